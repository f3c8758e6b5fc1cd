//! The encrypted state disk: a LUKS2-compatible disk, formatted and opened by PID 1 itself,
//! mapped with the kernel's dm-crypt through device-mapper ioctls.
//!
//! A node's state (etcd, kubelet, containers) lives on a disk the host must not read or
//! silently alter. PID 1 finds it by serial ([`device`]), reads its header strictly
//! ([`hawser_luks2`], [`probe`]), formats a blank disk once or opens an initialized one with the key
//! ([`lifecycle`]), maps it with parameters that are hawser's constants, never the header's
//! ([`dm`]), and mounts the ext4 filesystem at [`STATE_MOUNT_POINT`]. An operator holding the
//! key can always open the disk with `cryptsetup open --volume-key-file` (see
//! `docs/state-disk.md`).
//!
//! The measured configuration (`hawser.state_disk*` on the kernel command line, see
//! [`StateDiskConfig`]) says which disk, where its key comes from ([`key::KeySourceKind`]) and
//! whether to add dm-integrity. With the default key source `none` PID 1 leaves disks alone.
//!
//! The boot runs it in three steps — [`prepare`], the key (the race, in `crate::boot`),
//! [`Prepared::verify`] then [`Prepared::apply`]. Only [`find`], those steps and
//! [`LinuxPlatform`] touch the machine; the rest is tested on the host.

pub mod dm;
pub mod key;
pub mod lifecycle;
pub mod probe;

use std::fs::{File, OpenOptions};
use std::io::{self, Seek as _, SeekFrom};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hawser_luks2::Integrity;
use nix::mount::MsFlags;
use tokio::io::AsyncReadExt as _;
use tracing::{info, warn};

use self::dm::DmError;
use self::key::{DiskStatus, FixedKey, KeyError, KeySourceKind, VolumeKey};
use self::lifecycle::{
    Action, Kept, LifecycleError, MkfsError, Options, Plan, Platform, VerifiedKey,
};
use crate::platform::block::{self as device, BlockDevice, DiskSelector, Lookup, SysfsError};
use crate::platform::mounts::SharedMountTable;
use crate::platform::poll::{self, Poll};
use crate::platform::reaper::ChildRegistry;
use crate::platform::syscalls::{LinuxSyscalls, MountSpec};
use crate::platform::timings::PhaseTimer;

/// Where the state filesystem is mounted (ext4, no mount flags: what later runs from it —
/// containerd, kubelet — decides its own).
pub const STATE_MOUNT_POINT: &str = "/run/hawser/state";
/// How long to wait for the disk to appear (virtio-blk probes asynchronously).
pub const DISK_WAIT: Duration = Duration::from_secs(10);
/// The mkfs in the initramfs (e2fsprogs' mke2fs).
pub const MKFS: &str = "/usr/sbin/mke2fs";
/// The ext4 label of the state filesystem.
pub const FS_LABEL: &str = "hawser-state";
/// How often sysfs is looked at while waiting for the disk.
const DISK_POLL: Duration = Duration::from_millis(20);
/// Bytes per write when wiping for dm-integrity.
const WIPE_CHUNK: usize = 4 * 1024 * 1024;

/// The measured state disk configuration (`hawser.state_disk`, `hawser.state_disk_key_source`,
/// `hawser.state_disk_integrity`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StateDiskConfig {
    pub key_source: KeySourceKind,
    /// Required unless the key source is `none`.
    pub disk: Option<DiskSelector>,
    pub integrity: Integrity,
}

/// Why the state disk is not up. Each message names the disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// No disk with the configured serial appeared in time.
    #[error(
        "no state disk with {selector} appeared within {} s; disks present: {present}",
        waited.as_secs()
    )]
    NotFound {
        selector: DiskSelector,
        waited: Duration,
        present: String,
    },
    /// Several disks have the configured serial.
    #[error(
        "more than one disk has {selector} ({disks}); refusing to guess which is the state disk"
    )]
    Ambiguous {
        selector: DiskSelector,
        disks: String,
    },
    /// A key source is configured without `hawser.state_disk`.
    #[error(
        "hawser.state_disk_key_source={} needs hawser.state_disk=serial:<serial>",
        key_source.cmdline_name()
    )]
    NoDiskConfigured { key_source: KeySourceKind },
    /// /sys/block cannot be listed.
    #[error("cannot list the disks")]
    Sysfs(#[source] SysfsError),
    /// The disk is attached read-only.
    #[error("state disk {device} is read-only; hawser must be able to write to it")]
    ReadOnly { device: String },
    /// The disk's device node cannot be opened for reading and writing.
    #[error("cannot open state disk {device}")]
    Open {
        device: String,
        #[source]
        source: io::Error,
    },
    /// No key could be had from the configured source.
    #[error("state disk")]
    Key(#[source] KeyError),
    /// Probing, formatting, opening, mapping or mounting the disk failed.
    #[error("state disk {device}")]
    Lifecycle {
        device: String,
        #[source]
        source: LifecycleError,
    },
    /// A blocking task of the state disk panicked or was cancelled.
    #[error("the state disk task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The warning logged on every boot with the development key source.
pub const INSECURE_KEY_WARNING: &str = "INSECURE: hawser.state_disk_key_source=fw_cfg-insecure-dev: \
     the state disk key comes from fw_cfg, which the host chooses and reads; the disk is not \
     protected from the host. For development only.";

/// Where the state disk's key comes from, as the configuration decided: nothing to do, the
/// development key, or the cluster (`C`: the enrollment race, which is the boot's to run).
#[derive(Debug)]
pub enum KeyChoice<C> {
    /// `hawser.state_disk_key_source=none`: PID 1 leaves disks alone.
    None,
    /// The development key from fw_cfg.
    Fixed(FixedKey),
    /// The join service or the admin, through the race.
    Cluster(C),
}

/// Decides where the key comes from (`config`), or does nothing when the key source is `none`.
/// `fw_cfg_key` is fw_cfg's `opt/hawser/state_disk_key`, used only by the development source;
/// `cluster` is the race, needed by the join-service source. `warn` gets each warning for the
/// boot report.
pub fn choose_key<C>(
    config: &StateDiskConfig,
    fw_cfg_key: Option<VolumeKey>,
    cluster: Option<C>,
    mut warn: impl FnMut(String),
) -> Result<KeyChoice<C>, DiskError> {
    if fw_cfg_key.is_some() && config.key_source != KeySourceKind::FwCfgInsecureDev {
        warn(format!(
            "fw_cfg opt/hawser/state_disk_key is ignored: hawser.state_disk_key_source is {}",
            config.key_source.cmdline_name()
        ));
    }
    match config.key_source {
        KeySourceKind::None => {
            info!("no state disk (hawser.state_disk_key_source=none)");
            Ok(KeyChoice::None)
        }
        KeySourceKind::JoinService => cluster
            .map(KeyChoice::Cluster)
            .ok_or(DiskError::Key(KeyError::NoEnrollment)),
        KeySourceKind::FwCfgInsecureDev => {
            warn(INSECURE_KEY_WARNING.to_owned());
            let key = fw_cfg_key.ok_or(DiskError::Key(KeyError::MissingFwCfgKey))?;
            Ok(KeyChoice::Fixed(FixedKey::new(
                key,
                "fw_cfg opt/hawser/state_disk_key",
            )))
        }
    }
}

/// Finds the configured disk (waiting for it to appear) and checks that it is writable.
pub async fn find(config: &StateDiskConfig) -> Result<BlockDevice, DiskError> {
    // The configuration parser already refuses a key source without a disk.
    let Some(selector) = config.disk.clone() else {
        return Err(DiskError::NoDiskConfigured {
            key_source: config.key_source,
        });
    };
    let disk = wait_for_disk(&selector, DISK_WAIT).await?;
    if disk.read_only {
        return Err(DiskError::ReadOnly {
            device: disk.to_string(),
        });
    }
    Ok(disk)
}

/// The options of the lifecycle on a node.
fn options(integrity: Integrity, cluster_id: Option<[u8; 32]>, first_boot: &[Kept]) -> Options<'_> {
    Options {
        integrity,
        mount_point: Path::new(STATE_MOUNT_POINT),
        formatted_by: concat!("hawser ", env!("CARGO_PKG_VERSION")),
        cluster_id,
        first_boot,
    }
}

/// A found and probed state disk with its plan (format or open), waiting for its key.
pub struct Prepared {
    device: String,
    file: File,
    plan: Plan,
    integrity: Integrity,
    /// The cluster the node locked into, recorded on the disk by [`Prepared::apply`].
    cluster_id: Option<[u8; 32]>,
    /// What a format keeps before the "initialized" mark ([`Prepared::keeping`]).
    first_boot: Vec<Kept>,
}

/// Step 1 of the key flow (blocking): opens the disk, probes it and plans format or open.
pub fn prepare(
    disk: &BlockDevice,
    integrity: Integrity,
    platform: &dyn Platform,
    timer: &mut PhaseTimer,
) -> Result<Prepared, DiskError> {
    let device = disk.to_string();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(disk.path())
        .map_err(|source| DiskError::Open {
            device: device.clone(),
            source,
        })?;
    let plan = lifecycle::prepare(&file, &options(integrity, None, &[]), platform, timer);
    let plan = plan.map_err(|source| DiskError::Lifecycle {
        device: device.clone(),
        source,
    })?;
    Ok(Prepared {
        device,
        file,
        plan,
        integrity,
        cluster_id: None,
        first_boot: Vec::new(),
    })
}

impl Prepared {
    /// The disk, as the log names it (`/dev/vdb (serial "…")`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The LUKS2 UUID to ask the key for.
    pub fn luks_uuid(&self) -> &str {
        self.plan.luks_uuid()
    }

    /// Whether the key is for a new disk or an initialized one.
    pub fn status(&self) -> DiskStatus {
        self.plan.status()
    }

    /// The cluster the disk's header says it belongs to (unauthenticated; the join client
    /// refuses a join service of another cluster with it, before the node lock).
    pub fn recorded_cluster_id(&self) -> Option<[u8; 32]> {
        self.plan.recorded_cluster_id()
    }

    /// The cluster the node locked into: [`Prepared::apply`] records it on the disk (with the
    /// "initialized" mark of a format, or on a disk that records none yet) and refuses a disk
    /// that records another.
    pub fn for_cluster(mut self, cluster_id: [u8; 32]) -> Self {
        self.cluster_id = Some(cluster_id);
        self
    }

    /// What a format keeps on the new filesystem before it marks the disk initialized: the
    /// node's one-time grants ([`lifecycle::Options::first_boot`]).
    pub fn keeping(mut self, first_boot: Vec<Kept>) -> Self {
        self.first_boot = first_boot;
        self
    }

    /// The key length the measured integrity mode needs.
    pub fn key_len(&self) -> usize {
        self.integrity.key_len()
    }

    fn lifecycle_error(&self) -> impl FnOnce(LifecycleError) -> DiskError + '_ {
        |source| DiskError::Lifecycle {
            device: self.device.clone(),
            source,
        }
    }

    /// Step 2 (blocking): checks `key` against the disk (its LUKS2 digest, for an initialized
    /// disk) before anything is written, mapped or locked.
    pub fn verify(&self, key: VolumeKey, timer: &mut PhaseTimer) -> Result<VerifiedKey, DiskError> {
        lifecycle::verify(&self.plan, key, &options(self.integrity, None, &[]), timer)
            .map_err(self.lifecycle_error())
    }

    /// Step 3 (blocking): formats or opens the disk, maps and mounts it; logs what was done and
    /// returns the warnings for the boot report.
    pub fn apply(
        self,
        key: VerifiedKey,
        platform: &dyn Platform,
        timer: &mut PhaseTimer,
    ) -> Result<Vec<String>, DiskError> {
        let Prepared {
            device,
            file,
            plan,
            integrity,
            cluster_id,
            first_boot,
        } = self;
        let options = options(integrity, cluster_id, &first_boot);
        let outcome =
            lifecycle::apply(&file, plan, key, &options, platform, timer).map_err(|source| {
                DiskError::Lifecycle {
                    device: device.clone(),
                    source,
                }
            })?;
        log_outcome(&device, integrity, &outcome);
        Ok(outcome
            .warnings
            .iter()
            .map(|warning| format!("state disk {device}: {warning}"))
            .collect())
    }
}

/// The console line of a state disk that is up.
fn log_outcome(device: &str, integrity: Integrity, outcome: &lifecycle::Outcome) {
    let integrity = match integrity {
        Integrity::None => "no integrity".to_owned(),
        mode => format!("{} integrity", mode.cmdline_name()),
    };
    match outcome.action {
        Action::Formatted { was } => info!(
            "state disk {device}: formatted LUKS2 volume {} (the disk was {was}; \
             aes-xts-plain64, {integrity}{}), created ext4 on {}, mounted at {STATE_MOUNT_POINT}; \
             boot {} of this disk",
            outcome.uuid,
            outcome
                .wiped
                .map(|bytes| format!(", wiped {} MiB", bytes >> 20))
                .unwrap_or_default(),
            outcome.mapped.display(),
            outcome.boots
        ),
        Action::Opened => info!(
            "state disk {device}: opened LUKS2 volume {} ({integrity}) as {}, mounted at \
             {STATE_MOUNT_POINT}; boot {} of this disk",
            outcome.uuid,
            outcome.mapped.display(),
            outcome.boots
        ),
    }
}

/// Polls sysfs until the disk appears (or `limit` passes).
pub async fn wait_for_disk(
    selector: &DiskSelector,
    limit: Duration,
) -> Result<BlockDevice, DiskError> {
    poll::wait_until(limit, DISK_POLL, || {
        let disks = match device::list_disks(Path::new("/sys/block")) {
            Ok(disks) => disks,
            Err(e) => return Poll::Failed(DiskError::Sysfs(e)),
        };
        match device::find(disks, selector) {
            Lookup::Found(disk) => Poll::Ready(disk),
            Lookup::Ambiguous(disks) => Poll::Failed(DiskError::Ambiguous {
                selector: selector.clone(),
                disks: device::describe_disks(&disks),
            }),
            Lookup::Missing(present) => Poll::Pending(DiskError::NotFound {
                selector: selector.clone(),
                waited: limit,
                present: device::describe_disks(&present),
            }),
        }
    })
    .await
}

/// The real [`Platform`]: device-mapper, mke2fs (through the child registry, so the reaper
/// leaves its exit status alone), mount(2) into PID 1's mount table (so shutdown unmounts it),
/// getrandom(2).
pub struct LinuxPlatform {
    pub disk: BlockDevice,
    pub registry: ChildRegistry,
    /// PID 1's mount table: the mapping and the mount are recorded for the shutdown.
    pub mounts: SharedMountTable,
    /// The PID 1 runtime, for spawning mke2fs from the blocking thread.
    pub runtime: tokio::runtime::Handle,
}

impl Platform for LinuxPlatform {
    fn map(
        &self,
        luks_uuid: &str,
        integrity: Integrity,
        key: &VolumeKey,
    ) -> Result<PathBuf, DmError> {
        let mapped = dm::map(self.disk.devnum, self.disk.size, luks_uuid, integrity, key)?;
        // Closed at shutdown after the state file system is unmounted, crypt before integrity.
        let mut table = self.mounts.lock();
        if integrity == Integrity::HmacSha256 {
            table.record_device(dm::DM_INTEGRITY_NAME);
        }
        table.record_device(dm::DM_NAME);
        Ok(mapped.path)
    }

    fn unmap(&self) {
        for name in [dm::DM_NAME, dm::DM_INTEGRITY_NAME] {
            let _ = dm::remove(name);
            self.mounts.lock().forget_device(name);
        }
    }

    fn wipe(&self, mapped: &Path) -> io::Result<u64> {
        let mut file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(mapped)?;
        let size = file.seek(SeekFrom::End(0))?;
        let zeros = vec![0u8; WIPE_CHUNK];
        let mut offset = 0u64;
        let mut reported = 0;
        while offset < size {
            let n = (size - offset).min(WIPE_CHUNK as u64) as usize;
            file.write_all_at(&zeros[..n], offset)?;
            offset += n as u64;
            // A large disk takes minutes: say how far it is, every 10 % (synced, so that the
            // number is what is on the disk, not what is in the page cache).
            let percent = offset * 100 / size;
            if percent >= reported + 10 {
                file.sync_data()?;
                reported = percent - percent % 10;
                info!(
                    "wiping {} for dm-integrity: {reported} % of {} MiB",
                    mapped.display(),
                    size >> 20
                );
            }
        }
        file.sync_data()?;
        Ok(size)
    }

    fn mkfs(&self, mapped: &Path) -> Result<(), MkfsError> {
        let mut command = tokio::process::Command::new(MKFS);
        command
            .args(["-t", "ext4", "-q", "-F", "-b", "4096", "-L", FS_LABEL])
            // Lazy inode tables and journal: mke2fs writes the metadata it needs (≈ 0.25 MiB
            // for 256 MiB) instead of zeroing the 16 MiB journal (and more on a larger disk)
            // through dm-crypt. The volume key is new, so every block the new journal has not
            // written decrypts to noise: jbd2 cannot mistake it for a transaction (magic,
            // sequence number and, with metadata_csum, the journal checksum).
            .args(["-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"])
            .arg(mapped)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        self.runtime.block_on(async {
            let mut child =
                self.registry
                    .spawn(&mut command)
                    .map_err(|source| MkfsError::Spawn {
                        program: MKFS,
                        source,
                    })?;
            let stdout = child.inner().stdout.take();
            let stderr = child.inner().stderr.take();
            let (out, err) = tokio::join!(read_all(stdout), read_all(stderr));
            let status = child.wait().await.map_err(|source| MkfsError::Wait {
                program: MKFS,
                source,
            })?;
            if status.success() {
                return Ok(());
            }
            let output = format!(
                "{}{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
            Err(MkfsError::Failed {
                program: MKFS,
                status,
                output: output.trim().to_owned(),
            })
        })
    }

    fn mount(&self, mapped: &Path, target: &Path) -> io::Result<()> {
        // MountSpec holds 'static strings (the mount table outlives every caller); this runs
        // once per boot.
        let leak = |p: &Path| -> &'static str {
            Box::leak(p.to_string_lossy().into_owned().into_boxed_str())
        };
        report_clean_state(mapped);
        let spec = MountSpec {
            source: leak(mapped),
            target: leak(target),
            fstype: "ext4",
            flags: MsFlags::empty(),
            data: None,
        };
        self.mounts
            .lock()
            .mount(&LinuxSyscalls, &spec)
            .map_err(|e| e.source)
    }

    fn random(&self, buf: &mut [u8]) -> io::Result<()> {
        fill_random(buf)
    }
}

/// `s_feature_incompat` of the ext4 superblock (1024 bytes into the device) and its
/// `RECOVER` bit: set while the file system is mounted, cleared by a clean unmount.
const EXT4_INCOMPAT_OFFSET: u64 = 1024 + 0x60;
const EXT4_INCOMPAT_RECOVER: u32 = 0x0004;

/// Says whether the state file system was cleanly unmounted at the last shutdown (read from its
/// superblock before mounting; the mount itself replays the journal if it was not).
fn report_clean_state(mapped: &Path) {
    let mut bytes = [0u8; 4];
    let read =
        std::fs::File::open(mapped).and_then(|f| f.read_exact_at(&mut bytes, EXT4_INCOMPAT_OFFSET));
    match read {
        Ok(()) if u32::from_le_bytes(bytes) & EXT4_INCOMPAT_RECOVER == 0 => {
            info!("state file system: clean (nothing in its journal to replay)")
        }
        Ok(()) => warn!(
            "state file system: NOT cleanly unmounted at the last shutdown (power loss or \
             crash): ext4 replays its journal"
        ),
        Err(e) => warn!("cannot read the state file system's superblock: {e}"),
    }
}

async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes).await;
    }
    bytes
}

/// The kernel's CSPRNG at its old path (`init/tests/luks2_cryptsetup.rs` imports it from here).
pub use crate::platform::random::fill as fill_random;

#[cfg(test)]
mod tests;
