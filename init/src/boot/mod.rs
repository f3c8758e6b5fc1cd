//! The PID 1 sequence: bring-up, measurement, the state disk, attestation, boot report, the
//! pivot and the node's services (images with a rootfs), idle, shutdown.
//!
//! ```text
//! /init ─ fds 0-2, console log, panic hook
//!       ─ mounts (/proc first, before the runtime)              [mounts]
//!       ─ tokio current_thread runtime; reaper; SIGTERM/SIGINT/SIGPWR
//!       ─ /proc/cmdline → hawser.* keys, reboot policy, log level [cmdline]
//!       ─ kernel modules in modules.dep order, on a thread of their own, in three stages
//!         awaited where they are needed: the NIC's, the state disk's, the mesh's and the
//!         rootfs's                  [modules-network, modules-background, modules-after-state-disk]
//!       ─ wait for the TPM node; open it                         [tpm-wait, tpm-open]
//!       ─ seed the kernel pool from TPM2_GetRandom               [entropy]
//!       ─ PCR 11 before; extend "enter-initrd"; read PCRs 0-23   [measure]
//!       ─ (the NIC's modules) fw_cfg keys                        [fw-cfg]
//!       ─ network (hawser.net)                                   [net]
//!       ─ the attestation key and its provider certificate       [attestation-key]
//!       ─ (the state disk's modules) power button watcher (with a rootfs: after the pivot,
//!         or from the initramfs if the bring-up still waits 10 s later)
//!       ─ state disk: find, format or open, map, mount           [state-disk-*]
//!         (join-service key: join client races init server, node lock → PCR 15;
//!         a first boot keeps its one-time grants before the "initialized" mark)
//!       ─ (the mesh's and the rootfs's modules)
//!       ─ the WireGuard mesh, when the ticket has one: key, tunnel [mesh]
//!       ─ quote PCRs 0-23 with the nonce                         [attest]
//!       ─ boot report line; firmware event log line
//!       ─ hawser.root_hash: pivot into the rootfs (PCR 11 ← ["control-plane",] "leave-initrd":
//!         the marker for a node holding its cluster's master secret, `pivot_role.rs`), then
//!         the rootfs's kubernetes.json checked against hawser.kubernetes, containerd, the
//!         image's control-plane images                          [images-import]
//!         kubelet, kubeadm once (kube/)
//!       ─ "hawser: boot complete; idle"
//!       ─ shutdown request → stop processes, unmount, power off
//! ```
//!
//! A shutdown request is honoured at any point, also during the bring-up. Every error of the
//! bring-up is fatal ([`crate::fatal`]).
//!
//! `bring_up` is the script; each phase is one method of the [`Boot`] context (`context.rs`),
//! which owns the phase timer, the warnings for the boot report, the child registry, the TPM,
//! the mount table and the node's services (the shutdown stops and unmounts through clones of
//! those two handles): the phases before the state disk in `phases.rs`, the state disk's
//! prepare → race → apply in `state_disk.rs`, the report and the node in `after_disk.rs`.

mod after_disk;
mod cloud;
mod context;
mod phases;
mod pivot_role;
mod state_disk;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

pub use self::context::{Boot, Warnings};
pub use self::phases::wait_for_device;
use crate::attest::TpmStepError;
use crate::config::ConfigError;
use crate::disk::DiskError;
use crate::enrollment::race::EnrollmentError;
use crate::fatal::{self, fatal, fatal_error};
use crate::kube;
use crate::modules::ModuleError;
use crate::platform::console;
use crate::platform::error_chain;
use crate::platform::fw_cfg::FwCfgError;
use crate::platform::mounts::{EARLY_MOUNTS, SharedMountTable};
use crate::platform::reaper::{self, ChildRegistry};
use crate::platform::rebase;
use crate::platform::syscalls::{LinuxSyscalls, PowerAction, Syscalls};
use crate::platform::timings::PhaseTimer;
use crate::shutdown::{self, STOP_GRACE, STRAGGLER_KILL_WAIT};
use crate::supervisor::SharedSupervisor;

/// How long to wait for the TPM device node: devtmpfs creates it when the TIS/CRB driver has
/// probed, which can lag behind /init on a slow (TCG) VM.
pub const TPM_WAIT: Duration = Duration::from_secs(5);
/// Random bytes credited to the kernel pool (256 bits, a full CRNG seed).
pub const ENTROPY_BYTES: usize = 32;
/// Length of a nonce PID 1 makes itself when fw_cfg gives none.
pub const GENERATED_NONCE_BYTES: usize = 32;

/// The real syscalls: a unit struct with no state, named once for the phases to borrow.
static LINUX: LinuxSyscalls = LinuxSyscalls;

/// A bring-up step that failed. The message reads as the reason of a `FATAL:` line.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// /proc/cmdline cannot be read (procfs is not mounted).
    #[error("cannot read the kernel command line from /proc/cmdline")]
    ReadCmdline(#[source] io::Error),
    /// The measured command line has a malformed or contradictory `hawser.*` key.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A required kernel module cannot be loaded.
    #[error(transparent)]
    Modules(#[from] ModuleError),
    /// fw_cfg's `opt/hawser/` directory cannot be read.
    #[error(transparent)]
    FwCfg(#[from] FwCfgError),
    /// The TPM's device node did not appear (no TPM attached, or its driver is missing).
    #[error("no TPM device: {} did not appear within {} s", path.display(), waited.as_secs())]
    NoTpm { path: PathBuf, waited: Duration },
    /// A phase asked for the TPM before it was opened: a mistake in the boot sequence.
    #[error("the TPM was used before it was opened")]
    TpmNotOpen,
    /// A TPM command of the bring-up failed.
    #[error(transparent)]
    Tpm(#[from] TpmStepError),
    /// The state disk cannot be found, probed, opened, formatted, mapped or mounted.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// No key for the state disk came out of the race, or the node lock cannot be taken.
    #[error("state disk {device}")]
    StateDiskKey {
        device: String,
        /// Boxed: it is the largest cause, and would make every boot `Result` as large.
        #[source]
        source: Box<EnrollmentError>,
    },
    /// The join ticket names another Kubernetes than the image carries (refused before the
    /// node lock).
    #[error("the join is refused before the node lock; the state disk is untouched")]
    Ticket(#[source] kube::grants::TicketVersionError),
    /// The network (`hawser.net`) cannot be brought up.
    #[error(transparent)]
    Net(#[from] crate::platform::net::NetError),
    /// A cloud's DHCP server gave no usable lease.
    #[error(transparent)]
    Dhcp(#[from] crate::platform::dhcp::DhcpError),
    /// The instance metadata service cannot be read.
    #[error("cannot read the node's settings from the instance metadata service")]
    Metadata(#[from] crate::platform::metadata::MetadataError),
    /// The node cannot present its platform's evidence (Azure: the HCL report, the metadata
    /// service's VCEK chain or TD quote; AWS: no profile).
    #[error(transparent)]
    PlatformEvidence(#[from] cloud::PlatformEvidenceError),
    /// The join client cannot start (no provider CA for an attested join service).
    #[error(transparent)]
    JoinSetup(#[from] crate::enrollment::client::JoinSetupError),
    /// The TPM-backed attestation issuer cannot start.
    #[error("cannot attest to the join service or the admin: the TPM issuer cannot start")]
    Issuer(#[source] hawser_platforms::node::NodeError),
    /// `hawser.join_discovery=mdns`, but browsing the LAN cannot start.
    #[error("cannot look for the join service on the LAN (hawser.join_discovery=mdns)")]
    Discovery(#[source] crate::enrollment::discover::DiscoveryError),
    /// The node cannot take its place in the WireGuard mesh the join service gave it.
    #[error(transparent)]
    Mesh(#[from] crate::mesh::MeshSetupError),
    /// The pivot into the verified rootfs failed.
    #[error("cannot pivot into the rootfs")]
    Pivot(#[source] crate::rootfs::PivotError),
    /// The rootfs's Kubernetes description is unreadable, or disagrees with the command line.
    #[error(transparent)]
    ImageKubernetes(#[from] kube::image::ImageKubernetesError),
    /// The image's control-plane images cannot be put into containerd.
    #[error("the control plane cannot start")]
    Images(#[source] kube::image::ImagesImportError),
    /// The boot report cannot be encoded as JSON.
    #[error("cannot encode the boot report")]
    Report(#[source] serde_json::Error),
    /// A blocking task of the bring-up panicked or was cancelled.
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
    let mut warnings = Warnings::default();

    // /proc before the runtime: tokio and the standard library read it.
    // The one mount table: the boot, the state disk and the shutdown get it from here, the
    // panic path from its registration.
    let mounts = SharedMountTable::default();
    shutdown::register_mount_table(&mounts);
    let mounted = timer.time("mounts", || mounts.lock().mount_all(&LINUX, &EARLY_MOUNTS));
    if let Err(e) = mounted {
        fatal_error(&e);
    }
    if let Some(warning) = console::attach_kmsg() {
        warnings.warn(warning);
    }
    // With /proc mounted: which device PID 1's own files are on, for the move after the pivot.
    rebase::remember_initramfs_device();
    if let Err(e) = LINUX.disable_ctrl_alt_del() {
        warnings.warn(format!(
            "cannot route Ctrl-Alt-Del to PID 1 (reboot(RB_DISABLE_CAD): {e})"
        ));
    }

    // Before any listener or child exists: all of them inherit it.
    match crate::platform::rlimit::raise_nofile() {
        Ok((soft, hard)) => info!("open-file limit {soft} (hard {hard})"),
        Err(e) => warnings.warn(format!(
            "PID 1 keeps the kernel's open-file limit: {}",
            error_chain(&e)
        )),
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => fatal(&format!("cannot start the tokio runtime: {e}")),
    };
    runtime.block_on(supervise(timer, warnings, mounts));
    fatal("the PID 1 event loop ended");
}

/// Runs the bring-up and then idles; both end only in a shutdown.
async fn supervise(timer: PhaseTimer, warnings: Warnings, mounts: SharedMountTable) {
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

    let mut boot = Boot::new(timer, warnings, registry, requests.clone(), mounts.clone());
    // The shutdown may interrupt the bring-up, which holds the context: it gets the handles.
    let services = boot.services().clone();
    tokio::select! {
        result = bring_up(&mut boot) => match result {
            Ok(()) => {
                // The bring-up's buffers (image reads, TLS, the initramfs index) are freed:
                // hand the heap's free pages back to the kernel.
                // SAFETY: malloc_trim only walks glibc's own heap under its lock.
                unsafe { libc::malloc_trim(0) };
                let before = MemoryUse::read();
                match tokio::task::spawn_blocking(rebase::onto_rootfs).await {
                    Ok(Ok(Some(rebased))) => info!(
                        "PID 1's code now maps from the rootfs copies ({} mappings from the \
                         copies, {} copied, {:.1} KiB; {} threads parked for {:.1} ms; \
                         /proc/self/exe {}): the initramfs's files are freed",
                        rebased.from_copies,
                        rebased.anonymous,
                        rebased.copied_bytes as f64 / 1024.0,
                        rebased.parked_threads,
                        rebased.parked_for.as_secs_f64() * 1e3,
                        if rebased.exe_moved { "moved" } else { "NOT moved (the old binary stays allocated)" }
                    ),
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => warn!(
                        "PID 1 still maps its code from the deleted initramfs, whose memory stays \
                         in use: {}",
                        error_chain(&e)
                    ),
                    Err(e) => warn!("moving PID 1's code onto the rootfs failed: {e}"),
                }
                if let Some(before) = before {
                    info!("PID 1 memory before the move: {before}");
                }
                match MemoryUse::read() {
                    Some(now) => info!("boot complete; idle; {now}"),
                    None => info!("boot complete; idle"),
                }
            }
            Err(e) => fatal_error(&e),
        },
        Some(request) = requested.recv() => shutdown(request, &mounts, &services).await,
    }
    match requested.recv().await {
        Some(request) => shutdown(request, &mounts, &services).await,
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

/// Stops everything and powers off. Never returns.
async fn shutdown(
    request: ShutdownRequest,
    mounts: &SharedMountTable,
    services: &SharedSupervisor,
) -> ! {
    info!("shutdown requested by {request}");
    // The node's services first, in reverse start order, each given time to stop cleanly.
    kube::stop_services(services).await;
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
    let error = shutdown::power_down(&LINUX, &mut mounts.lock(), PowerAction::PowerOff);
    fatal(&format!("cannot power off: reboot(2) failed: {error}"));
}

/// PID 1's memory (`/proc/self/status`, `/proc/meminfo`), as the boot log's memory line
/// prints it. `VmRSS` is the sum of the three `Rss*` parts; the QEMU node test checks that the
/// printed line adds up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUse {
    /// `VmRSS`, `RssAnon`, `RssFile`, `RssShmem`, `VmHWM` in KiB.
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
    pub shmem_kib: u64,
    pub peak_kib: u64,
    /// The machine's tmpfs and shared memory (`Shmem` of /proc/meminfo), where the
    /// initramfs's files live until their last mapping goes.
    pub machine_shmem_kib: u64,
    /// PID 1's mappings of initramfs files.
    pub initramfs_mappings: usize,
}

impl MemoryUse {
    /// Now; `None` if /proc cannot be read.
    pub fn read() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        Some(Self {
            rss_kib: kib_field(&status, "VmRSS:")?,
            anon_kib: kib_field(&status, "RssAnon:")?,
            file_kib: kib_field(&status, "RssFile:")?,
            shmem_kib: kib_field(&status, "RssShmem:")?,
            peak_kib: kib_field(&status, "VmHWM:")?,
            machine_shmem_kib: kib_field(&meminfo, "Shmem:")?,
            initramfs_mappings: rebase::initramfs_mappings().unwrap_or(0),
        })
    }
}

impl std::fmt::Display for MemoryUse {
    /// "PID 1 resident memory 6.1 MiB = 2.5 MiB anonymous + 3.6 MiB files + 0.0 MiB shared
    /// (initramfs); peak 16.0 MiB; 0 mappings of initramfs files; machine shmem 1.2 MiB".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |kib: u64| kib as f64 / 1024.0;
        write!(
            f,
            "PID 1 resident memory {:.1} MiB = {:.1} MiB anonymous + {:.1} MiB files + {:.1} MiB \
             shared (initramfs); peak {:.1} MiB; {} mappings of initramfs files; machine shmem \
             {:.1} MiB",
            mib(self.rss_kib),
            mib(self.anon_kib),
            mib(self.file_kib),
            mib(self.shmem_kib),
            mib(self.peak_kib),
            self.initramfs_mappings,
            mib(self.machine_shmem_kib)
        )
    }
}

/// `name   1234 kB` of a /proc file.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
}

/// The bring-up, phase by phase.
async fn bring_up(boot: &mut Boot) -> Result<(), BootError> {
    let mut config = boot.read_config()?;
    let kernel_release = after_disk::kernel_release();
    boot.load_modules(&config).await?;
    // The TPM steps while fw_cfg's and the NIC's drivers load (they mostly wait on the TPM).
    boot.open_tpm(&config.tpm_device).await?;
    boot.seed_entropy().await?;
    let measurement = boot.measure().await?;
    boot.await_network_modules().await?;
    let mut fw_cfg = boot.read_fw_cfg()?;
    let nonce = boot.nonce(fw_cfg.quote_nonce.take()).await?;
    if !boot.lease_net(&mut config).await? {
        boot.bring_up_net(&config).await?;
    }
    boot.read_metadata(&config, &mut fw_cfg).await?;
    boot.platform_evidence(&config).await?;
    boot.bring_up_lan(&fw_cfg).await?;
    let lan_address = fw_cfg.lan_net.as_ref().map(|lan| lan.address);
    // The node's WireGuard key for a first join: its public half goes in the join request.
    let mesh_key = crate::mesh::generate_key()?;
    let enrollment = boot
        .enrollment(&config, &mut fw_cfg, mesh_key.public_key())
        .await?;
    boot.await_state_disk_modules().await?;
    boot.watch_power_buttons(&config);
    let first_boot = kube::grants::FirstBoot {
        image_kubernetes: config.kubernetes.as_ref(),
        mesh_key: &mesh_key,
        rootfs: config.root_hash.is_some(),
        underlay_ip: after_disk::underlay_ip(lan_address, &config),
    };
    let mut outcome = boot
        .state_disk(
            &config.state_disk,
            fw_cfg.state_disk_key.take(),
            enrollment,
            &first_boot,
        )
        .await?;
    // Kept on the state disk if it was granted; the tunnel reads it back from there.
    drop(mesh_key);
    boot.await_late_modules().await?;
    let grant = outcome.as_mut().and_then(|o| o.membership.mesh.take());
    let mesh = boot.mesh(grant).await?;
    let (role, node_name, mut control_plane) = after_disk::role(&config, outcome, &measurement);
    // A control plane's join service shares the node's tunnel: its place, and where the
    // tunnel listens on the underlay (the address joining nodes reach this node at).
    if let (Some(inputs), Some(mesh), Some(underlay)) = (
        control_plane.inputs.as_mut(),
        mesh.as_ref(),
        after_disk::underlay_ip(lan_address, &config),
    ) {
        inputs.mesh = Some((
            mesh.clone(),
            std::net::SocketAddr::from((underlay, mesh.listen_port)),
        ));
    }
    boot.report(nonce, measurement, &config, &kernel_release)
        .await?;
    after_disk::emit_event_log();
    let node_ip = after_disk::node_ip(mesh.as_ref(), lan_address, &config);
    boot.run_node(&config, role, node_name, control_plane, node_ip)
        .await
}
