//! `hawser local up` with two control planes and a worker, driven the way a user drives it: the
//! `hawser-local` binary (what `hawser local` runs), real QEMU + OVMF + swtpm nodes on a LAN
//! between them, the real PID 1, `hawser-joind` on both control planes with its state in their
//! etcd (Debian's etcd-server, run by the kubeadm and kubelet stand-ins as kubeadm runs stacked
//! etcd). Real Kubernetes is `local_kubernetes.rs`.
//!
//! One cluster is formed (`hawser init` of node-1, node-2 joins as an approved control plane and
//! becomes an etcd member, node-3 joins as a worker, each found by mDNS), then each control
//! plane in turn is powered off while the worker reboots and rejoins through the other one, and
//! comes back by rejoining through the other one's join service — node-1, made by `hawser
//! init` and not by a join, included. Then the whole cluster is powered off and booted again:
//! the control planes are recovered by the admin (`hawser recover`), the worker rejoins.
//!
//! The Faults rows of docs/security.md name the steps of this test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Up;

/// Where this test's cluster and image live (never a developer's `~/.cache/hawser/local`).
fn test_dir() -> PathBuf {
    common::test_dir("local-cluster")
}

fn hawser(args: &[&str]) -> Command {
    common::hawser(&test_dir(), args)
}

fn local(args: &[&str]) -> String {
    common::local(&test_dir(), args)
}

fn console_tails() -> String {
    common::console_tails(&test_dir(), &["node-1", "node-2", "node-3"])
}

fn wait_for_console(node: &str, wanted: impl Fn(&str) -> bool) -> String {
    common::wait_for_console(&test_dir(), node, &["node-1", "node-2", "node-3"], wanted)
}

/// Asserts that `hawser local start|restart` brought `node` back by a rejoin through the join
/// service at `through` (a control plane's LAN address), not by the admin.
fn assert_rejoined_through(said: &str, node: &str, through: &str) {
    let attested = said
        .lines()
        .find(|l| l.starts_with(&format!("{node} attested (")))
        .unwrap_or_else(|| panic!("no attestation of {node} in:\n{said}"));
    assert!(
        attested.contains("IssueRejoinTicket via join-service"),
        "{node} did not rejoin through a join service: {attested}"
    );
    assert!(
        attested.contains(&format!("{through}:7000")),
        "{node} did not find the join service at {through}: {attested}"
    );
    assert!(
        said.contains(&format!("{node}: quote verified")),
        "{node}'s quote: {said}"
    );
    assert!(
        said.contains(&format!("{node}: back in the cluster, kubeadm done")),
        "{said}"
    );
}

const NODE_1: &str = "192.168.76.10";
const NODE_2: &str = "192.168.76.11";

#[test]
#[ignore = "builds the production node image and boots three QEMU nodes eleven times (~15 min under TCG)"]
fn a_cluster_of_two_control_planes_and_a_worker_survives_any_one_node_down() {
    let dir = test_dir();
    let _ = std::fs::remove_dir_all(dir.join("local"));
    let image = dir.join("image");
    let image = image.to_str().unwrap();
    // The image users ship: state disks with HMAC-SHA256 integrity and 96-byte keys, each
    // node's key checked on the host against the master secret at that length.
    // hawser's stand-ins for kubeadm and kubelet: eleven boots of real control planes would
    // take an hour under TCG (`local_kubernetes.rs` forms a cluster of real Kubernetes).
    let mut up = Up::start(
        &test_dir(),
        &[
            "--fresh",
            "--production",
            "--kubernetes",
            "stand-in",
            "--nodes",
            "3",
            "--control-planes",
            "2",
            "--out",
            image,
        ],
    );

    // `local stop` waits until the cluster is formed (every node attested, quoted, locked to
    // the cluster and past kubeadm: `local up` exits otherwise, and `stop` with it).
    let said = local(&["stop", "node-1"]);
    assert!(said.contains("node-1 powered off"), "{said}");
    let cmdline = std::fs::read_to_string(dir.join("image/cmdline")).unwrap();
    assert!(
        cmdline.contains("hawser.state_disk_integrity=hmac-sha256"),
        "not a production image: {cmdline}"
    );
    let status = local(&["status"]);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("node-1 ") && l.contains(" off ")),
        "{status}"
    );
    // The cluster's WireGuard mesh (`hawser init`'s default prefix): every node that joined
    // has its address in it (node-1 is 10.99.0.1, the others the next free ones).
    for node in ["node-2 ", "node-3 "] {
        assert!(
            status
                .lines()
                .any(|l| l.starts_with(node) && l.contains(" 10.99.0.")),
            "{node}has no address in the mesh:\n{status}"
        );
    }

    step_a_worker_rejoins_while_the_first_control_plane_is_down();
    step_the_first_control_plane_rejoins_through_the_second_while_a_new_node_joins();
    step_a_worker_rejoins_while_the_second_control_plane_is_down();
    step_the_second_control_plane_rejoins_through_the_first();

    local(&["down"]);
    let exit = up.0.wait().unwrap();
    assert!(exit.success(), "`hawser local up` ended with {exit}");

    step_full_cluster_restart_recovers_the_control_planes_and_rejoins_the_worker(image);
}

/// node-1 is off: node-3 reboots and rejoins through node-2's join service (its disk's binding
/// read from node-2's etcd member, which has no quorum without node-1's).
fn step_a_worker_rejoins_while_the_first_control_plane_is_down() {
    let said = local(&["restart", "node-3"]);
    assert_rejoined_through(&said, "node-3", NODE_2);
}

/// node-1 is still off when a new node asks to join (node-3 with a blank disk: a new LUKS2
/// UUID, so an admission, not a rejoin). Admitting it binds the new disk in etcd, which has no
/// quorum with one of its two members down: node-2's join service refuses it as unavailable,
/// naming etcd, and the node keeps asking. Then node-1 boots while node-2 runs: it rejoins
/// through node-2's join service with no admin (its disk, made by `hawser init`, was bound to
/// its AK by its own join service); its etcd member is back, and the new node is admitted.
fn step_the_first_control_plane_rejoins_through_the_second_while_a_new_node_joins() {
    let joining = std::thread::spawn(|| local(&["restart", "node-3", "--new-disk"]));
    let refused = wait_for_console("node-3", |line| {
        line.contains("join attempt") && line.contains("failed") && line.contains("etcd")
    });
    eprintln!("node-3 while node-1 is down: {refused}");
    let said = local(&["start", "node-1"]);
    assert!(!said.contains("hawser recover"), "{said}");
    assert_rejoined_through(&said, "node-1", NODE_2);
    let said = joining.join().unwrap();
    let attested = said
        .lines()
        .find(|l| l.starts_with("node-3 attested ("))
        .unwrap_or_else(|| panic!("no attestation of node-3 in:\n{said}"));
    assert!(
        attested.contains("IssueJoinTicket via join-service"),
        "node-3 was not admitted as a new node: {attested}"
    );
    assert!(
        said.contains("node-3: back in the cluster, kubeadm done"),
        "{said}"
    );
}

/// node-2 is off: node-3 reboots and rejoins through node-1's join service.
fn step_a_worker_rejoins_while_the_second_control_plane_is_down() {
    let said = local(&["stop", "node-2"]);
    assert!(said.contains("node-2 powered off"), "{said}");
    let said = local(&["restart", "node-3"]);
    assert_rejoined_through(&said, "node-3", NODE_1);
}

/// node-2 comes back through node-1's join service.
fn step_the_second_control_plane_rejoins_through_the_first() {
    let said = local(&["start", "node-2"]);
    assert_rejoined_through(&said, "node-2", NODE_1);
    let status = local(&["status"]);
    assert_eq!(
        status.matches("kubeadm done").count(),
        3,
        "every node past kubeadm: {status}"
    );
}

/// Every node was powered off: no join service can answer (each needs etcd, and etcd a
/// majority of its members), so `local up` recovers both control planes as the admin (`hawser
/// recover`) and the worker rejoins, with the image built above.
fn step_full_cluster_restart_recovers_the_control_planes_and_rejoins_the_worker(image: &str) {
    let output = hawser(&[
        "local",
        "up",
        "--once",
        "--quiet",
        "--nodes",
        "3",
        "--control-planes",
        "2",
        "--image",
        image,
    ])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stdout}");
    assert!(
        output.status.success(),
        "`hawser local up` again failed: {stderr}\n{}",
        console_tails()
    );
    // Both control planes are recovered by the admin: a join service needs etcd, and etcd a
    // majority of its two members. The worker rejoins.
    for node in ["node-1", "node-2"] {
        assert!(
            stderr.contains(&format!("{node} attested (Recover via admin")),
            "{node}: {stderr}"
        );
    }
    assert!(
        stderr.contains("node-3 attested (IssueRejoinTicket via join-service"),
        "node-3: {stderr}"
    );
    assert!(stdout.contains("past kubeadm: yes"), "{stdout}");
}
