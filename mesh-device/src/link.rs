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

/// The offloads asked of the tun device: checksums and TCP segmentation left to the tunnel
/// (`crate::offload`), so the kernel hands over 64 KiB super-packets.
const TUN_OFFLOADS: libc::c_uint =
    libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;

/// Creates the tun device `interface` (layer 3, no packet information, one queue, a
/// `virtio_net_hdr` in front of every packet) and asks for the offloads. Returns its
/// descriptor and whether the kernel took the offloads (without them, packets come one by one
/// with an empty header).
pub fn create_tun(interface: &str) -> io::Result<(OwnedFd, bool)> {
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
    request.ifr_ifru.ifru_flags =
        (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
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
    // SAFETY: TUNSETOFFLOAD takes its flags as the integer argument itself.
    let offloaded = unsafe {
        libc::ioctl(
            tun.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(TUN_OFFLOADS),
        )
    };
    if offloaded < 0 {
        tracing::warn!(
            interface,
            error = %io::Error::last_os_error(),
            "the tun device takes no offloads: packets cross it one by one"
        );
    }
    Ok((tun.into(), offloaded == 0))
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
