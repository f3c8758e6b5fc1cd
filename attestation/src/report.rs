//! The boot report: what the PID 1 prints on the console once the node has measured itself, and
//! the verifier that turns it into facts.
//!
//! The report is self-describing JSON on one console line (`HAWSER_BOOT_REPORT {…}`), so the QEMU
//! harness, the CLI and a human reading a serial log all see the same thing. Nothing in it is
//! trusted as written: [`BootReport::verify`] accepts it only if a TPM quote signed by the AK
//! in the report covers the reported PCR values and the nonce, and the reported PCR 11 equals
//! the replay of the phase words hawser extended on top of the value it read before.
//!
//! # The qualifying data
//!
//! The nonce comes from the host (fw_cfg `quote_nonce`), and the AK that signs the boot report's
//! quote is the one that signs aTLS evidence. So the nonce never goes into the quote as it is:
//! the quote's qualifying data (`extraData`, 32 bytes) is
//!
//! ```text
//! SHA-256( "hawser boot report v1\0"     22 bytes, domain separation
//!        || nonce )                       1-64 bytes, chosen by the verifier (or the node)
//! ```
//!
//! ([`boot_report_qualifying_data`]). aTLS hashes its own label (`"hawser aTLS evidence v1\0"`,
//! [`crate::evidence::QUALIFYING_DATA_PREFIX`]) in front of its inputs, and the two labels differ
//! in their eighth byte, so no nonce a host chooses makes a boot-report quote that aTLS accepts
//! (that would be a SHA-256 collision): the host cannot use the boot as a signing oracle for an
//! aTLS binding of its choice.
//!
//! What `verify` does **not** decide is whether the AK belongs to a TPM you trust: it returns
//! the AK's name and fingerprint in [`VerifiedQuote`], and the caller must compare them with a
//! trusted AK (see [`VerifiedQuote::ensure_ak_name`]) or a certificate chain. It also does not
//! judge whether the PCR values are the ones a released image produces; that is the job of the
//! reference measurements.

use std::collections::{BTreeMap, BTreeSet};

use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, extend_sha256, phase_digest};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::tpm_types::{
    self, Attest, ClockInfo, EccPublic, EccSignature, ParseError, TPM_ALG_ECDSA, TPM_ALG_SHA256,
    TPM_ECC_NIST_P256, TPM_RH_ENDORSEMENT, object_attributes,
};

/// The console line carrying a boot report is this marker followed by one JSON object.
pub const BOOT_REPORT_MARKER: &str = "HAWSER_BOOT_REPORT ";

/// The console line carrying a [`JoinReport`] is this marker followed by one JSON object.
pub const JOIN_REPORT_MARKER: &str = "HAWSER_JOIN_REPORT ";

/// How a node came to belong to its cluster, printed by PID 1 once it holds its state-disk key.
/// No secrets: the key's fingerprint and the public cluster ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinReport {
    /// The state disk's LUKS2 UUID.
    pub disk_uuid: String,
    /// `IssueJoinTicket`, `IssueRejoinTicket`, `Init` or `Recover`.
    pub rpc: String,
    /// `join-service` or `admin`.
    pub via: String,
    /// Join attempts (1 for the admin's calls).
    pub attempts: u32,
    pub key_fingerprint: String,
    /// The key's length in bytes: 64 (AES-XTS), 96 (with HMAC-SHA256 integrity). Reports of
    /// nodes before lengths were reported read as 64.
    #[serde(default = "xts_key_bytes")]
    pub key_bytes: usize,
    /// Hex.
    pub cluster_id: String,
    /// Hex: PCR 15 after the node lock.
    pub pcr15: String,
}

fn xts_key_bytes() -> usize {
    64
}

impl JoinReport {
    /// The console line for this report.
    pub fn to_console_line(&self) -> Result<String, serde_json::Error> {
        Ok(format!(
            "{JOIN_REPORT_MARKER}{}",
            serde_json::to_string(self)?
        ))
    }

    /// The report in a console line (or text) containing [`JOIN_REPORT_MARKER`]; `None` if
    /// there is no marker.
    pub fn find_in_console(text: &str) -> Option<Result<Self, serde_json::Error>> {
        text.lines().find_map(|line| {
            line.find(JOIN_REPORT_MARKER)
                .map(|at| serde_json::from_str(line[at + JOIN_REPORT_MARKER.len()..].trim_end()))
        })
    }
}

/// The console line carrying the firmware's TCG event log (defined in hawser-pcr, shared by PID 1
/// and the parser in hawser-measurements).
pub use hawser_pcr::EVENT_LOG_MARKER;

/// The report format this crate writes and verifies.
pub const REPORT_VERSION: u32 = 1;

/// The first bytes hashed into a boot report's qualifying data (see the module docs).
pub const BOOT_REPORT_QUALIFYING_DATA_PREFIX: &[u8; 22] = b"hawser boot report v1\0";

/// The qualifying data a boot report's quote binds for `nonce`:
/// `SHA-256("hawser boot report v1\0" || nonce)` (see the module docs).
pub fn boot_report_qualifying_data(nonce: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(BOOT_REPORT_QUALIFYING_DATA_PREFIX);
    hasher.update(nonce);
    hasher.finalize().into()
}

/// Evidence from one TPM2_Quote, as the TPM marshalled it (hex strings).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct QuoteEvidence {
    /// The AK's `TPM2B_PUBLIC`.
    pub ak_public: String,
    /// The signed `TPMS_ATTEST`.
    pub attest: String,
    /// The `TPMT_SIGNATURE` over `attest`.
    pub signature: String,
    /// The PCRs of the sha256 bank the quote covers, ascending.
    pub pcr_selection: Vec<u8>,
}

/// How long one step of the PID 1 took.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PhaseTiming {
    /// The step, e.g. "mounts", "modules", "tpm".
    pub name: String,
    /// Milliseconds since /init started.
    pub start_ms: f64,
    /// Milliseconds the step took.
    pub duration_ms: f64,
}

/// The boot report the PID 1 prints after measuring the boot (see the module docs).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct BootReport {
    /// Format version, [`REPORT_VERSION`].
    pub report_version: u32,
    /// Version of the hawser PID 1 that wrote the report.
    pub hawser_version: String,
    /// `uname -r` of the running kernel.
    pub kernel_release: String,
    /// The TPM device used, e.g. "/dev/tpmrm0".
    pub tpm_device: String,
    /// Hex of the nonce; the quote binds [`boot_report_qualifying_data`] of it.
    pub nonce: String,
    /// Where the nonce came from: "fw_cfg" (the verifier's) or "generated" (the node's own).
    pub nonce_source: String,
    /// Hex of sha256-bank PCR 11 read just before hawser extended its first phase word.
    pub pcr11_before_phase: String,
    /// The phase words hawser extended into PCR 11, in order (["enter-initrd"]).
    pub phases_extended: Vec<String>,
    /// Hex of the sha256-bank PCRs read after the extension, by index.
    pub pcrs: BTreeMap<u8, String>,
    /// The quote over `pcrs`.
    pub quote: QuoteEvidence,
    /// Durations of the PID 1's steps.
    pub timings: Vec<PhaseTiming>,
    /// CLOCK_BOOTTIME at /init start, in milliseconds (the kernel's share of the boot).
    pub init_started_at_ms: f64,
    /// Anything the PID 1 wants a reader to notice (unknown kernel parameters, fallbacks).
    pub warnings: Vec<String>,
}

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

/// What a valid quote proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedQuote {
    /// The AK's TPM name (`000b || SHA256(TPMT_PUBLIC)`), stable for a given TPM and template.
    pub ak_name: Vec<u8>,
    /// SHA-256 of the AK's public point in SEC1 uncompressed form (`04 || x || y`).
    pub ak_fingerprint: [u8; 32],
    /// The AK's public point, SEC1 uncompressed.
    pub ak_public_point: [u8; 65],
    /// The qualifying data the quote binds.
    pub nonce: Vec<u8>,
    /// The TPM's clock when it signed.
    pub clock_info: ClockInfo,
    /// The TPM's firmware version.
    pub firmware_version: u64,
    /// The quoted sha256-bank PCRs, ascending.
    pub pcr_selection: Vec<u8>,
    /// SHA-256 over the quoted PCR values, as the TPM computed it.
    pub pcr_digest: [u8; 32],
}

/// What a valid boot report proves (on top of [`VerifiedQuote`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedReport {
    /// The verified quote (its `nonce` is the qualifying data, [`boot_report_qualifying_data`]
    /// of [`VerifiedReport::nonce`]).
    pub quote: VerifiedQuote,
    /// The report's nonce, which the quote binds.
    pub nonce: Vec<u8>,
    /// The quoted sha256-bank PCR values.
    pub pcrs: BTreeMap<u8, [u8; 32]>,
    /// PCR 11 before the phase words, as reported (consistent with the quoted PCR 11).
    pub pcr11_before_phase: [u8; 32],
    /// The phase words extended into PCR 11.
    pub phases_extended: Vec<String>,
}

fn decode_hex(field: impl Into<String>, value: &str) -> Result<Vec<u8>, VerifyError> {
    hex::decode(value).map_err(|source| VerifyError::Hex {
        field: field.into(),
        source,
    })
}

fn decode_32(field: String, value: &str) -> Result<[u8; 32], VerifyError> {
    let bytes = decode_hex(field.clone(), value)?;
    let actual = bytes.len();
    bytes.try_into().map_err(|_| VerifyError::Length {
        field,
        expected: 32,
        actual,
    })
}

fn describe_selections(selections: &[tpm_types::PcrSelection]) -> String {
    let banks: Vec<String> = selections
        .iter()
        .map(|s| format!("{:#06x}:{:?}", s.hash_alg, s.indices()))
        .collect();
    format!("[{}]", banks.join(", "))
}

impl QuoteEvidence {
    /// Checks that this quote is a TPM-generated quote signed by a restricted P-256 ECDSA
    /// signing key that is a primary of the endorsement hierarchy, over exactly the declared
    /// sha256 PCRs, with `qualifying_data` as its extraData (for a boot report, that is
    /// [`boot_report_qualifying_data`] of the nonce; [`BootReport::verify`] derives it).
    pub fn verify(&self, qualifying_data: &[u8]) -> Result<VerifiedQuote, VerifyError> {
        let ak_bytes = decode_hex("quote.ak_public", &self.ak_public)?;
        let attest_bytes = decode_hex("quote.attest", &self.attest)?;
        let signature_bytes = decode_hex("quote.signature", &self.signature)?;
        verify_quote(
            QuoteParts {
                ak_public: &ak_bytes,
                attest: &attest_bytes,
                signature: &signature_bytes,
            },
            &REPORT_FIELDS,
            &self.pcr_selection,
            qualifying_data,
        )
    }
}

/// The three marshalled TPM structures of a quote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuoteParts<'a> {
    pub ak_public: &'a [u8],
    pub attest: &'a [u8],
    pub signature: &'a [u8],
}

/// How the caller's format names the three structures, for error messages.
pub(crate) struct FieldNames {
    pub ak_public: &'static str,
    pub attest: &'static str,
    pub signature: &'static str,
}

const REPORT_FIELDS: FieldNames = FieldNames {
    ak_public: "quote.ak_public",
    attest: "quote.attest",
    signature: "quote.signature",
};

/// The quote checks of [`QuoteEvidence::verify`] on raw bytes (shared with the aTLS evidence).
pub(crate) fn verify_quote(
    parts: QuoteParts<'_>,
    fields: &FieldNames,
    pcr_selection: &[u8],
    nonce: &[u8],
) -> Result<VerifiedQuote, VerifyError> {
    let attest_bytes = parts.attest;
    let ak = EccPublic::parse(parts.ak_public).map_err(|source| VerifyError::Parse {
        field: fields.ak_public,
        source,
    })?;
    let attest = Attest::parse(attest_bytes).map_err(|source| VerifyError::Parse {
        field: fields.attest,
        source,
    })?;
    let signature = EccSignature::parse(parts.signature).map_err(|source| VerifyError::Parse {
        field: fields.signature,
        source,
    })?;

    // The AK: only a restricted signing key's signature over a TPM_GENERATED_VALUE structure
    // proves the TPM produced it; a non-restricted key could sign a forged TPMS_ATTEST.
    if ak.name_alg != TPM_ALG_SHA256 {
        return Err(VerifyError::AkNameAlg {
            actual: ak.name_alg,
        });
    }
    let attrs = ak.object_attributes;
    let problem = if attrs & object_attributes::RESTRICTED == 0 {
        Some("not restricted")
    } else if attrs & object_attributes::SIGN_ENCRYPT == 0 {
        Some("not a signing key")
    } else if attrs & object_attributes::FIXED_TPM == 0 {
        Some("not fixedTPM")
    } else if attrs & object_attributes::DECRYPT != 0 {
        Some("also a decryption key")
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(VerifyError::AkAttributes {
            actual: attrs,
            problem,
        });
    }
    if ak.scheme.scheme != TPM_ALG_ECDSA || ak.scheme.hash_alg != Some(TPM_ALG_SHA256) {
        return Err(VerifyError::AkScheme {
            scheme: ak.scheme.scheme,
            hash: ak.scheme.hash_alg,
        });
    }
    if ak.curve != TPM_ECC_NIST_P256 {
        return Err(VerifyError::AkKey {
            reason: format!("curve is {:#06x}, expected NIST P-256 (0x0003)", ak.curve),
        });
    }
    let (Some(point), Some(key)) = (ak.p256_sec1_point(), ak.p256_verifying_key()) else {
        return Err(VerifyError::AkKey {
            reason: format!(
                "the point (x {} bytes, y {} bytes) is not on the curve",
                ak.x.len(),
                ak.y.len()
            ),
        });
    };
    let ak_name = ak.name().ok_or(VerifyError::AkNameAlg {
        actual: ak.name_alg,
    })?;

    // The signature, before anything inside the attest is believed.
    if signature.sig_alg != TPM_ALG_ECDSA || signature.hash_alg != TPM_ALG_SHA256 {
        return Err(VerifyError::SignatureScheme {
            sig_alg: signature.sig_alg,
            hash_alg: signature.hash_alg,
        });
    }
    let p256_signature = signature.to_p256().ok_or(VerifyError::SignatureMalformed {
        r_len: signature.r.len(),
        s_len: signature.s.len(),
    })?;
    if !tpm_types::verify_p256_sha256(&key, attest_bytes, &p256_signature) {
        return Err(VerifyError::SignatureInvalid {
            ak_name: hex::encode(&ak_name),
        });
    }

    // The signer is this AK as an endorsement-hierarchy primary (not, say, a child key).
    let expected_signer =
        ak.primary_qualified_name(TPM_RH_ENDORSEMENT)
            .ok_or(VerifyError::AkNameAlg {
                actual: ak.name_alg,
            })?;
    if attest.qualified_signer != expected_signer {
        return Err(VerifyError::QualifiedSigner {
            expected: hex::encode(expected_signer),
            actual: hex::encode(&attest.qualified_signer),
        });
    }

    if attest.extra_data != nonce {
        return Err(VerifyError::UnexpectedNonce {
            expected: hex::encode(nonce),
            actual: hex::encode(&attest.extra_data),
        });
    }

    let mut declared = pcr_selection.to_vec();
    declared.sort_unstable();
    declared.dedup();
    let selection_matches = match attest.pcr_selections.as_slice() {
        [only] => only.hash_alg == TPM_ALG_SHA256 && only.indices() == declared,
        _ => false,
    };
    if !selection_matches || declared != pcr_selection {
        return Err(VerifyError::PcrSelection {
            declared: pcr_selection.to_vec(),
            attest: describe_selections(&attest.pcr_selections),
        });
    }
    let pcr_digest: [u8; 32] =
        attest
            .pcr_digest
            .clone()
            .try_into()
            .map_err(|d: Vec<u8>| VerifyError::Length {
                field: "quote.attest pcrDigest".into(),
                expected: 32,
                actual: d.len(),
            })?;

    Ok(VerifiedQuote {
        ak_fingerprint: Sha256::digest(point).into(),
        ak_public_point: point,
        ak_name,
        nonce: attest.extra_data,
        clock_info: attest.clock_info,
        firmware_version: attest.firmware_version,
        pcr_selection: declared,
        pcr_digest,
    })
}

impl VerifiedQuote {
    /// Checks that `pcrs` are exactly the quoted PCRs and hash to the quoted digest.
    pub fn check_pcrs(&self, pcrs: &BTreeMap<u8, [u8; 32]>) -> Result<(), VerifyError> {
        let quoted: BTreeSet<u8> = self.pcr_selection.iter().copied().collect();
        if let Some(&pcr) = pcrs.keys().find(|pcr| !quoted.contains(pcr)) {
            return Err(VerifyError::PcrNotQuoted { pcr });
        }
        let mut hasher = Sha256::new();
        for pcr in &self.pcr_selection {
            let value = pcrs.get(pcr).ok_or(VerifyError::PcrMissing { pcr: *pcr })?;
            hasher.update(value);
        }
        let computed: [u8; 32] = hasher.finalize().into();
        if computed != self.pcr_digest {
            return Err(VerifyError::PcrDigest {
                pcrs: self.pcr_selection.clone(),
                quoted: hex::encode(self.pcr_digest),
                computed: hex::encode(computed),
            });
        }
        Ok(())
    }

    /// Fails unless the quote was signed by the AK with TPM name `trusted_ak_name`.
    pub fn ensure_ak_name(&self, trusted_ak_name: &[u8]) -> Result<(), VerifyError> {
        if self.ak_name == trusted_ak_name {
            Ok(())
        } else {
            Err(VerifyError::UntrustedAk {
                expected: hex::encode(trusted_ak_name),
                actual: hex::encode(&self.ak_name),
            })
        }
    }
}

impl BootReport {
    /// Verifies the report (see the module docs): the quote with the boot-report qualifying
    /// data of its own nonce field, that nonce against `expected_nonce` when the verifier
    /// supplied one, the PCR values against the quoted digest, and PCR 11 against the replay of
    /// `phases_extended`.
    pub fn verify(&self, expected_nonce: Option<&[u8]>) -> Result<VerifiedReport, VerifyError> {
        if self.report_version != REPORT_VERSION {
            return Err(VerifyError::UnsupportedReportVersion {
                found: self.report_version,
                supported: REPORT_VERSION,
            });
        }
        let nonce = decode_hex("nonce", &self.nonce)?;
        let qualifying_data = boot_report_qualifying_data(&nonce);
        let quote = self
            .quote
            .verify(&qualifying_data)
            .map_err(|err| match err {
                VerifyError::UnexpectedNonce { expected, actual } => VerifyError::NonceMismatch {
                    report: self.nonce.clone(),
                    expected,
                    attest: actual,
                },
                other => other,
            })?;
        if let Some(expected) = expected_nonce
            && expected != nonce.as_slice()
        {
            return Err(VerifyError::UnexpectedNonce {
                expected: hex::encode(expected),
                actual: hex::encode(&nonce),
            });
        }

        let mut pcrs = BTreeMap::new();
        for (pcr, value) in &self.pcrs {
            pcrs.insert(*pcr, decode_32(format!("pcrs[{pcr}]"), value)?);
        }
        quote.check_pcrs(&pcrs)?;

        let pcr11 = *pcrs
            .get(&PCR_KERNEL_BOOT)
            .ok_or(VerifyError::Pcr11NotQuoted)?;
        if self.phases_extended.first().map(String::as_str) != Some(PHASE_ENTER_INITRD) {
            return Err(VerifyError::Phases {
                actual: self.phases_extended.clone(),
            });
        }
        let before = decode_32("pcr11_before_phase".into(), &self.pcr11_before_phase)?;
        let replayed = self.phases_extended.iter().fold(before, |pcr, phase| {
            extend_sha256(&pcr, &phase_digest(phase))
        });
        if replayed != pcr11 {
            return Err(VerifyError::Pcr11Replay {
                before: hex::encode(before),
                phases: self.phases_extended.clone(),
                expected: hex::encode(replayed),
                actual: hex::encode(pcr11),
            });
        }

        Ok(VerifiedReport {
            quote,
            nonce,
            pcrs,
            pcr11_before_phase: before,
            phases_extended: self.phases_extended.clone(),
        })
    }

    /// The console line for this report: [`BOOT_REPORT_MARKER`] followed by compact JSON.
    pub fn to_console_line(&self) -> Result<String, serde_json::Error> {
        Ok(format!(
            "{BOOT_REPORT_MARKER}{}",
            serde_json::to_string(self)?
        ))
    }

    /// The last boot report in a console log, if any. The marker may be preceded by other text
    /// on its line (a serial console interleaves kernel messages); the JSON runs to the end of
    /// the line.
    pub fn find_in_console(log: &str) -> Option<Result<BootReport, serde_json::Error>> {
        log.lines()
            .rev()
            .find_map(|line| line.find(BOOT_REPORT_MARKER).map(|at| (line, at)))
            .map(|(line, at)| {
                serde_json::from_str(line[at + BOOT_REPORT_MARKER.len()..].trim_end())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{
        AK_PUB, ATTEST, BOOT_REPORT_AK_NAME as AK_NAME, BOOT_REPORT_AK_PUB,
        BOOT_REPORT_ATTEST as REPORT_ATTEST, BOOT_REPORT_ATTEST_HIGH_S as REPORT_ATTEST_HIGH_S,
        BOOT_REPORT_SIG as REPORT_SIG, BOOT_REPORT_SIG_HIGH_S as REPORT_SIG_HIGH_S, SIG,
    };

    const NONCE: &str = "00112233445566778899aabbccddeeff";
    const PCR11: &str = "d15b0e8e244e65c40f024e95773f2347ce4ef3ffe6b597c9a14b50bbab6df319";

    /// A report around the tpm2-tools boot-report quote (qualifying data
    /// `boot_report_qualifying_data(NONCE)`): the fixture TPM had PCR 11 = extend(0, enter-initrd),
    /// PCRs 17..=22 all-ones (locality-4 PCRs reset to ones) and every other PCR zero.
    fn tpm2_tools_report() -> BootReport {
        let pcrs = (0u8..=23)
            .map(|pcr| {
                let value = match pcr {
                    11 => PCR11.to_string(),
                    17..=22 => "ff".repeat(32),
                    _ => "00".repeat(32),
                };
                (pcr, value)
            })
            .collect();
        BootReport {
            report_version: 1,
            hawser_version: "0.1.0".into(),
            kernel_release: "6.12.0-test".into(),
            tpm_device: "swtpm".into(),
            nonce: NONCE.into(),
            nonce_source: "generated".into(),
            pcr11_before_phase: "00".repeat(32),
            phases_extended: vec!["enter-initrd".into()],
            pcrs,
            quote: QuoteEvidence {
                ak_public: BOOT_REPORT_AK_PUB.into(),
                attest: REPORT_ATTEST.into(),
                signature: REPORT_SIG.into(),
                pcr_selection: (0..=23).collect(),
            },
            timings: vec![PhaseTiming {
                name: "tpm".into(),
                start_ms: 1.5,
                duration_ms: 40.25,
            }],
            init_started_at_ms: 7012.5,
            warnings: vec![],
        }
    }

    #[test]
    fn accepts_a_quote_made_by_tpm2_tools() {
        let nonce = hex::decode(NONCE).expect("hex");
        let verified = tpm2_tools_report()
            .verify(Some(&nonce))
            .expect("the tpm2-tools quote verifies");
        assert_eq!(verified.quote.ak_name, hex::decode(AK_NAME).expect("hex"));
        assert_eq!(verified.nonce, nonce);
        assert_eq!(verified.quote.nonce, boot_report_qualifying_data(&nonce));
        assert_eq!(verified.quote.clock_info.reset_count, 1);
        assert_eq!(verified.quote.firmware_version, 0x2019_1023_0016_3636);
        assert_eq!(verified.pcrs.len(), 24);
        assert_eq!(verified.phases_extended, ["enter-initrd"]);
        let point = verified.quote.ak_public_point;
        assert_eq!(point[0], 4);
        assert_eq!(
            verified.quote.ak_fingerprint,
            <[u8; 32]>::from(Sha256::digest(point))
        );
        verified
            .quote
            .ensure_ak_name(&hex::decode(AK_NAME).expect("hex"))
            .expect("trusted AK");
        assert!(matches!(
            verified.quote.ensure_ak_name(&[0; 34]),
            Err(VerifyError::UntrustedAk { .. })
        ));

        // The high-S quote of the same state verifies too.
        let mut report = tpm2_tools_report();
        report.quote.attest = REPORT_ATTEST_HIGH_S.into();
        report.quote.signature = REPORT_SIG_HIGH_S.into();
        report.verify(None).expect("high-S quote verifies");
    }

    #[test]
    fn console_line_round_trips() {
        let report = tpm2_tools_report();
        let line = report.to_console_line().expect("serialises");
        assert!(line.starts_with("HAWSER_BOOT_REPORT {"));
        assert!(!line.contains('\n'));
        let log =
            format!("[    7.1] random kernel line\nnoise {line}\r\nhawser: boot complete; idle\n");
        let parsed = BootReport::find_in_console(&log)
            .expect("marker found")
            .expect("JSON parses");
        parsed.verify(None).expect("still verifies");
        assert_eq!(parsed.timings, report.timings);
        assert!(BootReport::find_in_console("no report here\n").is_none());
    }

    #[test]
    fn json_field_names_are_the_documented_ones() {
        let value = serde_json::to_value(tpm2_tools_report()).expect("serialises");
        for key in [
            "report_version",
            "hawser_version",
            "kernel_release",
            "tpm_device",
            "nonce",
            "nonce_source",
            "pcr11_before_phase",
            "phases_extended",
            "pcrs",
            "quote",
            "timings",
            "init_started_at_ms",
            "warnings",
        ] {
            assert!(value.get(key).is_some(), "missing {key}");
        }
        assert!(
            value["pcrs"].get("11").is_some(),
            "PCR map keyed by decimal index"
        );
        for key in ["ak_public", "attest", "signature", "pcr_selection"] {
            assert!(value["quote"].get(key).is_some(), "missing quote.{key}");
        }
    }

    #[test]
    fn refusals_name_their_reason() {
        let nonce = hex::decode(NONCE).expect("hex");

        let mut r = tpm2_tools_report();
        r.pcrs.insert(0, "01".repeat(32));
        let err = r.verify(None).expect_err("tampered PCR 0");
        assert!(matches!(err, VerifyError::PcrDigest { .. }), "{err}");
        assert!(err.to_string().contains("pcrDigest is c6aa24a1"), "{err}");

        let err = tpm2_tools_report()
            .verify(Some(&[0xaa; 16]))
            .expect_err("other nonce");
        assert_eq!(
            err.to_string(),
            format!("the quote's nonce is {NONCE}, expected {}", "aa".repeat(16))
        );

        let mut r = tpm2_tools_report();
        r.nonce = "aa".repeat(16);
        let err = r
            .verify(None)
            .expect_err("report nonce differs from attest");
        assert!(matches!(err, VerifyError::NonceMismatch { .. }), "{err}");

        let mut r = tpm2_tools_report();
        let mut sig = hex::decode(REPORT_SIG).expect("hex");
        let last = sig.len() - 1;
        sig[last] ^= 0x01;
        r.quote.signature = hex::encode(sig);
        let err = r.verify(Some(&nonce)).expect_err("flipped signature bit");
        assert!(matches!(err, VerifyError::SignatureInvalid { .. }), "{err}");

        let mut r = tpm2_tools_report();
        r.quote.attest = REPORT_ATTEST[..REPORT_ATTEST.len() - 2].into();
        let err = r.verify(None).expect_err("truncated attest");
        assert_eq!(
            crate::error_chain(&err),
            "field quote.attest does not parse: TPMS_ATTEST: field attested.quote.pcrDigest \
             at offset 113 needs 32 bytes but only 31 remain"
        );

        let mut r = tpm2_tools_report();
        r.pcr11_before_phase = "11".repeat(32);
        let err = r.verify(None).expect_err("wrong PCR 11 base");
        assert!(matches!(err, VerifyError::Pcr11Replay { .. }), "{err}");

        let mut r = tpm2_tools_report();
        r.phases_extended = vec!["enter-initrd".into(), "leave-initrd".into()];
        let err = r
            .verify(None)
            .expect_err("claims a phase that was not extended");
        assert!(matches!(err, VerifyError::Pcr11Replay { .. }), "{err}");

        let mut r = tpm2_tools_report();
        r.phases_extended = vec!["sysinit".into()];
        assert!(matches!(r.verify(None), Err(VerifyError::Phases { .. })));

        let mut r = tpm2_tools_report();
        r.pcrs.remove(&5);
        assert!(matches!(
            r.verify(None),
            Err(VerifyError::PcrMissing { pcr: 5 })
        ));

        let mut r = tpm2_tools_report();
        r.pcrs.insert(24, "00".repeat(32));
        assert!(matches!(
            r.verify(None),
            Err(VerifyError::PcrNotQuoted { pcr: 24 })
        ));

        let mut r = tpm2_tools_report();
        r.quote.pcr_selection = (0..=22).collect();
        assert!(matches!(
            r.verify(None),
            Err(VerifyError::PcrSelection { .. })
        ));

        let mut r = tpm2_tools_report();
        r.pcrs.insert(3, "00".repeat(31));
        let err = r.verify(None).expect_err("short PCR");
        assert_eq!(err.to_string(), "field pcrs[3] holds 31 bytes, expected 32");

        let mut r = tpm2_tools_report();
        r.report_version = 2;
        assert!(matches!(
            r.verify(None),
            Err(VerifyError::UnsupportedReportVersion { found: 2, .. })
        ));

        let mut r = tpm2_tools_report();
        r.nonce = "zz".into();
        assert!(matches!(r.verify(None), Err(VerifyError::Hex { .. })));
    }

    #[test]
    fn refuses_an_unrestricted_or_decrypting_ak() {
        // Clearing `restricted` changes the AK's name, so the signature check would fail too;
        // the attribute check comes first and names the real problem.
        let mut ak = hex::decode(BOOT_REPORT_AK_PUB).expect("hex");
        // objectAttributes are bytes 6..10 of the TPM2B_PUBLIC (size 2, type 2, nameAlg 2).
        ak[7] &= !0x01; // bit 16: restricted
        let mut r = tpm2_tools_report();
        r.quote.ak_public = hex::encode(&ak);
        let err = r.verify(None).expect_err("unrestricted");
        assert!(
            matches!(
                err,
                VerifyError::AkAttributes {
                    problem: "not restricted",
                    ..
                }
            ),
            "{err}"
        );

        let mut ak = hex::decode(BOOT_REPORT_AK_PUB).expect("hex");
        ak[7] |= 0x02; // bit 17: decrypt
        let mut r = tpm2_tools_report();
        r.quote.ak_public = hex::encode(&ak);
        assert!(matches!(
            r.verify(None),
            Err(VerifyError::AkAttributes {
                problem: "also a decryption key",
                ..
            })
        ));
    }

    #[test]
    fn boot_report_qualifying_data_is_the_labelled_hash_of_the_nonce() {
        let nonce = hex::decode(NONCE).expect("hex");
        // The value tpm2_quote was given for the fixture (computed with Python's hashlib).
        assert_eq!(
            hex::encode(boot_report_qualifying_data(&nonce)),
            "819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa5"
        );
        let mut input = b"hawser boot report v1\0".to_vec();
        input.extend_from_slice(&nonce);
        assert_eq!(
            boot_report_qualifying_data(&nonce),
            <[u8; 32]>::from(Sha256::digest(&input))
        );
        assert_ne!(
            boot_report_qualifying_data(&nonce),
            boot_report_qualifying_data(&nonce[1..])
        );
    }

    #[test]
    fn boot_report_and_atls_qualifying_data_are_separate_domains() {
        use crate::evidence::{Binding, QUALIFYING_DATA_PREFIX, Role};
        // Neither label is a prefix of the other: the hash inputs of the two domains differ in
        // their first bytes whatever follows, so equal outputs would be a SHA-256 collision.
        let (report, atls) = (
            &BOOT_REPORT_QUALIFYING_DATA_PREFIX[..],
            &QUALIFYING_DATA_PREFIX[..],
        );
        let common = report.len().min(atls.len());
        assert_ne!(report[..common], atls[..common]);
        // A host that chooses the boot report's nonce to be exactly the aTLS input after the
        // label still gets another value than aTLS expects.
        let nonce = [0x42; 32];
        let binding = Binding {
            role: Role::Server,
            nonce: &nonce,
            tls_spki_der: b"spki",
        };
        let atls_value = binding.qualifying_data(b"");
        let mut atls_input_after_label = vec![b's'];
        atls_input_after_label.extend_from_slice(&nonce);
        atls_input_after_label.extend_from_slice(&binding.tls_key_hash());
        atls_input_after_label.extend_from_slice(&Sha256::digest(b""));
        for host_nonce in [&atls_value[..], &atls_input_after_label[..]] {
            assert_ne!(boot_report_qualifying_data(host_nonce), atls_value);
        }
    }

    #[test]
    fn a_quote_of_the_raw_nonce_is_not_a_boot_report() {
        // The tpm2-tools quote with the nonce itself as qualifying data (what a boot report
        // quoted before domain separation) is refused, naming the value it should bind.
        let mut r = tpm2_tools_report();
        r.quote.ak_public = AK_PUB.into();
        r.quote.attest = ATTEST.into();
        r.quote.signature = SIG.into();
        let err = r.verify(None).expect_err("raw nonce");
        assert!(matches!(err, VerifyError::NonceMismatch { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "the quote's extraData is {NONCE}, but the report's nonce field {NONCE} gives \
                 the boot-report qualifying data \
                 819ca5a192c932bb5f375de145a4e1dd4ab5613afe297b65d08e9fc68002cfa5"
            )
        );
    }
}
