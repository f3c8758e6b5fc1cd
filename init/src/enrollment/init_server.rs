//! The init server: the node's side of `hawser init` and `hawser recover`.
//!
//! While the node waits for its state-disk key, PID 1 listens on [`INIT_PORT`] with aTLS: the
//! node attests itself (its quote is in the TLS certificate), the admin's CLI checks that quote
//! against the expected measurements and only then sends the cluster's master secret. The CLI
//! does not attest; it proves that it knows the **init secret** whose hash the node's platform
//! gave it ([`super::init_secret`]). That check comes before anything else: a request without
//! the right secret is refused (`PERMISSION_DENIED`), logged without the secret, and changes
//! nothing — the node is not locked and keeps serving. A node without an init secret hash runs
//! no init server at all.
//!
//! - `Init` is accepted only while the state disk is new: an initialized disk holds a cluster's
//!   data and is never reformatted for another cluster (`hawser recover` reopens it instead).
//! - `Recover` is accepted only while the disk is initialized: the node derives its own disk key
//!   from the master secret when no join service is left to ask.
//!
//! A valid request becomes a [`Grant`] handed to the race in [`super::race`]; the first of the
//! join client and the init server to get secrets takes the node lock. After the grant the call
//! stays open: the node's log lines stream to the admin until boot reports the outcome through
//! [`Progress`]. Validation is pure ([`validate_init`], [`validate_recover`]); the gRPC service is
//! a thin adapter over it.
//!
//! A grant whose key turns out not to open the disk (`Recover` with another cluster's master
//! secret) is refused through its own call; the server then takes requests again. Once the node
//! lock is taken the server refuses everything, and it stops listening when the winning admin's
//! call has ended (the CLI keeps it open for its confirming quote, at most [`CONFIRM_WINDOW`]).
//!
//! Anyone on the network can connect, and the node quotes for every handshake before the
//! client has proved anything: [`CONNECTION_LIMITS`] bound that work (handshakes in flight per
//! address and in total, quotes paced at [`QUOTES_PER_SEC`], connections without a call closed
//! after [`IDLE_TIMEOUT`]), so a flood neither starves the admin nor exhausts PID 1's files.

use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hawser_attestation::TpmIssuer;
use hawser_attestation::atls::{AtlsServer, CallTracking, ConnectionLimits, Identity, PeerPolicy};
use hawser_keys::MasterSecret;
use hawser_kube_types::{Endpoint, KubernetesVersion, ServiceCidr};
use hawser_proto::init::init_service_server::{InitService, InitServiceServer};
use hawser_proto::init::{
    InitFailure, InitRequest, InitResponse, InitSuccess, RecoverRequest, init_response,
};
use tokio::sync::{Notify, mpsc, oneshot};
use tonic::{Request, Response, Status};
use tracing::{info, warn};
use zeroize::Zeroize as _;

use super::init_secret::{InitSecretError, InitSecretHash, REFUSAL_DELAY};
use super::lock::{NodeLock, State};
use crate::disk::key::DiskStatus;

mod validate;

pub use self::validate::{RequestError, init_kubernetes_version, validate_init, validate_recover};

/// The TCP port the init server listens on (Constellation's bootstrapper uses the same).
pub const INIT_PORT: u16 = 9000;
pub use hawser_keys::MEASUREMENT_SALT_LEN;
/// Requests are small; anything bigger is refused before decoding.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// At most this many aTLS handshakes (each a TPM quote) in flight at once: one admin at a time
/// is served, the rest is room for a retry and a few flooding addresses.
pub const MAX_PENDING_HANDSHAKES: usize = 16;
/// At most this many of them from one address: an admin's CLI runs one at a time (and a
/// second for its confirming quote).
pub const MAX_PENDING_HANDSHAKES_PER_SOURCE: usize = 4;
/// Quotes per second for handshakes, sustained: about one quote's time on a vTPM under TCG
/// (≈ 100 ms), so a flood keeps PID 1's TPM busy at most this often, and the admin's handshake
/// waits at most about `addresses × MAX_PENDING_HANDSHAKES_PER_SOURCE / QUOTES_PER_SEC`.
pub const QUOTES_PER_SEC: f64 = 10.0;
/// An established connection with no call in progress for this long is closed: the CLI calls
/// right after its handshake, and its call keeps the connection open while the node boots.
/// With [`QUOTES_PER_SEC`] this bounds idle connections to about 300.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The init server's pre-authentication limits (see [`hawser_attestation::atls::limits`]).
pub const CONNECTION_LIMITS: ConnectionLimits = ConnectionLimits {
    max_handshakes: MAX_PENDING_HANDSHAKES,
    max_handshakes_per_source: MAX_PENDING_HANDSHAKES_PER_SOURCE,
    quotes_per_sec: QUOTES_PER_SEC,
    quote_burst: 4,
    max_queued_quotes: MAX_PENDING_HANDSHAKES,
    max_queued_quotes_per_source: 2,
    idle_timeout: IDLE_TIMEOUT,
};
/// Buffered responses per call before the node's log lines wait for a slow admin.
const STREAM_BUFFER: usize = 64;
/// After the outcome, how long the winning admin's call may stay open (the CLI re-attests the
/// node meanwhile, to see PCR 15 locked) before the server stops listening anyway.
pub const CONFIRM_WINDOW: Duration = Duration::from_secs(120);
/// Longest accepted list of control-plane approvals in one `Init`.
pub const MAX_CONTROL_PLANE_APPROVALS: usize = 64;

/// What the admin asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantKind {
    /// A new cluster on this node.
    Init(ClusterSpec),
    /// This node of an existing cluster, without a join service.
    Recover,
}

impl GrantKind {
    pub fn rpc(&self) -> &'static str {
        match self {
            GrantKind::Init(_) => "Init",
            GrantKind::Recover => "Recover",
        }
    }
}

/// The cluster `hawser init` asks for, validated. Kubernetes itself is started after the pivot
/// into the rootfs, from these values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    pub cluster_name: String,
    pub kubernetes_version: KubernetesVersion,
    pub service_cidr: ServiceCidr,
    pub api_server_cert_sans: Vec<String>,
    /// kubeadm's `controlPlaneEndpoint`; `None`: the first node's address.
    pub control_plane_endpoint: Option<Endpoint>,
    /// AK TPM names (lowercase hex) the cluster's join service approves as control planes.
    pub control_plane_approvals: Vec<String>,
    /// The cluster's WireGuard mesh prefix; `None`: no mesh. This node takes its first host
    /// address ([`crate::mesh::MeshGrant::first_node`]).
    pub mesh_prefix: Option<hawser_mesh::Ipv4Net>,
}

/// A valid request: the cluster's secrets and the channel back to the admin.
pub struct Grant {
    pub kind: GrantKind,
    pub master: MasterSecret,
    pub measurement_salt: Vec<u8>,
    pub progress: Progress,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("kind", &self.kind)
            .field("master", &self.master)
            .finish_non_exhaustive()
    }
}

/// The open call of the admin whose request won: boot reports the outcome through it. Until
/// then every log line of the node streams to the admin. Dropping it without an outcome tells
/// the admin the node stopped serving the request.
#[derive(Debug)]
pub struct Progress {
    outcome: Option<oneshot::Sender<InitResponse>>,
    /// Marks the server busy with this call until the call's outcome is decided.
    _busy: Option<Busy>,
}

/// The init server serves one admin at a time: this is held while it does.
#[derive(Debug)]
struct Busy(Arc<AtomicBool>);

impl Busy {
    fn take(flag: &Arc<AtomicBool>) -> Option<Busy> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Busy(Arc::clone(flag)))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What the call's forwarder does once the call has ended: stop the server if the node is
/// locked by then (the lock is final; a refused grant leaves the server serving).
struct EndOfCall {
    lock: Arc<NodeLock>,
    stop: Arc<Notify>,
}

impl Progress {
    /// Starts streaming the node's log lines into `stream`, on the current runtime.
    fn start(
        stream: mpsc::Sender<Result<InitResponse, Status>>,
        busy: Busy,
        end: EndOfCall,
    ) -> Progress {
        let (outcome, mut outcome_rx) = oneshot::channel::<InitResponse>();
        let mut lines = crate::platform::console::subscribe_lines();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                tokio::select! {
                    // Lines logged before the outcome go first.
                    biased;
                    line = lines.recv() => {
                        let text = match line {
                            Ok(text) => text,
                            Err(RecvError::Lagged(n)) => format!("({n} log lines skipped)"),
                            Err(RecvError::Closed) => continue,
                        };
                        let message = InitResponse { kind: Some(init_response::Kind::LogLine(text)) };
                        if stream.send(Ok(message)).await.is_err() {
                            // The admin hung up; the node carries on regardless.
                            return;
                        }
                    }
                    outcome = &mut outcome_rx => {
                        let outcome = outcome.unwrap_or_else(|_| failure(
                            "the node stopped serving this request before it finished (see its console)",
                        ));
                        if stream.send(Ok(outcome)).await.is_ok() {
                            // Hold the call until the admin has re-attested and hung up.
                            let _ = tokio::time::timeout(CONFIRM_WINDOW, stream.closed()).await;
                        }
                        break;
                    }
                }
            }
            if matches!(end.lock.state(), State::Locked { .. }) {
                end.stop.notify_one();
            }
        });
        Progress {
            outcome: Some(outcome),
            _busy: Some(busy),
        }
    }

    /// Reports success: the cluster ID the node is locked to and, once Kubernetes runs, the
    /// admin kubeconfig (empty otherwise). Ends the call.
    pub fn succeed(mut self, cluster_id: [u8; 32], kubeconfig: Vec<u8>) {
        if let Some(sender) = self.outcome.take() {
            let _ = sender.send(InitResponse {
                kind: Some(init_response::Kind::Success(InitSuccess {
                    kubeconfig,
                    cluster_id: cluster_id.to_vec(),
                })),
            });
        }
    }

    /// Reports failure with `reason`. Ends the call.
    pub fn fail(mut self, reason: &str) {
        if let Some(sender) = self.outcome.take() {
            let _ = sender.send(failure(reason));
        }
    }
}

fn failure(reason: &str) -> InitResponse {
    InitResponse {
        kind: Some(init_response::Kind::Failure(InitFailure {
            reason: reason.to_owned(),
        })),
    }
}

/// The gRPC service: checks the init secret, validates, hands one valid request at a time to
/// the race, refuses the rest.
pub struct InitServer {
    disk: DiskStatus,
    lock: Arc<NodeLock>,
    secret_hash: InitSecretHash,
    grants: mpsc::Sender<Grant>,
    busy: Arc<AtomicBool>,
    stop: Arc<Notify>,
    /// The image's Kubernetes version (`hawser.kubernetes`): what an Init without a version
    /// installs, and the only one it may ask for.
    image_kubernetes: Option<KubernetesVersion>,
}

impl InitServer {
    /// A server for a node whose state disk is `disk` and whose admin proves knowledge of the
    /// secret behind `secret_hash`; valid requests go to `grants`, one at a time. `stop` is
    /// notified when the node is locked and the winning admin's call has ended.
    pub fn new(
        disk: DiskStatus,
        lock: Arc<NodeLock>,
        secret_hash: InitSecretHash,
        grants: mpsc::Sender<Grant>,
        stop: Arc<Notify>,
    ) -> Self {
        InitServer {
            disk,
            lock,
            secret_hash,
            grants,
            busy: Arc::new(AtomicBool::new(false)),
            stop,
            image_kubernetes: None,
        }
    }

    /// The image's Kubernetes version (`hawser.kubernetes`), when it names one: an Init
    /// request asking for another is refused by name before anything changes on the node.
    pub fn image_kubernetes(mut self, version: Option<KubernetesVersion>) -> Self {
        self.image_kubernetes = version;
        self
    }

    /// The first check of every request: the init secret. A refusal is logged without the
    /// secret, waits [`REFUSAL_DELAY`], and changes nothing on the node.
    async fn check_secret(&self, rpc: &'static str, secret: &mut Vec<u8>) -> Result<(), Status> {
        let checked = self.secret_hash.check(secret);
        secret.zeroize();
        if let Err(e) = checked {
            warn!("{rpc} refused: {e}; the node is not locked and keeps waiting");
            tokio::time::sleep(REFUSAL_DELAY).await;
            return Err(refusal(&e));
        }
        Ok(())
    }

    fn admit(
        &self,
        rpc: &'static str,
        validated: Result<(GrantKind, MasterSecret, Vec<u8>), RequestError>,
    ) -> Result<mpsc::Receiver<Result<InitResponse, Status>>, Status> {
        let expected = match self.disk {
            DiskStatus::New => "Init",
            DiskStatus::Initialized => "Recover",
        };
        if let State::Locked { owner, cluster_id } = self.lock.state() {
            return Err(Status::failed_precondition(format!(
                "this node already belongs to cluster {} (the node lock was taken by {owner})",
                hex::encode(cluster_id)
            )));
        }
        if rpc != expected {
            return Err(Status::failed_precondition(match self.disk {
                DiskStatus::New => {
                    "this node's state disk is new: there is nothing to recover; \
                                    use `hawser init` to start a cluster on it"
                }
                DiskStatus::Initialized => {
                    "this node's state disk already holds a cluster's data and is never \
                     reformatted: use `hawser recover` with that cluster's master secret"
                }
            }));
        }
        let (kind, master, measurement_salt) =
            validated.map_err(|e| Status::invalid_argument(crate::platform::error_chain(&e)))?;
        let busy = Busy::take(&self.busy).ok_or_else(|| {
            Status::failed_precondition(
                "another init or recover request is already being served by this node",
            )
        })?;
        let (stream, receiver) = mpsc::channel(STREAM_BUFFER);
        info!("{rpc} request accepted from the admin: taking part in the node lock race");
        let end = EndOfCall {
            lock: Arc::clone(&self.lock),
            stop: Arc::clone(&self.stop),
        };
        let grant = Grant {
            kind,
            master,
            measurement_salt,
            progress: Progress::start(stream, busy, end),
        };
        if let Err(
            mpsc::error::TrySendError::Full(grant) | mpsc::error::TrySendError::Closed(grant),
        ) = self.grants.try_send(grant)
        {
            // The race is over (the join client won between the check above and now).
            grant
                .progress
                .fail("this node joined a cluster through its join service meanwhile");
        }
        Ok(receiver)
    }
}

type ResponseStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<InitResponse, Status>> + Send>>;

#[tonic::async_trait]
impl InitService for InitServer {
    type InitStream = ResponseStream;
    type RecoverStream = ResponseStream;

    async fn init(
        &self,
        request: Request<InitRequest>,
    ) -> Result<Response<Self::InitStream>, Status> {
        let mut request = request.into_inner();
        self.check_secret("Init", &mut request.init_secret).await?;
        let validated = validate_init(&mut request, self.image_kubernetes.as_ref());
        let receiver = self.admit("Init", validated)?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn recover(
        &self,
        request: Request<RecoverRequest>,
    ) -> Result<Response<Self::RecoverStream>, Status> {
        let mut request = request.into_inner();
        self.check_secret("Recover", &mut request.init_secret)
            .await?;
        let validated = validate_recover(&mut request);
        let receiver = self.admit("Recover", validated)?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }
}

/// Why the init server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum InitServerError {
    /// The init server's port cannot be bound (in use?).
    #[error("cannot listen on {address} for `hawser init`")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The gRPC status of a refused init secret.
fn refusal(error: &InitSecretError) -> Status {
    Status::permission_denied(error.to_string())
}

/// Listens on `0.0.0.0:port` and serves `server` over aTLS (the node attests with `issuer`, the
/// admin proves the init secret instead), in a task on the current runtime, until `stop` is
/// notified: then the listening socket is closed at once and open calls may finish.
pub async fn spawn(
    server: InitServer,
    port: u16,
    issuer: Arc<TpmIssuer>,
    stop: Arc<Notify>,
) -> Result<tokio::task::JoinHandle<()>, InitServerError> {
    let address = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| InitServerError::Listen { address, source })?;
    let atls = AtlsServer::new(Identity::attested(issuer), PeerPolicy::Unauthenticated);
    let incoming =
        hawser_attestation::atls::incoming_from(listener, CONNECTION_LIMITS, move || {
            Some(atls.clone())
        });
    info!(
        "init server listening on {address} (aTLS): waiting for `hawser init` or `hawser recover`"
    );
    Ok(tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            // The idle timeout must see the admin's call in progress.
            .layer(CallTracking)
            .add_service(
                InitServiceServer::new(server).max_decoding_message_size(MAX_REQUEST_BYTES),
            )
            .serve_with_incoming_shutdown(incoming, async move { stop.notified().await })
            .await;
        info!("the init server on {address} has stopped");
        if let Err(e) = result {
            warn!(
                "the init server stopped: {}",
                crate::platform::error_chain(&e)
            );
        }
    }))
}

#[cfg(test)]
mod tests;
