//! The join service's mesh decisions: a join's VPN key and endpoint, checked; the node admitted
//! into the registry (last, after every other check, so a refused join takes no address);
//! a rejoin's entry with its new endpoint; the nodes' polls of the peer API.

use std::net::{Ipv4Addr, SocketAddr};

use hawser_mesh::{PeerStats, PeerUpdate, PublicKey, Registry};

use super::{JoinCore, JoinError, JoinRequest};
use crate::store::{PollStatus, ReadConsistency, StoreError};
use crate::vpn::{MeshSettings, PeerApiError, VpnTicket};

impl JoinCore {
    /// The request's VPN key and endpoint, checked; `None` when it has no key or the mesh is
    /// off.
    pub(super) fn vpn_request(
        &self,
        req: &JoinRequest,
    ) -> Result<Option<(PublicKey, Option<SocketAddr>)>, JoinError> {
        if self.mesh.is_none() || req.vpn_public_key.is_empty() {
            return Ok(None);
        }
        let key = PublicKey::from_slice(&req.vpn_public_key).map_err(JoinError::VpnPublicKey)?;
        Ok(Some((key, parse_endpoint(&req.vpn_endpoint)?)))
    }

    /// Admits disk `uuid` into the mesh (the same address again if it is a member) and makes
    /// its ticket.
    pub(super) fn admit_node(
        &self,
        mesh: &MeshSettings,
        uuid: &str,
        name: &str,
        key: PublicKey,
        endpoint: Option<SocketAddr>,
    ) -> Result<VpnTicket, JoinError> {
        let registry = self
            .store
            .update_vpn_registry(mesh.prefix, &mut |registry| {
                registry.admit(uuid, name, key, endpoint, false, None)?;
                Ok(())
            })
            .map_err(|e| mesh_error(name, e))?;
        let ticket = ticket_for(mesh, &registry, uuid)?;
        tracing::info!(
            target: "audit",
            disk_uuid = uuid,
            node = name,
            node_vpn_ip = %ticket.node.vpn_ip,
            node_vpn_pub_key = %key,
            registry_version = ticket.registry_version,
            "node admitted into the WireGuard mesh"
        );
        Ok(ticket)
    }

    /// The mesh part of a rejoin: the disk's entry if it has one, with its new endpoint
    /// recorded. Reading follows the rejoin rule (works without etcd quorum); recording the
    /// endpoint is best effort, the node also roams to it by its first packet.
    pub(super) fn rejoin_mesh(
        &self,
        mesh: &MeshSettings,
        uuid: &str,
        endpoint: Option<SocketAddr>,
    ) -> Result<Option<VpnTicket>, JoinError> {
        let Some(registry) = self.store.vpn_registry(ReadConsistency::LatestOrLocal)? else {
            return Ok(None);
        };
        let Some(member) = registry.member(uuid).cloned() else {
            return Ok(None);
        };
        let registry = match endpoint {
            Some(endpoint) if member.endpoint != Some(endpoint) => {
                let update = self
                    .store
                    .update_vpn_registry(mesh.prefix, &mut |registry| {
                        // Only a member still there is updated; a removal in between stands.
                        if let Some(now) = registry.member(uuid).cloned() {
                            registry.admit(
                                uuid,
                                &now.name,
                                now.public_key,
                                Some(endpoint),
                                now.coordinator,
                                None,
                            )?;
                        }
                        Ok(())
                    });
                match update {
                    Ok(updated) => updated,
                    Err(e) if e.is_unavailable() => {
                        tracing::warn!(
                            disk_uuid = uuid,
                            endpoint = %endpoint,
                            "cannot record the node's new VPN endpoint now (the node's first packet updates its peers anyway): {}",
                            hawser_attestation::error_chain(&e)
                        );
                        registry
                    }
                    Err(e) => return Err(mesh_error(&member.name, e)),
                }
            }
            _ => registry,
        };
        Ok(VpnTicket::for_member(mesh, &registry, uuid))
    }

    /// Answers a poll of the peer API from `source` (a VPN address): records it as the
    /// member's heartbeat with its tunnel statistics, and returns what changed since
    /// `known_version`. Blocking: call from the blocking pool.
    pub fn get_peers(
        &self,
        source: Ipv4Addr,
        known_version: Option<u64>,
        stats: Vec<PeerStats>,
    ) -> Result<PeerUpdate, PeerApiError> {
        self.poll(source, known_version, stats, &[])
            .map(|(update, _)| update)
    }

    /// [`JoinCore::get_peers`] with the member's re-attestation `evidence` (empty: none),
    /// judged ([`crate::reattest`]); also returns the nonce to ask the member to quote for
    /// next, when its last good quote is older than the interval. A failed re-attestation
    /// evicts the member and refuses the poll.
    pub fn poll(
        &self,
        source: Ipv4Addr,
        known_version: Option<u64>,
        stats: Vec<PeerStats>,
        evidence: &[u8],
    ) -> Result<(PeerUpdate, Option<[u8; 32]>), PeerApiError> {
        if self.mesh.is_none() {
            return Err(PeerApiError::MeshOff);
        }
        // Without etcd quorum (a whole-cluster restart) the members' own copies answer: the
        // control planes' etcd members reach each other through this very mesh, so a mesh that
        // waited for quorum would never form again. A node refuses a set older than its own.
        let Some(registry) = self.store.vpn_registry(ReadConsistency::LatestOrLocal)? else {
            return Err(PeerApiError::UnknownSource {
                address: source.into(),
            });
        };
        let (id, member) = crate::vpn::poller(&registry, source)?;
        let status = PollStatus {
            unix_time: unix_now(),
            known_version,
            stats,
        };
        // The heartbeat is best effort for the same reason: the answer matters more.
        match self.store.record_vpn_poll(&id, &status) {
            Err(e) if e.is_unavailable() => tracing::debug!(
                node = %member.name,
                "the poll is not recorded (the store is unavailable): {}",
                hawser_attestation::error_chain(&e)
            ),
            other => other?,
        }
        let (verdict, nonce) = self.reattest_poll(&id, evidence);
        if let crate::reattest::Verdict::Evicted(reason) = verdict {
            return Err(PeerApiError::Evicted { reason });
        }
        let update = registry.update_since(known_version);
        tracing::debug!(node = %member.name, vpn_ip = %source, known_version = ?known_version, version = update.version(), "poll answered");
        Ok((update, nonce))
    }
}

/// The ticket of member `uuid`, which `registry` must hold (it was just admitted).
fn ticket_for(
    mesh: &MeshSettings,
    registry: &Registry,
    uuid: &str,
) -> Result<VpnTicket, JoinError> {
    VpnTicket::for_member(mesh, registry, uuid).ok_or_else(|| {
        JoinError::Store(StoreError::VpnMemberMissing {
            id: uuid.to_owned(),
        })
    })
}

/// A mesh refusal as [`JoinError::Mesh`], anything else as [`JoinError::Store`].
fn mesh_error(node: &str, error: StoreError) -> JoinError {
    match error {
        StoreError::Mesh(source) => JoinError::Mesh {
            node: node.to_owned(),
            source,
        },
        other => JoinError::Store(other),
    }
}

/// `ip:port`, or `None` for an empty text.
pub(super) fn parse_endpoint(text: &str) -> Result<Option<SocketAddr>, JoinError> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| JoinError::VpnEndpoint {
        text: text.chars().take(80).collect(),
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
