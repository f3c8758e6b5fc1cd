//! Releases: the node images a cluster's join services accept, kept in the cluster store so that
//! every control plane's join service accepts the same ones (`docs/lifecycle.md`).
//!
//! A release is the enforced part of an image's expected measurements (PCRs 4, 9, 11 as a
//! fresh node quotes it in the initramfs, 12, 13 and 15 = zero), under a name the admin
//! chooses. Only the admin writes releases, over the join service's authenticated admin
//! channel; a join service writes one itself only when the store holds none at all (the first
//! control plane, whose image is the cluster's first release). A retired release stays in the
//! store, so its nodes are refused by name, and is never accepted again: going back to an old
//! image is a new release.

use std::collections::BTreeMap;

use hawser_attestation::measurements::{ExpectedMeasurements, ExpectedPcr, MeasurementsError};
use hawser_attestation::releases::ReleaseSet;
use hawser_pcr::{PCR_CLUSTER_ID, PCR_KERNEL_BOOT, cluster_lock_pcr, pcr11_after_pivot};
use sha2::{Digest, Sha256};

use crate::{ClusterStore, PutMode, ReadConsistency, RecordKind, StoreError};

/// A release as stored (`/hawser/v1/releases/<name>`, or `<state-dir>/releases/<name>.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    /// The admin's name for it (`v2`, `2026-11-29`, …).
    pub name: String,
    /// sha256 of the enforced measurements ([`measurements_digest`]): one image, one digest.
    pub digest: String,
    /// The enforced expected value of each PCR, lowercase hex.
    pub measurements: BTreeMap<u8, String>,
    /// The `version` of the published measurements file it came from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When it was added, seconds since the Unix epoch.
    pub added_unix: u64,
    /// Who added it (`admin`, or `first control plane` for the cluster's first release).
    pub added_by: String,
    /// When it was retired; `None` while accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_unix: Option<u64>,
    /// The platform profile its measurements file selected (`attestationVariant`; `None`:
    /// `qemu`), so that a verifier of a running node judges it by its platform's evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation_variant: Option<String>,
}

/// Why a release cannot be added, retired or read.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// A release name outside `[A-Za-z0-9._-]{1,64}`.
    #[error("release name {0:?} is not 1 to 64 letters, digits, `.`, `_` or `-`")]
    Name(String),
    /// The measurements file cannot be read or is not an expected-measurements file.
    #[error("cannot read the release's measurements")]
    Measurements(#[from] MeasurementsError),
    /// The file holds neither a measurements map nor a published `list`.
    #[error(
        "the measurements hold no enforced PCR (neither a verifier map nor the `list` of \
         `hawser measurements publish`)"
    )]
    NothingEnforced,
    /// Another release has this name.
    #[error("release {name} exists with other measurements (digest {digest}); choose another name")]
    NameTaken {
        /// The name.
        name: String,
        /// The existing release's digest.
        digest: String,
    },
    /// These measurements are a release already, under another name.
    #[error("these measurements are release {existing} already{}", if *.retired { " (retired: a retired release is never accepted again)" } else { "" })]
    SameMeasurements {
        /// The existing release.
        existing: String,
        /// Whether it is retired.
        retired: bool,
    },
    /// No release has this name.
    #[error("no release is named {name} (the cluster has: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The releases there are, comma-separated.
        known: String,
    },
    /// Retiring it would leave no accepted release.
    #[error(
        "release {0} is the only accepted release: retiring it would refuse every node; add \
         the next release first"
    )]
    LastAccepted(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks a release name.
pub fn check_name(name: &str) -> Result<(), ReleaseError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ReleaseError::Name(name.to_owned()))
    }
}

/// sha256 over `<pcr>=<hex>\n` of each enforced PCR, ascending: the identity of an image's
/// measurements, whatever file they came in.
pub fn measurements_digest(enforced: &BTreeMap<u8, String>) -> String {
    let mut hasher = Sha256::new();
    for (pcr, value) in enforced {
        hasher.update(format!("{pcr}={value}\n"));
    }
    hex::encode(hasher.finalize())
}

/// The enforced PCRs of `measurements`, as a release holds them.
pub fn enforced_map(measurements: &ExpectedMeasurements) -> BTreeMap<u8, String> {
    measurements
        .iter()
        .filter(|(_, e)| !e.warn_only)
        .map(|(pcr, e)| (pcr, hex::encode(e.expected)))
        .collect()
}

impl Release {
    /// A release named `name` from the text of a measurements file: a verifier map (what
    /// `hawser-joind --measurements` reads) or the document of `hawser measurements publish`
    /// (its `list[0].measurements`, and its `version`). `warnOnly` PCRs are left out: they
    /// differ between machines.
    pub fn from_measurements_text(
        name: &str,
        text: &str,
        added_by: &str,
        now_unix: u64,
    ) -> Result<Self, ReleaseError> {
        check_name(name)?;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(MeasurementsError::from)?;
        let variant = |of: &serde_json::Value| {
            of.get("attestationVariant")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        let (map, version, attestation_variant) = match value.get("list").and_then(|l| l.get(0)) {
            Some(first) => (
                first
                    .get("measurements")
                    .cloned()
                    .unwrap_or(serde_json::Value::Null),
                value
                    .get("version")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned),
                variant(first).or_else(|| variant(&value)),
            ),
            None => {
                let attestation_variant = variant(&value);
                (value, None, attestation_variant)
            }
        };
        let measurements = ExpectedMeasurements::from_json(&map.to_string())?;
        let mut release = Self::new(name, &measurements, version, added_by, now_unix)?;
        release.attestation_variant = attestation_variant;
        Ok(release)
    }

    /// A release named `name` of `measurements`' enforced PCRs.
    pub fn new(
        name: &str,
        measurements: &ExpectedMeasurements,
        version: Option<String>,
        added_by: &str,
        now_unix: u64,
    ) -> Result<Self, ReleaseError> {
        check_name(name)?;
        let enforced = enforced_map(measurements);
        if enforced.is_empty() {
            return Err(ReleaseError::NothingEnforced);
        }
        Ok(Self {
            name: name.to_owned(),
            digest: measurements_digest(&enforced),
            measurements: enforced,
            version,
            added_unix: now_unix,
            added_by: added_by.to_owned(),
            retired_unix: None,
            attestation_variant: None,
        })
    }

    /// Whether the admin retired it.
    pub fn is_retired(&self) -> bool {
        self.retired_unix.is_some()
    }

    /// Its measurements, every PCR enforced.
    pub fn expected(&self) -> ExpectedMeasurements {
        let mut expected = ExpectedMeasurements::new();
        for (pcr, value) in &self.measurements {
            let mut bytes = [0u8; 32];
            // Written by `new` from 32-byte values; a hand-edited record that is not is skipped
            // as PCR-less and refuses nothing by accident (it then matches nothing).
            if hex::decode_to_slice(value, &mut bytes).is_ok() {
                expected.insert(
                    *pcr,
                    ExpectedPcr {
                        expected: bytes,
                        warn_only: false,
                    },
                );
            }
        }
        expected
    }

    fn to_json(&self) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec_pretty(self).map_err(|source| StoreError::RecordJson {
            kind: "release",
            name: self.name.clone(),
            source,
        })
    }
}

/// Every release in the store, oldest first.
pub fn list(
    store: &dyn ClusterStore,
    consistency: ReadConsistency,
) -> Result<Vec<Release>, ReleaseError> {
    let mut releases = store
        .records(RecordKind::Release, consistency)?
        .into_iter()
        .map(|(name, bytes)| {
            serde_json::from_slice::<Release>(&bytes).map_err(|source| {
                ReleaseError::Store(StoreError::RecordJson {
                    kind: "release",
                    name,
                    source,
                })
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    releases.sort_by(|a, b| (a.added_unix, &a.name).cmp(&(b.added_unix, &b.name)));
    Ok(releases)
}

/// What [`add`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// The release is new.
    New,
    /// The same name and measurements were there already: nothing written.
    Present,
}

/// Adds `release` (the admin's call). The same name with the same measurements is a no-op;
/// another name for known measurements, or a known name for other measurements, is refused.
pub fn add(store: &dyn ClusterStore, release: &Release) -> Result<Added, ReleaseError> {
    for existing in list(store, ReadConsistency::Latest)? {
        match (
            existing.name == release.name,
            existing.digest == release.digest,
        ) {
            (true, true) if !existing.is_retired() => return Ok(Added::Present),
            (true, false) => {
                return Err(ReleaseError::NameTaken {
                    name: existing.name,
                    digest: existing.digest,
                });
            }
            (_, true) => {
                return Err(ReleaseError::SameMeasurements {
                    retired: existing.is_retired(),
                    existing: existing.name,
                });
            }
            (false, false) => {}
        }
    }
    if store.put_record(
        RecordKind::Release,
        &release.name,
        &release.to_json()?,
        PutMode::Create,
    )? {
        Ok(Added::New)
    } else {
        // Another admin call wrote this name between the read and the write.
        add(store, release)
    }
}

/// Retires release `name` (the admin's call): its nodes are refused by name from the next
/// policy refresh of every join service on. Retiring a retired release is a no-op; the last
/// accepted release cannot be retired.
pub fn retire(
    store: &dyn ClusterStore,
    name: &str,
    now_unix: u64,
) -> Result<Release, ReleaseError> {
    let releases = list(store, ReadConsistency::Latest)?;
    let Some(mut release) = releases.iter().find(|r| r.name == name).cloned() else {
        return Err(ReleaseError::Unknown {
            name: name.to_owned(),
            known: names(&releases),
        });
    };
    if release.is_retired() {
        return Ok(release);
    }
    if !releases.iter().any(|r| r.name != name && !r.is_retired()) {
        return Err(ReleaseError::LastAccepted(name.to_owned()));
    }
    release.retired_unix = Some(now_unix);
    store.put_record(
        RecordKind::Release,
        name,
        &release.to_json()?,
        PutMode::Replace,
    )?;
    Ok(release)
}

/// Writes `release` if the store holds no release at all (a join service at start: the first
/// control plane's image becomes the cluster's first release). Returns whether it wrote.
pub fn seed(store: &dyn ClusterStore, release: &Release) -> Result<bool, ReleaseError> {
    if !list(store, ReadConsistency::Latest)?.is_empty() {
        return Ok(false);
    }
    Ok(store.put_record(
        RecordKind::Release,
        &release.name,
        &release.to_json()?,
        PutMode::Create,
    )?)
}

fn names(releases: &[Release]) -> String {
    if releases.is_empty() {
        return "none".into();
    }
    releases
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The name a join service's own measurements go by when the store has no release of them:
/// `image-` and the first 12 hex digits of their digest.
pub fn own_release_name(digest: &str) -> String {
    format!("image-{}", &digest[..digest.len().min(12)])
}

/// What a join service accepts: every release in the store that is not retired, and its own
/// image's measurements (`own`, the `--measurements` file) unless a retired release has them;
/// the retired releases are refused by name. `own` goes by its release's name when the store
/// has it, else [`own_release_name`].
pub fn release_set(stored: &[Release], own: &ExpectedMeasurements) -> ReleaseSet {
    let own_enforced = enforced_map(own);
    let own_digest = measurements_digest(&own_enforced);
    let mut set = ReleaseSet::default();
    let own_stored = stored.iter().find(|r| r.digest == own_digest);
    match own_stored {
        Some(release) if release.is_retired() => {}
        Some(_) => {}
        None => set.accept(own_release_name(&own_digest), own.clone()),
    }
    for release in stored {
        if release.is_retired() {
            set.retire(release.name.clone(), release.expected());
        } else {
            set.accept(release.name.clone(), release.expected());
        }
    }
    set
}

/// The phases a running node quotes: (name, control-plane marker).
pub const RUNNING_PHASES: [(&str, bool); 2] = [("worker", false), ("control-plane", true)];

/// What a node of `release` quotes after its pivot, as a worker or a control plane, locked to
/// `cluster_id`: the release's image PCRs, PCR 11 after `leave-initrd` (with `control-plane`
/// before it when `control_plane`), PCR 15 the cluster's lock.
pub fn running_node_measurements(
    release: &Release,
    cluster_id: &[u8; 32],
    control_plane: bool,
) -> ExpectedMeasurements {
    let mut expected = release.expected();
    if let Some(enter) = expected.get(PCR_KERNEL_BOOT).map(|e| e.expected) {
        expected.insert(
            PCR_KERNEL_BOOT,
            ExpectedPcr {
                expected: pcr11_after_pivot(&enter, control_plane),
                warn_only: false,
            },
        );
    }
    expected.insert(
        PCR_CLUSTER_ID,
        ExpectedPcr {
            expected: cluster_lock_pcr(cluster_id),
            warn_only: false,
        },
    );
    expected
}

/// The phase of a node still in its initramfs, not locked to a cluster: it waits for its
/// disk's key (a node of a retired release stays there).
pub const INITRAMFS_PHASE: &str = "initramfs";

/// Every accepted release in both running phases and in its initramfs ([`INITRAMFS_PHASE`]:
/// PCR 11 after `enter-initrd`, PCR 15 zero), and the retired ones likewise (refused by name);
/// entries are named `<release> <phase>`.
pub fn running_release_set(releases: &[Release], cluster_id: &[u8; 32]) -> ReleaseSet {
    let mut set = ReleaseSet::default();
    for release in releases {
        let mut entries: Vec<(String, ExpectedMeasurements)> = RUNNING_PHASES
            .iter()
            .map(|(phase, control_plane)| {
                (
                    format!("{} {phase}", release.name),
                    running_node_measurements(release, cluster_id, *control_plane),
                )
            })
            .collect();
        let mut fresh = release.expected();
        fresh.insert(
            PCR_CLUSTER_ID,
            ExpectedPcr {
                expected: [0; 32],
                warn_only: false,
            },
        );
        entries.push((format!("{} {INITRAMFS_PHASE}", release.name), fresh));
        for (name, expected) in entries {
            if release.is_retired() {
                set.retire(name, expected);
            } else {
                set.accept(name, expected);
            }
        }
    }
    set
}

#[cfg(test)]
mod tests;
