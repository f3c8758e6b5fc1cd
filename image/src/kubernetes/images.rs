//! The control-plane images a node needs offline, made from the image's own inputs: what
//! kubeadm 1.20 runs as static pods (kube-apiserver, kube-controller-manager, kube-scheduler,
//! etcd), its kube-proxy DaemonSet, and the pod sandbox (pause).
//!
//! ```text
//!   <lock dir>/bin/kube-*   ─┐
//!   etcd-server + libc6     ─┼─► one OCI archive (oci.rs) ─► /usr/share/hawser/kubernetes/images.tar
//!   pause.c + host gcc      ─┘    every image: the shared base layer + one layer of its own
//! ```
//!
//! All are named under [`IMAGE_REPOSITORY`], `registry.hawser.invalid/kubernetes`: these are not
//! upstream's image bytes, so they do not carry upstream's names, and `.invalid` never resolves,
//! so an image missing from the node fails at once instead of being pulled. kubeadm finds them
//! through its configuration: `imageRepository` (the four `kube-*` at tag = the Kubernetes
//! version, as `KubernetesVersionToImageTag` spells it), `etcd.local.imageRepository/imageTag`,
//! and containerd's `sandbox_image` for pause.
//!
//! What kubeadm runs in them (v1.20.2's tree): the static pods' `command` starts with the bare
//! name (`kube-apiserver`, `etcd`, …), found through the image's `PATH`; kube-proxy's DaemonSet
//! runs `/usr/local/bin/kube-proxy`. So the Kubernetes binaries are at
//! `/usr/local/bin/<name>` (also the entrypoint), etcd at Debian's `/usr/bin/etcd` with its
//! shared libraries (Debian's etcd is dynamically linked), pause at `/pause` as upstream.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hawser_kube_types::ImageSet;

use super::KubernetesError;
use super::oci::{self, Content, Entry, ImageSpec, Layer};
use super::pause;
use crate::closure;
use crate::tool::io_error;

/// The repository every control-plane image is named under (kubeadm's `imageRepository`).
pub const IMAGE_REPOSITORY: &str = "registry.hawser.invalid/kubernetes";
/// Where the archive is in the rootfs: what `ctr -n k8s.io images import` reads at boot.
pub const IMAGES_ARCHIVE_PATH: &str = "/usr/share/hawser/kubernetes/images.tar";
/// The images' `PATH` (Docker's default): finds `/usr/local/bin/kube-*` and `/usr/bin/etcd`.
pub const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The Kubernetes images: tag = the Kubernetes version, binary at `/usr/local/bin/<name>`.
pub use hawser_kube_types::KUBERNETES_IMAGES;
/// The pause tag kubeadm 1.20 asks for (`PauseVersion` of
/// `cmd/kubeadm/app/constants/constants_unix.go`), though the tree's `pause.c` is the one its
/// Makefile tags 3.4: kubeadm's preflight and `sandbox_image` name 3.2.
pub const PAUSE_TAG: &str = "3.2";
/// etcd in its image, where Debian installs it.
pub const ETCD_BINARY: &str = "usr/bin/etcd";
/// What these images lack that upstream's have, one line each (for `kubernetes.json`'s
/// `absent`).
pub const IMAGE_GAPS: &[&str] = &[
    "kube-proxy's image has no iptables, ip6tables, ipset or conntrack: kube-proxy starts, \
     but cannot program Service rules in iptables or IPVS mode",
    "the images have no CA certificates, shell or libc (but etcd's): only what the binary needs",
];

/// Where [`build_images`] takes each image's content from.
#[derive(Debug, Clone)]
pub struct ImageInputs<'a> {
    /// The Kubernetes binaries, `<lock dir>/bin` (`kube-apiserver`, …).
    pub bin_dir: &'a Path,
    /// Trees holding [`ETCD_BINARY`] and its libraries, searched in order: the node's mkosi
    /// tree, or the unpacked `etcd-server` and `libc6` packages of `rootfs.lock`.
    pub etcd_roots: &'a [PathBuf],
    /// The Debian version of `etcd-server` (`3.4.23-4+b4`), from `rootfs.lock`.
    pub etcd_version: &'a str,
    /// The tree's `build/pause/linux/pause.c`.
    pub pause_source: &'a Path,
    /// The build cache (`~/.cache/hawser`): pause is kept under it.
    pub cache: &'a Path,
    /// The Kubernetes version, `v1.20.2`.
    pub version: &'a str,
    /// `SOURCE_DATE_EPOCH`.
    pub epoch: u64,
}

/// etcd's image tag as kubeadm spells it: the upstream version and `-0` (`3.4.23-4+b4` →
/// `3.4.23-0`).
pub fn etcd_image_tag(debian_version: &str) -> Result<String, KubernetesError> {
    let without_epoch = debian_version
        .split_once(':')
        .map_or(debian_version, |(_, rest)| rest);
    let upstream = without_epoch
        .rsplit_once('-')
        .map_or(without_epoch, |(upstream, _)| upstream);
    let upstream = upstream.split(['+', '~']).next().unwrap_or_default();
    let parts: Vec<&str> = upstream.split('.').collect();
    if parts.len() != 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(KubernetesError::EtcdVersion(debian_version.to_owned()));
    }
    Ok(format!("{upstream}-0"))
}

/// What kubeadm's configuration and containerd need to know of the images.
pub fn image_set(version: &str, etcd_tag: &str) -> ImageSet {
    ImageSet::named(
        IMAGE_REPOSITORY,
        IMAGES_ARCHIVE_PATH,
        version,
        etcd_tag,
        PAUSE_TAG,
    )
}

/// Builds the archive `out` (pause compiled or taken from the cache first); returns what to
/// record in `kubernetes.json`. `progress` gets a line per step and one per image.
pub fn build_images(
    inputs: &ImageInputs,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageSet, KubernetesError> {
    let etcd_tag = etcd_image_tag(inputs.etcd_version)?;
    let pause = pause::build_pause(inputs.pause_source, inputs.version, inputs.cache)?;
    progress(&format!(
        "images: pause {} ({}, key {})",
        if pause.cached {
            "from the cache"
        } else {
            "compiled"
        },
        pause.path.display(),
        &pause.key[..16]
    ));
    let specs = image_specs(inputs, &etcd_tag, &pause.path)?;
    let t = Instant::now();
    let summary = oci::write_archive(&specs, inputs.epoch, out)?;
    for image in &summary.images {
        progress(&format!(
            "images:   {} {:.1} MB ({} layers)",
            image.name,
            image.bytes as f64 / 1e6,
            image.layers.len()
        ));
    }
    progress(&format!(
        "images: {} images, {} blobs, {:.1} MB in {} ({:.1}s)",
        summary.images.len(),
        summary.blobs,
        summary.bytes as f64 / 1e6,
        out.display(),
        t.elapsed().as_secs_f64()
    ));
    Ok(image_set(inputs.version, &etcd_tag))
}

/// The six images, each the base layer and its own.
pub fn image_specs(
    inputs: &ImageInputs,
    etcd_tag: &str,
    pause_binary: &Path,
) -> Result<Vec<ImageSpec>, KubernetesError> {
    let image = |name: &str, tag: &str, entrypoint: &str, layer: Layer| ImageSpec {
        repository: format!("{IMAGE_REPOSITORY}/{name}"),
        tag: tag.to_owned(),
        entrypoint: vec![entrypoint.to_owned()],
        env: vec![PATH_ENV.to_owned()],
        layers: vec![base_layer(), layer],
    };
    let mut specs = Vec::new();
    for name in KUBERNETES_IMAGES {
        let binary = inputs.bin_dir.join(name);
        if !binary.is_file() {
            return Err(KubernetesError::Layout {
                what: format!("{name} (build it with `hawser image kubernetes`)"),
                dir: inputs.bin_dir.to_owned(),
            });
        }
        let path = format!("usr/local/bin/{name}");
        let layer = Layer {
            description: format!("hawser: {name} {}", inputs.version),
            entries: vec![executable(&path, binary)],
        };
        specs.push(image(name, inputs.version, &format!("/{path}"), layer));
    }
    specs.push(image(
        "etcd",
        etcd_tag,
        &format!("/{ETCD_BINARY}"),
        etcd_layer(inputs.etcd_roots, etcd_tag)?,
    ));
    let pause_layer = Layer {
        description: format!(
            "hawser: pause.c v{}-{}, static",
            pause::PAUSE_MAKEFILE_TAG,
            inputs.version
        ),
        entries: vec![executable("pause", pause_binary.to_owned())],
    };
    specs.push(image("pause", PAUSE_TAG, "/pause", pause_layer));
    Ok(specs)
}

/// What every image shares: the merged-/usr links (etcd's loader is `/lib64/ld-linux…`), a
/// world-writable `/tmp`, and root and nobody in passwd and group.
pub fn base_layer() -> Layer {
    let file = |path: &str, text: &str| Entry::File {
        path: path.to_owned(),
        mode: 0o644,
        content: Content::Bytes(text.as_bytes().to_vec()),
    };
    let link = |path: &str, target: &str| Entry::Symlink {
        path: path.to_owned(),
        target: target.to_owned(),
    };
    Layer {
        description: "hawser: base (merged /usr, /tmp, passwd, group, nsswitch.conf)".into(),
        entries: vec![
            link("bin", "usr/bin"),
            link("lib", "usr/lib"),
            link("lib64", "usr/lib64"),
            link("sbin", "usr/sbin"),
            file("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
            file(
                "etc/nsswitch.conf",
                "passwd: files\ngroup: files\nhosts: files dns\n",
            ),
            file(
                "etc/passwd",
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            ),
            Entry::Dir {
                path: "tmp".into(),
                mode: 0o1777,
            },
            Entry::Dir {
                path: "usr".into(),
                mode: 0o755,
            },
        ],
    }
}

/// etcd and its ELF closure, resolved in `roots` by the initramfs's resolver.
fn etcd_layer(roots: &[PathBuf], tag: &str) -> Result<Layer, KubernetesError> {
    let binary = roots
        .iter()
        .map(|root| root.join(ETCD_BINARY))
        .find(|path| path.is_file())
        .ok_or_else(|| KubernetesError::Layout {
            what: format!("{ETCD_BINARY} (Debian's etcd-server)"),
            dir: roots.first().cloned().unwrap_or_default(),
        })?;
    let libraries =
        closure::resolve(&binary, roots, &[]).map_err(|source| KubernetesError::EtcdClosure {
            path: binary.clone(),
            source,
        })?;
    let mut entries = vec![executable(ETCD_BINARY, binary)];
    for file in libraries.files {
        let mode = std::fs::metadata(&file.source)
            .map_err(io_error("stat", &file.source))?
            .permissions()
            .mode();
        entries.push(Entry::File {
            path: file.dest,
            // ld.so is executable, the libraries are not: two fixed modes.
            mode: if mode & 0o111 != 0 { 0o755 } else { 0o644 },
            content: Content::Path(file.source),
        });
    }
    for link in libraries.symlinks {
        entries.push(Entry::Symlink {
            path: link.dest,
            target: link.target,
        });
    }
    Ok(Layer {
        description: format!("hawser: Debian's etcd {tag} and its shared libraries"),
        entries,
    })
}

fn executable(path: &str, source: PathBuf) -> Entry {
    Entry::File {
        path: path.to_owned(),
        mode: 0o755,
        content: Content::Path(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_tags_are_kubeadms_spelling_of_the_debian_version() {
        assert_eq!(etcd_image_tag("3.4.23-4+b4").unwrap(), "3.4.23-0");
        assert_eq!(etcd_image_tag("1:3.5.16-1").unwrap(), "3.5.16-0");
        assert_eq!(etcd_image_tag("3.4.23+dfsg-1~bpo12+1").unwrap(), "3.4.23-0");
        for bad in ["", "3.4-1", "x.y.z-1", "3.4.23.1-1"] {
            let err = etcd_image_tag(bad).unwrap_err();
            assert!(err.to_string().contains("etcd-server"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_set_names_every_image_under_the_invalid_registry() {
        // The naming itself is kube-types' `ImageSet::named` (tested there); here: which
        // repository, archive and pause tag the image builder gives it.
        let set = image_set("v1.20.2", "3.4.23-0");
        assert_eq!(set.archive, IMAGES_ARCHIVE_PATH);
        assert_eq!(set.image_repository, "registry.hawser.invalid/kubernetes");
        assert_eq!(set.pause.tag, "3.2");
        assert_eq!(set.images.len(), 6);
    }

    #[test]
    fn a_missing_binary_or_etcd_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let roots = [dir.path().to_owned()];
        let inputs = ImageInputs {
            bin_dir: dir.path(),
            etcd_roots: &roots,
            etcd_version: "3.4.23-4",
            pause_source: Path::new("/nonexistent/pause.c"),
            cache: dir.path(),
            version: "v1.20.2",
            epoch: 1,
        };
        let err = image_specs(&inputs, "3.4.23-0", Path::new("/pause")).unwrap_err();
        assert!(err.to_string().contains("kube-apiserver"), "{err}");
        for name in KUBERNETES_IMAGES {
            std::fs::write(dir.path().join(name), b"binary").unwrap();
        }
        let err = image_specs(&inputs, "3.4.23-0", Path::new("/pause")).unwrap_err();
        assert!(err.to_string().contains("usr/bin/etcd"), "{err}");
    }
}
