//! The mesh's peer API (`hawser.vpn.v1.VpnApi`), a thin adapter over
//! [`JoinCore::get_peers`].
//!
//! Served as plain gRPC on the join service's address INSIDE the mesh: WireGuard has already
//! authenticated and encrypted the packet, and a tunnel only accepts a peer's packets from its
//! own VPN address, so the source address names the caller. A source that is no member's VPN
//! address is `PERMISSION_DENIED`. The caller binds the listener (on the join service's VPN
//! address, once its tunnel is up).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use hawser_proto::vpn::vpn_api_server::{VpnApi, VpnApiServer};
use hawser_proto::vpn::{GetPeersRequest, GetPeersResponse};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

use crate::core::JoinCore;
use crate::vpn::PeerApiError;

/// The largest GetPeers request accepted: statistics of a few thousand peers.
pub const MAX_POLL_BYTES: usize = 1024 * 1024;

/// The tonic service.
pub struct VpnApiService {
    core: Arc<JoinCore>,
}

impl VpnApiService {
    /// The peer API over `core` (whose mesh must be on).
    pub fn new(core: Arc<JoinCore>) -> Self {
        Self { core }
    }
}

/// The gRPC status for a refused poll; the message is the error's text.
pub fn status_of(error: &PeerApiError) -> Status {
    let code = match error {
        PeerApiError::MeshOff => Code::FailedPrecondition,
        PeerApiError::UnknownSource { .. } | PeerApiError::Evicted { .. } => Code::PermissionDenied,
        PeerApiError::Store(e) if e.is_unavailable() => Code::Unavailable,
        PeerApiError::Store(_) => Code::Internal,
    };
    Status::new(code, hawser_attestation::error_chain(error))
}

/// The caller's VPN address (an IPv4 address, or one mapped into IPv6).
fn source_of<T>(request: &Request<T>) -> Result<Ipv4Addr, Status> {
    let address = request
        .remote_addr()
        .ok_or_else(|| Status::permission_denied("the poll's source address is unknown"))?
        .ip();
    match address {
        IpAddr::V4(ip) => Ok(ip),
        IpAddr::V6(ip) => ip.to_ipv4_mapped().ok_or_else(|| {
            Status::permission_denied(format!("{ip} is no member's VPN address: the mesh is IPv4"))
        }),
    }
}

#[tonic::async_trait]
impl VpnApi for VpnApiService {
    async fn get_peers(
        &self,
        request: Request<GetPeersRequest>,
    ) -> Result<Response<GetPeersResponse>, Status> {
        let source = source_of(&request)?;
        let msg = request.into_inner();
        let stats = msg
            .stats
            .iter()
            .map(hawser_proto::mesh::stats_from_wire)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                Status::invalid_argument(format!(
                    "malformed tunnel statistics: {}",
                    hawser_attestation::error_chain(&e)
                ))
            })?;
        let core = Arc::clone(&self.core);
        let known_version = msg.known_version;
        let evidence = msg.evidence;
        let (update, nonce) = tokio::task::spawn_blocking(move || {
            core.poll(source, known_version, stats, &evidence)
        })
            .await
            .map_err(|e| Status::internal(format!("the GetPeers task failed: {e}")))?
            .map_err(|e| {
                tracing::warn!(source = %source, "poll refused: {}", hawser_attestation::error_chain(&e));
                status_of(&e)
            })?;
        let mut response = hawser_proto::mesh::update_to_wire(&update);
        response.attest_nonce = nonce.map(|n| n.to_vec()).unwrap_or_default();
        Ok(Response::new(response))
    }
}

/// Serves the peer API on `listener` until `shutdown` completes. The caller binds `listener`
/// on the join service's VPN address.
pub async fn serve_vpn_api(
    core: Arc<JoinCore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tracing::info!(listen = ?listener.local_addr().ok(), "serving the mesh's peer API");
    tonic::transport::Server::builder()
        .add_service(
            VpnApiServer::new(VpnApiService::new(core)).max_decoding_message_size(MAX_POLL_BYTES),
        )
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
}
