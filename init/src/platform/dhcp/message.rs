//! The pure half of [`super`]: the client's messages, which replies are ours, and what a
//! lease says (address, prefix, routes, MTU), with the routes in the order they can be added.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable as _, Decoder, Encodable as _};

/// A DHCP message no bigger than this fits an Ethernet frame (1500 − IP and UDP headers):
/// told to the server (option 57) so that a long option 121 is not cut.
pub const MAX_MESSAGE_SIZE: u16 = 1472;

/// The options asked for (option 55).
const REQUESTED: [OptionCode; 5] = [
    OptionCode::SubnetMask,
    OptionCode::Router,
    OptionCode::InterfaceMtu,
    OptionCode::AddressLeaseTime,
    OptionCode::ClasslessStaticRoute,
];

/// A route of the lease: `destination/prefix_len` via `gateway`, or on the link (no gateway:
/// option 121's router 0.0.0.0, or a route hawser adds to reach a gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub destination: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
}

impl Route {
    /// Whether `address` is inside `destination/prefix_len`.
    pub fn contains(&self, address: Ipv4Addr) -> bool {
        let mask = prefix_mask(self.prefix_len);
        u32::from(address) & mask == u32::from(self.destination) & mask
    }
}

/// What the server leased (from its DHCPACK).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The address (`yiaddr`).
    pub address: Ipv4Addr,
    /// The prefix length of the subnet mask (option 1; 32 when the server gives none).
    pub prefix_len: u8,
    /// The default gateway: option 121's route to 0.0.0.0/0 when option 121 is given (RFC
    /// 3442: the client then ignores option 3), else option 3's first router.
    pub gateway: Option<Ipv4Addr>,
    /// Option 121's classless static routes as given (a default route among them).
    pub routes: Vec<Route>,
    /// Option 26's interface MTU (68 or more; GCE gives 1460).
    pub mtu: Option<u16>,
    /// The server that leased it (option 54).
    pub server: Ipv4Addr,
    /// Option 51's lease time in seconds (`u32::MAX`: infinite).
    pub lease_seconds: Option<u32>,
}

impl Lease {
    /// The subnet mask of [`Lease::prefix_len`].
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(prefix_mask(self.prefix_len))
    }

    /// The routes to add after the address, in an order the kernel accepts them: on-link
    /// routes first, then routes via gateways. A gateway outside the address's subnet and
    /// outside every on-link route (GCE: a /32 address, gateway `10.x.y.1`) first gets an
    /// on-link host route of its own. Without option 121, the default route via option 3's
    /// router. The subnet route itself is the kernel's, made with the address.
    pub fn routes_to_add(&self) -> Vec<Route> {
        let via: Vec<Route> = if self.routes.is_empty() {
            self.gateway
                .map(|gateway| Route {
                    destination: Ipv4Addr::UNSPECIFIED,
                    prefix_len: 0,
                    gateway: Some(gateway),
                })
                .into_iter()
                .collect()
        } else {
            self.routes
                .iter()
                .filter(|r| r.gateway.is_some())
                .copied()
                .collect()
        };
        let mut on_link: Vec<Route> = self
            .routes
            .iter()
            .filter(|r| r.gateway.is_none())
            .copied()
            .collect();
        let subnet = Route {
            destination: self.address,
            prefix_len: self.prefix_len,
            gateway: None,
        };
        for gateway in via.iter().filter_map(|r| r.gateway) {
            let reachable = subnet.contains(gateway) || on_link.iter().any(|r| r.contains(gateway));
            if !reachable {
                on_link.push(Route {
                    destination: gateway,
                    prefix_len: 32,
                    gateway: None,
                });
            }
        }
        on_link.extend(via);
        on_link
    }
}

/// Why a DHCPACK cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("the DHCPACK leases no usable address ({0})")]
    Address(Ipv4Addr),
    #[error("the DHCPACK's subnet mask {0} is not a prefix")]
    Netmask(Ipv4Addr),
    #[error("the DHCPACK names no server (option 54)")]
    NoServer,
}

/// What came back for our transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A DHCPOFFER: `address` from `server`.
    Offer { address: Ipv4Addr, server: Ipv4Addr },
    /// A DHCPACK with a usable lease.
    Ack(Lease),
    /// A DHCPACK that cannot be used.
    UnusableAck(LeaseError),
    /// A DHCPNAK: start over.
    Nak,
}

fn prefix_mask(prefix_len: u8) -> u32 {
    match prefix_len {
        0 => 0,
        n => u32::MAX << (32 - u32::from(n.min(32))),
    }
}

fn base(xid: u32, mac: [u8; 6], kind: MessageType) -> Message {
    let unspecified = Ipv4Addr::UNSPECIFIED;
    let mut message = Message::new_with_id(
        xid,
        unspecified,
        unspecified,
        unspecified,
        unspecified,
        &mac,
    );
    // Broadcast flag: the client has no address yet, so the server must broadcast its reply.
    message.set_flags(Flags::default().set_broadcast());
    let mut client_id = vec![1u8]; // hardware type Ethernet, then the MAC (RFC 2132 §9.14)
    client_id.extend_from_slice(&mac);
    let options = message.opts_mut();
    options.insert(DhcpOption::MessageType(kind));
    options.insert(DhcpOption::ClientIdentifier(client_id));
    options.insert(DhcpOption::MaxMessageSize(MAX_MESSAGE_SIZE));
    options.insert(DhcpOption::ParameterRequestList(REQUESTED.to_vec()));
    message
}

/// The DHCPDISCOVER of transaction `xid` from the NIC with hardware address `mac`.
pub fn discover(xid: u32, mac: [u8; 6]) -> Vec<u8> {
    encode(&base(xid, mac, MessageType::Discover))
}

/// The DHCPREQUEST (SELECTING state) for `address` offered by `server`.
pub fn request(xid: u32, mac: [u8; 6], address: Ipv4Addr, server: Ipv4Addr) -> Vec<u8> {
    let mut message = base(xid, mac, MessageType::Request);
    let options = message.opts_mut();
    options.insert(DhcpOption::RequestedIpAddress(address));
    options.insert(DhcpOption::ServerIdentifier(server));
    encode(&message)
}

fn encode(message: &Message) -> Vec<u8> {
    // Encoding a message built from these fixed options cannot fail (dhcproto errors only on
    // options longer than it can split); an empty datagram would be ignored by servers.
    let mut bytes = message.to_vec().unwrap_or_default();
    // BOOTP relays and old servers drop messages shorter than 300 bytes (RFC 1542 §2.1).
    if bytes.len() < dhcproto::v4::MIN_PACKET_SIZE {
        bytes.resize(dhcproto::v4::MIN_PACKET_SIZE, 0);
    }
    bytes
}

/// The reply in `datagram` if it answers transaction `xid` of the NIC `mac`; `None` for
/// anything else (another client's reply, a request, garbage).
pub fn classify(datagram: &[u8], xid: u32, mac: [u8; 6]) -> Option<Reply> {
    let message = Message::decode(&mut Decoder::new(datagram)).ok()?;
    if message.opcode() != Opcode::BootReply
        || message.xid() != xid
        || message.chaddr().get(..6) != Some(&mac[..])
    {
        return None;
    }
    let options = message.opts();
    let server = match options.get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(server)) => Some(*server),
        _ => None,
    };
    match options.msg_type()? {
        MessageType::Offer => {
            let address = message.yiaddr();
            (usable(address) && server.is_some()).then_some(Reply::Offer {
                address,
                server: server?,
            })
        }
        MessageType::Ack => Some(match lease(&message, server) {
            Ok(lease) => Reply::Ack(lease),
            Err(error) => Reply::UnusableAck(error),
        }),
        MessageType::Nak => Some(Reply::Nak),
        _ => None,
    }
}

fn usable(address: Ipv4Addr) -> bool {
    !(address.is_unspecified()
        || address.is_broadcast()
        || address.is_multicast()
        || address.is_loopback())
}

fn lease(message: &Message, server: Option<Ipv4Addr>) -> Result<Lease, LeaseError> {
    let address = message.yiaddr();
    if !usable(address) {
        return Err(LeaseError::Address(address));
    }
    let options = message.opts();
    let prefix_len = match options.get(OptionCode::SubnetMask) {
        Some(DhcpOption::SubnetMask(mask)) => {
            let bits = u32::from(*mask);
            let ones = bits.leading_ones();
            if bits.checked_shl(ones).unwrap_or(0) != 0 || ones == 0 {
                return Err(LeaseError::Netmask(*mask));
            }
            ones as u8
        }
        _ => 32,
    };
    let routes: Vec<Route> = match options.get(OptionCode::ClasslessStaticRoute) {
        Some(DhcpOption::ClasslessStaticRoute(routes)) => routes
            .iter()
            .map(|(net, router)| Route {
                destination: net.network(),
                prefix_len: net.prefix_len(),
                gateway: (!router.is_unspecified()).then_some(*router),
            })
            .collect(),
        _ => Vec::new(),
    };
    let gateway = if routes.is_empty() {
        match options.get(OptionCode::Router) {
            Some(DhcpOption::Router(routers)) => {
                routers.first().copied().filter(|r| !r.is_unspecified())
            }
            _ => None,
        }
    } else {
        routes
            .iter()
            .find(|r| r.prefix_len == 0)
            .and_then(|r| r.gateway)
    };
    let mtu = match options.get(OptionCode::InterfaceMtu) {
        Some(DhcpOption::InterfaceMtu(mtu)) if *mtu >= 68 => Some(*mtu),
        _ => None,
    };
    let lease_seconds = match options.get(OptionCode::AddressLeaseTime) {
        Some(DhcpOption::AddressLeaseTime(seconds)) => Some(*seconds),
        _ => None,
    };
    Ok(Lease {
        address,
        prefix_len,
        gateway,
        routes,
        mtu,
        server: server.ok_or(LeaseError::NoServer)?,
        lease_seconds,
    })
}
