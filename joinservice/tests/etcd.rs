//! The join service's cluster state in a real etcd (Debian's `etcd-server` 3.4): members
//! started on loopback with TLS and client certificates laid out as kubeadm's stacked etcd
//! uses them, join-service cores on top, members stopped to prove what still works.
//! Run with `cargo test -p hawser-joinservice --test etcd`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hawser_joinservice::approvals::ApprovalStore;
use hawser_joinservice::core::{
    CONTROL_PLANE_FILES, JoinCore, JoinCoreConfig, JoinError, JoinRequest, RejoinRequest,
    VerifiedPeer,
};
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::store::{
    BindOutcome, ClusterStore, DiskBinding, EtcdConfig, EtcdStore, FileStore, ReadConsistency,
    StoreError, approval_key,
};
use hawser_joinservice::tokens::KubeadmTokenIssuer;
use hawser_keys::{MasterSecret, StateDiskKeyLength};
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType,
};
use tonic::Code;

/// The deadline of every etcd call in these tests: short, so lost quorum shows quickly.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// TLS material as kubeadm lays out stacked etcd's: a CA, a serving certificate for the
/// members, a client certificate for the API server (here: the join service).
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    fn generate(dir: &Path) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "etcd-ca");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        server
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_cert = server.signed_by(&server_key, &issuer).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-etcd-client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &issuer).unwrap();

        let pki = Self {
            ca: dir.join("etcd/ca.crt"),
            server_cert: dir.join("etcd/server.crt"),
            server_key: dir.join("etcd/server.key"),
            client_cert: dir.join("apiserver-etcd-client.crt"),
            client_key: dir.join("apiserver-etcd-client.key"),
        };
        std::fs::create_dir_all(dir.join("etcd")).unwrap();
        std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
        std::fs::write(&pki.server_cert, server_cert.pem()).unwrap();
        std::fs::write(&pki.server_key, server_key.serialize_pem()).unwrap();
        std::fs::write(&pki.client_cert, client_cert.pem()).unwrap();
        std::fs::write(&pki.client_key, client_key.serialize_pem()).unwrap();
        pki
    }
}

/// One etcd process; killed when dropped (also when a test panics).
struct Member {
    name: String,
    client_url: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Member {
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A cluster of etcd members on loopback, with its own PKI and data directories.
struct EtcdCluster {
    // Fields drop in order: the members are killed before their data directories go.
    members: Vec<Member>,
    pki: Pki,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn etcd_binary() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "etcd not found on PATH: install the Debian package etcd-server (scripts/setup-host)"
        )
    })
}

impl EtcdCluster {
    fn start(size: usize) -> Self {
        let etcd = etcd_binary();
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path());
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let initial_cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let client_url = format!("https://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = dir.path().join(format!("{name}.log"));
            let log_file = std::fs::File::create(&log).unwrap();
            let child = Command::new(&etcd)
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.path().join(&name))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial_cluster.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "hawser-test"])
                .arg("--cert-file")
                .arg(&pki.server_cert)
                .arg("--key-file")
                .arg(&pki.server_key)
                .arg("--trusted-ca-file")
                .arg(&pki.ca)
                .arg("--client-cert-auth")
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .unwrap();
            members.push(Member {
                name,
                client_url,
                child: Some(child),
                log,
            });
        }
        let cluster = Self {
            members,
            pki,
            _dir: dir,
        };
        cluster.wait_until_ready();
        cluster
    }

    fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    fn etcd_config(&self) -> EtcdConfig {
        EtcdConfig::from_files(
            self.endpoints(),
            &self.pki.ca,
            &self.pki.client_cert,
            &self.pki.client_key,
            CALL_TIMEOUT,
        )
        .unwrap()
    }

    /// Waits until a linearizable read succeeds (a leader is elected).
    fn wait_until_ready(&self) {
        let runtime = runtime();
        let store = runtime
            .block_on(EtcdStore::connect(self.etcd_config()))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match store.disk_binding("ready-probe", ReadConsistency::Latest) {
                Ok(_) => return,
                Err(e) if Instant::now() > deadline => {
                    let logs: String = self
                        .members
                        .iter()
                        .map(|m| {
                            format!(
                                "--- {}:\n{}\n",
                                m.name,
                                std::fs::read_to_string(&m.log).unwrap_or_default()
                            )
                        })
                        .collect();
                    panic!(
                        "etcd did not become ready: {}\n{logs}",
                        hawser_attestation::error_chain(&e)
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A join service's core over one store, with what tests need around it.
struct Node {
    core: JoinCore,
}

/// What every core of one cluster shares: the master secret, policy, PKI, token issuer.
struct ClusterFiles {
    dir: tempfile::TempDir,
    master: MasterSecret,
    policy: Arc<PolicyStore>,
}

impl ClusterFiles {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let measurements = dir.path().join("measurements.json");
        std::fs::write(
            &measurements,
            format!(
                r#"{{"9": {{"expected": "{}", "warnOnly": false}}}}"#,
                "99".repeat(32)
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("admin.conf"), "kind: Config\n").unwrap();
        for name in CONTROL_PLANE_FILES {
            let path = dir.path().join("pki").join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("content of {name}")).unwrap();
        }
        Self {
            policy: Arc::new(PolicyStore::load(&measurements).unwrap()),
            master: MasterSecret::new(vec![5; 32], vec![6; 32]).unwrap(),
            dir,
        }
    }

    fn config(&self, registry: &str) -> JoinCoreConfig {
        JoinCoreConfig {
            master_secret: self.master.clone(),
            measurement_salt: vec![7; 32],
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(3600),
            pki_dir: Some(self.dir.path().join("pki")),
            registry_file: self.dir.path().join(registry),
        }
    }

    fn tokens(&self) -> Arc<KubeadmTokenIssuer> {
        Arc::new(KubeadmTokenIssuer {
            kubeadm: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kubeadm-standin"),
            kubeconfig: self.dir.path().join("admin.conf"),
        })
    }

    fn node_on(&self, store: Arc<dyn ClusterStore>) -> Node {
        Node {
            core: JoinCore::with_cluster_store(
                Arc::clone(&self.policy),
                self.tokens(),
                self.config("unused"),
                store,
            ),
        }
    }

    fn node_on_files(&self, registry: &str) -> Node {
        Node {
            core: JoinCore::new(
                Arc::clone(&self.policy),
                self.tokens(),
                self.config(registry),
            )
            .unwrap(),
        }
    }
}

fn peer(ak_name: &[u8]) -> VerifiedPeer {
    VerifiedPeer {
        address: Some("127.0.0.1".parse().unwrap()),
        pcrs: BTreeMap::from([(9, [0x99; 32])]),
        ak_name: ak_name.to_vec(),
    }
}

fn join_request(uuid: &str, control_plane: bool) -> JoinRequest {
    JoinRequest {
        disk_uuid: uuid.to_owned(),
        node_name: "node-1".into(),
        is_control_plane: control_plane,
        ..JoinRequest::default()
    }
}

fn uuid(n: u32) -> String {
    format!("3f1c2d4e-5a6b-4c7d-8e9f-{n:012x}")
}

const AK: [u8; 34] = [0xa1; 34];
const OTHER_AK: [u8; 34] = [0xb2; 34];

fn connect(runtime: &tokio::runtime::Runtime, cluster: &EtcdCluster) -> Arc<EtcdStore> {
    Arc::new(
        runtime
            .block_on(EtcdStore::connect(cluster.etcd_config()))
            .unwrap(),
    )
}

#[test]
fn etcd_store_round_trips_bindings_and_approvals() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let store = connect(&runtime, &cluster);
    let ak = hex::encode(AK);
    let other = hex::encode(OTHER_AK);

    assert_eq!(
        store
            .disk_binding(&uuid(1), ReadConsistency::Latest)
            .unwrap(),
        None
    );
    assert_eq!(store.bind_disk(&uuid(1), &ak).unwrap(), BindOutcome::New);
    assert_eq!(store.bind_disk(&uuid(1), &ak).unwrap(), BindOutcome::Same);
    assert_eq!(
        store.bind_disk(&uuid(1), &other).unwrap(),
        BindOutcome::Another(ak.clone())
    );
    assert_eq!(
        store
            .disk_binding(&uuid(1), ReadConsistency::LatestOrLocal)
            .unwrap(),
        Some(DiskBinding::Bound(ak.clone()))
    );

    // Approvals: absent until imported; the import is put-if-absent.
    assert!(!store.approves_control_plane(&ak).unwrap());
    let written = store
        .import_control_plane_approvals([ak.as_str()], "test seed")
        .unwrap();
    assert_eq!(written, vec![ak.clone()]);
    assert!(store.approves_control_plane(&ak).unwrap());
    assert!(!store.approves_control_plane(&other).unwrap());
    let again = store
        .import_control_plane_approvals([ak.as_str(), other.as_str()], "test seed")
        .unwrap();
    assert_eq!(again, vec![other.clone()]);
    assert_eq!(
        store.approvals_location(&ak),
        format!(
            "etcd ({}) as key {}",
            cluster.endpoints().join(","),
            approval_key(&ak)
        )
    );
}

#[test]
fn fault_the_first_control_plane_rejoins_through_another_once_its_own_disk_is_bound() {
    // The first control plane's disk was made by `hawser init`, not by a join: no join
    // service bound it. Its join service binds it at start (`hawser-joind --own-disk`), so
    // that after a reboot it rejoins through any other control plane's join service.
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let first = files.node_on(connect(&runtime, &cluster));
    let second = files.node_on(connect(&runtime, &cluster));
    let own = uuid(5);
    let err = second
        .core
        .issue_rejoin_ticket(&peer(&AK), &own)
        .unwrap_err();
    assert!(matches!(err, JoinError::UnknownDisk(_)), "{err}");

    let bind = |ak: &[u8]| {
        runtime.block_on(hawser_joinservice::store::bind_own_disk(
            Arc::clone(first.core.store()),
            own.clone(),
            hex::encode(ak),
            Duration::from_millis(100),
        ))
    };
    assert_eq!(bind(&AK), BindOutcome::New);
    // Every start binds it again: the same AK is no change.
    assert_eq!(bind(&AK), BindOutcome::Same);
    let rejoin = second.core.issue_rejoin_ticket(&peer(&AK), &own).unwrap();
    let again = first.core.issue_rejoin_ticket(&peer(&AK), &own).unwrap();
    assert_eq!(*rejoin.state_disk_key, *again.state_disk_key);
    // Another TPM claiming the disk binds nothing, and its rejoin is refused.
    assert_eq!(bind(&OTHER_AK), BindOutcome::Another(hex::encode(AK)));
    let err = second
        .core
        .issue_rejoin_ticket(&peer(&OTHER_AK), &own)
        .unwrap_err();
    assert!(matches!(err, JoinError::AnotherAk { .. }), "{err}");
}

#[test]
fn fault_join_service_on_another_control_plane_sees_the_same_disks() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let first = files.node_on(connect(&runtime, &cluster));
    let second = files.node_on(connect(&runtime, &cluster));

    // A disk joins through the first control plane's join service ...
    let ticket = first
        .core
        .issue_join_ticket(&peer(&AK), &join_request(&uuid(7), false))
        .unwrap();
    // ... and rejoins through the second's, with the same key.
    let rejoin = second
        .core
        .issue_rejoin_ticket(&peer(&AK), &uuid(7))
        .unwrap();
    assert_eq!(*rejoin.state_disk_key, *ticket.state_disk_key);
    // A clone of it is refused by both.
    for node in [&first, &second] {
        let err = node
            .core
            .issue_rejoin_ticket(&peer(&OTHER_AK), &uuid(7))
            .unwrap_err();
        assert!(matches!(err, JoinError::AnotherAk { .. }), "{err}");
        let err = node
            .core
            .issue_join_ticket(&peer(&OTHER_AK), &join_request(&uuid(7), false))
            .unwrap_err();
        assert!(matches!(err, JoinError::AnotherAk { .. }), "{err}");
    }
    // An unknown disk is unknown to both.
    assert!(matches!(
        second.core.issue_rejoin_ticket(&peer(&AK), &uuid(8)),
        Err(JoinError::UnknownDisk(_))
    ));

    // An approval seeded through the first join service's store counts at the second.
    let err = second
        .core
        .issue_join_ticket(&peer(&AK), &join_request(&uuid(9), true))
        .unwrap_err();
    assert!(
        err.to_string().contains(&approval_key(&hex::encode(AK))),
        "{err}"
    );
    let seeder = connect(&runtime, &cluster);
    let approvals_file = files.dir.path().join("control-plane-approvals");
    std::fs::write(&approvals_file, format!("{}\n", hex::encode(AK))).unwrap();
    let approvals = ApprovalStore::load(&approvals_file).unwrap();
    seeder
        .import_control_plane_approvals(approvals.current().ak_names(), "seeded by test")
        .unwrap();
    let ticket = second
        .core
        .issue_join_ticket(&peer(&AK), &join_request(&uuid(9), true))
        .unwrap();
    assert_eq!(
        ticket.kubeadm.control_plane_files.map(|files| files.len()),
        Some(CONTROL_PLANE_FILES.len())
    );
}

#[test]
fn two_join_services_racing_to_bind_one_disk_bind_it_once() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let nodes = [
        Arc::new(files.node_on(connect(&runtime, &cluster))),
        Arc::new(files.node_on(connect(&runtime, &cluster))),
    ];
    for n in 0..10 {
        let disk = uuid(100 + n);
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [(0, AK), (1, OTHER_AK)]
            .into_iter()
            .map(|(i, ak)| {
                let node = Arc::clone(&nodes[i]);
                let barrier = Arc::clone(&barrier);
                let disk = disk.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    node.core
                        .issue_join_ticket(&peer(&ak), &join_request(&disk, false))
                        .map(|_| ())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|racer| racer.join().unwrap())
            .collect();
        let won = racers.iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "disk {disk}: {racers:?}");
        let lost = racers.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(matches!(lost, JoinError::AnotherAk { .. }), "{lost}");
    }
}

#[test]
fn fault_a_control_plane_down_joins_continue() {
    let mut cluster = EtcdCluster::start(3);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let node = files.node_on(connect(&runtime, &cluster));
    node.core
        .issue_join_ticket(&peer(&AK), &join_request(&uuid(1), false))
        .unwrap();

    cluster.members[0].stop();

    // A new disk still joins (2 of 3 members are a quorum) and an old one rejoins.
    node.core
        .issue_join_ticket(&peer(&OTHER_AK), &join_request(&uuid(2), false))
        .unwrap();
    node.core.issue_rejoin_ticket(&peer(&AK), &uuid(1)).unwrap();
    // A join service connected after the failure, too.
    let late = files.node_on(connect(&runtime, &cluster));
    late.core
        .issue_rejoin_ticket(&peer(&OTHER_AK), &uuid(2))
        .unwrap();
}

#[test]
fn fault_etcd_quorum_lost_rejoin_still_works() {
    let mut cluster = EtcdCluster::start(3);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let node = files.node_on(connect(&runtime, &cluster));
    node.core
        .issue_join_ticket(&peer(&AK), &join_request(&uuid(1), false))
        .unwrap();

    cluster.members[0].stop();
    cluster.members[1].stop();

    // A new disk must be written: refused, naming etcd and its endpoints, as UNAVAILABLE
    // (the node retries).
    let err = node
        .core
        .issue_join_ticket(&peer(&OTHER_AK), &join_request(&uuid(2), false))
        .unwrap_err();
    let chain = hawser_attestation::error_chain(&err);
    assert!(
        matches!(&err, JoinError::Store(e) if e.is_unavailable()),
        "{chain}"
    );
    assert!(
        chain.contains("etcd") && chain.contains(&cluster.endpoints().join(",")),
        "{chain}"
    );
    assert_eq!(
        hawser_joinservice::service::status_of(&err).code(),
        Code::Unavailable
    );
    // The rejoin reads its binding serializably from the member left.
    let rejoin = node.core.issue_rejoin_ticket(&peer(&AK), &uuid(1)).unwrap();
    assert_eq!(
        *rejoin.state_disk_key,
        *files
            .master
            .state_disk_key(&uuid(1), StateDiskKeyLength::Xts)
            .unwrap()
    );
    // Still no clone gets through, and an unknown disk stays unknown.
    assert!(matches!(
        node.core.issue_rejoin_ticket(&peer(&OTHER_AK), &uuid(1)),
        Err(JoinError::AnotherAk { .. })
    ));
    assert!(matches!(
        node.core.issue_rejoin_ticket(&peer(&AK), &uuid(3)),
        Err(JoinError::UnknownDisk(_))
    ));
}

#[test]
fn etcd_unreachable_fails_closed_naming_etcd_and_the_endpoints() {
    let mut cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let store = connect(&runtime, &cluster);
    cluster.members[0].stop();
    let started = Instant::now();
    let err = store.bind_disk(&uuid(1), &hex::encode(AK)).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Etcd { .. } | StoreError::EtcdTimeout { .. }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&cluster.members[0].client_url),
        "{err}"
    );
    // No hang: every call has its deadline (and a few for the serializable fallback).
    assert!(
        store
            .disk_binding(&uuid(1), ReadConsistency::LatestOrLocal)
            .is_err()
    );
    assert!(
        started.elapsed() < CALL_TIMEOUT * 5,
        "{:?}",
        started.elapsed()
    );
}

/// The cost of one join decision's store work, and of a whole join decision (the kubeadm
/// stand-in runs in both), with the file backend and with a one-member etcd on loopback.
/// Prints the numbers docs/cluster-state.md quotes; asserts only that every decision worked.
#[test]
fn join_decision_cost_etcd_vs_files() {
    const N: u32 = 50;
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let stores: [(&str, Arc<dyn ClusterStore>); 2] = [
        (
            "files",
            Arc::new(FileStore::open(&files.dir.path().join("bench-registry")).unwrap()),
        ),
        ("etcd", connect(&runtime, &cluster)),
    ];
    let ak = hex::encode(AK);
    for (name, store) in &stores {
        let started = Instant::now();
        for n in 0..N {
            let disk = uuid(1000 + n);
            assert_eq!(
                store.disk_binding(&disk, ReadConsistency::Latest).unwrap(),
                None
            );
            assert_eq!(store.bind_disk(&disk, &ak).unwrap(), BindOutcome::New);
        }
        let store_work = started.elapsed() / N;
        let node = match *name {
            "files" => files.node_on_files("bench-joins"),
            _ => files.node_on(Arc::clone(store)),
        };
        let started = Instant::now();
        for n in 0..N {
            node.core
                .issue_join_ticket(&peer(&AK), &join_request(&uuid(2000 + n), false))
                .unwrap();
        }
        let decision = started.elapsed() / N;
        println!(
            "join decision cost, {name}: store read + bind {store_work:?}, whole decision (kubeadm stand-in included) {decision:?}"
        );
    }
}

/// `hawser-joind --etcd-endpoints … --etcd-ca … --etcd-cert … --etcd-key …` keeps its state in
/// etcd: the approvals file it is given is imported there at start (and a second start does not
/// write it again).
#[test]
fn hawser_joind_with_etcd_flags_imports_the_approvals_into_etcd() {
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let store = connect(&runtime, &cluster);
    let files = ClusterFiles::new();
    let dir = files.dir.path();
    let master = dir.join("master-secret.json");
    files.master.write_new_file(&master).unwrap();
    let provider_ca = dir.join("provider-ca.pem");
    std::fs::write(&provider_ca, std::fs::read(&cluster.pki.ca).unwrap()).unwrap();
    let approvals = dir.join("control-plane-approvals");
    std::fs::write(&approvals, format!("{}  # cp-2\n", hex::encode(AK))).unwrap();
    assert!(!store.approves_control_plane(&hex::encode(AK)).unwrap());

    for start in ["first", "second"] {
        let mut joind = Command::new(env!("CARGO_BIN_EXE_hawser-joind"))
            .args(["--listen", "127.0.0.1:0", "--kubernetes-version", "v1.33.4"])
            .arg("--measurements")
            .arg(dir.join("measurements.json"))
            .arg("--master-secret")
            .arg(&master)
            .arg("--provider-ca")
            .arg(&provider_ca)
            .arg("--state-dir")
            .arg(dir.join("joind"))
            .arg("--control-plane-approvals")
            .arg(&approvals)
            .args(["--etcd-endpoints", &cluster.endpoints().join(",")])
            .arg("--etcd-ca")
            .arg(&cluster.pki.ca)
            .arg("--etcd-cert")
            .arg(&cluster.pki.client_cert)
            .arg("--etcd-key")
            .arg(&cluster.pki.client_key)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(joind.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        // The import runs in the background (it is retried while etcd has no quorum): wait
        // for its log line.
        let stderr = joind.stderr.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut log = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !log.contains("imported into etcd where absent") && Instant::now() < deadline {
            if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
                log.push_str(&line);
                log.push('\n');
            }
        }
        let _ = joind.kill();
        let _ = joind.wait();
        assert!(
            line.starts_with("listening on"),
            "{start} start: {line}\n{log}"
        );
        assert!(log.contains("cluster state in etcd"), "{log}");
        let imported = if start == "first" { 1 } else { 0 };
        assert!(log.contains(&format!("imported={imported}")), "{log}");
        assert!(store.approves_control_plane(&hex::encode(AK)).unwrap());
    }
}

#[test]
fn hawser_joind_refuses_etcd_endpoints_without_the_client_certificate() {
    let output = Command::new(env!("CARGO_BIN_EXE_hawser-joind"))
        .args([
            "--measurements",
            "m",
            "--master-secret",
            "s",
            "--provider-ca",
            "p",
        ])
        .args(["--kubernetes-version", "v1.33.4"])
        .args(["--etcd-endpoints", "https://127.0.0.1:2379"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--etcd-ca"), "{stderr}");
}

#[test]
fn two_join_services_racing_to_admit_vpn_members_lose_no_admission() {
    use hawser_joinservice::store::{PollStatus, VPN_REGISTRY_KEY};
    use hawser_mesh::{Ipv4Net, PeerStats, PublicKey};
    let cluster = EtcdCluster::start(1);
    let runtime = runtime();
    let stores = [connect(&runtime, &cluster), connect(&runtime, &cluster)];
    let prefix: Ipv4Net = "10.99.0.0/24".parse().unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = (0..2u8)
        .map(|i| {
            let store = Arc::clone(&stores[usize::from(i)]);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                for n in 0..10u8 {
                    let id = uuid(u32::from(i) * 100 + u32::from(n));
                    let key = PublicKey::from_slice(&[i * 100 + n + 1; 32]).unwrap();
                    store
                        .update_vpn_registry(prefix, &mut |registry| {
                            registry.admit(&id, &id, key, None, false, None)?;
                            Ok(())
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for racer in racers {
        racer.join().unwrap();
    }
    let registry = stores[0]
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap();
    assert_eq!(registry.members().count(), 20);
    assert_eq!(registry.version(), 20);
    let addresses: std::collections::BTreeSet<_> =
        registry.members().map(|(_, peer)| peer.vpn_ip).collect();
    assert_eq!(addresses.len(), 20, "two members share an address");

    // A refused change writes nothing; another prefix is refused naming both.
    let taken = PublicKey::from_slice(&[1; 32]).unwrap();
    let error = stores[1]
        .update_vpn_registry(prefix, &mut |registry| {
            registry.admit("intruder", "intruder", taken, None, false, None)?;
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(error, StoreError::Mesh(_)), "{error}");
    let other: Ipv4Net = "10.98.0.0/24".parse().unwrap();
    let error = stores[1]
        .update_vpn_registry(other, &mut |_| Ok(()))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("10.99.0.0/24") && message.contains("10.98.0.0/24"),
        "{message}"
    );
    assert_eq!(
        stores[1].vpn_registry(ReadConsistency::Latest).unwrap(),
        Some(registry)
    );
    assert!(VPN_REGISTRY_KEY.starts_with("/hawser/v1/vpn/"));

    // Polls: one key per node, the last one wins.
    let stats = PeerStats {
        public_key: taken,
        endpoint: Some("192.0.2.1:51820".parse().unwrap()),
        last_handshake_unix: Some(1_700_000_000),
        rx_bytes: 10,
        tx_bytes: 20,
    };
    for unix_time in [1, 2] {
        stores[unix_time % 2]
            .record_vpn_poll(
                &uuid(1),
                &PollStatus {
                    unix_time: unix_time as u64,
                    known_version: Some(20),
                    stats: vec![stats.clone()],
                },
            )
            .unwrap();
    }
    stores[0]
        .record_vpn_poll(
            "join-service/cp-1",
            &PollStatus {
                unix_time: 3,
                known_version: None,
                stats: vec![],
            },
        )
        .unwrap();
    let polls = stores[1].vpn_polls().unwrap();
    assert_eq!(polls.len(), 2);
    assert_eq!(polls[&uuid(1)].unix_time, 2);
    assert_eq!(polls[&uuid(1)].stats, vec![stats]);
    assert_eq!(polls["join-service/cp-1"].known_version, None);
}

#[test]
fn fault_etcd_quorum_lost_a_rejoin_keeps_its_vpn_address_and_polls_are_answered_from_the_member_left()
 {
    use hawser_joinservice::vpn::{self, JoinServiceAddress, MeshSettings, PeerApiError};
    use hawser_mesh::{Ipv4Net, PeerUpdate, PublicKey};
    let mut cluster = EtcdCluster::start(3);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let store = connect(&runtime, &cluster);
    let prefix: Ipv4Net = "10.99.0.0/24".parse().unwrap();
    let coordinator = vpn::admit_join_service(
        store.as_ref(),
        prefix,
        "cp-1",
        PublicKey::from_slice(&[200; 32]).unwrap(),
        Some("192.0.2.1:51820".parse().unwrap()),
        JoinServiceAddress::Allocated,
    )
    .unwrap();
    assert_eq!(
        coordinator.vpn_ip.to_string(),
        "10.99.0.2",
        "not the reserved .1"
    );
    let coordinator_ip = coordinator.vpn_ip;
    let node = Node {
        core: files.node_on(store).core.with_mesh(MeshSettings {
            prefix,
            mtu: 1420,
            coordinator,
            vpn_api_port: 9091,
        }),
    };
    let request = JoinRequest {
        vpn_public_key: vec![1; 32],
        vpn_endpoint: "192.0.2.10:51820".into(),
        ..join_request(&uuid(1), false)
    };
    let joined = node
        .core
        .issue_join_ticket(&peer(&AK), &request)
        .unwrap()
        .vpn
        .unwrap();
    assert_eq!(joined.node.vpn_ip.to_string(), "10.99.0.3");
    node.core
        .get_peers(joined.node.vpn_ip, None, vec![])
        .unwrap();

    cluster.members[0].stop();
    cluster.members[1].stop();

    // The rejoin gets its mesh from the member left; its new endpoint cannot be recorded now.
    let rejoin = node
        .core
        .issue_rejoin_ticket_at(
            &peer(&AK),
            &RejoinRequest {
                disk_uuid: uuid(1),
                vpn_endpoint: "192.0.2.99:51820".into(),
                ..RejoinRequest::default()
            },
        )
        .unwrap()
        .vpn
        .unwrap();
    assert_eq!(rejoin.node.vpn_ip, joined.node.vpn_ip);
    assert_eq!(rejoin.registry_version, joined.registry_version);
    assert_eq!(rejoin.node.endpoint, joined.node.endpoint);
    // A poll is answered from the member left (the control planes' etcd members reach each
    // other through this mesh: a mesh that waited for quorum would never form again after a
    // whole-cluster restart); it cannot be recorded now, and that does not fail it.
    let update = node
        .core
        .get_peers(joined.node.vpn_ip, None, vec![])
        .unwrap();
    assert_eq!(update.version(), joined.registry_version);
    let PeerUpdate::Full { peers, .. } = &update else {
        panic!("a poll with no known version gets the whole set: {update:?}");
    };
    assert!(
        peers.iter().any(|p| p.vpn_ip == coordinator_ip),
        "{peers:?}"
    );
    // A poller that is no member is still refused.
    let error = node
        .core
        .get_peers("10.99.0.77".parse().unwrap(), None, vec![])
        .unwrap_err();
    assert!(
        matches!(&error, PeerApiError::UnknownSource { .. }),
        "{error}"
    );
    assert_eq!(
        hawser_joinservice::vpnapi::status_of(&error).code(),
        Code::PermissionDenied
    );
    // A new node is not admitted, and takes no address.
    let error = node
        .core
        .issue_join_ticket(
            &peer(&OTHER_AK),
            &JoinRequest {
                vpn_public_key: vec![2; 32],
                ..join_request(&uuid(2), false)
            },
        )
        .unwrap_err();
    assert_eq!(
        hawser_joinservice::service::status_of(&error).code(),
        Code::Unavailable
    );
}

/// Releases and revocations in etcd: written through one join service's store, seen by
/// another's (the first release seeded once), readable from the member left while quorum is
/// lost, and a revoked AK refused by both join services, naming the revocation.
#[test]
fn releases_and_revocations_are_shared_through_etcd_and_survive_a_lost_quorum() {
    use hawser_joinservice::store::releases::{self, Release};
    use hawser_joinservice::store::revocations::{self, Revocation};
    let mut cluster = EtcdCluster::start(3);
    let runtime = runtime();
    let files = ClusterFiles::new();
    let one = files.node_on(connect(&runtime, &cluster));
    let two = files.node_on(connect(&runtime, &cluster));
    let own = one.core.policy().current().measurements;
    let first = Release::new("image-first", &own, None, "first control plane", 1).unwrap();
    assert!(releases::seed(one.core.store().as_ref(), &first).unwrap());
    let again = Release::new("image-again", &own, None, "second control plane", 2).unwrap();
    assert!(!releases::seed(two.core.store().as_ref(), &again).unwrap());
    let listed = releases::list(two.core.store().as_ref(), ReadConsistency::Latest).unwrap();
    assert_eq!(listed, vec![first.clone()]);

    one.core
        .issue_join_ticket(&peer(&AK), &join_request(&uuid(1), false))
        .unwrap();
    revocations::revoke(
        two.core.store().as_ref(),
        &Revocation {
            ak_name: hex::encode(AK),
            disk_uuid: Some(uuid(1)),
            node: "node-2".into(),
            reason: "test".into(),
            revoked_unix: 3,
            readmitted_unix: None,
        },
    )
    .unwrap();
    for node in [&one, &two] {
        let err = node
            .core
            .issue_rejoin_ticket(&peer(&AK), &uuid(1))
            .unwrap_err();
        assert!(matches!(err, JoinError::Revoked { .. }), "{err}");
    }

    cluster.members[0].stop();
    cluster.members[1].stop();
    let local = releases::list(one.core.store().as_ref(), ReadConsistency::LatestOrLocal).unwrap();
    assert_eq!(local, vec![first]);
    let err = one
        .core
        .issue_rejoin_ticket(&peer(&AK), &uuid(1))
        .unwrap_err();
    assert!(
        hawser_attestation::error_chain(&err).contains("was revoked by the cluster's admin: test"),
        "{err}"
    );
}
