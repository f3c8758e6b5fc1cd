//! After the state disk: the pivot into the verified rootfs, and the node's Kubernetes services.
//!
//! Runs only for images with a rootfs (`hawser.root_hash` on the measured command line):
//!
//! 1. the rootfs is opened with dm-verity against the measured root hash, mounted read-only,
//!    the node's writable state bound in from the state disk ([`crate::rootfs`]);
//! 2. PCR 11 ← `leave-initrd` (a control plane's `control-plane` first), then `switch_root`
//!    (PID 1 stays, the initramfs is freed);
//! 3. the supervisor starts containerd and the kubelet (restart with backoff);
//! 4. `kubeadm init` (the admin's `hawser init`) or `kubeadm join` (the join ticket) runs until
//!    it succeeded once in the node's life (the marker [`KUBEADM_MARKER`] on the state disk);
//! 5. after `kubeadm init`, the admin kubeconfig goes back to the admin's open `hawser init`.
//!
//! **kubeadm until it succeeded.** What kubeadm needs to run again (the rendered
//! configuration, a control-plane join's shared certificates) is kept on the encrypted state
//! disk as the *intent* ([`intent`], [`KUBEADM_INTENT`]) by the boot that formats the disk,
//! before it marks the disk initialized ([`grants`], with the WireGuard key and a control
//! plane's secrets): a power cut before the mark formats the disk again and the node asks
//! again, a cut after it leaves the marker (done) or the intent (to do). A failed attempt is logged and
//! reported (console status line, the admin's call), the node stays up, and the next attempt
//! follows in the background with capped exponential backoff (10 s → 5 min, forever; aborted
//! at shutdown), each after `kubeadm reset -f`. A boot that finds no marker but an intent —
//! a rejoining node, or a `hawser recover`ed first control plane — runs kubeadm again the same
//! way; one that finds the marker runs no kubeadm. The status (done or pending, attempts, the
//! last failure's reason chain) is on the state disk ([`KUBEADM_STATUS`]), printed after each
//! attempt, and a pending one is in the next boot's boot report.
//!
//! The configuration is rendered for the node's name and address of the boot that kept it: a
//! node whose address changed across boots retries with the old one.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_attestation::tpm::Tpm;
use hawser_measurements::PCR_KERNEL_BOOT;
use tracing::{info, warn};

use crate::enrollment::init_server::{ClusterSpec, Progress};
use crate::fatal::error_chain;
use crate::join_service::{self, JoinServiceInputs};
use crate::kubeadm;
use crate::platform::mounts::SharedMountTable;
use crate::platform::poll;
use crate::platform::reaper::ChildRegistry;
use crate::platform::syscalls::LinuxSyscalls;
use crate::platform::timings::PhaseTimer;
use crate::rootfs::{self, RootHash, RootfsPlan, StateBacking};
use crate::supervisor::retry::{self, KUBEADM_RETRY};
use crate::supervisor::{self, OneShotJob, OneShotOutcome, SharedSupervisor, Supervisor};
use hawser_kube_types::{ControlPlaneFile, JoinTicket};

pub mod grants;
pub mod intent;

pub use self::intent::{KUBEADM_INTENT, KUBEADM_STATUS};
use self::intent::{KubeadmIntent, KubeadmState, KubeadmStatus};

/// Where the kubeadm configuration is written (tmpfs: it holds the bootstrap token).
pub const KUBEADM_CONFIG: &str = "/run/hawser/kubeadm.yaml";
/// The marker of a node whose `kubeadm init|join` succeeded (on the state disk).
pub const KUBEADM_MARKER: &str = "/var/lib/hawser/kubeadm.done";
pub use crate::kubeadm::{ADMIN_KUBECONFIG, KUBEADM, PKI_DIR};

/// Writes the join service's control-plane files under `pki_dir`: keys 0600, certificates
/// and public keys 0644, as kubeadm writes them. A name that is absolute or climbs out of
/// `pki_dir` is refused (the service is attested, but a path is still input).
fn write_control_plane_files(pki_dir: &Path, files: &[ControlPlaneFile]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    for file in files {
        let relative = Path::new(&file.name);
        let plain = relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if file.name.is_empty() || !plain {
            return Err(std::io::Error::other(format!(
                "refusing the control-plane file name {:?}",
                file.name
            )));
        }
        let path = pki_dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mode = if file.name.ends_with(".key") {
            0o600
        } else {
            0o644
        };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&path)?;
        out.write_all(&file.data)?;
        out.sync_all()?;
    }
    Ok(())
}

/// containerd's CRI socket, which the kubelet needs.
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// How long the kubelet's start waits for [`CONTAINERD_SOCKET`].
const CONTAINERD_WAIT: Duration = Duration::from_secs(30);
/// How often that wait looks for the socket.
const CONTAINERD_POLL: Duration = Duration::from_millis(100);

/// Waits until `path` exists or `limit` passed (then says so and goes on).
async fn wait_for_path(path: &Path, limit: Duration) {
    let started = tokio::time::Instant::now();
    if poll::wait_for_path(path, limit, CONTAINERD_POLL).await {
        info!(
            "{} is there after {:.1} s",
            path.display(),
            started.elapsed().as_secs_f64()
        );
    } else {
        warn!(
            "{} did not appear within {} s; starting the kubelet anyway",
            path.display(),
            limit.as_secs()
        );
    }
}

/// What the node does with Kubernetes after the pivot.
pub enum Role {
    /// `hawser init`: a new cluster on this node; the kubeconfig goes back to the admin, and
    /// the node runs the cluster's join service for the nodes that follow.
    Init {
        spec: ClusterSpec,
        cluster_id: [u8; 32],
        progress: Progress,
    },
    /// A join ticket from the join service: `kubeadm join`.
    Join(JoinTicket),
    /// A rejoining or recovered node: services, and kubeadm again only if an earlier boot left
    /// its intent and no marker.
    Rejoin,
}

/// What a control plane needs to run the cluster's join service besides the cluster's secrets
/// (kept on the state disk by the boot that formatted it, [`grants`]): the image's inputs,
/// read before the pivot; `None` without a provider CA.
#[derive(Default)]
pub struct ControlPlane {
    pub inputs: Option<JoinServiceInputs>,
}

/// This node as Kubernetes will know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub name: String,
    pub ip: IpAddr,
}

/// Why the node cannot pivot.
#[derive(Debug, thiserror::Error)]
pub enum PivotError {
    /// The rootfs partition cannot be found, verified or mapped (its own message says which).
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
    /// A step of the switch into the new root failed (its own message says which).
    #[error(transparent)]
    Switch(#[from] rootfs::plan::SwitchRootError),
    /// `/proc`, `/sys`, `/dev` and the rest cannot be mounted in the new root.
    #[error("cannot mount the new root's API filesystems")]
    Mounts(#[source] crate::platform::mounts::MountError),
    /// The blocking task that switches roots panicked or was cancelled.
    #[error("a blocking task of the pivot failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Opens the verified rootfs and switches into it (steps 1–2); records the new root's mounts
/// in `mounts`, PID 1's mount table, for the shutdown. After an error past the measurement the
/// machine is half-switched: the caller's fatal path must end it.
///
/// The Kubernetes networking modules live in the initramfs: after the switch, a thread of
/// their own loads them from it (through the descriptor the switch kept open), sets
/// [`KUBERNETES_SYSCTLS`] and then deletes the initramfs, while the caller starts containerd.
/// [`Pivoted::networking`] is awaited before the kubelet and kubeadm, which need it.
pub async fn pivot(
    root_hash: RootHash,
    tpm: Arc<Tpm>,
    state_disk: bool,
    role: rootfs::MeasuredRole,
    mounts: &SharedMountTable,
    timer: &PhaseTimer,
) -> Result<Pivoted, PivotError> {
    let device = rootfs::open_verity_root(root_hash, rootfs::PARTITION_WAIT).await?;
    info!(
        "rootfs mapped at {} with dm-verity against root hash {}: every block is checked \
         when read, and a corrupted one stops the node (kernel panic: dm-verity device corrupted)",
        device.path.display(),
        hex::encode(root_hash.as_bytes())
    );
    let backing = if state_disk {
        StateBacking::Disk
    } else {
        StateBacking::Ephemeral
    };
    let plan = RootfsPlan::new(device.path.clone(), backing).measured_role(role);
    let phases = plan.measured_phases().join(", ");
    let after_switch = plan.mounts_after_switch();
    let mut outcome = tokio::task::spawn_blocking(move || {
        rootfs::plan::switch_root(&LinuxSyscalls, &plan, &mut |phase| {
            tpm.extend_phase(PCR_KERNEL_BOOT, phase)
                .map(|_| ())
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
    })
    .await
    .map_err(PivotError::Task)??;
    let mut table = mounts.lock();
    // The shutdown unmounts these before the state disk they bind from.
    for spec in after_switch {
        table.record(spec);
    }
    table
        .mount_all(&LinuxSyscalls, &rootfs::plan::NEW_ROOT_API_MOUNTS)
        .map_err(PivotError::Mounts)?;
    drop(table);
    info!(
        "measured {phases} into PCR {PCR_KERNEL_BOOT} and switched into the rootfs; \
         /init → pivot {:.1} ms ({:.3} s after boot)",
        timer.elapsed_ms(),
        crate::platform::console::boottime_seconds()
    );
    for warning in &outcome.warnings {
        warn!("{warning}");
    }
    let old_root = outcome.old_root.take();
    let networking = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let prepared = old_root
            .as_ref()
            .and_then(crate::platform::syscalls::OldRoot::path)
            .map(|root| prepare_kubernetes_networking(&root))
            .unwrap_or(Err(NetworkingError::NoInitramfs));
        match &prepared {
            Ok(loaded) => info!(
                "loaded {loaded} kernel modules for Kubernetes networking in {:.1} ms; {}",
                started.elapsed().as_secs_f64() * 1e3,
                KUBERNETES_SYSCTLS
                    .iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Err(e) => warn!(
                "Kubernetes networking is not prepared (pods may get no network): {}",
                error_chain(e)
            ),
        }
        if let Some(old_root) = old_root {
            rootfs::plan::delete_old_root(&LinuxSyscalls, old_root);
        }
        prepared.is_ok()
    });
    Ok(Pivoted {
        warnings: outcome.warnings,
        networking,
    })
}

/// The switch done; Kubernetes networking being prepared.
pub struct Pivoted {
    /// The switch's warnings.
    pub warnings: Vec<String>,
    /// Loads the networking modules and sets the sysctls, then deletes the initramfs: `true`
    /// when networking is ready.
    pub networking: tokio::task::JoinHandle<bool>,
}

/// The sysctls kubeadm's preflight requires and kube-proxy and CNI plugins rely on (systemd's
/// `sysctl.d` would set them on a general-purpose distribution).
pub const KUBERNETES_SYSCTLS: [(&str, &str); 3] = [
    ("net.ipv4.ip_forward", "1"),
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
];

/// Why Kubernetes networking could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum NetworkingError {
    /// A kernel module Kubernetes networking needs cannot be loaded (its own message says
    /// which).
    #[error(transparent)]
    Modules(#[from] crate::modules::ModuleError),
    /// The initramfs, which holds the modules, was not kept open by the switch.
    #[error("the initramfs is not open after the switch")]
    NoInitramfs,
    /// A sysctl of [`KUBERNETES_SYSCTLS`] cannot be written.
    #[error("cannot set {key}={value}")]
    Sysctl {
        /// The sysctl, e.g. `net.ipv4.ip_forward`.
        key: &'static str,
        /// The value it should have.
        value: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Loads [`hawser_kmod::KUBERNETES_MODULE_TABLE`] from the initramfs at `initramfs` (several
/// at once with more than one CPU) and sets [`KUBERNETES_SYSCTLS`]; returns how many modules
/// are loaded.
fn prepare_kubernetes_networking(initramfs: &Path) -> Result<usize, NetworkingError> {
    let dir = initramfs.join(
        crate::modules::running_modules_dir()
            .strip_prefix("/")
            .unwrap_or(Path::new("")),
    );
    let loaded = crate::modules::load_table_in(
        &LinuxSyscalls,
        &dir,
        hawser_kmod::KUBERNETES_MODULE_TABLE,
        crate::modules::load_threads(),
    )?
    .loaded;
    for (key, value) in KUBERNETES_SYSCTLS {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        std::fs::write(&path, value).map_err(|source| NetworkingError::Sysctl {
            key,
            value,
            source,
        })?;
    }
    Ok(loaded)
}

/// What kubeadm has to do on this boot.
enum KubeadmWork {
    /// Nothing: kubeadm succeeded on an earlier boot, or there is nothing it could run.
    Nothing,
    /// No configuration can be rendered (the reason, for the admin's `hawser init`).
    Unrunnable(String),
    /// Run `intent`; `status` counts the attempts of earlier boots.
    Run {
        intent: KubeadmIntent,
        status: KubeadmStatus,
    },
}

/// What an earlier boot left for kubeadm (a rejoining or recovered node): nothing if the
/// marker is there, else the kept intent with its attempts so far. `on_disk` maps an absolute
/// path to the state disk's file.
fn earlier_boot_work(on_disk: &dyn Fn(&str) -> std::path::PathBuf) -> KubeadmWork {
    let marker = on_disk(KUBEADM_MARKER);
    match std::fs::symlink_metadata(&marker) {
        Ok(_) => {
            info!("this node joined on an earlier boot: kubeadm does not run again");
            return KubeadmWork::Nothing;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!("cannot check kubeadm's marker {KUBEADM_MARKER} ({e}); kubeadm does not run");
            return KubeadmWork::Nothing;
        }
    }
    match KubeadmIntent::load(&on_disk(KUBEADM_INTENT)) {
        Ok(Some(intent)) => {
            let status = match KubeadmStatus::load(&on_disk(KUBEADM_STATUS)) {
                Ok(Some(status)) => status,
                Ok(None) => KubeadmStatus::new(intent.verb),
                Err(e) => {
                    warn!("{}; counting attempts from 0", error_chain(&e));
                    KubeadmStatus::new(intent.verb)
                }
            };
            info!(
                "kubeadm {} did not finish on an earlier boot ({} attempt(s), no marker \
                 {KUBEADM_MARKER}): running it again from {KUBEADM_INTENT}",
                intent.verb.as_str(),
                status.attempts
            );
            KubeadmWork::Run { intent, status }
        }
        Ok(None) => {
            warn!(
                "neither kubeadm's marker {KUBEADM_MARKER} nor its intent {KUBEADM_INTENT} \
                 is on the state disk: kubeadm has nothing to run; services only"
            );
            KubeadmWork::Nothing
        }
        Err(e) => {
            warn!(
                "{}: kubeadm cannot run again; services only",
                error_chain(&e)
            );
            KubeadmWork::Nothing
        }
    }
}

/// What kubeadm does on this boot: a new intent (init, join), or what an earlier boot left
/// (rejoin, recover). Never fails: a broken intent is logged, and the node runs its services.
fn kubeadm_work(role: &Role, identity: &NodeIdentity, root: &Path) -> KubeadmWork {
    let on_disk = |path: &str| root.join(path.trim_start_matches('/'));
    let Some(grant) = role.kubeadm_grant() else {
        return earlier_boot_work(&on_disk);
    };
    // The rendering this boot kept on the state disk before its "initialized" mark (`grants`),
    // so from here a power cut leaves the intent or the marker.
    match grants::render_intent(grant, identity) {
        Ok(intent) => {
            let status = KubeadmStatus::new(intent.verb);
            KubeadmWork::Run { intent, status }
        }
        Err(e) => {
            warn!("{}; the node stays up without Kubernetes", error_chain(&e));
            KubeadmWork::Unrunnable(error_chain(&e))
        }
    }
}

/// Starts the node's services and runs kubeadm for `role` (steps 3–5); hands the services to
/// `services`, where the shutdown stops them. Never fails: what goes wrong is logged (and
/// reported to the admin), and the node stays up; a failed kubeadm runs again in the
/// background with backoff until it succeeds.
pub async fn run(
    role: Role,
    identity: NodeIdentity,
    control_plane: ControlPlane,
    registry: &ChildRegistry,
    services: &SharedSupervisor,
    networking: tokio::task::JoinHandle<bool>,
) {
    // The kubelet and kubeadm name the node after the host unless told otherwise.
    match nix::unistd::sethostname(&identity.name) {
        Ok(()) => info!("hostname set to {}", identity.name),
        Err(e) => warn!("cannot set the hostname to {}: {e}", identity.name),
    }
    let work = kubeadm_work(&role, &identity, Path::new("/"));
    let inputs = control_plane.inputs;
    let mut started = Supervisor::new(registry.clone());
    started.start(supervisor::containerd());
    // As systemd's `After=containerd.service` (with containerd's sd_notify) does: the kubelet
    // refuses to start without the runtime's socket. The supervisor restarts it either way.
    wait_for_path(Path::new(CONTAINERD_SOCKET), CONTAINERD_WAIT).await;
    // The networking modules and sysctls (kubeadm's preflight checks them), prepared while
    // containerd started. A failure was logged; the node goes on without pod networking.
    if let Err(e) = networking.await {
        warn!("preparing Kubernetes networking failed: {e}");
    }
    started.start(supervisor::kubelet());
    if services.install(started).await.is_err() {
        warn!("the node's services were already started once; not starting them again");
        return;
    }
    let (intent, status) = match work {
        KubeadmWork::Run { intent, status } => (intent, status),
        KubeadmWork::Nothing => {
            join_service::start_on_control_plane(inputs.as_ref(), services).await;
            return;
        }
        KubeadmWork::Unrunnable(reason) => {
            if let Role::Init { progress, .. } = role {
                progress.fail(&reason);
            }
            return;
        }
    };
    let first = status.attempts.saturating_add(1);
    let status = std::sync::Arc::new(tokio::sync::Mutex::new(status));
    let outcome = attempt_kubeadm(registry, &intent, first, &status).await;
    let spec = match role {
        Role::Init {
            spec,
            cluster_id,
            progress,
        } => {
            match &outcome {
                Ok(()) => match std::fs::read(ADMIN_KUBECONFIG) {
                    Ok(kubeconfig) => {
                        info!(
                            "cluster {:?} is initialized; the admin kubeconfig goes back to \
                             `hawser init`",
                            spec.cluster_name
                        );
                        progress.succeed(cluster_id, kubeconfig);
                    }
                    Err(e) => {
                        progress.fail(&error_chain(&KubeadmRunError::AdminKubeconfig(e)));
                    }
                },
                Err(e) => progress.fail(&format!(
                    "{}; the node tries again with backoff, and {ADMIN_KUBECONFIG} is written \
                     once kubeadm init succeeded",
                    error_chain(e)
                )),
            }
            Some(spec)
        }
        _ => None,
    };
    if outcome.is_ok() {
        join_service::start_on_control_plane(inputs.as_ref(), services).await;
        return;
    }
    let registry = registry.clone();
    let shared = services.clone();
    let retries = tokio::spawn(async move {
        let ((), attempts) = retry::until_success(
            KUBEADM_RETRY,
            first.saturating_add(1),
            |n| attempt_kubeadm(&registry, &intent, n, &status),
            tokio::time::sleep,
            |_, _, _| {},
        )
        .await;
        info!(
            "kubeadm {} succeeded at attempt {attempts}",
            intent.verb.as_str()
        );
        join_service::start_on_control_plane(inputs.as_ref(), &shared).await;
        if let Some(spec) = spec {
            info!(
                "cluster {:?} is initialized; the admin kubeconfig is {ADMIN_KUBECONFIG} on \
                 this node",
                spec.cluster_name
            );
        }
    });
    services.adopt(retries).await;
}

/// One attempt, number `attempt` of this node's life: `kubeadm reset -f` first unless it is
/// the first, the control-plane files put (back) in place, the configuration written, kubeadm
/// run once. The status is saved before (a power cut counts the attempt) and after, and
/// printed on the console after.
async fn attempt_kubeadm(
    registry: &ChildRegistry,
    intent: &KubeadmIntent,
    attempt: u32,
    status: &tokio::sync::Mutex<KubeadmStatus>,
) -> Result<(), KubeadmRunError> {
    let mut status = status.lock().await;
    status.attempts = attempt;
    status.state = KubeadmState::Pending;
    if let Err(e) = status.save(Path::new(KUBEADM_STATUS)) {
        warn!("{}", error_chain(&e));
    }
    let outcome = run_kubeadm(registry, intent, attempt).await;
    match &outcome {
        Ok(()) => {
            status.state = KubeadmState::Done;
            status.last_error = None;
        }
        Err(e) => {
            let delay = KUBEADM_RETRY.delay_after(attempt);
            warn!(
                "{}; the node stays up without Kubernetes; attempt {} in {} s",
                error_chain(e),
                attempt.saturating_add(1),
                delay.as_secs()
            );
            status.last_error = Some(error_chain(e));
        }
    }
    if let Err(e) = status.save(Path::new(KUBEADM_STATUS)) {
        warn!("{}", error_chain(&e));
    }
    crate::platform::console::emit_raw_console_line(&status.console_line());
    outcome
}

/// Why kubeadm did not make this node a Kubernetes node. The node stays up either way.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmRunError {
    /// The values for the kubeadm configuration are not valid (a node name or address kubeadm
    /// would refuse).
    #[error("cannot write the kubeadm configuration")]
    Config(#[source] kubeadm::KubeadmConfigError),
    /// The control-plane join's shared certificates and keys cannot be written to
    /// [`PKI_DIR`].
    #[error("cannot write the control-plane files to {PKI_DIR}")]
    ControlPlaneFiles(#[source] std::io::Error),
    /// The configuration file [`KUBEADM_CONFIG`] cannot be written.
    #[error("cannot write {KUBEADM_CONFIG}")]
    WriteConfig(#[source] std::io::Error),
    /// `kubeadm init` or `kubeadm join` did not succeed.
    #[error("kubeadm {verb} failed (attempt {attempt})")]
    Run {
        /// `init` or `join`.
        verb: &'static str,
        /// The attempt's number in this node's life.
        attempt: u32,
        #[source]
        source: supervisor::OneShotError,
    },
    /// `kubeadm init` succeeded, but the admin kubeconfig ([`ADMIN_KUBECONFIG`]) for
    /// `hawser init` cannot be read.
    #[error("kubeadm init succeeded but {ADMIN_KUBECONFIG} is unreadable")]
    AdminKubeconfig(#[source] std::io::Error),
}

async fn run_kubeadm(
    registry: &ChildRegistry,
    intent: &KubeadmIntent,
    attempt: u32,
) -> Result<(), KubeadmRunError> {
    let verb = intent.verb.as_str();
    if attempt > 1 {
        // What a half-run kubeadm left (certificates, kubeconfigs, manifests) stops the next
        // run at its preflight checks: clean up as an operator would.
        let reset = OneShotJob::new("kubeadm", &[KUBEADM, "reset", "-f"], KUBEADM_MARKER);
        match supervisor::run_job(registry, &reset, "to clean up before the retry").await {
            Ok(took) => info!("kubeadm reset -f done in {:.1} s", took.as_secs_f64()),
            Err(e) => warn!(
                "{}; trying kubeadm {verb} anyway (its preflight checks say what is left)",
                error_chain(&e)
            ),
        }
    }
    // A control-plane join without `--upload-certs`: the cluster's shared certificates must be
    // in place before kubeadm runs (it refuses otherwise), and `kubeadm reset` removed them.
    if !intent.control_plane_files.is_empty() {
        write_control_plane_files(Path::new(PKI_DIR), &intent.control_plane_files)
            .map_err(KubeadmRunError::ControlPlaneFiles)?;
        info!(
            "control-plane join: wrote the cluster's {} shared certificate and key files to \
             {PKI_DIR}",
            intent.control_plane_files.len()
        );
    }
    kubeadm::write_config(Path::new(KUBEADM_CONFIG), &intent.config)
        .map_err(KubeadmRunError::WriteConfig)?;
    let job = OneShotJob::new(
        "kubeadm",
        &[KUBEADM, verb, "--config", KUBEADM_CONFIG],
        KUBEADM_MARKER,
    );
    match supervisor::run_once(registry, &job).await {
        Ok(OneShotOutcome::Succeeded { took }) => {
            info!("kubeadm {verb} succeeded in {:.1} s", took.as_secs_f64());
            Ok(())
        }
        Ok(OneShotOutcome::AlreadyDone) => Ok(()),
        Err(source) => Err(KubeadmRunError::Run {
            verb,
            attempt,
            source,
        }),
    }
}

/// Stops the node's services in reverse start order (the shutdown path); nothing if none run.
pub async fn stop_services(services: &SharedSupervisor) {
    for report in services.stop_all().await {
        info!("service {}: {:?}", report.name, report.outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::intent::Verb;
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use zeroize::Zeroizing;

    fn file(name: &str, data: &[u8]) -> ControlPlaneFile {
        ControlPlaneFile {
            name: name.to_owned(),
            data: Zeroizing::new(data.to_vec()),
        }
    }

    #[test]
    fn control_plane_files_land_under_pki_with_kubeadms_modes() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        write_control_plane_files(
            &pki,
            &[
                file("ca.crt", b"cert"),
                file("ca.key", b"key"),
                file("etcd/ca.key", b"etcd"),
            ],
        )
        .unwrap();
        let mode = |p: &str| std::fs::metadata(pki.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("ca.crt"), 0o644);
        assert_eq!(mode("ca.key"), 0o600);
        assert_eq!(mode("etcd/ca.key"), 0o600);
        assert_eq!(std::fs::read(pki.join("etcd/ca.key")).unwrap(), b"etcd");
    }

    #[test]
    fn kubeadm_failures_name_their_layer_and_show_each_cause_once() {
        let bad_key = kubeadm::CertificateKey::parse("x").unwrap_err();
        assert_eq!(
            error_chain(&KubeadmRunError::Config(bad_key)),
            "cannot write the kubeadm configuration: kubeadm configuration: certificate key is \
             invalid (value not shown: secret): expected 64 lowercase hex digits (32 bytes)"
        );
        let unreadable = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(
            error_chain(&KubeadmRunError::AdminKubeconfig(unreadable)),
            "kubeadm init succeeded but /etc/kubernetes/admin.conf is unreadable: entity not found"
        );
    }

    fn identity() -> NodeIdentity {
        NodeIdentity {
            name: "hawser-0123abcd".into(),
            ip: "10.0.2.15".parse().unwrap(),
        }
    }

    fn on_disk(root: &Path, path: &str) -> std::path::PathBuf {
        root.join(path.trim_start_matches('/'))
    }

    fn join_intent() -> KubeadmIntent {
        KubeadmIntent {
            verb: Verb::Join,
            config: kubeadm::KubeadmConfig::from_stored(Zeroizing::new(
                "{\"kind\":\"JoinConfiguration\"}".into(),
            )),
            control_plane_files: Vec::new(),
        }
    }

    #[test]
    fn a_join_runs_the_intent_its_first_boot_kept_on_the_state_disk() {
        let root = tempfile::tempdir().unwrap();
        let ticket = JoinTicket {
            api_server_endpoint: "10.0.2.100:6443".parse().unwrap(),
            token: "abcdef.0123456789abcdef".parse().unwrap(),
            ca_cert_hashes: vec![format!("sha256:{}", "00".repeat(32)).parse().unwrap()],
            kubernetes_version: "v1.31.2".into(),
            control_plane_files: Some(vec![file("ca.key", b"key")]),
        };
        let granted = grants::Granted {
            disk_uuid: "0123abcd-0000-4000-8000-000000000000",
            kubeadm: Some(grants::KubeadmGrant::Join(&ticket)),
            secrets: None,
            mesh: None,
        };
        let first_boot = grants::FirstBoot {
            mesh_key: &hawser_mesh::PrivateKey::from_random([1; 32]),
            rootfs: true,
            underlay_ip: Some("10.0.2.15".parse().unwrap()),
        };
        for kept in grants::first_boot_files(&granted, &first_boot).unwrap() {
            kept.write_under(root.path()).unwrap();
        }
        let KubeadmWork::Run { intent, status } =
            kubeadm_work(&Role::Join(ticket), &identity(), root.path())
        else {
            panic!("a join runs kubeadm");
        };
        assert_eq!(status, KubeadmStatus::new(Verb::Join));
        let path = on_disk(root.path(), KUBEADM_INTENT);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let kept = KubeadmIntent::load(&path).unwrap().unwrap();
        assert_eq!(kept, intent);
        assert_eq!(kept.verb, Verb::Join);
        assert!(kept.config.as_str().contains("10.0.2.100:6443"));
        assert!(kept.config.as_str().contains("hawser-0123abcd"));
        assert_eq!(kept.control_plane_files, vec![file("ca.key", b"key")]);
    }

    #[test]
    fn a_rejoin_with_the_marker_runs_no_kubeadm_even_with_an_intent() {
        let root = tempfile::tempdir().unwrap();
        join_intent()
            .save(&on_disk(root.path(), KUBEADM_INTENT))
            .unwrap();
        std::fs::write(on_disk(root.path(), KUBEADM_MARKER), "done").unwrap();
        let work = kubeadm_work(&Role::Rejoin, &identity(), root.path());
        assert!(matches!(work, KubeadmWork::Nothing));
    }

    #[test]
    fn a_rejoin_without_the_marker_runs_the_kept_intent_counting_earlier_attempts() {
        let root = tempfile::tempdir().unwrap();
        join_intent()
            .save(&on_disk(root.path(), KUBEADM_INTENT))
            .unwrap();
        let mut status = KubeadmStatus::new(Verb::Join);
        status.attempts = 2;
        status.last_error = Some("kubeadm join failed (attempt 2)".into());
        status.save(&on_disk(root.path(), KUBEADM_STATUS)).unwrap();
        let KubeadmWork::Run {
            intent,
            status: kept,
        } = kubeadm_work(&Role::Rejoin, &identity(), root.path())
        else {
            panic!("kubeadm does not run again");
        };
        assert_eq!(intent, join_intent());
        assert_eq!(kept, status);
    }

    #[test]
    fn a_rejoin_with_no_intent_or_a_corrupt_one_runs_services_only() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(on_disk(root.path(), "/var/lib/hawser")).unwrap();
        let work = kubeadm_work(&Role::Rejoin, &identity(), root.path());
        assert!(matches!(work, KubeadmWork::Nothing));
        std::fs::write(on_disk(root.path(), KUBEADM_INTENT), "{\"version\":").unwrap();
        let work = kubeadm_work(&Role::Rejoin, &identity(), root.path());
        assert!(matches!(work, KubeadmWork::Nothing));
    }

    #[test]
    fn control_plane_file_names_cannot_leave_the_pki_directory() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["../evil", "/etc/shadow", "", "a/../../b"] {
            let err = write_control_plane_files(dir.path(), &[file(name, b"x")]).unwrap_err();
            assert!(err.to_string().contains("refusing"), "{name}: {err}");
        }
    }
}
