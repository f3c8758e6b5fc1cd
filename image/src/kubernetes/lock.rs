//! `kubernetes.lock`: the Kubernetes input, pinned file by file.
//!
//! Three kinds of entries, each a file of the Debian archive with its URL, size and sha256:
//! - `[[source]]`: the `.dsc` of Debian's `kubernetes` source package and the tarballs it lists
//!   (unpacked with `dpkg-source -x`, Debian's patches applied);
//! - `[[toolchain]]`: the Go toolchain's `.deb`s (`golang-1.19-go`, `golang-1.19-src`), unpacked
//!   into one tree, never installed;
//! - `[[swap]]`: a `.deb` whose directory `from` replaces the vendored package at `into` in the
//!   source tree (reflect2 1.0.2 for Go ≥ 1.18);
//! - `[[release]]`: upstream's release tarball(s) of the same version, pinned by the sha512 its
//!   changelog lists (or a sha256), and the member paths of the six binaries in them;
//! - `[[tools]]`: the `.deb`s the images archive's test/tools image is made of (bookworm's
//!   `busybox-static`), unpacked, never installed.
//!
//! Top-level `version` is the Kubernetes release the binaries report (`kubeadm version`) and
//! `git_commit` its upstream commit; both go into the version ldflags. The lock pins both origins;
//! the caller chooses one ([`super::Origin`]), and each has its own cache key: the source
//! digest ([`KubernetesLock::digest`], everything but `[[release]]` and `[[tools]]`) and the
//! release digest ([`KubernetesLock::release_digest`], `version` and `[[release]]` only), so
//! re-pinning one origin leaves the other's cache valid. `[[tools]]` is in neither: the tools
//! image is made anew with the archive at every image build, and builds no binary.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Binary, KubernetesError, Origin};
use crate::inputs::{LockedPackage, Pin, PinnedFile, Role};

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

/// One upstream release file: a gzip-compressed tar holding some of the binaries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseFile {
    /// The file's name, the last segment of its URL (`kubernetes-server-linux-amd64.tar.gz`).
    pub file: String,
    /// `https://dl.k8s.io/<version>/<file>`, or `file://` for a local mirror.
    pub url: String,
    /// Its size in bytes, if known (upstream's changelog does not list it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Exactly one of `sha512` (what upstream's changelog lists) and `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha512: Option<String>,
    /// The binaries' member paths in the tarball (`kubernetes/server/bin/kubeadm`); a member's
    /// file name is the binary's name.
    pub binaries: Vec<String>,
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
    /// Upstream's release binaries; none if the lock pins the source only.
    #[serde(rename = "release", default, skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<ReleaseFile>,
    /// The packages of the test/tools image (`busybox-static`); none in a lock written before
    /// it existed (the image build then says what to add).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<LockedPackage>,
}

/// What the release digest hashes: the version and the `[[release]]` entries.
#[derive(Serialize)]
struct ReleasePins<'a> {
    version: &'a str,
    #[serde(rename = "release")]
    releases: &'a [ReleaseFile],
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
    /// A `[[release]]` entry is not a usable pin of upstream's binaries.
    #[error("[[release]] {file}: {problem}")]
    Release { file: String, problem: String },
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
            )
            .chain(
                self.tools
                    .iter()
                    .map(|p| (format!("[[tools]] {}", p.name), &p.url, &p.sha256, &p.name)),
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
        let mut tools = std::collections::BTreeSet::new();
        for p in &self.tools {
            if !tools.insert(p.name.as_str()) {
                return Err(KubernetesLockError::Invalid(format!(
                    "[[tools]] {} is pinned twice",
                    p.name
                )));
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
        self.check_releases()
    }

    /// `[[release]]`: each entry a `.tar.gz` at a URL ending in its name, pinned by exactly one
    /// well-formed digest, naming members inside the tarball; together, if there are any, the
    /// six binaries once each (the release origin delivers what the source origin builds).
    fn check_releases(&self) -> Result<(), KubernetesLockError> {
        let mut provided = Vec::new();
        for r in &self.releases {
            let problem = |problem: String| KubernetesLockError::Release {
                file: r.file.clone(),
                problem,
            };
            if !(r.file.ends_with(".tar.gz") || r.file.ends_with(".tgz")) || r.file.contains('/') {
                return Err(problem(
                    "file must be the name of a .tar.gz (gzip-compressed tar)".into(),
                ));
            }
            let scheme_ok = ["https://", "http://", "file://"]
                .iter()
                .any(|s| r.url.starts_with(s));
            if !scheme_ok || !r.url.ends_with(&format!("/{}", r.file)) {
                return Err(problem(format!(
                    "url {:?} must be an https, http or file URL ending in /{}",
                    r.url, r.file
                )));
            }
            match (&r.sha256, &r.sha512) {
                (Some(h), None) if is_hex(h, 64) => {}
                (None, Some(h)) if is_hex(h, 128) => {}
                (Some(_), Some(_)) | (None, None) => {
                    return Err(problem("give exactly one of sha512 and sha256".into()));
                }
                (Some(h), None) | (None, Some(h)) => {
                    return Err(problem(format!(
                        "{h:?} is not {} lowercase hex digits",
                        if r.sha256.is_some() { 64 } else { 128 }
                    )));
                }
            }
            for member in &r.binaries {
                let name = member.rsplit('/').next().unwrap_or_default();
                let binary = Binary::from_name(name).ok_or_else(|| {
                    problem(format!(
                        "member {member:?} is not one of the binaries ({})",
                        Binary::ALL.map(Binary::name).join(", ")
                    ))
                })?;
                if member.starts_with('/') || member.split('/').any(|c| c == ".." || c == ".") {
                    return Err(problem(format!(
                        "member {member:?} must be a relative path without . or .."
                    )));
                }
                if provided.contains(&binary) {
                    return Err(problem(format!(
                        "{name} is named twice in the lock's [[release]] entries"
                    )));
                }
                provided.push(binary);
            }
        }
        if let Some(first) = self.releases.first()
            && let Some(missing) = Binary::ALL.into_iter().find(|b| !provided.contains(b))
        {
            return Err(KubernetesLockError::Release {
                file: first.file.clone(),
                problem: format!(
                    "no [[release]] entry provides {}: the release origin must deliver all six binaries",
                    missing.name()
                ),
            });
        }
        Ok(())
    }

    /// The canonical rendering of the whole lock (comments and layout of the file on disk do
    /// not count).
    pub fn render(&self) -> String {
        // Serializing plain strings and integers cannot fail.
        toml::to_string(self).unwrap_or_default()
    }

    /// The source digest: sha256 of the canonical rendering without `[[release]]` and
    /// `[[tools]]`. The cache key of everything built from the source (its unpacked tree, Go
    /// cache and binaries).
    pub fn digest(&self) -> String {
        let source = Self {
            releases: Vec::new(),
            tools: Vec::new(),
            ..self.clone()
        };
        hex::encode(Sha256::digest(source.render().as_bytes()))
    }

    /// The release digest: sha256 of the canonical rendering of `version` and `[[release]]`.
    /// The cache key of the binaries read out of upstream's tarballs.
    pub fn release_digest(&self) -> String {
        let pins = ReleasePins {
            version: &self.version,
            releases: &self.releases,
        };
        // Serializing plain strings and integers cannot fail.
        let text = toml::to_string(&pins).unwrap_or_default();
        hex::encode(Sha256::digest(text.as_bytes()))
    }

    /// The cache key of `origin`'s binaries.
    pub fn digest_for(&self, origin: Origin) -> String {
        match origin {
            Origin::Source => self.digest(),
            Origin::Release => self.release_digest(),
        }
    }

    /// The `[[release]]` entry providing `binary`, with its member path.
    pub fn release_of(&self, binary: Binary) -> Option<(&ReleaseFile, &str)> {
        self.releases.iter().find_map(|r| {
            r.binaries
                .iter()
                .find(|m| m.rsplit('/').next() == Some(binary.name()))
                .map(|m| (r, m.as_str()))
        })
    }

    /// The `[[tools]]` package named `name`.
    pub fn tool(&self, name: &str) -> Option<&LockedPackage> {
        self.tools.iter().find(|p| p.name == name)
    }

    /// The `.dsc` entry (parsing made sure there is one).
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

impl ReleaseFile {
    /// This file as a download of the shared input fetcher (`version`: the lock's).
    pub(crate) fn as_download<'a>(&'a self, version: &'a str) -> PinnedFile<'a> {
        let pin = match (&self.sha512, &self.sha256) {
            (Some(h), _) => Pin::Sha512(h),
            (None, Some(h)) => Pin::Sha256(h),
            // check() refuses an entry without a digest; an empty pin matches no file.
            (None, None) => Pin::Sha256(""),
        };
        PinnedFile {
            name: &self.file,
            version,
            url: &self.url,
            pin,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn committed_text() -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kubernetes.lock");
        std::fs::read_to_string(path).unwrap()
    }

    /// The committed lock's text with `from` replaced (which must be there).
    fn edited(from: &str, to: &str) -> String {
        let text = committed_text();
        assert!(text.contains(from), "{from:?} not in the lock");
        text.replacen(from, to, 1)
    }

    fn release_error(text: &str) -> String {
        match KubernetesLock::parse(text) {
            Err(e @ KubernetesLockError::Release { .. }) => e.to_string(),
            other => panic!("not a [[release]] error: {other:?}"),
        }
    }

    const SHA512: &str = "65abf178782e43bc21e8455ffbfdadf6064dbeae3ff704ccf9e13e8acee18235c280b06778e5de4bd702f5507e1870fe38c561366d125ef4f821ed7aa46e9f45";

    #[test]
    fn committed_release_entry_is_upstreams_server_tarball_with_all_six() {
        let lock = KubernetesLock::parse(&committed_text()).unwrap();
        assert_eq!(lock.releases.len(), 1);
        let r = &lock.releases[0];
        assert_eq!(
            r.url,
            "https://dl.k8s.io/v1.20.2/kubernetes-server-linux-amd64.tar.gz"
        );
        // CHANGELOG-1.20.md, v1.20.2, "Server binaries".
        assert_eq!(r.sha512.as_deref(), Some(SHA512));
        assert_eq!((r.sha256.as_ref(), r.size), (None, None));
        for binary in Binary::ALL {
            let (_, member) = lock.release_of(binary).unwrap();
            assert_eq!(member, format!("kubernetes/server/bin/{}", binary.name()));
        }
    }

    #[test]
    fn the_source_digest_ignores_release_lines_and_the_release_digest_source_lines() {
        let lock = KubernetesLock::parse(&committed_text()).unwrap();
        // The key the source build was cached under before [[release]] existed.
        assert_eq!(
            lock.digest(),
            "7e6bcfb55736317a080ab3555a029975ee2677d41222763a37b6c062ae3b9fc7"
        );
        let no_release = KubernetesLock {
            releases: Vec::new(),
            ..lock.clone()
        };
        assert_eq!(no_release.digest(), lock.digest());

        let other_release = KubernetesLock::parse(&edited(SHA512, &"0".repeat(128))).unwrap();
        assert_eq!(other_release.digest(), lock.digest());
        assert_ne!(other_release.release_digest(), lock.release_digest());

        let other_source = KubernetesLock::parse(&edited("size = 21300", "size = 21301")).unwrap();
        assert_ne!(other_source.digest(), lock.digest());
        assert_eq!(other_source.release_digest(), lock.release_digest());

        let other_version =
            KubernetesLock::parse(&edited("version = \"v1.20.2\"", "version = \"v1.20.3\""))
                .unwrap();
        assert_ne!(other_version.release_digest(), lock.release_digest());

        // The tools image's packages are outside both: a new busybox rebuilds no binary.
        let no_tools = KubernetesLock {
            tools: Vec::new(),
            ..lock.clone()
        };
        assert_eq!(no_tools.digest(), lock.digest());
        assert_eq!(no_tools.release_digest(), lock.release_digest());
        let other_tools = KubernetesLock::parse(&edited("size = 928188", "size = 928189")).unwrap();
        assert_eq!(other_tools.digest(), lock.digest());

        assert_ne!(lock.release_digest(), lock.digest());
        assert_eq!(lock.digest_for(Origin::Source), lock.digest());
        assert_eq!(lock.digest_for(Origin::Release), lock.release_digest());
    }

    #[test]
    fn the_tools_entry_pins_busybox_static_and_bad_ones_are_named() {
        let lock = KubernetesLock::parse(&committed_text()).unwrap();
        let busybox = lock.tool("busybox-static").unwrap();
        assert_eq!(busybox.version, "1:1.35.0-4+deb12u1+b1");
        assert_eq!(busybox.role, Role::Tool);

        let sha = "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744";
        let err = KubernetesLock::parse(&edited(sha, "3D3F")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "[[tools]] busybox-static: sha256 \"3D3F\" is not 64 lowercase hex digits"
        );
        let entry = &committed_text()[committed_text().find("\n[[tools]]").unwrap()..];
        let twice = format!("{}\n{entry}", committed_text());
        let err = KubernetesLock::parse(&twice).unwrap_err();
        assert!(
            err.to_string().contains("busybox-static is pinned twice"),
            "{err}"
        );

        let without =
            &committed_text()[..committed_text().find("\n# The test/tools image").unwrap()];
        let lock = KubernetesLock::parse(without).unwrap();
        assert!(lock.tools.is_empty() && lock.tool("busybox-static").is_none());
    }

    #[test]
    fn a_lock_without_release_lines_parses_and_has_none() {
        let text = committed_text();
        let source_only = &text[..text.find("\n[[release]]").unwrap()];
        let lock = KubernetesLock::parse(source_only).unwrap();
        assert!(lock.releases.is_empty());
        assert!(lock.release_of(Binary::Kubeadm).is_none());
        assert!(!lock.render().contains("release"), "{}", lock.render());
    }

    #[test]
    fn bad_release_lines_are_named() {
        let file = "[[release]] kubernetes-server-linux-amd64.tar.gz";
        let short = release_error(&edited(SHA512, "65abf178"));
        assert!(
            short.starts_with(file) && short.contains("128 lowercase hex"),
            "{short}"
        );

        let both = edited(
            &format!("sha512 = \"{SHA512}\""),
            &format!("sha512 = \"{SHA512}\"\nsha256 = \"{}\"", "a".repeat(64)),
        );
        assert!(release_error(&both).contains("exactly one of sha512 and sha256"));
        let neither = edited(&format!("sha512 = \"{SHA512}\"\n"), "");
        assert!(release_error(&neither).contains("exactly one of sha512 and sha256"));
        let by_sha256 = edited(
            &format!("sha512 = \"{SHA512}\""),
            &format!("sha256 = \"{}\"", "a".repeat(64)),
        );
        assert!(KubernetesLock::parse(&by_sha256).is_ok());

        let other_file = edited(
            "v1.20.2/kubernetes-server-linux-amd64.tar.gz\"",
            "v1.20.2/kubernetes-node-linux-amd64.tar.gz\"",
        );
        assert!(
            release_error(&other_file).contains("must be an https, http or file URL ending in")
        );
        let ftp = edited("url = \"https://dl.k8s.io/", "url = \"ftp://dl.k8s.io/");
        assert!(release_error(&ftp).contains("ftp://"));

        let kubectl = edited(
            "\"kubernetes/server/bin/kube-proxy\"",
            "\"kubernetes/server/bin/kubectl\"",
        );
        let err = release_error(&kubectl);
        assert!(
            err.contains("\"kubernetes/server/bin/kubectl\" is not one of the binaries"),
            "{err}"
        );

        let escape = edited(
            "\"kubernetes/server/bin/kube-proxy\"",
            "\"kubernetes/../../kube-proxy\"",
        );
        assert!(release_error(&escape).contains("without . or .."));

        let twice = edited(
            "\"kubernetes/server/bin/kube-proxy\"",
            "\"kubernetes/server/bin/kubeadm\"",
        );
        let err = release_error(&twice);
        assert!(err.contains("kubeadm is named twice"), "{err}");

        let five = edited("    \"kubernetes/server/bin/kube-proxy\",\n", "");
        let err = release_error(&five);
        assert!(
            err.contains("no [[release]] entry provides kube-proxy"),
            "{err}"
        );

        let unknown = edited(
            &format!("sha512 = \"{SHA512}\""),
            &format!("sha512 = \"{SHA512}\"\nmd5 = \"x\""),
        );
        assert!(matches!(
            KubernetesLock::parse(&unknown),
            Err(KubernetesLockError::Toml(_))
        ));
    }
}
