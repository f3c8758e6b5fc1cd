//! [`VerifyError`]: why a boot report or a quote was refused, one variant per check of
//! [`super::BootReport::verify`] and the quote verifier, each naming the field and the values.

use thiserror::Error;

use crate::tpm_types::ParseError;

/// Why a report or a quote was refused. Every variant names the field and the values involved.
#[derive(Debug, Error)]
pub enum VerifyError {
    /// The report's format version is not the one this verifier understands.
    #[error("report_version is {found}, this verifier understands version {supported}")]
    UnsupportedReportVersion { found: u32, supported: u32 },
    /// A hex field does not decode.
    #[error("field {field} is not valid hex")]
    Hex {
        field: String,
        #[source]
        source: hex::FromHexError,
    },
    /// A PCR value has the wrong length.
    #[error("field {field} holds {actual} bytes, expected {expected}")]
    Length {
        field: String,
        expected: usize,
        actual: usize,
    },
    /// A TPM structure is malformed.
    #[error("field {field} does not parse")]
    Parse {
        field: &'static str,
        #[source]
        source: ParseError,
    },
    /// The AK is not an ECC P-256 key with a valid point.
    #[error("the AK is not a usable NIST P-256 key: {reason}")]
    AkKey { reason: String },
    /// The AK's nameAlg is not SHA-256.
    #[error("the AK's nameAlg is {actual:#06x}, expected SHA-256 (0x000b)")]
    AkNameAlg { actual: u16 },
    /// The AK lacks attributes that make its quotes trustworthy (or has forbidden ones).
    #[error(
        "the AK's objectAttributes are {actual:#010x}: it must be restricted, sign, fixedTPM and not decrypt ({problem})"
    )]
    AkAttributes { actual: u32, problem: &'static str },
    /// The AK's signing scheme is not ECDSA with SHA-256.
    #[error(
        "the AK's scheme is {scheme:#06x} with hash {hash:?}, expected ECDSA (0x0018) with SHA-256 (0x000b)"
    )]
    AkScheme { scheme: u16, hash: Option<u16> },
    /// The signature is not ECDSA with SHA-256.
    #[error(
        "the quote signature uses algorithm {sig_alg:#06x} with hash {hash_alg:#06x}, expected ECDSA (0x0018) with SHA-256 (0x000b)"
    )]
    SignatureScheme { sig_alg: u16, hash_alg: u16 },
    /// r or s is not a valid P-256 scalar.
    #[error(
        "the quote signature's r or s is not a valid P-256 scalar (r {r_len} bytes, s {s_len} bytes)"
    )]
    SignatureMalformed { r_len: usize, s_len: usize },
    /// The signature does not verify with the AK.
    #[error("the quote signature does not verify with the AK {ak_name} over the attest")]
    SignatureInvalid { ak_name: String },
    /// The quote was signed by a key that is not this AK as a primary of the endorsement
    /// hierarchy.
    #[error(
        "the quote's qualifiedSigner is {actual}, expected {expected} (the AK as a primary key of the endorsement hierarchy)"
    )]
    QualifiedSigner { expected: String, actual: String },
    /// The quote's extraData is not the boot-report qualifying data of the nonce the report
    /// claims (a quote made for another nonce, or for another purpose such as aTLS).
    #[error(
        "the quote's extraData is {attest}, but the report's nonce field {report} gives the \
         boot-report qualifying data {expected}"
    )]
    NonceMismatch {
        report: String,
        expected: String,
        attest: String,
    },
    /// The quote's nonce is not the one the verifier asked for (a replay, or another boot).
    #[error("the quote's nonce is {actual}, expected {expected}")]
    UnexpectedNonce { expected: String, actual: String },
    /// The attest selects PCRs other than exactly the declared sha256 PCRs.
    #[error(
        "the quote's PCR selection is {attest}, but the evidence declares sha256 PCRs {declared:?}"
    )]
    PcrSelection { declared: Vec<u8>, attest: String },
    /// A quoted PCR has no value in the report.
    #[error("PCR {pcr} is quoted but missing from the report's pcrs")]
    PcrMissing { pcr: u8 },
    /// A PCR value in the report is not covered by the quote.
    #[error("PCR {pcr} is in the report's pcrs but not covered by the quote")]
    PcrNotQuoted { pcr: u8 },
    /// The reported PCR values do not hash to the quoted pcrDigest.
    #[error(
        "the reported PCR values {pcrs:?} hash to {computed}, but the quote's pcrDigest is {quoted}"
    )]
    PcrDigest {
        pcrs: Vec<u8>,
        quoted: String,
        computed: String,
    },
    /// PCR 11 is not quoted, so the phase extension cannot be checked.
    #[error("PCR 11 is not covered by the quote, so the boot phases cannot be checked")]
    Pcr11NotQuoted,
    /// The report does not start its phases with enter-initrd.
    #[error("phases_extended is {actual:?}, expected it to start with \"enter-initrd\"")]
    Phases { actual: Vec<String> },
    /// PCR 11 is not the replay of the phase words on top of pcr11_before_phase.
    #[error(
        "PCR 11 is {actual}, but extending pcr11_before_phase {before} with {phases:?} gives {expected}"
    )]
    Pcr11Replay {
        before: String,
        phases: Vec<String>,
        expected: String,
        actual: String,
    },
    /// The AK is valid but not the one the caller trusts.
    #[error("the quote was signed by AK {actual}, the trusted AK is {expected}")]
    UntrustedAk { expected: String, actual: String },
}
