//! A peer's aTLS certificate as the verifier receives it: X.509 parsing, the evidence
//! extension's encoding, then the validator; and the nonce encodings of the handshake.
// cargo-fuzz builds this file as a libFuzzer binary (`--cfg fuzzing`); `tests/fuzz_seeds.rs`
// of the crate compiles it as a module and replays the seeds through `run`.
#![cfg_attr(fuzzing, no_main)]

#[path = "common.rs"]
mod common;

use hawser_attestation::atls::{nonce, parse_certificate};

/// One input, as the fuzzer gives it.
pub fn run(data: &[u8]) {
    if let Ok(parsed) = parse_certificate(data)
        && let Ok(evidence) = parsed.evidence()
    {
        let _ = common::validator().validate(evidence, &common::binding(&parsed.spki_der));
    }
    let _ = nonce::from_distinguished_name(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = nonce::from_sni(text);
    }
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));
