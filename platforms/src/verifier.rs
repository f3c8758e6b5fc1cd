//! The platforms' verifiers behind hawser's validator, and the trust a cluster's measurements
//! file selects.
//!
//! [`ak_trust`] is what every verifier of hawser evidence builds its
//! [`AkTrust`](hawser_attestation::AkTrust) with: for the `qemu` profile the provider CA (PEM),
//! for `gce` a [`GceVerifier`] over Google's roots (or a bundle the admin configured), so the
//! join service, re-attestation, `hawser verify` and a node checking its join service all judge
//! the profile their measurements select, and refuse another profile's evidence by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use hawser_attestation::evidence::{Evidence, Variant};
use hawser_attestation::platform::{PlatformRefusal, PlatformVerified, PlatformVerifier};
use hawser_attestation::tpm_types::Attest;
use hawser_attestation::validator::{AkTrust, AkTrustError};
use sha2::{Digest as _, Sha256};

use crate::chain::VerificationTime;
use crate::gce::{GceEvidence, GcePolicy, VtpmQuote};
use crate::profile::Platform;

/// Why a profile's trust cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(transparent)]
    ProviderCa(#[from] AkTrustError),
    #[error("the {platform} trust bundle is not valid PEM: {detail}")]
    Pem { platform: Platform, detail: String },
    #[error(
        "the {platform} trust bundle holds no root certificate (a self-signed CA): give the platform's roots (for gce: Google's, from https://pki.goog/cloud_integrity/)"
    )]
    NoRoot { platform: Platform },
    #[error(
        "the {0} profile's evidence cannot be verified by a hawser node or join service yet (see docs/platforms.md)"
    )]
    NotWired(Platform),
    #[error(
        "the {platform} profile's verifier needs {what} besides a PEM bundle: build it with {constructor}"
    )]
    NeedsConfiguration {
        platform: Platform,
        what: &'static str,
        constructor: &'static str,
    },
}

/// The AK trust of `platform`: for `qemu` the provider CA certificates of `bundle_pem`; for
/// `gce` Google's chain, the roots and intermediates of `bundle_pem` (roots self-signed; a root
/// that is not one of Google's pinned ones is trusted because the bundle names it, and a
/// warning says so: a test chain); for `azure-snp` an
/// [`AzureVerifier`](crate::verifier_cloud::AzureVerifier) under Azure's paravisor policy,
/// `bundle_pem` the certificates beside the node's (AMD's ASK and ARK, Azure's AK
/// intermediates; every root is accepted only by its pinned fingerprint), the AK certificate
/// optional.
///
/// `azure-tdx` needs Intel's collateral, which no PEM bundle carries
/// ([`TrustError::NeedsConfiguration`]); bare `sev-snp` and `tdx` evidence has no PCRs for the
/// validator's releases to check (its measurements are its verifier's policy), so those stay
/// [`TrustError::NotWired`]: their verifiers are in [`crate::verifier_cloud`].
pub fn ak_trust(platform: Platform, bundle_pem: &str) -> Result<AkTrust, TrustError> {
    match platform {
        Platform::Qemu => Ok(AkTrust::from_pem(bundle_pem)?),
        Platform::Gce => Ok(AkTrust::platform(Arc::new(GceVerifier::from_bundle(
            bundle_pem,
            GcePolicy::default(),
        )?))),
        Platform::AzureSnp => Ok(AkTrust::platform(Arc::new(
            crate::verifier_cloud::AzureVerifier::snp(
                bundle_pem,
                crate::verifier_cloud::azure_snp_policy(),
            )
            .map_err(|e| TrustError::Pem {
                platform,
                detail: e.detail,
            })?,
        ))),
        Platform::AzureTdx => Err(TrustError::NeedsConfiguration {
            platform,
            what: "Intel's TDX collateral (the TD quote's TCB info, QE identity and CRLs)",
            constructor: "verifier_cloud::AzureVerifier::tdx",
        }),
        other @ (Platform::SevSnp | Platform::Tdx) => Err(TrustError::NotWired(other)),
    }
}

/// GCE's vTPM evidence through [`crate::gce::verify_pinned`], as the validator's platform hook.
#[derive(Debug, Clone)]
pub struct GceVerifier {
    roots: Vec<Vec<u8>>,
    intermediates: Vec<Vec<u8>>,
    pins: Vec<String>,
    policy: GcePolicy,
}

impl GceVerifier {
    /// From a PEM bundle of roots (self-signed) and intermediates, judged by `policy`.
    pub fn from_bundle(bundle_pem: &str, policy: GcePolicy) -> Result<Self, TrustError> {
        let mut roots = Vec::new();
        let mut intermediates = Vec::new();
        for pem in x509_parser::pem::Pem::iter_from_buffer(bundle_pem.as_bytes()) {
            let pem = pem.map_err(|e| TrustError::Pem {
                platform: Platform::Gce,
                detail: e.to_string(),
            })?;
            let cert = pem.parse_x509().map_err(|e| TrustError::Pem {
                platform: Platform::Gce,
                detail: e.to_string(),
            })?;
            if cert.subject() == cert.issuer() {
                roots.push(pem.contents.clone());
            } else {
                intermediates.push(pem.contents.clone());
            }
        }
        if roots.is_empty() {
            return Err(TrustError::NoRoot {
                platform: Platform::Gce,
            });
        }
        let mut pins: Vec<String> = crate::gce::GOOGLE_ROOTS
            .iter()
            .map(|pin| (*pin).to_owned())
            .collect();
        for root in &roots {
            let fingerprint = hex::encode(Sha256::digest(root));
            if !pins.contains(&fingerprint) {
                tracing::warn!(
                    %fingerprint,
                    "trusting a gce root that is not one of Google's because the trust bundle names it (a test chain)"
                );
                pins.push(fingerprint);
            }
        }
        Ok(Self {
            roots,
            intermediates,
            pins,
            policy,
        })
    }
}

impl PlatformVerifier for GceVerifier {
    fn variant(&self) -> Variant {
        Variant::GceVtpm
    }

    fn verify(
        &self,
        evidence: &Evidence,
        qualifying_data: &[u8; 32],
    ) -> Result<PlatformVerified, PlatformRefusal> {
        let refuse = |source: Box<dyn std::error::Error + Send + Sync>| PlatformRefusal {
            profile: Platform::Gce.name(),
            source,
        };
        let tpmt = tpmt_of(&evidence.ak_public).ok_or_else(|| {
            refuse("ak_public is not a TPM2B_PUBLIC (size and TPMT_PUBLIC)".into())
        })?;
        let (ak_certificate, sent) = evidence
            .ak_cert_chain
            .split_first()
            .ok_or_else(|| refuse("the evidence carries no AK certificate".into()))?;
        let intermediates: Vec<&[u8]> = sent
            .iter()
            .chain(&self.intermediates)
            .map(Vec::as_slice)
            .collect();
        let roots: Vec<&[u8]> = self.roots.iter().map(Vec::as_slice).collect();
        let pcrs: BTreeMap<u8, Vec<u8>> = evidence
            .pcrs_sha256
            .iter()
            .filter_map(|(pcr, value)| Some((u8::try_from(*pcr).ok()?, value.clone())))
            .collect();
        let gce = GceEvidence {
            ak_public: tpmt,
            ak_certificate,
            intermediates: &intermediates,
            quote: VtpmQuote {
                attest: &evidence.quote,
                signature: &evidence.signature,
                pcrs: &pcrs,
            },
        };
        let pins: Vec<&str> = self.pins.iter().map(String::as_str).collect();
        let verified = crate::gce::verify_pinned(
            &gce,
            &roots,
            &pins,
            qualifying_data,
            VerificationTime::now(),
        )
        .map_err(|e| refuse(Box::new(e)))?;
        crate::gce::judge(&verified, &self.policy).map_err(|e| refuse(Box::new(e)))?;
        let attest = Attest::parse(&evidence.quote)
            .map_err(|e| refuse(format!("the quote does not parse: {e}").into()))?;
        // The name disks and revocations are keyed on: the one the TPM signed, not only the
        // presented public area's (its attribute bits change the name, not the key).
        let ak = crate::tpm_rsa::RsaPublic::parse_tpmt(tpmt)
            .map_err(|e| refuse(format!("ak_public does not parse: {e}").into()))?;
        let ak_name =
            crate::tpm_rsa::signed_primary_name(&attest, &ak).map_err(|e| refuse(e.into()))?;
        let pcrs = verified
            .pcrs
            .iter()
            .filter_map(|(pcr, value)| Some((*pcr, <[u8; 32]>::try_from(value.as_slice()).ok()?)))
            .collect();
        let subject = match &verified.instance {
            Some(instance) => format!(
                "GCE instance {} ({}) in project {}, zone {}",
                instance.instance_name, instance.instance_id, instance.project_id, instance.zone
            ),
            None => "a GCE vTPM (no instance information)".to_owned(),
        };
        Ok(PlatformVerified {
            ak_name,
            ak_certificate_subject: subject,
            pcrs,
            clock_info: attest.clock_info,
            firmware_version: attest.firmware_version,
        })
    }
}

/// The `TPMT_PUBLIC` inside a `TPM2B_PUBLIC`, if the size prefix is right.
fn tpmt_of(tpm2b: &[u8]) -> Option<&[u8]> {
    let (size, rest) = tpm2b.split_first_chunk::<2>()?;
    (usize::from(u16::from_be_bytes(*size)) == rest.len()).then_some(rest)
}
