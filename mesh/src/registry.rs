//! The versioned peer registry the join service keeps (in its cluster store: a file, or the
//! control planes' etcd).
//!
//! Every member is recorded under its node ID (the disk UUID of its state disk: stable across
//! its reboots and rejoins, new when the disk is formatted again) with its name, public key, VPN
//! address and underlay endpoint. The registry's version grows by one with every change of the
//! peer set; each member remembers the version that last changed it, and removals leave a
//! tombstone, so "what changed since version N" is answered with a delta, or with the whole set
//! when N is older than the oldest tombstone kept or newer than the registry (unknown).
//!
//! Addresses: the prefix's first host address is never handed out (it is kept for the
//! out-of-cluster join service of local development and tests); members get the lowest free host
//! address. A member's address is its own while it exists: a rejoin gets the same one, and it is
//! only free again after [`Registry::remove`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};

use ipnet::Ipv4Net;

use crate::{MeshError, Peer, PublicKey};

/// How many removals are remembered for deltas; an older base gets the whole peer set.
pub const TOMBSTONES_KEPT: usize = 256;

/// The registry. Serialized as JSON into the cluster store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Registry {
    prefix: Ipv4Net,
    version: u64,
    members: BTreeMap<String, Member>,
    /// Removed keys and the version that removed them.
    tombstones: BTreeMap<PublicKey, u64>,
    /// The oldest version a delta can be made from.
    delta_floor: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Member {
    peer: Peer,
    changed: u64,
}

/// The result of [`Registry::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The member as recorded.
    pub peer: Peer,
    /// Whether the registry changed (a new member, or a new name or endpoint).
    pub changed: bool,
}

/// The answer to "what changed since version N".
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PeerUpdate {
    /// Nothing changed: the node is at the current version.
    Current {
        /// The current version.
        version: u64,
    },
    /// The whole peer set (the node's version was too old, unknown, or it had none).
    Full {
        /// The current version.
        version: u64,
        /// Every member.
        peers: Vec<Peer>,
    },
    /// What changed since `base`.
    Delta {
        /// The version the delta starts from (the node's).
        base: u64,
        /// The current version.
        version: u64,
        /// Members added or changed since `base`.
        upserts: Vec<Peer>,
        /// Keys removed since `base`.
        removed: Vec<PublicKey>,
    },
}

impl PeerUpdate {
    /// The version the update leads to.
    pub fn version(&self) -> u64 {
        match self {
            Self::Current { version }
            | Self::Full { version, .. }
            | Self::Delta { version, .. } => *version,
        }
    }
}

impl Registry {
    /// An empty registry for the mesh `prefix` (an IPv4 prefix of /8 to /30).
    pub fn new(prefix: Ipv4Net) -> Result<Self, MeshError> {
        if !(8..=30).contains(&prefix.prefix_len()) {
            return Err(MeshError::PrefixSize { prefix });
        }
        Ok(Self {
            prefix: prefix.trunc(),
            version: 0,
            members: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            delta_floor: 0,
        })
    }

    /// The mesh prefix.
    pub fn prefix(&self) -> Ipv4Net {
        self.prefix
    }

    /// The current version (0: nothing was ever recorded).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The address kept for the out-of-cluster join service: the prefix's first host address.
    pub fn reserved_address(&self) -> Ipv4Addr {
        first_host(self.prefix)
    }

    /// Records member `id` (a node's disk UUID, or a join service's name), or confirms it.
    ///
    /// A known member keeps its address; a new name or endpoint is recorded (a new version). A
    /// known member presenting another key is refused ([`MeshError::KeyChanged`]), as is a key
    /// that is another member's. `fixed_ip` asks for a particular address (the out-of-cluster join
    /// service's [`Registry::reserved_address`]); otherwise the lowest free one is given.
    pub fn admit(
        &mut self,
        id: &str,
        name: &str,
        public_key: PublicKey,
        endpoint: Option<SocketAddr>,
        coordinator: bool,
        fixed_ip: Option<Ipv4Addr>,
    ) -> Result<Admitted, MeshError> {
        if let Some((owner, _)) = self
            .members
            .iter()
            .find(|(other, m)| other.as_str() != id && m.peer.public_key == public_key)
        {
            return Err(MeshError::KeyInUse {
                key: public_key,
                owner: owner.clone(),
            });
        }
        if let Some(member) = self.members.get(id) {
            if member.peer.public_key != public_key {
                return Err(MeshError::KeyChanged {
                    node: id.to_owned(),
                    known: member.peer.public_key,
                    presented: public_key,
                });
            }
            let wanted = Peer {
                name: name.to_owned(),
                public_key,
                vpn_ip: member.peer.vpn_ip,
                endpoint: endpoint.or(member.peer.endpoint),
                coordinator,
            };
            if wanted == member.peer {
                return Ok(Admitted {
                    peer: wanted,
                    changed: false,
                });
            }
            let version = self.version + 1;
            self.members.insert(
                id.to_owned(),
                Member {
                    peer: wanted.clone(),
                    changed: version,
                },
            );
            self.version = version;
            return Ok(Admitted {
                peer: wanted,
                changed: true,
            });
        }
        let vpn_ip = match fixed_ip {
            Some(ip) => self.check_free(name, ip)?,
            None => self.free_address()?,
        };
        let version = self.version + 1;
        let peer = Peer {
            name: name.to_owned(),
            public_key,
            vpn_ip,
            endpoint,
            coordinator,
        };
        self.tombstones.remove(&public_key);
        self.members.insert(
            id.to_owned(),
            Member {
                peer: peer.clone(),
                changed: version,
            },
        );
        self.version = version;
        Ok(Admitted {
            peer,
            changed: true,
        })
    }

    /// Removes member `id`; its address is free again. `None` if it was not a member.
    pub fn remove(&mut self, id: &str) -> Option<Peer> {
        let member = self.members.remove(id)?;
        self.version += 1;
        self.tombstones.insert(member.peer.public_key, self.version);
        while self.tombstones.len() > TOMBSTONES_KEPT {
            let Some((&oldest_key, &oldest)) = self.tombstones.iter().min_by_key(|(_, v)| **v)
            else {
                break;
            };
            self.tombstones.remove(&oldest_key);
            self.delta_floor = self.delta_floor.max(oldest);
        }
        Some(member.peer)
    }

    /// Member `id`.
    pub fn member(&self, id: &str) -> Option<&Peer> {
        self.members.get(id).map(|m| &m.peer)
    }

    /// The member with this VPN address, and its ID (who is polling, inside the tunnel).
    pub fn member_by_ip(&self, ip: Ipv4Addr) -> Option<(&str, &Peer)> {
        self.members
            .iter()
            .find(|(_, m)| m.peer.vpn_ip == ip)
            .map(|(id, m)| (id.as_str(), &m.peer))
    }

    /// Every member, by ID.
    pub fn members(&self) -> impl Iterator<Item = (&str, &Peer)> {
        self.members.iter().map(|(id, m)| (id.as_str(), &m.peer))
    }

    /// What changed since version `known` (`None`: the node has nothing yet).
    pub fn update_since(&self, known: Option<u64>) -> PeerUpdate {
        match known {
            Some(known) if known == self.version => PeerUpdate::Current {
                version: self.version,
            },
            Some(known) if known < self.version && known >= self.delta_floor => PeerUpdate::Delta {
                base: known,
                version: self.version,
                upserts: self
                    .members
                    .values()
                    .filter(|m| m.changed > known)
                    .map(|m| m.peer.clone())
                    .collect(),
                removed: self
                    .tombstones
                    .iter()
                    .filter(|(_, removed)| **removed > known)
                    .map(|(key, _)| *key)
                    .collect(),
            },
            _ => PeerUpdate::Full {
                version: self.version,
                peers: self.members.values().map(|m| m.peer.clone()).collect(),
            },
        }
    }

    fn taken(&self) -> BTreeSet<Ipv4Addr> {
        self.members.values().map(|m| m.peer.vpn_ip).collect()
    }

    fn check_free(&self, name: &str, ip: Ipv4Addr) -> Result<Ipv4Addr, MeshError> {
        if !is_host_address(self.prefix, ip) {
            return Err(MeshError::AddressOutside {
                peer: name.to_owned(),
                ip,
                prefix: self.prefix,
            });
        }
        if let Some((owner, _)) = self.member_by_ip(ip) {
            return Err(MeshError::AddressClash {
                ip,
                first: owner.to_owned(),
                second: name.to_owned(),
            });
        }
        Ok(ip)
    }

    fn free_address(&self) -> Result<Ipv4Addr, MeshError> {
        let taken = self.taken();
        let reserved = self.reserved_address();
        self.prefix
            .hosts()
            .find(|ip| *ip != reserved && !taken.contains(ip))
            .ok_or(MeshError::PrefixFull {
                prefix: self.prefix,
                nodes: self.members.len(),
            })
    }
}

/// Whether `ip` is a host address of `prefix` (inside it, neither its network nor its
/// broadcast address).
pub fn is_host_address(prefix: Ipv4Net, ip: Ipv4Addr) -> bool {
    prefix.contains(&ip) && ip != prefix.network() && ip != prefix.broadcast()
}

fn first_host(prefix: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(prefix.network()).saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> PublicKey {
        PublicKey::from_slice(&[n; 32]).unwrap()
    }

    fn registry() -> Registry {
        Registry::new("10.99.0.0/24".parse().unwrap()).unwrap()
    }

    fn admit(r: &mut Registry, id: &str, n: u8) -> Peer {
        r.admit(id, id, key(n), None, false, None).unwrap().peer
    }

    #[test]
    fn members_get_the_lowest_free_address_after_the_reserved_one() {
        let mut r = registry();
        assert_eq!(r.reserved_address(), Ipv4Addr::new(10, 99, 0, 1));
        assert_eq!(admit(&mut r, "a", 1).vpn_ip, Ipv4Addr::new(10, 99, 0, 2));
        assert_eq!(admit(&mut r, "b", 2).vpn_ip, Ipv4Addr::new(10, 99, 0, 3));
        assert_eq!(r.version(), 2);
    }

    #[test]
    fn a_rejoin_keeps_the_address_and_the_version() {
        let mut r = registry();
        let first = admit(&mut r, "a", 1);
        admit(&mut r, "b", 2);
        let again = r.admit("a", "a", key(1), None, false, None).unwrap();
        assert_eq!(again.peer, first);
        assert!(!again.changed);
        assert_eq!(r.version(), 2);
    }

    #[test]
    fn an_address_is_not_reused_while_its_member_exists_and_is_free_after_removal() {
        let mut r = registry();
        let a = admit(&mut r, "a", 1);
        admit(&mut r, "b", 2);
        assert_eq!(r.remove("a").unwrap(), a);
        assert!(r.remove("a").is_none());
        // The freed address is the lowest free one again; b's is never handed out.
        assert_eq!(admit(&mut r, "c", 3).vpn_ip, a.vpn_ip);
        assert_eq!(admit(&mut r, "d", 4).vpn_ip, Ipv4Addr::new(10, 99, 0, 4));
    }

    #[test]
    fn a_key_change_and_a_shared_key_are_refused_and_change_nothing() {
        let mut r = registry();
        admit(&mut r, "a", 1);
        let before = r.clone();
        let error = r.admit("a", "a", key(9), None, false, None).unwrap_err();
        assert!(matches!(error, MeshError::KeyChanged { .. }), "{error}");
        assert!(error.to_string().contains("key change is refused"));
        let error = r.admit("b", "b", key(1), None, false, None).unwrap_err();
        assert!(matches!(error, MeshError::KeyInUse { .. }), "{error}");
        assert_eq!(r, before);
    }

    #[test]
    fn a_fixed_address_must_be_a_free_host_address_of_the_prefix() {
        let mut r = registry();
        let reserved = r.reserved_address();
        let joind = r
            .admit("joind", "joind", key(1), None, true, Some(reserved))
            .unwrap();
        assert_eq!(joind.peer.vpn_ip, reserved);
        let clash = r
            .admit("other", "other", key(2), None, true, Some(reserved))
            .unwrap_err();
        assert!(matches!(clash, MeshError::AddressClash { .. }), "{clash}");
        for outside in ["10.99.0.0", "10.99.0.255", "10.98.0.7"] {
            let error = r
                .admit(
                    "x",
                    "x",
                    key(3),
                    None,
                    false,
                    Some(outside.parse().unwrap()),
                )
                .unwrap_err();
            assert!(matches!(error, MeshError::AddressOutside { .. }), "{error}");
        }
    }

    #[test]
    fn a_full_prefix_is_refused() {
        let mut r = Registry::new("10.99.0.0/30".parse().unwrap()).unwrap();
        admit(&mut r, "a", 1); // .2; .1 is reserved
        let error = r.admit("b", "b", key(2), None, false, None).unwrap_err();
        assert!(
            matches!(error, MeshError::PrefixFull { nodes: 1, .. }),
            "{error}"
        );
        assert!(Registry::new("10.0.0.0/31".parse().unwrap()).is_err());
        assert!(Registry::new("10.0.0.0/7".parse().unwrap()).is_err());
    }

    #[test]
    fn updates_are_current_deltas_or_the_whole_set() {
        let mut r = registry();
        assert_eq!(
            r.update_since(None),
            PeerUpdate::Full {
                version: 0,
                peers: vec![]
            }
        );
        let a = admit(&mut r, "a", 1);
        let b = admit(&mut r, "b", 2);
        assert_eq!(r.update_since(Some(2)), PeerUpdate::Current { version: 2 });
        assert_eq!(
            r.update_since(Some(1)),
            PeerUpdate::Delta {
                base: 1,
                version: 2,
                upserts: vec![b.clone()],
                removed: vec![]
            }
        );
        r.remove("a");
        let endpoint: SocketAddr = "192.0.2.7:51820".parse().unwrap();
        let b2 = r
            .admit("b", "b", key(2), Some(endpoint), false, None)
            .unwrap();
        assert!(b2.changed);
        assert_eq!(
            r.update_since(Some(2)),
            PeerUpdate::Delta {
                base: 2,
                version: 4,
                upserts: vec![b2.peer.clone()],
                removed: vec![a.public_key]
            }
        );
        // A version the registry never had (a node ahead of it) gets the whole set.
        assert_eq!(
            r.update_since(Some(99)),
            PeerUpdate::Full {
                version: 4,
                peers: vec![b2.peer]
            }
        );
    }

    #[test]
    fn a_base_older_than_the_tombstones_kept_gets_the_whole_set() {
        let mut r = registry();
        for n in 0..=u16::try_from(TOMBSTONES_KEPT).unwrap() {
            let id = format!("n{n}");
            let mut bytes = [0u8; 32];
            bytes[..2].copy_from_slice(&n.to_le_bytes());
            let key = PublicKey::from_slice(&bytes).unwrap();
            r.admit(&id, &id, key, None, false, None).unwrap();
            r.remove(&id);
        }
        assert!(matches!(r.update_since(Some(1)), PeerUpdate::Full { .. }));
        let recent = r.version() - 2;
        assert!(matches!(
            r.update_since(Some(recent)),
            PeerUpdate::Delta { .. }
        ));
    }

    #[test]
    fn the_registry_round_trips_through_json() {
        let mut r = registry();
        admit(&mut r, "a", 1);
        admit(&mut r, "b", 2);
        r.remove("a");
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Registry>(&json).unwrap(), r);
    }
}
