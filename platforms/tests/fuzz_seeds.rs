//! The cargo-fuzz targets of `platforms/fuzz/` (what a cloud or a CPU sends: HCL and
//! SEV-SNP reports, RSA AKs, GCE's extension) over their seeds, as ordinary
//! tests (`hawser_harness::fuzz_seeds`): the targets compile as modules here, and each seed (and
//! a local corpus, if `scripts/fuzz` grew one) goes through the target's `run`. Real fuzzing:
//! `scripts/fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

#[path = "../fuzz/fuzz_targets/platform_reports.rs"]
mod platform_reports;

fn replay(target: &str, run: fn(&[u8])) {
    let ran = hawser_harness::fuzz_seeds::replay(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        target,
        run,
    )
    .unwrap();
    assert!(ran > 0);
}

#[test]
fn platform_reports_seeds() {
    replay("platform_reports", platform_reports::run);
}
