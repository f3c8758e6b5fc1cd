//! The real Kubernetes build from `kubernetes.lock`: the six binaries built from Debian's source
//! with the pinned Go toolchain each report v1.20.2, a second run takes them from the cache, and
//! a second kubeadm build from another unpack directory with an empty Go cache gives the same
//! bytes.
//!
//! Slow (a cold build of the six is several minutes on 2 cores, plus kubeadm's again) and needs
//! the network for the first fetch (deb.debian.org), so `#[ignore]`: scripts/test's stage
//! "Kubernetes from the pinned source" runs it with `--ignored`.
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
#[ignore = "slow: builds Kubernetes from source, and kubeadm once more (minutes cold); scripts/test's Kubernetes stage runs it"]
fn kubernetes_from_the_pinned_source_is_v1_20_2_cached_and_reproducible() {
    let (lock, epoch) = locks();
    let cache = inputs::cache_dir();
    let (_, first) =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &Binary::ALL, Origin::Source)
            .expect("build");
    for (step, took) in &first.timeline {
        println!("timing: {step}: {:.1} s", took.as_secs_f64());
    }
    assert_eq!(first.binaries.len(), Binary::ALL.len());
    for built in &first.binaries {
        // kubeadm has a `version` command; the others a `--version` flag.
        let args: &[&str] = if built.binary == Binary::Kubeadm {
            &["version", "-o", "short"]
        } else {
            &["--version"]
        };
        let out = Command::new(&built.path)
            .args(args)
            .output()
            .expect("run a built binary");
        assert!(out.status.success(), "{}: {out:?}", built.binary.name());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.trim() == "v1.20.2" || text.trim() == "Kubernetes v1.20.2",
            "{} reports {text:?}",
            built.binary.name()
        );
    }
    let kubeadm = first
        .binaries
        .iter()
        .find(|b| b.binary == Binary::Kubeadm)
        .expect("kubeadm built");

    // A second run reuses every binary (its sha256 checked against the manifest).
    let (again, second) =
        kubernetes::fetch_and_build(&lock, &cache, epoch, &Binary::ALL, Origin::Source)
            .expect("rebuild");
    let again = again.expect("the source origin returns its unpacked tree");
    assert!(!again.fresh, "the unpacked input was not reused");
    for (built, cached) in first.binaries.iter().zip(&second.binaries) {
        assert!(
            cached.cached,
            "{} was rebuilt, not reused",
            built.binary.name()
        );
        assert_eq!(cached.sha256, built.sha256);
    }

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
