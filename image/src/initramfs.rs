//! The initramfs: PID 1, its libraries, the kernel modules it loads, and nothing else.
//!
//! Layout (merged /usr, as in trixie):
//!
//! ```text
//! bin -> usr/bin   sbin -> usr/sbin   lib -> usr/lib   lib64 -> usr/lib64
//! init                                   PID 1 (hawser-init)
//! usr/lib/x86_64-linux-gnu/…             its shared-library closure (closure.rs)
//! usr/sbin/mke2fs                        programs PID 1 runs (PROGRAMS), and their closures
//! usr/lib64/ld-linux-x86-64.so.2         -> ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
//! usr/lib/modules/<kver>/kernel/….ko     hawser_kmod::BOOT_MODULES (+ a platform's) + dependencies
//! usr/lib/modules/<kver>/modules.dep     of exactly the shipped modules (PID 1 reads it)
//! usr/lib/modules/<kver>/modules.builtin the kernel package's, unchanged
//! dev/console                            char 5:1, so fds 0-2 of PID 1 are the console
//! proc sys dev run tmp etc               empty mount points / directories
//! ```
//!
//! Modules are shipped decompressed: the package's `.ko.xz` become `.ko` (still signed; the
//! kernel checks the appended signature as before). The whole archive is zstd-compressed
//! anyway, so this costs ~0.03 MiB of initrd, and it spares the kernel an xz decompression per
//! module in `finit_module` at every boot (≈ 20 % of PID 1's module phase under TCG, see
//! docs/benchmarks.md). File modes are fixed by
//! kind (0755 for ELF files, 0644 for data) rather than copied from the unpacked packages, so
//! the archive does not depend on how the packages were unpacked. The archive is compressed
//! with zstd (the cloud kernel has `CONFIG_RD_ZSTD=y`) at level 19 in one thread, which is
//! deterministic for a given zstd version; the version is pinned by Cargo.lock.

use std::path::{Path, PathBuf};

use hawser_kmod::ModuleIndex;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::ImageError;
use crate::closure::{self, LibraryClosure};
use crate::cpio::{CpioArchive, Entry};

/// Libraries PID 1 `dlopen`s, which no `DT_NEEDED` names: none. (There was the tss2 device
/// TCTI, until the issuer spoke TPM 2.0 commands itself: PID 1 links libc and libgcc_s only.)
pub const DLOPENED_LIBRARIES: &[&str] = &[];

/// Programs PID 1 runs, as paths inside the package roots; each is installed at the same path
/// with its library closure. mke2fs creates the state disk's filesystem.
pub const PROGRAMS: &[&str] = &["usr/sbin/mke2fs"];

/// zstd level of the initramfs: the smallest output the kernel still decompresses quickly.
pub const ZSTD_LEVEL: i32 = 19;

/// Where kernel modules live in the image (also reachable as /lib/modules).
pub const MODULES_ROOT: &str = "usr/lib/modules";

/// What goes into the initramfs.
#[derive(Debug, Clone)]
pub struct InitramfsSpec {
    /// The PID 1 executable, installed as /init.
    pub init_binary: PathBuf,
    /// Unpacked package trees the library closure is resolved in, in search order.
    pub lib_roots: Vec<PathBuf>,
    /// Sonames loaded with dlopen, resolved like DT_NEEDED.
    pub dlopened: Vec<String>,
    /// Programs (paths relative to a root in `lib_roots`) installed at the same path, with
    /// their libraries.
    pub programs: Vec<String>,
    /// The kernel package's modules directory (`usr/lib/modules/<kver>`).
    pub modules_dir: PathBuf,
    /// `uname -r` of the kernel: the directory name under /usr/lib/modules.
    pub kernel_release: String,
    /// Modules PID 1 loads; their dependencies are added.
    pub modules: Vec<String>,
    /// Modification time of every entry.
    pub source_date_epoch: u64,
    /// Extra configuration files (path in the archive, contents), mode 0644 — e.g. the provider
    /// CA PID 1 verifies an attested join service with ([`PROVIDER_CA_PATH`]).
    pub files: Vec<(String, Vec<u8>)>,
}

/// Where the image carries the PEM of the CA(s) that certify attestation keys, for PID 1 to
/// verify an attesting join service (`hawser.join_service_trust=attested`).
pub const PROVIDER_CA_PATH: &str = "etc/hawser/provider-ca.pem";

impl InitramfsSpec {
    /// The spec for hawser's PID 1: [`DLOPENED_LIBRARIES`], [`PROGRAMS`],
    /// [`hawser_kmod::BOOT_MODULES`]. [`hawser_kmod::KUBERNETES_MODULES`] are not in it: only
    /// a node with a rootfs runs Kubernetes, and PID 1 loads them from the verified rootfs
    /// after the pivot ([`module_files`], `rootfs::install_kernel_modules`).
    pub fn for_hawser(
        init_binary: &Path,
        lib_roots: &[PathBuf],
        modules_dir: &Path,
        kernel_release: &str,
        source_date_epoch: u64,
    ) -> Self {
        Self {
            init_binary: init_binary.to_owned(),
            lib_roots: lib_roots.to_vec(),
            dlopened: DLOPENED_LIBRARIES.iter().map(|s| (*s).to_owned()).collect(),
            programs: PROGRAMS.iter().map(|s| (*s).to_owned()).collect(),
            modules_dir: modules_dir.to_owned(),
            kernel_release: kernel_release.to_owned(),
            modules: hawser_kmod::BOOT_MODULES
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            source_date_epoch,
            files: Vec::new(),
        }
    }
}

/// One entry of the initramfs, as listed in the build manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestEntry {
    pub path: String,
    /// "directory", "regular file", "symlink" or "character device".
    pub kind: String,
    /// Permission bits in octal ("0755"); symlinks have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Bytes of content (a symlink's target length).
    pub size: u64,
    /// sha256 of the content, for regular files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Symlink target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// "major:minor" of a device node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// The built initramfs.
#[derive(Debug, Clone)]
pub struct Initramfs {
    /// The zstd-compressed newc archive: what goes into the UKI's `.initrd`.
    pub compressed: Vec<u8>,
    /// Size of the archive before compression.
    pub uncompressed_size: u64,
    /// Every entry, sorted by path.
    pub manifest: Vec<ManifestEntry>,
    /// Module paths (relative to the modules directory) in load order.
    pub modules: Vec<String>,
    /// The resolved library closure.
    pub closure: LibraryClosure,
}

/// PID 1's own ELF files as the initramfs holds them: `init` and its library closure
/// (including [`DLOPENED_LIBRARIES`]), as (path in the initramfs, file). The node image puts
/// copies of exactly these into the verified rootfs (`hawser_disk_format::rootfs::PID1_COPIES`).
pub fn pid1_elf_files(
    init_binary: &Path,
    lib_roots: &[PathBuf],
) -> Result<Vec<(String, PathBuf)>, ImageError> {
    let closure = closure::resolve(init_binary, lib_roots, DLOPENED_LIBRARIES)?;
    Ok(std::iter::once(("init".to_owned(), init_binary.to_owned()))
        .chain(
            closure
                .files
                .into_iter()
                .map(|file| (file.dest, file.source)),
        )
        .collect())
}

/// Builds and compresses the initramfs described by `spec`.
pub fn build_initramfs(spec: &InitramfsSpec) -> Result<Initramfs, ImageError> {
    let (archive, closure, modules) = assemble(spec)?;
    let cpio = archive.to_bytes(spec.source_date_epoch)?;
    let compressed = compress(&cpio)?;
    Ok(Initramfs {
        uncompressed_size: cpio.len() as u64,
        compressed,
        manifest: manifest(&archive),
        modules,
        closure,
    })
}

/// Builds the uncompressed archive; also returns the closure and the module load order.
pub fn assemble(
    spec: &InitramfsSpec,
) -> Result<(CpioArchive, LibraryClosure, Vec<String>), ImageError> {
    let mut archive = CpioArchive::new();
    add_skeleton(&mut archive)?;

    tracing::info!(init = %spec.init_binary.display(), "adding /init");
    let init = read(&spec.init_binary)?;
    archive.add_file("init", 0o755, init)?;

    let dlopened: Vec<&str> = spec.dlopened.iter().map(String::as_str).collect();
    let closure = closure::resolve(&spec.init_binary, &spec.lib_roots, &dlopened)?;
    tracing::info!(
        files = closure.files.len(),
        symlinks = closure.symlinks.len(),
        "resolved the init binary's library closure"
    );
    for file in &closure.files {
        archive.add_file(&file.dest, 0o755, read(&file.source)?)?;
    }
    for link in &closure.symlinks {
        archive.add_symlink(&link.dest, &link.target)?;
    }

    for program in &spec.programs {
        add_program(&mut archive, spec, program)?;
    }

    for (path, data) in &spec.files {
        archive.add_file(path, 0o644, data.clone())?;
    }

    let modules = add_modules(&mut archive, spec)?;
    Ok((archive, closure, modules))
}

/// Adds `program` from the first root that has it, at the same path, and its library closure
/// (libraries shared with /init are the same files and are stored once).
fn add_program(
    archive: &mut CpioArchive,
    spec: &InitramfsSpec,
    program: &str,
) -> Result<(), ImageError> {
    let source = spec
        .lib_roots
        .iter()
        .map(|root| root.join(program))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            ImageError::InvalidInput(format!(
                "program {program} is in none of the {} package roots",
                spec.lib_roots.len()
            ))
        })?;
    tracing::info!(program, source = %source.display(), "adding a program");
    archive.add_file(program, 0o755, read(&source)?)?;
    let closure = closure::resolve(&source, &spec.lib_roots, &[])?;
    for file in &closure.files {
        archive.add_file(&file.dest, 0o755, read(&file.source)?)?;
    }
    for link in &closure.symlinks {
        archive.add_symlink(&link.dest, &link.target)?;
    }
    Ok(())
}

/// The merged-/usr skeleton, mount points and /dev/console.
fn add_skeleton(archive: &mut CpioArchive) -> Result<(), ImageError> {
    for dir in [
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "dev",
        "run",
        "etc",
    ] {
        archive.add_dir(dir, 0o755)?;
    }
    archive.add_dir("proc", 0o555)?;
    archive.add_dir("sys", 0o555)?;
    archive.add_dir("tmp", 0o1777)?;
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        archive.add_symlink(link, target)?;
    }
    archive.add_char_device("dev/console", 0o600, 5, 1)?;
    Ok(())
}

/// Adds the modules of `spec.modules` and their dependencies, a `modules.dep` of exactly those
/// and the package's `modules.builtin`; returns the load order.
fn add_modules(archive: &mut CpioArchive, spec: &InitramfsSpec) -> Result<Vec<String>, ImageError> {
    let names: Vec<&str> = spec.modules.iter().map(String::as_str).collect();
    let modules = module_files(&spec.modules_dir, &spec.kernel_release, &names)?;
    for (path, data) in modules.files {
        archive.add_file(&path, 0o644, data)?;
    }
    Ok(modules.order)
}

/// The files of a module directory holding `names` and their dependencies.
#[derive(Debug, Clone)]
pub struct ModuleFiles {
    /// (path under the root, e.g. `usr/lib/modules/<kver>/kernel/…/x.ko`, contents): every
    /// module decompressed (still signed), a `modules.dep` of exactly those, and the package's
    /// `modules.builtin`.
    pub files: Vec<(String, Vec<u8>)>,
    /// The load order, as paths relative to the module directory.
    pub order: Vec<String>,
}

/// [`ModuleFiles`] of `names` from the kernel package's `modules_dir`, under
/// `usr/lib/modules/<kernel_release>`: what the initramfs carries for PID 1's own modules, and
/// the rootfs for Kubernetes'.
pub fn module_files(
    dir: &Path,
    kernel_release: &str,
    names: &[&str],
) -> Result<ModuleFiles, ImageError> {
    let modules_error = |source| ImageError::Modules {
        modules_dir: dir.to_owned(),
        source,
    };
    // An installed kernel has modules.dep; a kernel package (never installed) does not, and
    // the dependencies are read from the modules' own .modinfo instead.
    let dep_path = dir.join("modules.dep");
    let builtin_path = dir.join("modules.builtin");
    let builtin = read_text(&builtin_path)?;
    let index = if dep_path.is_file() {
        ModuleIndex::parse(&read_text(&dep_path)?, Some(&builtin)).map_err(modules_error)?
    } else {
        ModuleIndex::scan_modules_dir(dir, names).map_err(modules_error)?
    };
    let order = index.load_order(names).map_err(modules_error)?;
    tracing::info!(
        requested = names.len(),
        shipped = order.len(),
        "resolved kernel modules"
    );

    let base = format!("{MODULES_ROOT}/{kernel_release}");
    let mut files = Vec::with_capacity(order.len() + 2);
    for module in &order {
        let elf = hawser_kmod::read_module(&dir.join(module)).map_err(modules_error)?;
        let shipped = hawser_kmod::decompressed_path(module);
        files.push((format!("{base}/{shipped}"), elf));
    }
    files.push((
        format!("{base}/modules.dep"),
        index
            .render_subset_as(&order, hawser_kmod::decompressed_path)
            .into_bytes(),
    ));
    files.push((format!("{base}/modules.builtin"), builtin.into_bytes()));
    let order = order
        .iter()
        .map(|module| hawser_kmod::decompressed_path(module).to_owned())
        .collect();
    Ok(ModuleFiles { files, order })
}

/// zstd at [`ZSTD_LEVEL`], one thread, with the content size and a content checksum in the
/// frame header (no timestamps exist in the zstd format).
pub fn compress(data: &[u8]) -> Result<Vec<u8>, ImageError> {
    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(ImageError::Compress)?;
    compressor
        .include_checksum(true)
        .map_err(ImageError::Compress)?;
    compressor
        .include_contentsize(true)
        .map_err(ImageError::Compress)?;
    compressor.compress(data).map_err(ImageError::Compress)
}

/// The manifest of every entry, in archive order.
pub fn manifest(archive: &CpioArchive) -> Vec<ManifestEntry> {
    archive
        .entries()
        .map(|(path, entry)| {
            let mut item = ManifestEntry {
                path: path.to_owned(),
                kind: entry.kind().to_string(),
                mode: None,
                size: entry.data().len() as u64,
                sha256: None,
                target: None,
                device: None,
            };
            match entry {
                Entry::Directory { mode } => item.mode = Some(format!("{mode:04o}")),
                Entry::File { mode, data } => {
                    item.mode = Some(format!("{mode:04o}"));
                    item.sha256 = Some(hex::encode(Sha256::digest(data)));
                }
                Entry::Symlink { target } => item.target = Some(target.clone()),
                Entry::CharDevice { mode, major, minor } => {
                    item.mode = Some(format!("{mode:04o}"));
                    item.device = Some(format!("{major}:{minor}"));
                }
            }
            item
        })
        .collect()
}

fn read(path: &Path) -> Result<Vec<u8>, ImageError> {
    std::fs::read(path).map_err(ImageError::io("read", path))
}

fn read_text(path: &Path) -> Result<String, ImageError> {
    std::fs::read_to_string(path).map_err(ImageError::io("read", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skeleton_has_merged_usr_and_console() {
        let mut archive = CpioArchive::new();
        add_skeleton(&mut archive).unwrap();
        assert_eq!(
            archive.get("lib"),
            Some(&Entry::Symlink {
                target: "usr/lib".into()
            })
        );
        assert_eq!(
            archive.get("lib64"),
            Some(&Entry::Symlink {
                target: "usr/lib64".into()
            })
        );
        assert_eq!(
            archive.get("dev/console"),
            Some(&Entry::CharDevice {
                mode: 0o600,
                major: 5,
                minor: 1
            })
        );
        assert_eq!(archive.get("tmp"), Some(&Entry::Directory { mode: 0o1777 }));
        for dir in ["proc", "sys", "dev", "run", "etc", "usr/lib64"] {
            assert!(
                matches!(archive.get(dir), Some(Entry::Directory { .. })),
                "{dir}"
            );
        }
    }

    #[test]
    fn compression_is_deterministic_and_round_trips() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let a = compress(&data).unwrap();
        let b = compress(&data).unwrap();
        assert_eq!(a, b);
        assert!(a.len() < data.len() / 10);
        // Frame header: magic, and the checksum flag (bit 2 of the descriptor) is set.
        assert_eq!(&a[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
        assert_ne!(a[4] & 0b100, 0);
        assert_eq!(zstd::decode_all(a.as_slice()).unwrap(), data);
    }

    #[test]
    fn manifest_lists_hashes_targets_and_devices() {
        let mut archive = CpioArchive::new();
        add_skeleton(&mut archive).unwrap();
        archive.add_file("init", 0o755, b"abc".to_vec()).unwrap();
        let manifest = manifest(&archive);
        let init = manifest.iter().find(|e| e.path == "init").unwrap();
        assert_eq!(
            init.sha256.as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert_eq!(init.size, 3);
        assert_eq!(init.mode.as_deref(), Some("0755"));
        let console = manifest.iter().find(|e| e.path == "dev/console").unwrap();
        assert_eq!(console.device.as_deref(), Some("5:1"));
        let lib = manifest.iter().find(|e| e.path == "lib").unwrap();
        assert_eq!(lib.target.as_deref(), Some("usr/lib"));
        assert_eq!(lib.kind, "symlink");
        let paths: Vec<&str> = manifest.iter().map(|e| e.path.as_str()).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
    }
}
