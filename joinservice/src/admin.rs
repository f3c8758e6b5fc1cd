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
use hawser_cluster_store::{ClusterStore, ReadConsistency, StoreError};
use hawser_proto::admin::admin_server::{Admin, AdminServer};
use hawser_proto::admin::{
    AddReleaseRequest, ListNodesRequest, ListNodesResponse, ListReleasesRequest,
    ListReleasesResponse, ReadmitNodeRequest, ReleaseResponse, RetireReleaseRequest,
    RevokeNodeRequest, RevokeNodeResponse,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::core::JoinCore;
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
    /// The node to revoke is not known by that name.
    #[error(
        "no node {0:?} in the cluster store (give its disk UUID, its AK name, or its mesh name \
         or address)"
    )]
    UnknownNode(String),
    /// No revocation is in force for the node.
    #[error("node {0:?} is not revoked")]
    NotRevoked(String),
    /// The node revoked is a member of the mesh, and the mesh refused its removal.
    #[error("the WireGuard mesh refused to remove {0}")]
    Mesh(String),
}

fn status_of(err: &AdminError) -> Status {
    let message = hawser_attestation::error_chain(err);
    match err {
        AdminError::Release(ReleaseError::Store(e)) | AdminError::Store(e)
            if e.is_unavailable() =>
        {
            Status::unavailable(message)
        }
        AdminError::Release(ReleaseError::Store(_)) | AdminError::Store(_) => {
            Status::internal(message)
        }
        AdminError::Release(
            ReleaseError::Name(_) | ReleaseError::Measurements(_) | ReleaseError::NothingEnforced,
        ) => Status::invalid_argument(message),
        AdminError::Release(ReleaseError::Unknown { .. })
        | AdminError::UnknownNode(_)
        | AdminError::NotRevoked(_) => Status::not_found(message),
        AdminError::Release(_) | AdminError::Mesh(_) => Status::failed_precondition(message),
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

/// A node as the store knows it.
struct KnownNode {
    disk_uuid: Option<String>,
    ak_name: String,
    name: String,
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
        let (revocation, removed) = revoke_node(&self.core, node, reason)?;
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

/// Finds `node`: a disk UUID, an AK name, or a mesh member's name or VPN address.
fn find_node(store: &dyn ClusterStore, node: &str) -> Result<KnownNode, AdminError> {
    let registry = store.vpn_registry(ReadConsistency::Latest)?;
    let member_id = registry.as_ref().and_then(|r| {
        let by_ip = node
            .parse()
            .ok()
            .and_then(|ip| r.member_by_ip(ip))
            .map(|(id, _)| id.to_owned());
        by_ip.or_else(|| {
            r.members()
                .find(|(id, peer)| *id == node || peer.name == node)
                .map(|(id, _)| id.to_owned())
        })
    });
    let uuid = member_id
        .as_deref()
        .or(Some(node))
        .and_then(|id| hawser_keys::canonical_uuid(id).ok());
    if let Some(uuid) = uuid.clone()
        && let Some(hawser_cluster_store::DiskBinding::Bound(ak_name)) =
            store.disk_binding(&uuid, ReadConsistency::Latest)?
    {
        let name = registry
            .as_ref()
            .and_then(|r| r.member(&uuid).map(|p| p.name.clone()))
            .unwrap_or_else(|| uuid.clone());
        return Ok(KnownNode {
            disk_uuid: Some(uuid),
            ak_name,
            name,
        });
    }
    // A mesh member whose disk has no binding (none is made without one, but a store may
    // be older): revoked by its disk.
    if let (Some(uuid), Some(registry)) = (&uuid, &registry)
        && let Some(member) = registry.member(uuid)
    {
        return Ok(KnownNode {
            disk_uuid: Some(uuid.clone()),
            ak_name: String::new(),
            name: member.name.clone(),
        });
    }
    let is_hex = node.len() >= 6 && node.bytes().all(|b| b.is_ascii_hexdigit());
    if is_hex {
        return Ok(KnownNode {
            disk_uuid: None,
            ak_name: node.to_ascii_lowercase(),
            name: node.to_owned(),
        });
    }
    Err(AdminError::UnknownNode(node.to_owned()))
}

/// Revokes `node` on `core`'s store: its AK and disk on the deny-list, its mesh membership
/// removed (the admin's call, and an eviction by re-attestation).
pub(crate) fn revoke_node(
    core: &JoinCore,
    node: &str,
    reason: &str,
) -> Result<(Revocation, bool), AdminError> {
    let store = core.store().as_ref();
    let known = find_node(store, node)?;
    let revocation = Revocation {
        ak_name: known.ak_name.clone(),
        disk_uuid: known.disk_uuid.clone(),
        node: known.name.clone(),
        reason: if reason.is_empty() {
            "revoked by the admin".into()
        } else {
            reason.to_owned()
        },
        revoked_unix: now_unix(),
        readmitted_unix: None,
    };
    revocations::revoke(store, &revocation)?;
    let removed = match (&known.disk_uuid, core.mesh()) {
        (Some(uuid), Some(mesh)) => {
            let mut removed = false;
            store
                .update_vpn_registry(mesh.prefix, &mut |registry| {
                    removed = registry.remove(uuid).is_some();
                    Ok(())
                })
                .map_err(|e| {
                    AdminError::Mesh(format!(
                        "{}: {}",
                        known.name,
                        hawser_attestation::error_chain(&e)
                    ))
                })?;
            removed
        }
        _ => false,
    };
    Ok((revocation, removed))
}

/// Evicts mesh member `id` (a disk UUID) for `reason` (re-attestation).
pub(crate) fn revoke_member(core: &JoinCore, id: &str, reason: &str) -> Result<(), AdminError> {
    revoke_node(core, id, reason).map(|_| ())
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
