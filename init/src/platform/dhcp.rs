//! A DHCPv4 client for the first NIC, for clouds: they hand the node its address by DHCP.
//!
//! Under QEMU hawser takes a static address from the measured `hawser.net=` ([`super::net`]);
//! on a cloud the address, the routes and the MTU come from the cloud's DHCP server. Its
//! answers are as unmeasured as the metadata service's: they choose where the node's packets
//! go, never what the node trusts (the join service is still authenticated by attestation).
//!
//! One exchange (RFC 2131 §3.1): DHCPDISCOVER, the first usable DHCPOFFER, DHCPREQUEST for
//! it, DHCPACK; a DHCPNAK or an unusable DHCPACK starts over with a new transaction ID.
//! Messages (built and read with `dhcproto`) carry the broadcast flag, since the client has no
//! address to receive unicast on, and go out from a UDP socket bound to `0.0.0.0:68` with
//! `SO_BROADCAST` and `SO_BINDTODEVICE` (nix), to `255.255.255.255:67`. Unanswered messages
//! are sent again after 1, 2, 4, 4, … s until the caller's deadline; after
//! [`REQUESTS_PER_OFFER`] unanswered DHCPREQUESTs the client discovers again.
//!
//! The lease is applied with the interface ioctls [`super::net`] uses: the MTU (option 26;
//! GCE gives 1460), the address and netmask (option 1; GCE gives a /32), then the routes in
//! an order the kernel accepts ([`Lease::routes_to_add`]): option 121's classless static
//! routes when given (RFC 3442: option 3 is then ignored; a router of 0.0.0.0 means on the
//! link, as GCE uses for its gateway's /32), else a default route via option 3's router, and
//! an on-link host route to any gateway outside the subnet. DNS servers, domain names and
//! NTP are not read: PID 1 resolves no names.
//!
//! Not done: renewing the lease (T1/T2). [`Lease::lease_seconds`] says how long it is valid;
//! clouds keep giving the same address to the same VM, so an expired, unrenewed lease keeps
//! working there, but a renewing caller is the proper fix.

mod link;
mod message;

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};

pub use link::LinkError;
pub use message::{Lease, LeaseError, MAX_MESSAGE_SIZE, Reply, Route, classify, discover, request};

use self::link::Link;

/// The first retransmission wait; it doubles up to [`MAX_RETRANSMIT`].
pub const FIRST_RETRANSMIT: Duration = Duration::from_secs(1);
/// The longest retransmission wait.
pub const MAX_RETRANSMIT: Duration = Duration::from_secs(4);
/// Unanswered DHCPREQUESTs for one offer before discovering again.
pub const REQUESTS_PER_OFFER: u32 = 3;
/// The client's port.
pub const CLIENT_PORT: u16 = 68;
/// The server's port.
pub const SERVER_PORT: u16 = 67;

/// The configured NIC and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    /// The interface name, e.g. `ens4`.
    pub interface: String,
    /// What the DHCP server leased (and what was applied).
    pub lease: Lease,
}

/// Why the NIC has no DHCP address.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    /// No NIC besides `lo` appeared in time (no NIC, or its driver is not loaded).
    #[error(
        "no network interface besides lo appeared in /sys/class/net within {} s (is the NIC's \
         driver loaded?)",
        .wait.as_secs()
    )]
    NoInterface { wait: Duration },
    /// The NIC's hardware address could not be read.
    #[error("cannot read the hardware address of {nic} from {}", .path.display())]
    HardwareAddress {
        nic: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An interface ioctl failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The client socket could not be set up.
    #[error("cannot {what} for the DHCP client on {nic}")]
    Socket {
        nic: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A message could not be sent or a reply not received.
    #[error("DHCP on {nic}: cannot {what}")]
    Io {
        nic: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// No lease within the deadline.
    #[error(
        "no DHCP lease on {nic} within {} s ({progress}); check that the network has a DHCP \
         server, or give the node a static address with hawser.net=",
        .deadline.as_secs()
    )]
    NoLease {
        nic: String,
        deadline: Duration,
        progress: String,
    },
}

/// Waits for the first NIC (besides `lo`), brings `lo` and it up, leases an address by DHCP
/// and applies it; all within `deadline`.
pub async fn dhcp_configure(deadline: Duration) -> Result<Configured, DhcpError> {
    let started = tokio::time::Instant::now();
    let wait = deadline.min(super::net::NIC_WAIT);
    let nic =
        super::poll::wait_until(
            wait,
            Duration::from_millis(20),
            || match super::net::first_nic(Path::new("/sys/class/net")) {
                Some(nic) => super::poll::Poll::Ready(nic),
                None => super::poll::Poll::Pending(DhcpError::NoInterface { wait }),
            },
        )
        .await?;
    dhcp_configure_nic(&nic, deadline.saturating_sub(started.elapsed())).await
}

/// [`dhcp_configure`] on the NIC named `nic`.
pub async fn dhcp_configure_nic(nic: &str, deadline: Duration) -> Result<Configured, DhcpError> {
    let address_path = Path::new("/sys/class/net").join(nic).join("address");
    let mac = std::fs::read_to_string(&address_path)
        .and_then(|text| {
            parse_mac(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, text))
        })
        .map_err(|source| DhcpError::HardwareAddress {
            nic: nic.to_owned(),
            path: address_path,
            source,
        })?;
    Link::open("lo")?.up()?;
    let link = Link::open(nic)?;
    link.up()?;
    let socket = client_socket(nic)?;
    let lease = exchange(&socket, nic, mac, deadline).await?;
    if let Some(mtu) = lease.mtu {
        link.set_mtu(mtu)?;
    }
    link.set_address(lease.address, lease.netmask())?;
    for route in lease.routes_to_add() {
        link.add_route(&route)?;
    }
    tracing::info!(
        interface = nic,
        address = %lease.address,
        prefix_len = lease.prefix_len,
        gateway = ?lease.gateway,
        routes = lease.routes.len(),
        mtu = ?lease.mtu,
        server = %lease.server,
        lease_seconds = ?lease.lease_seconds,
        "DHCP lease applied"
    );
    Ok(Configured {
        interface: nic.to_owned(),
        lease,
    })
}

/// `52:54:00:12:34:56` (sysfs' `address`, a trailing newline allowed) → the six bytes.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim_ascii().split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn client_socket(nic: &str) -> Result<tokio::net::UdpSocket, DhcpError> {
    let error = |what| {
        move |source| DhcpError::Socket {
            nic: nic.to_owned(),
            what,
            source,
        }
    };
    let socket = std::net::UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, CLIENT_PORT))
        .map_err(error("bind UDP 0.0.0.0:68"))?;
    setsockopt(&socket, sockopt::Broadcast, &true)
        .map_err(|e| error("set SO_BROADCAST")(e.into()))?;
    setsockopt(&socket, sockopt::BindToDevice, &nic.into())
        .map_err(|e| error("set SO_BINDTODEVICE")(e.into()))?;
    socket
        .set_nonblocking(true)
        .map_err(error("make the socket non-blocking"))?;
    tokio::net::UdpSocket::from_std(socket).map_err(error("register the socket with tokio"))
}

fn new_xid() -> Result<u32, io::Error> {
    let mut bytes = [0u8; 4];
    super::random::fill(&mut bytes)?;
    Ok(u32::from_ne_bytes(bytes))
}

/// Where the exchange is, for the error at the deadline.
enum Stage {
    Discovering,
    Requesting {
        address: Ipv4Addr,
        server: Ipv4Addr,
        sent: u32,
    },
}

async fn exchange(
    socket: &tokio::net::UdpSocket,
    nic: &str,
    mac: [u8; 6],
    deadline: Duration,
) -> Result<Lease, DhcpError> {
    let io_error = |what| {
        move |source| DhcpError::Io {
            nic: nic.to_owned(),
            what,
            source,
        }
    };
    let give_up_at = tokio::time::Instant::now() + deadline;
    let broadcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, SERVER_PORT);
    let mut xid = new_xid().map_err(io_error("draw a transaction ID"))?;
    let mut stage = Stage::Discovering;
    let mut wait = FIRST_RETRANSMIT;
    let mut progress = "no DHCPOFFER".to_owned();
    let mut buffer = vec![0u8; 2048];
    'send: loop {
        let now = tokio::time::Instant::now();
        if now >= give_up_at {
            return Err(DhcpError::NoLease {
                nic: nic.to_owned(),
                deadline,
                progress,
            });
        }
        let packet = match &mut stage {
            Stage::Discovering => discover(xid, mac),
            Stage::Requesting {
                address,
                server,
                sent,
            } => {
                *sent += 1;
                request(xid, mac, *address, *server)
            }
        };
        socket
            .send_to(&packet, broadcast)
            .await
            .map_err(io_error("send to 255.255.255.255:67"))?;
        let round_end = (now + wait).min(give_up_at);
        loop {
            let received = tokio::time::timeout_at(round_end, socket.recv_from(&mut buffer)).await;
            let Ok(received) = received else {
                break; // nothing in time: send again
            };
            let (len, _) = received.map_err(io_error("receive on UDP port 68"))?;
            match (classify(&buffer[..len], xid, mac), &stage) {
                (Some(Reply::Offer { address, server }), Stage::Discovering) => {
                    tracing::debug!(interface = nic, %address, %server, "DHCPOFFER");
                    progress = format!("offered {address} by {server}, no DHCPACK");
                    stage = Stage::Requesting {
                        address,
                        server,
                        sent: 0,
                    };
                    wait = FIRST_RETRANSMIT;
                    continue 'send;
                }
                (Some(Reply::Ack(lease)), Stage::Requesting { .. }) => return Ok(lease),
                (Some(Reply::UnusableAck(error)), Stage::Requesting { server, .. }) => {
                    tracing::warn!(interface = nic, %server, %error, "unusable DHCPACK; discovering again");
                    progress = format!("unusable DHCPACK from {server}: {error}");
                }
                (Some(Reply::Nak), Stage::Requesting { server, .. }) => {
                    tracing::warn!(interface = nic, %server, "DHCPNAK; discovering again");
                    progress = format!("DHCPNAK from {server}");
                }
                _ => continue, // not for this transaction or this stage
            }
            xid = new_xid().map_err(io_error("draw a transaction ID"))?;
            stage = Stage::Discovering;
            wait = FIRST_RETRANSMIT;
            continue 'send;
        }
        wait = (wait * 2).min(MAX_RETRANSMIT);
        if let Stage::Requesting { sent, .. } = stage
            && sent >= REQUESTS_PER_OFFER
        {
            xid = new_xid().map_err(io_error("draw a transaction ID"))?;
            stage = Stage::Discovering;
        }
    }
}

#[cfg(test)]
mod tests;
