//! The kubeadm configuration PID 1 hands to `kubeadm init --config` and `kubeadm join --config`.
//!
//! kubeadm reads a YAML stream; YAML is a superset of JSON, so hawser writes each document as
//! one JSON object from typed structs (serde), documents separated by `---` lines. No YAML
//! library, no string templates: every value is escaped by the JSON encoder.
//!
//! The API is kubeadm's `v1beta4` (kubeadm 1.31 and later). Its notable change from `v1beta3`:
//! `extraArgs` and `nodeRegistration.kubeletExtraArgs` are lists of `{name, value}` objects
//! (duplicates allowed), no longer string maps.
//!
//! What hawser sets, and why:
//!
//! - `nodeRegistration.name` and the kubelet's `node-ip`: the node's own name and address,
//!   never kubeadm's guesses from the hostname and the default route. In a WireGuard mesh the
//!   address is the node's VPN address (`crate::mesh`), so the kubelet's serving certificate,
//!   the API server's advertised address (and so its certificate's SANs) and etcd's peer URLs
//!   are all mesh addresses.
//! - `criSocket`: containerd's socket, so kubeadm does not probe for runtimes.
//! - `localAPIEndpoint.advertiseAddress`: the node IP, port 6443.
//! - `controlPlaneEndpoint` (init): set, defaulting to the first node's `<ip>:6443`; kubeadm
//!   refuses control-plane joins to a cluster initialised without one.
//! - a `KubeletConfiguration` with `cgroupDriver: cgroupfs` (init; joining nodes receive it
//!   from the cluster's `kubelet-config` ConfigMap): kubeadm defaults to the systemd driver,
//!   and there is no systemd on a hawser node. containerd must use cgroupfs as well (its
//!   default `SystemdCgroup = false`).
//!
//! Input is validated before anything is encoded. The values a join ticket or `hawser init`
//! brings (bootstrap token, CA certificate hashes, API server endpoint, Service range,
//! Kubernetes version) arrive as `hawser-kube-types` values, checked where they entered the
//! node; this module checks the rest: node name, cluster name and SANs as DNS names,
//! addresses and the certificate key. Errors never echo secrets (tokens, keys), and the
//! secret-carrying types redact themselves in `Debug`. The configuration text itself contains
//! the token: [`KubeadmConfig`] zeroizes it on drop and [`write_config`] creates the file with
//! mode 0600.

use std::fmt;
use std::io::{self, Write as _};
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::Duration;

use hawser_kube_types::{
    ApiServerEndpoint, BootstrapToken, CaCertHash, Cidr, DnsSubdomain, Endpoint, KubernetesVersion,
    ServiceCidr,
};
use serde::Serialize;
use zeroize::Zeroizing;

/// The admin kubeconfig `kubeadm init` (and a control-plane `kubeadm join`) writes.
pub const ADMIN_KUBECONFIG: &str = "/etc/kubernetes/admin.conf";
/// The kubeadm binary in the rootfs.
pub const KUBEADM: &str = "/usr/bin/kubeadm";
/// kubeadm's certificate directory (on the state disk, through the `/etc/kubernetes` bind).
pub const PKI_DIR: &str = "/etc/kubernetes/pki";

/// kubeadm's configuration API version.
pub const KUBEADM_API_VERSION: &str = "kubeadm.k8s.io/v1beta4";
/// The kubelet configuration API version.
pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// containerd's CRI socket.
pub const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";
/// The API server's port on every control-plane node.
pub const API_SERVER_PORT: u16 = 6443;
/// The groups of a kubeadm node-join token.
pub const NODE_TOKEN_GROUPS: &[&str] = &["system:bootstrappers:kubeadm:default-node-token"];

/// Input kubeadm cannot be given, or a configuration that cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmConfigError {
    /// A value that is not a secret is malformed (node name, address, SAN, ...); the message
    /// shows it.
    #[error("kubeadm configuration: {field} {value:?} is invalid: {reason}")]
    Invalid {
        /// What the value is, e.g. `node name`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What was expected instead.
        reason: &'static str,
    },
    /// A secret (the certificate key) is malformed; its value is never shown.
    #[error("kubeadm configuration: {field} is invalid (value not shown: secret): {reason}")]
    InvalidSecret {
        /// What the secret is, e.g. `certificate key`.
        field: &'static str,
        /// What was expected instead.
        reason: &'static str,
    },
    /// A document cannot be encoded as JSON (a bug: every field is a plain string, number or
    /// list).
    #[error("cannot encode the kubeadm configuration")]
    Encode(#[source] serde_json::Error),
}

fn invalid(field: &'static str, value: &str, reason: &'static str) -> KubeadmConfigError {
    KubeadmConfigError::Invalid {
        field,
        value: value.to_owned(),
        reason,
    }
}

/// The key that encrypts the control-plane certificates kubeadm shares through the cluster
/// (`--certificate-key`): 32 bytes as 64 lowercase hex digits. `Debug` shows nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct CertificateKey(Zeroizing<String>);

impl CertificateKey {
    pub fn parse(text: &str) -> Result<CertificateKey, KubeadmConfigError> {
        if text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(CertificateKey(Zeroizing::new(text.to_owned())))
        } else {
            Err(KubeadmConfigError::InvalidSecret {
                field: "certificate key",
                reason: "expected 64 lowercase hex digits (32 bytes)",
            })
        }
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for CertificateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CertificateKey(<redacted>)")
    }
}

/// A token `kubeadm init` creates, for the first joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitBootstrapToken {
    pub token: BootstrapToken,
    pub ttl: Duration,
}

/// What `kubeadm init` needs to know about the new cluster and this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitRequest {
    pub cluster_name: String,
    /// `v1.31.2`.
    pub kubernetes_version: KubernetesVersion,
    /// `10.96.0.0/12`.
    pub service_cidr: ServiceCidr,
    /// For CNIs that allocate from the node's pod CIDR (flannel); `None` leaves it unset.
    pub pod_cidr: Option<Cidr>,
    /// `host[:port]` all nodes reach the API server at; `None` means `<node_ip>:6443`.
    pub control_plane_endpoint: Option<Endpoint>,
    /// Extra names and addresses in the API server certificate.
    pub cert_sans: Vec<String>,
    pub node_name: String,
    pub node_ip: IpAddr,
    /// `None` lets kubeadm create a token of its own (printed in its output, redacted in the
    /// log).
    pub bootstrap_token: Option<InitBootstrapToken>,
    /// kubeadm preflight checks to ignore, by name.
    pub ignore_preflight_errors: Vec<String>,
}

/// A control-plane join's extras.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneJoin {
    /// Decrypts the shared control-plane certificates (`kubeadm init --upload-certs`);
    /// `None` when the certificates were put in place otherwise.
    pub certificate_key: Option<CertificateKey>,
}

/// `kubeadm join`'s input: the join ticket's values ([`hawser_kube_types::JoinTicket`], as
/// the join service handed them) and this node's name, address and preflight choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRequest {
    /// `host:port` of the API server.
    pub api_server_endpoint: ApiServerEndpoint,
    pub token: BootstrapToken,
    /// Pins of the cluster CA's public key; at least one.
    pub ca_cert_hashes: Vec<CaCertHash>,
    pub node_name: String,
    pub node_ip: IpAddr,
    /// `Some` for a control-plane node.
    pub control_plane: Option<ControlPlaneJoin>,
    pub ignore_preflight_errors: Vec<String>,
}

/// A rendered configuration: a YAML stream of JSON documents. Contains secrets; zeroized on
/// drop; `Debug` shows only its size.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeadmConfig(Zeroizing<String>);

impl KubeadmConfig {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A configuration rendered on an earlier boot and kept on the state disk (the kubeadm
    /// intent): kubeadm validates it again when it reads it.
    pub fn from_stored(text: Zeroizing<String>) -> Self {
        KubeadmConfig(text)
    }
}

impl fmt::Debug for KubeadmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KubeadmConfig({} bytes, contents redacted)",
            self.0.len()
        )
    }
}

// --- The v1beta4 documents (only the fields hawser sets). ---

#[derive(Serialize)]
struct Arg<'a> {
    name: &'a str,
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeRegistration<'a> {
    name: &'a str,
    cri_socket: &'a str,
    kubelet_extra_args: Vec<Arg<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ignore_preflight_errors: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiEndpoint {
    advertise_address: String,
    bind_port: u16,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BootstrapTokenSpec<'a> {
    token: &'a str,
    description: &'a str,
    ttl: String,
    usages: [&'a str; 2],
    groups: &'a [&'a str],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InitConfiguration<'a> {
    api_version: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    bootstrap_tokens: Vec<BootstrapTokenSpec<'a>>,
    node_registration: NodeRegistration<'a>,
    #[serde(rename = "localAPIEndpoint")]
    local_api_endpoint: ApiEndpoint,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Networking {
    service_subnet: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_subnet: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiServer<'a> {
    #[serde(rename = "certSANs", skip_serializing_if = "<[_]>::is_empty")]
    cert_sans: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterConfiguration<'a> {
    api_version: &'a str,
    kind: &'a str,
    cluster_name: &'a str,
    kubernetes_version: &'a str,
    control_plane_endpoint: String,
    networking: Networking,
    api_server: ApiServer<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfiguration<'a> {
    api_version: &'a str,
    kind: &'a str,
    cgroup_driver: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BootstrapTokenDiscovery<'a> {
    token: &'a str,
    api_server_endpoint: String,
    ca_cert_hashes: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Discovery<'a> {
    bootstrap_token: BootstrapTokenDiscovery<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JoinControlPlane<'a> {
    #[serde(rename = "localAPIEndpoint")]
    local_api_endpoint: ApiEndpoint,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_key: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JoinConfiguration<'a> {
    api_version: &'a str,
    kind: &'a str,
    discovery: Discovery<'a>,
    node_registration: NodeRegistration<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    control_plane: Option<JoinControlPlane<'a>>,
}

/// One document as pretty-printed JSON (zeroized on drop: it may hold the token).
fn render(document: &impl Serialize) -> Result<Zeroizing<String>, KubeadmConfigError> {
    serde_json::to_string_pretty(document)
        .map(Zeroizing::new)
        .map_err(KubeadmConfigError::Encode)
}

/// Documents as a YAML stream: each a JSON object, separated by `---` lines.
fn stream(documents: &[Zeroizing<String>]) -> KubeadmConfig {
    let len = documents.iter().map(|d| d.len() + 5).sum();
    let mut text = Zeroizing::new(String::with_capacity(len));
    for (i, document) in documents.iter().enumerate() {
        if i > 0 {
            text.push_str("---\n");
        }
        text.push_str(document);
        text.push('\n');
    }
    KubeadmConfig(text)
}

fn node_registration<'a>(
    node_name: &'a str,
    node_ip: IpAddr,
    ignore_preflight_errors: &'a [String],
) -> NodeRegistration<'a> {
    NodeRegistration {
        name: node_name,
        cri_socket: CRI_SOCKET,
        kubelet_extra_args: vec![Arg {
            name: "node-ip",
            value: node_ip.to_string(),
        }],
        ignore_preflight_errors,
    }
}

/// The configuration for `kubeadm init --config`: InitConfiguration, ClusterConfiguration,
/// KubeletConfiguration.
pub fn init_config(request: &InitRequest) -> Result<KubeadmConfig, KubeadmConfigError> {
    check_dns_subdomain("cluster name", &request.cluster_name)?;
    check_node(&request.node_name, request.node_ip)?;
    for san in &request.cert_sans {
        check_san(san)?;
    }
    check_preflight_names(&request.ignore_preflight_errors)?;
    let control_plane_endpoint = match &request.control_plane_endpoint {
        Some(endpoint) => endpoint.to_string(),
        None => host_port(request.node_ip, API_SERVER_PORT),
    };
    let bootstrap_tokens = match &request.bootstrap_token {
        Some(token) => {
            if token.ttl < Duration::from_secs(1) {
                return Err(invalid(
                    "bootstrap token TTL",
                    &format!("{} s", token.ttl.as_secs()),
                    "expected at least one second (0 would make it never expire)",
                ));
            }
            vec![BootstrapTokenSpec {
                token: token.token.expose_secret(),
                description: "created by hawser at kubeadm init",
                ttl: format!("{}s", token.ttl.as_secs()),
                usages: ["signing", "authentication"],
                groups: NODE_TOKEN_GROUPS,
            }]
        }
        None => Vec::new(),
    };
    let init = InitConfiguration {
        api_version: KUBEADM_API_VERSION,
        kind: "InitConfiguration",
        bootstrap_tokens,
        node_registration: node_registration(
            &request.node_name,
            request.node_ip,
            &request.ignore_preflight_errors,
        ),
        local_api_endpoint: ApiEndpoint {
            advertise_address: request.node_ip.to_string(),
            bind_port: API_SERVER_PORT,
        },
    };
    let cluster = ClusterConfiguration {
        api_version: KUBEADM_API_VERSION,
        kind: "ClusterConfiguration",
        cluster_name: &request.cluster_name,
        kubernetes_version: request.kubernetes_version.as_str(),
        control_plane_endpoint,
        networking: Networking {
            service_subnet: request.service_cidr.to_string(),
            pod_subnet: request.pod_cidr.as_ref().map(Cidr::to_string),
        },
        api_server: ApiServer {
            cert_sans: &request.cert_sans,
        },
    };
    let kubelet = KubeletConfiguration {
        api_version: KUBELET_API_VERSION,
        kind: "KubeletConfiguration",
        cgroup_driver: "cgroupfs",
    };
    Ok(stream(&[
        render(&init)?,
        render(&cluster)?,
        render(&kubelet)?,
    ]))
}

/// The configuration for `kubeadm join --config`: one JoinConfiguration.
pub fn join_config(ticket: &JoinRequest) -> Result<KubeadmConfig, KubeadmConfigError> {
    if ticket.ca_cert_hashes.is_empty() {
        return Err(invalid(
            "CA certificate hashes",
            "",
            "expected at least one: joining without pinning the cluster CA is not allowed",
        ));
    }
    check_node(&ticket.node_name, ticket.node_ip)?;
    check_preflight_names(&ticket.ignore_preflight_errors)?;
    let join = JoinConfiguration {
        api_version: KUBEADM_API_VERSION,
        kind: "JoinConfiguration",
        discovery: Discovery {
            bootstrap_token: BootstrapTokenDiscovery {
                token: ticket.token.expose_secret(),
                api_server_endpoint: ticket.api_server_endpoint.to_string(),
                ca_cert_hashes: ticket
                    .ca_cert_hashes
                    .iter()
                    .map(CaCertHash::to_string)
                    .collect(),
            },
        },
        node_registration: node_registration(
            &ticket.node_name,
            ticket.node_ip,
            &ticket.ignore_preflight_errors,
        ),
        control_plane: ticket.control_plane.as_ref().map(|cp| JoinControlPlane {
            local_api_endpoint: ApiEndpoint {
                advertise_address: ticket.node_ip.to_string(),
                bind_port: API_SERVER_PORT,
            },
            certificate_key: cp.certificate_key.as_ref().map(CertificateKey::expose),
        }),
    };
    Ok(stream(&[render(&join)?]))
}

/// Writes `config` to `path`, readable by root only (it holds the bootstrap token), replacing
/// an older file.
pub fn write_config(path: &Path, config: &KubeadmConfig) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file that existed before keeps its mode: make sure.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(config.as_str().as_bytes())?;
    file.sync_all()
}

// --- Validation. ---

fn host_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// An RFC 1123 subdomain, as Kubernetes names nodes (lowercase; see [`DnsSubdomain`]).
fn is_dns_subdomain(name: &str) -> bool {
    name.parse::<DnsSubdomain>().is_ok()
}

fn check_dns_subdomain(field: &'static str, name: &str) -> Result<(), KubeadmConfigError> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(invalid(
            field,
            name,
            "expected a lowercase RFC 1123 DNS name (letters, digits, '-', '.'; at most 253)",
        ))
    }
}

fn check_node(node_name: &str, node_ip: IpAddr) -> Result<(), KubeadmConfigError> {
    check_dns_subdomain("node name", node_name)?;
    let unusable = node_ip.is_unspecified() || node_ip.is_loopback() || node_ip.is_multicast();
    if unusable {
        return Err(invalid(
            "node IP",
            &node_ip.to_string(),
            "expected a unicast address other nodes can reach (not unspecified, loopback or \
             multicast)",
        ));
    }
    Ok(())
}

fn check_san(san: &str) -> Result<(), KubeadmConfigError> {
    let name = san.strip_prefix("*.").unwrap_or(san);
    if san.parse::<IpAddr>().is_ok() || is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(invalid(
            "API server certificate SAN",
            san,
            "expected an IP address or a lowercase DNS name (optionally *.-prefixed)",
        ))
    }
}

fn check_preflight_names(names: &[String]) -> Result<(), KubeadmConfigError> {
    for name in names {
        let valid = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(invalid(
                "ignored preflight check",
                name,
                "expected a check name such as SystemVerification",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
