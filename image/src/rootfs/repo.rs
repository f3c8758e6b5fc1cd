//! The local apt repository a pinned build installs from: the `.deb` files `rootfs.lock` pins,
//! downloaded into hawser's cache (`<cache>/debs`, beside `inputs.lock`'s) and verified by
//! sha256, an index made from their own control data, and a package manager tree whose
//! `mkosi.sources` names that repository as the build's only Debian source. apt inside mkosi
//! can then install nothing but the pinned files.
//!
//! mkosi mounts the repository into its sandbox as its `LocalMirror=` (`--local-mirror`), at
//! the same path, where it also reads the essential packages it unpacks itself. The
//! repository is `Trusted: yes`: its files were verified against the lock, which is the trust
//! anchor here as `inputs.lock` is for the UKI's packages.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::RootfsError;
use super::lock::{LOCK_FILE, RootfsLock, RootfsLockError};
use crate::inputs::{self, InputError, LockedPackage};
use crate::tool::{self, ToolError, io_error};

/// The repository's directory under the cache.
const REPOSITORY_DIR: &str = "rootfs-repo";
/// The package manager tree, in the build's output directory.
const PACKAGE_MANAGER_TREE: &str = "rootfs-lock.pkgmngr";
/// The one component and architecture of the repository.
const COMPONENT: &str = "main";
const ARCHITECTURE: &str = "amd64";

/// A local repository of the locked files, ready for mkosi.
#[derive(Debug, Clone)]
pub struct LocalRepository {
    /// The repository (`dists/`, `pool/`): mkosi's `--local-mirror=file://<dir>`.
    pub dir: PathBuf,
    /// The package manager tree whose `mkosi.sources` replaces the workspace's.
    pub package_manager_tree: PathBuf,
}

/// Makes sure every locked `.deb` is in `<cache>/debs` with its locked sha256, downloading
/// what is missing; `progress` gets a line per download and a summary. Returns the files in
/// lock order.
pub fn fetch_locked_debs(
    lock: &RootfsLock,
    cache: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<PathBuf>, InputError> {
    let debs = cache.join("debs");
    std::fs::create_dir_all(&debs).map_err(io_error("create directory", &debs))?;
    let total = lock.packages.len();
    let mut downloaded = (0usize, 0u64);
    let mut files = Vec::with_capacity(total);
    for (i, pkg) in lock.packages.iter().enumerate() {
        let deb = inputs::cached_deb(cache, pkg);
        if !deb.is_file() {
            progress(&format!(
                "{LOCK_FILE} {}/{total}: downloading {} {} ({:.1} MiB)",
                i + 1,
                pkg.name,
                pkg.version,
                pkg.size as f64 / 1_048_576.0
            ));
            downloaded.0 += 1;
            downloaded.1 += pkg.size;
        }
        inputs::download_verified(pkg, &deb)?;
        files.push(deb);
    }
    progress(&format!(
        "rootfs: {total} packages pinned by {LOCK_FILE} (digest {}), sha256-verified in {}; \
         {} downloaded ({:.1} MiB)",
        &lock.digest()[..16],
        debs.display(),
        downloaded.0,
        downloaded.1 as f64 / 1_048_576.0
    ));
    Ok(files)
}

/// Fetches the locked files and makes the repository from them under `<cache>/rootfs-repo`,
/// anew for each build and for this build only (it takes a second; builds running at the same
/// time share nothing but the verified files), and the package manager tree under `out_dir`.
pub fn prepare_repository(
    lock: &RootfsLock,
    cache: &Path,
    out_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<LocalRepository, RootfsError> {
    let debs = fetch_locked_debs(lock, cache, progress)?;
    let dir =
        cache
            .join(REPOSITORY_DIR)
            .join(format!("{}-{}", &lock.digest()[..16], std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io_error("remove", &dir))?;
    }
    let pool = dir.join("pool");
    let index_dir = dir
        .join("dists")
        .join(&lock.suite)
        .join(COMPONENT)
        .join(format!("binary-{ARCHITECTURE}"));
    for d in [&pool, &index_dir] {
        std::fs::create_dir_all(d).map_err(io_error("create directory", d))?;
    }
    let mut index = String::new();
    for (pkg, deb) in lock.packages.iter().zip(&debs) {
        let file_name = deb
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let in_pool = pool.join(&file_name);
        if std::fs::hard_link(deb, &in_pool).is_err() {
            std::fs::copy(deb, &in_pool).map_err(io_error("copy a package to", &in_pool))?;
        }
        let control = control_of(pkg, deb)?;
        index.push_str(&index_stanza(pkg, &control, &format!("pool/{file_name}"))?);
    }
    let packages = index_dir.join("Packages");
    std::fs::write(&packages, &index).map_err(io_error("write", &packages))?;
    let release = dir.join("dists").join(&lock.suite).join("Release");
    std::fs::write(&release, release_file(&lock.suite, &index))
        .map_err(io_error("write", &release))?;

    let package_manager_tree = out_dir.join(PACKAGE_MANAGER_TREE);
    let sources_dir = package_manager_tree.join("etc/apt/sources.list.d");
    std::fs::create_dir_all(&sources_dir).map_err(io_error("create directory", &sources_dir))?;
    let sources = sources_dir.join("mkosi.sources");
    std::fs::write(&sources, sources_file(&dir, &lock.suite, &lock.digest()))
        .map_err(io_error("write", &sources))?;
    progress(&format!(
        "rootfs: local repository {} is the build's only Debian source",
        dir.display()
    ));
    Ok(LocalRepository {
        dir,
        package_manager_tree,
    })
}

impl LocalRepository {
    /// Removes the repository (the files stay in the cache) once mkosi is done with it.
    pub fn remove(self) -> Result<(), RootfsError> {
        std::fs::remove_dir_all(&self.dir).map_err(|e| io_error("remove", &self.dir)(e).into())
    }
}

/// The control paragraph of a verified `.deb` (`dpkg-deb --field`).
fn control_of(pkg: &LockedPackage, deb: &Path) -> Result<String, InputError> {
    let out = tool::run_tool(Command::new("dpkg-deb").arg("--field").arg(deb)).map_err(
        |source: ToolError| InputError::Tool {
            step: format!("reading the control data of {}", pkg.name),
            package: "dpkg",
            source,
        },
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of a control field (first line only).
fn field<'a>(control: &'a str, name: &str) -> Option<&'a str> {
    control.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (!l.starts_with(char::is_whitespace) && key == name).then(|| value.trim())
    })
}

/// The repository index's stanza of `pkg`: its control data, checked against the lock, plus
/// where the file is and its size and sha256.
fn index_stanza(
    pkg: &LockedPackage,
    control: &str,
    filename: &str,
) -> Result<String, RootfsLockError> {
    let mismatch =
        |what: &'static str, locked: &str, found: Option<&str>| RootfsLockError::Mismatch {
            package: Box::new(pkg.clone()),
            what,
            locked: locked.to_owned(),
            found: found.unwrap_or("none").to_owned(),
        };
    let name = field(control, "Package");
    if name != Some(pkg.name.as_str()) {
        return Err(mismatch("package name", &pkg.name, name));
    }
    let version = field(control, "Version");
    if version != Some(pkg.version.as_str()) {
        return Err(mismatch("version", &pkg.version, version));
    }
    let arch = field(control, "Architecture");
    if !matches!(arch, Some(ARCHITECTURE | "all")) {
        return Err(mismatch("architecture", ARCHITECTURE, arch));
    }
    let mut stanza = control.trim_end().to_owned();
    let _ = write!(
        stanza,
        "\nFilename: {filename}\nSize: {}\nSHA256: {}\n\n",
        pkg.size, pkg.sha256
    );
    Ok(stanza)
}

/// A `Release` file for the index: apt checks the index against its hash.
fn release_file(suite: &str, index: &str) -> String {
    format!(
        "Origin: hawser\nLabel: hawser rootfs.lock\nSuite: {suite}\nCodename: {suite}\n\
         Architectures: {ARCHITECTURE}\nComponents: {COMPONENT}\n\
         Description: the packages pinned by rootfs.lock\nSHA256:\n {} {} {COMPONENT}/binary-{ARCHITECTURE}/Packages\n",
        hex::encode(Sha256::digest(index.as_bytes())),
        index.len()
    )
}

/// The `mkosi.sources` of a pinned build.
fn sources_file(repository: &Path, suite: &str, digest: &str) -> String {
    format!(
        "# Written by hawser for a build pinned by {LOCK_FILE} (digest {digest}): the only apt\n\
         # source is the local repository of the pinned files, verified by sha256 against the lock.\n\
         Types: deb\nURIs: file://{}\nSuites: {suite}\nComponents: {COMPONENT}\nTrusted: yes\n",
        repository.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::Role;

    const CONTROL: &str = "Package: bash\nVersion: 5.2.15-2+b7\nArchitecture: amd64\n\
                           Essential: yes\nDescription: GNU Bourne Again SHell\n Bash is an sh-compatible\n";

    fn bash(version: &str) -> LockedPackage {
        LockedPackage {
            name: "bash".into(),
            version: version.into(),
            role: Role::Rootfs,
            url: "http://deb.debian.org/debian/pool/main/b/bash/bash_5.2.15-2%2bb7_amd64.deb"
                .into(),
            size: 1_482_340,
            sha256: "ab".repeat(32),
        }
    }

    #[test]
    fn the_index_stanza_is_the_control_data_plus_the_locked_file() {
        let stanza = index_stanza(&bash("5.2.15-2+b7"), CONTROL, "pool/bash.deb").unwrap();
        assert!(stanza.starts_with("Package: bash\n"), "{stanza}");
        assert!(stanza.contains("Essential: yes\n"), "{stanza}");
        assert!(
            stanza.ends_with(&format!(
                " Bash is an sh-compatible\nFilename: pool/bash.deb\nSize: 1482340\nSHA256: {}\n\n",
                "ab".repeat(32)
            )),
            "{stanza}"
        );
    }

    #[test]
    fn a_file_of_another_version_than_the_lock_is_refused_naming_both() {
        let err = index_stanza(&bash("5.2.15-2+b9"), CONTROL, "pool/bash.deb")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pins bash 5.2.15-2+b9 with version 5.2.15-2+b9")
                && err.contains("has 5.2.15-2+b7"),
            "{err}"
        );
        let err = index_stanza(
            &bash("5.2.15-2+b7"),
            &CONTROL.replace("amd64", "arm64"),
            "p",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("architecture"), "{err}");
    }

    #[test]
    fn the_release_file_hashes_the_index_and_the_sources_trust_only_it() {
        let release = release_file("bookworm", "Package: a\n\n");
        assert!(release.contains("Codename: bookworm\n"));
        assert!(release.contains(&format!(
            " {} 12 main/binary-amd64/Packages\n",
            hex::encode(Sha256::digest(b"Package: a\n\n"))
        )));
        let sources = sources_file(Path::new("/c/rootfs-repo"), "bookworm", "d1");
        assert!(sources.contains("URIs: file:///c/rootfs-repo\nSuites: bookworm\n"));
        assert_eq!(sources.matches("URIs:").count(), 1, "one source only");
    }

    #[test]
    fn a_corrupted_cached_file_is_downloaded_again_and_refused_if_still_wrong() {
        let cache = tempfile::tempdir().unwrap();
        let src = cache.path().join("served.deb");
        std::fs::write(&src, b"not the locked bytes").unwrap();
        let mut pkg = bash("5.2.15-2+b7");
        pkg.url = format!("file://{}", src.display());
        let lock = RootfsLock {
            suite: "bookworm".into(),
            packages: vec![pkg],
        };
        let mut lines = Vec::new();
        let err =
            fetch_locked_debs(&lock, cache.path(), &mut |l| lines.push(l.to_owned())).unwrap_err();
        assert!(
            matches!(&err, InputError::Checksum { name, .. } if name == "bash"),
            "{err}"
        );
        assert!(
            lines[0].contains("rootfs.lock 1/1: downloading bash 5.2.15-2+b7"),
            "{lines:?}"
        );
    }
}
