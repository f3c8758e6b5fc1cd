//! The harness itself against real processes: OVMF boots systemd-boot and the kernel from an
//! ESP with a TPM, QEMU is driven over QMP, a kernel panic ends a wait early with the console's
//! tail, a QEMU that cannot start is reported with its stderr, dropping a VM kills QEMU and
//! swtpm and keeps the logs asked for, and a TCP swtpm serves tpm2-tools and keeps its state.
//!
//! The guest is the trixie cloud kernel from the image inputs (`hawser image fetch`), without an
//! initramfs: it boots to "VFS: Unable to mount root fs" and panics, which is enough to see
//! firmware, ESP, boot loader, kernel, TPM and console work together. With `panic=-1` the panic
//! reboots, and `-no-reboot` turns that into a QEMU exit. A missing input or tool fails a test,
//! naming what to run or install; none skips.
//!
//! The QEMU boots are `#[ignore]`d in plain `cargo test` (seconds to a minute each under TCG):
//! `cargo test -p hawser-qemu --test harness -- --ignored --test-threads=1`. The swtpm test
//! boots nothing and runs with the unit tests.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_harness::{
    Esp, EspFile, QemuError, Swtpm, SwtpmOptions, TpmConfig, TpmModel, Vm, VmConfig,
    format_timeline,
};
use hawser_image::test_support;

/// Generous: two TCG guests may boot at once on two host cores.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// The image's inputs as `inputs.lock` pins them and `hawser image fetch` unpacked them
/// (never another version left in the cache, nor another distribution's package).
fn inputs() -> hawser_image::inputs::FetchedInputs {
    let lock_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
    let lock = hawser_image::inputs::InputLock::load(&lock_path)
        .unwrap_or_else(|e| panic!("{}: {e}", lock_path.display()));
    hawser_image::inputs::cached(&lock, &hawser_image::inputs::cache_dir()).unwrap_or_else(|e| {
        panic!(
            "the image inputs of inputs.lock: {e}: {}",
            test_support::FETCH_INPUTS
        )
    })
}

fn kernel() -> PathBuf {
    inputs().kernel_image
}

fn systemd_boot() -> PathBuf {
    inputs().stub.with_file_name("systemd-bootx64.efi")
}

/// An ESP on which systemd-boot boots the kernel with `options` at once (timeout 0).
fn systemd_boot_esp(dir: &Path, options: &str) -> Esp {
    let loader_conf = dir.join("loader.conf");
    std::fs::write(&loader_conf, "timeout 0\ndefault hawser.conf\n").expect("write loader.conf");
    let entry = dir.join("hawser.conf");
    std::fs::write(
        &entry,
        format!("title hawser harness test\nlinux /vmlinuz\noptions {options}\n"),
    )
    .expect("write entry");
    Esp::Files(vec![
        EspFile::default_boot_loader(systemd_boot()),
        EspFile::new("loader/loader.conf", loader_conf),
        EspFile::new("loader/entries/hawser.conf", entry),
        EspFile::new("vmlinuz", kernel()),
    ])
}

#[test]
#[ignore = "boots QEMU: cargo test -p hawser-qemu --test harness -- --ignored"]
fn uefi_boots_systemd_boot_and_the_kernel_from_the_esp_with_a_tpm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = VmConfig::uefi_with_esp(systemd_boot_esp(dir.path(), "console=ttyS0 panic=-1"))
        .name("uefi-smoke")
        .tpm(TpmConfig::default());
    let vm = Vm::start(config).expect("start VM");

    // OVMF found the ESP on the GPT disk and started its removable-media boot loader.
    vm.wait_for_marker(
        "OVMF starts the ESP boot loader",
        "BdsDxe: starting Boot",
        BOOT_TIMEOUT,
    )
    .expect("OVMF boots the ESP");
    // systemd-boot passed the entry's command line to the kernel.
    vm.wait_for_marker("kernel started", "Linux version 6.", BOOT_TIMEOUT)
        .expect("kernel starts");
    let cmdline = vm
        .wait_for_line("Command line:", BOOT_TIMEOUT)
        .expect("kernel prints its command line");
    assert!(cmdline.contains("console=ttyS0 panic=-1"), "{cmdline}");
    // The firmware measured the boot into the TPM: it hands the kernel its event logs.
    let efi_tables = vm
        .wait_for_line(
            |line: &str| line.contains("efi: ") && line.contains("ACPI="),
            BOOT_TIMEOUT,
        )
        .expect("kernel lists the EFI configuration tables");
    for table in ["TPMEventLog=", "TPMFinalLog="] {
        assert!(
            efi_tables.contains(table),
            "no {table} from OVMF: {efi_tables}"
        );
    }
    assert_eq!(vm.query_status().expect("query-status"), "running");

    vm.wait_for_marker(
        "kernel panics without a root fs",
        "VFS: Unable to mount root fs",
        BOOT_TIMEOUT,
    )
    .expect("kernel reaches the root mount");
    let status = vm
        .wait_for_exit(Duration::from_secs(60))
        .expect("panic=-1 reboots, -no-reboot exits");
    assert!(status.success(), "QEMU exit status {status}");
    assert!(
        vm.swtpm()
            .is_some_and(|swtpm| swtpm.wait_exit(Duration::from_secs(5))),
        "swtpm outlived QEMU"
    );
    eprintln!("UEFI boot timeline:\n{}", format_timeline(&vm.timeline()));
}

#[test]
#[ignore = "boots QEMU: cargo test -p hawser-qemu --test harness -- --ignored"]
fn direct_kernel_boot_reaches_the_kernel_and_quits_over_qmp() {
    let config = VmConfig::direct_kernel(kernel(), None, "console=ttyS0 panic=0")
        .name("direct-smoke")
        .tpm(TpmConfig {
            model: TpmModel::Tis,
            state_dir: None,
        })
        .fw_cfg_string("quote_nonce", "00112233");
    let vm = Vm::start(config).expect("start VM");
    vm.wait_for_marker("kernel started", "Linux version 6.", BOOT_TIMEOUT)
        .expect("kernel starts");
    assert_eq!(vm.query_status().expect("query-status"), "running");
    vm.powerdown().expect("QEMU accepts system_powerdown");
    vm.quit().expect("quit");
    let status = vm
        .wait_for_exit(Duration::from_secs(30))
        .expect("QEMU exits on quit");
    assert!(status.success(), "QEMU exit status {status}");
    let timeline = vm.timeline();
    let labels: Vec<&str> = timeline.iter().map(|(label, _)| label.as_str()).collect();
    for expected in [
        "swtpm ready",
        "QEMU started",
        "first console output",
        "kernel started",
        "QEMU exited",
    ] {
        assert!(
            labels.contains(&expected),
            "{expected} missing from {labels:?}"
        );
    }
    assert!(
        timeline.windows(2).all(|pair| pair[0].1 <= pair[1].1),
        "{timeline:?}"
    );
    eprintln!("direct kernel timeline:\n{}", format_timeline(&timeline));
}

#[test]
#[ignore = "boots QEMU: cargo test -p hawser-qemu --test harness -- --ignored"]
fn a_kernel_panic_fails_the_wait_early_with_the_console_tail() {
    // No panic=: the kernel hangs after panicking; only the fail pattern can end the wait early.
    let config = VmConfig::direct_kernel(kernel(), None, "console=ttyS0").name("panic-smoke");
    let vm = Vm::start(config).expect("start VM");
    let started = Instant::now();
    let error = vm
        .wait_for_line("hawser: boot complete", BOOT_TIMEOUT)
        .expect_err("the kernel cannot reach /init without an initramfs");
    assert!(
        started.elapsed() < BOOT_TIMEOUT,
        "waited for the timeout instead of failing early"
    );
    let QemuError::ConsoleFailure { line, .. } = &error else {
        panic!("expected a console failure, got {error}");
    };
    assert!(line.contains("VFS: Unable to mount root fs"), "{line}");
    let message = error.to_string();
    assert!(message.contains("\"hawser: boot complete\""), "{message}");
    assert!(message.contains("last 40 console lines"), "{message}");
    assert!(message.contains("--- QEMU output"), "{message}");
}

#[test]
#[ignore = "boots QEMU: cargo test -p hawser-qemu --test harness -- --ignored"]
fn qemu_that_cannot_start_is_reported_with_its_stderr() {
    let mut config = VmConfig::direct_kernel(kernel(), None, "console=ttyS0").name("bad-args");
    config.extra_args = vec!["-device".into(), "no-such-device-model".into()];
    let vm = Vm::start(config).expect("QEMU is spawned");
    let error = vm
        .wait_for_line("Linux version", Duration::from_secs(30))
        .expect_err("QEMU must refuse the device");
    assert!(matches!(error, QemuError::QemuExited { .. }), "{error}");
    assert!(
        error.to_string().contains("no-such-device-model"),
        "{error}"
    );
}

#[derive(Clone, Default)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
#[ignore = "boots QEMU: cargo test -p hawser-qemu --test harness -- --ignored"]
fn drop_kills_qemu_and_swtpm_removes_the_workdir_and_keeps_logs() {
    let logs = tempfile::tempdir().expect("tempdir");
    let echo = SharedBuffer::default();
    let config = VmConfig::direct_kernel(kernel(), None, "console=ttyS0")
        .name("teardown")
        .tpm(TpmConfig::default())
        .keep_logs_in(logs.path());
    let vm = Vm::start_echoing(config, Box::new(echo.clone())).expect("start VM");
    vm.wait_for_line("Linux version", BOOT_TIMEOUT)
        .expect("kernel starts");
    let qemu_pid = vm.pid();
    let swtpm_pid = vm.swtpm().expect("swtpm").pid();
    let workdir = vm.workdir().to_path_buf();
    drop(vm);
    for pid in [qemu_pid, swtpm_pid] {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "));
        assert!(!alive, "process {pid} survived the VM");
    }
    assert!(!workdir.exists(), "{} was not removed", workdir.display());
    let kept = std::fs::read_to_string(logs.path().join("teardown.console.log"))
        .expect("kept console log");
    assert!(kept.contains("Linux version"), "kept log lacks the boot");
    assert!(logs.path().join("teardown.qemu.log").exists());
    assert!(logs.path().join("teardown.swtpm.log").exists());
    let echoed = String::from_utf8(echo.0.lock().expect("lock").clone()).expect("utf-8");
    assert!(
        echoed.contains("Linux version"),
        "echo missed the boot: {echoed}"
    );
}

/// `tpm2_*` from tpm2-tools against the TCP swtpm.
fn tpm2_tool(tcti: &str, args: &[&str]) -> std::process::Output {
    let tool = test_support::require_tool(args[0], "tpm2-tools");
    std::process::Command::new(&tool)
        .args(&args[1..])
        .env("TPM2TOOLS_TCTI", tcti)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tool.display()))
}

#[test]
fn tcp_swtpm_serves_the_swtpm_tcti_and_its_state_dir_survives_a_restart() {
    let state = tempfile::tempdir().expect("tempdir");
    const INDEX: &str = "0x1500016";
    {
        let swtpm =
            Swtpm::start(&SwtpmOptions::tcp().with_state_dir(state.path())).expect("start swtpm");
        let tcti = swtpm.tcti().expect("tcti");
        assert!(tcti.starts_with("swtpm:host=127.0.0.1,port="), "{tcti}");
        let output = tpm2_tool(&tcti, &["tpm2_getrandom", "--hex", "8"]);
        assert!(
            output.status.success(),
            "getrandom: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            output.stdout.len(),
            16,
            "{:?}",
            String::from_utf8_lossy(&output.stdout)
        );
        let output = tpm2_tool(
            &tcti,
            &[
                "tpm2_nvdefine",
                INDEX,
                "-C",
                "o",
                "-s",
                "8",
                "-a",
                "ownerread|ownerwrite",
            ],
        );
        assert!(
            output.status.success(),
            "nvdefine: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert!(
        state.path().join("tpm2-00.permall").exists(),
        "no TPM state written"
    );
    // The same state: the NV index is still defined.
    let swtpm =
        Swtpm::start(&SwtpmOptions::tcp().with_state_dir(state.path())).expect("restart swtpm");
    let output = tpm2_tool(&swtpm.tcti().expect("tcti"), &["tpm2_nvreadpublic", INDEX]);
    assert!(
        output.status.success(),
        "nvreadpublic after restart: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A fresh TPM does not have it: the check above can fail.
    let fresh = Swtpm::start(&SwtpmOptions::tcp()).expect("fresh swtpm");
    let output = tpm2_tool(&fresh.tcti().expect("tcti"), &["tpm2_nvreadpublic", INDEX]);
    assert!(!output.status.success(), "a fresh TPM has the index");
}
