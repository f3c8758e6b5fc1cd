//! hawser-mesh-device: the mesh tunnel, WireGuard on a tun interface (boringtun's `noise`
//! protocol code under hawser's own packet loop), configured in-process and over netlink. The
//! mesh's pure side (keys, addresses, the registry, updates, the polling agent) is
//! `hawser-mesh`; this crate is its I/O, for PID 1 and the join service.
//!
//! [`Tunnel::start`] makes a tun interface (with the kernel's TCP segmentation and checksum
//! offloads handed to the tunnel), binds the UDP socket and starts the packet loop's thread
//! ([`device`]), then sets the interface's address (with the mesh prefix's length, so the kernel
//! routes the whole mesh into it), MTU and state over rtnetlink. No `ip` or `wg` command is run:
//! the node image has none.
//!
//! Peers change in one step per call ([`Tunnel::apply`], [`Tunnel::replace_peers`]), checked
//! first: a duplicate key, the tunnel's own key or address, or an address clash is refused and
//! nothing changes. [`Tunnel::stats`] reads what the nodes report in their polls.
//!
//! Everything here works in the network namespace of the thread that called
//! [`Tunnel::start`]: the tun device, the UDP socket and the loop's thread belong to it.

mod device;
mod error;
mod link;
#[cfg(feature = "netns-testing")]
pub mod netns;
pub mod offload;
pub mod uapi;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ipnet::Ipv4Net;

pub use error::DeviceError;
use link::{LinkProbe, LinkSettings};
use uapi::PeerSection;

use hawser_mesh::{Peer, PeerStats, PrivateKey, PublicKey};

/// How long [`Tunnel::stop`] waits for the interface to go.
const STOP_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest MTU: the packet loop's datagram slots hold an MTU of 1500 and WireGuard's
/// overhead.
pub const MAX_MTU: u32 = 1500;
const MIN_MTU: u32 = 68;

/// What a tunnel is started with.
#[derive(Debug)]
pub struct TunnelConfig {
    /// The interface's name, e.g. `hawser0`: 1 to 15 bytes, no `/`, whitespace or NUL.
    pub interface: String,
    /// This member's private key: handed to the packet loop, never logged.
    pub private_key: PrivateKey,
    /// The UDP port to listen on; 0 lets the kernel choose ([`Tunnel::listen_port`] tells which).
    pub listen_port: u16,
    /// This member's VPN address.
    pub address: Ipv4Addr,
    /// The mesh prefix: the address is added with its length, so the kernel routes the whole
    /// mesh into the tunnel.
    pub prefix: Ipv4Net,
    /// The interface's MTU, e.g. [`hawser_mesh::tunnel_mtu`]`(1500)`; at most [`MAX_MTU`].
    pub mtu: u32,
    /// At least 1 (the packet loop runs on one thread whatever the number: kept for callers).
    pub threads: usize,
    /// Whether the tunnel carries the pods' traffic: the pod network
    /// ([`hawser_mesh::pods::POD_NETWORK`]) is routed into it, and each peer's pod range
    /// ([`hawser_mesh::pods::pod_range`] of its VPN address) is accepted from and sent to that
    /// peer. A node's PID 1 turns it on; a join service's own tunnel carries no pods.
    pub pod_routes: bool,
}

impl TunnelConfig {
    /// Checks what can be checked before anything is created.
    pub fn check(&self) -> Result<(), DeviceError> {
        check_interface_name(&self.interface)?;
        let host = self.prefix.contains(&self.address)
            && (self.prefix.prefix_len() >= 31
                || (self.address != self.prefix.network()
                    && self.address != self.prefix.broadcast()));
        if !host {
            return Err(DeviceError::AddressOutsidePrefix {
                address: self.address,
                prefix: self.prefix,
            });
        }
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(DeviceError::Mtu { mtu: self.mtu });
        }
        if self.threads == 0 {
            return Err(DeviceError::NoThreads);
        }
        Ok(())
    }
}

fn check_interface_name(name: &str) -> Result<(), DeviceError> {
    let fits = (1..=15).contains(&name.len())
        && !name
            .chars()
            .any(|c| c == '/' || c == '\0' || c.is_whitespace())
        && !name.bytes().all(|b| b.is_ascii_digit())
        && name != "."
        && name != "..";
    if fits {
        Ok(())
    } else {
        Err(DeviceError::InterfaceName {
            name: name.to_owned(),
        })
    }
}

/// A running tunnel. Stopped by [`Tunnel::stop`] or when dropped: the loop's thread exits and
/// the interface goes away.
pub struct Tunnel {
    interface: String,
    address: Ipv4Addr,
    public_key: PublicKey,
    pod_routes: bool,
    device: Option<device::Device>,
    state: Mutex<ControlState>,
    probe: LinkProbe,
}

/// The peers as last configured, under one lock: one change at a time.
struct ControlState {
    /// The peers, to leave unchanged ones alone.
    peers: BTreeMap<PublicKey, PeerSection>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("interface", &self.interface)
            .field("address", &self.address)
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

impl Tunnel {
    /// Creates the interface, starts the packet loop on it with the private key and listen
    /// port, and gives it its address, MTU and state. No peers yet.
    ///
    /// Runs on any tokio runtime with I/O enabled (`enable_io` or `enable_all`; a
    /// current-thread one in PID 1): the netlink socket is registered with it for the set-up.
    pub async fn start(config: TunnelConfig) -> Result<Tunnel, DeviceError> {
        config.check()?;
        let public_key = config.private_key.public_key();
        let probe = LinkProbe::new().map_err(DeviceError::ProbeSocket)?;
        // Any interface of that name, tun or not, is refused here with a clear reason.
        if probe.exists(&config.interface) {
            return Err(DeviceError::InterfaceExists {
                interface: config.interface,
            });
        }
        check_port_free(config.listen_port)?;
        let device = start_device(&config)?;
        let tunnel = Tunnel {
            interface: config.interface,
            address: config.address,
            public_key,
            pod_routes: config.pod_routes,
            device: Some(device),
            state: Mutex::new(ControlState {
                peers: BTreeMap::new(),
            }),
            probe,
        };
        let settings = LinkSettings {
            address: config.address,
            prefix_len: config.prefix.prefix_len(),
            mtu: config.mtu,
            pod_network: config.pod_routes.then_some(hawser_mesh::pods::POD_NETWORK),
        };
        link::configure(&tunnel.interface, settings).await?;
        let listen_port = tunnel.listen_port()?;
        tracing::info!(
            interface = %tunnel.interface,
            address = %config.address,
            prefix = %config.prefix,
            mtu = config.mtu,
            listen_port,
            public_key = %tunnel.public_key,
            threads = config.threads,
            "mesh tunnel up"
        );
        Ok(tunnel)
    }

    /// Adds or updates `upserts` (endpoint, `vpn_ip/32` as the allowed address, with its pod
    /// range when the tunnel carries pods, a keepalive every 25 s) and removes `removed`, in one
    /// step. Peers whose configuration is unchanged are left alone (their sessions go on; a
    /// changed peer keeps its session too). Refused, with nothing changed, when a key appears twice or in both lists, a peer has this tunnel's key or address,
    /// or two peers would share an address.
    ///
    /// Like every method here but [`Tunnel::start`], this takes the loop's lock for a moment.
    pub fn apply(&self, upserts: &[Peer], removed: &[PublicKey]) -> Result<(), DeviceError> {
        let mut state = self.lock();
        let removed: BTreeSet<PublicKey> = removed.iter().copied().collect();
        let sections = self.check_peers(upserts)?;
        if let Some(key) = sections.keys().find(|key| removed.contains(*key)) {
            return Err(DeviceError::AddedAndRemoved { key: *key });
        }
        let mut after = state.peers.clone();
        after.retain(|key, _| !removed.contains(key));
        after.extend(
            sections
                .iter()
                .map(|(key, section)| (*key, section.clone())),
        );
        check_addresses(&after)?;

        let changed: Vec<PeerSection> = sections
            .values()
            .filter(|section| state.peers.get(&section.public_key) != Some(*section))
            .cloned()
            .collect();
        let removed: Vec<PublicKey> = removed.into_iter().collect();
        if changed.is_empty() && removed.is_empty() {
            return Ok(());
        }
        self.device()?.set_peers(&changed, &removed, false);
        tracing::info!(
            interface = %self.interface,
            changed = changed.len(),
            removed = removed.len(),
            peers = after.len(),
            "mesh peers changed"
        );
        state.peers = after;
        Ok(())
    }

    /// Makes `peers` the tunnel's whole peer set: every session starts over, so this is for a
    /// full resynchronisation; [`Tunnel::apply`] for changes. Refused, with nothing changed, on
    /// the same grounds as [`Tunnel::apply`].
    pub fn replace_peers(&self, peers: &[Peer]) -> Result<(), DeviceError> {
        let mut state = self.lock();
        let sections = self.check_peers(peers)?;
        check_addresses(&sections)?;
        let list: Vec<PeerSection> = sections.values().cloned().collect();
        self.device()?.set_peers(&list, &[], true);
        tracing::info!(interface = %self.interface, peers = list.len(), "mesh peers replaced");
        state.peers = sections;
        Ok(())
    }

    /// What the tunnel knows of each peer: endpoint, last handshake, bytes received and sent.
    pub fn stats(&self) -> Result<Vec<PeerStats>, DeviceError> {
        let peers = self.device()?.peers();
        let now = SystemTime::now();
        Ok(peers
            .into_iter()
            .map(|peer| peer_stats(peer, now))
            .collect())
    }

    /// The UDP port the tunnel listens on (the kernel's choice when configured with 0).
    pub fn listen_port(&self) -> Result<u16, DeviceError> {
        Ok(self.device()?.listen_port())
    }

    /// This member's public key.
    pub fn public_key(&self) -> PublicKey {
        self.public_key
    }

    /// The interface's name.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// This member's VPN address.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// Stops the packet loop and waits (a few seconds at most) for the interface to go.
    pub fn stop(self) {
        // Drop does it.
    }

    fn device(&self) -> Result<&device::Device, DeviceError> {
        self.device.as_ref().ok_or(DeviceError::Stopped)
    }

    fn lock(&self) -> MutexGuard<'_, ControlState> {
        // A panic while holding the lock leaves ControlState as it was: it is replaced whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The peers as sections keyed by public key, refusing duplicates and this tunnel's own
    /// key or address.
    fn check_peers(&self, peers: &[Peer]) -> Result<BTreeMap<PublicKey, PeerSection>, DeviceError> {
        let mut sections = BTreeMap::new();
        for peer in peers {
            if peer.public_key == self.public_key {
                return Err(DeviceError::OwnKey {
                    name: peer.name.clone(),
                    key: peer.public_key,
                });
            }
            if peer.vpn_ip == self.address {
                return Err(DeviceError::OwnAddress {
                    name: peer.name.clone(),
                    ip: peer.vpn_ip,
                });
            }
            let section = PeerSection {
                public_key: peer.public_key,
                vpn_ip: peer.vpn_ip,
                endpoint: peer.endpoint,
                pod_range: if self.pod_routes {
                    hawser_mesh::pods::pod_range(peer.vpn_ip)
                } else {
                    None
                },
            };
            if sections.insert(peer.public_key, section).is_some() {
                return Err(DeviceError::DuplicatePeer {
                    key: peer.public_key,
                });
            }
        }
        Ok(sections)
    }
}

/// Refuses a listen port another socket holds: the kernel would otherwise refuse the
/// tunnel's own bind with a less telling error.
fn check_port_free(port: u16) -> Result<(), DeviceError> {
    if port == 0 {
        return Ok(());
    }
    std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))
        .map(drop)
        .map_err(|source| DeviceError::PortInUse { port, source })
}

/// Creates the tun device and starts the packet loop on it.
fn start_device(config: &TunnelConfig) -> Result<device::Device, DeviceError> {
    let interface = &config.interface;
    let (tun, offloads) = link::create_tun(interface).map_err(|source| {
        if source.raw_os_error() == Some(libc::EBUSY) {
            DeviceError::InterfaceExists {
                interface: interface.to_owned(),
            }
        } else {
            DeviceError::Tun {
                interface: interface.to_owned(),
                source,
            }
        }
    })?;
    // The interface lives as long as the loop holds the descriptor.
    device::Device::start(
        tun,
        offloads,
        &config.private_key,
        config.listen_port,
        interface,
    )
    .map_err(|source| DeviceError::Start {
        interface: interface.to_owned(),
        source,
    })
}

/// A peer's stats at `now`. boringtun 0.7 tells how long ago the last handshake was (the kernel's
/// WireGuard tells when): the Unix time is `now` minus that.
fn peer_stats(peer: uapi::PeerState, now: SystemTime) -> PeerStats {
    PeerStats {
        public_key: peer.public_key,
        endpoint: peer.endpoint,
        last_handshake_unix: peer
            .since_last_handshake
            .and_then(|since| now.checked_sub(since))
            .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
            .map(|at| at.as_secs()),
        rx_bytes: peer.rx_bytes,
        tx_bytes: peer.tx_bytes,
    }
}

/// Refuses two peers with one address.
fn check_addresses(peers: &BTreeMap<PublicKey, PeerSection>) -> Result<(), DeviceError> {
    let mut owners: HashMap<Ipv4Addr, PublicKey> = HashMap::new();
    for section in peers.values() {
        if let Some(first) = owners.insert(section.vpn_ip, section.public_key) {
            return Err(DeviceError::AddressClash {
                ip: section.vpn_ip,
                first,
                second: section.public_key,
            });
        }
    }
    Ok(())
}

/// The agent ([`hawser_mesh::agent`]) drives the tunnel directly.
impl hawser_mesh::agent::TunnelControl for Tunnel {
    type Error = DeviceError;

    fn apply(&self, upserts: &[Peer], removed: &[PublicKey]) -> Result<(), DeviceError> {
        Tunnel::apply(self, upserts, removed)
    }

    fn stats(&self) -> Result<Vec<PeerStats>, DeviceError> {
        Tunnel::stats(self)
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // Stopping the loop closes the tun device, the last reference to the interface, which
        // the kernel then removes. It is stopped from a thread of its own: should the loop be
        // stuck, only that thread waits forever, not the caller.
        if let Some(device) = self.device.take() {
            let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
            let dropper = std::thread::Builder::new()
                .name("mesh-tunnel-stop".into())
                .spawn(move || {
                    device.stop();
                    let _ = dropped_tx.send(());
                });
            if dropper.is_ok() && dropped_rx.recv_timeout(STOP_TIMEOUT).is_err() {
                tracing::error!(
                    interface = %self.interface,
                    "the mesh tunnel's loop did not stop (its thread is stuck)"
                );
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while self.probe.exists(&self.interface) {
            if Instant::now() >= deadline {
                tracing::warn!(
                    interface = %self.interface,
                    "mesh tunnel stopped, but its interface is still there"
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(interface = %self.interface, "mesh tunnel stopped");
    }
}

#[cfg(test)]
mod tests;
