//! The admin API (`hawser.admin.v1`): the releases the join services accept and the deny-list
//! of revoked nodes, changed only by the cluster's admin.
//!
//! Served on its own port (`hawser-joind --admin-listen`) over aTLS where this service attests
//! (on a control plane, with its TPM) and the caller does not: the admin's CLI verifies that it
//! talks to a control plane of an accepted release locked to the cluster before it sends
//! anything. The caller proves it is the admin with the admin token, derived from the cluster's
//! master secret (`MasterSecret::admin_token`): a worker, or anything else on the network,
//! never holds it. Every call is one audit line (target `audit`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::atls::{AtlsServer, ConnectionLimits, Identity, PeerPolicy, incoming_from};
use hawser_cluster_store::releases::{self, Release, ReleaseError};
use hawser_cluster_store::revocations::{self, Revocation};
use hawser_cluster_store::{ReadConsistency, StoreError};
use hawser_proto::admin::admin_server::{Admin, AdminServer};
use hawser_proto::admin::{
    AddReleaseRequest, ListNodesRequest, ListNodesResponse, ListReleasesRequest,
    ListReleasesResponse, ReadmitNodeRequest, ReleaseResponse, RetireReleaseRequest,
    RevokeNodeRequest, RevokeNodeResponse,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::core::{JoinCore, RevokeError};
use crate::service::bind_listener;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The release cannot be added or retired.
    #[error(transparent)]
    Release(#[from] ReleaseError),
    /// The store failed.
    #[error("cannot consult the cluster state")]
    Store(#[from] StoreError),
    /// The node cannot be revoked.
    #[error(transparent)]
    Revoke(#[from] RevokeError),
    /// No revocation is in force for the node.
    #[error("node {0:?} is not revoked")]
    NotRevoked(String),
}

fn status_of(err: &AdminError) -> Status {
    let message = hawser_attestation::error_chain(err);
    match err {
        AdminError::Release(ReleaseError::Store(e))
        | AdminError::Store(e)
        | AdminError::Revoke(RevokeError::Store(e))
            if e.is_unavailable() =>
        {
            Status::unavailable(message)
        }
        AdminError::Release(ReleaseError::Store(_))
        | AdminError::Store(_)
        | AdminError::Revoke(RevokeError::Store(_)) => Status::internal(message),
        AdminError::Release(
            ReleaseError::Name(_) | ReleaseError::Measurements(_) | ReleaseError::NothingEnforced,
        ) => Status::invalid_argument(message),
        AdminError::Release(ReleaseError::Unknown { .. })
        | AdminError::Revoke(RevokeError::UnknownNode(_))
        | AdminError::NotRevoked(_) => Status::not_found(message),
        AdminError::Release(_) | AdminError::Revoke(RevokeError::Mesh(_)) => {
            Status::failed_precondition(message)
        }
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The admin calls, free of gRPC (blocking: the store's calls block).
pub struct AdminCore {
    core: Arc<JoinCore>,
}

impl AdminCore {
    /// The admin calls over `core`'s store and mesh.
    pub fn new(core: Arc<JoinCore>) -> Self {
        Self { core }
    }

    fn store(&self) -> &dyn hawser_cluster_store::ClusterStore {
        self.core.store().as_ref()
    }

    /// Every release, oldest first.
    pub fn list_releases(&self) -> Result<Vec<Release>, AdminError> {
        Ok(releases::list(
            self.store(),
            ReadConsistency::LatestOrLocal,
        )?)
    }

    /// Adds release `name` of `measurements_json`; returns it and whether it is new.
    pub fn add_release(
        &self,
        name: &str,
        measurements_json: &str,
    ) -> Result<(Release, bool), AdminError> {
        let release =
            Release::from_measurements_text(name, measurements_json, "admin", now_unix())?;
        let added = releases::add(self.store(), &release)?;
        let new = added == releases::Added::New;
        tracing::info!(target: "audit", call = "AddRelease", release = %release.name, digest = %release.digest, new, "release added by the admin");
        Ok((release, new))
    }

    /// Retires release `name`.
    pub fn retire_release(&self, name: &str) -> Result<(Release, bool), AdminError> {
        let before = self
            .list_releases()?
            .into_iter()
            .find(|r| r.name == name)
            .is_some_and(|r| r.is_retired());
        let release = releases::retire(self.store(), name, now_unix())?;
        tracing::info!(target: "audit", call = "RetireRelease", release = %release.name, digest = %release.digest, "release retired by the admin: its nodes are refused from now on");
        Ok((release, !before))
    }

    /// Revokes `node`: its AK and disk on the deny-list, its mesh membership removed.
    pub fn revoke(&self, node: &str, reason: &str) -> Result<(Revocation, bool), AdminError> {
        let (revocation, removed) = self.core.revoke_node(node, reason)?;
        tracing::warn!(target: "audit", call = "RevokeNode", node = %revocation.node, ak = %revocation.ak_name, disk_uuid = revocation.disk_uuid.as_deref().unwrap_or(""), removed_from_mesh = removed, reason = %revocation.reason, "node revoked by the admin: its joins and rejoins are refused");
        Ok((revocation, removed))
    }

    /// Readmits `node` (a disk UUID or an AK name).
    pub fn readmit(&self, node: &str) -> Result<Revocation, AdminError> {
        let all = revocations::list(self.store(), ReadConsistency::Latest)?;
        let uuid = hawser_keys::canonical_uuid(node).ok();
        let Some(found) = revocations::find(&all, node, uuid.as_deref()) else {
            return Err(AdminError::NotRevoked(node.to_owned()));
        };
        let ak_name = found.key().to_owned();
        let readmitted = revocations::readmit(self.store(), &ak_name, now_unix())?
            .ok_or_else(|| AdminError::NotRevoked(node.to_owned()))?;
        tracing::info!(target: "audit", call = "ReadmitNode", node = %readmitted.node, ak = %ak_name, "node readmitted by the admin");
        Ok(readmitted)
    }
}

/// The tonic service: checks the token, runs the call on the blocking pool.
struct AdminService {
    admin: Arc<AdminCore>,
    call_timeout: Duration,
}

impl AdminService {
    async fn run<T: Send + 'static>(
        &self,
        peer: Option<SocketAddr>,
        call: &'static str,
        token: &[u8],
        work: impl FnOnce(&AdminCore) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, Status> {
        if !self.admin.core.is_admin_token(token) {
            tracing::warn!(target: "audit", call, peer = ?peer, "admin call refused: not the admin's token");
            return Err(Status::unauthenticated(
                "not the admin's token: admin calls need the cluster's master secret (hawser \
                 --master-secret)",
            ));
        }
        let admin = Arc::clone(&self.admin);
        let task = tokio::task::spawn_blocking(move || work(&admin));
        match tokio::time::timeout(self.call_timeout, task).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(e))) => Err(status_of(&e)),
            Ok(Err(e)) => Err(Status::internal(format!("the {call} task failed: {e}"))),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{call} did not finish within {:?}",
                self.call_timeout
            ))),
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    // A store record is plain data: it always serializes.
    serde_json::to_string(value).unwrap_or_default()
}

fn peer_of<T>(request: &Request<T>) -> Option<SocketAddr> {
    request
        .extensions()
        .get::<hawser_attestation::atls::AtlsConnectInfo>()
        .and_then(|info| info.remote_addr)
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn list_releases(
        &self,
        request: Request<ListReleasesRequest>,
    ) -> Result<Response<ListReleasesResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let releases = self
            .run(peer, "ListReleases", &req.admin_token, |a| {
                a.list_releases()
            })
            .await?;
        Ok(Response::new(ListReleasesResponse {
            release_json: releases.iter().map(json).collect(),
        }))
    }

    async fn add_release(
        &self,
        request: Request<AddReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let (name, text) = (req.name, req.measurements_json);
        let (release, changed) = self
            .run(peer, "AddRelease", &req.admin_token, move |a| {
                a.add_release(&name, &text)
            })
            .await?;
        Ok(Response::new(ReleaseResponse {
            release_json: json(&release),
            changed,
        }))
    }

    async fn retire_release(
        &self,
        request: Request<RetireReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let name = req.name;
        let (release, changed) = self
            .run(peer, "RetireRelease", &req.admin_token, move |a| {
                a.retire_release(&name)
            })
            .await?;
        Ok(Response::new(ReleaseResponse {
            release_json: json(&release),
            changed,
        }))
    }

    async fn revoke_node(
        &self,
        request: Request<RevokeNodeRequest>,
    ) -> Result<Response<RevokeNodeResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let (node, reason) = (req.node, req.reason);
        let (revocation, removed) = self
            .run(peer, "RevokeNode", &req.admin_token, move |a| {
                a.revoke(&node, &reason)
            })
            .await?;
        Ok(Response::new(RevokeNodeResponse {
            revocation_json: json(&revocation),
            removed_from_mesh: removed,
        }))
    }

    async fn readmit_node(
        &self,
        request: Request<ReadmitNodeRequest>,
    ) -> Result<Response<RevokeNodeResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let node = req.node;
        let revocation = self
            .run(peer, "ReadmitNode", &req.admin_token, move |a| {
                a.readmit(&node)
            })
            .await?;
        Ok(Response::new(RevokeNodeResponse {
            revocation_json: json(&revocation),
            removed_from_mesh: false,
        }))
    }

    async fn list_nodes(
        &self,
        request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let peer = peer_of(&request);
        let req = request.into_inner();
        let nodes = self
            .run(peer, "ListNodes", &req.admin_token, |a| a.list_nodes())
            .await?;
        Ok(Response::new(ListNodesResponse { node_json: nodes }))
    }
}

impl AdminCore {
    /// The mesh's members with their last poll and any revocation, one JSON object each.
    pub fn list_nodes(&self) -> Result<Vec<String>, AdminError> {
        let registry = self.store().vpn_registry(ReadConsistency::LatestOrLocal)?;
        let polls = self.store().vpn_polls()?;
        let revoked = revocations::list(self.store(), ReadConsistency::LatestOrLocal)?;
        let attested = self.store().records(
            hawser_cluster_store::RecordKind::Attested,
            ReadConsistency::LatestOrLocal,
        )?;
        let mut nodes = Vec::new();
        if let Some(registry) = &registry {
            for (id, peer) in registry.members() {
                let revocation = revoked
                    .iter()
                    .find(|r| r.in_force() && r.disk_uuid.as_deref() == Some(id));
                nodes.push(
                    serde_json::json!({
                        "id": id,
                        "name": peer.name,
                        "vpnIp": peer.vpn_ip.to_string(),
                        "endpoint": peer.endpoint.map(|e| e.to_string()),
                        "coordinator": peer.coordinator,
                        "lastPollUnix": polls.get(id).map(|p| p.unix_time),
                        "attested": attested
                            .get(id)
                            .and_then(|a| serde_json::from_slice::<serde_json::Value>(a).ok()),
                        "revoked": revocation.map(|r| r.reason.clone()),
                    })
                    .to_string(),
                );
            }
        }
        for r in revoked.iter().filter(|r| r.in_force()) {
            let in_mesh = registry.as_ref().is_some_and(|reg| {
                r.disk_uuid
                    .as_deref()
                    .is_some_and(|d| reg.member(d).is_some())
            });
            if !in_mesh {
                nodes.push(
                    serde_json::json!({
                        "id": r.disk_uuid.clone().unwrap_or_else(|| r.ak_name.clone()),
                        "name": r.node,
                        "revoked": r.reason,
                    })
                    .to_string(),
                );
            }
        }
        Ok(nodes)
    }
}

/// The running admin API.
pub struct RunningAdmin {
    /// The bound address.
    pub local_addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningAdmin {
    /// Stops accepting and waits for calls in progress.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(());
        let _ = self.task.await;
    }
}

/// Serves the admin API on `listen`: aTLS with `identity` (this service attests when it has a
/// TPM), the caller unauthenticated at the TLS layer and authenticated by its token.
pub async fn spawn(
    listen: SocketAddr,
    core: Arc<JoinCore>,
    identity: Identity,
    limits: ConnectionLimits,
    call_timeout: Duration,
) -> std::io::Result<RunningAdmin> {
    let listener = bind_listener(listen)?;
    let local_addr = listener.local_addr()?;
    let server = AtlsServer::new(identity, PeerPolicy::Unauthenticated);
    let incoming = incoming_from(listener, limits, move || Some(server.clone()));
    let service = AdminService {
        admin: Arc::new(AdminCore::new(core)),
        call_timeout,
    };
    let (shutdown, shutdown_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(
        async move {
            tonic::transport::Server::builder()
                .add_service(AdminServer::new(service))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = shutdown_rx.await;
                })
                .await
        }
        .instrument(tracing::info_span!("admin_api")),
    );
    tracing::info!(listen = %local_addr, "admin API listening (the service attests; callers show the admin token)");
    Ok(RunningAdmin {
        local_addr,
        shutdown,
        task,
    })
}
