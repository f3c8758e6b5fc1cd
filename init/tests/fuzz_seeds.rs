//! The cargo-fuzz targets of `init/fuzz/` (what a disk holds: the LUKS2
//! header) over their seeds, as ordinary
//! tests (`hawser_harness::fuzz_seeds`): the targets compile as modules here, and each seed (and
//! a local corpus, if `scripts/fuzz` grew one) goes through the target's `run`. Real fuzzing:
//! `scripts/fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

#[path = "../fuzz/fuzz_targets/luks2_header.rs"]
mod luks2_header;

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
fn luks2_header_seeds() {
    replay("luks2_header", luks2_header::run);
}
