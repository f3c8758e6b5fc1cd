//! A node's side of the mesh after the join: poll a join service for peer updates, apply them
//! to the tunnel, report the tunnel's statistics. Generic over where updates come from
//! ([`PeerSource`]: the gRPC client of `hawser.vpn.v1` in PID 1) and what carries the traffic
//! ([`TunnelControl`]: the boringtun tunnel), so that the logic is plain Rust.
//!
//! Each round asks the join services the node knows (the mesh's coordinators, in turn, starting
//! with the one that answered last) for what changed since the node's version; the poll carries
//! the tunnel's statistics and is the node's heartbeat. An update is checked whole
//! ([`MeshView::apply`]) and applied to the tunnel in one step; a refused update, a tunnel that
//! refuses the change, or no join service answering all leave the running mesh as it was, and
//! the next round tries again. Rounds are ~10 s apart with jitter, so that nodes booted together
//! do not poll in step.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::registry::PeerUpdate;
use crate::update::{Changes, MeshView};
use crate::{MeshError, Peer, PeerStats, PublicKey};

/// How often a node polls, before jitter.
pub const POLL_INTERVAL: Duration = Duration::from_secs(10);

/// The most a poll is moved either way (a fifth of the interval).
pub const POLL_JITTER: Duration = Duration::from_secs(2);

/// Where peer updates come from: a join service's peer API.
pub trait PeerSource {
    /// Why a poll failed (unreachable, refused).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Asks the join service at `coordinator` what changed since `known`, reporting `stats`.
    fn get_peers(
        &mut self,
        coordinator: Ipv4Addr,
        known: Option<u64>,
        stats: &[PeerStats],
    ) -> impl std::future::Future<Output = Result<PeerUpdate, Self::Error>>;
}

/// The tunnel the mesh's peers are configured on.
pub trait TunnelControl {
    /// Why the tunnel refused.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Adds or updates `upserts` and removes `removed`, in one step.
    fn apply(&self, upserts: &[Peer], removed: &[PublicKey]) -> Result<(), Self::Error>;

    /// What the tunnel knows of each peer.
    fn stats(&self) -> Result<Vec<PeerStats>, Self::Error>;
}

/// What one poll round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// A join service answered; the tunnel now has `changes` applied (often none).
    Applied {
        /// The join service that answered.
        coordinator: Ipv4Addr,
        /// The registry version the node is at now.
        version: u64,
        /// What changed on the tunnel.
        changes: Changes,
    },
    /// The node knows no join service inside the mesh to ask.
    NoCoordinator,
}

/// Why a poll round changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No join service answered; the last one's error is the source.
    #[error("no join service of the mesh answered ({tried} tried)")]
    Unreachable {
        /// How many were asked.
        tried: usize,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The update was refused; the mesh is as it was.
    #[error("the peer update from {coordinator} was refused; the mesh is left as it was")]
    Refused {
        /// The join service that sent it.
        coordinator: Ipv4Addr,
        #[source]
        source: MeshError,
    },
    /// The tunnel refused the change or its statistics; the view is as it was.
    #[error("the tunnel refused the mesh change")]
    Tunnel {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

/// The node's mesh agent.
pub struct Agent<T> {
    view: MeshView,
    tunnel: T,
    preferred: Option<Ipv4Addr>,
    /// The node serves the peer API itself (a control plane's join service shares its tunnel).
    serves_peer_api: bool,
}

impl<T: TunnelControl> Agent<T> {
    /// An agent for `tunnel`, whose view is `view` (empty, or as the join ticket set it).
    pub fn new(view: MeshView, tunnel: T) -> Self {
        Self {
            view,
            tunnel,
            preferred: None,
            serves_peer_api: false,
        }
    }

    /// The node runs a join service that serves the peer API on the node's own VPN address (a
    /// control plane): it is asked first, before the coordinators among the peers. A control
    /// plane's tunnel thus learns of new members from the registry its own join service reads,
    /// even while it knows no other coordinator (the cluster's first node).
    pub fn serving_peer_api(mut self) -> Self {
        self.serves_peer_api = true;
        self
    }

    /// The node's view of the mesh.
    pub fn view(&self) -> &MeshView {
        &self.view
    }

    /// The tunnel.
    pub fn tunnel(&self) -> &T {
        &self.tunnel
    }

    /// Applies `update` (e.g. the peer set in the join ticket): checked whole, then the tunnel
    /// is changed, then the view; on any refusal both stay as they were.
    pub fn apply(&mut self, update: &PeerUpdate) -> Result<Changes, AgentError> {
        self.apply_from(update, None)
    }

    fn apply_from(
        &mut self,
        update: &PeerUpdate,
        coordinator: Option<Ipv4Addr>,
    ) -> Result<Changes, AgentError> {
        let mut next = self.view.clone();
        let changes = next.apply(update).map_err(|source| AgentError::Refused {
            coordinator: coordinator.unwrap_or(Ipv4Addr::UNSPECIFIED),
            source,
        })?;
        if !changes.is_empty() {
            self.tunnel
                .apply(&changes.upserts, &changes.removed)
                .map_err(|source| AgentError::Tunnel {
                    source: Box::new(source),
                })?;
        }
        self.view = next;
        Ok(changes)
    }

    /// One poll round: the join services in the view, the one that answered last first.
    pub async fn poll<S: PeerSource>(&mut self, source: &mut S) -> Result<Round, AgentError> {
        let mut coordinators: Vec<Ipv4Addr> = self.view.coordinators().map(|p| p.vpn_ip).collect();
        if self.serves_peer_api {
            coordinators.insert(0, self.view.own_ip());
        }
        if coordinators.is_empty() {
            return Ok(Round::NoCoordinator);
        }
        if let Some(preferred) = self.preferred
            && let Some(at) = coordinators.iter().position(|c| *c == preferred)
        {
            coordinators.rotate_left(at);
        }
        let stats = self.tunnel.stats().map_err(|source| AgentError::Tunnel {
            source: Box::new(source),
        })?;
        let mut last_error: Option<Box<dyn std::error::Error + Send + Sync>> = None;
        for coordinator in &coordinators {
            match source
                .get_peers(*coordinator, self.view.version(), &stats)
                .await
            {
                Ok(update) => {
                    self.preferred = Some(*coordinator);
                    let changes = self.apply_from(&update, Some(*coordinator))?;
                    return Ok(Round::Applied {
                        coordinator: *coordinator,
                        version: update.version(),
                        changes,
                    });
                }
                Err(error) => {
                    tracing::debug!(%coordinator, error = %error, "mesh poll failed; next join service");
                    last_error = Some(Box::new(error));
                }
            }
        }
        Err(AgentError::Unreachable {
            tried: coordinators.len(),
            source: last_error.unwrap_or_else(|| "no attempt".into()),
        })
    }
}

/// The wait before the next round: [`POLL_INTERVAL`] moved by up to [`POLL_JITTER`] either
/// way, by `random` (any u64: the caller's random source).
pub fn next_poll_in(random: u64) -> Duration {
    let span = u64::try_from(POLL_JITTER.as_millis() * 2).unwrap_or(u64::MAX);
    let offset = Duration::from_millis(random % (span + 1));
    (POLL_INTERVAL - POLL_JITTER) + offset
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;
    use crate::Registry;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Failure(String);

    /// A tunnel that records what it was told (the logic under test is the agent's).
    #[derive(Default)]
    struct RecordingTunnel {
        peers: RefCell<BTreeMap<PublicKey, Peer>>,
        refuse: RefCell<bool>,
    }

    impl TunnelControl for RecordingTunnel {
        type Error = Failure;
        fn apply(&self, upserts: &[Peer], removed: &[PublicKey]) -> Result<(), Failure> {
            if *self.refuse.borrow() {
                return Err(Failure("tunnel says no".into()));
            }
            let mut peers = self.peers.borrow_mut();
            for key in removed {
                peers.remove(key);
            }
            for peer in upserts {
                peers.insert(peer.public_key, peer.clone());
            }
            Ok(())
        }
        fn stats(&self) -> Result<Vec<PeerStats>, Failure> {
            Ok(vec![])
        }
    }

    /// Join services answering from one shared registry; some of them down.
    struct Registries<'a> {
        registry: &'a RefCell<Registry>,
        down: Vec<Ipv4Addr>,
        asked: Vec<Ipv4Addr>,
    }

    impl PeerSource for Registries<'_> {
        type Error = Failure;
        async fn get_peers(
            &mut self,
            coordinator: Ipv4Addr,
            known: Option<u64>,
            _stats: &[PeerStats],
        ) -> Result<PeerUpdate, Failure> {
            self.asked.push(coordinator);
            if self.down.contains(&coordinator) {
                return Err(Failure(format!("{coordinator} unreachable")));
            }
            Ok(self.registry.borrow().update_since(known))
        }
    }

    fn key(n: u8) -> PublicKey {
        PublicKey::from_slice(&[n; 32]).unwrap()
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        // The agent's futures never wait here: poll them to completion by hand.
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut context) {
                return out;
            }
        }
    }

    /// A registry with two join services (.1 and .2) and node `me` (.3).
    fn mesh() -> (RefCell<Registry>, Agent<RecordingTunnel>) {
        let mut registry = Registry::new("10.99.0.0/24".parse().unwrap()).unwrap();
        let reserved = registry.reserved_address();
        registry
            .admit("js-a", "join-a", key(1), None, true, Some(reserved))
            .unwrap();
        registry
            .admit("js-b", "join-b", key(2), None, true, None)
            .unwrap();
        let me = registry
            .admit("me", "me", key(3), None, false, None)
            .unwrap();
        let view = MeshView::new(key(3), me.peer.vpn_ip, registry.prefix());
        let mut agent = Agent::new(view, RecordingTunnel::default());
        agent.apply(&registry.update_since(None)).unwrap();
        (RefCell::new(registry), agent)
    }

    #[test]
    fn the_first_control_plane_polls_its_own_join_service_and_learns_the_mesh() {
        // node-1 of a cluster made by `hawser init`: its join service registered it (at the
        // reserved address, as the coordinator) and knows of a worker; node-1's tunnel has no
        // peers yet, so no coordinator but itself.
        let mut registry = Registry::new("10.99.0.0/24".parse().unwrap()).unwrap();
        let reserved = registry.reserved_address();
        registry
            .admit("disk-1", "node-1", key(1), None, true, Some(reserved))
            .unwrap();
        registry
            .admit("disk-2", "node-2", key(2), None, false, None)
            .unwrap();
        let registry = RefCell::new(registry);
        let view = MeshView::new(key(1), reserved, registry.borrow().prefix());
        let mut source = Registries {
            registry: &registry,
            down: vec![],
            asked: vec![],
        };
        let mut plain = Agent::new(view.clone(), RecordingTunnel::default());
        assert!(matches!(
            block_on(plain.poll(&mut source)).unwrap(),
            Round::NoCoordinator
        ));
        let mut agent = Agent::new(view, RecordingTunnel::default()).serving_peer_api();
        let round = block_on(agent.poll(&mut source)).unwrap();
        assert!(
            matches!(round, Round::Applied { coordinator, .. } if coordinator == reserved),
            "{round:?}"
        );
        assert_eq!(source.asked, vec![reserved]);
        let peers = agent.tunnel().peers.borrow();
        assert_eq!(peers.len(), 1, "the worker, not node-1 itself");
        assert!(peers.contains_key(&key(2)));
    }

    #[test]
    fn a_node_converges_through_whichever_join_service_answers() {
        let (registry, mut agent) = mesh();
        assert_eq!(agent.tunnel().peers.borrow().len(), 2);
        registry
            .borrow_mut()
            .admit("other", "other", key(4), None, false, None)
            .unwrap();
        let mut source = Registries {
            registry: &registry,
            down: vec!["10.99.0.1".parse().unwrap()],
            asked: vec![],
        };
        let round = block_on(agent.poll(&mut source)).unwrap();
        let Round::Applied {
            coordinator,
            changes,
            ..
        } = round
        else {
            panic!("{round:?}")
        };
        assert_eq!(coordinator, "10.99.0.2".parse::<Ipv4Addr>().unwrap());
        assert_eq!(changes.upserts.len(), 1);
        assert_eq!(agent.tunnel().peers.borrow().len(), 3);
        // The one that answered is asked first next time.
        source.asked.clear();
        block_on(agent.poll(&mut source)).unwrap();
        assert_eq!(source.asked, vec!["10.99.0.2".parse::<Ipv4Addr>().unwrap()]);
    }

    #[test]
    fn while_no_join_service_answers_the_mesh_stays_and_converges_after() {
        let (registry, mut agent) = mesh();
        let before = agent.view().clone();
        registry.borrow_mut().remove("js-b");
        let mut source = Registries {
            registry: &registry,
            down: vec!["10.99.0.1".parse().unwrap(), "10.99.0.2".parse().unwrap()],
            asked: vec![],
        };
        let error = block_on(agent.poll(&mut source)).unwrap_err();
        assert!(error.to_string().contains("2 tried"), "{error}");
        assert_eq!(agent.view(), &before);
        source.down.clear();
        block_on(agent.poll(&mut source)).unwrap();
        assert_eq!(agent.view().coordinators().count(), 1);
        assert!(!agent.tunnel().peers.borrow().contains_key(&key(2)));
    }

    #[test]
    fn a_tunnel_that_refuses_leaves_the_view_as_it_was() {
        let (registry, mut agent) = mesh();
        let before = agent.view().clone();
        registry
            .borrow_mut()
            .admit("other", "other", key(4), None, false, None)
            .unwrap();
        *agent.tunnel().refuse.borrow_mut() = true;
        let mut source = Registries {
            registry: &registry,
            down: vec![],
            asked: vec![],
        };
        let error = block_on(agent.poll(&mut source)).unwrap_err();
        assert!(matches!(error, AgentError::Tunnel { .. }), "{error}");
        assert_eq!(agent.view(), &before);
        *agent.tunnel().refuse.borrow_mut() = false;
        block_on(agent.poll(&mut source)).unwrap();
        assert_eq!(agent.tunnel().peers.borrow().len(), 3);
    }

    #[test]
    fn polls_are_ten_seconds_apart_give_or_take_two() {
        for random in [0, 1, 1999, 2000, 4000, 4001, u64::MAX] {
            let wait = next_poll_in(random);
            assert!(wait >= Duration::from_secs(8) && wait <= Duration::from_secs(12));
        }
        assert_ne!(next_poll_in(0), next_poll_in(1234));
    }
}
