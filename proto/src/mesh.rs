//! Conversions between `hawser.vpn.v1` messages and the mesh's own types
//! ([`hawser_mesh`]), for the join service and PID 1. Everything from the wire is checked here:
//! key lengths, addresses and endpoints; the mesh's rules (prefix, clashes, versions) are
//! checked by [`hawser_mesh::MeshView::apply`] after. [`GrpcPeers`] is the node's client of
//! the peer API (PID 1 and tests poll through it).

use std::net::{Ipv4Addr, SocketAddr};

use crate::vpn::GetPeersRequest;
use crate::vpn::vpn_api_client::VpnApiClient;

use hawser_mesh::{Peer, PeerStats, PeerUpdate, PublicKey};

use crate::vpn;

/// A `hawser.vpn.v1` message that does not convert.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A public key is not 32 bytes.
    #[error("peer `{peer}` has a malformed public key")]
    Key {
        /// The peer's name (or `?` in statistics).
        peer: String,
        #[source]
        source: hawser_mesh::MeshError,
    },
    /// A VPN address is not an IPv4 address.
    #[error("peer `{peer}` has VPN address `{text}`, which is not an IPv4 address")]
    VpnIp {
        /// The peer's name.
        peer: String,
        /// The text.
        text: String,
    },
    /// An endpoint is not `ip:port`.
    #[error("peer `{peer}` has endpoint `{text}`, which is not ip:port")]
    Endpoint {
        /// The peer's name.
        peer: String,
        /// The text.
        text: String,
    },
    /// A GetPeers answer without an update.
    #[error("a GetPeers answer carries no update")]
    NoUpdate,
}

/// A peer for the wire.
pub fn peer_to_wire(peer: &Peer) -> vpn::Peer {
    vpn::Peer {
        name: peer.name.clone(),
        public_key: peer.public_key.as_bytes().to_vec(),
        vpn_ip: peer.vpn_ip.to_string(),
        endpoint: peer.endpoint.map(|e| e.to_string()).unwrap_or_default(),
        coordinator: peer.coordinator,
    }
}

/// A peer from the wire, checked.
pub fn peer_from_wire(peer: &vpn::Peer) -> Result<Peer, WireError> {
    Ok(Peer {
        name: peer.name.clone(),
        public_key: key(&peer.name, &peer.public_key)?,
        vpn_ip: peer
            .vpn_ip
            .parse::<Ipv4Addr>()
            .map_err(|_| WireError::VpnIp {
                peer: peer.name.clone(),
                text: peer.vpn_ip.clone(),
            })?,
        endpoint: endpoint(&peer.name, &peer.endpoint)?,
        coordinator: peer.coordinator,
    })
}

/// An update for the wire.
pub fn update_to_wire(update: &PeerUpdate) -> vpn::GetPeersResponse {
    use vpn::get_peers_response::Update;
    let update = match update {
        PeerUpdate::Current { version } => Update::Current(*version),
        PeerUpdate::Full { version, peers } => Update::Full(vpn::FullPeers {
            version: *version,
            peers: peers.iter().map(peer_to_wire).collect(),
        }),
        PeerUpdate::Delta {
            base,
            version,
            upserts,
            removed,
        } => Update::Delta(vpn::DeltaPeers {
            base: *base,
            version: *version,
            upserts: upserts.iter().map(peer_to_wire).collect(),
            removed: removed.iter().map(|k| k.as_bytes().to_vec()).collect(),
        }),
    };
    vpn::GetPeersResponse {
        update: Some(update),
        attest_nonce: Vec::new(),
    }
}

/// An update from the wire, checked.
pub fn update_from_wire(response: &vpn::GetPeersResponse) -> Result<PeerUpdate, WireError> {
    use vpn::get_peers_response::Update;
    let peers = |peers: &[vpn::Peer]| -> Result<Vec<Peer>, WireError> {
        peers.iter().map(peer_from_wire).collect()
    };
    Ok(match response.update.as_ref().ok_or(WireError::NoUpdate)? {
        Update::Current(version) => PeerUpdate::Current { version: *version },
        Update::Full(full) => PeerUpdate::Full {
            version: full.version,
            peers: peers(&full.peers)?,
        },
        Update::Delta(delta) => PeerUpdate::Delta {
            base: delta.base,
            version: delta.version,
            upserts: peers(&delta.upserts)?,
            removed: delta
                .removed
                .iter()
                .map(|k| key("(removed)", k))
                .collect::<Result<_, _>>()?,
        },
    })
}

/// Tunnel statistics for the wire.
pub fn stats_to_wire(stats: &PeerStats) -> vpn::PeerStats {
    vpn::PeerStats {
        public_key: stats.public_key.as_bytes().to_vec(),
        endpoint: stats.endpoint.map(|e| e.to_string()).unwrap_or_default(),
        last_handshake_unix: stats.last_handshake_unix.unwrap_or(0),
        rx_bytes: stats.rx_bytes,
        tx_bytes: stats.tx_bytes,
    }
}

/// Tunnel statistics from the wire, checked.
pub fn stats_from_wire(stats: &vpn::PeerStats) -> Result<PeerStats, WireError> {
    Ok(PeerStats {
        public_key: key("?", &stats.public_key)?,
        endpoint: endpoint("?", &stats.endpoint)?,
        last_handshake_unix: (stats.last_handshake_unix != 0).then_some(stats.last_handshake_unix),
        rx_bytes: stats.rx_bytes,
        tx_bytes: stats.tx_bytes,
    })
}

fn key(peer: &str, bytes: &[u8]) -> Result<PublicKey, WireError> {
    PublicKey::from_slice(bytes).map_err(|source| WireError::Key {
        peer: peer.to_owned(),
        source,
    })
}

fn endpoint(peer: &str, text: &str) -> Result<Option<SocketAddr>, WireError> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| WireError::Endpoint {
        peer: peer.to_owned(),
        text: text.to_owned(),
    })
}

/// Makes the node's re-attestation evidence for a join service's nonce (encoded
/// `hawser.evidence.v1.Evidence`); an error is the node's to log, and the poll goes without.
pub type Attester = std::sync::Arc<dyn Fn([u8; 32]) -> Result<Vec<u8>, String> + Send + Sync>;

/// The user data of a re-attestation quote.
pub const REATTEST_USER_DATA: &[u8] = b"hawser mesh re-attestation v1";

/// The join services' peer API, inside the mesh (plain gRPC: WireGuard authenticates both
/// ends).
pub struct GrpcPeers {
    port: u16,
    /// Quotes for the join service's nonce (re-attestation); `None`: the node never quotes.
    attester: Option<Attester>,
    /// The nonce the last answer asked the node to quote for.
    pending: Option<[u8; 32]>,
}

impl GrpcPeers {
    /// A source asking the join services' peer API on `port` (the VpnConfig's
    /// `vpn_api_port`).
    pub fn new(port: u16) -> Self {
        Self {
            port,
            attester: None,
            pending: None,
        }
    }

    /// Answers the join services' re-attestation nonces with `attester`'s evidence.
    pub fn with_attester(mut self, attester: Attester) -> Self {
        self.attester = Some(attester);
        self
    }
}

/// How long the connection to a join service's peer API may take (a join service that is down
/// is given up after this, and the next one asked).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long one poll may take once connected: long enough for a join service whose etcd has
/// no quorum (a whole-cluster restart) to give up its linearizable read (5 s) and answer from
/// its own member's copy, which is how the control planes' tunnels, and with them etcd's
/// quorum, come back.
pub const POLL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Why a poll failed.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// No connection to the join service's peer API.
    #[error("cannot reach the peer API at {at}")]
    Connect {
        at: SocketAddr,
        #[source]
        source: tonic::transport::Error,
    },
    /// The join service refused the poll.
    #[error("the peer API at {at} refused ({code:?}): {message}")]
    Status {
        at: SocketAddr,
        code: tonic::Code,
        message: String,
    },
    /// The answer does not convert.
    #[error("the peer API at {at} sent a malformed answer")]
    Answer {
        at: SocketAddr,
        #[source]
        source: WireError,
    },
}

impl hawser_mesh::agent::PeerSource for GrpcPeers {
    type Error = PollError;

    async fn get_peers(
        &mut self,
        coordinator: Ipv4Addr,
        known: Option<u64>,
        stats: &[PeerStats],
    ) -> Result<PeerUpdate, PollError> {
        let at = SocketAddr::from((coordinator, self.port));
        // The quote a join service asked for in its last answer, made off the runtime (TPM).
        let evidence = match (self.pending.take(), &self.attester) {
            (Some(nonce), Some(attester)) => {
                let attester = std::sync::Arc::clone(attester);
                match tokio::task::spawn_blocking(move || attester(nonce)).await {
                    Ok(Ok(evidence)) => evidence,
                    Ok(Err(_)) | Err(_) => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{at}"))
            .map_err(|source| PollError::Connect { at, source })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(POLL_TIMEOUT)
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|source| PollError::Connect { at, source })?;
        let response = VpnApiClient::new(channel)
            .get_peers(GetPeersRequest {
                known_version: known,
                stats: stats.iter().map(stats_to_wire).collect(),
                evidence,
            })
            .await
            .map_err(|status| PollError::Status {
                at,
                code: status.code(),
                message: status.message().to_owned(),
            })?
            .into_inner();
        self.pending = <[u8; 32]>::try_from(response.attest_nonce.as_slice()).ok();
        update_from_wire(&response).map_err(|source| PollError::Answer { at, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(n: u8) -> Peer {
        Peer {
            name: format!("node-{n}"),
            public_key: PublicKey::from_slice(&[n; 32]).unwrap(),
            vpn_ip: Ipv4Addr::new(10, 99, 0, n),
            endpoint: n
                .is_multiple_of(2)
                .then(|| SocketAddr::from(([192, 0, 2, n], 51820))),
            coordinator: n == 1,
        }
    }

    #[test]
    fn updates_and_stats_round_trip() {
        let updates = [
            PeerUpdate::Current { version: 4 },
            PeerUpdate::Full {
                version: 5,
                peers: vec![peer(1), peer(2)],
            },
            PeerUpdate::Delta {
                base: 3,
                version: 5,
                upserts: vec![peer(3)],
                removed: vec![peer(4).public_key],
            },
        ];
        for update in updates {
            assert_eq!(update_from_wire(&update_to_wire(&update)).unwrap(), update);
        }
        let stats = PeerStats {
            public_key: peer(2).public_key,
            endpoint: peer(2).endpoint,
            last_handshake_unix: Some(1_700_000_000),
            rx_bytes: 1,
            tx_bytes: 2,
        };
        assert_eq!(stats_from_wire(&stats_to_wire(&stats)).unwrap(), stats);
    }

    #[test]
    fn malformed_peers_are_refused_naming_the_peer_and_the_field() {
        let mut bad_key = peer_to_wire(&peer(2));
        bad_key.public_key.pop();
        let mut bad_ip = peer_to_wire(&peer(2));
        bad_ip.vpn_ip = "10.99.0.300".into();
        let mut bad_endpoint = peer_to_wire(&peer(2));
        bad_endpoint.endpoint = "somewhere".into();
        for (wire, says) in [
            (bad_key, "malformed public key"),
            (bad_ip, "10.99.0.300"),
            (bad_endpoint, "somewhere"),
        ] {
            let error = peer_from_wire(&wire).unwrap_err().to_string();
            assert!(error.contains("node-2") && error.contains(says), "{error}");
        }
        let empty = vpn::GetPeersResponse {
            update: None,
            attest_nonce: Vec::new(),
        };
        assert!(matches!(update_from_wire(&empty), Err(WireError::NoUpdate)));
    }
}
