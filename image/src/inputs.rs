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

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::tool::{self, IoError, ToolError, io_error};

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
    ("libssl3t64", Role::Library),
    // libcrypto.so.3 needs these two.
    ("zlib1g", Role::Library),
    ("libzstd1", Role::Library),
    ("libtss2-esys-3.0.2-0t64", Role::Library),
    ("libtss2-sys1t64", Role::Library),
    ("libtss2-mu-4.0.1-0t64", Role::Library),
    ("libtss2-tctildr0t64", Role::Library),
    ("libtss2-tcti-device0t64", Role::Library),
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
    /// A downloaded file's sha256 differs from the lock.
    #[error(
        "{name} {version}: sha256 {actual} does not match the locked {expected}; the file was discarded"
    )]
    Checksum {
        name: String,
        version: String,
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

/// Where the fetched inputs are, ready for the image builder.
#[derive(Debug, Clone)]
pub struct FetchedInputs {
    /// `boot/vmlinuz-<release>` of the kernel package.
    pub kernel_image: PathBuf,
    /// `uname -r` of the guest kernel, e.g. `6.12.117+deb13-cloud-amd64`.
    pub kernel_release: String,
    /// `usr/lib/modules/<release>`.
    pub modules_dir: PathBuf,
    /// systemd-stub: `usr/lib/systemd/boot/efi/linuxx64.efi.stub`.
    pub stub: PathBuf,
    /// Unpacked library package trees, in lock order.
    pub lib_roots: Vec<PathBuf>,
    /// ukify 257 (`usr/bin/ukify` of the pinned systemd-ukify): run it with `/usr/bin/python3`,
    /// whose pefile and zstandard modules it needs.
    pub ukify: PathBuf,
    /// The lock digest these were fetched from.
    pub lock_digest: String,
}

/// Makes sure every locked package is downloaded, verified and unpacked under `cache`.
/// Already unpacked packages are not downloaded again.
pub fn fetch(lock: &InputLock, cache: &Path) -> Result<FetchedInputs, InputError> {
    let mut roots = Vec::new();
    for (i, pkg) in lock.packages.iter().enumerate() {
        let progress = format!("input {}/{}", i + 1, lock.packages.len());
        let root = fetch_package(pkg, cache, &progress)?;
        roots.push((pkg.role, pkg.name.clone(), root));
    }
    locate(lock, roots)
}

/// Downloads, verifies and unpacks one locked package under `cache` unless it already is, and
/// returns the directory it is unpacked in. `progress` heads the log line of a download
/// (e.g. "input 3/18").
pub fn fetch_package(
    pkg: &LockedPackage,
    cache: &Path,
    progress: &str,
) -> Result<PathBuf, InputError> {
    for dir in [cache.join("debs"), cache.join("inputs")] {
        std::fs::create_dir_all(&dir).map_err(io_error("create directory", &dir))?;
    }
    let root = unpacked_root(cache, pkg);
    if is_unpacked(pkg, &root) {
        tracing::debug!(package = %pkg.name, "input already unpacked");
        return Ok(root);
    }
    tracing::info!(
        "{progress}: {} {} ({:.1} MiB)",
        pkg.name,
        pkg.version,
        pkg.size as f64 / 1048576.0
    );
    let deb = cached_deb(cache, pkg);
    download_verified(pkg, &deb)?;
    unpack(pkg, &deb, &root)?;
    let stamp = root.join(STAMP);
    std::fs::write(&stamp, &pkg.sha256).map_err(io_error("write", &stamp))?;
    Ok(root)
}

/// Where a locked package is unpacked, and the stamp that says it was, from which `.deb`.
fn unpacked_root(cache: &Path, pkg: &LockedPackage) -> PathBuf {
    cache
        .join("inputs")
        .join(format!("{}_{}", pkg.name, pkg.version))
}
const STAMP: &str = ".hawser-sha256";

fn is_unpacked(pkg: &LockedPackage, root: &Path) -> bool {
    std::fs::read_to_string(root.join(STAMP)).is_ok_and(|s| s.trim() == pkg.sha256)
}

/// The locked inputs if every one is already unpacked under `cache`; never downloads (for
/// tests and tools that must not touch the network). A missing package is
/// [`InputError::NotFetched`].
pub fn cached(lock: &InputLock, cache: &Path) -> Result<FetchedInputs, InputError> {
    let mut roots = Vec::new();
    for pkg in &lock.packages {
        let root = unpacked_root(cache, pkg);
        if !is_unpacked(pkg, &root) {
            return Err(InputError::NotFetched {
                name: pkg.name.clone(),
                version: pkg.version.clone(),
            });
        }
        roots.push((pkg.role, pkg.name.clone(), root));
    }
    locate(lock, roots)
}

fn sha256_file(path: &Path) -> Result<String, InputError> {
    let mut file = std::fs::File::open(path).map_err(io_error("open", path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_error("read", path))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Where the `.deb` of a locked package is kept in the cache.
pub(crate) fn cached_deb(cache: &Path, pkg: &LockedPackage) -> PathBuf {
    cache.join("debs").join(format!(
        "{}_{}.deb",
        pkg.name,
        pkg.version.replace(':', "%3a")
    ))
}

/// Makes `deb` the locked file of `pkg`: kept if its sha256 is the locked one, else downloaded
/// and verified. A download with another sha256 is discarded ([`InputError::Checksum`]); a file
/// the archive no longer has is [`InputError::Gone`].
pub(crate) fn download_verified(pkg: &LockedPackage, deb: &Path) -> Result<(), InputError> {
    if deb.is_file() && sha256_file(deb)? == pkg.sha256 {
        return Ok(());
    }
    let partial = deb.with_extension("deb.partial");
    let output = Command::new("curl")
        .args([
            "--fail",
            "--location",
            "--silent",
            "--show-error",
            "--retry",
            "3",
            "--write-out",
            "%{http_code}",
            "--output",
        ])
        .arg(&partial)
        .arg(&pkg.url)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| InputError::Tool {
            step: format!("downloading {}", pkg.name),
            package: "curl",
            source: ToolError::Spawn {
                tool: "curl".into(),
                source,
            },
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        let http_status = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if matches!(http_status.as_str(), "404" | "410") {
            return Err(InputError::Gone {
                name: pkg.name.clone(),
                version: pkg.version.clone(),
                url: pkg.url.clone(),
                http_status,
            });
        }
        return Err(InputError::Download {
            name: pkg.name.clone(),
            version: pkg.version.clone(),
            url: pkg.url.clone(),
            reason: format!(
                "curl exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    let actual = sha256_file(&partial)?;
    if actual != pkg.sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(InputError::Checksum {
            name: pkg.name.clone(),
            version: pkg.version.clone(),
            expected: pkg.sha256.clone(),
            actual,
        });
    }
    std::fs::rename(&partial, deb).map_err(io_error("rename the download to", deb))?;
    Ok(())
}

fn unpack(pkg: &LockedPackage, deb: &Path, root: &Path) -> Result<(), InputError> {
    let tmp = root.with_extension("unpacking");
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(root);
    tool::run_tool(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tmp)).map_err(|source| {
        InputError::Tool {
            step: format!("unpacking {}", pkg.name),
            package: "dpkg",
            source,
        }
    })?;
    std::fs::rename(&tmp, root).map_err(io_error("rename the unpacked tree to", root))?;
    Ok(())
}

/// Finds kernel, modules and stub in the unpacked trees.
fn locate(
    lock: &InputLock,
    roots: Vec<(Role, String, PathBuf)>,
) -> Result<FetchedInputs, InputError> {
    let find = |role: Role| {
        roots
            .iter()
            .find(|(r, _, _)| *r == role)
            .ok_or(InputError::MissingRole { role })
    };
    let (_, kernel_name, kernel_root) = find(Role::Kernel)?;
    let modules_base = kernel_root.join("usr/lib/modules");
    let kernel_release = std::fs::read_dir(&modules_base)
        .map_err(io_error("list", &modules_base))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .ok_or_else(|| InputError::Layout {
            name: kernel_name.clone(),
            what: "modules directory",
            dir: modules_base.clone(),
        })?;
    let kernel_image = kernel_root.join(format!("boot/vmlinuz-{kernel_release}"));
    if !kernel_image.is_file() {
        return Err(InputError::Layout {
            name: kernel_name.clone(),
            what: "boot/vmlinuz-<release>",
            dir: kernel_root.clone(),
        });
    }
    let (_, stub_name, stub_root) = find(Role::Stub)?;
    let stub = stub_root.join("usr/lib/systemd/boot/efi/linuxx64.efi.stub");
    if !stub.is_file() {
        return Err(InputError::Layout {
            name: stub_name.clone(),
            what: "usr/lib/systemd/boot/efi/linuxx64.efi.stub",
            dir: stub_root.clone(),
        });
    }
    let (_, ukify_name, ukify_root) = find(Role::Tool)?;
    let ukify = ukify_root.join(UKIFY);
    if !ukify.is_file() {
        return Err(InputError::Layout {
            name: ukify_name.clone(),
            what: UKIFY,
            dir: ukify_root.clone(),
        });
    }
    Ok(FetchedInputs {
        ukify,
        modules_dir: modules_base.join(&kernel_release),
        kernel_image,
        kernel_release,
        stub,
        lib_roots: roots
            .iter()
            .filter(|(r, _, _)| *r == Role::Library)
            .map(|(_, _, p)| p.clone())
            .collect(),
        lock_digest: lock.digest(),
    })
}

/// ukify inside the unpacked systemd-ukify package.
pub const UKIFY: &str = "usr/bin/ukify";

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

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "'http://deb.debian.org/debian-security/pool/updates/main/o/openssl/libssl3t64_3.5.7-1%7edeb13u3_amd64.deb' \
        libssl3t64_3.5.7-1~deb13u3_amd64.deb 2458176 \
        SHA256:ff16bc048bcd7d1b256094450b79c77947d8e76fe2a24bd99b91021d591fa074";

    #[test]
    fn parses_apt_print_uris() {
        let p = parse_print_uris(LINE, "libssl3t64", Role::Library).unwrap();
        assert_eq!(p.version, "3.5.7-1~deb13u3");
        assert_eq!(p.size, 2458176);
        assert!(p.url.ends_with("libssl3t64_3.5.7-1%7edeb13u3_amd64.deb"));
        assert_eq!(p.sha256.len(), 64);
        assert!(
            parse_print_uris(LINE, "libssl3", Role::Library).is_none(),
            "name must match the file"
        );
        assert!(parse_print_uris("'u' f.deb x SHA256:00", "f", Role::Library).is_none());
    }

    #[test]
    fn lock_round_trips_and_rejects_bad_digests() {
        let lock = InputLock {
            suite: SUITE.into(),
            source_date_epoch: 1_767_225_600,
            packages: vec![parse_print_uris(LINE, "libssl3t64", Role::Library).unwrap()],
        };
        let text = lock.render();
        assert_eq!(InputLock::parse(&text).unwrap(), lock);
        assert_eq!(lock.digest(), InputLock::parse(&text).unwrap().digest());
        let broken = text.replace("ff16bc04", "zz16bc04");
        assert!(
            InputLock::parse(&broken)
                .unwrap_err()
                .to_string()
                .contains("malformed sha256")
        );
    }

    #[test]
    fn committed_lock_covers_every_role() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
        let lock = InputLock::load(&path).unwrap();
        for role in [Role::Kernel, Role::Stub, Role::Library, Role::Tool] {
            assert!(lock.by_role(role).next().is_some(), "{role:?} missing");
        }
        assert_eq!(lock.by_role(Role::Library).count(), WANTED.len() - 3);
        let stub = lock.by_role(Role::Stub).next().unwrap();
        let ukify = lock.by_role(Role::Tool).next().unwrap();
        assert_eq!(
            (ukify.name.as_str(), &ukify.version),
            ("systemd-ukify", &stub.version),
            "ukify must come from the same systemd as the stub it is compared on"
        );
    }

    #[test]
    fn tools_are_outside_the_image_digest() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
        let lock = InputLock::load(&path).unwrap();
        let mut image_only = lock.clone();
        image_only.packages.retain(|p| p.role != Role::Tool);
        assert_eq!(lock.digest(), image_only.digest());
        let mut other_tool = lock.clone();
        other_tool
            .packages
            .iter_mut()
            .filter(|p| p.role == Role::Tool)
            .for_each(|p| p.version.push_str("+other"));
        assert_eq!(lock.digest(), other_tool.digest());
        let mut other_kernel = lock.clone();
        other_kernel.packages[0].version.push_str("+other");
        assert_ne!(lock.digest(), other_kernel.digest(), "image packages count");
    }

    #[test]
    fn a_corrupted_download_is_refused_and_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let deb = dir.path().join("x.deb");
        let src = dir.path().join("src.deb");
        std::fs::write(&src, b"not the locked bytes").unwrap();
        let pkg = LockedPackage {
            name: "x".into(),
            version: "1".into(),
            role: Role::Library,
            url: format!("file://{}", src.display()),
            size: 20,
            sha256: "00".repeat(32),
        };
        let err = download_verified(&pkg, &deb).unwrap_err();
        assert!(matches!(err, InputError::Checksum { .. }), "{err}");
        assert!(!deb.exists() && !deb.with_extension("deb.partial").exists());
    }
}
