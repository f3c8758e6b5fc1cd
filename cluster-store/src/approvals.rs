//! Which TPMs may join as control planes: an admin-managed allow-list of attestation-key names,
//! kept in step with a file without a restart.
//!
//! A node asks for a control-plane join with `role=control-plane` in its fw_cfg, which the host
//! sets and nothing measures; a control-plane join receives the cluster CA, the etcd CA and the
//! service-account keys. So the request alone is not enough: the AK that signed the node's aTLS
//! evidence (its TPM name, verified in the handshake) must be on this list.
//!
//! File format: one AK name per line, in hex (`000b` followed by the SHA-256 of the AK's
//! `TPMT_PUBLIC`, as a refusal prints it; case is ignored), blank lines and `#` comments (also
//! after a name) ignored.
//!
//! Reloads follow the measurements file's rules where they keep a door closed: an invalid file
//! is rejected and the old list stays (logged once per problem). Where the measurements file
//! keeps its old policy on deletion, this list does the opposite: a deleted file approves
//! nobody, which is also the state of a service with no file or a file that does not exist
//! yet.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::reload::ReloadOutcome;

/// Why an approvals file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalsError {
    /// The file exists but cannot be read.
    #[error("cannot read the control-plane approvals {path}")]
    Io {
        /// The approvals file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A line is neither blank, a comment, nor a hex AK name.
    #[error(
        "line {line} of the control-plane approvals is not an AK name (hex, `#` starts a comment): {text:?}"
    )]
    Line {
        /// 1-based line number.
        line: usize,
        /// The line, cut to 80 characters.
        text: String,
    },
}

/// A parsed approvals list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlPlaneApprovals {
    /// Approved AK names, lowercase hex.
    ak_names: BTreeSet<String>,
}

impl ControlPlaneApprovals {
    /// Parses the file format in the module docs.
    pub fn parse(text: &str) -> Result<Self, ApprovalsError> {
        let mut ak_names = BTreeSet::new();
        for (index, line) in text.lines().enumerate() {
            let name = line.split('#').next().unwrap_or_default().trim();
            if name.is_empty() {
                continue;
            }
            // A TPM name is a 2-byte algorithm identifier and a digest.
            let well_formed = name.len() >= 6
                && name.len() % 2 == 0
                && name.bytes().all(|b| b.is_ascii_hexdigit());
            if !well_formed {
                return Err(ApprovalsError::Line {
                    line: index + 1,
                    text: line.chars().take(80).collect(),
                });
            }
            ak_names.insert(name.to_ascii_lowercase());
        }
        Ok(Self { ak_names })
    }

    /// Whether the AK with TPM name `ak_name` may join as a control plane.
    pub fn approves(&self, ak_name: &[u8]) -> bool {
        self.ak_names.contains(&hex::encode(ak_name))
    }

    /// The approved AK names, lowercase hex.
    pub fn ak_names(&self) -> impl Iterator<Item = &str> {
        self.ak_names.iter().map(String::as_str)
    }

    /// How many AK names are approved.
    pub fn len(&self) -> usize {
        self.ak_names.len()
    }

    /// Whether nobody is approved.
    pub fn is_empty(&self) -> bool {
        self.ak_names.is_empty()
    }
}

/// The list in force and the digest of the file it came from (`None`: no file).
#[derive(Debug, Clone, Default)]
struct Current {
    approvals: Arc<ControlPlaneApprovals>,
    digest: Option<String>,
}

/// The control-plane approvals, kept in step with a file.
#[derive(Debug, Default)]
pub struct ApprovalStore {
    path: Option<PathBuf>,
    current: RwLock<Current>,
}

impl ApprovalStore {
    /// No file: every control-plane join is refused.
    pub fn none() -> Self {
        Self::default()
    }

    /// Loads the list from `path`; a missing file approves nobody (until it appears), an
    /// unreadable or invalid one is an error.
    pub fn load(path: &Path) -> Result<Self, ApprovalsError> {
        let store = Self {
            path: Some(path.to_owned()),
            current: RwLock::default(),
        };
        if let Some(text) = read(path)? {
            let approvals = ControlPlaneApprovals::parse(&text)?;
            store.set(Current {
                approvals: Arc::new(approvals),
                digest: Some(digest(&text)),
            });
        }
        Ok(store)
    }

    /// The file, if one is configured.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The list in force.
    pub fn current(&self) -> Arc<ControlPlaneApprovals> {
        Arc::clone(&self.get().approvals)
    }

    fn get(&self) -> Current {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            // A writer never panics while holding the lock (it only assigns); recover anyway.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set(&self, current: Current) {
        match self.current.write() {
            Ok(mut guard) => *guard = current,
            Err(poisoned) => *poisoned.into_inner() = current,
        }
    }

    /// Re-reads the file: a changed valid file replaces the list, an invalid one is rejected
    /// (the old list stays), a deleted one empties it.
    pub fn reload_if_changed(&self) -> ReloadOutcome {
        let Some(path) = &self.path else {
            return ReloadOutcome::Unchanged;
        };
        let text = match read(path) {
            Ok(Some(text)) => text,
            Ok(None) => {
                if self.get().digest.is_none() {
                    return ReloadOutcome::Unchanged;
                }
                self.set(Current::default());
                return ReloadOutcome::Missing;
            }
            Err(e) => {
                return ReloadOutcome::Rejected {
                    reason: hawser_attestation::error_chain(&e),
                };
            }
        };
        let new_digest = digest(&text);
        if self.get().digest.as_ref() == Some(&new_digest) {
            return ReloadOutcome::Unchanged;
        }
        match ControlPlaneApprovals::parse(&text) {
            Ok(approvals) => {
                self.set(Current {
                    approvals: Arc::new(approvals),
                    digest: Some(new_digest.clone()),
                });
                ReloadOutcome::Reloaded { digest: new_digest }
            }
            Err(e) => ReloadOutcome::Rejected {
                reason: hawser_attestation::error_chain(&e),
            },
        }
    }

    /// Checks the file every `interval` and logs what changed. Runs until the task is dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let mut last_problem = None;
        loop {
            tokio::time::sleep(interval).await;
            let outcome = self.reload_if_changed();
            match &outcome {
                ReloadOutcome::Unchanged => {}
                ReloadOutcome::Reloaded { digest } => tracing::info!(
                    file = %path.display(),
                    %digest,
                    approved = self.current().len(),
                    "control-plane approvals reloaded"
                ),
                ReloadOutcome::Rejected { reason } if last_problem.as_ref() != Some(&outcome) => {
                    tracing::error!(
                        file = %path.display(),
                        approved = self.current().len(),
                        "REJECTED new control-plane approvals, keeping the old list: {reason}"
                    );
                }
                ReloadOutcome::Missing => tracing::warn!(
                    file = %path.display(),
                    "control-plane approvals file is gone; every control-plane join is refused"
                ),
                ReloadOutcome::Rejected { .. } => {}
            }
            last_problem = match outcome {
                ReloadOutcome::Rejected { .. } => Some(outcome),
                _ => None,
            };
        }
    }
}

fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The file's text, `None` if it does not exist.
fn read(path: &Path) -> Result<Option<String>, ApprovalsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ApprovalsError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AK_A: &str = "000b1111111111111111111111111111111111111111111111111111111111111111";
    const AK_B: &str = "000b2222222222222222222222222222222222222222222222222222222222222222";

    fn name(hex_name: &str) -> Vec<u8> {
        hex::decode(hex_name).unwrap()
    }

    #[test]
    fn parses_names_comments_and_blank_lines() {
        let approvals = ControlPlaneApprovals::parse(&format!(
            "# control planes\n\n{AK_A}  # cp-2\n{}\n",
            AK_B.to_uppercase()
        ))
        .unwrap();
        assert_eq!(approvals.len(), 2);
        assert!(approvals.approves(&name(AK_A)));
        assert!(approvals.approves(&name(AK_B)));
        assert!(!approvals.approves(&name(&AK_A.replace('1', "3"))));
    }

    #[test]
    fn a_line_that_is_not_a_name_is_an_error_naming_the_line() {
        for bad in ["000b12 extra", "000b1", "not-hex-at-all", "max 3"] {
            let err = ControlPlaneApprovals::parse(&format!("{AK_A}\n{bad}\n")).unwrap_err();
            assert!(
                matches!(err, ApprovalsError::Line { line: 2, .. }),
                "{bad}: {err:?}"
            );
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn no_file_approves_nobody() {
        assert!(ApprovalStore::none().current().is_empty());
        let dir = tempfile::tempdir().unwrap();
        let store = ApprovalStore::load(&dir.path().join("absent")).unwrap();
        assert!(store.current().is_empty());
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Unchanged);
    }

    #[test]
    fn reloads_keep_the_old_list_on_a_bad_file_and_approve_nobody_once_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control-plane-approvals");
        let store = ApprovalStore::load(&path).unwrap();

        std::fs::write(&path, format!("{AK_A}\n")).unwrap();
        assert!(matches!(
            store.reload_if_changed(),
            ReloadOutcome::Reloaded { .. }
        ));
        assert!(store.current().approves(&name(AK_A)));
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Unchanged);

        std::fs::write(&path, format!("{AK_A}\n{AK_B}\nbogus\n")).unwrap();
        let outcome = store.reload_if_changed();
        assert!(
            matches!(&outcome, ReloadOutcome::Rejected { reason } if reason.contains("line 3")),
            "{outcome:?}"
        );
        assert!(store.current().approves(&name(AK_A)));
        assert!(!store.current().approves(&name(AK_B)));

        std::fs::remove_file(&path).unwrap();
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Missing);
        assert!(store.current().is_empty());
        assert_eq!(store.reload_if_changed(), ReloadOutcome::Unchanged);
    }

    #[test]
    fn an_invalid_file_at_start_up_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control-plane-approvals");
        std::fs::write(&path, "000b zz\n").unwrap();
        assert!(ApprovalStore::load(&path).is_err());
    }
}
