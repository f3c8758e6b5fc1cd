//! What a node image says about its Kubernetes: `/usr/share/hawser/kubernetes.json` in the
//! rootfs, written by the image builder and read by PID 1.
//!
//! ```text
//!   hawser image build:  kubernetes.lock ─► binaries + OCI images ─► ImageKubernetes (JSON)
//!   hawser-init:         ImageKubernetes ─► the cluster's default version, the early refusal
//!                        of another, the images imported into containerd, and kubeadm's
//!                        imageRepository / etcd image / pause image
//! ```
//!
//! An image carries Kubernetes built from the pinned source, official release binaries (both
//! with their control-plane images in one OCI archive), or hawser's stand-ins (no images; the
//! version is the one whose kubeadm configuration the stand-ins check). The file is part of the
//! verified rootfs, so what it says is measured through the root hash.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::KubernetesVersion;

/// Where the file is, relative to the rootfs.
pub const IMAGE_KUBERNETES_PATH: &str = "usr/share/hawser/kubernetes.json";

/// Where the node's Kubernetes binaries came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubernetesOrigin {
    /// Built by hawser from the Debian source package pinned in `kubernetes.lock`.
    Source,
    /// Upstream's release binaries pinned in `kubernetes.lock`.
    Release,
    /// hawser's stand-ins for kubeadm and kubelet (crate `hawser-standin`): not Kubernetes.
    StandIn,
}

impl KubernetesOrigin {
    /// Whether the image carries real Kubernetes.
    pub fn is_real(self) -> bool {
        self != KubernetesOrigin::StandIn
    }
}

impl fmt::Display for KubernetesOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KubernetesOrigin::Source => "built from the pinned source",
            KubernetesOrigin::Release => "upstream release binaries",
            KubernetesOrigin::StandIn => "hawser's stand-ins (NOT Kubernetes)",
        })
    }
}

/// An image reference `repository:tag`, as containerd names an imported image.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageRef {
    /// `registry.hawser.invalid/kubernetes/etcd`
    pub repository: String,
    /// `3.4.23-0`
    pub tag: String,
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.repository, self.tag)
    }
}

/// The control-plane images of a real-Kubernetes image, as kubeadm's configuration names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSet {
    /// The OCI archive (an `index.json` with one manifest per image), absolute in the rootfs:
    /// `/usr/share/hawser/kubernetes/images.tar`, what `ctr -n k8s.io images import` reads.
    pub archive: String,
    /// kubeadm's `imageRepository`: `<repository>/kube-apiserver:<version>` and the other
    /// control-plane components are found under it.
    pub image_repository: String,
    /// etcd's image, `<repository>/etcd:<tag>`: kubeadm's `etcd.local.imageRepository` is the
    /// repository without its last `/etcd` (kubeadm appends it), `imageTag` the tag.
    pub etcd: ImageRef,
    /// containerd's `sandbox_image` (and kubelet's `--pod-infra-container-image`).
    pub pause: ImageRef,
    /// Every image in the archive, as `repository:tag`.
    pub images: Vec<String>,
    /// The test/tools image (a shell and network tools, for pods that check the cluster), also
    /// in [`Self::images`]. Absent from descriptions written before it existed, and from
    /// image sets without one (kubeadm's configuration never names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ImageRef>,
}

/// The control-plane components whose images are tagged with the Kubernetes version, as
/// kubeadm names them under its `imageRepository`.
pub const KUBERNETES_IMAGES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
];

impl ImageSet {
    /// The set of an image whose archive is at `archive`: [`KUBERNETES_IMAGES`] at `version`,
    /// `etcd:<etcd_tag>` and `pause:<pause_tag>`, all under `repository`; `images` sorted.
    pub fn named(
        repository: &str,
        archive: &str,
        version: &str,
        etcd_tag: &str,
        pause_tag: &str,
    ) -> ImageSet {
        let reference = |name: &str, tag: &str| ImageRef {
            repository: format!("{repository}/{name}"),
            tag: tag.to_owned(),
        };
        let etcd = reference("etcd", etcd_tag);
        let pause = reference("pause", pause_tag);
        let mut images: Vec<String> = KUBERNETES_IMAGES
            .iter()
            .map(|name| reference(name, version).to_string())
            .chain([etcd.to_string(), pause.to_string()])
            .collect();
        images.sort();
        ImageSet {
            archive: archive.to_owned(),
            image_repository: repository.to_owned(),
            etcd,
            pause,
            images,
            tools: None,
        }
    }

    /// The set with `tools` as its tools image, added to [`Self::images`] (kept sorted; a
    /// previous tools image is replaced).
    pub fn with_tools(mut self, tools: ImageRef) -> ImageSet {
        if let Some(previous) = self.tools.take() {
            let previous = previous.to_string();
            self.images.retain(|name| *name != previous);
        }
        self.images.push(tools.to_string());
        self.images.sort();
        self.tools = Some(tools);
        self
    }

    /// The images kubeadm's control plane runs (every image but the tools image), sorted.
    pub fn control_plane_images(&self) -> Vec<&str> {
        let tools = self.tools.as_ref().map(ToString::to_string);
        self.images
            .iter()
            .filter(|name| Some(*name) != tools.as_ref())
            .map(String::as_str)
            .collect()
    }
}

/// `/usr/share/hawser/kubernetes.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageKubernetes {
    pub origin: KubernetesOrigin,
    /// The version of the image's kubeadm and kubelet (`v1.20.2`); for stand-ins, the version
    /// whose kubeadm configuration they check. The default of `hawser init`, and the only one
    /// this image installs.
    pub version: String,
    /// The control-plane images; `None` for stand-ins.
    pub images: Option<ImageSet>,
    /// What a stock kubeadm cluster has and this image does not (e.g. CoreDNS), one line each;
    /// PID 1 prints them in the node's status.
    #[serde(default)]
    pub absent: Vec<String>,
}

/// Why an `ImageKubernetes` is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ImageKubernetesError {
    #[error("not the JSON of an image's Kubernetes description")]
    Json(#[from] serde_json::Error),
    #[error("the image's Kubernetes version {value:?} is not a Kubernetes version")]
    Version {
        value: String,
        #[source]
        source: crate::KubernetesVersionError,
    },
    #[error("the image carries real Kubernetes ({origin}) but names no control-plane images")]
    NoImages { origin: KubernetesOrigin },
}

impl ImageKubernetes {
    /// Parses and checks the file's text.
    pub fn from_json(text: &str) -> Result<ImageKubernetes, ImageKubernetesError> {
        let parsed: ImageKubernetes = serde_json::from_str(text)?;
        parsed.kubernetes_version()?;
        if parsed.origin.is_real() && parsed.images.is_none() {
            return Err(ImageKubernetesError::NoImages {
                origin: parsed.origin,
            });
        }
        Ok(parsed)
    }

    /// The file's text: pretty JSON with a final newline (the same bytes for the same value).
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }

    /// [`Self::version`], parsed.
    pub fn kubernetes_version(&self) -> Result<KubernetesVersion, ImageKubernetesError> {
        KubernetesVersion::from_str(&self.version).map_err(|source| ImageKubernetesError::Version {
            value: self.version.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> ImageKubernetes {
        ImageKubernetes {
            origin: KubernetesOrigin::Source,
            version: "v1.20.2".into(),
            images: Some(ImageSet::named(
                "registry.hawser.invalid/kubernetes",
                "/usr/share/hawser/kubernetes/images.tar",
                "v1.20.2",
                "3.4.23-0",
                "3.2",
            )),
            absent: vec!["CoreDNS".into()],
        }
    }

    #[test]
    fn a_named_set_has_the_four_components_etcd_and_pause_sorted() {
        let set = real().images.unwrap();
        assert_eq!(
            set.etcd.to_string(),
            "registry.hawser.invalid/kubernetes/etcd:3.4.23-0"
        );
        assert_eq!(
            set.pause.to_string(),
            "registry.hawser.invalid/kubernetes/pause:3.2"
        );
        assert_eq!(
            set.images,
            [
                "etcd:3.4.23-0",
                "kube-apiserver:v1.20.2",
                "kube-controller-manager:v1.20.2",
                "kube-proxy:v1.20.2",
                "kube-scheduler:v1.20.2",
                "pause:3.2",
            ]
            .map(|name| format!("registry.hawser.invalid/kubernetes/{name}"))
        );
    }

    fn busybox() -> ImageRef {
        ImageRef {
            repository: "registry.hawser.invalid/hawser/busybox".into(),
            tag: "1.35.0".into(),
        }
    }

    #[test]
    fn the_tools_image_joins_the_sorted_list_but_not_the_control_plane() {
        let plain = real().images.unwrap();
        let set = plain.clone().with_tools(busybox());
        assert_eq!(set.tools, Some(busybox()));
        assert_eq!(set.images.len(), 7);
        assert_eq!(
            set.images[0],
            "registry.hawser.invalid/hawser/busybox:1.35.0"
        );
        assert!(set.images.is_sorted());
        assert_eq!(set.control_plane_images(), plain.control_plane_images());
        assert_eq!(set.control_plane_images().len(), 6);
        let newer = ImageRef {
            tag: "1.36.1".into(),
            ..busybox()
        };
        let replaced = set.with_tools(newer.clone());
        assert_eq!(replaced.images.len(), 7);
        assert!(replaced.images.contains(&newer.to_string()));
        assert!(!replaced.images.contains(&busybox().to_string()));
    }

    #[test]
    fn the_tools_field_is_camel_case_optional_and_left_out_when_absent() {
        let mut image = real();
        let without = image.to_json();
        assert!(!without.contains("tools"), "{without}");
        assert_eq!(ImageKubernetes::from_json(&without).unwrap(), image);

        image.images = image.images.map(|set| set.with_tools(busybox()));
        let text = image.to_json();
        assert!(
            text.contains(
                "\"tools\": {\n      \"repository\": \"registry.hawser.invalid/hawser/busybox\""
            ),
            "{text}"
        );
        assert_eq!(ImageKubernetes::from_json(&text).unwrap(), image);
    }

    #[test]
    fn round_trips_through_its_json() {
        let image = real();
        let text = image.to_json();
        assert!(text.contains("\"origin\": \"source\""), "{text}");
        assert!(text.contains("\"imageRepository\""), "{text}");
        assert_eq!(ImageKubernetes::from_json(&text).unwrap(), image);
    }

    #[test]
    fn refuses_a_bad_version_and_real_kubernetes_without_images() {
        let mut bad = real();
        bad.version = "1.20".into();
        let err = ImageKubernetes::from_json(&bad.to_json()).unwrap_err();
        assert!(err.to_string().contains("\"1.20\""), "{err}");

        let mut no_images = real();
        no_images.images = None;
        let err = ImageKubernetes::from_json(&no_images.to_json()).unwrap_err();
        assert!(
            err.to_string().contains("names no control-plane images"),
            "{err}"
        );

        let mut standin = no_images;
        standin.origin = KubernetesOrigin::StandIn;
        standin.version = "v1.33.4".into();
        assert!(ImageKubernetes::from_json(&standin.to_json()).is_ok());
    }

    #[test]
    fn refuses_unknown_fields() {
        let text = real().to_json().replacen('{', "{\"extra\": 1,", 1);
        assert!(ImageKubernetes::from_json(&text).is_err());
    }
}
