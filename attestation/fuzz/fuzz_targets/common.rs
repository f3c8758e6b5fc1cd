//! A validator with a real (generated) provider CA and one enforced PCR, and a fixed binding:
//! the checks after decoding run on whatever the fuzzer makes of the evidence.

use std::sync::OnceLock;

use hawser_attestation::evidence::{Binding, Role};
use hawser_attestation::{AkTrust, ExpectedMeasurements, Validator};

pub const NONCE: [u8; 32] = [0x5a; 32];

pub fn validator() -> &'static Validator {
    static VALIDATOR: OnceLock<Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("CA");
        let measurements = ExpectedMeasurements::from_json(
            r#"{"11": {"expected": "d15b0e8e244e65c40f024e95773f2347ce4ef3ffe6b597c9a14b50bbab6df319", "warnOnly": false},
                "0": {"expected": "0000000000000000000000000000000000000000000000000000000000000000", "warnOnly": true}}"#,
        )
        .expect("measurements");
        Validator::new(measurements, AkTrust::from_der([ca.der()]).expect("anchor"))
            .expect("validator")
    })
}

pub fn binding(spki: &[u8]) -> Binding<'_> {
    Binding {
        role: Role::Server,
        nonce: &NONCE,
        tls_spki_der: spki,
    }
}
