//! The release origin through the real code path, without the release site: the source-built
//! kubeadm and kube-scheduler, packed in upstream's layout (`kubernetes/server/bin/<name>` in
//! `kubernetes-server-linux-amd64.tar.gz`), are pinned by their real sha512 in a copy of
//! `kubernetes.lock` whose `[[release]]` URL is `file://`, and `fetch_and_build(.., Origin::Release)`
//! must put the same bytes at the same `bin/<name>` with the same manifest lines as the source
//! build. A wrong sha512, a tarball lacking a member and an unreachable URL are refused by name,
//! with nothing left in `bin/`.
//!
//! The first test needs the source build's binaries in the cache (`hawser image kubernetes
//! --only kubeadm,kube-scheduler`, ~4 min cold), so it is `#[ignore]`d and run by scripts/test's
//! Kubernetes stage after the build; the refusals use small stand-in members and run with the
//! unit tests. ~10 s.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hawser_image::inputs::{self, InputError, InputLock};
use hawser_image::kubernetes::{self, Binary, KubernetesError, KubernetesLock, Origin};
use sha2::{Digest, Sha512};

const FILE: &str = "kubernetes-server-linux-amd64.tar.gz";
const WANTED: [Binary; 2] = [Binary::Kubeadm, Binary::KubeScheduler];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn committed() -> (String, KubernetesLock, u64) {
    let text = std::fs::read_to_string(root().join(kubernetes::LOCK_FILE)).unwrap();
    let lock = KubernetesLock::parse(&text).unwrap();
    let epoch = InputLock::load(&root().join("inputs.lock"))
        .unwrap()
        .source_date_epoch;
    (text, lock, epoch)
}

/// The source build's `bin/` and manifest; fails naming the command that fills it.
fn source_build(lock: &KubernetesLock) -> (PathBuf, BTreeMap<String, String>) {
    let bin = kubernetes::lock_dir(&inputs::cache_dir(), lock).join("bin");
    let manifest: BTreeMap<String, String> = std::fs::read(bin.join("manifest.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    for b in WANTED {
        assert!(
            bin.join(b.name()).is_file() && manifest.contains_key(b.name()),
            "{} is not in {}: build it from the pinned source first with \
             `hawser image kubernetes --only kubeadm,kube-scheduler` (~4 min; \
             HAWSER_CACHE selects the cache)",
            b.name(),
            bin.display()
        );
    }
    (bin, manifest)
}

/// A gzip tar at `dir/FILE` in upstream's layout: `(name, bytes)` under `kubernetes/server/bin/`,
/// mode 0755, owner 0, plus the `.docker_tag` file upstream has beside each image binary.
fn upstream_tarball(dir: &Path, members: &[(&str, Vec<u8>)]) -> (PathBuf, String) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(FILE);
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    let mut tar = tar::Builder::new(gz);
    let mut append = |name: &str, mode: u32, kind: tar::EntryType, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(bytes.len() as u64);
        header.set_mtime(1_611_187_200);
        header.set_cksum();
        tar.append_data(&mut header, name, bytes).unwrap();
    };
    for d in [
        "kubernetes/",
        "kubernetes/server/",
        "kubernetes/server/bin/",
    ] {
        append(d, 0o755, tar::EntryType::Directory, b"");
    }
    append(
        "kubernetes/server/bin/kube-scheduler.docker_tag",
        0o644,
        tar::EntryType::Regular,
        b"v1.20.2",
    );
    for (name, bytes) in members {
        append(
            &format!("kubernetes/server/bin/{name}"),
            0o755,
            tar::EntryType::Regular,
            bytes,
        );
    }
    tar.into_inner().unwrap().finish().unwrap();
    let sha512 = hex::encode(Sha512::digest(std::fs::read(&path).unwrap()));
    (path, sha512)
}

/// The committed lock with its `[[release]]` pointing at `url`, pinned by `sha512`.
fn lock_for(text: &str, committed: &KubernetesLock, url: &str, sha512: &str) -> KubernetesLock {
    let release = &committed.releases[0];
    let text =
        text.replacen(&release.url, url, 1)
            .replacen(release.sha512.as_deref().unwrap(), sha512, 1);
    KubernetesLock::parse(&text).unwrap()
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

fn assert_nothing_in_bin(cache: &Path, lock: &KubernetesLock) {
    let dir = kubernetes::origin_dir(cache, lock, Origin::Release);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "{left:?} left in {} after a refusal",
        dir.display()
    );
}

// Needs the source build's binaries, which a fresh machine has only after scripts/test's stage
// "Kubernetes from the pinned source": that stage runs it with --ignored, right after.
#[test]
#[ignore = "needs the source-built kubeadm and kube-scheduler in the cache: scripts/test's Kubernetes stage runs it"]
fn release_binaries_land_in_the_source_builds_layout_with_the_same_bytes() {
    let (text, committed, epoch) = committed();
    let (source_bin, source_manifest) = source_build(&committed);
    let work = tempfile::tempdir().unwrap();
    let members: Vec<(&str, Vec<u8>)> = WANTED
        .iter()
        .map(|b| (b.name(), std::fs::read(source_bin.join(b.name())).unwrap()))
        .collect();
    let (tarball, sha512) = upstream_tarball(&work.path().join("mirror"), &members);
    let lock = lock_for(&text, &committed, &file_url(&tarball), &sha512);
    let cache = work.path().join("cache");

    let (unpacked, report) =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &WANTED, Origin::Release).unwrap();
    assert!(
        unpacked.is_none(),
        "the release origin unpacks no source tree"
    );
    let bin = kubernetes::origin_dir(&cache, &lock, Origin::Release).join("bin");
    assert_eq!(
        bin,
        cache
            .join("kubernetes")
            .join(lock.release_digest())
            .join("bin")
    );
    let names: Vec<Binary> = report.binaries.iter().map(|b| b.binary).collect();
    assert_eq!(names, WANTED);
    for (built, (name, bytes)) in report.binaries.iter().zip(&members) {
        assert_eq!(built.path, bin.join(name));
        assert!(!built.cached);
        assert_eq!(&built.sha256, &source_manifest[*name], "{name}");
        assert!(
            std::fs::read(&built.path).unwrap() == *bytes,
            "{name}: the release's bytes differ from the source build's"
        );
        let mode = std::fs::metadata(&built.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755, "{name}");
    }
    let manifest: BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(bin.join("manifest.json")).unwrap()).unwrap();
    let expected: BTreeMap<String, String> = WANTED
        .iter()
        .map(|b| (b.name().to_owned(), source_manifest[b.name()].clone()))
        .collect();
    assert_eq!(manifest, expected);
    let steps: Vec<&str> = report.timeline.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        steps,
        [format!("fetch {FILE}"), format!("extract 2 from {FILE}")]
    );

    // A second run takes both from the cache, with the mirror gone.
    std::fs::remove_file(&tarball).unwrap();
    let (_, again) =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &WANTED, Origin::Release).unwrap();
    assert!(again.binaries.iter().all(|b| b.cached), "{again:?}");
    assert_eq!(again.timeline[0].0, "fetch (cached)");

    // The source origin of the same lock still finds its own cache: the release lines are
    // outside its key.
    assert_eq!(
        kubernetes::lock_dir(&inputs::cache_dir(), &lock).join("bin"),
        source_bin
    );
}

#[test]
fn a_wrong_sha512_is_refused_by_name_and_nothing_reaches_bin() {
    let (text, committed, epoch) = committed();
    let work = tempfile::tempdir().unwrap();
    let stub = vec![(Binary::Kubeadm.name(), b"not kubeadm".to_vec())];
    let (tarball, actual) = upstream_tarball(&work.path().join("mirror"), &stub);
    let wrong = "0".repeat(128);
    let lock = lock_for(&text, &committed, &file_url(&tarball), &wrong);
    let cache = work.path().join("cache");
    let err =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &WANTED, Origin::Release).unwrap_err();
    match &err {
        KubernetesError::Fetch(InputError::Checksum {
            name,
            algorithm,
            expected,
            actual: got,
            ..
        }) => {
            assert_eq!(name, FILE);
            assert_eq!(*algorithm, "sha512");
            assert_eq!(expected, &wrong);
            assert_eq!(got, &actual);
        }
        other => panic!("not a checksum refusal: {other:?}"),
    }
    let chain = anyhow_like(&err);
    assert!(chain.contains(FILE) && chain.contains(&wrong) && chain.contains(&actual));
    assert_nothing_in_bin(&cache, &lock);
    let download = cache.join("releases/v1.20.2").join(FILE);
    assert!(!download.exists(), "the refused download was kept");
}

#[test]
fn a_tarball_lacking_a_binary_is_refused_naming_the_member() {
    let (text, committed, epoch) = committed();
    let work = tempfile::tempdir().unwrap();
    let only_kubeadm = vec![(Binary::Kubeadm.name(), b"kubeadm".to_vec())];
    let (tarball, sha512) = upstream_tarball(&work.path().join("mirror"), &only_kubeadm);
    let lock = lock_for(&text, &committed, &file_url(&tarball), &sha512);
    let cache = work.path().join("cache");
    let err =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &WANTED, Origin::Release).unwrap_err();
    match &err {
        KubernetesError::ReleaseMemberMissing { file, member } => {
            assert_eq!(file, FILE);
            assert_eq!(member, "kubernetes/server/bin/kube-scheduler");
        }
        other => panic!("not a missing member: {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("has no member kubernetes/server/bin/kube-scheduler"),
        "{err}"
    );
    assert_nothing_in_bin(&cache, &lock);
}

#[test]
fn an_unreachable_release_site_is_named_with_the_way_out() {
    let (text, committed, epoch) = committed();
    let work = tempfile::tempdir().unwrap();
    let url = file_url(&work.path().join("nowhere").join(FILE));
    let lock = lock_for(&text, &committed, &url, &"0".repeat(128));
    let cache = work.path().join("cache");
    let err =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &WANTED, Origin::Release).unwrap_err();
    assert!(
        matches!(&err, KubernetesError::ReleaseDownload { url: u, .. } if *u == url),
        "{err:?}"
    );
    let message = err.to_string();
    for part in [FILE, url.as_str(), "--from source"] {
        assert!(message.contains(part), "{message} lacks {part}");
    }
    assert_nothing_in_bin(&cache, &lock);

    // A lock without [[release]] says what to add.
    let source_only = KubernetesLock {
        releases: Vec::new(),
        ..committed
    };
    let err = kubernetes::fetch_and_build(&source_only, &cache, epoch, &WANTED, Origin::Release)
        .unwrap_err();
    assert!(matches!(err, KubernetesError::NoRelease), "{err:?}");
}

/// The error and its sources, one per line, as the CLI prints them.
fn anyhow_like(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(&format!("\ncaused by: {s}"));
        source = s.source();
    }
    out
}
