//! The evidence paths' fixtures: each profile's node-side `Evidence` built from the captured
//! vectors (`tests/vectors/`) through the node's own gathering code, and its verifier.
//!
//! Genuine: every report, quote, signature, certificate, PCR value and collateral item, byte for
//! byte as captured. Arranged, each said where it is made: the containers the node reads them
//! from (a configfs-tsm tree in a tempdir, an SNP certificate table, THIM's JSON, an NV map in
//! memory instead of a vTPM) and, on Azure, the AK's `TPM2B_PUBLIC`, which the captures do not
//! hold: it is rebuilt from `HCLAkPub` with Azure's AK template, and the quote's signed
//! `qualifiedSigner` names exactly that public area (the verifier checks it), so the
//! reconstruction is confirmed by the TPM's own signature.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test uses a part

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hawser_attestation::evidence::{Binding, EVIDENCE_VERSION, Evidence, EvidenceIssuer, Role};
use hawser_attestation::platform::{PlatformRefusal, PlatformVerified, PlatformVerifier};
use hawser_attestation::releases::ReleaseSet;
use hawser_attestation::{ExpectedMeasurements, ExpectedPcr, Variant};
use hawser_platforms::azure::{self, HclReport};
use hawser_platforms::node::{self, AzureAuxRequest, TsmIssuer};
use hawser_platforms::profile::Platform;
use hawser_platforms::snp::{AttestationReport, SnpPolicy};
use hawser_platforms::tdx::TdxPolicy;
use hawser_platforms::verifier_cloud::{AzureVerifier, SnpVerifier, TdxVerifier, azure_snp_policy};

use crate::common::*;

/// The binding every test's node attests to (a client's, to one verifier nonce and TLS key).
pub const NONCE: [u8; 32] = [0x11; 32];
pub const TLS_SPKI: &[u8] = b"the node's TLS SubjectPublicKeyInfo";

pub fn binding() -> Binding<'static> {
    Binding {
        role: Role::Client,
        nonce: &NONCE,
        tls_spki_der: TLS_SPKI,
    }
}

/// DER → PEM.
pub fn pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Azure's vTPM AK as a `TPM2B_PUBLIC`: RSA-2048, SHA-256 name, fixedTPM | fixedParent |
/// sensitiveDataOrigin | userWithAuth | noDA | restricted | sign (0x00050472), RSASSA-SHA256,
/// exponent 0 (65537), the modulus `HCLAkPub`'s. Both captures' quotes name this area, as a
/// primary of the endorsement hierarchy, in their signed `qualifiedSigner`.
pub fn azure_ak_public(hcl_report: &[u8]) -> Vec<u8> {
    let (modulus, exponent) = HclReport::parse(hcl_report).unwrap().ak_public().unwrap();
    assert_eq!(exponent, [1, 0, 1]);
    let mut tpmt = vec![0x00, 0x01, 0x00, 0x0b, 0x00, 0x05, 0x04, 0x72, 0x00, 0x00];
    tpmt.extend_from_slice(&[0x00, 0x10, 0x00, 0x14, 0x00, 0x0b, 0x08, 0x00, 0, 0, 0, 0]);
    tpmt.extend_from_slice(&u16::try_from(modulus.len()).unwrap().to_be_bytes());
    tpmt.extend_from_slice(&modulus);
    let mut tpm2b = u16::try_from(tpmt.len()).unwrap().to_be_bytes().to_vec();
    tpm2b.extend_from_slice(&tpmt);
    tpm2b
}

/// The TPM name `000b || SHA-256(TPMT_PUBLIC)` of a `TPM2B_PUBLIC`.
pub fn tpm_name(tpm2b: &[u8]) -> Vec<u8> {
    use sha2::Digest as _;
    let mut name = vec![0x00, 0x0b];
    name.extend_from_slice(&sha2::Sha256::digest(&tpm2b[2..]));
    name
}

/// An Azure node's evidence: the platform part through [`node::azure_evidence_parts`] (what
/// `issuer_for_azure` sends), the TPM part (quote, signature, PCRs, AK public area) as
/// `TpmIssuer::issue_evidence` fills it, here from the capture.
pub fn azure_evidence(
    platform: Platform,
    nv: &BTreeMap<u32, Vec<u8>>,
    aux: Vec<u8>,
    attest: &[u8],
    signature: &[u8],
    pcrs: &BTreeMap<u8, Vec<u8>>,
) -> Evidence {
    let parts = node::azure_evidence_parts(platform, nv, aux).unwrap();
    Evidence {
        version: EVIDENCE_VERSION,
        variant: parts.variant as i32,
        ak_public: azure_ak_public(&parts.platform_report),
        quote: attest.to_vec(),
        signature: signature.to_vec(),
        pcrs_sha256: pcrs
            .iter()
            .map(|(k, v)| (u32::from(*k), v.clone()))
            .collect(),
        ak_cert_chain: parts.ak_cert_chain,
        user_data: Vec::new(),
        nonce: NONCE.to_vec(),
        tls_key_hash: binding().tls_key_hash().to_vec(),
        platform_report: parts.platform_report,
        platform_aux: parts.platform_aux,
    }
}

/// trustee's Azure SNP capture as the node assembles it. The VCEK chain is what IMDS's THIM
/// endpoint answers (arranged JSON: the capture's VCEK, AMD's genuine Genoa ASK and ARK),
/// through [`node::thim_vcek_chain`]. Returns the evidence and the quote's captured extraData.
pub fn azure_snp() -> (Evidence, Vec<u8>) {
    let v = AzureSnpVector::load();
    let nv = BTreeMap::from([(azure::HCL_REPORT_NV_INDEX, v.hcl_report.clone())]);
    assert_eq!(
        node::azure_aux_request(Platform::AzureSnp, &v.hcl_report).unwrap(),
        AzureAuxRequest::VcekChain
    );
    let thim = serde_json::json!({
        "vcekCert": pem(&v.chain.key),
        "certificateChain": pem(&v.chain.intermediate) + &pem(&v.chain.root),
        "tcbm": "arranged",
    });
    let aux = node::thim_vcek_chain(thim.to_string().as_bytes()).unwrap();
    let evidence = azure_evidence(
        Platform::AzureSnp,
        &nv,
        aux,
        &v.attest,
        &v.signature,
        &v.pcrs,
    );
    (evidence, hex::decode(AZURE_SNP_NONCE).unwrap())
}

pub fn azure_snp_verifier() -> AzureVerifier {
    AzureVerifier::snp("", azure_snp_policy())
        .unwrap()
        .at(AZURE_SNP_AT)
}

/// flashbots' Azure TDX capture as the node assembles it: the HCL report and the AK
/// certificate from their NV indices, the TD quote as IMDS answered the capture's request for
/// it (the request, the TDREPORT, is the one the node derives from the HCL report).
pub fn azure_tdx() -> (Evidence, Vec<u8>) {
    let v = AzureTdxVector::load();
    let nv = BTreeMap::from([
        (azure::HCL_REPORT_NV_INDEX, v.hcl_report.clone()),
        (azure::AK_CERT_NV_INDEX, v.ak_certificate.clone()),
    ]);
    let AzureAuxRequest::TdQuote { td_report } =
        node::azure_aux_request(Platform::AzureTdx, &v.hcl_report).unwrap()
    else {
        panic!("a TDX HCL report asks for a TD quote");
    };
    // The captured quote is of this TDREPORT: the same REPORTDATA (TDREPORT offset 128; the
    // v4 quote's body starts at 48, REPORTDATA its last 64 of 584 bytes).
    assert_eq!(td_report.len(), 1024);
    assert_eq!(&td_report[128..192], &v.td_quote[48 + 520..48 + 584]);
    let evidence = azure_evidence(
        Platform::AzureTdx,
        &nv,
        v.td_quote.clone(),
        &v.attest,
        &v.signature,
        &v.pcrs,
    );
    (evidence, AZURE_NONCE.to_vec())
}

/// The Azure TDX verifier: the capture's collateral, Azure's AK intermediates and root.
pub fn azure_tdx_verifier() -> AzureVerifier {
    let v = AzureTdxVector::load();
    let mut bundle: String = v.intermediates.iter().map(|der| pem(der)).collect();
    bundle.push_str(&pem(&v.root));
    AzureVerifier::tdx(&bundle, vec![v.collateral], TdxPolicy::default())
        .unwrap()
        .at(AZURE_TDX_AT)
}

/// A GUID's bytes as an SNP certificate table holds them (the first three fields
/// little-endian).
fn guid(text: &str) -> [u8; 16] {
    let hex = hex::decode(text.replace('-', "")).unwrap();
    let mut out = [0; 16];
    out.copy_from_slice(&hex);
    out[0..4].reverse();
    out[4..6].reverse();
    out[6..8].reverse();
    out
}

/// An SEV-SNP certificate table (the GHCB extended report's layout) of VCEK, ASK and ARK.
pub fn snp_certificate_table(vcek: &[u8], ask: &[u8], ark: &[u8]) -> Vec<u8> {
    let entries = [
        ("63da758d-e664-4564-adc5-f4b93be8accd", vcek),
        ("4ab7b379-bbac-4fe4-a02f-05aef327c782", ask),
        ("c0b406a4-a803-4952-9743-3fb6014cd0ae", ark),
    ];
    let mut offset = 24 * (entries.len() + 1);
    let mut table = Vec::new();
    for (id, der) in entries {
        table.extend_from_slice(&guid(id));
        table.extend_from_slice(&u32::try_from(offset).unwrap().to_le_bytes());
        table.extend_from_slice(&u32::try_from(der.len()).unwrap().to_le_bytes());
        offset += der.len();
    }
    table.extend_from_slice(&[0; 24]);
    for (_, der) in entries {
        table.extend_from_slice(der);
    }
    table
}

/// A configfs-tsm tree under `root` as a guest kernel shows it once the report directory
/// exists: its provider, generation counter, the report (`outblob`) and, for SNP, `auxblob`.
pub fn fake_tsm(root: &Path, provider: &str, outblob: &[u8], auxblob: Option<&[u8]>) {
    let dir = root.join("report").join(TsmIssuer::REPORT_NAME);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("provider"), format!("{provider}\n")).unwrap();
    std::fs::write(dir.join("generation"), "1\n").unwrap();
    std::fs::write(dir.join("outblob"), outblob).unwrap();
    if let Some(auxblob) = auxblob {
        std::fs::write(dir.join("auxblob"), auxblob).unwrap();
    }
}

/// What the node wrote to `inblob`.
pub fn inblob(root: &Path) -> Vec<u8> {
    std::fs::read(
        root.join("report")
            .join(TsmIssuer::REPORT_NAME)
            .join("inblob"),
    )
    .unwrap()
}

/// virtee's Milan report through [`TsmIssuer`] over a fake configfs-tsm tree, its auxblob a
/// certificate table of the genuine VCEK, ASK and ARK. Returns the evidence and the report's
/// captured REPORT_DATA.
pub fn bare_snp(root: &Path) -> (Evidence, [u8; 64]) {
    let report = virtee_report();
    let chain = virtee_chain();
    let table = snp_certificate_table(&chain.key, &chain.intermediate, &chain.root);
    fake_tsm(root, "sev_guest", &report, Some(&table));
    let issuer = TsmIssuer::new(root, Platform::SevSnp).unwrap();
    let evidence = issuer.issue(&binding(), b"").unwrap();
    let captured = AttestationReport::from_bytes(&report).unwrap().report_data;
    (evidence, captured)
}

/// The virtee guest's policy, less its REPORT_DATA (the verifier sets the binding's).
pub fn bare_snp_verifier() -> SnpVerifier {
    let policy = SnpPolicy {
        report_data: None,
        ..virtee_policy(&virtee_report())
    };
    SnpVerifier::new("", policy).unwrap().at(VIRTEE_AT)
}

/// dcap-qvl's TDX sample quote through [`TsmIssuer`] over a fake configfs-tsm tree (TDX has no
/// auxblob). Returns the evidence and the quote's captured REPORTDATA.
pub fn bare_tdx(root: &Path) -> (Evidence, [u8; 64]) {
    let quote = vector("tdx/tdx_quote");
    fake_tsm(root, "tdx_guest", &quote, None);
    let issuer = TsmIssuer::new(root, Platform::Tdx).unwrap();
    let evidence = issuer.issue(&binding(), b"").unwrap();
    let mut captured = [0; 64];
    captured.copy_from_slice(&quote[48 + 520..48 + 584]);
    (evidence, captured)
}

pub fn bare_tdx_verifier() -> TdxVerifier {
    TdxVerifier::new(
        vec![tdx_collateral("tdx/tdx_quote_collateral.json")],
        TdxPolicy::default(),
    )
    .at(TDX_AT)
}

/// A verification against a capture's own binding.
pub type VerifyCaptured =
    dyn Fn(&Evidence) -> Result<PlatformVerified, PlatformRefusal> + Send + Sync;

/// A platform verifier that checks the evidence against the binding its capture was made for
/// instead of the validator's: the one arranged step between a capture and the validator
/// (which derives its binding from its own nonce and TLS key, so no captured quote or report
/// can match it). Everything else runs as in a join service: the validator's variant check,
/// the platform's verification, the validator's release check.
pub struct Captured {
    pub variant: Variant,
    pub verify: Box<VerifyCaptured>,
}

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captured")
            .field("variant", &self.variant)
            .finish()
    }
}

impl PlatformVerifier for Captured {
    fn variant(&self) -> Variant {
        self.variant
    }

    fn verify(
        &self,
        evidence: &Evidence,
        _: &[u8; 32],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        (self.verify)(evidence)
    }
}

pub fn captured_azure(verifier: AzureVerifier, extra_data: Vec<u8>) -> Arc<Captured> {
    Arc::new(Captured {
        variant: verifier.variant(),
        verify: Box::new(move |evidence| verifier.verify_bound(evidence, &extra_data)),
    })
}

/// The release a cluster of the captured node would accept: its PCRs the profile enforces,
/// as captured.
pub fn release_of(platform: Platform, evidence: &Evidence) -> ReleaseSet {
    let mut measurements = ExpectedMeasurements::new();
    for pcr in platform.enforceable_pcrs() {
        let value = &evidence.pcrs_sha256[&u32::from(*pcr)];
        measurements.insert(
            *pcr,
            ExpectedPcr {
                expected: value.as_slice().try_into().unwrap(),
                warn_only: false,
            },
        );
    }
    ReleaseSet::single("captured", measurements)
}

/// A release that enforces PCR 4 at a value no capture has.
pub fn other_release() -> ReleaseSet {
    let mut measurements = ExpectedMeasurements::new();
    measurements.insert(
        4,
        ExpectedPcr {
            expected: [0xee; 32],
            warn_only: false,
        },
    );
    ReleaseSet::single("other", measurements)
}

/// Every profile's evidence with its verifier, which checks the binding its capture answers.
pub fn every_profile(
    dir: &std::path::Path,
) -> Vec<(Platform, Evidence, Arc<dyn PlatformVerifier>)> {
    let (azure_snp, snp_extra) = azure_snp();
    let (azure_tdx, tdx_extra) = azure_tdx();
    let (snp, snp_data) = bare_snp(&dir.join("snp"));
    let (tdx, tdx_data) = bare_tdx(&dir.join("tdx"));
    vec![
        (
            Platform::AzureSnp,
            azure_snp,
            captured_azure(azure_snp_verifier(), snp_extra),
        ),
        (
            Platform::AzureTdx,
            azure_tdx,
            captured_azure(azure_tdx_verifier(), tdx_extra),
        ),
        (
            Platform::SevSnp,
            snp,
            Arc::new(Captured {
                variant: Variant::SevSnp,
                verify: Box::new(move |e| bare_snp_verifier().verify_bound(e, &snp_data)),
            }),
        ),
        (
            Platform::Tdx,
            tdx,
            Arc::new(Captured {
                variant: Variant::Tdx,
                verify: Box::new(move |e| bare_tdx_verifier().verify_bound(e, &tdx_data)),
            }),
        ),
    ]
}
