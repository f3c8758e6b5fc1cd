//! Network bring-up: one static IPv4 address on the first NIC, from the measured command line.
//!
//! The join client needs a route to the join service and nothing more: no DHCP client (its
//! answers are unmeasured and would choose where the node talks to), no DNS. `hawser.net=
//! <address>/<prefix>[,<gateway>]` is part of the measured UKI, so a verifier sees which
//! network a node was told to use. QEMU's user networking gives the guest 10.0.2.15/24 with
//! the gateway at 10.0.2.2.
//!
//! The configuration is done with the classic `SIOCSIF*` / `SIOCADDRT` ioctls on an `AF_INET`
//! datagram socket: a handful of syscalls, no netlink dependency. Parsing is pure and tested on
//! the host; [`bring_up`] needs the VM.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// How long to wait for the NIC to appear (virtio-net probes asynchronously).
pub const NIC_WAIT: Duration = Duration::from_secs(10);

/// `hawser.net`: the node's address, prefix length and optional default gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
}

impl NetConfig {
    /// Parses `<address>/<prefix>[,<gateway>]`.
    pub fn parse(text: &str) -> Option<Self> {
        let (cidr, gateway) = match text.split_once(',') {
            Some((cidr, gateway)) => (cidr, Some(gateway.parse().ok()?)),
            None => (text, None),
        };
        let (address, prefix) = cidr.split_once('/')?;
        let prefix_len: u8 = prefix.parse().ok()?;
        if !(1..=32).contains(&prefix_len) {
            return None;
        }
        Some(NetConfig {
            address: address.parse().ok()?,
            prefix_len,
            gateway,
        })
    }

    /// The netmask of the prefix length.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::MAX << (32 - u32::from(self.prefix_len)))
    }
}

/// Why the network is not up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Fewer network interfaces than needed (besides `lo`) appeared in time (no NIC, or its
    /// driver is missing).
    #[error("network interface {nth} (besides lo) did not appear in /sys/class/net within {} s", .wait.as_secs())]
    NoInterface { wait: Duration, nth: usize },
    /// An interface ioctl (address, netmask, up, route) failed.
    #[error("cannot {what} on network interface {interface}")]
    Ioctl {
        what: &'static str,
        interface: String,
        #[source]
        source: io::Error,
    },
    /// The socket the interface ioctls go through cannot be opened.
    #[error("cannot open a socket to configure the network")]
    Socket(#[source] io::Error),
}

/// The `index`th interface in `/sys/class/net` other than `lo`, by name (0: the first NIC).
pub fn nth_nic(sys_class_net: &Path, index: usize) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(sys_class_net)
        .ok()?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "lo")
        .collect();
    names.sort();
    names.into_iter().nth(index)
}

/// The first interface in `/sys/class/net` other than `lo`, by name.
pub fn first_nic(sys_class_net: &Path) -> Option<String> {
    nth_nic(sys_class_net, 0)
}

/// Brings `lo` and the first NIC up with `config`; returns the NIC's name.
pub async fn bring_up(config: &NetConfig) -> Result<String, NetError> {
    bring_up_nth(0, config).await
}

/// Brings the second NIC up with `config` (fw_cfg `lan_net`: the LAN between the nodes);
/// returns its name.
pub async fn bring_up_lan(config: &NetConfig) -> Result<String, NetError> {
    bring_up_nth(1, config).await
}

async fn bring_up_nth(index: usize, config: &NetConfig) -> Result<String, NetError> {
    let nic = super::poll::wait_until(NIC_WAIT, Duration::from_millis(20), || {
        match nth_nic(Path::new("/sys/class/net"), index) {
            Some(nic) => super::poll::Poll::Ready(nic),
            None => super::poll::Poll::Pending(NetError::NoInterface {
                wait: NIC_WAIT,
                nth: index + 1,
            }),
        }
    })
    .await?;
    let socket = socket()?;
    set_up(&socket, "lo")?;
    set_addr(
        &socket,
        &nic,
        libc::SIOCSIFADDR,
        config.address,
        "set the address",
    )?;
    set_addr(
        &socket,
        &nic,
        libc::SIOCSIFNETMASK,
        config.netmask(),
        "set the netmask",
    )?;
    set_up(&socket, &nic)?;
    if let Some(gateway) = config.gateway {
        add_default_route(&socket, &nic, gateway)?;
    }
    Ok(nic)
}

fn socket() -> Result<OwnedFd, NetError> {
    ioctl_socket().map_err(NetError::Socket)
}

/// The `AF_INET` datagram socket the interface ioctls go through (also the DHCP client's,
/// `dhcp::link`).
pub(super) fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the returned descriptor is checked and owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `ifreq` naming interface `name` (cut to `IFNAMSIZ - 1` bytes), all else zero.
pub(super) fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src as libc::c_char;
    }
    req
}

/// `address` as the `sockaddr` the interface and route ioctls take.
pub(super) fn sockaddr_in(address: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(address).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and sockaddr is plain
    // data; this is how the ioctl ABI expects an AF_INET address.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(
    socket: &OwnedFd,
    request: libc::c_ulong,
    arg: *mut libc::c_void,
    what: &'static str,
    interface: &str,
) -> Result<(), NetError> {
    raw_ioctl(socket, request, arg).map_err(|source| NetError::Ioctl {
        what,
        interface: interface.to_owned(),
        source,
    })
}

/// ioctl(2) `request` on `socket` with `arg`, which must point to a live, initialized struct of
/// the type `request` expects (`ifreq` or `rtentry`), owned by the caller for the call.
pub(super) fn raw_ioctl(
    socket: &OwnedFd,
    request: libc::c_ulong,
    arg: *mut libc::c_void,
) -> io::Result<()> {
    // SAFETY: per this function's contract, `arg` points to a live, properly initialized
    // struct of the type `request` expects, owned by the caller for the duration of the call.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), request, arg) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_addr(
    socket: &OwnedFd,
    name: &str,
    request: libc::c_ulong,
    address: Ipv4Addr,
    what: &'static str,
) -> Result<(), NetError> {
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_addr = sockaddr_in(address);
    ioctl(socket, request, (&raw mut req).cast(), what, name)
}

fn set_up(socket: &OwnedFd, name: &str) -> Result<(), NetError> {
    let mut req = ifreq(name);
    ioctl(
        socket,
        libc::SIOCGIFFLAGS,
        (&raw mut req).cast(),
        "read the flags",
        name,
    )?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(
        socket,
        libc::SIOCSIFFLAGS,
        (&raw mut req).cast(),
        "bring up",
        name,
    )
}

fn add_default_route(socket: &OwnedFd, name: &str, gateway: Ipv4Addr) -> Result<(), NetError> {
    // SAFETY: rtentry is plain old data; all-zero is a valid value.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = sockaddr_in(gateway);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    ioctl(
        socket,
        libc::SIOCADDRT,
        (&raw mut route).cast(),
        "add the default route",
        name,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_address_prefix_and_gateway() {
        let net = NetConfig::parse("10.0.2.15/24,10.0.2.2").unwrap();
        assert_eq!(net.address, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(net.netmask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(net.gateway, Some(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(
            NetConfig::parse("192.168.1.9/32").unwrap().netmask(),
            Ipv4Addr::BROADCAST
        );
        for bad in [
            "10.0.2.15",
            "10.0.2.15/0",
            "10.0.2.15/33",
            "x/24",
            "10.0.2.15/24,gw",
        ] {
            assert_eq!(NetConfig::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_first_nic_skips_lo() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["lo", "eth1", "enp0s2"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        assert_eq!(first_nic(dir.path()).as_deref(), Some("enp0s2"));
        assert_eq!(nth_nic(dir.path(), 1).as_deref(), Some("eth1"));
        assert_eq!(nth_nic(dir.path(), 2), None);
    }
}
