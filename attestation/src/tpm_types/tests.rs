//! Tests of the TPM structure parsers on tpm2-tools output: fields, names, signatures, and no
//! panic on any truncation or corruption.

use super::*;

use crate::test_fixtures::*;

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).expect("fixture is hex")
}

#[test]
fn parses_tpm2_tools_ak_public() {
    let ak = EccPublic::parse(&unhex(AK_PUB)).expect("valid TPM2B_PUBLIC");
    assert_eq!(ak.name_alg, TPM_ALG_SHA256);
    assert_eq!(ak.object_attributes, 0x0005_0072);
    use object_attributes::*;
    assert_eq!(
        ak.object_attributes,
        FIXED_TPM
            | FIXED_PARENT
            | SENSITIVE_DATA_ORIGIN
            | USER_WITH_AUTH
            | RESTRICTED
            | SIGN_ENCRYPT
    );
    assert!(ak.auth_policy.is_empty());
    assert_eq!(ak.symmetric, TPM_ALG_NULL);
    assert_eq!(
        ak.scheme,
        Scheme {
            scheme: TPM_ALG_ECDSA,
            hash_alg: Some(TPM_ALG_SHA256)
        }
    );
    assert_eq!(ak.curve, TPM_ECC_NIST_P256);
    assert_eq!(ak.kdf.scheme, TPM_ALG_NULL);
    assert_eq!(ak.x.len(), 32);
    assert_eq!(ak.y.len(), 32);
    assert!(ak.p256_verifying_key().is_some());
}

#[test]
fn name_and_qualified_name_match_the_tpm() {
    let ak = EccPublic::parse(&unhex(AK_PUB)).expect("valid TPM2B_PUBLIC");
    // tpm2_readpublic -n wrote this name; the TPM put the qualified name into the quote.
    assert_eq!(ak.name(), Some(unhex(AK_NAME)));
    let attest = Attest::parse(&unhex(ATTEST)).expect("valid TPMS_ATTEST");
    assert_eq!(
        ak.primary_qualified_name(TPM_RH_ENDORSEMENT),
        Some(attest.qualified_signer.clone())
    );
    // The owner hierarchy would give another qualified name.
    assert_ne!(
        ak.primary_qualified_name(0x4000_0001),
        Some(attest.qualified_signer)
    );
}

#[test]
fn parses_tpm2_tools_quote() {
    let attest = Attest::parse(&unhex(ATTEST)).expect("valid TPMS_ATTEST");
    assert_eq!(attest.extra_data, unhex("00112233445566778899aabbccddeeff"));
    assert_eq!(attest.clock_info.clock, 0x24a5);
    assert_eq!(attest.clock_info.reset_count, 1);
    assert_eq!(attest.clock_info.restart_count, 0);
    assert!(attest.clock_info.safe);
    assert_eq!(attest.firmware_version, 0x2019_1023_0016_3636);
    assert_eq!(attest.pcr_selections.len(), 1);
    assert_eq!(attest.pcr_selections[0].hash_alg, TPM_ALG_SHA256);
    assert_eq!(
        attest.pcr_selections[0].indices(),
        (0..=23).collect::<Vec<u8>>()
    );
    assert_eq!(attest.pcr_digest.len(), 32);
}

#[test]
fn verifies_tpm2_tools_signatures_including_high_s() {
    let ak = EccPublic::parse(&unhex(AK_PUB)).expect("valid TPM2B_PUBLIC");
    let key = ak.p256_verifying_key().expect("P-256 key");
    for (attest_hex, sig_hex) in [(ATTEST, SIG), (ATTEST_HIGH_S, SIG_HIGH_S)] {
        let attest = unhex(attest_hex);
        let sig = EccSignature::parse(&unhex(sig_hex)).expect("valid TPMT_SIGNATURE");
        assert_eq!(sig.sig_alg, TPM_ALG_ECDSA);
        assert_eq!(sig.hash_alg, TPM_ALG_SHA256);
        let p256_sig = sig.to_p256().expect("scalars in range");
        assert!(verify_p256_sha256(&key, &attest, &p256_sig));
        // The same signature does not cover a different message.
        let mut other = attest.clone();
        other[20] ^= 1;
        assert!(!verify_p256_sha256(&key, &other, &p256_sig));
    }
    let high_s = EccSignature::parse(&unhex(SIG_HIGH_S)).expect("valid");
    assert!(
        high_s.to_p256().and_then(|s| s.normalize_s()).is_some(),
        "s is high"
    );
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    type Parser = fn(&[u8]) -> Result<(), ParseError>;
    let cases: [(&str, Parser); 3] = [
        (AK_PUB, |b| EccPublic::parse(b).map(drop)),
        (ATTEST, |b| Attest::parse(b).map(drop)),
        (SIG, |b| EccSignature::parse(b).map(drop)),
    ];
    for (hex_bytes, parse) in cases {
        let bytes = unhex(hex_bytes);
        assert!(parse(&bytes).is_ok());
        for len in 0..bytes.len() {
            let err = parse(&bytes[..len]).expect_err("a strict prefix must not parse");
            // The reported offset lies within the input.
            let offset = match err {
                ParseError::Truncated { offset, .. }
                | ParseError::Unexpected { offset, .. }
                | ParseError::TooLarge { offset, .. }
                | ParseError::TrailingBytes { offset, .. } => offset,
            };
            assert!(offset <= len, "offset {offset} beyond input of {len} bytes");
        }
        // One extra byte is refused too.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(parse(&longer).is_err());
    }
}

#[test]
fn random_corruption_never_panics() {
    // xorshift64: a deterministic stream of corruptions, no extra dependency.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for hex_bytes in [AK_PUB, ATTEST, SIG] {
        let original = unhex(hex_bytes);
        for _ in 0..5000 {
            let mut bytes = original.clone();
            for _ in 0..=(next() % 4) {
                let i = (next() as usize) % bytes.len();
                bytes[i] = next() as u8;
            }
            let cut = (next() as usize) % (bytes.len() + 1);
            let bytes = &bytes[..cut];
            let _ = EccPublic::parse(bytes).map(|k| (k.name(), k.p256_verifying_key()));
            let _ = Attest::parse(bytes);
            let _ = EccSignature::parse(bytes).map(|s| s.to_p256());
        }
    }
}

#[test]
fn errors_name_field_and_offset() {
    let mut attest = unhex(ATTEST);
    attest[0] = 0;
    let err = Attest::parse(&attest).expect_err("bad magic");
    assert_eq!(
        err.to_string(),
        "TPMS_ATTEST: field magic at offset 0 is 0x544347, expected TPM_GENERATED_VALUE (0xff544347)"
    );

    let mut attest = unhex(ATTEST);
    attest[5] = 0x17; // TPM_ST_ATTEST_CERTIFY
    let err = Attest::parse(&attest).expect_err("not a quote");
    assert!(matches!(
        err,
        ParseError::Unexpected {
            field: "type",
            offset: 4,
            actual: 0x8017,
            ..
        }
    ));

    // magic (4) + type (2) + qualifiedSigner (2 + 34) = 42; extraData's size is at 42..44.
    let err = Attest::parse(&unhex(ATTEST)[..50]).expect_err("truncated");
    assert_eq!(
        err.to_string(),
        "TPMS_ATTEST: field extraData at offset 44 needs 16 bytes but only 6 remain"
    );

    let mut sig = unhex(SIG);
    sig[1] = 0x14; // TPM_ALG_RSASSA
    let err = EccSignature::parse(&sig).expect_err("RSA");
    assert!(matches!(
        err,
        ParseError::Unexpected {
            field: "sigAlg",
            offset: 0,
            ..
        }
    ));
}
