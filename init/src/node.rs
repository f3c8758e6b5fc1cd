//! After the state disk: the pivot into the verified rootfs, and the node's Kubernetes services.
//!
//! Runs only for images with a rootfs (`hawser.root_hash` on the measured command line):
//!
//! 1. the rootfs is opened with dm-verity against the measured root hash, mounted read-only,
//!    the node's writable state bound in from the state disk ([`crate::rootfs`]);
//! 2. PCR 11 ← `leave-initrd`, then `switch_root` (PID 1 stays, the initramfs is freed);
//! 3. the supervisor starts containerd and the kubelet (restart with backoff);
//! 4. `kubeadm init` (the admin's `hawser init`) or `kubeadm join` (the join ticket) runs once
//!    per node lifetime (a marker on the state disk); a rejoining or recovered node only
//!    starts its services;
//! 5. after `kubeadm init`, the admin kubeconfig goes back to the admin's open `hawser init`.
//!
//! A failing kubeadm is reported (console, and the admin's call) and the node stays up: PID 1
//! never exits; the next boot tries again (the marker is written only after success).

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use hawser_attestation::tpm::Tpm;
use hawser_measurements::{PCR_KERNEL_BOOT, PHASE_LEAVE_INITRD};
use tracing::{info, warn};

use crate::fatal::error_chain;
use crate::join::client::KubeadmTicket;
use crate::join::init_server::{ClusterSpec, Progress};
use crate::kubeadm::{self, InitRequest, JoinTicket};
use crate::reaper::ChildRegistry;
use crate::rootfs::{self, RootHash, RootfsPlan, StateBacking};
use crate::supervisor::{self, OneShotJob, OneShotOutcome, Supervisor};
use crate::syscalls::LinuxSyscalls;

/// Where the kubeadm configuration is written (tmpfs: it holds the bootstrap token).
pub const KUBEADM_CONFIG: &str = "/run/hawser/kubeadm.yaml";
/// The marker of a node whose `kubeadm init|join` succeeded (on the state disk).
pub const KUBEADM_MARKER: &str = "/var/lib/hawser/kubeadm.done";
/// The admin kubeconfig `kubeadm init` writes.
pub const ADMIN_KUBECONFIG: &str = "/etc/kubernetes/admin.conf";
/// The kubeadm binary in the rootfs.
pub const KUBEADM: &str = "/usr/bin/kubeadm";

/// The running services, for the shutdown path.
static SUPERVISOR: OnceLock<tokio::sync::Mutex<Supervisor>> = OnceLock::new();

/// What the node does with Kubernetes after the pivot.
pub enum Role {
    /// `hawser init`: a new cluster on this node; the kubeconfig goes back to the admin.
    Init {
        spec: ClusterSpec,
        cluster_id: [u8; 32],
        progress: Progress,
    },
    /// A join ticket from the join service: `kubeadm join`.
    Join(KubeadmTicket),
    /// A rejoining or recovered node: kubeadm ran on an earlier boot; services only.
    Rejoin,
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
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
    #[error(transparent)]
    Switch(#[from] rootfs::plan::SwitchRootError),
    #[error("cannot mount the new root's API filesystems")]
    Mounts(#[source] crate::mounts::MountError),
    #[error("a blocking task of the pivot failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Opens the verified rootfs and switches into it (steps 1–2). After an error past the
/// measurement the machine is half-switched: the caller's fatal path must end it.
pub async fn pivot(
    root_hash: RootHash,
    tpm: Arc<Tpm>,
    state_disk: bool,
) -> Result<Vec<String>, PivotError> {
    let device = rootfs::open_verity_root(root_hash, rootfs::PARTITION_WAIT).await?;
    info!(
        "rootfs verified against root hash {} and mapped at {}",
        hex::encode(root_hash.as_bytes()),
        device.path.display()
    );
    let backing = if state_disk {
        StateBacking::Disk
    } else {
        StateBacking::Ephemeral
    };
    let plan = RootfsPlan::new(device.path.clone(), backing);
    let outcome = tokio::task::spawn_blocking(move || {
        rootfs::plan::switch_root(&LinuxSyscalls, &plan, &mut || {
            tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_LEAVE_INITRD)
                .map(|_| ())
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
    })
    .await
    .map_err(PivotError::Task)??;
    crate::shutdown::mount_table()
        .mount_all(&LinuxSyscalls, &rootfs::plan::NEW_ROOT_API_MOUNTS)
        .map_err(PivotError::Mounts)?;
    info!("measured {PHASE_LEAVE_INITRD} into PCR {PCR_KERNEL_BOOT} and switched into the rootfs");
    for warning in &outcome.warnings {
        warn!("{warning}");
    }
    Ok(outcome.warnings)
}

/// Starts the node's services and runs kubeadm for `role` (steps 3–5). Never fails: what
/// goes wrong is logged (and reported to the admin), and the node stays up.
pub async fn run(role: Role, identity: NodeIdentity, registry: &ChildRegistry) {
    let mut services = Supervisor::new(registry.clone());
    services.start(supervisor::containerd());
    services.start(supervisor::kubelet());
    if SUPERVISOR.set(tokio::sync::Mutex::new(services)).is_err() {
        warn!("the node's services were already started once; not starting them again");
        return;
    }
    let config = match &role {
        Role::Init { spec, .. } => kubeadm::init_config(&InitRequest {
            cluster_name: spec.cluster_name.clone(),
            kubernetes_version: spec.kubernetes_version.clone(),
            service_cidr: spec.service_cidr.clone(),
            pod_cidr: None,
            control_plane_endpoint: None,
            cert_sans: spec.api_server_cert_sans.clone(),
            node_name: identity.name.clone(),
            node_ip: identity.ip,
            bootstrap_token: None,
            ignore_preflight_errors: Vec::new(),
        })
        .map(|c| (c, "init")),
        Role::Join(ticket) => kubeadm::join_config(&JoinTicket {
            api_server_endpoint: ticket.api_server_endpoint.clone(),
            token: ticket.token.clone(),
            ca_cert_hashes: ticket.ca_cert_hashes.clone(),
            node_name: identity.name.clone(),
            node_ip: identity.ip,
            control_plane: None,
            ignore_preflight_errors: Vec::new(),
        })
        .map(|c| (c, "join")),
        Role::Rejoin => {
            info!("this node joined on an earlier boot: kubeadm does not run again");
            return;
        }
    };
    let outcome = match config {
        Ok((config, verb)) => run_kubeadm(registry, &config, verb).await,
        Err(e) => Err(format!(
            "cannot write the kubeadm configuration: {}",
            error_chain(&e)
        )),
    };
    if let Err(reason) = &outcome {
        warn!("{reason}; the node stays up without Kubernetes, the next boot tries again");
    }
    if let Role::Init {
        spec,
        cluster_id,
        progress,
    } = role
    {
        match outcome.and_then(|()| {
            std::fs::read(ADMIN_KUBECONFIG).map_err(|e| {
                format!("kubeadm init succeeded but {ADMIN_KUBECONFIG} is unreadable: {e}")
            })
        }) {
            Ok(kubeconfig) => {
                info!(
                    "cluster {:?} is initialized; the admin kubeconfig goes back to `hawser init`",
                    spec.cluster_name
                );
                progress.succeed(cluster_id, kubeconfig);
            }
            Err(reason) => progress.fail(&reason),
        }
    }
}

async fn run_kubeadm(
    registry: &ChildRegistry,
    config: &kubeadm::KubeadmConfig,
    verb: &str,
) -> Result<(), String> {
    kubeadm::write_config(Path::new(KUBEADM_CONFIG), config)
        .map_err(|e| format!("cannot write {KUBEADM_CONFIG}: {e}"))?;
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
        Err(e) => Err(format!("kubeadm {verb} failed: {}", error_chain(&e))),
    }
}

/// Stops the node's services in reverse start order (the shutdown path); nothing if none run.
pub async fn stop_services() {
    if let Some(services) = SUPERVISOR.get() {
        let reports = services.lock().await.stop_all().await;
        for report in reports {
            info!("service {}: {:?}", report.name, report.outcome);
        }
    }
}
