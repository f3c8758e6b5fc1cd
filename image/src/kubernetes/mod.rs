//! Kubernetes as a pinned input of the image: kubeadm, kubelet and the control plane built
//! reproducibly from Debian's `kubernetes` source package with Debian's Go toolchain.
//!
//! Debian bookworm's `kubernetes` source (`1.20.5+really1.20.2-1.1+deb12u1`) is the full upstream
//! v1.20.2 tree with its `vendor/`; later Debian releases ship kubectl only, so v1.20.2 is the
//! newest Kubernetes these registries can build (`docs/kubernetes.md`). The pieces:
//! - [`lock`]: `kubernetes.lock`, every file by URL and sha256, and its digest (the cache key);
//! - [`fetch`](mod@fetch): download and verify through the shared input fetcher
//!   ([`crate::inputs`]), unpack the source for GOPATH mode and the toolchain beside it under
//!   `<cache>/kubernetes/<digest>/`;
//! - [`build`](mod@build): the build plan (commands and a closed environment: GOPATH mode,
//!   `CGO_ENABLED=0`, `-trimpath`, fixed build ID and date), the API server's generated OpenAPI
//!   code, and the binaries cached by (digest, name) with their sha256 in a manifest;
//! - [`release`](mod@release): the other origin, upstream's release tarball pinned in the same
//!   lock, its binaries read out into the same `bin/` layout and manifest;
//! - [`images`]: the images containerd imports offline, two deterministic OCI archives
//!   ([`oci`]): every node's (pause built static from the tree, [`pause`]; kube-proxy; busybox)
//!   and the control plane's (API server, controller manager, scheduler, etcd).
//!
//! [`fetch_and_build`] is the one entry point for both origins ([`Origin`]): what it returns, the
//! binaries at `<cache>/kubernetes/<digest>/bin/<name>` and `bin/manifest.json`, looks the same
//! whichever made them, so nothing downstream knows.

use std::path::{Path, PathBuf};

use hawser_kube_types::KubernetesOrigin;

pub mod binary;
pub mod build;
pub mod fetch;
pub mod images;
pub mod lock;
pub mod oci;
pub mod pause;
pub mod release;

pub use binary::Binary;
pub use build::{BuildReport, BuiltBinary, build};
pub use fetch::{Unpacked, fetch};
pub use lock::{KubernetesLock, KubernetesLockError, LOCK_FILE, ReleaseFile};
pub use release::fetch_release;

use crate::inputs::InputError;
use crate::tool::{IoError, ToolError};

/// Why Kubernetes could not be fetched or built.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    /// `SOURCE_DATE_EPOCH` is past what an RFC 3339 date can say (the year 9999).
    #[error("SOURCE_DATE_EPOCH {0} is not a date kubernetes' buildDate can carry")]
    BuildDate(u64),
    /// The lock file is missing or unreadable.
    #[error("cannot read the Kubernetes lock {path}")]
    ReadLock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The lock is malformed (the source names the line or entry).
    #[error("the Kubernetes lock {path} is malformed")]
    ParseLock {
        path: PathBuf,
        #[source]
        source: KubernetesLockError,
    },
    /// Downloading or verifying a locked file failed.
    #[error("fetching the Kubernetes inputs failed")]
    Fetch(#[from] InputError),
    /// A host tool (dpkg-source, dpkg-deb) or a build step (go, openapi-gen) failed.
    #[error("{step} failed (its tool comes with the Debian package {package})")]
    Tool {
        step: String,
        package: &'static str,
        #[source]
        source: ToolError,
    },
    /// The unpacked inputs lack something the build needs.
    #[error("{what} not found under {dir}")]
    Layout { what: String, dir: PathBuf },
    /// openapi-gen reported other API rule violations than the tree's known list.
    #[error(
        "openapi-gen's API rule violations ({report}) differ from the tree's known list ({known}): \
         the generated code is not the one upstream released"
    )]
    OpenApiViolations { report: PathBuf, known: PathBuf },
    /// A cached binary's sha256 differs from the manifest (and rebuilding it gave yet another).
    #[error("{name}: built {actual}, but the manifest of this lock records {expected}")]
    NotReproduced {
        name: String,
        expected: String,
        actual: String,
    },
    /// The lock pins no release binaries.
    #[error(
        "kubernetes.lock has no [[release]] entry: pin upstream's server tarball there \
         (docs/kubernetes.md, \"Release binaries\"), or build from the pinned source (--from source)"
    )]
    NoRelease,
    /// Upstream's release site could not be reached, or does not have the file.
    #[error(
        "cannot download the release file {file} from {url} ({reason}); the release origin needs \
         the upstream release site (dl.k8s.io): where it is out of reach, build from the pinned \
         source instead (hawser image kubernetes --from source)"
    )]
    ReleaseDownload {
        file: String,
        url: String,
        reason: String,
    },
    /// A release tarball cannot be read (not gzip, not tar, or cut short).
    #[error("cannot read the release file {file} as a gzip-compressed tar")]
    ReleaseArchive {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A release tarball lacks a member the lock names.
    #[error(
        "the release file {file} has no member {member}: the lock's [[release]] entry names a \
         binary its tarball does not hold; fix the entry's binaries"
    )]
    ReleaseMemberMissing { file: String, member: String },
    /// A release tarball's member is not what a binary must be.
    #[error(
        "the release file {file}'s member {member} is {found}, not a regular file of mode 0755"
    )]
    ReleaseMember {
        file: String,
        member: String,
        found: String,
    },
    /// The build manifest cannot be read or written as JSON.
    #[error("the build manifest {path} is not valid JSON")]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// One of the images' OCI archives could not be written.
    #[error("writing an images archive failed")]
    ImageArchive(#[from] oci::OciError),
    /// etcd's shared libraries are not all in the root it is taken from.
    #[error("resolving the shared libraries of etcd ({path}) failed")]
    EtcdClosure {
        path: PathBuf,
        #[source]
        source: crate::closure::ClosureError,
    },
    /// The etcd-server version is not a Debian version of it.
    #[error("{0:?} is not a Debian version of etcd-server (like 3.4.23-4+b4)")]
    EtcdVersion(String),
    /// The busybox-static version is not a Debian version of it.
    #[error("{0:?} is not a Debian version of busybox-static (like 1:1.35.0-4+deb12u1+b1)")]
    ToolsVersion(String),
    /// The images built for an archive are not the ones its description lists (a bug in the
    /// image builder: the split and the specs disagree).
    #[error(
        "the archive {archive} would hold {built:?}, but the image's description lists {listed:?}"
    )]
    ArchiveSplit {
        archive: String,
        built: Vec<String>,
        listed: Vec<String>,
    },
    /// `kubernetes.lock` pins no package the tools image is made of.
    #[error(
        "kubernetes.lock pins no [[tools]] {package}: the images archive's test/tools image is \
         made of it; add its entry (docs/kubernetes.md, \"kubernetes.lock\")"
    )]
    NoToolsPackage { package: &'static str },
    /// A file or directory of the cache could not be read or written.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Where the node's Kubernetes binaries come from; the lock pins both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Built here from the Debian source package and Go toolchain of `[[source]]`/`[[toolchain]]`.
    Source,
    /// Read out of upstream's release tarballs of `[[release]]`.
    Release,
}

impl Origin {
    /// `source` or `release`, as `--from` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Source => "source",
            Origin::Release => "release",
        }
    }
}

impl From<Origin> for KubernetesOrigin {
    fn from(origin: Origin) -> Self {
        match origin {
            Origin::Source => KubernetesOrigin::Source,
            Origin::Release => KubernetesOrigin::Release,
        }
    }
}

/// Provides `binaries` from `origin` (cached) at `<cache>/kubernetes/<origin's digest>/bin/<name>`
/// with their sha256 in `bin/manifest.json`. Source: fetch and unpack the inputs, then build (the
/// unpacked tree is returned); release: download, verify and read out upstream's tarball (no
/// tree). The report's timeline starts with the fetch.
pub fn fetch_and_build(
    lock: &KubernetesLock,
    cache: &Path,
    epoch: u64,
    binaries: &[Binary],
    origin: Origin,
) -> Result<(Option<Unpacked>, BuildReport), KubernetesError> {
    if origin == Origin::Release {
        return Ok((None, fetch_release(lock, cache, binaries)?));
    }
    let t = std::time::Instant::now();
    let unpacked = fetch(lock, cache)?;
    let fetch_step = if unpacked.fresh {
        "fetch + unpack"
    } else {
        "fetch (cached)"
    };
    let fetched = t.elapsed();
    let mut report = build(&unpacked, lock, epoch, binaries)?;
    report.timeline.insert(0, (fetch_step.to_owned(), fetched));
    Ok((Some(unpacked), report))
}

/// Where everything of the lock's source origin lives: `<cache>/kubernetes/<digest>`.
pub fn lock_dir(cache: &Path, lock: &KubernetesLock) -> PathBuf {
    origin_dir(cache, lock, Origin::Source)
}

/// Where `origin`'s binaries live: `<cache>/kubernetes/<origin's digest>` (its `bin/`).
pub fn origin_dir(cache: &Path, lock: &KubernetesLock, origin: Origin) -> PathBuf {
    cache.join("kubernetes").join(lock.digest_for(origin))
}

#[cfg(test)]
mod tests;
