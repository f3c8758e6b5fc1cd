//! The Azure and bare SEV-SNP/TDX verifiers behind hawser's validator
//! ([`hawser_attestation::platform`]): what a join service plugs into its
//! [`AkTrust`](hawser_attestation::AkTrust) for the `azure-snp`, `azure-tdx`, `sev-snp` and
//! `tdx` profiles.
//!
//! - [`AzureVerifier`]: the HCL report in `platform_report` ([`crate::azure::verify`]): on SNP
//!   its report to AMD's root with the VCEK chain from `platform_aux` (and the verifier's
//!   certificates), on TDX the TD quote in `platform_aux` with Intel's collateral from the
//!   verifier's configuration; then the TPM quote by `HCLAkPub`, whose `extraData` is the
//!   binding, and the AK certificate where the node sent one. The presented AK public area must
//!   be `HCLAkPub` and the quote's signed `qualifiedSigner` must name it as a primary of the
//!   endorsement hierarchy (Azure's AK is one: both captures show it), so the AK's TPM name,
//!   the identity the join service binds disks to, is the TPM's and not the node's word.
//! - [`SnpVerifier`]: a bare SEV-SNP report in `platform_report`, endorsed by the certificate
//!   table in `platform_aux` (configfs-tsm's `auxblob`) or the verifier's certificates, judged
//!   by the configured [`SnpPolicy`], its `REPORT_DATA` the binding ([`bare_report_data`]).
//! - [`TdxVerifier`]: a bare TD quote in `platform_report`, with the configured collateral and
//!   [`TdxPolicy`], its `REPORTDATA` the binding.
//!
//! Every verifier judges at its [`VerificationTime`] (`at`), the host's clock at each
//! verification unless one is set (tests set the captures' times). Bare evidence has no PCRs:
//! its measurements are the policy's (the launch measurement, MRTD and RTMRs), so its
//! `PlatformVerified` carries none, and its identity (`ak_name`) is the chip's: SNP's
//! `CHIP_ID` (or, masked, the guest's `REPORT_ID`), TDX's PPID from the PCK certificate.

use std::collections::BTreeMap;

use dcap_qvl::QuoteCollateralV3;
use hawser_attestation::evidence::{Evidence, Variant};
use hawser_attestation::platform::{PlatformRefusal, PlatformVerified, PlatformVerifier};
use hawser_attestation::tpm_types::{Attest, ClockInfo};
use x509_parser::prelude::X509Certificate;

use crate::azure::{AzureEvidence, AzureHardware, HclReport};
use crate::chain::VerificationTime;
use crate::profile::Platform;
use crate::snp::{AttestationReport, SigningKey, SnpEndorsement, SnpPolicy};
use crate::tdx::TdxPolicy;
use crate::tpm_rsa::{RsaPublic, VtpmQuote};

/// The REPORT_DATA of bare SEV-SNP and TDX evidence: the binding's qualifying data followed by
/// 32 zero bytes.
pub fn bare_report_data(qualifying_data: &[u8; 32]) -> [u8; 64] {
    let mut report_data = [0; 64];
    report_data[..32].copy_from_slice(qualifying_data);
    report_data
}

/// The SEV-SNP policy of Azure's paravisor: VMPL 0, no debugging, no migration agent.
pub fn azure_snp_policy() -> SnpPolicy {
    SnpPolicy {
        vmpl: Some(0),
        ..SnpPolicy::default()
    }
}

type Source = Box<dyn std::error::Error + Send + Sync>;

fn refusal(platform: Platform, source: impl Into<Source>) -> PlatformRefusal {
    PlatformRefusal {
        profile: platform.name(),
        source: source.into(),
    }
}

/// Refused unless `evidence` is labelled `variant` (the validator checks it first; a verifier
/// called on its own checks it too).
fn check_variant(
    platform: Platform,
    variant: Variant,
    evidence: &Evidence,
) -> Result<(), PlatformRefusal> {
    if evidence.variant == variant as i32 {
        return Ok(());
    }
    let found = Variant::try_from(evidence.variant)
        .map_or("an unknown", hawser_attestation::platform::profile_name);
    Err(refusal(
        platform,
        format!("the evidence is {found} evidence, not {platform}"),
    ))
}

fn time(at: Option<VerificationTime>) -> VerificationTime {
    at.unwrap_or_else(VerificationTime::now)
}

/// A verifier's PEM bundle that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("the {platform} trust bundle is not valid PEM: {detail}")]
pub struct BundleError {
    pub platform: Platform,
    pub detail: String,
}

/// The DER certificates of a PEM bundle.
fn bundle_ders(platform: Platform, bundle_pem: &str) -> Result<Vec<Vec<u8>>, BundleError> {
    x509_parser::pem::Pem::iter_from_buffer(bundle_pem.as_bytes())
        .map(|pem| {
            let pem = pem.map_err(|e| BundleError {
                platform,
                detail: e.to_string(),
            })?;
            pem.parse_x509().map_err(|e| BundleError {
                platform,
                detail: e.to_string(),
            })?;
            Ok(pem.contents)
        })
        .collect()
}

fn parse(der: &[u8]) -> Option<X509Certificate<'_>> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, cert)| cert)
}

/// The certificates of an SEV-SNP certificate table (the GHCB extended report's, as
/// configfs-tsm's `auxblob` holds it): 24-byte entries (GUID, offset, length, little-endian)
/// up to an all-zero one, offsets from the table's start. Entries that are not X.509
/// certificates are left out (which certificate is which is found by content, not GUID).
pub fn snp_certificate_table(table: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut certificates = Vec::new();
    for (i, entry) in table.chunks(24).enumerate() {
        let entry: &[u8; 24] = entry
            .try_into()
            .map_err(|_| format!("the certificate table ends inside entry {i}"))?;
        if entry.iter().all(|b| *b == 0) {
            return Ok(certificates);
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]]) as usize
        };
        let (offset, length) = (u32_at(16), u32_at(20));
        let der = offset
            .checked_add(length)
            .and_then(|end| table.get(offset..end))
            .ok_or_else(|| {
                format!(
                    "certificate table entry {i} ({offset}+{length}) runs past its {} bytes",
                    table.len()
                )
            })?;
        if parse(der).is_some() {
            certificates.push(der.to_vec());
        }
    }
    Err("the certificate table has no terminating entry".into())
}

/// AMD's `hwID` and `cspId` extensions of VCEK and VLEK certificates.
const AMD_HW_ID: &str = "1.3.6.1.4.1.3704.1.4";
const AMD_CSP_ID: &str = "1.3.6.1.4.1.3704.1.5";

/// The endorsement of `report` among `pool`: the VCEK whose `hwID` is the report's chip (or a
/// VLEK, for a VLEK-signed report), the certificate that issued it, and the one above that.
fn snp_endorsement<'a>(
    report: &AttestationReport,
    pool: &'a [Vec<u8>],
) -> Result<SnpEndorsement<'a>, String> {
    let parsed: Vec<(&'a [u8], X509Certificate<'a>)> = pool
        .iter()
        .filter_map(|der| Some((der.as_slice(), parse(der)?)))
        .collect();
    let extension = |cert: &X509Certificate<'_>, oid: &str| {
        cert.extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == oid)
            .map(|e| e.value.to_vec())
    };
    let (key, which) = match report.signing_key {
        SigningKey::Vlek => (
            parsed
                .iter()
                .find(|(_, c)| extension(c, AMD_CSP_ID).is_some()),
            "VLEK".to_owned(),
        ),
        _ => (
            parsed
                .iter()
                .find(|(_, c)| extension(c, AMD_HW_ID).is_some_and(|id| id == report.chip_id)),
            format!("VCEK for chip {}", hex::encode(report.chip_id)),
        ),
    };
    let (key, key_cert) = key.ok_or_else(|| {
        format!(
            "no {which} among the {} certificates sent and configured",
            pool.len()
        )
    })?;
    let issuer_of = |cert: &X509Certificate<'_>| {
        parsed
            .iter()
            .find(|(_, c)| c.subject() == cert.issuer())
            .ok_or_else(|| format!("no certificate issued \"{}\"", cert.subject()))
    };
    let (intermediate, intermediate_cert) = issuer_of(key_cert)?;
    let (root, _) = issuer_of(intermediate_cert)?;
    Ok(SnpEndorsement {
        key,
        intermediate,
        root,
    })
}

/// The collateral of the platform that made `quote` (by the FMSPC of its PCK certificate), and
/// that platform's PPID.
fn collateral_for<'a>(
    quote: &[u8],
    collateral: &'a [QuoteCollateralV3],
) -> Result<(&'a QuoteCollateralV3, Vec<u8>), String> {
    let parsed = dcap_qvl::quote::Quote::parse(quote)
        .map_err(|e| format!("the TD quote does not parse: {e:#}"))?;
    let chain = dcap_qvl::intel::extract_cert_chain(&parsed)
        .map_err(|e| format!("the TD quote carries no PCK certificate: {e:#}"))?;
    let pck = chain
        .first()
        .ok_or("the TD quote carries no PCK certificate")?;
    let extension = dcap_qvl::intel::parse_pck_extension(pck)
        .map_err(|e| format!("the PCK certificate's SGX extension: {e:#}"))?;
    let fmspc = hex::encode_upper(extension.fmspc);
    let fmspc_of = |c: &QuoteCollateralV3| {
        serde_json::from_str::<serde_json::Value>(&c.tcb_info)
            .ok()
            .and_then(|info| info["fmspc"].as_str().map(str::to_uppercase))
    };
    let found = collateral
        .iter()
        .find(|c| fmspc_of(c).as_deref() == Some(fmspc.as_str()))
        .ok_or_else(|| {
            let configured: Vec<String> = collateral
                .iter()
                .map(|c| fmspc_of(c).unwrap_or_else(|| "?".into()))
                .collect();
            format!(
                "no collateral for the quote's platform (FMSPC {fmspc}; configured: {}): fetch it from Intel's PCS",
                if configured.is_empty() {
                    "none".to_owned()
                } else {
                    configured.join(", ")
                }
            )
        })?;
    Ok((found, extension.ppid))
}

fn no_tpm_clock() -> ClockInfo {
    ClockInfo {
        clock: 0,
        reset_count: 0,
        restart_count: 0,
        safe: false,
    }
}

/// The CPU side an [`AzureVerifier`] trusts.
#[derive(Debug, Clone)]
enum AzureCpu {
    Snp {
        policy: SnpPolicy,
    },
    Tdx {
        policy: Box<TdxPolicy>,
        collateral: Vec<QuoteCollateralV3>,
    },
}

/// Azure confidential VMs' evidence (see the module docs).
#[derive(Debug, Clone)]
pub struct AzureVerifier {
    cpu: AzureCpu,
    /// The configured certificates: AMD's (SNP: ASK, ARK, a VCEK) and Azure's (the AK
    /// certificate's intermediates and roots); each is accepted only by the pinned roots.
    certificates: Vec<Vec<u8>>,
    require_ak_certificate: bool,
    at: Option<VerificationTime>,
}

impl AzureVerifier {
    /// `azure-snp`: the SNP report judged by `policy` ([`azure_snp_policy`] unless the cluster
    /// pins more); `bundle_pem`: certificates beside the node's (AMD's ASK and ARK if IMDS's
    /// chain is not trusted to carry them, Azure's AK intermediates); may be empty.
    pub fn snp(bundle_pem: &str, policy: SnpPolicy) -> Result<Self, BundleError> {
        Ok(Self {
            cpu: AzureCpu::Snp { policy },
            certificates: bundle_ders(Platform::AzureSnp, bundle_pem)?,
            require_ak_certificate: false,
            at: None,
        })
    }

    /// `azure-tdx`: the TD quote verified with `collateral` (one per platform FMSPC, refreshed
    /// from Intel's PCS about monthly) and judged by `policy`; `bundle_pem` as for
    /// [`Self::snp`].
    pub fn tdx(
        bundle_pem: &str,
        collateral: Vec<QuoteCollateralV3>,
        policy: TdxPolicy,
    ) -> Result<Self, BundleError> {
        Ok(Self {
            cpu: AzureCpu::Tdx {
                policy: Box::new(policy),
                collateral,
            },
            certificates: bundle_ders(Platform::AzureTdx, bundle_pem)?,
            require_ak_certificate: false,
            at: None,
        })
    }

    /// Refuses evidence without an AK certificate (by default the HCL report's word on the AK
    /// suffices: the CPU signed it).
    pub fn requiring_ak_certificate(mut self) -> Self {
        self.require_ak_certificate = true;
        self
    }

    /// Judges at `at` instead of the host's clock at each verification.
    pub fn at(mut self, at: VerificationTime) -> Self {
        self.at = Some(at);
        self
    }

    fn platform(&self) -> Platform {
        match self.cpu {
            AzureCpu::Snp { .. } => Platform::AzureSnp,
            AzureCpu::Tdx { .. } => Platform::AzureTdx,
        }
    }

    /// [`PlatformVerifier::verify`] with the quote's expected `extraData` given raw: hawser's
    /// binding through the trait; another protocol's (a captured vector's) here.
    pub fn verify_bound(
        &self,
        evidence: &Evidence,
        extra_data: &[u8],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        let platform = self.platform();
        let refuse = |source: Source| refusal(platform, source);
        check_variant(platform, self.variant(), evidence)?;
        let pcrs: BTreeMap<u8, Vec<u8>> = evidence
            .pcrs_sha256
            .iter()
            .filter_map(|(pcr, value)| Some((u8::try_from(*pcr).ok()?, value.clone())))
            .collect();
        // The SNP endorsement's pool: what the node sent (IMDS's PEM), then the configured.
        let mut pool: Vec<Vec<u8>> = match self.cpu {
            AzureCpu::Snp { .. } => {
                let text = String::from_utf8_lossy(&evidence.platform_aux);
                x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
                    .filter_map(|pem| Some(pem.ok()?.contents))
                    .collect()
            }
            AzureCpu::Tdx { .. } => Vec::new(),
        };
        pool.extend(self.certificates.iter().cloned());
        let hardware = match &self.cpu {
            AzureCpu::Snp { policy } => {
                let hcl =
                    HclReport::parse(&evidence.platform_report).map_err(|e| refuse(Box::new(e)))?;
                let report = AttestationReport::from_bytes(&hcl.hardware_report)
                    .map_err(|e| refuse(Box::new(e)))?;
                AzureHardware::SevSnp {
                    endorsement: snp_endorsement(&report, &pool).map_err(|e| refuse(e.into()))?,
                    policy,
                }
            }
            AzureCpu::Tdx { policy, collateral } => AzureHardware::Tdx {
                quote: &evidence.platform_aux,
                collateral: collateral_for(&evidence.platform_aux, collateral)
                    .map_err(|e| refuse(e.into()))?
                    .0,
                policy,
            },
        };
        let intermediates: Vec<&[u8]> = evidence
            .ak_cert_chain
            .iter()
            .skip(1)
            .chain(&self.certificates)
            .map(Vec::as_slice)
            .collect();
        let ak_certificate = evidence
            .ak_cert_chain
            .first()
            .map(|leaf| (leaf.as_slice(), intermediates.as_slice()));
        if ak_certificate.is_none() && self.require_ak_certificate {
            return Err(refuse(
                "the evidence carries no AK certificate (NV 0x01c101d0), which this verifier requires".into(),
            ));
        }
        let roots: Vec<&[u8]> = self.certificates.iter().map(Vec::as_slice).collect();
        let azure = AzureEvidence {
            hcl_report: &evidence.platform_report,
            hardware,
            quote: VtpmQuote {
                attest: &evidence.quote,
                signature: &evidence.signature,
                pcrs: &pcrs,
            },
            ak_certificate,
        };
        let verified = crate::azure::verify(&azure, &roots, extra_data, time(self.at))
            .map_err(|e| refuse(Box::new(e)))?;
        // The presented AK is HCLAkPub, and the TPM named it as the quote's signer.
        let ak = evidence
            .ak_public
            .split_first_chunk::<2>()
            .filter(|(size, rest)| usize::from(u16::from_be_bytes(**size)) == rest.len())
            .and_then(|(_, tpmt)| RsaPublic::parse_tpmt(tpmt).ok())
            .ok_or_else(|| refuse("ak_public is not an RSA key's TPM2B_PUBLIC".into()))?;
        use hawser_attestation::tpm_types::object_attributes::{RESTRICTED, SIGN_ENCRYPT};
        if trim(&ak.modulus) != trim(&verified.hcl.ak_modulus)
            || ak.exponent != verified.hcl.ak_exponent
        {
            return Err(refuse(
                "ak_public is not the HCL report's attestation key HCLAkPub".into(),
            ));
        }
        if ak.object_attributes & (RESTRICTED | SIGN_ENCRYPT) != RESTRICTED | SIGN_ENCRYPT {
            return Err(refuse("ak_public is not a restricted signing key".into()));
        }
        let attest = Attest::parse(&evidence.quote)
            .map_err(|e| refuse(format!("the quote does not parse: {e}").into()))?;
        let ak_name =
            crate::tpm_rsa::signed_primary_name(&attest, &ak).map_err(|e| refuse(e.into()))?;
        let vm = verified.hcl.vm_configuration["vmUniqueId"]
            .as_str()
            .unwrap_or("?");
        let subject = format!(
            "Azure {platform} VM {vm}, AK {}",
            if verified.ak_certificate_verified {
                "certified by Azure's vTPM root and vouched for by the CPU's report"
            } else {
                "vouched for by the CPU's report"
            }
        );
        Ok(PlatformVerified {
            ak_name,
            ak_certificate_subject: subject,
            pcrs: pcrs32(&verified.pcrs),
            clock_info: attest.clock_info,
            firmware_version: attest.firmware_version,
        })
    }
}

impl PlatformVerifier for AzureVerifier {
    fn variant(&self) -> Variant {
        match self.cpu {
            AzureCpu::Snp { .. } => Variant::AzureSevSnp,
            AzureCpu::Tdx { .. } => Variant::AzureTdx,
        }
    }

    fn verify(
        &self,
        evidence: &Evidence,
        qualifying_data: &[u8; 32],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        self.verify_bound(evidence, qualifying_data)
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

fn pcrs32(pcrs: &BTreeMap<u8, Vec<u8>>) -> BTreeMap<u8, [u8; 32]> {
    pcrs.iter()
        .filter_map(|(pcr, value)| Some((*pcr, <[u8; 32]>::try_from(value.as_slice()).ok()?)))
        .collect()
}

/// Bare SEV-SNP guests' evidence (see the module docs).
#[derive(Debug, Clone)]
pub struct SnpVerifier {
    /// Configured certificates: AMD's ASK/ASVK and ARK, VCEKs of hosts that do not supply the
    /// extended report.
    certificates: Vec<Vec<u8>>,
    policy: SnpPolicy,
    at: Option<VerificationTime>,
}

impl SnpVerifier {
    /// Judged by `policy` (its `report_data` is replaced by each evidence's binding); the
    /// certificates of `bundle_pem` join those the node sends. The launch measurement is the
    /// whole trust in the guest's software: a cluster pins it in `policy.measurement`.
    pub fn new(bundle_pem: &str, policy: SnpPolicy) -> Result<Self, BundleError> {
        Ok(Self {
            certificates: bundle_ders(Platform::SevSnp, bundle_pem)?,
            policy,
            at: None,
        })
    }

    /// Judges at `at` instead of the host's clock at each verification.
    pub fn at(mut self, at: VerificationTime) -> Self {
        self.at = Some(at);
        self
    }

    /// [`PlatformVerifier::verify`] with the expected REPORT_DATA given raw (all 64 bytes):
    /// [`bare_report_data`] of hawser's binding through the trait; another protocol's here.
    pub fn verify_bound(
        &self,
        evidence: &Evidence,
        report_data: &[u8; 64],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        let platform = Platform::SevSnp;
        let refuse = |source: Source| refusal(platform, source);
        check_variant(platform, Variant::SevSnp, evidence)?;
        let report = AttestationReport::from_bytes(&evidence.platform_report)
            .map_err(|e| refuse(Box::new(e)))?;
        let mut pool = if evidence.platform_aux.is_empty() {
            Vec::new()
        } else {
            snp_certificate_table(&evidence.platform_aux).map_err(|e| refuse(e.into()))?
        };
        pool.extend(self.certificates.iter().cloned());
        let endorsement = snp_endorsement(&report, &pool).map_err(|e| refuse(e.into()))?;
        let policy = SnpPolicy {
            report_data: Some(*report_data),
            ..self.policy.clone()
        };
        let verified = crate::snp::verify(
            &evidence.platform_report,
            &endorsement,
            &policy,
            time(self.at),
        )
        .map_err(|e| refuse(Box::new(e)))?;
        let report = &verified.report;
        let masked = report.chip_id.iter().all(|b| *b == 0);
        let (ak_name, identity) = if masked {
            (
                report.report_id.to_vec(),
                "guest (chip ID masked), report ID",
            )
        } else {
            (report.chip_id.to_vec(), "chip")
        };
        let key = match &verified.csp_id {
            Some(csp) => format!("VLEK of {csp}"),
            None => "VCEK".to_owned(),
        };
        Ok(PlatformVerified {
            ak_certificate_subject: format!(
                "SEV-SNP {:?} {identity} {} ({key}), launch measurement {}",
                verified.product,
                hex::encode(&ak_name[..8]),
                hex::encode(report.measurement)
            ),
            ak_name,
            pcrs: BTreeMap::new(),
            clock_info: no_tpm_clock(),
            firmware_version: 0,
        })
    }
}

impl PlatformVerifier for SnpVerifier {
    fn variant(&self) -> Variant {
        Variant::SevSnp
    }

    fn verify(
        &self,
        evidence: &Evidence,
        qualifying_data: &[u8; 32],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        self.verify_bound(evidence, &bare_report_data(qualifying_data))
    }
}

/// Bare TDX guests' evidence (see the module docs).
#[derive(Debug, Clone)]
pub struct TdxVerifier {
    collateral: Vec<QuoteCollateralV3>,
    policy: TdxPolicy,
    at: Option<VerificationTime>,
}

impl TdxVerifier {
    /// Quotes verified with `collateral` (one per platform FMSPC, from Intel's PCS or a PCCS,
    /// valid about a month) and judged by `policy` (its `report_data` is replaced by each
    /// evidence's binding; MRTD and the RTMRs are the guest's measurements: pin them).
    pub fn new(collateral: Vec<QuoteCollateralV3>, policy: TdxPolicy) -> Self {
        Self {
            collateral,
            policy,
            at: None,
        }
    }

    /// Judges at `at` instead of the host's clock at each verification.
    pub fn at(mut self, at: VerificationTime) -> Self {
        self.at = Some(at);
        self
    }

    /// [`PlatformVerifier::verify`] with the expected REPORTDATA given raw (all 64 bytes):
    /// [`bare_report_data`] of hawser's binding through the trait; another protocol's here.
    pub fn verify_bound(
        &self,
        evidence: &Evidence,
        report_data: &[u8; 64],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        let platform = Platform::Tdx;
        let refuse = |source: Source| refusal(platform, source);
        check_variant(platform, Variant::Tdx, evidence)?;
        let (collateral, ppid) = collateral_for(&evidence.platform_report, &self.collateral)
            .map_err(|e| refuse(e.into()))?;
        let policy = TdxPolicy {
            report_data: Some(*report_data),
            ..self.policy.clone()
        };
        let verified = crate::tdx::verify(
            &evidence.platform_report,
            collateral,
            &policy,
            time(self.at),
        )
        .map_err(|e| refuse(Box::new(e)))?;
        Ok(PlatformVerified {
            ak_certificate_subject: format!(
                "TDX platform {} (TCB {}), MRTD {}",
                hex::encode(&ppid),
                verified.status,
                hex::encode(verified.report.mr_td)
            ),
            ak_name: ppid,
            pcrs: BTreeMap::new(),
            clock_info: no_tpm_clock(),
            firmware_version: 0,
        })
    }
}

impl PlatformVerifier for TdxVerifier {
    fn variant(&self) -> Variant {
        Variant::Tdx
    }

    fn verify(
        &self,
        evidence: &Evidence,
        qualifying_data: &[u8; 32],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        self.verify_bound(evidence, &bare_report_data(qualifying_data))
    }
}
