//! hawser-attestation: TPM evidence for a hawser node, issued in the guest and verified anywhere,
//! and attested TLS (aTLS) that carries it.
//!
//! A peer proves which image it booted, bound to the exact TLS connection it talks on, and a
//! verifier accepts it only if the measurements and the attestation key (AK) are trusted. The
//! pieces, in the order evidence flows through them:
//!
//! - **Issuer** (feature `tpm`: [`tpm`], [`issuer`]): the PID 1's side (and `hawser-joind`'s
//!   when it attests itself, `--attest-with-tpm`), speaking TPM 2.0 commands itself (no libtss2). It
//!   extends boot phases like systemd-pcrphase, reads the sha256 bank, creates the AK from a
//!   fixed template ([`tpm_types::AK_TEMPLATE`]), reads the AK certificate the provider stored
//!   in NV ([`tpm_types::AK_CERT_NV_INDEX`]) and quotes with qualifying data that binds a peer's
//!   nonce and the TLS key ([`evidence`]).
//! - **Evidence** ([`evidence`]): the protobuf `hawser.evidence.v1.Evidence`, small enough for
//!   a certificate extension.
//! - **Validator** (always built, pure Rust, no libtss2): [`tpm_types`] parses the marshalled
//!   TPM structures with bounds-checked readers that report offsets; [`validator`] checks a
//!   quote's signature, its binding, the AK's certificate chain to a provider CA, and the PCR
//!   values against [`measurements::ExpectedMeasurements`]. The CLI uses only this half; the
//!   join service also issues when it attests itself.
//! - **aTLS** (feature `atls`, [`atls`]; feature `tonic` adds the tonic transport): TLS 1.3 on
//!   rustls with the evidence in the certificate, nonces in the handshake, and a verdict after
//!   it, in client-attests, server-attests or mutual mode.
//! - **Boot report** ([`report`]): what the PID 1 prints on the console after measuring the
//!   boot, checked with the same quote verifier.
//!
//! The verifier trusts nothing in the evidence it is handed: not the AK (it must chain to a
//! configured provider CA and match the quote), not the PCR values (they must hash to the
//! quoted digest and equal the expected ones), not the freshness (the verifier's own nonce).

#[cfg(feature = "atls")]
pub mod atls;
pub mod evidence;
#[cfg(feature = "tpm")]
pub mod issuer;
pub mod measurements;
pub mod platform;
pub mod releases;
pub mod report;
#[cfg(test)]
mod test_fixtures;
#[cfg(feature = "tpm")]
pub mod tpm;
pub mod tpm_types;
pub mod validator;

pub use evidence::{Binding, Evidence, EvidenceIssuer, IssueError, Nonce, Role, Variant};
#[cfg(feature = "tpm")]
pub use issuer::{IssuerError, TpmIssuer};
pub use measurements::{ExpectedMeasurements, ExpectedPcr, MeasurementsError};
pub use platform::{PlatformRefusal, PlatformVerified, PlatformVerifier};
pub use report::{
    BOOT_REPORT_MARKER, BootReport, PhaseTiming, QuoteEvidence, REPORT_VERSION, VerifiedQuote,
    VerifiedReport, VerifyError,
};
#[cfg(feature = "tpm")]
pub use tpm::{AttestationKey, Tpm, TpmError};
pub use validator::{AkTrust, EvidenceError, ValidatedEvidence, Validator};

/// An error and its causes, outermost first, joined by `": "`: each error's message describes
/// its own layer only, so this is how a refusal is told to a peer or written to a log line.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
