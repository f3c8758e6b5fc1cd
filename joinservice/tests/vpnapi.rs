//! The mesh's side of the join service on the host: the peer API (`hawser.vpn.v1.VpnApi`)
//! served over loopback, where the member polling is the one whose VPN address is the
//! connection's source (here 127.0.0.1; another loopback source is a stranger), and
//! `hawser-joind`'s mesh flags.
//! Run with `cargo test -p hawser-joinservice --test vpnapi`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hawser_joinservice::core::{JoinCore, JoinCoreConfig};
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::store::{ClusterStore, FileStore, ReadConsistency};
use hawser_joinservice::tokens::KubeadmTokenIssuer;
use hawser_joinservice::vpn::{self, JoinServiceAddress, MeshSettings};
use hawser_joinservice::vpnapi::serve_vpn_api;
use hawser_keys::MasterSecret;
use hawser_mesh::{Ipv4Net, PeerStats, PeerUpdate, PublicKey};
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
    let master = dir.join("master-secret.json");
    if !master.exists() {
        MasterSecret::new(vec![5; 32], vec![6; 32])
            .unwrap()
            .write_new_file(&master)
            .unwrap();
    }
    // With a mesh, hawser-joind starts a WireGuard tunnel: in a network namespace of its own
    // (util-linux's `unshare`), never on the host's.
    let mut command = Command::new("unshare");
    command
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\" \"$@\"",
        ])
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
