//! The pivot into the verified rootfs, after the state disk (images with `hawser.root_hash`):
//!
//! 1. the rootfs is opened with dm-verity against the measured root hash, mounted read-only,
//!    the node's writable state bound in from the state disk ([`super::plan`]);
//! 2. PCR 11 ← `leave-initrd` (a control plane's `control-plane` first), then `switch_root`
//!    (PID 1 stays, the initramfs is kept open until the networking modules are loaded from it,
//!    [`super::networking`], then deleted).

use std::sync::Arc;
use std::time::Instant;

use hawser_attestation::tpm::Tpm;
use hawser_pcr::PCR_KERNEL_BOOT;
use tracing::{info, warn};

use super::networking::{KUBERNETES_SYSCTLS, prepare_kubernetes_networking};
use super::{RootHash, RootfsPlan, StateBacking};
use crate::platform::error_chain;
use crate::platform::mounts::SharedMountTable;
use crate::platform::syscalls::LinuxSyscalls;
use crate::platform::timings::PhaseTimer;

/// Why the node cannot pivot.
#[derive(Debug, thiserror::Error)]
pub enum PivotError {
    /// The rootfs partition cannot be found, verified or mapped (its own message says which).
    #[error(transparent)]
    Rootfs(#[from] super::RootfsError),
    /// A step of the switch into the new root failed (its own message says which).
    #[error(transparent)]
    Switch(#[from] super::plan::SwitchRootError),
    /// `/proc`, `/sys`, `/dev` and the rest cannot be mounted in the new root.
    #[error("cannot mount the new root's API filesystems")]
    Mounts(#[source] crate::platform::mounts::MountError),
    /// The blocking task that switches roots panicked or was cancelled.
    #[error("a blocking task of the pivot failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Opens the verified rootfs and switches into it; records the new root's mounts
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
    role: super::MeasuredRole,
    mounts: &SharedMountTable,
    timer: &PhaseTimer,
) -> Result<Pivoted, PivotError> {
    let device = super::open_verity_root(root_hash, super::PARTITION_WAIT).await?;
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
        super::plan::switch_root(&LinuxSyscalls, &plan, &mut |phase| {
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
        .mount_all(&LinuxSyscalls, &super::plan::NEW_ROOT_API_MOUNTS)
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
        // The new root: the rootfs carries Kubernetes' modules.
        let prepared = prepare_kubernetes_networking(std::path::Path::new("/"));
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
            super::plan::delete_old_root(&LinuxSyscalls, old_root);
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
