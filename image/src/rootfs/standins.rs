//! hawser's own binaries in the rootfs: `hawser-joind`, PID 1's copies, and the kubeadm/kubelet
//! stand-ins of a `--kubernetes stand-in` build with the marker that says so.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{RootfsError, STANDIN_MARKER};
use crate::tool::{ToolError, io_error};

/// The text of `/usr/share/hawser/STAND-IN`: the same in every stand-in image.
pub fn standin_marker_text() -> String {
    "This image carries hawser STAND-INS, NOT Kubernetes.\n\
     \n\
     Substituted:\n\
     \x20 /usr/bin/kubeadm  hawser-standin's kubeadm: checks kubeadm v1beta4 configurations, writes a\n\
     \x20                   stand-in CA and kubeconfigs, starts no control plane\n\
     \x20 /usr/bin/kubelet  hawser-standin's kubelet: checks its flags, runs no pods\n\
     Not installed: the control-plane images, kube-proxy.\n\
     \n\
     Why: it was built with `--kubernetes stand-in`, for tests that need a node's boot to be fast;\n\
     an image for a cluster carries Kubernetes (`--kubernetes source` or `release`).\n"
        .to_owned()
}

/// Copies the stand-ins to `/usr/bin` of `tree` and writes the marker, all timestamped `epoch`.
pub fn install_standins(tree: &Path, bin_dir: &Path, epoch: u64) -> Result<(), RootfsError> {
    let usr_bin = tree.join("usr/bin");
    let marker = tree.join(STANDIN_MARKER);
    let marker_dir = tree.join("usr/share/hawser");
    std::fs::create_dir_all(&marker_dir).map_err(io_error("create directory", &marker_dir))?;
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
        std::fs::copy(&from, &to).map_err(io_error("copy a stand-in to", &to))?;
        installed.push((to, Some(0o755)));
    }
    std::fs::write(&marker, standin_marker_text()).map_err(io_error("write", &marker))?;
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
    std::fs::copy(&from, &to).map_err(io_error("copy hawser-joind to", &to))?;
    set_modes_and_epoch(vec![(to, Some(0o755)), (tree.join("usr/bin"), None)], epoch)
}

/// Copies PID 1's ELF files (`(path in the initramfs, file)`) under
/// [`hawser_disk_format::rootfs::PID1_COPIES`], byte for byte, mode 0755.
pub fn install_pid1_copies(
    tree: &Path,
    files: &[(String, PathBuf)],
    epoch: u64,
) -> Result<(), RootfsError> {
    let base = tree.join(hawser_disk_format::rootfs::PID1_COPIES);
    let files = files
        .iter()
        .map(|(dest, source)| {
            (
                base.join(dest.trim_start_matches('/')),
                Contents::CopyOf(source),
                0o755,
            )
        })
        .collect();
    install_files(tree, files, epoch)
}

/// Writes the kernel modules PID 1 loads after the pivot ([`crate::initramfs::module_files`]
/// of [`hawser_kmod::rootfs_modules`], Kubernetes' and the power button's: the modules, their
/// `modules.dep`, `modules.builtin`)
/// into `tree` at their paths (`usr/lib/modules/<kver>/…`), mode 0644, for PID 1 to load after
/// the pivot: the verified rootfs carries them, not the initramfs.
pub fn install_kernel_modules(
    tree: &Path,
    files: &[(String, Vec<u8>)],
    epoch: u64,
) -> Result<(), RootfsError> {
    let files = files
        .iter()
        .map(|(path, data)| (tree.join(path), Contents::Bytes(data), 0o644))
        .collect();
    install_files(tree, files, epoch)
}

/// What [`install_files`] writes at a path.
enum Contents<'a> {
    CopyOf(&'a Path),
    Bytes(&'a [u8]),
}

/// Writes each file at its path in `tree` with its mode, creating directories; every file and
/// directory made gets the epoch as its mtime.
fn install_files(
    tree: &Path,
    files: Vec<(PathBuf, Contents<'_>, u32)>,
    epoch: u64,
) -> Result<(), RootfsError> {
    let mut touched = Vec::new();
    for (to, contents, mode) in files {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io_error("create directory", parent))?;
        }
        match contents {
            Contents::CopyOf(source) => {
                std::fs::copy(source, &to).map_err(io_error("copy a PID 1 file to", &to))?;
            }
            Contents::Bytes(data) => {
                std::fs::write(&to, data).map_err(io_error("write", &to))?;
            }
        }
        touched.push((to, Some(mode)));
    }
    // Directories too: the tree's mtimes are all the epoch.
    let mut dirs: Vec<PathBuf> = touched
        .iter()
        .flat_map(|(path, _)| {
            path.ancestors()
                .skip(1)
                .map(Path::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|dir| dir.starts_with(tree) && dir != tree)
        .collect();
    dirs.sort();
    dirs.dedup();
    touched.extend(dirs.into_iter().rev().map(|dir| (dir, None)));
    set_modes_and_epoch(touched, epoch)
}

/// Sets each path's mode (if given) and its mtime to `epoch`.
pub(super) fn set_modes_and_epoch(
    paths: Vec<(PathBuf, Option<u32>)>,
    epoch: u64,
) -> Result<(), RootfsError> {
    let epoch_time = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch);
    for (path, mode) in paths {
        if let Some(mode) = mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(io_error("set permissions of", &path))?;
        }
        std::fs::File::open(&path)
            .and_then(|f| f.set_modified(epoch_time))
            .map_err(io_error("set the mtime of", &path))?;
    }
    Ok(())
}

/// Compiles every binary of the image ([`crate::compile::IMAGE_PACKAGES`]: PID 1,
/// `hawser-joind`, the stand-ins) in one cargo invocation, and returns the directory holding
/// them (`hawser-init`, `hawser-joind`, `kubeadm`, `kubelet`).
pub fn compile_rootfs_binaries(
    workspace: &Path,
    target_dir: Option<&Path>,
    source_date_epoch: u64,
) -> Result<PathBuf, RootfsError> {
    let target_dir = crate::compile::image_target_dir(workspace, target_dir);
    let status = crate::compile::image_cargo_build(workspace, &target_dir, source_date_epoch)
        .status()
        .map_err(|source| RootfsError::Step {
            step: "compiling the image's binaries",
            hint: "",
            source: ToolError::Spawn {
                tool: "cargo".into(),
                source,
            },
        })?;
    if !status.success() {
        return Err(RootfsError::Step {
            step: "compiling the image's binaries",
            hint: "",
            source: ToolError::Failed {
                command: crate::compile::image_cargo_command(),
                status,
                output_tail: "(cargo's own output is above)".into(),
            },
        });
    }
    Ok(target_dir.join("image"))
}
