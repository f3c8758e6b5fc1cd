//! The loop's peers: each one's `Tunn`, endpoint and allowed IPs, and the routes from
//! destination addresses to peers.

use super::*;

/// One peer in the loop.
pub(super) struct PeerEntry {
    pub(super) key: PublicKey,
    pub(super) tunn: Tunn,
    pub(super) endpoint: Option<SocketAddr>,
    pub(super) allowed: Vec<Ipv4Net>,
    /// A new peer, greeted with a handshake at the next tick if it has an endpoint (as the
    /// kernel's WireGuard sends a keepalive once the interval is set), so that a peer behind
    /// NAT is reachable before its first packet (not 25 s later).
    pub(super) greet: bool,
}

/// The peers and the keys, shared by the loop and the configuring thread.
pub(super) struct State {
    pub(super) private: x25519::StaticSecret,
    pub(super) public: x25519::PublicKey,
    pub(super) rate_limiter: Arc<RateLimiter>,
    /// By the index in their session indices (`receiver_idx >> 8`).
    pub(super) peers: HashMap<u32, PeerEntry>,
    pub(super) by_key: HashMap<PublicKey, u32>,
    /// Allowed networks, longest prefix first.
    pub(super) routes: Vec<(Ipv4Net, u32)>,
    pub(super) next_index: u32,
}

impl State {
    pub(super) fn route(&self, destination: Ipv4Addr) -> Option<u32> {
        self.routes
            .iter()
            .find(|(net, _)| net.contains(&destination))
            .map(|(_, index)| *index)
    }

    pub(super) fn rebuild_routes(&mut self) {
        self.routes = self
            .peers
            .iter()
            .flat_map(|(index, peer)| peer.allowed.iter().map(move |net| (*net, *index)))
            .collect();
        self.routes
            .sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
    }

    pub(super) fn fresh_index(&mut self) -> u32 {
        loop {
            self.next_index = (self.next_index.wrapping_add(1)) & 0x00ff_ffff;
            if self.next_index != 0 && !self.peers.contains_key(&self.next_index) {
                return self.next_index;
            }
        }
    }

    pub(super) fn remove(&mut self, key: &PublicKey) {
        if let Some(index) = self.by_key.remove(key) {
            self.peers.remove(&index);
        }
    }

    pub(super) fn upsert(&mut self, section: &PeerSection) {
        let mut allowed = vec![Ipv4Net::from(section.vpn_ip)];
        allowed.extend(section.pod_range);
        if let Some(index) = self.by_key.get(&section.public_key)
            && let Some(peer) = self.peers.get_mut(index)
        {
            if section.endpoint.is_some() {
                peer.endpoint = section.endpoint;
            }
            peer.allowed = allowed;
            return;
        }
        let index = self.fresh_index();
        let tunn = Tunn::new(
            self.private.clone(),
            x25519::PublicKey::from(*section.public_key.as_bytes()),
            None,
            Some(PERSISTENT_KEEPALIVE_SECONDS),
            index,
            Some(Arc::clone(&self.rate_limiter)),
        );
        self.peers.insert(
            index,
            PeerEntry {
                key: section.public_key,
                tunn,
                endpoint: section.endpoint,
                allowed,
                greet: true,
            },
        );
        self.by_key.insert(section.public_key, index);
    }
}
