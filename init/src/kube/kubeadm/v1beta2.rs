//! kubeadm's `v1beta2` documents (kubeadm 1.20, the release hawser builds from Debian's
//! source), only the fields hawser sets; the Go types are
//! `cmd/kubeadm/app/apis/kubeadm/v1beta2/types.go` of Kubernetes 1.20.2.
//!
//! The same things as `v1beta4` ([`super::v1beta4`]), in its shapes:
//!
//! - `nodeRegistration.kubeletExtraArgs` is a string map (`{"node-ip": …}`), not a list;
//! - no `timeouts` block: the control plane's wait is `apiServer.timeoutForControlPlane`, set
//!   to [`TIMEOUT_FOR_CONTROL_PLANE`] (kubeadm's 4 min default is too short for an API server
//!   under emulation: 154 s to `/readyz` was measured under TCG);
//! - no `skipPhases` (added in `v1beta3`): what hawser needs skipped is on the command line
//!   ([`super::command_flags`]).
//!
//! `JoinControlPlane.certificateKey`, `localAPIEndpoint`, the bootstrap token and its
//! discovery are as in `v1beta4`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hawser_kube_types::KubeadmApi;
use serde::Serialize;
use zeroize::Zeroizing;

use super::{
    ApiEndpoint, BootstrapTokenDiscovery, BootstrapTokenSpec, CRI_SOCKET, CertificateKey,
    CheckedInit, JoinRequest, KubeadmConfigError, Networking, render,
};

/// The documents' `apiVersion`.
fn api_version() -> &'static str {
    KubeadmApi::V1beta2.api_version()
}

/// `apiServer.timeoutForControlPlane`: how long `kubeadm init` (and a control-plane join)
/// waits for the API server (a Go duration).
pub const TIMEOUT_FOR_CONTROL_PLANE: &str = "10m0s";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeRegistration<'a> {
    name: &'a str,
    cri_socket: &'a str,
    kubelet_extra_args: BTreeMap<&'a str, String>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ignore_preflight_errors: &'a [String],
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
struct ApiServer<'a> {
    #[serde(rename = "certSANs", skip_serializing_if = "<[_]>::is_empty")]
    cert_sans: &'a [String],
    timeout_for_control_plane: &'a str,
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

fn node_registration<'a>(
    node_name: &'a str,
    node_ip: IpAddr,
    ignore_preflight_errors: &'a [String],
) -> NodeRegistration<'a> {
    NodeRegistration {
        name: node_name,
        cri_socket: CRI_SOCKET,
        kubelet_extra_args: BTreeMap::from([("node-ip", node_ip.to_string())]),
        ignore_preflight_errors,
    }
}

/// `kubeadm init`'s documents: InitConfiguration, ClusterConfiguration, KubeletConfiguration.
pub(super) fn init(checked: CheckedInit<'_>) -> Result<Vec<Zeroizing<String>>, KubeadmConfigError> {
    let request = checked.request;
    let networking = checked.networking();
    let init = InitConfiguration {
        api_version: api_version(),
        kind: "InitConfiguration",
        bootstrap_tokens: checked.bootstrap_tokens,
        node_registration: node_registration(
            &request.node_name,
            request.node_ip,
            &request.ignore_preflight_errors,
        ),
        local_api_endpoint: ApiEndpoint::of(request.node_ip),
    };
    let cluster = ClusterConfiguration {
        api_version: api_version(),
        kind: "ClusterConfiguration",
        cluster_name: &request.cluster_name,
        kubernetes_version: request.kubernetes_version.as_str(),
        control_plane_endpoint: checked.control_plane_endpoint,
        networking,
        api_server: ApiServer {
            cert_sans: &request.cert_sans,
            timeout_for_control_plane: TIMEOUT_FOR_CONTROL_PLANE,
        },
    };
    Ok(vec![
        render(&init)?,
        render(&cluster)?,
        render(&CheckedInit::kubelet())?,
    ])
}

/// `kubeadm join`'s JoinConfiguration.
pub(super) fn join(ticket: &JoinRequest) -> Result<Zeroizing<String>, KubeadmConfigError> {
    let join = JoinConfiguration {
        api_version: api_version(),
        kind: "JoinConfiguration",
        discovery: Discovery {
            bootstrap_token: ticket.bootstrap_token_discovery(),
        },
        node_registration: node_registration(
            &ticket.node_name,
            ticket.node_ip,
            &ticket.ignore_preflight_errors,
        ),
        control_plane: ticket.control_plane.as_ref().map(|cp| JoinControlPlane {
            local_api_endpoint: ApiEndpoint::of(ticket.node_ip),
            certificate_key: cp.certificate_key.as_ref().map(CertificateKey::expose),
        }),
    };
    render(&join)
}

#[cfg(test)]
mod tests;
