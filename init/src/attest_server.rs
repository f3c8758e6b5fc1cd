//! The node's answer to `hawser verify`: PID 1 serves `hawser.attest.v1` on [`ATTEST_PORT`]
//! from the moment it has its provider-certified AK (in the initramfs, while it asks for its
//! disk's key) for the node's life, and quotes its PCRs for each verifier's fresh nonce, the
//! node's claims (name, role) bound into the quote as user data. A node stuck before its pivot
//! (an image the cluster retired, say) is thus named by `hawser verify` too. At the pivot the
//! claims change ([`serve`] again); the listening socket stays.
//!
//! Plain gRPC: the answer is signed by the TPM and bound to the verifier's nonce, so a channel
//! adds nothing, and nothing in it is secret. The TPM is guarded: one quote at a time, and at
//! most [`MAX_QUOTES_PER_SEC`] per second over all callers; a caller over the rate is refused
//! with `RESOURCE_EXHAUSTED` (the verifier retries).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_attestation::TpmIssuer;
use hawser_attestation::evidence::{Binding, EvidenceIssuer as _, NONCE_LEN, Role};
use hawser_proto::attest::node_attestation_server::{NodeAttestation, NodeAttestationServer};
use hawser_proto::attest::{AttestRequest, AttestResponse};
use prost::Message as _;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

/// The port `hawser verify` asks (TCP, every address).
pub const ATTEST_PORT: u16 = 9443;
/// Quotes per second, over all callers.
pub const MAX_QUOTES_PER_SEC: u32 = 4;

/// What the node says of itself; signed through the quote (as its user data).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Claims {
    /// The Kubernetes node name (`hawser-<disk uuid prefix>`), if the node has one.
    pub node_name: Option<String>,
    /// `control-plane` or `worker`: what PID 1 measured into PCR 11 at the pivot; `joining`
    /// before it.
    pub role: &'static str,
    /// hawser's version.
    pub hawser_version: &'static str,
}

struct Service {
    shared: Arc<Shared>,
    booted: Instant,
    /// When the last quote started; one quote at a time.
    last: tokio::sync::Mutex<Option<Instant>>,
}

/// What the running server quotes with and claims, changed at the pivot.
struct Shared {
    issuer: std::sync::Mutex<Arc<TpmIssuer>>,
    claims: std::sync::Mutex<Claims>,
}

/// The server of this PID 1, once it listens.
static RUNNING: std::sync::OnceLock<Arc<Shared>> = std::sync::OnceLock::new();

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[tonic::async_trait]
impl NodeAttestation for Service {
    async fn attest(
        &self,
        request: Request<AttestRequest>,
    ) -> Result<Response<AttestResponse>, Status> {
        let nonce: [u8; NONCE_LEN] =
            request
                .into_inner()
                .nonce
                .try_into()
                .map_err(|n: Vec<u8>| {
                    Status::invalid_argument(format!(
                        "the nonce is {} bytes; it must be {NONCE_LEN} random bytes",
                        n.len()
                    ))
                })?;
        let mut last = self.last.lock().await;
        let spacing = Duration::from_secs(1) / MAX_QUOTES_PER_SEC;
        if let Some(at) = *last
            && at.elapsed() < spacing
        {
            return Err(Status::resource_exhausted(
                "the node quotes at most 4 times a second; ask again",
            ));
        }
        *last = Some(Instant::now());
        let mut claims = serde_json::to_value(&*lock(&self.shared.claims)).unwrap_or_default();
        claims["uptimeSecs"] = self.booted.elapsed().as_secs().into();
        let claims_json = claims.to_string();
        let issuer = Arc::clone(&lock(&self.shared.issuer));
        let user_data = claims_json.clone().into_bytes();
        let evidence = tokio::task::spawn_blocking(move || {
            let binding = Binding {
                role: Role::Server,
                nonce: &nonce,
                tls_spki_der: &[],
            };
            issuer.issue(&binding, &user_data)
        })
        .await
        .map_err(|e| Status::internal(format!("the quote task failed: {e}")))?
        .map_err(|e| {
            warn!(
                "cannot quote for a verifier: {}",
                crate::platform::error_chain(&e)
            );
            Status::unavailable(crate::platform::error_chain(&e))
        })?;
        Ok(Response::new(AttestResponse {
            evidence: evidence.encode_to_vec(),
            claims_json,
        }))
    }
}

/// Serves the attestation API on `0.0.0.0:`[`ATTEST_PORT`] in a task, for the node's life;
/// if it serves already, from now on with `issuer` and `claims`.
pub async fn serve(issuer: Arc<TpmIssuer>, claims: Claims) -> std::io::Result<()> {
    if let Some(shared) = RUNNING.get() {
        *lock(&shared.issuer) = issuer;
        *lock(&shared.claims) = claims;
        return Ok(());
    }
    let (_, shared) = listen(
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, ATTEST_PORT)),
        issuer,
        claims,
    )
    .await?;
    let _ = RUNNING.set(shared);
    Ok(())
}

/// If the server runs already (started in the initramfs), claims `claims` from now on with the
/// AK it has; `false` if none runs.
pub fn set_claims(claims: &Claims) -> bool {
    match RUNNING.get() {
        Some(shared) => {
            *lock(&shared.claims) = claims.clone();
            true
        }
        None => false,
    }
}

/// A server of its own on `address` (tests); returns the bound address.
pub async fn spawn_on(
    address: SocketAddr,
    issuer: Arc<TpmIssuer>,
    claims: Claims,
) -> std::io::Result<SocketAddr> {
    listen(address, issuer, claims).await.map(|(a, _)| a)
}

async fn listen(
    address: SocketAddr,
    issuer: Arc<TpmIssuer>,
    claims: Claims,
) -> std::io::Result<(SocketAddr, Arc<Shared>)> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let address = listener.local_addr()?;
    let shared = Arc::new(Shared {
        issuer: std::sync::Mutex::new(issuer),
        claims: std::sync::Mutex::new(claims),
    });
    let service = Service {
        shared: Arc::clone(&shared),
        booted: Instant::now(),
        last: tokio::sync::Mutex::new(None),
    };
    info!("attestation for `hawser verify` on {address}");
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let result = tonic::transport::Server::builder()
            .add_service(NodeAttestationServer::new(service))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = result {
            warn!(
                "the attestation server stopped: {}",
                crate::platform::error_chain(&e)
            );
        }
    });
    Ok((address, shared))
}
