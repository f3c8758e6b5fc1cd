//! Helpers shared by the QEMU test suites: the workspace, scratch directories under the target
//! directory (so `cargo clean` removes them), and building the image under test.
// Each suite is its own test binary and uses a different subset of these.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hawser_harness::{TpmConfig, VmConfig};
use hawser_image::build::BuildOutput;
use hawser_image::pipeline::{self, NodeImage, PipelineOptions};
use hawser_joinservice::service::RunningService;
use hawser_local::localhost::{self, LocalCluster};

pub mod quote;
pub mod toolbox;
pub mod ukify;

/// The hawser workspace this crate lives in.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("qemu-tests lives in the workspace")
        .to_owned()
}

/// `<target dir>/<suite>/<name>`, created if missing.
pub fn scratch(suite: &str, name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let dir = target.join(suite).join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Like [`scratch`], emptied first (disk images and TPM state from an earlier run must not leak
/// into this one).
pub fn fresh_scratch(suite: &str, name: &str) -> PathBuf {
    let dir = scratch(suite, name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Builds the image from this workspace into `dir`, with `cmdline` or the default measured one.
pub fn build_image(dir: &Path, cmdline: Option<&str>) -> BuildOutput {
    let mut opts = PipelineOptions::new(&workspace(), dir);
    if let Some(cmdline) = cmdline {
        opts.cmdline = cmdline.to_owned();
    }
    let (output, timeline) =
        pipeline::build_image(&opts).unwrap_or_else(|e| panic!("image build failed: {e}"));
    eprintln!("image built in {}: {timeline:?}", dir.display());
    output
}

/// Builds the node image (rootfs, UKI with its root hash, disk image) into `dir` with the
/// measured command line `cmdline` (the root hash is appended) and, if given, the provider CA
/// that certifies nodes' attestation keys.
pub fn build_node_image(dir: &Path, cmdline: &str, provider_ca: Option<&Path>) -> NodeImage {
    // hawser's stand-ins for kubeadm and kubelet: these tests are about the boot path (join,
    // disk, pivot, kubeadm run once), and real Kubernetes' control plane takes minutes per
    // node under TCG. The image with real Kubernetes is booted by tests/kubernetes_image.rs,
    // built by `measurements check --node` and scripts/check-reproducible-node, and its
    // configurations run through real kubeadm.
    build_node_image_of(
        dir,
        cmdline,
        provider_ca,
        pipeline::KubernetesOrigin::StandIn,
    )
}

/// [`build_node_image`] with Kubernetes from `kubernetes` (the pinned source, release binaries
/// or the stand-ins).
pub fn build_node_image_of(
    dir: &Path,
    cmdline: &str,
    provider_ca: Option<&Path>,
    kubernetes: pipeline::KubernetesOrigin,
) -> NodeImage {
    let mut opts = PipelineOptions::new(&workspace(), dir);
    opts.cmdline = cmdline.to_owned();
    opts.provider_ca = provider_ca.map(Path::to_owned);
    opts.kubernetes = kubernetes;
    let (node, timeline) = pipeline::build_node_image(&opts, &mut |line| eprintln!("{line}"))
        .unwrap_or_else(|e| panic!("node image build failed: {e}"));
    eprintln!("{node}\nnode image built: {timeline:?}");
    node
}

/// The host side of a local cluster (`hawser local up`'s): provider CA, master secret,
/// expected measurements and the join service.
pub struct Host {
    pub runtime: tokio::runtime::Runtime,
    pub cluster: LocalCluster,
    pub measurements: PathBuf,
}

impl Host {
    /// A cluster in `dir` whose join service expects the measurements predicted from `uki`.
    pub fn new(dir: &Path, uki: &Path) -> Host {
        let cluster = LocalCluster::create(dir).expect("create the local cluster");
        let measurements = cluster.dir.join("measurements.json");
        localhost::write_expected_measurements(uki, &measurements)
            .expect("predict the measurements");
        Host {
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime"),
            cluster,
            measurements,
        }
    }

    pub fn start_service(&self, listen: SocketAddr) -> RunningService {
        self.runtime
            .block_on(self.cluster.start_join_service(listen, &self.measurements))
            .expect("start the join service")
    }

    /// The state disk of this cluster's node.
    pub fn state_disk(&self) -> PathBuf {
        self.cluster.dir.join("state.img")
    }

    /// `base` as this cluster's node: its TPM (AK certified by the provider; kept across
    /// boots), its state disk (`fresh` = a new empty one, else the one from the last boot),
    /// and a NIC that reaches only `port` on the host's loopback.
    pub fn node(&self, base: VmConfig, name: &str, port: u16, fresh: bool) -> VmConfig {
        let tpm_dir = self.cluster.dir.join("tpm");
        if fresh || !tpm_dir.exists() {
            let _ = std::fs::remove_dir_all(&tpm_dir);
            self.cluster
                .provision_tpm(&tpm_dir)
                .expect("provision the TPM");
        }
        let disk = self.state_disk();
        if fresh || !disk.exists() {
            std::fs::File::create(&disk)
                .and_then(|f| f.set_len(256 << 20))
                .expect("create the state disk");
        }
        let mut config = base
            .name(name)
            .tpm(TpmConfig {
                state_dir: Some(tpm_dir),
                ..TpmConfig::default()
            })
            .disk(&disk, localhost::STATE_DISK_SERIAL)
            .keep_logs_in(self.cluster.dir.join("logs").join(name));
        config
            .extra_args
            .extend(localhost::user_net_args(Some(port), &[]));
        config
    }
}

/// What the stand-in kubeadm prints before the configuration it received
/// (`hawser_standin::kubeadm::CONFIG_RECEIVED`).
pub const CONFIG_RECEIVED: &str = "configuration received (secrets redacted): ";
/// PID 1's line on a node whose kubeadm ran on an earlier boot.
pub const NO_SECOND_KUBEADM: &str = "kubeadm does not run again";

/// The documents of the stand-in kubeadm's configuration line.
pub fn kubeadm_documents(line: &str) -> Vec<serde_json::Value> {
    let json = &line[line.find(CONFIG_RECEIVED).expect("config line") + CONFIG_RECEIVED.len()..];
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Array(docs)) => docs,
        other => panic!("the stand-in's configuration is not a JSON array: {other:?}\n{json}"),
    }
}

/// The document of `kind` among `docs`.
pub fn kubeadm_document<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
}

/// The test thread (and every thread and process it starts from now on: the join service's
/// runtime, swtpm, QEMU) in a network namespace of its own with nothing but loopback, so that
/// the VMs' unrestricted user networks and the join service's tunnel reach nothing else; the
/// thread goes back to the host's namespace when this is dropped.
pub struct PrivateNetwork {
    host: std::fs::File,
}

impl PrivateNetwork {
    pub fn enter() -> Self {
        use nix::sched::{CloneFlags, unshare};
        let host = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        unshare(CloneFlags::CLONE_NEWNET).expect("a network namespace (needs root)");
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("`ip` (install iproute2)");
        assert!(up.success(), "cannot bring up the namespace's loopback");
        PrivateNetwork { host }
    }
}

impl Drop for PrivateNetwork {
    fn drop(&mut self) {
        let _ = nix::sched::setns(&self.host, nix::sched::CloneFlags::CLONE_NEWNET);
    }
}

/// Whether `ip` answers one ping within 2 s (from the test's namespace, through the join
/// service's tunnel).
pub fn pings(ip: &str) -> bool {
    (0..3).any(|_| {
        std::process::Command::new("ping")
            .args(["-c", "1", "-W", "2", ip])
            .status()
            .expect("`ping` (install iputils-ping)")
            .success()
    })
}
