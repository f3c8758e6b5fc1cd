//! The image's control-plane images in a kubeadm configuration, applied after the pivot.
//!
//! A real-Kubernetes image carries its control-plane images in one OCI archive, imported into
//! containerd at boot under `registry.hawser.invalid/kubernetes/…` (a name no registry
//! answers: a node never pulls). kubeadm must name exactly those images:
//!
//! - `ClusterConfiguration.imageRepository`: where kube-apiserver, kube-controller-manager,
//!   kube-scheduler, kube-proxy (at the cluster's version) and pause are found;
//! - `ClusterConfiguration.etcd.local.imageRepository` / `imageTag`: etcd (Debian's 3.4.23, not
//!   1.20's default 3.4.13). kubeadm appends `/etcd` to the repository, so the image's etcd
//!   repository must end in `/etcd`;
//! - `nodeRegistration.kubeletExtraArgs["pod-infra-container-image"]`: the pause image, which
//!   the kubelet then never garbage-collects (kubeadm 1.20 sets it only for Docker).
//!
//! The same holds for two facts of the image that are not images: its `/usr` is read-only, so the
//! FlexVolume plugins' directory moves to the state disk ([`FLEX_VOLUME_DIR`]), and its control
//! plane runs on small (and emulated) machines, so leader election waits longer
//! ([`LEADER_ELECTION_ARGS`]).
//!
//! The images belong to the image, not to the cluster: the kubeadm intent a first boot keeps
//! before the pivot (`crate::kube::grants`) cannot know them, and a node that boots a newer
//! image must run with its images. So they are applied to the configuration at every attempt,
//! on the documents hawser rendered (JSON objects): the values are set, the rest is unchanged.
//! The documents hold the bootstrap token: every string of the parsed documents is wiped
//! before it is freed, and errors never quote the text.

use hawser_kube_types::{ImageSet, KubeadmApi};
use serde_json::{Map, Value};
use zeroize::{Zeroize as _, Zeroizing};

use super::{KubeadmConfig, KubeadmConfigError, stream};

/// The kubelet flag that names the pause image.
pub const PAUSE_IMAGE_ARG: &str = "pod-infra-container-image";
/// The controller manager's flag for the FlexVolume plugins' directory.
pub const FLEX_VOLUME_ARG: &str = "flex-volume-plugin-dir";
/// Where the FlexVolume plugins' directory is on a hawser node: on the state disk. kubeadm
/// mounts the controller manager's (`/usr/libexec/kubernetes/kubelet-plugins/volume/exec` by
/// default) into its static pod as a `DirectoryOrCreate` host path, which cannot be created
/// in the read-only `/usr` of the verified rootfs: the controller manager would never start
/// (and with it neither the bootstrap signer that kubeadm join's discovery waits for nor the
/// CSR approval of the kubelets' certificates). The kubelet's `volumePluginDir` is the same.
pub const FLEX_VOLUME_DIR: &str = "/var/lib/kubelet/volumeplugins";
/// The controller manager's and the scheduler's leader election, tolerant of a slow API
/// server: a leader that cannot renew its lease within the deadline exits (and is restarted by
/// the kubelet), and kubeadm's defaults (15 s lease, 10 s deadline, 2 s retry) are shorter
/// than an etcd write takes on a loaded machine under emulation. Failover after a control
/// plane's loss takes up to the lease duration instead of 15 s.
pub const LEADER_ELECTION_ARGS: [(&str, &str); 3] = [
    ("leader-elect-lease-duration", "60s"),
    ("leader-elect-renew-deadline", "40s"),
    ("leader-elect-retry-period", "5s"),
];

/// Whether the image's archive has a CoreDNS image (hawser's never do: not in Debian).
pub fn has_coredns(images: &ImageSet) -> bool {
    images.images.iter().any(|name| {
        let repository = name
            .rsplit_once(':')
            .map_or(name.as_str(), |(repo, _)| repo);
        repository.rsplit('/').next() == Some("coredns")
    })
}

/// kubeadm's `etcd.local.imageRepository`: the image's etcd repository without its last
/// `/etcd`, which kubeadm appends.
fn etcd_repository(images: &ImageSet) -> Result<&str, KubeadmConfigError> {
    images
        .etcd
        .repository
        .strip_suffix("/etcd")
        .filter(|prefix| !prefix.is_empty())
        .ok_or_else(|| KubeadmConfigError::Invalid {
            field: "the image's etcd repository",
            value: images.etcd.repository.clone(),
            reason: "expected <repository>/etcd: kubeadm appends /etcd to \
                     etcd.local.imageRepository",
        })
}

/// `config` with the image's images set (see the module docs).
pub fn with_images(
    config: &KubeadmConfig,
    images: &ImageSet,
) -> Result<KubeadmConfig, KubeadmConfigError> {
    let etcd_repository = etcd_repository(images)?;
    let pause = images.pause.to_string();
    let mut documents = Vec::new();
    for text in config.as_str().split("\n---\n") {
        let mut document: Value =
            serde_json::from_str(text).map_err(KubeadmConfigError::NotJson)?;
        let api = document
            .get("apiVersion")
            .and_then(Value::as_str)
            .and_then(KubeadmApi::from_api_version);
        let kind = document
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if let (Some(api), Some(fields)) = (api, document.as_object_mut()) {
            match kind.as_str() {
                "ClusterConfiguration" => {
                    fields.insert(
                        "imageRepository".to_owned(),
                        Value::from(images.image_repository.as_str()),
                    );
                    if let Some(local) =
                        object(fields, "etcd").and_then(|etcd| object(etcd, "local"))
                    {
                        local.insert("imageRepository".to_owned(), Value::from(etcd_repository));
                        local.insert("imageTag".to_owned(), Value::from(images.etcd.tag.as_str()));
                    }
                    if let Some(manager) = object(fields, "controllerManager") {
                        set_arg(manager, "extraArgs", api, FLEX_VOLUME_ARG, FLEX_VOLUME_DIR);
                    }
                    for component in ["controllerManager", "scheduler"] {
                        if let Some(fields) = object(fields, component) {
                            for (name, value) in LEADER_ELECTION_ARGS {
                                set_arg(fields, "extraArgs", api, name, value);
                            }
                        }
                    }
                }
                "InitConfiguration" | "JoinConfiguration" => {
                    if let Some(registration) = object(fields, "nodeRegistration") {
                        set_arg(
                            registration,
                            "kubeletExtraArgs",
                            api,
                            PAUSE_IMAGE_ARG,
                            &pause,
                        );
                    }
                }
                _ => {}
            }
        }
        if kind == "KubeletConfiguration"
            && let Some(fields) = document.as_object_mut()
        {
            fields.insert("volumePluginDir".to_owned(), Value::from(FLEX_VOLUME_DIR));
        }
        let rendered = serde_json::to_string_pretty(&document)
            .map(Zeroizing::new)
            .map_err(KubeadmConfigError::Encode);
        wipe(&mut document);
        documents.push(rendered?);
    }
    Ok(stream(&documents))
}

/// The object under `key`, made if absent (or not an object); always `Some`.
fn object<'a>(fields: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    let entry = fields
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut()
}

/// Sets a flag in `fields[key]` (`nodeRegistration.kubeletExtraArgs`, a component's
/// `extraArgs`), in the API's shape: a string map (`v1beta2`) or a `{name, value}` list
/// (`v1beta4`).
fn set_arg(fields: &mut Map<String, Value>, key: &str, api: KubeadmApi, name: &str, value: &str) {
    match api {
        KubeadmApi::V1beta2 => {
            if let Some(args) = object(fields, key) {
                args.insert(name.to_owned(), Value::from(value));
            }
        }
        KubeadmApi::V1beta4 => {
            let args = fields
                .entry(key.to_owned())
                .or_insert_with(|| Value::Array(Vec::new()));
            if !args.is_array() {
                *args = Value::Array(Vec::new());
            }
            if let Value::Array(list) = args {
                list.retain(|arg| arg.get("name").and_then(Value::as_str) != Some(name));
                let mut arg = Map::new();
                arg.insert("name".to_owned(), Value::from(name));
                arg.insert("value".to_owned(), Value::from(value));
                list.push(Value::Object(arg));
            }
        }
    }
}

/// Wipes every string of a parsed document (it may hold the bootstrap token).
fn wipe(value: &mut Value) {
    match value {
        Value::String(text) => text.zeroize(),
        Value::Array(items) => items.iter_mut().for_each(wipe),
        Value::Object(fields) => fields.values_mut().for_each(wipe),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests;
