//! What a node does with a peer update: check it whole, then change its view of the mesh.
//!
//! An update is refused, and the view (and so the running tunnel) left as it was, when: a delta
//! was made from a version the node does not hold; a whole set is older than the node's view (a
//! join service reading a stale copy of the registry); a "no change" answer names a version the
//! node does not hold; a peer's address is outside the prefix, is the node's own, or is another
//! peer's; a known peer's address now comes with another key (a key change); or one key appears
//! twice. The node's own entry in a whole set is recognised by its key and left out.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::registry::{PeerUpdate, is_host_address};
use crate::{MeshError, Peer, PublicKey};

/// A node's view of the mesh: the peers its tunnel has, at a registry version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshView {
    own_key: PublicKey,
    own_ip: Ipv4Addr,
    prefix: Ipv4Net,
    version: Option<u64>,
    peers: BTreeMap<PublicKey, Peer>,
}

/// What the tunnel must do after an update: one set of upserts and removals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Peers added, or whose endpoint, name or role changed.
    pub upserts: Vec<Peer>,
    /// Peers removed.
    pub removed: Vec<PublicKey>,
}

impl Changes {
    /// Whether the tunnel has nothing to do.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removed.is_empty()
    }
}

impl MeshView {
    /// An empty view for the node with key `own_key` at `own_ip` in `prefix`.
    pub fn new(own_key: PublicKey, own_ip: Ipv4Addr, prefix: Ipv4Net) -> Self {
        Self {
            own_key,
            own_ip,
            prefix,
            version: None,
            peers: BTreeMap::new(),
        }
    }

    /// The node's own VPN address.
    pub fn own_ip(&self) -> Ipv4Addr {
        self.own_ip
    }

    /// The registry version the view is at (`None` before the first update).
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// The peers, by key.
    pub fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }

    /// The peers that serve the peer API (the join services to poll).
    pub fn coordinators(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values().filter(|p| p.coordinator)
    }

    /// Checks `update` whole and applies it; on a refusal the view is unchanged.
    pub fn apply(&mut self, update: &PeerUpdate) -> Result<Changes, MeshError> {
        let current = self.version.unwrap_or(0);
        let next = match update {
            PeerUpdate::Current { version } => {
                if self.version != Some(*version) {
                    return Err(MeshError::UnknownVersion {
                        version: *version,
                        current,
                    });
                }
                return Ok(Changes::default());
            }
            PeerUpdate::Full { version, peers } => {
                if self.version.is_some_and(|v| *version < v) {
                    return Err(MeshError::VersionWentBack {
                        version: *version,
                        current,
                    });
                }
                // A whole set replaces the view: a known peer missing from it was removed (and
                // its address may have been given to a new member since).
                let gone: Vec<PublicKey> = self
                    .peers
                    .keys()
                    .filter(|k| !peers.iter().any(|p| p.public_key == **k))
                    .copied()
                    .collect();
                self.checked_set(BTreeMap::new(), peers, &gone)?
            }
            PeerUpdate::Delta {
                base,
                version,
                upserts,
                removed,
            } => {
                if self.version != Some(*base) || version < base {
                    return Err(MeshError::UnknownBase {
                        base: *base,
                        version: *version,
                        current,
                    });
                }
                self.checked_set(self.peers.clone(), upserts, removed)?
            }
        };
        let changes = diff(&self.peers, &next);
        self.peers = next;
        self.version = Some(update.version());
        Ok(changes)
    }

    /// The peer set `start` with `removed` taken out and `upserts` put in, if it is valid.
    fn checked_set(
        &self,
        mut set: BTreeMap<PublicKey, Peer>,
        upserts: &[Peer],
        removed: &[PublicKey],
    ) -> Result<BTreeMap<PublicKey, Peer>, MeshError> {
        for key in removed {
            set.remove(key);
        }
        let mut seen = BTreeMap::new();
        for peer in upserts {
            if seen.insert(peer.public_key, ()).is_some() {
                return Err(MeshError::DuplicateKey {
                    key: peer.public_key,
                });
            }
            if peer.public_key == self.own_key {
                // The node itself, as the registry lists it: not a peer of its own tunnel.
                if peer.vpn_ip != self.own_ip {
                    return Err(MeshError::OwnAddress {
                        peer: peer.name.clone(),
                        ip: peer.vpn_ip,
                    });
                }
                continue;
            }
            if !is_host_address(self.prefix, peer.vpn_ip) {
                return Err(MeshError::AddressOutside {
                    peer: peer.name.clone(),
                    ip: peer.vpn_ip,
                    prefix: self.prefix,
                });
            }
            if peer.vpn_ip == self.own_ip {
                return Err(MeshError::OwnAddress {
                    peer: peer.name.clone(),
                    ip: peer.vpn_ip,
                });
            }
            if let Some(known) = self.peers.values().find(|p| p.vpn_ip == peer.vpn_ip)
                && known.public_key != peer.public_key
                && !removed.contains(&known.public_key)
            {
                return Err(MeshError::KeyChanged {
                    node: peer.name.clone(),
                    known: known.public_key,
                    presented: peer.public_key,
                });
            }
            set.insert(peer.public_key, peer.clone());
        }
        let mut by_ip: BTreeMap<Ipv4Addr, &Peer> = BTreeMap::new();
        for peer in set.values() {
            if let Some(other) = by_ip.insert(peer.vpn_ip, peer) {
                return Err(MeshError::AddressClash {
                    ip: peer.vpn_ip,
                    first: other.name.clone(),
                    second: peer.name.clone(),
                });
            }
        }
        Ok(set)
    }
}

fn diff(old: &BTreeMap<PublicKey, Peer>, new: &BTreeMap<PublicKey, Peer>) -> Changes {
    Changes {
        upserts: new
            .values()
            .filter(|peer| old.get(&peer.public_key) != Some(*peer))
            .cloned()
            .collect(),
        removed: old
            .keys()
            .filter(|k| !new.contains_key(k))
            .copied()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    fn key(n: u8) -> PublicKey {
        PublicKey::from_slice(&[n; 32]).unwrap()
    }

    fn peer(n: u8, ip: &str) -> Peer {
        Peer {
            name: format!("node-{n}"),
            public_key: key(n),
            vpn_ip: ip.parse().unwrap(),
            endpoint: None,
            coordinator: false,
        }
    }

    fn prefix() -> Ipv4Net {
        "10.99.0.0/24".parse().unwrap()
    }

    /// The view of node 1 (10.99.0.2) after a whole set with nodes 1, 2 and 3.
    fn view() -> MeshView {
        let mut view = MeshView::new(key(1), "10.99.0.2".parse().unwrap(), prefix());
        let changes = view
            .apply(&PeerUpdate::Full {
                version: 3,
                peers: vec![
                    peer(1, "10.99.0.2"),
                    peer(2, "10.99.0.3"),
                    peer(3, "10.99.0.4"),
                ],
            })
            .unwrap();
        assert_eq!(
            changes.upserts.len(),
            2,
            "the node itself is not its own peer"
        );
        view
    }

    #[test]
    fn a_node_follows_the_registry_through_deltas_and_whole_sets() {
        let mut registry = Registry::new(prefix()).unwrap();
        let me = registry
            .admit("d1", "node-1", key(1), None, false, None)
            .unwrap();
        let mut view = MeshView::new(key(1), me.peer.vpn_ip, prefix());
        assert!(view.apply(&registry.update_since(None)).unwrap().is_empty());
        registry
            .admit("d2", "node-2", key(2), None, false, None)
            .unwrap();
        registry
            .admit("d3", "node-3", key(3), None, false, None)
            .unwrap();
        let changes = view.apply(&registry.update_since(view.version())).unwrap();
        assert_eq!(changes.upserts.len(), 2);
        registry.remove("d2");
        let endpoint = "192.0.2.3:51820".parse().unwrap();
        registry
            .admit("d3", "node-3", key(3), Some(endpoint), false, None)
            .unwrap();
        let update = registry.update_since(view.version());
        assert!(matches!(update, PeerUpdate::Delta { .. }));
        let changes = view.apply(&update).unwrap();
        assert_eq!(changes.removed, vec![key(2)]);
        assert_eq!(changes.upserts.len(), 1);
        assert_eq!(changes.upserts[0].endpoint, Some(endpoint));
        assert_eq!(view.version(), Some(registry.version()));
        assert!(
            view.apply(&registry.update_since(view.version()))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_removed_peer_that_comes_back_is_added_again() {
        let mut view = view();
        let removal = PeerUpdate::Delta {
            base: 3,
            version: 4,
            upserts: vec![],
            removed: vec![key(2)],
        };
        assert_eq!(view.apply(&removal).unwrap().removed, vec![key(2)]);
        let back = PeerUpdate::Delta {
            base: 4,
            version: 5,
            upserts: vec![peer(2, "10.99.0.3")],
            removed: vec![],
        };
        assert_eq!(
            view.apply(&back).unwrap().upserts,
            vec![peer(2, "10.99.0.3")]
        );
    }

    /// Each refusal names its reason and leaves the view as it was.
    #[test]
    fn bad_updates_are_refused_and_change_nothing() {
        let cases: Vec<(PeerUpdate, &str)> = vec![
            (
                PeerUpdate::Delta {
                    base: 2,
                    version: 4,
                    upserts: vec![],
                    removed: vec![],
                },
                "this node is at version 3",
            ),
            (
                PeerUpdate::Full {
                    version: 2,
                    peers: vec![],
                },
                "older copy",
            ),
            (PeerUpdate::Current { version: 7 }, "holds 3"),
            (
                PeerUpdate::Delta {
                    base: 3,
                    version: 4,
                    upserts: vec![peer(4, "10.98.0.9")],
                    removed: vec![],
                },
                "not a host address",
            ),
            (
                PeerUpdate::Delta {
                    base: 3,
                    version: 4,
                    upserts: vec![peer(4, "10.99.0.255")],
                    removed: vec![],
                },
                "not a host address",
            ),
            (
                PeerUpdate::Delta {
                    base: 3,
                    version: 4,
                    upserts: vec![peer(4, "10.99.0.3")],
                    removed: vec![],
                },
                "key change",
            ),
            (
                PeerUpdate::Delta {
                    base: 3,
                    version: 4,
                    upserts: vec![peer(4, "10.99.0.2")],
                    removed: vec![],
                },
                "own address",
            ),
            (
                PeerUpdate::Delta {
                    base: 3,
                    version: 4,
                    upserts: vec![peer(4, "10.99.0.9"), peer(5, "10.99.0.9")],
                    removed: vec![],
                },
                "address clash",
            ),
            (
                PeerUpdate::Delta {
                    base: 3,
                    version: 4,
                    upserts: vec![peer(4, "10.99.0.9"), peer(4, "10.99.0.10")],
                    removed: vec![],
                },
                "twice",
            ),
            (
                PeerUpdate::Full {
                    version: 4,
                    peers: vec![peer(1, "10.99.0.7")],
                },
                "own address",
            ),
        ];
        for (update, reason) in cases {
            let mut view = view();
            let before = view.clone();
            let error = view.apply(&update).unwrap_err();
            assert!(
                error.to_string().contains(reason),
                "{update:?}: `{error}` should say `{reason}`"
            );
            assert_eq!(view, before, "{update:?} changed the view");
        }
    }

    #[test]
    fn a_whole_set_may_give_a_removed_peers_address_to_a_new_one() {
        let mut view = view();
        let update = PeerUpdate::Full {
            version: 9,
            peers: vec![
                peer(1, "10.99.0.2"),
                peer(4, "10.99.0.3"),
                peer(3, "10.99.0.4"),
            ],
        };
        let changes = view.apply(&update).unwrap();
        assert_eq!(changes.removed, vec![key(2)]);
        assert_eq!(changes.upserts, vec![peer(4, "10.99.0.3")]);
    }

    #[test]
    fn a_peer_replaced_in_one_update_is_no_key_change() {
        let mut view = view();
        let update = PeerUpdate::Delta {
            base: 3,
            version: 5,
            upserts: vec![peer(4, "10.99.0.3")],
            removed: vec![key(2)],
        };
        let changes = view.apply(&update).unwrap();
        assert_eq!(changes.removed, vec![key(2)]);
        assert_eq!(changes.upserts, vec![peer(4, "10.99.0.3")]);
    }
}
