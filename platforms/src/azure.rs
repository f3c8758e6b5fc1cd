//! Azure confidential VMs (DCesv5/ECesv5 on Intel TDX, DCasv5/ECasv5 on AMD SEV-SNP): the
//! vTPM's quote, tied to the CPU's attestation through the HCL report, verified offline.
//!
//! On these VMs the vTPM runs in the paravisor (the HCL), inside the confidential boundary.
//! At boot the HCL writes an *HCL report* to the vTPM's NV index [`HCL_REPORT_NV_INDEX`]: the
//! CPU's report (an SEV-SNP attestation report, or a TDX TDREPORT) whose `REPORT_DATA` holds the
//! SHA-256 of a JSON *runtime data* document, which carries the vTPM's attestation key
//! (`HCLAkPub`). So the chain of trust, for [`verify`]:
//!
//! 1. the hardware report: SEV-SNP verified to AMD's ARK ([`crate::snp`]); TDX by the TD quote
//!    Azure's quoting service makes of the same TDREPORT, verified with Intel's collateral
//!    ([`crate::tdx`]) — the TDREPORT itself is MACed for the CPU only;
//! 2. the report's `REPORT_DATA` is SHA-256(runtime data) followed by 32 zero bytes;
//! 3. the runtime data's `HCLAkPub` signed the TPM quote (RSASSA, SHA-256), whose `extraData` is
//!    the verifier's nonce and whose digest covers the PCR values presented;
//! 4. optionally the AK certificate (NV [`AK_CERT_NV_INDEX`]) chains through its intermediates
//!    to Azure's pinned root ([`AZURE_VTPM_ROOTS`]) and holds the same key.
//!
//! The HCL report layout (header "HCLA", a 1184-byte hardware report slot, the IGVM request
//! data, the runtime data) is read by hand: it is small and fixed, and the crates that parse
//! it (`az-cvm-vtpm`) bring tss-esapi and OpenSSL with their verifiers.

use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};
use x509_parser::public_key::PublicKey;

use crate::chain::{Cert, ChainError, VerificationTime, trim, verify_chain};
use crate::tpm_rsa::{QuoteError, VtpmQuote, verify_quote};

/// Where the HCL writes its report.
pub const HCL_REPORT_NV_INDEX: u32 = 0x0140_0001;
/// Where a guest writes 64 bytes of its own that the next HCL report carries in its runtime
/// data (`user-data`).
pub const HCL_USER_DATA_NV_INDEX: u32 = 0x0140_0002;
/// The AK certificate's NV index on Azure.
pub const AK_CERT_NV_INDEX: u32 = 0x01c1_01d0;

/// Azure's roots for vTPM AK certificates, by the SHA-256 of their DER: "Azure Virtual TPM Root
/// Certificate Authority 2023".
pub const AZURE_VTPM_ROOTS: [&str; 1] =
    ["e6c596b17f8ffefba5c300f714cfb1260c6028704ecf7becc4ab5018efb00e95"];

const HEADER_LEN: usize = 32;
const HW_REPORT_LEN: usize = 1184;
const IGVM_REQUEST_AT: usize = HEADER_LEN + HW_REPORT_LEN;
const RUNTIME_DATA_AT: usize = IGVM_REQUEST_AT + 20;
/// "HCLA", little-endian.
const HCL_SIGNATURE: u32 = 0x414c_4348;
/// The TDREPORT's REPORTDATA: after REPORTMACSTRUCT's type, reserved, CPUSVN and two hashes.
const TDREPORT_REPORT_DATA_AT: usize = 128;

/// The CPU report an HCL report carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardwareReport {
    /// An SEV-SNP attestation report (IGVM report type 2).
    SevSnp,
    /// A TDX TDREPORT (IGVM report type 4).
    Tdx,
}

/// A parsed HCL report.
#[derive(Debug, Clone)]
pub struct HclReport {
    pub kind: HardwareReport,
    /// The hardware report slot: 1184 bytes for SNP, the 1024-byte TDREPORT and padding for
    /// TDX.
    pub hardware_report: Vec<u8>,
    /// The runtime data, exactly as hashed.
    pub runtime_data: Vec<u8>,
}

/// Why Azure evidence is refused.
#[derive(Debug, thiserror::Error)]
pub enum AzureError {
    #[error("the HCL report is malformed: {0}")]
    Hcl(String),
    #[error("the runtime data is not the JSON the HCL writes: {0}")]
    RuntimeData(String),
    #[error(
        "the hardware report's REPORT_DATA is {report}, not SHA-256 of the runtime data ({expected}) and 32 zero bytes"
    )]
    Binding { expected: String, report: String },
    #[error("the HCL report carries a {found:?} report; the evidence is for {expected:?}")]
    Kind {
        expected: HardwareReport,
        found: HardwareReport,
    },
    #[error(transparent)]
    Snp(#[from] crate::snp::SnpError),
    #[error(transparent)]
    Tdx(#[from] crate::tdx::TdxError),
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("no certificate among the intermediates and roots issued {0}")]
    NoIssuer(String),
    #[error("the AK certificate's key is not the HCL's attestation key HCLAkPub")]
    AkCertificate,
    #[error("the TPM quote by HCLAkPub: {0}")]
    Quote(#[from] QuoteError),
}

impl HclReport {
    /// Parses an HCL report as read from NV [`HCL_REPORT_NV_INDEX`].
    pub fn parse(bytes: &[u8]) -> Result<Self, AzureError> {
        let bad = |what: String| AzureError::Hcl(what);
        if bytes.len() < RUNTIME_DATA_AT {
            return Err(bad(format!(
                "{} bytes, shorter than its fixed part ({RUNTIME_DATA_AT})",
                bytes.len()
            )));
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        if u32_at(0) != HCL_SIGNATURE {
            return Err(bad(format!(
                "its signature is {:#010x}, not \"HCLA\"",
                u32_at(0)
            )));
        }
        let kind = match u32_at(IGVM_REQUEST_AT + 8) {
            2 => HardwareReport::SevSnp,
            4 => HardwareReport::Tdx,
            other => {
                return Err(bad(format!(
                    "report type {other} (2 SNP and 4 TDX are known)"
                )));
            }
        };
        let hash_type = u32_at(IGVM_REQUEST_AT + 12);
        if hash_type != 1 {
            return Err(bad(format!(
                "runtime data hash type {hash_type}, not 1 (SHA-256)"
            )));
        }
        let size = u32_at(IGVM_REQUEST_AT + 16) as usize;
        let runtime_data = bytes
            .get(RUNTIME_DATA_AT..RUNTIME_DATA_AT + size)
            .ok_or_else(|| bad(format!("runtime data of {size} bytes runs past its end")))?
            .to_vec();
        Ok(Self {
            kind,
            hardware_report: bytes[HEADER_LEN..IGVM_REQUEST_AT].to_vec(),
            runtime_data,
        })
    }

    /// The hardware report's REPORT_DATA.
    fn report_data(&self) -> &[u8] {
        match self.kind {
            HardwareReport::SevSnp => &self.hardware_report[0x50..0x90],
            HardwareReport::Tdx => {
                &self.hardware_report[TDREPORT_REPORT_DATA_AT..TDREPORT_REPORT_DATA_AT + 64]
            }
        }
    }

    /// Refused unless REPORT_DATA is SHA-256(runtime data) and 32 zero bytes.
    pub fn check_binding(&self) -> Result<(), AzureError> {
        let mut expected = Sha256::digest(&self.runtime_data).to_vec();
        expected.extend_from_slice(&[0; 32]);
        if self.report_data() != expected {
            return Err(AzureError::Binding {
                expected: hex::encode(&expected[..32]),
                report: hex::encode(self.report_data()),
            });
        }
        Ok(())
    }

    /// The attestation key in the runtime data (`keys[kid = "HCLAkPub"]`, an RSA JWK).
    pub fn ak_public(&self) -> Result<(Vec<u8>, Vec<u8>), AzureError> {
        let bad = |what: &str| AzureError::RuntimeData(what.into());
        let json: serde_json::Value =
            serde_json::from_slice(&self.runtime_data).map_err(|e| bad(&e.to_string()))?;
        let key = json["keys"]
            .as_array()
            .ok_or_else(|| bad("no \"keys\" array"))?
            .iter()
            .find(|k| k["kid"] == "HCLAkPub")
            .ok_or_else(|| bad("no key with kid HCLAkPub"))?;
        if key["kty"] != "RSA" {
            return Err(bad("HCLAkPub is not an RSA key"));
        }
        let field = |name: &str| -> Result<Vec<u8>, AzureError> {
            use base64::Engine as _;
            let text = key[name]
                .as_str()
                .ok_or_else(|| bad(&format!("HCLAkPub has no \"{name}\"")))?;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(text.trim_end_matches('='))
                .map_err(|_| bad(&format!("HCLAkPub's \"{name}\" is not base64url")))
        };
        Ok((field("n")?, field("e")?))
    }
}

/// The CPU side of Azure evidence.
pub enum AzureHardware<'a> {
    /// The HCL report's SNP report, endorsed by this VCEK chain.
    SevSnp {
        endorsement: crate::snp::SnpEndorsement<'a>,
        policy: &'a crate::snp::SnpPolicy,
    },
    /// The TD quote of the HCL report's TDREPORT, with Intel's collateral.
    Tdx {
        quote: &'a [u8],
        collateral: &'a dcap_qvl::QuoteCollateralV3,
        policy: &'a crate::tdx::TdxPolicy,
    },
}

/// What an Azure confidential VM presents.
pub struct AzureEvidence<'a> {
    pub hcl_report: &'a [u8],
    pub hardware: AzureHardware<'a>,
    pub quote: VtpmQuote<'a>,
    /// The AK certificate and its intermediates, where the VM sent them.
    pub ak_certificate: Option<(&'a [u8], &'a [&'a [u8]])>,
}

/// An HCL report whose hardware report verified and whose REPORT_DATA binds its runtime data:
/// the vTPM's attestation key, as the CPU vouches for it.
#[derive(Debug, Clone)]
pub struct VerifiedHcl {
    pub kind: HardwareReport,
    /// `HCLAkPub`'s RSA modulus (big-endian) and public exponent.
    pub ak_modulus: Vec<u8>,
    pub ak_exponent: u32,
    /// The runtime data's `vm-configuration` (secure boot, TPM, console…), as the HCL wrote it.
    pub vm_configuration: serde_json::Value,
    /// The SEV-SNP report, verified to AMD's root, where the CPU is AMD's.
    pub snp: Option<crate::snp::VerifiedSnpReport>,
}

/// Evidence that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedAzure {
    pub hcl: VerifiedHcl,
    /// The quoted SHA-256 PCR values.
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    /// Whether an AK certificate was verified to Azure's root too.
    pub ak_certificate_verified: bool,
}

/// Verifies the HCL report: its hardware report to the CPU vendor's root at `at` (by
/// `hardware`'s policy), and that REPORT_DATA binds the runtime data; returns the attestation
/// key the runtime data names. Steps 1 and 2 of [`verify`].
pub fn verify_hcl(
    hcl_report: &[u8],
    hardware: &AzureHardware<'_>,
    at: VerificationTime,
) -> Result<VerifiedHcl, AzureError> {
    let hcl = HclReport::parse(hcl_report)?;
    let expect = |kind: HardwareReport| {
        if hcl.kind == kind {
            Ok(())
        } else {
            Err(AzureError::Kind {
                expected: kind,
                found: hcl.kind,
            })
        }
    };
    // 1. The hardware report.
    let snp = match hardware {
        AzureHardware::SevSnp {
            endorsement,
            policy,
        } => {
            expect(HardwareReport::SevSnp)?;
            Some(crate::snp::verify(
                &hcl.hardware_report,
                endorsement,
                policy,
                at,
            )?)
        }
        AzureHardware::Tdx {
            quote,
            collateral,
            policy,
        } => {
            expect(HardwareReport::Tdx)?;
            // The quote must be of this TDREPORT: its REPORTDATA is the runtime data's hash.
            let mut policy = (*policy).clone();
            policy.report_data = Some(
                hcl.report_data()
                    .try_into()
                    .map_err(|_| AzureError::Hcl("REPORTDATA is not 64 bytes".into()))?,
            );
            crate::tdx::verify(quote, collateral, &policy, at)?;
            None
        }
    };
    // 2. REPORT_DATA binds the runtime data, and with it HCLAkPub.
    hcl.check_binding()?;
    let (ak_modulus, exponent) = hcl.ak_public()?;
    let ak_exponent = exponent
        .iter()
        .try_fold(0u32, |e, b| e.checked_mul(256).map(|e| e | u32::from(*b)))
        .ok_or_else(|| AzureError::RuntimeData("HCLAkPub's exponent is over 32 bits".into()))?;
    let runtime: serde_json::Value = serde_json::from_slice(&hcl.runtime_data)
        .map_err(|e| AzureError::RuntimeData(e.to_string()))?;
    Ok(VerifiedHcl {
        kind: hcl.kind,
        ak_modulus,
        ak_exponent,
        vm_configuration: runtime["vm-configuration"].clone(),
        snp,
    })
}

/// Verifies Azure evidence with the verifier's `nonce` at `at`; `roots` are candidates for the
/// AK certificate's root (accepted only by [`AZURE_VTPM_ROOTS`]).
pub fn verify(
    evidence: &AzureEvidence<'_>,
    roots: &[&[u8]],
    nonce: &[u8],
    at: VerificationTime,
) -> Result<VerifiedAzure, AzureError> {
    let hcl = verify_hcl(evidence.hcl_report, &evidence.hardware, at)?;
    // 3. HCLAkPub signed the TPM quote.
    verify_quote(&hcl.ak_modulus, hcl.ak_exponent, &evidence.quote, nonce)?;
    // 4. The AK certificate, if sent.
    let ak_certificate_verified = match evidence.ak_certificate {
        Some((leaf, intermediates)) => {
            verify_ak_certificate(leaf, intermediates, roots, &hcl.ak_modulus, at)?;
            true
        }
        None => false,
    };
    Ok(VerifiedAzure {
        hcl,
        pcrs: evidence.quote.pcrs.clone(),
        ak_certificate_verified,
    })
}

/// The AK certificate through its intermediates to a pinned Azure root, holding `modulus`.
fn verify_ak_certificate(
    leaf: &[u8],
    intermediates: &[&[u8]],
    roots: &[&[u8]],
    modulus: &[u8],
    at: VerificationTime,
) -> Result<(), AzureError> {
    let leaf = Cert::parse("the AK certificate", leaf)?;
    let mut pool = intermediates
        .iter()
        .map(|der| Cert::parse("an AK certificate intermediate", der))
        .collect::<Result<Vec<_>, _>>()?;
    pool.extend(
        roots
            .iter()
            .map(|der| Cert::parse("Azure's root", der))
            .collect::<Result<Vec<_>, _>>()?,
    );
    // Issuer by issuer, up to a self-signed certificate, at most five deep.
    let mut path = vec![&leaf];
    while path.len() < 6 {
        let last = path[path.len() - 1];
        if last.x509.issuer() == last.x509.subject() {
            break;
        }
        let issuer = pool
            .iter()
            .find(|c| c.x509.subject() == last.x509.issuer())
            .ok_or_else(|| AzureError::NoIssuer(format!("\"{}\"", last.x509.subject())))?;
        path.push(issuer);
    }
    verify_chain(&path, &AZURE_VTPM_ROOTS, at)?;
    match leaf.x509.public_key().parsed() {
        Ok(PublicKey::RSA(key)) if trim(key.modulus) == trim(modulus) => Ok(()),
        _ => Err(AzureError::AkCertificate),
    }
}
