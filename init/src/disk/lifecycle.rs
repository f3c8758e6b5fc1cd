//! The state disk's lifecycle: format a blank disk once, open it on every later boot, and never
//! lose data.
//!
//! ```text
//!            ┌──────── blank, or hawser's and never initialized, or a format cut short ────────┐
//!  probe ────┤                                                                                  │
//!            │   new UUID → key(UUID) → header "formatting" (both copies, synced)              │
//!            │   → map → [integrity: wipe] → mkfs.ext4 → mount → marker file (synced)          │
//!            │   → the first boot's kept files, in order (each synced)                          │
//!            │   → header "initialized" (seqid + 1, both copies, synced)                       │
//!            │                                                                                  │
//!            ├──────── hawser's, initialized ──────────────────────────────────────────────────┤
//!            │   key(UUID) → LUKS2 digest matches? ── no ──► WrongKey: nothing written          │
//!            │   → [repair a stale or torn header copy]                                         │
//!            │   → [no cluster ID recorded: record the lock's (seqid + 1, both copies)]         │
//!            │   → map → mount → marker: boots + 1                                              │
//!            │                                                                                  │
//!            └──────── anything else: refused, naming what was found; nothing written ─────────┘
//! ```
//!
//! The cluster the node locked into (PCR 15's input, [`Options::cluster_id`]) is recorded in
//! hawser's token with the "initialized" mark, or — on a disk initialized before hawser recorded
//! it — at the next boot that opens it; a disk that records another cluster than the lock's is
//! refused before anything is written ([`LifecycleError::OtherCluster`]). The join client reads
//! the recorded ID ([`Plan::recorded_cluster_id`]) to refuse another cluster's join service
//! before the lock.
//!
//! The "initialized" mark is the last write of the first boot, after the filesystem, its
//! marker file and what the caller asks to keep there first ([`Options::first_boot`]: the
//! node's one-time grants, [`Kept`]) are on disk: a power cut anywhere before it leaves a disk
//! that the next boot formats again, and a power cut after it leaves a disk that is only ever
//! opened, with everything the first boot kept. Each header
//! write goes copy by copy, the copy not currently relied on first, so one valid copy always
//! survives a cut; within a copy the binary header (whose first sector names hawser) is synced
//! before the JSON area, so even a cut during the very first write is recognizable (see
//! [`super::probe`]).
//!
//! Everything that touches the kernel (device-mapper, mkfs, mount, randomness) goes through
//! [`Platform`]; disk reads and writes through [`BlockIo`]. The decisions are unit-tested on the
//! host with an in-memory disk and a recording platform; the QEMU tests run the real thing.

use std::io;
use std::path::{Path, PathBuf};

use hawser_luks2::{self as luks2, DiskState, HeaderSlot, Integrity, KeyDigest, NewHeader};

use super::dm::DmError;
use super::key::{DiskStatus, KeySource, VolumeKey};
use super::probe::{self, BlockIo, Contents};
use crate::platform::timings::PhaseTimer;

mod cluster;
mod error;
mod kept;
mod marker;

pub use self::error::{LifecycleError, MkfsError};
pub use self::kept::Kept;
pub use self::marker::{MARKER_FILE, Marker, read_marker, write_marker};

/// What the kernel-facing steps need.
pub trait Platform {
    /// Maps the data segment with `key`; returns the plaintext block device.
    fn map(
        &self,
        luks_uuid: &str,
        integrity: Integrity,
        key: &VolumeKey,
    ) -> Result<PathBuf, DmError>;
    /// Removes the mapping (cleanup after a failed step; best effort).
    fn unmap(&self);
    /// Writes zeros over the whole mapped device (integrity mode: valid tags everywhere);
    /// returns the bytes written.
    fn wipe(&self, mapped: &Path) -> io::Result<u64>;
    /// Creates the filesystem on the mapped device.
    fn mkfs(&self, mapped: &Path) -> Result<(), MkfsError>;
    /// Mounts the mapped device's filesystem at `target`.
    fn mount(&self, mapped: &Path, target: &Path) -> io::Result<()>;
    /// Fills `buf` from the kernel's CSPRNG.
    fn random(&self, buf: &mut [u8]) -> io::Result<()>;
    /// Keeps `kept` on the mounted filesystem at `root` ([`Kept::write_under`]); the host
    /// tests cut the power here.
    fn keep(&self, root: &Path, kept: &Kept) -> io::Result<()> {
        kept.write_under(root)
    }
}

/// What the lifecycle is asked to do.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// The measured integrity mode.
    pub integrity: Integrity,
    /// Where the filesystem is mounted.
    pub mount_point: &'a Path,
    /// Written into the marker file ("hawser 0.1.0").
    pub formatted_by: &'a str,
    /// The cluster the node locked into (PCR 15's input), recorded on the disk by [`apply`];
    /// `None` when the key came from no cluster (the development key source).
    pub cluster_id: Option<[u8; 32]>,
    /// What a format keeps on the new filesystem, in this order, before the "initialized"
    /// mark (the node's one-time grants). An open keeps nothing: the boot that formatted the
    /// disk kept it all before marking it.
    pub first_boot: &'a [Kept],
}

/// What happened to the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Formatted; `was` says what the disk was before ("blank", …).
    Formatted { was: &'static str },
    /// An initialized disk opened with the right key.
    Opened,
}

/// The state disk is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The LUKS2 UUID (lowercase): the identity of the disk and its key.
    pub uuid: String,
    pub action: Action,
    /// The plaintext block device.
    pub mapped: PathBuf,
    /// How many boots (including this one) opened this disk, from the marker file.
    pub boots: u64,
    /// Bytes wiped for dm-integrity on this boot.
    pub wiped: Option<u64>,
    /// Things worth a warning line (a repaired header copy, a missing marker file).
    pub warnings: Vec<String>,
}

/// What [`prepare`] decided to do with the disk; [`apply`] does it.
#[derive(Debug)]
pub struct Plan {
    kind: PlanKind,
}

#[derive(Debug)]
enum PlanKind {
    /// An initialized disk: open it with its key.
    Open(Box<luks2::Selected>),
    /// Format the disk under a new UUID: `first` copy first, at `seqid`.
    Format {
        uuid: String,
        digest_salt: [u8; luks2::DIGEST_SALT_LEN],
        first: HeaderSlot,
        seqid: u64,
        was: &'static str,
    },
}

impl Plan {
    /// The LUKS2 UUID the key is asked for: the disk's, or the new one a format writes.
    pub fn luks_uuid(&self) -> &str {
        match &self.kind {
            PlanKind::Open(selected) => &selected.header.uuid,
            PlanKind::Format { uuid, .. } => uuid,
        }
    }

    /// The cluster an initialized disk's header says it belongs to (unauthenticated: see
    /// `hawser_luks2::Header::cluster_id`); `None` for a format or a disk that records none.
    pub fn recorded_cluster_id(&self) -> Option<[u8; 32]> {
        match &self.kind {
            PlanKind::Open(selected) => selected.header.cluster_id,
            PlanKind::Format { .. } => None,
        }
    }

    /// Whether the key is for a new disk or an initialized one.
    pub fn status(&self) -> DiskStatus {
        match self.kind {
            PlanKind::Open(_) => DiskStatus::Initialized,
            PlanKind::Format { .. } => DiskStatus::New,
        }
    }
}

/// A key that [`verify`] found to open the planned disk (or, for a format, of the right length).
#[derive(Debug)]
pub struct VerifiedKey(VolumeKey);

/// Step 1 (blocking, no key): probes the disk and decides between format and open. A format's
/// UUID and digest salt are drawn here, so that the key can be asked for that UUID.
pub fn prepare(
    disk: &dyn BlockIo,
    options: &Options<'_>,
    platform: &dyn Platform,
    timer: &mut PhaseTimer,
) -> Result<Plan, LifecycleError> {
    let contents = timer.time("state-disk-probe", || probe::probe(disk, options.integrity))?;
    let (first, seqid, was) = match contents {
        Contents::Hawser(selected) if selected.header.state == DiskState::Initialized => {
            return Ok(Plan {
                kind: PlanKind::Open(selected),
            });
        }
        Contents::Hawser(selected) => (
            selected.source.slot.other(),
            selected.header.seqid.max(selected.source.seqid) + 1,
            "formatted by hawser but never initialized",
        ),
        Contents::InterruptedFormat { .. } => (
            HeaderSlot::Primary,
            1,
            "left half-formatted by an interrupted format",
        ),
        Contents::Blank => (HeaderSlot::Primary, 1, "blank"),
    };
    let mut uuid_bytes = [0u8; 16];
    let mut digest_salt = [0u8; luks2::DIGEST_SALT_LEN];
    platform
        .random(&mut uuid_bytes)
        .and_then(|()| platform.random(&mut digest_salt))
        .map_err(LifecycleError::Random)?;
    Ok(Plan {
        kind: PlanKind::Format {
            uuid: luks2::uuid_from_random(uuid_bytes),
            digest_salt,
            first,
            seqid,
            was,
        },
    })
}

/// Step 2 (blocking, reads nothing but the plan): checks `key` against the disk before anything
/// is written or mapped — its length, and for an initialized disk the LUKS2 digest (PBKDF2).
/// The caller takes the node lock only after this.
pub fn verify(
    plan: &Plan,
    key: VolumeKey,
    options: &Options<'_>,
    timer: &mut PhaseTimer,
) -> Result<VerifiedKey, LifecycleError> {
    let expected = options.integrity.key_len();
    if key.len() != expected {
        return Err(LifecycleError::KeyLength {
            found: key.len(),
            expected,
        });
    }
    if let PlanKind::Open(selected) = &plan.kind {
        let matches = timer.time("state-disk-verify", || {
            selected.header.digest.matches(key.as_bytes())
        });
        if !matches {
            return Err(LifecycleError::WrongKey {
                uuid: selected.header.uuid.clone(),
            });
        }
    }
    Ok(VerifiedKey(key))
}

/// Step 3 (blocking): formats or opens the disk as planned with the verified key, maps it,
/// mounts it at `options.mount_point`.
pub fn apply(
    disk: &dyn BlockIo,
    plan: Plan,
    key: VerifiedKey,
    options: &Options<'_>,
    platform: &dyn Platform,
    timer: &mut PhaseTimer,
) -> Result<Outcome, LifecycleError> {
    match plan.kind {
        PlanKind::Open(selected) => open(disk, *selected, key.0, options, platform, timer),
        PlanKind::Format {
            uuid,
            digest_salt,
            first,
            seqid,
            was,
        } => {
            let fresh = Fresh {
                uuid,
                digest_salt,
                seqid,
                first,
                was,
            };
            format(disk, fresh, key.0, options, platform, timer)
        }
    }
}

/// Brings the state disk up in one call with a key from `keys`: [`prepare`], the key,
/// [`verify`], [`apply`] (PID 1 itself runs the steps one by one, racing for the key between
/// them; this is the whole flow for the host tests and the cryptsetup cross-check).
pub fn run(
    disk: &dyn BlockIo,
    options: &Options<'_>,
    keys: &dyn KeySource,
    platform: &dyn Platform,
    timer: &mut PhaseTimer,
) -> Result<Outcome, LifecycleError> {
    let plan = prepare(disk, options, platform, timer)?;
    let key = timer.time("state-disk-key", || {
        keys.volume_key(plan.luks_uuid(), options.integrity.key_len(), plan.status())
    })?;
    let key = verify(&plan, key, options, timer)?;
    apply(disk, plan, key, options, platform, timer)
}

fn open(
    disk: &dyn BlockIo,
    selected: luks2::Selected,
    key: VolumeKey,
    options: &Options<'_>,
    platform: &dyn Platform,
    timer: &mut PhaseTimer,
) -> Result<Outcome, LifecycleError> {
    let uuid = selected.header.uuid.clone();
    let mut warnings = Vec::new();
    if let Some((stale, reason)) = &selected.repair {
        let mut salt = [0u8; luks2::HEADER_SALT_LEN];
        platform.random(&mut salt).map_err(LifecycleError::Random)?;
        write_copy(disk, *stale, &luks2::repaired_copy(&selected.source, salt))?;
        warnings.push(format!(
            "repaired the {stale} of state disk {uuid} from the other copy ({reason})"
        ));
    }
    cluster::record_cluster_id(disk, &selected, options.cluster_id, platform)?;

    let mapped = timer.time("state-disk-map", || map(platform, &uuid, options, key))?;
    timer.time("state-disk-mount", || {
        mount(platform, &mapped, options.mount_point, &uuid)
    })?;

    let marker_path = options.mount_point.join(MARKER_FILE);
    let marker = match read_marker(&marker_path) {
        Ok(Some(marker)) if marker.luks_uuid == uuid => Marker {
            boots: marker.boots.saturating_add(1),
            ..marker
        },
        found => {
            warnings.push(match found {
                Ok(Some(other)) => format!(
                    "{} names LUKS2 volume {}, not {uuid}; starting it again",
                    marker_path.display(),
                    other.luks_uuid
                ),
                Ok(None) => format!(
                    "{} is missing on initialized state disk {uuid}; writing it again",
                    marker_path.display()
                ),
                Err(e) => format!(
                    "cannot read {}: {e}; writing it again",
                    marker_path.display()
                ),
            });
            Marker {
                luks_uuid: uuid.clone(),
                formatted_by: "unknown".into(),
                boots: 1,
            }
        }
    };
    write_marker(&marker_path, &marker)?;
    Ok(Outcome {
        uuid,
        action: Action::Opened,
        mapped,
        boots: marker.boots,
        wiped: None,
        warnings,
    })
}

/// Maps the data segment; the key is dropped (wiped) as soon as dm-crypt has it.
fn map(
    platform: &dyn Platform,
    uuid: &str,
    options: &Options<'_>,
    key: VolumeKey,
) -> Result<PathBuf, LifecycleError> {
    platform
        .map(uuid, options.integrity, &key)
        .map_err(|source| LifecycleError::Map {
            uuid: uuid.to_owned(),
            source,
        })
}

/// What [`prepare`] chose for a format.
struct Fresh {
    uuid: String,
    digest_salt: [u8; luks2::DIGEST_SALT_LEN],
    seqid: u64,
    first: HeaderSlot,
    was: &'static str,
}

fn format(
    disk: &dyn BlockIo,
    fresh: Fresh,
    key: VolumeKey,
    options: &Options<'_>,
    platform: &dyn Platform,
    timer: &mut PhaseTimer,
) -> Result<Outcome, LifecycleError> {
    let Fresh {
        uuid,
        digest_salt,
        seqid,
        first,
        was,
    } = fresh;
    tracing::info!("formatting the state disk as LUKS2 volume {uuid} (the disk was {was})");
    let mut header = timer.time("state-disk-format", || {
        let header = NewHeader {
            uuid: uuid.clone(),
            integrity: options.integrity,
            digest: KeyDigest::compute(key.as_bytes(), digest_salt, luks2::DIGEST_ITERATIONS),
            state: DiskState::Formatting,
            seqid,
            cluster_id: None,
        };
        write_header(disk, platform, &header, first)?;
        if options.integrity != Integrity::None {
            // A zeroed superblock makes the kernel format dm-integrity afresh.
            write_synced(
                disk,
                "the dm-integrity superblock",
                &[0u8; luks2::SECTOR_SIZE as usize],
                luks2::DATA_OFFSET,
            )?;
        }
        Ok::<_, LifecycleError>(header)
    })?;

    let mapped = timer.time("state-disk-map", || map(platform, &uuid, options, key))?;

    let result = (|| {
        let mut wiped = None;
        if options.integrity != Integrity::None {
            let bytes = timer.time("state-disk-wipe", || {
                platform
                    .wipe(&mapped)
                    .map_err(|source| LifecycleError::Wipe {
                        mapped: mapped.clone(),
                        source,
                    })
            })?;
            wiped = Some(bytes);
        }
        timer.time("state-disk-mkfs", || {
            platform
                .mkfs(&mapped)
                .map_err(|source| LifecycleError::Mkfs {
                    mapped: mapped.clone(),
                    source,
                })
        })?;
        Ok(wiped)
    })();
    let wiped = match result {
        Ok(wiped) => wiped,
        Err(e) => {
            platform.unmap();
            return Err(e);
        }
    };

    timer.time("state-disk-mount", || {
        mount(platform, &mapped, options.mount_point, &uuid)
    })?;
    let marker = Marker {
        luks_uuid: uuid.clone(),
        formatted_by: options.formatted_by.to_owned(),
        boots: 1,
    };
    write_marker(&options.mount_point.join(MARKER_FILE), &marker)?;
    timer.time("state-disk-keep", || keep_first_boot(platform, options))?;

    // Only now, with the filesystem, its marker and what the first boot keeps on disk: the
    // point of no reformat.
    timer.time("state-disk-initialized", || {
        header.state = DiskState::Initialized;
        header.seqid += 1;
        header.cluster_id = options.cluster_id;
        write_header(disk, platform, &header, HeaderSlot::Primary)
    })?;

    Ok(Outcome {
        uuid,
        action: Action::Formatted { was },
        mapped,
        boots: 1,
        wiped,
        warnings: Vec::new(),
    })
}

/// Keeps [`Options::first_boot`] on the new filesystem, in order.
fn keep_first_boot(platform: &dyn Platform, options: &Options<'_>) -> Result<(), LifecycleError> {
    for kept in options.first_boot {
        platform
            .keep(options.mount_point, kept)
            .map_err(|source| LifecycleError::Keep {
                path: options.mount_point.join(kept.path()),
                source,
            })?;
    }
    Ok(())
}

fn mount(
    platform: &dyn Platform,
    mapped: &Path,
    target: &Path,
    uuid: &str,
) -> Result<(), LifecycleError> {
    platform.mount(mapped, target).map_err(|source| {
        platform.unmap();
        LifecycleError::Mount {
            mapped: mapped.to_owned(),
            target: target.to_owned(),
            uuid: uuid.to_owned(),
            source,
        }
    })
}

/// Writes both copies of `header`, `first` first, each with its own random salt.
fn write_header(
    disk: &dyn BlockIo,
    platform: &dyn Platform,
    header: &NewHeader,
    first: HeaderSlot,
) -> Result<(), LifecycleError> {
    for copy in [first, first.other()] {
        let mut salt = [0u8; luks2::HEADER_SALT_LEN];
        platform.random(&mut salt).map_err(LifecycleError::Random)?;
        write_copy(disk, copy, &luks2::new_header_copy(copy, header, salt))?;
    }
    Ok(())
}

/// Writes one copy: the binary header, synced, then the JSON area, synced.
fn write_copy(disk: &dyn BlockIo, copy: HeaderSlot, bytes: &[u8]) -> Result<(), LifecycleError> {
    let (binary, json) = bytes.split_at(luks2::BINARY_HEADER_LEN);
    write_synced(disk, "a LUKS2 binary header", binary, copy.offset())?;
    write_synced(
        disk,
        "a LUKS2 JSON area",
        json,
        copy.offset() + luks2::BINARY_HEADER_LEN as u64,
    )
}

fn write_synced(
    disk: &dyn BlockIo,
    what: &'static str,
    bytes: &[u8],
    offset: u64,
) -> Result<(), LifecycleError> {
    disk.write_all_at(bytes, offset)
        .and_then(|()| disk.sync())
        .map_err(|source| LifecycleError::Write {
            what,
            offset,
            source,
        })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) mod testing;
