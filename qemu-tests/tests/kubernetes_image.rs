//! The node image with real Kubernetes booted as a node: v1.20.2 built from the pinned source
//! (`kubernetes.lock`), as `hawser image build` makes it by default.
//!
//! 1. A fresh node joins as a worker (the host's join service hands out a worker's ticket, of
//!    the image's version, which PID 1 checks against `hawser.kubernetes` before it formats the
//!    disk), pivots, reads the rootfs's `/usr/share/hawser/kubernetes.json` (its version the
//!    command line's), starts containerd, imports the **node archive only** — pause, kube-proxy
//!    and busybox for test pods, not the control-plane archive's four images — into containerd's
//!    store on the encrypted state disk (all three listed afterwards, or the boot stops), then
//!    starts the real kubelet and runs the real `kubeadm join`, which waits in discovery: no
//!    control plane answers the ticket's endpoint here. ACPI power-off: the services stop, the
//!    disk closes.
//! 2. The node boots again: it rejoins (still a worker: its kept intent is a worker's join),
//!    and containerd's store already holds the node archive's images, so nothing is imported.
//!
//! No cluster forms here; forming one of real Kubernetes is the local cluster's. The other QEMU
//! tests of the boot path use stand-in images (`common::build_node_image`) for speed.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test kubernetes_image -- --ignored --test-threads=1 --nocapture`
//! after the Kubernetes build (`hawser image kubernetes`), which the image build would otherwise
//! run (10–13 min cold).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hawser_harness::{Vm, VmConfig, format_timeline};
use hawser_image::pipeline::{DEFAULT_CMDLINE, KubernetesOrigin};
use hawser_local::localhost::{self, free_port};

mod common;
use common::{Host, build_node_image_of};

/// Generous: OVMF + pivot + containerd + importing the node archive (~45 MB) under TCG.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);
/// Room for containerd's store: the archive's blobs and their unpacked snapshots.
const STATE_DISK_BYTES: u64 = 2 << 30;
/// PID 1's teardown with every file system unmounted and the state disk closed.
const CLEAN_TEARDOWN: &str = "device-mapper devices (0 failed)";
/// PID 1's decision: a worker (its ticket carries no control-plane files).
const WORKER: &str = "images: this node is a worker (a worker's join ticket): it imports the \
                      node archive only, 3 images";
/// Boot 2 decides from the intent boot 1 kept (kubeadm join never finished here).
const WORKER_AGAIN: &str = "images: this node is a worker (a worker's join again, from the \
                            intent an earlier boot kept)";
const NODE_ARCHIVE: &str = "/usr/share/hawser/kubernetes/node-images.tar";
const CONTROL_PLANE_ARCHIVE: &str = "/usr/share/hawser/kubernetes/control-plane-images.tar";
const IMPORTED: &str = "imported 3 images (a worker: node images only) in ";
const ALREADY_THERE: &str =
    "containerd has the 3 images already (a worker: node images only): nothing to import";

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-kubernetes", name)
}

fn console(vm: &Vm) -> String {
    vm.console_lines().join("\n")
}

fn wait(vm: &Vm, label: &str, what: &str) -> String {
    vm.wait_for_marker(label, what, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(vm)))
}

/// Powers the node off by ACPI and returns its console; the teardown must be clean.
fn power_off(vm: Vm, boot: &str) -> String {
    vm.powerdown().unwrap();
    let status = vm
        .wait_for_exit(Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("no power-off after ACPI: {e}\n{}", console(&vm)));
    let text = console(&vm);
    eprintln!("{boot}: {}", format_timeline(&vm.timeline()));
    assert!(status.success(), "{status:?}\n{text}");
    assert!(text.contains(CLEAN_TEARDOWN), "{text}");
    assert!(!text.contains("FATAL"), "{text}");
    text
}

#[test]
#[ignore = "builds the node image with real Kubernetes and boots it twice (~6 min under TCG); run by scripts/test"]
fn a_worker_of_the_real_kubernetes_image_imports_the_node_images_once_and_runs_real_kubeadm() {
    let image = build_node_image_of(
        &scratch("image"),
        &localhost::node_cmdline(DEFAULT_CMDLINE, true),
        None,
        KubernetesOrigin::Source,
    );
    assert_eq!(image.rootfs.kubernetes.origin, KubernetesOrigin::Source);
    assert_eq!(image.rootfs.kubernetes.version, "v1.20.2");
    let uki = &image.image.uki.path;
    let version = localhost::image_kubernetes_version(uki)
        .unwrap()
        .expect("hawser.kubernetes on the image's command line");
    assert_eq!(version.to_string(), "v1.20.2");

    let mut host = Host::new(&scratch("cluster"), uki);
    // The join service hands out the image's version: a node refuses any other.
    host.cluster.set_kubernetes_version(&version);
    let port = free_port().unwrap();
    let _service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    std::fs::File::create(host.state_disk())
        .and_then(|f| f.set_len(STATE_DISK_BYTES))
        .unwrap();
    let node = |name: &str| {
        // `fresh: false` keeps the state disk made above (the TPM is provisioned once).
        host.node(VmConfig::uefi_disk(&image.disk.path), name, port, false)
            .memory_mib(1536)
    };

    // Boot 1: join, pivot, the images imported, the real kubelet and kubeadm.
    let vm = Vm::start(node("node-1")).unwrap();
    wait(&vm, "pivot", "switched into the rootfs");
    wait(
        &vm,
        "the image's Kubernetes",
        "this image carries Kubernetes v1.20.2 (built from the pinned source), 7 images: 3 for \
         every node, 4 for control planes",
    );
    wait(&vm, "a worker's images", WORKER);
    wait(&vm, "images imported", IMPORTED);
    wait(
        &vm,
        "kubeadm join",
        "running kubeadm once: /usr/bin/kubeadm join",
    );
    // Real kubeadm 1.20 in discovery, the real kubelet restarting until kubeadm writes its
    // configuration: a moment for both to say something.
    std::thread::sleep(Duration::from_secs(20));
    let first = power_off(vm, "boot 1");
    assert!(
        first.contains("this node's Kubernetes differs from a stock kubeadm cluster: CoreDNS"),
        "{first}"
    );
    assert!(!first.contains("STAND-IN"), "a stand-in ran: {first}");
    assert!(first.contains("--skip-phases=preflight"), "{first}");
    // The node archive, and never the control plane's.
    assert!(
        first.contains(&format!("importing {NODE_ARCHIVE} (3 images, ")),
        "{first}"
    );
    assert!(
        first.contains(&format!("imported {NODE_ARCHIVE} in ")),
        "{first}"
    );
    assert!(
        !first.contains(&format!("importing {CONTROL_PLANE_ARCHIVE}")),
        "a worker imported the control-plane archive: {first}"
    );
    let line = |text: &str, marker: &str| {
        text.lines()
            .find(|l| l.contains(marker))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    eprintln!("boot 1: {}", line(&first, "importing /usr/share"));
    eprintln!("boot 1: {}", line(&first, IMPORTED));

    // Boot 2: rejoin; containerd's store on the state disk has every image.
    let vm = Vm::start(node("node-2")).unwrap();
    wait(&vm, "pivot", "switched into the rootfs");
    wait(&vm, "still a worker", WORKER_AGAIN);
    wait(&vm, "images present", ALREADY_THERE);
    wait(
        &vm,
        "kubeadm join",
        "running kubeadm once: /usr/bin/kubeadm join",
    );
    let second = power_off(vm, "boot 2");
    assert!(!second.contains(IMPORTED), "imported again: {second}");
    assert!(
        !second.contains(&format!("importing {CONTROL_PLANE_ARCHIVE}")),
        "a worker imported the control-plane archive: {second}"
    );
    eprintln!("boot 2: {}", line(&second, ALREADY_THERE));
}
