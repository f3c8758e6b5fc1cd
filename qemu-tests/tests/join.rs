//! A node joins: it attests to a real `hawser-joind` on the host over aTLS, receives the key
//! derived for its state disk's LUKS2 UUID, takes the node lock (PCR 15 ← cluster ID), and a
//! node from an image whose command line differs by one byte is refused.
//!
//! The join service runs in this process on 127.0.0.1; the guest reaches it only through QEMU
//! user networking's `guestfwd` (10.0.2.100:7000 → the service), with `restrict=on` so the
//! guest reaches nothing else. Its trust in the service is `insecure-dev` (the host service does
//! not attest); the service verifies the node against the image's predicted measurements and
//! the harness's provider CA, which certified the node's AK before boot.
//!
//! `#[ignore]`d like the other boot tests (OVMF boots under TCG, ~25 s each):
//! `cargo test -p hawser-qemu --test join -- --ignored --test-threads=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_harness::{Vm, VmConfig};
use hawser_image::build::BuildOutput;
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_local::localhost::{self, free_port, luks_uuid};

mod common;
use common::{Host, build_image};

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-join", name)
}

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

fn join_cmdline() -> String {
    localhost::node_cmdline(DEFAULT_CMDLINE, true)
}

fn build(name: &str, cmdline: &str) -> BuildOutput {
    build_image(&scratch(name), Some(cmdline))
}

fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build("image", &join_cmdline()))
}

fn host(name: &str, uki: &Path) -> Host {
    Host::new(&scratch(name), uki)
}

/// A fresh node of `host` booting `uki`.
fn boot(host: &Host, uki: &Path, port: u16) -> (Vm, PathBuf) {
    let config = host.node(VmConfig::uefi(uki), "join", port, true);
    (Vm::start(config).unwrap(), host.state_disk())
}

/// (1) + (2): the join service is down when the node boots; the node retries, logging why;
/// the service comes up; the node receives the key derived for its disk's UUID, and its quote
/// shows PCR 15 locked to the cluster ID.
#[test]
#[ignore = "boots QEMU (~1 min under TCG)"]
fn a_node_joins_after_retries_and_gets_the_key_of_its_disk() {
    let image = image();
    let host = host("join", &image.uki.path);
    let port = free_port().unwrap();
    let (vm, disk) = boot(&host, &image.uki.path, port);

    let failure = vm
        .wait_for_line("join attempt 2", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    eprintln!("while the service is down: {failure}");
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));

    let line = vm
        .wait_for_marker("join report", JOIN_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let join = JoinReport::find_in_console(&line).unwrap().unwrap();
    let report_line = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let report = BootReport::find_in_console(&report_line).unwrap().unwrap();
    let verified = report.verify(None).unwrap();
    vm.kill();
    let console = vm.console_lines().join("\n");
    host.runtime.block_on(service.shutdown());

    // The node told the truth about its disk, and its key is the KDF's for that disk.
    let uuid = luks_uuid(&disk).expect("the node formatted its state disk");
    assert_eq!(join.disk_uuid, uuid.as_str(), "{console}");
    assert_eq!(join.rpc, "IssueJoinTicket");
    assert_eq!(join.via, "join-service");
    let expected_key = host
        .cluster
        .master_secret()
        .state_disk_key(&uuid, hawser_keys::StateDiskKeyLength::Xts)
        .unwrap();
    assert_eq!(
        join.key_fingerprint,
        hawser_keys::fingerprint(&expected_key).as_str()
    );
    assert!(u64::from(join.attempts) >= 3, "{join:?}");
    assert!(
        console.contains("join attempt 1 (IssueJoinTicket to 10.0.2.100:7000) failed"),
        "{console}"
    );
    // The lock: PCR 15 in the signed quote is the cluster ID's extension.
    let cluster_id = host.cluster.cluster_id();
    assert_eq!(join.cluster_id, hex::encode(cluster_id).as_str());
    assert_eq!(
        verified.pcrs[&15],
        hawser_pcr::cluster_lock_pcr(&cluster_id)
    );
    // Secrets never reach the console.
    assert!(!console.contains(&hex::encode(&*expected_key)));
    assert!(!console.contains("FATAL"), "{console}");
}

/// (3): an image whose command line differs by one byte is refused; the node's log names the
/// PCRs (9 and/or 11) that differ.
#[test]
#[ignore = "builds a second image and boots QEMU (~1 min under TCG)"]
fn a_node_with_a_changed_cmdline_is_refused_naming_the_pcr() {
    let good = image();
    let changed = join_cmdline().replace("panic=30", "panic=31");
    let bad = build("image-changed", &changed);
    let host = host("join-refused", &good.uki.path);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    let (vm, _disk) = boot(&host, &bad.uki.path, port);
    let refusal = vm
        .wait_for_line(
            |line: &str| {
                line.contains("join attempt") && (line.contains("PCR 9") || line.contains("PCR 11"))
            },
            BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    eprintln!("refusal: {refusal}");
    vm.kill();
    host.runtime.block_on(service.shutdown());
    assert!(!vm.console_lines().join("\n").contains(JOIN_REPORT_MARKER));
}
