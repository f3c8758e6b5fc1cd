//! Throwaway test initramfs archives: the image's own initramfs (its kernel and modules)
//! followed by a second archive of host tools, started with `rdinit=/<script>`. For test VMs
//! that run standard tools (cryptsetup, iproute2, wireguard-tools) against hawser's pieces;
//! never part of the product image, and nothing of hawser runs in them.
//!
//! The host's programs come with their host library closures, which replace the image's
//! libraries of the same names (nothing of the image runs). Kernel modules come from the
//! image's kernel package in the input cache, decompressed for busybox's `insmod`, in
//! dependency order; the init loads them after mounting /proc, /sys, /dev and /run, then runs
//! the test's script.

use std::path::{Path, PathBuf};

use hawser_image::closure;
use hawser_image::cpio::CpioArchive;

/// What every toolbox init runs first: busybox's shell as `$B`, the kernel's file systems
/// mounted, and the archive's kernel modules loaded.
const PRELUDE: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
$B mount -t tmpfs tmpfs /run
@LOAD_MODULES@
"#;

/// A test initramfs being put together.
pub struct Toolbox {
    archive: CpioArchive,
    load_modules: String,
    modules: usize,
}

impl Toolbox {
    /// An archive with a static busybox at `/bin/busybox`.
    pub fn new() -> Self {
        let mut toolbox = Toolbox {
            archive: CpioArchive::new(),
            load_modules: String::new(),
            modules: 0,
        };
        let busybox = std::fs::read("/bin/busybox")
            .expect("/bin/busybox: install busybox-static (scripts/setup-host)");
        toolbox.file("bin/busybox", 0o755, busybox);
        toolbox
    }

    /// Adds a file (parents are created).
    pub fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> &mut Self {
        self.archive
            .add_file(path, mode, data)
            .unwrap_or_else(|e| panic!("{path} in the test initramfs: {e}"));
        self
    }

    /// Adds the host program `path` (absolute) at the same place, with its library closure.
    /// `package` names what to install when it is missing.
    pub fn program(&mut self, path: &str, package: &str) -> &mut Self {
        let bytes = std::fs::read(path)
            .unwrap_or_else(|e| panic!("{path}: {e} (install {package}: scripts/setup-host)"));
        self.file(path.trim_start_matches('/'), 0o755, bytes);
        let libs = closure::resolve(Path::new(path), &[PathBuf::from("/")], &[])
            .unwrap_or_else(|e| panic!("the libraries of {path}: {e}"));
        for file in &libs.files {
            let bytes = std::fs::read(&file.source)
                .unwrap_or_else(|e| panic!("{}: {e}", file.source.display()));
            self.file(&file.dest, 0o755, bytes);
        }
        for link in &libs.symlinks {
            if self.archive.get(&link.dest).is_none() {
                self.archive
                    .add_symlink(&link.dest, &link.target)
                    .unwrap_or_else(|e| panic!("{} in the test initramfs: {e}", link.dest));
            }
        }
        self
    }

    /// Adds the kernel modules at `paths` (relative to `modules_dir`, in load order),
    /// decompressed, with a line each for `@LOAD_MODULES@`.
    pub fn modules(&mut self, modules_dir: &Path, paths: &[String]) -> &mut Self {
        for module in paths {
            // The image lists modules under the names it ships (`.ko`, decompressed); the
            // kernel package may hold them as `.ko` or `.ko.xz`.
            let plain = modules_dir.join(module);
            let path = if plain.exists() {
                plain
            } else {
                modules_dir.join(format!("{module}.xz"))
            };
            let bytes = hawser_kmod::read_module(&path).unwrap_or_else(|e| {
                panic!("module {module}: {e} (install the kernel's modules: scripts/setup-host)")
            });
            let name = format!("toolbox/modules/{:03}.ko", self.modules);
            self.modules += 1;
            self.file(&name, 0o644, bytes);
            self.load_modules.push_str(&format!(
                "/bin/busybox insmod /{name} || echo \"TOOLBOX insmod {module} failed\"\n"
            ));
        }
        self
    }

    /// Writes `base` (the image's initramfs) followed by this archive, with the prelude (mounts,
    /// modules) and then `script` at `/<init>`, to `dest`.
    pub fn write(&mut self, base: &Path, init: &str, script: &str, dest: &Path) -> PathBuf {
        let script = PRELUDE.replace("@LOAD_MODULES@", &self.load_modules) + script;
        self.file(init, 0o755, script.into_bytes());
        let mut initrd = std::fs::read(base).unwrap();
        initrd.resize(initrd.len().next_multiple_of(512), 0);
        initrd.extend(self.archive.to_bytes(0).unwrap());
        std::fs::write(dest, initrd).unwrap();
        dest.to_owned()
    }
}

/// `usr/lib/modules/<release>` of the image's kernel package in the input cache.
pub fn kernel_modules_dir(release: &str) -> PathBuf {
    std::fs::read_dir(hawser_image::inputs::cache_dir().join("inputs"))
        .expect("the input cache (hawser image fetch)")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("linux-image-")
        })
        .expect("kernel package in the input cache")
        .join("usr/lib/modules")
        .join(release)
}

/// The modules (paths relative to [`kernel_modules_dir`]) to load for `names`, dependencies
/// first, read from the modules themselves (a kernel package has no `modules.dep`).
pub fn module_load_order(modules_dir: &Path, names: &[&str]) -> Vec<String> {
    hawser_kmod::ModuleIndex::scan_modules_dir(modules_dir, names)
        .and_then(|index| index.load_order(names))
        .unwrap_or_else(|e| panic!("kernel modules {names:?}: {e}"))
}
