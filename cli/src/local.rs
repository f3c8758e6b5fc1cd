//! `hawser local …`: boot the image on the local reference platform (QEMU + OVMF + swtpm),
//! show the console live, verify the boot report on the host, and power off on request.
//!
//! `local up` runs in the foreground and owns the VM: Ctrl-C, SIGTERM, or `hawser local down`
//! (which sends SIGTERM to the process recorded in the state file) press the VM's ACPI power
//! button and wait for PID 1's orderly shutdown. The harness kills QEMU and swtpm on every exit
//! path, so nothing is left running.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Subcommand;
use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, VerifiedReport};
use hawser_image::inputs;
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_qemu::{TpmConfig, Vm, VmConfig, format_timeline};

#[derive(Subcommand)]
pub enum LocalCommand {
    /// Build the image (unless --image is given) and boot it in QEMU with a software TPM.
    Up {
        /// Boot this hawser.efi instead of building one.
        #[arg(long)]
        image: Option<PathBuf>,
        /// Where to build the image.
        #[arg(long, default_value = "out")]
        out: PathBuf,
        /// QEMU accelerator (tcg, kvm); default: $HAWSER_QEMU_ACCEL or tcg.
        #[arg(long)]
        accel: Option<String>,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 1024)]
        memory: u32,
        /// Do not echo the serial console (the boot report summary is still printed).
        #[arg(long)]
        quiet: bool,
        /// Power off once the boot report has been verified, instead of waiting for Ctrl-C.
        #[arg(long)]
        once: bool,
    },
    /// Power off the VM started by `hawser local up`.
    Down,
}

/// Records which `local up` process owns the running VM.
fn state_file() -> PathBuf {
    inputs::cache_dir().join("local/up.pid")
}

pub fn run(cmd: LocalCommand) -> anyhow::Result<()> {
    match cmd {
        LocalCommand::Up {
            image,
            out,
            accel,
            memory,
            quiet,
            once,
        } => up(image, out, accel, memory, quiet, once),
        LocalCommand::Down => down(),
    }
}

fn down() -> anyhow::Result<()> {
    let path = state_file();
    let pid: i32 = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("no local VM is running (no {})", path.display()))?;
    let pid = nix::unistd::Pid::from_raw(pid);
    if nix::sys::signal::kill(pid, None).is_err() {
        let _ = std::fs::remove_file(&path);
        bail!("no local VM is running (process {pid} is gone)");
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .with_context(|| format!("signalling `hawser local up` (pid {pid})"))?;
    println!("asked `hawser local up` (pid {pid}) to power the VM off");
    Ok(())
}

fn up(
    image: Option<PathBuf>,
    out: PathBuf,
    accel: Option<String>,
    memory: u32,
    quiet: bool,
    once: bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let uki = match image {
        Some(uki) => uki,
        None => {
            let ws = crate::image::workspace()?;
            eprintln!("building the image into {} …", out.display());
            let (output, timeline) = pipeline::build_image(&PipelineOptions::new(&ws, &out))?;
            eprintln!("{output}");
            eprintln!(
                "built in {:.1}s",
                timeline
                    .steps
                    .iter()
                    .map(|(_, d)| d.as_secs_f64())
                    .sum::<f64>()
            );
            output.uki.path
        }
    };
    if !uki.is_file() {
        bail!(
            "{} does not exist: build it with `hawser image build`",
            uki.display()
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }

    let nonce: [u8; 32] = rand_nonce()?;
    let mut config = VmConfig::uefi(&uki)
        .name("hawser-local")
        .memory_mib(memory)
        .tpm(TpmConfig::default())
        .fw_cfg_string("quote_nonce", hex::encode(nonce));
    if let Some(accel) = accel {
        config = config.accel(accel);
    }
    eprintln!(
        "booting {} in QEMU ({}, OVMF, swtpm); Ctrl-C powers it off",
        uki.display(),
        config.accel
    );
    let vm = if quiet {
        Vm::start(config)?
    } else {
        Vm::start_echoing(config, Box::new(ConsoleEcho))?
    };
    let state = state_file();
    if let Some(dir) = state.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&state, std::process::id().to_string())?;
    let _state_guard = RemoveOnDrop(state);

    let line = wait_or_stop(&vm, BOOT_REPORT_MARKER, Duration::from_secs(600), &stop)?;
    let Some(line) = line else {
        return power_off(&vm, "interrupted before the boot report");
    };
    let report = BootReport::find_in_console(&line)
        .context("boot report marker without a report")?
        .context("the boot report is not valid JSON")?;
    match report.verify(Some(&nonce)) {
        Ok(verified) => print_summary(&report, &verified, &vm, started),
        Err(e) => {
            eprintln!("\nBOOT REPORT DOES NOT VERIFY: {e}");
            power_off(&vm, "verification failed")?;
            bail!("the boot report did not verify: {e}");
        }
    }
    if once {
        return power_off(&vm, "--once");
    }
    eprintln!("node is up; Ctrl-C or `hawser local down` powers it off");
    while !stop.load(Ordering::Relaxed) {
        if let Some(status) = vm.exit_status() {
            bail!(
                "QEMU exited on its own ({status}); console log: {}",
                vm.console_log_path().display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    power_off(&vm, "requested")
}

/// Waits for `marker`, returning `None` if a stop signal arrives first.
fn wait_or_stop(
    vm: &Vm,
    marker: &str,
    timeout: Duration,
    stop: &AtomicBool,
) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match vm.wait_for_marker(marker, marker, Duration::from_millis(500)) {
            Ok(line) => return Ok(Some(line)),
            Err(hawser_qemu::QemuError::Timeout { .. }) if Instant::now() < deadline => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn power_off(vm: &Vm, why: &str) -> anyhow::Result<()> {
    eprintln!("\npowering off ({why}): ACPI power button …");
    let t = Instant::now();
    vm.powerdown().context("pressing the ACPI power button")?;
    let status = vm
        .wait_for_exit(Duration::from_secs(90))
        .context("the VM did not power off within 90 s (it is killed now)")?;
    eprintln!(
        "VM powered off in {:.1}s ({status})",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn print_summary(report: &BootReport, verified: &VerifiedReport, vm: &Vm, started: Instant) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n── boot report ─────────────────────────────────────────────"
    );
    let _ = writeln!(
        out,
        "hawser {} on Linux {} · TPM {}",
        report.hawser_version, report.kernel_release, report.tpm_device
    );
    let _ = writeln!(
        out,
        "quote VERIFIED: ECDSA P-256 signature by AK {}…, nonce from the host, PCR digest, PCR 11 = … ⊕ enter-initrd",
        &hex::encode(verified.quote.ak_fingerprint)[..16]
    );
    for (pcr, value) in &verified.pcrs {
        if *value != [0u8; 32] {
            let _ = writeln!(out, "  PCR {pcr:>2}  {}", hex::encode(value));
        }
    }
    let _ = writeln!(out, "  (PCRs not listed are zero)");
    let _ = writeln!(
        out,
        "PID 1 phases (ms since /init; kernel reached /init at {:.0} ms):",
        report.init_started_at_ms
    );
    for t in &report.timings {
        let _ = writeln!(
            out,
            "  {:>8.1} +{:>7.1}  {}",
            t.start_ms, t.duration_ms, t.name
        );
    }
    for w in &report.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "host timeline (wall clock since QEMU start):");
    let _ = write!(out, "{}", format_timeline(&vm.timeline()));
    let _ = writeln!(
        out,
        "total since `hawser local up`: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

fn rand_nonce() -> anyhow::Result<[u8; 32]> {
    use std::io::Read as _;
    let mut nonce = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut nonce))
        .context("reading /dev/urandom")?;
    Ok(nonce)
}

/// Echoes console lines to stderr, dimmed, so the summary on stdout stands out.
struct ConsoleEcho;

impl std::io::Write for ConsoleEcho {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::io::IsTerminal as _;
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            err.write_all(b"\x1b[2m")?;
            err.write_all(buf)?;
            err.write_all(b"\x1b[0m")?;
        } else {
            err.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
