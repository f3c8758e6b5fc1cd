//! `kubernetes.lock`: the Kubernetes input, pinned file by file.
//!
//! Three kinds of entries, each a file of the Debian archive with its URL, size and sha256:
//! - `[[source]]`: the `.dsc` of Debian's `kubernetes` source package and the tarballs it lists
//!   (unpacked with `dpkg-source -x`, Debian's patches applied);
//! - `[[toolchain]]`: the Go toolchain's `.deb`s (`golang-1.19-go`, `golang-1.19-src`), unpacked
//!   into one tree, never installed;
//! - `[[swap]]`: a `.deb` whose directory `from` replaces the vendored package at `into` in the
//!   source tree (reflect2 1.0.2 for Go ≥ 1.18).
//!
//! Top-level `version` is the Kubernetes release the binaries report (`kubeadm version`) and
//! `git_commit` its upstream commit; both go into the version ldflags. The lock's digest
//! ([`KubernetesLock::digest`]) is the sha256 of its canonical rendering: the cache key of
//! everything built from it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::KubernetesError;
use crate::inputs::{LockedPackage, Role};

/// The lock file, at the workspace root next to `inputs.lock`.
pub const LOCK_FILE: &str = "kubernetes.lock";

/// One file of the source package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    /// The source package, `kubernetes`.
    pub package: String,
    /// Its Debian version.
    pub version: String,
    /// The file's name as the `.dsc` lists it (`dpkg-source` looks for it by this name).
    pub file: String,
    pub url: String,
    pub size: u64,
    pub sha256: String,
}

/// A library package whose files replace a vendored package of the source tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Swap {
    pub name: String,
    pub version: String,
    pub role: Role,
    pub url: String,
    pub size: u64,
    pub sha256: String,
    /// The directory inside the unpacked `.deb` whose files are taken.
    pub from: String,
    /// The vendored directory of the source tree they replace.
    pub into: String,
}

/// The contents of `kubernetes.lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesLock {
    /// The release the binaries report, `v1.20.2`.
    pub version: String,
    /// Its upstream commit (40 hex digits).
    pub git_commit: String,
    #[serde(rename = "source")]
    pub sources: Vec<SourceFile>,
    #[serde(rename = "toolchain")]
    pub toolchain: Vec<LockedPackage>,
    #[serde(rename = "swap", default)]
    pub swaps: Vec<Swap>,
}

/// Why lock text is not a valid Kubernetes lock: the message names the line or the entry.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesLockError {
    /// The text is not TOML of the lock's shape (the TOML error names line and column).
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// An entry's sha256 is not 64 lowercase hex digits.
    #[error("{entry}: sha256 {sha256:?} is not 64 lowercase hex digits")]
    MalformedSha256 { entry: String, sha256: String },
    /// An entry's URL is not an http(s) URL ending in its file name.
    #[error("{entry}: url {url:?} {problem}")]
    MalformedUrl {
        entry: String,
        url: String,
        problem: &'static str,
    },
    /// The top-level fields are not what the build needs.
    #[error("{0}")]
    Invalid(String),
}

impl KubernetesLock {
    /// Reads and parses the lock file.
    pub fn load(path: &Path) -> Result<Self, KubernetesError> {
        let text = std::fs::read_to_string(path).map_err(|source| KubernetesError::ReadLock {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|source| KubernetesError::ParseLock {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses and checks lock text.
    pub fn parse(text: &str) -> Result<Self, KubernetesLockError> {
        let lock: Self = toml::from_str(text)?;
        lock.check()?;
        Ok(lock)
    }

    fn check(&self) -> Result<(), KubernetesLockError> {
        let v = self.version.strip_prefix('v').unwrap_or_default();
        if v.split('.').count() != 3 || !v.split('.').all(|n| n.parse::<u32>().is_ok()) {
            return Err(KubernetesLockError::Invalid(format!(
                "version {:?} is not a release like \"v1.20.2\"",
                self.version
            )));
        }
        if !is_hex(&self.git_commit, 40) {
            return Err(KubernetesLockError::Invalid(format!(
                "git_commit {:?} is not 40 lowercase hex digits",
                self.git_commit
            )));
        }
        let dscs = self.sources.iter().filter(|s| s.file.ends_with(".dsc"));
        if dscs.count() != 1 {
            return Err(KubernetesLockError::Invalid(
                "[[source]] must name exactly one .dsc file".into(),
            ));
        }
        if self.toolchain.is_empty() {
            return Err(KubernetesLockError::Invalid(
                "no [[toolchain]] package: the Go toolchain is part of the input".into(),
            ));
        }
        let files = self
            .sources
            .iter()
            .map(|s| (format!("[[source]] {}", s.file), &s.url, &s.sha256, &s.file))
            .chain(self.toolchain.iter().map(|p| {
                (
                    format!("[[toolchain]] {}", p.name),
                    &p.url,
                    &p.sha256,
                    &p.name,
                )
            }))
            .chain(
                self.swaps
                    .iter()
                    .map(|s| (format!("[[swap]] {}", s.name), &s.url, &s.sha256, &s.name)),
            );
        for (entry, url, sha256, file) in files {
            if !is_hex(sha256, 64) {
                return Err(KubernetesLockError::MalformedSha256 {
                    entry,
                    sha256: sha256.clone(),
                });
            }
            let problem = if !(url.starts_with("http://") || url.starts_with("https://")) {
                Some("is not an http(s) URL")
            } else if entry.starts_with("[[source]]")
                && !url.ends_with(&file.replace('+', "%2b"))
                && !url.ends_with(file.as_str())
            {
                Some("does not end in the entry's file name")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(KubernetesLockError::MalformedUrl {
                    entry,
                    url: url.clone(),
                    problem,
                });
            }
        }
        for s in &self.swaps {
            if !s.into.starts_with("vendor/") || s.into.contains("..") || s.from.contains("..") {
                return Err(KubernetesLockError::Invalid(format!(
                    "[[swap]] {}: into {:?} must be a directory under vendor/ (and neither path may contain ..)",
                    s.name, s.into
                )));
            }
        }
        Ok(())
    }

    /// The canonical rendering: what [`digest`](Self::digest) hashes (comments and layout of
    /// the file on disk do not change the key).
    pub fn render(&self) -> String {
        // Serializing plain strings and integers cannot fail.
        toml::to_string(self).unwrap_or_default()
    }

    /// sha256 of the canonical rendering: the cache key.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.render().as_bytes()))
    }

    /// The `.dsc` entry ([`check`](Self::check) made sure there is one).
    pub fn dsc(&self) -> Option<&SourceFile> {
        self.sources.iter().find(|s| s.file.ends_with(".dsc"))
    }
}

impl SourceFile {
    /// This file as a download of the shared input fetcher (same cache, curl, sha256 check).
    pub(crate) fn as_download(&self) -> LockedPackage {
        LockedPackage {
            name: self.file.clone(),
            version: self.version.clone(),
            role: Role::Tool,
            url: self.url.clone(),
            size: self.size,
            sha256: self.sha256.clone(),
        }
    }
}

impl Swap {
    /// The swapped library as a download of the shared input fetcher.
    pub(crate) fn as_download(&self) -> LockedPackage {
        LockedPackage {
            name: self.name.clone(),
            version: self.version.clone(),
            role: self.role,
            url: self.url.clone(),
            size: self.size,
            sha256: self.sha256.clone(),
        }
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `kubernetes.lock` of the workspace at `root`.
pub fn lock_path(root: &Path) -> PathBuf {
    root.join(LOCK_FILE)
}
