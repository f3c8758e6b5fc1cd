//! Re-resolving the lock (`hawser image lock`): a private apt configuration under the cache,
//! never the host's, and the parse of `apt-get download --print-uris`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{InputError, InputLock, LockedPackage, Role, SUITE, WANTED};
use crate::tool::{self, io_error};

/// A private apt configuration under the cache: never touches the host's package state or
/// sources. [`PrivateApt::new`] is the image suite's; [`PrivateApt::with_sources`] reads
/// another directory of sources (the rootfs's `mkosi.pkgmngr/etc/apt/sources.list.d`).
pub(crate) struct PrivateApt {
    pub(crate) dir: PathBuf,
    /// `Dir::Etc::sourceparts`; `None`: the sources.list written under `dir`.
    source_parts: Option<PathBuf>,
}

impl PrivateApt {
    fn new(cache: &Path) -> Result<Self, InputError> {
        let dir = cache.join("apt");
        Self::create_dirs(&dir)?;
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let mut sources = String::new();
        for (url, suite) in [
            ("http://deb.debian.org/debian", SUITE.to_owned()),
            ("http://deb.debian.org/debian", format!("{SUITE}-updates")),
            (
                "http://deb.debian.org/debian-security",
                format!("{SUITE}-security"),
            ),
        ] {
            let _ = writeln!(sources, "deb [signed-by={keyring}] {url} {suite} main");
        }
        let list = dir.join("etc/sources.list");
        std::fs::write(&list, sources).map_err(io_error("write", &list))?;
        Ok(Self {
            dir,
            source_parts: None,
        })
    }

    /// A private apt under `cache/<subdir>` whose sources are the files in `source_parts`.
    pub(crate) fn with_sources(
        cache: &Path,
        subdir: &str,
        source_parts: &Path,
    ) -> Result<Self, InputError> {
        let dir = cache.join(subdir);
        Self::create_dirs(&dir)?;
        Ok(Self {
            dir,
            source_parts: Some(source_parts.to_owned()),
        })
    }

    fn create_dirs(dir: &Path) -> Result<(), InputError> {
        for sub in ["lists/partial", "archives/partial", "etc"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).map_err(io_error("create directory", &d))?;
        }
        let status = dir.join("status");
        if !status.exists() {
            std::fs::write(&status, "").map_err(io_error("write", &status))?;
        }
        Ok(())
    }

    fn command(&self, tool: &str) -> Command {
        let d = self.dir.display();
        let mut cmd = Command::new(tool);
        let (source_list, source_parts) = match &self.source_parts {
            Some(parts) => ("/dev/null".to_owned(), parts.display().to_string()),
            None => (format!("{d}/etc/sources.list"), "-".to_owned()),
        };
        for opt in [
            format!("Dir::Etc::sourcelist={source_list}"),
            format!("Dir::Etc::sourceparts={source_parts}"),
            "Acquire::Languages=none".into(),
            format!("Dir::State::Lists={d}/lists"),
            format!("Dir::Cache={d}"),
            "Dir::Cache::pkgcache=".into(),
            "Dir::Cache::srcpkgcache=".into(),
            format!("Dir::State::status={d}/status"),
            "APT::Architecture=amd64".into(),
            "Debug::NoLocking=1".into(),
        ] {
            cmd.arg("-o").arg(opt);
        }
        cmd
    }

    pub(crate) fn run(&self, tool: &str, args: &[&str]) -> Result<String, InputError> {
        let out =
            tool::run_tool(self.command(tool).args(args)).map_err(|source| InputError::Tool {
                step: format!("{tool} {}", args.join(" ")),
                package: "apt",
                source,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Resolves [`WANTED`] against the current archive and returns a fresh lock.
pub fn resolve_lock(cache: &Path) -> Result<InputLock, InputError> {
    let apt = PrivateApt::new(cache)?;
    tracing::info!(
        "updating the private {SUITE} package index under {}",
        apt.dir.display()
    );
    apt.run("apt-get", &["-qq", "update"])?;
    let mut packages = Vec::new();
    for (wanted, role) in WANTED {
        let mut name = (*wanted).to_owned();
        if *role == Role::Kernel {
            // Follow the meta-package to the versioned image it depends on.
            let deps = apt.run("apt-cache", &["depends", "--important", wanted])?;
            name = deps
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Depends: "))
                .find(|d| d.starts_with("linux-image-"))
                .ok_or_else(|| InputError::Resolve {
                    name: name.clone(),
                    suite: SUITE.into(),
                    reason: "the meta-package depends on no linux-image-*".into(),
                })?
                .trim()
                .to_owned();
        }
        let uris = apt.run("apt-get", &["download", "--print-uris", &name])?;
        let resolve_err = |reason: &str| InputError::Resolve {
            name: name.clone(),
            suite: SUITE.into(),
            reason: reason.into(),
        };
        let line = uris
            .lines()
            .next()
            .ok_or_else(|| resolve_err("no download URI"))?;
        packages.push(parse_print_uris(line, &name, *role).ok_or_else(|| resolve_err(line))?);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(InputLock {
        suite: SUITE.into(),
        // Whole days: the epoch only needs to be fixed, not precise.
        source_date_epoch: now - now % 86_400,
        packages,
    })
}

/// Parses one `apt-get download --print-uris` line:
/// `'URL' FILE SIZE SHA256:HEX`, where FILE is `name_version_arch.deb` (version `:` as `%3a`).
pub(crate) fn parse_print_uris(line: &str, name: &str, role: Role) -> Option<LockedPackage> {
    let mut fields = line.split_whitespace();
    let url = fields.next()?.trim_matches('\'').to_owned();
    let file = fields.next()?;
    let size = fields.next()?.parse().ok()?;
    let sha256 = fields.next()?.strip_prefix("SHA256:")?.to_owned();
    let rest = file.strip_prefix(name)?.strip_prefix('_')?;
    let version = rest.rsplit_once('_')?.0.replace("%3a", ":");
    Some(LockedPackage {
        name: name.to_owned(),
        version,
        role,
        url,
        size,
        sha256,
    })
}
