//! The cargo-fuzz targets of `attestation/fuzz/` (what a peer sends: evidence, TPM
//! structures, the aTLS certificate) over their seeds, as ordinary
//! tests (`hawser_harness::fuzz_seeds`): the targets compile as modules here, and each seed (and
//! a local corpus, if `scripts/fuzz` grew one) goes through the target's `run`. Real fuzzing:
//! `scripts/fuzz`.
// evidence.rs and atls_certificate.rs each load their
// shared validator (common.rs), as the two fuzz binaries they are.
// The targets assert as a fuzzer sees a crash: with expect.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::duplicate_mod)]

#[path = "../fuzz/fuzz_targets/atls_certificate.rs"]
mod atls_certificate;
#[path = "../fuzz/fuzz_targets/evidence.rs"]
mod evidence;
#[path = "../fuzz/fuzz_targets/tpm_structures.rs"]
mod tpm_structures;

#[test]
fn evidence_seeds() {
    hawser_harness::fuzz_seeds::replay_or_fail(
        env!("CARGO_MANIFEST_DIR"),
        "evidence",
        evidence::run,
    );
}

#[test]
fn tpm_structures_seeds() {
    hawser_harness::fuzz_seeds::replay_or_fail(
        env!("CARGO_MANIFEST_DIR"),
        "tpm_structures",
        tpm_structures::run,
    );
}

#[test]
fn atls_certificate_seeds() {
    hawser_harness::fuzz_seeds::replay_or_fail(
        env!("CARGO_MANIFEST_DIR"),
        "atls_certificate",
        atls_certificate::run,
    );
}
