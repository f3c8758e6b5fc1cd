//! The input lock: every external input of the image, pinned by version and sha256.
//!
//! The image's content comes from Debian 13 "trixie" packages (kernel, systemd-stub, and the
//! shared libraries PID 1 runs against). One more package is pinned beside them, not built into
//! the image: trixie's `systemd-ukify`, the ukify of the same systemd as the stub, which the UKI
//! tests compare hawser's assembly with byte for byte (bookworm has no ukify, and backports'
//! systemd 254 none of the 257 layout rules). They are fetched as `.deb` files into a cache and
//! unpacked there, never installed on the build host. `inputs.lock` at the repository root names
//! each package's version, archive URL and sha256, so anyone can rebuild the image from the same
//! bytes; the sha256 in the lock is the trust anchor for each download.
//!
//! `hawser image lock` re-resolves the packages against the archive (with a private apt
//! configuration under the cache, signed by the host's `debian-archive-keyring`) and rewrites the
//! lock. `hawser image fetch` downloads and unpacks exactly what the lock says and refuses any
//! file whose sha256 differs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::tool::{IoError, ToolError};

mod apt;
mod fetch;

pub use apt::resolve_lock;
pub(crate) use apt::{PrivateApt, parse_print_uris};
pub use fetch::{FetchedInputs, UKIFY, cached, fetch, fetch_package};
pub(crate) use fetch::{Pin, PinnedFile, cached_deb, download_pinned, download_verified};

/// The Debian suite the image content comes from.
pub const SUITE: &str = "trixie";

/// What a locked package is for in the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The guest kernel: `boot/vmlinuz-*` and `usr/lib/modules/*`.
    Kernel,
    /// systemd-stub, the UEFI stub of the UKI.
    Stub,
    /// Shared libraries in the initramfs (the init binary's closure is taken from these).
    Library,
    /// A build or test tool, not part of the image: outside the lock's digest and the input
    /// list of the measurement metadata, so pinning one leaves the references unchanged.
    Tool,
    /// A package of the node's rootfs, pinned in `rootfs.lock` (`rootfs::lock`): mkosi installs
    /// it from a local repository made of the pinned files; it is not in the UKI.
    Rootfs,
}

/// The packages the lock pins: (package or meta-package, role). A meta-package (the kernel's)
/// is followed to the versioned package it depends on.
pub const WANTED: &[(&str, Role)] = &[
    ("linux-image-cloud-amd64", Role::Kernel),
    ("systemd-boot-efi", Role::Stub),
    ("libc6", Role::Library),
    ("libgcc-s1", Role::Library),
    // mke2fs, which PID 1 runs to create the state disk's filesystem (issue 6), and its
    // libraries. e2fsprogs is a program package; it is a library root all the same: the
    // initramfs builder finds programs and libraries in the same unpacked trees.
    ("e2fsprogs", Role::Library),
    ("libext2fs2t64", Role::Library),
    ("libcom-err2", Role::Library),
    ("libblkid1", Role::Library),
    ("libuuid1", Role::Library),
    // ukify 257, the reference the UKI assembly is checked against (image/tests/uki.rs); a Python
    // script, run with the host's python3-pefile and python3-zstandard.
    ("systemd-ukify", Role::Tool),
];

/// One pinned package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedPackage {
    pub name: String,
    pub version: String,
    pub role: Role,
    /// Where the `.deb` is downloaded from.
    pub url: String,
    pub size: u64,
    pub sha256: String,
}

/// The contents of `inputs.lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputLock {
    pub suite: String,
    /// `SOURCE_DATE_EPOCH` of the image: every timestamp in it. Pinned here, not taken from
    /// the commit or the clock, so that the committed reference measurements stay valid across
    /// commits that do not change the image; `hawser image lock` sets it to the time of locking.
    pub source_date_epoch: u64,
    #[serde(rename = "package")]
    pub packages: Vec<LockedPackage>,
}

/// Why the inputs could not be locked, fetched or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The lock file is missing or unreadable.
    #[error("cannot read the input lock {path}")]
    ReadLock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The lock file is not valid TOML of the expected shape.
    #[error("the input lock {path} is malformed")]
    ParseLock {
        path: PathBuf,
        #[source]
        source: LockParseError,
    },
    /// The lock lacks a package of a role the image needs.
    #[error("the input lock has no {role:?} package; regenerate it with `hawser image lock`")]
    MissingRole { role: Role },
    /// A download failed.
    #[error(
        "downloading {name} {version} from {url} failed ({reason}); if the archive no longer carries this \
         version, re-pin with `hawser image lock` (that changes the image and its measurements)"
    )]
    Download {
        name: String,
        version: String,
        url: String,
        /// curl's exit status.
        reason: String,
    },
    /// The archive no longer has the pinned file (HTTP 404 or 410): Debian keeps only the
    /// current build of a package, so a point release removes the one before.
    #[error(
        "{name} {version} is no longer in the Debian archive: {url} answered HTTP {http_status} \
         (the archive keeps only the current build of each package; snapshot.debian.org is not used). \
         Re-pin with `hawser image lock` (it rewrites inputs.lock and rootfs.lock, which changes the image \
         and its measurements)"
    )]
    Gone {
        name: String,
        version: String,
        url: String,
        http_status: String,
    },
    /// A downloaded file's digest differs from the lock.
    #[error(
        "{name} {version}: {algorithm} {actual} does not match the locked {expected}; the file was discarded"
    )]
    Checksum {
        name: String,
        version: String,
        /// `sha256` or `sha512`.
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    /// A host tool the inputs need (curl, dpkg-deb, apt) could not run or failed.
    #[error("{step} failed (the tool comes with the Debian package {package})")]
    Tool {
        /// What the tool was doing, e.g. `unpacking libc6`.
        step: String,
        package: &'static str,
        #[source]
        source: ToolError,
    },
    /// apt could not resolve a wanted package.
    #[error("apt cannot resolve {name} in {suite}: {reason}")]
    Resolve {
        name: String,
        suite: String,
        reason: String,
    },
    /// A locked package is not in the cache and the caller asked not to download.
    #[error("{name} {version} is not in the input cache; run `hawser image fetch`")]
    NotFetched { name: String, version: String },
    /// Unpacked inputs lack an expected file.
    #[error("the unpacked {name} has no {what} under {dir}")]
    Layout {
        name: String,
        what: &'static str,
        dir: PathBuf,
    },
    /// A file or directory of the input cache could not be read or written.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Why lock text is not a valid input lock.
#[derive(Debug, thiserror::Error)]
pub enum LockParseError {
    /// The text is not TOML of the lock's shape.
    #[error("it is not TOML of the input lock's shape")]
    Toml(#[from] toml::de::Error),
    /// A package's sha256 is not 64 hex digits.
    #[error("package {package} has a malformed sha256 {sha256:?}")]
    MalformedSha256 { package: String, sha256: String },
}

impl InputLock {
    /// Reads and parses a lock file.
    pub fn load(path: &Path) -> Result<Self, InputError> {
        let text = std::fs::read_to_string(path).map_err(|source| InputError::ReadLock {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|source| InputError::ParseLock {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses lock text.
    pub fn parse(text: &str) -> Result<Self, LockParseError> {
        let lock: Self = toml::from_str(text)?;
        for p in &lock.packages {
            if p.sha256.len() != 64 || !p.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(LockParseError::MalformedSha256 {
                    package: p.name.clone(),
                    sha256: p.sha256.clone(),
                });
            }
        }
        Ok(lock)
    }

    /// The lock as written to disk: a header, then TOML.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# hawser image inputs: the Debian packages the image is built from, pinned by version\n\
             # and sha256. Regenerate with `hawser image lock` (that changes the measurements).\n",
        );
        // Serializing plain strings and integers cannot fail.
        out.push_str(&toml::to_string(self).unwrap_or_default());
        out
    }

    /// sha256 over the rendered lock of the image's packages (tools left out): names the exact
    /// input set in measurement metadata.
    pub fn digest(&self) -> String {
        let image = Self {
            packages: self.image_packages().cloned().collect(),
            ..self.clone()
        };
        hex::encode(Sha256::digest(image.render().as_bytes()))
    }

    /// The packages the image is made of: all but the tools.
    pub fn image_packages(&self) -> impl Iterator<Item = &LockedPackage> {
        self.packages.iter().filter(|p| p.role != Role::Tool)
    }

    /// The locked packages of one role.
    pub fn by_role(&self, role: Role) -> impl Iterator<Item = &LockedPackage> {
        self.packages.iter().filter(move |p| p.role == role)
    }
}

/// The cache directory: `$HAWSER_CACHE`, else `~/.cache/hawser`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HAWSER_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/hawser")
}

#[cfg(test)]
mod tests;
