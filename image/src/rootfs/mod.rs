//! The immutable rootfs: Debian bookworm from mkosi, made into a deterministic erofs image with
//! a dm-verity hash tree whose root hash goes on the measured kernel command line.
//!
//! Why each step is the way it is:
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
//! - Kubernetes comes from pkgs.k8s.io when this machine can reach it. When it cannot, the build
//!   says so — on the terminal, in [`Rootfs::kubernetes`] and in the image's
//!   `/usr/share/hawser/STAND-IN` — and installs hawser's stand-ins for kubeadm and kubelet
//!   (crate `hawser-standin`), which never pretend to be Kubernetes.
//!
//! The contract with the initramfs: the kernel command line carries
//! `hawser.root_hash=<64 hex>` ([`root_hash_cmdline_arg`]); the GPT data partition's PARTUUID
//! is the first 16 bytes of the root hash and the verity partition's the last 16
//! ([`hawser_disk_format::gpt::root_partuuids`], systemd's convention). The hash tree's format
//! (block size, hash) is the one PID 1 accepts, from [`hawser_disk_format::verity`].
//!
//! The code: this module has the options, the result and [`build_rootfs`]; `mkosi` runs mkosi
//! (and probes pkgs.k8s.io), `standins` installs hawser's binaries into the tree, `tree`
//! normalises it, `images` makes the erofs image and its verity tree.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use hawser_disk_format::Guid;
use hawser_disk_format::verity;
use sha2::{Digest, Sha256};

use crate::tool::{self, IoError, ToolError, io_error};

mod images;
mod mkosi;
mod standins;
mod tree;

pub use images::{TreeImages, image_tree, verify_verity};
pub use mkosi::probe_kubernetes_repository;
use mkosi::{kubeadm_version_from_manifest, kubernetes_package_manager_tree, run_mkosi};
pub use standins::{
    JOIND_PATH, compile_rootfs_binaries, install_joind, install_standins, standin_marker_text,
};
pub use tree::normalize_tree;

/// `PATH` for the tools run here: mkosi runs helpers with the Python it finds on PATH, and a
/// user's pyenv Python lacks the modules they need.
pub const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The Kubernetes minor release whose packages the rootfs carries when it can get them.
pub const KUBERNETES_MINOR: &str = "v1.33";
/// The Kubernetes packages installed from pkgs.k8s.io.
pub const KUBERNETES_PACKAGES: &[&str] = &[
    "kubeadm",
    "kubelet",
    "kubectl",
    "kubernetes-cni",
    "cri-tools",
];
/// The tree, image and hash tree in the output directory.
pub const TREE_DIR: &str = "rootfs";
pub const EROFS_FILE: &str = "rootfs.erofs";
pub const VERITY_FILE: &str = "rootfs.verity";
/// The root hash as hex text, next to the images.
pub const ROOTHASH_FILE: &str = "rootfs.roothash";
/// What was built: root hash, salt, sizes, and where Kubernetes came from (or that it did not).
pub const SUMMARY_FILE: &str = "rootfs.json";
/// The marker the stand-in build leaves in the image.
pub const STANDIN_MARKER: &str = "usr/share/hawser/STAND-IN";
/// dm-verity's block sizes (data and hash), and erofs's block size.
pub const BLOCK_SIZE: u64 = verity::BLOCK_SIZE as u64;
/// How long the pkgs.k8s.io probe may take.
const PROBE_TIMEOUT_SECS: u32 = 5;

/// The APT repository of [`KUBERNETES_MINOR`].
pub fn kubernetes_repository() -> String {
    format!("https://pkgs.k8s.io/core:/stable:/{KUBERNETES_MINOR}/deb/")
}

/// What to build, and from where.
#[derive(Debug, Clone)]
pub struct RootfsOptions {
    /// The hawser workspace: holds `mkosi.conf` and `mkosi.pkgmngr/`.
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
}

/// Where the image's kubeadm and kubelet come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubernetesSource {
    /// Kubernetes' own packages from pkgs.k8s.io, at this kubeadm package version.
    Upstream { version: String },
    /// hawser's stand-ins (not Kubernetes), and why.
    StandIn { reason: String },
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
    pub kubernetes: KubernetesSource,
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
    /// mkosi's package manifest is not JSON.
    #[error("mkosi's manifest {path} is not valid JSON")]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The stand-in binaries were not built.
    #[error(
        "the kubeadm/kubelet stand-ins are not at {path}: build them first (cargo build --profile image -p hawser-standin -p hawser-joinservice, or rootfs::compile_rootfs_binaries)"
    )]
    StandInsMissing { path: PathBuf },
    /// mkosi finished without the directory it was configured to make.
    #[error(
        "mkosi finished but left no directory tree at {path}: check Format=directory and Output=rootfs in mkosi.conf"
    )]
    NoTree { path: PathBuf },
    /// The erofs image cannot be covered by 4096-byte verity data blocks.
    #[error("the erofs image {path} is {bytes} bytes, not a whole number of 4096-byte blocks")]
    UnalignedImage { path: PathBuf, bytes: u64 },
}

/// `: hint`, or nothing for an empty hint.
fn hint_text(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!(": {hint}")
    }
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

/// Builds the rootfs: mkosi tree, stand-ins if needed, erofs image, verity hash tree.
/// `progress` gets one line per step and keeps the terminal alive during mkosi's minutes.
pub fn build_rootfs(
    opts: &RootfsOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Rootfs, RootfsError> {
    check_tools()?;
    let mut timings = Vec::new();
    std::fs::create_dir_all(&opts.out_dir).map_err(io_error("create directory", &opts.out_dir))?;

    let t = Instant::now();
    let kubernetes_reachable = probe_kubernetes_repository();
    let upstream_tree = match &kubernetes_reachable {
        Ok(()) => {
            progress(&format!(
                "rootfs: Kubernetes packages from {} ({})",
                kubernetes_repository(),
                KUBERNETES_PACKAGES.join(", ")
            ));
            Some(kubernetes_package_manager_tree(&opts.out_dir)?)
        }
        Err(why) => {
            let message = format!(
                "rootfs: OFFLINE BUILD: {} is not reachable ({why}); installing hawser's \
                 STAND-INS for kubeadm and kubelet — this image does NOT contain Kubernetes",
                kubernetes_repository()
            );
            tracing::warn!("{message}");
            progress(&message);
            let kubeadm = opts.standin_bin_dir.join("kubeadm");
            let kubelet = opts.standin_bin_dir.join("kubelet");
            if !kubeadm.is_file() || !kubelet.is_file() {
                return Err(RootfsError::StandInsMissing {
                    path: opts.standin_bin_dir.clone(),
                });
            }
            None
        }
    };
    timings.push(("probe pkgs.k8s.io".to_owned(), t.elapsed()));

    let t = Instant::now();
    let tree = run_mkosi(opts, upstream_tree.as_deref(), progress)?;
    timings.push(("mkosi".to_owned(), t.elapsed()));
    install_joind(&tree, &opts.standin_bin_dir, opts.source_date_epoch)?;
    progress(&format!("rootfs: installed /{JOIND_PATH}"));

    let kubernetes = match kubernetes_reachable {
        Ok(()) => {
            let manifest = opts.out_dir.join(format!("{TREE_DIR}.manifest"));
            let version = kubeadm_version_from_manifest(&manifest)?;
            progress(&format!("rootfs: Kubernetes kubeadm {version} installed"));
            KubernetesSource::Upstream { version }
        }
        Err(why) => {
            let t = Instant::now();
            install_standins(&tree, &opts.standin_bin_dir, opts.source_date_epoch)?;
            progress(&format!(
                "rootfs: installed the STAND-INS at /usr/bin/kubeadm and /usr/bin/kubelet, marker /{STANDIN_MARKER}"
            ));
            timings.push(("install stand-ins".to_owned(), t.elapsed()));
            KubernetesSource::StandIn {
                reason: format!("{} is not reachable: {why}", kubernetes_repository()),
            }
        }
    };

    let images = image_tree(&tree, &opts.out_dir, opts.source_date_epoch, progress)?;
    timings.extend(images.timings);
    let summary = opts.out_dir.join(SUMMARY_FILE);
    let kubernetes_json = match &kubernetes {
        KubernetesSource::Upstream { version } => serde_json::json!({
            "source": "upstream", "repository": kubernetes_repository(), "kubeadm_version": version,
        }),
        KubernetesSource::StandIn { reason } => serde_json::json!({
            "source": "stand-in (NOT Kubernetes)", "reason": reason,
        }),
    };
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "root_hash": hex::encode(images.root_hash),
        "cmdline": root_hash_cmdline_arg(&images.root_hash),
        "verity_salt": hex::encode(images.verity_salt),
        "data_blocks": images.data_blocks,
        "erofs_bytes": images.erofs_bytes,
        "verity_bytes": images.verity_bytes,
        "tree_digest": hex::encode(images.tree_digest),
        "source_date_epoch": opts.source_date_epoch,
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
        timings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
