//! Which role PCR 11 records at the pivot: whether this node extends the control-plane marker
//! (`control-plane`, immediately before `leave-initrd`: [`crate::rootfs::plan`]).
//!
//! A joining node trusts as its join service only a TPM whose PCR 11 carries the marker
//! ([`crate::enrollment::join_service_policy`]), so the marker is what makes a node's join
//! service believable, and PID 1 must extend it only for a node that *is* one of its cluster's
//! control planes: one that holds the cluster's master secret. The secret may come from this
//! boot's grant (the admin's `hawser init`, or an approved control-plane join, whose master
//! secret the join client checked against the key it was sent) or from the state disk, where a
//! control plane keeps it for later boots. The disk's copy is checked before it counts: root
//! on a worker can write any file into its own `/var`, but it never learns a master secret,
//! and no other secret derives the cluster ID this node's lock put into PCR 15 (HKDF is one
//! way). So the rule is: **the marker iff a master secret this node holds derives the cluster
//! ID its PCR 15 is locked to.** A node without a lock (PCR 15 zero) is never a control plane.
//!
//! `hawser recover` sends the master secret too, but a recovered worker keeps none and runs no
//! join service: only the disk's copy counts on such a boot (a recovered control plane kept
//! one on its first boot).

use std::path::{Path, PathBuf};

use hawser_pcr::{PCR_CLUSTER_ID, cluster_lock_pcr};
use tracing::{info, warn};

use super::context::Boot;
use crate::enrollment::race::ClusterSecrets;
use crate::platform::error_chain;
use crate::rootfs::MeasuredRole;

/// Where a control plane's kept secrets are before the pivot: the state disk's `/var` is bound
/// onto the new root's `/var` at the pivot ([`crate::kube::join_service::CLUSTER_DIR`] after it).
pub(super) fn kept_secrets_dir() -> PathBuf {
    Path::new(crate::disk::STATE_MOUNT_POINT)
        .join(crate::kube::join_service::CLUSTER_DIR.trim_start_matches('/'))
}

/// The rule of the module docs: `granted` (this boot's grant, when the node keeps it) or
/// `kept` (the state disk's copy) must derive the cluster ID PCR 15 is locked to.
pub(super) fn decide(
    granted: Option<&ClusterSecrets>,
    kept: Option<&ClusterSecrets>,
    pcr15: &[u8; 32],
) -> MeasuredRole {
    if *pcr15 == [0; 32] {
        return MeasuredRole::Worker;
    }
    let of_this_cluster = |secrets: &ClusterSecrets| {
        let cluster_id = hawser_keys::cluster_id(
            secrets.master.measurement_secret().as_slice(),
            &secrets.measurement_salt,
        );
        cluster_lock_pcr(&cluster_id) == *pcr15
    };
    if granted.into_iter().chain(kept).any(of_this_cluster) {
        MeasuredRole::ControlPlane
    } else {
        MeasuredRole::Worker
    }
}

impl Boot {
    /// The role the pivot measures for this node (see the module docs). Reading PCR 15 or the
    /// kept secrets can fail: the node is then measured as a worker (it can still join and
    /// serve workloads; only its join service would be refused), and the reason is logged.
    pub(super) async fn pivot_role(&self, state_disk: bool) -> MeasuredRole {
        // A master secret granted in this boot (a control-plane join, `hawser init`) was kept
        // on the state disk before its "initialized" mark (node/grants.rs): the disk holds
        // every control plane's, so the kept secrets decide; a worker keeps none.
        let granted: Option<&ClusterSecrets> = None;
        let tpm = match self.tpm() {
            Ok(tpm) => tpm,
            Err(e) => {
                warn!("measured as a worker: {}", error_chain(&e));
                return MeasuredRole::Worker;
            }
        };
        let read = super::context::blocking(move || {
            let pcr15 = tpm.read_pcrs_sha256(vec![PCR_CLUSTER_ID]);
            let kept = state_disk.then(|| crate::kube::join_service::load(&kept_secrets_dir()));
            (pcr15, kept)
        })
        .await;
        let (pcr15, kept) = match read {
            Ok((Ok(pcrs), kept)) => match pcrs.get(&PCR_CLUSTER_ID) {
                Some(pcr15) => (*pcr15, kept),
                None => {
                    warn!("measured as a worker: the TPM did not return PCR {PCR_CLUSTER_ID}");
                    return MeasuredRole::Worker;
                }
            },
            Ok((Err(e), _)) => {
                warn!(
                    "measured as a worker: cannot read PCR {PCR_CLUSTER_ID}: {}",
                    error_chain(&e)
                );
                return MeasuredRole::Worker;
            }
            Err(e) => {
                warn!("measured as a worker: {}", error_chain(&e));
                return MeasuredRole::Worker;
            }
        };
        let kept = match kept {
            Some(Ok(kept)) => kept.map(|(secrets, _version)| secrets),
            Some(Err(e)) => {
                warn!(
                    "the cluster secrets kept on the state disk are unusable ({}): they do not \
                     make this node a control plane",
                    error_chain(&e)
                );
                None
            }
            None => None,
        };
        let measured = decide(granted, kept.as_ref(), &pcr15);
        match (measured, granted.is_some() || kept.is_some()) {
            (MeasuredRole::ControlPlane, _) => info!(
                "this node holds its cluster's master secret: PCR 11 gets the control-plane \
                 marker before leave-initrd"
            ),
            (MeasuredRole::Worker, true) => warn!(
                "the master secret this node holds does not derive the cluster its PCR 15 is \
                 locked to: measured as a worker, so joining nodes refuse its join service"
            ),
            (MeasuredRole::Worker, false) => {}
        }
        measured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(key: u8) -> ClusterSecrets {
        ClusterSecrets {
            master: hawser_keys::MasterSecret::new(vec![key; 32], vec![2; 32]).unwrap(),
            measurement_salt: b"salt".to_vec(),
        }
    }

    fn locked_to(secrets: &ClusterSecrets) -> [u8; 32] {
        cluster_lock_pcr(&hawser_keys::cluster_id(
            secrets.master.measurement_secret().as_slice(),
            &secrets.measurement_salt,
        ))
    }

    #[test]
    fn the_marker_needs_a_master_secret_of_the_locked_cluster() {
        let ours = secrets(1);
        let pcr15 = locked_to(&ours);
        // This boot's grant, or the disk's copy, of this cluster.
        assert_eq!(
            decide(Some(&ours), None, &pcr15),
            MeasuredRole::ControlPlane
        );
        assert_eq!(
            decide(None, Some(&ours), &pcr15),
            MeasuredRole::ControlPlane
        );
        // Nothing held: a worker.
        assert_eq!(decide(None, None, &pcr15), MeasuredRole::Worker);
        // A secret of another cluster (root on a worker wrote one into its /var): a worker.
        let planted = secrets(9);
        assert_eq!(decide(None, Some(&planted), &pcr15), MeasuredRole::Worker);
        // The right master secret with another salt derives another cluster ID.
        let mut salted = secrets(1);
        salted.measurement_salt = b"other salt".to_vec();
        assert_eq!(decide(None, Some(&salted), &pcr15), MeasuredRole::Worker);
        // No lock: never a control plane, whatever it holds.
        assert_eq!(decide(Some(&ours), None, &[0; 32]), MeasuredRole::Worker);
    }

    #[test]
    fn kept_secrets_are_read_from_the_state_disk_before_the_pivot() {
        assert_eq!(
            kept_secrets_dir(),
            Path::new("/run/hawser/state/var/lib/hawser/cluster")
        );
    }
}
