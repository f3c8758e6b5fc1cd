//! Kubernetes in the rootfs: the real binaries and control-plane images, or hawser's stand-ins,
//! and the description PID 1 reads (`/usr/share/hawser/kubernetes.json`).
//!
//! A real image (built from the pinned source, or upstream's release binaries) gets:
//! - `/usr/bin/kubeadm` and `/usr/bin/kubelet`, the host's two Kubernetes programs;
//! - the control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
//!   etcd from the tree's Debian etcd-server, pause) and a test/tools image (busybox) as OCI
//!   images in one archive ([`crate::kubernetes::images`]), imported into containerd by PID 1
//!   at boot;
//! - `/etc/containerd/config.toml`: Debian's settings with the archive's pause image as the CRI
//!   sandbox image, so nothing is ever pulled;
//! - `kubernetes.json` naming the version, the images and what a stock cluster has that this one
//!   lacks (CoreDNS).
//!
//! A stand-in image gets the stand-ins (`standins.rs`), the `STAND-IN` marker and a
//! `kubernetes.json` that says so; it exists for the QEMU tests that need a node's boot fast.

use std::path::{Path, PathBuf};

use hawser_kube_types::{IMAGE_KUBERNETES_PATH, ImageKubernetes, ImageSet, KubernetesOrigin};

use super::standins::set_modes_and_epoch;
use super::{RootfsError, install_standins};
use crate::kubernetes::images::{IMAGE_GAPS, IMAGES_DIR, ImageInputs, build_images};
use crate::tool::io_error;

/// The version whose kubeadm configuration API (`v1beta4`) the stand-ins check: what a
/// stand-in image records as its Kubernetes version.
pub const STANDIN_KUBERNETES_VERSION: &str = "v1.33.4";

/// containerd's configuration file in the rootfs.
pub const CONTAINERD_CONFIG_PATH: &str = "etc/containerd/config.toml";

/// What a real image lacks of a stock kubeadm cluster, as `kubernetes.json` says it.
pub const ABSENT_IN_REAL_IMAGES: &[&str] = &[
    "CoreDNS: Debian ships no CoreDNS, so the image has no image of it; kubeadm's addon/coredns \
     phase is skipped and the cluster serves no DNS (Service names do not resolve in pods)",
];

/// The Kubernetes a rootfs gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootfsKubernetes {
    /// Real Kubernetes, as `kubernetes::fetch_and_build` left it.
    Real {
        /// Source-built or upstream's release binaries.
        origin: KubernetesOrigin,
        /// `v1.20.2`.
        version: String,
        /// Holds kubeadm, kubelet, kube-apiserver, kube-controller-manager, kube-scheduler and
        /// kube-proxy.
        bin_dir: PathBuf,
        /// The tree's `build/pause/linux/pause.c`, built static into the pause image.
        pause_source: PathBuf,
        /// The unpacked `busybox-static` of `kubernetes.lock`'s `[[tools]]`: the tools image.
        busybox_root: PathBuf,
        /// Its Debian version.
        busybox_version: String,
    },
    /// hawser's stand-ins for kubeadm and kubelet (from the rootfs options' binary directory):
    /// NOT Kubernetes.
    StandIn,
}

impl RootfsKubernetes {
    /// The version the image will carry.
    pub fn version(&self) -> &str {
        match self {
            RootfsKubernetes::Real { version, .. } => version,
            RootfsKubernetes::StandIn => STANDIN_KUBERNETES_VERSION,
        }
    }
}

/// `hawser.kubernetes=<version>`: the image's Kubernetes version on the UKI's measured command
/// line, where PID 1 finds it before the rootfs is mounted (to refuse another version before the
/// state disk is formatted).
pub fn kubernetes_cmdline_arg(version: &str) -> String {
    format!("hawser.kubernetes={version}")
}

/// Where [`install_kubernetes`] puts things and takes them from.
#[derive(Debug, Clone, Copy)]
pub struct InstallTarget<'a> {
    /// mkosi's tree (its etcd goes into the etcd image).
    pub tree: &'a Path,
    /// The Debian version of `etcd-server` in the tree (from `rootfs.lock`).
    pub etcd_version: &'a str,
    /// Where the stand-ins are.
    pub standin_bin_dir: &'a Path,
    /// hawser's cache (the pause build is kept there).
    pub cache: &'a Path,
    pub epoch: u64,
}

/// Installs `kubernetes` into the tree and writes its description.
pub fn install_kubernetes(
    target: InstallTarget<'_>,
    kubernetes: &RootfsKubernetes,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageKubernetes, RootfsError> {
    let InstallTarget {
        tree,
        etcd_version,
        standin_bin_dir,
        cache,
        epoch,
    } = target;
    let description = match kubernetes {
        RootfsKubernetes::StandIn => {
            install_standins(tree, standin_bin_dir, epoch)?;
            progress(&format!(
                "rootfs: installed the STAND-INS at /usr/bin/kubeadm and /usr/bin/kubelet, marker /{}",
                super::STANDIN_MARKER
            ));
            ImageKubernetes {
                origin: KubernetesOrigin::StandIn,
                version: STANDIN_KUBERNETES_VERSION.to_owned(),
                images: None,
                absent: vec![
                    "Kubernetes: this image carries hawser's stand-ins for kubeadm and kubelet \
                     (for fast tests), no Kubernetes"
                        .to_owned(),
                ],
            }
        }
        RootfsKubernetes::Real {
            origin,
            version,
            bin_dir,
            pause_source,
            busybox_root,
            busybox_version,
        } => {
            let usr_bin = tree.join("usr/bin");
            let mut installed = vec![(usr_bin.clone(), None)];
            for name in ["kubeadm", "kubelet"] {
                let from = bin_dir.join(name);
                let to = usr_bin.join(name);
                std::fs::copy(&from, &to).map_err(io_error("copy a Kubernetes binary to", &to))?;
                installed.push((to, Some(0o755)));
            }
            set_modes_and_epoch(installed, epoch)?;
            progress(&format!(
                "rootfs: Kubernetes {version} ({origin}): /usr/bin/kubeadm, /usr/bin/kubelet"
            ));
            let archives = tree.join(IMAGES_DIR.trim_start_matches('/'));
            std::fs::create_dir_all(&archives).map_err(io_error("create directory", &archives))?;
            let images = build_images(
                &ImageInputs {
                    bin_dir,
                    etcd_roots: &[tree.to_owned()],
                    etcd_version,
                    pause_source,
                    cache,
                    busybox_root,
                    busybox_version,
                    version,
                    epoch,
                },
                &archives,
                progress,
            )?;
            write_containerd_config(tree, &images, epoch)?;
            ImageKubernetes {
                origin: *origin,
                version: version.clone(),
                images: Some(images),
                absent: ABSENT_IN_REAL_IMAGES
                    .iter()
                    .chain(IMAGE_GAPS)
                    .map(|s| (*s).to_owned())
                    .collect(),
            }
        }
    };
    let path = tree.join(IMAGE_KUBERNETES_PATH);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    }
    std::fs::write(&path, description.to_json()).map_err(io_error("write", &path))?;
    set_modes_and_epoch(vec![(path, Some(0o644))], epoch)?;
    Ok(description)
}

/// containerd's configuration: Debian's package default (CNI directories, the `opt` plugin's
/// path) plus the sandbox image from the archive.
pub fn containerd_config(images: &ImageSet) -> String {
    format!(
        "# containerd in a hawser node image (written by hawser-image): Debian's defaults, and the\n\
         # pause image of the image's own archive as the CRI sandbox image (nothing is pulled).\n\
         version = 2\n\
         \n\
         [plugins]\n\
         \x20 [plugins.\"io.containerd.grpc.v1.cri\"]\n\
         \x20   sandbox_image = \"{}\"\n\
         \x20   [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
         \x20     bin_dir = \"/usr/lib/cni\"\n\
         \x20     conf_dir = \"/etc/cni/net.d\"\n\
         \x20 [plugins.\"io.containerd.internal.v1.opt\"]\n\
         \x20   path = \"/var/lib/containerd/opt\"\n",
        images.pause
    )
}

fn write_containerd_config(tree: &Path, images: &ImageSet, epoch: u64) -> Result<(), RootfsError> {
    let path = tree.join(CONTAINERD_CONFIG_PATH);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    }
    std::fs::write(&path, containerd_config(images)).map_err(io_error("write", &path))?;
    set_modes_and_epoch(vec![(path, Some(0o644))], epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_sandbox_image_is_the_archives_pause() {
        let images = ImageSet::named(
            "registry.hawser.invalid/kubernetes",
            IMAGES_DIR,
            "v1.20.2",
            "3.4.23-0",
            "3.2",
        );
        let config = containerd_config(&images);
        assert!(
            config
                .contains("    sandbox_image = \"registry.hawser.invalid/kubernetes/pause:3.2\"\n"),
            "{config}"
        );
        assert!(config.contains("bin_dir = \"/usr/lib/cni\""), "{config}");
    }

    #[test]
    fn stand_ins_record_the_version_they_check() {
        assert_eq!(RootfsKubernetes::StandIn.version(), "v1.33.4");
        assert_eq!(
            kubernetes_cmdline_arg("v1.20.2"),
            "hawser.kubernetes=v1.20.2"
        );
    }
}
