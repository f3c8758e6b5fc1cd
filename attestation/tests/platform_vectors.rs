//! Genuine evidence captured on real confidential-computing hardware (`tests/vectors/`, origin
//! and licence in its README), verified offline at pinned times: each vector is accepted, and
//! each tampering is refused with the reason named.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::PathBuf;

use hawser_attestation::platform::VerificationTime;
use hawser_attestation::platform::snp::{
    self, AttestationReport, Product, SigningKey, SnpEndorsement, SnpError, SnpPolicy, TcbVersion,
};

/// 2024-01-01T00:00:00Z: inside the virtee Milan VCEK's validity.
const VIRTEE_AT: VerificationTime = VerificationTime(1_704_067_200);
/// 2022-09-24T01:00:00Z: go-sev-guest's own verification time for its vector.
const GO_SEV_GUEST_AT: VerificationTime = VerificationTime(1_663_981_200);
/// 2025-06-01T00:00:00Z: inside the trustee VLEK's one-year validity.
const VLEK_AT: VerificationTime = VerificationTime(1_748_736_000);

fn vector(path: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The DER certificates of a PEM file, in order.
fn pem_chain(path: &str) -> Vec<Vec<u8>> {
    let text = String::from_utf8(vector(path)).unwrap();
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|pem| pem.unwrap().contents)
        .collect()
}

fn virtee_report() -> Vec<u8> {
    let text = String::from_utf8(vector("sev-snp/virtee-sev/report_milan.hex")).unwrap();
    hex::decode(text.trim()).unwrap()
}

struct Chain {
    key: Vec<u8>,
    intermediate: Vec<u8>,
    root: Vec<u8>,
}

impl Chain {
    fn new(key: &str, ask_ark: &str) -> Self {
        let mut pems = pem_chain(ask_ark);
        assert_eq!(pems.len(), 2, "{ask_ark}: the ASK then the ARK");
        let root = pems.pop().unwrap();
        Self {
            key: vector(key),
            intermediate: pems.pop().unwrap(),
            root,
        }
    }

    fn endorsement(&self) -> SnpEndorsement<'_> {
        SnpEndorsement {
            key: &self.key,
            intermediate: &self.intermediate,
            root: &self.root,
        }
    }
}

fn virtee_chain() -> Chain {
    Chain::new(
        "sev-snp/virtee-sev/vcek_milan.der",
        "sev-snp/go-sev-guest/ask_ark_milan.pem",
    )
}

/// The policy a verifier who knows the virtee guest would set: its measurement and
/// REPORT_DATA (the nonce), VMPL 0, the TCB it reports as the minimum.
fn virtee_policy(report: &[u8]) -> SnpPolicy {
    let parsed = AttestationReport::from_bytes(report).unwrap();
    SnpPolicy {
        vmpl: Some(0),
        minimum_tcb: parsed.reported_tcb,
        measurement: Some(parsed.measurement),
        report_data: Some(parsed.report_data),
        ..SnpPolicy::default()
    }
}

#[test]
fn a_genuine_milan_report_verifies_to_amds_root() {
    let report = virtee_report();
    let chain = virtee_chain();
    let verified = snp::verify(
        &report,
        &chain.endorsement(),
        &virtee_policy(&report),
        VIRTEE_AT,
    )
    .unwrap();
    assert_eq!(verified.product, Product::Milan);
    assert_eq!(verified.signing_key, SigningKey::Vcek);
    assert_eq!(
        verified.report.reported_tcb,
        TcbVersion {
            bootloader: 3,
            tee: 0,
            snp: 8,
            microcode: 0x73
        }
    );
    assert!(!verified.report.debug_allowed());
    assert_eq!(
        hex::encode(&verified.report.measurement[..8]),
        "7a1e5c266c0108db"
    );
}

#[test]
fn a_flipped_report_byte_is_refused_by_the_signature() {
    let report = virtee_report();
    let policy = virtee_policy(&report);
    let chain = virtee_chain();
    // A byte of the measurement, of the policy and of the chip ID: each breaks the signature.
    for at in [0x90, 0x08, 0x1A0] {
        let mut tampered = report.clone();
        tampered[at] ^= 0x01;
        let err = snp::verify(&tampered, &chain.endorsement(), &policy, VIRTEE_AT).unwrap_err();
        assert!(
            matches!(err, SnpError::Signature(SigningKey::Vcek)),
            "byte {at:#x}: {err}"
        );
    }
}

#[test]
fn a_wrong_chain_is_refused_naming_the_certificate() {
    let report = virtee_report();
    let policy = virtee_policy(&report);
    // Genoa's ASK and ARK under a Milan VCEK: the ARK is not Milan's pinned root.
    let genoa = Chain::new(
        "sev-snp/virtee-sev/vcek_milan.der",
        "sev-snp/go-sev-guest/ask_ark_genoa.pem",
    );
    let err = snp::verify(&report, &genoa.endorsement(), &policy, VIRTEE_AT).unwrap_err();
    assert!(
        err.to_string().contains("the ARK is not a pinned root"),
        "{err}"
    );
    // Milan's ARK with the ASK swapped for the ASVK: the VCEK's issuer is not it.
    let mut swapped = virtee_chain();
    swapped.intermediate = pem_chain("sev-snp/go-sev-guest/ask_ark_milan_vlek.pem").remove(0);
    let err = snp::verify(&report, &swapped.endorsement(), &policy, VIRTEE_AT).unwrap_err();
    assert!(
        err.to_string()
            .contains("the VCEK is not signed by the ASK"),
        "{err}"
    );
    // Another chip's VCEK (go-sev-guest's), properly chained: the report's signature fails.
    let other_chip = Chain::new(
        "sev-snp/go-sev-guest/vcek.testcer",
        "sev-snp/go-sev-guest/ask_ark_milan.pem",
    );
    let err = snp::verify(&report, &other_chip.endorsement(), &policy, VIRTEE_AT).unwrap_err();
    assert!(
        matches!(err, SnpError::Signature(SigningKey::Vcek)),
        "{err}"
    );
}

#[test]
fn certificates_are_judged_at_the_verification_time() {
    let report = virtee_report();
    let policy = virtee_policy(&report);
    let chain = virtee_chain();
    // Before the VCEK was issued (2023-04-03) and after it expires (2030-04-03).
    for at in [
        VerificationTime(1_672_531_200),
        VerificationTime(1_924_992_000),
    ] {
        let err = snp::verify(&report, &chain.endorsement(), &policy, at).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("the VCEK is not valid at the verification time"),
            "{text}"
        );
    }
    // The VLEK expired on 2025-12-10: refused at today's date, naming it and its dates.
    let vlek = vlek_chain();
    let err = snp::verify(
        &vector("sev-snp/trustee/test-vlek-report.bin"),
        &vlek.endorsement(),
        &SnpPolicy::default(),
        VerificationTime::now(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("the VLEK is not valid") && text.contains("to 2025-12-10T22:14:21Z"),
        "{text}"
    );
}

#[test]
fn a_wrong_nonce_or_measurement_is_refused_naming_the_field() {
    let report = virtee_report();
    let chain = virtee_chain();
    let mut nonce = virtee_policy(&report);
    nonce.report_data = Some([0x55; 64]);
    let err = snp::verify(&report, &chain.endorsement(), &nonce, VIRTEE_AT).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the report's REPORT_DATA is d447b55d"),
        "{err}"
    );
    let mut measurement = virtee_policy(&report);
    measurement.measurement = Some([0; 48]);
    let err = snp::verify(&report, &chain.endorsement(), &measurement, VIRTEE_AT).unwrap_err();
    assert!(err.to_string().contains("launch measurement"), "{err}");
    let mut tcb = virtee_policy(&report);
    tcb.minimum_tcb.snp = 9;
    let err = snp::verify(&report, &chain.endorsement(), &tcb, VIRTEE_AT).unwrap_err();
    assert!(
        matches!(
            err,
            SnpError::TcbTooLow {
                component: "SNP firmware",
                minimum: 9,
                report: 8
            }
        ),
        "{err}"
    );
}

#[test]
fn a_debuggable_guest_is_refused_unless_the_policy_allows_it() {
    let report = vector("sev-snp/go-sev-guest/attestation.bin");
    let chain = Chain::new(
        "sev-snp/go-sev-guest/vcek.testcer",
        "sev-snp/go-sev-guest/ask_ark_milan.pem",
    );
    let err = snp::verify(
        &report,
        &chain.endorsement(),
        &SnpPolicy::default(),
        GO_SEV_GUEST_AT,
    )
    .unwrap_err();
    assert!(matches!(err, SnpError::Debug(0xb0000)), "{err}");
    assert!(err.to_string().contains("allows debugging"), "{err}");
    // The signature and the chain are genuine: with debugging allowed, it verifies.
    let verified = snp::verify(
        &report,
        &chain.endorsement(),
        &SnpPolicy {
            allow_debug: true,
            ..SnpPolicy::default()
        },
        GO_SEV_GUEST_AT,
    )
    .unwrap();
    assert!(verified.report.debug_allowed());
}

fn vlek_chain() -> Chain {
    Chain::new(
        "sev-snp/trustee/test-vlek.der",
        "sev-snp/go-sev-guest/ask_ark_milan_vlek.pem",
    )
}

#[test]
fn a_vlek_signed_report_verifies_and_names_its_cloud_and_vmpl() {
    let report = vector("sev-snp/trustee/test-vlek-report.bin");
    let chain = vlek_chain();
    let verified = snp::verify(
        &report,
        &chain.endorsement(),
        &SnpPolicy {
            vmpl: Some(1),
            ..SnpPolicy::default()
        },
        VLEK_AT,
    )
    .unwrap();
    assert_eq!(verified.signing_key, SigningKey::Vlek);
    assert_eq!(verified.report.cpuid, Some((0x19, 0x01, 0x01)));
    let csp = verified.csp_id.unwrap_or_default();
    assert!(csp.contains("amazonaws.com"), "{csp}");
    // A verifier that requires VMPL 0 (a bare guest's kernel) refuses it.
    let err = snp::verify(
        &report,
        &chain.endorsement(),
        &SnpPolicy {
            vmpl: Some(0),
            ..SnpPolicy::default()
        },
        VLEK_AT,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SnpError::Vmpl {
                expected: 0,
                report: 1
            }
        ),
        "{err}"
    );
    // The VLEK report presented with a VCEK chain: the kinds disagree.
    let err = snp::verify(
        &report,
        &virtee_chain().endorsement(),
        &SnpPolicy::default(),
        VLEK_AT,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SnpError::SigningKeyKind {
                report: SigningKey::Vlek,
                endorsement: SigningKey::Vcek
            }
        ),
        "{err}"
    );
}
