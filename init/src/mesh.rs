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
    let path = state_root.join(KEY_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| MeshSetupError::KeyFile {
        path: path.clone(),
        source,
    })?;
    let text = zeroize::Zeroizing::new(text);
    let key = PrivateKey::from_base64(&text)
        .map_err(|source| MeshSetupError::KeyFileContent { path, source })?;
    check_registered(&key, grant)?;
    Ok(key)
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mesh {
    /// The node's VPN address: its Kubernetes node IP.
    pub node_ip: Ipv4Addr,
}

/// Starts the tunnel with the ticket's peers and the task that keeps them current.
pub async fn start(
    grant: MeshGrant,
    key: PrivateKey,
    listen_port: u16,
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
    })
    .await
    .map_err(MeshSetupError::Tunnel)?;
    let view = MeshView::new(public_key, grant.node_ip, grant.prefix);
    let mut agent = Agent::new(view, tunnel);
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
    let source = GrpcPeers::new(grant.api_port);
    tokio::spawn(keep_current(agent, source));
    Ok(Mesh {
        node_ip: grant.node_ip,
    })
}

/// Polls for the rest of the node's life. Logs a change of state (answers again, no answer
/// any more, a refused update) once, not every round.
async fn keep_current(mut agent: Agent<Tunnel>, mut source: GrpcPeers) {
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
mod tests {
    use hawser_proto::mesh::peer_to_wire;

    use super::*;

    fn key(n: u8) -> PrivateKey {
        PrivateKey::from_random([n; 32])
    }

    fn wire_peer(n: u8, ip: &str) -> hawser_proto::vpn::Peer {
        peer_to_wire(&Peer {
            name: format!("node-{n}"),
            public_key: key(n).public_key(),
            vpn_ip: ip.parse().unwrap(),
            endpoint: None,
            coordinator: n == 1,
        })
    }

    fn config() -> VpnConfig {
        VpnConfig {
            node_vpn_ip: "10.99.0.3".into(),
            prefix: "10.99.0.0/16".into(),
            mtu: 1420,
            registry_version: 4,
            peers: vec![wire_peer(1, "10.99.0.1"), wire_peer(2, "10.99.0.3")],
            vpn_api_port: 9091,
            ..Default::default()
        }
    }

    #[test]
    fn a_ticket_without_a_mesh_is_no_mesh() {
        assert_eq!(MeshGrant::from_wire(&VpnConfig::default()).unwrap(), None);
    }

    #[test]
    fn a_ticket_mesh_is_checked_and_finds_the_node_itself() {
        let grant = MeshGrant::from_wire(&config()).unwrap().unwrap();
        assert_eq!(grant.own.public_key, key(2).public_key());
        assert_eq!(grant.mtu, 1420);
        assert_eq!(grant.peers.version(), 4);
        type Change = fn(&mut VpnConfig);
        let cases: Vec<(Change, &str)> = vec![
            (|c| c.node_vpn_ip = "10.99.0.300".into(), "node address"),
            (|c| c.node_vpn_ip = "10.98.0.3".into(), "outside the prefix"),
            (|c| c.prefix = "10.99.0.0".into(), "prefix"),
            (|c| c.mtu = 100, "MTU"),
            (|c| c.vpn_api_port = 70000, "peer API port"),
            (
                |c| {
                    c.peers[0].public_key.pop();
                },
                "malformed",
            ),
            (|c| c.node_vpn_ip = "10.99.0.9".into(), "no member there"),
        ];
        for (change, says) in cases {
            let mut config = config();
            change(&mut config);
            let error = MeshGrant::from_wire(&config).unwrap_err().to_string();
            assert!(error.contains(says), "`{error}` should say `{says}`");
        }
    }

    fn keep(root: &Path, bytes: &[u8]) {
        crate::platform::fs::write_atomically(&root.join(KEY_FILE), bytes, 0o600).unwrap();
    }

    #[test]
    fn the_first_boot_keeps_the_generated_key_and_every_boot_reads_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let grant = MeshGrant::from_wire(&config()).unwrap().unwrap();
        keep(dir.path(), &key_to_keep(&key(2), &grant).unwrap());
        let kept = node_key(dir.path(), &grant).unwrap();
        assert_eq!(kept.public_key(), key(2).public_key());
    }

    #[test]
    fn a_key_the_registry_does_not_hold_is_refused_and_never_kept() {
        let dir = tempfile::tempdir().unwrap();
        let grant = MeshGrant::from_wire(&config()).unwrap().unwrap();
        let error = key_to_keep(&key(7), &grant).unwrap_err();
        assert!(
            matches!(error, MeshSetupError::KeyMismatch { .. }),
            "{error}"
        );
        // No key on the disk (it was lost): the error names the file, never a fresh key.
        let error = node_key(dir.path(), &grant).unwrap_err();
        assert!(error.to_string().contains("wireguard.key"), "{error}");
        keep(dir.path(), key(7).to_base64().as_bytes());
        let error = node_key(dir.path(), &grant).unwrap_err();
        assert!(
            error.to_string().contains("remove it from the mesh"),
            "{error}"
        );
        keep(dir.path(), b"garbage");
        let error = node_key(dir.path(), &grant).unwrap_err();
        assert!(
            matches!(error, MeshSetupError::KeyFileContent { .. }),
            "{error}"
        );
        assert!(!error.to_string().contains("garbage"));
    }
}
