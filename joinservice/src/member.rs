//! The join service as a member of the mesh it coordinates: its own boringtun tunnel on its VPN
//! address, kept in step with the registry in the cluster store, and the peer API served on
//! that address, inside the tunnel.
//!
//! A node learns of new members by polling the peer API; the join service reads the registry
//! itself (every [`FOLLOW_INTERVAL`]), applies what changed to its tunnel through the same
//! checked path a node uses ([`hawser_mesh::agent::Agent::apply`]), and records its own
//! tunnel's statistics as its poll, so that `hawser peers` shows the join service's handshakes
//! too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hawser_mesh::agent::Agent;
use hawser_mesh::{MeshView, PrivateKey};
use hawser_mesh_device::{DeviceError, Tunnel, TunnelConfig};
use tokio::net::TcpListener;

use crate::JoinCore;
use crate::store::{ClusterStore, PollStatus, ReadConsistency, StoreError};
use crate::vpn::{self, JoinServiceAddress, KeyFileError, MeshSettings};

/// How often the join service reads the registry for its own tunnel.
pub const FOLLOW_INTERVAL: Duration = Duration::from_secs(2);

/// Why the join service cannot take its place in the mesh.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The join service's WireGuard key file cannot be used.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// The join service cannot be admitted into the registry.
    #[error("cannot admit this join service ({id}) into the WireGuard mesh")]
    Admit {
        /// Its member ID.
        id: String,
        #[source]
        source: StoreError,
    },
    /// The tunnel cannot start.
    #[error("cannot start the join service's WireGuard tunnel")]
    Tunnel(#[source] DeviceError),
    /// The peer API cannot listen on the join service's VPN address.
    #[error("cannot listen for the mesh's peer API on {address}")]
    Listen {
        /// The address.
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Where the tunnel runs.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The tunnel's interface name.
    pub interface: String,
    /// The UDP port the tunnel listens on.
    pub listen_port: u16,
    /// The join service's ID in the registry (`join-service/<name>`).
    pub member_id: String,
}

/// The join service's place in the mesh, as `hawser-joind`'s `--vpn-*` flags give it.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// The mesh prefix.
    pub prefix: hawser_mesh::Ipv4Net,
    /// Where nodes reach this join service's tunnel.
    pub endpoint: std::net::SocketAddr,
    /// The tunnel MTU handed to nodes (0: each node decides).
    pub mtu: u32,
    /// The peer API's port on the join service's VPN address.
    pub api_port: u16,
    /// The join service's WireGuard key (created if missing).
    pub key_file: std::path::PathBuf,
    /// Its name in the mesh (its ID is `join-service/<name>`).
    pub name: String,
    /// Which address it takes.
    pub address: JoinServiceAddress,
    /// Its tunnel's interface.
    pub interface: String,
    /// Its tunnel's UDP port.
    pub listen_port: u16,
}

/// What [`admit`] decided, for [`start`].
pub struct Membership {
    /// The mesh settings the core hands to nodes.
    pub settings: MeshSettings,
    key: PrivateKey,
    config: MemberConfig,
}

/// Admits the join service into the registry (blocking: the store) and returns the core with
/// the mesh on and the membership to [`start`].
pub fn admit(core: JoinCore, options: &MeshOptions) -> Result<(JoinCore, Membership), MemberError> {
    let key = vpn::load_or_create_private_key(&options.key_file)?;
    let id = vpn::join_service_id(&options.name);
    let coordinator = vpn::admit_join_service(
        core.store().as_ref(),
        options.prefix,
        &options.name,
        key.public_key(),
        Some(options.endpoint),
        options.address,
    )
    .map_err(|source| MemberError::Admit {
        id: id.clone(),
        source,
    })?;
    tracing::info!(
        prefix = %options.prefix,
        vpn_ip = %coordinator.vpn_ip,
        endpoint = %options.endpoint,
        public_key = %coordinator.public_key,
        mtu = options.mtu,
        vpn_api_port = options.api_port,
        "WireGuard mesh on: this join service is a member"
    );
    let settings = MeshSettings {
        prefix: options.prefix,
        mtu: options.mtu,
        coordinator,
        vpn_api_port: options.api_port,
    };
    let membership = Membership {
        settings: settings.clone(),
        key,
        config: MemberConfig {
            interface: options.interface.clone(),
            listen_port: options.listen_port,
            member_id: id,
        },
    };
    Ok((core.with_mesh(settings), membership))
}

/// Starts the join service's tunnel and peer API; both run until `shutdown` resolves (the
/// tunnel is removed then).
pub async fn start(
    core: Arc<JoinCore>,
    membership: Membership,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), MemberError> {
    let Membership {
        settings,
        key,
        config,
    } = membership;
    let settings = &settings;
    let own = &settings.coordinator;
    let tunnel = Tunnel::start(TunnelConfig {
        interface: config.interface.clone(),
        private_key: key,
        listen_port: config.listen_port,
        address: own.vpn_ip,
        prefix: settings.prefix,
        mtu: match settings.mtu {
            0 => hawser_mesh::tunnel_mtu(1500),
            mtu => mtu,
        },
        threads: 1,
        pod_routes: false,
    })
    .await
    .map_err(MemberError::Tunnel)?;
    let address = std::net::SocketAddr::from((own.vpn_ip, settings.vpn_api_port));
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| MemberError::Listen { address, source })?;
    let agent = Agent::new(
        MeshView::new(own.public_key, own.vpn_ip, settings.prefix),
        tunnel,
    );
    tracing::info!(
        interface = %config.interface,
        %address,
        "the join service's tunnel is up; the peer API listens inside it"
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn({
        let core = Arc::clone(&core);
        let mut stopped = stopped.clone();
        async move {
            let until = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = crate::vpnapi::serve_vpn_api(core, listener, until).await {
                tracing::error!(error = %e, "the mesh's peer API stopped");
            }
        }
    });
    tokio::spawn(follow(core, agent, config.member_id, stopped));
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    Ok(())
}

/// Keeps the tunnel's peers those of the registry until told to stop; then the tunnel goes.
async fn follow(
    core: Arc<JoinCore>,
    mut agent: Agent<Tunnel>,
    member_id: String,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        match step(&core, &mut agent, &member_id).await {
            Ok(()) if failing => {
                tracing::info!("the join service's tunnel follows the registry again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                let reason = hawser_attestation::error_chain(&e);
                tracing::warn!(%reason, "the join service's tunnel keeps its peers as they are");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_INTERVAL) => {}
            _ = stopped.wait_for(|s| *s) => break,
        }
    }
    drop(agent);
    tracing::info!("the join service's tunnel is down");
}

/// Why one round of the join service's tunnel failed; the next round tries again.
#[derive(Debug, thiserror::Error)]
enum StepError {
    /// A blocking task of the round panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// The store cannot be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The registry's update does not apply to the tunnel's view.
    #[error(transparent)]
    Agent(#[from] hawser_mesh::agent::AgentError),
    /// The tunnel's statistics cannot be read.
    #[error(transparent)]
    Tunnel(#[from] DeviceError),
}

/// One round: the registry's changes onto the tunnel, the tunnel's statistics into the store.
async fn step(
    core: &Arc<JoinCore>,
    agent: &mut Agent<Tunnel>,
    member_id: &str,
) -> Result<(), StepError> {
    let store = Arc::clone(core.store());
    let registry =
        tokio::task::spawn_blocking(move || store.vpn_registry(ReadConsistency::LatestOrLocal))
            .await??;
    let Some(registry) = registry else {
        return Ok(());
    };
    let update = registry.update_since(agent.view().version());
    let changes = agent.apply(&update)?;
    if !changes.is_empty() {
        tracing::info!(
            version = update.version(),
            added_or_changed = changes.upserts.len(),
            removed = changes.removed.len(),
            "the join service's tunnel follows the registry"
        );
    }
    let stats = agent.tunnel().stats()?;
    let status = PollStatus {
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        known_version: agent.view().version(),
        stats,
    };
    let store = Arc::clone(core.store());
    let id = member_id.to_owned();
    tokio::task::spawn_blocking(move || store.record_vpn_poll(&id, &status)).await??;
    Ok(())
}

/// The join service on a node whose PID 1 runs the node's tunnel (a control plane of a cluster
/// hawser formed): the service is that node's member of the mesh — the node's disk in the
/// registry, as a coordinator — serves the peer API on the node's VPN address, and starts no
/// tunnel of its own. The node's PID 1 polls it like any other join service, so the node's
/// tunnel follows the registry through it.
#[derive(Debug, Clone)]
pub struct NodeMember {
    /// The mesh prefix.
    pub prefix: hawser_mesh::Ipv4Net,
    /// The node's entry: its name, public key, VPN address and underlay endpoint.
    pub node: hawser_mesh::Peer,
    /// The node's member ID: its state disk's UUID (as a join registers a node).
    pub member_id: String,
    /// The tunnel MTU handed to nodes.
    pub mtu: u32,
    /// The peer API's port on the node's VPN address.
    pub api_port: u16,
}

impl NodeMember {
    /// The mesh settings the core hands to joining nodes: this node as the coordinator.
    pub fn settings(&self) -> MeshSettings {
        MeshSettings {
            prefix: self.prefix,
            mtu: self.mtu,
            coordinator: hawser_mesh::Peer {
                coordinator: true,
                ..self.node.clone()
            },
            vpn_api_port: self.api_port,
        }
    }

    /// Records the node in the registry as the coordinator it is: a node the cluster formed
    /// (the first control plane, at the address `hawser init` gave it) is admitted at its
    /// address; a control plane that joined keeps its entry, now marked as serving the peer
    /// API. Blocking (the store). Refused when the registry holds another address or key for
    /// the disk: the node's tunnel and the registry would disagree.
    pub fn register(&self, store: &dyn ClusterStore) -> Result<hawser_mesh::Peer, StoreError> {
        let node = &self.node;
        let registry = store.update_vpn_registry(self.prefix, &mut |registry| {
            // Checked before anything is written: a known disk keeps its address.
            if let Some(known) = registry.member(&self.member_id)
                && known.vpn_ip != node.vpn_ip
            {
                return Err(hawser_mesh::MeshError::AddressClash {
                    ip: node.vpn_ip,
                    first: format!(
                        "{} (the registry's {} for this disk)",
                        self.member_id, known.vpn_ip
                    ),
                    second: node.name.clone(),
                });
            }
            registry.admit(
                &self.member_id,
                &node.name,
                node.public_key,
                node.endpoint,
                true,
                Some(node.vpn_ip),
            )?;
            Ok(())
        })?;
        registry
            .member(&self.member_id)
            .cloned()
            .ok_or_else(|| StoreError::VpnMemberMissing {
                id: self.member_id.clone(),
            })
    }
}

/// How often [`serve_on_node`] tries again to record the node in the registry while the store
/// is unavailable (a whole-cluster restart, before etcd has quorum).
pub const REGISTER_RETRY: Duration = Duration::from_secs(5);

/// Serves the peer API on the node's VPN address, and records the node in the registry (at
/// once when the store answers, else in the background until it does); both until `shutdown`.
pub async fn serve_on_node(
    core: Arc<JoinCore>,
    member: NodeMember,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), MemberError> {
    let address = std::net::SocketAddr::from((member.node.vpn_ip, member.api_port));
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| MemberError::Listen { address, source })?;
    tracing::info!(
        %address,
        prefix = %member.prefix,
        public_key = %member.node.public_key,
        "WireGuard mesh on: this join service serves the peer API inside the node's tunnel"
    );
    tokio::spawn({
        let core = Arc::clone(&core);
        let member = member.clone();
        async move {
            let mut failing = false;
            loop {
                let (core_now, member_now) = (Arc::clone(&core), member.clone());
                let result = tokio::task::spawn_blocking(move || {
                    member_now.register(core_now.store().as_ref())
                })
                .await;
                match result {
                    Ok(Ok(entry)) => {
                        tracing::info!(
                            member = %member.member_id,
                            vpn_ip = %entry.vpn_ip,
                            endpoint = ?entry.endpoint,
                            "this node is in the mesh's registry as a coordinator"
                        );
                        break;
                    }
                    Ok(Err(e)) if e.is_unavailable() => {
                        if !failing {
                            tracing::warn!(
                                "cannot record this node in the mesh's registry yet ({}); \
                                 trying again every {}s",
                                hawser_attestation::error_chain(&e),
                                REGISTER_RETRY.as_secs()
                            );
                            failing = true;
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::error!(
                            "this node cannot take its place in the mesh's registry: {}",
                            hawser_attestation::error_chain(&e)
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::error!("the mesh registration task failed: {e}");
                        break;
                    }
                }
                tokio::time::sleep(REGISTER_RETRY).await;
            }
        }
    });
    tokio::spawn(async move {
        if let Err(e) = crate::vpnapi::serve_vpn_api(core, listener, shutdown).await {
            tracing::error!(error = %e, "the mesh's peer API stopped");
        }
    });
    Ok(())
}

/// Logs each node that stops polling the peer API (and comes back), checking every half
/// `stale_after`: the heartbeat the registry keeps, turned into one log line per change.
pub async fn watch_polls(core: Arc<JoinCore>, stale_after: Duration) {
    let mut known: BTreeMap<String, vpn::Polling> = BTreeMap::new();
    let mut tick = tokio::time::interval((stale_after / 2).max(Duration::from_secs(1)));
    loop {
        tick.tick().await;
        let store = Arc::clone(core.store());
        let read = tokio::task::spawn_blocking(move || {
            let registry = store.vpn_registry(ReadConsistency::Latest)?;
            let polls = store.vpn_polls()?;
            Ok::<_, StoreError>((registry, polls))
        })
        .await;
        let (registry, polls) = match read {
            Ok(Ok((Some(registry), polls))) => (registry, polls),
            Ok(Ok((None, _))) => continue,
            Ok(Err(e)) => {
                tracing::debug!(
                    "cannot read the mesh's polls: {}",
                    hawser_attestation::error_chain(&e)
                );
                continue;
            }
            Err(e) => {
                tracing::debug!("the poll watcher's read failed: {e}");
                continue;
            }
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let statuses = vpn::member_statuses(&registry, &polls, now, stale_after);
        let mut current = BTreeMap::new();
        for status in statuses {
            let before = known.get(&status.id).copied();
            match (before, status.polling) {
                (Some(vpn::Polling::Polling), vpn::Polling::Stopped) => tracing::warn!(
                    node = %status.peer.name,
                    disk_uuid = %status.id,
                    vpn_ip = %status.peer.vpn_ip,
                    last_poll_unix = status.last_poll.as_ref().map(|p| p.unix_time),
                    "node stopped polling the mesh's peer API"
                ),
                (Some(vpn::Polling::Stopped | vpn::Polling::Never), vpn::Polling::Polling) => {
                    tracing::info!(
                        node = %status.peer.name,
                        vpn_ip = %status.peer.vpn_ip,
                        "node polls the mesh's peer API"
                    );
                }
                _ => {}
            }
            current.insert(status.id, status.polling);
        }
        known = current;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_mesh::{Peer, PublicKey};

    fn key(n: u8) -> PublicKey {
        PublicKey::from_slice(&[n; 32]).unwrap()
    }

    fn node(n: u8, ip: &str, disk: &str) -> NodeMember {
        NodeMember {
            prefix: "10.99.0.0/24".parse().unwrap(),
            node: Peer {
                name: format!("node-{n}"),
                public_key: key(n),
                vpn_ip: ip.parse().unwrap(),
                endpoint: Some(format!("192.168.76.{}:51820", 9 + n).parse().unwrap()),
                coordinator: true,
            },
            member_id: disk.to_owned(),
            mtu: 1420,
            api_port: 9091,
        }
    }

    #[test]
    fn the_nodes_join_services_register_their_nodes_as_coordinators() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::FileStore::open(&dir.path().join("joined")).unwrap();
        // The first node (hawser init): the reserved address, its own disk as the member.
        let first = node(1, "10.99.0.1", "disk-1");
        let entry = first.register(&store).unwrap();
        assert_eq!(entry, first.settings().coordinator);
        assert_eq!(first.register(&store).unwrap(), entry, "again: no change");
        // A control plane that joined: its entry (address allocated) becomes a coordinator.
        let registry = store
            .update_vpn_registry(first.prefix, &mut |r| {
                r.admit("disk-2", "node-2", key(2), None, false, None)?;
                Ok(())
            })
            .unwrap();
        let joined = registry.member("disk-2").unwrap().clone();
        assert_eq!(joined.vpn_ip.to_string(), "10.99.0.2");
        assert!(!joined.coordinator);
        let second = node(2, "10.99.0.2", "disk-2");
        let entry = second.register(&store).unwrap();
        assert!(entry.coordinator);
        assert_eq!(entry.endpoint, second.node.endpoint);
        // A node whose tunnel has another address than the registry holds for its disk.
        let wrong = node(2, "10.99.0.7", "disk-2");
        let error = hawser_attestation::error_chain(&wrong.register(&store).unwrap_err());
        assert!(error.contains("10.99.0.2"), "{error}");
        // Another disk with a member's key.
        let error = hawser_attestation::error_chain(
            &node(1, "10.99.0.9", "disk-9").register(&store).unwrap_err(),
        );
        assert!(error.contains("disk-1"), "{error}");
    }
}
