//! What the tests of the real `hawser-joind` binary share: a node's provisioned swtpm, a join
//! service's TPM after its pivot, the service as a child process, the node's join client.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test file uses a part

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_attestation::{Tpm, TpmIssuer};
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_init::disk::key::DiskStatus;
use hawser_init::enrollment::client::{JoinClient, Secrets};
use hawser_init::enrollment::{
    JoinEndpoints, JoinServicePolicy, JoinServiceTrust, join_service_policy,
};
use hawser_keys::MasterSecret;
use hawser_pcr::{
    PCR_CLUSTER_ID, PCR_KERNEL_BOOT, PHASE_CONTROL_PLANE, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD,
    extend_sha256, phase_digest,
};

pub const UUID: &str = "6a0e4c1f-2b3d-4e5f-8a9b-0c1d2e3f4a5b";
/// How long a step may take before the test fails (a join is a second or two here).
pub const STEP: Duration = Duration::from_secs(90);

/// A node that booted this image: a provisioned swtpm with PCR 11 at `enter-initrd`.
pub struct Node {
    pub issuer: Arc<TpmIssuer>,
    pub ak_hex: String,
    /// What PID 1 requires of the join service with `hawser.join_service_trust=attested`,
    /// built by PID 1's own function from this TPM's PCRs and the provider CA.
    pub attested: JoinServicePolicy,
    // Last: the TPM connection inside the issuer closes before swtpm is killed.
    pub _swtpm: Swtpm,
}

pub fn node(ca: &ProviderCa) -> Node {
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
pub enum Pivoted {
    /// A control plane: PCR 11 ← enter-initrd, control-plane, leave-initrd.
    ControlPlane,
    /// A worker: PCR 11 ← enter-initrd, leave-initrd (root on it runs the fake service).
    Worker,
}

/// A swtpm for a join service, provisioned by `ca` like the node's (same image: PCRs 4, 9, 12
/// and 13 equal), with PCR 11 as `pivoted` leaves it and PCR 15 locked to `cluster`. No client
/// stays connected: `hawser-joind --attest-with-tpm` connects to it.
pub fn service_tpm(ca: &ProviderCa, pivoted: Pivoted, cluster: &[u8; 32]) -> Swtpm {
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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < STEP, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The join service's inputs in one directory, and the service as a child process.
pub struct Service {
    pub dir: tempfile::TempDir,
    pub master: MasterSecret,
    pub port: u16,
    pub child: Option<Child>,
    /// The TPM the service attests with (`--attest-with-tpm`), if it attests. After `child`:
    /// the service is killed before its TPM.
    pub tpm: Option<Swtpm>,
}

impl Service {
    pub fn new(ca: &ProviderCa) -> Service {
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
    pub fn cluster_id(&self) -> [u8; 32] {
        hawser_keys::cluster_id(self.master.measurement_secret().as_slice(), b"salt")
    }

    /// Attests with `tpm` from its next start on.
    pub fn attest_with(&mut self, tpm: Swtpm) {
        self.tpm = Some(tpm);
    }

    /// Starts, attesting with a TPM of the image pivoted as `pivoted` and locked to `cluster`,
    /// its kubeadm ungated.
    pub fn start_attested(&mut self, ca: &ProviderCa, pivoted: Pivoted, cluster: &[u8; 32]) {
        self.attest_with(service_tpm(ca, pivoted, cluster));
        std::fs::write(self.path("go"), "").expect("write");
        self.start();
    }

    /// The aTLS connections this service's clients refused, from its log.
    pub fn refused_by_clients(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("the client refused our attestation"))
            .map(str::to_owned)
            .collect()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("joind.log")).unwrap_or_default()
    }

    /// Starts `hawser-joind` (again, on the same port and state) and waits until it listens.
    pub fn start(&mut self) {
        self.start_with(None, SocketAddr::from(([127, 0, 0, 1], self.port)), &[]);
    }

    /// [`Service::start`] inside network namespace `ns` (`ip netns exec`), listening on
    /// `listen`, with `extra` flags; waits for its "listening" line.
    pub fn start_with(&mut self, ns: Option<&str>, listen: SocketAddr, extra: &[&str]) {
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
        // No tokens minted ahead unless a test asks: a join runs the gated kubeadm itself, which
        // is how the tests see a join inside the service (the module docs).
        if !extra.contains(&"--token-pool") {
            command.args(["--token-pool", "0"]);
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
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pgid = nix::unistd::Pid::from_raw(-(child.id() as i32));
            let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// The lines of the registry of joined disks.
    pub fn registry(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("state/joined-disks"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn granted_joins(&self) -> usize {
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

/// Starts the node's join for a new disk through the join services on `ports` (loopback, in
/// turn), in the background.
pub fn join(
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
pub fn attested_fetch(
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

pub fn runtime() -> tokio::runtime::Runtime {
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
