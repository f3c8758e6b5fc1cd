//! The join service as a member of the mesh it coordinates: its own boringtun tunnel on its VPN
//! address, kept in step with the registry in the cluster store, and the peer API served on
//! that address, inside the tunnel.
//!
//! A node learns of new members by polling the peer API; the join service reads the registry
//! itself (every [`FOLLOW_INTERVAL`]), applies what changed to its tunnel through the same
//! checked path a node uses ([`hawser_mesh::agent::Agent::apply`]), and records its own
//! tunnel's statistics as its poll, so that `hawser peers` shows the join service's handshakes
//! too.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hawser_mesh::agent::Agent;
use hawser_mesh::{MeshView, PrivateKey};
use hawser_mesh_device::{DeviceError, Tunnel, TunnelConfig};
use tokio::net::TcpListener;

use crate::JoinCore;
use crate::store::{PollStatus, ReadConsistency, StoreError};
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
