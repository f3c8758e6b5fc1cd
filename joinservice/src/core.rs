//! The join decisions, free of gRPC: check the verified peer's PCRs against the current policy,
//! check that a control-plane join comes from an approved AK (which then receives the cluster's
//! shared certificates and its master secret, to run this join service too), derive its disk
//! key, issue a bootstrap token, remember the disk with the AK that joined it, audit the
//! decision.
//!
//! Which AK each joined disk is bound to, and which AKs may join as control planes, live in a
//! [`ClusterStore`]: local files for a single join service ([`JoinCore::new`]), the control
//! planes' etcd for a join service on every control plane ([`JoinCore::with_cluster_store`]).
//! A disk bound to one AK is refused to any other: a cloned disk on another machine does not
//! boot as a second copy of the node.
//!
//! With the WireGuard mesh on ([`JoinCore::with_mesh`]), a join that carries the node's VPN
//! public key is admitted into the mesh's registry (in the same store) under its disk UUID —
//! last, after every other check passed and the disk is bound, so a refused join takes no
//! address — and its ticket carries the node's VPN address and the mesh; a rejoin of a member
//! gets the same. [`JoinCore::get_peers`] answers the nodes' polls of the peer API.
//!
//! The aTLS layer has already verified the evidence itself (quote signature, freshness, binding
//! to the TLS key, AK certificate chain); this layer applies the expected measurements, which
//! may have been reloaded since the handshake began.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::measurements::MeasurementMismatch;
use hawser_attestation::releases::{ReleaseMismatch, ReleaseSet};
use hawser_cluster_store::revocations;
use hawser_keys::{MasterSecret, StateDiskKeyLength};
use hawser_kube_types::{ControlPlaneFile, DnsSubdomain, DnsSubdomainError, JoinTicket};
use hawser_mesh::MeshError;
use zeroize::Zeroizing;

use crate::approvals::ApprovalStore;
use crate::audit::{self, Decision, Outcome};
use crate::policy::PolicyStore;
use crate::store::{
    BindOutcome, ClusterStore, DiskBinding, FileStore, ReadConsistency, StoreError,
};
use crate::tokens::{BootstrapTokenIssuer, TokenError};
use crate::vpn::{MeshSettings, VpnTicket};

mod mesh;
mod reattest;
mod revoke;

pub use revoke::RevokeError;

use self::mesh::parse_endpoint;

/// A join request, as the service received it.
#[derive(Debug, Clone, Default)]
pub struct JoinRequest {
    pub disk_uuid: String,
    pub node_name: String,
    pub is_control_plane: bool,
    /// The node's WireGuard public key (32 bytes); empty: the node takes no part in the mesh.
    pub vpn_public_key: Vec<u8>,
    /// `ip:port` where the node's tunnel listens on the underlay network; empty if unknown.
    pub vpn_endpoint: String,
    /// The state-disk key's length in bytes, as the node asked (0: did not say, 64).
    pub state_disk_key_length: usize,
}

/// A rejoin request, as the service received it.
#[derive(Debug, Clone, Default)]
pub struct RejoinRequest {
    pub disk_uuid: String,
    /// `ip:port` where the node's tunnel listens now; empty if unknown.
    pub vpn_endpoint: String,
    /// The state-disk key's length in bytes, as the node asked (0: did not say, 64).
    pub state_disk_key_length: usize,
}

/// The verified facts about the peer the aTLS handshake established.
#[derive(Debug, Clone)]
pub struct VerifiedPeer {
    pub address: Option<IpAddr>,
    /// sha256-bank PCR values from the peer's verified quote.
    pub pcrs: BTreeMap<u8, [u8; 32]>,
    /// TPM name of the AK that signed the peer's verified evidence: the identity of its TPM.
    pub ak_name: Vec<u8>,
}

/// What a joining node is granted: its state disk key, the cluster ID's inputs, the join
/// ticket kubeadm joins with, a control plane's master secret and the node's place in the
/// mesh. Debug never shows a secret.
pub struct JoinGrant {
    pub state_disk_key: Zeroizing<Vec<u8>>,
    pub measurement_secret: Zeroizing<[u8; 32]>,
    pub measurement_salt: Vec<u8>,
    /// What `kubeadm join` needs; a control plane's also carries the shared certificates and
    /// keys (name relative to /etc/kubernetes/pki, content).
    pub kubeadm: JoinTicket,
    /// For an approved control-plane join: the cluster's master secret, so that the new control
    /// plane runs the join service too.
    pub master_secret: Option<MasterSecret>,
    /// The node's place in the WireGuard mesh, when the mesh is on and the node sent its key.
    pub vpn: Option<VpnTicket>,
}

impl std::fmt::Debug for JoinGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinGrant")
            .field(
                "state_disk_key",
                &hawser_keys::fingerprint(&self.state_disk_key),
            )
            .field("kubeadm", &self.kubeadm)
            .finish_non_exhaustive()
    }
}

/// What a rebooting node receives.
pub struct RejoinTicket {
    pub state_disk_key: Zeroizing<Vec<u8>>,
    pub measurement_secret: Zeroizing<[u8; 32]>,
    pub measurement_salt: Vec<u8>,
    /// The disk's place in the WireGuard mesh, if it has one.
    pub vpn: Option<VpnTicket>,
}

impl std::fmt::Debug for RejoinTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RejoinTicket")
            .field(
                "state_disk_key",
                &hawser_keys::fingerprint(&self.state_disk_key),
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
    /// The peer's measurements match no accepted release, or a retired one.
    #[error(transparent)]
    Release(ReleaseMismatch),
    /// The admin revoked the node (its AK, or its disk).
    #[error(
        "node {node} (AK {ak_name}) was revoked by the cluster's admin: {reason}; its joins and \
         rejoins are refused until the admin readmits it (`hawser node readmit`)"
    )]
    Revoked {
        /// The node's name in the revocation.
        node: String,
        /// The revoked AK, hex.
        ak_name: String,
        /// The admin's reason.
        reason: String,
    },
    /// The request's disk UUID is not a UUID.
    #[error("malformed request: the disk UUID is unusable")]
    DiskUuid(#[source] hawser_keys::KeyError),
    /// The request asks for a state-disk key of a length no state disk uses.
    #[error("malformed request: the state disk key length is unusable")]
    DiskKeyLength(#[source] hawser_keys::KeyError),
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
    /// A control-plane join from an AK that is not on the control-plane approvals list.
    #[error("control-plane join refused: AK {ak_name} is not approved; add it to {approvals}")]
    ControlPlaneNotApproved {
        /// The peer's AK name, hex.
        ak_name: String,
        /// The approvals file, or a note that none is configured.
        approvals: String,
    },
    /// A disk that joined with one AK asks again from another TPM.
    #[error(
        "disk {uuid} joined with AK {registered}; this {request} comes from AK {presented}: a cloned disk on another machine?"
    )]
    AnotherAk {
        uuid: String,
        /// The AK recorded at the disk's first join, hex.
        registered: String,
        /// The AK of this request, hex.
        presented: String,
        /// `join` or `rejoin`.
        request: &'static str,
    },
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
    /// The cluster state (registry of joined disks, approvals) could not be read or written:
    /// a local file, or etcd unreachable or without quorum.
    #[error("cannot consult the cluster state")]
    Store(#[from] StoreError),
    /// The state disk key could not be derived from the master secret.
    #[error("internal error: cannot derive the state disk key")]
    DiskKey(#[source] hawser_keys::KeyError),
    /// The request's `vpn_public_key` is not a WireGuard public key.
    #[error("malformed request: vpn_public_key is not a WireGuard public key")]
    VpnPublicKey(#[source] MeshError),
    /// The request's `vpn_endpoint` is not `ip:port`.
    #[error("malformed request: vpn_endpoint {text:?} is not ip:port")]
    VpnEndpoint {
        /// The text, cut to 80 characters.
        text: String,
    },
    /// The mesh refused the node: a key change, a key that is another member's, no free
    /// address left.
    #[error("the WireGuard mesh refused node {node}")]
    Mesh {
        /// The node's name.
        node: String,
        #[source]
        source: MeshError,
    },
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
    /// The registry of joined disks of the file backend ([`JoinCore::new`]; see
    /// [`FileStore`]). Unused with [`JoinCore::with_cluster_store`].
    pub registry_file: PathBuf,
}

/// The join service's decisions.
pub struct JoinCore {
    policy: Arc<PolicyStore>,
    approvals: Arc<ApprovalStore>,
    tokens: Arc<dyn BootstrapTokenIssuer>,
    config: JoinCoreConfig,
    store: Arc<dyn ClusterStore>,
    /// The same store when it is the file backend: it takes its approvals from `approvals`.
    files: Option<Arc<FileStore>>,
    /// The WireGuard mesh; `None`: off.
    mesh: Option<MeshSettings>,
    /// Periodic re-attestation of the mesh's members; `None`: off.
    reattestation: Option<crate::reattest::Reattestation>,
}

impl JoinCore {
    /// A core over `policy` and `tokens` with the file backend: reads the registry of joined
    /// disks. It approves no control-plane join until given a list
    /// ([`JoinCore::with_control_plane_approvals`]).
    pub fn new(
        policy: Arc<PolicyStore>,
        tokens: Arc<dyn BootstrapTokenIssuer>,
        config: JoinCoreConfig,
    ) -> Result<Self, JoinError> {
        let files = Arc::new(FileStore::open(&config.registry_file)?);
        Ok(Self {
            policy,
            approvals: Arc::new(ApprovalStore::none()),
            tokens,
            config,
            store: Arc::clone(&files) as Arc<dyn ClusterStore>,
            files: Some(files),
            mesh: None,
            reattestation: None,
        })
    }

    /// A core over `policy` and `tokens` whose disks and approvals live in `store` (etcd,
    /// shared by the join services of every control plane).
    pub fn with_cluster_store(
        policy: Arc<PolicyStore>,
        tokens: Arc<dyn BootstrapTokenIssuer>,
        config: JoinCoreConfig,
        store: Arc<dyn ClusterStore>,
    ) -> Self {
        Self {
            policy,
            approvals: Arc::new(ApprovalStore::none()),
            tokens,
            config,
            store,
            files: None,
            mesh: None,
            reattestation: None,
        }
    }

    /// Turns the WireGuard mesh on: joins with a VPN key are admitted into the registry and
    /// their tickets carry the mesh. The join service's own entry (`settings.coordinator`) is
    /// admitted beforehand ([`crate::vpn::admit_join_service`]).
    pub fn with_mesh(mut self, settings: MeshSettings) -> Self {
        self.mesh = Some(settings);
        self
    }

    /// The mesh settings; `None`: the mesh is off.
    pub fn mesh(&self) -> Option<&MeshSettings> {
        self.mesh.as_ref()
    }

    /// The cluster store.
    pub fn store(&self) -> &Arc<dyn ClusterStore> {
        &self.store
    }

    /// With the file backend, control-plane joins are granted to the AKs on `approvals` only
    /// (and the service watches the file). With a cluster store the store's approvals decide;
    /// seed them from a file with [`EtcdStore::import_control_plane_approvals`] instead.
    ///
    /// [`EtcdStore::import_control_plane_approvals`]: crate::store::EtcdStore::import_control_plane_approvals
    pub fn with_control_plane_approvals(mut self, approvals: Arc<ApprovalStore>) -> Self {
        if let Some(files) = &self.files {
            files.set_approvals(Arc::clone(&approvals));
        }
        self.approvals = approvals;
        self
    }

    /// Turns periodic re-attestation of the mesh's members on ([`crate::reattest`]).
    pub fn with_reattestation(mut self, reattestation: crate::reattest::Reattestation) -> Self {
        self.reattestation = Some(reattestation);
        self
    }

    /// The re-attestation settings, if it is on.
    pub fn reattestation(&self) -> Option<&crate::reattest::Reattestation> {
        self.reattestation.as_ref()
    }

    /// Whether `token` is the admin's ([`MasterSecret::admin_token`]), compared in constant
    /// time.
    pub fn is_admin_token(&self, token: &[u8]) -> bool {
        let expected = self.config.master_secret.admin_token();
        token.len() == expected.len()
            && token
                .iter()
                .zip(expected.iter())
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }

    /// The policy store (for reload watching).
    pub fn policy(&self) -> &Arc<PolicyStore> {
        &self.policy
    }

    /// The control-plane approvals (for reload watching).
    pub fn approvals(&self) -> &Arc<ApprovalStore> {
        &self.approvals
    }

    /// Decides a join. Blocking (token issuance runs kubeadm): call from `spawn_blocking`.
    pub fn issue_join_ticket(
        &self,
        peer: &VerifiedPeer,
        req: &JoinRequest,
    ) -> Result<JoinGrant, JoinError> {
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
                    hawser_keys::fingerprint(&ticket.state_disk_key)
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
        decide: impl FnOnce(&ReleaseSet) -> Result<T, JoinError>,
        granted: impl FnOnce(&T) -> String,
    ) -> Result<T, JoinError> {
        let policy = self.policy.current();
        let checked: Vec<u8> = policy.releases.enforced();
        let release = policy
            .releases
            .check(&peer.pcrs)
            .map(|(name, _)| name.to_owned())
            .ok();
        let result = decide(&policy.releases);
        let (outcome, reason) = match &result {
            Ok(value) => (Outcome::Granted, granted(value)),
            Err(e) => (Outcome::Refused, hawser_attestation::error_chain(e)),
        };
        audit::record(&Decision {
            call,
            peer: peer.address,
            ak_name: &hex::encode(&peer.ak_name),
            node,
            disk_uuid,
            pcrs_checked: &checked,
            policy_digest: &policy.digest,
            release: release.as_deref(),
            outcome,
            reason: &reason,
        });
        result
    }

    fn join(
        &self,
        peer: &VerifiedPeer,
        req: &JoinRequest,
        expected: &ReleaseSet,
    ) -> Result<JoinGrant, JoinError> {
        let uuid = hawser_keys::canonical_uuid(&req.disk_uuid).map_err(JoinError::DiskUuid)?;
        // Before anything is recorded: a key the node cannot use must not bind its disk.
        let key_length = key_length(req.state_disk_key_length)?;
        validate_node_name(&req.node_name)?;
        let vpn_request = self.vpn_request(req)?;
        check_measurements(peer, expected)?;
        self.check_not_revoked(peer, &uuid)?;
        let control_plane_files = if req.is_control_plane {
            Some(self.control_plane_files(peer)?)
        } else {
            None
        };
        // Refuse a clone before kubeadm runs; `bind` below decides atomically in the store.
        let ak_name = hex::encode(&peer.ak_name);
        if let Some(DiskBinding::Bound(registered)) =
            self.store.disk_binding(&uuid, ReadConsistency::Latest)?
        {
            check_same_ak(&uuid, &registered, &ak_name, "join")?;
        }
        let credentials = self.tokens.issue(self.config.token_ttl)?;
        let state_disk_key = self.state_disk_key(&uuid, key_length)?;
        self.bind(&uuid, &ak_name, "join")?;
        // Last: a refused join takes no address.
        let vpn = match (&self.mesh, vpn_request) {
            (Some(mesh), Some((key, endpoint))) => {
                Some(self.admit_node(mesh, &uuid, &req.node_name, key, endpoint)?)
            }
            _ => None,
        };
        Ok(JoinGrant {
            vpn,
            state_disk_key,
            measurement_secret: self.config.master_secret.measurement_secret(),
            measurement_salt: self.config.measurement_salt.clone(),
            kubeadm: JoinTicket {
                api_server_endpoint: credentials.api_server_endpoint,
                token: credentials.bootstrap_token,
                ca_cert_hashes: credentials.discovery_ca_cert_hashes,
                kubernetes_version: self.config.kubernetes_version.clone(),
                control_plane_files,
            },
            master_secret: req
                .is_control_plane
                .then(|| self.config.master_secret.clone()),
        })
    }

    /// Decides a rejoin: only for disks that joined before, from the AK they joined with.
    pub fn issue_rejoin_ticket(
        &self,
        peer: &VerifiedPeer,
        disk_uuid: &str,
    ) -> Result<RejoinTicket, JoinError> {
        self.issue_rejoin_ticket_at(
            peer,
            &RejoinRequest {
                disk_uuid: disk_uuid.to_owned(),
                ..RejoinRequest::default()
            },
        )
    }

    /// [`JoinCore::issue_rejoin_ticket`] as the node asked: its key's length, and the
    /// `ip:port` its tunnel listens at, recorded in the mesh if the disk is a member.
    pub fn issue_rejoin_ticket_at(
        &self,
        peer: &VerifiedPeer,
        req: &RejoinRequest,
    ) -> Result<RejoinTicket, JoinError> {
        self.audited(
            "IssueRejoinTicket",
            peer,
            "",
            &req.disk_uuid,
            |expected| {
                let uuid =
                    hawser_keys::canonical_uuid(&req.disk_uuid).map_err(JoinError::DiskUuid)?;
                let key_length = key_length(req.state_disk_key_length)?;
                let endpoint = parse_endpoint(&req.vpn_endpoint)?;
                check_measurements(peer, expected)?;
                self.check_not_revoked(peer, &uuid)?;
                let ak_name = hex::encode(&peer.ak_name);
                // A rejoin only reads its disk's binding: it works while etcd has lost quorum.
                match self
                    .store
                    .disk_binding(&uuid, ReadConsistency::LatestOrLocal)?
                {
                    None => return Err(JoinError::UnknownDisk(uuid)),
                    Some(DiskBinding::Bound(registered)) => {
                        check_same_ak(&uuid, &registered, &ak_name, "rejoin")?;
                    }
                    Some(DiskBinding::Unbound) => self.bind(&uuid, &ak_name, "rejoin")?,
                }
                let vpn = match &self.mesh {
                    Some(mesh) => self.rejoin_mesh(mesh, &uuid, endpoint)?,
                    None => None,
                };
                Ok(RejoinTicket {
                    state_disk_key: self.state_disk_key(&uuid, key_length)?,
                    measurement_secret: self.config.master_secret.measurement_secret(),
                    measurement_salt: self.config.measurement_salt.clone(),
                    vpn,
                })
            },
            |ticket| {
                format!(
                    "key {} issued",
                    hawser_keys::fingerprint(&ticket.state_disk_key)
                )
            },
        )
    }

    /// Refuses a node the admin revoked: its AK, or its disk from any AK. Read as a rejoin
    /// reads its binding, so it holds while etcd has no quorum.
    fn check_not_revoked(&self, peer: &VerifiedPeer, uuid: &str) -> Result<(), JoinError> {
        let revocations = revocations::list(self.store.as_ref(), ReadConsistency::LatestOrLocal)?;
        let ak_name = hex::encode(&peer.ak_name);
        match revocations::find(&revocations, &ak_name, Some(uuid)) {
            Some(revoked) => Err(JoinError::Revoked {
                node: revoked.node.clone(),
                ak_name: revoked.ak_name.clone(),
                reason: revoked.reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn state_disk_key(
        &self,
        uuid: &str,
        length: StateDiskKeyLength,
    ) -> Result<Zeroizing<Vec<u8>>, JoinError> {
        self.config
            .master_secret
            .state_disk_key(uuid, length)
            .map_err(JoinError::DiskKey)
    }

    /// Binds disk `uuid` to `ak_name` (hex) in the store, and refuses a disk bound to another
    /// AK.
    fn bind(&self, uuid: &str, ak_name: &str, request: &'static str) -> Result<(), JoinError> {
        match self.store.bind_disk(uuid, ak_name)? {
            BindOutcome::New | BindOutcome::Same => Ok(()),
            BindOutcome::BoundLegacy => {
                tracing::warn!(
                    target: "audit",
                    disk_uuid = uuid,
                    ak = ak_name,
                    "disk joined before disks were bound to AKs; bound it to the AK of this {request}"
                );
                Ok(())
            }
            BindOutcome::Another(registered) => check_same_ak(uuid, &registered, ak_name, request),
        }
    }

    fn control_plane_files(&self, peer: &VerifiedPeer) -> Result<Vec<ControlPlaneFile>, JoinError> {
        let Some(dir) = &self.config.pki_dir else {
            return Err(JoinError::BadRequest(
                "this join service does not hand out control-plane certificates".into(),
            ));
        };
        let ak_name = hex::encode(&peer.ak_name);
        if !self.store.approves_control_plane(&ak_name)? {
            return Err(JoinError::ControlPlaneNotApproved {
                approvals: self.store.approvals_location(&ak_name),
                ak_name,
            });
        }
        CONTROL_PLANE_FILES
            .iter()
            .map(|name| {
                read_secret_file(&dir.join(name)).map(|data| ControlPlaneFile {
                    name: (*name).to_owned(),
                    data,
                })
            })
            .collect()
    }
}

fn check_same_ak(
    uuid: &str,
    registered: &str,
    presented: &str,
    request: &'static str,
) -> Result<(), JoinError> {
    if registered == presented {
        return Ok(());
    }
    Err(JoinError::AnotherAk {
        uuid: uuid.to_owned(),
        registered: registered.to_owned(),
        presented: presented.to_owned(),
        request,
    })
}

fn read_secret_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, JoinError> {
    std::fs::read(path)
        .map(Zeroizing::new)
        .map_err(|source| JoinError::ControlPlaneFile {
            path: path.display().to_string(),
            source,
        })
}

/// Checks the peer's PCRs against the accepted releases.
fn check_measurements(peer: &VerifiedPeer, releases: &ReleaseSet) -> Result<(), JoinError> {
    match releases.check(&peer.pcrs) {
        Ok((_, warnings)) => {
            for w in warnings {
                tracing::warn!(target: "audit", "{w}");
            }
            Ok(())
        }
        Err(ReleaseMismatch::Single(mismatch)) => Err(JoinError::Measurements(mismatch)),
        Err(other) => Err(JoinError::Release(other)),
    }
}

/// The key length a node asked for (0: it did not say, 64 bytes).
fn key_length(requested: usize) -> Result<StateDiskKeyLength, JoinError> {
    StateDiskKeyLength::from_requested(requested).map_err(JoinError::DiskKeyLength)
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
mod tests;
