//! Kubernetes' view of the formed cluster, from the host: the admin's host kubeconfig
//! (node-1's API server forwarded to the loopback) and every node `Ready`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{Formation, Interrupted, Node};
use crate::kubectl::{self, KubeNode};
use crate::local_cluster::observe;

/// How long the nodes have after kubeadm to become `Ready` (the kubelet registers, the CNI
/// configuration is found, the node's lease renews; minutes under TCG).
const READY_TIMEOUT: Duration = Duration::from_secs(900);
/// How often the API server is asked.
pub(super) const POLL: Duration = Duration::from_secs(10);

/// Writes the host kubeconfig and waits until every node of `nodes` is `Ready`; says when each
/// one became so. Returns the last view.
pub(super) fn wait_ready(
    f: &Formation<'_>,
    nodes: &[Arc<Node>],
    stop: &AtomicBool,
) -> anyhow::Result<Vec<KubeNode>> {
    let host = f.admin.host_kubeconfig();
    kubectl::write_host_kubeconfig(&f.admin.kubeconfig(), f.ports[0].api, &host)?;
    f.events.say(format!(
        "host kubeconfig {} (node-1's API server on 127.0.0.1:{}): {} --kubeconfig {} get nodes",
        host.display(),
        f.ports[0].api,
        kubectl::program().display(),
        host.display()
    ));
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut ready = BTreeSet::new();
    let mut last: anyhow::Result<Vec<KubeNode>> = Ok(Vec::new());
    loop {
        last = kubectl::nodes(&host).or_else(|e| match last {
            // A slow API server under emulation: keep the last answer, say the error at the end.
            Ok(ref view) if !view.is_empty() => Ok(view.clone()),
            _ => Err(e),
        });
        if let Ok(view) = &last {
            for node in nodes {
                let Some(kube) = entry(f, view, node) else {
                    continue;
                };
                if kube.ready && ready.insert(node.spec.name.clone()) {
                    f.events.say(format!(
                        "{} Ready: Kubernetes node {} (kubelet {}, node IP {})",
                        node.spec.name,
                        kube.name,
                        kube.kubelet_version,
                        kube.internal_ip.as_deref().unwrap_or("-")
                    ));
                }
            }
            if nodes.iter().all(|n| ready.contains(&n.spec.name)) {
                return Ok(view.clone());
            }
        }
        if stop.load(Ordering::Relaxed) {
            return Err(Interrupted {
                node: "the cluster".to_owned(),
                what: "waiting for the nodes to be Ready".to_owned(),
            }
            .into());
        }
        if Instant::now() > deadline {
            let why = match &last {
                Ok(view) => not_ready(f, nodes, view),
                Err(e) => format!("the API server did not answer: {e:#}"),
            };
            bail!(
                "not every node is Ready {} min after kubeadm: {why}",
                READY_TIMEOUT.as_secs() / 60
            );
        }
        std::thread::sleep(POLL);
    }
}

/// `node`'s entry in `view`, found by its node IP (its VPN address, else its LAN address).
fn entry<'v>(f: &Formation<'_>, view: &'v [KubeNode], node: &Node) -> Option<&'v KubeNode> {
    let i = f.layout.index_of(&node.spec.name)?;
    kubectl::node_at(view, &observe(&node.vm.console_lines()).node_ip(i))
}

/// Which nodes are not Ready, and why.
fn not_ready(f: &Formation<'_>, nodes: &[Arc<Node>], view: &[KubeNode]) -> String {
    nodes
        .iter()
        .filter_map(|n| match entry(f, view, n) {
            None => Some(format!("{} is not registered", n.spec.name)),
            Some(k) if !k.ready => Some(format!(
                "{} is NotReady ({})",
                k.name,
                k.not_ready_reason.as_deref().unwrap_or("no reason given")
            )),
            Some(_) => None,
        })
        .collect::<Vec<_>>()
        .join("; ")
}
