//! The kubeadm v1beta4 configuration types, fields as in
//! k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4. Decoding is strict
//! (`deny_unknown_fields`), as kubeadm's is.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

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
