//! The immutable rootfs: Debian bookworm from mkosi, made into a deterministic erofs image with
//! a dm-verity hash tree whose root hash goes on the measured kernel command line.
//!
//! Why each step is the way it is:
//! - Every Debian package comes from `rootfs.lock` ([`lock`]): the whole closure mkosi installs,
//!   pinned by version and sha256. The build downloads the pinned files into hawser's cache,
//!   verifies them, and hands them to mkosi as a local repository that is its only Debian
//!   source ([`repo`]); afterwards mkosi's manifest must list exactly the locked packages and
//!   versions. `hawser image lock` re-pins ([`lock_rootfs`]: one mkosi build from the live
//!   archive, whose manifest is resolved to archive files).
//! - mkosi builds a plain directory (`Format=directory`, see `mkosi.conf`) with
//!   `SourceDateEpoch` (the epoch pinned in `inputs.lock`, passed on the command line here), a
//!   fixed `Seed` and the run-to-run differences removed; its own archive outputs are not
//!   sorted, so the image is made here from the directory.
//! - `mkfs.erofs -T <epoch> -U <uuid>` gives the same bytes for the same tree: every inode gets
//!   the epoch as its time, and the filesystem UUID is derived from the tree's content (a digest
//!   over paths, types, modes, owners and file contents), never random.
//! - `veritysetup format` is deterministic once salt and UUID are fixed: both are derived from
//!   the erofs image's sha256, so the same image always gets the same hash tree and root hash.
//!   The verity superblock stays at the start of the hash file (sha256, 4096/4096 blocks), and
//!   `veritysetup verify` checks the result on the host (it needs no device-mapper).
//! - Kubernetes comes from `kubernetes.lock` ([`crate::kubernetes`]): built from Debian's source
//!   or upstream's release binaries, kubeadm and kubelet in `/usr/bin`, the control plane as OCI
//!   images in one archive, described in `/usr/share/hawser/kubernetes.json` ([`kubernetes`]).
//!   Tests that need a fast boot build with hawser's stand-ins instead (crate `hawser-standin`),
//!   which never pretend to be Kubernetes: the build says so on the terminal, in
//!   [`Rootfs::kubernetes`], in `kubernetes.json` and in the image's `/usr/share/hawser/STAND-IN`.
//!
//! The contract with the initramfs: the kernel command line carries
//! `hawser.root_hash=<64 hex>` ([`root_hash_cmdline_arg`]); the GPT data partition's PARTUUID
//! is the first 16 bytes of the root hash and the verity partition's the last 16
//! ([`hawser_disk_format::gpt::root_partuuids`], systemd's convention). The hash tree's format
//! (block size, hash) is the one PID 1 accepts, from [`hawser_disk_format::verity`].
//!
//! The code: this module has the options, the result, [`build_rootfs`] and [`lock_rootfs`];
//! `lock` is the lock file, `repo` the local repository made from it, `mkosi` runs mkosi,
//! `standins` installs hawser's binaries into the tree, `kubernetes` Kubernetes (or the
//! stand-ins), `tree` normalises it, `images` makes the erofs image and its verity tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hawser_disk_format::Guid;
use hawser_disk_format::verity;
use sha2::{Digest, Sha256};

use crate::inputs::InputError;
use crate::tool::{self, IoError, ToolError, io_error};

mod images;
pub mod kubernetes;
pub mod lock;
mod mkosi;
pub mod repo;
mod standins;
mod tree;

pub use images::{TreeImages, image_tree, verify_verity};
pub use kubernetes::{RootfsKubernetes, install_kubernetes, kubernetes_cmdline_arg};
use lock::{MkosiConf, RootfsLock, RootfsLockError};
pub use mkosi::manifest_packages;
use mkosi::{MkosiRun, run_mkosi};
pub use standins::{
    JOIND_PATH, compile_rootfs_binaries, install_joind, install_kernel_modules,
    install_pid1_copies, install_standins, standin_marker_text,
};
pub use tree::normalize_tree;

/// `PATH` for the tools run here: mkosi runs helpers with the Python it finds on PATH, and a
/// user's pyenv Python lacks the modules they need.
pub const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The tree, image and hash tree in the output directory.
pub const TREE_DIR: &str = "rootfs";
pub const EROFS_FILE: &str = "rootfs.erofs";
pub const VERITY_FILE: &str = "rootfs.verity";
/// The root hash as hex text, next to the images.
pub const ROOTHASH_FILE: &str = "rootfs.roothash";
/// What was built: root hash, salt, sizes, the rootfs lock, and where Kubernetes came from (or
/// that it did not).
pub const SUMMARY_FILE: &str = "rootfs.json";
/// mkosi's JSON manifest of the tree (every installed package and version), in the output
/// directory.
pub const MANIFEST_FILE: &str = "rootfs.manifest";
/// The workspace's mkosi configuration and the apt sources a build from the live archive uses.
pub const MKOSI_CONF: &str = "mkosi.conf";
pub const MKOSI_SOURCES_DIR: &str = "mkosi.pkgmngr/etc/apt/sources.list.d";
/// The marker the stand-in build leaves in the image.
pub const STANDIN_MARKER: &str = "usr/share/hawser/STAND-IN";
/// The CNI plugins a pod network needs, which containerd's CRI finds in its `bin_dir`
/// (`/usr/lib/cni`, Debian's containernetworking-plugins): the loopback of every pod, a bridge
/// network with host-local addresses, and hostPort mappings. The build refuses a tree without
/// them as executable files ([`check_required_files`]).
pub const CNI_PLUGINS: &[&str] = &[
    "usr/lib/cni/bridge",
    "usr/lib/cni/host-local",
    "usr/lib/cni/loopback",
    "usr/lib/cni/portmap",
];
/// dm-verity's block sizes (data and hash), and erofs's block size.
pub const BLOCK_SIZE: u64 = verity::BLOCK_SIZE as u64;

/// What to build, and from where.
#[derive(Debug, Clone)]
pub struct RootfsOptions {
    /// The hawser workspace: holds `mkosi.conf`, `mkosi.pkgmngr/` and `rootfs.lock`.
    pub workspace: PathBuf,
    /// Where the tree, `rootfs.erofs`, `rootfs.verity`, `rootfs.roothash` and `rootfs.json` go
    /// (plus mkosi's `rootfs.manifest`, the package list).
    pub out_dir: PathBuf,
    /// hawser's cache root (`inputs::cache_dir()`); mkosi's package cache is its `mkosi/`.
    pub cache_dir: PathBuf,
    /// Every timestamp in the tree and the image (the epoch pinned in `inputs.lock`).
    pub source_date_epoch: u64,
    /// Where the built binaries `hawser-joind`, `kubeadm` and `kubelet` (stand-ins) are
    /// (`target/<profile>/`).
    pub standin_bin_dir: PathBuf,
    /// Kubernetes, or the stand-ins.
    pub kubernetes: RootfsKubernetes,
    /// PID 1's ELF files as the initramfs holds them (path in the initramfs, file): copied
    /// under [`hawser_disk_format::rootfs::PID1_COPIES`] ([`crate::initramfs::pid1_elf_files`]).
    pub pid1_files: Vec<(String, PathBuf)>,
    /// The kernel modules PID 1 loads after the pivot (Kubernetes' and the power button's), at
    /// their paths in the tree ([`crate::initramfs::module_files`] of
    /// [`hawser_kmod::rootfs_modules`]).
    pub kernel_modules: Vec<(String, Vec<u8>)>,
}

/// The built rootfs.
#[derive(Debug, Clone)]
pub struct Rootfs {
    /// mkosi's directory tree (plus the stand-ins when used).
    pub tree: PathBuf,
    pub erofs: PathBuf,
    pub verity: PathBuf,
    pub root_hash: [u8; 32],
    pub verity_salt: [u8; 32],
    /// Data blocks (4096 bytes) covered by the hash tree: the erofs image's size / 4096.
    pub data_blocks: u64,
    pub erofs_bytes: u64,
    pub verity_bytes: u64,
    /// What `/usr/share/hawser/kubernetes.json` says: real Kubernetes (which, its images) or
    /// the stand-ins.
    pub kubernetes: hawser_kube_types::ImageKubernetes,
    /// sha256 of the `rootfs.lock` the packages came from ([`RootfsLock::digest`]).
    pub lock_digest: String,
    /// Wall time of each step.
    pub timings: Vec<(String, Duration)>,
}

/// Why the rootfs could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// A tool the build needs is not installed.
    #[error(transparent)]
    MissingTool(#[from] ToolError),
    /// A step's tool could not run or failed; `hint` says what usually fixes it.
    #[error("{step} failed{}", hint_text(hint))]
    Step {
        step: &'static str,
        hint: &'static str,
        #[source]
        source: ToolError,
    },
    /// A tool succeeded but its output is not what it should be.
    #[error("{tool} printed no usable {what}; its output:\n{output}")]
    ToolOutput {
        tool: &'static str,
        what: &'static str,
        output: String,
    },
    /// A file or directory of the build could not be read or written.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The rootfs lock is unusable or does not match the configuration or the build.
    #[error(transparent)]
    Lock(#[from] RootfsLockError),
    /// A locked package could not be downloaded or verified, or apt failed while locking.
    #[error(transparent)]
    Inputs(#[from] InputError),
    /// mkosi's package manifest is not JSON.
    #[error("mkosi's manifest {path} is not valid JSON")]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// Kubernetes' control-plane images could not be built.
    #[error("building the rootfs's Kubernetes images failed")]
    Kubernetes(#[source] Box<crate::kubernetes::KubernetesError>),
    /// The stand-in binaries were not built.
    #[error(
        "the kubeadm/kubelet stand-ins are not at {path}: build them first (cargo build --locked --profile image -p hawser-init -p hawser-joinservice -p hawser-standin, or rootfs::compile_rootfs_binaries)"
    )]
    StandInsMissing { path: PathBuf },
    /// mkosi finished without the directory it was configured to make.
    #[error(
        "mkosi finished but left no directory tree at {path}: check Format=directory and Output=rootfs in mkosi.conf"
    )]
    NoTree { path: PathBuf },
    /// A file the node needs is not in mkosi's tree, or is not an executable regular file.
    #[error(
        "the rootfs tree lacks /{path} as an executable file ({why}): is its package in mkosi.conf \
         and rootfs.lock, and not removed by RemoveFiles= or a dpkg path-exclude?"
    )]
    RequiredFile { path: String, why: &'static str },
    /// The erofs image cannot be covered by 4096-byte verity data blocks.
    #[error("the erofs image {path} is {bytes} bytes, not a whole number of 4096-byte blocks")]
    UnalignedImage { path: PathBuf, bytes: u64 },
}

impl From<crate::kubernetes::KubernetesError> for RootfsError {
    fn from(error: crate::kubernetes::KubernetesError) -> Self {
        RootfsError::Kubernetes(Box::new(error))
    }
}

/// `: hint`, or nothing for an empty hint.
fn hint_text(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!(": {hint}")
    }
}

/// Checks that each of `paths` (relative to `tree`) is a regular file with an execute bit;
/// `why` says what it is, for the error.
pub fn check_required_files(
    tree: &Path,
    paths: &[&str],
    why: &'static str,
) -> Result<(), RootfsError> {
    use std::os::unix::fs::PermissionsExt as _;
    for path in paths {
        let executable = std::fs::symlink_metadata(tree.join(path))
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0);
        if !executable {
            return Err(RootfsError::RequiredFile {
                path: (*path).to_owned(),
                why,
            });
        }
    }
    Ok(())
}

/// `hawser.root_hash=<64 hex>`: the measured kernel command line's pin on the rootfs.
pub fn root_hash_cmdline_arg(root_hash: &[u8; 32]) -> String {
    format!("hawser.root_hash={}", hex::encode(root_hash))
}

/// A UUID (version 4 and variant bits set, so tools accept it) derived from `label` and `data`.
fn derived_uuid(label: &str, data: &[u8]) -> Guid {
    let digest = Sha256::new()
        .chain_update(label.as_bytes())
        .chain_update([0u8])
        .chain_update(data)
        .finalize();
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&digest[..16]);
    Guid::version_4(uuid)
}

/// Finds `tool` on [`TOOL_PATH`].
fn find_tool(tool: &'static str, package: &'static str) -> Result<PathBuf, RootfsError> {
    Ok(tool::find_tool_in(TOOL_PATH, tool, package)?)
}

/// Runs a short tool (with [`TOOL_PATH`]) to completion; a failure is a [`RootfsError::Step`]
/// naming the step, with a `hint` of what usually fixes it.
fn run_tool(
    mut cmd: Command,
    step: &'static str,
    hint: &'static str,
) -> Result<std::process::Output, RootfsError> {
    tool::run_tool(cmd.env("PATH", TOOL_PATH)).map_err(|source| RootfsError::Step {
        step,
        hint,
        source,
    })
}

/// Whether the tools the whole build needs are installed; `Err` names the first missing one.
pub fn check_tools() -> Result<(), RootfsError> {
    find_tool("mkosi", "mkosi (bookworm-backports)")?;
    find_tool("mkfs.erofs", "erofs-utils")?;
    find_tool("veritysetup", "cryptsetup-bin")?;
    Ok(())
}

/// The workspace's `rootfs.lock`, checked against its `mkosi.conf` (same release, every
/// configured package pinned).
pub fn load_rootfs_lock(workspace: &Path) -> Result<RootfsLock, RootfsError> {
    let lock = RootfsLock::load(&workspace.join(lock::LOCK_FILE))?;
    MkosiConf::load(&workspace.join(MKOSI_CONF))?.check(&lock)?;
    Ok(lock)
}

/// Builds the rootfs: the locked packages into a local repository, the mkosi tree from it
/// (checked against the lock), stand-ins if needed, erofs image, verity hash tree.
/// `progress` gets one line per step and keeps the terminal alive during mkosi's minutes.
pub fn build_rootfs(
    opts: &RootfsOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Rootfs, RootfsError> {
    check_tools()?;
    let mut timings = Vec::new();
    std::fs::create_dir_all(&opts.out_dir).map_err(io_error("create directory", &opts.out_dir))?;
    let lock = load_rootfs_lock(&opts.workspace)?;

    if opts.kubernetes == RootfsKubernetes::StandIn {
        let message = "rootfs: STAND-INS for kubeadm and kubelet (--kubernetes stand-in): this \
                       image does NOT contain Kubernetes";
        tracing::warn!("{message}");
        progress(message);
        let kubeadm = opts.standin_bin_dir.join("kubeadm");
        let kubelet = opts.standin_bin_dir.join("kubelet");
        if !kubeadm.is_file() || !kubelet.is_file() {
            return Err(RootfsError::StandInsMissing {
                path: opts.standin_bin_dir.clone(),
            });
        }
    }

    let t = Instant::now();
    let repository = repo::prepare_repository(&lock, &opts.cache_dir, &opts.out_dir, progress)?;
    timings.push((format!("fetch {}", lock::LOCK_FILE), t.elapsed()));

    let t = Instant::now();
    let tree = run_mkosi(
        &MkosiRun {
            workspace: &opts.workspace,
            out_dir: &opts.out_dir,
            cache_dir: &opts.cache_dir,
            source_date_epoch: opts.source_date_epoch,
            local_mirror: Some(&repository.dir),
            package_manager_trees: vec![repository.package_manager_tree.clone()],
        },
        progress,
    )?;
    repository.remove()?;
    timings.push(("mkosi".to_owned(), t.elapsed()));
    let manifest = opts.out_dir.join(MANIFEST_FILE);
    lock::verify_installed(&lock, &manifest_packages(&manifest)?)?;
    progress(&format!(
        "rootfs: mkosi installed exactly the {} packages of {}",
        lock.packages.len(),
        lock::LOCK_FILE,
    ));
    check_required_files(&tree, CNI_PLUGINS, "a CNI plugin")?;
    progress(&format!(
        "rootfs: CNI plugins present: /{}",
        CNI_PLUGINS.join(", /")
    ));
    install_joind(&tree, &opts.standin_bin_dir, opts.source_date_epoch)?;
    progress(&format!("rootfs: installed /{JOIND_PATH}"));
    install_pid1_copies(&tree, &opts.pid1_files, opts.source_date_epoch)?;
    progress(&format!(
        "rootfs: installed copies of PID 1's {} ELF files under /{}",
        opts.pid1_files.len(),
        hawser_disk_format::rootfs::PID1_COPIES
    ));

    install_kernel_modules(&tree, &opts.kernel_modules, opts.source_date_epoch)?;
    progress(&format!(
        "rootfs: installed {} files of Kubernetes' kernel modules under /{}",
        opts.kernel_modules.len(),
        crate::initramfs::MODULES_ROOT
    ));

    let t = Instant::now();
    let etcd_version = lock
        .versions()
        .get("etcd-server")
        .cloned()
        .unwrap_or_default();
    let kubernetes = install_kubernetes(
        kubernetes::InstallTarget {
            tree: &tree,
            etcd_version: &etcd_version,
            standin_bin_dir: &opts.standin_bin_dir,
            cache: &opts.cache_dir,
            epoch: opts.source_date_epoch,
        },
        &opts.kubernetes,
        progress,
    )?;
    timings.push(("install Kubernetes".to_owned(), t.elapsed()));

    let images = image_tree(&tree, &opts.out_dir, opts.source_date_epoch, progress)?;
    timings.extend(images.timings);
    let summary = opts.out_dir.join(SUMMARY_FILE);
    let kubernetes_json = serde_json::to_value(&kubernetes).unwrap_or_default();
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "root_hash": hex::encode(images.root_hash),
        "cmdline": root_hash_cmdline_arg(&images.root_hash),
        "verity_salt": hex::encode(images.verity_salt),
        "data_blocks": images.data_blocks,
        "erofs_bytes": images.erofs_bytes,
        "verity_bytes": images.verity_bytes,
        "tree_digest": hex::encode(images.tree_digest),
        "source_date_epoch": opts.source_date_epoch,
        "rootfs_lock": { "digest": lock.digest(), "packages": lock.packages.len() },
        "kubernetes": kubernetes_json,
    }))
    .unwrap_or_default();
    std::fs::write(&summary, text + "\n").map_err(io_error("write", &summary))?;
    Ok(Rootfs {
        tree,
        erofs: images.erofs,
        verity: images.verity,
        root_hash: images.root_hash,
        verity_salt: images.verity_salt,
        data_blocks: images.data_blocks,
        erofs_bytes: images.erofs_bytes,
        verity_bytes: images.verity_bytes,
        kubernetes,
        lock_digest: lock.digest(),
        timings,
    })
}

/// Re-pins the rootfs for `hawser image lock`: builds the tree once with mkosi from the live
/// archive (the sources of `mkosi.pkgmngr/`), takes every installed package and version from
/// mkosi's manifest, and resolves each to its archive file with a private apt of the same
/// sources. The tree is deleted afterwards; nothing in the workspace is written (the caller
/// writes the lock).
pub fn lock_rootfs(
    workspace: &Path,
    cache_dir: &Path,
    source_date_epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<RootfsLock, RootfsError> {
    check_tools()?;
    let conf_path = workspace.join(MKOSI_CONF);
    let conf = MkosiConf::load(&conf_path)?;
    let suite = conf.release_or_error(&conf_path)?.to_owned();
    let out_dir = cache_dir.join("rootfs-lock");
    if out_dir.exists() {
        std::fs::remove_dir_all(&out_dir).map_err(io_error("remove", &out_dir))?;
    }
    std::fs::create_dir_all(&out_dir).map_err(io_error("create directory", &out_dir))?;
    run_mkosi(
        &MkosiRun {
            workspace,
            out_dir: &out_dir,
            cache_dir,
            source_date_epoch,
            local_mirror: None,
            package_manager_trees: Vec::new(),
        },
        progress,
    )?;
    let installed = manifest_packages(&out_dir.join(MANIFEST_FILE))?;
    progress(&format!(
        "rootfs lock: mkosi installed {} packages from the live {suite} archive; resolving their files",
        installed.len()
    ));
    let lock = lock::resolve(
        &installed,
        &suite,
        &workspace.join(MKOSI_SOURCES_DIR),
        cache_dir,
    )?;
    std::fs::remove_dir_all(&out_dir).map_err(io_error("remove", &out_dir))?;
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_without_an_executable_cni_plugin_is_refused_by_name() {
        use std::os::unix::fs::PermissionsExt as _;
        let tree = tempfile::tempdir().unwrap();
        let cni = tree.path().join("usr/lib/cni");
        std::fs::create_dir_all(&cni).unwrap();
        for path in CNI_PLUGINS {
            let file = tree.path().join(path);
            std::fs::write(&file, b"\x7fELF").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        check_required_files(tree.path(), CNI_PLUGINS, "a CNI plugin").unwrap();

        let portmap = cni.join("portmap");
        std::fs::set_permissions(&portmap, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = check_required_files(tree.path(), CNI_PLUGINS, "a CNI plugin").unwrap_err();
        assert!(
            err.to_string().starts_with(
                "the rootfs tree lacks /usr/lib/cni/portmap as an executable file (a CNI plugin)"
            ),
            "{err}"
        );
        std::fs::remove_file(cni.join("bridge")).unwrap();
        std::os::unix::fs::symlink("loopback", cni.join("bridge")).unwrap();
        let err = check_required_files(tree.path(), CNI_PLUGINS, "a CNI plugin").unwrap_err();
        assert!(err.to_string().contains("/usr/lib/cni/bridge"), "{err}");
    }

    #[test]
    fn mkosi_conf_installs_the_cni_plugins_and_the_lock_pins_them() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let conf = MkosiConf::load(&workspace.join(MKOSI_CONF)).unwrap();
        assert!(
            conf.packages
                .iter()
                .any(|p| p == "containernetworking-plugins"),
            "{:?}",
            conf.packages
        );
        let lock = load_rootfs_lock(&workspace).unwrap();
        assert_eq!(
            lock.versions()
                .get("containernetworking-plugins")
                .map(String::as_str),
            Some("1.1.1+ds1-3+b5")
        );
    }

    #[test]
    fn partition_uuids_are_the_halves_of_the_root_hash() {
        let mut root_hash = [0u8; 32];
        for (i, b) in root_hash.iter_mut().enumerate() {
            *b = u8::try_from(i).unwrap();
        }
        let (data, verity) = hawser_disk_format::gpt::root_partuuids(&root_hash);
        assert_eq!(data.to_string(), "00010203-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(verity.to_string(), "10111213-1415-1617-1819-1a1b1c1d1e1f");
        assert_eq!(
            root_hash_cmdline_arg(&root_hash),
            "hawser.root_hash=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
        );
    }

    #[test]
    fn derived_uuids_are_stable_well_formed_version_4() {
        let a = derived_uuid("label", b"data");
        assert_eq!(a, derived_uuid("label", b"data"));
        assert_ne!(a, derived_uuid("label", b"other"));
        assert_ne!(a, derived_uuid("other", b"data"));
        let text = a.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4");
        assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"), "{text}");
    }
}
