//! The control-plane images a node needs offline, made from the image's own inputs: what
//! kubeadm 1.20 runs as static pods (kube-apiserver, kube-controller-manager, kube-scheduler,
//! etcd), its kube-proxy DaemonSet, and the pod sandbox (pause); and one test/tools image
//! (busybox) for pods that check the cluster's network.
//!
//! ```text
//!   <lock dir>/bin/kube-proxy ─┐
//!   pause.c + host gcc        ─┼─► /usr/share/hawser/kubernetes/node-images.tar   (every node)
//!   busybox-static            ─┘
//!   <lock dir>/bin/kube-{apiserver,controller-manager,scheduler} ─┐
//!   etcd-server + libc6       ─────────────────────────────────────┴─► …/control-plane-images.tar
//!                               (a control plane only)
//!   every image: the shared base layer (in each archive) + one layer of its own (oci.rs)
//! ```
//!
//! Two archives, because a node imports at its first boot what it runs, and under TCG the
//! import of all seven images took 159 s on a worker that runs three of them: the node archive
//! is 39 MB, the control-plane archive 277 MB. Which image goes where is kube-types'
//! [`ImageSet::named`]; the specs here are split by the names it lists, and a difference is an
//! error, so the archives always hold what `kubernetes.json` says.
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
//!
//! The tools image, [`TOOLS_REPOSITORY`] (`registry.hawser.invalid/hawser/busybox`, outside
//! kubeadm's repository: kubeadm never runs it), is bookworm's static busybox at
//! `/usr/bin/busybox` (`/bin` is a link to `usr/bin`) with links for [`TOOLS_APPLETS`], no
//! entrypoint and `sh` as its command, as Docker's busybox: a pod's `command` runs an applet by
//! name.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hawser_kube_types::{ImageRef, ImageSet};

use super::KubernetesError;
use super::oci::{self, Content, Entry, ImageSpec, Layer};
use super::pause;
use crate::closure;
use crate::tool::io_error;

/// The repository every control-plane image is named under (kubeadm's `imageRepository`).
pub const IMAGE_REPOSITORY: &str = "registry.hawser.invalid/kubernetes";
/// Where the two archives are in the rootfs: what `ctr -n k8s.io images import` reads at boot
/// ([`NODE_ARCHIVE`] on every node, [`CONTROL_PLANE_ARCHIVE`] on control planes).
pub const IMAGES_DIR: &str = "/usr/share/hawser/kubernetes";
pub use hawser_kube_types::{CONTROL_PLANE_ARCHIVE, NODE_ARCHIVE};
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
/// The tools image's repository: hawser's own, not kubeadm's `imageRepository`.
pub const TOOLS_REPOSITORY: &str = "registry.hawser.invalid/hawser/busybox";
/// The `kubernetes.lock` `[[tools]]` package the tools image is made of.
pub const TOOLS_PACKAGE: &str = "busybox-static";
/// busybox in the unpacked `busybox-static` package.
pub const BUSYBOX_IN_PACKAGE: &str = "bin/busybox";
/// busybox in the tools image (`/bin/busybox` through the base layer's `bin → usr/bin`).
pub const BUSYBOX_BINARY: &str = "usr/bin/busybox";
/// The applets the tools image links to busybox in `/usr/bin`: a shell, a web server and
/// client, netcat, ping, ip, and what a test script needs around them. Any other applet runs
/// as `busybox <applet>`.
pub const TOOLS_APPLETS: &[&str] = &[
    "cat", "echo", "hostname", "httpd", "ip", "ls", "nc", "ping", "sh", "sleep", "wget",
];
/// What these images lack that upstream's have, one line each (for `kubernetes.json`'s
/// `absent`).
pub const IMAGE_GAPS: &[&str] = &[
    "kube-proxy's image has no iptables, ip6tables, ipset or conntrack: it cannot program \
     Service rules, so kubeadm init skips its addon (Services' ClusterIPs do not route)",
    "the control-plane images have no CA certificates, shell or libc (but etcd's): only what \
     the binary needs",
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
    /// The unpacked `busybox-static` package of `kubernetes.lock`'s `[[tools]]` (holds
    /// [`BUSYBOX_IN_PACKAGE`]).
    pub busybox_root: &'a Path,
    /// Its Debian version (`1:1.35.0-4+deb12u1+b1`).
    pub busybox_version: &'a str,
    /// The Kubernetes version, `v1.20.2`.
    pub version: &'a str,
    /// `SOURCE_DATE_EPOCH`.
    pub epoch: u64,
}

/// The upstream `X.Y.Z` of a Debian version (`1:1.35.0-4+deb12u1+b1` → `1.35.0`), if it has
/// that shape.
fn upstream_version(debian_version: &str) -> Option<&str> {
    let without_epoch = debian_version
        .split_once(':')
        .map_or(debian_version, |(_, rest)| rest);
    let upstream = without_epoch
        .rsplit_once('-')
        .map_or(without_epoch, |(upstream, _)| upstream);
    let upstream = upstream.split(['+', '~']).next().unwrap_or_default();
    let parts: Vec<&str> = upstream.split('.').collect();
    let numeric = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    numeric.then_some(upstream)
}

/// etcd's image tag as kubeadm spells it: the upstream version and `-0` (`3.4.23-4+b4` →
/// `3.4.23-0`).
pub fn etcd_image_tag(debian_version: &str) -> Result<String, KubernetesError> {
    upstream_version(debian_version)
        .map(|upstream| format!("{upstream}-0"))
        .ok_or_else(|| KubernetesError::EtcdVersion(debian_version.to_owned()))
}

/// The tools image's tag: busybox's upstream version (`1:1.35.0-4+deb12u1+b1` → `1.35.0`).
pub fn tools_image_tag(debian_version: &str) -> Result<String, KubernetesError> {
    upstream_version(debian_version)
        .map(str::to_owned)
        .ok_or_else(|| KubernetesError::ToolsVersion(debian_version.to_owned()))
}

/// What kubeadm's configuration, containerd and PID 1 need to know of the images.
pub fn image_set(version: &str, etcd_tag: &str, tools_tag: &str) -> ImageSet {
    ImageSet::named(IMAGE_REPOSITORY, IMAGES_DIR, version, etcd_tag, PAUSE_TAG).with_tools(
        ImageRef {
            repository: TOOLS_REPOSITORY.to_owned(),
            tag: tools_tag.to_owned(),
        },
    )
}

/// Builds the two archives in `out_dir` ([`NODE_ARCHIVE`], [`CONTROL_PLANE_ARCHIVE`]; pause
/// compiled or taken from the cache first); returns what to record in `kubernetes.json`.
/// `progress` gets a line per step, one per image and one per archive.
pub fn build_images(
    inputs: &ImageInputs,
    out_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageSet, KubernetesError> {
    let etcd_tag = etcd_image_tag(inputs.etcd_version)?;
    let tools_tag = tools_image_tag(inputs.busybox_version)?;
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
    let set = image_set(inputs.version, &etcd_tag, &tools_tag);
    let specs = image_specs(inputs, &etcd_tag, &tools_tag, &pause.path)?;
    let (node, control_plane) = split_specs(&set, specs)?;
    for (who, file, specs) in [
        ("every node", NODE_ARCHIVE, node),
        ("control planes", CONTROL_PLANE_ARCHIVE, control_plane),
    ] {
        let out = out_dir.join(file);
        let t = Instant::now();
        let summary = oci::write_archive(&specs, inputs.epoch, &out)?;
        for image in &summary.images {
            progress(&format!(
                "images:   {} {:.1} MB ({} layers)",
                image.name,
                image.bytes as f64 / 1e6,
                image.layers.len()
            ));
        }
        progress(&format!(
            "images: {} images for {who}, {} blobs, {:.1} MB in {} ({:.1}s)",
            summary.images.len(),
            summary.blobs,
            summary.bytes as f64 / 1e6,
            out.display(),
            t.elapsed().as_secs_f64()
        ));
    }
    Ok(set)
}

/// `specs` split into the node archive's and the control-plane archive's, as `set` lists
/// them; an image in neither list, or a listed image without a spec, is an error.
pub fn split_specs(
    set: &ImageSet,
    specs: Vec<ImageSpec>,
) -> Result<(Vec<ImageSpec>, Vec<ImageSpec>), KubernetesError> {
    let (node, control_plane): (Vec<ImageSpec>, Vec<ImageSpec>) = specs
        .into_iter()
        .partition(|spec| set.node.images.contains(&spec.name()));
    for (archive, specs) in [(&set.node, &node), (&set.control_plane, &control_plane)] {
        let mut built: Vec<String> = specs.iter().map(ImageSpec::name).collect();
        built.sort();
        if built != archive.images {
            return Err(KubernetesError::ArchiveSplit {
                archive: archive.path.clone(),
                built,
                listed: archive.images.clone(),
            });
        }
    }
    Ok((node, control_plane))
}

/// The seven images (six of the control plane, one of tools), each the base layer and its own.
pub fn image_specs(
    inputs: &ImageInputs,
    etcd_tag: &str,
    tools_tag: &str,
    pause_binary: &Path,
) -> Result<Vec<ImageSpec>, KubernetesError> {
    let image = |name: &str, tag: &str, entrypoint: &str, layer: Layer| ImageSpec {
        repository: format!("{IMAGE_REPOSITORY}/{name}"),
        tag: tag.to_owned(),
        entrypoint: vec![entrypoint.to_owned()],
        cmd: Vec::new(),
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
    specs.push(tools_image(inputs, tools_tag)?);
    Ok(specs)
}

/// The tools image: as Docker's busybox, no entrypoint and `sh` as the command (a pod's
/// `command`, or `ctr run`'s arguments, name the applet).
fn tools_image(inputs: &ImageInputs, tag: &str) -> Result<ImageSpec, KubernetesError> {
    Ok(ImageSpec {
        repository: TOOLS_REPOSITORY.to_owned(),
        tag: tag.to_owned(),
        entrypoint: Vec::new(),
        cmd: vec!["sh".to_owned()],
        env: vec![PATH_ENV.to_owned()],
        layers: vec![base_layer(), tools_layer(inputs, tag)?],
    })
}

/// busybox at [`BUSYBOX_BINARY`] and a relative link to it for each of [`TOOLS_APPLETS`].
fn tools_layer(inputs: &ImageInputs, tag: &str) -> Result<Layer, KubernetesError> {
    let busybox = inputs.busybox_root.join(BUSYBOX_IN_PACKAGE);
    if !busybox.is_file() {
        return Err(KubernetesError::Layout {
            what: format!("{BUSYBOX_IN_PACKAGE} (Debian's {TOOLS_PACKAGE})"),
            dir: inputs.busybox_root.to_owned(),
        });
    }
    let mut entries = vec![executable(BUSYBOX_BINARY, busybox)];
    entries.extend(TOOLS_APPLETS.iter().map(|applet| Entry::Symlink {
        path: format!("usr/bin/{applet}"),
        target: "busybox".to_owned(),
    }));
    Ok(Layer {
        description: format!(
            "hawser: Debian's static busybox {tag} ({}) and its applets {}",
            inputs.busybox_version,
            TOOLS_APPLETS.join(" ")
        ),
        entries,
    })
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
        let set = image_set("v1.20.2", "3.4.23-0", "1.35.0");
        assert_eq!(
            set.node.path,
            "/usr/share/hawser/kubernetes/node-images.tar"
        );
        assert_eq!(
            set.control_plane.path,
            "/usr/share/hawser/kubernetes/control-plane-images.tar"
        );
        assert_eq!(set.node.images.len(), 3);
        assert_eq!(set.control_plane.images.len(), 4);
        assert_eq!(set.image_repository, "registry.hawser.invalid/kubernetes");
        assert_eq!(set.pause.tag, "3.2");
        assert_eq!(set.images.len(), 7);
        assert_eq!(set.control_plane_images().len(), 6);
        assert_eq!(
            set.tools.map(|tools| tools.to_string()).as_deref(),
            Some("registry.hawser.invalid/hawser/busybox:1.35.0")
        );
    }

    #[test]
    fn the_tools_tag_is_busyboxs_upstream_version() {
        assert_eq!(tools_image_tag("1:1.35.0-4+deb12u1+b1").unwrap(), "1.35.0");
        assert_eq!(tools_image_tag("1:1.37.0-6").unwrap(), "1.37.0");
        let err = tools_image_tag("1:1.35-4").unwrap_err();
        assert!(err.to_string().contains("busybox-static"), "{err}");
    }

    #[test]
    fn the_tools_image_is_busybox_with_its_applet_links_and_sh_as_command() {
        let dir = tempfile::tempdir().unwrap();
        let busybox_root = dir.path().join("busybox-static");
        std::fs::create_dir_all(busybox_root.join("bin")).unwrap();
        std::fs::write(busybox_root.join(BUSYBOX_IN_PACKAGE), b"\x7fELF busybox").unwrap();
        let roots = [dir.path().to_owned()];
        let inputs = ImageInputs {
            bin_dir: dir.path(),
            etcd_roots: &roots,
            etcd_version: "3.4.23-4",
            pause_source: Path::new("/nonexistent/pause.c"),
            cache: dir.path(),
            busybox_root: &busybox_root,
            busybox_version: "1:1.35.0-4+deb12u1+b1",
            version: "v1.20.2",
            epoch: 1,
        };
        let layer = tools_layer(&inputs, "1.35.0").unwrap();
        assert_eq!(
            layer.entries[0],
            Entry::File {
                path: "usr/bin/busybox".into(),
                mode: 0o755,
                content: Content::Path(busybox_root.join("bin/busybox")),
            }
        );
        let links: Vec<(&str, &str)> = layer.entries[1..]
            .iter()
            .map(|entry| match entry {
                Entry::Symlink { path, target } => (path.as_str(), target.as_str()),
                other => panic!("not a link: {other:?}"),
            })
            .collect();
        for applet in [
            "sh", "httpd", "wget", "nc", "ping", "ip", "sleep", "cat", "echo", "hostname", "ls",
        ] {
            assert!(
                links.contains(&(format!("usr/bin/{applet}").as_str(), "busybox")),
                "{applet}: {links:?}"
            );
        }
        assert_eq!(links.len(), TOOLS_APPLETS.len());

        let tools = tools_image(&inputs, "1.35.0").unwrap();
        assert_eq!(
            tools.name(),
            "registry.hawser.invalid/hawser/busybox:1.35.0"
        );
        assert!(tools.entrypoint.is_empty());
        assert_eq!(tools.cmd, ["sh"]);
        assert_eq!(tools.layers[0], base_layer());

        std::fs::remove_file(busybox_root.join(BUSYBOX_IN_PACKAGE)).unwrap();
        let err = tools_layer(&inputs, "1.35.0").unwrap_err();
        assert!(err.to_string().contains("bin/busybox"), "{err}");
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
            busybox_root: dir.path(),
            busybox_version: "1:1.35.0-4",
            version: "v1.20.2",
            epoch: 1,
        };
        let err = image_specs(&inputs, "3.4.23-0", "1.35.0", Path::new("/pause")).unwrap_err();
        assert!(err.to_string().contains("kube-apiserver"), "{err}");
        for name in KUBERNETES_IMAGES {
            std::fs::write(dir.path().join(name), b"binary").unwrap();
        }
        let err = image_specs(&inputs, "3.4.23-0", "1.35.0", Path::new("/pause")).unwrap_err();
        assert!(err.to_string().contains("usr/bin/etcd"), "{err}");
    }

    fn spec_named(name: &str) -> ImageSpec {
        let (repository, tag) = name.rsplit_once(':').unwrap();
        ImageSpec {
            repository: repository.into(),
            tag: tag.into(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: Vec::new(),
            layers: vec![base_layer()],
        }
    }

    #[test]
    fn the_specs_are_split_as_the_description_lists_them() {
        let set = image_set("v1.20.2", "3.4.23-0", "1.35.0");
        let specs: Vec<ImageSpec> = set.images.iter().map(|name| spec_named(name)).collect();
        let (node, control_plane) = split_specs(&set, specs.clone()).unwrap();
        let names = |specs: &[ImageSpec]| specs.iter().map(ImageSpec::name).collect::<Vec<_>>();
        assert_eq!(
            names(&node),
            [
                "registry.hawser.invalid/hawser/busybox:1.35.0",
                "registry.hawser.invalid/kubernetes/kube-proxy:v1.20.2",
                "registry.hawser.invalid/kubernetes/pause:3.2",
            ]
        );
        assert_eq!(
            names(&control_plane),
            [
                "registry.hawser.invalid/kubernetes/etcd:3.4.23-0",
                "registry.hawser.invalid/kubernetes/kube-apiserver:v1.20.2",
                "registry.hawser.invalid/kubernetes/kube-controller-manager:v1.20.2",
                "registry.hawser.invalid/kubernetes/kube-scheduler:v1.20.2",
            ]
        );

        let without_etcd: Vec<ImageSpec> = specs
            .iter()
            .filter(|spec| spec.repository != "registry.hawser.invalid/kubernetes/etcd")
            .cloned()
            .collect();
        let err = split_specs(&set, without_etcd).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the archive /usr/share/hawser/kubernetes/control-plane-images.tar"),
            "{err}"
        );
        let mut extra = specs;
        extra.push(spec_named(
            "registry.hawser.invalid/kubernetes/coredns:1.7.0",
        ));
        let err = split_specs(&set, extra).unwrap_err();
        assert!(err.to_string().contains("coredns:1.7.0"), "{err}");
    }
}
