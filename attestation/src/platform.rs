//! The validator's hook for a platform's own evidence.
//!
//! On QEMU the AK is trusted because hawser's provider CA certified it ([`crate::AkTrust`]'s
//! anchors, checked by the [`Validator`](crate::Validator) itself). On a cloud the platform's
//! vendor chain does that job (Google's CA for a GCE vTPM; AMD's or Intel's report vouching
//! for the AK on an Azure confidential VM), and hawser-platforms holds those verifiers. A
//! [`PlatformVerifier`] plugs one into the same [`Validator`](crate::Validator): the evidence
//! format, the binding of the nonce and the TLS key (the qualifying data), the PCR parsing and
//! the release check stay the validator's, so every caller (the join service, re-attestation,
//! `hawser verify`, a node checking its join service) gets the platform's check by building its
//! [`AkTrust`](crate::AkTrust) with [`AkTrust::platform`](crate::AkTrust::platform).
//!
//! Evidence of another platform than the trust's is refused first, naming both profiles
//! (`the cluster's measurements select the gce profile; the peer presented qemu evidence`):
//! a node cannot pick a weaker profile than its cluster's.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::evidence::{Evidence, Variant};
use crate::tpm_types::ClockInfo;

/// hawser's profile name of an evidence variant (the names of hawser-platforms' profiles).
pub fn profile_name(variant: Variant) -> &'static str {
    match variant {
        Variant::Unspecified => "unspecified",
        Variant::QemuVtpm => "qemu",
        Variant::GceVtpm => "gce",
        Variant::AzureSevSnp => "azure-snp",
        Variant::AzureTdx => "azure-tdx",
        Variant::SevSnp => "sev-snp",
        Variant::Tdx => "tdx",
    }
}

/// What a platform's verifier established: everything but the measurements, which the
/// validator checks against its releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformVerified {
    /// A stable identity of the attesting TPM (or CPU): the AK's TPM name where there is an AK.
    pub ak_name: Vec<u8>,
    /// Who vouched for the AK, for logs (the AK certificate's subject and the instance it
    /// names, or the hardware report's chip).
    pub ak_certificate_subject: String,
    /// The quoted sha256 PCR values the platform verified against the quote's digest (empty on
    /// bare SEV-SNP and TDX, which have no TPM).
    pub pcrs: BTreeMap<u8, [u8; 32]>,
    /// The TPM's clock info when it signed (zeroes without a TPM).
    pub clock_info: ClockInfo,
    /// The TPM's firmware version (0 without a TPM).
    pub firmware_version: u64,
}

/// A platform's refusal of evidence of its own variant.
#[derive(Debug, Error)]
#[error("the {profile} platform's check refused the evidence")]
pub struct PlatformRefusal {
    /// The profile that refused.
    pub profile: &'static str,
    /// Why.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// A platform's evidence check (see the module docs). Implemented in hawser-platforms.
pub trait PlatformVerifier: Send + Sync + std::fmt::Debug {
    /// The variant this platform's evidence carries.
    fn variant(&self) -> Variant;

    /// Verifies `evidence` of [`Self::variant`]: the platform's chain to its pinned roots, the
    /// AK, the quote's (or the report's) signature over `qualifying_data` and the PCR values'
    /// digest. Never the measurements: the validator checks those.
    fn verify(
        &self,
        evidence: &Evidence,
        qualifying_data: &[u8; 32],
    ) -> Result<PlatformVerified, PlatformRefusal>;
}
