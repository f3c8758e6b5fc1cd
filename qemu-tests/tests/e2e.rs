//! End-to-end tests: build the real image and boot it in QEMU with swtpm.
//!
//! They take minutes under TCG, so they are `#[ignore]`d in plain `cargo test` and run by
//! `scripts/test` (`cargo test -p hawser-qemu --test e2e -- --ignored --test-threads=1`).
//! The image is built once per run and shared by every boot; each boot costs ~10 s (direct
//! kernel) or ~25 s (OVMF + UKI) of wall time. That the same tree built in another directory
//! gives the same bytes is `scripts/check-reproducible-node`'s (the node image's UKI carries
//! this one's initramfs and PID 1).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport};
use hawser_harness::{TpmConfig, Vm, VmConfig, format_timeline};
use hawser_image::build::BuildOutput;
use sha2::{Digest, Sha256};

mod common;
use common::build_image;

fn scratch(name: &str) -> PathBuf {
    common::scratch("e2e", name)
}

/// Generous: TCG on a loaded 2-core CI machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// The image under test, built once from this workspace with the default measured cmdline.
fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(&scratch("image"), None))
}

fn random_nonce() -> [u8; 32] {
    let mut nonce = [0u8; 32];
    let bytes = std::fs::read("/proc/sys/kernel/random/uuid").unwrap_or_default();
    let seed = Sha256::digest([bytes.as_slice(), &std::process::id().to_le_bytes()].concat());
    nonce.copy_from_slice(&seed);
    nonce
}

/// The whole measured chain: OVMF → UKI → Linux → hawser PID 1 with a TPM, the boot report's
/// quote verified on the host against the nonce we passed in through fw_cfg, then an ACPI
/// power-off that PID 1 carries out in order.
/// A user's own plain QEMU line: q35, OVMF, a TPM, and no `-cpu`, so TCG's default CPU model
/// (qemu64, without AES-NI; docs/qemu.md). PID 1 skips `aesni_intel` with a warning, dm-crypt
/// keeps its generic AES, and the boot goes on to a verified quote and a clean power-off.
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn uefi_boot_reports_a_verified_quote_and_powers_off_cleanly() {
    let image = image();
    let nonce = random_nonce();
    let mut config = VmConfig::uefi(&image.uki.path)
        .name("e2e-uefi")
        .tpm(TpmConfig::default())
        .fw_cfg_string("quote_nonce", hex::encode(nonce));
    config.cpu_model = None;
    let vm = Vm::start(config).expect("start VM");

    let line = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("no boot report: {e}"));
    let report = BootReport::find_in_console(&line)
        .expect("marker present")
        .expect("the boot report is valid JSON");
    let verified = report
        .verify(Some(&nonce))
        .unwrap_or_else(|e| panic!("the boot report does not verify: {e}"));

    assert_eq!(
        report.nonce_source, "fw_cfg",
        "the host's nonce must be the one quoted"
    );
    assert_eq!(report.phases_extended, ["enter-initrd"]);
    assert_eq!(report.tpm_device, "/dev/tpmrm0");
    let aesni = report
        .warnings
        .iter()
        .find(|w| w.contains("aesni_intel"))
        .unwrap_or_else(|| {
            panic!(
                "no warning about aesni_intel on a CPU without AES-NI: {:?}",
                report.warnings
            )
        });
    assert!(
        aesni.contains("AES-NI") && aesni.contains("generic AES"),
        "the warning says what the VM lacks and what dm-crypt falls back to: {aesni}"
    );
    assert_eq!(report.kernel_release, image.kernel_release);
    // Firmware, the Linux EFI stub and systemd-stub all measured something: a UEFI boot.
    for pcr in [0u8, 4, 9, 11] {
        assert_ne!(
            verified.pcrs[&pcr], [0u8; 32],
            "PCR {pcr} is zero: not a measured UEFI boot"
        );
    }
    // systemd-stub measured the UKI's sections before hawser's phase word.
    assert_ne!(
        verified.pcr11_before_phase, [0u8; 32],
        "systemd-stub measured nothing into PCR 11"
    );
    for phase in ["mounts", "modules", "tpm"] {
        assert!(
            report.timings.iter().any(|t| t.name.contains(phase)),
            "no {phase} timing in {:?}",
            report.timings
        );
    }

    vm.wait_for_line("boot complete", Duration::from_secs(30))
        .expect("PID 1 reaches idle");
    vm.powerdown().expect("ACPI power button");
    vm.wait_for_line("powering off", Duration::from_secs(60))
        .expect("PID 1 shuts down on the ACPI power button");
    let status = vm
        .wait_for_exit(Duration::from_secs(60))
        .expect("QEMU exits after power-off");
    assert!(status.success(), "QEMU exit status {status}");
    let console = vm.console_lines().join("\n");
    assert!(
        !console.contains("FATAL"),
        "fatal error during boot:\n{console}"
    );
    assert!(
        !console.contains("Kernel panic"),
        "kernel panic:\n{console}"
    );
    eprintln!("timeline:\n{}", format_timeline(&vm.timeline()));
}

/// Bad input, in one fast direct-kernel boot: an unknown key is a warning, and a missing TPM is
/// a fatal error that names the device; with `hawser.reboot_delay=0` PID 1 halts instead of
/// rebooting, and it never panics the kernel.
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn no_tpm_is_fatal_and_names_the_device_unknown_keys_warn() {
    let image = image();
    let cmdline = "console=ttyS0 quiet hawser.reboot_delay=0 hawser.frobnicate=1";
    let vm = Vm::start(
        VmConfig::direct_kernel(&image.kernel.path, Some(image.initrd.path.clone()), cmdline)
            .name("e2e-no-tpm"),
    )
    .expect("start VM");
    let warning = vm
        .wait_for_line("hawser.frobnicate", BOOT_TIMEOUT)
        .expect("unknown key is reported");
    assert!(
        warning.contains("warning") && !warning.contains("FATAL"),
        "an unknown key must be a warning, not fatal: {warning}"
    );
    let fatal = vm
        .wait_for_line("FATAL", BOOT_TIMEOUT)
        .expect("missing TPM is fatal");
    assert!(
        fatal.contains("/dev/tpmrm0"),
        "the fatal error must name the device: {fatal}"
    );
    vm.wait_for_line("halt", Duration::from_secs(30))
        .expect("reboot_delay=0 halts for debugging");
    assert!(
        vm.exit_status().is_none(),
        "a halted node stays up for inspection"
    );
}

/// A malformed value of a measured key is fatal, and the reboot policy is applied: the VM
/// reboots (QEMU runs with -no-reboot, so it exits) after the configured delay.
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn malformed_value_is_fatal_then_reboots_by_policy() {
    let image = image();
    let cmdline = "console=ttyS0 quiet hawser.reboot_delay=2 hawser.log=loudest";
    let vm = Vm::start(
        VmConfig::direct_kernel(&image.kernel.path, Some(image.initrd.path.clone()), cmdline)
            .name("e2e-malformed"),
    )
    .expect("start VM");
    let fatal = vm
        .wait_for_line("FATAL", BOOT_TIMEOUT)
        .expect("malformed value is fatal");
    assert!(
        fatal.contains("hawser.log") && fatal.contains("loudest"),
        "the error names key and value: {fatal}"
    );
    let status = vm
        .wait_for_exit(Duration::from_secs(60))
        .expect("the VM reboots after the delay (QEMU -no-reboot exits)");
    assert!(status.success(), "QEMU exit status {status}");
}
