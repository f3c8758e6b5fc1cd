//! `rootfs.lock`: every Debian package of the node's rootfs — the whole closure mkosi installs,
//! essential packages included — pinned by name, version, archive URL, size and sha256, in the
//! TOML shape of `inputs.lock` (role `rootfs`).
//!
//! A build installs exactly these files and nothing from the live archive (`super::repo`: the
//! verified files become a local apt repository, the build's only Debian source), then checks
//! mkosi's manifest against the lock ([`verify_installed`]).
//!
//! `hawser image lock` makes it ([`resolve`]): mkosi builds the rootfs once from the live archive
//! (the sources in `mkosi.pkgmngr/`), its manifest names every installed package and version,
//! and a private apt with the same sources gives each one's URL, size and sha256. Taking the
//! closure from mkosi's own run, not from a solver run beside it, pins exactly what mkosi
//! installs, including its two-stage install (the essential packages first, then the
//! configured ones).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::RootfsError;
use crate::inputs::{self, LockParseError, LockedPackage, PrivateApt, Role};

/// The lock file, at the workspace root next to `inputs.lock`.
pub const LOCK_FILE: &str = "rootfs.lock";

/// The contents of `rootfs.lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsLock {
    /// The Debian release the packages are from: `mkosi.conf`'s `Release=`.
    pub suite: String,
    /// Sorted by name; each name once.
    #[serde(rename = "package")]
    pub packages: Vec<LockedPackage>,
}

/// Why the rootfs lock cannot be used, or does not match the build.
#[derive(Debug, thiserror::Error)]
pub enum RootfsLockError {
    /// The lock file is missing or unreadable.
    #[error("cannot read the rootfs lock {path} (make it with `hawser image lock`)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The lock is not TOML of the lock's shape, or a sha256 is malformed.
    #[error("the rootfs lock {path} is malformed")]
    Parse {
        path: PathBuf,
        #[source]
        source: LockParseError,
    },
    /// A package is pinned twice, or with another role than `rootfs`.
    #[error("the rootfs lock {path} is malformed: {problem}")]
    Invalid { path: PathBuf, problem: String },
    /// `mkosi.conf` names no release to pin.
    #[error("{path} has no Release= setting: the rootfs lock pins the packages of one release")]
    NoRelease { path: PathBuf },
    /// `mkosi.conf` cannot be read.
    #[error("cannot read {path}")]
    ReadConf {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The lock is for another Debian release than `mkosi.conf` builds.
    #[error(
        "{LOCK_FILE} pins packages of {lock_suite}, but mkosi.conf builds Release={conf_release}; \
         re-pin with `hawser image lock --only rootfs`"
    )]
    Release {
        lock_suite: String,
        conf_release: String,
    },
    /// `mkosi.conf` asks for packages the lock does not pin.
    #[error(
        "mkosi.conf installs {}, which {LOCK_FILE} does not pin; re-pin with \
         `hawser image lock --only rootfs` (that changes the node image and its measurements)",
        names.join(", ")
    )]
    Unpinned { names: Vec<String> },
    /// A pinned file is not what the lock says it is.
    #[error(
        "{LOCK_FILE} pins {} {} with {what} {locked}, but the verified file from {} has {found}: \
         the lock was edited by hand or is corrupt; re-pin with `hawser image lock --only rootfs`",
        .package.name, .package.version, .package.url
    )]
    Mismatch {
        package: Box<LockedPackage>,
        /// `package name`, `version`, `architecture`.
        what: &'static str,
        locked: String,
        found: String,
    },
    /// mkosi installed other packages or versions than the lock pins.
    #[error(
        "mkosi installed other packages than {LOCK_FILE} pins (locked → installed):\n  {}\n\
         re-pin with `hawser image lock --only rootfs` if mkosi.conf changed",
        changes.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
    )]
    Drift { changes: Vec<PackageChange> },
    /// Packages mkosi installed from the live archive are not offered by it as files.
    #[error(
        "the Debian archive ({sources}) offers no file for {}: they cannot be pinned",
        packages.join(", ")
    )]
    NotInArchive {
        sources: String,
        packages: Vec<String>,
    },
}

impl RootfsLock {
    /// Reads and validates `rootfs.lock`.
    pub fn load(path: &Path) -> Result<Self, RootfsLockError> {
        let text = std::fs::read_to_string(path).map_err(|source| RootfsLockError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses lock text; `path` is for messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, RootfsLockError> {
        let lock: Self = toml::from_str(text).map_err(|e| RootfsLockError::Parse {
            path: path.to_owned(),
            source: LockParseError::Toml(e),
        })?;
        let invalid = |problem: String| RootfsLockError::Invalid {
            path: path.to_owned(),
            problem,
        };
        let mut seen = std::collections::BTreeSet::new();
        for p in &lock.packages {
            if p.sha256.len() != 64 || !p.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(RootfsLockError::Parse {
                    path: path.to_owned(),
                    source: LockParseError::MalformedSha256 {
                        package: p.name.clone(),
                        sha256: p.sha256.clone(),
                    },
                });
            }
            if p.role != Role::Rootfs {
                return Err(invalid(format!(
                    "{} has role {:?}; every package here is `rootfs`",
                    p.name, p.role
                )));
            }
            if !seen.insert(p.name.as_str()) {
                return Err(invalid(format!("{} is pinned twice", p.name)));
            }
        }
        if lock.packages.is_empty() {
            return Err(invalid("it pins no package".into()));
        }
        Ok(lock)
    }

    /// The lock as written to disk: a header, then TOML.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# hawser node rootfs: every Debian package mkosi installs (the whole closure, essential\n\
             # packages included), pinned by version and sha256; the build installs these files and\n\
             # nothing else. Regenerate with `hawser image lock` (that changes the node image and its\n\
             # measurements).\n",
        );
        // Serializing plain strings and integers cannot fail.
        out.push_str(&toml::to_string(self).unwrap_or_default());
        out
    }

    /// sha256 over the rendered lock: names the exact package set in measurement metadata.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.render().as_bytes()))
    }

    /// Package name → version.
    pub fn versions(&self) -> BTreeMap<String, String> {
        self.packages
            .iter()
            .map(|p| (p.name.clone(), p.version.clone()))
            .collect()
    }
}

/// One package whose version differs between two package sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageChange {
    pub name: String,
    /// The version in the first set (`None`: not in it).
    pub before: Option<String>,
    /// The version in the second set (`None`: not in it).
    pub after: Option<String>,
}

impl fmt::Display for PackageChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
        write!(f, "{} {} → {}", self.name, v(&self.before), v(&self.after))
    }
}

/// The packages whose versions differ between `before` and `after` (name → version), by name.
pub fn package_drift(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<PackageChange> {
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| before.get(*n) != after.get(*n))
        .map(|n| PackageChange {
            name: n.clone(),
            before: before.get(n).cloned(),
            after: after.get(n).cloned(),
        })
        .collect()
}

/// Checks what mkosi installed (its manifest: name → version) against the lock: every locked
/// package at its version, and nothing else.
pub fn verify_installed(
    lock: &RootfsLock,
    installed: &BTreeMap<String, String>,
) -> Result<(), RootfsLockError> {
    let changes = package_drift(&lock.versions(), installed);
    if changes.is_empty() {
        Ok(())
    } else {
        Err(RootfsLockError::Drift { changes })
    }
}

/// What the build needs from `mkosi.conf`: the release and the configured packages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MkosiConf {
    pub release: Option<String>,
    pub packages: Vec<String>,
}

impl MkosiConf {
    /// Reads `mkosi.conf`.
    pub fn load(path: &Path) -> Result<Self, RootfsLockError> {
        let text = std::fs::read_to_string(path).map_err(|source| RootfsLockError::ReadConf {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::parse(&text))
    }

    /// The configured release, which a lock must be for.
    pub fn release_or_error(&self, path: &Path) -> Result<&str, RootfsLockError> {
        self.release
            .as_deref()
            .ok_or_else(|| RootfsLockError::NoRelease {
                path: path.to_owned(),
            })
    }

    /// Parses the `Release=` and `Packages=` settings (systemd-style: `Key=value`, values
    /// continued on indented lines, `#` comments; packages separated by commas or blanks).
    pub fn parse(text: &str) -> Self {
        let mut conf = Self::default();
        let mut key = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
                continue;
            }
            let value = if line.starts_with(char::is_whitespace) {
                trimmed
            } else if trimmed.starts_with('[') {
                key.clear();
                continue;
            } else if let Some((k, v)) = trimmed.split_once('=') {
                key = k.trim().to_owned();
                v.trim()
            } else {
                continue;
            };
            match key.as_str() {
                "Release" if !value.is_empty() => conf.release = Some(value.to_owned()),
                "Packages" => conf.packages.extend(
                    value
                        .split(|c: char| c == ',' || c.is_whitespace())
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned),
                ),
                _ => {}
            }
        }
        conf
    }

    /// Whether `lock` fits this configuration: the same release, every configured package
    /// pinned. (A package the configuration no longer asks for shows after the build, as
    /// [`RootfsLockError::Drift`].)
    pub fn check(&self, lock: &RootfsLock) -> Result<(), RootfsLockError> {
        if let Some(release) = &self.release
            && *release != lock.suite
        {
            return Err(RootfsLockError::Release {
                lock_suite: lock.suite.clone(),
                conf_release: release.clone(),
            });
        }
        let pinned = lock.versions();
        let names: Vec<String> = self
            .packages
            .iter()
            .filter(|p| !pinned.contains_key(*p))
            .cloned()
            .collect();
        if names.is_empty() {
            Ok(())
        } else {
            Err(RootfsLockError::Unpinned { names })
        }
    }
}

/// Pins `installed` (name → version, from mkosi's manifest of a build from the live archive):
/// updates the private apt index of the rootfs's sources (`source_parts`, the directory
/// mkosi's apt reads them from) under `cache`, and asks it for each package's URL, size and
/// sha256.
pub fn resolve(
    installed: &BTreeMap<String, String>,
    suite: &str,
    source_parts: &Path,
    cache: &Path,
) -> Result<RootfsLock, RootfsError> {
    let apt = PrivateApt::with_sources(cache, &format!("apt-{suite}"), source_parts)?;
    tracing::info!(
        "updating the private {suite} package index under {}",
        apt.dir.display()
    );
    apt.run("apt-get", &["-qq", "update"])?;
    let wanted: Vec<String> = installed.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let mut args = vec!["download", "--print-uris", "-qq"];
    args.extend(wanted.iter().map(String::as_str));
    let uris = match apt.run("apt-get", &args) {
        Ok(uris) => uris,
        // apt refuses the whole list for one unknown version: find which, one by one.
        Err(_) => {
            let missing: Vec<String> = wanted
                .iter()
                .filter(|w| {
                    apt.run("apt-get", &["download", "--print-uris", "-qq", w])
                        .is_err()
                })
                .cloned()
                .collect();
            return Err(RootfsLockError::NotInArchive {
                sources: source_parts.display().to_string(),
                packages: missing,
            }
            .into());
        }
    };
    let packages = packages_from_print_uris(&uris, installed).map_err(|packages| {
        RootfsLockError::NotInArchive {
            sources: source_parts.display().to_string(),
            packages,
        }
    })?;
    Ok(RootfsLock {
        suite: suite.to_owned(),
        packages,
    })
}

/// The locked packages from `apt-get download --print-uris` output, one per `installed`
/// package at its version, sorted by name; `Err` lists the `name=version`s it lacks.
fn packages_from_print_uris(
    uris: &str,
    installed: &BTreeMap<String, String>,
) -> Result<Vec<LockedPackage>, Vec<String>> {
    let mut found: BTreeMap<String, LockedPackage> = BTreeMap::new();
    for line in uris.lines() {
        // `'URL' name_version_arch.deb SIZE SHA256:…`
        let Some(name) = line
            .split_whitespace()
            .nth(1)
            .and_then(|file| file.split('_').next())
        else {
            continue;
        };
        if let Some(pkg) = inputs::parse_print_uris(line, name, Role::Rootfs)
            && installed.get(name) == Some(&pkg.version)
        {
            found.insert(name.to_owned(), pkg);
        }
    }
    let missing: Vec<String> = installed
        .iter()
        .filter(|(n, _)| !found.contains_key(*n))
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    if missing.is_empty() {
        Ok(found.into_values().collect())
    } else {
        Err(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, version: &str) -> LockedPackage {
        LockedPackage {
            name: name.into(),
            version: version.into(),
            role: Role::Rootfs,
            url: format!("http://deb.debian.org/debian/pool/main/x/{name}_{version}_amd64.deb"),
            size: 1000,
            sha256: "ab".repeat(32),
        }
    }

    fn lock(packages: &[(&str, &str)]) -> RootfsLock {
        RootfsLock {
            suite: "bookworm".into(),
            packages: packages.iter().map(|(n, v)| pkg(n, v)).collect(),
        }
    }

    fn versions(packages: &[(&str, &str)]) -> BTreeMap<String, String> {
        packages
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn lock_round_trips_and_its_digest_follows_its_content() {
        let a = lock(&[("bash", "5.2.15-2+b7"), ("libc6", "2.36-9+deb12u13")]);
        let text = a.render();
        assert!(text.contains("role = \"rootfs\""), "{text}");
        let parsed = RootfsLock::parse(&text, Path::new("rootfs.lock")).unwrap();
        assert_eq!(parsed, a);
        assert_eq!(parsed.digest(), a.digest());
        let mut b = a.clone();
        b.packages[0].sha256 = "cd".repeat(32);
        assert_ne!(a.digest(), b.digest(), "a new sha256 is a new lock");
    }

    #[test]
    fn malformed_locks_are_refused_naming_the_package() {
        let path = Path::new("rootfs.lock");
        let good = lock(&[("bash", "5.2.15-2+b7")]).render();
        let err = RootfsLock::parse(&good.replace(&"ab".repeat(32), "abcd"), path).unwrap_err();
        assert!(
            format!("{:?}", err).contains("bash") && err.to_string().contains("malformed"),
            "{err:?}"
        );
        let err = RootfsLock::parse(&good.replace("\"rootfs\"", "\"library\""), path).unwrap_err();
        assert!(err.to_string().contains("bash has role Library"), "{err}");
        let twice = lock(&[("bash", "1"), ("bash", "2")]).render();
        let err = RootfsLock::parse(&twice, path).unwrap_err();
        assert!(err.to_string().contains("bash is pinned twice"), "{err}");
        let err = RootfsLock::parse("suite = \"bookworm\"\npackage = []\n", path).unwrap_err();
        assert!(err.to_string().contains("pins no package"), "{err}");
        let err = RootfsLock::parse("suite = 3", path).unwrap_err();
        assert!(err.to_string().contains("is malformed"), "{err}");
    }

    #[test]
    fn committed_lock_parses_and_pins_what_mkosi_conf_asks_for() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let lock = RootfsLock::load(&root.join(LOCK_FILE)).unwrap_or_else(|e| panic!("{e}"));
        let conf = MkosiConf::load(&root.join("mkosi.conf")).unwrap();
        assert_eq!(conf.release.as_deref(), Some("bookworm"));
        assert!(conf.packages.contains(&"containerd".to_owned()));
        conf.check(&lock).unwrap_or_else(|e| panic!("{e}"));
        // The closure includes the essential packages mkosi installs first.
        for essential in ["base-files", "dpkg", "libc6", "coreutils"] {
            assert!(lock.versions().contains_key(essential), "{essential}");
        }
        let mut names: Vec<&str> = lock.packages.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            lock.packages
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            "sorted by name"
        );
        for p in &lock.packages {
            assert!(p.url.starts_with("http://deb.debian.org/"), "{}", p.url);
        }
    }

    #[test]
    fn mkosi_conf_settings_are_read_across_continuation_lines() {
        let conf = MkosiConf::parse(
            "# comment\n[Distribution]\nDistribution=debian\nRelease=bookworm\n\n[Content]\n\
             Packages=a,b\n    c\n    # not a package\n    d e\nRemoveFiles=\n    /var/log\n",
        );
        assert_eq!(conf.release.as_deref(), Some("bookworm"));
        assert_eq!(conf.packages, ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn a_configured_package_missing_from_the_lock_or_another_release_is_named() {
        let l = lock(&[("containerd", "1.6.20"), ("runc", "1.1.5")]);
        let conf = MkosiConf {
            release: Some("bookworm".into()),
            packages: vec!["containerd".into(), "socat".into(), "runc".into()],
        };
        let err = conf.check(&l).unwrap_err().to_string();
        assert!(
            err.starts_with("mkosi.conf installs socat, which rootfs.lock does not pin"),
            "{err}"
        );
        let conf = MkosiConf {
            release: Some("trixie".into()),
            packages: vec![],
        };
        let err = conf.check(&l).unwrap_err().to_string();
        assert!(err.contains("Release=trixie"), "{err}");
    }

    #[test]
    fn a_changed_installed_version_is_drift_naming_the_package_old_and_new() {
        let l = lock(&[("bash", "5.2.15-2+b7"), ("libc6", "2.36-9+deb12u13")]);
        assert!(
            verify_installed(
                &l,
                &versions(&[("bash", "5.2.15-2+b7"), ("libc6", "2.36-9+deb12u13")]),
            )
            .is_ok()
        );
        let err = verify_installed(
            &l,
            &versions(&[("bash", "5.2.15-2+b8"), ("libc6", "2.36-9+deb12u13")]),
        )
        .unwrap_err();
        let RootfsLockError::Drift { changes } = &err else {
            panic!("{err}")
        };
        assert_eq!(
            changes,
            &[PackageChange {
                name: "bash".into(),
                before: Some("5.2.15-2+b7".into()),
                after: Some("5.2.15-2+b8".into()),
            }]
        );
        assert!(
            err.to_string()
                .contains("\n  bash 5.2.15-2+b7 → 5.2.15-2+b8\n"),
            "{err}"
        );
    }

    #[test]
    fn extra_and_missing_packages_are_drift() {
        let l = lock(&[("bash", "1"), ("gone", "2")]);
        let installed = versions(&[("bash", "1"), ("kubeadm", "1.33.1-1.1"), ("new", "3")]);
        let err = verify_installed(&l, &installed).unwrap_err().to_string();
        assert!(err.contains("gone 2 → (none)"), "{err}");
        assert!(err.contains("new (none) → 3"), "{err}");
        assert!(err.contains("kubeadm (none) → 1.33.1-1.1"), "{err}");
    }

    #[test]
    fn print_uris_output_becomes_locked_packages_or_names_what_is_missing() {
        let uris = "'http://deb.debian.org/debian/pool/main/b/bash/bash_5.2.15-2%2bb7_amd64.deb' bash_5.2.15-2+b7_amd64.deb 1482340 SHA256:ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01\n\
                    'http://deb.debian.org/debian/pool/main/a/adduser/adduser_3.134_all.deb' adduser_3.134_all.deb 1000 SHA256:cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01cd01\n";
        let packages = packages_from_print_uris(
            uris,
            &versions(&[("bash", "5.2.15-2+b7"), ("adduser", "3.134")]),
        )
        .unwrap();
        let names: Vec<&str> = packages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["adduser", "bash"]);
        assert_eq!(packages[1].size, 1_482_340);
        assert!(packages.iter().all(|p| p.role == Role::Rootfs));
        let missing = packages_from_print_uris(
            uris,
            &versions(&[("bash", "5.2.15-2+b8"), ("adduser", "3.134")]),
        )
        .unwrap_err();
        assert_eq!(missing, ["bash=5.2.15-2+b8"]);
    }
}
