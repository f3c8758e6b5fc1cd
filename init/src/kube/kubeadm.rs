//! The kubeadm configuration PID 1 hands to `kubeadm init --config` and `kubeadm join --config`.
//!
//! kubeadm reads a YAML stream; YAML is a superset of JSON, so hawser writes each document as
//! one JSON object from typed structs (serde), documents separated by `---` lines. No YAML
//! library, no string templates: every value is escaped by the JSON encoder.
//!
//! The API follows the Kubernetes version ([`KubeadmApi::for_version`]): `v1beta2` for 1.20
//! ([`v1beta2`]), `v1beta4` for 1.31 and later ([`v1beta4`]); any other version is refused by
//! name ([`KubeadmConfigError::NoWriter`]). The two say the same things in different shapes:
//! `v1beta4`'s `extraArgs` and `nodeRegistration.kubeletExtraArgs` are lists of `{name, value}`
//! objects, `v1beta2`'s are string maps; what `v1beta2` cannot say is on kubeadm's command line
//! instead ([`command_flags`]).
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
    ApiServerEndpoint, BootstrapToken, CaCertHash, Cidr, DnsSubdomain, Endpoint, KubeadmApi,
    KubernetesVersion, KubernetesVersionError, NoKubeadmWriter, ServiceCidr,
};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use hawser_kube_types::ImageSet;

pub mod images;
pub mod v1beta2;
pub mod v1beta4;

pub use self::images::with_images;

/// The admin kubeconfig `kubeadm init` (and a control-plane `kubeadm join`) writes.
pub const ADMIN_KUBECONFIG: &str = "/etc/kubernetes/admin.conf";
/// The kubeadm binary in the rootfs.
pub const KUBEADM: &str = "/usr/bin/kubeadm";
/// kubeadm's certificate directory (on the state disk, through the `/etc/kubernetes` bind).
pub const PKI_DIR: &str = "/etc/kubernetes/pki";

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
    /// hawser has no writer for the Kubernetes version: the message names it and the versions
    /// hawser writes for.
    #[error("kubeadm configuration: {0}")]
    NoWriter(#[from] NoKubeadmWriter),
    /// The join ticket's Kubernetes version is not one (the join service's configuration).
    #[error("kubeadm configuration: the join ticket's Kubernetes version {value:?} is invalid")]
    TicketVersion {
        /// The version as the ticket gave it.
        value: String,
        #[source]
        source: KubernetesVersionError,
    },
    /// A document of a configuration hawser rendered (or kept on the state disk) is not a
    /// JSON object (a corrupted intent); serde_json's message names a line and column only.
    #[error("a document of the kubeadm configuration is not JSON")]
    NotJson(#[source] serde_json::Error),
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
    /// The version the cluster runs (the ticket's): it chooses the API.
    pub kubernetes_version: KubernetesVersion,
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

    /// The kubeadm API of its documents (every hawser configuration has one); `None` if no
    /// document names one hawser writes. Reads each document's `apiVersion` only: nothing
    /// else is copied out of the text (it holds the token).
    pub fn api(&self) -> Option<KubeadmApi> {
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(rename = "apiVersion", borrow)]
            api_version: Option<&'a str>,
        }
        self.0.split("\n---\n").find_map(|document| {
            let head: Head<'_> = serde_json::from_str(document).ok()?;
            KubeadmApi::from_api_version(head.api_version?)
        })
    }
}

/// The flags `kubeadm <verb> --config` needs besides the configuration for `api`: what the
/// API cannot say.
///
/// - `v1beta2` (kubeadm 1.20): `--skip-phases=preflight`. kubeadm 1.20's preflight phase ends
///   with its image-pull check, which needs `crictl` for any runtime but Docker and fails
///   (`crictl is required for container runtime`) whatever `ignorePreflightErrors` says; crictl
///   is not in Debian, and the images are in containerd already (imported at boot). `v1beta2`
///   has no `skipPhases` (`v1beta3` added it), so the phase is skipped on the command line,
///   and with it kubeadm's host checks (swap, ports, sysctls): PID 1 prepares the host itself.
///   `kubeadm init` also skips `addon/coredns` when the image's `images` carry no CoreDNS
///   (none of hawser's do: CoreDNS is not in Debian), since its Deployment would pull an image
///   that exists nowhere the node can reach; and with the image's images it skips
///   `addon/kube-proxy`: hawser's kube-proxy image has no iptables to program Services with
///   (`hawser_image::kubernetes::images::IMAGE_GAPS`), and its DaemonSet mounts the host's
///   `/lib/modules`, which the read-only rootfs lacks, so its pod would never start. Services'
///   ClusterIPs do not route; pods reach pods by address (docs/kubernetes.md).
/// - `v1beta4`: nothing (its stand-in images carry no control-plane images).
pub fn command_flags(api: KubeadmApi, verb: Verb, images: Option<&ImageSet>) -> Vec<String> {
    match api {
        KubeadmApi::V1beta2 => {
            let mut phases = vec!["preflight"];
            if verb == Verb::Init && images.is_some_and(|images| !images::has_coredns(images)) {
                phases.push("addon/coredns");
            }
            if verb == Verb::Init && images.is_some() {
                phases.push("addon/kube-proxy");
            }
            vec![format!("--skip-phases={}", phases.join(","))]
        }
        KubeadmApi::V1beta4 => Vec::new(),
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

/// Which kubeadm command runs: `init` or `join`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// `kubeadm init`: the cluster's first control plane.
    Init,
    /// `kubeadm join`: a worker or a further control plane.
    Join,
}

impl Verb {
    /// `init` or `join`, as on kubeadm's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Init => "init",
            Verb::Join => "join",
        }
    }

    /// The kubeadm document the configuration of this verb must contain.
    pub(crate) fn document_kind(self) -> &'static str {
        match self {
            Verb::Init => "InitConfiguration",
            Verb::Join => "JoinConfiguration",
        }
    }
}

// --- What both APIs write the same way (only the fields hawser sets). ---

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ApiEndpoint {
    advertise_address: String,
    bind_port: u16,
}

impl ApiEndpoint {
    fn of(node_ip: IpAddr) -> Self {
        ApiEndpoint {
            advertise_address: node_ip.to_string(),
            bind_port: API_SERVER_PORT,
        }
    }
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
struct Networking {
    service_subnet: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_subnet: Option<String>,
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

/// An init request's values once checked, as both APIs write them.
struct CheckedInit<'a> {
    request: &'a InitRequest,
    control_plane_endpoint: String,
    bootstrap_tokens: Vec<BootstrapTokenSpec<'a>>,
}

impl CheckedInit<'_> {
    fn networking(&self) -> Networking {
        Networking {
            service_subnet: self.request.service_cidr.to_string(),
            pod_subnet: self.request.pod_cidr.as_ref().map(Cidr::to_string),
        }
    }

    /// The KubeletConfiguration: the cgroupfs driver (no systemd on a hawser node).
    fn kubelet() -> KubeletConfiguration<'static> {
        KubeletConfiguration {
            api_version: KUBELET_API_VERSION,
            kind: "KubeletConfiguration",
            cgroup_driver: "cgroupfs",
        }
    }
}

impl JoinRequest {
    fn bootstrap_token_discovery(&self) -> BootstrapTokenDiscovery<'_> {
        BootstrapTokenDiscovery {
            token: self.token.expose_secret(),
            api_server_endpoint: self.api_server_endpoint.to_string(),
            ca_cert_hashes: self
                .ca_cert_hashes
                .iter()
                .map(CaCertHash::to_string)
                .collect(),
        }
    }
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

/// The configuration for `kubeadm init --config`: InitConfiguration, ClusterConfiguration,
/// KubeletConfiguration, in the API of the request's Kubernetes version.
pub fn init_config(request: &InitRequest) -> Result<KubeadmConfig, KubeadmConfigError> {
    let api = KubeadmApi::for_version(&request.kubernetes_version)?;
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
    let checked = CheckedInit {
        request,
        control_plane_endpoint,
        bootstrap_tokens,
    };
    let documents = match api {
        KubeadmApi::V1beta2 => v1beta2::init(checked)?,
        KubeadmApi::V1beta4 => v1beta4::init(checked)?,
    };
    Ok(stream(&documents))
}

/// The configuration for `kubeadm join --config`: one JoinConfiguration, in the API of the
/// cluster's Kubernetes version.
pub fn join_config(ticket: &JoinRequest) -> Result<KubeadmConfig, KubeadmConfigError> {
    let api = KubeadmApi::for_version(&ticket.kubernetes_version)?;
    if ticket.ca_cert_hashes.is_empty() {
        return Err(invalid(
            "CA certificate hashes",
            "",
            "expected at least one: joining without pinning the cluster CA is not allowed",
        ));
    }
    check_node(&ticket.node_name, ticket.node_ip)?;
    check_preflight_names(&ticket.ignore_preflight_errors)?;
    let document = match api {
        KubeadmApi::V1beta2 => v1beta2::join(ticket)?,
        KubeadmApi::V1beta4 => v1beta4::join(ticket)?,
    };
    Ok(stream(&[document]))
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
