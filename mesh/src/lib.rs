//! The WireGuard mesh of a hawser cluster, as plain Rust: no gRPC and no I/O here (the gRPC
//! services are thin adapters in `hawser-joind` and PID 1, the tunnel is `hawser-mesh-device`).
//!
//! - [`key`]: WireGuard keys; a node's private key never leaves the node.
//! - [`registry`]: what the join service keeps: every node's VPN address (allocated from the
//!   mesh's prefix, stable across rejoins of one disk), public key and underlay endpoint, under a
//!   version that grows with every change, so that a node asking "what changed since version N"
//!   gets a delta, or the whole peer set when N is too old or unknown.
//! - [`update`]: what a node does with an answer: checks it whole (addresses inside the prefix,
//!   no clash, no silent key change, a delta only on the version it was made from) and only then
//!   changes its view, returning the peers to add, change and remove on the tunnel.
//! - [`pods`]: the cluster's pod network and each node's /24 of it, routed over the mesh.
//! - [`agent`]: a node's polling loop after the join, generic over where updates come from and
//!   what carries the traffic (the boringtun tunnel of `hawser-mesh-device`).
//!
//! The design and the protocol are in `docs/mesh.md`.

pub mod agent;
pub mod key;
pub mod pods;
pub mod registry;
pub mod update;

use std::net::{Ipv4Addr, SocketAddr};

pub use ipnet::Ipv4Net;
pub use key::{PrivateKey, PublicKey};
pub use registry::{Admitted, PeerUpdate, Registry};
pub use update::{Changes, MeshView};

/// WireGuard's overhead on an IPv4 underlay is 60 bytes, 80 on IPv6: the tunnel's MTU is the
/// underlay's minus 80, which fits either.
pub const ENCAPSULATION_OVERHEAD: u32 = 80;

/// The UDP port hawser's tunnels listen on unless configured otherwise (WireGuard's usual).
pub const DEFAULT_LISTEN_PORT: u16 = 51820;

/// The tunnel's MTU for an underlay MTU.
pub fn tunnel_mtu(underlay_mtu: u32) -> u32 {
    underlay_mtu.saturating_sub(ENCAPSULATION_OVERHEAD)
}

/// A member of the mesh, as the registry lists it and nodes configure it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Peer {
    /// The Kubernetes node name (or the join service's name), for people.
    pub name: String,
    /// Its WireGuard public key.
    pub public_key: PublicKey,
    /// Its address inside the mesh; the only address the tunnel accepts from it (`/32`).
    pub vpn_ip: Ipv4Addr,
    /// Where its tunnel listens on the underlay network, if known; a peer without one is
    /// reached once it has sent a packet (WireGuard roams to the last source address).
    pub endpoint: Option<SocketAddr>,
    /// Whether it serves the mesh's peer API (a join service): nodes poll these.
    #[serde(default)]
    pub coordinator: bool,
}

/// What a tunnel knows of one peer (boringtun's UAPI `get`), reported in every poll.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerStats {
    /// The peer.
    pub public_key: PublicKey,
    /// Where its packets last came from.
    pub endpoint: Option<SocketAddr>,
    /// When the last handshake completed, seconds since the Unix epoch; `None` if never.
    pub last_handshake_unix: Option<u64>,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
}

/// Why a mesh operation was refused. Every refusal leaves the registry or the node's view as
/// it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// A public key is not 32 bytes.
    #[error("a WireGuard public key is 32 bytes, this one is {length}")]
    KeyLength {
        /// The length given.
        length: usize,
    },
    /// A public key's text is not base64 (or hex) of 32 bytes.
    #[error("`{text}` is not a WireGuard public key (base64 of 32 bytes)")]
    KeyText {
        /// The text given.
        text: String,
    },
    /// A private key's text is not base64 of 32 bytes (its text is not repeated).
    #[error("the WireGuard private key is not base64 of 32 bytes")]
    PrivateKeyText,
    /// The mesh prefix cannot hold nodes.
    #[error("the VPN prefix {prefix} is too small: give an IPv4 prefix of /8 to /30")]
    PrefixSize {
        /// The prefix.
        prefix: Ipv4Net,
    },
    /// A cluster's mesh wider than [`pods::WIDEST_CLUSTER_PREFIX`]: two nodes would get the same
    /// pod range.
    #[error(
        "a cluster's mesh is at most a /{widest}: each node's pods get 10.244.<last octet of its \
         address>.0/24, so in the /{len} of {prefix} two nodes would get the same pod range",
        widest = pods::WIDEST_CLUSTER_PREFIX,
        len = prefix.prefix_len()
    )]
    ClusterPrefixTooWide {
        /// The prefix.
        prefix: Ipv4Net,
    },
    /// Every address of the prefix is taken.
    #[error("no free address left in the VPN prefix {prefix} ({nodes} nodes)")]
    PrefixFull {
        /// The prefix.
        prefix: Ipv4Net,
        /// How many members the registry holds.
        nodes: usize,
    },
    /// A known node came back with another public key.
    #[error(
        "node {node} joined the mesh with key {known} and now presents {presented}: a key change \
         is refused (remove the node from the mesh first if it was re-installed)"
    )]
    KeyChanged {
        /// The node.
        node: String,
        /// The key the mesh knows.
        known: PublicKey,
        /// The key presented.
        presented: PublicKey,
    },
    /// A public key is already another member's.
    #[error("key {key} is already node {owner}'s: one key per member")]
    KeyInUse {
        /// The key.
        key: PublicKey,
        /// Its member.
        owner: String,
    },
    /// An address outside the prefix, or its network or broadcast address.
    #[error("peer {peer} has address {ip}, which is not a host address of the VPN prefix {prefix}")]
    AddressOutside {
        /// The peer's name.
        peer: String,
        /// The address.
        ip: Ipv4Addr,
        /// The prefix.
        prefix: Ipv4Net,
    },
    /// Two members with one address.
    #[error("address clash: {ip} is both {first}'s and {second}'s")]
    AddressClash {
        /// The address.
        ip: Ipv4Addr,
        /// One member.
        first: String,
        /// The other.
        second: String,
    },
    /// A delta made from a version the node does not hold.
    #[error(
        "a peer update from version {base} to {version} was refused: this node is at version \
         {current} (it asks for the whole peer set next)"
    )]
    UnknownBase {
        /// The version the delta was made from.
        base: u64,
        /// The version it leads to.
        version: u64,
        /// The node's version.
        current: u64,
    },
    /// An update older than the node's view (a join service reading a stale copy).
    #[error(
        "a peer update at version {version} was refused: this node already has version {current} \
         (the answering join service reads an older copy of the registry)"
    )]
    VersionWentBack {
        /// The update's version.
        version: u64,
        /// The node's version.
        current: u64,
    },
    /// An answer claiming "no change" at a version the node does not hold.
    #[error("the join service says version {version} is current, but this node holds {current}")]
    UnknownVersion {
        /// The version named.
        version: u64,
        /// The node's version.
        current: u64,
    },
    /// One key twice in one update.
    #[error("peer key {key} appears twice in one update")]
    DuplicateKey {
        /// The key.
        key: PublicKey,
    },
    /// A peer update names this node's own address with another key.
    #[error("peer {peer} claims this node's own address {ip}")]
    OwnAddress {
        /// The peer's name.
        peer: String,
        /// The address.
        ip: Ipv4Addr,
    },
}
