//! Tests of the boot report and the quote verifier against tpm2-tools fixtures.

use super::*;
use crate::test_fixtures::{
    AK_PUB, ATTEST, BOOT_REPORT_AK_NAME as AK_NAME, BOOT_REPORT_AK_PUB,
    BOOT_REPORT_ATTEST as REPORT_ATTEST, BOOT_REPORT_ATTEST_HIGH_S as REPORT_ATTEST_HIGH_S,
    BOOT_REPORT_SIG as REPORT_SIG, BOOT_REPORT_SIG_HIGH_S as REPORT_SIG_HIGH_S, SIG,
};

const NONCE: &str = "00112233445566778899aabbccddeeff";
const PCR11: &str = "d15b0e8e244e65c40f024e95773f2347ce4ef3ffe6b597c9a14b50bbab6df319";

/// A report around the tpm2-tools boot-report quote (qualifying data
/// `boot_report_qualifying_data(NONCE)`): the fixture TPM had PCR 11 = extend(0, enter-initrd),
/// PCRs 17..=22 all-ones (locality-4 PCRs reset to ones) and every other PCR zero.
fn tpm2_tools_report() -> BootReport {
    let pcrs = (0u8..=23)
        .map(|pcr| {
            let value = match pcr {
                11 => PCR11.to_string(),
                17..=22 => "ff".repeat(32),
                _ => "00".repeat(32),
            };
            (pcr, value)
        })
        .collect();
    BootReport {
        report_version: 1,
        hawser_version: "0.1.0".into(),
        kernel_release: "6.12.0-test".into(),
        tpm_device: "swtpm".into(),
        nonce: NONCE.into(),
        nonce_source: "generated".into(),
        pcr11_before_phase: "00".repeat(32),
        phases_extended: vec!["enter-initrd".into()],
        pcrs,
        quote: QuoteEvidence {
            ak_public: BOOT_REPORT_AK_PUB.into(),
            attest: REPORT_ATTEST.into(),
            signature: REPORT_SIG.into(),
            pcr_selection: (0..=23).collect(),
        },
        timings: vec![PhaseTiming {
            name: "tpm".into(),
            start_ms: 1.5,
            duration_ms: 40.25,
        }],
        init_started_at_ms: 7012.5,
        warnings: vec![],
    }
}

#[test]
fn accepts_a_quote_made_by_tpm2_tools() {
    let nonce = hex::decode(NONCE).expect("hex");
    let verified = tpm2_tools_report()
        .verify(Some(&nonce))
        .expect("the tpm2-tools quote verifies");
    assert_eq!(verified.quote.ak_name, hex::decode(AK_NAME).expect("hex"));
    assert_eq!(verified.nonce, nonce);
    assert_eq!(verified.quote.nonce, boot_report_qualifying_data(&nonce));
    assert_eq!(verified.quote.clock_info.reset_count, 1);
    assert_eq!(verified.quote.firmware_version, 0x2019_1023_0016_3636);
    assert_eq!(verified.pcrs.len(), 24);
    assert_eq!(verified.phases_extended, ["enter-initrd"]);
    let point = verified.quote.ak_public_point;
    assert_eq!(point[0], 4);
    assert_eq!(
        verified.quote.ak_fingerprint,
        <[u8; 32]>::from(Sha256::digest(point))
    );
    verified
        .quote
        .ensure_ak_name(&hex::decode(AK_NAME).expect("hex"))
        .expect("trusted AK");
    assert!(matches!(
        verified.quote.ensure_ak_name(&[0; 34]),
        Err(VerifyError::UntrustedAk { .. })
    ));

    // The high-S quote of the same state verifies too.
    let mut report = tpm2_tools_report();
    report.quote.attest = REPORT_ATTEST_HIGH_S.into();
    report.quote.signature = REPORT_SIG_HIGH_S.into();
    report.verify(None).expect("high-S quote verifies");
}

#[test]
fn console_line_round_trips() {
    let report = tpm2_tools_report();
    let line = report.to_console_line().expect("serialises");
    assert!(line.starts_with("HAWSER_BOOT_REPORT {"));
    assert!(!line.contains('\n'));
    let log =
        format!("[    7.1] random kernel line\nnoise {line}\r\nhawser: boot complete; idle\n");
    let parsed = BootReport::find_in_console(&log)
        .expect("marker found")
        .expect("JSON parses");
    parsed.verify(None).expect("still verifies");
    assert_eq!(parsed.timings, report.timings);
    assert!(BootReport::find_in_console("no report here\n").is_none());
}

#[test]
fn json_field_names_are_the_documented_ones() {
    let value = serde_json::to_value(tpm2_tools_report()).expect("serialises");
    for key in [
        "report_version",
        "hawser_version",
        "kernel_release",
        "tpm_device",
        "nonce",
        "nonce_source",
        "pcr11_before_phase",
        "phases_extended",
        "pcrs",
        "quote",
        "timings",
        "init_started_at_ms",
        "warnings",
    ] {
        assert!(value.get(key).is_some(), "missing {key}");
    }
    assert!(
        value["pcrs"].get("11").is_some(),
        "PCR map keyed by decimal index"
    );
    for key in ["ak_public", "attest", "signature", "pcr_selection"] {
        assert!(value["quote"].get(key).is_some(), "missing quote.{key}");
    }
}

#[test]
fn refusals_name_their_reason() {
    let nonce = hex::decode(NONCE).expect("hex");

    let mut r = tpm2_tools_report();
    r.pcrs.insert(0, "01".repeat(32));
    let err = r.verify(None).expect_err("tampered PCR 0");
    assert!(matches!(err, VerifyError::PcrDigest { .. }), "{err}");
    assert!(err.to_string().contains("pcrDigest is c6aa24a1"), "{err}");

    let err = tpm2_tools_report()
        .verify(Some(&[0xaa; 16]))
        .expect_err("other nonce");
    assert_eq!(
        err.to_string(),
        format!("the quote's nonce is {NONCE}, expected {}", "aa".repeat(16))
    );

    let mut r = tpm2_tools_report();
    r.nonce = "aa".repeat(16);
    let err = r
        .verify(None)
        .expect_err("report nonce differs from attest");
    assert!(matches!(err, VerifyError::NonceMismatch { .. }), "{err}");

    let mut r = tpm2_tools_report();
    let mut sig = hex::decode(REPORT_SIG).expect("hex");
    let last = sig.len() - 1;
    sig[last] ^= 0x01;
    r.quote.signature = hex::encode(sig);
    let err = r.verify(Some(&nonce)).expect_err("flipped signature bit");
    assert!(matches!(err, VerifyError::SignatureInvalid { .. }), "{err}");

    let mut r = tpm2_tools_report();
    r.quote.attest = REPORT_ATTEST[..REPORT_ATTEST.len() - 2].into();
    let err = r.verify(None).expect_err("truncated attest");
    assert_eq!(
        crate::error_chain(&err),
        "field quote.attest does not parse: TPMS_ATTEST: field attested.quote.pcrDigest \
         at offset 113 needs 32 bytes but only 31 remain"
    );

    let mut r = tpm2_tools_report();
    r.pcr11_before_phase = "11".repeat(32);
    let err = r.verify(None).expect_err("wrong PCR 11 base");
    assert!(matches!(err, VerifyError::Pcr11Replay { .. }), "{err}");

    let mut r = tpm2_tools_report();
    r.phases_extended = vec!["enter-initrd".into(), "leave-initrd".into()];
    let err = r
        .verify(None)
        .expect_err("claims a phase that was not extended");
    assert!(matches!(err, VerifyError::Pcr11Replay { .. }), "{err}");

    let mut r = tpm2_tools_report();
    r.phases_extended = vec!["sysinit".into()];
    assert!(matches!(r.verify(None), Err(VerifyError::Phases { .. })));

    let mut r = tpm2_tools_report();
    r.pcrs.remove(&5);
    assert!(matches!(
        r.verify(None),
        Err(VerifyError::PcrMissing { pcr: 5 })
    ));

    let mut r = tpm2_tools_report();
    r.pcrs.insert(24, "00".repeat(32));
    assert!(matches!(
        r.verify(None),
        Err(VerifyError::PcrNotQuoted { pcr: 24 })
    ));

    let mut r = tpm2_tools_report();
    r.quote.pcr_selection = (0..=22).collect();
    assert!(matches!(
        r.verify(None),
        Err(VerifyError::PcrSelection { .. })
    ));

    let mut r = tpm2_tools_report();
    r.pcrs.insert(3, "00".repeat(31));
    let err = r.verify(None).expect_err("short PCR");
    assert_eq!(err.to_string(), "field pcrs[3] holds 31 bytes, expected 32");

    let mut r = tpm2_tools_report();
    r.report_version = 2;
    assert!(matches!(
        r.verify(None),
        Err(VerifyError::UnsupportedReportVersion { found: 2, .. })
    ));

    let mut r = tpm2_tools_report();
    r.nonce = "zz".into();
    assert!(matches!(r.verify(None), Err(VerifyError::Hex { .. })));
}

#[test]
fn refuses_an_unrestricted_or_decrypting_ak() {
    // Clearing `restricted` changes the AK's name, so the signature check would fail too;
    // the attribute check comes first and names the real problem.
    let mut ak = hex::decode(BOOT_REPORT_AK_PUB).expect("hex");
    // objectAttributes are bytes 6..10 of the TPM2B_PUBLIC (size 2, type 2, nameAlg 2).
    ak[7] &= !0x01; // bit 16: restricted
    let mut r = tpm2_tools_report();
    r.quote.ak_public = hex::encode(&ak);
    let err = r.verify(None).expect_err("unrestricted");
    assert!(
        matches!(
            err,
            VerifyError::AkAttributes {
                problem: "not restricted",
                ..
            }
        ),
        "{err}"
    );

    let mut ak = hex::decode(BOOT_REPORT_AK_PUB).expect("hex");
    ak[7] |= 0x02; // bit 17: decrypt
    let mut r = tpm2_tools_report();
    r.quote.ak_public = hex::encode(&ak);
    assert!(matches!(
        r.verify(None),
        Err(VerifyError::AkAttributes {
            problem: "also a decryption key",
            ..
        })
    ));
}

#[test]
fn boot_report_qualifying_data_is_the_labelled_hash_of_the_nonce() {
    let nonce = hex::decode(NONCE).expect("hex");
    // The value tpm2_quote was given for the fixture (computed with Python's hashlib).
    assert_eq!(
        hex::encode(boot_report_qualifying_data(&nonce)),
        "819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa5"
    );
    let mut input = b"hawser boot report v1\0".to_vec();
    input.extend_from_slice(&nonce);
    assert_eq!(
        boot_report_qualifying_data(&nonce),
        <[u8; 32]>::from(Sha256::digest(&input))
    );
    assert_ne!(
        boot_report_qualifying_data(&nonce),
        boot_report_qualifying_data(&nonce[1..])
    );
}

#[test]
fn boot_report_and_atls_qualifying_data_are_separate_domains() {
    use crate::evidence::{Binding, QUALIFYING_DATA_PREFIX, Role};
    // Neither label is a prefix of the other: the hash inputs of the two domains differ in
    // their first bytes whatever follows, so equal outputs would be a SHA-256 collision.
    let (report, atls) = (
        &BOOT_REPORT_QUALIFYING_DATA_PREFIX[..],
        &QUALIFYING_DATA_PREFIX[..],
    );
    let common = report.len().min(atls.len());
    assert_ne!(report[..common], atls[..common]);
    // A host that chooses the boot report's nonce to be exactly the aTLS input after the
    // label still gets another value than aTLS expects.
    let nonce = [0x42; 32];
    let binding = Binding {
        role: Role::Server,
        nonce: &nonce,
        tls_spki_der: b"spki",
    };
    let atls_value = binding.qualifying_data(b"");
    let mut atls_input_after_label = vec![b's'];
    atls_input_after_label.extend_from_slice(&nonce);
    atls_input_after_label.extend_from_slice(&binding.tls_key_hash());
    atls_input_after_label.extend_from_slice(&Sha256::digest(b""));
    for host_nonce in [&atls_value[..], &atls_input_after_label[..]] {
        assert_ne!(boot_report_qualifying_data(host_nonce), atls_value);
    }
}

#[test]
fn a_quote_of_the_raw_nonce_is_not_a_boot_report() {
    // The tpm2-tools quote with the nonce itself as qualifying data (what a boot report
    // quoted before domain separation) is refused, naming the value it should bind.
    let mut r = tpm2_tools_report();
    r.quote.ak_public = AK_PUB.into();
    r.quote.attest = ATTEST.into();
    r.quote.signature = SIG.into();
    let err = r.verify(None).expect_err("raw nonce");
    assert!(matches!(err, VerifyError::NonceMismatch { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "the quote's extraData is {NONCE}, but the report's nonce field {NONCE} gives \
             the boot-report qualifying data \
             819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa5"
        )
    );
}
