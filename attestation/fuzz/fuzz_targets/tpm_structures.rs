//! The TPM structure parsers (TPM2B_PUBLIC, TPMS_ATTEST, TPMT_SIGNATURE) and what is derived
//! from them, plus the AK certificate chain as read from NV.
// cargo-fuzz builds this file as a libFuzzer binary (`--cfg fuzzing`); `tests/fuzz_seeds.rs`
// of the crate compiles it as a module and replays the seeds through `run`.
#![cfg_attr(fuzzing, no_main)]

use hawser_attestation::evidence::split_certificate_chain;
use hawser_attestation::tpm_types::{Attest, EccPublic, EccSignature, TPM_RH_ENDORSEMENT};

/// One input, as the fuzzer gives it.
pub fn run(data: &[u8]) {
    if let Ok(key) = EccPublic::parse(data) {
        let _ = key.name();
        let _ = key.primary_qualified_name(TPM_RH_ENDORSEMENT);
        let _ = key.p256_verifying_key();
    }
    if let Ok(attest) = Attest::parse(data) {
        for selection in &attest.pcr_selections {
            let _ = selection.indices();
        }
    }
    if let Ok(signature) = EccSignature::parse(data) {
        let _ = signature.to_p256();
    }
    let _ = split_certificate_chain(data);
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));
