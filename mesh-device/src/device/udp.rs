//! The loop's UDP socket: binding, socket options, addresses, and the send queue that leaves
//! in `sendmmsg` batches with UDP GSO.

use super::*;

pub(super) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take integer arguments.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

pub(super) fn set_int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from `value`, which lives across the
    // call.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            socklen::<libc::c_int>(),
        )
    })
    .map(drop)
}

pub(super) fn socklen<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(libc::socklen_t::MAX)
}

/// A UDP socket on `port` for IPv4 and IPv6 (IPv4 only where the kernel has no IPv6):
/// non-blocking, with large buffers. Returns it and whether it is an IPv6 socket.
pub(super) fn bind_udp(port: u16) -> io::Result<(OwnedFd, bool)> {
    let flags = libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: socket takes no pointers.
    let (fd, v6) = match cvt(unsafe { libc::socket(libc::AF_INET6, flags, 0) }) {
        Ok(fd) => (fd, true),
        // SAFETY: as above.
        Err(_) => (
            cvt(unsafe { libc::socket(libc::AF_INET, flags, 0) })?,
            false,
        ),
    };
    // SAFETY: a fresh descriptor owned by nobody else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = socket.as_raw_fd();
    if v6 {
        set_int_option(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    }
    for option in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // Capped by the kernel's limits; a refusal leaves the defaults, which work.
        let _ = set_int_option(raw, libc::SOL_SOCKET, option, SOCKET_BUFFER);
    }
    let address = if v6 {
        SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0))
    } else {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
    };
    let (storage, length) = to_sockaddr(address, v6);
    // SAFETY: bind reads `length` bytes of `storage`, a valid sockaddr of that length.
    cvt(unsafe { libc::bind(raw, (&raw const storage).cast(), length) })?;
    Ok((socket, v6))
}

pub(super) fn local_port(fd: RawFd) -> io::Result<u16> {
    // SAFETY: all zeroes is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut length = socklen::<libc::sockaddr_storage>();
    // SAFETY: getsockname writes at most `length` bytes into `storage`, both live across it.
    cvt(unsafe { libc::getsockname(fd, (&raw mut storage).cast(), &raw mut length) })?;
    from_sockaddr(&storage)
        .map(|address| address.port())
        .ok_or_else(|| io::Error::other("the socket has no IP address"))
}

/// `address` as a sockaddr for a socket of the family `v6` says (IPv4 as mapped IPv6 there).
pub(super) fn to_sockaddr(
    address: SocketAddr,
    v6: bool,
) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all zeroes is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let (ip, port) = match address {
        SocketAddr::V4(a) if !v6 => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
            return (storage, socklen::<libc::sockaddr_in>());
        }
        SocketAddr::V4(a) => (a.ip().to_ipv6_mapped(), a.port()),
        SocketAddr::V6(a) => (*a.ip(), a.port()),
    };
    let sin6 = libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: port.to_be(),
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr {
            s6_addr: ip.octets(),
        },
        sin6_scope_id: 0,
    };
    // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
    unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
    (storage, socklen::<libc::sockaddr_in6>())
}

pub(super) fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; storage is larger and
            // aligned for it.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read((&raw const *storage).cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6 (as above).
            let sin6: libc::sockaddr_in6 = unsafe { std::ptr::read((&raw const *storage).cast()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, sin6.sin6_scope_id)),
            })
        }
        _ => None,
    }
}

/// Encrypted datagrams waiting for one `sendmmsg`.
pub(super) struct SendQueue {
    /// Whether to hand runs of datagrams to the kernel as one (UDP GSO); off for good once the
    /// kernel refuses.
    pub(super) gso: bool,
    pub(super) buffer: Vec<u8>,
    /// Length and destination of each.
    pub(super) packets: Vec<(usize, SocketAddr)>,
}

impl SendQueue {
    pub(super) fn new() -> Self {
        Self {
            gso: true,
            buffer: vec![0; SEND_BATCH * SLOT],
            packets: Vec::with_capacity(SEND_BATCH),
        }
    }

    /// The next free slot (the queue flushed first when full).
    pub(super) fn slot(&mut self, udp: RawFd, v6: bool) -> &mut [u8] {
        if self.packets.len() >= SEND_BATCH {
            self.flush(udp, v6);
        }
        let at = self.packets.len() * SLOT;
        &mut self.buffer[at..at + SLOT]
    }

    /// Queues what was written into the slot [`SendQueue::slot`] gave.
    pub(super) fn commit(&mut self, length: usize, to: SocketAddr) {
        self.packets.push((length.min(SLOT), to));
    }

    pub(super) fn flush(&mut self, udp: RawFd, v6: bool) {
        let count = self.packets.len();
        if count == 0 {
            return;
        }
        // Runs of datagrams to one destination, all of one size but a shorter last one: one
        // message each, cut by the kernel (UDP GSO) where it takes UDP_SEGMENT.
        let mut runs: Vec<(usize, usize)> = Vec::with_capacity(count);
        let mut start = 0;
        while start < count {
            let (size, to) = self.packets[start];
            let mut end = start + 1;
            let mut total = size;
            if self.gso {
                while end < count
                    && end - start < GSO_MAX_SEGMENTS
                    && self.packets[end].1 == to
                    && self.packets[end].0 <= size
                    && total + self.packets[end].0 <= GSO_MAX_BYTES
                {
                    total += self.packets[end].0;
                    end += 1;
                    if self.packets[end - 1].0 < size {
                        break;
                    }
                }
            }
            runs.push((start, end));
            start = end;
        }
        let mut addresses: Vec<(libc::sockaddr_storage, libc::socklen_t)> = runs
            .iter()
            .map(|(start, _)| to_sockaddr(self.packets[*start].1, v6))
            .collect();
        let base = self.buffer.as_mut_ptr();
        let mut iovecs: Vec<libc::iovec> = self
            .packets
            .iter()
            .enumerate()
            .map(|(i, (length, _))| libc::iovec {
                // SAFETY: i < SEND_BATCH: the offset lies inside `buffer`.
                iov_base: unsafe { base.add(i * SLOT) }.cast(),
                iov_len: *length,
            })
            .collect();
        // One control message per run: UDP_SEGMENT and the segment size.
        let mut controls: Vec<[u64; 4]> = vec![[0; 4]; runs.len()];
        let iov_base = iovecs.as_mut_ptr();
        let mut messages: Vec<libc::mmsghdr> = runs
            .iter()
            .zip(addresses.iter_mut())
            .zip(controls.iter_mut())
            .map(|((&(start, end), (address, length)), control)| {
                // SAFETY: all zeroes is a valid msghdr.
                let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
                header.msg_name = (&raw mut *address).cast();
                header.msg_namelen = *length;
                // SAFETY: start < count = iovecs.len().
                header.msg_iov = unsafe { iov_base.add(start) };
                header.msg_iovlen = end - start;
                if end - start > 1 {
                    let size = u16::try_from(self.packets[start].0).unwrap_or(u16::MAX);
                    set_segment_size(&mut header, control, size);
                }
                libc::mmsghdr {
                    msg_hdr: header,
                    msg_len: 0,
                }
            })
            .collect();
        let mut sent = 0;
        while sent < messages.len() {
            let rest = u32::try_from(messages.len() - sent).unwrap_or(u32::MAX);
            // SAFETY: the headers point at addresses, control buffers, iovecs and slots of
            // `buffer`, all alive and unmoved across the call; sendmmsg reads at most `rest`.
            let result = unsafe {
                libc::sendmmsg(udp, messages[sent..].as_mut_ptr(), rest, libc::MSG_DONTWAIT)
            };
            if result <= 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                let (start, end) = runs[sent];
                if end - start > 1 && matches!(error.raw_os_error(), Some(libc::EIO | libc::EINVAL))
                {
                    // No UDP GSO here (no checksum offload on the way out, an old kernel):
                    // from now on one datagram per message; this run and the rest again so.
                    tracing::info!(%error, "mesh tunnel: UDP segmentation offload refused; sending datagrams singly");
                    self.gso = false;
                    let rest: Vec<(usize, SocketAddr)> = self.packets[start..].to_vec();
                    // Move the unsent datagrams to the front of the queue and send them.
                    self.buffer.copy_within(start * SLOT..count * SLOT, 0);
                    self.packets = rest;
                    return self.flush(udp, v6);
                }
                tracing::trace!(%error, "mesh tunnel: datagrams not sent");
                sent += 1;
                continue;
            }
            sent += usize::try_from(result).unwrap_or(1);
        }
        self.packets.clear();
    }
}

/// Puts a UDP_SEGMENT control message with `size` into `control` and points `header` at it.
pub(super) fn set_segment_size(header: &mut libc::msghdr, control: &mut [u64; 4], size: u16) {
    header.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes.
    header.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
    // SAFETY: the header's control buffer is `control`, 32 bytes, room for one cmsghdr (16
    // bytes) and its 2 data bytes, aligned for cmsghdr (u64).
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(header);
        if cmsg.is_null() {
            return;
        }
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(2) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size);
    }
}
