//! The join client: asks the join service for the state-disk key over aTLS, retrying with
//! backoff until it gets an answer.
//!
//! A fresh disk (about to be formatted) asks `IssueJoinTicket`; an initialized disk asks
//! `IssueRejoinTicket`. The node lock is taken by the race in [`super::race`], not here. Every failed attempt is logged with its reason — the join service's
//! refusal names the PCRs that differ — and retried after [`RetryBackoff`]: a join service that is
//! down at boot and up later is normal (the first node of a cluster boots before its join
//! service exists). The key, measurement secret and salt are zeroized; only the key's
//! fingerprint and the public cluster ID are ever logged.
//!
//! With `hawser.join_service_trust=attested` the join service must prove over aTLS that it is
//! a control plane of this image ([`super::join_service_measurements`]): a worker's TPM is
//! refused by name, and on a rejoin so is a control plane of another cluster (its PCR 15).
//!
//! An initialized disk records the cluster it belongs to (hawser's LUKS2 token). An answer from
//! a join service of another cluster — its cluster ID, derived from the measurement secret and
//! salt it sent as the node lock derives it, differs — is refused by name before the node lock
//! ([`ForeignCluster`]) and the client keeps trying: the endpoint may be misconfigured and fixed
//! later, and rebooting would not change the answer. The recorded ID is unauthenticated; the
//! cryptographic refusal is the LUKS2 key digest (another cluster's master secret gives another
//! key), which the boot checks before the lock too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::TpmIssuer;
use hawser_attestation::atls::{AtlsClient, Identity};
use hawser_keys::MasterSecret;
use hawser_kube_types::JoinTicket;
use hawser_proto::join::join_service_client::JoinServiceClient;
use hawser_proto::join::{IssueJoinTicketRequest, IssueRejoinTicketRequest};
use hawser_proto::ticket::join_ticket_from_wire;
use tracing::warn;
use zeroize::Zeroizing;

use super::{
    INSECURE_TRUST_WARNING, JoinEndpoint, JoinEndpoints, JoinServicePolicy, RetryBackoff,
    jitter_unit,
};
use crate::disk::key::DiskStatus;
use crate::mesh::MeshSetupError;

mod error;

pub use self::error::{AttemptError, MasterSecretError};
use crate::platform::error_chain;

/// Deadline of one attempt (connect, handshake with quotes on both sides, call).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the join client cannot start.
#[derive(Debug, thiserror::Error)]
pub enum JoinSetupError {
    /// An attested join service is required and the image has no provider CA to check it with.
    #[error(
        "hawser.join_service_trust=attested needs the provider CA that certifies the join \
         service's attestation key in the image ({path}; build with `hawser image build \
         --provider-ca FILE`), and this image carries none; use \
         hawser.join_service_trust=insecure-dev for development"
    )]
    NoProviderCa { path: &'static str },
    /// The image's provider CA cannot be parsed.
    #[error("the image's provider CA {path} is unusable")]
    ProviderCa {
        path: &'static str,
        #[source]
        source: hawser_platforms::verifier::TrustError,
    },
    /// The node's own PCRs, which the join service must share, cannot be read.
    #[error("cannot read this node's own PCRs to build the join service's expected measurements")]
    OwnPcrs(#[source] hawser_attestation::tpm::TpmError),
    /// The TPM returned no value for PCR 11, from which the join service's is computed.
    #[error(
        "the TPM returned no value for this node's PCR 11, from which the PCR 11 the join \
         service must show (a control plane's) is computed"
    )]
    OwnPcr11,
}

/// A join service that answered for another cluster than the one this node's disk records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the join service at {endpoint} belongs to cluster {}; this node's disk belongs to cluster {}",
    hex::encode(service),
    hex::encode(disk)
)]
pub struct ForeignCluster {
    /// The join service's address.
    pub endpoint: String,
    /// The cluster ID its answer derives (measurement secret and salt).
    pub service: [u8; 32],
    /// The cluster ID the disk records.
    pub disk: [u8; 32],
}

/// Accepts `secrets` from the join service at `endpoint` only if they are of the cluster the
/// disk records (`disk_cluster`; a new disk, or one initialized before hawser recorded it,
/// records none and accepts any).
pub fn check_cluster(
    endpoint: &JoinEndpoint,
    disk_cluster: Option<&[u8; 32]>,
    secrets: &Secrets,
) -> Result<(), ForeignCluster> {
    let Some(disk) = disk_cluster else {
        return Ok(());
    };
    let service = hawser_keys::cluster_id(&secrets.measurement_secret, &secrets.measurement_salt);
    if service == *disk {
        return Ok(());
    }
    Err(ForeignCluster {
        endpoint: endpoint.to_string(),
        service,
        disk: *disk,
    })
}

/// What the join service sent, secrets zeroized on drop.
pub struct Secrets {
    pub state_disk_key: Zeroizing<Vec<u8>>,
    pub measurement_secret: Zeroizing<Vec<u8>>,
    pub measurement_salt: Vec<u8>,
    /// What `kubeadm join` needs (`IssueJoinTicket` only; a rejoining node joined before).
    pub ticket: Option<JoinTicket>,
    /// A control-plane join: the cluster's master secret, checked against the rest of the
    /// answer, for the join service this control plane runs too. Zeroized on drop.
    pub master_secret: Option<MasterSecret>,
    /// The node's place in the WireGuard mesh, when the join service runs one.
    pub mesh: Option<crate::mesh::MeshGrant>,
}

/// Whether this disk is new (join) or initialized (rejoin).
pub fn describe(status: DiskStatus) -> &'static str {
    match status {
        DiskStatus::New => "IssueJoinTicket",
        DiskStatus::Initialized => "IssueRejoinTicket",
    }
}

/// Where the join client finds the join services.
#[derive(Debug, Clone)]
pub enum JoinSource {
    /// Configured endpoints (measured command line or fw_cfg): the list in turn, round after
    /// round.
    Configured(JoinEndpoints),
    /// The join services advertised on the LAN (`hawser.join_discovery=mdns`), looked at anew
    /// for every round.
    Discovered(Arc<super::discover::LanDiscovery>),
}

impl std::fmt::Display for JoinSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinSource::Configured(endpoints) => write!(f, "{endpoints}"),
            JoinSource::Discovered(_) => f.write_str("whatever the LAN advertises (mDNS)"),
        }
    }
}

impl From<JoinEndpoints> for JoinSource {
    fn from(endpoints: JoinEndpoints) -> Self {
        JoinSource::Configured(endpoints)
    }
}

impl JoinSource {
    /// The endpoints of the next round: the configured list, or the join services advertised
    /// now (the disk's cluster first, other clusters' left out; waiting a while for a first
    /// advert). Empty when nothing is advertised.
    async fn round(&self, disk_cluster: Option<&[u8; 32]>) -> Vec<JoinEndpoint> {
        match self {
            JoinSource::Configured(endpoints) => endpoints.iter().cloned().collect(),
            JoinSource::Discovered(lan) => {
                lan.round(disk_cluster.copied(), super::discover::ROUND_WAIT)
                    .await
            }
        }
    }
}

/// The gRPC join client.
#[derive(Debug, Clone)]
pub struct JoinClient {
    pub(super) endpoints: JoinSource,
    /// What the join service must prove; with [`Self::disk_cluster`], it makes the aTLS
    /// client of every attempt.
    policy: JoinServicePolicy,
    issuer: Arc<TpmIssuer>,
    backoff: RetryBackoff,
    /// Ask for a control-plane join (fw_cfg `role=control-plane`).
    control_plane: bool,
    /// The cluster the state disk records: an attested join service must be locked to it (its
    /// PCR 15), and answers of another cluster are refused.
    disk_cluster: Option<[u8; 32]>,
    /// The node's WireGuard public key (sent at the first join) and underlay endpoint (sent at
    /// every join and rejoin); `None`: the node asks for no place in the mesh.
    mesh: Option<(hawser_mesh::PublicKey, Option<std::net::SocketAddr>)>,
}

impl JoinClient {
    /// A client that attests with `issuer` (the node's TPM) and requires `policy` of the join
    /// service (see [`super::join_service_policy`]).
    pub fn new(
        endpoints: impl Into<JoinSource>,
        policy: JoinServicePolicy,
        issuer: Arc<TpmIssuer>,
    ) -> Self {
        let endpoints = endpoints.into();
        if matches!(policy, JoinServicePolicy::Unauthenticated) {
            warn!("{INSECURE_TRUST_WARNING}");
        }
        JoinClient {
            endpoints,
            policy,
            issuer,
            backoff: RetryBackoff::default(),
            control_plane: false,
            disk_cluster: None,
            mesh: None,
        }
    }

    /// Refuses (and keeps asking past) a join service of another cluster than `cluster_id`, the
    /// one the state disk records (`None`: accept any): an attested one whose PCR 15 is not
    /// that cluster's lock, and any answer whose secrets derive another cluster ID.
    pub fn disk_cluster(mut self, cluster_id: Option<[u8; 32]>) -> Self {
        self.disk_cluster = cluster_id;
        self
    }

    /// Asks for a control-plane join instead of a worker join.
    pub fn control_plane(mut self, control_plane: bool) -> Self {
        self.control_plane = control_plane;
        self
    }

    /// Asks for a place in the mesh with this WireGuard public key (a first join; a rejoin's
    /// key is the one the registry holds) and underlay endpoint.
    pub fn mesh(
        mut self,
        public_key: hawser_mesh::PublicKey,
        endpoint: Option<std::net::SocketAddr>,
    ) -> Self {
        self.mesh = Some((public_key, endpoint));
        self
    }

    /// Asks the join services in turn until one answers with secrets of the disk's cluster and
    /// a key of `key_length` bytes (what the measured integrity mode needs). Returns the
    /// secrets and the number of attempts.
    pub async fn fetch(
        &self,
        disk_uuid: &str,
        key_length: usize,
        status: DiskStatus,
    ) -> (Secrets, u32) {
        let retry = Retry {
            endpoints: &self.endpoints,
            backoff: &self.backoff,
            disk_cluster: self.disk_cluster.as_ref(),
            status,
        };
        retry
            .run(|endpoint| self.attempt(endpoint, disk_uuid, key_length, status))
            .await
    }

    /// The aTLS client of an attempt: the node attests with its TPM, and the join service must
    /// satisfy the policy for the disk's cluster.
    fn atls(&self) -> Result<AtlsClient, AttemptError> {
        let policy = self
            .policy
            .peer_policy(self.disk_cluster.as_ref())
            .map_err(AttemptError::Policy)?;
        Ok(
            AtlsClient::new(Identity::attested(self.issuer.clone()), policy)
                .handshake_timeout(ATTEMPT_TIMEOUT),
        )
    }

    async fn attempt(
        &self,
        endpoint: JoinEndpoint,
        disk_uuid: &str,
        key_length: usize,
        status: DiskStatus,
    ) -> Result<Secrets, AttemptError> {
        let secrets = self.ask(endpoint, disk_uuid, key_length, status).await?;
        // A key this disk cannot use costs an attempt, named, never the boot: another join
        // service (or this one, upgraded) may answer right.
        if secrets.state_disk_key.len() != key_length {
            return Err(AttemptError::KeyLength {
                sent: secrets.state_disk_key.len(),
                needed: key_length,
            });
        }
        Ok(secrets)
    }

    async fn ask(
        &self,
        endpoint: JoinEndpoint,
        disk_uuid: &str,
        key_length: usize,
        status: DiskStatus,
    ) -> Result<Secrets, AttemptError> {
        // Both fit a u32: the configured lengths are 64 and 96.
        let state_disk_key_length = u32::try_from(key_length).unwrap_or(u32::MAX);
        let atls = self.atls()?;
        let channel = tonic::transport::Endpoint::from_shared(endpoint.uri())
            .map_err(AttemptError::Endpoint)?
            .connect_timeout(ATTEMPT_TIMEOUT)
            .connect_with_connector(atls.connector())
            .await
            .map_err(AttemptError::Connect)?;
        let mut client = JoinServiceClient::new(channel);
        match status {
            DiskStatus::New => {
                let request = IssueJoinTicketRequest {
                    disk_uuid: disk_uuid.to_owned(),
                    node_name: node_name(disk_uuid),
                    is_control_plane: self.control_plane,
                    kubelet_csr: Vec::new(),
                    vpn_public_key: self
                        .mesh
                        .map(|(key, _)| key.as_bytes().to_vec())
                        .unwrap_or_default(),
                    vpn_endpoint: self.mesh_endpoint(),
                    state_disk_key_length,
                };
                let mut response = client.issue_join_ticket(request).await?.into_inner();
                let ticket = join_ticket_from_wire(&mut response, self.control_plane);
                let mesh = mesh_grant(response.vpn.as_ref());
                let state_disk_key = Zeroizing::new(std::mem::take(&mut response.state_disk_key));
                let measurement_secret =
                    Zeroizing::new(std::mem::take(&mut response.measurement_secret));
                let master_secret = response.master_secret.take().map(|mut sent| {
                    let parts = (
                        std::mem::take(&mut sent.key),
                        std::mem::take(&mut sent.salt),
                    );
                    (Zeroizing::new(parts.0), Zeroizing::new(parts.1))
                });
                // Files a worker was sent, and those of a refused ticket, are wiped too.
                for file in &mut response.control_plane_files {
                    zeroize::Zeroize::zeroize(&mut file.data);
                }
                let ticket = ticket?;
                let mesh = mesh?;
                let master_secret = match master_secret {
                    Some((key, salt)) if self.control_plane => Some(checked_master_secret(
                        &key,
                        &salt,
                        disk_uuid,
                        &state_disk_key,
                        &measurement_secret,
                    )?),
                    // A worker keeps no master secret it was sent (the service should not
                    // have): it is wiped here.
                    _ => None,
                };
                Ok(Secrets {
                    state_disk_key,
                    measurement_secret,
                    measurement_salt: std::mem::take(&mut response.measurement_salt),
                    ticket: Some(ticket),
                    master_secret,
                    mesh,
                })
            }
            DiskStatus::Initialized => {
                let mut response = client
                    .issue_rejoin_ticket(IssueRejoinTicketRequest {
                        disk_uuid: disk_uuid.to_owned(),
                        vpn_endpoint: self.mesh_endpoint(),
                        state_disk_key_length,
                    })
                    .await?
                    .into_inner();
                Ok(Secrets {
                    state_disk_key: Zeroizing::new(std::mem::take(&mut response.state_disk_key)),
                    measurement_secret: Zeroizing::new(std::mem::take(
                        &mut response.measurement_secret,
                    )),
                    measurement_salt: std::mem::take(&mut response.measurement_salt),
                    ticket: None,
                    master_secret: None,
                    mesh: mesh_grant(response.vpn.as_ref())?,
                })
            }
        }
    }
}

impl JoinClient {
    fn mesh_endpoint(&self) -> String {
        self.mesh
            .and_then(|(_, endpoint)| endpoint)
            .map(|e| e.to_string())
            .unwrap_or_default()
    }
}

/// The ticket's mesh, checked: a malformed one fails the attempt (which is retried).
fn mesh_grant(
    vpn: Option<&hawser_proto::join::VpnConfig>,
) -> Result<Option<crate::mesh::MeshGrant>, MeshSetupError> {
    match vpn {
        Some(vpn) => crate::mesh::MeshGrant::from_wire(vpn),
        None => Ok(None),
    }
}

/// The retry loop of [`JoinClient::fetch`], apart from the gRPC call so that its decisions are
/// tested without a join service.
struct Retry<'a> {
    endpoints: &'a JoinSource,
    backoff: &'a RetryBackoff,
    disk_cluster: Option<&'a [u8; 32]>,
    status: DiskStatus,
}

impl Retry<'_> {
    /// Runs `attempt` at each endpoint of a round in turn until one gives secrets of the disk's
    /// cluster; every failure and every refusal is logged with its reason. The next endpoint of
    /// a round is asked at once; after a whole round (or a round with nothing advertised) the
    /// backoff grows (one round per backoff step).
    async fn run<F, A, E>(&self, mut attempt: F) -> (Secrets, u32)
    where
        F: FnMut(JoinEndpoint) -> A,
        A: Future<Output = Result<Secrets, E>>,
        E: std::error::Error,
    {
        let mut attempts: u32 = 0;
        let mut round: u32 = 0;
        loop {
            let endpoints = self.endpoints.round(self.disk_cluster).await;
            if endpoints.is_empty() {
                let delay = self.backoff.delay(round, jitter_unit());
                warn!(
                    "no join service is advertised on the LAN at an IPv4 address yet; looking \
                     again in {:.1} s",
                    delay.as_secs_f64()
                );
                round = round.saturating_add(1);
                tokio::time::sleep(delay).await;
                continue;
            }
            for (i, endpoint) in endpoints.iter().enumerate() {
                attempts += 1;
                let result = tokio::time::timeout(ATTEMPT_TIMEOUT, attempt(endpoint.clone())).await;
                let reason = match result {
                    Ok(Ok(secrets)) => {
                        match check_cluster(endpoint, self.disk_cluster, &secrets) {
                            Ok(()) => return (secrets, attempts),
                            // The foreign secrets are dropped (zeroized) here, before any lock.
                            Err(foreign) => foreign.to_string(),
                        }
                    }
                    Ok(Err(e)) => error_chain(&e),
                    Err(_) => format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs()),
                };
                let (next, delay) = match endpoints.get(i + 1) {
                    Some(next) => (next.to_string(), Duration::ZERO),
                    None => (
                        match self.endpoints {
                            JoinSource::Configured(_) => endpoints[0].to_string(),
                            JoinSource::Discovered(_) => {
                                "the join services then advertised".to_owned()
                            }
                        },
                        self.backoff.delay(round, jitter_unit()),
                    ),
                };
                warn!(
                    "join attempt {attempts} ({} to {endpoint}) failed: {reason}; retrying at \
                     {next} in {:.1} s",
                    describe(self.status),
                    delay.as_secs_f64()
                );
                tokio::time::sleep(delay).await;
            }
            round = round.saturating_add(1);
        }
    }
}

/// The master secret a control-plane join was sent, accepted only if it is the secret the
/// rest of the answer comes from: the disk key and the measurement secret it derives must be
/// the ones sent. A control plane runs the join service with it, so a wrong one would hand
/// out keys of another cluster.
fn checked_master_secret(
    key: &[u8],
    salt: &[u8],
    disk_uuid: &str,
    state_disk_key: &[u8],
    measurement_secret: &[u8],
) -> Result<MasterSecret, MasterSecretError> {
    let master =
        MasterSecret::new(key.to_vec(), salt.to_vec()).map_err(MasterSecretError::Unusable)?;
    let uuid =
        hawser_keys::canonical_uuid(disk_uuid).map_err(|source| MasterSecretError::DiskUuid {
            uuid: disk_uuid.to_owned(),
            source,
        })?;
    let length = hawser_keys::StateDiskKeyLength::from_requested(state_disk_key.len())
        .map_err(MasterSecretError::DiskKey)?;
    let derived_key = master
        .state_disk_key(&uuid, length)
        .map_err(MasterSecretError::Derive)?;
    let consistent = bool::from(subtle::ConstantTimeEq::ct_eq(
        &derived_key[..],
        state_disk_key,
    )) && bool::from(subtle::ConstantTimeEq::ct_eq(
        &master.measurement_secret()[..],
        measurement_secret,
    ));
    if !consistent {
        return Err(MasterSecretError::Inconsistent);
    }
    Ok(master)
}

/// The node's name as the join service records it.
pub fn node_name(disk_uuid: &str) -> String {
    format!("hawser-{}", disk_uuid.get(..8).unwrap_or(disk_uuid))
}

#[cfg(test)]
mod tests;
