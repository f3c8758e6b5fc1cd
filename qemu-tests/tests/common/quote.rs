//! One measured boot: start a UKI under OVMF + swtpm, verify the boot report PID 1 prints
//! against a fresh nonce, read the firmware's event log, and hold both against a prediction.
//! Shared by the suites that boot a UKI and hold its quote and event log against a prediction
//! (`measurements`, `stubs`, `boot_paths`, `disk_image`).

use std::path::Path;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, VerifiedReport};
use hawser_harness::{TpmConfig, Vm, VmConfig, format_timeline};
use hawser_measurements::eventlog::{self, EventLog};
use hawser_measurements::explain::explain;
use hawser_measurements::predict::{PREDICTED_PCRS, Phase, Prediction};
use sha2::{Digest, Sha256};

/// Generous: TCG on a loaded 2-core CI machine.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

pub fn nonce(label: &str) -> [u8; 32] {
    let uuid = std::fs::read("/proc/sys/kernel/random/uuid").unwrap_or_default();
    Sha256::digest([uuid.as_slice(), label.as_bytes()].concat()).into()
}

/// What one boot produced.
pub struct Boot {
    pub verified: VerifiedReport,
    /// The firmware's event log, from PID 1's `HAWSER_EVENT_LOG` console line.
    pub event_log: EventLog,
}

/// Boots `uki` with OVMF + swtpm, waits for the boot report and the event log, verifies the
/// report against a fresh nonce, and powers the VM off.
pub fn boot(name: &str, uki: &Path) -> Boot {
    boot_with(name, VmConfig::uefi(uki))
}

/// [`boot`] with the VM `config` (its firmware, ESP and drives), given a TPM and the nonce.
pub fn boot_with(name: &str, config: VmConfig) -> Boot {
    let nonce = nonce(name);
    let vm = Vm::start(
        config
            .name(name)
            .tpm(TpmConfig::default())
            .fw_cfg_string("quote_nonce", hex::encode(nonce)),
    )
    .expect("start VM");
    let line = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{name}: no boot report: {e}"));
    let report = BootReport::find_in_console(&line)
        .expect("marker present")
        .expect("the boot report is valid JSON");
    let verified = report
        .verify(Some(&nonce))
        .unwrap_or_else(|e| panic!("{name}: the boot report does not verify: {e}"));
    let log_line = vm
        .wait_for_marker(
            "event log",
            hawser_pcr::EVENT_LOG_MARKER,
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{name}: PID 1 printed no HAWSER_EVENT_LOG line: {e}"));
    let bytes = eventlog::find_in_console(&log_line)
        .expect("marker present")
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let event_log = EventLog::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    vm.shutdown(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{name}: shutdown: {e}"));
    eprintln!("{name} timeline:\n{}", format_timeline(&vm.timeline()));
    Boot {
        verified,
        event_log,
    }
}

/// Every predicted PCR equals the verified quote; PCR 11 before hawser's phase equals the stub's
/// prediction; the event log lines up event for event.
pub fn assert_boot_matches(name: &str, prediction: &Prediction, boot: &Boot) {
    if let Err(why) = boot_matches(prediction, boot) {
        panic!("{name}: {why}");
    }
}

/// [`assert_boot_matches`] as a result: `Err` lists every quoted PCR that differs from the
/// prediction, followed by `hawser measurements explain`'s diagnosis of the event log.
pub fn boot_matches(prediction: &Prediction, boot: &Boot) -> Result<(), String> {
    let quoted = &boot.verified.pcrs;
    let mut differ = Vec::new();
    for pcr in PREDICTED_PCRS {
        let (q, p) = (quoted[&pcr], prediction.pcr(pcr, Phase::EnterInitrd));
        if q != p {
            differ.push(format!(
                "quoted PCR {pcr} {} differs from the prediction {}",
                hex::encode(q),
                hex::encode(p)
            ));
        }
    }
    if boot.verified.pcr11_before_phase != prediction.pcr(11, Phase::Stub) {
        differ.push("PCR 11 before enter-initrd differs from systemd-stub's prediction".into());
    }
    let diagnosis = explain(
        prediction,
        &boot.event_log,
        Some(quoted),
        &boot.verified.phases_extended,
    )
    .map_err(|e| format!("explain: {e}"))?;
    let lined_up = diagnosis.ok()
        && diagnosis
            .pcrs
            .iter()
            .all(|p| p.events.iter().all(|e| !e.is_problem()) && p.in_order);
    if differ.is_empty() && lined_up {
        Ok(())
    } else {
        Err(format!("{}\n{diagnosis}", differ.join("\n")))
    }
}
