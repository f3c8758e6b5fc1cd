//! Kubernetes on the node, after the state disk and the pivot ([`crate::rootfs::pivot`]): its
//! services, kubeadm until it succeeded, and the cluster's join service on a control plane.
//!
//! Runs only for images with a rootfs (`hawser.root_hash` on the measured command line):
//!
//! 1. the supervisor starts containerd; a real-Kubernetes image's control-plane images are
//!    imported into it ([`image`]) and the pod network configured ([`cni`]); then the kubelet
//!    (restart with backoff);
//! 2. `kubeadm init` (the admin's `hawser init`) or `kubeadm join` (the join ticket) runs until
//!    it succeeded once in the node's life (the marker [`KUBEADM_MARKER`] on the state disk;
//!    [`attempts`]);
//! 3. after `kubeadm init`, the admin kubeconfig goes back to the admin's open `hawser init`;
//! 4. a control plane runs the cluster's join service ([`join_service`]).
//!
//! ```text
//!  cni ─────── the pod network's configuration (bridge, this node's pod range)
//!  grants ──── what a first boot keeps on its new disk (intent, secrets, WireGuard key)
//!  image ───── the image's kubernetes.json, checked; its images imported into containerd
//!  intent ──── kubeadm's rendered configuration and status on the state disk
//!  kubeadm ─── the configuration rendered from the join ticket or `hawser init`
//!  attempts ── one kubeadm attempt, what this boot has to do, the retries' errors
//!  join_service  the cluster's join service on every control plane
//! ```
//!
//! **kubeadm until it succeeded.** What kubeadm needs to run again (the rendered
//! configuration, a control-plane join's shared certificates) is kept on the encrypted state
//! disk as the *intent* ([`intent`], [`KUBEADM_INTENT`]) by the boot that formats the disk,
//! before it marks the disk initialized ([`grants`], with the WireGuard key and a control
//! plane's secrets): a power cut before the mark formats the disk again and the node asks
//! again, a cut after it leaves the marker (done) or the intent (to do). A failed attempt is
//! logged and reported (console status line, the admin's call), the node stays up, and the
//! next attempt follows in the background with capped exponential backoff (10 s → 5 min,
//! forever; aborted at shutdown), each after `kubeadm reset -f`. A boot that finds no marker
//! but an intent — a rejoining node, or a `hawser recover`ed first control plane — runs
//! kubeadm again the same way; one that finds the marker runs no kubeadm. The status (done or
//! pending, attempts, the last failure's reason chain) is on the state disk
//! ([`KUBEADM_STATUS`]), printed after each attempt, and a pending one is in the next boot's
//! boot report.
//!
//! The configuration is rendered for the node's name and address of the boot that kept it: a
//! node whose address changed across boots retries with the old one.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use hawser_kube_types::{ImageKubernetes, JoinTicket};
use tracing::{info, warn};

use self::attempts::{KubeadmWork, attempt_kubeadm, kubeadm_work};
use self::join_service::JoinServiceInputs;
use crate::enrollment::init_server::{ClusterSpec, Progress};
use crate::fatal::error_chain;
use crate::platform::poll;
use crate::platform::reaper::ChildRegistry;
use crate::platform::timings::PhaseTimer;
use crate::supervisor::retry::{self, KUBEADM_RETRY};
use crate::supervisor::{self, SharedSupervisor, Supervisor};

pub mod attempts;
pub mod cni;
mod error;
pub mod grants;
pub mod image;
pub mod intent;
pub mod join_service;
pub mod kubeadm;

pub use self::error::KubeadmRunError;
pub use self::intent::{KUBEADM_INTENT, KUBEADM_STATUS};

/// Where the kubeadm configuration is written (tmpfs: it holds the bootstrap token).
pub const KUBEADM_CONFIG: &str = "/run/hawser/kubeadm.yaml";
/// The marker of a node whose `kubeadm init|join` succeeded (on the state disk).
pub const KUBEADM_MARKER: &str = "/var/lib/hawser/kubeadm.done";
pub use self::kubeadm::{ADMIN_KUBECONFIG, KUBEADM, PKI_DIR};

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

/// What the node runs Kubernetes with: its child registry and services, and the image's
/// Kubernetes (`None` on an image that names none).
pub struct Runtime<'a> {
    pub registry: &'a ChildRegistry,
    pub services: &'a SharedSupervisor,
    pub image: Option<&'a ImageKubernetes>,
    /// The bring-up's timer: the images' import is phase `images-import`.
    pub timer: &'a mut PhaseTimer,
}

/// Starts the node's services and runs kubeadm for `role` (steps 1–4); hands the services to
/// `services`, where the shutdown stops them. Fails only when the image's control-plane images
/// cannot be put into containerd (the control plane cannot start without them); anything else
/// that goes wrong is logged (and reported to the admin), and the node stays up; a failed
/// kubeadm runs again in the background with backoff until it succeeds.
pub async fn run(
    role: Role,
    identity: NodeIdentity,
    control_plane: ControlPlane,
    runtime: Runtime<'_>,
    networking: tokio::task::JoinHandle<bool>,
) -> Result<(), image::ImagesImportError> {
    let Runtime {
        registry,
        services,
        image,
        timer,
    } = runtime;
    // The kubelet and kubeadm name the node after the host unless told otherwise.
    match nix::unistd::sethostname(&identity.name) {
        Ok(()) => info!("hostname set to {}", identity.name),
        Err(e) => warn!("cannot set the hostname to {}: {e}", identity.name),
    }
    let images = image.and_then(|image| image.images.as_ref());
    let mut work = kubeadm_work(&role, &identity, Path::new("/"));
    if let KubeadmWork::Run { intent, .. } = &mut work {
        intent.images = images.cloned();
    }
    let inputs = control_plane.inputs;
    let mut started = Supervisor::new(registry.clone());
    started.start(supervisor::containerd());
    // As systemd's `After=containerd.service` (with containerd's sd_notify) does: the kubelet
    // refuses to start without the runtime's socket. The supervisor restarts it either way.
    wait_for_path(Path::new(CONTAINERD_SOCKET), CONTAINERD_WAIT).await;
    if let Some(images) = images {
        let start = timer.elapsed_ms();
        let imported = image::import(registry, images, image::ImportFor::of(&role, &work)).await;
        timer.record("images-import", start);
        if let Err(e) = imported {
            // containerd runs: the shutdown stops it.
            let _ = services.install(started).await;
            if let Role::Init { progress, .. } = role {
                progress.fail(&error_chain(&e));
            }
            return Err(e);
        }
    }
    // The networking modules and sysctls (kubeadm's preflight checks them), prepared while
    // containerd started. A failure was logged; the node goes on without pod networking.
    if let Err(e) = networking.await {
        warn!("preparing Kubernetes networking failed: {e}");
    }
    // The pod network's configuration, before the kubelet looks for it (a real Kubernetes
    // image: the stand-ins run no pods).
    if images.is_some() {
        match cni::write(Path::new("/"), identity.ip) {
            Ok((network, len)) => info!(
                "pod network: bridge {} with pod range {network}/{len} ({})",
                cni::BRIDGE,
                cni::CNI_CONFIG
            ),
            Err(e) => warn!("the node has no pod network: {}", error_chain(&e)),
        }
        match cni::ensure_resolv_conf(Path::new("/")) {
            Ok(true) => info!(
                "{}: none was there; wrote one without a resolver (the kubelet needs the file)",
                cni::RESOLV_CONF
            ),
            Ok(false) => {}
            Err(e) => warn!("pods cannot start: {}", error_chain(&e)),
        }
    }
    started.start(supervisor::kubelet());
    if services.install(started).await.is_err() {
        warn!("the node's services were already started once; not starting them again");
        return Ok(());
    }
    let (intent, status) = match work {
        KubeadmWork::Run { intent, status } => (intent, status),
        KubeadmWork::Nothing => {
            join_service::start_on_control_plane(inputs.as_ref(), services).await;
            return Ok(());
        }
        KubeadmWork::Unrunnable(reason) => {
            if let Role::Init { progress, .. } = role {
                progress.fail(&reason);
            }
            return Ok(());
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
        return Ok(());
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
    Ok(())
}

/// Stops the node's services in reverse start order (the shutdown path); nothing if none run.
pub async fn stop_services(services: &SharedSupervisor) {
    for report in services.stop_all().await {
        info!("service {}: {:?}", report.name, report.outcome);
    }
}
