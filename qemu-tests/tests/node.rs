//! A whole node: OVMF boots the disk image's UKI; PID 1 attests to `hawser-joind` on the host,
//! opens its encrypted state disk, verifies the rootfs with dm-verity against the root hash on
//! its measured command line, pivots into it, starts containerd and the kubelet, and runs
//! `kubeadm join` with the configuration built from its join ticket — once per node lifetime.
//!
//! The rootfs of these machines' offline builds carries hawser's kubeadm and kubelet
//! *stand-ins* (crate `hawser-standin`, never Kubernetes): the stand-in kubeadm validates the
//! configuration against the v1beta4 API and prints it (secrets redacted), which is what the
//! test checks.
//!
//! Boots (OVMF under TCG, ~1 min each to the kubeadm call), sharing one image and one cluster:
//! 1. fresh node: join → pivot → `kubeadm join` with the ticket's endpoint, token and CA
//!    hash, node name and IP; then ACPI power-off: services stop in order, the state disk is
//!    unmounted and closed, the VM powers off;
//! 2. reboot: rejoin (IssueRejoinTicket) → the same disk reopens, the state file system was
//!    cleanly unmounted, the kubelet starts, kubeadm does not run again;
//! 3. the disk image with one byte of the rootfs partition flipped: dm-verity refuses the
//!    block, the node stops with a clear message and never runs kubeadm.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test node -- --ignored --test-threads=1 --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::SocketAddr;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use hawser_attestation::report::{JOIN_REPORT_MARKER, JoinReport};
use hawser_cli::localhost::{self, free_port};
use hawser_image::pipeline::{DEFAULT_CMDLINE, NodeImage};
use hawser_qemu::{Vm, VmConfig, format_timeline};

mod common;
use common::{
    CONFIG_RECEIVED, Host, NO_SECOND_KUBEADM, build_node_image, kubeadm_document as document,
    kubeadm_documents,
};

/// Generous: OVMF + pivot + services under TCG on a loaded 2-core CI machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(360);
/// The kubelet stand-in's line once it runs with the configuration kubeadm wrote.
const KUBELET_RUNNING: &str = "[kubelet] kubelet STAND-IN (not Kubernetes): started for node";
/// PID 1's teardown with every file system unmounted and the state disk closed.
const CLEAN_TEARDOWN: &str = "device-mapper devices (0 failed)";
/// PID 1's line on a state disk that was cleanly unmounted.
const CLEAN_STATE: &str = "state file system: clean (nothing in its journal to replay)";

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-node", name)
}

fn image() -> &'static NodeImage {
    static IMAGE: OnceLock<NodeImage> = OnceLock::new();
    IMAGE.get_or_init(|| {
        build_node_image(
            &scratch("image"),
            &localhost::node_cmdline(DEFAULT_CMDLINE, true),
            None,
        )
    })
}

fn console(vm: &Vm) -> String {
    vm.console_lines().join("\n")
}

fn wait(vm: &Vm, label: &str, what: &str) -> String {
    vm.wait_for_marker(label, what, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(vm)))
}

#[test]
#[ignore = "boots QEMU three times (~4 min under TCG); run by scripts/test"]
fn a_node_joins_runs_kubeadm_once_and_rejoins_after_a_clean_power_off() {
    let image = image();
    let host = Host::new(&scratch("cluster"), &image.image.uki.path);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));

    // Boot 1: join, pivot, kubeadm join.
    let vm =
        Vm::start(host.node(VmConfig::uefi_disk(&image.disk.path), "node-1", port, true)).unwrap();
    let join_line = wait(&vm, "join report", JOIN_REPORT_MARKER);
    let join = JoinReport::find_in_console(&join_line).unwrap().unwrap();
    wait(&vm, "pivot", "switched into the rootfs");
    let config_line = wait(&vm, "kubeadm call", CONFIG_RECEIVED);
    wait(&vm, "kubeadm done", "kubeadm join succeeded");
    let kubelet_line = wait(&vm, "kubelet running", KUBELET_RUNNING);
    vm.powerdown().unwrap();
    let status = vm
        .wait_for_exit(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("no power-off after ACPI: {e}\n{}", console(&vm)));
    let first = console(&vm);
    eprintln!("boot 1: {}", format_timeline(&vm.timeline()));
    // PID 1's memory after the pivot and kubeadm, for docs/rootfs.md.
    let memory = first.lines().find(|l| l.contains("PID 1 resident memory"));
    eprintln!("boot 1: {}", memory.unwrap_or("(no memory line)"));
    assert!(memory.is_some(), "{first}");
    assert!(status.success(), "{status:?}\n{first}");

    // The configuration kubeadm received is the join ticket's, for this node.
    let docs = kubeadm_documents(&config_line);
    let join_config = document(&docs, "JoinConfiguration");
    assert_eq!(join_config["apiVersion"], "kubeadm.k8s.io/v1beta4");
    let discovery = &join_config["discovery"]["bootstrapToken"];
    // What the local cluster's join service hands out (no control plane on the host).
    assert_eq!(
        discovery["apiServerEndpoint"], "10.0.2.100:6443",
        "{docs:#?}"
    );
    assert_eq!(discovery["token"], "nocpln.<redacted>", "{docs:#?}");
    assert_eq!(
        discovery["caCertHashes"][0],
        format!("sha256:{}", "00".repeat(32)).as_str()
    );
    let registration = &join_config["nodeRegistration"];
    let node_name = hawser_init_node_name(&join.disk_uuid);
    assert_eq!(registration["name"], node_name.as_str(), "{docs:#?}");
    assert!(
        registration.to_string().contains("10.0.2.15"),
        "the node IP: {docs:#?}"
    );
    // Services ran, and stopped in order at power-off (the kubelet before containerd); every
    // file system was unmounted and the state disk closed.
    let kubelet_stop = first.find("[kubelet] kubelet STAND-IN (not Kubernetes): SIGTERM received");
    let containerd_stop = first.find("containerd stopped");
    assert!(
        kubelet_stop.is_some() && containerd_stop.is_some(),
        "{first}"
    );
    assert!(kubelet_stop < containerd_stop, "{first}");
    assert!(first.contains(CLEAN_TEARDOWN), "{first}");
    assert!(first.contains("containerd successfully booted"), "{first}");
    // The kubelet runs as the node kubeadm registered (the hostname PID 1 set).
    assert!(
        kubelet_line.contains(&format!("started for node {node_name} ")),
        "{kubelet_line}"
    );
    assert!(!first.contains("FATAL"), "{first}");

    // Boot 2: rejoin, no second kubeadm.
    let vm =
        Vm::start(host.node(VmConfig::uefi_disk(&image.disk.path), "node-2", port, false)).unwrap();
    let rejoin_line = wait(&vm, "join report", JOIN_REPORT_MARKER);
    let rejoin = JoinReport::find_in_console(&rejoin_line).unwrap().unwrap();
    wait(&vm, "no second kubeadm", NO_SECOND_KUBEADM);
    wait(&vm, "kubelet running", KUBELET_RUNNING);
    vm.kill();
    let second = console(&vm);
    eprintln!("boot 2: {}", format_timeline(&vm.timeline()));
    host.runtime.block_on(service.shutdown());
    assert_eq!(rejoin.rpc, "IssueRejoinTicket", "{second}");
    assert_eq!(rejoin.disk_uuid, join.disk_uuid);
    assert_eq!(rejoin.key_fingerprint, join.key_fingerprint);
    assert!(!second.contains(CONFIG_RECEIVED), "{second}");
    // The power-off of boot 1 left the state file system clean: no journal replay.
    assert!(second.contains(CLEAN_STATE), "{second}");
    assert!(!second.contains("FATAL"), "{second}");
}

/// The node name PID 1 derives from the disk UUID (`init::join::client::node_name`).
fn hawser_init_node_name(disk_uuid: &str) -> String {
    format!("hawser-{}", &disk_uuid[..8])
}

#[test]
#[ignore = "boots QEMU (~1 min under TCG); run by scripts/test"]
fn a_flipped_rootfs_byte_stops_the_node_before_kubeadm() {
    let image = image();
    let dir = scratch("verity");
    let disk = dir.join("tampered.raw");
    std::fs::copy(&image.disk.path, &disk).unwrap();
    // One byte of the erofs superblock (1024 bytes into the root partition): read at mount.
    let root = &image.disk.partitions[1];
    let offset = root.offset() + 1024 + 8;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&disk)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x01], offset).unwrap();
    drop(file);

    let host = Host::new(&dir.join("cluster"), &image.image.uki.path);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    let vm = Vm::start(host.node(VmConfig::uefi_disk(&disk), "tampered", port, true)).unwrap();
    // The kernel's own lines: dm-verity names the block, then panics (panic_on_corruption).
    let line = vm
        .wait_for_line(
            |line: &str| line.contains("device-mapper: verity") && line.contains("is corrupted"),
            BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    eprintln!("verity: {line}");
    wait(
        &vm,
        "kernel panic",
        "Kernel panic - not syncing: dm-verity device corrupted",
    );
    // Give a wrongly continuing boot the time to reach kubeadm, then look.
    std::thread::sleep(Duration::from_secs(20));
    vm.kill();
    host.runtime.block_on(service.shutdown());
    let console = console(&vm);
    assert!(!console.contains(CONFIG_RECEIVED), "{console}");
    assert!(!console.contains("switched into the rootfs"), "{console}");
}
