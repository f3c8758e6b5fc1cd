//! What every `hawser local up` shares, whether of one node (`single.rs`) or of a cluster
//! (`cluster.rs`): its options, where local clusters live, and waiting on a console marker
//! until a stop signal.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hawser_cli::image_build::NodeKubernetes;
use hawser_harness::Vm;
use hawser_image::inputs;
use hawser_image::profile::ImageProfile;

/// Where local clusters live: `$HAWSER_LOCAL_DIR`, or `local/` in hawser's cache
/// (`~/.cache/hawser`). The test suite points it elsewhere, so that it never touches a
/// developer's own local cluster.
pub fn local_dir() -> PathBuf {
    std::env::var_os("HAWSER_LOCAL_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| inputs::cache_dir().join("local"), PathBuf::from)
}

#[derive(Args)]
pub struct UpOptions {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 2)]
    pub(crate) nodes: usize,
    /// How many of the nodes are control planes (the first is initialized with `hawser init`,
    /// the others join with the admin's approval of their TPM's attestation key).
    #[arg(long, default_value_t = 1)]
    pub(crate) control_planes: usize,
    /// Start a new cluster: remove the local cluster's disks, TPMs and admin secrets first.
    #[arg(long)]
    pub(crate) fresh: bool,
    /// DEVELOPMENT SHORTCUT, one node: a join service on the host that the node trusts WITHOUT
    /// attesting it (`hawser.join_service_trust=insecure-dev` on its measured command line).
    #[arg(long, conflicts_with_all = ["init", "nodes", "control_planes", "fresh"])]
    pub(crate) insecure_dev_join_service: bool,
    /// Boot the node image already built in this directory (`hawser image build --out
    /// DIR` with the local command line: hawser.efi and hawser-disk.raw) instead of
    /// building one.
    #[arg(long)]
    pub(crate) image: Option<PathBuf>,
    /// Where to build the image.
    #[arg(long, default_value = "out")]
    pub(crate) out: PathBuf,
    /// Build the image users ship: a production image, whose state disks have HMAC-SHA256
    /// integrity (`hawser image build`'s default; 96-byte disk keys, a first-boot wipe of each
    /// disk). Without it `local up` builds a development image (AES-XTS only), the fast path.
    #[arg(long, conflicts_with = "image")]
    pub(crate) production: bool,
    /// The Kubernetes the node image carries: v1.20.2 built from the pinned Debian source (a
    /// real cluster: minutes per node under TCG), upstream's release binaries, or hawser's
    /// stand-ins (not Kubernetes: the fast path for working on the boot chain).
    /// Default: `source` for a cluster; `stand-in` for one node (`--init`,
    /// `--insecure-dev-join-service`), whose join service is on the host with no API server.
    #[arg(long, value_enum, conflicts_with = "image")]
    pub(crate) kubernetes: Option<NodeKubernetes>,
    /// Form the cluster without the WireGuard mesh (`hawser init --no-mesh`): the nodes talk
    /// over their LAN, and pods on different nodes cannot reach each other. By default the
    /// cluster's mesh is `10.99.0.0/24` (node-1 is 10.99.0.1) and the node IPs are in it.
    #[arg(long, conflicts_with_all = ["init", "insecure_dev_join_service"])]
    pub(crate) no_mesh: bool,
    /// QEMU accelerator (tcg, kvm); default: $HAWSER_QEMU_ACCEL or tcg.
    #[arg(long)]
    pub(crate) accel: Option<String>,
    /// Guest memory in MiB; default: 2560 for a control plane of real Kubernetes (etcd, the
    /// API server, the controllers and the kubelet), 1536 for a worker, 1024 with stand-ins.
    #[arg(long)]
    pub(crate) memory: Option<u32>,
    /// Virtual CPUs of every node; default: 2 with real Kubernetes (under TCG each vCPU is a
    /// host thread: node-1's wipe, images' import and `kubeadm init` use both cores while it
    /// runs alone), 1 with stand-ins.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) cpus: Option<u32>,
    /// Do not echo the serial console (the boot report summary is still printed).
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Power off once the boot report is verified and kubeadm has run (or the node said why
    /// not), instead of waiting for Ctrl-C.
    #[arg(long)]
    pub(crate) once: bool,
    /// One node that waits for YOUR `hawser init` on 127.0.0.1:<init-port> (the command is
    /// printed).
    /// (The init secret's hash goes on the image's measured command line, so the image is
    /// built for it: not with --image.)
    #[arg(long, conflicts_with_all = ["nodes", "control_planes", "fresh", "image"])]
    pub(crate) init: bool,
    /// The host port forwarded to the node's init server (port 9000 in the guest).
    #[arg(long, default_value_t = 9000)]
    pub(crate) init_port: u16,
    /// PID 1's log level on the image's measured command line (`hawser.log=LEVEL`): another
    /// level is another image (PCRs 4, 9 and 11 differ), e.g. the next release for `hawser
    /// local upgrade`.
    #[arg(long, value_parser = ["error", "warn", "info", "debug", "trace"], conflicts_with = "image")]
    pub(crate) node_log: Option<String>,
    /// Create the cluster's host side if needed and build its node image into `--out`, then
    /// exit without booting (an image for `hawser local upgrade --image`).
    #[arg(long, conflicts_with_all = ["image", "once", "init", "insecure_dev_join_service"])]
    pub(crate) build_only: bool,
}

impl UpOptions {
    /// Whether the nodes run real Kubernetes: an image built here with `--kubernetes source`
    /// or `release`, or one given with `--image` whose UKI's command line names real
    /// Kubernetes (an image it cannot read is sized as real: more memory does no harm).
    pub(crate) fn real_kubernetes(&self) -> bool {
        match &self.image {
            Some(dir) => crate::localhost::image_runs_real_kubernetes(
                &dir.join(hawser_image::build::UKI_FILE),
            )
            .unwrap_or(true),
            None => self.kubernetes() != NodeKubernetes::StandIn,
        }
    }

    /// `--kubernetes`, or its default for this kind of `local up`.
    pub(crate) fn kubernetes(&self) -> NodeKubernetes {
        self.kubernetes
            .unwrap_or(if self.init || self.insecure_dev_join_service {
                NodeKubernetes::StandIn
            } else {
                NodeKubernetes::Source
            })
    }

    /// The size of a new node's (sparse) state disk of `role`: with real Kubernetes, room on a
    /// control plane for containerd's store of the control-plane images (~630 MB unpacked) and
    /// etcd, 2 GiB; on a worker for the node images and its pods, 1 GiB; 256 MiB with
    /// stand-ins. A production image wipes all of it on the first boot (~37 s per GiB under
    /// TCG on an idle core, and the worker's wipe runs beside node-1's control plane).
    pub(crate) fn state_disk_bytes(&self, role: crate::local_cluster::Role) -> u64 {
        match (self.real_kubernetes(), role) {
            (true, crate::local_cluster::Role::ControlPlane) => 2 << 30,
            (true, crate::local_cluster::Role::Worker) => 1 << 30,
            (false, _) => 256 << 20,
        }
    }

    /// The guest memory of a node of `role` (see `--memory`).
    pub(crate) fn memory_mib(&self, role: crate::local_cluster::Role) -> u32 {
        match (self.memory, self.real_kubernetes(), role) {
            (Some(mib), _, _) => mib,
            (None, false, _) => 1024,
            (None, true, crate::local_cluster::Role::ControlPlane) => 2560,
            (None, true, crate::local_cluster::Role::Worker) => 1536,
        }
    }

    /// The virtual CPUs of every node (see `--cpus`).
    pub(crate) fn cpus(&self) -> u32 {
        match (self.cpus, self.real_kubernetes()) {
            (Some(cpus), _) => cpus,
            (None, true) => 2,
            (None, false) => 1,
        }
    }

    /// The mesh prefix `hawser init` of node-1 is given; `None` with `--no-mesh`.
    pub(crate) fn mesh_prefix(&self) -> Option<hawser_mesh::Ipv4Net> {
        if self.no_mesh {
            return None;
        }
        hawser_cli::cluster::DEFAULT_VPN_PREFIX.parse().ok()
    }

    /// The image profile `--production` asks for.
    pub(crate) fn profile(&self) -> ImageProfile {
        if self.production {
            ImageProfile::Production
        } else {
            ImageProfile::Development
        }
    }
}

/// Waits for `marker`, returning `None` if a stop signal arrives first.
pub(crate) fn wait_or_stop(
    vm: &Vm,
    marker: impl hawser_harness::LineMatcher + Copy,
    timeout: Duration,
    stop: &AtomicBool,
) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    let label = marker.describe();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match vm.wait_for_marker(&label, marker, Duration::from_millis(500)) {
            Ok(line) => return Ok(Some(line)),
            Err(hawser_harness::QemuError::Timeout { .. }) if Instant::now() < deadline => {}
            Err(e) => return Err(e.into()),
        }
    }
}
