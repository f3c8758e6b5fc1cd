//! What kubeadm has still to do, and how its attempts went, kept on the encrypted state disk.
//!
//! - The **intent** ([`KUBEADM_INTENT`], 0600): what `kubeadm init|join` needs to run again —
//!   the rendered configuration (with the bootstrap token) and, for a control-plane join, the
//!   cluster's shared certificates and keys. The boot that formats the state disk keeps it
//!   there before it marks the disk initialized (`super::grants`), so a power cut at any later
//!   point leaves either kubeadm's marker (done) or the intent (to do).
//!   It holds secrets: it lives only on the encrypted state disk, its `Debug` shows none, and
//!   its errors never quote its contents.
//! - The **status** ([`KUBEADM_STATUS`]): done or pending, how many attempts started, and the
//!   last failure's reason chain (as logged: tokens and keys redacted). It is printed on the
//!   console after each attempt as one line after [`KUBEADM_STATUS_MARKER`], and the next boot
//!   puts a pending status into its boot report.
//!
//! Both are written atomically: a temporary file, fsynced, renamed over the old one, and the
//! directory fsynced.

use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::kube::kubeadm::KubeadmConfig;
use hawser_kube_types::ControlPlaneFile;

/// The kubeadm intent on the state disk (after the pivot).
pub const KUBEADM_INTENT: &str = "/var/lib/hawser/kubeadm-intent.json";
/// The kubeadm status on the state disk (after the pivot).
pub const KUBEADM_STATUS: &str = "/var/lib/hawser/kubeadm-status.json";
/// The prefix of the console line with the kubeadm status (compact JSON follows).
pub const KUBEADM_STATUS_MARKER: &str = "HAWSER_KUBEADM_STATUS ";
/// The intent format's version.
const INTENT_VERSION: u32 = 1;

pub use crate::kube::kubeadm::Verb;

/// What kubeadm needs to run again. Holds secrets: `Debug` shows only their sizes.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeadmIntent {
    pub verb: Verb,
    /// The configuration for `kubeadm <verb> --config`.
    pub config: KubeadmConfig,
    /// A control-plane join's shared certificates and keys (names relative to the PKI
    /// directory); put back before each attempt, since `kubeadm reset` removes them.
    pub control_plane_files: Vec<ControlPlaneFile>,
    /// The image's control-plane images (`/usr/share/hawser/kubernetes.json`), set after the
    /// pivot on every boot and never kept: they belong to the image, not to the cluster, so
    /// an intent kept before the pivot runs with them too ([`crate::kube::kubeadm::images`]).
    pub images: Option<hawser_kube_types::ImageSet>,
}

impl std::fmt::Debug for KubeadmIntent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeadmIntent")
            .field("verb", &self.verb)
            .field("config", &self.config)
            .field("control_plane_files", &self.control_plane_files)
            .field("images", &self.images)
            .finish()
    }
}

/// The intent as stored.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredIntent {
    version: u32,
    verb: Verb,
    config: String,
    control_plane_files: Vec<StoredFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredFile {
    name: String,
    data_base64: String,
}

impl Drop for StoredIntent {
    fn drop(&mut self) {
        use zeroize::Zeroize as _;
        self.config.zeroize();
        for file in &mut self.control_plane_files {
            file.data_base64.zeroize();
        }
    }
}

/// Why the intent or the status cannot be read or written. Messages never show the contents.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// The file exists but cannot be read (an I/O error on the state disk, permissions).
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file is not the JSON hawser writes (truncated, overwritten, another version's
    /// format). serde_json's message names a line and column, never the contents.
    #[error("{} is corrupt", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The file is well-formed JSON but its contents are not usable.
    #[error("{} is invalid: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, without the contents.
        reason: String,
    },
    /// The file cannot be written durably.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn invalid(path: &Path, reason: impl Into<String>) -> IntentError {
    IntentError::Invalid {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

impl KubeadmIntent {
    /// Writes the intent to `path` atomically, mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), IntentError> {
        let bytes = self.encode().map_err(|source| IntentError::Write {
            path: path.to_owned(),
            source,
        })?;
        crate::platform::fs::write_atomically(path, &bytes, 0o600).map_err(|source| {
            IntentError::Write {
                path: path.to_owned(),
                source,
            }
        })
    }

    /// The intent as [`KubeadmIntent::save`] writes it (and a first boot keeps it, before the
    /// state disk's "initialized" mark: `super::grants`).
    pub fn encode(&self) -> io::Result<Zeroizing<Vec<u8>>> {
        let stored = StoredIntent {
            version: INTENT_VERSION,
            verb: self.verb,
            config: self.config.as_str().to_owned(),
            control_plane_files: self
                .control_plane_files
                .iter()
                .map(|f| StoredFile {
                    name: f.name.clone(),
                    data_base64: base64::engine::general_purpose::STANDARD.encode(&*f.data),
                })
                .collect(),
        };
        serde_json::to_vec(&stored)
            .map(Zeroizing::new)
            .map_err(io::Error::other)
    }

    /// Reads the intent from `path`; `None` if there is none.
    pub fn load(path: &Path) -> Result<Option<KubeadmIntent>, IntentError> {
        let Some(bytes) = read_if_exists(path)? else {
            return Ok(None);
        };
        let bytes = Zeroizing::new(bytes);
        let stored: StoredIntent =
            serde_json::from_slice(&bytes).map_err(|source| IntentError::Corrupt {
                path: path.to_owned(),
                source,
            })?;
        if stored.version != INTENT_VERSION {
            return Err(invalid(
                path,
                format!(
                    "format version {} (this hawser reads {INTENT_VERSION})",
                    stored.version
                ),
            ));
        }
        let kind = stored.verb.document_kind();
        // The documents are JSON, compact or pretty-printed (`kubeadm::write_config`'s).
        let has_kind = [
            format!("\"kind\":\"{kind}\""),
            format!("\"kind\": \"{kind}\""),
        ]
        .iter()
        .any(|needle| stored.config.contains(needle.as_str()));
        if !has_kind {
            return Err(invalid(
                path,
                format!(
                    "the {} configuration has no {kind} document",
                    stored.verb.as_str()
                ),
            ));
        }
        let mut control_plane_files = Vec::with_capacity(stored.control_plane_files.len());
        for file in &stored.control_plane_files {
            let data = base64::engine::general_purpose::STANDARD
                .decode(&file.data_base64)
                .map_err(|_| {
                    invalid(
                        path,
                        format!("control-plane file {:?} is not base64", file.name),
                    )
                })?;
            control_plane_files.push(ControlPlaneFile {
                name: file.name.clone(),
                data: Zeroizing::new(data),
            });
        }
        Ok(Some(KubeadmIntent {
            verb: stored.verb,
            config: KubeadmConfig::from_stored(Zeroizing::new(stored.config.clone())),
            control_plane_files,
            images: None,
        }))
    }
}

/// Whether kubeadm is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KubeadmState {
    /// An attempt is running, or failed and another follows.
    Pending,
    /// kubeadm succeeded; its marker is written.
    Done,
}

/// How kubeadm's attempts went on this node (across boots).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeadmStatus {
    pub state: KubeadmState,
    pub verb: Verb,
    /// Attempts started, on every boot together.
    pub attempts: u32,
    /// The last failed attempt's reason chain (tokens and keys redacted); `None` before the
    /// first failure and after success.
    pub last_error: Option<String>,
}

impl KubeadmStatus {
    /// No attempt yet.
    pub fn new(verb: Verb) -> Self {
        KubeadmStatus {
            state: KubeadmState::Pending,
            verb,
            attempts: 0,
            last_error: None,
        }
    }

    /// Writes the status to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), IntentError> {
        let bytes = serde_json::to_vec(self).map_err(|e| IntentError::Write {
            path: path.to_owned(),
            source: io::Error::other(e),
        })?;
        crate::platform::fs::write_atomically(path, &bytes, 0o600).map_err(|source| {
            IntentError::Write {
                path: path.to_owned(),
                source,
            }
        })
    }

    /// Reads the status from `path`; `None` if there is none.
    pub fn load(path: &Path) -> Result<Option<KubeadmStatus>, IntentError> {
        let Some(bytes) = read_if_exists(path)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| IntentError::Corrupt {
                path: path.to_owned(),
                source,
            })
    }

    /// The console line: [`KUBEADM_STATUS_MARKER`] and the status as compact JSON.
    pub fn console_line(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned());
        format!("{KUBEADM_STATUS_MARKER}{json}")
    }

    /// The status found in a console line, if the line carries one.
    pub fn find_in_line(line: &str) -> Option<KubeadmStatus> {
        let (_, json) = line.split_once(KUBEADM_STATUS_MARKER)?;
        serde_json::from_str(json.trim()).ok()
    }

    /// One sentence for the boot report: what an earlier boot left pending.
    pub fn earlier_boot_summary(&self) -> Option<String> {
        match self.state {
            KubeadmState::Done => None,
            KubeadmState::Pending => Some(format!(
                "kubeadm {} is pending from an earlier boot after {} attempt(s); last failure: \
                 {}; this boot runs it again",
                self.verb.as_str(),
                self.attempts,
                self.last_error
                    .as_deref()
                    .unwrap_or("none recorded (the attempt was interrupted)")
            )),
        }
    }
}

/// What the boot report says about kubeadm, read from the state disk mounted at `state_root`
/// (before the pivot): a pending status, or a status that cannot be read.
pub fn boot_report_warning(state_root: &Path) -> Option<String> {
    let relative = KUBEADM_STATUS.trim_start_matches('/');
    match KubeadmStatus::load(&state_root.join(relative)) {
        Ok(Some(status)) => status.earlier_boot_summary(),
        Ok(None) => None,
        Err(e) => Some(format!(
            "kubeadm's status is unreadable: {}",
            crate::fatal::error_chain(&e)
        )),
    }
}

fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>, IntentError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IntentError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn intent() -> KubeadmIntent {
        KubeadmIntent {
            verb: Verb::Join,
            config: KubeadmConfig::from_stored(Zeroizing::new(format!(
                "{{\"kind\":\"JoinConfiguration\",\"token\":\"{TOKEN}\"}}\n"
            ))),
            control_plane_files: vec![ControlPlaneFile {
                name: "etcd/ca.key".into(),
                data: Zeroizing::new(b"KEY MATERIAL".to_vec()),
            }],
            images: None,
        }
    }

    #[test]
    fn an_intent_round_trips_with_mode_0600_and_no_temporary_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("var/lib/hawser/kubeadm-intent.json");
        intent().save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!path.with_extension("json.tmp").exists());
        assert_eq!(KubeadmIntent::load(&path).unwrap().unwrap(), intent());
        // Saved again over the old one (a later write replaces, never appends).
        let mut init = intent();
        init.verb = Verb::Init;
        init.config =
            KubeadmConfig::from_stored(Zeroizing::new("{\"kind\":\"InitConfiguration\"}".into()));
        init.control_plane_files.clear();
        init.save(&path).unwrap();
        assert_eq!(KubeadmIntent::load(&path).unwrap().unwrap(), init);
    }

    #[test]
    fn a_missing_intent_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            KubeadmIntent::load(&dir.path().join("kubeadm-intent.json"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_corrupt_intent_is_a_clear_error_that_shows_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeadm-intent.json");
        intent().save(&path).unwrap();
        let full = std::fs::read(&path).unwrap();
        // A torn write (what a broken disk or a bug could leave).
        std::fs::write(&path, &full[..full.len() / 2]).unwrap();
        let err = KubeadmIntent::load(&path).unwrap_err();
        let chain = crate::fatal::error_chain(&err);
        assert!(
            chain.starts_with(&format!("{} is corrupt: ", path.display())),
            "{chain}"
        );
        assert!(!chain.contains("0123456789abcdef"), "{chain}");
        // Valid JSON of the wrong shape, and a configuration of the wrong verb.
        std::fs::write(&path, "{\"version\":1}").unwrap();
        assert!(matches!(
            KubeadmIntent::load(&path),
            Err(IntentError::Corrupt { .. })
        ));
        std::fs::write(
            &path,
            "{\"version\":1,\"verb\":\"init\",\"config\":\"{\\\"kind\\\":\\\"JoinConfiguration\\\"}\",\"control_plane_files\":[]}",
        )
        .unwrap();
        assert_eq!(
            KubeadmIntent::load(&path).unwrap_err().to_string(),
            format!(
                "{} is invalid: the init configuration has no InitConfiguration document",
                path.display()
            )
        );
    }

    #[test]
    fn debug_shows_no_secret() {
        let text = format!("{:?}", intent());
        assert!(!text.contains("0123456789abcdef"), "{text}");
        assert!(!text.contains("KEY MATERIAL"), "{text}");
    }

    #[test]
    fn a_status_round_trips_and_its_console_line_parses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeadm-status.json");
        assert!(KubeadmStatus::load(&path).unwrap().is_none());
        let status = KubeadmStatus {
            state: KubeadmState::Pending,
            verb: Verb::Join,
            attempts: 2,
            last_error: Some("kubeadm join failed: discovery".into()),
        };
        status.save(&path).unwrap();
        assert_eq!(KubeadmStatus::load(&path).unwrap().unwrap(), status);
        let line = status.console_line();
        assert!(line.starts_with("HAWSER_KUBEADM_STATUS {\"state\":\"pending\""));
        assert_eq!(
            KubeadmStatus::find_in_line(&format!("[  12.3] {line}")),
            Some(status)
        );
    }

    #[test]
    fn the_boot_report_names_a_pending_kubeadm_and_its_last_failure() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("var/lib/hawser/kubeadm-status.json");
        assert_eq!(boot_report_warning(root.path()), None);
        let mut status = KubeadmStatus::new(Verb::Join);
        status.attempts = 1;
        status.save(&path).unwrap();
        assert_eq!(
            boot_report_warning(root.path()).unwrap(),
            "kubeadm join is pending from an earlier boot after 1 attempt(s); last failure: \
             none recorded (the attempt was interrupted); this boot runs it again"
        );
        status.state = KubeadmState::Done;
        status.save(&path).unwrap();
        assert_eq!(boot_report_warning(root.path()), None);
        std::fs::write(&path, "{").unwrap();
        assert!(
            boot_report_warning(root.path())
                .unwrap()
                .starts_with("kubeadm's status is unreadable: ")
        );
    }
}
