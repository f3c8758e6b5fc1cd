//! Kubernetes' own view of a local cluster, from the host: the admin kubeconfig `hawser init`
//! wrote, pointed at a control plane's API server forwarded to the host's loopback, and
//! Debian's `kubectl` (package `kubernetes-client`, installed by `scripts/setup-host`).
//!
//! The API server's certificate names `127.0.0.1` (`hawser local up` asks `hawser init` for
//! that SAN), so the host's kubeconfig verifies it against the cluster's CA as any other does;
//! only its `server` differs from the node's `admin.conf`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

/// The kubectl on `PATH`, if setup-host did not unpack Debian's elsewhere.
pub const KUBECTL: &str = "kubectl";
/// How long one kubectl request may take (an API server under TCG answers in seconds).
const REQUEST_TIMEOUT: &str = "20s";

/// One node as the API server knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeNode {
    pub name: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `v1.20.2`.
    pub kubelet_version: String,
    /// The node's `InternalIP` (the kubelet's `--node-ip`).
    pub internal_ip: Option<String>,
    /// The `Ready` condition's reason when it is not `True` (e.g. `KubeletNotReady`).
    pub not_ready_reason: Option<String>,
}

/// The entry of `view` for the node at `ip` (the kubelet's `--node-ip`: hawser names nodes
/// after their disks, not after the local cluster's `node-N`).
pub fn node_at<'a>(view: &'a [KubeNode], ip: &str) -> Option<&'a KubeNode> {
    view.iter().find(|k| k.internal_ip.as_deref() == Some(ip))
}

/// The kubectl to run: `$HAWSER_KUBECTL`, else Debian's unpacked by setup-host beside
/// another package's `/usr/bin/kubectl`, else `kubectl` on `PATH`.
pub fn program() -> PathBuf {
    if let Some(path) = std::env::var_os("HAWSER_KUBECTL").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let unpacked = hawser_image::inputs::cache_dir().join("kubernetes-client/usr/bin/kubectl");
    if unpacked.is_file() {
        unpacked
    } else {
        PathBuf::from(KUBECTL)
    }
}

/// Runs kubectl with `kubeconfig`, `--request-timeout=<request_timeout>` and `args`; what it
/// printed and how it ended, or an error naming the package to install when it is missing.
pub fn output(
    kubeconfig: &Path,
    request_timeout: &str,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    Command::new(program())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg(format!("--request-timeout={request_timeout}"))
        .args(args)
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow::anyhow!(
                    "{KUBECTL} is not installed: install Debian's kubernetes-client \
                     (scripts/setup-host does)"
                )
            } else {
                anyhow::Error::new(e).context(format!("running {KUBECTL}"))
            }
        })
}

/// Runs kubectl with `kubeconfig` and `args`; its stdout, or an error with its stderr.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = output(kubeconfig, REQUEST_TIMEOUT, args)?;
    if !output.status.success() {
        bail!(
            "{KUBECTL} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout).context("kubectl's output is not UTF-8")
}

/// What kubectl prints for an API server that could not finish a request in time, or could not
/// be reached for a moment (a control plane under TCG restarting a component, or its etcd
/// slow): the same request may succeed when tried again. Anything else (a refused object, a
/// missing resource, a failed `exec`) is not.
const TRANSIENT: &[&str] = &[
    // The ResourceQuota admission plugin's 10 s limit (an API server short of CPU).
    "resource quota evaluation timed out",
    "etcdserver: request timed out",
    "etcdserver: leader changed",
    "the server was unable to return a response in the time allotted",
    "Timeout: request did not complete within",
    "the server is currently unable to handle the request",
    "net/http: TLS handshake timeout",
    "connect: connection refused",
    // kubectl's own words for a refused connection (it drops the dial error).
    "was refused - did you specify the right host or port?",
    "http2: client connection lost",
];

/// Whether kubectl's `stderr` says the API server failed for a moment, not for good
/// ([`TRANSIENT`]): a client that keeps state idempotent (`apply`, `get`, `wait`) tries again.
pub fn is_transient(stderr: &str) -> bool {
    TRANSIENT.iter().any(|t| stderr.contains(t))
}

/// Writes `out`: the admin kubeconfig `admin_conf`, its cluster's server set to
/// `https://127.0.0.1:<port>`.
pub fn write_host_kubeconfig(admin_conf: &Path, port: u16, out: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(admin_conf)
        .with_context(|| format!("reading the admin kubeconfig {}", admin_conf.display()))?;
    let config: serde_json::Value = serde_json::from_str(&kubectl(
        admin_conf,
        &["config", "view", "--raw", "-o", "json"],
    )?)
    .context("kubectl config view")?;
    let cluster = config["contexts"][0]["context"]["cluster"]
        .as_str()
        .with_context(|| format!("{} has no context naming a cluster", admin_conf.display()))?
        .to_owned();
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    kubectl(
        out,
        &[
            "config",
            "set-cluster",
            &cluster,
            &format!("--server=https://127.0.0.1:{port}"),
        ],
    )?;
    Ok(())
}

/// The cluster's nodes, from `kubectl get nodes -o json`.
pub fn nodes(kubeconfig: &Path) -> anyhow::Result<Vec<KubeNode>> {
    let text = kubectl(kubeconfig, &["get", "nodes", "-o", "json"])?;
    parse_nodes(&text)
}

/// [`nodes`] of kubectl's JSON.
pub fn parse_nodes(text: &str) -> anyhow::Result<Vec<KubeNode>> {
    #[derive(Deserialize)]
    struct List {
        items: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        metadata: Metadata,
        #[serde(default)]
        status: Status,
    }
    #[derive(Deserialize)]
    struct Metadata {
        name: String,
    }
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        #[serde(default)]
        conditions: Vec<Condition>,
        #[serde(default)]
        addresses: Vec<Address>,
        node_info: Option<NodeInfo>,
    }
    #[derive(Deserialize)]
    struct Condition {
        #[serde(rename = "type")]
        kind: String,
        status: String,
        reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Address {
        #[serde(rename = "type")]
        kind: String,
        address: String,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct NodeInfo {
        kubelet_version: String,
    }
    let list: List = serde_json::from_str(text).context("kubectl get nodes: not a node list")?;
    Ok(list
        .items
        .into_iter()
        .map(|item| {
            let ready = item.status.conditions.iter().find(|c| c.kind == "Ready");
            KubeNode {
                name: item.metadata.name,
                ready: ready.is_some_and(|c| c.status == "True"),
                not_ready_reason: ready
                    .filter(|c| c.status != "True")
                    .and_then(|c| c.reason.clone()),
                kubelet_version: item
                    .status
                    .node_info
                    .map(|i| i.kubelet_version)
                    .unwrap_or_default(),
                internal_ip: item
                    .status
                    .addresses
                    .into_iter()
                    .find(|a| a.kind == "InternalIP")
                    .map(|a| a.address),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_read_from_kubectls_json() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
          {"metadata":{"name":"node-1"},"status":{
            "conditions":[{"type":"MemoryPressure","status":"False"},
                          {"type":"Ready","status":"True","reason":"KubeletReady"}],
            "addresses":[{"type":"InternalIP","address":"192.168.76.10"},
                         {"type":"Hostname","address":"node-1"}],
            "nodeInfo":{"kubeletVersion":"v1.20.2"}}},
          {"metadata":{"name":"node-2"},"status":{
            "conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady"}],
            "nodeInfo":{"kubeletVersion":"v1.20.2"}}},
          {"metadata":{"name":"node-3"}}]}"#;
        let nodes = parse_nodes(text).unwrap();
        assert_eq!(nodes.len(), 3);
        assert!(nodes[0].ready);
        assert_eq!(nodes[0].internal_ip.as_deref(), Some("192.168.76.10"));
        assert_eq!(nodes[0].kubelet_version, "v1.20.2");
        assert_eq!(nodes[0].not_ready_reason, None);
        assert!(!nodes[1].ready);
        assert_eq!(
            nodes[1].not_ready_reason.as_deref(),
            Some("KubeletNotReady")
        );
        assert!(!nodes[2].ready);
        assert_eq!(nodes[2].kubelet_version, "");
    }

    #[test]
    fn a_server_short_of_time_is_tried_again_a_refused_object_is_not() {
        for stderr in [
            "Error from server (InternalError): error when creating \"client.json\": Internal \
             error occurred: resource quota evaluation timed out",
            "Error from server: etcdserver: request timed out",
            "Unable to connect to the server: net/http: TLS handshake timeout",
            "The connection to the server 127.0.0.1:6443 was refused - did you specify the right \
             host or port?",
        ] {
            assert!(is_transient(stderr), "{stderr}");
        }
        for stderr in [
            "The Pod \"web\" is invalid: spec.containers[0].image: Required value",
            "Error from server (NotFound): pods \"web\" not found",
            "Error from server (Forbidden): pods is forbidden: User \"x\" cannot create",
            "command terminated with exit code 1",
        ] {
            assert!(!is_transient(stderr), "{stderr}");
        }
    }

    #[test]
    fn something_else_is_refused() {
        let err = parse_nodes("{\"kind\":\"Status\"}").unwrap_err();
        assert!(format!("{err:#}").contains("not a node list"), "{err:#}");
    }
}
