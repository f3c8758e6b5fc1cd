use super::*;
use crate::evidence::Role;
use crate::measurements::ExpectedPcr;

fn trust() -> AkTrust {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&key).expect("CA");
    let from_der = AkTrust::from_der([ca.der()]).expect("DER anchor");
    let from_pem = AkTrust::from_pem(&ca.pem()).expect("PEM anchor");
    assert_eq!((from_der.len(), from_pem.len()), (1, 1));
    from_der
}

fn validator() -> Validator {
    let mut measurements = ExpectedMeasurements::new();
    measurements.insert(
        11,
        ExpectedPcr {
            expected: [0; 32],
            warn_only: false,
        },
    );
    Validator::new(measurements, trust()).expect("validator")
}

fn evidence() -> Evidence {
    Evidence {
        version: EVIDENCE_VERSION,
        variant: Variant::QemuVtpm as i32,
        ..Evidence::default()
    }
}

fn refuse(evidence: &[u8]) -> String {
    let nonce = [0; 32];
    let binding = Binding {
        role: Role::Server,
        nonce: &nonce,
        tls_spki_der: b"spki",
    };
    let err = validator()
        .validate(evidence, &binding)
        .expect_err("refused");
    crate::error_chain(&err)
}

#[test]
fn nothing_enforced_is_not_a_validator() {
    let mut warn_only = ExpectedMeasurements::new();
    warn_only.insert(
        0,
        ExpectedPcr {
            expected: [0; 32],
            warn_only: true,
        },
    );
    for measurements in [ExpectedMeasurements::new(), warn_only] {
        assert!(matches!(
            Validator::new(measurements, trust()),
            Err(ValidatorError::NothingEnforced)
        ));
    }
}

#[test]
fn malformed_evidence_is_refused_with_its_reason() {
    assert_eq!(
        refuse(&vec![0; MAX_EVIDENCE_LEN + 1]),
        "the evidence is 16385 bytes, more than the 16384 bytes a hawser verifier accepts"
    );
    assert!(refuse(b"\xff\xff\xff").starts_with("the evidence is not a hawser Evidence protobuf"),);

    let mut e = evidence();
    e.version = 2;
    assert_eq!(
        refuse(&e.encode_to_vec()),
        "the evidence has version 2; this verifier understands version 1"
    );
    let mut e = evidence();
    e.variant = 7;
    assert_eq!(
        refuse(&e.encode_to_vec()),
        "the evidence variant is 7, which no hawser platform profile has"
    );
    let mut e = evidence();
    e.variant = Variant::GceVtpm as i32;
    assert_eq!(
        refuse(&e.encode_to_vec()),
        "the cluster's measurements select the qemu profile; the peer presented gce evidence"
    );
    let mut e = evidence();
    e.pcrs_sha256.insert(24, vec![0; 32]);
    assert_eq!(
        refuse(&e.encode_to_vec()),
        "pcrs_sha256 lists PCR 24, but a TPM has PCRs 0 to 23"
    );
    let mut e = evidence();
    e.pcrs_sha256.insert(3, vec![0; 31]);
    assert_eq!(
        refuse(&e.encode_to_vec()),
        "pcrs_sha256[3] holds 31 bytes, a sha256 PCR holds 32"
    );
    let mut e = evidence();
    e.ak_public = vec![0x00, 0x10, 0x00, 0x23];
    assert_eq!(
        refuse(&e.encode_to_vec()),
        "the quote is invalid: field ak_public does not parse: TPM2B_PUBLIC: field \
         publicArea at offset 2 needs 16 bytes but only 2 remain"
    );
}

#[test]
fn trust_anchors_must_be_certificates() {
    assert!(matches!(
        AkTrust::from_pem(""),
        Err(AkTrustError::NoCertificates)
    ));
    assert!(matches!(
        AkTrust::from_der([b"not a certificate"]),
        Err(AkTrustError::Anchor { index: 0, .. })
    ));
}

/// A platform verifier that vouches for whatever it is given, with fixed PCR values: the
/// validator's hook around it is what these tests check (the platforms' own checks are
/// hawser-platforms' tests, on genuine evidence).
#[derive(Debug)]
struct Vouching {
    pcr11: [u8; 32],
    refuse: bool,
}

impl crate::platform::PlatformVerifier for Vouching {
    fn variant(&self) -> Variant {
        Variant::GceVtpm
    }

    fn verify(
        &self,
        evidence: &Evidence,
        qualifying_data: &[u8; 32],
    ) -> Result<crate::platform::PlatformVerified, crate::platform::PlatformRefusal> {
        // The qualifying data is the validator's binding of this connection.
        assert_eq!(evidence.nonce.as_slice(), &qualifying_data[..]);
        if self.refuse {
            return Err(crate::platform::PlatformRefusal {
                profile: "gce",
                source: "the AK certificate does not chain to a pinned root".into(),
            });
        }
        Ok(crate::platform::PlatformVerified {
            ak_name: vec![0x00, 0x0b, 1],
            ak_certificate_subject: "GCE instance node-1".to_owned(),
            pcrs: [(11, self.pcr11)].into(),
            clock_info: ClockInfo {
                clock: 1,
                reset_count: 2,
                restart_count: 3,
                safe: true,
            },
            firmware_version: 4,
        })
    }
}

#[test]
fn a_platform_trust_judges_its_own_variant_and_refuses_every_other_by_name() {
    let mut measurements = ExpectedMeasurements::new();
    measurements.insert(
        11,
        ExpectedPcr {
            expected: [0; 32],
            warn_only: false,
        },
    );
    let validator = |pcr11, refuse| {
        let trust = AkTrust::platform(std::sync::Arc::new(Vouching { pcr11, refuse }));
        assert_eq!(trust.variant(), Variant::GceVtpm);
        Validator::new(measurements.clone(), trust).expect("validator")
    };
    let nonce = [7; 32];
    let binding = Binding {
        role: Role::Client,
        nonce: &nonce,
        tls_spki_der: b"spki",
    };
    let gce = Evidence {
        version: EVIDENCE_VERSION,
        variant: Variant::GceVtpm as i32,
        nonce: binding.qualifying_data(b"").to_vec(),
        ..Evidence::default()
    };

    let accepted = validator([0; 32], false)
        .validate_decoded(&gce, &binding)
        .expect("accepted");
    assert_eq!(accepted.variant, Variant::GceVtpm);
    assert_eq!(accepted.ak_certificate_subject, "GCE instance node-1");
    assert_eq!(accepted.clock_info.reset_count, 2);

    // The measurements are still the validator's to judge.
    let err = validator([1; 32], false)
        .validate_decoded(&gce, &binding)
        .expect_err("another image");
    assert!(matches!(err, EvidenceError::Measurements(_)), "{err}");
    // The platform's refusal is told with its profile and reason.
    let err = validator([0; 32], true)
        .validate_decoded(&gce, &binding)
        .expect_err("refused by the platform");
    assert_eq!(
        crate::error_chain(&err),
        "the gce platform's check refused the evidence: the AK certificate does not chain to a \
         pinned root"
    );
    // QEMU's evidence is not a weaker way in.
    let qemu = Evidence {
        variant: Variant::QemuVtpm as i32,
        ..gce.clone()
    };
    let err = validator([0; 32], false)
        .validate_decoded(&qemu, &binding)
        .expect_err("another platform");
    assert_eq!(
        err.to_string(),
        "the cluster's measurements select the gce profile; the peer presented qemu evidence"
    );
}
