//! A cluster's life after formation, on QEMU nodes (docs/lifecycle.md): a production cluster of
//! one control plane and two workers (hawser's kubeadm/kubelet stand-ins, Debian's etcd) is
//! upgraded to a second image, built for the same cluster with another `hawser.log` level on
//! its measured command line, so that PCRs 4, 9 and 11 of every node change:
//!
//! - `hawser local upgrade` adds the new release through node-1's attested admin API, reboots
//!   node-1 into it (`hawser recover` against the new release), then each worker (they rejoin
//!   through node-1's join service with their own disks), checks each with `hawser verify`
//!   (a fresh quote of each node after its pivot), and retires the old release;
//! - with `--check-retired`, node-3 boots the retired image once: it cannot rejoin, and
//!   `hawser verify` names its release as retired while it waits in its initramfs; then it boots
//!   the new image again;
//! - every node's state survived: each rejoined with its own disk (its key derived from the
//!   master secret for that disk's UUID, checked on the host), and each kept its place in the
//!   mesh (its WireGuard key and address are read from its state disk on every boot);
//! - every node re-attests on its own on the new release (a fresh quote riding on its polls of
//!   the mesh, judged by the join service);
//! - `hawser local revoke node-2`: the admin revokes a worker, and the other nodes' tunnels drop
//!   it within one poll of the mesh.
//!
//! Real Kubernetes is `local_kubernetes.rs`; the two-control-plane faults `local_cluster.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::path::PathBuf;

use common::Up;

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

fn test_dir() -> PathBuf {
    common::test_dir("local-upgrade")
}

fn local(args: &[&str]) -> String {
    common::local(&test_dir(), args)
}

/// `hawser local <args>` whose progress (stderr) is what the test reads.
fn local_said(args: &[&str]) -> String {
    let mut all = vec!["local"];
    all.extend_from_slice(args);
    eprintln!("$ hawser {}", all.join(" "));
    let output = common::hawser(&test_dir(), &all).output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprint!("{said}");
    assert!(
        output.status.success(),
        "`hawser {}` failed: {said}\n{}",
        all.join(" "),
        common::console_tails(&test_dir(), &NODES)
    );
    said
}

/// Each node's VPN address, from `hawser local status`.
fn vpn_addresses(status: &str) -> Vec<String> {
    NODES
        .iter()
        .map(|node| {
            status
                .lines()
                .find(|l| l.starts_with(&format!("{node} ")))
                .and_then(|l| l.split_whitespace().find(|w| w.starts_with("10.99.0.")))
                .unwrap_or_else(|| panic!("{node} has no mesh address:\n{status}"))
                .to_owned()
        })
        .collect()
}

#[test]
#[ignore = "builds two production node images and boots three QEMU nodes eight times (~12 min under TCG)"]
fn a_cluster_is_upgraded_to_a_new_image_node_by_node_and_a_revoked_worker_is_cut_off() {
    let dir = test_dir();
    let _ = std::fs::remove_dir_all(dir.join("local"));
    let (v1, v2) = (dir.join("image-v1"), dir.join("image-v2"));
    let (v1, v2) = (v1.to_str().unwrap(), v2.to_str().unwrap());
    let shape = [
        "--production",
        "--kubernetes",
        "stand-in",
        "--nodes",
        "3",
        "--control-planes",
        "1",
    ];
    // The next release first, for the cluster it creates (its provider CA, the admin's init
    // secret): the same image but for PID 1's log level on the measured command line.
    let mut build = vec![
        "up",
        "--fresh",
        "--build-only",
        "--node-log",
        "info",
        "--out",
        v2,
    ];
    build.extend_from_slice(&shape);
    local_said(&build);
    let mut args = vec!["--out", v1];
    args.extend_from_slice(&shape);
    let mut up = Up::start(&dir, &args);

    // `local upgrade` waits until the cluster is formed.
    let said = local_said(&["upgrade", "--image", v2, "--name", "v2", "--check-retired"]);
    let status = local(&["status"]);
    eprint!("{status}");
    let before = vpn_addresses(&status);
    assert!(said.contains("release v2 added"), "{said}");
    for node in NODES {
        assert!(
            said.contains(&format!("{node}: verified on release v2")),
            "{node} not verified on v2:\n{said}"
        );
        assert!(
            status
                .lines()
                .any(|l| l.starts_with(&format!("{node} ")) && l.contains(" v2 ")),
            "{node} does not run v2:\n{status}"
        );
    }
    // node-1 was recovered by the admin against v2; the workers rejoined with their disks
    // (the join report's key checked on the host against the master secret for their disk).
    assert!(
        said.contains("node-1 attested (Recover via admin"),
        "{said}"
    );
    for node in ["node-2", "node-3"] {
        assert!(
            said.contains(&format!(
                "{node} attested (IssueRejoinTicket via join-service"
            )),
            "{node} did not rejoin with its disk:\n{said}"
        );
    }
    assert!(
        said.contains("retired: its nodes are refused by name"),
        "{said}"
    );
    assert!(
        said.contains(
            "node-3 on the retired release is refused: `hawser verify` says it runs release image-"
        ) && said.contains("which is retired"),
        "{said}"
    );
    assert!(
        said.contains("the cluster runs release v2 on every node; `hawser verify` passed"),
        "{said}"
    );
    // Each node proved its state again on its own (its polls of the mesh carry a fresh quote
    // when its join service asks), on the new release.
    assert!(
        said.contains("every node re-attested on its own since it booted release v2: node-1 as v2 control-plane"),
        "{said}"
    );
    // The state read from each disk after the upgrade: the same place in the mesh.
    let status = local(&["status"]);
    assert_eq!(vpn_addresses(&status), before, "{status}");
    assert_eq!(status.matches("kubeadm done").count(), 3, "{status}");

    let said = local_said(&["revoke", "node-2", "--reason", "decommissioned"]);
    assert!(said.contains("node-2 (10.99.0."), "{said}");
    assert!(
        said.contains("node-2 is cut off: node-1, node-3 dropped it"),
        "{said}"
    );

    local(&["down"]);
    let exit = up.0.wait().unwrap();
    assert!(exit.success(), "`hawser local up` ended with {exit}");
}
