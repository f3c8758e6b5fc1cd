//! Fetching the Kubernetes input: every locked file downloaded once into the shared input cache
//! (`<cache>/sources/` for the source package, `<cache>/debs/` for `.deb`s) and checked against
//! its sha256 by the input fetcher, then unpacked under `<cache>/kubernetes/<digest>/`:
//! - `gopath/src/k8s.io/kubernetes`: `dpkg-source -x` of the `.dsc` (Debian's patches applied,
//!   the `.dsc`'s own checksums checked), the swapped libraries in place;
//! - `toolchain/`: the Go `.deb`s unpacked into one tree (`usr/lib/go-1.19/src` is a link into
//!   `usr/share/go-1.19`, the other package's), never installed.
//!
//! A stamp holding the digest marks a finished unpack; anything else there is redone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::{KubernetesError, KubernetesLock, lock_dir};
use crate::inputs::{cached_deb, download_verified};
use crate::tool::{self, io_error};

/// The import path of the tree in GOPATH mode.
pub const IMPORT_PATH: &str = "k8s.io/kubernetes";
const STAMP: &str = ".hawser-unpacked";

/// An unpacked Kubernetes input, ready to build.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// `<cache>/kubernetes/<digest>`.
    pub dir: PathBuf,
    /// `dir/gopath`.
    pub gopath: PathBuf,
    /// `gopath/src/k8s.io/kubernetes`.
    pub source: PathBuf,
    /// The Go toolchain's GOROOT (`toolchain/usr/lib/go-<version>`).
    pub goroot: PathBuf,
    /// Whether this call unpacked it (false: it already was).
    pub fresh: bool,
}

/// Downloads, verifies and unpacks the lock's files under `cache` unless they already are.
pub fn fetch(lock: &KubernetesLock, cache: &Path) -> Result<Unpacked, KubernetesError> {
    let dir = lock_dir(cache, lock);
    if std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s.trim() == lock.digest()) {
        tracing::info!("kubernetes: unpacked inputs cached at {}", dir.display());
        return locate(&dir, false);
    }
    download(lock, cache)?;
    unpack_into(lock, cache, &dir)?;
    locate(&dir, true)
}

/// Downloads and verifies every locked file (kept if already there with the locked sha256).
pub fn download(lock: &KubernetesLock, cache: &Path) -> Result<(), KubernetesError> {
    let sources = cache.join("sources");
    let debs = cache.join("debs");
    for d in [&sources, &debs] {
        std::fs::create_dir_all(d).map_err(io_error("create directory", d))?;
    }
    let total = lock.sources.len() + lock.toolchain.len() + lock.swaps.len();
    let mut files = Vec::new();
    files.extend(
        lock.sources
            .iter()
            .map(|s| (s.as_download(), sources.join(&s.file))),
    );
    files.extend(
        lock.toolchain
            .iter()
            .map(|p| (p.clone(), cached_deb(cache, p))),
    );
    files.extend(lock.swaps.iter().map(|s| {
        let p = s.as_download();
        let path = cached_deb(cache, &p);
        (p, path)
    }));
    for (i, (pkg, path)) in files.iter().enumerate() {
        let t = Instant::now();
        download_verified(pkg, path)?;
        tracing::info!(
            "kubernetes: input {}/{total} {} {} ({:.1} MiB) verified in {:.1}s",
            i + 1,
            pkg.name,
            pkg.version,
            pkg.size as f64 / 1048576.0,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Unpacks the (downloaded) lock's files into `dir`, by way of a scratch directory beside it.
pub fn unpack_into(lock: &KubernetesLock, cache: &Path, dir: &Path) -> Result<(), KubernetesError> {
    let t = Instant::now();
    let tmp = dir.with_extension("unpacking");
    let _ = std::fs::remove_dir_all(&tmp);
    let src_parent = tmp.join("gopath/src/k8s.io");
    std::fs::create_dir_all(&src_parent).map_err(io_error("create directory", &src_parent))?;
    let source = tmp.join("gopath/src").join(IMPORT_PATH);
    let dsc = lock.dsc().ok_or_else(|| KubernetesError::Layout {
        what: "a .dsc entry in the lock".into(),
        dir: cache.to_owned(),
    })?;
    run(
        Command::new("dpkg-source")
            .arg("-x")
            .arg(cache.join("sources").join(&dsc.file))
            .arg(&source),
        format!("unpacking {} with dpkg-source", dsc.file),
        "dpkg-dev",
    )?;
    let toolchain = tmp.join("toolchain");
    for pkg in &lock.toolchain {
        dpkg_deb_x(&cached_deb(cache, pkg), &toolchain, &pkg.name)?;
    }
    for swap in &lock.swaps {
        let pkg = swap.as_download();
        let unpacked = tmp.join("swap").join(&swap.name);
        dpkg_deb_x(&cached_deb(cache, &pkg), &unpacked, &swap.name)?;
        replace_dir(&unpacked.join(&swap.from), &source.join(&swap.into))?;
        tracing::info!(
            "kubernetes: {} replaced by {} {}",
            swap.into,
            swap.name,
            swap.version
        );
    }
    std::fs::write(tmp.join(STAMP), lock.digest()).map_err(io_error("write", &tmp.join(STAMP)))?;
    let _ = std::fs::remove_dir_all(dir);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(io_error("create directory", parent))?;
    }
    std::fs::rename(&tmp, dir).map_err(io_error("rename the unpacked tree to", dir))?;
    tracing::info!(
        "kubernetes: unpacked into {} in {:.1}s",
        dir.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn dpkg_deb_x(deb: &Path, into: &Path, name: &str) -> Result<(), KubernetesError> {
    std::fs::create_dir_all(into).map_err(io_error("create directory", into))?;
    run(
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(into),
        format!("unpacking {name}"),
        "dpkg",
    )
}

fn run(cmd: &mut Command, step: String, package: &'static str) -> Result<(), KubernetesError> {
    tool::run_tool(cmd.stdin(std::process::Stdio::null()))
        .map(|_| ())
        .map_err(|source| KubernetesError::Tool {
            step,
            package,
            source,
        })
}

/// Replaces the regular files of `into` (a vendored package, its subdirectories kept) by the
/// regular files of `from`.
pub(super) fn replace_dir(from: &Path, into: &Path) -> Result<(), KubernetesError> {
    if !from.is_dir() || !into.is_dir() {
        return Err(KubernetesError::Layout {
            what: format!(
                "the swap's directories {} and {}",
                from.display(),
                into.display()
            ),
            dir: into.to_owned(),
        });
    }
    for entry in std::fs::read_dir(into).map_err(io_error("list", into))? {
        let entry = entry.map_err(io_error("list", into))?;
        if entry
            .file_type()
            .map_err(io_error("stat", &entry.path()))?
            .is_file()
        {
            std::fs::remove_file(entry.path()).map_err(io_error("remove", &entry.path()))?;
        }
    }
    for entry in std::fs::read_dir(from).map_err(io_error("list", from))? {
        let entry = entry.map_err(io_error("list", from))?;
        if entry
            .file_type()
            .map_err(io_error("stat", &entry.path()))?
            .is_file()
        {
            let to = into.join(entry.file_name());
            std::fs::copy(entry.path(), &to).map_err(io_error("copy to", &to))?;
        }
    }
    Ok(())
}

/// Finds GOPATH, source tree and GOROOT in a directory [`unpack_into`] filled (`fresh`: whether
/// it was just unpacked).
pub fn locate(dir: &Path, fresh: bool) -> Result<Unpacked, KubernetesError> {
    let gopath = dir.join("gopath");
    let source = gopath.join("src").join(IMPORT_PATH);
    if !source.join("cmd/kubeadm").is_dir() {
        return Err(KubernetesError::Layout {
            what: "the Kubernetes tree (cmd/kubeadm)".into(),
            dir: source,
        });
    }
    let lib = dir.join("toolchain/usr/lib");
    let goroot = std::fs::read_dir(&lib)
        .map_err(io_error("list", &lib))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("go-"))
        })
        .find(|p| p.join("bin/go").is_file() && p.join("src/runtime").is_dir())
        .ok_or_else(|| KubernetesError::Layout {
            what: "a Go toolchain (go-*/bin/go with its src/runtime)".into(),
            dir: lib.clone(),
        })?;
    Ok(Unpacked {
        dir: dir.to_owned(),
        gopath,
        source,
        goroot,
        fresh,
    })
}
