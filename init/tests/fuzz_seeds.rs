//! The cargo-fuzz targets of `init/fuzz/` (what a disk holds: the LUKS2
//! header) over their seeds, as ordinary
//! tests (`hawser_harness::fuzz_seeds`): the targets compile as modules here, and each seed (and
//! a local corpus, if `scripts/fuzz` grew one) goes through the target's `run`. Real fuzzing:
//! `scripts/fuzz`.

// The targets assert as a fuzzer sees a crash: with expect.
#![allow(clippy::expect_used, clippy::unwrap_used)]
#[path = "../fuzz/fuzz_targets/luks2_header.rs"]
mod luks2_header;

#[test]
fn luks2_header_seeds() {
    hawser_harness::fuzz_seeds::replay_or_fail(
        env!("CARGO_MANIFEST_DIR"),
        "luks2_header",
        luks2_header::run,
    );
}
