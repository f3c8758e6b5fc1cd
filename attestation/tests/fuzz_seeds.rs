//! The cargo-fuzz targets of `attestation/fuzz/` (what a peer sends: evidence, TPM
//! structures, the aTLS certificate) over their seeds, as ordinary
//! tests (`hawser_harness::fuzz_seeds`): the targets compile as modules here, and each seed (and
//! a local corpus, if `scripts/fuzz` grew one) goes through the target's `run`. Real fuzzing:
//! `scripts/fuzz`.
// A test: a failed assumption fails it. And evidence.rs and atls_certificate.rs each load their
// shared validator (common.rs), as the two fuzz binaries they are.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::duplicate_mod)]

#[path = "../fuzz/fuzz_targets/atls_certificate.rs"]
mod atls_certificate;
#[path = "../fuzz/fuzz_targets/evidence.rs"]
mod evidence;
#[path = "../fuzz/fuzz_targets/tpm_structures.rs"]
mod tpm_structures;

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
fn evidence_seeds() {
    replay("evidence", evidence::run);
}

#[test]
fn tpm_structures_seeds() {
    replay("tpm_structures", tpm_structures::run);
}

#[test]
fn atls_certificate_seeds() {
    replay("atls_certificate", atls_certificate::run);
}
