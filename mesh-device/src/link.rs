//! The tunnel interface in the kernel: the tun device itself, its address, MTU and state set
//! over rtnetlink, and a probe that tells whether it still exists.
//!
//! All of it works in the network namespace of the calling thread (the tun device, the netlink
//! socket and the probe's socket belong to it).

use std::ffi::c_char;
use std::fs::OpenOptions;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use futures_util::TryStreamExt as _;
use rtnetlink::LinkUnspec;

use crate::DeviceError;

/// What the interface gets.
#[derive(Debug, Clone, Copy)]
pub struct LinkSettings {
    /// The tunnel's address.
    pub address: Ipv4Addr,
    /// The mesh prefix's length: the kernel then routes the whole mesh into the interface.
    pub prefix_len: u8,
    /// The MTU.
    pub mtu: u32,
    /// A network routed into the interface besides the mesh's prefix (the pods'), with the
    /// tunnel's address as the source of what the node itself sends there.
    pub pod_network: Option<ipnet::Ipv4Net>,
}

/// Gives `interface` its address (with the mesh's prefix length), its MTU, and brings it up.
pub async fn configure(interface: &str, settings: LinkSettings) -> Result<(), DeviceError> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|source| DeviceError::NetlinkSocket {
            interface: interface.to_owned(),
            source,
        })?;
    let connection = tokio::spawn(connection);
    let result = configure_with(&handle, interface, settings).await;
    drop(handle);
    connection.abort();
    result
}

async fn configure_with(
    handle: &rtnetlink::Handle,
    interface: &str,
    settings: LinkSettings,
) -> Result<(), DeviceError> {
    let failed = |operation| {
        move |source| DeviceError::Netlink {
            operation,
            interface: interface.to_owned(),
            source,
        }
    };
    let link = handle
        .link()
        .get()
        .match_name(interface.to_owned())
        .execute()
        .try_next()
        .await
        .map_err(failed("look the interface up"))?
        .ok_or_else(|| DeviceError::LinkMissing {
            interface: interface.to_owned(),
        })?;
    let index = link.header.index;
    handle
        .address()
        .add(index, IpAddr::V4(settings.address), settings.prefix_len)
        .replace()
        .execute()
        .await
        .map_err(failed("add the tunnel address"))?;
    handle
        .link()
        .set(
            LinkUnspec::new_with_index(index)
                .mtu(settings.mtu)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(failed("set the MTU and bring the link up"))?;
    if let Some(network) = settings.pod_network {
        let mut route = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(network.network(), network.prefix_len())
            .output_interface(index)
            .pref_source(settings.address);
        route.get_mut().header.scope = rtnetlink::packet_route::route::RouteScope::Link;
        handle
            .route()
            .add(route.build())
            .replace()
            .execute()
            .await
            .map_err(failed("route the pod network into the tunnel"))?;
    }
    Ok(())
}

/// How many descriptor numbers above the highest open one the tun device's descriptor is moved
/// to (see [`create_tun`]).
const TUN_FD_HEADROOM: i32 = 64;

/// Creates the tun device `interface` (layer 3, no packet information, one queue) and returns
/// its descriptor, moved above every descriptor open now.
///
/// boringtun 0.7 indexes its event table by descriptor number, and when the listen port is set
/// it removes the socket it opened at start by that socket's number, which it never registered
/// (it registered a duplicate): when that number is beyond the table, it panics. The tun
/// device is registered in the same table, so a tun descriptor numbered above the sockets
/// boringtun opens after it keeps that look-up inside the table.
pub fn create_tun(interface: &str) -> io::Result<OwnedFd> {
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let bytes = interface.as_bytes();
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    if bytes.len() >= request.ifr_name.len() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    for (slot, byte) in request.ifr_name.iter_mut().zip(bytes) {
        *slot = *byte as c_char;
    }
    // Without IFF_MULTI_QUEUE a name already in use is refused (EBUSY), not joined.
    request.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads the ifreq (a NUL-terminated name and the flags), which lives
    // across the call, on a descriptor that is open.
    let result = unsafe {
        libc::ioctl(
            tun.as_raw_fd(),
            libc::TUNSETIFF,
            &mut request as *mut libc::ifreq,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    let above = highest_open_fd().saturating_add(TUN_FD_HEADROOM);
    // SAFETY: F_DUPFD_CLOEXEC takes an integer argument and returns a new descriptor (or -1).
    let moved = unsafe { libc::fcntl(tun.as_raw_fd(), libc::F_DUPFD_CLOEXEC, above) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `moved` is a fresh descriptor owned by nobody else; the original closes with
    // `tun` (the device stays: the duplicate holds it).
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// The highest descriptor number open in this process (by /proc/self/fd), 255 if that cannot
/// be read.
fn highest_open_fd() -> i32 {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 255;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .max()
        .unwrap_or(255)
}

/// Tells whether an interface exists in the namespace the probe was made in.
#[derive(Debug)]
pub struct LinkProbe {
    socket: OwnedFd,
}

impl LinkProbe {
    /// A probe for the calling thread's network namespace.
    pub fn new() -> io::Result<Self> {
        // SAFETY: socket() takes no pointers; a non-negative result is a new descriptor that
        // nothing else owns.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else (see above).
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { socket })
    }

    /// Whether `interface` exists; an error other than "no such device" counts as existing,
    /// so a caller waiting for it to go never stops waiting too early.
    pub fn exists(&self, interface: &str) -> bool {
        let bytes = interface.as_bytes();
        // SAFETY: ifreq is plain old data; all zeroes is a valid value.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        if bytes.len() >= request.ifr_name.len() {
            return false;
        }
        for (slot, byte) in request.ifr_name.iter_mut().zip(bytes) {
            *slot = *byte as c_char;
        }
        // SAFETY: SIOCGIFINDEX reads the NUL-terminated name (zeroed beyond it) and writes the
        // index into the ifreq, which lives across the call.
        let result = unsafe {
            libc::ioctl(
                self.socket.as_raw_fd(),
                libc::SIOCGIFINDEX,
                &mut request as *mut libc::ifreq,
            )
        };
        result == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENODEV)
    }
}
