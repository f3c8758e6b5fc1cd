//! Encoded evidence through the whole validator: protobuf decoding, field checks, the TPM
//! structures, the signature, the binding, the AK certificate chain and the measurements.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = common::validator().validate(data, &common::binding(b"fuzzed TLS key"));
});
