//! The join service end to end on the host: real swtpm TPMs provisioned by the harness's
//! provider CA, nodes attesting over aTLS with the TPM issuer, tonic's JoinServiceClient on
//! top, and the core issuing tokens through the kubeadm stand-in.
//! Run with `cargo test -p hawser-joinservice --test service`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy};
use hawser_attestation::evidence::EvidenceIssuer;
use hawser_attestation::{Tpm, TpmIssuer};
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_joinservice::approvals::ApprovalStore;
use hawser_joinservice::core::{CONTROL_PLANE_FILES, JoinCore, JoinCoreConfig};
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::service::{self, RunningService, ServiceConfig};
use hawser_joinservice::tokens::KubeadmTokenIssuer;
use hawser_joinservice::vpn;
use hawser_keys::MasterSecret;
use hawser_mesh::PublicKey;
use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, extend_sha256, phase_digest};
use hawser_proto::join::join_service_client::JoinServiceClient;
use hawser_proto::join::{IssueJoinTicketRequest, IssueRejoinTicketRequest};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const UUID: &str = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

/// A booted node: a provisioned swtpm (PCR 11 extended with enter-initrd if `booted`).
struct Node {
    issuer: Arc<TpmIssuer>,
    pcrs: BTreeMap<u8, [u8; 32]>,
    // Last: the TPM connection inside the issuer closes before swtpm is killed.
    _swtpm: Swtpm,
}

fn node(ca: &ProviderCa, booted: bool) -> Node {
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"));
    ca.provision(&swtpm).expect("provider provisions the TPM");
    let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open swtpm");
    if booted {
        tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
            .expect("extend enter-initrd");
    }
    let pcrs = tpm.read_pcrs_sha256(0..=23).expect("read PCRs");
    let issuer = TpmIssuer::new(Arc::new(tpm)).expect("issuer");
    Node {
        issuer: Arc::new(issuer),
        pcrs,
        _swtpm: swtpm,
    }
}

fn booted_pcr11() -> [u8; 32] {
    extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD))
}

fn measurements_json(pcr11: [u8; 32]) -> String {
    format!(
        r#"{{"4": {{"expected": "{}", "warnOnly": false}},
            "11": {{"expected": "{}", "warnOnly": false}},
            "0": {{"expected": "{}", "warnOnly": true}}}}"#,
        "00".repeat(32),
        hex::encode(pcr11),
        "ab".repeat(32)
    )
}

fn standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubeadm-standin")
}

/// A join service over a fresh master secret, expecting a booted node's PCRs, with a PKI
/// directory for control-plane joins and an approvals file that does not exist yet.
struct Fixture {
    dir: tempfile::TempDir,
    ca: ProviderCa,
    master: MasterSecret,
    measurements: PathBuf,
    approvals: PathBuf,
    service: Option<RunningService>,
    addr: SocketAddr,
}

impl Fixture {
    async fn start(adjust: impl FnOnce(&mut ServiceConfig, &Path)) -> Fixture {
        Self::start_meshed(None, adjust).await
    }

    /// [`Fixture::start`] with the WireGuard mesh on `mesh_prefix` (the join service admitted
    /// at the reserved address, endpoint 192.0.2.1:51820).
    async fn start_meshed(
        mesh_prefix: Option<&str>,
        adjust: impl FnOnce(&mut ServiceConfig, &Path),
    ) -> Fixture {
        // The service's logs (audit lines included) in the test's captured output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = ProviderCa::generate("test provider").expect("CA");
        let master = MasterSecret::generate().expect("master secret");
        let measurements = dir.path().join("measurements.json");
        std::fs::write(&measurements, measurements_json(booted_pcr11())).expect("write");
        let kubeconfig = dir.path().join("admin.conf");
        std::fs::write(&kubeconfig, "kind: Config\n").expect("write");
        let policy = Arc::new(PolicyStore::load(&measurements).expect("policy"));
        let pki_dir = dir.path().join("pki");
        for name in CONTROL_PLANE_FILES {
            let path = pki_dir.join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, format!("content of {name}")).expect("write");
        }
        let approvals = dir.path().join("control-plane-approvals");
        let core = JoinCore::new(
            policy,
            Arc::new(KubeadmTokenIssuer {
                kubeadm: standin(),
                kubeconfig,
            }),
            JoinCoreConfig {
                master_secret: master.clone(),
                measurement_salt: b"salt".to_vec(),
                kubernetes_version: "v1.33.4".into(),
                token_ttl: Duration::from_secs(600),
                pki_dir: Some(pki_dir),
                registry_file: dir.path().join("joined"),
            },
        )
        .expect("core")
        .with_control_plane_approvals(Arc::new(
            ApprovalStore::load(&approvals).expect("approvals"),
        ));
        let core = match mesh_prefix {
            None => core,
            Some(prefix) => {
                let prefix = prefix.parse().expect("prefix");
                let coordinator = vpn::admit_join_service(
                    core.store().as_ref(),
                    prefix,
                    "joind",
                    PublicKey::from_slice(&[200; 32]).expect("key"),
                    Some("192.0.2.1:51820".parse().expect("endpoint")),
                    vpn::JoinServiceAddress::Reserved,
                )
                .expect("the join service joins its mesh");
                core.with_mesh(vpn::MeshSettings {
                    prefix,
                    mtu: 1420,
                    coordinator,
                    vpn_api_port: 9091,
                })
            }
        };
        let mut config = ServiceConfig::new(
            "127.0.0.1:0".parse().expect("addr"),
            Arc::new(core),
            ca.certificate_pem(),
        );
        config.rate_per_sec = 1000.0;
        config.burst = 1000;
        config.policy_poll = Duration::from_millis(100);
        adjust(&mut config, dir.path());
        let service = service::spawn(config).await.expect("service starts");
        let addr = service.local_addr;
        Fixture {
            dir,
            ca,
            master,
            measurements,
            approvals,
            service: Some(service),
            addr,
        }
    }

    /// An aTLS channel from `node` (the node attests; the service does not).
    async fn connect(&self, node: &Node) -> Result<Channel, String> {
        let client = AtlsClient::new(
            Identity::attested(Arc::clone(&node.issuer) as Arc<dyn EvidenceIssuer>),
            PeerPolicy::Unauthenticated,
        );
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .connect_with_connector(client.connector())
            .await
            .map_err(|e| error_chain(&e))
    }

    async fn client(&self, node: &Node) -> JoinServiceClient<Channel> {
        JoinServiceClient::new(self.connect(node).await.expect("node connects"))
    }

    async fn stop(mut self) {
        if let Some(service) = self.service.take() {
            service.shutdown().await;
        }
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

fn join_request(uuid: &str) -> IssueJoinTicketRequest {
    IssueJoinTicketRequest {
        disk_uuid: uuid.into(),
        node_name: "worker-1".into(),
        is_control_plane: false,
        kubelet_csr: Vec::new(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_genuine_node_joins_and_bad_requests_get_clear_statuses() {
    let f = Fixture::start(|_, _| {}).await;
    let node = node(&f.ca, true);
    let mut client = f.client(&node).await;

    // The genuine node receives exactly the key derived for its disk.
    let ticket = client
        .issue_join_ticket(join_request(&UUID.to_uppercase()))
        .await
        .expect("join granted")
        .into_inner();
    assert_eq!(
        ticket.state_disk_key,
        &f.master
            .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
            .unwrap()[..]
    );
    assert_eq!(
        ticket.measurement_secret,
        &f.master.measurement_secret()[..]
    );
    assert_eq!(ticket.measurement_salt, b"salt");
    assert_eq!(ticket.api_server_endpoint, "10.42.0.1:6443");
    assert!(
        ticket
            .bootstrap_token
            .parse::<hawser_kube_types::BootstrapToken>()
            .is_ok(),
        "{}",
        ticket.bootstrap_token.len()
    );
    assert_eq!(ticket.kubernetes_version, "v1.33.4");
    assert_eq!(node.pcrs[&11], booted_pcr11());

    // It can rejoin with its disk; the key is the same.
    let rejoin = client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: UUID.into(),
            ..Default::default()
        })
        .await
        .expect("rejoin granted")
        .into_inner();
    assert_eq!(rejoin.state_disk_key, ticket.state_disk_key);

    // A disk that never joined: NOT_FOUND, naming the disk.
    let other = "00000000-1111-4222-8333-444444444444";
    let status = client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: other.into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown disk refused");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains(other), "{}", status.message());

    // A malformed UUID: INVALID_ARGUMENT, naming it.
    let status = client
        .issue_join_ticket(join_request("not-a-uuid"))
        .await
        .expect_err("malformed UUID refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("not-a-uuid"),
        "{}",
        status.message()
    );

    // A malformed node name: INVALID_ARGUMENT.
    let mut bad_name = join_request(UUID);
    bad_name.node_name = "Worker_1".into();
    let status = client
        .issue_join_ticket(bad_name)
        .await
        .expect_err("bad name");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("node name"),
        "{}",
        status.message()
    );

    // An oversize message: a clear status from the server, and the connection still serves.
    let mut oversize = join_request(UUID);
    oversize.kubelet_csr = vec![b'A'; service::MAX_REQUEST_BYTES + 1];
    let status = client
        .issue_join_ticket(oversize)
        .await
        .expect_err("oversize refused");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("too large"),
        "{}",
        status.message()
    );
    client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: UUID.into(),
            ..Default::default()
        })
        .await
        .expect("the service keeps serving after bad requests");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_wrong_pcr_is_refused_naming_the_pcr() {
    let f = Fixture::start(|_, _| {}).await;
    // PCR 11 never extended: not what a booted image measures.
    let wrong = node(&f.ca, false);
    let err = f
        .connect(&wrong)
        .await
        .expect_err("the handshake refuses the node");
    assert!(
        err.contains("refused our attestation") && err.contains("PCR 11"),
        "{err}"
    );
    assert!(
        err.contains(&hex::encode(booted_pcr11())),
        "expected value named: {err}"
    );
    assert!(err.contains(&"00".repeat(32)), "actual value named: {err}");

    // The service still serves a genuine node.
    let genuine = node(&f.ca, true);
    f.client(&genuine)
        .await
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("genuine node joins");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_changed_at_runtime_judges_the_next_join() {
    let f = Fixture::start(|_, _| {}).await;
    let node = node(&f.ca, true);
    let mut client = f.client(&node).await;
    client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("join under the first policy");

    // The image changed: PCR 11 now expects another value.
    let new_pcr11 = [0x5a; 32];
    std::fs::write(&f.measurements, measurements_json(new_pcr11)).expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;

    // On the open connection, the core judges the call by the new policy.
    let status = client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect_err("refused under the new policy");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("PCR 11") && status.message().contains(&hex::encode(new_pcr11)),
        "{}",
        status.message()
    );
    let status = client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: UUID.into(),
            ..Default::default()
        })
        .await
        .expect_err("rejoin refused under the new policy");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // A new connection meets the rebuilt validator in the handshake.
    let err = f.connect(&node).await.expect_err("handshake refused");
    assert!(
        err.contains("PCR 11") && err.contains(&hex::encode(new_pcr11)),
        "{err}"
    );

    // A bad file is rejected and the policy in force stays.
    std::fs::write(&f.measurements, "{not json").expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        f.connect(&node).await.is_err(),
        "the new policy stays in force"
    );

    // Back to the booted image's value: new connections and calls are admitted again.
    std::fs::write(&f.measurements, measurements_json(booted_pcr11())).expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    f.client(&node)
        .await
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("join under the restored policy");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_over_its_rate_limit_gets_resource_exhausted_with_a_retry_hint() {
    let f = Fixture::start(|config, _| {
        config.rate_per_sec = 0.5;
        config.burst = 2;
    })
    .await;
    let node = node(&f.ca, true);
    let mut client = f.client(&node).await;
    for _ in 0..2 {
        client
            .issue_join_ticket(join_request(UUID))
            .await
            .expect("within the burst");
    }
    let status = client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("retry in"),
        "{}",
        status.message()
    );
    let retry_ms: u64 = status
        .metadata()
        .get("retry-after-ms")
        .expect("retry hint")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("milliseconds");
    assert!((1..=2000).contains(&retry_ms), "{retry_ms}");
    tokio::time::sleep(Duration::from_millis(retry_ms + 50)).await;
    client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("served again after the hinted delay");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_calls_hit_the_deadline_and_token_failures_are_unavailable() {
    // kubeadm that takes 3 s: the call's 500 ms deadline ends it.
    let f = Fixture::start(|config, dir| {
        let slow = dir.join("slow-kubeadm");
        std::fs::write(
            &slow,
            format!("#!/bin/sh\nsleep 3\nexec {} \"$@\"\n", standin().display()),
        )
        .expect("write");
        set_executable(&slow);
        config.call_timeout = Duration::from_millis(500);
    })
    .await;
    // The fixture's core uses the stand-in directly; build one with the slow kubeadm instead.
    let slow_core = core_with_kubeadm(&f, &f.dir.path().join("slow-kubeadm"), true);
    let mut config = ServiceConfig::new(
        "127.0.0.1:0".parse().expect("addr"),
        Arc::new(slow_core),
        f.ca.certificate_pem(),
    );
    config.call_timeout = Duration::from_millis(500);
    let slow = service::spawn(config).await.expect("slow service");
    let node = node(&f.ca, true);
    let client = AtlsClient::new(
        Identity::attested(Arc::clone(&node.issuer) as Arc<dyn EvidenceIssuer>),
        PeerPolicy::Unauthenticated,
    );
    let channel = Endpoint::from_shared(format!("http://{}", slow.local_addr))
        .expect("endpoint")
        .connect_with_connector(client.connector())
        .await
        .expect("connect");
    let started = Instant::now();
    let status = JoinServiceClient::new(channel)
        .issue_join_ticket(join_request(UUID))
        .await
        .expect_err("deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    slow.shutdown().await;

    // kubeadm that cannot read its kubeconfig: UNAVAILABLE with kubeadm's reason.
    let broken_core = core_with_kubeadm(&f, &standin(), false);
    let broken = service::spawn(ServiceConfig::new(
        "127.0.0.1:0".parse().expect("addr"),
        Arc::new(broken_core),
        f.ca.certificate_pem(),
    ))
    .await
    .expect("service");
    let client = AtlsClient::new(
        Identity::attested(Arc::clone(&node.issuer) as Arc<dyn EvidenceIssuer>),
        PeerPolicy::Unauthenticated,
    );
    let channel = Endpoint::from_shared(format!("http://{}", broken.local_addr))
        .expect("endpoint")
        .connect_with_connector(client.connector())
        .await
        .expect("connect");
    let status = JoinServiceClient::new(channel)
        .issue_join_ticket(join_request(UUID))
        .await
        .expect_err("token failure");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("no such file"),
        "{}",
        status.message()
    );
    broken.shutdown().await;
    f.stop().await;
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn core_with_kubeadm(f: &Fixture, kubeadm: &Path, kubeconfig_exists: bool) -> JoinCore {
    let kubeconfig = if kubeconfig_exists {
        f.dir.path().join("admin.conf")
    } else {
        f.dir.path().join("missing.conf")
    };
    JoinCore::new(
        Arc::new(PolicyStore::load(&f.measurements).expect("policy")),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: kubeadm.to_owned(),
            kubeconfig,
        }),
        JoinCoreConfig {
            master_secret: f.master.clone(),
            measurement_salt: b"salt".to_vec(),
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(600),
            pki_dir: None,
            registry_file: f.dir.path().join("joined-2"),
        },
    )
    .expect("core")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_finish_their_handshake_do_not_block_others() {
    let f = Fixture::start(|config, _| {
        config.handshake_timeout = Duration::from_secs(2);
    })
    .await;
    // 100 connections that say nothing, and 20 that send half a ClientHello, from addresses
    // other than the node's (one address may have 16 handshakes in flight; the rest of its
    // connections are closed at once, which the reads below see too).
    let mut stalled = Vec::new();
    for i in 0..120 {
        let mut tcp = connect_from([127, 0, 0, 2 + (i % 8) as u8], f.addr)
            .await
            .expect("connect");
        if i >= 100 {
            // TLS record header announcing 512 bytes of handshake, then only 5 of them.
            tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
                .await
                .expect("write");
        }
        stalled.push(tcp);
    }
    // A genuine node is served meanwhile, well within the stalled handshakes' timeout.
    let node = node(&f.ca, true);
    let started = Instant::now();
    f.client(&node)
        .await
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("genuine node joins while others stall");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "join took {:?}",
        started.elapsed()
    );
    // The stalled connections are closed by the server after the handshake timeout.
    let deadline = Instant::now() + Duration::from_secs(5);
    for tcp in &mut stalled {
        let mut buf = [0u8; 64];
        let left = deadline.saturating_duration_since(Instant::now());
        let read = tokio::time::timeout(left, tcp.read(&mut buf))
            .await
            .expect("the server closes a stalled handshake after its timeout");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "closed without a TLS conversation: {read:?}"
        );
    }
    f.stop().await;
}

/// A TCP connection to `addr` from the loopback address `source` (127.0.0.x all work on Linux).
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(addr).await
}

/// The service's TPM as a control plane's join service has it, made slow: 50 ms per quote,
/// one at a time (a vTPM under TCG takes about 100 ms).
struct SlowTpm {
    issuer: Arc<TpmIssuer>,
    busy: std::sync::Mutex<()>,
    quotes: std::sync::atomic::AtomicUsize,
}

impl EvidenceIssuer for SlowTpm {
    fn issue(
        &self,
        binding: &hawser_attestation::evidence::Binding<'_>,
        user_data: &[u8],
    ) -> Result<hawser_attestation::evidence::Evidence, hawser_attestation::evidence::IssueError>
    {
        let _tpm = self.busy.lock().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        self.quotes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.issuer.issue(binding, user_data)
    }
}

/// An attested join service (its quotes slow) flooded by 200 handshake loops from four
/// addresses: each attacker handshake costs it a quote before the attacker is refused for not
/// attesting. A genuine node still joins within 5 s: each address gets 2 places in the quote
/// queue, so the node waits behind at most 8 quotes. (Before the limits, the 200 loops queued
/// 200 quotes, 10 s of TPM time, and the node's handshake timed out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_handshake_flood_while_a_node_joins() {
    let service_node = node(&ProviderCa::generate("service").expect("CA"), true);
    let tpm = Arc::new(SlowTpm {
        issuer: Arc::clone(&service_node.issuer),
        busy: std::sync::Mutex::new(()),
        quotes: std::sync::atomic::AtomicUsize::new(0),
    });
    let identity = Identity::attested(Arc::clone(&tpm) as Arc<dyn EvidenceIssuer>);
    let f = Fixture::start(move |config, _| config.identity = identity).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for source in 2..=5u8 {
        for _ in 0..50 {
            let (stop, addr) = (Arc::clone(&stop), f.addr);
            tokio::spawn(async move {
                let attacker = AtlsClient::new(Identity::Unattested, PeerPolicy::Unauthenticated);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(tcp) = connect_from([127, 0, 0, source], addr).await {
                        let _ = attacker.connect(tcp).await;
                    }
                    // Refused at once most of the time: spare the test machine's two cores.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let quotes_before = tpm.quotes.load(std::sync::atomic::Ordering::SeqCst);

    let node = node(&f.ca, true);
    let started = Instant::now();
    let mut joined = None;
    while joined.is_none() && started.elapsed() < Duration::from_secs(10) {
        if let Ok(channel) = f.connect(&node).await {
            joined = JoinServiceClient::new(channel)
                .issue_join_ticket(join_request(UUID))
                .await
                .ok();
        }
    }
    let took = started.elapsed();
    let quotes = tpm.quotes.load(std::sync::atomic::Ordering::SeqCst) - quotes_before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        joined.is_some(),
        "the node did not join within 10 s of flood"
    );
    assert!(took < Duration::from_secs(5), "the join took {took:?}");
    assert!(quotes > 5, "the attackers were being quoted for ({quotes})");
    f.stop().await;
}

/// The AK name of `node`'s TPM, as refusals print it and the approvals file lists it.
fn ak_hex(node: &Node) -> String {
    hex::encode(node.issuer.ak_name())
}

fn control_plane_request(uuid: &str) -> IssueJoinTicketRequest {
    IssueJoinTicketRequest {
        node_name: "control-plane-2".into(),
        is_control_plane: true,
        ..join_request(uuid)
    }
}

/// Tamper row: control-plane join without approval
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_control_plane_join_without_approval() {
    let f = Fixture::start(|_, _| {}).await;
    let node = node(&f.ca, true);
    let mut client = f.client(&node).await;

    // A genuine node that asks to be a control plane (an unmeasured fw_cfg flag) is refused,
    // and told which AK the admin must approve where.
    let status = client
        .issue_join_ticket(control_plane_request(UUID))
        .await
        .expect_err("control-plane join without approval refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "control-plane join refused: AK {} is not approved; add it to {}",
            ak_hex(&node),
            f.approvals.display()
        )
    );
    // Approving another machine's AK changes nothing for this one.
    let other = "000b".to_owned() + &"17".repeat(32);
    std::fs::write(&f.approvals, format!("# cp-3\n{other}\n")).expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let status = client
        .issue_join_ticket(control_plane_request(UUID))
        .await
        .expect_err("still not approved");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // Worker joins need no approval.
    let worker = client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("worker join")
        .into_inner();
    assert!(worker.control_plane_files.is_empty());
    assert!(
        worker.master_secret.is_none(),
        "a worker never gets the master secret"
    );

    // Once the admin approves its AK (picked up without a restart), it receives the PKI.
    std::fs::write(
        &f.approvals,
        format!("# cp-3\n{other}\n{}  # cp-2\n", ak_hex(&node)),
    )
    .expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ticket = client
        .issue_join_ticket(control_plane_request(UUID))
        .await
        .expect("approved control-plane join")
        .into_inner();
    let names: Vec<&str> = ticket
        .control_plane_files
        .iter()
        .map(|file| file.name.as_str())
        .collect();
    assert_eq!(names, CONTROL_PLANE_FILES);
    // ... and the cluster's master secret, to run the join service on it too.
    let master = ticket
        .master_secret
        .expect("an approved control plane gets the master secret");
    assert_eq!(master.key, f.master.key_bytes());
    assert_eq!(master.salt, f.master.salt_bytes());
    f.stop().await;
}

/// Tamper row: cloned disk on another TPM
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_cloned_disk_on_another_tpm() {
    let f = Fixture::start(|_, _| {}).await;
    let original = node(&f.ca, true);
    let mut client = f.client(&original).await;
    client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect("first join");

    // The same image on another machine (another TPM, certified by the same provider) boots a
    // copy of the disk: its rejoin, and a fresh join of the same disk, are refused.
    let clone = node(&f.ca, true);
    assert_ne!(ak_hex(&clone), ak_hex(&original));
    let mut clone_client = f.client(&clone).await;
    let status = clone_client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: UUID.into(),
            ..Default::default()
        })
        .await
        .expect_err("the clone's rejoin is refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        format!(
            "disk {UUID} joined with AK {}; this rejoin comes from AK {}: a cloned disk on another machine?",
            ak_hex(&original),
            ak_hex(&clone)
        )
    );
    let status = clone_client
        .issue_join_ticket(join_request(UUID))
        .await
        .expect_err("the clone's join of the same disk is refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("this join comes from AK"),
        "{}",
        status.message()
    );

    // The original still rejoins with its key.
    let rejoin = client
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: UUID.into(),
            ..Default::default()
        })
        .await
        .expect("the original rejoins")
        .into_inner();
    assert_eq!(
        rejoin.state_disk_key,
        &f.master
            .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
            .unwrap()[..]
    );
    f.stop().await;
}

/// Tamper row: a measurements file that enforces nothing is refused on reload (old policy kept)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_measurements_file_that_enforces_nothing() {
    let f = Fixture::start(|_, _| {}).await;
    let genuine = node(&f.ca, true);
    let wrong = node(&f.ca, false);
    let all_warn_only = format!(
        r#"{{"4": {{"expected": "{}", "warnOnly": true}}, "11": {{"expected": "{}", "warnOnly": true}}}}"#,
        "00".repeat(32),
        "00".repeat(32),
    );
    for text in ["{}", all_warn_only.as_str()] {
        std::fs::write(&f.measurements, text).expect("write");
        tokio::time::sleep(Duration::from_millis(400)).await;
        // No outage: the old policy admits the genuine node...
        f.client(&genuine)
            .await
            .issue_join_ticket(join_request(UUID))
            .await
            .unwrap_or_else(|e| panic!("{text}: genuine node refused: {e:?}"));
        // ...and still refuses a node whose PCR 11 differs.
        let err = f
            .connect(&wrong)
            .await
            .expect_err("the old policy still enforces PCR 11");
        assert!(err.contains("PCR 11"), "{text}: {err}");
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_tickets_carry_each_other_in_the_mesh_and_a_rejoin_keeps_the_address() {
    let f = Fixture::start_meshed(Some("10.99.0.0/24"), |_, _| {}).await;
    let first = node(&f.ca, true);
    let second = node(&f.ca, true);
    let other_uuid = "00000000-1111-4222-8333-444444444444";
    let key = |n: u8| PublicKey::from_slice(&[n; 32]).unwrap();
    let meshed_request = |uuid: &str, name: &str, n: u8, endpoint: &str| IssueJoinTicketRequest {
        node_name: name.into(),
        vpn_public_key: key(n).as_bytes().to_vec(),
        vpn_endpoint: endpoint.into(),
        ..join_request(uuid)
    };
    let peers_of = |vpn: &hawser_proto::join::VpnConfig| -> BTreeMap<String, (String, PublicKey)> {
        vpn.peers
            .iter()
            .map(|p| {
                let peer = hawser_proto::mesh::peer_from_wire(p).expect("a well-formed peer");
                (peer.name, (peer.vpn_ip.to_string(), peer.public_key))
            })
            .collect()
    };

    let one = f
        .client(&first)
        .await
        .issue_join_ticket(meshed_request(UUID, "worker-1", 1, "192.0.2.10:51820"))
        .await
        .expect("first join granted")
        .into_inner()
        .vpn
        .expect("the ticket carries the mesh");
    assert_eq!(one.node_vpn_ip, "10.99.0.2");
    assert_eq!(one.prefix, "10.99.0.0/24");
    assert_eq!((one.mtu, one.vpn_api_port), (1420, 9091));
    assert_eq!(one.coordinator_vpn_ip, "10.99.0.1");
    assert_eq!(one.coordinator_public_endpoint, "192.0.2.1:51820");
    assert_eq!(one.coordinator_vpn_pub_key, vec![200; 32]);
    assert_eq!(one.registry_version, 2);
    assert_eq!(peers_of(&one).len(), 2);

    let two = f
        .client(&second)
        .await
        .issue_join_ticket(meshed_request(other_uuid, "worker-2", 2, ""))
        .await
        .expect("second join granted")
        .into_inner()
        .vpn
        .expect("the ticket carries the mesh");
    assert_eq!(two.node_vpn_ip, "10.99.0.3");
    assert_eq!(two.registry_version, 3);
    let seen_by_two = peers_of(&two);
    assert_eq!(
        seen_by_two["worker-1"],
        ("10.99.0.2".to_owned(), key(1)),
        "{seen_by_two:?}"
    );

    // The first node reboots: the same address, and now it sees the second.
    let rejoin = f
        .client(&first)
        .await
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: UUID.into(),
            vpn_endpoint: "192.0.2.11:51820".into(),
            ..Default::default()
        })
        .await
        .expect("rejoin granted")
        .into_inner()
        .vpn
        .expect("the rejoin ticket carries the mesh");
    assert_eq!(rejoin.node_vpn_ip, one.node_vpn_ip);
    let seen_by_one = peers_of(&rejoin);
    assert_eq!(seen_by_one["worker-2"], ("10.99.0.3".to_owned(), key(2)));
    assert_eq!(
        rejoin.registry_version, 4,
        "the new endpoint is a new version"
    );

    // A key change is refused with the mesh's reason, and the mesh stays as it was.
    let status = f
        .client(&second)
        .await
        .issue_join_ticket(meshed_request(other_uuid, "worker-2", 9, ""))
        .await
        .expect_err("a key change is refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("key change is refused"),
        "{}",
        status.message()
    );
    // A malformed key: INVALID_ARGUMENT naming the field.
    let mut short = meshed_request(other_uuid, "worker-2", 2, "");
    short.vpn_public_key.truncate(5);
    let status = f
        .client(&second)
        .await
        .issue_join_ticket(short)
        .await
        .expect_err("a malformed key is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("vpn_public_key"),
        "{}",
        status.message()
    );
    f.stop().await;
}
