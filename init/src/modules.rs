//! Kernel module loading: `modules.dep` order, `finit_module(2)`, compressed modules.
//!
//! There is no udev and no modprobe in the initramfs: PID 1 loads a fixed list of modules
//! ([`hawser_kmod::BOOT_MODULES`]), dependencies first, from `/usr/lib/modules/<release>/`.
//! The image builder ships exactly the closure of that list, so a module that cannot be found
//! or loaded is an image defect and fatal. A module that is already loaded (EEXIST) is fine.

use std::io;
use std::path::{Path, PathBuf};

use hawser_kmod::{KmodError, ModuleIndex};

use crate::syscalls::Syscalls;

/// Where the running kernel's modules live (merged /usr: /lib is a symlink to /usr/lib).
pub fn modules_dir(kernel_release: &str) -> PathBuf {
    Path::new("/usr/lib/modules").join(kernel_release)
}

/// A module that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("cannot read {path}")]
    ReadIndex {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot resolve the kernel modules to load from {path}")]
    Resolve {
        path: PathBuf,
        #[source]
        source: KmodError,
    },
    #[error("kernel module {module} is missing: {path} does not exist")]
    Missing { module: String, path: PathBuf },
    #[error("cannot load kernel module {module} from {path}")]
    Load {
        module: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What happened to one module file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleOutcome {
    Loaded,
    AlreadyLoaded,
}

/// Reads `modules.dep` (and `modules.builtin` if present) from `dir`.
pub fn read_index(dir: &Path) -> Result<ModuleIndex, ModuleError> {
    let dep_path = dir.join("modules.dep");
    let dep = std::fs::read_to_string(&dep_path).map_err(|source| ModuleError::ReadIndex {
        path: dep_path.clone(),
        source,
    })?;
    let builtin_path = dir.join("modules.builtin");
    let builtin = match std::fs::read_to_string(&builtin_path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ModuleError::ReadIndex {
                path: builtin_path,
                source,
            });
        }
    };
    ModuleIndex::parse(&dep, builtin.as_deref()).map_err(|source| ModuleError::Resolve {
        path: dep_path,
        source,
    })
}

/// The module files to load for `names`, dependencies first, as absolute paths under `dir`.
pub fn plan(index: &ModuleIndex, dir: &Path, names: &[&str]) -> Result<Vec<PathBuf>, ModuleError> {
    let order = index
        .load_order(names)
        .map_err(|source| ModuleError::Resolve {
            path: dir.join("modules.dep"),
            source,
        })?;
    Ok(order.iter().map(|relative| dir.join(relative)).collect())
}

/// The module name of a module file path, for messages ("dm-crypt.ko.xz" → "dm_crypt").
pub fn module_name(path: &Path) -> String {
    hawser_kmod::normalize_name(&path.to_string_lossy())
}

/// Whether the kernel must decompress this file (`.ko.xz`, `.ko.zst`, `.ko.gz`).
pub fn is_compressed(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    !name.ends_with(".ko")
}

/// Loads `names` and their dependencies from the initramfs's modules of the running kernel;
/// returns how many were loaded or already there. Blocking (decompression).
pub fn load_named(sys: &dyn Syscalls, names: &[&str]) -> Result<usize, ModuleError> {
    let release = nix::sys::utsname::uname()
        .map(|uts| uts.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = modules_dir(&release);
    let index = read_index(&dir)?;
    let paths = plan(&index, &dir, names)?;
    Ok(load_all(sys, &paths)?.len())
}

/// Loads `paths` in order; stops at the first failure.
pub fn load_all(
    sys: &dyn Syscalls,
    paths: &[PathBuf],
) -> Result<Vec<(String, ModuleOutcome)>, ModuleError> {
    let mut outcomes = Vec::with_capacity(paths.len());
    for path in paths {
        let module = module_name(path);
        let outcome = match sys.load_module(path, is_compressed(path)) {
            Ok(()) => ModuleOutcome::Loaded,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => ModuleOutcome::AlreadyLoaded,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ModuleError::Missing {
                    module,
                    path: path.clone(),
                });
            }
            Err(source) => {
                return Err(ModuleError::Load {
                    module,
                    path: path.clone(),
                    source,
                });
            }
        };
        tracing::debug!(module = %module, ?outcome, "kernel module");
        outcomes.push((module, outcome));
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscalls::{Call, RecordingSyscalls};
    use nix::errno::Errno;

    const DEP: &str = "\
kernel/drivers/md/dm-crypt.ko.xz: kernel/drivers/md/dm-mod.ko.xz
kernel/drivers/md/dm-mod.ko.xz:
kernel/drivers/firmware/qemu_fw_cfg.ko.xz:
kernel/drivers/block/virtio_blk.ko:
";
    const BUILTIN: &str = "kernel/drivers/virtio/virtio.ko\n";

    fn dir() -> PathBuf {
        PathBuf::from("/usr/lib/modules/6.12.0-test")
    }

    fn loaded(sys: &RecordingSyscalls) -> Vec<(String, bool)> {
        sys.calls()
            .into_iter()
            .map(|call| match call {
                Call::LoadModule { path, compressed } => {
                    (path.to_string_lossy().into_owned(), compressed)
                }
                other => panic!("unexpected call {other:?}"),
            })
            .collect()
    }

    #[test]
    fn loads_dependencies_first_each_once_with_the_compressed_flag() {
        let index = ModuleIndex::parse(DEP, Some(BUILTIN)).unwrap();
        let paths = plan(
            &index,
            &dir(),
            &["dm_crypt", "dm-mod", "virtio_blk", "virtio"],
        )
        .unwrap();
        let sys = RecordingSyscalls::new();
        let outcomes = load_all(&sys, &paths).unwrap();
        assert_eq!(
            loaded(&sys),
            [
                (
                    "/usr/lib/modules/6.12.0-test/kernel/drivers/md/dm-mod.ko.xz".into(),
                    true
                ),
                (
                    "/usr/lib/modules/6.12.0-test/kernel/drivers/md/dm-crypt.ko.xz".into(),
                    true
                ),
                (
                    "/usr/lib/modules/6.12.0-test/kernel/drivers/block/virtio_blk.ko".into(),
                    false
                ),
            ]
        );
        let names: Vec<_> = outcomes.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["dm_mod", "dm_crypt", "virtio_blk"]);
    }

    #[test]
    fn already_loaded_is_fine() {
        let index = ModuleIndex::parse(DEP, None).unwrap();
        let paths = plan(&index, &dir(), &["dm_crypt"]).unwrap();
        let sys = RecordingSyscalls::new();
        sys.fail(
            Call::LoadModule {
                path: paths[0].clone(),
                compressed: true,
            },
            Errno::EEXIST,
        );
        let outcomes = load_all(&sys, &paths).unwrap();
        assert_eq!(
            outcomes,
            [
                ("dm_mod".to_owned(), ModuleOutcome::AlreadyLoaded),
                ("dm_crypt".to_owned(), ModuleOutcome::Loaded)
            ]
        );
    }

    #[test]
    fn a_missing_module_file_is_an_error_naming_the_module() {
        let index = ModuleIndex::parse(DEP, None).unwrap();
        let paths = plan(&index, &dir(), &["qemu_fw_cfg", "virtio_blk"]).unwrap();
        let sys = RecordingSyscalls::new();
        sys.fail(
            Call::LoadModule {
                path: paths[0].clone(),
                compressed: true,
            },
            Errno::ENOENT,
        );
        let err = load_all(&sys, &paths).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kernel module qemu_fw_cfg is missing: \
             /usr/lib/modules/6.12.0-test/kernel/drivers/firmware/qemu_fw_cfg.ko.xz does not exist"
        );
        // Nothing after the failure is attempted.
        assert_eq!(loaded(&sys).len(), 1);
    }

    #[test]
    fn a_failing_module_is_an_error_naming_it() {
        let index = ModuleIndex::parse(DEP, None).unwrap();
        let paths = plan(&index, &dir(), &["virtio_blk"]).unwrap();
        let sys = RecordingSyscalls::new();
        sys.fail(
            Call::LoadModule {
                path: paths[0].clone(),
                compressed: false,
            },
            Errno::ENOEXEC,
        );
        let err = load_all(&sys, &paths).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot load kernel module virtio_blk from /usr/lib/modules/"),
            "{err}"
        );
    }

    #[test]
    fn a_module_unknown_to_modules_dep_is_an_error_naming_it() {
        let index = ModuleIndex::parse(DEP, None).unwrap();
        let err = plan(&index, &dir(), &["wireguard"]).unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(chain.contains("wireguard"), "{chain}");
    }

    #[test]
    fn boot_modules_cover_what_pid1_relies_on() {
        // fw_cfg (quote nonce), virtio-rng (entropy), and the power button as an input device.
        for needed in ["qemu_fw_cfg", "virtio_rng", "button", "evdev"] {
            assert!(
                hawser_kmod::BOOT_MODULES.contains(&needed),
                "hawser_kmod::BOOT_MODULES lacks {needed}"
            );
        }
    }
}
