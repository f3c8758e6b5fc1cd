//! Fetching the locked inputs: each `.deb` downloaded once into the cache, checked against the
//! lock's sha256, unpacked there, and located for the image builder ([`FetchedInputs`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256, Sha512};

use super::{InputError, InputLock, LockedPackage, Role};
use crate::tool::{self, ToolError, io_error};

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

fn hash_file<D: Digest + std::io::Write>(path: &Path) -> Result<String, InputError> {
    let mut file = std::fs::File::open(path).map_err(io_error("open", path))?;
    let mut hasher = D::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_error("read", path))?;
    Ok(hex::encode(hasher.finalize()))
}

/// The digest a pinned file must have: Debian's archive pins by sha256, upstream Kubernetes
/// publishes sha512.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin<'a> {
    Sha256(&'a str),
    Sha512(&'a str),
}

impl<'a> Pin<'a> {
    fn algorithm(self) -> &'static str {
        match self {
            Pin::Sha256(_) => "sha256",
            Pin::Sha512(_) => "sha512",
        }
    }

    fn expected(self) -> &'a str {
        match self {
            Pin::Sha256(hex) | Pin::Sha512(hex) => hex,
        }
    }

    fn actual(self, path: &Path) -> Result<String, InputError> {
        match self {
            Pin::Sha256(_) => hash_file::<Sha256>(path),
            Pin::Sha512(_) => hash_file::<Sha512>(path),
        }
    }
}

/// A file to download: what the error messages call it, where it is, what it must hash to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PinnedFile<'a> {
    pub name: &'a str,
    pub version: &'a str,
    /// http(s), or `file://` (a local mirror; the tests).
    pub url: &'a str,
    pub pin: Pin<'a>,
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
    download_pinned(
        &PinnedFile {
            name: &pkg.name,
            version: &pkg.version,
            url: &pkg.url,
            pin: Pin::Sha256(&pkg.sha256),
        },
        deb,
    )
}

/// Makes `path` the pinned file: kept if its digest is the pinned one, else downloaded (by way
/// of `<path>.partial`) and verified; a download with another digest is discarded.
pub(crate) fn download_pinned(file: &PinnedFile<'_>, path: &Path) -> Result<(), InputError> {
    let expected = file.pin.expected();
    if path.is_file() && file.pin.actual(path)? == expected {
        return Ok(());
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
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
        .arg(file.url)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| InputError::Tool {
            step: format!("downloading {}", file.name),
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
                name: file.name.to_owned(),
                version: file.version.to_owned(),
                url: file.url.to_owned(),
                http_status,
            });
        }
        // Each of curl's retries repeats its message: say it once.
        let stderr = String::from_utf8_lossy(&output.stderr);
        let mut lines: Vec<&str> = stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines.dedup();
        return Err(InputError::Download {
            name: file.name.to_owned(),
            version: file.version.to_owned(),
            url: file.url.to_owned(),
            reason: format!("curl exited with {}: {}", output.status, lines.join("; ")),
        });
    }
    let actual = file.pin.actual(&partial)?;
    if actual != expected {
        let _ = std::fs::remove_file(&partial);
        return Err(InputError::Checksum {
            name: file.name.to_owned(),
            version: file.version.to_owned(),
            algorithm: file.pin.algorithm(),
            expected: expected.to_owned(),
            actual,
        });
    }
    std::fs::rename(&partial, path).map_err(io_error("rename the download to", path))?;
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
