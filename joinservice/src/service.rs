//! The gRPC face of the join service: `hawser.join.v1.JoinService` over attested TLS, a thin
//! adapter over [`JoinCore`].
//!
//! What this layer adds to the core, and why:
//!
//! - **aTLS, client attests** (mutual when [`ServiceConfig::identity`] is attested): a node's
//!   evidence is validated in the handshake against the provider CA and the expected
//!   measurements in force *when the connection is accepted*. A node whose enforced PCRs differ
//!   is refused before any handler runs; the refusal reason (naming each PCR, expected vs
//!   actual) travels to the node in the aTLS verdict. The validator is rebuilt whenever the
//!   [`PolicyStore`](crate::policy::PolicyStore) has reloaded, checked on every accepted
//!   connection, so a new connection is always judged by the current file; the core re-checks
//!   the PCRs with the policy current at each call, so a connection accepted under an old
//!   policy gets `PERMISSION_DENIED` once the policy no longer admits it.
//! - **Handshakes are isolated and bounded before authentication**: each runs in its own task
//!   under [`ServiceConfig::handshake_timeout`]; at most [`MAX_PENDING_HANDSHAKES`] run at once
//!   and [`MAX_PENDING_HANDSHAKES_PER_SOURCE`] from one address. A connection over its
//!   address's bound waits, accepted and unread (no TLS, no TPM work), for that address's next
//!   place, first come first served, for at most the handshake timeout; beyond
//!   [`MAX_PENDING_HANDSHAKES`] waiting, and over the total bound, connections are closed as
//!   soon as they are accepted. A client that never finishes its handshake holds one slot until
//!   its timeout, nothing more. When the service attests (on a control plane), its quotes are
//!   paced first come, first served ([`ServiceConfig::connection_limits`],
//!   [`hawser_attestation::atls::limits`]), so a flood cannot queue TPM work beyond the
//!   handshake timeout; an established connection with no call for
//!   [`IDLE_TIMEOUT`] is closed. The kernel queues up to [`LISTEN_BACKLOG`] connections the
//!   acceptor has not taken yet.
//! - **Per call**: a per-peer token bucket (`RESOURCE_EXHAUSTED` with a retry hint, also as
//!   `retry-after-ms` metadata), then a deadline ([`ServiceConfig::call_timeout`],
//!   `DEADLINE_EXCEEDED`) around waiting for one of [`ServiceConfig::max_concurrent_calls`]
//!   slots and running the core on the blocking pool (token issuance runs kubeadm).
//! - **Messages** larger than [`MAX_REQUEST_BYTES`] are refused by tonic with `OUT_OF_RANGE`
//!   ("decoded message length too large: found N bytes, the limit is: M bytes").
//! - **Statuses**: [`JoinError`] maps to a gRPC code (see [`status_of`]); the message is the
//!   error's text, which never contains a secret.
//!
//! Secrets in responses: the core's tickets hold keys in `Zeroizing` buffers; the protobuf
//! message needs plain `Vec<u8>`s, which tonic encodes and drops. Those copies are not
//! zeroized (prost offers no hook); they live for one response.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_attestation::atls::{
    AtlsConnectInfo, AtlsServer, CallTracking, ConnectionLimits, Identity, PeerPolicy,
    incoming_queued_from,
};
use hawser_attestation::validator::{AkTrust, Validator, ValidatorError};
use hawser_mesh::MeshError;
use hawser_proto::join::join_service_server::{JoinService, JoinServiceServer};
use hawser_proto::join::{
    ClusterMasterSecret, IssueJoinTicketRequest, IssueJoinTicketResponse, IssueRejoinTicketRequest,
    IssueRejoinTicketResponse, VpnConfig,
};
use hawser_proto::ticket::join_ticket_to_wire;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, oneshot};
use tonic::{Code, Request, Response, Status};
use tracing::Instrument as _;

use crate::core::{JoinCore, JoinError, JoinRequest, RejoinRequest, VerifiedPeer};
use crate::ratelimit::RateLimiter;
use crate::vpn::VpnTicket;

/// The largest request message accepted (a join request is a UUID, a node name and at most a
/// CSR of a few KiB).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// aTLS handshakes in progress at once. Each costs a task, a socket and a rustls state; a slow
/// or silent client holds one until [`ServiceConfig::handshake_timeout`].
pub const MAX_PENDING_HANDSHAKES: usize = 1024;
/// aTLS handshakes in progress at once from one address (IPv6: one /64). A node runs one at a
/// time; the rest is room for nodes behind one NAT. The excess waits for a place
/// (at most the handshake timeout), unread.
pub const MAX_PENDING_HANDSHAKES_PER_SOURCE: usize = 16;
/// An established connection with no call in progress for this long is closed (a node
/// connects to call; a reconnecting channel attests afresh).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections the kernel queues until the acceptor takes them (`listen(2)`'s backlog, capped
/// by `net.core.somaxconn`). `TcpListener::bind` uses std's 128: a burst of more joining nodes
/// than that while the acceptor is busy loses SYNs, and each node whose SYN was lost waits
/// for its retransmission (1 s, then 3 s, …).
pub const LISTEN_BACKLOG: u32 = 1024;

/// How `hawser-joind` serves. Build with [`ServiceConfig::new`] and adjust fields.
pub struct ServiceConfig {
    /// Address to listen on (port 0 picks a free one; see [`RunningService::local_addr`]).
    pub listen: SocketAddr,
    /// The decisions.
    pub core: Arc<JoinCore>,
    /// PEM of the provider CA(s) that certify nodes' attestation keys (on a cloud profile: the
    /// platform's roots and intermediates).
    pub provider_ca_pem: String,
    /// The platform profile the cluster's measurements file selects (`attestationVariant`;
    /// `qemu` by default): nodes presenting another profile's evidence are refused by name.
    pub platform: hawser_platforms::profile::Platform,
    /// What the service presents: `Unattested` on a host without a TPM (then only the node
    /// attests), attested on a control-plane node (mutual attestation).
    pub identity: Identity,
    /// Calls running the core at once (default 64).
    pub max_concurrent_calls: usize,
    /// Sustained calls per second per peer IP address (default 5).
    pub rate_per_sec: f64,
    /// Burst of calls per peer IP address (default 20).
    pub burst: u32,
    /// Deadline of every call, from its arrival (default 30 s; kubeadm may be slow).
    pub call_timeout: Duration,
    /// Deadline of every aTLS handshake, quotes included (default 10 s).
    pub handshake_timeout: Duration,
    /// What clients that have not attested yet may make the listener do: handshakes in
    /// flight ([`MAX_PENDING_HANDSHAKES`] in total, [`MAX_PENDING_HANDSHAKES_PER_SOURCE`] per
    /// address), the quote rate when the service attests (the defaults of
    /// [`hawser_attestation::atls::limits`]: 10/s, 32 waiting), the idle timeout
    /// ([`IDLE_TIMEOUT`]).
    pub connection_limits: ConnectionLimits,
    /// How often the expected-measurements and control-plane approvals files are checked for
    /// changes (default 2 s).
    pub policy_poll: Duration,
}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceConfig")
            .field("listen", &self.listen)
            .field("platform", &self.platform)
            .field("identity", &self.identity)
            .field("max_concurrent_calls", &self.max_concurrent_calls)
            .field("rate_per_sec", &self.rate_per_sec)
            .field("burst", &self.burst)
            .field("call_timeout", &self.call_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("connection_limits", &self.connection_limits)
            .field("policy_poll", &self.policy_poll)
            .finish_non_exhaustive()
    }
}

impl ServiceConfig {
    /// Defaults: unattested service identity, 64 concurrent calls, 5 calls/s per peer with
    /// bursts of 20, 30 s per call, 10 s per handshake, policy checked every 2 s.
    pub fn new(listen: SocketAddr, core: Arc<JoinCore>, provider_ca_pem: String) -> Self {
        Self {
            listen,
            core,
            provider_ca_pem,
            platform: hawser_platforms::profile::Platform::Qemu,
            identity: Identity::Unattested,
            max_concurrent_calls: 64,
            rate_per_sec: 5.0,
            burst: 20,
            call_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            connection_limits: ConnectionLimits {
                max_handshakes: MAX_PENDING_HANDSHAKES,
                max_handshakes_per_source: MAX_PENDING_HANDSHAKES_PER_SOURCE,
                idle_timeout: IDLE_TIMEOUT,
                ..ConnectionLimits::default()
            },
            policy_poll: Duration::from_secs(2),
        }
    }
}

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The provider CA file holds no certificate usable as a trust anchor (or the platform's
    /// trust cannot be built from it).
    #[error("the provider CA is unusable as an attestation-key trust anchor")]
    ProviderCa(#[from] hawser_platforms::verifier::TrustError),
    /// The expected measurements enforce nothing (or are otherwise unusable).
    #[error("the expected measurements cannot make a validator")]
    Validator(#[from] ValidatorError),
    /// tonic's server stopped with an error.
    #[error("the gRPC server failed")]
    Serve(#[from] tonic::transport::Error),
    /// The server task panicked or was cancelled.
    #[error("the join service task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// A running join service.
#[derive(Debug)]
pub struct RunningService {
    /// The address it listens on.
    pub local_addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ServiceError>>,
}

impl RunningService {
    /// Stops accepting, lets calls in progress finish, and returns when the server has stopped.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(());
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::error!(
                err = hawser_attestation::error_chain(&err),
                "join service stopped with an error"
            ),
            Err(err) => tracing::error!(%err, "join service task failed"),
        }
    }

    /// Runs until the server fails (it does not stop by itself otherwise).
    pub async fn wait(self) -> Result<(), ServiceError> {
        let RunningService { shutdown, task, .. } = self;
        let result = task.await.map_err(ServiceError::Task)?;
        drop(shutdown);
        result
    }
}

/// Starts the join service: binds, starts the policy watcher, the aTLS acceptor and the gRPC
/// server, and returns once it listens.
pub async fn spawn(config: ServiceConfig) -> Result<RunningService, ServiceError> {
    let trust = hawser_platforms::verifier::ak_trust(config.platform, &config.provider_ca_pem)?;
    let acceptor = Acceptor {
        identity: config.identity.clone(),
        trust,
        handshake_timeout: config.handshake_timeout,
        current: Mutex::new(None),
        core: Arc::clone(&config.core),
    };
    // Fails now if the policy in force cannot make a validator (nothing enforced).
    acceptor.server()?;

    let listener = bind_listener(config.listen).map_err(|source| ServiceError::Bind {
        addr: config.listen,
        source,
    })?;
    let local_addr = listener.local_addr().map_err(|source| ServiceError::Bind {
        addr: config.listen,
        source,
    })?;

    let service = Service {
        core: Arc::clone(&config.core),
        limiter: Arc::new(RateLimiter::new(config.rate_per_sec, config.burst)),
        calls: Arc::new(Semaphore::new(config.max_concurrent_calls.max(1))),
        call_timeout: config.call_timeout,
    };
    let watcher = tokio::spawn(
        Arc::clone(config.core.policy())
            .watch(config.policy_poll)
            .instrument(tracing::info_span!("policy_watch")),
    );
    let releases_follower = tokio::spawn(
        Arc::clone(config.core.policy())
            .follow_releases(Arc::clone(config.core.store()), config.policy_poll)
            .instrument(tracing::info_span!("releases")),
    );
    let approvals_watcher = tokio::spawn(
        Arc::clone(config.core.approvals())
            .watch(config.policy_poll)
            .instrument(tracing::info_span!("approvals_watch")),
    );
    // The validator follows policy reloads: each new connection gets the server for the
    // policy in force. `None` (a reloaded policy that enforces nothing) refuses, loudly.
    // Over its address's bound, a connection waits (unread) for that address's next place
    // rather than being reset: nodes behind one NAT queue when the service is busy.
    let handshake_timeout = config.handshake_timeout;
    let limits = config.connection_limits.clone();
    let incoming = incoming_queued_from(listener, limits, handshake_timeout, move || {
        acceptor
            .server()
            .inspect_err(|err| {
                tracing::error!(
                    err = hawser_attestation::error_chain(err),
                    "refusing connection: no usable validator"
                );
            })
            .ok()
    });
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            // The idle timeout must see the calls in progress.
            .layer(CallTracking)
            .add_service(
                JoinServiceServer::new(service).max_decoding_message_size(MAX_REQUEST_BYTES),
            )
            .serve_with_incoming_shutdown(incoming, async {
                // A dropped sender (RunningService::wait consumed) never shuts down.
                if shutdown_rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
            })
            .await;
        watcher.abort();
        releases_follower.abort();
        approvals_watcher.abort();
        result.map_err(ServiceError::from)
    });
    Ok(RunningService {
        local_addr,
        shutdown,
        task,
    })
}

/// A listening socket on `addr` with [`LISTEN_BACKLOG`] and `SO_REUSEADDR` (as
/// `TcpListener::bind` sets it). Must be called within a tokio runtime.
pub fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Makes the aTLS server for the policy in force, rebuilding it when the policy changed.
struct Acceptor {
    identity: Identity,
    trust: AkTrust,
    handshake_timeout: Duration,
    core: Arc<JoinCore>,
    /// (policy digest, server built for it).
    current: Mutex<Option<(String, AtlsServer)>>,
}

impl Acceptor {
    /// The aTLS server for the current policy.
    fn server(&self) -> Result<AtlsServer, ValidatorError> {
        let policy = self.core.policy().current();
        let mut current = match self.current.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((digest, server)) = current.as_ref()
            && *digest == policy.digest
        {
            return Ok(server.clone());
        }
        let validator = Validator::for_releases((*policy.releases).clone(), self.trust.clone())?;
        let server = AtlsServer::new(
            self.identity.clone(),
            PeerPolicy::Verify(Arc::new(validator)),
        )
        .handshake_timeout(self.handshake_timeout);
        if current.is_some() {
            tracing::info!(policy = %&policy.digest[..16], "aTLS validator rebuilt for the reloaded expected measurements");
        }
        *current = Some((policy.digest, server.clone()));
        Ok(server)
    }
}

/// The tonic service.
struct Service {
    core: Arc<JoinCore>,
    limiter: Arc<RateLimiter>,
    calls: Arc<Semaphore>,
    call_timeout: Duration,
}

/// The mesh part of a ticket, for the wire.
pub fn vpn_config(ticket: &VpnTicket) -> VpnConfig {
    VpnConfig {
        node_vpn_ip: ticket.node.vpn_ip.to_string(),
        coordinator_vpn_pub_key: ticket.coordinator.public_key.as_bytes().to_vec(),
        coordinator_public_endpoint: ticket
            .coordinator
            .endpoint
            .map(|e| e.to_string())
            .unwrap_or_default(),
        prefix: ticket.prefix.to_string(),
        mtu: ticket.mtu,
        registry_version: ticket.registry_version,
        peers: ticket
            .peers
            .iter()
            .map(hawser_proto::mesh::peer_to_wire)
            .collect(),
        coordinator_vpn_ip: ticket.coordinator.vpn_ip.to_string(),
        vpn_api_port: u32::from(ticket.vpn_api_port),
    }
}

/// The gRPC status for a core refusal; the message is the error's text.
pub fn status_of(err: &JoinError) -> Status {
    let code = match err {
        JoinError::BadRequest(_)
        | JoinError::DiskUuid(_)
        | JoinError::DiskKeyLength(_)
        | JoinError::NodeName { .. }
        | JoinError::VpnPublicKey(_)
        | JoinError::VpnEndpoint { .. } => Code::InvalidArgument,
        JoinError::Mesh {
            source: MeshError::PrefixFull { .. },
            ..
        } => Code::ResourceExhausted,
        JoinError::Mesh { .. } => Code::FailedPrecondition,
        JoinError::Measurements(_)
        | JoinError::Release(_)
        | JoinError::Revoked { .. }
        | JoinError::ControlPlaneNotApproved { .. }
        | JoinError::AnotherAk { .. } => Code::PermissionDenied,
        JoinError::UnknownDisk(_) => Code::NotFound,
        // etcd unreachable or without quorum: the node retries later.
        JoinError::Token(_) => Code::Unavailable,
        JoinError::Store(e) if e.is_unavailable() => Code::Unavailable,
        JoinError::ControlPlaneFile { .. } | JoinError::Store(_) | JoinError::DiskKey(_) => {
            Code::Internal
        }
    };
    Status::new(code, hawser_attestation::error_chain(err))
}

impl Service {
    /// The verified peer behind a request, or `UNAUTHENTICATED` (not reachable through the
    /// aTLS acceptor, which only hands over attested connections).
    fn peer<T>(request: &Request<T>) -> Result<VerifiedPeer, Status> {
        let info = request
            .extensions()
            .get::<AtlsConnectInfo>()
            .ok_or_else(|| Status::unauthenticated("the connection is not attested TLS"))?;
        let evidence = info
            .peer
            .evidence()
            .ok_or_else(|| Status::unauthenticated("the node did not attest"))?;
        Ok(VerifiedPeer {
            address: info.remote_addr.map(|a| a.ip()),
            pcrs: evidence.pcrs.clone(),
            ak_name: evidence.ak_name.clone(),
        })
    }

    /// Rate limit, deadline, concurrency bound, then `decide` on the blocking pool.
    async fn run<T, F>(
        &self,
        call: &'static str,
        peer: &VerifiedPeer,
        decide: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&JoinCore) -> Result<T, JoinError> + Send + 'static,
    {
        if let Some(address) = peer.address
            && let Err(limited) = self.limiter.check(address, Instant::now())
        {
            tracing::warn!(call, peer = %address, "{limited}");
            let mut status = Status::resource_exhausted(limited.to_string());
            if let Ok(value) = limited.retry_after.as_millis().to_string().parse() {
                status.metadata_mut().insert("retry-after-ms", value);
            }
            return Err(status);
        }
        let core = Arc::clone(&self.core);
        let calls = Arc::clone(&self.calls);
        let work = async move {
            let _permit = calls
                .acquire_owned()
                .await
                .map_err(|_| Status::unavailable("the join service is shutting down"))?;
            tokio::task::spawn_blocking(move || decide(&core))
                .await
                .map_err(|e| Status::internal(format!("the {call} task failed: {e}")))?
                .map_err(|e| status_of(&e))
        };
        match tokio::time::timeout(self.call_timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(call, peer = ?peer.address, timeout = ?self.call_timeout, "call exceeded its deadline");
                Err(Status::deadline_exceeded(format!(
                    "{call} did not complete within {:?}",
                    self.call_timeout
                )))
            }
        }
    }
}

#[tonic::async_trait]
impl JoinService for Service {
    async fn issue_join_ticket(
        &self,
        request: Request<IssueJoinTicketRequest>,
    ) -> Result<Response<IssueJoinTicketResponse>, Status> {
        let peer = Self::peer(&request)?;
        let msg = request.into_inner();
        let req = JoinRequest {
            disk_uuid: msg.disk_uuid,
            node_name: msg.node_name,
            is_control_plane: msg.is_control_plane,
            vpn_public_key: msg.vpn_public_key,
            vpn_endpoint: msg.vpn_endpoint,
            state_disk_key_length: msg.state_disk_key_length as usize,
        };
        let decided_peer = peer.clone();
        let ticket = self
            .run("IssueJoinTicket", &peer, move |core| {
                core.issue_join_ticket(&decided_peer, &req)
            })
            .await?;
        let mut response = IssueJoinTicketResponse {
            state_disk_key: ticket.state_disk_key.to_vec(),
            measurement_salt: ticket.measurement_salt.clone(),
            measurement_secret: ticket.measurement_secret.to_vec(),
            kubelet_cert: Vec::new(),
            cluster_ca_cert: Vec::new(),
            vpn: ticket.vpn.as_ref().map(vpn_config),
            master_secret: ticket
                .master_secret
                .as_ref()
                .map(|master| ClusterMasterSecret {
                    key: master.key_bytes().to_vec(),
                    salt: master.salt_bytes().to_vec(),
                }),
            ..IssueJoinTicketResponse::default()
        };
        join_ticket_to_wire(&ticket.kubeadm, &mut response);
        Ok(Response::new(response))
    }

    async fn issue_rejoin_ticket(
        &self,
        request: Request<IssueRejoinTicketRequest>,
    ) -> Result<Response<IssueRejoinTicketResponse>, Status> {
        let peer = Self::peer(&request)?;
        let msg = request.into_inner();
        let req = RejoinRequest {
            disk_uuid: msg.disk_uuid,
            vpn_endpoint: msg.vpn_endpoint,
            state_disk_key_length: msg.state_disk_key_length as usize,
        };
        let decided_peer = peer.clone();
        let ticket = self
            .run("IssueRejoinTicket", &peer, move |core| {
                core.issue_rejoin_ticket_at(&decided_peer, &req)
            })
            .await?;
        Ok(Response::new(IssueRejoinTicketResponse {
            state_disk_key: ticket.state_disk_key.to_vec(),
            measurement_secret: ticket.measurement_secret.to_vec(),
            measurement_salt: ticket.measurement_salt.clone(),
            vpn: ticket.vpn.as_ref().map(vpn_config),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More nodes than std's backlog of 128 connect while the acceptor takes none: every
    /// connection is queued (with a backlog of 128 the 130th SYN is dropped and its connect
    /// hangs in retransmissions).
    #[tokio::test]
    async fn a_burst_of_200_connections_waits_in_the_backlog() {
        let listener = bind_listener(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connected = Vec::new();
        for i in 0..200 {
            let stream = tokio::time::timeout(
                Duration::from_secs(10),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            .unwrap_or_else(|_| panic!("connection {i} was not queued"))
            .unwrap();
            connected.push(stream);
        }
    }
}
