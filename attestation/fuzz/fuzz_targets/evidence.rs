//! Encoded evidence through the whole validator: protobuf decoding, field checks, the TPM
//! structures, the signature, the binding, the AK certificate chain and the measurements.
// cargo-fuzz builds this file as a libFuzzer binary (`--cfg fuzzing`); `tests/fuzz_seeds.rs`
// of the crate compiles it as a module and replays the seeds through `run`.
#![cfg_attr(fuzzing, no_main)]

#[path = "common.rs"]
mod common;

/// One input, as the fuzzer gives it.
pub fn run(data: &[u8]) {
    let _ = common::validator().validate(data, &common::binding(b"fuzzed TLS key"));
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));
