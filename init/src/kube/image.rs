//! The image's Kubernetes after the pivot: `/usr/share/hawser/kubernetes.json` read and checked
//! against the measured command line, and the images this node runs imported into containerd.
//!
//! ```text
//!  hawser.kubernetes=v1.20.2 (cmdline, measured) ─┐ equal, or the image is inconsistent: FATAL
//!  /usr/share/hawser/kubernetes.json (rootfs) ────┘
//!      images? ─► containerd up ─► for each archive this node runs (a worker: node-images.tar;
//!                                  a control plane: it and control-plane-images.tar):
//!                                    `ctr images ls -q` lists every image of it? ─► skip
//!                                    otherwise `ctr images import <archive>`    [images-import]
//!               ─► kubelet, kubeadm (with the image's imageRepository, etcd, pause)
//! ```
//!
//! A worker never runs etcd, the API server, the controller manager or the scheduler, so it
//! imports only the node archive (pause, kube-proxy, the tools image: 39 MB of 317 MB; under
//! TCG a worker's import took 16 s instead of 107–159 s for all seven). Whether this node is a control plane is what
//! kubeadm runs on it ([`ImportFor::of`]): `kubeadm init`, a control-plane join (the ticket or
//! the kept intent carries the cluster's certificates), or, when kubeadm has nothing to run on
//! this boot, the cluster secrets a control plane keeps on its state disk (what also decides
//! the measured role before the pivot, `boot::pivot_role`). A worker that imported too much
//! would only be slow; a control plane without its images cannot start, so any sign of one
//! imports both.
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

use hawser_kube_types::{
    IMAGE_KUBERNETES_PATH, ImageArchive, ImageKubernetes, ImageSet, KubernetesVersion,
};
use tracing::{info, warn};

use super::attempts::KubeadmWork;
use super::kubeadm::Verb;
use super::{CONTAINERD_SOCKET, Role};
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

/// Why the images this node runs are not in containerd.
#[derive(Debug, thiserror::Error)]
pub enum ImagesImportError {
    /// `ctr images ls` failed (containerd not answering).
    #[error("cannot list containerd's images")]
    List(#[source] OneShotError),
    /// `ctr images import` failed; its own last lines are in the cause.
    #[error("cannot import the images from {archive}")]
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
    match &image.images {
        Some(set) => info!(
            "this image carries Kubernetes {} ({}), {} images: {} for every node, {} for control \
             planes",
            image.version,
            image.origin,
            set.images.len(),
            set.node.images.len(),
            set.control_plane.images.len()
        ),
        None => info!(
            "this image carries Kubernetes {} ({}), no images",
            image.version, image.origin
        ),
    }
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

/// The command that imports one of the image's archives.
pub fn import_command(archive: &ImageArchive) -> OneShotJob {
    ctr(&["import", &archive.path], IMPORT_TIMEOUT)
}

/// The names of `images` that `listed` (`ctr images ls -q`'s output) lacks.
pub fn missing<'a>(images: &'a [String], listed: &str) -> Vec<&'a str> {
    let present: std::collections::BTreeSet<&str> = listed.lines().map(str::trim).collect();
    images
        .iter()
        .map(String::as_str)
        .filter(|name| !present.contains(name))
        .collect()
}

/// Which of the image's archives this node imports, and why: what it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportFor {
    /// A control plane imports both archives; a worker the node archive only.
    pub control_plane: bool,
    /// What says so, for the log.
    pub because: &'static str,
}

impl ImportFor {
    /// A worker, for `because`.
    pub const fn worker(because: &'static str) -> Self {
        ImportFor {
            control_plane: false,
            because,
        }
    }

    /// A control plane, for `because`.
    pub const fn control_plane(because: &'static str) -> Self {
        ImportFor {
            control_plane: true,
            because,
        }
    }

    /// What this node runs: what kubeadm does on this boot (`role`, or for a rejoining node
    /// the intent an earlier boot kept, in `work`), and whether the state disk keeps the
    /// cluster's secrets as a control plane's does ([`super::join_service::CLUSTER_DIR`]).
    pub(super) fn of(role: &Role, work: &KubeadmWork) -> Self {
        Self::decide(
            Self::of_kubeadm(role, work),
            super::join_service::keeps_secrets(Path::new(super::join_service::CLUSTER_DIR)),
        )
    }

    /// What kubeadm's grant or kept intent says; `None` when kubeadm has nothing to run.
    fn of_kubeadm(role: &Role, work: &KubeadmWork) -> Option<Self> {
        match role {
            Role::Init { .. } => Some(Self::control_plane("kubeadm init on this node")),
            Role::Join(ticket) if ticket.control_plane_files.is_some() => {
                Some(Self::control_plane("a control-plane join ticket"))
            }
            Role::Join(_) => Some(Self::worker("a worker's join ticket")),
            Role::Rejoin => match work {
                KubeadmWork::Run { intent, .. } if intent.verb == Verb::Init => Some(
                    Self::control_plane("kubeadm init again, from the intent an earlier boot kept"),
                ),
                KubeadmWork::Run { intent, .. } if !intent.control_plane_files.is_empty() => {
                    Some(Self::control_plane(
                        "a control-plane join again, from the intent an earlier boot kept",
                    ))
                }
                KubeadmWork::Run { .. } => Some(Self::worker(
                    "a worker's join again, from the intent an earlier boot kept",
                )),
                KubeadmWork::Nothing | KubeadmWork::Unrunnable(_) => None,
            },
        }
    }

    /// The rule: a control plane if kubeadm makes one, or if the state disk keeps the
    /// cluster's secrets; otherwise a worker.
    fn decide(kubeadm: Option<Self>, keeps_secrets: bool) -> Self {
        match kubeadm {
            Some(kubeadm) if kubeadm.control_plane => kubeadm,
            _ if keeps_secrets => Self::control_plane(
                "the state disk keeps the cluster's secrets, as a control plane's does",
            ),
            Some(worker) => worker,
            None => Self::worker(
                "kubeadm has nothing to run on this boot, and the state disk keeps no cluster \
                 secrets",
            ),
        }
    }

    /// `a worker: node images only`, or `a control plane: node and control-plane images`.
    pub fn scope(&self) -> &'static str {
        if self.control_plane {
            "a control plane: node and control-plane images"
        } else {
            "a worker: node images only"
        }
    }
}

/// What [`import`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported {
    /// containerd had every image already (a reboot: its store is on the state disk).
    AlreadyPresent,
    /// `archives` archives were imported.
    Imported { archives: usize, took: Duration },
}

/// Puts the images `node` runs into containerd (running: its socket is there): each of its
/// archives ([`ImageSet::archives`]) unless containerd has every image of it already.
pub async fn import(
    registry: &ChildRegistry,
    images: &ImageSet,
    node: ImportFor,
) -> Result<Imported, ImagesImportError> {
    let archives = images.archives(node.control_plane);
    let wanted: Vec<String> = archives
        .iter()
        .flat_map(|archive| archive.images.iter().cloned())
        .collect();
    if node.control_plane {
        info!(
            "images: this node is a control plane ({}): it imports both archives, {} images",
            node.because,
            wanted.len()
        );
    } else {
        info!(
            "images: this node is a worker ({}): it imports the node archive only, {} images \
             ({}), not the {} control-plane images of {}",
            node.because,
            wanted.len(),
            wanted.join(", "),
            images.control_plane.images.len(),
            images.control_plane.path
        );
    }
    let listed = supervisor::run_query(registry, &list_command())
        .await
        .map_err(ImagesImportError::List)?;
    let (mut imported, mut imported_images) = (0, 0);
    let mut took = Duration::ZERO;
    for archive in &archives {
        let missing_before = missing(&archive.images, &listed);
        if missing_before.is_empty() {
            info!(
                "containerd has the {} images of {} already",
                archive.images.len(),
                archive.path
            );
            continue;
        }
        let size = std::fs::metadata(&archive.path).map_or_else(
            |_| "size unknown".to_owned(),
            |m| format!("{:.1} MB", m.len() as f64 / 1e6),
        );
        info!(
            "importing {} ({} images, {size}) into containerd (it lacks {})",
            archive.path,
            archive.images.len(),
            missing_before.join(", ")
        );
        let one = supervisor::run_job(registry, &import_command(archive), "to import the images")
            .await
            .map_err(|source| ImagesImportError::Import {
                archive: archive.path.clone(),
                source,
            })?;
        info!("imported {} in {:.1} s", archive.path, one.as_secs_f64());
        imported += 1;
        imported_images += archive.images.len();
        took += one;
    }
    if imported == 0 {
        info!(
            "containerd has the {} images already ({}): nothing to import",
            wanted.len(),
            node.scope()
        );
        return Ok(Imported::AlreadyPresent);
    }
    let listed = supervisor::run_query(registry, &list_command())
        .await
        .map_err(ImagesImportError::List)?;
    for archive in &archives {
        let missing_after = missing(&archive.images, &listed);
        if !missing_after.is_empty() {
            return Err(ImagesImportError::StillMissing {
                archive: archive.path.clone(),
                missing: missing_after.into_iter().map(str::to_owned).collect(),
            });
        }
    }
    info!(
        "imported {imported_images} images ({}) in {:.1} s",
        node.scope(),
        took.as_secs_f64()
    );
    Ok(Imported::Imported {
        archives: imported,
        took,
    })
}

#[cfg(test)]
mod tests;
