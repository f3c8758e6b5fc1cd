//! What `local up` tells of the cluster: `status.json`, kept current while it runs (what
//! `hawser local status` reads), and the closing summary.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_cli::cluster::ClusterFile;

use super::{Admin, Events, Node};
use crate::kubectl::{self, KubeNode};
use crate::local_cluster::{Layout, NodeStatus, Stage, StatusFile, observe};

/// Keeps `status.json` current while `local up` runs.
pub(super) fn keep_status(
    dir: &Path,
    admin: &Admin,
    layout: &Layout,
    nodes: &Mutex<Vec<Arc<Node>>>,
    running: &AtomicBool,
) {
    let mut kubernetes = None;
    let mut asked: Option<Instant> = None;
    while running.load(Ordering::Relaxed) {
        let nodes = nodes.lock().map(|n| n.clone()).unwrap_or_default();
        // Kubernetes' view once the host kubeconfig exists (after kubeadm), every POLL.
        if asked.is_none_or(|at| at.elapsed() >= super::kube::POLL)
            && admin.host_kubeconfig().is_file()
        {
            asked = Some(Instant::now());
            match kubectl::nodes(&admin.host_kubeconfig()) {
                Ok(view) => kubernetes = Some(view),
                Err(e) => tracing::debug!("kubectl get nodes: {e:#}"),
            }
        }
        write_status(dir, admin, layout, &nodes, kubernetes.as_deref());
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub(super) fn write_status(
    dir: &Path,
    admin: &Admin,
    layout: &Layout,
    nodes: &[Arc<Node>],
    kubernetes: Option<&[KubeNode]>,
) {
    let status = StatusFile {
        pid: std::process::id(),
        cluster_id: ClusterFile::read(&admin.cluster_file())
            .ok()
            .map(|c| c.cluster_id),
        nodes: layout
            .nodes
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let node = nodes.iter().find(|n| n.spec.name == spec.name);
                let mut seen = node
                    .map(|n| observe(&n.vm.console_lines()))
                    .unwrap_or_default();
                if node.is_some_and(|n| n.vm.exit_status().is_some()) {
                    seen.stage = Some(Stage::Off);
                }
                let kubernetes = kubernetes
                    .and_then(|view| kubectl::node_at(view, &seen.node_ip(i)))
                    .cloned();
                NodeStatus {
                    release: node.map(|n| n.release.clone()),
                    name: spec.name.clone(),
                    role: spec.role,
                    seen,
                    quote_verified: node.is_some_and(|n| n.quote_verified.load(Ordering::Relaxed)),
                    // The live log while it exists (QEMU runs, or a node powered off by
                    // `hawser local stop`); the copy kept in the node's directory after.
                    console_log: node
                        .filter(|n| n.vm.console_log_path().exists())
                        .map_or_else(
                            || {
                                dir.join(&spec.name)
                                    .join("logs")
                                    .join(format!("{}.console.log", spec.name))
                            },
                            |n| n.vm.console_log_path().to_owned(),
                        ),
                    kubernetes,
                }
            })
            .collect(),
    };
    if let Err(e) = status.write(dir) {
        tracing::warn!("{e:#}");
    }
}

/// The closing summary: one line per node, the cluster, and the timeline.
pub(super) fn summary(
    nodes: &[Arc<Node>],
    layout: &Layout,
    admin: &Admin,
    kubernetes: Option<&[KubeNode]>,
    events: &Events,
) -> bool {
    let mut out = std::io::stdout().lock();
    let cluster_id = ClusterFile::read(&admin.cluster_file())
        .ok()
        .map(|c| c.cluster_id);
    let _ = writeln!(
        out,
        "\n── local cluster ───────────────────────────────────────────"
    );
    let status = StatusFile {
        pid: std::process::id(),
        cluster_id: cluster_id.clone(),
        nodes: nodes
            .iter()
            .map(|n| {
                let seen = observe(&n.vm.console_lines());
                let kubernetes = kubernetes
                    .zip(layout.index_of(&n.spec.name))
                    .and_then(|(view, i)| kubectl::node_at(view, &seen.node_ip(i)))
                    .cloned();
                NodeStatus {
                    name: n.spec.name.clone(),
                    role: n.spec.role,
                    seen,
                    quote_verified: n.quote_verified.load(Ordering::Relaxed),
                    console_log: n.vm.console_log_path().to_owned(),
                    kubernetes,
                    release: Some(n.release.clone()),
                }
            })
            .collect(),
    };
    let _ = write!(out, "{}", status.table());
    let all = status.nodes.iter().all(|n| {
        n.quote_verified
            && n.seen.cluster_id == cluster_id
            && n.seen.cluster_id.is_some()
            && n.seen.stage == Some(Stage::KubeadmDone)
            && (kubernetes.is_none() || n.kubernetes.as_ref().is_some_and(|k| k.ready))
    });
    let _ = writeln!(
        out,
        "{} node(s) attested (both ways on joins), quotes verified here, locked to cluster {}, \
         past kubeadm{}: {}",
        status.nodes.len(),
        cluster_id.as_deref().unwrap_or("-"),
        if kubernetes.is_some() {
            ", Ready in Kubernetes"
        } else {
            ""
        },
        if all { "yes" } else { "NO" }
    );
    if kubernetes.is_some() {
        let _ = writeln!(
            out,
            "kubectl: {} --kubeconfig {} get nodes",
            kubectl::program().display(),
            admin.host_kubeconfig().display()
        );
    }
    let _ = writeln!(
        out,
        "admin files (master secret, cluster file, kubeconfig): {}",
        admin.dir.display()
    );
    let _ = writeln!(out, "timeline:");
    if let Ok(events) = events.events.lock() {
        for (at, what) in events.iter() {
            let _ = writeln!(out, "  {:>7.1}s  {what}", at.as_secs_f64());
        }
    }
    all
}
