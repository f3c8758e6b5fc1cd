//! The node's one-time grants, kept on the new state disk before it is marked "initialized".
//!
//! A first boot is given some things once: the WireGuard key whose public half the join
//! service registered, kubeadm's ticket (or the admin's `hawser init`), a control plane's
//! cluster secrets. Every later boot is a rejoin, and a rejoin gets none of them again. Were
//! the disk marked initialized before they are on it, a power cut in between would wedge the
//! node: the registry's WireGuard key is not the one a new boot generates (`KeyMismatch`, FATAL
//! on every boot), no intent leaves kubeadm nothing to run (services only, forever), no master
//! secret leaves a control plane without its join service. So the boot that formats the disk
//! keeps them first, as the lifecycle's [`Kept`] list ([`first_boot_files`]), and the mark is
//! the write after the last of them:
//!
//! ```text
//!  race won ── disk key, and: ticket | admin's init, mesh grant, secrets     nothing on disk yet
//!  lock ────── PCR 15 ← cluster ID
//!  format ──── header "formatting" → map → mkfs → mount → marker file   ┐
//!  keep ────── 1. lib/hawser/mesh/{wireguard.key,mesh.json} (the key,  │ a cut here: the next
//!                 the node's place in the mesh)                       │
//!              2. var/lib/hawser/kubeadm-intent.json                    │ boot formats again
//!              3. var/lib/hawser/cluster/{master-secret.json,           │ and asks again (a
//!                 measurement-salt,kubernetes-version}                  │ fresh join, or the
//!              4. var/lib/hawser-joind/control-plane-approvals (init)   │ admin's init again)
//!  mark ────── header "initialized" ◄── the point of no return          ┘
//!  then ────── mesh (key read back), pivot, kubeadm from the intent,      a cut here: the rejoin
//!              join service from the secrets                              finds every grant
//! ```
//!
//! Each file is written whole and fsynced ([`Kept::write_under`]); the directories they land
//! in are listed first, with their modes. A cut before the mark costs the grants of the
//! abandoned disk: its binding and mesh address stay in the cluster's store under the old
//! LUKS2 UUID (a stale peer), and its bootstrap token expires unused.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use hawser_kube_types::KubernetesVersion;
use hawser_mesh::PrivateKey;
use tracing::{info, warn};
use zeroize::Zeroizing;

use super::error::KubeadmRunError;
use super::intent::{KUBEADM_INTENT, KubeadmIntent, Verb};
use super::{NodeIdentity, Role};
use crate::disk::lifecycle::Kept;
use crate::enrollment::init_server::{ClusterSpec, GrantKind};
use crate::enrollment::race::{ClusterSecrets, Membership};
use crate::fatal::error_chain;
use crate::kube::join_service;
use crate::kube::kubeadm::{self, InitRequest, JoinRequest};
use crate::mesh::{self, MeshGrant, MeshSetupError};
use hawser_kube_types::JoinTicket;

/// The directories the grants land in that are not 0700: the rootfs's `/var` and `/var/lib`.
const SHARED_DIRS: [&str; 2] = ["var", "var/lib"];

/// What kubeadm is granted on this boot: a new cluster (`hawser init`) or a join ticket.
#[derive(Clone, Copy)]
pub enum KubeadmGrant<'a> {
    Init(&'a ClusterSpec),
    Join(&'a JoinTicket),
}

impl Role {
    /// This boot's kubeadm grant; `None` for a rejoining or recovered node.
    pub(super) fn kubeadm_grant(&self) -> Option<KubeadmGrant<'_>> {
        match self {
            Role::Init { spec, .. } => Some(KubeadmGrant::Init(spec)),
            Role::Join(ticket) => Some(KubeadmGrant::Join(ticket)),
            Role::Rejoin => None,
        }
    }
}

/// What the race granted on this boot, as far as the state disk keeps it.
pub struct Granted<'a> {
    /// The disk's LUKS2 UUID (the node's name).
    pub disk_uuid: &'a str,
    pub kubeadm: Option<KubeadmGrant<'a>>,
    /// The cluster's secrets: the admin's, or a control-plane join's.
    pub secrets: Option<&'a ClusterSecrets>,
    pub mesh: Option<&'a MeshGrant>,
}

impl<'a> Granted<'a> {
    /// The race's membership for the disk `disk_uuid`, read as the node's role will be
    /// (`boot::after_disk::role`): the admin's `hawser init` is kubeadm init on an image with
    /// a rootfs, `hawser recover` grants nothing new, a join ticket is kubeadm join.
    pub fn of(membership: &'a Membership, disk_uuid: &'a str, rootfs: bool) -> Self {
        let kubeadm = match (&membership.admin, &membership.kubeadm) {
            (Some((GrantKind::Init(spec), _)), _) if rootfs => Some(KubeadmGrant::Init(spec)),
            (Some(_), _) => None,
            (None, ticket) => ticket.as_ref().map(KubeadmGrant::Join),
        };
        Granted {
            disk_uuid,
            kubeadm,
            secrets: membership.secrets.as_ref(),
            mesh: membership.mesh.as_ref(),
        }
    }
}

/// This boot's node, as far as its grants need it.
pub struct FirstBoot<'a> {
    /// The image's Kubernetes version (`hawser.kubernetes`): a join ticket must name it.
    pub image_kubernetes: Option<&'a KubernetesVersion>,
    /// The WireGuard key generated before the join: its public half went in the request.
    pub mesh_key: &'a PrivateKey,
    /// The image has a rootfs (`hawser.root_hash`): kubeadm and a join service run here.
    pub rootfs: bool,
    /// The node IP without a mesh (its LAN or `hawser.net` address).
    pub underlay_ip: Option<Ipv4Addr>,
}

/// A join ticket this image cannot act on: checked after the race, before the node lock and
/// the state disk, so a refused node stays fresh.
#[derive(Debug, thiserror::Error)]
pub enum TicketVersionError {
    /// The ticket's version is not a Kubernetes version (the join service's configuration).
    #[error("the join ticket's Kubernetes version {value:?} is not one")]
    Malformed {
        /// The version as the ticket gave it.
        value: String,
        #[source]
        source: hawser_kube_types::KubernetesVersionError,
    },
    /// The cluster runs another version than the image carries.
    #[error(
        "the join service hands out Kubernetes {ticket}, but this image carries {image} \
         (hawser.kubernetes on its command line) and installs no other: run the cluster's join \
         service with --kubernetes-version {image}, or boot this node from an image of {ticket}"
    )]
    NotTheImages {
        /// The ticket's version.
        ticket: KubernetesVersion,
        /// The image's version.
        image: KubernetesVersion,
    },
}

/// Refuses a join ticket whose Kubernetes version is not the image's, naming both. Nothing to
/// check without a ticket or without a version on the image's command line (no rootfs).
pub fn check_ticket_version(
    ticket: Option<&JoinTicket>,
    image: Option<&KubernetesVersion>,
) -> Result<(), TicketVersionError> {
    let (Some(ticket), Some(image)) = (ticket, image) else {
        return Ok(());
    };
    let version = ticket
        .kubernetes_version
        .parse::<KubernetesVersion>()
        .map_err(|source| TicketVersionError::Malformed {
            value: ticket.kubernetes_version.clone(),
            source,
        })?;
    if version != *image {
        return Err(TicketVersionError::NotTheImages {
            ticket: version,
            image: image.clone(),
        });
    }
    Ok(())
}

/// What a first boot keeps on its new state disk before marking it initialized, in order:
/// the WireGuard key, kubeadm's intent, a control plane's secrets (with the admin's approvals).
/// A WireGuard key the ticket does not hold is refused here, before the mark. An intent that
/// cannot be rendered is left out (the node's run renders it again and reports why), as is
/// everything kubeadm needs when the image has no rootfs or the node no identity: those
/// nodes run no kubeadm.
pub fn first_boot_files(
    granted: &Granted<'_>,
    first: &FirstBoot<'_>,
) -> Result<Vec<Kept>, MeshSetupError> {
    let kept = collect(granted, first)?;
    let files: Vec<String> = kept
        .iter()
        .filter(|kept| matches!(kept, Kept::File { .. }))
        .map(|kept| kept.path().display().to_string())
        .collect();
    if !files.is_empty() {
        info!(
            "the new state disk keeps the one-time grants before its \"initialized\" mark: {}",
            files.join(", ")
        );
    }
    Ok(kept)
}

fn collect(granted: &Granted<'_>, first: &FirstBoot<'_>) -> Result<Vec<Kept>, MeshSetupError> {
    let mut kept = KeptList::default();
    if let Some(grant) = granted.mesh {
        let key = mesh::key_to_keep(first.mesh_key, grant)?;
        kept.file(PathBuf::from(mesh::KEY_FILE), key, 0o600);
        match serde_json::to_vec_pretty(&grant.settings()) {
            Ok(bytes) => kept.file(
                PathBuf::from(mesh::SETTINGS_FILE),
                Zeroizing::new(bytes),
                0o600,
            ),
            Err(e) => warn!("cannot encode the node's place in the mesh: {e}; it is not kept"),
        }
    }
    let identity = granted
        .mesh
        .map(|grant| grant.node_ip)
        .or(first.underlay_ip)
        .map(|ip| NodeIdentity {
            name: crate::enrollment::client::node_name(granted.disk_uuid),
            ip: ip.into(),
        });
    let (Some(grant), true, Some(identity)) = (granted.kubeadm, first.rootfs, identity) else {
        return Ok(kept.0);
    };
    match render_intent(grant, &identity) {
        Ok(intent) => match intent.encode() {
            Ok(bytes) => kept.file(on_state_disk(Path::new(KUBEADM_INTENT)), bytes, 0o600),
            Err(e) => warn!("cannot encode kubeadm's intent: {e}; it is not kept"),
        },
        Err(e) => warn!("{}; kubeadm's intent is not kept", error_chain(&e)),
    }
    if let Some(secrets) = granted.secrets {
        for file in cluster_secret_files(grant, secrets) {
            kept.file(on_state_disk(&file.path), file.bytes, file.mode);
        }
    }
    Ok(kept.0)
}

/// A control plane's cluster secrets with the Kubernetes version its join service hands out:
/// the admin's (`hawser init`, with the control planes it approved) or a control-plane join's.
/// Nothing when they cannot be kept (logged: the join service then does not run here).
fn cluster_secret_files(
    grant: KubeadmGrant<'_>,
    secrets: &ClusterSecrets,
) -> Vec<join_service::SecretFile> {
    let files = match grant {
        KubeadmGrant::Init(spec) => join_service::secret_files(
            secrets,
            &spec.kubernetes_version,
            Some(&spec.control_plane_approvals),
        ),
        KubeadmGrant::Join(ticket) => {
            match ticket.kubernetes_version.parse::<KubernetesVersion>() {
                Ok(version) => join_service::secret_files(secrets, &version, None),
                Err(e) => {
                    warn!(
                        "the cluster's join service will not run here: the join ticket's \
                     Kubernetes version {:?}: {e}",
                        ticket.kubernetes_version
                    );
                    return Vec::new();
                }
            }
        }
    };
    files.unwrap_or_else(|e| {
        warn!(
            "{}; the cluster's join service will not run here",
            error_chain(&e)
        );
        Vec::new()
    })
}

/// The kubeadm configuration of a new cluster or a join ticket, rendered for this node.
pub(super) fn render_intent(
    grant: KubeadmGrant<'_>,
    identity: &NodeIdentity,
) -> Result<KubeadmIntent, KubeadmRunError> {
    let (verb, config, control_plane_files) = match grant {
        KubeadmGrant::Init(spec) => (
            Verb::Init,
            kubeadm::init_config(&InitRequest {
                cluster_name: spec.cluster_name.clone(),
                kubernetes_version: spec.kubernetes_version.clone(),
                service_cidr: spec.service_cidr,
                pod_cidr: None,
                control_plane_endpoint: spec.control_plane_endpoint.clone(),
                cert_sans: spec.api_server_cert_sans.clone(),
                node_name: identity.name.clone(),
                node_ip: identity.ip,
                bootstrap_token: None,
                ignore_preflight_errors: Vec::new(),
            }),
            Vec::new(),
        ),
        KubeadmGrant::Join(ticket) => (
            Verb::Join,
            ticket_version(ticket).and_then(|kubernetes_version| {
                kubeadm::join_config(&JoinRequest {
                    kubernetes_version,
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
            }),
            ticket.control_plane_files.clone().unwrap_or_default(),
        ),
    };
    Ok(KubeadmIntent {
        verb,
        config: config.map_err(KubeadmRunError::Config)?,
        control_plane_files,
        images: None,
    })
}

/// The join ticket's Kubernetes version, which chooses the kubeadm API.
fn ticket_version(ticket: &JoinTicket) -> Result<KubernetesVersion, kubeadm::KubeadmConfigError> {
    ticket
        .kubernetes_version
        .parse()
        .map_err(|source| kubeadm::KubeadmConfigError::TicketVersion {
            value: ticket.kubernetes_version.clone(),
            source,
        })
}

/// A path of the rootfs's `/var` as it lies on the state disk (its `var/` directory).
fn on_state_disk(after_pivot: &Path) -> PathBuf {
    after_pivot
        .strip_prefix("/")
        .unwrap_or(after_pivot)
        .to_path_buf()
}

/// The kept list, each file after the directories it lands in (0700 unless shared).
#[derive(Default)]
struct KeptList(Vec<Kept>);

impl KeptList {
    fn file(&mut self, path: PathBuf, bytes: Zeroizing<Vec<u8>>, mode: u32) {
        let mut dirs: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .filter(|dir| !dir.as_os_str().is_empty())
            .collect();
        dirs.reverse();
        for dir in dirs {
            if !self.0.iter().any(|kept| kept.path() == dir) {
                let shared = SHARED_DIRS.iter().any(|shared| Path::new(shared) == dir);
                self.0
                    .push(Kept::dir(dir, if shared { 0o755 } else { 0o700 }));
            }
        }
        self.0.push(Kept::file(path, bytes, mode));
    }
}

#[cfg(test)]
mod tests;
