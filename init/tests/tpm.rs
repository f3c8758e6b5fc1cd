//! The TPM step of the bring-up against a real swtpm, checked with the report verifier of
//! hawser-attestation the way the test harness and the CLI check a guest's report.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

// The attestation crate's swtpm fixture (one private swtpm per test), shared rather than copied.
#[allow(dead_code)]
#[path = "../../attestation/tests/common/mod.rs"]
mod common;

use hawser_attestation::tpm::Tpm;
use hawser_init::attest::{self, Attestation, NonceSource, REPORTED_PCRS, ReportContext};
use hawser_init::timings::PhaseTimer;
use hawser_pcr::{PCR_KERNEL_BOOT, extend_sha256, phase_digest};

fn report(tpm: &Tpm, nonce: &[u8], timer: &PhaseTimer) -> hawser_attestation::BootReport {
    let measurement = attest::measure_enter_initrd(tpm).unwrap();
    let quote = attest::quote_boot(tpm, nonce).unwrap();
    Attestation {
        nonce: nonce.to_vec(),
        nonce_source: NonceSource::FwCfg,
        measurement,
        quote,
    }
    .into_report(ReportContext {
        kernel_release: "6.12.0-test",
        tpm_device: "swtpm",
        timer,
        warnings: vec!["a warning".into()],
    })
}

#[test]
fn the_boot_report_verifies_and_replays_pcr_11() {
    let swtpm = common::Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).unwrap();
    let mut timer = PhaseTimer::start();
    timer.time("measure", || ());
    let nonce = [0x5a; 32];

    let first = report(&tpm, &nonce, &timer);
    let verified = first.verify(Some(&nonce)).unwrap();
    // The quote binds the boot report's labelled hash of the host's nonce, never the nonce.
    assert_eq!(
        verified.quote.nonce,
        hawser_attestation::report::boot_report_qualifying_data(&nonce)
    );
    // A fresh TPM: PCR 11 was zero, and is now extend(0, H("enter-initrd")).
    assert_eq!(first.pcr11_before_phase, "00".repeat(32));
    assert_eq!(
        verified.pcrs[&PCR_KERNEL_BOOT],
        extend_sha256(&[0; 32], &phase_digest("enter-initrd"))
    );
    assert_eq!(
        first.pcrs.keys().copied().collect::<Vec<_>>(),
        REPORTED_PCRS.collect::<Vec<_>>()
    );
    assert_eq!(first.nonce_source, "fw_cfg");
    assert_eq!(first.timings[0].name, "measure");
    assert_eq!(first.warnings, ["a warning"]);

    // The report is bound to its nonce.
    assert!(first.verify(Some(&[0xa5; 32])).is_err());

    // A second measurement starts from where the first left PCR 11.
    let second = report(&tpm, &nonce, &timer);
    assert_eq!(second.pcr11_before_phase, first.pcrs[&PCR_KERNEL_BOOT]);
    second.verify(Some(&nonce)).unwrap();
}

#[test]
fn the_report_round_trips_through_a_console_line() {
    let swtpm = common::Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).unwrap();
    let timer = PhaseTimer::start();
    let line = report(&tpm, b"nonce", &timer).to_console_line().unwrap();
    assert!(!line.contains('\n'), "one console line");
    let console = format!(
        "[    1.000000] hawser: something\n{line}\n[    2.0] hawser: boot complete; idle\n"
    );
    let parsed = hawser_attestation::BootReport::find_in_console(&console)
        .unwrap()
        .unwrap();
    parsed.verify(Some(b"nonce")).unwrap();
}

/// Tamper row: PCR 15 already extended
///
/// Something extends PCR 15 before the node lock (with any value; here, the one a lock for
/// another cluster would leave). The lock is refused with the reason, stays open, and PCR 15 is
/// left as it was; on a TPM whose PCR 15 is zero the same lock is taken.
#[test]
fn tamper_pcr15_already_extended() {
    use hawser_init::enrollment::lock::{
        LockError, MarkError, NodeLock, Owner, PCR_CLUSTER_ID, State, cluster_lock_pcr, mark_tpm,
    };
    let cluster_id = [0x15; 32];

    let swtpm = common::Swtpm::start();
    let tpm = Tpm::open(&swtpm.tcti()).unwrap();
    tpm.extend_sha256_digest(PCR_CLUSTER_ID, &[0xee; 32])
        .unwrap();
    let before = tpm.read_pcrs_sha256([PCR_CLUSTER_ID]).unwrap()[&PCR_CLUSTER_ID];
    let lock = NodeLock::new();
    let err = lock
        .lock(Owner::JoinClient, cluster_id, |id| mark_tpm(&tpm, id))
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Mark(MarkError::AlreadyExtended { value }) if *value == before),
        "{err:?}"
    );
    assert_eq!(
        hawser_init::platform::error_chain(&err),
        format!(
            "cannot mark the TPM with the cluster ID (PCR 15): PCR 15 already holds {} instead \
             of zeros: something extended it before the node lock, so extending it with the \
             cluster ID would not prove one cluster; the node does not lock",
            hex::encode(before)
        )
    );
    assert_eq!(lock.state(), State::Unlocked);
    assert_eq!(
        tpm.read_pcrs_sha256([PCR_CLUSTER_ID]).unwrap()[&PCR_CLUSTER_ID],
        before,
        "the refused lock did not extend PCR 15"
    );

    // The control: a fresh TPM locks, and PCR 15 is the documented prediction.
    let fresh_swtpm = common::Swtpm::start();
    let fresh = Tpm::open(&fresh_swtpm.tcti()).unwrap();
    lock.lock(Owner::JoinClient, cluster_id, |id| mark_tpm(&fresh, id))
        .unwrap();
    assert_eq!(
        fresh.read_pcrs_sha256([PCR_CLUSTER_ID]).unwrap()[&PCR_CLUSTER_ID],
        cluster_lock_pcr(&cluster_id)
    );
}
