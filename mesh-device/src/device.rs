//! hawser's packet loop on boringtun's `noise` API (its `Tunn` per peer: handshakes, sessions,
//! timers, cookies), in place of boringtun's own `device` event loop.
//!
//! One thread moves every packet. It waits in `poll` on the tun device, the UDP socket and a
//! stop eventfd, at most 250 ms (the peers' timers run on that tick), and works in batches:
//!
//! - **tun to network**: the tun device hands super-packets of up to 64 KiB (`IFF_VNET_HDR`
//!   with `TUN_F_TSO4`/`TSO6`/`CSUM`): each is cut into MTU-sized TCP segments here
//!   ([`offload::segment`]), every segment encrypted for the peer whose allowed IPs hold its
//!   destination, and the datagrams go out with one `sendmmsg` per batch.
//! - **network to tun**: up to [`RECV_BATCH`] datagrams per `recvmmsg`, decrypted, checked
//!   against the sending peer's allowed IPs, and consecutive TCP segments of one flow coalesced
//!   back into super-packets ([`offload::Coalescer`]) the kernel takes in one write each.
//!
//! A panic while handling a batch is caught, logged and the loop goes on (it runs inside PID
//! 1); the peers' state is behind a mutex the caller's thread shares for configuration and
//! statistics.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519;
use ipnet::Ipv4Net;
use zeroize::Zeroizing;

use crate::offload::{self, Coalesced, Coalescer, VNET_HDR_LEN, VnetHdr};
use crate::uapi::{PERSISTENT_KEEPALIVE_SECONDS, PeerSection, PeerState};
use hawser_mesh::{PrivateKey, PublicKey};

/// Datagrams per `recvmmsg`.
pub const RECV_BATCH: usize = 64;
/// Datagrams per `sendmmsg` at most.
const SEND_BATCH: usize = 128;
/// One datagram's room: an MTU of at most 1500 plus WireGuard's 32 bytes, and the 148 bytes
/// `Tunn::encapsulate` asks for at least.
const SLOT: usize = 2048;
/// What one read from the tun device may bring: a header and a 64 KiB super-packet.
const TUN_READ: usize = VNET_HDR_LEN + 65536;
/// Reads from each side per wake-up before the other gets its turn.
const ROUNDS: usize = 8;
/// The timers' tick (boringtun's device's too).
const TICK: Duration = Duration::from_millis(250);
/// Handshake messages per second before cookies are asked for (boringtun's device's limit,
/// doubled: the shared limiter counts a handshake initiation twice, once at the look-up of its
/// peer and once in the peer's `Tunn`).
const HANDSHAKE_RATE_LIMIT: u64 = 200;
/// Datagrams per UDP GSO message at most (the kernel's UDP_MAX_SEGMENTS is 64 or more).
const GSO_MAX_SEGMENTS: usize = 64;
/// Bytes per UDP GSO message at most: one IP packet's worth, less the headers.
const GSO_MAX_BYTES: usize = 65535 - 40 - 8;
/// The UDP socket's buffers.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

mod peers;
mod udp;

use peers::State;
use udp::*;

/// The running loop: its thread, its stop signal and the state it shares.
pub struct Device {
    state: Arc<Mutex<State>>,
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
    listen_port: u16,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("listen_port", &self.listen_port)
            .finish_non_exhaustive()
    }
}

/// The private key as boringtun's secret (the intermediate copies zeroized).
fn static_secret(key: &PrivateKey) -> x25519::StaticSecret {
    let hex = key.to_hex();
    let mut bytes = Zeroizing::new([0u8; 32]);
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = hex
            .get(2 * i..2 * i + 2)
            .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            .unwrap_or(0);
    }
    x25519::StaticSecret::from(*bytes)
}

fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer, which lives across
    // the call.
    let _ = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    u32::from_ne_bytes(bytes)
}

fn cvt(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

impl Device {
    /// Binds the UDP socket on `listen_port` (0: the kernel's choice) and starts the loop's
    /// thread on `tun` (opened with `IFF_VNET_HDR`). `offloads`: whether the tun device took
    /// `TUNSETOFFLOAD` (super-packets come and may be written).
    pub fn start(
        tun: OwnedFd,
        offloads: bool,
        private_key: &PrivateKey,
        listen_port: u16,
        interface: &str,
    ) -> io::Result<Device> {
        set_nonblocking(tun.as_raw_fd())?;
        let (udp, v6) = bind_udp(listen_port)?;
        let listen_port = local_port(udp.as_raw_fd())?;
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor.
        let stop = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `stop` is a fresh descriptor owned by nobody else.
        let stop = unsafe { OwnedFd::from_raw_fd(stop) };
        let private = static_secret(private_key);
        let public = x25519::PublicKey::from(&private);
        let state = Arc::new(Mutex::new(State {
            rate_limiter: Arc::new(RateLimiter::new(&public, HANDSHAKE_RATE_LIMIT)),
            private,
            public,
            peers: HashMap::new(),
            by_key: HashMap::new(),
            routes: Vec::new(),
            next_index: random_u32() & 0x00ff_ffff,
        }));
        // SAFETY: dup takes no pointers; the result is a new descriptor for the loop.
        let stop_for_loop = cvt(unsafe { libc::dup(stop.as_raw_fd()) })?;
        // SAFETY: a fresh descriptor owned by nobody else.
        let stop_for_loop = unsafe { OwnedFd::from_raw_fd(stop_for_loop) };
        let mut packet_loop = Loop {
            state: Arc::clone(&state),
            tun,
            udp,
            v6,
            offloads,
            stop: stop_for_loop,
            interface: interface.to_owned(),
            tun_buffer: vec![0; TUN_READ],
            scratch: vec![0; 65536],
            send: SendQueue::new(),
            recv: vec![0; RECV_BATCH * SLOT],
            plain: vec![0; RECV_BATCH * SLOT],
            plain_spans: Vec::with_capacity(RECV_BATCH),
            coalescer: Coalescer::default(),
            next_tick: Instant::now() + TICK,
        };
        let thread = std::thread::Builder::new()
            .name("mesh-tunnel".into())
            .spawn(move || packet_loop.run())?;
        Ok(Device {
            state,
            stop,
            thread: Some(thread),
            listen_port,
        })
    }

    /// The UDP port it listens on.
    pub fn listen_port(&self) -> u16 {
        self.listen_port
    }

    /// Removes `removed` (all peers with `replace`), then adds or updates `upserts`: a known
    /// peer keeps its session, and its endpoint unless a new one is given.
    pub fn set_peers(&self, upserts: &[PeerSection], removed: &[PublicKey], replace: bool) {
        let mut state = lock(&self.state);
        if replace {
            state.peers.clear();
            state.by_key.clear();
        }
        for key in removed {
            state.remove(key);
        }
        for section in upserts {
            state.upsert(section);
        }
        state.rebuild_routes();
    }

    /// Every peer's endpoint, allowed IPs, time since its last handshake and traffic.
    pub fn peers(&self) -> Vec<PeerState> {
        let state = lock(&self.state);
        let mut peers: Vec<PeerState> = state
            .peers
            .values()
            .map(|peer| {
                let (since_last_handshake, tx, rx, _, _) = peer.tunn.stats();
                PeerState {
                    public_key: peer.key,
                    endpoint: peer.endpoint,
                    allowed_ips: peer.allowed.iter().map(ToString::to_string).collect(),
                    since_last_handshake,
                    rx_bytes: rx as u64,
                    tx_bytes: tx as u64,
                }
            })
            .collect();
        peers.sort_by_key(|peer| peer.public_key);
        peers
    }

    /// Tells the loop to stop and waits for its thread to end (it then closes the tun device
    /// and the socket).
    pub fn stop(mut self) {
        self.signal_stop();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the mesh tunnel's thread ended in a panic");
        }
    }

    fn signal_stop(&self) {
        let one: u64 = 1;
        // SAFETY: write reads 8 bytes from `one`, which lives across the call.
        let _ = unsafe {
            libc::write(
                self.stop.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.signal_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic in the loop leaves the peers as they were between two packets: usable.
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The loop's own: descriptors, buffers.
struct Loop {
    state: Arc<Mutex<State>>,
    tun: OwnedFd,
    udp: OwnedFd,
    v6: bool,
    offloads: bool,
    stop: OwnedFd,
    interface: String,
    tun_buffer: Vec<u8>,
    scratch: Vec<u8>,
    send: SendQueue,
    recv: Vec<u8>,
    /// Decrypted packets, each at `VNET_HDR_LEN` in its slot.
    plain: Vec<u8>,
    /// Which slots of `plain` hold a packet for the tun device, and its length.
    plain_spans: Vec<(usize, usize)>,
    coalescer: Coalescer,
    next_tick: Instant,
}

enum Step {
    Continue,
    Stop,
}

impl Loop {
    fn run(&mut self) {
        tracing::debug!(interface = %self.interface, offloads = self.offloads, "mesh tunnel loop running");
        let mut panics: u32 = 0;
        loop {
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.step())) {
                Ok(Ok(Step::Continue)) => {}
                Ok(Ok(Step::Stop)) => break,
                Ok(Err(error)) => {
                    tracing::error!(interface = %self.interface, %error, "mesh tunnel: waiting failed");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(_) => {
                    panics = panics.saturating_add(1);
                    tracing::error!(
                        interface = %self.interface,
                        panics,
                        "mesh tunnel: a panic while moving packets (the batch is lost; going on)"
                    );
                    // The queues may hold half a batch: start over clean.
                    self.send.packets.clear();
                    self.plain_spans.clear();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        tracing::debug!(interface = %self.interface, "mesh tunnel loop stopped");
    }

    fn step(&mut self) -> io::Result<Step> {
        let now = Instant::now();
        if now >= self.next_tick {
            self.timers();
            self.next_tick = now + TICK;
        }
        let timeout = self.next_tick.saturating_duration_since(Instant::now());
        let timeout = libc::c_int::try_from(timeout.as_millis())
            .unwrap_or(250)
            .max(1);
        let mut fds = [
            libc::pollfd {
                fd: self.tun.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.udp.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads and writes the three pollfds, which live across the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            return if error.kind() == io::ErrorKind::Interrupted {
                Ok(Step::Continue)
            } else {
                Err(error)
            };
        }
        if fds[2].revents != 0 {
            return Ok(Step::Stop);
        }
        if fds[1].revents != 0 {
            self.network_to_tun();
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            tracing::error!(interface = %self.interface, "mesh tunnel: the tun device failed");
            return Ok(Step::Stop);
        }
        if fds[0].revents != 0 {
            self.tun_to_network();
        }
        Ok(Step::Continue)
    }

    /// Every peer's timers: handshakes started or retried, keepalives, sessions expired.
    fn timers(&mut self) {
        let mut state = lock(&self.state);
        state.rate_limiter.reset_count();
        let (udp, v6) = (self.udp.as_raw_fd(), self.v6);
        for peer in state.peers.values_mut() {
            if peer.greet
                && let Some(to) = peer.endpoint
            {
                peer.greet = false;
                let slot = self.send.slot(udp, v6);
                if let TunnResult::WriteToNetwork(packet) =
                    peer.tunn.format_handshake_initiation(slot, false)
                {
                    let length = packet.len();
                    self.send.commit(length, to);
                }
            }
            let slot = self.send.slot(udp, v6);
            match peer.tunn.update_timers(slot) {
                TunnResult::WriteToNetwork(packet) => {
                    let length = packet.len();
                    if let Some(to) = peer.endpoint {
                        self.send.commit(length, to);
                    }
                }
                TunnResult::Err(WireGuardError::ConnectionExpired) | TunnResult::Done => {}
                TunnResult::Err(error) => {
                    tracing::debug!(peer = %peer.key, ?error, "mesh tunnel: timer");
                }
                TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {}
            }
        }
        drop(state);
        self.send.flush(udp, v6);
    }

    /// Reads packets from the tun device, segments super-packets, encrypts and sends.
    fn tun_to_network(&mut self) {
        let (udp, v6) = (self.udp.as_raw_fd(), self.v6);
        for _ in 0..ROUNDS {
            // SAFETY: read writes at most `tun_buffer.len()` bytes into it.
            let read = unsafe {
                libc::read(
                    self.tun.as_raw_fd(),
                    self.tun_buffer.as_mut_ptr().cast(),
                    self.tun_buffer.len(),
                )
            };
            let Ok(read) = usize::try_from(read) else {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::WouldBlock
                    && error.kind() != io::ErrorKind::Interrupted
                {
                    tracing::warn!(interface = %self.interface, %error, "mesh tunnel: reading the tun device");
                }
                break;
            };
            let Some(hdr) = VnetHdr::decode(&self.tun_buffer[..read]) else {
                continue;
            };
            let mut state = lock(&self.state);
            let send = &mut self.send;
            let packet = &mut self.tun_buffer[VNET_HDR_LEN..read];
            if hdr.gso_type != offload::GSO_NONE {
                let result = offload::segment(packet, &hdr, &mut self.scratch, |segment| {
                    encapsulate(&mut state, send, udp, v6, segment);
                });
                if let Err(error) = result {
                    tracing::debug!(%error, "mesh tunnel: a super-packet dropped");
                }
            } else {
                if hdr.flags & offload::F_NEEDS_CSUM != 0
                    && let Err(error) = offload::complete_checksum(packet, &hdr)
                {
                    tracing::debug!(%error, "mesh tunnel: a packet dropped");
                    continue;
                }
                encapsulate(&mut state, send, udp, v6, packet);
            }
            drop(state);
            // Out before the next read (which most often only says there is nothing more):
            // a lone packet waits no longer than it must.
            self.send.flush(udp, v6);
        }
    }

    /// Receives datagrams in batches, decrypts them and writes what they carry to the tun
    /// device, TCP segments coalesced.
    fn network_to_tun(&mut self) {
        let (udp, v6) = (self.udp.as_raw_fd(), self.v6);
        for _ in 0..ROUNDS {
            let mut sources: [MaybeUninit<libc::sockaddr_storage>; RECV_BATCH] =
                [const { MaybeUninit::zeroed() }; RECV_BATCH];
            let base = self.recv.as_mut_ptr();
            let mut iovecs: Vec<libc::iovec> = (0..RECV_BATCH)
                .map(|i| libc::iovec {
                    // SAFETY: i < RECV_BATCH: the offset lies inside `recv`.
                    iov_base: unsafe { base.add(i * SLOT) }.cast(),
                    iov_len: SLOT,
                })
                .collect();
            let mut messages: Vec<libc::mmsghdr> = iovecs
                .iter_mut()
                .zip(sources.iter_mut())
                .map(|(iov, source)| {
                    // SAFETY: all zeroes is a valid msghdr.
                    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
                    header.msg_name = source.as_mut_ptr().cast();
                    header.msg_namelen = socklen::<libc::sockaddr_storage>();
                    header.msg_iov = iov;
                    header.msg_iovlen = 1;
                    libc::mmsghdr {
                        msg_hdr: header,
                        msg_len: 0,
                    }
                })
                .collect();
            // SAFETY: the headers point at the sources, iovecs and slots of `recv`, alive and
            // unmoved across the call; recvmmsg writes at most RECV_BATCH of them.
            let received = unsafe {
                libc::recvmmsg(
                    udp,
                    messages.as_mut_ptr(),
                    RECV_BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            let Ok(received) = usize::try_from(received) else {
                break;
            };
            if received == 0 {
                break;
            }
            self.plain_spans.clear();
            let mut state = lock(&self.state);
            for (i, message) in messages.iter().take(received).enumerate() {
                let length = usize::try_from(message.msg_len).unwrap_or(0).min(SLOT);
                if message.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                    continue;
                }
                // SAFETY: the kernel wrote a sockaddr into each source it returned; the rest
                // of the storage is zeroed, so reading it whole is defined.
                let source = unsafe { sources[i].assume_init_ref() };
                let Some(from) = from_sockaddr(source) else {
                    continue;
                };
                let datagram = &self.recv[i * SLOT..i * SLOT + length];
                let plain = &mut self.plain[i * SLOT + VNET_HDR_LEN..(i + 1) * SLOT];
                if let Some(span) =
                    decapsulate(&mut state, &mut self.send, udp, v6, datagram, from, plain)
                {
                    self.plain_spans.push((i, span));
                }
            }
            drop(state);
            self.send.flush(udp, v6);
            self.write_to_tun();
            if received < RECV_BATCH {
                break;
            }
        }
    }

    fn write_to_tun(&mut self) {
        let plain = &self.plain;
        let packet_at = |i: usize| -> &[u8] {
            let (slot, length) = self.plain_spans[i];
            &plain[slot * SLOT + VNET_HDR_LEN..slot * SLOT + VNET_HDR_LEN + length]
        };
        self.coalescer.clear();
        if self.offloads {
            for i in 0..self.plain_spans.len() {
                self.coalescer.add(i, packet_at(i), packet_at);
            }
        }
        let order = if self.offloads {
            self.coalescer.finish()
        } else {
            (0..self.plain_spans.len()).map(Coalesced::Single).collect()
        };
        for entry in order {
            let bytes: &[u8] = match entry {
                Coalesced::Merged(b) => self.coalescer.super_packet(b),
                Coalesced::Single(i) => {
                    let (slot, length) = self.plain_spans[i];
                    let at = slot * SLOT;
                    VnetHdr::default().encode(&mut self.plain[at..at + VNET_HDR_LEN]);
                    &self.plain[at..at + VNET_HDR_LEN + length]
                }
            };
            // SAFETY: write reads `bytes.len()` bytes from `bytes`, alive across the call.
            let written =
                unsafe { libc::write(self.tun.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            if written < 0 {
                let error = io::Error::last_os_error();
                tracing::trace!(%error, "mesh tunnel: a packet not written to the tun device");
            }
        }
        self.plain_spans.clear();
    }
}

/// Encrypts one packet from the tun device for the peer its destination routes to.
fn encapsulate(state: &mut State, send: &mut SendQueue, udp: RawFd, v6: bool, packet: &[u8]) {
    if packet.len() + 32 > SLOT {
        return;
    }
    let Some(IpAddr::V4(destination)) = Tunn::dst_address(packet) else {
        return;
    };
    let Some(index) = state.route(destination) else {
        return;
    };
    let Some(peer) = state.peers.get_mut(&index) else {
        return;
    };
    let slot = send.slot(udp, v6);
    match peer.tunn.encapsulate(packet, slot) {
        TunnResult::WriteToNetwork(datagram) => {
            let length = datagram.len();
            if let Some(to) = peer.endpoint {
                send.commit(length, to);
            }
        }
        TunnResult::Err(error) => {
            tracing::debug!(peer = %peer.key, ?error, "mesh tunnel: encapsulate");
        }
        _ => {}
    }
}

/// Decrypts one datagram (or answers a handshake). Returns the length of the packet it carried
/// for the tun device, written at the start of `plain`.
fn decapsulate(
    state: &mut State,
    send: &mut SendQueue,
    udp: RawFd,
    v6: bool,
    datagram: &[u8],
    from: SocketAddr,
    plain: &mut [u8],
) -> Option<usize> {
    let index = match Tunn::parse_incoming_packet(datagram).ok()? {
        Packet::HandshakeInit(init) => {
            // Mac1 first (and a cookie asked for under load), before any Diffie-Hellman.
            let slot = send.slot(udp, v6);
            match state
                .rate_limiter
                .verify_packet(Some(from.ip()), datagram, slot)
            {
                Ok(_) => {}
                Err(TunnResult::WriteToNetwork(cookie)) => {
                    let length = cookie.len();
                    send.commit(length, from);
                    return None;
                }
                Err(_) => return None,
            }
            let half = parse_handshake_anon(&state.private, &state.public, &init).ok()?;
            *state
                .by_key
                .get(&PublicKey::from_slice(&half.peer_static_public).ok()?)?
        }
        Packet::HandshakeResponse(p) => p.receiver_idx >> 8,
        Packet::PacketCookieReply(p) => p.receiver_idx >> 8,
        Packet::PacketData(p) => p.receiver_idx >> 8,
    };
    let peer = state.peers.get_mut(&index)?;
    let base = plain.as_ptr() as usize;
    let result = peer.tunn.decapsulate(Some(from.ip()), datagram, plain);
    let carried = match result {
        TunnResult::Done => None,
        TunnResult::Err(error) => {
            tracing::trace!(peer = %peer.key, ?error, "mesh tunnel: decapsulate");
            return None;
        }
        TunnResult::WriteToNetwork(reply) => {
            let length = reply.len();
            let slot = send.slot(udp, v6);
            slot[..length].copy_from_slice(reply);
            send.commit(length, from);
            // Packets queued for the handshake go now.
            loop {
                let slot = send.slot(udp, v6);
                match peer.tunn.decapsulate(None, &[], slot) {
                    TunnResult::WriteToNetwork(packet) => {
                        let length = packet.len();
                        send.commit(length, from);
                    }
                    _ => break,
                }
            }
            None
        }
        TunnResult::WriteToTunnelV4(packet, source) => {
            let allowed = peer.allowed.iter().any(|net| net.contains(&source));
            let offset = (packet.as_ptr() as usize).wrapping_sub(base);
            let length = packet.len();
            if allowed && offset == 0 {
                Some(length)
            } else {
                None
            }
        }
        TunnResult::WriteToTunnelV6(..) => None,
    };
    // Authenticated: the peer is where this came from (roaming).
    peer.endpoint = Some(from);
    carried
}
