//! The expected-measurements policy, reloaded when its file changes, without a restart, and
//! combined with the cluster's releases in the cluster store ([`PolicyStore::set_releases`]):
//! the join service accepts its own image (the file) unless the admin retired it, and every
//! release the admin added; a retired release is refused by name (`docs/lifecycle.md`).
//!
//! A new file that cannot be parsed, or that enforces no PCR (`{}`, or every entry `warnOnly`:
//! no validator can be made from it, so every later handshake would be refused), is rejected
//! and the old policy stays in force, loudly (an error log line once per problem); a deleted
//! file likewise keeps the old policy, so a half-finished `mv` never opens the door. At
//! start-up the same files are an error. Readers clone an `Arc` of the
//! current policy and validate without holding any lock.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hawser_attestation::measurements::{ExpectedMeasurements, MeasurementsError};
use hawser_attestation::releases::ReleaseSet;
use hawser_cluster_store::releases::{self as store_releases, Release};
use sha2::{Digest, Sha256};

/// The policy in force and where it came from.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The file's measurements: this join service's own image.
    pub measurements: Arc<ExpectedMeasurements>,
    /// What is accepted now: the file's measurements (unless retired) and the store's releases.
    pub releases: Arc<ReleaseSet>,
    /// sha256 of the file content, and of the store's releases when there are any, for the
    /// audit log and to rebuild the aTLS validator when either changes.
    pub digest: String,
}

/// The file's part of the policy.
#[derive(Debug, Clone)]
struct FilePolicy {
    measurements: Arc<ExpectedMeasurements>,
    digest: String,
}

impl Policy {
    fn combine(file: &FilePolicy, stored: &[Release]) -> Self {
        if stored.is_empty() {
            return Self {
                releases: Arc::new(ReleaseSet::single(
                    store_releases::own_release_name(&store_releases::measurements_digest(
                        &store_releases::enforced_map(&file.measurements),
                    )),
                    (*file.measurements).clone(),
                )),
                measurements: Arc::clone(&file.measurements),
                digest: file.digest.clone(),
            };
        }
        let mut hasher = Sha256::new();
        hasher.update(file.digest.as_bytes());
        for release in stored {
            hasher.update(format!(
                "\n{} {} {:?}",
                release.name, release.digest, release.retired_unix
            ));
        }
        Self {
            releases: Arc::new(store_releases::release_set(stored, &file.measurements)),
            measurements: Arc::clone(&file.measurements),
            digest: hex::encode(hasher.finalize()),
        }
    }
}

/// Why a measurements file cannot become the policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file cannot be read, or is not a valid expected-measurements file.
    #[error(transparent)]
    Measurements(#[from] MeasurementsError),
    /// The file is valid but enforces no PCR (`{}`, or every entry `warnOnly`).
    #[error(
        "the expected measurements in {path} enforce no PCR (the file is empty or every entry is warnOnly); at least one PCR must be enforced"
    )]
    NothingEnforced {
        /// The measurements file.
        path: String,
    },
}

/// What a reload check did (shared with the control-plane approvals, kept in the cluster
/// store's crate).
pub use hawser_cluster_store::reload::ReloadOutcome;

/// The expected measurements, kept in step with a file.
#[derive(Debug)]
pub struct PolicyStore {
    path: PathBuf,
    file: RwLock<FilePolicy>,
    stored: RwLock<Vec<Release>>,
    current: RwLock<Policy>,
}

fn write<T>(lock: &RwLock<T>, value: T) {
    match lock.write() {
        Ok(mut guard) => *guard = value,
        // A writer never panics while holding the lock (it only assigns).
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    match lock.read() {
        Ok(guard) => guard.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Parses a measurements file and refuses one that enforces nothing.
fn parse(path: &Path, text: &str) -> Result<ExpectedMeasurements, PolicyError> {
    let measurements = ExpectedMeasurements::from_json(text)?;
    if measurements.enforced().next().is_none() {
        return Err(PolicyError::NothingEnforced {
            path: path.display().to_string(),
        });
    }
    Ok(measurements)
}

impl PolicyStore {
    /// Loads the policy; a missing or invalid file, or one that enforces no PCR, is an error.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| MeasurementsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let measurements = parse(path, &text)?;
        let file = FilePolicy {
            measurements: Arc::new(measurements),
            digest: digest(text.as_bytes()),
        };
        Ok(Self {
            path: path.to_owned(),
            current: RwLock::new(Policy::combine(&file, &[])),
            file: RwLock::new(file),
            stored: RwLock::new(Vec::new()),
        })
    }

    /// The policy in force (an `Arc` clone: validate without holding a lock).
    pub fn current(&self) -> Policy {
        read(&self.current)
    }

    /// Takes the releases read from the cluster store; returns whether the policy changed.
    pub fn set_releases(&self, releases: Vec<Release>) -> bool {
        if read(&self.stored) == releases {
            return false;
        }
        write(&self.current, Policy::combine(&read(&self.file), &releases));
        write(&self.stored, releases);
        true
    }

    /// The releases last read from the cluster store.
    pub fn stored_releases(&self) -> Vec<Release> {
        read(&self.stored)
    }

    /// Re-reads the file and swaps the policy if it changed and is valid.
    pub fn reload_if_changed(&self) -> ReloadOutcome {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return ReloadOutcome::Missing,
            Err(e) => {
                return ReloadOutcome::Rejected {
                    reason: e.to_string(),
                };
            }
        };
        let new_digest = digest(text.as_bytes());
        if new_digest == read(&self.file).digest {
            return ReloadOutcome::Unchanged;
        }
        match parse(&self.path, &text) {
            Ok(measurements) => {
                let file = FilePolicy {
                    measurements: Arc::new(measurements),
                    digest: new_digest.clone(),
                };
                write(&self.current, Policy::combine(&file, &read(&self.stored)));
                write(&self.file, file);
                ReloadOutcome::Reloaded { digest: new_digest }
            }
            Err(e) => ReloadOutcome::Rejected {
                reason: hawser_attestation::error_chain(&e),
            },
        }
    }

    /// Checks the file every `interval` and logs what changed. Runs until the task is dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut last_problem = None;
        loop {
            tokio::time::sleep(interval).await;
            let outcome = self.reload_if_changed();
            match &outcome {
                ReloadOutcome::Unchanged => {}
                ReloadOutcome::Reloaded { digest } => {
                    tracing::info!(file = %self.path.display(), %digest, "expected measurements reloaded");
                }
                ReloadOutcome::Rejected { reason } if last_problem.as_ref() != Some(&outcome) => {
                    tracing::error!(
                        file = %self.path.display(),
                        kept = %self.current().digest,
                        "REJECTED new expected measurements, keeping the old policy: {reason}"
                    );
                }
                ReloadOutcome::Missing if last_problem.as_ref() != Some(&outcome) => {
                    tracing::error!(
                        file = %self.path.display(),
                        kept = %self.current().digest,
                        "expected measurements file is gone; keeping the old policy"
                    );
                }
                _ => {}
            }
            last_problem = match outcome {
                ReloadOutcome::Rejected { .. } | ReloadOutcome::Missing => Some(outcome),
                _ => None,
            };
        }
    }
}

impl PolicyStore {
    /// Reads the cluster's releases from `store` now and then every `interval`, and takes them
    /// into the policy ([`PolicyStore::set_releases`]); logs each change, and a failed read once
    /// (the last releases read stay in force). Runs until the task is dropped.
    pub async fn follow_releases(
        self: Arc<Self>,
        store: Arc<dyn hawser_cluster_store::ClusterStore>,
        interval: Duration,
    ) {
        let mut failing = false;
        loop {
            let reader = Arc::clone(&store);
            let read = tokio::task::spawn_blocking(move || {
                store_releases::list(
                    reader.as_ref(),
                    hawser_cluster_store::ReadConsistency::LatestOrLocal,
                )
            })
            .await;
            match read {
                Ok(Ok(releases)) => {
                    failing = false;
                    if self.set_releases(releases) {
                        let policy = self.current();
                        let names = |list: &[hawser_attestation::releases::NamedMeasurements]| {
                            list.iter()
                                .map(|r| r.name.as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        };
                        tracing::info!(
                            accepted = %names(policy.releases.accepted()),
                            retired = %names(policy.releases.retired()),
                            policy = %&policy.digest[..16],
                            "the cluster's releases changed"
                        );
                    }
                }
                Ok(Err(e)) if !failing => {
                    failing = true;
                    tracing::error!(
                        "cannot read the cluster's releases; keeping those last read: {}",
                        hawser_attestation::error_chain(&e)
                    );
                }
                Ok(Err(_)) => {}
                Err(e) => tracing::error!("the task reading the cluster's releases failed: {e}"),
            }
            tokio::time::sleep(interval).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(pcr4: &str) -> String {
        format!(
            r#"{{"4": {{"expected": "{pcr4}", "warnOnly": false}}, "0": {{"expected": "{z}", "warnOnly": true}}}}"#,
            z = "00".repeat(32)
        )
    }

    #[test]
    fn reloads_good_files_keeps_old_policy_on_bad_or_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("measurements.json");
        std::fs::write(&path, file(&"aa".repeat(32))).unwrap();
        let store = PolicyStore::load(&path).unwrap();
        let first = store.current();
        assert_eq!(first.measurements.get(4).unwrap().expected, [0xaa; 32]);
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Unchanged);

        std::fs::write(&path, file(&"bb".repeat(32))).unwrap();
        assert!(matches!(
            store.reload_if_changed(),
            ReloadOutcome::Reloaded { .. }
        ));
        assert_eq!(
            store.current().measurements.get(4).unwrap().expected,
            [0xbb; 32]
        );
        // A reader that cloned the old policy keeps a consistent view.
        assert_eq!(first.measurements.get(4).unwrap().expected, [0xaa; 32]);

        std::fs::write(&path, r#"{"4": {"expected": "zz"}}"#).unwrap();
        let outcome = store.reload_if_changed();
        assert!(
            matches!(&outcome, ReloadOutcome::Rejected { reason } if reason.contains("PCR 4")),
            "{outcome:?}"
        );
        assert_eq!(
            store.current().measurements.get(4).unwrap().expected,
            [0xbb; 32]
        );

        std::fs::remove_file(&path).unwrap();
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Missing);
        assert_eq!(
            store.current().measurements.get(4).unwrap().expected,
            [0xbb; 32]
        );

        std::fs::write(&path, file(&"cc".repeat(32))).unwrap();
        assert!(matches!(
            store.reload_if_changed(),
            ReloadOutcome::Reloaded { .. }
        ));
        assert_eq!(
            store.current().measurements.get(4).unwrap().expected,
            [0xcc; 32]
        );
    }

    #[test]
    fn a_bad_file_at_start_up_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        assert!(PolicyStore::load(&path).is_err());
        std::fs::write(&path, "[]").unwrap();
        assert!(PolicyStore::load(&path).is_err());
    }

    #[test]
    fn a_file_that_enforces_nothing_is_refused_at_start_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let warn_only = format!(
            r#"{{"4": {{"expected": "{}", "warnOnly": true}}}}"#,
            "aa".repeat(32)
        );
        for text in ["{}", r#"{"measurementsVersion": 1}"#, &warn_only] {
            std::fs::write(&path, text).unwrap();
            let err = PolicyStore::load(&path).unwrap_err();
            assert!(
                matches!(err, PolicyError::NothingEnforced { .. }),
                "{text}: {err:?}"
            );
            assert!(err.to_string().contains("enforce no PCR"), "{err}");
        }
    }

    #[test]
    fn a_file_that_enforces_nothing_is_rejected_on_reload_and_the_old_policy_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        std::fs::write(&path, file(&"aa".repeat(32))).unwrap();
        let store = PolicyStore::load(&path).unwrap();
        let kept = store.current().digest;
        let warn_only = format!(
            r#"{{"4": {{"expected": "{}", "warnOnly": true}}}}"#,
            "bb".repeat(32)
        );
        for text in ["{}", &warn_only] {
            std::fs::write(&path, text).unwrap();
            let outcome = store.reload_if_changed();
            assert!(
                matches!(&outcome, ReloadOutcome::Rejected { reason } if reason.contains("enforce no PCR")),
                "{text}: {outcome:?}"
            );
            assert_eq!(store.current().digest, kept);
            assert_eq!(
                store.current().measurements.get(4).unwrap().expected,
                [0xaa; 32]
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_watcher_picks_up_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        std::fs::write(&path, file(&"aa".repeat(32))).unwrap();
        let store = Arc::new(PolicyStore::load(&path).unwrap());
        let watcher = tokio::spawn(Arc::clone(&store).watch(Duration::from_secs(1)));
        std::fs::write(&path, file(&"dd".repeat(32))).unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            store.current().measurements.get(4).unwrap().expected,
            [0xdd; 32]
        );
        watcher.abort();
    }
}
