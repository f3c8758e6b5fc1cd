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
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::tpm::Tpm;
use hawser_kube_types::KubernetesVersion;
use hawser_measurements::{PCR_KERNEL_BOOT, PHASE_LEAVE_INITRD};
use tracing::{info, warn};

use crate::enrollment::client::{ControlPlaneFile, KubeadmTicket};
use crate::enrollment::init_server::{ClusterSpec, Progress};
use crate::enrollment::race::ClusterSecrets;
use crate::fatal::error_chain;
use crate::join_service::{self, JoinServiceInputs};
use crate::kubeadm::{self, InitRequest, JoinTicket};
use crate::platform::mounts::SharedMountTable;
use crate::platform::poll;
use crate::platform::reaper::ChildRegistry;
use crate::platform::syscalls::LinuxSyscalls;
use crate::rootfs::{self, RootHash, RootfsPlan, StateBacking};
use crate::supervisor::{self, OneShotJob, OneShotOutcome, SharedSupervisor, Supervisor};

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
    Join(KubeadmTicket),
    /// A rejoining or recovered node: kubeadm ran on an earlier boot; services only.
    Rejoin,
}

/// What a control plane needs to run the cluster's join service: the image's inputs (read
/// before the pivot; `None` without a provider CA) and, on the boot that runs kubeadm, the
/// cluster's secrets (the admin's `hawser init`, or a control-plane join's ticket). A worker
/// has no secrets; later boots read them from the state disk ([`join_service`]).
#[derive(Default)]
pub struct ControlPlane {
    pub inputs: Option<JoinServiceInputs>,
    pub secrets: Option<ClusterSecrets>,
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
pub async fn pivot(
    root_hash: RootHash,
    tpm: Arc<Tpm>,
    state_disk: bool,
    mounts: &SharedMountTable,
) -> Result<Vec<String>, PivotError> {
    // The initramfs holds the kernel's modules and is freed by the switch: what Kubernetes
    // networking needs is loaded now. A failure costs the pod network, not the node.
    match tokio::task::spawn_blocking(prepare_kubernetes_networking).await {
        Ok(Ok(loaded)) => info!(
            "loaded {loaded} kernel modules for Kubernetes networking; {}",
            KUBERNETES_SYSCTLS
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Ok(Err(e)) => warn!(
            "Kubernetes networking is not prepared (pods may get no network): {}",
            error_chain(&e)
        ),
        Err(e) => warn!("preparing Kubernetes networking failed: {e}"),
    }
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
    let plan = RootfsPlan::new(device.path.clone(), backing);
    let after_switch = plan.mounts_after_switch();
    let outcome = tokio::task::spawn_blocking(move || {
        rootfs::plan::switch_root(&LinuxSyscalls, &plan, &mut || {
            tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_LEAVE_INITRD)
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
    info!("measured {PHASE_LEAVE_INITRD} into PCR {PCR_KERNEL_BOOT} and switched into the rootfs");
    for warning in &outcome.warnings {
        warn!("{warning}");
    }
    Ok(outcome.warnings)
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

/// Loads [`hawser_kmod::KUBERNETES_MODULE_TABLE`] and sets [`KUBERNETES_SYSCTLS`]; returns
/// how many modules are loaded.
fn prepare_kubernetes_networking() -> Result<usize, NetworkingError> {
    let loaded =
        crate::modules::load_table(&LinuxSyscalls, hawser_kmod::KUBERNETES_MODULE_TABLE)?.loaded;
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

/// Starts the node's services and runs kubeadm for `role` (steps 3–5); hands the services to
/// `services`, where the shutdown stops them. Never fails: what goes wrong is logged (and
/// reported to the admin), and the node stays up.
pub async fn run(
    role: Role,
    identity: NodeIdentity,
    control_plane: ControlPlane,
    registry: &ChildRegistry,
    services: &SharedSupervisor,
) {
    // The kubelet and kubeadm name the node after the host unless told otherwise.
    match nix::unistd::sethostname(&identity.name) {
        Ok(()) => info!("hostname set to {}", identity.name),
        Err(e) => warn!("cannot set the hostname to {}: {e}", identity.name),
    }
    let mut started = Supervisor::new(registry.clone());
    started.start(supervisor::containerd());
    // As systemd's `After=containerd.service` (with containerd's sd_notify) does: the kubelet
    // refuses to start without the runtime's socket. The supervisor restarts it either way.
    wait_for_path(Path::new(CONTAINERD_SOCKET), CONTAINERD_WAIT).await;
    started.start(supervisor::kubelet());
    if services.install(started).await.is_err() {
        warn!("the node's services were already started once; not starting them again");
        return;
    }
    let config = match &role {
        Role::Init { spec, .. } => kubeadm::init_config(&InitRequest {
            cluster_name: spec.cluster_name.clone(),
            kubernetes_version: spec.kubernetes_version.clone(),
            service_cidr: spec.service_cidr,
            pod_cidr: None,
            control_plane_endpoint: None,
            cert_sans: spec.api_server_cert_sans.clone(),
            node_name: identity.name.clone(),
            node_ip: identity.ip,
            bootstrap_token: None,
            ignore_preflight_errors: Vec::new(),
        })
        .map(|c| (c, "init")),
        Role::Join(ticket) => {
            // A control-plane join without `--upload-certs`: the cluster's shared certificates
            // must be in place before kubeadm runs (it refuses otherwise).
            if let Some(files) = &ticket.control_plane_files {
                match write_control_plane_files(Path::new(PKI_DIR), files) {
                    Ok(()) => info!(
                        "control-plane join: wrote the cluster's {} shared certificate and key \
                         files to {PKI_DIR}",
                        files.len()
                    ),
                    Err(e) => warn!("cannot write the control-plane files to {PKI_DIR}: {e}"),
                }
            }
            kubeadm::join_config(&JoinTicket {
                api_server_endpoint: ticket.api_server_endpoint.clone(),
                token: ticket.token.clone(),
                ca_cert_hashes: ticket.ca_cert_hashes.clone(),
                node_name: identity.name.clone(),
                node_ip: identity.ip,
                control_plane: ticket.control_plane_files.as_ref().map(|_| {
                    kubeadm::ControlPlaneJoin {
                        certificate_key: None,
                    }
                }),
                ignore_preflight_errors: Vec::new(),
            })
            .map(|c| (c, "join"))
        }
        Role::Rejoin => {
            info!("this node joined on an earlier boot: kubeadm does not run again");
            join_service::restart_on_control_plane(control_plane.inputs.as_ref(), services).await;
            return;
        }
    };
    let outcome = match config {
        Ok((config, verb)) => run_kubeadm(registry, &config, verb).await,
        Err(source) => Err(KubeadmRunError::Config(source)),
    };
    if let Err(e) = &outcome {
        warn!(
            "{}; the node stays up without Kubernetes, the next boot tries again",
            error_chain(e)
        );
    }
    if let (Role::Join(ticket), Some(secrets), Ok(())) = (&role, &control_plane.secrets, &outcome) {
        match ticket.kubernetes_version.parse::<KubernetesVersion>() {
            Ok(version) => {
                join_service::start_after_kubeadm(
                    control_plane.inputs.as_ref(),
                    secrets,
                    &version,
                    None,
                    services,
                )
                .await
            }
            Err(e) => warn!(
                "the cluster's join service is not started: the join ticket's Kubernetes \
                 version {:?}: {e}",
                ticket.kubernetes_version
            ),
        }
    }
    if let Role::Init {
        spec,
        cluster_id,
        progress,
    } = role
    {
        match (&outcome, &control_plane.secrets) {
            (Ok(()), Some(secrets)) => {
                join_service::start_after_kubeadm(
                    control_plane.inputs.as_ref(),
                    secrets,
                    &spec.kubernetes_version,
                    Some(&spec.control_plane_approvals),
                    services,
                )
                .await
            }
            (Ok(()), None) => warn!(
                "the cluster's join service is not started: the admin's secrets did not reach \
                 this boot"
            ),
            (Err(_), _) => {}
        }
        match outcome.and_then(|()| {
            std::fs::read(ADMIN_KUBECONFIG).map_err(KubeadmRunError::AdminKubeconfig)
        }) {
            Ok(kubeconfig) => {
                info!(
                    "cluster {:?} is initialized; the admin kubeconfig goes back to `hawser init`",
                    spec.cluster_name
                );
                progress.succeed(cluster_id, kubeconfig);
            }
            Err(e) => progress.fail(&error_chain(&e)),
        }
    }
}

/// Why kubeadm did not make this node a Kubernetes node. The node stays up either way.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmRunError {
    /// The values for the kubeadm configuration are not valid (a node name or address kubeadm
    /// would refuse).
    #[error("cannot write the kubeadm configuration")]
    Config(#[source] kubeadm::KubeadmConfigError),
    /// The configuration file [`KUBEADM_CONFIG`] cannot be written.
    #[error("cannot write {KUBEADM_CONFIG}")]
    WriteConfig(#[source] std::io::Error),
    /// `kubeadm init` or `kubeadm join` did not succeed.
    #[error("kubeadm {verb} failed")]
    Run {
        /// `init` or `join`.
        verb: &'static str,
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
    config: &kubeadm::KubeadmConfig,
    verb: &'static str,
) -> Result<(), KubeadmRunError> {
    kubeadm::write_config(Path::new(KUBEADM_CONFIG), config)
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
        Err(source) => Err(KubeadmRunError::Run { verb, source }),
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

    #[test]
    fn control_plane_file_names_cannot_leave_the_pki_directory() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["../evil", "/etc/shadow", "", "a/../../b"] {
            let err = write_control_plane_files(dir.path(), &[file(name, b"x")]).unwrap_err();
            assert!(err.to_string().contains("refusing"), "{name}: {err}");
        }
    }
}
