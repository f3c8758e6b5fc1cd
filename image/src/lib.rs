//! hawser-image: builds the measured boot artifacts of a hawser node, deterministically.
//!
//! The UKI (systemd-stub + Linux + initramfs + cmdline) is what firmware and stub measure into
//! PCRs 4, 9 and 11, so a verifier can only predict those PCRs if the same inputs always give
//! the same bytes. Everything here is a pure function of its inputs and `SOURCE_DATE_EPOCH`:
//! no wall clock, no build-host paths, no host libraries, no host kernel modules.
//!
//! The pieces, in build order:
//! - [`inputs`]: the input lock (trixie packages pinned by version and sha256) and their fetch;
//! - [`closure`]: the init binary's shared-library closure, resolved in the unpacked packages;
//! - [`initramfs`]: the newc archive ([`cpio`]) with /init, its libraries, the kernel modules
//!   PID 1 loads, and the merged-/usr skeleton, zstd-compressed;
//! - [`uki`]: the PE assembly of the unified kernel image;
//! - [`build`](mod@build): the orchestration writing `hawser.efi`, `initrd.cpio.zst`, `vmlinuz`, `cmdline`
//!   and `manifest.json`;
//! - [`pipeline`]: fetch + compile PID 1 + build, as the CLI runs it ([`compile`]: the
//!   reproducible cargo builds of PID 1 and the rootfs's binaries);
//! - [`kubernetes`]: Kubernetes 1.20.2 built reproducibly from Debian's source as a pinned
//!   input (`kubernetes.lock`);
//! - [`profile`]: production or development, as the measured command line says it (the
//!   state disk's integrity);
//! - [`platform`]: the cloud or bare confidential VM an image is for (`--platform`): its
//!   measured command line and kernel modules, and the file it imports, which [`export`]
//!   writes from the raw disk (GCE's `disk.raw` tar.gz, Azure's fixed VHD).

pub mod build;
pub mod closure;
pub mod compile;
pub mod cpio;
pub mod disk;
pub mod export;
pub mod initramfs;
pub mod inputs;
pub mod kubernetes;
pub mod pipeline;
pub mod platform;
pub mod profile;
pub mod rootfs;
#[doc(hidden)]
pub mod test_support;
pub mod tool;
pub mod uki;

use std::path::PathBuf;

/// Finds a host tool in `PATH`, then in the sbin directories (mkfs.vfat and veritysetup live in
/// /usr/sbin, which an unprivileged user's `PATH` often lacks): an executable file, or `None`.
pub fn locate_tool(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

pub use build::{BuildInputs, BuildOutput, build, default_os_release};

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file or directory could not be read or written.
    #[error(transparent)]
    Io(#[from] tool::IoError),
    /// The initramfs archive refused an entry.
    #[error("assembling the initramfs failed")]
    Cpio(#[from] cpio::CpioError),
    /// The init binary's libraries could not be resolved in the library roots.
    #[error("resolving the init binary's shared libraries failed")]
    Closure(#[from] closure::ClosureError),
    /// The kernel modules PID 1 loads could not be resolved.
    #[error("resolving kernel modules in {modules_dir} failed")]
    Modules {
        modules_dir: PathBuf,
        #[source]
        source: hawser_kmod::KmodError,
    },
    /// zstd compression failed.
    #[error("compressing the initramfs with zstd failed")]
    Compress(#[source] std::io::Error),
    /// The UKI could not be assembled.
    #[error("assembling the UKI failed")]
    Uki(#[from] uki::UkiError),
    /// The build manifest could not be serialised as JSON.
    #[error("the build manifest cannot be serialised")]
    Manifest(#[source] serde_json::Error),
    /// The build inputs are inconsistent (the text says how).
    #[error("invalid build input: {0}")]
    InvalidInput(String),
}

impl ImageError {
    /// An I/O error on `path` while doing `action` ("read", "write", "create directory", …).
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| {
            ImageError::Io(tool::IoError {
                action,
                path,
                source,
            })
        }
    }
}
