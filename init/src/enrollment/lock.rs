//! The node lock: one transition, unlocked → locked(by whom, which cluster), never back.
//!
//! Constellation's bootstrapper guards the point of no return between its InitServer and
//! JoinClient with such a lock; taking it marks the TPM (PCR 15 ← cluster ID), so the node's
//! later quotes show it belongs to a cluster and it can never pass as a fresh node again in this
//! boot. The state machine is pure; what "marking" means is the caller's closure, run exactly
//! once, under the lock, by the winner.
//!
//! PCR 15's sha256 bank is extended with the cluster ID itself as the digest, as Constellation's
//! bootstrapper does, so `PCR 15 = SHA-256(0³² ‖ cluster ID)` — see [`cluster_lock_pcr`].
//!
//! That value proves one cluster only if PCR 15 was zero when the lock extended it: whoever
//! extended it first (a program before PID 1's lock, or a second lock in one boot) would make
//! the node's quotes show a value no cluster predicts — or, with the right choice, the value of
//! another cluster. So the product's mark, [`mark_tpm`], reads PCR 15 first and refuses to lock
//! unless it is still all zeros ([`MarkError::AlreadyExtended`]).

use std::sync::Mutex;

use hawser_attestation::tpm::{Tpm, TpmError};

pub use hawser_pcr::{PCR_CLUSTER_ID, cluster_lock_pcr};

/// Why the TPM could not be marked with the cluster ID.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    /// PCR 15 is not zero before the lock: something extended it first.
    #[error(
        "PCR {PCR_CLUSTER_ID} already holds {} instead of zeros: something extended it before \
         the node lock, so extending it with the cluster ID would not prove one cluster; the node \
         does not lock",
        hex::encode(value)
    )]
    AlreadyExtended { value: [u8; 32] },
    /// PCR 15 could not be read.
    #[error("cannot read PCR {PCR_CLUSTER_ID} before the node lock")]
    Read(#[source] TpmError),
    /// The read returned no value for PCR 15.
    #[error("the TPM returned no sha256 value for PCR {PCR_CLUSTER_ID}")]
    Missing,
    /// The extension failed.
    #[error("cannot extend PCR {PCR_CLUSTER_ID} with the cluster ID")]
    Extend(#[source] TpmError),
}

/// The lock's precondition on PCR 15's value: all zeros (as the TPM reset it).
pub fn check_unextended(pcr15: &[u8; 32]) -> Result<(), MarkError> {
    if pcr15.iter().all(|&b| b == 0) {
        Ok(())
    } else {
        Err(MarkError::AlreadyExtended { value: *pcr15 })
    }
}

/// The node lock's mark on `tpm` (blocking): PCR 15 ← `cluster_id`, only if PCR 15 is still
/// zero ([`check_unextended`]).
pub fn mark_tpm(tpm: &Tpm, cluster_id: &[u8; 32]) -> Result<(), MarkError> {
    let values = tpm
        .read_pcrs_sha256([PCR_CLUSTER_ID])
        .map_err(MarkError::Read)?;
    let pcr15 = values.get(&PCR_CLUSTER_ID).ok_or(MarkError::Missing)?;
    check_unextended(pcr15)?;
    tpm.extend_sha256_digest(PCR_CLUSTER_ID, cluster_id)
        .map_err(MarkError::Extend)
}

/// Who took the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    JoinClient,
    InitServer,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Owner::JoinClient => "the join client",
            Owner::InitServer => "the init server",
        })
    }
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError<E: std::error::Error + 'static> {
    /// Another contestant took the lock first.
    #[error(
        "the node lock is already held by {owner} (cluster {})",
        hex::encode(cluster_id)
    )]
    Held { owner: Owner, cluster_id: [u8; 32] },
    /// The mark (the PCR 15 extension) failed; the lock stays open.
    #[error("cannot mark the TPM with the cluster ID (PCR {PCR_CLUSTER_ID})")]
    Mark(#[source] E),
}

/// The lock's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Unlocked,
    Locked { owner: Owner, cluster_id: [u8; 32] },
}

/// The node lock.
#[derive(Debug)]
pub struct NodeLock {
    state: Mutex<State>,
}

impl Default for NodeLock {
    fn default() -> Self {
        NodeLock {
            state: Mutex::new(State::Unlocked),
        }
    }
}

impl NodeLock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn state(&self) -> State {
        *self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the lock for `owner` and `cluster_id`, running `mark` (the PCR extension) first.
    /// If `mark` fails the lock stays unlocked. Blocking (the mark talks to the TPM).
    pub fn lock<E: std::error::Error + 'static>(
        &self,
        owner: Owner,
        cluster_id: [u8; 32],
        mark: impl FnOnce(&[u8; 32]) -> Result<(), E>,
    ) -> Result<(), LockError<E>> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let State::Locked { owner, cluster_id } = *state {
            return Err(LockError::Held { owner, cluster_id });
        }
        mark(&cluster_id).map_err(LockError::Mark)?;
        *state = State::Locked { owner, cluster_id };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("tpm gone")]
    struct Gone;

    #[test]
    fn the_first_owner_wins_and_the_lock_never_opens_again() {
        let lock = NodeLock::new();
        let mut marks = Vec::new();
        lock.lock(Owner::JoinClient, [1; 32], |id| {
            marks.push(*id);
            Ok::<(), Gone>(())
        })
        .unwrap();
        let err = lock
            .lock(Owner::InitServer, [2; 32], |id| {
                marks.push(*id);
                Ok::<(), Gone>(())
            })
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the node lock is already held by the join client"),
            "{err}"
        );
        assert_eq!(marks, [[1; 32]]);
        assert_eq!(
            lock.state(),
            State::Locked {
                owner: Owner::JoinClient,
                cluster_id: [1; 32]
            }
        );
    }

    #[test]
    fn a_failed_mark_leaves_the_lock_open() {
        let lock = NodeLock::new();
        assert!(matches!(
            lock.lock(Owner::InitServer, [3; 32], |_| Err(Gone)),
            Err(LockError::Mark(Gone))
        ));
        assert_eq!(lock.state(), State::Unlocked);
        lock.lock(Owner::InitServer, [3; 32], |_| Ok::<(), Gone>(()))
            .unwrap();
    }

    #[test]
    fn only_a_zero_pcr15_may_be_marked() {
        check_unextended(&[0; 32]).unwrap();
        let mut value = [0; 32];
        value[31] = 1;
        let err = check_unextended(&value).unwrap_err();
        assert!(
            matches!(err, MarkError::AlreadyExtended { value: v } if v == value),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "PCR 15 already holds {} instead of zeros: something extended it before the node \
                 lock, so extending it with the cluster ID would not prove one cluster; the node \
                 does not lock",
                hex::encode(value)
            )
        );
        // The value a lock leaves behind is not zero either: a second lock is refused too.
        assert!(check_unextended(&cluster_lock_pcr(&[0xab; 32])).is_err());
    }

    #[test]
    fn pcr15_prediction_is_constellations_extension_by_the_cluster_id() {
        // SHA-256(0^32 || 0xab^32), computed independently with coreutils:
        // (head -c32 /dev/zero; printf '\xab%.0s' {1..32}) | sha256sum
        assert_eq!(
            hex::encode(cluster_lock_pcr(&[0xab; 32])),
            "debb3e7acfff6dd18d501042273629f0b79cb206bb8c24f59f62ddb80849403b"
        );
    }
}
