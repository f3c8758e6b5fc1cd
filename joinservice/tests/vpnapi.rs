//! The mesh's side of the join service on the host: the peer API (`hawser.vpn.v1.VpnApi`)
//! served over loopback, where the member polling is the one whose VPN address is the
//! connection's source (here 127.0.0.1; another loopback source is a stranger), and
//! `hawser-joind`'s mesh flags; and the whole mesh in network namespaces (needs root, iproute2,
//! iputils-ping, /dev/net/tun).
//! Run with `cargo test -p hawser-joinservice --test vpnapi`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_joinservice::core::{JoinCore, JoinCoreConfig};
use hawser_joinservice::member;
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::store::{ClusterStore, FileStore, ReadConsistency};
use hawser_joinservice::tokens::KubeadmTokenIssuer;
use hawser_joinservice::vpn::{self, JoinServiceAddress, MeshSettings};
use hawser_joinservice::vpnapi::serve_vpn_api;
use hawser_keys::MasterSecret;
use hawser_mesh::agent::Agent;
use hawser_mesh::{Ipv4Net, MeshView, PeerStats, PeerUpdate, PrivateKey, PublicKey};
use hawser_mesh_device::netns;
use hawser_mesh_device::{Tunnel, TunnelConfig};
use hawser_proto::mesh::GrpcPeers;
use hawser_proto::vpn::GetPeersRequest;
use hawser_proto::vpn::vpn_api_client::VpnApiClient;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

fn key(n: u8) -> PublicKey {
    PublicKey::from_slice(&[n; 32]).unwrap()
}

fn measurements(dir: &Path) -> PathBuf {
    let path = dir.join("measurements.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"9": {{"expected": "{}", "warnOnly": false}}}}"#,
            "99".repeat(32)
        ),
    )
    .unwrap();
    path
}

/// A core with the mesh on 127.0.0.0/24: the node `NODE` at 127.0.0.1 (the loopback source
/// of the test's connections), the join service at the next free address.
fn core(dir: &Path) -> Arc<JoinCore> {
    let core = JoinCore::new(
        Arc::new(PolicyStore::load(&measurements(dir)).unwrap()),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: "/nonexistent".into(),
            kubeconfig: "/nonexistent".into(),
        }),
        JoinCoreConfig {
            master_secret: MasterSecret::new(vec![5; 32], vec![6; 32]).unwrap(),
            measurement_salt: vec![7; 32],
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(60),
            pki_dir: None,
            registry_file: dir.join("joined"),
        },
    )
    .unwrap();
    let prefix: Ipv4Net = "127.0.0.0/24".parse().unwrap();
    core.store()
        .update_vpn_registry(prefix, &mut |registry| {
            registry.admit(
                NODE,
                "worker-1",
                key(1),
                None,
                false,
                Some(Ipv4Addr::LOCALHOST),
            )?;
            Ok(())
        })
        .unwrap();
    let coordinator = vpn::admit_join_service(
        core.store().as_ref(),
        prefix,
        "joind",
        key(200),
        Some("192.0.2.1:51820".parse().unwrap()),
        JoinServiceAddress::Allocated,
    )
    .unwrap();
    Arc::new(core.with_mesh(MeshSettings {
        prefix,
        mtu: 1420,
        coordinator,
        vpn_api_port: 9091,
    }))
}

async fn client(addr: SocketAddr, source: Ipv4Addr) -> VpnApiClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .local_address(Some(source.into()))
        .connect()
        .await
        .unwrap();
    VpnApiClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_api_answers_the_member_at_the_source_address_and_records_its_poll() {
    let dir = tempfile::tempdir().unwrap();
    let core = core(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_vpn_api(Arc::clone(&core), listener, async {
        let _ = stopped.await;
    }));
    let mut node = client(addr, Ipv4Addr::LOCALHOST).await;

    // First poll: the whole mesh, and the node's statistics recorded as its heartbeat.
    let stats = PeerStats {
        public_key: key(200),
        endpoint: Some("192.0.2.1:51820".parse().unwrap()),
        last_handshake_unix: Some(1_700_000_000),
        rx_bytes: 1234,
        tx_bytes: 5678,
    };
    let answer = node
        .get_peers(GetPeersRequest {
            known_version: None,
            stats: vec![hawser_proto::mesh::stats_to_wire(&stats)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let update = hawser_proto::mesh::update_from_wire(&answer).unwrap();
    let PeerUpdate::Full { version, peers } = update else {
        panic!("a first poll gets the whole mesh: {update:?}");
    };
    assert_eq!(version, 2);
    let names: BTreeMap<_, _> = peers.iter().map(|p| (p.name.as_str(), p.vpn_ip)).collect();
    assert_eq!(
        names,
        BTreeMap::from([
            ("worker-1", Ipv4Addr::LOCALHOST),
            ("joind", Ipv4Addr::new(127, 0, 0, 2))
        ])
    );
    let polls = core.store().vpn_polls().unwrap();
    assert_eq!(polls[NODE].known_version, None);
    assert_eq!(polls[NODE].stats, vec![stats]);

    // Up to date: "current".
    let answer = node
        .get_peers(GetPeersRequest {
            known_version: Some(2),
            stats: vec![],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        hawser_proto::mesh::update_from_wire(&answer).unwrap(),
        PeerUpdate::Current { version: 2 }
    );
    assert_eq!(
        core.store().vpn_polls().unwrap()[NODE].known_version,
        Some(2)
    );

    // Malformed statistics: INVALID_ARGUMENT, and the last poll stays.
    let status = node
        .get_peers(GetPeersRequest {
            known_version: Some(2),
            stats: vec![hawser_proto::vpn::PeerStats {
                public_key: vec![1; 5],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("public key"),
        "{}",
        status.message()
    );

    // A source that is no member's VPN address: PERMISSION_DENIED naming it; nothing recorded.
    let stranger = Ipv4Addr::new(127, 0, 0, 3);
    let status = client(addr, stranger)
        .await
        .get_peers(GetPeersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("127.0.0.3"),
        "{}",
        status.message()
    );
    assert_eq!(core.store().vpn_polls().unwrap().len(), 1);

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// A provider CA certificate (any CA: this test never attests).
fn provider_ca(dir: &Path) -> PathBuf {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let path = dir.join("provider-ca.pem");
    std::fs::write(&path, params.self_signed(&ca_key).unwrap().pem()).unwrap();
    path
}

fn joind(dir: &Path, mesh: &[&str]) -> Command {
    joind_in(dir, None, mesh)
}

/// hawser-joind with the test's fixtures, in network namespace `ns` (`ip netns exec`), or, for
/// `None`, in a namespace of its own (util-linux's `unshare`) — with a mesh it starts a
/// WireGuard tunnel, never in the host's namespace.
fn joind_in(dir: &Path, ns: Option<&str>, mesh: &[&str]) -> Command {
    let master = dir.join("master-secret.json");
    if !master.exists() {
        MasterSecret::new(vec![5; 32], vec![6; 32])
            .unwrap()
            .write_new_file(&master)
            .unwrap();
    }
    let mut command = match ns {
        Some(ns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", ns]);
            command
        }
        None => {
            let mut command = Command::new("unshare");
            command.args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec \"$0\" \"$@\"",
            ]);
            command
        }
    };
    command
        .arg(env!("CARGO_BIN_EXE_hawser-joind"))
        .args(["--listen", "127.0.0.1:0", "--kubernetes-version", "v1.33.4"])
        .arg("--measurements")
        .arg(measurements(dir))
        .arg("--master-secret")
        .arg(&master)
        .arg("--provider-ca")
        .arg(provider_ca(dir))
        .arg("--state-dir")
        .arg(dir.join("joind"))
        .args(mesh)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Starts hawser-joind, waits until it listens, stops it; returns its log.
fn start_and_stop(mut command: Command) -> String {
    let mut joind = command.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(joind.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let _ = joind.kill();
    let output = joind.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(line.starts_with("listening on"), "{line}\n{log}");
    log
}

#[test]
fn hawser_joind_with_a_vpn_prefix_joins_its_own_mesh_with_a_private_key_it_keeps() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let mesh = [
        "--vpn-prefix",
        "10.99.0.0/24",
        "--vpn-endpoint",
        "192.0.2.1:51820",
        "--vpn-name",
        "joind-test",
    ];
    let log = start_and_stop(joind(dir.path(), &mesh));
    assert!(log.contains("WireGuard mesh on"), "{log}");
    assert!(
        log.contains("the join service's tunnel is up; the peer API listens inside it"),
        "{log}"
    );
    let key_file = dir.path().join("joind/vpn.key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let private_key = std::fs::read_to_string(&key_file).unwrap();
    assert!(
        !log.contains(private_key.trim()),
        "the private key was logged"
    );

    let store = FileStore::open(&dir.path().join("joind/joined-disks")).unwrap();
    let registry = store
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap();
    let me = registry.member("join-service/joind-test").unwrap().clone();
    assert_eq!(
        me.vpn_ip,
        Ipv4Addr::new(10, 99, 0, 1),
        "the reserved address"
    );
    assert!(me.coordinator);
    assert_eq!(me.endpoint, Some("192.0.2.1:51820".parse().unwrap()));

    // A restart keeps its key and its place: the registry does not change.
    start_and_stop(joind(dir.path(), &mesh));
    let again = store
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap();
    assert_eq!(again, registry);
}

#[test]
fn hawser_joind_refuses_bad_mesh_flags_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, says) in [
        (&["--vpn-prefix", "10.99.0.1/24"][..], "host bits"),
        (&["--vpn-prefix", "10.99.0.0/31"][..], "too small"),
        (
            &["--vpn-prefix", "10.99.0.0/24", "--vpn-mtu", "100"][..],
            "--vpn-mtu",
        ),
        (
            &["--vpn-prefix", "10.99.0.0/24", "--vpn-endpoint", "nowhere"][..],
            "--vpn-endpoint",
        ),
    ] {
        let output = joind(dir.path(), flags).output().unwrap();
        assert!(!output.status.success(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
    // A stored mesh on another prefix stops the start, naming both.
    let first = [
        "--vpn-prefix",
        "10.99.0.0/24",
        "--vpn-endpoint",
        "192.0.2.1:51820",
    ];
    start_and_stop(joind(dir.path(), &first));
    let other = [
        "--vpn-prefix",
        "10.98.0.0/24",
        "--vpn-endpoint",
        "192.0.2.1:51820",
    ];
    let output = joind(dir.path(), &other).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("10.99.0.0/24") && stderr.contains("10.98.0.0/24"),
        "{stderr}"
    );
}

/// A node of the end-to-end test: its tunnel and agent on a thread inside its namespace,
/// polling the join service's peer API through the mesh as PID 1 does (same agent, same gRPC
/// client), every 300 ms instead of ~10 s.
struct MeshNode {
    stop: Arc<AtomicBool>,
    version: Arc<Mutex<Option<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MeshNode {
    /// Starts node `id` (its registry entry must exist) in `ns`, with the peers of the registry
    /// as they are now (what its join ticket would carry).
    fn start(ns: &str, store: &FileStore, id: &str, key: PrivateKey) -> Self {
        let registry = store
            .vpn_registry(ReadConsistency::Latest)
            .unwrap()
            .unwrap();
        let own = registry.member(id).unwrap().clone();
        let ticket = registry.update_since(None);
        let prefix = registry.prefix();
        let stop = Arc::new(AtomicBool::new(false));
        let version = Arc::new(Mutex::new(None));
        let (started, ready) = std::sync::mpsc::channel();
        let thread = netns::spawn_in(ns, {
            let (stop, version) = (Arc::clone(&stop), Arc::clone(&version));
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let public_key = key.public_key();
                    let tunnel = Tunnel::start(TunnelConfig {
                        interface: "hawser0".into(),
                        private_key: key,
                        listen_port: hawser_mesh::DEFAULT_LISTEN_PORT,
                        address: own.vpn_ip,
                        prefix,
                        mtu: hawser_mesh::tunnel_mtu(1500),
                        threads: 1,
                        pod_routes: false,
                    })
                    .await
                    .unwrap();
                    let view = MeshView::new(public_key, own.vpn_ip, prefix);
                    let mut agent = Agent::new(view, tunnel);
                    agent.apply(&ticket).unwrap();
                    started.send(()).unwrap();
                    let mut source = GrpcPeers::new(9091);
                    while !stop.load(Ordering::SeqCst) {
                        if agent.poll(&mut source).await.is_ok() {
                            *version.lock().unwrap() = agent.view().version();
                        }
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                });
            }
        });
        ready.recv_timeout(Duration::from_secs(10)).unwrap();
        MeshNode {
            stop,
            version,
            thread: Some(thread),
        }
    }

    /// Waits until the node holds the registry's version `version`.
    fn wait_for_version(&self, version: u64, what: &str) {
        self.wait_for_version_within(version, what, Duration::from_secs(20));
    }

    /// [`MeshNode::wait_for_version`], waiting at most `within`.
    fn wait_for_version_within(&self, version: u64, what: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while *self.version.lock().unwrap() != Some(version) {
            assert!(
                Instant::now() < deadline,
                "{what}: the node is at {:?}, not at registry version {version}",
                self.version.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for MeshNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// hawser-joind, killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_joind(mut command: Command) -> Running {
    let mut child = command.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(
        line.starts_with("listening on"),
        "hawser-joind did not start: {line}"
    );
    Running(child)
}

fn random_key() -> PrivateKey {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    PrivateKey::from_random(bytes)
}

fn admit(store: &FileStore, prefix: Ipv4Net, id: &str, key: PublicKey, endpoint: SocketAddr) {
    store
        .update_vpn_registry(prefix, &mut |registry| {
            registry.admit(id, id, key, Some(endpoint), false, None)?;
            Ok(())
        })
        .unwrap();
}

fn registry_version(store: &FileStore) -> u64 {
    store
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap()
        .version()
}

/// The whole mesh on the host, each member in a network namespace the test creates: the real
/// `hawser-joind` with its own tunnel and the peer API inside it, and two nodes running PID 1's
/// agent and gRPC client on boringtun tunnels. Nodes enter the registry through the store, as
/// a join does (the join itself, with its aTLS, is tested in `tests/service.rs`).
///
/// Shows: node A learns of node B, which joined after it, by polling, and both reach each
/// other and the join service by VPN address; both report handshakes in their polls; B removed
/// from the registry is removed from A's tunnel (no traffic), and re-added, converges again;
/// with the join service down the mesh keeps working, and after it is back a member added
/// meanwhile reaches both nodes' views; after the join service moved to another underlay
/// address, both nodes converge again.
#[test]
fn nodes_converge_through_the_join_services_peer_api_inside_the_mesh() {
    netns::require_host();
    let underlay = netns::Underlay::new(3, 78);
    let dir = tempfile::tempdir().unwrap();
    let prefix: Ipv4Net = "10.78.0.0/24".parse().unwrap();
    let joind_endpoint = format!("{}:51820", underlay.ip(0));
    let mesh = [
        "--vpn-prefix",
        "10.78.0.0/24",
        "--vpn-endpoint",
        joind_endpoint.as_str(),
        "--vpn-name",
        "joind-e2e",
    ];
    let joind = start_joind(joind_in(dir.path(), Some(&underlay.members[0]), &mesh));
    let store = FileStore::open(&dir.path().join("joind/joined-disks")).unwrap();
    let joind_ip = Ipv4Addr::new(10, 78, 0, 1);

    let (key_a, key_b) = (random_key(), random_key());
    let (pub_a, pub_b) = (key_a.public_key(), key_b.public_key());
    let a_endpoint = SocketAddr::from((underlay.ip(1), hawser_mesh::DEFAULT_LISTEN_PORT));
    let b_endpoint = SocketAddr::from((underlay.ip(2), hawser_mesh::DEFAULT_LISTEN_PORT));
    admit(&store, prefix, "node-a", pub_a, a_endpoint);
    let node_a = MeshNode::start(&underlay.members[1], &store, "node-a", key_a);
    admit(&store, prefix, "node-b", pub_b, b_endpoint);
    let node_b = MeshNode::start(&underlay.members[2], &store, "node-b", key_b);
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 78, 0, 2), Ipv4Addr::new(10, 78, 0, 3));

    // A joined first: it learns of B by polling.
    node_a.wait_for_version(registry_version(&store), "A learns of B");
    assert!(underlay.pings(1, ip_b), "A reaches B by VPN address");
    assert!(underlay.pings(2, ip_a), "B reaches A by VPN address");
    assert!(underlay.pings(1, joind_ip), "A reaches the join service");
    assert!(underlay.pings(2, joind_ip), "B reaches the join service");

    // Their polls carry their tunnels' statistics: a handshake with each other.
    std::thread::sleep(Duration::from_secs(1));
    let polls = store.vpn_polls().unwrap();
    for (node, other) in [("node-a", pub_b), ("node-b", pub_a)] {
        let poll = polls
            .get(node)
            .unwrap_or_else(|| panic!("{node} never polled: {polls:?}"));
        let stats = poll.stats.iter().find(|s| s.public_key == other).unwrap();
        assert!(
            stats.last_handshake_unix.is_some() && stats.rx_bytes > 0,
            "{node}: {stats:?}"
        );
    }
    // The join service records its own tunnel's statistics too (give it a round).
    std::thread::sleep(member::FOLLOW_INTERVAL + Duration::from_secs(1));
    let polls = store.vpn_polls().unwrap();
    let own = polls
        .get("join-service/joind-e2e")
        .expect("the join service's own poll");
    assert!(
        own.stats
            .iter()
            .any(|s| s.public_key == pub_a && s.rx_bytes > 0),
        "{own:?}"
    );

    // B removed from the registry: A's tunnel drops it.
    store
        .update_vpn_registry(prefix, &mut |registry| {
            registry.remove("node-b");
            Ok(())
        })
        .unwrap();
    node_a.wait_for_version(registry_version(&store), "A learns B is gone");
    assert!(!underlay.ping(1, ip_b), "A still reaches a removed B");
    // Re-added (same key, same address): A converges again.
    admit(&store, prefix, "node-b", pub_b, b_endpoint);
    node_a.wait_for_version(registry_version(&store), "A learns B is back");
    assert!(underlay.pings(1, ip_b), "A reaches B after B was re-added");

    // The join service down: the mesh keeps running; a member added meanwhile is in both
    // nodes' views once the join service is back.
    drop(joind);
    std::thread::sleep(Duration::from_secs(1));
    assert!(underlay.pings(1, ip_b), "the mesh without its join service");
    let key_c = random_key();
    admit(
        &store,
        prefix,
        "node-c",
        key_c.public_key(),
        SocketAddr::from((underlay.ip(0), 51821)),
    );
    let joind = start_joind(joind_in(dir.path(), Some(&underlay.members[0]), &mesh));
    let version = registry_version(&store);
    node_a.wait_for_version(version, "A converges after the join service is back");
    node_b.wait_for_version(version, "B converges after the join service is back");

    // The join service moves to another underlay address (same key, same store). The nodes
    // still send to the old one; the join service's tunnel reaches them from the new one (its
    // keepalive, within 25 s: WireGuard follows an authenticated peer to its new address),
    // their polls get through again, and the registry carries the new endpoint.
    drop(joind);
    let ns0 = &underlay.members[0];
    let moved_ip = Ipv4Addr::new(192, 168, 78, 30);
    netns::must(&["ip", "-n", ns0, "addr", "flush", "dev", "eth0"]);
    netns::must(&[
        "ip",
        "-n",
        ns0,
        "addr",
        "add",
        &format!("{moved_ip}/24"),
        "dev",
        "eth0",
    ]);
    let moved_endpoint = format!("{moved_ip}:51820");
    let moved = [
        "--vpn-prefix",
        "10.78.0.0/24",
        "--vpn-endpoint",
        moved_endpoint.as_str(),
        "--vpn-name",
        "joind-e2e",
    ];
    let _joind = start_joind(joind_in(dir.path(), Some(ns0), &moved));
    let version = registry_version(&store);
    let joind_entry = store
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap()
        .member("join-service/joind-e2e")
        .unwrap()
        .clone();
    assert_eq!(joind_entry.endpoint, Some(moved_endpoint.parse().unwrap()));
    let moved_within = Duration::from_secs(90);
    node_a.wait_for_version_within(
        version,
        "A converges after the join service moved",
        moved_within,
    );
    node_b.wait_for_version_within(
        version,
        "B converges after the join service moved",
        moved_within,
    );
    assert!(
        underlay.pings(1, joind_ip),
        "A reaches the moved join service"
    );
    assert!(underlay.pings(2, ip_a), "B still reaches A");
}
