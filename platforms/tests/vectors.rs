//! Genuine evidence captured on real confidential-computing hardware (`tests/vectors/`, origin
//! and licence in its README), verified offline at pinned times: each vector is accepted, and
//! each tampering is refused with the reason named.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use hawser_platforms::VerificationTime;
use hawser_platforms::azure::{self, AzureError, AzureHardware, HclReport};
use hawser_platforms::gce::{self, GceError};
use hawser_platforms::snp::{self, Product, SigningKey, SnpError, SnpPolicy, TcbVersion};
use hawser_platforms::tdx::{self, TdxError, TdxPolicy};
use hawser_platforms::tpm_rsa::QuoteError;

mod common;
use common::*;

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

#[test]
fn a_genuine_gce_vtpm_quote_verifies_to_googles_root() {
    let v = GceVector::load();
    let verified = v.verify(&v.pcrs, &GCE_NONCE, GCE_AT).unwrap();
    assert_eq!(verified.pcrs.len(), 24);
    let instance = verified
        .instance
        .expect("the instance-information extension");
    assert_eq!(instance.zone, "us-central1-a");
    assert_eq!(instance.instance_name, "cos-test");
    assert_eq!(instance.is_production, Some(true));
}

#[test]
fn gce_evidence_tampered_is_refused_naming_the_reason() {
    let v = GceVector::load();
    // A wrong nonce (a replayed quote).
    let err = v.verify(&v.pcrs, &[0x90, 0x0a], GCE_AT).unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::Nonce { ref quoted, .. }) if quoted == "9009"),
        "{err}"
    );
    // A PCR value changed after the quote.
    let mut pcrs = v.pcrs.clone();
    pcrs.get_mut(&4).unwrap()[0] ^= 1;
    let err = v.verify(&pcrs, &GCE_NONCE, GCE_AT).unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::PcrDigest { .. })),
        "{err}"
    );
    // A PCR left out.
    let mut pcrs = v.pcrs.clone();
    pcrs.remove(&23);
    let err = v.verify(&pcrs, &GCE_NONCE, GCE_AT).unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::PcrSet { .. })),
        "{err}"
    );
    // A flipped byte of the quote.
    let mut tampered = GceVector::load();
    let last = tampered.quote.quote.len() - 1;
    tampered.quote.quote[last] ^= 1;
    let err = tampered.verify(&v.pcrs, &GCE_NONCE, GCE_AT).unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::Signature)),
        "{err}"
    );
    // Another AK in the certificate's place: the SNP vector's VCEK is no Google certificate.
    let mut other = GceVector::load();
    other.attestation.ak_cert = vector("sev-snp/virtee-sev/vcek_milan.der");
    let err = other.verify(&v.pcrs, &GCE_NONCE, GCE_AT).unwrap_err();
    assert!(matches!(err, GceError::NoIntermediate(1)), "{err}");
    // The quoting AK is not the certified one: one byte of its modulus changed.
    let mut swapped_ak = GceVector::load();
    let at = swapped_ak.attestation.ak_pub.len() - 10;
    swapped_ak.attestation.ak_pub[at] ^= 1;
    let err = swapped_ak.verify(&v.pcrs, &GCE_NONCE, GCE_AT).unwrap_err();
    assert!(
        matches!(err, GceError::AkMismatch("the modulus differs")),
        "{err}"
    );
    // A root that is not Google's (AMD's ARK): none issued the intermediate.
    let amd = pem_chain("sev-snp/go-sev-guest/ask_ark_milan.pem")
        .pop()
        .unwrap();
    let intermediates = [v.intermediate.as_slice()];
    let err = gce::verify(
        &v.evidence(&intermediates, &v.pcrs),
        &[&amd],
        &GCE_NONCE,
        GCE_AT,
    )
    .unwrap_err();
    assert!(matches!(err, GceError::NoRoot(1)), "{err}");
    // Policy: another project; a newer vTPM firmware than the host's.
    let verified = v.verify(&v.pcrs, &GCE_NONCE, GCE_AT).unwrap();
    gce::judge(&verified, &gce::GcePolicy::default()).unwrap();
    let err = gce::judge(
        &verified,
        &gce::GcePolicy {
            project_ids: vec!["my-cluster-project".into()],
            ..gce::GcePolicy::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the VM runs in project google.com:wuale-gcp-testing; the policy accepts [\"my-cluster-project\"]"
    );
    let err = gce::judge(
        &verified,
        &gce::GcePolicy {
            minimum_security_version: 1,
            ..gce::GcePolicy::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            GceError::SecurityVersion {
                found: Some(0),
                minimum: 1
            }
        ),
        "{err}"
    );
    // After the AK certificate's notAfter (2051-08-24).
    let err = v
        .verify(&v.pcrs, &GCE_NONCE, VerificationTime(2_629_584_000))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the AK certificate is not valid at the verification time 2053-"),
        "{err}"
    );
}

#[test]
fn a_genuine_tdx_quote_verifies_with_intels_collateral() {
    let quote = vector("tdx/tdx_quote");
    let collateral = tdx_collateral("tdx/tdx_quote_collateral.json");
    let verified = tdx::verify(&quote, &collateral, &TdxPolicy::default(), TDX_AT).unwrap();
    assert_eq!(verified.status, "UpToDate");
    assert!(verified.advisory_ids.is_empty());
    assert_eq!(verified.report.td_attributes[0] & 1, 0, "not a debug TD");
    // A policy that names the TD's MRTD and REPORTDATA accepts it.
    let pinned = TdxPolicy {
        mr_td: Some(verified.report.mr_td),
        report_data: Some(verified.report.report_data),
        rtmrs: [Some(verified.report.rt_mr0), None, None, None],
        ..TdxPolicy::default()
    };
    tdx::verify(&quote, &collateral, &pinned, TDX_AT).unwrap();
    // The collateral's chains end in Intel's SGX Root CA, the pinned one.
    let root = x509_parser::pem::Pem::iter_from_buffer(collateral.tcb_info_issuer_chain.as_bytes())
        .last()
        .unwrap()
        .unwrap()
        .contents;
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&root)),
        tdx::INTEL_SGX_ROOT_CA
    );
}

#[test]
fn tdx_evidence_tampered_or_stale_is_refused_naming_the_reason() {
    let quote = vector("tdx/tdx_quote");
    let collateral = tdx_collateral("tdx/tdx_quote_collateral.json");
    let policy = TdxPolicy::default();
    // A flipped byte of the TD report (its MRTD, at 48 + 136).
    let mut tampered = quote.clone();
    tampered[48 + 136] ^= 1;
    let err = tdx::verify(&tampered, &collateral, &policy, TDX_AT).unwrap_err();
    assert!(matches!(err, TdxError::Dcap { .. }), "{err}");
    // The collateral at today's date: expired (Intel reissues it monthly).
    let err = tdx::verify(&quote, &collateral, &policy, VerificationTime::now()).unwrap_err();
    assert!(
        matches!(err, TdxError::Dcap { ref reason, .. } if reason.contains("Expired")),
        "{err}"
    );
    // TCB info edited (another status): its signature no longer holds.
    let mut forged = collateral.clone();
    forged.tcb_info = forged.tcb_info.replacen("OutOfDate", "UpToDate", 1);
    assert_ne!(
        forged.tcb_info, collateral.tcb_info,
        "the fixture has an OutOfDate level"
    );
    let err = tdx::verify(&quote, &forged, &policy, TDX_AT).unwrap_err();
    assert!(matches!(err, TdxError::Dcap { .. }), "{err}");
    // A wrong nonce, and another MRTD.
    let nonce = TdxPolicy {
        report_data: Some([0x55; 64]),
        ..TdxPolicy::default()
    };
    let err = tdx::verify(&quote, &collateral, &nonce, TDX_AT).unwrap_err();
    assert!(
        matches!(
            err,
            TdxError::Field {
                field: "REPORTDATA",
                ..
            }
        ),
        "{err}"
    );
    let mr_td = TdxPolicy {
        mr_td: Some([0; 48]),
        ..TdxPolicy::default()
    };
    let err = tdx::verify(&quote, &collateral, &mr_td, TDX_AT).unwrap_err();
    assert!(
        matches!(err, TdxError::Field { field: "MRTD", .. }),
        "{err}"
    );
}

#[test]
fn a_platform_below_intels_tcb_levels_or_the_policys_statuses_is_refused() {
    // An Azure TDX host's quote whose TEE TCB SVN is below every level of its TCB info.
    let quote = vector("tdx/tdx_quote_outdated");
    let collateral = tdx_collateral("tdx/tdx_quote_outdated_collateral.json");
    let err = tdx::verify(&quote, &collateral, &TdxPolicy::default(), TDX_OUTDATED_AT).unwrap_err();
    assert!(
        matches!(err, TdxError::Dcap { ref reason, .. } if reason.contains("No matching TCB level")),
        "{err}"
    );
    // A policy that accepts only another status refuses an UpToDate platform, naming both.
    let quote = vector("tdx/tdx_quote");
    let collateral = tdx_collateral("tdx/tdx_quote_collateral.json");
    let strict = TdxPolicy {
        accepted_statuses: vec!["SWHardeningNeeded".into()],
        ..TdxPolicy::default()
    };
    let err = tdx::verify(&quote, &collateral, &strict, TDX_AT).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the platform's TCB status is UpToDate (advisories: none); the policy accepts SWHardeningNeeded"
    );
}

#[test]
fn a_genuine_azure_tdx_cvm_verifies_from_intel_to_the_vtpm_quote() {
    let v = AzureTdxVector::load();
    let hcl = HclReport::parse(&v.hcl_report).unwrap();
    assert_eq!(hcl.kind, azure::HardwareReport::Tdx);
    let verified = v
        .verify(&TdxPolicy::default(), true, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap();
    assert!(verified.ak_certificate_verified);
    assert_eq!(verified.pcrs.len(), 24);
    assert!(
        verified.hcl.vm_configuration.is_object(),
        "{}",
        verified.hcl.vm_configuration
    );
}

#[test]
fn azure_evidence_tampered_is_refused_naming_the_link() {
    let v = AzureTdxVector::load();
    let policy = TdxPolicy::default();
    // The runtime data changed (another AK): REPORT_DATA no longer binds it.
    let mut runtime = AzureTdxVector::load();
    // (The runtime data starts at 1236: header 32, hardware report 1184, IGVM request 20.)
    runtime.hcl_report[1236 + 10] ^= 1;
    let err = runtime
        .verify(&policy, false, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(matches!(err, AzureError::Binding { .. }), "{err}");
    // The TDREPORT's REPORTDATA changed: the TD quote is not of this report.
    let mut report = AzureTdxVector::load();
    report.hcl_report[32 + 128] ^= 1;
    let err = report
        .verify(&policy, false, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(
        matches!(
            err,
            AzureError::Tdx(hawser_platforms::tdx::TdxError::Field {
                field: "REPORTDATA",
                ..
            })
        ),
        "{err}"
    );
    // A wrong nonce, and a PCR changed after the quote.
    let err = v
        .verify(&policy, false, &[1; 32], AZURE_TDX_AT)
        .unwrap_err();
    assert!(
        matches!(err, AzureError::Quote(QuoteError::Nonce { .. })),
        "{err}"
    );
    let mut pcr = AzureTdxVector::load();
    pcr.pcrs.get_mut(&7).unwrap()[0] ^= 1;
    let err = pcr
        .verify(&policy, false, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(
        matches!(err, AzureError::Quote(QuoteError::PcrDigest { .. })),
        "{err}"
    );
    // A flipped byte of the TPM quote.
    let mut quote = AzureTdxVector::load();
    quote.attest[20] ^= 1;
    let err = quote
        .verify(&policy, false, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(
        matches!(err, AzureError::Quote(QuoteError::Signature)),
        "{err}"
    );
    // The AK certificate without its intermediates: no issuer for it.
    let mut bare = AzureTdxVector::load();
    bare.intermediates.clear();
    let err = bare
        .verify(&policy, true, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(matches!(err, AzureError::NoIssuer(_)), "{err}");
    // Another key's certificate: GCE's AK certificate is no Azure certificate.
    let mut other = AzureTdxVector::load();
    other.ak_certificate = GoTpmAttestationBytes::ak_cert();
    let err = other
        .verify(&policy, true, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(matches!(err, AzureError::NoIssuer(_)), "{err}");
    // Policy: another MRTD (the paravisor's firmware), a platform status Intel does not give.
    let other_firmware = TdxPolicy {
        mr_td: Some([7; 48]),
        ..TdxPolicy::default()
    };
    let err = v
        .verify(&other_firmware, false, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(
        matches!(err, AzureError::Tdx(TdxError::Field { field: "MRTD", .. })),
        "{err}"
    );
    let no_status = TdxPolicy {
        accepted_statuses: vec![],
        ..TdxPolicy::default()
    };
    let err = v
        .verify(&no_status, false, &AZURE_NONCE, AZURE_TDX_AT)
        .unwrap_err();
    assert!(matches!(err, AzureError::Tdx(_)), "{err}");
    // A year on, the AK certificate (valid to 2027-06-07) and the collateral have expired.
    let err = v
        .verify(&policy, true, &AZURE_NONCE, VerificationTime::now())
        .unwrap_err();
    assert!(matches!(err, AzureError::Tdx(_)), "{err}");
}

/// The GCE vector's AK certificate, as a certificate of another cloud.
struct GoTpmAttestationBytes;

impl GoTpmAttestationBytes {
    fn ak_cert() -> Vec<u8> {
        use prost::Message as _;
        GoTpmAttestation::decode(vector("gce/gce-cos-85-nonce9009.pb").as_slice())
            .unwrap()
            .ak_cert
    }
}

#[test]
fn a_genuine_azure_snp_cvm_verifies_from_amd_to_the_vtpm_quote() {
    let v = AzureSnpVector::load();
    let hcl = HclReport::parse(&v.hcl_report).unwrap();
    assert_eq!(hcl.kind, azure::HardwareReport::SevSnp);
    let nonce = hex::decode(AZURE_SNP_NONCE).unwrap();
    let verified = v.verify(&azure_snp_policy(), &nonce).unwrap();
    let snp = verified.hcl.snp.as_ref().unwrap();
    assert_eq!(snp.product, Product::Genoa);
    assert_eq!(snp.signing_key, SigningKey::Vcek);
    assert_eq!(snp.report.vmpl, 0);
    assert!(!snp.report.debug_allowed());
    assert_eq!(verified.hcl.ak_modulus.len(), 256, "an RSA-2048 AK");
    assert_eq!(verified.hcl.ak_exponent, 65537);
    assert_eq!(verified.hcl.vm_configuration["secure-boot"], true);
    assert_eq!(verified.pcrs.len(), 24);
    // trustee's own expectation of this capture's PCR 0.
    assert_eq!(
        hex::encode(&verified.pcrs[&0]),
        "afd689d0bb1c5f36f023fbaf574135f555a28a10c1f6b938d2a25e70c7783338"
    );
    // The launch measurement, pinned: a policy that names it accepts the report.
    let policy = SnpPolicy {
        measurement: Some(snp.report.measurement),
        ..azure_snp_policy()
    };
    v.verify_hcl(&policy, AZURE_SNP_AT).unwrap();
}

#[test]
fn azure_snp_evidence_tampered_is_refused_naming_the_link() {
    let v = AzureSnpVector::load();
    let policy = azure_snp_policy();
    let nonce = hex::decode(AZURE_SNP_NONCE).unwrap();
    // A byte of the SNP report (its measurement): AMD's signature fails.
    let mut report = AzureSnpVector::load();
    report.hcl_report[32 + 0x90] ^= 1;
    let err = report.verify(&policy, &nonce).unwrap_err();
    assert!(
        matches!(err, AzureError::Snp(SnpError::Signature(SigningKey::Vcek))),
        "{err}"
    );
    // Another AK in the runtime data: REPORT_DATA no longer binds it.
    let mut runtime = AzureSnpVector::load();
    let n = runtime.hcl_report[1236..]
        .windows(4)
        .position(|w| w == b"\"n\":")
        .unwrap();
    runtime.hcl_report[1236 + n + 10] ^= 1;
    let err = runtime.verify(&policy, &nonce).unwrap_err();
    assert!(matches!(err, AzureError::Binding { .. }), "{err}");
    // A wrong nonce; a PCR changed after the quote; a flipped byte of the TPM quote.
    let err = v.verify(&policy, &[1; 48]).unwrap_err();
    assert!(
        matches!(err, AzureError::Quote(QuoteError::Nonce { .. })),
        "{err}"
    );
    let mut pcr = AzureSnpVector::load();
    pcr.pcrs.get_mut(&11).unwrap()[0] ^= 1;
    let err = pcr.verify(&policy, &nonce).unwrap_err();
    assert!(
        matches!(err, AzureError::Quote(QuoteError::PcrDigest { .. })),
        "{err}"
    );
    let mut quote = AzureSnpVector::load();
    quote.attest[40] ^= 1;
    let err = quote.verify(&policy, &nonce).unwrap_err();
    assert!(
        matches!(err, AzureError::Quote(QuoteError::Signature)),
        "{err}"
    );
    // Milan's ASK and ARK under this Genoa VCEK: a wrong chain.
    let mut milan = AzureSnpVector::load();
    let mut pems = pem_chain("sev-snp/go-sev-guest/ask_ark_milan.pem");
    milan.chain.root = pems.pop().unwrap();
    milan.chain.intermediate = pems.pop().unwrap();
    let err = milan.verify(&policy, &nonce).unwrap_err();
    assert!(matches!(err, AzureError::Snp(_)), "{err}");
    // Another chip's VCEK: the report's signature fails or its product differs.
    let mut other = AzureSnpVector::load();
    other.chain.key = vector("sev-snp/virtee-sev/vcek_milan.der");
    let err = other.verify(&policy, &nonce).unwrap_err();
    assert!(matches!(err, AzureError::Snp(_)), "{err}");
    // Before the VCEK was issued, and after it expires.
    for at in [
        VerificationTime(1_704_067_200),
        VerificationTime(1_988_150_400),
    ] {
        let err = v.verify_hcl(&policy, at).unwrap_err();
        assert!(
            err.to_string()
                .contains("the VCEK is not valid at the verification time"),
            "{err}"
        );
    }
    // Policy: another launch measurement, a VMPL other than the paravisor's, a TCB above the
    // platform's.
    let err = v
        .verify_hcl(
            &SnpPolicy {
                measurement: Some([7; 48]),
                ..azure_snp_policy()
            },
            AZURE_SNP_AT,
        )
        .unwrap_err();
    assert!(err.to_string().contains("measurement"), "{err}");
    let err = v
        .verify_hcl(
            &SnpPolicy {
                vmpl: Some(1),
                ..azure_snp_policy()
            },
            AZURE_SNP_AT,
        )
        .unwrap_err();
    assert!(
        matches!(err, AzureError::Snp(SnpError::Vmpl { .. })),
        "{err}"
    );
    let err = v
        .verify_hcl(
            &SnpPolicy {
                minimum_tcb: TcbVersion {
                    bootloader: 0,
                    tee: 0,
                    snp: 255,
                    microcode: 0,
                },
                ..azure_snp_policy()
            },
            AZURE_SNP_AT,
        )
        .unwrap_err();
    assert!(err.to_string().contains("SNP firmware SPL is 23"), "{err}");
    // An HCL report of the other kind: the TDX capture where SNP is expected.
    let tdx = AzureTdxVector::load();
    let err = azure::verify_hcl(
        &tdx.hcl_report,
        &AzureHardware::SevSnp {
            endorsement: v.chain.endorsement(),
            policy: &policy,
        },
        AZURE_SNP_AT,
    )
    .unwrap_err();
    assert!(matches!(err, AzureError::Kind { .. }), "{err}");
    // A truncated or foreign HCL report.
    let err = HclReport::parse(&v.hcl_report[..1000]).unwrap_err();
    assert!(
        err.to_string().contains("shorter than its fixed part"),
        "{err}"
    );
    let mut foreign = v.hcl_report.clone();
    foreign[0] = b'X';
    let err = HclReport::parse(&foreign).unwrap_err();
    assert!(err.to_string().contains("not \"HCLA\""), "{err}");
}

/// Each profile's genuine vector through the one entry point the cluster's measurements file
/// selects; the same evidence under another profile is refused naming both.
#[test]
fn each_profile_verifies_its_genuine_vector_and_refuses_another_platforms() {
    use hawser_platforms::profile::{self, Platform, PlatformEvidence, ProfileError};
    // gce
    let gce_vector = GceVector::load();
    let intermediates = [gce_vector.intermediate.as_slice()];
    let roots = [gce_vector.root.as_slice()];
    let gce_evidence = PlatformEvidence::Gce {
        evidence: gce_vector.evidence(&intermediates, &gce_vector.pcrs),
        roots: &roots,
        policy: &gce::GcePolicy {
            project_ids: vec!["google.com:wuale-gcp-testing".into()],
            ..gce::GcePolicy::default()
        },
    };
    let verified = profile::verify(Platform::Gce, &gce_evidence, &GCE_NONCE, GCE_AT).unwrap();
    assert_eq!(verified.platform, Platform::Gce);
    assert!(!verified.pcrs.is_empty());
    // azure-snp
    let snp_vector = AzureSnpVector::load();
    let snp_policy = azure_snp_policy();
    let azure_snp = PlatformEvidence::Azure {
        evidence: snp_vector.evidence(&snp_policy),
        roots: &[],
    };
    let nonce = hex::decode(AZURE_SNP_NONCE).unwrap();
    let verified = profile::verify(Platform::AzureSnp, &azure_snp, &nonce, AZURE_SNP_AT).unwrap();
    assert_eq!(verified.launch_measurement.as_ref().map(Vec::len), Some(48));
    // azure-tdx
    let tdx_vector = AzureTdxVector::load();
    let tdx_policy = TdxPolicy::default();
    let tdx_intermediates = tdx_vector.intermediates();
    let azure_roots = [tdx_vector.root.as_slice()];
    let azure_tdx = PlatformEvidence::Azure {
        evidence: tdx_vector.evidence(&tdx_policy, Some(&tdx_intermediates)),
        roots: &azure_roots,
    };
    let verified =
        profile::verify(Platform::AzureTdx, &azure_tdx, &AZURE_NONCE, AZURE_TDX_AT).unwrap();
    assert_eq!(verified.pcrs.len(), 24);
    // sev-snp (bare)
    let report = virtee_report();
    let chain = virtee_chain();
    let policy = virtee_policy(&report);
    let bare_snp = PlatformEvidence::SevSnp {
        report: &report,
        endorsement: chain.endorsement(),
        policy: &policy,
    };
    let verified = profile::verify(Platform::SevSnp, &bare_snp, &[], VIRTEE_AT).unwrap();
    assert!(verified.pcrs.is_empty() && verified.launch_measurement.is_some());
    // tdx (bare)
    let quote = vector("tdx/tdx_quote");
    let collateral = tdx_collateral("tdx/tdx_quote_collateral.json");
    let bare_tdx = PlatformEvidence::Tdx {
        quote: &quote,
        collateral: &collateral,
        policy: &tdx_policy,
    };
    let verified = profile::verify(Platform::Tdx, &bare_tdx, &[], TDX_AT).unwrap();
    assert!(verified.launch_measurement.is_some());

    // Under another profile than the cluster's, each is refused before any check.
    for (evidence, expected) in [
        (&gce_evidence, Platform::AzureTdx),
        (&azure_snp, Platform::SevSnp),
        (&azure_tdx, Platform::AzureSnp),
        (&bare_snp, Platform::AzureSnp),
        (&bare_tdx, Platform::AzureTdx),
    ] {
        let err = profile::verify(expected, evidence, &[], GCE_AT).unwrap_err();
        assert!(matches!(err, ProfileError::Mismatch { .. }), "{err}");
        assert!(
            err.to_string().contains(&format!(
                "select the {expected} profile; the node presented {}",
                evidence.platform()
            )),
            "{err}"
        );
    }
    let err = profile::verify(Platform::Qemu, &gce_evidence, &[], GCE_AT).unwrap_err();
    assert!(
        matches!(err, ProfileError::NotHere(Platform::Qemu)),
        "{err}"
    );
}
