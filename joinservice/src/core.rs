//! The join decisions, free of gRPC: check the verified peer's PCRs against the current policy,
//! derive its disk key, issue a bootstrap token, remember the disk, audit the decision.
//!
//! The aTLS layer has already verified the evidence itself (quote signature, freshness, binding
//! to the TLS key, AK certificate chain); this layer applies the expected measurements, which
//! may have been reloaded since the handshake began.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hawser_attestation::measurements::{ExpectedMeasurements, MeasurementMismatch};
use hawser_keys::{MasterSecret, STATE_DISK_KEY_LEN};
use hawser_kube_types::{DnsSubdomain, DnsSubdomainError};
use zeroize::Zeroizing;

use crate::audit::{self, Decision, Outcome};
use crate::policy::PolicyStore;
use crate::tokens::{BootstrapTokenIssuer, JoinCredentials, TokenError};

/// A join request, as the service received it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub disk_uuid: String,
    pub node_name: String,
    pub is_control_plane: bool,
}

/// The verified facts about the peer the aTLS handshake established.
#[derive(Debug, Clone)]
pub struct VerifiedPeer {
    pub address: Option<IpAddr>,
    /// sha256-bank PCR values from the peer's verified quote.
    pub pcrs: BTreeMap<u8, [u8; 32]>,
}

/// A control-plane file: name relative to /etc/kubernetes/pki, and its (secret) content.
pub type ControlPlaneFile = (String, Zeroizing<Vec<u8>>);

/// What a joining node receives. Debug never shows a secret.
pub struct JoinTicket {
    pub state_disk_key: Zeroizing<[u8; STATE_DISK_KEY_LEN]>,
    pub measurement_secret: Zeroizing<[u8; 32]>,
    pub measurement_salt: Vec<u8>,
    pub credentials: JoinCredentials,
    pub kubernetes_version: String,
    /// For control-plane joins: (name relative to /etc/kubernetes/pki, content).
    pub control_plane_files: Vec<ControlPlaneFile>,
}

impl std::fmt::Debug for JoinTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinTicket")
            .field(
                "state_disk_key",
                &hawser_keys::fingerprint(&*self.state_disk_key),
            )
            .field("credentials", &self.credentials)
            .field("kubernetes_version", &self.kubernetes_version)
            .field(
                "control_plane_files",
                &self
                    .control_plane_files
                    .iter()
                    .map(|(n, _)| n)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What a rebooting node receives.
pub struct RejoinTicket {
    pub state_disk_key: Zeroizing<[u8; STATE_DISK_KEY_LEN]>,
    pub measurement_secret: Zeroizing<[u8; 32]>,
    pub measurement_salt: Vec<u8>,
}

impl std::fmt::Debug for RejoinTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RejoinTicket")
            .field(
                "state_disk_key",
                &hawser_keys::fingerprint(&*self.state_disk_key),
            )
            .finish_non_exhaustive()
    }
}

/// Why a request was refused. Its chain ([`hawser_attestation::error_chain`]) is what the peer
/// and the audit log see.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Enforced PCRs of the peer differ from the expected measurements.
    #[error(transparent)]
    Measurements(#[from] MeasurementMismatch),
    /// The request's disk UUID is not a UUID.
    #[error("malformed request: the disk UUID is unusable")]
    DiskUuid(#[source] hawser_keys::KeyError),
    /// The request's node name is not a Kubernetes node name.
    #[error("malformed request: node name {name:?} is not a DNS subdomain")]
    NodeName {
        /// The name, cut to 80 characters.
        name: String,
        #[source]
        source: DnsSubdomainError,
    },
    /// The request asks for something this join service does not do.
    #[error("malformed request: {0}")]
    BadRequest(String),
    /// A rejoin for a disk that is not in the registry of joined disks.
    #[error("disk {0} never joined this cluster; a new node must use IssueJoinTicket")]
    UnknownDisk(String),
    /// The bootstrap token issuer (kubeadm) failed.
    #[error("cannot issue a bootstrap token")]
    Token(#[from] TokenError),
    /// A control-plane certificate or key could not be read from the PKI directory.
    #[error("cannot read control-plane file {path}")]
    ControlPlaneFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The registry of joined disks could not be read or appended to.
    #[error("cannot record the joined disk in {path}")]
    Registry {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The state disk key could not be derived from the master secret.
    #[error("internal error: cannot derive the state disk key")]
    DiskKey(#[source] hawser_keys::KeyError),
}

/// The files kubeadm needs for a control-plane join, relative to /etc/kubernetes/pki.
pub const CONTROL_PLANE_FILES: &[&str] = &[
    "ca.crt",
    "ca.key",
    "sa.key",
    "sa.pub",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
];

/// Configuration of the core.
pub struct JoinCoreConfig {
    pub master_secret: MasterSecret,
    pub measurement_salt: Vec<u8>,
    pub kubernetes_version: String,
    pub token_ttl: Duration,
    /// Where the cluster's PKI lives (for control-plane joins); `None` refuses them.
    pub pki_dir: Option<PathBuf>,
    /// A file listing the disk UUIDs that joined (one per line), for rejoins.
    pub registry_file: PathBuf,
}

/// The join service's decisions.
pub struct JoinCore {
    policy: Arc<PolicyStore>,
    tokens: Arc<dyn BootstrapTokenIssuer>,
    config: JoinCoreConfig,
    joined: Mutex<BTreeSet<String>>,
}

impl JoinCore {
    /// A core over `policy` and `tokens`; reads the registry of joined disks.
    pub fn new(
        policy: Arc<PolicyStore>,
        tokens: Arc<dyn BootstrapTokenIssuer>,
        config: JoinCoreConfig,
    ) -> Result<Self, JoinError> {
        let joined = match std::fs::read_to_string(&config.registry_file) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(source) => {
                return Err(JoinError::Registry {
                    path: config.registry_file.display().to_string(),
                    source,
                });
            }
        };
        Ok(Self {
            policy,
            tokens,
            config,
            joined: Mutex::new(joined),
        })
    }

    /// The policy store (for reload watching).
    pub fn policy(&self) -> &Arc<PolicyStore> {
        &self.policy
    }

    /// Decides a join. Blocking (token issuance runs kubeadm): call from `spawn_blocking`.
    pub fn issue_join_ticket(
        &self,
        peer: &VerifiedPeer,
        req: &JoinRequest,
    ) -> Result<JoinTicket, JoinError> {
        let suffix = if req.is_control_plane {
            " (control plane)"
        } else {
            ""
        };
        self.audited(
            "IssueJoinTicket",
            peer,
            &req.node_name,
            &req.disk_uuid,
            |expected| self.join(peer, req, expected),
            |ticket| {
                format!(
                    "key {} issued{suffix}",
                    hawser_keys::fingerprint(&*ticket.state_disk_key)
                )
            },
        )
    }

    /// Runs one decision against the current policy and writes its audit line.
    fn audited<T>(
        &self,
        call: &'static str,
        peer: &VerifiedPeer,
        node: &str,
        disk_uuid: &str,
        decide: impl FnOnce(&ExpectedMeasurements) -> Result<T, JoinError>,
        granted: impl FnOnce(&T) -> String,
    ) -> Result<T, JoinError> {
        let policy = self.policy.current();
        let checked: Vec<u8> = policy.measurements.enforced().collect();
        let result = decide(&policy.measurements);
        let (outcome, reason) = match &result {
            Ok(value) => (Outcome::Granted, granted(value)),
            Err(e) => (Outcome::Refused, hawser_attestation::error_chain(e)),
        };
        audit::record(&Decision {
            call,
            peer: peer.address,
            node,
            disk_uuid,
            pcrs_checked: &checked,
            policy_digest: &policy.digest,
            outcome,
            reason: &reason,
        });
        result
    }

    fn join(
        &self,
        peer: &VerifiedPeer,
        req: &JoinRequest,
        expected: &ExpectedMeasurements,
    ) -> Result<JoinTicket, JoinError> {
        let uuid = hawser_keys::canonical_uuid(&req.disk_uuid).map_err(JoinError::DiskUuid)?;
        validate_node_name(&req.node_name)?;
        check_measurements(peer, expected)?;
        let control_plane_files = if req.is_control_plane {
            self.control_plane_files()?
        } else {
            Vec::new()
        };
        let credentials = self.tokens.issue(self.config.token_ttl)?;
        let state_disk_key = self.state_disk_key(&uuid)?;
        self.remember(&uuid)?;
        Ok(JoinTicket {
            state_disk_key,
            measurement_secret: self.config.master_secret.measurement_secret(),
            measurement_salt: self.config.measurement_salt.clone(),
            credentials,
            kubernetes_version: self.config.kubernetes_version.clone(),
            control_plane_files,
        })
    }

    /// Decides a rejoin: only for disks that joined before.
    pub fn issue_rejoin_ticket(
        &self,
        peer: &VerifiedPeer,
        disk_uuid: &str,
    ) -> Result<RejoinTicket, JoinError> {
        self.audited(
            "IssueRejoinTicket",
            peer,
            "",
            disk_uuid,
            |expected| {
                let uuid = hawser_keys::canonical_uuid(disk_uuid).map_err(JoinError::DiskUuid)?;
                check_measurements(peer, expected)?;
                if !self.lock_joined().contains(&uuid) {
                    return Err(JoinError::UnknownDisk(uuid));
                }
                Ok(RejoinTicket {
                    state_disk_key: self.state_disk_key(&uuid)?,
                    measurement_secret: self.config.master_secret.measurement_secret(),
                    measurement_salt: self.config.measurement_salt.clone(),
                })
            },
            |ticket| {
                format!(
                    "key {} issued",
                    hawser_keys::fingerprint(&*ticket.state_disk_key)
                )
            },
        )
    }

    fn state_disk_key(&self, uuid: &str) -> Result<Zeroizing<[u8; STATE_DISK_KEY_LEN]>, JoinError> {
        self.config
            .master_secret
            .state_disk_key(uuid)
            .map_err(JoinError::DiskKey)
    }

    fn lock_joined(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        match self.joined.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records a joined disk (in memory and appended to the registry file).
    fn remember(&self, uuid: &str) -> Result<(), JoinError> {
        use std::io::Write as _;
        let mut joined = self.lock_joined();
        if joined.contains(uuid) {
            return Ok(());
        }
        let path = &self.config.registry_file;
        let io = |source| JoinError::Registry {
            path: path.display().to_string(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        writeln!(file, "{uuid}")
            .and_then(|()| file.sync_data())
            .map_err(io)?;
        joined.insert(uuid.to_owned());
        Ok(())
    }

    fn control_plane_files(&self) -> Result<Vec<ControlPlaneFile>, JoinError> {
        let Some(dir) = &self.config.pki_dir else {
            return Err(JoinError::BadRequest(
                "this join service does not hand out control-plane certificates".into(),
            ));
        };
        CONTROL_PLANE_FILES
            .iter()
            .map(|name| read_secret_file(&dir.join(name)).map(|data| ((*name).to_owned(), data)))
            .collect()
    }
}

fn read_secret_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, JoinError> {
    std::fs::read(path)
        .map(Zeroizing::new)
        .map_err(|source| JoinError::ControlPlaneFile {
            path: path.display().to_string(),
            source,
        })
}

fn check_measurements(
    peer: &VerifiedPeer,
    expected: &hawser_attestation::measurements::ExpectedMeasurements,
) -> Result<(), JoinError> {
    match expected.check(&peer.pcrs) {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!(target: "audit", "{w}");
            }
            Ok(())
        }
        Err(mismatch) => Err(JoinError::Measurements(mismatch)),
    }
}

/// A Kubernetes node name: a DNS subdomain (RFC 1123), at most 253 characters.
fn validate_node_name(name: &str) -> Result<(), JoinError> {
    match name.parse::<DnsSubdomain>() {
        Ok(_) => Ok(()),
        Err(source) => Err(JoinError::NodeName {
            name: name.chars().take(80).collect(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::KubeadmTokenIssuer;

    const UUID: &str = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

    struct Fixture {
        _dir: tempfile::TempDir,
        core: JoinCore,
        master: MasterSecret,
        measurements: PathBuf,
    }

    fn fixture(pki: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let measurements = dir.path().join("measurements.json");
        std::fs::write(
            &measurements,
            format!(r#"{{"9": {{"expected": "{}", "warnOnly": false}}, "0": {{"expected": "{}", "warnOnly": true}}}}"#, "99".repeat(32), "00".repeat(32)),
        )
        .unwrap();
        let kubeconfig = dir.path().join("admin.conf");
        std::fs::write(&kubeconfig, "kind: Config\n").unwrap();
        let pki_dir = dir.path().join("pki");
        if pki {
            for name in CONTROL_PLANE_FILES {
                let path = pki_dir.join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, format!("content of {name}")).unwrap();
            }
        }
        let master = MasterSecret::new(vec![5; 32], vec![6; 32]).unwrap();
        let core = JoinCore::new(
            Arc::new(PolicyStore::load(&measurements).unwrap()),
            Arc::new(KubeadmTokenIssuer {
                kubeadm: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/kubeadm-standin"),
                kubeconfig,
            }),
            JoinCoreConfig {
                master_secret: master.clone(),
                measurement_salt: vec![7; 32],
                kubernetes_version: "v1.33.4".into(),
                token_ttl: Duration::from_secs(3600),
                pki_dir: pki.then_some(pki_dir),
                registry_file: dir.path().join("joined"),
            },
        )
        .unwrap();
        Fixture {
            _dir: dir,
            core,
            master,
            measurements,
        }
    }

    fn peer(pcr9: u8) -> VerifiedPeer {
        VerifiedPeer {
            address: Some("127.0.0.1".parse().unwrap()),
            pcrs: BTreeMap::from([(9, [pcr9; 32]), (0, [1; 32])]),
        }
    }

    fn request(control_plane: bool) -> JoinRequest {
        JoinRequest {
            disk_uuid: UUID.to_uppercase(),
            node_name: "worker-1".into(),
            is_control_plane: control_plane,
        }
    }

    #[test]
    fn a_genuine_node_gets_the_key_of_its_disk_and_can_rejoin() {
        let f = fixture(false);
        let ticket = f
            .core
            .issue_join_ticket(&peer(0x99), &request(false))
            .unwrap();
        assert_eq!(
            *ticket.state_disk_key,
            *f.master.state_disk_key(UUID).unwrap()
        );
        assert_eq!(*ticket.measurement_secret, *f.master.measurement_secret());
        assert!(
            !format!("{ticket:?}").contains(ticket.credentials.bootstrap_token.expose_secret())
        );
        assert!(!format!("{ticket:?}").contains(&hex::encode(&ticket.state_disk_key[..8])));
        let rejoin = f.core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
        assert_eq!(*rejoin.state_disk_key, *ticket.state_disk_key);
    }

    #[test]
    fn a_wrong_pcr_is_refused_naming_expected_and_actual() {
        let f = fixture(false);
        let err = f
            .core
            .issue_join_ticket(&peer(0x98), &request(false))
            .unwrap_err();
        let msg = hawser_attestation::error_chain(&err);
        assert!(
            msg.contains("PCR 9")
                && msg.contains(&"99".repeat(32))
                && msg.contains(&"98".repeat(32)),
            "{msg}"
        );
        // warnOnly PCR 0 differs too, but is not a reason to refuse.
        assert!(!msg.contains("PCR 0"), "{msg}");
    }

    #[test]
    fn rejoin_of_an_unknown_disk_is_refused_and_the_registry_survives_restarts() {
        let f = fixture(false);
        let err = f.core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap_err();
        assert!(matches!(err, JoinError::UnknownDisk(_)), "{err}");
        f.core
            .issue_join_ticket(&peer(0x99), &request(false))
            .unwrap();
        let again = JoinCore::new(
            Arc::clone(f.core.policy()),
            Arc::new(KubeadmTokenIssuer {
                kubeadm: "/nonexistent".into(),
                kubeconfig: "/nonexistent".into(),
            }),
            JoinCoreConfig {
                master_secret: f.master.clone(),
                measurement_salt: vec![7; 32],
                kubernetes_version: "v1.33.4".into(),
                token_ttl: Duration::from_secs(60),
                pki_dir: None,
                registry_file: f.core.config.registry_file.clone(),
            },
        )
        .unwrap();
        again.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
    }

    #[test]
    fn malformed_requests_are_refused_with_the_reason() {
        let f = fixture(false);
        let mut bad = request(false);
        bad.disk_uuid = "../../etc/passwd".into();
        let err = f.core.issue_join_ticket(&peer(0x99), &bad).unwrap_err();
        let chain = hawser_attestation::error_chain(&err);
        assert!(chain.contains("is not a UUID"), "{chain}");
        let mut bad = request(false);
        bad.node_name = "Worker_1".into();
        let err = f.core.issue_join_ticket(&peer(0x99), &bad).unwrap_err();
        let chain = hawser_attestation::error_chain(&err);
        assert!(chain.contains("DNS subdomain"), "{chain}");
        let err = f
            .core
            .issue_join_ticket(&peer(0x99), &request(true))
            .unwrap_err();
        assert!(err.to_string().contains("control-plane"), "{err}");
    }

    #[test]
    fn control_plane_joins_receive_the_pki_files() {
        let f = fixture(true);
        let ticket = f
            .core
            .issue_join_ticket(&peer(0x99), &request(true))
            .unwrap();
        let names: Vec<&str> = ticket
            .control_plane_files
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(names, CONTROL_PLANE_FILES);
        assert_eq!(&**ticket.control_plane_files[1].1, b"content of ca.key");
    }

    #[test]
    fn a_reloaded_policy_applies_to_the_next_request() {
        let f = fixture(false);
        std::fs::write(
            &f.measurements,
            format!(
                r#"{{"9": {{"expected": "{}", "warnOnly": false}}}}"#,
                "98".repeat(32)
            ),
        )
        .unwrap();
        f.core.policy().reload_if_changed();
        f.core
            .issue_join_ticket(&peer(0x98), &request(false))
            .unwrap();
        assert!(
            f.core
                .issue_join_ticket(&peer(0x99), &request(false))
                .is_err()
        );
    }
}
