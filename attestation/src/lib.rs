//! hawser-attestation: TPM evidence for a hawser node, issued in the guest and verified anywhere.
//!
//! Two halves with one data format between them:
//!
//! - **Verifier** (always built, pure Rust, no libtss2): [`tpm_types`] parses the marshalled TPM
//!   structures a quote consists of (`TPM2B_PUBLIC`, `TPMS_ATTEST`, `TPMT_SIGNATURE`) with
//!   bounds-checked readers, and [`report`] checks a [`BootReport`] or a bare [`QuoteEvidence`]:
//!   ECDSA P-256 signature by a restricted endorsement-hierarchy AK, nonce, PCR digest, and the
//!   PCR 11 boot-phase replay. Host tools and the join service depend on this half only.
//! - **Issuer** (feature `tpm`, module `tpm`): the PID 1's side, over tss-esapi and the
//!   system's libtss2. It extends boot phases like systemd-pcrphase, reads the sha256 bank,
//!   creates the attestation key from a fixed template and quotes.
//!
//! The verifier trusts nothing in the evidence it is handed; deciding whether the AK itself is
//! trusted (a provider certificate, a pinned name) is left to the caller, who gets the AK's
//! name and fingerprint back.

pub mod report;
#[cfg(test)]
mod test_fixtures;
#[cfg(feature = "tpm")]
pub mod tpm;
pub mod tpm_types;

pub use report::{
    BOOT_REPORT_MARKER, BootReport, PhaseTiming, QuoteEvidence, REPORT_VERSION, VerifiedQuote,
    VerifiedReport, VerifyError,
};
#[cfg(feature = "tpm")]
pub use tpm::{AttestationKey, Tpm, TpmError};
