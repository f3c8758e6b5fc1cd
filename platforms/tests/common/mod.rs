//! The captured vectors (`tests/vectors/`, origin and licence in its README) and their loaders,
//! shared by the tests of this crate.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test uses a part

use std::collections::BTreeMap;
use std::path::PathBuf;

use hawser_platforms::VerificationTime;
use hawser_platforms::azure::{self, AzureError, AzureEvidence, AzureHardware};
use hawser_platforms::gce::{self, GceError, GceEvidence, VtpmQuote};
use hawser_platforms::snp::{AttestationReport, SnpEndorsement, SnpPolicy};

pub fn vector(path: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn pem_ders(text: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|pem| pem.unwrap().contents)
        .collect()
}

/// go-tpm-tools' `attest.Attestation` (proto/attest.proto), the fields its GCE vectors carry.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GoTpmAttestation {
    #[prost(bytes = "vec", tag = "1")]
    pub ak_pub: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub quotes: Vec<GoTpmQuote>,
    #[prost(bytes = "vec", tag = "3")]
    pub event_log: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    pub ak_cert: Vec<u8>,
}

/// `tpm.Quote`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GoTpmQuote {
    #[prost(bytes = "vec", tag = "1")]
    pub quote: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub raw_sig: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    pub pcrs: Option<GoTpmPcrs>,
}

/// `tpm.PCRs`: the bank (a TPM_ALG_ID) and its values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GoTpmPcrs {
    #[prost(int32, tag = "1")]
    pub hash: i32,
    #[prost(btree_map = "uint32, bytes", tag = "2")]
    pub pcrs: BTreeMap<u32, Vec<u8>>,
}

/// 2024-01-01T00:00:00Z: Google's AK certificate is valid 2021-08-31 to 2051-08-24.
pub const GCE_AT: VerificationTime = VerificationTime(1_704_067_200);
/// The vector's nonce (its name: `nonce9009`).
pub const GCE_NONCE: [u8; 2] = [0x90, 0x09];

pub struct GceVector {
    pub attestation: GoTpmAttestation,
    /// The SHA-256 bank's quote and values.
    pub quote: GoTpmQuote,
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub intermediate: Vec<u8>,
    pub root: Vec<u8>,
}

impl GceVector {
    pub fn load() -> Self {
        use prost::Message as _;
        let attestation =
            GoTpmAttestation::decode(vector("gce/gce-cos-85-nonce9009.pb").as_slice()).unwrap();
        assert!(
            !attestation.event_log.is_empty(),
            "the vector has an event log"
        );
        let quote = attestation
            .quotes
            .iter()
            .find(|q| q.pcrs.as_ref().is_some_and(|p| p.hash == 0x000b))
            .expect("a SHA-256 quote")
            .clone();
        let pcrs = quote
            .pcrs
            .as_ref()
            .unwrap()
            .pcrs
            .iter()
            .map(|(k, v)| (u8::try_from(*k).unwrap(), v.clone()))
            .collect();
        Self {
            attestation,
            quote,
            pcrs,
            intermediate: vector("gce/tpm_ek_intermediate_2.crt"),
            root: vector("gce/tpm_ek_root_1.cer"),
        }
    }

    /// The vector as evidence, with `pcrs` presented and `intermediates` (its intermediate,
    /// or others) sent along.
    pub fn evidence<'a>(
        &'a self,
        intermediates: &'a [&'a [u8]],
        pcrs: &'a BTreeMap<u8, Vec<u8>>,
    ) -> GceEvidence<'a> {
        GceEvidence {
            ak_public: &self.attestation.ak_pub,
            ak_certificate: &self.attestation.ak_cert,
            intermediates,
            quote: VtpmQuote {
                attest: &self.quote.quote,
                signature: &self.quote.raw_sig,
                pcrs,
            },
        }
    }

    pub fn verify(
        &self,
        pcrs: &BTreeMap<u8, Vec<u8>>,
        nonce: &[u8],
        at: VerificationTime,
    ) -> Result<gce::VerifiedGce, GceError> {
        let intermediates = [self.intermediate.as_slice()];
        gce::verify(
            &self.evidence(&intermediates, pcrs),
            &[&self.root],
            nonce,
            at,
        )
    }
}

pub fn yaml(path: &str) -> serde_norway::Value {
    serde_norway::from_slice(&vector(path)).unwrap()
}

pub fn yaml_bytes(value: &serde_norway::Value) -> Vec<u8> {
    value
        .as_sequence()
        .unwrap()
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect()
}

/// 2024-01-01T00:00:00Z: inside the virtee Milan VCEK's validity.
pub const VIRTEE_AT: VerificationTime = VerificationTime(1_704_067_200);
/// 2022-09-24T01:00:00Z: go-sev-guest's own verification time for its vector.
pub const GO_SEV_GUEST_AT: VerificationTime = VerificationTime(1_663_981_200);
/// 2025-06-01T00:00:00Z: inside the trustee VLEK's one-year validity.
pub const VLEK_AT: VerificationTime = VerificationTime(1_748_736_000);

/// The DER certificates of a PEM file, in order.
pub fn pem_chain(path: &str) -> Vec<Vec<u8>> {
    let text = String::from_utf8(vector(path)).unwrap();
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|pem| pem.unwrap().contents)
        .collect()
}

pub fn virtee_report() -> Vec<u8> {
    let text = String::from_utf8(vector("sev-snp/virtee-sev/report_milan.hex")).unwrap();
    hex::decode(text.trim()).unwrap()
}

pub struct Chain {
    pub key: Vec<u8>,
    pub intermediate: Vec<u8>,
    pub root: Vec<u8>,
}

impl Chain {
    pub fn new(key: &str, ask_ark: &str) -> Self {
        let mut pems = pem_chain(ask_ark);
        assert_eq!(pems.len(), 2, "{ask_ark}: the ASK then the ARK");
        let root = pems.pop().unwrap();
        Self {
            key: vector(key),
            intermediate: pems.pop().unwrap(),
            root,
        }
    }

    pub fn endorsement(&self) -> SnpEndorsement<'_> {
        SnpEndorsement {
            key: &self.key,
            intermediate: &self.intermediate,
            root: &self.root,
        }
    }
}

pub fn virtee_chain() -> Chain {
    Chain::new(
        "sev-snp/virtee-sev/vcek_milan.der",
        "sev-snp/go-sev-guest/ask_ark_milan.pem",
    )
}

/// The policy a verifier who knows the virtee guest would set: its measurement and
/// REPORT_DATA (the nonce), VMPL 0, the TCB it reports as the minimum.
pub fn virtee_policy(report: &[u8]) -> SnpPolicy {
    let parsed = AttestationReport::from_bytes(report).unwrap();
    SnpPolicy {
        vmpl: Some(0),
        minimum_tcb: parsed.reported_tcb,
        measurement: Some(parsed.measurement),
        report_data: Some(parsed.report_data),
        ..SnpPolicy::default()
    }
}

/// 2025-07-01T00:00:00Z: inside the dcap-qvl sample's collateral window (2025-06-19 to
/// 2025-07-19: TCB info, QE identity and both CRLs all current).
pub const TDX_AT: VerificationTime = VerificationTime(1_751_328_000);
/// 2026-03-01T00:00:00Z: inside the outdated sample's collateral window.
pub const TDX_OUTDATED_AT: VerificationTime = VerificationTime(1_772_323_200);

pub fn tdx_collateral(path: &str) -> dcap_qvl::QuoteCollateralV3 {
    serde_json::from_slice(&vector(path)).unwrap()
}

/// 1780922561 = 2026-06-08T12:42:41Z: flashbots' capture time, inside the collateral's window
/// (2026-06-08T12:24:22Z to 2026-07-08T11:28:48Z) and the AK certificate's (from 2026-06-08).
pub const AZURE_TDX_AT: VerificationTime = VerificationTime(1_780_922_561);

/// flashbots/attested-tls's Azure TDX capture: a TD quote, the HCL report, the vTPM's AK
/// certificate with its intermediates, a TPM quote and the 24 PCRs, and Intel's collateral.
pub struct AzureTdxVector {
    pub td_quote: Vec<u8>,
    pub hcl_report: Vec<u8>,
    pub ak_certificate: Vec<u8>,
    pub intermediates: Vec<Vec<u8>>,
    pub attest: Vec<u8>,
    /// The quote's signature as a TPMT_SIGNATURE (the capture holds the raw RSA bytes).
    pub signature: Vec<u8>,
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub collateral: dcap_qvl::QuoteCollateralV3,
    pub root: Vec<u8>,
}

impl AzureTdxVector {
    pub fn load() -> Self {
        use base64::Engine as _;
        let evidence = yaml("azure/azure-tdx-with-ak-intermediates-1780922561.yaml");
        let url = |key: &str| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(evidence[key].as_str().unwrap().trim().trim_end_matches('='))
                .unwrap()
        };
        let tpm = &evidence["tpm_attestation"];
        let quote = &tpm["quote"];
        let pcrs = quote["pcrs"]
            .as_sequence()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, v)| (u8::try_from(i).unwrap(), yaml_bytes(v)))
            .collect();
        let collateral = yaml("azure/azure-collateral-with-ak-intermediates-1780922561.yaml");
        let text = |key: &str| collateral[key].as_str().unwrap().to_owned();
        let bytes = |key: &str| hex::decode(text(key).trim()).unwrap();
        Self {
            td_quote: url("tdx_quote_base64"),
            hcl_report: url("hcl_report_base64"),
            ak_certificate: pem_ders(tpm["ak_certificate_pem"].as_str().unwrap()).remove(0),
            intermediates: tpm["ak_intermediate_certificates_pem"]
                .as_sequence()
                .unwrap()
                .iter()
                .flat_map(|pem| pem_ders(pem.as_str().unwrap()))
                .collect(),
            attest: yaml_bytes(&quote["message"]),
            signature: tpmt_rsassa_sha256(&yaml_bytes(&quote["signature"])),
            pcrs,
            collateral: dcap_qvl::QuoteCollateralV3 {
                pck_crl_issuer_chain: text("pck_crl_issuer_chain"),
                root_ca_crl: bytes("root_ca_crl"),
                pck_crl: bytes("pck_crl"),
                tcb_info_issuer_chain: text("tcb_info_issuer_chain"),
                tcb_info: text("tcb_info"),
                tcb_info_signature: bytes("tcb_info_signature"),
                qe_identity_issuer_chain: text("qe_identity_issuer_chain"),
                qe_identity: text("qe_identity"),
                qe_identity_signature: bytes("qe_identity_signature"),
                pck_certificate_chain: None,
            },
            root: pem_ders(
                std::str::from_utf8(&vector("azure/azure-virtual-tpm-root-2023.pem")).unwrap(),
            )
            .remove(0),
        }
    }

    /// The AK certificate's intermediates, as [`Self::evidence`] takes them.
    pub fn intermediates(&self) -> Vec<&[u8]> {
        self.intermediates.iter().map(Vec::as_slice).collect()
    }

    /// The vector as evidence under `policy`, with its AK certificate and `intermediates`
    /// (from [`Self::intermediates`]) if given.
    pub fn evidence<'a>(
        &'a self,
        policy: &'a hawser_platforms::tdx::TdxPolicy,
        intermediates: Option<&'a [&'a [u8]]>,
    ) -> AzureEvidence<'a> {
        AzureEvidence {
            hcl_report: &self.hcl_report,
            hardware: AzureHardware::Tdx {
                quote: &self.td_quote,
                collateral: &self.collateral,
                policy,
            },
            quote: VtpmQuote {
                attest: &self.attest,
                signature: &self.signature,
                pcrs: &self.pcrs,
            },
            ak_certificate: intermediates
                .map(|intermediates| (self.ak_certificate.as_slice(), intermediates)),
        }
    }

    pub fn verify(
        &self,
        policy: &hawser_platforms::tdx::TdxPolicy,
        with_certificate: bool,
        nonce: &[u8],
        at: VerificationTime,
    ) -> Result<azure::VerifiedAzure, AzureError> {
        let intermediates = self.intermediates();
        azure::verify(
            &self.evidence(policy, with_certificate.then_some(intermediates.as_slice())),
            &[&self.root],
            nonce,
            at,
        )
    }
}

/// A TPMT_SIGNATURE (RSASSA, SHA-256) around raw RSA signature bytes, as the captures hold them.
pub fn tpmt_rsassa_sha256(signature: &[u8]) -> Vec<u8> {
    let mut tpmt = vec![0x00, 0x14, 0x00, 0x0b];
    tpmt.extend_from_slice(&u16::try_from(signature.len()).unwrap().to_be_bytes());
    tpmt.extend_from_slice(signature);
    tpmt
}

/// The TPM quote's extraData in the capture: 32 zero bytes.
pub const AZURE_NONCE: [u8; 32] = [0; 32];

/// 2026-02-20T00:00:00Z: the day trustee committed the capture, inside the VCEK's validity
/// (2025-01-24 to 2032-01-24).
pub const AZURE_SNP_AT: VerificationTime = VerificationTime(1_771_545_600);

/// confidential-containers/trustee's capture from an Azure SEV-SNP confidential VM on Genoa:
/// the HCL report, a TPM quote by the AK it names with the 24 SHA-256 PCRs, and the chip's VCEK
/// (the ASK and ARK are AMD's Genoa chain, from go-sev-guest).
pub struct AzureSnpVector {
    pub hcl_report: Vec<u8>,
    pub attest: Vec<u8>,
    /// The quote's signature as a TPMT_SIGNATURE (the capture holds the raw RSA bytes).
    pub signature: Vec<u8>,
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    pub chain: Chain,
}

/// The capture's TPM quote extraData: the verifier's 48-byte nonce.
pub const AZURE_SNP_NONCE: &str = "0218488bae25d2509232bf676f1a66a30d7372add909109b36016ef136f2938ca05475f8b46094de6b64270ea35d950f";

impl AzureSnpVector {
    pub fn load() -> Self {
        let evidence: serde_json::Value =
            serde_json::from_slice(&vector("azure/evidence-genoa.json")).unwrap();
        let bytes = |value: &serde_json::Value| -> Vec<u8> {
            value
                .as_array()
                .unwrap()
                .iter()
                .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
                .collect()
        };
        let quote = &evidence["quote"];
        let genoa = Chain::new(
            "sev-snp/go-sev-guest/vcek.testcer",
            "sev-snp/go-sev-guest/ask_ark_genoa.pem",
        );
        Self {
            hcl_report: bytes(&evidence["report"]),
            attest: bytes(&quote["message"]),
            signature: tpmt_rsassa_sha256(&bytes(&quote["signature"])),
            pcrs: quote["pcrs"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, v)| (u8::try_from(i).unwrap(), bytes(v)))
                .collect(),
            chain: Chain {
                key: pem_chain("azure/vcek-genoa.pem").remove(0),
                ..genoa
            },
        }
    }

    pub fn verify_hcl(
        &self,
        policy: &SnpPolicy,
        at: VerificationTime,
    ) -> Result<azure::VerifiedHcl, AzureError> {
        azure::verify_hcl(
            &self.hcl_report,
            &AzureHardware::SevSnp {
                endorsement: self.chain.endorsement(),
                policy,
            },
            at,
        )
    }

    /// The vector as evidence under `policy` (the capture has no AK certificate: the HCL
    /// report's runtime data names the AK).
    pub fn evidence<'a>(&'a self, policy: &'a SnpPolicy) -> AzureEvidence<'a> {
        AzureEvidence {
            hcl_report: &self.hcl_report,
            hardware: AzureHardware::SevSnp {
                endorsement: self.chain.endorsement(),
                policy,
            },
            quote: VtpmQuote {
                attest: &self.attest,
                signature: &self.signature,
                pcrs: &self.pcrs,
            },
            ak_certificate: None,
        }
    }

    pub fn verify(
        &self,
        policy: &SnpPolicy,
        nonce: &[u8],
    ) -> Result<azure::VerifiedAzure, AzureError> {
        azure::verify(&self.evidence(policy), &[], nonce, AZURE_SNP_AT)
    }
}

/// What Azure's paravisor runs at: VMPL 0, no debugging, no migration agent.
pub fn azure_snp_policy() -> SnpPolicy {
    SnpPolicy {
        vmpl: Some(0),
        ..SnpPolicy::default()
    }
}
