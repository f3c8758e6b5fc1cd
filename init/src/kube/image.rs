//! The image's Kubernetes after the pivot: `/usr/share/hawser/kubernetes.json` read and checked
//! against the measured command line, and its control-plane images imported into containerd.
//!
//! ```text
//!  hawser.kubernetes=v1.20.2 (cmdline, measured) ─┐ equal, or the image is inconsistent: FATAL
//!  /usr/share/hawser/kubernetes.json (rootfs) ────┘
//!      images? ─► containerd up ─► `ctr images ls -q` lists every one? ─► skip
//!                                   otherwise `ctr images import <archive>`   [images-import]
//!               ─► kubelet, kubeadm (with the image's imageRepository, etcd, pause)
//! ```
//!
//! The command line carries the version because the init server and the join client decide
//! before the rootfs is mounted; the file, in the verified rootfs, says the rest (origin,
//! images, what a stock cluster has and this one lacks). Both are measured, so a difference is
//! a broken image, not an attack: the node stops naming both.
//!
//! containerd keeps its image store on the state disk: a node's reboot finds its images there
//! and imports nothing. A failed import is fatal with ctr's own words: the control plane cannot
//! start without its images.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hawser_kube_types::{IMAGE_KUBERNETES_PATH, ImageKubernetes, ImageSet, KubernetesVersion};
use tracing::{info, warn};

use super::CONTAINERD_SOCKET;
use crate::platform::reaper::ChildRegistry;
use crate::supervisor::{self, OneShotError, OneShotJob};

/// containerd's client in the rootfs.
pub const CTR: &str = "/usr/bin/ctr";
/// The containerd namespace the kubelet's CRI uses.
pub const K8S_NAMESPACE: &str = "k8s.io";
/// How long `ctr images ls` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `ctr images import` may take (5.5 s for 83 MB was measured; TCG is slower).
const IMPORT_TIMEOUT: Duration = Duration::from_secs(600);

/// Why the image's Kubernetes cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageKubernetesError {
    /// The file exists but cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not an image's Kubernetes description.
    #[error("{} is not a Kubernetes description hawser can use", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: hawser_kube_types::ImageKubernetesError,
    },
    /// The command line and the rootfs disagree: a broken image.
    #[error(
        "the image is inconsistent: its command line says hawser.kubernetes={cmdline} but its \
         rootfs's {} says {file}; rebuild the image",
        path.display()
    )]
    Mismatch {
        path: PathBuf,
        cmdline: String,
        file: String,
    },
}

/// Why the image's control-plane images are not in containerd.
#[derive(Debug, thiserror::Error)]
pub enum ImagesImportError {
    /// `ctr images ls` failed (containerd not answering).
    #[error("cannot list containerd's images")]
    List(#[source] OneShotError),
    /// `ctr images import` failed; its own last lines are in the cause.
    #[error("cannot import the control-plane images from {archive}")]
    Import {
        archive: String,
        #[source]
        source: OneShotError,
    },
    /// The import succeeded but containerd still lacks some images (an archive that does not
    /// hold what the description says).
    #[error(
        "after importing {archive}, containerd still lacks {}: the image's archive does not \
         hold what its kubernetes.json says; rebuild the image",
        missing.join(", ")
    )]
    StillMissing {
        archive: String,
        missing: Vec<String>,
    },
}

/// Reads `<root>/usr/share/hawser/kubernetes.json` and checks it against the version on the
/// command line. `None` when neither names one (an image without Kubernetes); either without
/// the other is an inconsistent image.
pub fn read(
    root: &Path,
    cmdline: Option<&KubernetesVersion>,
) -> Result<Option<ImageKubernetes>, ImageKubernetesError> {
    let path = root.join(IMAGE_KUBERNETES_PATH);
    let shown = Path::new("/").join(IMAGE_KUBERNETES_PATH);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ImageKubernetesError::Read {
                path: shown,
                source,
            });
        }
    };
    let image = text
        .map(|text| {
            ImageKubernetes::from_json(&text).map_err(|source| ImageKubernetesError::Invalid {
                path: shown.clone(),
                source,
            })
        })
        .transpose()?;
    let file_version = image.as_ref().map(|image| image.version.as_str());
    let cmdline_version = cmdline.map(KubernetesVersion::as_str);
    if file_version != cmdline_version {
        return Err(ImageKubernetesError::Mismatch {
            path: shown,
            cmdline: cmdline_version.unwrap_or("(absent)").to_owned(),
            file: file_version.map_or_else(|| "nothing (no such file)".to_owned(), str::to_owned),
        });
    }
    Ok(image)
}

/// Logs what the image carries, once, and what a stock kubeadm cluster has that it lacks.
pub fn report(image: &ImageKubernetes) {
    let images = image.images.as_ref().map_or(0, |set| set.images.len());
    info!(
        "this image carries Kubernetes {} ({}), {images} control-plane image(s)",
        image.version, image.origin
    );
    for line in &image.absent {
        warn!("this node's Kubernetes differs from a stock kubeadm cluster: {line}");
    }
}

/// `ctr --address <containerd> -n k8s.io images <args>`.
fn ctr(args: &[&str], timeout: Duration) -> OneShotJob {
    let mut argv = vec![
        CTR,
        "--address",
        CONTAINERD_SOCKET,
        "-n",
        K8S_NAMESPACE,
        "images",
    ];
    argv.extend_from_slice(args);
    OneShotJob {
        timeout: Some(timeout),
        // A job run to its end without a marker (`supervisor::run_job`, `run_query`).
        ..OneShotJob::new("ctr", &argv, PathBuf::new())
    }
}

/// The command that lists containerd's image names, one a line.
pub fn list_command() -> OneShotJob {
    ctr(&["ls", "-q"], LIST_TIMEOUT)
}

/// The command that imports the image's archive.
pub fn import_command(images: &ImageSet) -> OneShotJob {
    ctr(&["import", &images.archive], IMPORT_TIMEOUT)
}

/// The image names of `images` that `listed` (`ctr images ls -q`'s output) lacks.
pub fn missing<'a>(images: &'a ImageSet, listed: &str) -> Vec<&'a str> {
    let present: std::collections::BTreeSet<&str> = listed.lines().map(str::trim).collect();
    images
        .images
        .iter()
        .map(String::as_str)
        .filter(|name| !present.contains(name))
        .collect()
}

/// What [`import`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported {
    /// containerd had every image already (a reboot: its store is on the state disk).
    AlreadyPresent,
    /// The archive was imported.
    Imported { took: Duration },
}

/// Puts the image's control-plane images into containerd (running: its socket is there),
/// unless it has them all.
pub async fn import(
    registry: &ChildRegistry,
    images: &ImageSet,
) -> Result<Imported, ImagesImportError> {
    let listed = supervisor::run_query(registry, &list_command())
        .await
        .map_err(ImagesImportError::List)?;
    let missing_before = missing(images, &listed);
    if missing_before.is_empty() {
        info!(
            "containerd has the {} control-plane images already: nothing to import",
            images.images.len()
        );
        return Ok(Imported::AlreadyPresent);
    }
    info!(
        "importing {} into containerd (it lacks {})",
        images.archive,
        missing_before.join(", ")
    );
    let took = supervisor::run_job(registry, &import_command(images), "to import the images")
        .await
        .map_err(|source| ImagesImportError::Import {
            archive: images.archive.clone(),
            source,
        })?;
    let listed = supervisor::run_query(registry, &list_command())
        .await
        .map_err(ImagesImportError::List)?;
    let missing_after = missing(images, &listed);
    if !missing_after.is_empty() {
        return Err(ImagesImportError::StillMissing {
            archive: images.archive.clone(),
            missing: missing_after.into_iter().map(str::to_owned).collect(),
        });
    }
    info!(
        "imported {} control-plane images in {:.1} s",
        images.images.len(),
        took.as_secs_f64()
    );
    Ok(Imported::Imported { took })
}

#[cfg(test)]
mod tests;
