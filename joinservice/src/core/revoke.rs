//! Revoking a node: its AK and disk on the deny-list in the cluster store, its mesh membership
//! removed (the admin's `RevokeNode`, and an eviction by re-attestation).

use hawser_cluster_store::revocations::{self, Revocation};
use hawser_cluster_store::{ClusterStore, ReadConsistency, StoreError};

use super::JoinCore;

/// Why a node cannot be revoked.
#[derive(Debug, thiserror::Error)]
pub enum RevokeError {
    /// The store failed.
    #[error("cannot consult the cluster state")]
    Store(#[from] StoreError),
    /// The node is not known by that name.
    #[error(
        "no node {0:?} in the cluster store (give its disk UUID, its AK name, or its mesh name \
         or address)"
    )]
    UnknownNode(String),
    /// The node is a member of the mesh, and the mesh refused its removal.
    #[error("the WireGuard mesh refused to remove {0}")]
    Mesh(String),
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A node as the store knows it.
struct KnownNode {
    disk_uuid: Option<String>,
    ak_name: String,
    name: String,
}

/// Finds `node`: a disk UUID, an AK name, or a mesh member's name or VPN address.
fn find_node(store: &dyn ClusterStore, node: &str) -> Result<KnownNode, RevokeError> {
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
    Err(RevokeError::UnknownNode(node.to_owned()))
}

impl JoinCore {
    /// Revokes `node` on `core`'s store: its AK and disk on the deny-list, its mesh membership
    /// removed (the admin's call, and an eviction by re-attestation).
    pub fn revoke_node(&self, node: &str, reason: &str) -> Result<(Revocation, bool), RevokeError> {
        let core = self;
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
                        RevokeError::Mesh(format!(
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
}
