//! The release origin: upstream's binaries, read out of the release tarball pinned in
//! `kubernetes.lock` (`[[release]]`), into the same layout the source build fills.
//!
//! For users who can reach the upstream release site: each `[[release]]` file is downloaded
//! through the shared input fetcher into `<cache>/releases/<version>/<file>` and checked against
//! the lock's sha512 (upstream's changelog lists sha512) before a byte of it is read. The wanted
//! members are then streamed out of the gzip-compressed tar into a scratch directory, each
//! checked to be a regular file of mode 0755; only when every one is there do they move to
//! `<cache>/kubernetes/<release digest>/bin/<name>`, with their sha256 in `bin/manifest.json`,
//! the layout and manifest of [`super::build`](mod@super::build). A refused download or tarball leaves `bin/` as it
//! was. A binary whose sha256 still matches the manifest is reused, not read out again.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::build::{cached_binary, read_manifest, sha256_file, write_manifest};
use super::{
    Binary, BuildReport, BuiltBinary, KubernetesError, KubernetesLock, Origin, ReleaseFile,
    origin_dir,
};
use crate::inputs::{InputError, download_pinned};
use crate::tool::io_error;

/// Where a release file is kept once downloaded and verified.
pub fn release_download_path(
    cache: &Path,
    lock: &KubernetesLock,
    release: &ReleaseFile,
) -> PathBuf {
    cache
        .join("releases")
        .join(&lock.version)
        .join(&release.file)
}

/// Provides `binaries` (each once, in [`Binary::ALL`] order) from the lock's release files unless
/// cached, and records them in the manifest.
pub fn fetch_release(
    lock: &KubernetesLock,
    cache: &Path,
    binaries: &[Binary],
) -> Result<BuildReport, KubernetesError> {
    if lock.releases.is_empty() {
        return Err(KubernetesError::NoRelease);
    }
    let mut wanted: Vec<Binary> = binaries.to_vec();
    wanted.sort();
    wanted.dedup();
    let dir = origin_dir(cache, lock, Origin::Release);
    let bin = dir.join("bin");
    let manifest_path = bin.join("manifest.json");
    let mut manifest = read_manifest(&manifest_path)?;
    let mut report = BuildReport::default();
    // The timeline starts with the fetch, as the source build's does; cache hits follow it.
    let mut cached_steps = Vec::new();

    // Each release file with the members still wanted from it, in lock order.
    let mut needed: Vec<(&ReleaseFile, Vec<(Binary, &str)>)> = Vec::new();
    for binary in wanted {
        let t = Instant::now();
        let path = bin.join(binary.name());
        if let Some(built) = cached_binary(&manifest, binary, &path, "reading it out again")? {
            cached_steps.push((format!("{} (cached)", binary.name()), t.elapsed()));
            report.binaries.push(built);
            continue;
        }
        let (release, member) = lock.release_of(binary).ok_or(KubernetesError::NoRelease)?;
        match needed.iter_mut().find(|(r, _)| r.file == release.file) {
            Some((_, members)) => members.push((binary, member)),
            None => needed.push((release, vec![(binary, member)])),
        }
    }
    if needed.is_empty() {
        report
            .timeline
            .push(("fetch (cached)".into(), std::time::Duration::ZERO));
        report.timeline.extend(cached_steps);
        return Ok(report);
    }

    // Per process: two runs over one cache do not read into each other's scratch.
    let scratch = dir.join(format!("bin.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let extracted = download_and_extract(lock, cache, &needed, &scratch, &mut report);
    let moved = extracted.and_then(|()| {
        std::fs::create_dir_all(&bin).map_err(io_error("create directory", &bin))?;
        for (_, members) in &needed {
            for (binary, _) in members {
                let path = bin.join(binary.name());
                let from = scratch.join(binary.name());
                std::fs::rename(&from, &path).map_err(io_error("rename the binary to", &path))?;
                let sha256 = sha256_file(&path)?;
                if let Some(old) = manifest.insert(binary.name().to_owned(), sha256.clone())
                    && old != sha256
                {
                    tracing::warn!(
                        "kubernetes: the manifest recorded {old} for {}; the pinned tarball's is {sha256}",
                        binary.name()
                    );
                }
                write_manifest(&manifest_path, &manifest)?;
                tracing::info!(
                    "kubernetes: {} from the release (sha256 {sha256})",
                    binary.name()
                );
                report.binaries.push(BuiltBinary {
                    binary: *binary,
                    path,
                    sha256,
                    cached: false,
                });
            }
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&scratch);
    moved?;
    report.timeline.extend(cached_steps);
    report.binaries.sort_by_key(|b| b.binary);
    Ok(report)
}

/// Downloads and verifies each needed release file, then reads its members into `scratch`.
fn download_and_extract(
    lock: &KubernetesLock,
    cache: &Path,
    needed: &[(&ReleaseFile, Vec<(Binary, &str)>)],
    scratch: &Path,
    report: &mut BuildReport,
) -> Result<(), KubernetesError> {
    std::fs::create_dir_all(scratch).map_err(io_error("create directory", scratch))?;
    for (i, (release, members)) in needed.iter().enumerate() {
        let path = release_download_path(cache, lock, release);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_error("create directory", parent))?;
        }
        let t = Instant::now();
        tracing::info!(
            "kubernetes: release file {}/{} {} from {} …",
            i + 1,
            needed.len(),
            release.file,
            release.url
        );
        download_pinned(&release.as_download(&lock.version), &path).map_err(|e| match e {
            InputError::Download { url, reason, .. } => KubernetesError::ReleaseDownload {
                file: release.file.clone(),
                url,
                reason,
            },
            InputError::Gone {
                url, http_status, ..
            } => KubernetesError::ReleaseDownload {
                file: release.file.clone(),
                url,
                reason: format!("HTTP {http_status}"),
            },
            other => other.into(),
        })?;
        let size = std::fs::metadata(&path)
            .map_err(io_error("stat", &path))?
            .len();
        tracing::info!(
            "kubernetes: release file {}/{} {} ({:.1} MiB) verified in {:.1}s",
            i + 1,
            needed.len(),
            release.file,
            size as f64 / 1048576.0,
            t.elapsed().as_secs_f64()
        );
        report
            .timeline
            .push((format!("fetch {}", release.file), t.elapsed()));
        let t = Instant::now();
        extract_members(&path, &release.file, members, scratch)?;
        tracing::info!(
            "kubernetes: {} binaries read out of {} in {:.1}s",
            members.len(),
            release.file,
            t.elapsed().as_secs_f64()
        );
        report.timeline.push((
            format!("extract {} from {}", members.len(), release.file),
            t.elapsed(),
        ));
    }
    Ok(())
}

/// Streams `members` of the tarball at `path` into `into/<binary name>` (mode 0755); stops
/// reading once all are found. Each must be there once, a regular file of mode 0755.
pub fn extract_members(
    path: &Path,
    file: &str,
    members: &[(Binary, &str)],
    into: &Path,
) -> Result<(), KubernetesError> {
    let archive_error = |source: std::io::Error| KubernetesError::ReleaseArchive {
        file: path.to_owned(),
        source,
    };
    let tarball = std::fs::File::open(path).map_err(io_error("open", path))?;
    let gz = flate2::read::GzDecoder::new(std::io::BufReader::new(tarball));
    let mut archive = tar::Archive::new(gz);
    let mut found: BTreeMap<&str, ()> = BTreeMap::new();
    for entry in archive.entries().map_err(archive_error)? {
        let mut entry = entry.map_err(archive_error)?;
        let entry_path = entry.path().map_err(archive_error)?.into_owned();
        let name = entry_path.to_string_lossy();
        let name = name.strip_prefix("./").unwrap_or(&name);
        let Some((binary, member)) = members.iter().find(|(_, m)| *m == name) else {
            continue;
        };
        let refuse = |found: String| KubernetesError::ReleaseMember {
            file: file.to_owned(),
            member: (*member).to_owned(),
            found,
        };
        if found.insert(member, ()).is_some() {
            return Err(refuse("in the tarball twice".into()));
        }
        let kind = entry.header().entry_type();
        if !kind.is_file() {
            return Err(refuse(format!("a {kind:?} entry")));
        }
        let mode = entry.header().mode().map_err(archive_error)? & 0o7777;
        if mode != 0o755 {
            return Err(refuse(format!("of mode {mode:04o}")));
        }
        let out = into.join(binary.name());
        copy_executable(&mut entry, &out, archive_error)?;
        if found.len() == members.len() {
            break;
        }
    }
    if let Some((_, member)) = members.iter().find(|(_, m)| !found.contains_key(m)) {
        return Err(KubernetesError::ReleaseMemberMissing {
            file: file.to_owned(),
            member: (*member).to_owned(),
        });
    }
    Ok(())
}

/// Writes `from` to `to` as a file of mode 0755 (whatever the umask); a read error is the
/// tarball's (`read_error`), a write error the cache's.
fn copy_executable(
    from: &mut impl Read,
    to: &Path,
    read_error: impl Fn(std::io::Error) -> KubernetesError,
) -> Result<(), KubernetesError> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::fs::File::create(to).map_err(io_error("create", to))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = from.read(&mut buf).map_err(&read_error)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(io_error("write", to))?;
    }
    out.set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(io_error("set the mode of", to))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tarball of `entries`: (path, mode, kind, bytes).
    fn tarball(dir: &Path, entries: &[(&str, u32, tar::EntryType, &[u8])]) -> PathBuf {
        let path = dir.join("k.tar.gz");
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        let mut builder = tar::Builder::new(gz);
        for (name, mode, kind, bytes) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(*mode);
            header.set_size(bytes.len() as u64);
            header.set_cksum();
            builder.append_data(&mut header, name, *bytes).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap();
        path
    }

    const KUBEADM: &str = "kubernetes/server/bin/kubeadm";

    #[test]
    fn reads_out_the_member_as_an_executable_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = tarball(
            dir.path(),
            &[
                (
                    "kubernetes/server/bin/kubectl",
                    0o755,
                    tar::EntryType::Regular,
                    b"x",
                ),
                (KUBEADM, 0o755, tar::EntryType::Regular, b"kubeadm bytes"),
            ],
        );
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        extract_members(&path, "k.tar.gz", &[(Binary::Kubeadm, KUBEADM)], &out).unwrap();
        assert_eq!(
            std::fs::read(out.join("kubeadm")).unwrap(),
            b"kubeadm bytes"
        );
        let names: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "only the wanted member");
    }

    #[test]
    fn refuses_a_link_another_mode_and_a_member_twice() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        for (entries, expect) in [
            (
                vec![(KUBEADM, 0o755, tar::EntryType::Symlink, &b""[..])],
                "is a Symlink entry",
            ),
            (
                vec![(KUBEADM, 0o775, tar::EntryType::Regular, &b"x"[..])],
                "is of mode 0775",
            ),
        ] {
            let path = tarball(dir.path(), &entries);
            let err = extract_members(&path, "k.tar.gz", &[(Binary::Kubeadm, KUBEADM)], &out)
                .unwrap_err();
            assert!(err.to_string().contains(expect), "{err}");
            assert!(err.to_string().contains(KUBEADM), "{err}");
        }
        let path = tarball(
            dir.path(),
            &[
                (KUBEADM, 0o755, tar::EntryType::Regular, b"x"),
                (KUBEADM, 0o755, tar::EntryType::Regular, b"y"),
            ],
        );
        let both = [
            (Binary::Kubeadm, KUBEADM),
            (Binary::KubeProxy, "kubernetes/server/bin/kube-proxy"),
        ];
        let err = extract_members(&path, "k.tar.gz", &both, &out).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }

    #[test]
    fn reads_a_tarball_gnu_tar_made_as_upstreams_release_script_does() {
        // build/lib/release.sh: `tar czf <file> -C <stage> kubernetes --owner=0 --group=0`.
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("stage/kubernetes/server/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("kubeadm"), b"kubeadm bytes").unwrap();
        std::fs::set_permissions(
            bin.join("kubeadm"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(bin.join("kubectl"), b"kubectl").unwrap();
        let path = dir.path().join("k.tar.gz");
        let status = std::process::Command::new("tar")
            .arg("czf")
            .arg(&path)
            .arg("-C")
            .arg(dir.path().join("stage"))
            .args(["kubernetes", "--owner=0", "--group=0"])
            .status()
            .expect("GNU tar (Debian package tar)");
        assert!(status.success());
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        extract_members(&path, "k.tar.gz", &[(Binary::Kubeadm, KUBEADM)], &out).unwrap();
        assert_eq!(
            std::fs::read(out.join("kubeadm")).unwrap(),
            b"kubeadm bytes"
        );
    }

    #[test]
    fn a_file_that_is_not_a_gzip_tar_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.tar.gz");
        std::fs::write(&path, b"not gzip").unwrap();
        let err = extract_members(&path, "k.tar.gz", &[(Binary::Kubeadm, KUBEADM)], dir.path())
            .unwrap_err();
        assert!(
            matches!(err, KubernetesError::ReleaseArchive { .. }),
            "{err:?}"
        );
    }
}
