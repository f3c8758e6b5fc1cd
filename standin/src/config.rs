//! kubeadm's configuration file: a YAML stream of documents (`---`-separated; each may be
//! written as JSON), decoded strictly against the kubeadm v1beta4 API and validated as kubeadm
//! validates it.
//!
//! Strict means what kubeadm's strict decoding means: an unknown field, a field of the wrong
//! type, an unknown `kind` or `apiVersion` are errors naming the document and the field path.
//! Every problem in the file is reported at once, as kubeadm aggregates its field errors.
//!
//! The documents kubeadm passes through to other components (KubeletConfiguration,
//! KubeProxyConfiguration) are accepted as objects and kept as they are.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::validate;

/// The kubeadm configuration API this stand-in implements.
pub const KUBEADM_API_VERSION: &str = "kubeadm.k8s.io/v1beta4";
/// The kubelet's configuration API, passed through.
pub const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// kube-proxy's configuration API, passed through.
pub const KUBE_PROXY_API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

/// Which kubeadm command reads the file: it decides which kinds belong in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Init,
    Join,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Init => "kubeadm init",
            Phase::Join => "kubeadm join",
        })
    }
}

/// One thing wrong with the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based document number, and its kind when it has a readable one.
    pub document: Option<(usize, Option<String>)>,
    /// The field path inside the document (`nodeRegistration.taints[0].effect`).
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.document {
            Some((n, Some(kind))) => write!(f, "document {n} ({kind}): ")?,
            Some((n, None)) => write!(f, "document {n}: ")?,
            None => {}
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the kubeadm configuration {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read and is wrong; every problem found is listed.
    #[error("the kubeadm configuration {path} is invalid ({} problem{}):\n  {}",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

/// One decoded document, as written (nulls removed), for the record.
#[derive(Debug, Clone)]
pub struct Document {
    pub api_version: String,
    pub kind: String,
    pub body: Value,
}

/// A validated configuration.
#[derive(Debug, Clone, Default)]
pub struct KubeadmConfig {
    pub init: Option<InitConfiguration>,
    pub cluster: Option<ClusterConfiguration>,
    pub join: Option<JoinConfiguration>,
    /// KubeletConfiguration, passed through.
    pub kubelet: Option<Value>,
    /// KubeProxyConfiguration, passed through.
    pub kube_proxy: Option<Value>,
    pub documents: Vec<Document>,
}

// ---- the kubeadm v1beta4 types (fields as in k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4) ----

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct InitConfiguration {
    pub bootstrap_tokens: Vec<BootstrapToken>,
    pub dry_run: bool,
    pub node_registration: NodeRegistrationOptions,
    #[serde(rename = "localAPIEndpoint")]
    pub local_api_endpoint: ApiEndpoint,
    pub certificate_key: String,
    pub skip_phases: Vec<String>,
    pub patches: Option<Patches>,
    pub timeouts: Option<Timeouts>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ClusterConfiguration {
    pub etcd: Etcd,
    pub networking: Networking,
    pub kubernetes_version: String,
    pub control_plane_endpoint: String,
    pub api_server: ApiServer,
    pub controller_manager: ControlPlaneComponent,
    pub scheduler: ControlPlaneComponent,
    pub dns: Dns,
    pub proxy: Proxy,
    pub certificates_dir: String,
    pub image_repository: String,
    pub feature_gates: BTreeMap<String, bool>,
    pub cluster_name: String,
    pub encryption_algorithm: String,
    pub certificate_validity_period: Option<String>,
    pub ca_certificate_validity_period: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct JoinConfiguration {
    pub dry_run: bool,
    pub node_registration: NodeRegistrationOptions,
    pub ca_cert_path: String,
    pub discovery: Discovery,
    pub control_plane: Option<JoinControlPlane>,
    pub skip_phases: Vec<String>,
    pub patches: Option<Patches>,
    pub timeouts: Option<Timeouts>,
}

/// bootstraptoken/v1 BootstrapToken.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct BootstrapToken {
    pub token: String,
    pub description: String,
    pub ttl: Option<String>,
    pub expires: Option<String>,
    pub usages: Vec<String>,
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NodeRegistrationOptions {
    pub name: String,
    pub cri_socket: String,
    pub taints: Option<Vec<Taint>>,
    pub kubelet_extra_args: Vec<Arg>,
    pub ignore_preflight_errors: Vec<String>,
    pub image_pull_policy: String,
    pub image_pull_serial: Option<bool>,
}

/// core/v1 Taint.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
    pub time_added: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Arg {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ApiEndpoint {
    pub advertise_address: String,
    pub bind_port: i64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Patches {
    pub directory: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Timeouts {
    pub control_plane_component_health_check: Option<String>,
    pub kubelet_health_check: Option<String>,
    #[serde(rename = "kubernetesAPICall")]
    pub kubernetes_api_call: Option<String>,
    #[serde(rename = "etcdAPICall")]
    pub etcd_api_call: Option<String>,
    pub tls_bootstrap: Option<String>,
    pub discovery: Option<String>,
    pub upgrade_manifests: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Etcd {
    pub local: Option<LocalEtcd>,
    pub external: Option<ExternalEtcd>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct LocalEtcd {
    pub image_repository: String,
    pub image_tag: String,
    pub data_dir: String,
    pub extra_args: Vec<Arg>,
    pub extra_envs: Vec<EnvVar>,
    #[serde(rename = "serverCertSANs")]
    pub server_cert_sans: Vec<String>,
    #[serde(rename = "peerCertSANs")]
    pub peer_cert_sans: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ExternalEtcd {
    pub endpoints: Vec<String>,
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Networking {
    pub service_subnet: String,
    pub pod_subnet: String,
    pub dns_domain: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ControlPlaneComponent {
    pub extra_args: Vec<Arg>,
    pub extra_volumes: Vec<HostPathMount>,
    pub extra_envs: Vec<EnvVar>,
}

/// APIServer: ControlPlaneComponent inlined, plus certSANs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ApiServer {
    pub extra_args: Vec<Arg>,
    pub extra_volumes: Vec<HostPathMount>,
    pub extra_envs: Vec<EnvVar>,
    #[serde(rename = "certSANs")]
    pub cert_sans: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct HostPathMount {
    pub name: String,
    pub host_path: String,
    pub mount_path: String,
    pub read_only: bool,
    pub path_type: String,
}

/// core/v1 EnvVar; `valueFrom` is kept as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    pub value_from: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Dns {
    pub image_repository: String,
    pub image_tag: String,
    pub disabled: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Proxy {
    pub disabled: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Discovery {
    pub bootstrap_token: Option<BootstrapTokenDiscovery>,
    pub file: Option<FileDiscovery>,
    pub tls_bootstrap_token: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct BootstrapTokenDiscovery {
    pub token: String,
    pub api_server_endpoint: String,
    pub ca_cert_hashes: Vec<String>,
    #[serde(rename = "unsafeSkipCAVerification")]
    pub unsafe_skip_ca_verification: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct FileDiscovery {
    pub kube_config_path: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct JoinControlPlane {
    #[serde(rename = "localAPIEndpoint")]
    pub local_api_endpoint: ApiEndpoint,
    pub certificate_key: String,
}

/// kubeadm's default API server port.
pub const DEFAULT_BIND_PORT: u16 = 6443;

impl ApiEndpoint {
    /// The port after kubeadm's defaulting (0 means 6443). Only meaningful once validated.
    pub fn port(&self) -> u16 {
        u16::try_from(self.bind_port)
            .ok()
            .filter(|p| *p != 0)
            .unwrap_or(DEFAULT_BIND_PORT)
    }
}

/// Reads and validates the file `kubeadm <phase> --config <path>` would read.
pub fn load(path: &Path, phase: Phase) -> Result<KubeadmConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, phase).map_err(|problems| ConfigError::Invalid {
        path: path.to_owned(),
        problems,
    })
}

/// Decodes and validates a configuration text for `phase`; `Err` lists every problem.
pub fn parse(text: &str, phase: Phase) -> Result<KubeadmConfig, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut config = KubeadmConfig::default();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut index = 0;
    for raw in serde_norway::Deserializer::from_str(text) {
        index += 1;
        let doc_problem = |kind: Option<&str>, field: Option<String>, message: String| Problem {
            document: Some((index, kind.map(str::to_owned))),
            field,
            message,
        };
        let value = match Value::deserialize(raw) {
            Ok(v) => v,
            Err(e) => {
                problems.push(doc_problem(None, None, format!("not valid YAML: {e}")));
                // The stream cannot be resumed after a syntax error (the parser would report
                // it again forever).
                break;
            }
        };
        let mut object = match value {
            // An empty document (`---` followed by nothing) is allowed, as in kubeadm.
            Value::Null => continue,
            Value::Object(map) => map,
            Value::Array(_) => {
                problems.push(doc_problem(
                    None,
                    None,
                    "is a list, not a configuration object: write one object per document, \
                     separated by ---"
                        .into(),
                ));
                continue;
            }
            other => {
                problems.push(doc_problem(
                    None,
                    None,
                    format!("is {other}, not a configuration object"),
                ));
                continue;
            }
        };
        strip_nulls(&mut object);
        let api_version = object.remove("apiVersion");
        let kind = object.remove("kind");
        let (api_version, kind) = match (api_version, kind) {
            (Some(Value::String(a)), Some(Value::String(k))) => (a, k),
            (a, k) => {
                let kind_name = match &k {
                    Some(Value::String(k)) => Some(k.as_str()),
                    _ => None,
                };
                if !matches!(a, Some(Value::String(_))) {
                    problems.push(doc_problem(
                        kind_name,
                        Some("apiVersion".into()),
                        "required: a string such as kubeadm.k8s.io/v1beta4".into(),
                    ));
                }
                if kind_name.is_none() {
                    problems.push(doc_problem(
                        None,
                        Some("kind".into()),
                        "required: a string such as InitConfiguration".into(),
                    ));
                }
                continue;
            }
        };
        if let Some(first) = seen.insert(kind.clone(), index) {
            problems.push(doc_problem(
                Some(&kind),
                None,
                format!("kind {kind} appears twice (documents {first} and {index})"),
            ));
            continue;
        }
        let body = Value::Object(object);
        let before = problems.len();
        {
            let mut report = |field: Option<String>, message: String| {
                problems.push(doc_problem(Some(&kind), field, message));
            };
            match (api_version.as_str(), kind.as_str(), phase) {
                (KUBEADM_API_VERSION, "InitConfiguration", Phase::Init) => {
                    if let Some(c) = decode::<InitConfiguration>(&body, &mut report) {
                        validate_init(&c, &mut report);
                        config.init = Some(c);
                    }
                }
                (KUBEADM_API_VERSION, "ClusterConfiguration", Phase::Init) => {
                    if let Some(c) = decode::<ClusterConfiguration>(&body, &mut report) {
                        validate_cluster(&c, &mut report);
                        config.cluster = Some(c);
                    }
                }
                (KUBEADM_API_VERSION, "JoinConfiguration", Phase::Join) => {
                    if let Some(c) = decode::<JoinConfiguration>(&body, &mut report) {
                        validate_join(&c, &mut report);
                        config.join = Some(c);
                    }
                }
                (KUBELET_API_VERSION, "KubeletConfiguration", Phase::Init) => {
                    config.kubelet = Some(body.clone());
                }
                (KUBE_PROXY_API_VERSION, "KubeProxyConfiguration", Phase::Init) => {
                    config.kube_proxy = Some(body.clone());
                }
                (
                    KUBEADM_API_VERSION,
                    "InitConfiguration" | "ClusterConfiguration" | "JoinConfiguration",
                    _,
                )
                | (KUBELET_API_VERSION, "KubeletConfiguration", _)
                | (KUBE_PROXY_API_VERSION, "KubeProxyConfiguration", _) => report(
                    None,
                    format!(
                        "kind {kind} has no effect on {phase} (kubeadm ignores it there); leave it out"
                    ),
                ),
                (KUBEADM_API_VERSION, "ResetConfiguration" | "UpgradeConfiguration", _) => report(
                    None,
                    format!("kind {kind} is for another kubeadm command, not {phase}"),
                ),
                (KUBEADM_API_VERSION, _, _) => report(
                    Some("kind".into()),
                    format!("unknown kind {kind:?} in {KUBEADM_API_VERSION}"),
                ),
                (a, _, _) if a.starts_with("kubeadm.k8s.io/") => report(
                    Some("apiVersion".into()),
                    format!(
                        "{a} is not supported: this stand-in implements {KUBEADM_API_VERSION} only"
                    ),
                ),
                (a, k, _) => report(
                    Some("apiVersion".into()),
                    format!("unknown apiVersion/kind {a}/{k}"),
                ),
            }
        }
        if problems.len() == before {
            config.documents.push(Document {
                api_version,
                kind,
                body,
            });
        }
    }
    if problems.is_empty() {
        match phase {
            Phase::Init if config.init.is_none() => problems.push(Problem {
                document: None,
                field: None,
                message: "no InitConfiguration document: the stand-in needs one (it cannot \
                          detect the node's address as kubeadm would)"
                    .into(),
            }),
            Phase::Join if config.join.is_none() => problems.push(Problem {
                document: None,
                field: None,
                message: "no JoinConfiguration document".into(),
            }),
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(problems)
    }
}

/// Go decodes `null` as "not set"; so does this.
fn strip_nulls(map: &mut serde_json::Map<String, Value>) {
    map.retain(|_, v| !v.is_null());
    for v in map.values_mut() {
        strip_nulls_in(v);
    }
}

fn strip_nulls_in(value: &mut Value) {
    match value {
        Value::Object(map) => strip_nulls(map),
        Value::Array(items) => items.iter_mut().for_each(strip_nulls_in),
        _ => {}
    }
}

/// Strict decoding: unknown fields and wrong types are reported with their path.
fn decode<T: serde::de::DeserializeOwned>(
    body: &Value,
    report: &mut dyn FnMut(Option<String>, String),
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(body.clone()) {
        Ok(v) => Some(v),
        Err(e) => {
            let path = e.path().to_string();
            let field = (path != ".").then_some(path);
            report(field, format!("strict decoding error: {}", e.inner()));
            None
        }
    }
}

type Report<'a> = dyn FnMut(Option<String>, String) + 'a;

fn check(report: &mut Report<'_>, field: &str, ok: bool, message: impl Into<String>) {
    if !ok {
        report(Some(field.to_owned()), message.into());
    }
}

fn check_duration(report: &mut Report<'_>, field: &str, value: Option<&String>) {
    if let Some(v) = value {
        check(
            report,
            field,
            validate::parse_go_duration(v).is_some(),
            format!("{v:?} is not a duration such as 24h0m0s or 5m"),
        );
    }
}

fn check_timeouts(report: &mut Report<'_>, t: Option<&Timeouts>) {
    let Some(t) = t else { return };
    for (name, v) in [
        (
            "controlPlaneComponentHealthCheck",
            &t.control_plane_component_health_check,
        ),
        ("kubeletHealthCheck", &t.kubelet_health_check),
        ("kubernetesAPICall", &t.kubernetes_api_call),
        ("etcdAPICall", &t.etcd_api_call),
        ("tlsBootstrap", &t.tls_bootstrap),
        ("discovery", &t.discovery),
        ("upgradeManifests", &t.upgrade_manifests),
    ] {
        check_duration(report, &format!("timeouts.{name}"), v.as_ref());
    }
}

fn check_args(report: &mut Report<'_>, field: &str, args: &[Arg]) {
    for (i, a) in args.iter().enumerate() {
        check(
            report,
            &format!("{field}[{i}].name"),
            !a.name.is_empty() && !a.name.starts_with('-'),
            format!(
                "{:?}: required, the flag name without leading dashes",
                a.name
            ),
        );
    }
}

fn check_envs(report: &mut Report<'_>, field: &str, envs: &[EnvVar]) {
    for (i, e) in envs.iter().enumerate() {
        check(
            report,
            &format!("{field}[{i}].name"),
            !e.name.is_empty(),
            "required",
        );
    }
}

fn check_volumes(report: &mut Report<'_>, field: &str, volumes: &[HostPathMount]) {
    for (i, v) in volumes.iter().enumerate() {
        let f = |n: &str| format!("{field}[{i}].{n}");
        check(
            report,
            &f("name"),
            validate::is_dns1123_label(&v.name),
            format!("{:?} is not a DNS-1123 label", v.name),
        );
        check(
            report,
            &f("hostPath"),
            v.host_path.starts_with('/'),
            "required, an absolute path",
        );
        check(
            report,
            &f("mountPath"),
            v.mount_path.starts_with('/'),
            "required, an absolute path",
        );
    }
}

fn check_api_endpoint(report: &mut Report<'_>, field: &str, e: &ApiEndpoint) {
    if e.advertise_address.is_empty() {
        report(
            Some(format!("{field}.advertiseAddress")),
            "required by the stand-in: it cannot detect the node's address as kubeadm would".into(),
        );
    } else {
        let ip = e.advertise_address.parse::<std::net::IpAddr>();
        check(
            report,
            &format!("{field}.advertiseAddress"),
            ip.as_ref().is_ok_and(|ip| !ip.is_unspecified()),
            format!("{:?} is not a usable IP address", e.advertise_address),
        );
    }
    check(
        report,
        &format!("{field}.bindPort"),
        e.bind_port == 0 || validate::is_port(e.bind_port),
        format!("{} is not a port between 1 and 65535", e.bind_port),
    );
}

fn check_node_registration(report: &mut Report<'_>, n: &NodeRegistrationOptions) {
    let f = |s: &str| format!("nodeRegistration.{s}");
    if !n.name.is_empty() {
        check(
            report,
            &f("name"),
            validate::is_dns1123_subdomain(&n.name),
            format!(
                "{:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')",
                n.name
            ),
        );
    }
    if !n.cri_socket.is_empty() {
        check(
            report,
            &f("criSocket"),
            n.cri_socket
                .strip_prefix("unix://")
                .is_some_and(|p| p.starts_with('/')),
            format!(
                "{:?} is not a unix:// URL of an absolute socket path",
                n.cri_socket
            ),
        );
    }
    for (i, t) in n.taints.iter().flatten().enumerate() {
        check(
            report,
            &f(&format!("taints[{i}].key")),
            validate::is_qualified_name(&t.key),
            format!("{:?} is not a qualified name", t.key),
        );
        check(
            report,
            &f(&format!("taints[{i}].effect")),
            matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ),
            format!(
                "{:?}: must be NoSchedule, PreferNoSchedule or NoExecute",
                t.effect
            ),
        );
    }
    check_args(report, &f("kubeletExtraArgs"), &n.kubelet_extra_args);
    check(
        report,
        &f("imagePullPolicy"),
        matches!(
            n.image_pull_policy.as_str(),
            "" | "Always" | "IfNotPresent" | "Never"
        ),
        format!(
            "{:?}: must be Always, IfNotPresent or Never",
            n.image_pull_policy
        ),
    );
}

fn validate_init(c: &InitConfiguration, report: &mut Report<'_>) {
    for (i, t) in c.bootstrap_tokens.iter().enumerate() {
        let f = |s: &str| format!("bootstrapTokens[{i}].{s}");
        check(
            report,
            &f("token"),
            validate::is_bootstrap_token(&t.token),
            "required, and must match [a-z0-9]{6}.[a-z0-9]{16}",
        );
        check_duration(report, &f("ttl"), t.ttl.as_ref());
        for (j, u) in t.usages.iter().enumerate() {
            check(
                report,
                &f(&format!("usages[{j}]")),
                matches!(u.as_str(), "signing" | "authentication"),
                format!("{u:?}: must be signing or authentication"),
            );
        }
        for (j, g) in t.groups.iter().enumerate() {
            check(
                report,
                &f(&format!("groups[{j}]")),
                validate::is_bootstrap_group(g),
                format!("{g:?} does not match system:bootstrappers:[a-z0-9:-]{{0,255}}[a-z0-9]"),
            );
        }
    }
    check_node_registration(report, &c.node_registration);
    check_api_endpoint(report, "localAPIEndpoint", &c.local_api_endpoint);
    if !c.certificate_key.is_empty() {
        check(
            report,
            "certificateKey",
            validate::is_certificate_key(&c.certificate_key),
            "must be 64 hex digits (a 32-byte AES key)",
        );
    }
    check_timeouts(report, c.timeouts.as_ref());
}

fn validate_cluster(c: &ClusterConfiguration, report: &mut Report<'_>) {
    if !c.kubernetes_version.is_empty() {
        check(
            report,
            "kubernetesVersion",
            validate::is_kubernetes_version(&c.kubernetes_version),
            format!(
                "{:?} is not a version such as v1.33.0 (the stand-in resolves no labels like \"stable\")",
                c.kubernetes_version
            ),
        );
    }
    if !c.control_plane_endpoint.is_empty()
        && let Err(why) = validate::check_optional_port_endpoint(&c.control_plane_endpoint)
    {
        report(Some("controlPlaneEndpoint".into()), why);
    }
    for (field, value) in [
        ("networking.serviceSubnet", &c.networking.service_subnet),
        ("networking.podSubnet", &c.networking.pod_subnet),
    ] {
        if !value.is_empty()
            && let Err(why) = validate::check_subnets(value)
        {
            report(Some(field.into()), why);
        }
    }
    if !c.networking.dns_domain.is_empty() {
        check(
            report,
            "networking.dnsDomain",
            validate::is_dns1123_subdomain(&c.networking.dns_domain),
            format!("{:?} is not a DNS-1123 subdomain", c.networking.dns_domain),
        );
    }
    match (&c.etcd.local, &c.etcd.external) {
        (Some(_), Some(_)) => report(
            Some("etcd".into()),
            "local and external are mutually exclusive".into(),
        ),
        (Some(local), None) => {
            check_args(report, "etcd.local.extraArgs", &local.extra_args);
            check_envs(report, "etcd.local.extraEnvs", &local.extra_envs);
        }
        (None, Some(external)) => {
            check(
                report,
                "etcd.external.endpoints",
                !external.endpoints.is_empty(),
                "required: at least one etcd endpoint",
            );
            for (i, e) in external.endpoints.iter().enumerate() {
                check(
                    report,
                    &format!("etcd.external.endpoints[{i}]"),
                    e.starts_with("https://") || e.starts_with("http://"),
                    format!("{e:?} is not an http(s) URL"),
                );
            }
        }
        (None, None) => {}
    }
    for (field, component) in [
        ("controllerManager", &c.controller_manager),
        ("scheduler", &c.scheduler),
    ] {
        check_args(report, &format!("{field}.extraArgs"), &component.extra_args);
        check_volumes(
            report,
            &format!("{field}.extraVolumes"),
            &component.extra_volumes,
        );
        check_envs(report, &format!("{field}.extraEnvs"), &component.extra_envs);
    }
    check_args(report, "apiServer.extraArgs", &c.api_server.extra_args);
    check_volumes(
        report,
        "apiServer.extraVolumes",
        &c.api_server.extra_volumes,
    );
    check_envs(report, "apiServer.extraEnvs", &c.api_server.extra_envs);
    for (i, san) in c.api_server.cert_sans.iter().enumerate() {
        let name = san.strip_prefix("*.").unwrap_or(san);
        check(
            report,
            &format!("apiServer.certSANs[{i}]"),
            validate::is_host(name),
            format!("{san:?} is neither an IP address nor a DNS name"),
        );
    }
    if !c.certificates_dir.is_empty() {
        check(
            report,
            "certificatesDir",
            c.certificates_dir.starts_with('/'),
            "must be an absolute path",
        );
    }
    check(
        report,
        "encryptionAlgorithm",
        matches!(
            c.encryption_algorithm.as_str(),
            "" | "RSA-2048" | "RSA-3072" | "RSA-4096" | "ECDSA-P256"
        ),
        format!(
            "{:?}: must be RSA-2048, RSA-3072, RSA-4096 or ECDSA-P256",
            c.encryption_algorithm
        ),
    );
    check_duration(
        report,
        "certificateValidityPeriod",
        c.certificate_validity_period.as_ref(),
    );
    check_duration(
        report,
        "caCertificateValidityPeriod",
        c.ca_certificate_validity_period.as_ref(),
    );
}

fn validate_join(c: &JoinConfiguration, report: &mut Report<'_>) {
    check_node_registration(report, &c.node_registration);
    if !c.ca_cert_path.is_empty() {
        check(
            report,
            "caCertPath",
            c.ca_cert_path.starts_with('/'),
            "must be an absolute path",
        );
    }
    match (&c.discovery.bootstrap_token, &c.discovery.file) {
        (Some(_), Some(_)) => report(
            Some("discovery".into()),
            "bootstrapToken and file are mutually exclusive".into(),
        ),
        (None, Some(_)) => report(
            Some("discovery.file".into()),
            "the stand-in implements bootstrap-token discovery only (what hawser uses)".into(),
        ),
        (None, None) => report(
            Some("discovery.bootstrapToken".into()),
            "required: bootstrapToken or file discovery must be set".into(),
        ),
        (Some(b), None) => {
            check(
                report,
                "discovery.bootstrapToken.token",
                validate::is_bootstrap_token(&b.token),
                "required, and must match [a-z0-9]{6}.[a-z0-9]{16}",
            );
            if b.api_server_endpoint.is_empty() {
                report(
                    Some("discovery.bootstrapToken.apiServerEndpoint".into()),
                    "required: the API server's host:port".into(),
                );
            } else if let Err(why) = validate::split_host_port(&b.api_server_endpoint) {
                report(
                    Some("discovery.bootstrapToken.apiServerEndpoint".into()),
                    why,
                );
            }
            for (i, h) in b.ca_cert_hashes.iter().enumerate() {
                check(
                    report,
                    &format!("discovery.bootstrapToken.caCertHashes[{i}]"),
                    validate::is_ca_cert_hash(h),
                    format!("{h:?} is not sha256:<64 hex digits>"),
                );
            }
            if b.ca_cert_hashes.is_empty() && !b.unsafe_skip_ca_verification {
                report(
                    Some("discovery.bootstrapToken".into()),
                    "token-based discovery without caCertHashes can be unsafe: set \
                     caCertHashes, or unsafeSkipCAVerification: true to continue"
                        .into(),
                );
            }
        }
    }
    if !c.discovery.tls_bootstrap_token.is_empty() {
        check(
            report,
            "discovery.tlsBootstrapToken",
            validate::is_bootstrap_token(&c.discovery.tls_bootstrap_token),
            "must match [a-z0-9]{6}.[a-z0-9]{16}",
        );
    }
    if let Some(cp) = &c.control_plane {
        check_api_endpoint(
            report,
            "controlPlane.localAPIEndpoint",
            &cp.local_api_endpoint,
        );
        if !cp.certificate_key.is_empty() {
            check(
                report,
                "controlPlane.certificateKey",
                validate::is_certificate_key(&cp.certificate_key),
                "must be 64 hex digits (a 32-byte AES key)",
            );
        }
    }
    check_timeouts(report, c.timeouts.as_ref());
}
