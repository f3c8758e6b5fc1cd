//! Why the tunnel could not be started, configured or read.

use std::io;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use hawser_mesh::PublicKey;

/// Why a [`Tunnel`](crate::Tunnel) operation failed. A refused peer change (the variants from
/// [`DeviceError::DuplicatePeer`] on) is refused before anything is sent: the tunnel keeps the
/// peers it had.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The interface name is empty, longer than 15 bytes, all digits (boringtun would take it
    /// for a file descriptor), or holds a `/`, whitespace or a NUL.
    #[error(
        "{name:?} cannot name the tunnel interface: give 1 to 15 bytes without '/', whitespace or \
         NUL, not all digits"
    )]
    InterfaceName {
        /// The name given.
        name: String,
    },
    /// The tunnel's address is not a host address of the mesh prefix.
    #[error("the tunnel address {address} is not a host address of the VPN prefix {prefix}")]
    AddressOutsidePrefix {
        /// The address.
        address: Ipv4Addr,
        /// The prefix.
        prefix: Ipv4Net,
    },
    /// The MTU is out of range: the packet loop's slots hold at most 1500, and IPv4 needs at
    /// least 68.
    #[error("tunnel MTU {mtu} is out of range: give 68 to 1500")]
    Mtu {
        /// The MTU given.
        mtu: u32,
    },
    /// Zero worker threads were asked for.
    #[error("the tunnel needs at least one worker thread")]
    NoThreads,
    /// The listen port is taken (by another tunnel, or the kernel's WireGuard).
    #[error("UDP port {port} is taken: the tunnel needs a port of its own")]
    PortInUse {
        /// The port.
        port: u16,
        /// The bind error.
        #[source]
        source: io::Error,
    },
    /// The socket that watches the interface go away at stop could not be made.
    #[error("could not make the socket that watches the tunnel interface")]
    ProbeSocket(#[source] io::Error),
    /// An interface of that name exists already in this network namespace.
    #[error("an interface named {interface} exists already: the tunnel needs a name of its own")]
    InterfaceExists {
        /// The interface.
        interface: String,
    },
    /// The tun device could not be made (no /dev/net/tun, no CAP_NET_ADMIN, or the name is
    /// another kind of interface's).
    #[error("could not create the tun device {interface}")]
    Tun {
        /// The interface.
        interface: String,
        /// The error from /dev/net/tun.
        #[source]
        source: io::Error,
    },
    /// The packet loop could not start on the tun device: its UDP socket or its thread.
    #[error("could not start the tunnel's packet loop on {interface}")]
    Start {
        /// The interface.
        interface: String,
        /// The socket's or thread's error.
        #[source]
        source: io::Error,
    },
    /// The netlink socket could not be opened.
    #[error("could not open a netlink socket to set up {interface}")]
    NetlinkSocket {
        /// The interface.
        interface: String,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The kernel does not list the interface the tunnel created.
    #[error("the kernel lists no interface {interface} after the tunnel created it")]
    LinkMissing {
        /// The interface.
        interface: String,
    },
    /// A netlink request (look-up, address, MTU, link up) was refused.
    #[error("netlink could not {operation} on {interface}")]
    Netlink {
        /// What was asked.
        operation: &'static str,
        /// The interface.
        interface: String,
        /// The netlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// The tunnel's packet loop is gone (stopped).
    #[error("the tunnel is stopped")]
    Stopped,
    /// One key appears twice among the peers given.
    #[error("peer key {key} appears twice in one tunnel change")]
    DuplicatePeer {
        /// The key.
        key: PublicKey,
    },
    /// One key is both added and removed.
    #[error("peer key {key} is both added and removed in one tunnel change")]
    AddedAndRemoved {
        /// The key.
        key: PublicKey,
    },
    /// A peer has this tunnel's own key.
    #[error("peer {name} has this tunnel's own public key {key}")]
    OwnKey {
        /// The peer's name.
        name: String,
        /// The key.
        key: PublicKey,
    },
    /// A peer has this tunnel's own VPN address.
    #[error("peer {name} claims this tunnel's own address {ip}")]
    OwnAddress {
        /// The peer's name.
        name: String,
        /// The address.
        ip: Ipv4Addr,
    },
    /// Two peers with one VPN address (the second would silently take the first's traffic).
    #[error("address clash: {ip} would be both peer {first}'s and peer {second}'s")]
    AddressClash {
        /// The address.
        ip: Ipv4Addr,
        /// The peer that has it (or is given it first).
        first: PublicKey,
        /// The other.
        second: PublicKey,
    },
}
