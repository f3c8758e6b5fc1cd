//! The cargo-fuzz targets of `platforms/fuzz/` (what a cloud or a CPU sends: HCL and
//! SEV-SNP reports, RSA AKs, GCE's extension) over their seeds, as ordinary
//! tests (`hawser_harness::fuzz_seeds`): the targets compile as modules here, and each seed (and
//! a local corpus, if `scripts/fuzz` grew one) goes through the target's `run`. Real fuzzing:
//! `scripts/fuzz`.

// The targets assert as a fuzzer sees a crash: with expect.
#![allow(clippy::expect_used, clippy::unwrap_used)]
#[path = "../fuzz/fuzz_targets/platform_reports.rs"]
mod platform_reports;

#[test]
fn platform_reports_seeds() {
    hawser_harness::fuzz_seeds::replay_or_fail(
        env!("CARGO_MANIFEST_DIR"),
        "platform_reports",
        platform_reports::run,
    );
}
