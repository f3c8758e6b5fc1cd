//! The hawser QEMU harness: boots hawser images on the reference platform (q35, OVMF, swtpm)
//! and watches their serial console. The end-to-end tests and `hawser local up` use it.
//!
//! The pieces, in the order a boot uses them:
//! - [`VmConfig`]: what the VM looks like; [`VmConfig::qemu_args`] is the pure function that
//!   turns it into a QEMU command line.
//! - [`build_esp_image`]: a deterministic GPT disk with a FAT EFI System Partition, so OVMF
//!   boots the UKI at `\EFI\BOOT\BOOTX64.EFI` as it would from a real disk (built by
//!   `hawser_image::disk`, which also writes the product disk image: ESP + root + verity;
//!   [`VmConfig::uefi_disk`] boots such an image, read-only, with the serial
//!   [`BOOT_DISK_SERIAL`]).
//! - [`Swtpm`]: the vTPM, one per boot (it exits when QEMU disconnects), with fresh or reused
//!   state; also usable over TCP from the host to provision the TPM before a boot.
//! - [`Vm`]: starts swtpm and QEMU, tails the serial console into timestamped lines
//!   ([`Vm::wait_for_line`]), talks QMP ([`Qmp`]), records a [`Timeline`], and on drop kills
//!   everything it started and removes its temporary files.
//!
//! ```no_run
//! use std::time::Duration;
//! use hawser_harness::{TpmConfig, Vm, VmConfig, format_timeline};
//!
//! let vm = Vm::start(
//!     VmConfig::uefi("target/image/hawser.efi")
//!         .name("node-1")
//!         .tpm(TpmConfig::default())
//!         .fw_cfg_string("quote_nonce", "00112233"),
//! )?;
//! vm.wait_for_marker("kernel started", "Linux version", Duration::from_secs(120))?;
//! vm.wait_for_marker("PID 1 idle", "hawser: boot complete; idle", Duration::from_secs(120))?;
//! vm.shutdown(Duration::from_secs(60))?;
//! print!("{}", format_timeline(&vm.timeline()));
//! # Ok::<(), hawser_harness::QemuError>(())
//! ```
//!
//! Children never outlive the test process: they are killed on drop, and they carry
//! `PR_SET_PDEATHSIG = SIGKILL` for the cases where no destructor runs.
//!
//! # Environment
//! - `HAWSER_QEMU_ACCEL` sets the default accelerator (`tcg` if unset; `kvm` where usable).
//! - `HAWSER_QEMU_KEEP_LOGS=<dir>` keeps every VM's console, QEMU and swtpm logs in `<dir>`
//!   (as `<name>.console.log` etc.), for CI to show after a failure.
//! - `HAWSER_CACHE` (default `~/.cache/hawser`): where the harness's own boot tests
//!   (`tests/harness.rs`, `#[ignore]`d like every QEMU boot) find the kernel and systemd-boot
//!   from the image inputs.
//!
//! Nothing here opens a network: VMs have no NIC unless `extra_args` adds one, and the TCP
//! swtpm listens on 127.0.0.1 only.

mod config;
mod console;
mod error;
mod esp;
pub mod fuzz_seeds;
mod host;
pub mod metadata_server;
mod process;
pub mod provider;
pub mod provider_gce;
mod qmp;
mod swtpm;
mod vm;

pub use config::{
    BOOT_DISK_SERIAL, Boot, Disk, ENV_ACCEL, ENV_KEEP_LOGS, Esp, FW_CFG_PREFIX, FwCfgEntry,
    FwCfgValue, Ovmf, RuntimePaths, TpmConfig, TpmModel, VmConfig, default_accel,
};
pub use error::{Diagnostics, QemuError};
pub use esp::{ESP_TYPE_GUID, EspFile, build_esp_image};
pub use host::{OVMF_CODE, OVMF_VARS, QEMU_BINARY, SWTPM_BINARY, debian_package_for, find_binary};
pub use provider::{ProviderCa, ProviderError, ProvisionedAk};
pub use qmp::{Qmp, QmpMessage, parse_message as parse_qmp_message};
pub use swtpm::{Swtpm, SwtpmOptions, SwtpmTransport};
pub use vm::{LineMatcher, Timeline, Vm};

/// Formats a timeline as aligned `+seconds label` lines, for summaries and benchmarks.
pub fn format_timeline(timeline: &[(String, std::time::Duration)]) -> String {
    timeline
        .iter()
        .map(|(label, at)| format!("{:>9.3}s  {label}\n", at.as_secs_f64()))
        .collect()
}
