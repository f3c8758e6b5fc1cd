//! The TPM half of the bring-up: measure the `enter-initrd` phase, quote, assemble the report.
//!
//! Blocking calls over [`hawser_attestation::tpm::Tpm`] (the boot runs them on
//! `spawn_blocking`); tested against a real swtpm, and the report they produce is checked with
//! the verifier of `hawser-attestation`, as a user of the report would check it.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use hawser_attestation::report::{BootReport, QuoteEvidence, REPORT_VERSION};
use hawser_attestation::tpm::{Tpm, TpmError};
use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD};
use hawser_platforms::node::AzureAuxRequest;

use crate::platform::timings::PhaseTimer;

/// The platform profile this boot attests as: set once from `hawser.platform`, before any
/// evidence is issued (one platform per boot), `qemu` until then.
static PLATFORM: std::sync::OnceLock<hawser_platforms::profile::Platform> =
    std::sync::OnceLock::new();

/// Records the boot's platform profile (the first call wins).
pub fn set_platform(platform: hawser_platforms::profile::Platform) {
    let _ = PLATFORM.set(platform);
}

/// The boot's platform profile.
pub fn platform() -> hawser_platforms::profile::Platform {
    PLATFORM
        .get()
        .copied()
        .unwrap_or(hawser_platforms::profile::Platform::Qemu)
}

/// On an Azure confidential VM: what the boot asked Azure's metadata service for (from the
/// HCL report it read at boot) and the answer, sent in every evidence as `platform_aux`. Set
/// once, after the network is up and before any evidence is issued.
static AZURE_AUX: std::sync::OnceLock<(AzureAuxRequest, Vec<u8>)> = std::sync::OnceLock::new();

/// Records Azure's answer to `request` for this boot's evidence (the first call wins).
pub fn set_azure_aux(request: AzureAuxRequest, aux: Vec<u8>) {
    let _ = AZURE_AUX.set((request, aux));
}

/// The evidence issuer of this boot's platform (the AK its platform certified). Blocking.
///
/// An Azure profile's issuer sends the metadata answer [`set_azure_aux`] recorded; without one
/// it is refused (`NodeError::NeedsMetadata`), as it is when the HCL report asks for another
/// answer than the one recorded (it changed since the boot read it).
pub fn issuer(
    tpm: std::sync::Arc<Tpm>,
) -> Result<hawser_attestation::TpmIssuer, hawser_platforms::node::NodeError> {
    use hawser_platforms::profile::Platform;
    let platform = platform();
    match (platform, AZURE_AUX.get()) {
        (Platform::AzureSnp | Platform::AzureTdx, Some((asked, aux))) => {
            hawser_platforms::node::issuer_for_azure(platform, tpm, |request| {
                recorded_aux(asked, aux, request)
            })
        }
        _ => hawser_platforms::node::issuer_for(platform, tpm),
    }
}

/// The recorded answer, if `request` is what it answered.
fn recorded_aux(
    asked: &AzureAuxRequest,
    aux: &[u8],
    request: &AzureAuxRequest,
) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
    if request != asked {
        return Err(format!(
            "the HCL report in NV 0x01400001 changed since the boot fetched {}: the answer \
             recorded then is not for it",
            asked.what()
        )
        .into());
    }
    Ok(aux.to_vec())
}

/// The sha256-bank PCRs read for the report and covered by its quote: all of them. Every value
/// in the report is signed (the verifier refuses unquoted values), and quoting 24 PCRs costs the
/// same single TPM2_Quote as quoting 16.
pub const REPORTED_PCRS: RangeInclusive<u8> = 0..=23;

/// A TPM step of the bring-up failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {step}")]
pub struct TpmStepError {
    /// What PID 1 was doing, as a verb phrase ("extend PCR 11 with the enter-initrd phase").
    pub step: &'static str,
    /// Boxed: a TPM error carries the TSS response code and context, and a large `Err` would
    /// make every `Result` of the boot path as large.
    #[source]
    pub source: Box<TpmError>,
}

/// The `map_err` that names the step a TPM command was for.
pub fn step(step: &'static str) -> impl FnOnce(TpmError) -> TpmStepError {
    move |source| TpmStepError {
        step,
        source: Box::new(source),
    }
}

/// Where the quote's nonce came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceSource {
    /// The verifier's, through fw_cfg.
    FwCfg,
    /// The node's own, from the TPM's random number generator.
    Generated,
}

impl NonceSource {
    /// The report's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NonceSource::FwCfg => "fw_cfg",
            NonceSource::Generated => "generated",
        }
    }
}

/// PCR 11 before the phase extension, and the sha256 bank after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurement {
    pub pcr11_before: [u8; 32],
    pub pcrs: BTreeMap<u8, [u8; 32]>,
}

/// Reads PCR 11, extends it with `enter-initrd` (like systemd-pcrphase) and reads the bank.
pub fn measure_enter_initrd(tpm: &Tpm) -> Result<Measurement, TpmStepError> {
    const READ_11: &str = "read PCR 11";
    let before = tpm
        .read_pcrs_sha256([PCR_KERNEL_BOOT])
        .map_err(step(READ_11))?;
    let pcr11_before = *before.get(&PCR_KERNEL_BOOT).ok_or(TpmStepError {
        step: READ_11,
        source: Box::new(TpmError::PcrIndex {
            pcr: PCR_KERNEL_BOOT,
        }),
    })?;
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
        .map_err(step("extend PCR 11 with the enter-initrd phase"))?;
    let pcrs = tpm
        .read_pcrs_sha256(REPORTED_PCRS)
        .map_err(step("read the sha256 PCR bank"))?;
    Ok(Measurement { pcr11_before, pcrs })
}

/// Creates the AK and quotes [`REPORTED_PCRS`] for a boot report with `nonce` (the quote binds
/// the boot-report qualifying data of the nonce, never the host's nonce itself: see
/// `hawser_attestation::report`). The AK is flushed on return.
pub fn quote_boot(tpm: &Tpm, nonce: &[u8]) -> Result<QuoteEvidence, TpmStepError> {
    let ak = tpm
        .create_attestation_key()
        .map_err(step("create the attestation key"))?;
    let pcrs: Vec<u8> = REPORTED_PCRS.collect();
    tpm.quote_boot_report(&ak, nonce, &pcrs)
        .map_err(step("quote the boot PCRs"))
}

/// Everything the TPM contributed to the boot report.
#[derive(Debug, Clone)]
pub struct Attestation {
    pub nonce: Vec<u8>,
    pub nonce_source: NonceSource,
    pub measurement: Measurement,
    pub quote: QuoteEvidence,
}

/// The rest of the boot report: who wrote it and how the boot went.
#[derive(Debug, Clone)]
pub struct ReportContext<'a> {
    pub kernel_release: &'a str,
    pub tpm_device: &'a str,
    pub timer: &'a PhaseTimer,
    pub warnings: Vec<String>,
}

impl Attestation {
    /// The boot report (printed by the caller as [`BootReport::to_console_line`]).
    pub fn into_report(self, context: ReportContext<'_>) -> BootReport {
        BootReport {
            report_version: REPORT_VERSION,
            hawser_version: env!("CARGO_PKG_VERSION").to_owned(),
            kernel_release: context.kernel_release.to_owned(),
            tpm_device: context.tpm_device.to_owned(),
            nonce: hex::encode(&self.nonce),
            nonce_source: self.nonce_source.as_str().to_owned(),
            pcr11_before_phase: hex::encode(self.measurement.pcr11_before),
            phases_extended: vec![PHASE_ENTER_INITRD.to_owned()],
            pcrs: self
                .measurement
                .pcrs
                .iter()
                .map(|(pcr, value)| (*pcr, hex::encode(value)))
                .collect(),
            quote: self.quote,
            timings: context.timer.phases().to_vec(),
            init_started_at_ms: context.timer.started_at_boottime_ms(),
            warnings: context.warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_recorded_azure_answer_is_sent_only_for_the_request_it_answered() {
        let vcek = AzureAuxRequest::VcekChain;
        assert_eq!(recorded_aux(&vcek, b"PEM", &vcek).unwrap(), b"PEM");

        let quote_of = |byte: u8| AzureAuxRequest::TdQuote {
            td_report: vec![byte; 1024],
        };
        assert_eq!(
            recorded_aux(&quote_of(1), b"quote", &quote_of(1)).unwrap(),
            b"quote"
        );
        let error = recorded_aux(&quote_of(1), b"quote", &quote_of(2))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("changed since the boot fetched the TD quote"),
            "{error}"
        );
        assert!(recorded_aux(&quote_of(1), b"quote", &vcek).is_err());
    }
}
