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

use std::collections::BTreeMap;

use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, extend_sha256, phase_digest};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod error;
mod quote;

pub use error::VerifyError;
pub use quote::VerifiedQuote;
pub(crate) use quote::{FieldNames, QuoteParts, verify_quote};

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
mod tests;
