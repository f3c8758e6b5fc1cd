//! The PID 1 sequence: bring-up, measurement, the state disk, attestation, boot report, the
//! pivot and the node's services (images with a rootfs), idle, shutdown.
//!
//! ```text
//! /init ─ fds 0-2, console log, panic hook
//!       ─ mounts (/proc first, before the runtime)              [mounts]
//!       ─ tokio current_thread runtime; reaper; SIGTERM/SIGINT/SIGPWR
//!       ─ /proc/cmdline → hawser.* keys, reboot policy, log level [cmdline]
//!       ─ kernel modules in modules.dep order                    [modules]
//!       ─ power button watcher; fw_cfg keys                      [fw-cfg]
//!       ─ network (hawser.net)                                   [net]
//!       ─ wait for the TPM node; open it                         [tpm-wait, tpm-open]
//!       ─ seed the kernel pool from TPM2_GetRandom               [entropy]
//!       ─ PCR 11 before; extend "enter-initrd"; read PCRs 0-23   [measure]
//!       ─ state disk: find, format or open, map, mount           [state-disk-*]
//!         (join-service key: join client races init server, node lock → PCR 15)
//!       ─ AK; quote PCRs 0-23 with the nonce                     [attest]
//!       ─ boot report line; firmware event log line
//!       ─ hawser.root_hash: pivot into the rootfs (PCR 11 ← "leave-initrd"), then
//!         containerd, kubelet, kubeadm once (node.rs)
//!       ─ "hawser: boot complete; idle"
//!       ─ shutdown request → stop processes, unmount, power off
//! ```
//!
//! A shutdown request is honoured at any point, also during the bring-up. Every error of the
//! bring-up is fatal ([`crate::fatal`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::TpmIssuer;
use hawser_attestation::report::EVENT_LOG_MARKER;
use hawser_attestation::tpm::{Tpm, TpmError};
use hawser_measurements::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::attest::{self, Attestation, NonceSource, ReportContext, TpmStepError};
use crate::config::{self, ConfigError, RebootPolicy};
use crate::disk::key::KeySourceKind;
use crate::disk::{self, DiskError};
use crate::enrollment::client::JoinClient;
use crate::enrollment::init_server::{GrantKind, INIT_PORT, Progress};
use crate::enrollment::race::ClusterKeySource;
use crate::enrollment::{
    INSECURE_TRUST_WARNING, JoinServiceTrust, PROVIDER_CA_PATH, join_service_policy,
};
use crate::fatal::{self, fatal, fatal_error};
use crate::modules::{self, ModuleError};
use crate::node;
use crate::platform::fw_cfg::{self, FwCfgError};
use crate::platform::mounts::EARLY_MOUNTS;
use crate::platform::reaper::{self, ChildRegistry};
use crate::platform::syscalls::{LinuxSyscalls, PowerAction, Syscalls};
use crate::platform::timings::PhaseTimer;
use crate::platform::{console, entropy, poll, power_button};
use crate::shutdown::{self, STOP_GRACE, STRAGGLER_KILL_WAIT};

/// How long to wait for the TPM device node: devtmpfs creates it when the TIS/CRB driver has
/// probed, which can lag behind /init on a slow (TCG) VM.
pub const TPM_WAIT: Duration = Duration::from_secs(5);
/// Random bytes credited to the kernel pool (256 bits, a full CRNG seed).
pub const ENTROPY_BYTES: usize = 32;
/// Length of a nonce PID 1 makes itself when fw_cfg gives none.
pub const GENERATED_NONCE_BYTES: usize = 32;

static LINUX: LinuxSyscalls = LinuxSyscalls;

/// A bring-up step that failed. The message reads as the reason of a `FATAL:` line.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot read the kernel command line from /proc/cmdline")]
    ReadCmdline(#[source] io::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Modules(#[from] ModuleError),
    #[error(transparent)]
    FwCfg(#[from] FwCfgError),
    #[error("no TPM device: {} did not appear within {} s", path.display(), waited.as_secs())]
    NoTpm { path: PathBuf, waited: Duration },
    #[error(transparent)]
    Tpm(#[from] TpmStepError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error(transparent)]
    Net(#[from] crate::platform::net::NetError),
    #[error(transparent)]
    JoinSetup(#[from] crate::enrollment::client::JoinSetupError),
    #[error("cannot attest to the join service or the admin: the TPM issuer cannot start")]
    Issuer(#[source] hawser_attestation::IssuerError),
    #[error("cannot pivot into the rootfs")]
    Pivot(#[source] node::PivotError),
    #[error("cannot encode the boot report")]
    Report(#[source] serde_json::Error),
    #[error("a blocking task of the bring-up failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Why the machine goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownRequest {
    Signal(&'static str),
    PowerButton,
}

impl std::fmt::Display for ShutdownRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShutdownRequest::Signal(name) => write!(f, "{name}"),
            ShutdownRequest::PowerButton => f.write_str("the power button"),
        }
    }
}

/// PID 1's entry point. Never returns.
pub fn run() -> ! {
    let mut timer = PhaseTimer::start();
    if std::process::id() != 1 {
        // Someone ran the binary on a workstation: mounting over /dev and powering off would be
        // a very bad surprise. Checked before the panic hook exists, which reboots.
        eprintln!(
            "hawser-init must run as PID 1 (the /init of the hawser initramfs); refusing to start"
        );
        std::process::exit(2);
    }
    console::ensure_std_fds();
    console::open_console();
    fatal::install_panic_hook();
    console::init_tracing();
    info!(
        "hawser {} starting; kernel handed over {:.3} s after boot",
        env!("CARGO_PKG_VERSION"),
        timer.started_at_boottime_ms() / 1e3
    );
    let mut warnings = Vec::new();

    // /proc before the runtime: tokio and the standard library read it.
    let mounted = timer.time("mounts", || {
        shutdown::mount_table().mount_all(&LINUX, &EARLY_MOUNTS)
    });
    if let Err(e) = mounted {
        fatal_error(&e);
    }
    if let Some(warning) = console::attach_kmsg() {
        warn!("{warning}");
        warnings.push(warning);
    }
    if let Err(e) = LINUX.disable_ctrl_alt_del() {
        let warning = format!("cannot route Ctrl-Alt-Del to PID 1 (reboot(RB_DISABLE_CAD): {e})");
        warn!("{warning}");
        warnings.push(warning);
    }

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => fatal(&format!("cannot start the tokio runtime: {e}")),
    };
    runtime.block_on(supervise(timer, warnings));
    fatal("the PID 1 event loop ended");
}

/// Runs the bring-up and then idles; both end only in a shutdown.
async fn supervise(timer: PhaseTimer, warnings: Vec<String>) {
    let registry = ChildRegistry::new();
    tokio::spawn({
        let registry = registry.clone();
        async move {
            if let Err(e) = reaper::run(registry).await {
                fatal(&format!("cannot reap orphaned processes: {e}"));
            }
        }
    });
    let (requests, mut requested) = mpsc::channel(4);
    if let Err(e) = listen_for_signals(&requests) {
        fatal(&format!("cannot install signal handlers: {e}"));
    }

    tokio::select! {
        result = bring_up(timer, warnings, requests.clone(), &registry) => match result {
            Ok(()) => {
                // The bring-up's buffers (image reads, TLS, the initramfs index) are freed:
                // hand the heap's free pages back to the kernel.
                // SAFETY: malloc_trim only walks glibc's own heap under its lock.
                unsafe { libc::malloc_trim(0) };
                info!("boot complete; idle; {}", memory_summary())
            }
            Err(e) => fatal_error(&e),
        },
        Some(request) = requested.recv() => shutdown(request).await,
    }
    match requested.recv().await {
        Some(request) => shutdown(request).await,
        None => fatal("every source of shutdown requests is gone"),
    }
}

/// Turns SIGTERM, SIGINT (also Ctrl-Alt-Del, see [`Syscalls::disable_ctrl_alt_del`]) and SIGPWR
/// into shutdown requests. Must run inside the runtime.
pub fn listen_for_signals(requests: &mpsc::Sender<ShutdownRequest>) -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    for (kind, name) in [
        (SignalKind::terminate(), "SIGTERM"),
        (SignalKind::interrupt(), "SIGINT"),
        (SignalKind::from_raw(libc::SIGPWR), "SIGPWR"),
    ] {
        let mut stream = signal(kind)?;
        let requests = requests.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                let _ = requests.send(ShutdownRequest::Signal(name)).await;
            }
        });
    }
    Ok(())
}

fn watch_power_buttons(requests: &mpsc::Sender<ShutdownRequest>) -> Option<String> {
    let buttons = power_button::find_power_buttons(Path::new("/sys"), Path::new("/dev"));
    if buttons.is_empty() {
        return Some(
            "no ACPI power button input device found; power-button shutdown requests are ignored"
                .to_owned(),
        );
    }
    for button in buttons {
        let requests = requests.clone();
        tokio::spawn(async move {
            match power_button::wait_for_press(&button).await {
                Ok(()) => {
                    let _ = requests.send(ShutdownRequest::PowerButton).await;
                }
                Err(e) => warn!("stopped watching power button {}: {e}", button.display()),
            }
        });
    }
    None
}

/// Stops everything and powers off. Never returns.
async fn shutdown(request: ShutdownRequest) -> ! {
    info!("shutdown requested by {request}");
    // The node's services first, in reverse start order, each given time to stop cleanly.
    node::stop_services().await;
    let stopped = tokio::task::spawn_blocking(|| {
        shutdown::stop_all_processes(
            &LINUX,
            STOP_GRACE,
            STRAGGLER_KILL_WAIT,
            shutdown::processes_left,
            std::thread::sleep,
        )
    })
    .await;
    if let Ok(shutdown::Sweep::Stuck) = stopped {
        warn!("some processes survived SIGKILL; powering off anyway");
    }
    info!("powering off");
    let error = shutdown::power_down(&LINUX, &mut shutdown::mount_table(), PowerAction::PowerOff);
    fatal(&format!("cannot power off: reboot(2) failed: {error}"));
}

/// PID 1's resident memory now and at its peak (`VmRSS`, `VmHWM` of /proc/self/status).
fn memory_summary() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .map_or_else(
                || "?".to_owned(),
                |kib| format!("{:.1} MiB", kib as f64 / 1024.0),
            )
    };
    format!(
        "PID 1 resident memory {} ({} anonymous, {} of its binary and libraries in the freed \
         initramfs, {} other files; peak {})",
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssShmem:"),
        field("RssFile:"),
        field("VmHWM:")
    )
}

/// Runs blocking TPM (or other) work off the event loop.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BootError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(BootError::Task)
}

fn tpm_step(step: &'static str) -> impl FnOnce(TpmError) -> TpmStepError {
    move |source| TpmStepError { step, source }
}

async fn bring_up(
    mut timer: PhaseTimer,
    mut warnings: Vec<String>,
    requests: mpsc::Sender<ShutdownRequest>,
    registry: &ChildRegistry,
) -> Result<(), BootError> {
    // The measured configuration.
    let start = timer.elapsed_ms();
    let cmdline = std::fs::read_to_string("/proc/cmdline").map_err(BootError::ReadCmdline)?;
    let config = match config::parse_kernel_cmdline(&cmdline) {
        Ok(config) => config,
        Err(e) => {
            fatal::set_reboot_policy(config::reboot_policy_or_default(&cmdline));
            return Err(e.into());
        }
    };
    fatal::set_reboot_policy(config.reboot_policy);
    console::set_level(config.log_level);
    if config.reboot_policy == RebootPolicy::HaltForever {
        info!("hawser.reboot_delay=0: a fatal error halts the machine forever");
    }
    for warning in &config.warnings {
        warn!("{warning}");
    }
    warnings.extend(config.warnings.iter().cloned());
    timer.record("cmdline", start);

    let kernel_release = nix::sys::utsname::uname()
        .map(|uts| uts.release().to_string_lossy().into_owned())
        .unwrap_or_default();

    // Kernel modules (decompressing .ko.xz takes a while: off the event loop). An optional
    // module the machine cannot use was logged as a warning; the boot report lists it too.
    let start = timer.elapsed_ms();
    let kernel_modules =
        blocking(|| modules::load_table(&LINUX, hawser_kmod::BOOT_MODULE_TABLE)).await??;
    timer.record("modules", start);
    info!("{kernel_modules}");
    warnings.extend(kernel_modules.skipped.iter().map(ToString::to_string));

    if let Some(warning) = watch_power_buttons(&requests) {
        warn!("{warning}");
        warnings.push(warning);
    }

    // Unmeasured configuration.
    let start = timer.elapsed_ms();
    let mut fw_cfg_entries = fw_cfg::read_entries(Path::new(fw_cfg::FW_CFG_HAWSER_DIR))?;
    let parsed = config::parse_fw_cfg(&fw_cfg_entries);
    // The raw entries may hold key material (the development state disk key).
    fw_cfg_entries
        .values_mut()
        .for_each(zeroize::Zeroize::zeroize);
    let mut fw_cfg = parsed?;
    for warning in &fw_cfg.warnings {
        warn!("{warning}");
    }
    warnings.extend(fw_cfg.warnings.iter().cloned());
    timer.record("fw-cfg", start);

    if let Some(net) = &config.net {
        let start = timer.elapsed_ms();
        let nic = crate::platform::net::bring_up(net).await?;
        timer.record("net", start);
        info!(
            "network: {nic} is {}/{}{}",
            net.address,
            net.prefix_len,
            net.gateway.map(|g| format!(" via {g}")).unwrap_or_default()
        );
    }

    // The TPM.
    let tpm_device = config.tpm_device.clone();
    let start = timer.elapsed_ms();
    wait_for_device(&tpm_device, TPM_WAIT).await?;
    timer.record("tpm-wait", start);

    let start = timer.elapsed_ms();
    let tcti = format!("device:{}", tpm_device.display());
    let tpm = Arc::new(
        blocking(move || Tpm::open(&tcti))
            .await?
            .map_err(tpm_step("open the TPM"))?,
    );
    timer.record("tpm-open", start);

    // Entropy before anything (libcrypto's session nonces) calls a blocking getrandom.
    let start = timer.elapsed_ms();
    let crng_was_ready = entropy::crng_ready();
    let seed = {
        let tpm = Arc::clone(&tpm);
        blocking(move || tpm.get_random(ENTROPY_BYTES)).await?
    }
    .map_err(tpm_step("get random bytes from the TPM"))?;
    if let Err(e) = entropy::add_entropy(&seed) {
        let warning = format!(
            "cannot seed the kernel's random pool: {}",
            crate::platform::error_chain(&e)
        );
        warn!("{warning}");
        warnings.push(warning);
    }
    timer.record("entropy", start);
    info!(
        "seeded the kernel random pool with {ENTROPY_BYTES} bytes from the TPM (CRNG was {}ready before)",
        if crng_was_ready { "" } else { "not " }
    );

    let (nonce, nonce_source) = match fw_cfg.quote_nonce {
        Some(nonce) => (nonce, NonceSource::FwCfg),
        None => {
            let tpm = Arc::clone(&tpm);
            let nonce = blocking(move || tpm.get_random(GENERATED_NONCE_BYTES))
                .await?
                .map_err(tpm_step("get a nonce from the TPM"))?;
            (nonce, NonceSource::Generated)
        }
    };

    let start = timer.elapsed_ms();
    let measurement = {
        let tpm = Arc::clone(&tpm);
        blocking(move || attest::measure_enter_initrd(&tpm)).await??
    };
    timer.record("measure", start);
    info!("measured phase {PHASE_ENTER_INITRD} into PCR {PCR_KERNEL_BOOT}");

    // The race for the node lock, when the state disk key comes from the cluster: the join
    // client (if an endpoint is configured) against the init server (`hawser init`/`recover`).
    let cluster_keys = match config.state_disk.key_source {
        KeySourceKind::JoinService => {
            let issuer = {
                let tpm = Arc::clone(&tpm);
                Arc::new(
                    blocking(move || TpmIssuer::new(tpm))
                        .await?
                        .map_err(BootError::Issuer)?,
                )
            };
            let endpoint = config.join_endpoint.clone().or(fw_cfg.join_endpoint.take());
            let join = match endpoint {
                Some(endpoint) => {
                    let trust = config.join_service_trust;
                    if trust == JoinServiceTrust::InsecureDev {
                        warnings.push(INSECURE_TRUST_WARNING.to_owned());
                    }
                    let policy = {
                        let tpm = Arc::clone(&tpm);
                        blocking(move || {
                            join_service_policy(trust, &tpm, Path::new(PROVIDER_CA_PATH))
                        })
                        .await??
                    };
                    Some(
                        JoinClient::new(endpoint, policy, Arc::clone(&issuer))
                            .control_plane(fw_cfg.control_plane),
                    )
                }
                None => None,
            };
            Some(Arc::new(ClusterKeySource::new(
                join,
                INIT_PORT,
                issuer,
                tokio::runtime::Handle::current(),
                Arc::clone(&tpm),
            )))
        }
        _ => None,
    };

    let disk = disk::bring_up(
        &config.state_disk,
        fw_cfg.state_disk_key.take(),
        cluster_keys
            .clone()
            .map(|k| k as Arc<dyn disk::key::KeySource + Send + Sync>),
        registry,
        timer,
        &mut warnings,
    )
    .await;
    let outcome = cluster_keys.as_ref().and_then(|k| k.take_outcome());
    let mut timer = match disk {
        Ok(timer) => timer,
        Err(e) => {
            // The admin whose request won learns why the node cannot go on.
            if let Some((_, progress)) = outcome.and_then(|o| o.admin) {
                progress.fail(&format!(
                    "the state disk: {}",
                    crate::platform::error_chain(&e)
                ));
            }
            return Err(e.into());
        }
    };
    // What the node does with Kubernetes after the pivot (images with a rootfs).
    let mut role = node::Role::Rejoin;
    let mut node_name = None;
    if let Some(outcome) = outcome {
        match outcome.summary.to_console_line() {
            Ok(line) => console::emit_raw_console_line(&line),
            Err(e) => warn!("cannot encode the join summary: {e}"),
        }
        node_name = Some(crate::enrollment::client::node_name(
            &outcome.summary.disk_uuid,
        ));
        role = match (outcome.admin, outcome.kubeadm) {
            (Some((GrantKind::Init(spec), progress)), _) if config.root_hash.is_some() => {
                // The image's provider CA is in the initramfs, which the pivot frees: read now.
                let provider_ca = std::fs::read_to_string(PROVIDER_CA_PATH).ok();
                node::Role::Init {
                    spec,
                    cluster_id: outcome.cluster_id,
                    progress,
                    join_service: outcome.secrets.zip(provider_ca).map(|(secrets, pem)| {
                        node::InClusterJoinService {
                            secrets,
                            // Read at `enter-initrd`, before the lock: what a fresh node of
                            // this image measures.
                            joiner_measurements: crate::enrollment::fresh_node_measurements_json(
                                &measurement.pcrs,
                            ),
                            provider_ca_pem: pem,
                        }
                    }),
                }
            }
            (Some((kind, progress)), _) => {
                report_to_admin(&kind, progress, outcome.cluster_id);
                node::Role::Rejoin
            }
            (None, Some(ticket)) => node::Role::Join(ticket),
            (None, None) => node::Role::Rejoin,
        };
    }

    // The quote comes after the state disk: the node lock may have extended PCR 15, and the
    // report's PCR values must be the quoted ones.
    let start = timer.elapsed_ms();
    let (measurement, quote) = {
        let nonce = nonce.clone();
        let tpm = Arc::clone(&tpm);
        blocking(move || -> Result<_, TpmStepError> {
            let mut measurement = measurement;
            measurement.pcrs = tpm
                .read_pcrs_sha256(attest::REPORTED_PCRS)
                .map_err(tpm_step("read the sha256 PCR bank"))?;
            let quote = attest::quote_boot(&tpm, &nonce)?;
            Ok((measurement, quote))
        })
        .await??
    };
    timer.record("attest", start);

    let attestation = Attestation {
        nonce,
        nonce_source,
        measurement,
        quote,
    };
    let report = attestation.into_report(ReportContext {
        kernel_release: &kernel_release,
        tpm_device: &tpm_device.display().to_string(),
        timer: &timer,
        warnings,
    });
    let line = report.to_console_line().map_err(BootError::Report)?;
    console::emit_raw_console_line(&line);
    info!(
        "boot report printed ({} bytes); bring-up took {:.1} ms",
        line.len(),
        timer.elapsed_ms()
    );
    emit_event_log();

    if let Some(root_hash) = config.root_hash {
        let state_disk = config.state_disk.disk.is_some();
        let pivoted = node::pivot(root_hash, Arc::clone(&tpm), state_disk).await;
        if let Err(e) = pivoted {
            if let node::Role::Init { progress, .. } = role {
                progress.fail(&format!(
                    "the pivot into the rootfs: {}",
                    crate::platform::error_chain(&e)
                ));
            }
            return Err(BootError::Pivot(e));
        }
        let identity = match (&config.net, node_name) {
            (Some(net), Some(name)) => Some(node::NodeIdentity {
                name,
                ip: std::net::IpAddr::V4(net.address),
            }),
            _ => None,
        };
        match identity {
            Some(identity) => node::run(role, identity, registry).await,
            None => {
                let reason = "no node identity for Kubernetes (needs hawser.net and a cluster \
                              key source): containerd, kubelet and kubeadm are not started";
                warn!("{reason}");
                if let node::Role::Init { progress, .. } = role {
                    progress.fail(reason);
                }
            }
        }
    }
    Ok(())
}

/// Ends the admin's `hawser init` / `hawser recover` call. Kubernetes starts after the pivot
/// into the rootfs; an image without a rootfs has no Kubernetes, so no kubeconfig to return.
fn report_to_admin(kind: &GrantKind, progress: Progress, cluster_id: [u8; 32]) {
    match kind {
        GrantKind::Init(spec) => info!(
            "cluster {:?} ({}) initialized on this node: the state disk is ready; this image has \
             no rootfs, so Kubernetes is not started and there is no kubeconfig",
            spec.cluster_name,
            hex::encode(cluster_id)
        ),
        GrantKind::Recover => info!(
            "node recovered into cluster {}: the state disk is open",
            hex::encode(cluster_id)
        ),
    }
    progress.succeed(cluster_id, Vec::new());
}

/// Where the kernel exposes the firmware's TCG event log (securityfs, mounted at bring-up).
const EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// Prints the firmware's TCG event log as one console line, so a host can explain PCR values
/// that differ from the prediction. Unmeasured diagnostics: nothing trusts it without replaying
/// it against the quoted PCRs. A direct-kernel boot has no firmware and no log.
fn emit_event_log() {
    use base64::Engine as _;
    match std::fs::read(EVENT_LOG) {
        Ok(log) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&log);
            console::emit_raw_console_line(&format!("{EVENT_LOG_MARKER}{encoded}"));
            info!("firmware event log printed ({} bytes)", log.len());
        }
        Err(e) => info!("no firmware event log at {EVENT_LOG} ({e}); not a UEFI boot"),
    }
}

/// Waits until `path` exists (devtmpfs creates TPM nodes when the driver probes).
pub async fn wait_for_device(path: &Path, limit: Duration) -> Result<(), BootError> {
    if poll::wait_for_path(path, limit, Duration::from_millis(10)).await {
        return Ok(());
    }
    Err(BootError::NoTpm {
        path: path.to_owned(),
        waited: limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_missing_tpm_is_reported_with_its_path_after_the_wait() {
        let err = wait_for_device(Path::new("/dev/tpm-does-not-exist"), TPM_WAIT)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no TPM device: /dev/tpm-does-not-exist did not appear within 5 s"
        );
    }

    #[tokio::test]
    async fn an_existing_device_is_found_at_once() {
        let file = tempfile::NamedTempFile::new().unwrap();
        wait_for_device(file.path(), Duration::ZERO).await.unwrap();
    }
}
