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

use std::collections::VecDeque;
use std::io::{BufRead as _, Read as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use hawser_disk_format::Guid;
use hawser_disk_format::verity;
use sha2::{Digest, Sha256};

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
    /// A tool is not installed.
    #[error(
        "{tool} is not installed (Debian package {package}): run scripts/setup-host, which installs it"
    )]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    /// A tool could not be started.
    #[error("cannot run {tool}: {source}")]
    Spawn {
        tool: String,
        #[source]
        source: std::io::Error,
    },
    /// A tool ran and failed.
    #[error("{tool} failed ({status}); its last output:\n{output_tail}\n{hint}")]
    ToolFailed {
        tool: String,
        status: String,
        output_tail: String,
        hint: String,
    },
    /// A tool succeeded but its output is not what it should be.
    #[error("{tool} printed no usable {what}; its output:\n{output}")]
    ToolOutput {
        tool: &'static str,
        what: &'static str,
        output: String,
    },
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
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

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RootfsError + use<> {
    let path = path.to_owned();
    move |source| RootfsError::Io {
        action,
        path,
        source,
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
    TOOL_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(tool))
        .find(|p| p.is_file())
        .ok_or(RootfsError::MissingTool { tool, package })
}

/// Whether the tools the whole build needs are installed; `Err` names the first missing one.
pub fn check_tools() -> Result<(), RootfsError> {
    find_tool("mkosi", "mkosi (bookworm-backports)")?;
    find_tool("mkfs.erofs", "erofs-utils")?;
    find_tool("veritysetup", "cryptsetup-bin")?;
    Ok(())
}

/// Runs a short tool to completion; a failure carries its exit status and last output lines.
fn run_tool(mut cmd: Command, tool: &str, hint: &str) -> Result<std::process::Output, RootfsError> {
    let output = cmd
        .env("PATH", TOOL_PATH)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RootfsError::Spawn {
            tool: tool.to_owned(),
            source,
        })?;
    if !output.status.success() {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        return Err(RootfsError::ToolFailed {
            tool: tool.to_owned(),
            status: output.status.to_string(),
            output_tail: tail(&text, 20),
            hint: hint.to_owned(),
        });
    }
    Ok(output)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Builds the rootfs: mkosi tree, stand-ins if needed, erofs image, verity hash tree.
/// `progress` gets one line per step and keeps the terminal alive during mkosi's minutes.
pub fn build_rootfs(
    opts: &RootfsOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Rootfs, RootfsError> {
    check_tools()?;
    let mut timings = Vec::new();
    std::fs::create_dir_all(&opts.out_dir).map_err(io_err("create directory", &opts.out_dir))?;

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
    std::fs::write(&summary, text + "\n").map_err(io_err("write", &summary))?;
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

/// `Ok` when pkgs.k8s.io answers within a few seconds; `Err` says why not.
pub fn probe_kubernetes_repository() -> Result<(), String> {
    let url = format!("{}InRelease", kubernetes_repository());
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--head", "--max-time"])
        .arg(PROBE_TIMEOUT_SECS.to_string())
        .arg(&url)
        .env("PATH", TOOL_PATH)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        Err(if stderr.is_empty() {
            format!("curl {}", output.status)
        } else {
            stderr
        })
    }
}

/// A package manager tree adding the pkgs.k8s.io repository and its signing key.
fn kubernetes_package_manager_tree(out_dir: &Path) -> Result<PathBuf, RootfsError> {
    let tree = out_dir.join("kubernetes.pkgmngr");
    let keyrings = tree.join("etc/apt/keyrings");
    let sources = tree.join("etc/apt/sources.list.d");
    for dir in [&keyrings, &sources] {
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
    }
    let key = keyrings.join("kubernetes.asc");
    let mut curl = Command::new("curl");
    curl.args([
        "--silent",
        "--show-error",
        "--fail",
        "--location",
        "--max-time",
        "60",
        "--output",
    ])
    .arg(&key)
    .arg(format!("{}Release.key", kubernetes_repository()));
    run_tool(curl, "curl (the pkgs.k8s.io signing key)", "")?;
    let list = sources.join("kubernetes.sources");
    std::fs::write(
        &list,
        format!(
            "Types: deb\nURIs: {}\nSuites: /\nSigned-By: /etc/apt/keyrings/kubernetes.asc\n",
            kubernetes_repository()
        ),
    )
    .map_err(io_err("write", &list))?;
    Ok(tree)
}

/// The kubeadm package version in mkosi's JSON manifest.
fn kubeadm_version_from_manifest(manifest: &Path) -> Result<String, RootfsError> {
    let text = std::fs::read_to_string(manifest).map_err(io_err("read", manifest))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| RootfsError::Io {
        action: "parse",
        path: manifest.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    json["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "kubeadm"))
        .and_then(|p| p["version"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| RootfsError::ToolOutput {
            tool: "mkosi",
            what: "kubeadm package in its manifest",
            output: tail(&text, 10),
        })
}

/// Strips ANSI colour sequences.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs mkosi, streaming its phases to `progress`; returns the tree.
fn run_mkosi(
    opts: &RootfsOptions,
    extra_package_manager_tree: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, RootfsError> {
    let mkosi = find_tool("mkosi", "mkosi (bookworm-backports)")?;
    let package_cache = opts.cache_dir.join("mkosi");
    std::fs::create_dir_all(&package_cache).map_err(io_err("create directory", &package_cache))?;
    // mkosi's scratch space: never inside the source tree (mkosi refuses that, and an output
    // directory under `target/` is), and off tmpfs (the tree is hundreds of MiB).
    let scratch = opts.cache_dir.join("mkosi-workspace");
    std::fs::create_dir_all(&scratch).map_err(io_err("create directory", &scratch))?;
    let mut cmd = Command::new(&mkosi);
    cmd.current_dir(&opts.workspace)
        .arg("--directory")
        .arg(&opts.workspace)
        .arg("--force")
        .arg(format!("--source-date-epoch={}", opts.source_date_epoch))
        .arg(format!("--output-dir={}", opts.out_dir.display()))
        .arg(format!("--workspace-dir={}", scratch.display()))
        .arg(format!("--package-cache-dir={}", package_cache.display()));
    if let Some(tree) = extra_package_manager_tree {
        cmd.arg(format!("--package-manager-tree={}", tree.display()))
            .arg(format!("--package={}", KUBERNETES_PACKAGES.join(",")));
    }
    cmd.arg("build")
        .env("PATH", TOOL_PATH)
        .env("PYTHONUNBUFFERED", "1")
        .env("SOURCE_DATE_EPOCH", opts.source_date_epoch.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    progress(&format!(
        "rootfs: mkosi build (Debian bookworm, package cache {})",
        package_cache.display()
    ));
    tracing::info!(workspace = %opts.workspace.display(), "running mkosi");
    let mut child = cmd.spawn().map_err(|source| RootfsError::Spawn {
        tool: "mkosi".into(),
        source,
    })?;

    // Both streams into one channel, read on this thread (progress is not Send).
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    let streams: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ];
    for stream in streams.into_iter().flatten() {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);

    const HEARTBEAT: Duration = Duration::from_secs(10);
    let mut recent: VecDeque<String> = VecDeque::with_capacity(40);
    let mut last_said = Instant::now();
    let mut packages = 0usize;
    loop {
        match rx.recv_timeout(HEARTBEAT) {
            Ok(line) => {
                let line = plain(&line);
                if line.starts_with("Unpacking ") {
                    packages += 1;
                }
                let trimmed = line.trim();
                if let Some(phase) = trimmed.strip_prefix('‣') {
                    progress(&format!("rootfs: mkosi: {}", phase.trim()));
                    last_said = Instant::now();
                } else if last_said.elapsed() >= HEARTBEAT && !trimmed.is_empty() {
                    progress(&format!(
                        "rootfs: mkosi: … {trimmed} ({packages} packages unpacked)"
                    ));
                    last_said = Instant::now();
                }
                if recent.len() == 40 {
                    recent.pop_front();
                }
                recent.push_back(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                progress("rootfs: mkosi: … still working");
                last_said = Instant::now();
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child.wait().map_err(|source| RootfsError::Spawn {
        tool: "mkosi".into(),
        source,
    })?;
    if !status.success() {
        return Err(RootfsError::ToolFailed {
            tool: format!("mkosi (in {})", opts.workspace.display()),
            status: status.to_string(),
            output_tail: Vec::from(recent).join("\n"),
            hint: "mkosi needs root (or user namespaces), network access to deb.debian.org, and \
                   its dependencies from bookworm-backports: run scripts/setup-host"
                .into(),
        });
    }
    let tree = opts.out_dir.join(TREE_DIR);
    if !tree.join("usr").is_dir() {
        return Err(RootfsError::NoTree { path: tree });
    }
    Ok(tree)
}

/// The text of `/usr/share/hawser/STAND-IN`. It carries no build-time detail (such as the probe's
/// error), so it is the same in every offline build.
pub fn standin_marker_text() -> String {
    format!(
        "This image carries hawser STAND-INS, NOT Kubernetes.\n\
         \n\
         Substituted:\n\
         \x20 /usr/bin/kubeadm  hawser-standin's kubeadm: checks kubeadm v1beta4 configurations, writes a\n\
         \x20                   stand-in CA and kubeconfigs, starts no control plane\n\
         \x20 /usr/bin/kubelet  hawser-standin's kubelet: checks its flags, runs no pods\n\
         Not installed: {}.\n\
         \n\
         Why: the Kubernetes package repository {} could not be reached when this\n\
         image was built.\n",
        KUBERNETES_PACKAGES
            .iter()
            .filter(|p| !matches!(**p, "kubeadm" | "kubelet"))
            .copied()
            .collect::<Vec<_>>()
            .join(", "),
        kubernetes_repository()
    )
}

/// Copies the stand-ins to `/usr/bin` of `tree` and writes the marker, all timestamped `epoch`.
pub fn install_standins(tree: &Path, bin_dir: &Path, epoch: u64) -> Result<(), RootfsError> {
    let usr_bin = tree.join("usr/bin");
    let marker = tree.join(STANDIN_MARKER);
    let marker_dir = tree.join("usr/share/hawser");
    std::fs::create_dir_all(&marker_dir).map_err(io_err("create directory", &marker_dir))?;
    let mut installed = vec![
        (usr_bin.clone(), None),
        (tree.join("usr/share"), None),
        (marker_dir, Some(0o755)),
    ];
    for name in ["kubeadm", "kubelet"] {
        let from = bin_dir.join(name);
        if !from.is_file() {
            return Err(RootfsError::StandInsMissing {
                path: bin_dir.to_owned(),
            });
        }
        let to = usr_bin.join(name);
        std::fs::copy(&from, &to).map_err(io_err("copy a stand-in to", &to))?;
        installed.push((to, Some(0o755)));
    }
    std::fs::write(&marker, standin_marker_text()).map_err(io_err("write", &marker))?;
    installed.push((marker, Some(0o644)));
    set_modes_and_epoch(installed, epoch)
}

/// The join service binary in the rootfs: PID 1 runs it on a cluster's first control-plane
/// node so that later nodes can join (and attest it).
pub const JOIND_PATH: &str = "usr/bin/hawser-joind";

/// Installs `hawser-joind` from `bin_dir` (built by [`compile_rootfs_binaries`]) as
/// [`JOIND_PATH`].
pub fn install_joind(tree: &Path, bin_dir: &Path, epoch: u64) -> Result<(), RootfsError> {
    let from = bin_dir.join("hawser-joind");
    let to = tree.join(JOIND_PATH);
    std::fs::copy(&from, &to).map_err(io_err("copy hawser-joind to", &to))?;
    set_modes_and_epoch(vec![(to, Some(0o755)), (tree.join("usr/bin"), None)], epoch)
}

/// Sets each path's mode (if given) and its mtime to `epoch`.
fn set_modes_and_epoch(paths: Vec<(PathBuf, Option<u32>)>, epoch: u64) -> Result<(), RootfsError> {
    let epoch_time = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch);
    for (path, mode) in paths {
        if let Some(mode) = mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(io_err("set permissions of", &path))?;
        }
        std::fs::File::open(&path)
            .and_then(|f| f.set_modified(epoch_time))
            .map_err(io_err("set the mtime of", &path))?;
    }
    Ok(())
}

/// What [`image_tree`] made.
#[derive(Debug, Clone)]
pub struct TreeImages {
    pub erofs: PathBuf,
    pub verity: PathBuf,
    pub root_hash: [u8; 32],
    pub verity_salt: [u8; 32],
    pub data_blocks: u64,
    pub erofs_bytes: u64,
    pub verity_bytes: u64,
    /// sha256 over the normalised tree (see [`normalize_tree`]).
    pub tree_digest: [u8; 32],
    pub timings: Vec<(String, Duration)>,
}

/// Normalises `tree`, then makes `rootfs.erofs`, `rootfs.verity` and `rootfs.roothash` in
/// `out_dir` and checks the hash tree with `veritysetup verify`.
pub fn image_tree(
    tree: &Path,
    out_dir: &Path,
    epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<TreeImages, RootfsError> {
    let mkfs = find_tool("mkfs.erofs", "erofs-utils")?;
    let veritysetup = find_tool("veritysetup", "cryptsetup-bin")?;
    let mut timings = Vec::new();

    let t = Instant::now();
    progress(&format!("rootfs: normalising {}", tree.display()));
    let tree_digest = normalize_tree(tree, epoch)?;
    timings.push(("normalise tree".to_owned(), t.elapsed()));

    let t = Instant::now();
    let erofs = out_dir.join(EROFS_FILE);
    let uuid = derived_uuid("hawser rootfs erofs uuid v1", &tree_digest);
    progress(&format!("rootfs: mkfs.erofs -zlz4hc (UUID {uuid})"));
    remove_if_exists(&erofs)?;
    let mut cmd = Command::new(&mkfs);
    cmd.arg("--quiet")
        .arg("-zlz4hc")
        .arg(format!("-T{epoch}"))
        .arg(format!("-U{uuid}"))
        .arg(&erofs)
        .arg(tree);
    run_tool(
        cmd,
        "mkfs.erofs",
        "mkfs.erofs comes with erofs-utils: run scripts/setup-host",
    )?;
    let erofs_bytes = std::fs::metadata(&erofs)
        .map_err(io_err("stat", &erofs))?
        .len();
    if erofs_bytes % BLOCK_SIZE != 0 || erofs_bytes == 0 {
        return Err(RootfsError::UnalignedImage {
            path: erofs,
            bytes: erofs_bytes,
        });
    }
    let erofs_sha256 = sha256_file(&erofs)?;
    timings.push(("mkfs.erofs".to_owned(), t.elapsed()));

    let t = Instant::now();
    let verity = out_dir.join(VERITY_FILE);
    let salt: [u8; 32] = Sha256::new()
        .chain_update(b"hawser rootfs verity salt v1\0")
        .chain_update(erofs_sha256)
        .finalize()
        .into();
    let verity_uuid = derived_uuid("hawser rootfs verity uuid v1", &erofs_sha256);
    progress(&format!(
        "rootfs: veritysetup format ({}, {BLOCK_SIZE}/{BLOCK_SIZE})",
        verity::HASH_ALGORITHM
    ));
    remove_if_exists(&verity)?;
    let mut cmd = Command::new(&veritysetup);
    cmd.arg("format")
        .arg(format!("--salt={}", hex::encode(salt)))
        .arg(format!("--uuid={verity_uuid}"))
        .arg(format!("--hash={}", verity::HASH_ALGORITHM))
        .arg(format!("--data-block-size={BLOCK_SIZE}"))
        .arg(format!("--hash-block-size={BLOCK_SIZE}"))
        .arg(&erofs)
        .arg(&verity);
    let out = run_tool(
        cmd,
        "veritysetup format",
        "veritysetup comes with cryptsetup-bin: run scripts/setup-host",
    )?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let root_hash = parse_root_hash(&text)?;
    let data_blocks = parse_field(&text, "Data blocks")
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| RootfsError::ToolOutput {
            tool: "veritysetup format",
            what: "Data blocks line",
            output: text.clone(),
        })?;
    if data_blocks != erofs_bytes / BLOCK_SIZE {
        return Err(RootfsError::ToolOutput {
            tool: "veritysetup format",
            what: "data block count matching the erofs image",
            output: text,
        });
    }
    // veritysetup creates the hash file 0600; it is public data.
    std::fs::set_permissions(&verity, std::fs::Permissions::from_mode(0o644))
        .map_err(io_err("set permissions of", &verity))?;
    let verity_bytes = std::fs::metadata(&verity)
        .map_err(io_err("stat", &verity))?
        .len();
    timings.push(("veritysetup format".to_owned(), t.elapsed()));

    let t = Instant::now();
    progress(&format!(
        "rootfs: veritysetup verify (root hash {})",
        hex::encode(root_hash)
    ));
    verify_verity(&erofs, &verity, &root_hash)?;
    timings.push(("veritysetup verify".to_owned(), t.elapsed()));

    let roothash_file = out_dir.join(ROOTHASH_FILE);
    std::fs::write(&roothash_file, format!("{}\n", hex::encode(root_hash)))
        .map_err(io_err("write", &roothash_file))?;
    progress(&format!(
        "rootfs: {} ({} MiB), {} ({} KiB), {}",
        erofs.display(),
        erofs_bytes / (1 << 20),
        verity.display(),
        verity_bytes / 1024,
        root_hash_cmdline_arg(&root_hash)
    ));
    Ok(TreeImages {
        erofs,
        verity,
        root_hash,
        verity_salt: salt,
        data_blocks,
        erofs_bytes,
        verity_bytes,
        tree_digest,
        timings,
    })
}

/// `veritysetup verify`: recomputes the hash tree of `data` against `root_hash` (no
/// device-mapper needed).
pub fn verify_verity(data: &Path, hash: &Path, root_hash: &[u8; 32]) -> Result<(), RootfsError> {
    let veritysetup = find_tool("veritysetup", "cryptsetup-bin")?;
    let mut cmd = Command::new(veritysetup);
    cmd.arg("verify")
        .arg(data)
        .arg(hash)
        .arg(hex::encode(root_hash));
    run_tool(
        cmd,
        "veritysetup verify",
        "the hash tree does not match the image: rebuild both",
    )
    .map(|_| ())
}

fn parse_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == name).then(|| value.trim())
    })
}

fn parse_root_hash(text: &str) -> Result<[u8; 32], RootfsError> {
    parse_field(text, "Root hash")
        .and_then(|h| hex::decode(h).ok())
        .and_then(|h| <[u8; 32]>::try_from(h).ok())
        .ok_or_else(|| RootfsError::ToolOutput {
            tool: "veritysetup format",
            what: "Root hash line",
            output: text.to_owned(),
        })
}

fn remove_if_exists(path: &Path) -> Result<(), RootfsError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

fn sha256_file(path: &Path) -> Result<[u8; 32], RootfsError> {
    let mut file = std::fs::File::open(path).map_err(io_err("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

/// Clamps every regular file's and directory's mtime to `epoch` (what mkosi does; files added
/// after it get the same) and returns a sha256 over the tree as erofs will store it: for each
/// entry in byte-sorted path order, its path, type, mode, owner, size, device number, link
/// target and content digest. Timestamps are left out: `mkfs.erofs -T` replaces them all.
pub fn normalize_tree(tree: &Path, epoch: u64) -> Result<[u8; 32], RootfsError> {
    let epoch_time = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch);
    let mut digest = Sha256::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = tree.join(&rel);
        let meta = std::fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
        let kind = meta.file_type();
        digest.update(rel.as_os_str().as_encoded_bytes());
        digest.update([0u8]);
        digest.update(
            format!(
                "{:o} {}:{} {} {} {}\0",
                meta.mode(),
                meta.uid(),
                meta.gid(),
                meta.size(),
                meta.rdev(),
                meta.nlink()
            )
            .as_bytes(),
        );
        // Symlinks keep their (mkosi-clamped) time: std cannot set a link's own mtime, and
        // erofs ignores it anyway.
        if (kind.is_file() || kind.is_dir())
            && meta.mtime() > i64::try_from(epoch).unwrap_or(i64::MAX)
        {
            let file = std::fs::File::open(&path).map_err(io_err("open", &path))?;
            file.set_modified(epoch_time)
                .map_err(io_err("set the mtime of", &path))?;
        }
        if kind.is_symlink() {
            let target = std::fs::read_link(&path).map_err(io_err("read the link", &path))?;
            digest.update(target.as_os_str().as_encoded_bytes());
        } else if kind.is_file() {
            digest.update(sha256_file(&path)?);
        } else if kind.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path)
                .map_err(io_err("list", &path))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<_, _>>()
                .map_err(io_err("list", &path))?;
            // Reverse byte order on the stack pops them in byte order.
            names.sort_by(|a, b| b.as_encoded_bytes().cmp(a.as_encoded_bytes()));
            stack.extend(names.into_iter().map(|n| rel.join(n)));
        }
        digest.update([0xffu8]);
    }
    Ok(digest.finalize().into())
}

/// Compiles the binaries hawser puts into the rootfs — `hawser-joind` and the stand-ins — as
/// the init binary is compiled (the `image` profile, build paths remapped), and returns the
/// directory holding `hawser-joind`, `kubeadm` and `kubelet`.
pub fn compile_rootfs_binaries(
    workspace: &Path,
    target_dir: Option<&Path>,
    source_date_epoch: u64,
) -> Result<PathBuf, RootfsError> {
    let target_dir = crate::compile::image_target_dir(workspace, target_dir);
    let status = crate::compile::image_cargo_build(
        workspace,
        &target_dir,
        "hawser-standin",
        source_date_epoch,
    )
    .args(["-p", "hawser-joinservice"])
    .status()
    .map_err(|source| RootfsError::Spawn {
        tool: "cargo".into(),
        source,
    })?;
    if !status.success() {
        return Err(RootfsError::ToolFailed {
            tool: "cargo build --locked --profile image -p hawser-standin -p hawser-joinservice"
                .into(),
            status: status.to_string(),
            output_tail: "(cargo's own output is above)".into(),
            hint: String::new(),
        });
    }
    Ok(target_dir.join("image"))
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

    #[test]
    fn veritysetup_output_is_parsed() {
        let text = "VERITY header information for x\nUUID:            \tab\nData blocks:     \t27704\n\
                    Root hash:      \t9337a72ea0a5722b068c71d3bb0da7ab65fd95abc173fa8dab8df5df077d9a1b\n";
        assert_eq!(parse_field(text, "Data blocks"), Some("27704"));
        assert_eq!(
            hex::encode(parse_root_hash(text).unwrap()),
            "9337a72ea0a5722b068c71d3bb0da7ab65fd95abc173fa8dab8df5df077d9a1b"
        );
        assert!(parse_root_hash("Root hash: 12").is_err());
    }

    #[test]
    fn ansi_sequences_are_stripped() {
        assert_eq!(plain("\u{1b}[1m‣ Installing\u{1b}[0m"), "‣ Installing");
    }
}
