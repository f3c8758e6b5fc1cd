//! `hawser init` and `hawser recover`: argument parsing and terminal output over
//! [`hawser_cli::cluster`].

use std::path::PathBuf;

use clap::Args;
use hawser_cli::cluster::{self, DEFAULT_VPN_PREFIX, InitOptions, RecoverOptions};

/// Which node, and how to recognise it (both commands verify the node before sending it
/// anything).
#[derive(Args)]
pub struct NodeArgs {
    /// The node's init server, HOST:PORT (port 9000 on the node).
    #[arg(long)]
    node: String,
    /// Expected measurements of the node's image (e.g. from `hawser measurements predict --json`
    /// or written by `hawser local up --init`).
    #[arg(long)]
    measurements: PathBuf,
    /// PEM of the CA that certified the node's attestation key (the cloud provider's).
    #[arg(long)]
    provider_ca: PathBuf,
    /// The init secret the node was created with (its SHA-256 is in the node's platform
    /// metadata); sent only after the node is verified.
    #[arg(long, default_value = hawser_cli::cluster::INIT_SECRET_FILE)]
    init_secret: PathBuf,
}

/// Verify a waiting node and initialize a new cluster on it.
#[derive(Args)]
pub struct InitArgs {
    #[command(flatten)]
    target: NodeArgs,
    /// Where to write the new master secret (0600; never overwritten).
    #[arg(long, default_value = "hawser-master-secret.json")]
    master_secret: PathBuf,
    /// Where to write the cluster file (cluster ID, measurement salt; needed by `hawser recover`).
    #[arg(long, default_value = "hawser-cluster.json")]
    cluster_file: PathBuf,
    /// Where to write the admin kubeconfig.
    #[arg(long, default_value = "hawser-admin.conf")]
    kubeconfig: PathBuf,
    /// The cluster's name (a DNS label).
    #[arg(long, default_value = "hawser")]
    name: String,
    /// The Kubernetes version to install, v<major>.<minor>.<patch>. Default: the version the
    /// node's image carries (the only one it installs). Refused here, before the node is
    /// touched, if malformed or a version hawser writes no kubeadm configuration for.
    #[arg(long, value_parser = parse_kubernetes_version)]
    kubernetes_version: Option<hawser_kube_types::KubernetesVersion>,
    /// The cluster's service CIDR.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cidr: String,
    /// Extra subject alternative names of the API server certificate (repeatable).
    #[arg(long = "api-server-san")]
    api_server_sans: Vec<String>,
    /// `host[:port]` every node reaches the API server at (kubeadm's controlPlaneEndpoint: a
    /// load balancer or DNS name in front of the control planes). Needed to add control planes
    /// later; default: the first node's address.
    #[arg(long)]
    control_plane_endpoint: Option<hawser_kube_types::Endpoint>,
    /// The TPM name (hex, `000b…`, as `hawser-joind` prints it in a refusal) of an AK that may
    /// join the cluster as a control plane (repeatable).
    #[arg(long = "approve-control-plane", value_parser = parse_ak_name)]
    approve_control_plane: Vec<Vec<u8>>,
    /// The cluster's WireGuard mesh prefix (an IPv4 network address, /24 to /30): the first
    /// node takes its first host address, and every node joins the mesh with an address of it,
    /// its Kubernetes node IP (docs/mesh.md). Each node's pod range follows its address's last
    /// octet, so a /24 bounds the cluster to 253 nodes and a wider prefix is refused.
    #[arg(long, default_value = DEFAULT_VPN_PREFIX, conflicts_with = "no_mesh", value_parser = parse_cluster_prefix)]
    vpn_prefix: hawser_mesh::Ipv4Net,
    /// Form the cluster without the WireGuard mesh: nodes talk over their own network.
    #[arg(long)]
    no_mesh: bool,
}

/// A Kubernetes version hawser can install: well-formed, with a kubeadm writer.
fn parse_kubernetes_version(text: &str) -> Result<hawser_kube_types::KubernetesVersion, String> {
    let version: hawser_kube_types::KubernetesVersion = text.parse().map_err(|e| format!("{e}"))?;
    hawser_kube_types::KubeadmApi::for_version(&version).map_err(|e| e.to_string())?;
    Ok(version)
}

/// `--vpn-prefix`: an IPv4 network a cluster's mesh can be (`hawser_mesh::pods`).
fn parse_cluster_prefix(text: &str) -> Result<hawser_mesh::Ipv4Net, String> {
    let prefix: hawser_mesh::Ipv4Net = text.parse().map_err(|e| format!("{e}"))?;
    hawser_mesh::pods::check_cluster_prefix(prefix).map_err(|e| e.to_string())?;
    Ok(prefix)
}

fn parse_ak_name(text: &str) -> Result<Vec<u8>, String> {
    match hex::decode(text.trim()) {
        Ok(name) if name.len() >= 3 => Ok(name),
        _ => Err(format!(
            "{text:?} is not an AK TPM name in hex (000b followed by 64 hex digits)"
        )),
    }
}

/// Verify a node of an existing cluster and let it reopen its state disk without a join service.
#[derive(Args)]
pub struct RecoverArgs {
    #[command(flatten)]
    target: NodeArgs,
    /// The cluster's master secret, as written by `hawser init`.
    #[arg(long, default_value = "hawser-master-secret.json")]
    master_secret: PathBuf,
    /// The cluster file written by `hawser init`.
    #[arg(long, default_value = "hawser-cluster.json")]
    cluster_file: PathBuf,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn say(line: &str) {
    println!("{line}");
}

fn node_log(line: &str) {
    println!("  node │ {line}");
}

pub fn init(args: InitArgs) -> anyhow::Result<()> {
    let opts = InitOptions {
        node: args.target.node,
        measurements: args.target.measurements,
        provider_ca: args.target.provider_ca,
        master_secret: args.master_secret,
        cluster_file: args.cluster_file,
        kubeconfig: args.kubeconfig,
        cluster_name: args.name,
        kubernetes_version: args.kubernetes_version,
        service_cidr: args.service_cidr,
        api_server_cert_sans: args.api_server_sans,
        control_plane_endpoint: args.control_plane_endpoint,
        init_secret: args.target.init_secret,
        control_plane_approvals: args.approve_control_plane,
        vpn_prefix: (!args.no_mesh).then_some(args.vpn_prefix),
    };
    let done = runtime()?.block_on(cluster::init(&opts, &mut say, &mut node_log))?;
    println!(
        "cluster {:?} initialized: cluster ID {}",
        opts.cluster_name,
        hex::encode(done.cluster_id)
    );
    Ok(())
}

pub fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let opts = RecoverOptions {
        node: args.target.node,
        measurements: args.target.measurements,
        provider_ca: args.target.provider_ca,
        master_secret: args.master_secret,
        cluster_file: args.cluster_file,
        init_secret: args.target.init_secret,
    };
    let done = runtime()?.block_on(cluster::recover(&opts, &mut say, &mut node_log))?;
    println!(
        "node recovered into cluster {}",
        hex::encode(done.cluster_id)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_version_is_optional_and_refused_when_malformed_or_without_a_writer() {
        assert_eq!(
            parse_kubernetes_version("v1.20.2").unwrap().as_str(),
            "v1.20.2"
        );
        assert_eq!(
            parse_kubernetes_version("v1.33.4").unwrap().as_str(),
            "v1.33.4"
        );
        let malformed = parse_kubernetes_version("1.20").unwrap_err();
        assert!(
            malformed.contains("not a Kubernetes version"),
            "{malformed}"
        );
        let unwritten = parse_kubernetes_version("v1.25.0").unwrap_err();
        assert!(
            unwritten.contains("hawser writes no kubeadm configuration for Kubernetes v1.25.0"),
            "{unwritten}"
        );
    }

    #[test]
    fn a_clusters_mesh_prefix_wider_than_a_24_is_refused_before_the_node_is_asked() {
        assert_eq!(
            parse_cluster_prefix("10.99.0.0/24").unwrap().to_string(),
            "10.99.0.0/24"
        );
        let wide = parse_cluster_prefix("10.99.0.0/16").unwrap_err();
        assert!(wide.contains("same pod range"), "{wide}");
        assert!(parse_cluster_prefix("10.99.0.0").is_err());
    }
}
