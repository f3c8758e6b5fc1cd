//! Mesh members in network namespaces this test creates: each member's tunnel is started by a
//! thread that entered its namespace first (the tun device, UDP sockets and boringtun's threads
//! belong to that namespace), on a current-thread tokio runtime as in PID 1. The members reach
//! each other over veth pairs into a fourth namespace holding a bridge (the "underlay").
//!
//! Needs root, iproute2 (`ip`), iputils-ping (`ping`) and /dev/net/tun; without them the test
//! fails naming what is missing. The namespaces are deleted at the end, also when a test fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use hawser_mesh::{Ipv4Net, Peer, PrivateKey, PublicKey};
use hawser_mesh_device::netns::{self, Underlay};
use hawser_mesh_device::{DeviceError, Tunnel, TunnelConfig};

const INTERFACE: &str = "hawser0";

fn vpn_prefix() -> Ipv4Net {
    "10.77.0.0/24".parse().unwrap()
}

/// The host's tools, and the tunnels' logs (boringtun's too) in the test output
/// (RUST_LOG=debug for more).
fn require_host() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
    netns::require_host();
}

/// The namespaces of one run: members at 192.168.77.(10+i).
fn underlay(count: usize) -> Underlay {
    Underlay::new(count, 77)
}

fn underlay_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, 10 + u8::try_from(i).unwrap())
}

fn vpn_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, 1 + u8::try_from(i).unwrap())
}

/// Starts a tunnel from a thread inside namespace `ns`, on a current-thread runtime.
fn start_in(ns: &str, config: TunnelConfig) -> Result<Tunnel, DeviceError> {
    netns::in_namespace(ns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(Tunnel::start(config))
    })
}

fn member_config(i: usize, listen_port: u16) -> TunnelConfig {
    let mut seed = [0u8; 32];
    fill_random(&mut seed);
    TunnelConfig {
        interface: INTERFACE.into(),
        private_key: PrivateKey::from_random(seed),
        listen_port,
        address: vpn_ip(i),
        prefix: vpn_prefix(),
        mtu: hawser_mesh::tunnel_mtu(1500),
        // PID 1 runs one boringtun thread; member 1 runs two, so both ways are exercised.
        threads: if i == 1 { 2 } else { 1 },
        pod_routes: false,
    }
}

fn fill_random(bytes: &mut [u8]) {
    use std::io::Read as _;
    File::open("/dev/urandom")
        .unwrap()
        .read_exact(bytes)
        .unwrap();
}

/// A member as its peers see it.
fn peer(i: usize, tunnel: &Tunnel) -> Peer {
    Peer {
        name: format!("member-{i}"),
        public_key: tunnel.public_key(),
        vpn_ip: vpn_ip(i),
        endpoint: Some(SocketAddr::from((
            underlay_ip(i),
            tunnel.listen_port().unwrap(),
        ))),
        coordinator: false,
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Starts `count` members (the first lets the kernel choose its port) and gives each the
/// others as peers.
fn mesh(underlay: &Underlay, count: usize) -> (Vec<Tunnel>, Vec<Peer>) {
    let tunnels: Vec<Tunnel> = (0..count)
        .map(|i| {
            let port = if i == 0 {
                0
            } else {
                hawser_mesh::DEFAULT_LISTEN_PORT
            };
            start_in(&underlay.members[i], member_config(i, port)).unwrap()
        })
        .collect();
    let peers: Vec<Peer> = tunnels
        .iter()
        .enumerate()
        .map(|(i, t)| peer(i, t))
        .collect();
    for (i, tunnel) in tunnels.iter().enumerate() {
        let others: Vec<Peer> = peers
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, p)| p.clone())
            .collect();
        tunnel.replace_peers(&others).unwrap();
    }
    (tunnels, peers)
}

#[test]
fn three_members_ping_through_the_mesh_and_converge_after_a_peer_is_removed_and_re_added() {
    require_host();
    let underlay = underlay(3);
    let (tunnels, peers) = mesh(&underlay, 3);

    // The interface as netlink set it up.
    for i in 0..3 {
        let link = underlay.link(i, "link", INTERFACE).unwrap();
        assert!(link.contains("mtu 1420"), "{link}");
        assert!(link.contains(",UP"), "{link}");
        let address = underlay.link(i, "addr", INTERFACE).unwrap();
        assert!(
            address.contains(&format!("inet {}/24", vpn_ip(i))),
            "{address}"
        );
    }
    // Member 0 let the kernel choose its port.
    let port = tunnels[0].listen_port().unwrap();
    assert_ne!(port, 0);
    assert_eq!(
        tunnels[1].listen_port().unwrap(),
        hawser_mesh::DEFAULT_LISTEN_PORT
    );

    // Every pair, both ways, by VPN address.
    for from in 0..3 {
        for to in (0..3).filter(|to| *to != from) {
            assert!(
                underlay.pings(from, vpn_ip(to)),
                "member {from} cannot ping member {to} at {} through the mesh",
                vpn_ip(to)
            );
        }
    }

    // Each member's stats: both peers, a recent handshake, traffic both ways, the endpoint.
    for (i, tunnel) in tunnels.iter().enumerate() {
        let mut stats = tunnel.stats().unwrap();
        stats.sort_by_key(|s| s.public_key);
        let mut expected: Vec<&Peer> = peers.iter().filter(|p| p.vpn_ip != vpn_ip(i)).collect();
        expected.sort_by_key(|p| p.public_key);
        assert_eq!(stats.len(), 2, "member {i}: {stats:?}");
        for (stat, peer) in stats.iter().zip(expected) {
            assert_eq!(stat.public_key, peer.public_key);
            assert_eq!(stat.endpoint, peer.endpoint, "member {i}: {stat:?}");
            let handshake = stat.last_handshake_unix.expect("a handshake");
            assert!(
                handshake + 60 >= now_unix() && handshake <= now_unix(),
                "member {i}: handshake at {handshake}, now {}",
                now_unix()
            );
            assert!(
                stat.rx_bytes > 0 && stat.tx_bytes > 0,
                "member {i}: {stat:?}"
            );
        }
    }

    // Member 0 drops member 1: no traffic between them either way; member 2 unaffected.
    tunnels[0].apply(&[], &[peers[1].public_key]).unwrap();
    let keys: Vec<PublicKey> = tunnels[0]
        .stats()
        .unwrap()
        .iter()
        .map(|s| s.public_key)
        .collect();
    assert_eq!(keys, vec![peers[2].public_key]);
    assert!(
        !underlay.ping(0, vpn_ip(1)),
        "member 0 still reaches member 1"
    );
    assert!(
        !underlay.ping(1, vpn_ip(0)),
        "member 1 still reaches member 0"
    );
    assert!(underlay.pings(0, vpn_ip(2)));

    // Re-added: traffic flows again, and member 2's session was left alone.
    let before = tunnels[0].stats().unwrap();
    tunnels[0]
        .apply(&[peers[1].clone(), peers[2].clone()], &[])
        .unwrap();
    let after = tunnels[0].stats().unwrap();
    let of =
        |stats: &[hawser_mesh::PeerStats], key| stats.iter().find(|s| s.public_key == key).cloned();
    let kept = of(&after, peers[2].public_key).unwrap();
    assert!(
        kept.tx_bytes >= of(&before, peers[2].public_key).unwrap().tx_bytes,
        "an unchanged peer was re-added (its counters restarted)"
    );
    assert!(
        underlay.pings(0, vpn_ip(1)),
        "member 0 cannot reach member 1 again"
    );
    assert!(
        underlay.pings(1, vpn_ip(0)),
        "member 1 cannot reach member 0 again"
    );

    // Stopped: the interfaces are gone.
    drop(tunnels);
    for i in 0..3 {
        assert_eq!(underlay.link(i, "link", INTERFACE), None, "member {i}");
    }
}

/// The pods' traffic: two members whose tunnels carry pods, each with a "pod" address of its
/// pod range on a bridge (as `cni0` holds the range's gateway on a node). A packet
/// from member 0's range to member 1's goes through the tunnel (the pod network's route), is
/// accepted by member 1 from member 0 only, and the answer comes back the same way; a tunnel
/// that carries no pods neither routes nor accepts them.
#[test]
fn pod_ranges_are_routed_through_the_tunnel_to_the_member_that_owns_them() {
    require_host();
    let underlay = underlay(2);
    let pod_gateway = |i: usize| {
        let range = hawser_mesh::pods::pod_range(vpn_ip(i)).unwrap();
        Ipv4Addr::from(u32::from(range.network()) | 1)
    };
    let tunnels: Vec<Tunnel> = (0..2)
        .map(|i| {
            let config = TunnelConfig {
                pod_routes: true,
                ..member_config(i, hawser_mesh::DEFAULT_LISTEN_PORT)
            };
            start_in(&underlay.members[i], config).unwrap()
        })
        .collect();
    for (i, tunnel) in tunnels.iter().enumerate() {
        tunnel
            .replace_peers(&[peer(1 - i, &tunnels[1 - i])])
            .unwrap();
        let ns = &underlay.members[i];
        netns::must(&["ip", "-n", ns, "link", "add", "pods0", "type", "bridge"]);
        let address = format!("{}/24", pod_gateway(i));
        netns::must(&["ip", "-n", ns, "addr", "add", &address, "dev", "pods0"]);
        netns::must(&["ip", "-n", ns, "link", "set", "pods0", "up"]);
        let routes = netns::run(&["ip", "-n", ns, "route", "show", "dev", INTERFACE]);
        let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
        assert!(
            routes.contains(&format!(
                "10.244.0.0/16 proto static scope link src {}",
                vpn_ip(i)
            )),
            "member {i}: {routes}"
        );
    }
    let pod_ping = |from: usize| {
        let (source, to) = (
            pod_gateway(from).to_string(),
            pod_gateway(1 - from).to_string(),
        );
        let ns = &underlay.members[from];
        (0..3).any(|_| {
            netns::run(&[
                "ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", "-I", &source, &to,
            ])
            .status
            .success()
        })
    };
    assert!(pod_ping(0), "member 0's pod range cannot reach member 1's");
    assert!(pod_ping(1), "member 1's pod range cannot reach member 0's");
    let stats = tunnels[0].stats().unwrap();
    assert!(stats[0].rx_bytes > 0 && stats[0].tx_bytes > 0, "{stats:?}");

    // Member 1 again, without pods: no pod range is routed into its tunnel.
    drop(tunnels);
    let plain = start_in(&underlay.members[1], member_config(1, 0)).unwrap();
    let routes = netns::run(&[
        "ip",
        "-n",
        &underlay.members[1],
        "route",
        "show",
        "dev",
        INTERFACE,
    ]);
    assert!(
        !String::from_utf8_lossy(&routes.stdout).contains("10.244."),
        "a tunnel without pods routes them"
    );
    drop(plain);
}

#[test]
fn bad_peer_changes_are_refused_and_leave_the_mesh_as_it_was() {
    require_host();
    let underlay = underlay(2);
    let (tunnels, peers) = mesh(&underlay, 2);
    assert!(underlay.pings(0, vpn_ip(1)));
    let before = tunnels[0].stats().unwrap();

    let stranger = PrivateKey::from_random([5; 32]).public_key();
    let clash = Peer {
        name: "clash".into(),
        public_key: stranger,
        ..peers[1].clone()
    };
    let error = tunnels[0].apply(&[clash], &[]).unwrap_err();
    assert!(
        matches!(error, DeviceError::AddressClash { ip, .. } if ip == vpn_ip(1)),
        "{error}"
    );
    let error = tunnels[0]
        .apply(&[peers[1].clone(), peers[1].clone()], &[])
        .unwrap_err();
    assert!(
        matches!(error, DeviceError::DuplicatePeer { .. }),
        "{error}"
    );
    let error = tunnels[0]
        .apply(&[peers[1].clone()], &[peers[1].public_key])
        .unwrap_err();
    assert!(
        matches!(error, DeviceError::AddedAndRemoved { .. }),
        "{error}"
    );
    let error = tunnels[0].apply(&[peers[0].clone()], &[]).unwrap_err();
    assert!(matches!(error, DeviceError::OwnKey { .. }), "{error}");
    let own_address = Peer {
        public_key: stranger,
        vpn_ip: vpn_ip(0),
        ..peers[1].clone()
    };
    let error = tunnels[0].replace_peers(&[own_address]).unwrap_err();
    assert!(matches!(error, DeviceError::OwnAddress { .. }), "{error}");

    // The peer and its session are as they were, and traffic still flows.
    let after = tunnels[0].stats().unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].public_key, before[0].public_key);
    assert!(after[0].tx_bytes >= before[0].tx_bytes);
    assert!(underlay.ping(0, vpn_ip(1)));

    // A second tunnel of the same name in the same namespace is refused, not joined.
    let error = start_in(&underlay.members[0], member_config(0, 0)).unwrap_err();
    assert!(
        matches!(error, DeviceError::InterfaceExists { .. }),
        "{error}"
    );
    assert!(underlay.ping(0, vpn_ip(1)));
}

#[test]
fn a_peer_without_an_endpoint_is_reached_once_it_has_sent() {
    require_host();
    let underlay = underlay(3);
    let (tunnels, peers) = mesh(&underlay, 3);
    // Member 0 knows member 2 by key and address only; in one transaction with member 1, which
    // has an endpoint (boringtun 0.7 would hand it to the next peer section if written first).
    let anonymous = Peer {
        endpoint: None,
        ..peers[2].clone()
    };
    tunnels[0]
        .replace_peers(&[peers[1].clone(), anonymous])
        .unwrap();
    let endpoint_of = |key| {
        tunnels[0]
            .stats()
            .unwrap()
            .into_iter()
            .find(|s| s.public_key == key)
            .unwrap()
            .endpoint
    };
    assert_eq!(endpoint_of(peers[1].public_key), peers[1].endpoint);
    // Member 2 sends first: it greets member 0 with a handshake as soon as it knows it (as
    // the kernel's WireGuard sends a keepalive once one is configured), so member 0 learns
    // where it is without any traffic, and answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while endpoint_of(peers[2].public_key) != peers[2].endpoint {
        assert!(
            std::time::Instant::now() < deadline,
            "member 0 never learned member 2's endpoint from its greeting"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(underlay.pings(2, vpn_ip(0)));
    assert!(underlay.pings(0, vpn_ip(2)));
    assert!(underlay.pings(0, vpn_ip(1)));
}

/// A TCP stream each way through the tunnel, both ends in their namespaces: the kernel hands
/// the tunnel super-packets (TSO), the tunnel segments, encrypts, and on the other side
/// coalesces the segments back (GSO writes). 16 MiB arrive intact, and the statistics count
/// them.
#[test]
fn tcp_streams_cross_the_tunnel_intact_both_ways() {
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};

    require_host();
    let underlay = underlay(2);
    let (tunnels, _) = mesh(&underlay, 2);
    assert!(underlay.pings(0, vpn_ip(1)));
    const LEN: usize = 16 << 20;
    let data: Vec<u8> = (0..LEN).map(|i| (i * 31 % 253) as u8).collect();
    for (from, to) in [(0, 1), (1, 0)] {
        let listener = netns::in_namespace(&underlay.members[to], move || {
            TcpListener::bind((vpn_ip(to), 7100)).unwrap()
        });
        let receiver = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(60)))
                .unwrap();
            let mut got = Vec::with_capacity(LEN);
            stream.read_to_end(&mut got).unwrap();
            got
        });
        let mut stream = netns::in_namespace(&underlay.members[from], move || {
            TcpStream::connect((vpn_ip(to), 7100)).unwrap()
        });
        let started = std::time::Instant::now();
        stream.write_all(&data).unwrap();
        drop(stream);
        let got = receiver.join().unwrap();
        eprintln!(
            "{} MiB from member {from} to member {to} in {:?}",
            LEN >> 20,
            started.elapsed()
        );
        assert!(
            got == data,
            "the stream arrived changed ({} bytes)",
            got.len()
        );
    }
    let stats = tunnels[0].stats().unwrap();
    assert!(
        stats[0].rx_bytes > LEN as u64 && stats[0].tx_bytes > LEN as u64,
        "{stats:?}"
    );
}
