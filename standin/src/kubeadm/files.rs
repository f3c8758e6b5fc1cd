//! The files kubeadm writes for the kubelet and the admin, shared by `init` and `join`: the
//! kubelet's `config.yaml` and `kubeadm-flags.env`, `admin.conf`, the API server's manifest.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{DEFAULT_CRI_SOCKET, KubeadmError};
use crate::pki::{self, Ca, Credentials};
use crate::{StandinEnv, config, etcd};

/// /var/lib/kubelet/config.yaml and kubeadm-flags.env, as kubeadm writes them for the kubelet.
pub(super) fn write_kubelet_files(
    env: &StandinEnv,
    kubelet_config: Option<&Value>,
    registration: &config::NodeRegistrationOptions,
    written: &mut Vec<PathBuf>,
) -> Result<(), KubeadmError> {
    let mut document = kubelet_config.cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut document {
        map.insert("apiVersion".into(), json!(config::KUBELET_API_VERSION));
        map.insert("kind".into(), json!("KubeletConfiguration"));
        // kubeadm's default: the kubelet runs the control plane's static pods from there.
        map.entry("staticPodPath")
            .or_insert_with(|| json!(etcd::manifests_dir(env)));
    }
    let yaml = serde_norway::to_string(&document).unwrap_or_default();
    let config_path = env.root.join("var/lib/kubelet/config.yaml");
    pki::write_file(
        &config_path,
        format!("# Written by the kubeadm STAND-IN (hawser-standin).\n{yaml}").as_bytes(),
        0o644,
    )?;
    written.push(config_path);

    let socket = if registration.cri_socket.is_empty() {
        DEFAULT_CRI_SOCKET
    } else {
        &registration.cri_socket
    };
    let mut args = vec![format!("--container-runtime-endpoint={socket}")];
    args.extend(
        registration
            .kubelet_extra_args
            .iter()
            .map(|a| format!("--{}={}", a.name, a.value)),
    );
    let flags_path = env.root.join("var/lib/kubelet/kubeadm-flags.env");
    pki::write_file(
        &flags_path,
        format!("KUBELET_KUBEADM_ARGS=\"{}\"\n", args.join(" ")).as_bytes(),
        0o644,
    )?;
    written.push(flags_path);
    Ok(())
}

/// Writes `admin.conf` under `kube_dir` (a client certificate of the cluster CA for
/// `kubernetes-admin` in `kubeadm:cluster-admins`, pointing at `server`), as `kubeadm init`
/// and a control-plane `kubeadm join` do; returns its path.
pub(super) fn write_admin_conf(
    kube_dir: &Path,
    ca: &Ca,
    server: &str,
) -> Result<PathBuf, KubeadmError> {
    let (admin_cert, admin_key) =
        ca.client_cert("kubernetes-admin", Some("kubeadm:cluster-admins"))?;
    let admin = pki::kubeconfig(
        server,
        Some(&ca.cert_pem),
        "kubernetes-admin-standin",
        Credentials::ClientCert {
            cert_pem: &admin_cert,
            key_pem: &admin_key,
        },
    );
    let path = kube_dir.join("admin.conf");
    pki::write_kubeconfig(&path, &admin)?;
    Ok(path)
}

/// The API server's static pod manifest, as kubeadm writes it for the kubelet. The stand-in
/// kubelet runs no pod: it opens the port the manifest names (see `kubelet`), so that other
/// nodes' discovery reaches this control plane.
pub const API_SERVER_MANIFEST: &str = "etc/kubernetes/manifests/kube-apiserver.yaml";

pub(super) fn write_api_server_manifest(
    env: &StandinEnv,
    address: &str,
    port: u16,
) -> Result<PathBuf, KubeadmError> {
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "kube-apiserver",
            "image": "registry.k8s.io/kube-apiserver (not pulled: stand-in)",
            "command": [
                "kube-apiserver",
                format!("--advertise-address={address}"),
                format!("--secure-port={port}"),
            ],
        }]},
    });
    let yaml = serde_norway::to_string(&manifest).unwrap_or_default();
    let path = env.root.join(API_SERVER_MANIFEST);
    pki::write_file(
        &path,
        format!("# Written by the kubeadm STAND-IN (hawser-standin).\n{yaml}").as_bytes(),
        0o600,
    )?;
    Ok(path)
}
