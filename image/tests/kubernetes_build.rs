//! The real Kubernetes build from `kubernetes.lock`: kubeadm built from Debian's source with the
//! pinned Go toolchain reports v1.20.2, a second run takes it from the cache, and a second build
//! from another unpack directory with an empty Go cache gives the same bytes.
//!
//! Slow (a cold kubeadm build is ~5 min on 2 shared cores, twice) and needs the network for the
//! first fetch (deb.debian.org), so `#[ignore]`: scripts/test's stage "Kubernetes from the pinned
//! source" runs it with `--ignored` (wired by the coordinator).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::Path;
use std::process::Command;

use hawser_image::inputs::{self, InputLock};
use hawser_image::kubernetes::{self, Binary, KubernetesLock, Origin, fetch};

fn locks() -> (KubernetesLock, u64) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lock = KubernetesLock::load(&root.join(kubernetes::LOCK_FILE)).expect("kubernetes.lock");
    let epoch = InputLock::load(&root.join("inputs.lock"))
        .expect("inputs.lock")
        .source_date_epoch;
    (lock, epoch)
}

// Stage "Kubernetes from the pinned source" of scripts/test runs this with --ignored.
#[test]
#[ignore = "slow: builds kubeadm from source twice (~10 min cold); scripts/test's Kubernetes stage runs it"]
fn kubeadm_from_the_pinned_source_is_v1_20_2_cached_and_reproducible() {
    let (lock, epoch) = locks();
    let cache = inputs::cache_dir();
    let (_, first) =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &[Binary::Kubeadm], Origin::Source)
            .expect("build");
    let kubeadm = &first.binaries[0];
    let out = Command::new(&kubeadm.path)
        .args(["version", "-o", "short"])
        .output()
        .expect("run kubeadm");
    assert!(out.status.success(), "kubeadm version: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v1.20.2");

    // A second run reuses the binary (its sha256 checked against the manifest).
    let (again, second) =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &[Binary::Kubeadm], Origin::Source)
            .expect("rebuild");
    let again = again.expect("the source origin returns its unpacked tree");
    assert!(!again.fresh, "the unpacked input was not reused");
    assert!(second.binaries[0].cached, "kubeadm was rebuilt, not reused");
    assert_eq!(second.binaries[0].sha256, kubeadm.sha256);

    // Another unpack directory (another GOPATH) and an empty Go cache: the same bytes.
    let scratch = tempfile::tempdir_in(cache.join("kubernetes")).expect("scratch dir");
    let dir = scratch.path().join("elsewhere");
    fetch::unpack_into(&lock, &cache, &dir).expect("second unpack");
    let other = fetch::locate(&dir, true).expect("second layout");
    assert_ne!(other.gopath, again.gopath);
    let rebuilt =
        kubernetes::build(&other, &lock, epoch, &[Binary::Kubeadm]).expect("second build");
    assert!(!rebuilt.binaries[0].cached);
    assert_eq!(
        rebuilt.binaries[0].sha256,
        kubeadm.sha256,
        "kubeadm built in {} differs from the one built in {}",
        other.dir.display(),
        again.dir.display()
    );
}
