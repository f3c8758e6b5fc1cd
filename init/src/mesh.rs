//! The node's place in the cluster's WireGuard mesh (boot step 6, after the state disk and
//! before the pivot).
//!
//! ```text
//! before the join   a fresh WireGuard key (kernel CSPRNG); its public half goes in the join
//!                   request, the private half never leaves this process and the state disk
//! the ticket        VpnConfig: the node's VPN address, the prefix, the MTU, the mesh's peers
//!                   (checked here: `MeshGrant::from_wire`)
//! the first boot   the generated key, checked against the ticket's (the registry's) and kept
//!                   on the new state disk before it is marked initialized (`kube::grants`)
//! after the disk    the key read back from the state disk, every boot; it must be the key the
//!                   registry holds for this node
//! the tunnel        boringtun on `hawser0` (its own thread), address/MTU/route by netlink,
//!                   the ticket's peers; then a task that polls the join services inside the
//!                   mesh every ~10 s and applies checked updates (`hawser_mesh::agent`)
//! kubeadm           the VPN address is the node IP (node-ip, advertiseAddress)
//! ```
//!
//! The cluster's first node is made by `hawser init`, not by a ticket: the admin's request
//! carries the mesh prefix, and the node takes the prefix's first host address
//! ([`MeshGrant::first_node`]) before `kubeadm init`, so its node IP, the API server's and
//! etcd's advertised addresses are in the mesh from the start. Its join service registers it
//! (the disk's UUID, as a coordinator) once etcd runs, and hands joining nodes addresses of the
//! same prefix.
//!
//! Every node keeps its place ([`SETTINGS_FILE`]: prefix, address, MTU, peer-API port) beside
//! its key, and the peers its tunnel last had ([`PEERS_FILE`]): a boot that is given no ticket
//! (a control plane recovered by the admin, after a whole-cluster restart) takes the same place
//! again with those peers — the control planes' etcd members reach each other through them,
//! before any join service can read the registry — and polls for the rest. A
//! control plane polls its own join service first: it shares the node's tunnel
//! ([`hawser_mesh::agent::Agent::serving_peer_api`]).
//!
//! The tunnel also carries the pods' traffic: the pod network is routed into it and each
//! peer's pod range is accepted from and sent to that peer ([`hawser_mesh::pods`]).
//!
//! A node whose ticket carries no mesh (the join service runs none) runs without one, as
//! before. Everything here that can fail names the reason; nothing logs the private key.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use hawser_mesh::agent::{Agent, AgentError, Round, next_poll_in};
use hawser_mesh::{Ipv4Net, MeshView, Peer, PeerUpdate, PrivateKey, PublicKey};
use hawser_mesh_device::{DeviceError, Tunnel, TunnelConfig};
use hawser_proto::join::VpnConfig;
use hawser_proto::mesh::{GrpcPeers, WireError, peer_from_wire};
use tracing::{info, warn};

use crate::platform::{error_chain, random};

/// The tunnel's interface.
pub const INTERFACE: &str = "hawser0";
/// The node's WireGuard private key, relative to the state disk's root, base64, 0600. Not under
/// the disk's `var/` (the rootfs's `/var`): only PID 1 reads it, before the pivot.
pub const KEY_FILE: &str = "lib/hawser/mesh/wireguard.key";
/// The node's place in the mesh (prefix, address, MTU, peer-API port), relative to the state
/// disk's root, JSON: kept with the key, read back by a boot that gets no ticket.
pub const SETTINGS_FILE: &str = "lib/hawser/mesh/mesh.json";
/// The port of the peer API a control plane's join service serves on its VPN address.
pub const PEER_API_PORT: u16 = 9091;
/// The peers the node's tunnel last had and their registry version, relative to the state
/// disk's root, JSON: written whenever they change, read back by a boot that gets no ticket.
/// After a whole-cluster restart the control planes' etcd members reach each other only
/// through the mesh, and no join service can read the registry before they do: the tunnels
/// start from these peers.
pub const PEERS_FILE: &str = "lib/hawser/mesh/peers.json";
/// boringtun's worker threads: one (PID 1 runs on two vCPUs at most in tests, and the tunnel
/// carries the control plane's traffic, not bulk data; see docs/mesh.md for the measurement).
pub const THREADS: usize = 1;

/// Why the node cannot take its place in the mesh.
#[derive(Debug, thiserror::Error)]
pub enum MeshSetupError {
    /// The kernel's CSPRNG gave no bytes for the key.
    #[error("cannot make the node's WireGuard key (getrandom)")]
    Random(#[source] std::io::Error),
    /// A field of the ticket's VpnConfig is malformed.
    #[error("the join ticket's mesh configuration has a malformed {field}: `{value}`")]
    Grant {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A peer of the ticket is malformed.
    #[error("the join ticket's mesh peers are malformed")]
    Peers(#[source] WireError),
    /// The ticket's peer set does not list the node itself.
    #[error(
        "the join ticket gives this node the VPN address {ip}, but its peer set has no member there"
    )]
    NotListed {
        /// The node's address.
        ip: Ipv4Addr,
    },
    /// The key file on the state disk cannot be read or written.
    #[error("cannot read or write the node's WireGuard key {path}")]
    KeyFile {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The key file holds no key.
    #[error("{path} does not hold a WireGuard private key")]
    KeyFileContent {
        /// The file.
        path: PathBuf,
        #[source]
        source: hawser_mesh::MeshError,
    },
    /// The key this node has is not the one the mesh registry holds for it.
    #[error(
        "the mesh registry holds key {registry} for this node, but its key is {node}: the node \
         cannot take its place in the mesh (remove it from the mesh, or restore its state disk)"
    )]
    KeyMismatch {
        /// The node's public key.
        node: PublicKey,
        /// The registry's.
        registry: PublicKey,
    },
    /// The kept settings cannot be read or do not parse.
    #[error("{path} does not hold the node's place in the mesh")]
    SettingsFile {
        /// The file.
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The tunnel cannot start.
    #[error("cannot start the WireGuard tunnel")]
    Tunnel(#[source] DeviceError),
    /// The ticket's peer set was refused by the tunnel or the checks.
    #[error("cannot apply the join ticket's peers")]
    ApplyPeers(#[source] AgentError),
}

/// A fresh WireGuard key from the kernel's CSPRNG.
pub fn generate_key() -> Result<PrivateKey, MeshSetupError> {
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    random::fill(bytes.as_mut()).map_err(MeshSetupError::Random)?;
    Ok(PrivateKey::from_random(*bytes))
}

/// The mesh as the join ticket gave it, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshGrant {
    /// The node's VPN address.
    pub node_ip: Ipv4Addr,
    /// The mesh prefix.
    pub prefix: Ipv4Net,
    /// The tunnel's MTU.
    pub mtu: u32,
    /// The node's own entry.
    pub own: Peer,
    /// The peer set (a whole set, at the registry's version).
    pub peers: PeerUpdate,
    /// The port of the join services' peer API inside the mesh.
    pub api_port: u16,
}

impl MeshGrant {
    /// Checks a ticket's VpnConfig; `None` if it carries no mesh (empty address).
    pub fn from_wire(vpn: &VpnConfig) -> Result<Option<Self>, MeshSetupError> {
        if vpn.node_vpn_ip.is_empty() {
            return Ok(None);
        }
        let field = |field: &'static str, value: &str| MeshSetupError::Grant {
            field,
            value: value.to_owned(),
        };
        let node_ip: Ipv4Addr = vpn
            .node_vpn_ip
            .parse()
            .map_err(|_| field("node address", &vpn.node_vpn_ip))?;
        let prefix: Ipv4Net = vpn
            .prefix
            .parse()
            .map_err(|_| field("prefix", &vpn.prefix))?;
        if !hawser_mesh::registry::is_host_address(prefix, node_ip) {
            return Err(field("node address (outside the prefix)", &vpn.node_vpn_ip));
        }
        let mtu = match vpn.mtu {
            0 => hawser_mesh::tunnel_mtu(1500),
            mtu if (1280..=9000).contains(&mtu) => mtu,
            mtu => return Err(field("MTU (1280 to 9000)", &mtu.to_string())),
        };
        let api_port = u16::try_from(vpn.vpn_api_port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| field("peer API port", &vpn.vpn_api_port.to_string()))?;
        let peers = vpn
            .peers
            .iter()
            .map(peer_from_wire)
            .collect::<Result<Vec<_>, _>>()
            .map_err(MeshSetupError::Peers)?;
        let own = peers
            .iter()
            .find(|p| p.vpn_ip == node_ip)
            .cloned()
            .ok_or(MeshSetupError::NotListed { ip: node_ip })?;
        Ok(Some(Self {
            node_ip,
            prefix,
            mtu,
            own,
            peers: PeerUpdate::Full {
                version: vpn.registry_version,
                peers,
            },
            api_port,
        }))
    }
}

/// The node's place in the mesh as [`SETTINGS_FILE`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeptSettings {
    /// The node's name in the mesh.
    pub name: String,
    /// The mesh prefix.
    pub prefix: Ipv4Net,
    /// The node's VPN address.
    pub address: Ipv4Addr,
    /// The tunnel's MTU.
    pub mtu: u32,
    /// The peer API's port on the join services' VPN addresses.
    pub peer_api_port: u16,
}

impl MeshGrant {
    /// The cluster's first node, made by `hawser init` with a mesh `prefix`: the prefix's first
    /// host address (which a join service never hands to a node), this node's key, its
    /// underlay `endpoint`; no peers yet. Its join service registers it once etcd runs.
    pub fn first_node(
        prefix: Ipv4Net,
        name: &str,
        public_key: PublicKey,
        endpoint: Option<std::net::SocketAddr>,
    ) -> Result<Self, MeshSetupError> {
        let registry = hawser_mesh::Registry::new(prefix).map_err(|_| MeshSetupError::Grant {
            field: "prefix",
            value: prefix.to_string(),
        })?;
        Ok(Self::alone(
            KeptSettings {
                name: name.to_owned(),
                prefix,
                address: registry.reserved_address(),
                mtu: hawser_mesh::tunnel_mtu(1500),
                peer_api_port: PEER_API_PORT,
            },
            public_key,
            endpoint,
        ))
    }

    /// The node at its kept place, with no peer known yet (they come from the first poll).
    fn alone(
        kept: KeptSettings,
        public_key: PublicKey,
        endpoint: Option<std::net::SocketAddr>,
    ) -> Self {
        let own = Peer {
            name: kept.name,
            public_key,
            vpn_ip: kept.address,
            endpoint,
            coordinator: false,
        };
        Self {
            node_ip: kept.address,
            prefix: kept.prefix,
            mtu: kept.mtu,
            peers: PeerUpdate::Full {
                version: 0,
                peers: vec![own.clone()],
            },
            own,
            api_port: kept.peer_api_port,
        }
    }

    /// What [`SETTINGS_FILE`] keeps of this grant.
    pub fn settings(&self) -> KeptSettings {
        KeptSettings {
            name: self.own.name.clone(),
            prefix: self.prefix,
            address: self.node_ip,
            mtu: self.mtu,
            peer_api_port: self.api_port,
        }
    }
}

/// The place in the mesh kept on the state disk mounted at `state_root`, for a boot that got
/// no ticket (`None` when the node keeps none: it was never in a mesh). The key is read and
/// checked as always ([`node_key`]); the peers come from the first poll.
pub fn kept_grant(state_root: &Path) -> Result<Option<MeshGrant>, MeshSetupError> {
    let path = state_root.join(SETTINGS_FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(MeshSetupError::KeyFile { path, source }),
    };
    let kept: KeptSettings = serde_json::from_slice(&text)
        .map_err(|source| MeshSetupError::SettingsFile { path, source })?;
    let key = read_key(state_root)?;
    let mut grant = MeshGrant::alone(kept, key.public_key(), None);
    match read_peers(state_root) {
        Ok(Some(known)) => {
            let mut peers = known.peers;
            peers.retain(|p| p.public_key != grant.own.public_key);
            peers.push(grant.own.clone());
            grant.peers = PeerUpdate::Full {
                version: known.version,
                peers,
            };
        }
        Ok(None) => {}
        // Only a head start: the node learns its peers from the first poll without them.
        Err(e) => warn!(
            "{}; the tunnel starts without its last peers",
            error_chain(&e)
        ),
    }
    Ok(Some(grant))
}

/// What [`PEERS_FILE`] keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct KnownPeers {
    version: u64,
    peers: Vec<Peer>,
}

fn read_peers(state_root: &Path) -> Result<Option<KnownPeers>, MeshSetupError> {
    let path = state_root.join(PEERS_FILE);
    match std::fs::read(&path) {
        Ok(text) => serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| MeshSetupError::SettingsFile { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MeshSetupError::KeyFile { path, source }),
    }
}

/// Keeps the view's peers under `state_root` ([`PEERS_FILE`]); a failure is logged, once a
/// boot, and costs only the head start of a later boot without a ticket.
fn keep_peers(state_root: &Path, view: &MeshView, warned: &mut bool) {
    let Some(version) = view.version() else {
        return;
    };
    let known = KnownPeers {
        version,
        peers: view.peers().cloned().collect(),
    };
    let path = state_root.join(PEERS_FILE);
    let result = serde_json::to_vec_pretty(&known)
        .map_err(std::io::Error::other)
        .and_then(|bytes| crate::platform::fs::write_atomically(&path, &bytes, 0o600));
    if let Err(e) = result
        && !*warned
    {
        warn!("cannot keep the mesh's peers in {}: {e}", path.display());
        *warned = true;
    }
}

/// The file a first boot keeps on its new state disk ([`KEY_FILE`]): `generated`, whose public
/// half went in the join request, once it is the key the ticket (the registry) holds for this
/// node. A ticket for another key is refused here, before the disk is marked initialized: the
/// boot fails, the disk is formatted again and the node joins again.
pub fn key_to_keep(
    generated: &PrivateKey,
    grant: &MeshGrant,
) -> Result<zeroize::Zeroizing<Vec<u8>>, MeshSetupError> {
    check_registered(generated, grant)?;
    Ok(zeroize::Zeroizing::new(
        generated.to_base64().as_bytes().to_vec(),
    ))
}

/// The key the node uses in the mesh: the one on its state disk (mounted at `state_root`),
/// kept there by the boot that formatted it ([`key_to_keep`]); it must be the key the
/// registry holds for this node.
pub fn node_key(state_root: &Path, grant: &MeshGrant) -> Result<PrivateKey, MeshSetupError> {
    let key = read_key(state_root)?;
    check_registered(&key, grant)?;
    Ok(key)
}

fn read_key(state_root: &Path) -> Result<PrivateKey, MeshSetupError> {
    let path = state_root.join(KEY_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| MeshSetupError::KeyFile {
        path: path.clone(),
        source,
    })?;
    let text = zeroize::Zeroizing::new(text);
    PrivateKey::from_base64(&text).map_err(|source| MeshSetupError::KeyFileContent { path, source })
}

fn check_registered(key: &PrivateKey, grant: &MeshGrant) -> Result<(), MeshSetupError> {
    if key.public_key() != grant.own.public_key {
        return Err(MeshSetupError::KeyMismatch {
            node: key.public_key(),
            registry: grant.own.public_key,
        });
    }
    Ok(())
}

/// The running mesh: what the node needs of it after the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mesh {
    /// The node's VPN address: its Kubernetes node IP.
    pub node_ip: Ipv4Addr,
    /// The mesh prefix.
    pub prefix: Ipv4Net,
    /// The tunnel's MTU (the pods' interfaces get it too).
    pub mtu: u32,
    /// The node's public key.
    pub public_key: PublicKey,
    /// The node's name in the mesh.
    pub name: String,
    /// The peer API's port (a control plane's join service serves it on [`Mesh::node_ip`]).
    pub api_port: u16,
    /// The UDP port the tunnel listens on.
    pub listen_port: u16,
}

/// Starts the tunnel with the ticket's peers and the task that keeps them current (and, under
/// `state_root`, the last peers: [`PEERS_FILE`]). A node that `serves_peer_api` (a control
/// plane: its join service shares this tunnel) polls itself first.
pub async fn start(
    grant: MeshGrant,
    key: PrivateKey,
    listen_port: u16,
    serves_peer_api: bool,
    state_root: PathBuf,
    tpm: Option<std::sync::Arc<hawser_attestation::tpm::Tpm>>,
) -> Result<Mesh, MeshSetupError> {
    let public_key = key.public_key();
    let tunnel = Tunnel::start(TunnelConfig {
        interface: INTERFACE.to_owned(),
        private_key: key,
        listen_port,
        address: grant.node_ip,
        prefix: grant.prefix,
        mtu: grant.mtu,
        threads: THREADS,
        pod_routes: true,
    })
    .await
    .map_err(MeshSetupError::Tunnel)?;
    let view = MeshView::new(public_key, grant.node_ip, grant.prefix);
    let mut agent = Agent::new(view, tunnel);
    if serves_peer_api {
        agent = agent.serving_peer_api();
    }
    let changes = agent
        .apply(&grant.peers)
        .map_err(MeshSetupError::ApplyPeers)?;
    info!(
        "mesh up: {} is {}/{} on {INTERFACE} (MTU {}, key {public_key}), {} peers at registry \
         version {}",
        grant.own.name,
        grant.node_ip,
        grant.prefix.prefix_len(),
        grant.mtu,
        changes.upserts.len(),
        grant.peers.version()
    );
    let mut warned = false;
    keep_peers(&state_root, agent.view(), &mut warned);
    let mut source = GrpcPeers::new(grant.api_port);
    if let Some(tpm) = tpm {
        source = source.with_attester(attester(tpm));
    }
    tokio::spawn(keep_current(agent, source, state_root, warned));
    Ok(Mesh {
        node_ip: grant.node_ip,
        prefix: grant.prefix,
        mtu: grant.mtu,
        public_key,
        name: grant.own.name,
        api_port: grant.api_port,
        listen_port,
    })
}

/// Answers the join services' re-attestation nonces (docs/lifecycle.md): a quote of the PCRs
/// with the provider-certified AK, made on first use (not in the boot's path).
fn attester(tpm: std::sync::Arc<hawser_attestation::tpm::Tpm>) -> hawser_proto::mesh::Attester {
    use hawser_attestation::evidence::{Binding, EvidenceIssuer as _, Role};
    use prost::Message as _;
    let issuer: std::sync::OnceLock<Option<hawser_attestation::TpmIssuer>> =
        std::sync::OnceLock::new();
    std::sync::Arc::new(move |nonce: [u8; 32]| {
        let issuer = issuer.get_or_init(|| {
            crate::attest::issuer(std::sync::Arc::clone(&tpm))
                .inspect_err(|e| {
                    warn!(
                        "mesh: cannot re-attest, no platform-certified AK: {}",
                        error_chain(e)
                    )
                })
                .ok()
        });
        let Some(issuer) = issuer else {
            return Err("no platform-certified AK".to_owned());
        };
        let binding = Binding {
            role: Role::Client,
            nonce: &nonce,
            tls_spki_der: &[],
        };
        issuer
            .issue(&binding, hawser_proto::mesh::REATTEST_USER_DATA)
            .map(|evidence| evidence.encode_to_vec())
            .map_err(|e| {
                warn!("mesh: cannot quote for re-attestation: {}", error_chain(&e));
                error_chain(&e)
            })
    })
}

/// Polls for the rest of the node's life. Logs a change of state (answers again, no answer
/// any more, a refused update) once, not every round.
async fn keep_current(
    mut agent: Agent<Tunnel>,
    mut source: GrpcPeers,
    state_root: PathBuf,
    mut warned: bool,
) {
    let mut failing = false;
    loop {
        let mut jitter = [0u8; 8];
        let _ = random::fill(&mut jitter);
        tokio::time::sleep(next_poll_in(u64::from_le_bytes(jitter))).await;
        match agent.poll(&mut source).await {
            Ok(Round::Applied {
                coordinator,
                version,
                changes,
            }) => {
                if failing {
                    info!("mesh: the join service at {coordinator} answers again");
                    failing = false;
                }
                if !changes.is_empty() {
                    info!(
                        "mesh: registry version {version} from {coordinator}: {} peers added or \
                         changed, {} removed",
                        changes.upserts.len(),
                        changes.removed.len()
                    );
                    keep_peers(&state_root, agent.view(), &mut warned);
                }
            }
            Ok(Round::NoCoordinator) => {
                if !failing {
                    warn!("mesh: no join service in the mesh to poll; the peers stay as they are");
                    failing = true;
                }
            }
            Err(e) => {
                if !failing {
                    warn!("mesh: {}; the peers stay as they are", error_chain(&e));
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
