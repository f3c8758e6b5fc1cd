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
//! with their images in two OCI archives: what every node runs, and what only a control plane
//! runs, so a worker imports an eighth of the bytes), or hawser's stand-ins (no images; the
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

/// One OCI archive of the image (an `index.json` with one manifest per image) and the images in
/// it, as `repository:tag` (sorted): what `ctr -n k8s.io images import` reads and what
/// containerd lists afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageArchive {
    /// Absolute in the rootfs: `/usr/share/hawser/kubernetes/node-images.tar`.
    pub path: String,
    /// The images in it, sorted.
    pub images: Vec<String>,
}

/// The images of a real-Kubernetes image, as kubeadm's configuration names them, in two
/// archives: what every node runs ([`Self::node`]: pause, kube-proxy, the tools image) and what
/// only a control plane runs ([`Self::control_plane`]: the API server, the controller manager,
/// the scheduler, etcd). A worker imports the first, a control plane both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSet {
    /// The images every node runs: `/usr/share/hawser/kubernetes/node-images.tar`.
    pub node: ImageArchive,
    /// The images only a control plane runs:
    /// `/usr/share/hawser/kubernetes/control-plane-images.tar`.
    pub control_plane: ImageArchive,
    /// kubeadm's `imageRepository`: `<repository>/kube-apiserver:<version>` and the other
    /// control-plane components are found under it.
    pub image_repository: String,
    /// etcd's image, `<repository>/etcd:<tag>`: kubeadm's `etcd.local.imageRepository` is the
    /// repository without its last `/etcd` (kubeadm appends it), `imageTag` the tag.
    pub etcd: ImageRef,
    /// containerd's `sandbox_image` (and kubelet's `--pod-infra-container-image`).
    pub pause: ImageRef,
    /// Every image of both archives, as `repository:tag`, sorted.
    pub images: Vec<String>,
    /// The test/tools image (a shell and network tools, for pods that check the cluster), in
    /// [`Self::node`] and [`Self::images`]. Absent from image sets without one (kubeadm's
    /// configuration never names it).
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

/// Of [`KUBERNETES_IMAGES`], the one every node runs (kubeadm's kube-proxy DaemonSet); the
/// others, and etcd, are a control plane's static pods.
pub const NODE_KUBERNETES_IMAGES: &[&str] = &["kube-proxy"];

/// The file name of the archive every node imports, in the archives' directory.
pub const NODE_ARCHIVE: &str = "node-images.tar";
/// The file name of the archive only a control plane imports, in the archives' directory.
pub const CONTROL_PLANE_ARCHIVE: &str = "control-plane-images.tar";

impl ImageSet {
    /// The set of an image whose archives are in the directory `archive_dir` (absolute in the
    /// rootfs): [`KUBERNETES_IMAGES`] at `version`, `etcd:<etcd_tag>` and `pause:<pause_tag>`,
    /// all under `repository`; kube-proxy and pause in [`NODE_ARCHIVE`], the rest in
    /// [`CONTROL_PLANE_ARCHIVE`]; every list sorted.
    pub fn named(
        repository: &str,
        archive_dir: &str,
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
        let (node_components, control_plane_components): (Vec<&str>, Vec<&str>) = KUBERNETES_IMAGES
            .iter()
            .partition(|name| NODE_KUBERNETES_IMAGES.contains(name));
        let versioned = |names: Vec<&str>| -> Vec<String> {
            names
                .into_iter()
                .map(|name| reference(name, version).to_string())
                .collect()
        };
        let mut node_images = versioned(node_components);
        node_images.push(pause.to_string());
        node_images.sort();
        let mut control_plane_images = versioned(control_plane_components);
        control_plane_images.push(etcd.to_string());
        control_plane_images.sort();
        let dir = archive_dir.trim_end_matches('/');
        let mut images: Vec<String> = node_images
            .iter()
            .chain(&control_plane_images)
            .cloned()
            .collect();
        images.sort();
        ImageSet {
            node: ImageArchive {
                path: format!("{dir}/{NODE_ARCHIVE}"),
                images: node_images,
            },
            control_plane: ImageArchive {
                path: format!("{dir}/{CONTROL_PLANE_ARCHIVE}"),
                images: control_plane_images,
            },
            image_repository: repository.to_owned(),
            etcd,
            pause,
            images,
            tools: None,
        }
    }

    /// The set with `tools` as its tools image, in the node archive and [`Self::images`] (kept
    /// sorted; a previous tools image is replaced).
    pub fn with_tools(mut self, tools: ImageRef) -> ImageSet {
        let name = tools.to_string();
        if let Some(previous) = self.tools.take() {
            let previous = previous.to_string();
            self.images.retain(|image| *image != previous);
            self.node.images.retain(|image| *image != previous);
        }
        for list in [&mut self.images, &mut self.node.images] {
            list.push(name.clone());
            list.sort();
        }
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

    /// The archives a node imports: the node archive, and for a control plane the
    /// control-plane archive after it.
    pub fn archives(&self, control_plane: bool) -> Vec<&ImageArchive> {
        let mut archives = vec![&self.node];
        if control_plane {
            archives.push(&self.control_plane);
        }
        archives
    }

    /// Why the set contradicts itself, if it does: the two archives must share no image, and
    /// together hold exactly [`Self::images`]; pause, kube-proxy and the tools image must be in
    /// the node archive (every node runs them), etcd in the control plane's.
    fn inconsistency(&self) -> Option<String> {
        let mut both: Vec<&String> = self
            .node
            .images
            .iter()
            .chain(&self.control_plane.images)
            .collect();
        both.sort();
        if let Some(twice) = both.windows(2).find(|pair| pair[0] == pair[1]) {
            return Some(format!("{} is in both archives", twice[0]));
        }
        let mut listed: Vec<&String> = self.images.iter().collect();
        listed.sort();
        if both != listed {
            return Some(format!(
                "its archives hold {} but its images are {}",
                both.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                listed
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let node_runs = [
            Some(self.pause.to_string()),
            self.tools.as_ref().map(ToString::to_string),
        ];
        for name in node_runs.into_iter().flatten() {
            if !self.node.images.contains(&name) {
                return Some(format!(
                    "{name} is not in the node archive {}, but every node runs it",
                    self.node.path
                ));
            }
        }
        let etcd = self.etcd.to_string();
        if !self.control_plane.images.contains(&etcd) {
            return Some(format!(
                "{etcd} is not in the control-plane archive {}",
                self.control_plane.path
            ));
        }
        None
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
    /// A description from before the node and control-plane archives were split: one archive
    /// for every node. An image is built as a whole, so this is an image whose rootfs is older
    /// than its PID 1.
    #[error(
        "the description names one images archive for every node ({archive}), as image \
         builders before the split into a node archive and a control-plane archive wrote; \
         this PID 1 needs both: rebuild the image"
    )]
    OneArchive { archive: String },
    /// The two archives and the list of images disagree.
    #[error("the description's images contradict themselves: {reason}")]
    Inconsistent { reason: String },
}

impl ImageKubernetes {
    /// Parses and checks the file's text.
    pub fn from_json(text: &str) -> Result<ImageKubernetes, ImageKubernetesError> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        if let Some(archive) = value.get("images").and_then(|images| images.get("archive")) {
            return Err(ImageKubernetesError::OneArchive {
                archive: archive.as_str().unwrap_or("?").to_owned(),
            });
        }
        let parsed: ImageKubernetes = serde_json::from_value(value)?;
        parsed.kubernetes_version()?;
        if parsed.origin.is_real() && parsed.images.is_none() {
            return Err(ImageKubernetesError::NoImages {
                origin: parsed.origin,
            });
        }
        if let Some(reason) = parsed.images.as_ref().and_then(ImageSet::inconsistency) {
            return Err(ImageKubernetesError::Inconsistent { reason });
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
                "/usr/share/hawser/kubernetes",
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

    #[test]
    fn every_node_runs_pause_and_kube_proxy_and_a_control_plane_the_rest() {
        let set = real().images.unwrap().with_tools(busybox());
        let repo = "registry.hawser.invalid/kubernetes";
        assert_eq!(
            set.node.path,
            "/usr/share/hawser/kubernetes/node-images.tar"
        );
        assert_eq!(
            set.node.images,
            [
                "registry.hawser.invalid/hawser/busybox:1.35.0".to_owned(),
                format!("{repo}/kube-proxy:v1.20.2"),
                format!("{repo}/pause:3.2"),
            ]
        );
        assert_eq!(
            set.control_plane.path,
            "/usr/share/hawser/kubernetes/control-plane-images.tar"
        );
        assert_eq!(
            set.control_plane.images,
            [
                "etcd:3.4.23-0",
                "kube-apiserver:v1.20.2",
                "kube-controller-manager:v1.20.2",
                "kube-scheduler:v1.20.2",
            ]
            .map(|name| format!("{repo}/{name}"))
        );
        assert_eq!(set.archives(false), [&set.node]);
        assert_eq!(set.archives(true), [&set.node, &set.control_plane]);
        assert_eq!(set.inconsistency(), None);
    }

    #[test]
    fn a_description_with_one_archive_is_refused_as_older_than_pid_1() {
        // What an image builder before the split wrote (kubernetes.json of 2026-11-29).
        let text = real().to_json().replacen(
            "\"node\": {",
            "\"archive\": \"/usr/share/hawser/kubernetes/images.tar\",\n    \"node\": {",
            1,
        );
        let err = ImageKubernetes::from_json(&text).unwrap_err();
        assert!(
            matches!(err, ImageKubernetesError::OneArchive { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "the description names one images archive for every node \
             (/usr/share/hawser/kubernetes/images.tar), as image builders before the split into \
             a node archive and a control-plane archive wrote; this PID 1 needs both: rebuild \
             the image"
        );
    }

    #[test]
    fn archives_that_contradict_the_image_list_are_refused() {
        let good = real().images.unwrap().with_tools(busybox());
        let refused = |set: ImageSet| {
            let image = ImageKubernetes {
                images: Some(set),
                ..real()
            };
            ImageKubernetes::from_json(&image.to_json())
                .unwrap_err()
                .to_string()
        };
        let mut moved = good.clone();
        let pause = moved.node.images.remove(2);
        moved.control_plane.images.push(pause);
        moved.control_plane.images.sort();
        assert!(
            refused(moved).contains("pause:3.2 is not in the node archive"),
            "pause moved"
        );
        let mut twice = good.clone();
        twice
            .control_plane
            .images
            .push(twice.node.images[0].clone());
        let err = refused(twice);
        assert!(err.contains("busybox:1.35.0 is in both archives"), "{err}");
        let mut unlisted = good.clone();
        unlisted.images.pop();
        let err = refused(unlisted);
        assert!(err.contains("its archives hold"), "{err}");
        let mut no_etcd = good;
        no_etcd
            .control_plane
            .images
            .retain(|name| !name.contains("/etcd:"));
        no_etcd.images.retain(|name| !name.contains("/etcd:"));
        let err = refused(no_etcd);
        assert!(err.contains("is not in the control-plane archive"), "{err}");
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
        assert!(set.node.images.contains(&busybox().to_string()));
        assert!(!set.control_plane.images.contains(&busybox().to_string()));
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
        assert_eq!(replaced.node.images.len(), 3);
        assert!(replaced.node.images.contains(&newer.to_string()));
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
