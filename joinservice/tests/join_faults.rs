//! Faults during a join, end to end on the host: the node's own join client (PID 1's
//! `JoinClient`, attesting with a provisioned swtpm) against the real `hawser-joind` binary, with
//! the join service killed or the network cut while a join is inside the service. Each test
//! proves a row of docs/security.md's Faults table: the node ends with the key of its disk, the
//! disk is bound once to the node's AK, and nothing is lost.
//!
//! The moment "inside the service" is made exact with the token issuer: the service runs
//! `kubeadm token create` while it decides a join, and here that `kubeadm` is a wrapper that
//! says it was called (a file), waits for the test's "go" (another file), then runs the
//! kubeadm stand-in (`tests/fixtures/kubeadm-standin`, which says what it is).
//!
//! The tamper tests run the node as PID 1 does with `hawser.join_service_trust=attested`: the
//! join service must attest as a control plane of the node's image (a second swtpm, provisioned
//! by the same provider, with PCR 11 after `control-plane` and `leave-initrd` and PCR 15 locked
//! to its cluster), and the fakes are attested too where it matters: a worker's TPM of the same
//! image, a control plane of another cluster.
//!
//! Run with `cargo test -p hawser-joinservice --test join_faults`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hawser_attestation::{Tpm, TpmIssuer};
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_init::disk::key::DiskStatus;
use hawser_init::enrollment::client::{JoinClient, Secrets};
use hawser_init::enrollment::{
    JoinEndpoints, JoinServicePolicy, JoinServiceTrust, WORKER_JOIN_SERVICE, join_service_policy,
};
use hawser_keys::MasterSecret;
use hawser_pcr::{
    PCR_CLUSTER_ID, PCR_KERNEL_BOOT, PHASE_CONTROL_PLANE, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD,
    extend_sha256, phase_digest,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

const UUID: &str = "6a0e4c1f-2b3d-4e5f-8a9b-0c1d2e3f4a5b";
/// How long a step may take before the test fails (a join is a second or two here).
const STEP: Duration = Duration::from_secs(90);

/// A node that booted this image: a provisioned swtpm with PCR 11 at `enter-initrd`.
struct Node {
    issuer: Arc<TpmIssuer>,
    ak_hex: String,
    /// What PID 1 requires of the join service with `hawser.join_service_trust=attested`,
    /// built by PID 1's own function from this TPM's PCRs and the provider CA.
    attested: JoinServicePolicy,
    // Last: the TPM connection inside the issuer closes before swtpm is killed.
    _swtpm: Swtpm,
}

fn node(ca: &ProviderCa) -> Node {
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"));
    ca.provision(&swtpm).expect("provider provisions the TPM");
    let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open swtpm");
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
        .expect("extend enter-initrd");
    let ca_file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(ca_file.path(), ca.certificate_pem()).expect("write the provider CA");
    let attested = join_service_policy(JoinServiceTrust::Attested, &tpm, ca_file.path())
        .expect("PID 1's attested policy");
    let issuer = TpmIssuer::new(Arc::new(tpm)).expect("issuer");
    let ak_hex = hex::encode(issuer.ak_name());
    Node {
        issuer: Arc::new(issuer),
        ak_hex,
        attested,
        _swtpm: swtpm,
    }
}

/// What a join service's TPM shows: the node it runs on, after that node's pivot.
#[derive(Debug, Clone, Copy)]
enum Pivoted {
    /// A control plane: PCR 11 ← enter-initrd, control-plane, leave-initrd.
    ControlPlane,
    /// A worker: PCR 11 ← enter-initrd, leave-initrd (root on it runs the fake service).
    Worker,
}

/// A swtpm for a join service, provisioned by `ca` like the node's (same image: PCRs 4, 9, 12
/// and 13 equal), with PCR 11 as `pivoted` leaves it and PCR 15 locked to `cluster`. No client
/// stays connected: `hawser-joind --attest-with-tpm` connects to it.
fn service_tpm(ca: &ProviderCa, pivoted: Pivoted, cluster: &[u8; 32]) -> Swtpm {
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"));
    ca.provision(&swtpm).expect("provider provisions the TPM");
    let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open swtpm");
    let phases: &[&str] = match pivoted {
        Pivoted::ControlPlane => &[PHASE_ENTER_INITRD, PHASE_CONTROL_PLANE, PHASE_LEAVE_INITRD],
        Pivoted::Worker => &[PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD],
    };
    for phase in phases {
        tpm.extend_phase(PCR_KERNEL_BOOT, phase)
            .expect("extend a phase");
    }
    tpm.extend_sha256_digest(PCR_CLUSTER_ID, cluster)
        .expect("the node lock");
    swtpm
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < STEP, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The join service's inputs in one directory, and the service as a child process.
struct Service {
    dir: tempfile::TempDir,
    master: MasterSecret,
    port: u16,
    child: Option<Child>,
    /// The TPM the service attests with (`--attest-with-tpm`), if it attests. After `child`:
    /// the service is killed before its TPM.
    tpm: Option<Swtpm>,
}

impl Service {
    fn new(ca: &ProviderCa) -> Service {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let pcr11 = extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD));
        std::fs::write(
            d.join("measurements.json"),
            format!(
                r#"{{"11": {{"expected": "{}", "warnOnly": false}}}}"#,
                hex::encode(pcr11)
            ),
        )
        .expect("write");
        let master = MasterSecret::generate().expect("master secret");
        master
            .write_new_file(&d.join("master-secret.json"))
            .expect("write the master secret");
        std::fs::write(d.join("salt"), b"salt").expect("write");
        std::fs::write(d.join("provider-ca.pem"), ca.certificate_pem()).expect("write");
        std::fs::write(d.join("admin.conf"), "kind: Config\n").expect("write");
        let standin = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubeadm-standin");
        let wrapper = d.join("kubeadm");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n# The test's gate in front of the kubeadm stand-in (see the module docs).\n\
                 touch '{dir}/token-requested'\n\
                 echo \"$*\" >>'{dir}/kubeadm-calls'\n\
                 while [ ! -e '{dir}/go' ]; do sleep 0.05; done\n\
                 exec '{standin}' \"$@\"\n",
                dir = d.display(),
                standin = standin.display()
            ),
        )
        .expect("write");
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Service {
            dir,
            master,
            port: free_port(),
            child: None,
            tpm: None,
        }
    }

    /// The cluster this service's master secret makes.
    fn cluster_id(&self) -> [u8; 32] {
        hawser_keys::cluster_id(self.master.measurement_secret().as_slice(), b"salt")
    }

    /// Attests with `tpm` from its next start on.
    fn attest_with(&mut self, tpm: Swtpm) {
        self.tpm = Some(tpm);
    }

    /// Starts, attesting with a TPM of the image pivoted as `pivoted` and locked to `cluster`,
    /// its kubeadm ungated.
    fn start_attested(&mut self, ca: &ProviderCa, pivoted: Pivoted, cluster: &[u8; 32]) {
        self.attest_with(service_tpm(ca, pivoted, cluster));
        std::fs::write(self.path("go"), "").expect("write");
        self.start();
    }

    /// The aTLS connections this service's clients refused, from its log.
    fn refused_by_clients(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("the client refused our attestation"))
            .map(str::to_owned)
            .collect()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("joind.log")).unwrap_or_default()
    }

    /// Starts `hawser-joind` (again, on the same port and state) and waits until it listens.
    fn start(&mut self) {
        self.start_with(None, SocketAddr::from(([127, 0, 0, 1], self.port)), &[]);
    }

    /// [`Service::start`] inside network namespace `ns` (`ip netns exec`), listening on
    /// `listen`, with `extra` flags; waits for its "listening" line.
    fn start_with(&mut self, ns: Option<&str>, listen: SocketAddr, extra: &[&str]) {
        assert!(self.child.is_none(), "the service is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("joind.log"))
            .expect("log file");
        let arg = |name: &str| self.path(name).display().to_string();
        let joind = env!("CARGO_BIN_EXE_hawser-joind");
        let mut command = match ns {
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns, joind]);
                command
            }
            None => Command::new(joind),
        };
        if let Some(tpm) = &self.tpm {
            command.args(["--attest-with-tpm", &tpm.tcti().expect("tcti")]);
        }
        let child = command
            .args(["--listen", &listen.to_string()])
            .args(extra)
            .args(["--measurements", &arg("measurements.json")])
            .args(["--master-secret", &arg("master-secret.json")])
            .args(["--measurement-salt-file", &arg("salt")])
            .args(["--provider-ca", &arg("provider-ca.pem")])
            .args(["--kubeadm", &arg("kubeadm")])
            .args(["--kubeconfig", &arg("admin.conf")])
            .args(["--state-dir", &arg("state")])
            .args(["--kubernetes-version", "v1.33.4"])
            .args(["--worker-threads", "2", "--log", "info"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            // Its own process group: the kill below takes the waiting kubeadm wrapper too.
            .process_group(0)
            .spawn()
            .expect("start hawser-joind");
        self.child = Some(child);
        wait_for("hawser-joind to listen", || {
            self.log().contains(&format!("listening on {listen}"))
        });
    }

    /// Kills the service and everything it started, as a crash or an OOM kill would.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pgid = nix::unistd::Pid::from_raw(-(child.id() as i32));
            let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// The lines of the registry of joined disks.
    fn registry(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("state/joined-disks"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn granted_joins(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("IssueJoinTicket") && l.contains("granted"))
            .count()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the proxy does with the bytes between node and service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Both ways.
    Up,
    /// The node's bytes reach the service; the service's answers are lost.
    AnswersLost,
    /// Every connection is closed (the node sees its connection end).
    Cut,
}

/// A TCP proxy on loopback between the node and the service, whose link the test controls.
/// Returns its address and how many connections it has closed because the link was cut: the
/// test waits for that count, not for a time, before it brings the link up again (a proxy task
/// that ran only after the link was up again would otherwise pass the lost answer on).
async fn proxy(to: SocketAddr, link: watch::Receiver<Link>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut_connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&cut_connections);
    tokio::spawn(async move {
        while let Ok((node_side, _)) = listener.accept().await {
            let link = link.clone();
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let Ok(service_side) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let (mut node_read, mut node_write) = node_side.into_split();
                let (mut service_read, mut service_write) = service_side.into_split();
                let mut cut = link.clone();
                let up = async move {
                    let mut buf = vec![0; 16 * 1024];
                    while let Ok(n @ 1..) = node_read.read(&mut buf).await {
                        if service_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0; 16 * 1024];
                    while let Ok(n @ 1..) = service_read.read(&mut buf).await {
                        // Only an up link carries answers: bytes read once the link is
                        // cut (before this connection's cut branch ran) are lost too.
                        if *link.borrow() != Link::Up {
                            continue;
                        }
                        if node_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                // Dropping both halves closes the node's connection and the service's.
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                    _ = cut.wait_for(|l| *l == Link::Cut) => {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (addr, cut_connections)
}

/// Starts the node's join for a new disk through the join services on `ports` (loopback, in
/// turn), in the background.
fn join(
    runtime: &tokio::runtime::Runtime,
    node: &Node,
    ports: &[u16],
) -> tokio::task::JoinHandle<(Secrets, u32)> {
    let list: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let client = JoinClient::new(
        JoinEndpoints::parse(&list.join(",")).expect("endpoints"),
        JoinServicePolicy::Unauthenticated,
        Arc::clone(&node.issuer),
    );
    runtime.spawn(async move { client.fetch(UUID, 64, DiskStatus::New).await })
}

/// The node, attested as PID 1 is, asks the join services on `ports` (loopback, in turn) for
/// the key of its disk: a new one, or one that records `disk_cluster` (a rejoin).
fn attested_fetch(
    runtime: &tokio::runtime::Runtime,
    node: &Node,
    ports: &[u16],
    disk_cluster: Option<[u8; 32]>,
) -> (Secrets, u32) {
    let list: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let client = JoinClient::new(
        JoinEndpoints::parse(&list.join(",")).expect("endpoints"),
        node.attested.clone(),
        Arc::clone(&node.issuer),
    )
    .disk_cluster(disk_cluster);
    let status = match disk_cluster {
        Some(_) => DiskStatus::Initialized,
        None => DiskStatus::New,
    };
    runtime
        .block_on(async { tokio::time::timeout(STEP, client.fetch(UUID, 64, status)).await })
        .expect("the node gets a key")
}

/// The node got its disk's key, and the disk is bound once, to the node's AK.
fn assert_recovered(service: &Service, node: &Node, secrets: &Secrets, attempts: u32) {
    let log = service.log();
    assert!(
        attempts >= 2,
        "the fault cost no attempt ({attempts}):\n{log}"
    );
    let key = service
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{log}");
    assert!(secrets.ticket.is_some(), "a new disk gets a join ticket");
    assert_eq!(
        service.registry(),
        vec![format!("{UUID} {}", node.ak_hex)],
        "{log}"
    );
    // No secret reaches the service's log.
    assert!(!log.contains(&hex::encode(&*key)), "{log}");
}

fn runtime() -> tokio::runtime::Runtime {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Faults row: the join service restarted mid-join. The service is killed while a node's join
/// is inside it (its bootstrap token is being created); the node's attempt fails, it keeps
/// asking, and the restarted service (same state directory) grants the join.
#[test]
fn fault_join_service_restarted_mid_join() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut service = Service::new(&ca);
    service.start();
    let joining = join(&runtime, &node, &[service.port]);

    wait_for("the join inside the service", || {
        service.path("token-requested").exists()
    });
    service.kill();
    assert_eq!(service.granted_joins(), 0, "{}", service.log());
    std::fs::write(service.path("go"), "").expect("write");
    service.start();

    let (secrets, attempts) = runtime
        .block_on(async { tokio::time::timeout(STEP, joining).await })
        .expect("the node joins after the restart")
        .expect("join task");
    assert_recovered(&service, &node, &secrets, attempts);
    assert_eq!(service.granted_joins(), 1, "{}", service.log());
}

/// Faults row: the network cut mid-join. The node's request reaches the service, the service
/// decides it (the disk is bound, a token issued), and the answer is lost on the way back; then
/// the connection is cut. The node asks again, and the service grants the same disk to the same
/// AK again: the node ends with its key and nothing is bound twice.
#[test]
fn fault_network_cut_mid_join() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut service = Service::new(&ca);
    service.start();
    let (link, link_rx) = watch::channel(Link::Up);
    let to = SocketAddr::from(([127, 0, 0, 1], service.port));
    let (via, cut_connections) = runtime.block_on(proxy(to, link_rx));
    let joining = join(&runtime, &node, &[via.port()]);

    wait_for("the join inside the service", || {
        service.path("token-requested").exists()
    });
    link.send_replace(Link::AnswersLost);
    std::fs::write(service.path("go"), "").expect("write");
    wait_for("the service to grant the join whose answer is lost", || {
        service.granted_joins() == 1
    });
    assert_eq!(service.registry().len(), 1, "{}", service.log());
    link.send_replace(Link::Cut);
    wait_for("the proxy to cut the node's connection", || {
        cut_connections.load(Ordering::SeqCst) >= 1
    });
    link.send_replace(Link::Up);

    let (secrets, attempts) = runtime
        .block_on(async { tokio::time::timeout(STEP, joining).await })
        .expect("the node joins after the cut")
        .expect("join task");
    assert_recovered(&service, &node, &secrets, attempts);
    assert_eq!(service.granted_joins(), 2, "{}", service.log());
}

/// Faults row: a control plane's join service down, another's up. The node is given both
/// endpoints; the first refuses connections (its control plane is down), and the node asks the
/// next one at once, without waiting for a backoff.
#[test]
fn fault_a_control_planes_join_service_down_the_next_one_answers() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut service = Service::new(&ca);
    std::fs::write(service.path("go"), "").expect("write");
    service.start();
    let down = free_port();

    let (secrets, attempts) = runtime
        .block_on(async {
            tokio::time::timeout(STEP, join(&runtime, &node, &[down, service.port])).await
        })
        .expect("the node joins through the second endpoint")
        .expect("join task");
    assert_eq!(attempts, 2, "{}", service.log());
    assert_recovered(&service, &node, &secrets, attempts);
    assert_eq!(service.granted_joins(), 1, "{}", service.log());
}

/// Tamper row: root on a worker answers as the join service. The fake is *attested*: a real
/// `hawser-joind` (with a master secret of the attacker's choosing) on a TPM of the same image
/// and of the real cluster, pivoted as a worker (PCR 11 ← enter-initrd, leave-initrd). A fresh
/// node given the fake's endpoint first refuses it by name in the handshake (the fake's log
/// shows the node's verdict), before any call, and takes its key from the cluster's control
/// plane, whose TPM the node accepts (PCR 11 with the control-plane marker).
#[test]
fn tamper_a_workers_tpm_cannot_act_as_the_join_service() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut real = Service::new(&ca);
    let cluster = real.cluster_id();
    real.start_attested(&ca, Pivoted::ControlPlane, &cluster);
    let mut fake = Service::new(&ca);
    fake.start_attested(&ca, Pivoted::Worker, &cluster);

    let (secrets, attempts) = attested_fetch(&runtime, &node, &[fake.port, real.port], None);
    let key = real
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{}", fake.log());
    assert_eq!(attempts, 2, "the worker costs one attempt");
    let refused = fake.refused_by_clients();
    assert_eq!(refused.len(), 1, "{}", fake.log());
    assert!(refused[0].contains(WORKER_JOIN_SERVICE), "{}", refused[0]);
    // The node made no call: the fake decided nothing and bound nothing.
    assert_eq!(fake.granted_joins(), 0, "{}", fake.log());
    assert!(fake.registry().is_empty(), "{}", fake.log());
    assert_eq!(real.registry(), vec![format!("{UUID} {}", node.ak_hex)]);
    assert!(real.refused_by_clients().is_empty(), "{}", real.log());
}

/// Tamper row: a control plane of another cluster answers a rejoin. Both join services attest
/// as control planes of the node's image; the other's TPM is locked to its own cluster. A node
/// whose disk records the real cluster refuses the other in the handshake, naming its own
/// cluster (PCR 15), before it sends the other anything, and rejoins through the real one.
#[test]
fn tamper_a_control_plane_of_another_cluster_cannot_answer_a_rejoin() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut real = Service::new(&ca);
    let cluster = real.cluster_id();
    real.start_attested(&ca, Pivoted::ControlPlane, &cluster);
    let mut other = Service::new(&ca);
    let other_cluster = other.cluster_id();
    other.start_attested(&ca, Pivoted::ControlPlane, &other_cluster);

    // The first join: the disk is the real cluster's.
    let (secrets, attempts) = attested_fetch(&runtime, &node, &[real.port], None);
    let key = real
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(
        (*secrets.state_disk_key == key.to_vec(), attempts),
        (true, 1)
    );

    // The rejoin, the other cluster's control plane asked first.
    let (secrets, attempts) =
        attested_fetch(&runtime, &node, &[other.port, real.port], Some(cluster));
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{}", other.log());
    assert_eq!(attempts, 2, "the other cluster costs one attempt");
    let refused = other.refused_by_clients();
    assert_eq!(refused.len(), 1, "{}", other.log());
    assert!(
        refused[0].contains(&format!(
            "locked to another cluster than the one this node's disk records ({})",
            hex::encode(cluster)
        )),
        "{}",
        refused[0]
    );
    assert!(
        !other.log().contains("IssueRejoinTicket"),
        "the node asked the other cluster: {}",
        other.log()
    );
}

/// Tamper row: a fake join service advert on the LAN. On a LAN of network namespaces this test
/// creates, the real `hawser-joind` advertises itself over mDNS (`--mdns-instance`) and attests
/// as a control plane of the node's image (its swtpm in its namespace). So does a fake, whose
/// instance name sorts first: a real `hawser-joind` of another master secret (a cluster of the
/// attacker's), which would hand the node a key, but does not attest. A fresh node given no
/// endpoint (`hawser.join_discovery=mdns`, `hawser.join_service_trust=attested`) tries the
/// fake, refuses it in the handshake (one attempt, no call made), then gets the key of its disk
/// from the real one. A node whose disk records the real cluster never tries the fake: its
/// advert names another cluster. Without attestation the fake's key would be taken.
#[test]
fn tamper_fake_join_service_advert_only_costs_an_attempt() {
    use hawser_init::enrollment::client::JoinSource;
    use hawser_init::enrollment::discover::LanDiscovery;
    use hawser_mesh_device::netns::{self, Underlay};

    hawser_mesh_device::netns::require_host();
    let ca = Arc::new(ProviderCa::generate("test provider").expect("CA"));
    let lan = Underlay::new(3, 171);
    // The node's swtpm lives in its namespace, where its join client reaches it on loopback.
    let node = {
        let ca = Arc::clone(&ca);
        netns::in_namespace(&lan.members[2], move || node(&ca))
    };
    // member 0: the real join service; member 1: the fake; member 2: the node.
    let mut service = Service::new(&ca);
    let real_cluster = service.cluster_id();
    let tpm = {
        let ca = Arc::clone(&ca);
        netns::in_namespace(&lan.members[0], move || {
            service_tpm(&ca, Pivoted::ControlPlane, &real_cluster)
        })
    };
    service.attest_with(tpm);
    std::fs::write(service.path("go"), "").expect("write");
    let real = SocketAddr::from((lan.ip(0), 7000));
    service.start_with(
        Some(&lan.members[0]),
        real,
        &["--mdns-instance", "real-cp", "--mdns-interval-secs", "1"],
    );
    assert!(
        service
            .log()
            .contains("advertising real-cp._hawser-join._tcp.local."),
        "{}",
        service.log()
    );
    let mut fake = Service::new(&ca);
    std::fs::write(fake.path("go"), "").expect("write");
    fake.start_with(
        Some(&lan.members[1]),
        SocketAddr::from((lan.ip(1), 7000)),
        &["--mdns-instance", "a-fake", "--mdns-interval-secs", "1"],
    );

    let issuer = Arc::clone(&node.issuer);
    let policy = node.attested.clone();
    let (fresh, pinned) = netns::in_namespace(&lan.members[2], move || {
        let runtime = runtime();
        runtime.block_on(async move {
            let lan = Arc::new(LanDiscovery::start().expect("browse"));
            // Both adverts heard first, so that the count of attempts below is exact.
            let heard = tokio::time::timeout(STEP, async {
                while lan.round(None, Duration::from_secs(1)).await.len() < 2 {}
            });
            heard.await.expect("the node hears both adverts");
            let fresh = JoinClient::new(
                JoinSource::Discovered(Arc::clone(&lan)),
                policy.clone(),
                Arc::clone(&issuer),
            );
            let fresh = tokio::time::timeout(STEP, fresh.fetch(UUID, 64, DiskStatus::New))
                .await
                .expect("the fresh node joins through the real advert");
            let pinned = JoinClient::new(JoinSource::Discovered(lan), policy, issuer)
                .disk_cluster(Some(real_cluster));
            let pinned =
                tokio::time::timeout(STEP, pinned.fetch(UUID, 64, DiskStatus::Initialized))
                    .await
                    .expect("the joined node rejoins through the real advert");
            (fresh, pinned)
        })
    });
    let (secrets, attempts) = fresh;
    let key = service
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{}", fake.log());
    // Tried in a random order (docs/discovery.md): the fake costs at most one attempt.
    assert!(
        attempts <= 2,
        "the fake costs one attempt, no more ({attempts})"
    );
    assert_eq!(fake.granted_joins(), 0, "{}", fake.log());
    assert!(fake.registry().is_empty(), "{}", fake.log());
    let (secrets, attempts) = pinned;
    assert_eq!(*secrets.state_disk_key, key.to_vec());
    assert_eq!(
        attempts, 1,
        "a node of the real cluster never tries the fake"
    );
    assert_eq!(
        service.registry(),
        vec![format!("{UUID} {}", node.ak_hex)],
        "{}",
        service.log()
    );
}

/// Tamper row: a bootstrap token read from one node (its disk's ticket, or a pod on it). Every
/// join gets a token of its own, asked of kubeadm with the short lifetime: a token admits the
/// node it was issued to, for 30 minutes, and never another node's join.
#[test]
fn tamper_a_bootstrap_token_belongs_to_one_join_and_is_short_lived() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let mut service = Service::new(&ca);
    std::fs::write(service.path("go"), "").expect("write");
    service.start();
    let endpoints =
        JoinEndpoints::parse(&format!("127.0.0.1:{}", service.port)).expect("endpoints");
    let mut tokens = Vec::new();
    for uuid in [UUID, "0b1c2d3e-4f50-4612-8a9b-0c1d2e3f4a5b"] {
        let node = node(&ca);
        let client = JoinClient::new(
            endpoints.clone(),
            JoinServicePolicy::Unauthenticated,
            Arc::clone(&node.issuer),
        );
        let (secrets, _) = runtime
            .block_on(async {
                tokio::time::timeout(STEP, client.fetch(uuid, 64, DiskStatus::New)).await
            })
            .expect("the node joins");
        let ticket = secrets.ticket.expect("a new disk gets a join ticket");
        tokens.push(ticket.token.expose_secret().to_owned());
    }
    let calls = std::fs::read_to_string(service.path("kubeadm-calls")).expect("kubeadm ran");
    assert_ne!(tokens[0], tokens[1], "two joins shared one token:\n{calls}");
    let creates: Vec<&str> = calls
        .lines()
        .filter(|l| l.starts_with("token create"))
        .collect();
    assert_eq!(
        creates.len(),
        2,
        "one `kubeadm token create` per join:\n{calls}"
    );
    assert!(creates.iter().all(|l| l.contains("--ttl 1800s")), "{calls}");
}
