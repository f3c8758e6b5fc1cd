//! The join service's side of the WireGuard mesh, free of gRPC: its settings, what a join or
//! rejoin ticket carries of the mesh ([`VpnTicket`]), the join service's own key and entry in
//! the registry, and why a node's poll of the peer API is refused ([`PeerApiError`]).
//!
//! The registry itself ([`hawser_mesh::Registry`]) lives in the cluster store
//! ([`ClusterStore::update_vpn_registry`]); the decisions (admit a joining node, answer a poll)
//! are [`JoinCore`](crate::JoinCore) methods. The protocol is in `docs/mesh.md`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use hawser_mesh::{Ipv4Net, MeshError, Peer, PrivateKey, PublicKey, Registry};

use crate::store::{ClusterStore, StoreError};

/// How the join service takes part in the mesh. `None` in the core: the mesh is off, and
/// tickets carry no VPN configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshSettings {
    /// The mesh's prefix; nodes get addresses from it.
    pub prefix: Ipv4Net,
    /// The tunnel MTU handed to nodes (0: each node decides).
    pub mtu: u32,
    /// The join service's own entry: its public key, VPN address and underlay endpoint.
    pub coordinator: Peer,
    /// The port of the peer API on the join service's VPN address.
    pub vpn_api_port: u16,
}

/// What a ticket carries of the mesh: the node's place in it and the mesh as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VpnTicket {
    /// The node's own entry (its VPN address).
    pub node: Peer,
    /// The mesh's prefix.
    pub prefix: Ipv4Net,
    /// The tunnel MTU (0: the node decides).
    pub mtu: u32,
    /// The registry version `peers` is at.
    pub registry_version: u64,
    /// Every member at that version, the node itself included.
    pub peers: Vec<Peer>,
    /// The answering join service.
    pub coordinator: Peer,
    /// Where it serves the peer API, on `coordinator.vpn_ip`.
    pub vpn_api_port: u16,
}

impl VpnTicket {
    /// The ticket for member `id` of `registry`; `None` if it is not a member.
    pub fn for_member(settings: &MeshSettings, registry: &Registry, id: &str) -> Option<Self> {
        let node = registry.member(id)?.clone();
        let peers = registry.members().map(|(_, peer)| peer.clone()).collect();
        Some(Self {
            node,
            prefix: registry.prefix(),
            mtu: settings.mtu,
            registry_version: registry.version(),
            peers,
            coordinator: settings.coordinator.clone(),
            vpn_api_port: settings.vpn_api_port,
        })
    }
}

/// The registry ID of the join service called `name`.
pub fn join_service_id(name: &str) -> String {
    format!("join-service/{name}")
}

/// Admits the join service itself into the registry (coordinator), at `fixed_ip` if given (the
/// out-of-cluster join service takes [`Registry::reserved_address`]: pass
/// [`JoinServiceAddress::Reserved`]). Returns its entry; a restart finds it again.
pub fn admit_join_service(
    store: &dyn ClusterStore,
    prefix: Ipv4Net,
    name: &str,
    public_key: PublicKey,
    endpoint: Option<SocketAddr>,
    address: JoinServiceAddress,
) -> Result<Peer, StoreError> {
    let id = join_service_id(name);
    let registry = store.update_vpn_registry(prefix, &mut |registry| {
        let fixed = match address {
            JoinServiceAddress::Reserved if registry.member(&id).is_none() => {
                Some(registry.reserved_address())
            }
            _ => None,
        };
        registry.admit(&id, name, public_key, endpoint, true, fixed)?;
        Ok(())
    })?;
    registry
        .member(&id)
        .cloned()
        .ok_or(StoreError::VpnMemberMissing { id })
}

/// Which address the join service takes in the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinServiceAddress {
    /// The prefix's first host address, kept for the one out-of-cluster join service.
    Reserved,
    /// The lowest free address, like a node (a join service on each control plane).
    Allocated,
}

/// Why the join service's WireGuard key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read, created or written.
    #[error("cannot read or create the WireGuard key file {path}")]
    Io {
        /// The file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is readable by others than its owner.
    #[error(
        "the WireGuard key file {path} has mode {mode:o}; it must be readable by its owner only \
         (chmod 600)"
    )]
    Mode {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The file does not hold a key.
    #[error("the WireGuard key file {path} does not hold a private key (base64 of 32 bytes)")]
    Malformed {
        /// The file.
        path: String,
        #[source]
        source: MeshError,
    },
    /// No random bytes for a new key.
    #[error("cannot generate a WireGuard private key")]
    Random(#[source] hawser_keys::KeyError),
}

/// Reads the join service's WireGuard private key from `path` (mode 0600, base64 as `wg genkey`
/// writes it), or makes a new one there from the kernel's CSPRNG if the file does not exist.
/// The key itself never reaches a log.
pub fn load_or_create_private_key(path: &Path) -> Result<PrivateKey, KeyFileError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let io = |source| KeyFileError::Io {
        path: path.display().to_string(),
        source,
    };
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(KeyFileError::Mode {
                    path: path.display().to_string(),
                    mode,
                });
            }
            let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).map_err(io)?);
            return PrivateKey::from_base64(text.trim()).map_err(|source| {
                KeyFileError::Malformed {
                    path: path.display().to_string(),
                    source,
                }
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let random =
        zeroize::Zeroizing::new(hawser_keys::random_bytes(32).map_err(KeyFileError::Random)?);
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(&random);
    let key = PrivateKey::from_random(bytes);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    let text = key.to_base64();
    file.write_all(text.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    tracing::info!(file = %path.display(), public_key = %key.public_key(), "created a new WireGuard key for the join service");
    Ok(key)
}

/// Why a poll of the peer API was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerApiError {
    /// This join service runs without a mesh.
    #[error("this join service runs without a WireGuard mesh (no --vpn-prefix)")]
    MeshOff,
    /// The poll came from an address that is no member's VPN address.
    #[error("{address} is no member's VPN address: polls are only answered inside the mesh")]
    UnknownSource {
        /// The poll's source address.
        address: std::net::IpAddr,
    },
    /// The registry or the poll could not be read or written.
    #[error("cannot consult the VPN registry")]
    Store(#[from] StoreError),
    /// The member's re-attestation failed: it is evicted and revoked.
    #[error("evicted from the mesh: {reason}")]
    Evicted {
        /// Why.
        reason: String,
    },
}

/// The member's ID and entry polling from `source`, in `registry`.
pub fn poller(registry: &Registry, source: Ipv4Addr) -> Result<(String, Peer), PeerApiError> {
    registry
        .member_by_ip(source)
        .map(|(id, peer)| (id.to_owned(), peer.clone()))
        .ok_or(PeerApiError::UnknownSource {
            address: source.into(),
        })
}

pub use hawser_cluster_store::members::{MemberStatus, Polling, member_statuses};

/// The default of `--vpn-stale-after-secs`: a node that has not polled for this long (three
/// missed polls) is marked as stopped polling.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_file_is_created_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vpn.key");
        let made = load_or_create_private_key(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let read = load_or_create_private_key(&path).unwrap();
        assert_eq!(read.public_key(), made.public_key());
        assert!(!format!("{read:?}").contains(made.to_base64().as_str()));

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create_private_key(&path).unwrap_err();
        assert!(error.to_string().contains("chmod 600"), "{error}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not a key\n").unwrap();
        let error = load_or_create_private_key(&path).unwrap_err();
        assert!(matches!(error, KeyFileError::Malformed { .. }), "{error}");
    }

    #[test]
    fn the_out_of_cluster_join_service_takes_the_reserved_address_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::FileStore::open(&dir.path().join("joined")).unwrap();
        let prefix: Ipv4Net = "10.99.0.0/24".parse().unwrap();
        let key = PublicKey::from_slice(&[3; 32]).unwrap();
        let endpoint = Some("192.0.2.1:51820".parse().unwrap());
        let me = admit_join_service(
            &store,
            prefix,
            "joind",
            key,
            endpoint,
            JoinServiceAddress::Reserved,
        )
        .unwrap();
        assert_eq!(me.vpn_ip, Ipv4Addr::new(10, 99, 0, 1));
        assert!(me.coordinator);
        let again = admit_join_service(
            &store,
            prefix,
            "joind",
            key,
            endpoint,
            JoinServiceAddress::Reserved,
        )
        .unwrap();
        assert_eq!(again, me);
        let registry = store
            .vpn_registry(crate::store::ReadConsistency::Latest)
            .unwrap()
            .unwrap();
        assert_eq!(registry.version(), 1);
        assert_eq!(registry.member("join-service/joind"), Some(&me));
        // A join service on a control plane gets the next free address.
        let other = admit_join_service(
            &store,
            prefix,
            "cp-2",
            PublicKey::from_slice(&[4; 32]).unwrap(),
            None,
            JoinServiceAddress::Allocated,
        )
        .unwrap();
        assert_eq!(other.vpn_ip, Ipv4Addr::new(10, 99, 0, 2));
    }
}
