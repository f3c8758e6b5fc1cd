//! The Azure (SNP and TDX) and bare SEV-SNP / TDX evidence paths, from the node's gathering
//! code to the verifier behind hawser's validator, on the captured vectors.
//!
//! Each profile's evidence is built by the node-side code (`node::azure_evidence_parts`, what
//! `issuer_for_azure` sends beside its quote; `node::TsmIssuer` over a configfs-tsm tree),
//! verified by its profile's verifier (`verifier_cloud`) and, through the validator, checked
//! against a release of the captured PCRs; refused by every other profile's verifier, naming
//! both; and refused with one byte of its report flipped. What is genuine and what is arranged
//! is said in `common_paths` and at each step here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::sync::Arc;

use hawser_attestation::evidence::{Evidence, MAX_EVIDENCE_LEN};
use hawser_attestation::platform::PlatformVerifier;
use hawser_attestation::validator::{AkTrust, EvidenceError, Validator};
use hawser_attestation::{Variant, error_chain};
use hawser_platforms::node::{self, NodeError};
use hawser_platforms::profile::Platform;
use hawser_platforms::verifier::{TrustError, ak_trust};
use hawser_platforms::verifier_cloud::{SnpVerifier, TdxVerifier, bare_report_data};
use hawser_platforms::{azure, snp::SnpPolicy, tdx::TdxPolicy};
use prost::Message as _;

mod common;
mod common_paths;
use common::*;
use common_paths::*;

fn validate(
    trust: Arc<dyn PlatformVerifier>,
    releases: hawser_attestation::releases::ReleaseSet,
    evidence: &Evidence,
) -> Result<hawser_attestation::ValidatedEvidence, EvidenceError> {
    let encoded = evidence.encode_to_vec();
    assert!(
        encoded.len() <= MAX_EVIDENCE_LEN,
        "{} bytes of evidence: too large for a TLS certificate extension",
        encoded.len()
    );
    Validator::for_releases(releases, AkTrust::platform(trust))
        .unwrap()
        .validate(&encoded, &binding())
}

fn refusal(err: &(dyn std::error::Error + 'static)) -> String {
    error_chain(err)
}

#[test]
fn azure_snp_evidence_from_the_node_assembly_passes_the_validator() {
    let (evidence, captured) = azure_snp();
    assert_eq!(evidence.variant, Variant::AzureSevSnp as i32);
    assert!(
        evidence.ak_cert_chain.is_empty(),
        "the capture has no AK certificate"
    );
    // The verifier on its own, with the binding the capture's quote answers (its verifier's
    // 48-byte nonce): the CPU's report to AMD's root, HCLAkPub's quote, the AK's name.
    let verified = azure_snp_verifier()
        .verify_bound(&evidence, &captured)
        .unwrap();
    assert_eq!(verified.ak_name, tpm_name(&evidence.ak_public));
    assert_eq!(verified.pcrs.len(), 24);
    assert!(
        verified
            .ak_certificate_subject
            .contains("vouched for by the CPU's report"),
        "{}",
        verified.ak_certificate_subject
    );
    // Through the trait, hawser's binding (any qualifying data but the capture's) is refused:
    // the quote binds another nonce.
    let err = azure_snp_verifier()
        .verify(&evidence, &binding().qualifying_data(b""))
        .unwrap_err();
    assert!(refusal(&err).contains("extraData"), "{}", refusal(&err));
    // Through the validator: variant, platform, then the release of the captured PCRs.
    let trust = captured_azure(azure_snp_verifier(), captured.clone());
    let validated = validate(
        trust.clone(),
        release_of(Platform::AzureSnp, &evidence),
        &evidence,
    )
    .unwrap();
    assert_eq!(validated.variant, Variant::AzureSevSnp);
    assert_eq!(validated.ak_name, verified.ak_name);
    assert_eq!(validated.pcrs, verified.pcrs);
    let err = validate(trust, other_release(), &evidence).unwrap_err();
    assert!(matches!(err, EvidenceError::Measurements(_)), "{err}");
}

#[test]
fn azure_tdx_evidence_from_the_node_assembly_passes_the_validator() {
    let (evidence, captured) = azure_tdx();
    assert_eq!(evidence.variant, Variant::AzureTdx as i32);
    assert_eq!(
        evidence.ak_cert_chain.len(),
        1,
        "the leaf from NV 0x01c101d0"
    );
    // The capture's quote answers 32 zero bytes: a qualifying data the trait can carry, so
    // here the trait itself verifies it (nothing arranged but the value).
    let captured: [u8; 32] = captured.try_into().unwrap();
    let verifier = azure_tdx_verifier().requiring_ak_certificate();
    let verified = verifier.verify(&evidence, &captured).unwrap();
    assert_eq!(verified.ak_name, tpm_name(&evidence.ak_public));
    assert!(
        verified
            .ak_certificate_subject
            .contains("certified by Azure's vTPM root"),
        "{}",
        verified.ak_certificate_subject
    );
    // Without the AK certificate: accepted by default (the CPU vouches for the AK), refused by
    // a verifier that requires it.
    let bare = Evidence {
        ak_cert_chain: Vec::new(),
        ..evidence.clone()
    };
    azure_tdx_verifier().verify(&bare, &captured).unwrap();
    let err = verifier.verify(&bare, &captured).unwrap_err();
    assert!(
        refusal(&err).contains("no AK certificate"),
        "{}",
        refusal(&err)
    );
    // Through the validator.
    let trust = captured_azure(azure_tdx_verifier(), captured.to_vec());
    let validated = validate(
        trust.clone(),
        release_of(Platform::AzureTdx, &evidence),
        &evidence,
    )
    .unwrap();
    assert_eq!(validated.variant, Variant::AzureTdx);
    assert_eq!(validated.pcrs.len(), 24);
    let err = validate(trust, other_release(), &evidence).unwrap_err();
    assert!(matches!(err, EvidenceError::Measurements(_)), "{err}");
}

#[test]
fn the_azure_ak_must_be_hclakpub_as_the_tpm_named_it() {
    let (evidence, captured) = azure_tdx();
    let verifier = azure_tdx_verifier();
    // The same key with another attribute (no noDA): the modulus is HCLAkPub's, but the
    // quote's signed qualifiedSigner names the genuine public area, not this one.
    let mut other = evidence.clone();
    other.ak_public[2 + 6] &= !0x04;
    let err = verifier.verify_bound(&other, &captured).unwrap_err();
    assert!(
        refusal(&err).contains("the quote's signer is"),
        "{}",
        refusal(&err)
    );
    // Another key: not HCLAkPub.
    let mut other = evidence.clone();
    let last = other.ak_public.len() - 1;
    other.ak_public[last] ^= 1;
    let err = verifier.verify_bound(&other, &captured).unwrap_err();
    assert!(refusal(&err).contains("HCLAkPub"), "{}", refusal(&err));
    // None at all.
    let none = Evidence {
        ak_public: Vec::new(),
        ..evidence
    };
    let err = verifier.verify_bound(&none, &captured).unwrap_err();
    assert!(refusal(&err).contains("TPM2B_PUBLIC"), "{}", refusal(&err));
}

#[test]
fn bare_snp_evidence_from_configfs_tsm_verifies_with_its_binding() {
    let dir = tempfile::tempdir().unwrap();
    let (evidence, captured) = bare_snp(dir.path());
    // The node wrote the binding (qualifying data and 32 zero bytes) to inblob, and sent what
    // configfs-tsm gave back, with no TPM field.
    let qualifying_data = binding().qualifying_data(b"");
    assert_eq!(inblob(dir.path()), bare_report_data(&qualifying_data));
    assert_eq!(evidence.variant, Variant::SevSnp as i32);
    assert_eq!(evidence.platform_report, virtee_report());
    assert!(evidence.quote.is_empty() && evidence.ak_public.is_empty());
    assert!(evidence.pcrs_sha256.is_empty());
    assert!(
        dir.path().join("report/hawser").is_dir(),
        "an existing report directory is left in place"
    );
    // Genuine report, arranged binding: the fake configfs returned a report made for another
    // REPORT_DATA, so hawser's binding is refused naming the field...
    let err = bare_snp_verifier()
        .verify(&evidence, &qualifying_data)
        .unwrap_err();
    assert!(refusal(&err).contains("REPORT_DATA"), "{}", refusal(&err));
    // ... and the report's own REPORT_DATA, given raw as the binding, is accepted.
    let verified = bare_snp_verifier()
        .verify_bound(&evidence, &captured)
        .unwrap();
    let report = hawser_platforms::snp::AttestationReport::from_bytes(&virtee_report()).unwrap();
    assert_eq!(verified.ak_name, report.chip_id.to_vec());
    assert!(verified.pcrs.is_empty());
    assert!(
        verified.ak_certificate_subject.contains("Milan chip")
            && verified
                .ak_certificate_subject
                .contains(&hex::encode(report.measurement)),
        "{}",
        verified.ak_certificate_subject
    );
    // Without the host's certificate table: the configured VCEK and chain endorse it; with
    // neither, it is refused naming the chip.
    let no_aux = Evidence {
        platform_aux: Vec::new(),
        ..evidence.clone()
    };
    let chain = virtee_chain();
    let bundle = pem(&chain.key) + &pem(&chain.intermediate) + &pem(&chain.root);
    let policy = SnpPolicy {
        report_data: None,
        ..virtee_policy(&virtee_report())
    };
    SnpVerifier::new(&bundle, policy)
        .unwrap()
        .at(VIRTEE_AT)
        .verify_bound(&no_aux, &captured)
        .unwrap();
    let err = bare_snp_verifier()
        .verify_bound(&no_aux, &captured)
        .unwrap_err();
    assert!(
        refusal(&err).contains(&format!("no VCEK for chip {}", hex::encode(report.chip_id))),
        "{}",
        refusal(&err)
    );
    // Through the validator, the platform accepts it and the release check refuses it: bare
    // evidence has no PCRs (its measurements are the policy's), which is why `ak_trust` does
    // not build a validator trust for the bare profiles.
    let trust = Arc::new(Captured {
        variant: Variant::SevSnp,
        verify: Box::new(move |e| bare_snp_verifier().verify_bound(e, &captured)),
    });
    let err = validate(trust, other_release(), &evidence).unwrap_err();
    assert!(matches!(err, EvidenceError::Measurements(_)), "{err}");
    assert!(err.to_string().contains("it is not quoted"), "{err}");
}

#[test]
fn bare_tdx_evidence_from_configfs_tsm_verifies_with_its_binding() {
    let dir = tempfile::tempdir().unwrap();
    let (evidence, captured) = bare_tdx(dir.path());
    let qualifying_data = binding().qualifying_data(b"");
    assert_eq!(inblob(dir.path()), bare_report_data(&qualifying_data));
    assert_eq!(evidence.variant, Variant::Tdx as i32);
    assert_eq!(evidence.platform_report, vector("tdx/tdx_quote"));
    assert!(evidence.platform_aux.is_empty(), "TDX has no auxblob");
    let err = bare_tdx_verifier()
        .verify(&evidence, &qualifying_data)
        .unwrap_err();
    assert!(refusal(&err).contains("REPORTDATA"), "{}", refusal(&err));
    let verified = bare_tdx_verifier()
        .verify_bound(&evidence, &captured)
        .unwrap();
    assert_eq!(verified.ak_name.len(), 16, "the platform's PPID");
    assert!(verified.pcrs.is_empty());
    assert!(
        verified.ak_certificate_subject.contains("TCB UpToDate"),
        "{}",
        verified.ak_certificate_subject
    );
    // Collateral of another platform only: refused naming both FMSPCs.
    let other = TdxVerifier::new(
        vec![tdx_collateral("tdx/tdx_quote_outdated_collateral.json")],
        TdxPolicy::default(),
    )
    .at(TDX_AT);
    let err = other.verify_bound(&evidence, &captured).unwrap_err();
    assert!(
        refusal(&err).contains("FMSPC B0C06F000000; configured: "),
        "{}",
        refusal(&err)
    );
}

#[test]
fn each_profiles_evidence_is_refused_by_every_other_profiles_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = every_profile(dir.path());
    for (platform, evidence, verifier) in &profiles {
        // Its own verifier accepts it (the bare ones have no PCRs: the verifier alone).
        verifier.verify(evidence, &[0; 32]).unwrap();
        for (other, _, other_verifier) in &profiles {
            if other == platform {
                continue;
            }
            // The validator refuses by variant first, naming both profiles.
            let err = validate(other_verifier.clone(), other_release(), evidence).unwrap_err();
            assert!(
                matches!(err, EvidenceError::Platform { expected, found }
                    if expected == other.name() && found == platform.name()),
                "{err}"
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "the cluster's measurements select the {other} profile; the peer presented {platform} evidence"
                )
            );
            // The other verifier on its own refuses the label; relabelled as its own, it
            // refuses the content.
            let err = other_verifier.verify(evidence, &[0; 32]).unwrap_err();
            assert_eq!(err.profile, other.name());
            assert!(
                refusal(&err).contains(&format!("is {platform} evidence")),
                "{}",
                refusal(&err)
            );
            let relabelled = Evidence {
                variant: other_verifier.variant() as i32,
                ..evidence.clone()
            };
            let err = other_verifier.verify(&relabelled, &[0; 32]).unwrap_err();
            assert_eq!(err.profile, other.name(), "{}", refusal(&err));
        }
    }
}

#[test]
fn a_flipped_byte_of_each_report_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Offsets into platform_report (HCL report: 32-byte header, the hardware report, then at
    // 1236 the runtime data; SNP report: REPORT_DATA 0x50, MEASUREMENT 0x90, CHIP_ID 0x1a0;
    // TD quote v4: the 48-byte header, then the body, REPORTDATA its last 64 of 584 bytes).
    let flips: [(Platform, &[(usize, &str)]); 4] = [
        (
            Platform::AzureSnp,
            &[
                (32 + 0x50, "signature"),
                (32 + 0x90, "signature"),
                (1236 + 60, "REPORT_DATA"),
            ],
        ),
        (
            Platform::AzureTdx,
            &[(32 + 128, "REPORTDATA"), (1236 + 60, "REPORT_DATA")],
        ),
        (
            Platform::SevSnp,
            &[(0x50, "signature"), (0x90, "signature"), (0x1a0, "no VCEK")],
        ),
        (
            Platform::Tdx,
            &[(48 + 16 + 48 * 2 + 24, "Dcap"), (48 + 520, "Dcap"), (2, "")],
        ),
    ];
    let profiles = every_profile(dir.path());
    for ((platform, evidence, verifier), (flip_platform, offsets)) in profiles.iter().zip(flips) {
        assert_eq!(*platform, flip_platform);
        for (offset, reason) in offsets {
            let mut flipped = evidence.clone();
            flipped.platform_report[*offset] ^= 0x01;
            let err = verifier.verify(&flipped, &[0; 32]).unwrap_err();
            let text = refusal(&err);
            assert_eq!(err.profile, platform.name(), "{text}");
            assert!(
                text.contains(reason) || format!("{err:?}").contains(reason),
                "{platform} byte {offset}: {text}"
            );
        }
        // On Azure, the TPM quote too; and the TD quote beside a TDX HCL report.
        if evidence.quote.is_empty() {
            continue;
        }
        let mut flipped = evidence.clone();
        let last = flipped.quote.len() - 1;
        flipped.quote[last] ^= 0x01;
        let err = verifier.verify(&flipped, &[0; 32]).unwrap_err();
        assert!(refusal(&err).contains("signature"), "{}", refusal(&err));
        if *platform == Platform::AzureTdx {
            let mut flipped = evidence.clone();
            flipped.platform_aux[48 + 520] ^= 0x01;
            let err = verifier.verify(&flipped, &[0; 32]).unwrap_err();
            assert!(refusal(&err).contains("the quote"), "{}", refusal(&err));
        }
    }
}

#[test]
fn the_node_refuses_azure_contents_of_the_wrong_kind() {
    let snp = AzureSnpVector::load();
    let hcl = std::collections::BTreeMap::from([(azure::HCL_REPORT_NV_INDEX, snp.hcl_report)]);
    // An SNP HCL report on a node whose cluster selects azure-tdx.
    let err = node::azure_evidence_parts(Platform::AzureTdx, &hcl, vec![1]).unwrap_err();
    assert!(matches!(err, NodeError::Hcl { .. }), "{err}");
    assert!(
        error_chain(&err).contains("SevSnp"),
        "{}",
        error_chain(&err)
    );
    // No HCL report: named with its index; not an Azure profile: named.
    let err =
        node::azure_evidence_parts(Platform::AzureSnp, &Default::default(), vec![]).unwrap_err();
    assert!(err.to_string().contains("0x01400001"), "{err}");
    let err = node::azure_evidence_parts(Platform::Gce, &hcl, vec![]).unwrap_err();
    assert!(matches!(err, NodeError::NotAzure(Platform::Gce)), "{err}");
    // A TDX node without its TD quote.
    let tdx = AzureTdxVector::load();
    let hcl = std::collections::BTreeMap::from([(azure::HCL_REPORT_NV_INDEX, tdx.hcl_report)]);
    let err = node::azure_evidence_parts(Platform::AzureTdx, &hcl, vec![]).unwrap_err();
    assert!(matches!(err, NodeError::NoAux { .. }), "{err}");
    // THIM's answer without a VCEK.
    let err = node::thim_vcek_chain(br#"{"certificateChain": "x"}"#).unwrap_err();
    assert!(
        error_chain(&err).contains("vcekCert"),
        "{}",
        error_chain(&err)
    );
    // configfs-tsm of another provider.
    let dir = tempfile::tempdir().unwrap();
    fake_tsm(dir.path(), "tdx_guest", b"report", None);
    let issuer = node::TsmIssuer::new(dir.path(), Platform::SevSnp).unwrap();
    let err = hawser_attestation::EvidenceIssuer::issue(&issuer, &binding(), b"").unwrap_err();
    assert!(
        error_chain(&err).contains("needs sev_guest"),
        "{}",
        error_chain(&err)
    );
    assert!(matches!(
        node::TsmIssuer::new(dir.path(), Platform::AzureSnp),
        Err(NodeError::NotTsm { .. })
    ));
}

#[test]
fn ak_trust_builds_azure_snp_and_names_what_the_others_need() {
    let trust = ak_trust(Platform::AzureSnp, "").unwrap();
    assert_eq!(trust.variant(), Variant::AzureSevSnp);
    let err = ak_trust(Platform::AzureTdx, "").unwrap_err();
    assert!(
        matches!(
            err,
            TrustError::NeedsConfiguration {
                platform: Platform::AzureTdx,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("collateral"), "{err}");
    for bare in [Platform::SevSnp, Platform::Tdx] {
        assert!(matches!(ak_trust(bare, ""), Err(TrustError::NotWired(p)) if p == bare));
    }
    // The azure-snp trust ak_trust builds reaches the Azure verifier through the validator:
    // the capture's quote answers another binding than this validator's, and is refused for
    // it by the azure-snp profile (at today's date: every certificate is still valid).
    let (evidence, _) = azure_snp();
    let err = Validator::for_releases(release_of(Platform::AzureSnp, &evidence), trust)
        .unwrap()
        .validate(&evidence.encode_to_vec(), &binding())
        .unwrap_err();
    assert!(
        matches!(&err, EvidenceError::PlatformRefused(r) if r.profile == "azure-snp"),
        "{err}"
    );
    assert!(refusal(&err).contains("extraData"), "{}", refusal(&err));
}

/// The Azure node side on a real TPM (swtpm, feature `tpm`).
#[cfg(feature = "tpm")]
#[path = "common_paths/on_swtpm.rs"]
mod on_swtpm;

#[test]
fn a_vlek_report_and_a_malformed_certificate_table() {
    // trustee's AWS report, signed by a VLEK: endorsed by the configured VLEK, ASVK and ARK
    // (a host without extended reports), the cloud named; its identity the chip's.
    let report = vector("sev-snp/trustee/test-vlek-report.bin");
    let parsed = hawser_platforms::snp::AttestationReport::from_bytes(&report).unwrap();
    let evidence = Evidence {
        version: 1,
        variant: Variant::SevSnp as i32,
        platform_report: report,
        ..Evidence::default()
    };
    let mut bundle = pem(&vector("sev-snp/trustee/test-vlek.der"));
    bundle.push_str(
        std::str::from_utf8(&vector("sev-snp/go-sev-guest/ask_ark_milan_vlek.pem")).unwrap(),
    );
    let verifier = SnpVerifier::new(&bundle, SnpPolicy::default())
        .unwrap()
        .at(VLEK_AT);
    let verified = verifier
        .verify_bound(&evidence, &parsed.report_data)
        .unwrap();
    assert!(
        verified.ak_certificate_subject.contains("VLEK of"),
        "{}",
        verified.ak_certificate_subject
    );
    let expected_identity = if parsed.chip_id.iter().all(|b| *b == 0) {
        parsed.report_id.to_vec()
    } else {
        parsed.chip_id.to_vec()
    };
    assert_eq!(verified.ak_name, expected_identity);
    // A certificate table whose entry runs past its end, or with no terminating entry.
    let chain = virtee_chain();
    let table = snp_certificate_table(&chain.key, &chain.intermediate, &chain.root);
    for (broken, reason) in [
        (table[..table.len() - 1].to_vec(), "runs past"),
        ([&table[..16], &[0; 8][..]].concat(), "no terminating entry"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut evidence, captured) = bare_snp(dir.path());
        evidence.platform_aux = broken;
        let err = bare_snp_verifier()
            .verify_bound(&evidence, &captured)
            .unwrap_err();
        assert!(refusal(&err).contains(reason), "{}", refusal(&err));
    }
}
