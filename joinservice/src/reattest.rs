//! Periodic re-attestation of the mesh's members (`docs/lifecycle.md`): a node proves its state
//! again at every interval, riding on its polls of the peer API. A join service that answers a
//! member's poll asks for a fresh quote (`attest_nonce`, 32 random bytes) once the member's last
//! good one is older than the interval; the member quotes for it in its next poll (its
//! provider-certified AK; role client, no TLS key, user data
//! [`hawser_proto::mesh::REATTEST_USER_DATA`]). The join service judges it as `hawser verify`
//! does: an accepted release in a running phase (a worker's or a control plane's PCR 11 after
//! the pivot), PCR 15 this cluster's lock, and the AK its disk is bound to.
//!
//! - A good quote is recorded in the cluster store (`/hawser/v1/vpn/attested/<id>`), so that
//!   every join service sees it, whichever the member polled.
//! - A bad one (another image, a retired release, PCR 11 extended after the pivot, another AK)
//!   evicts the member at once: revoked with the reason (its rejoin refused until the admin
//!   readmits it) and out of the mesh.
//! - A member with no good quote for the grace period (a node that stopped quoting, or cut off
//!   the network that long) is evicted the same way by [`watch`]; a cut shorter than the grace
//!   period costs nothing. A join service that starts counts its own start as every member's
//!   last quote (a whole-cluster restart evicts nobody).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hawser_attestation::evidence::{Binding, Role};
use hawser_attestation::validator::{AkTrust, EvidenceError, Validator};
use hawser_cluster_store::releases::{self, INITRAMFS_PHASE, Release};
use hawser_cluster_store::{DiskBinding, PutMode, ReadConsistency, RecordKind};

use crate::core::JoinCore;

/// How often a member quotes again, by default (`hawser-joind --reattest-interval-secs`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// How long a member may go without a good quote before it is evicted, by default
/// (`--reattest-grace-secs`): ten intervals, so a reboot, a control plane's restart or a network
/// cut of several minutes costs nothing.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);

/// The re-attestation of one join service.
pub struct Reattestation {
    /// How often a member quotes again.
    pub interval: Duration,
    /// How long a member may go without a good quote.
    pub grace: Duration,
    ak_trust: AkTrust,
    cluster_id: [u8; 32],
    started_unix: u64,
    /// Nonces asked of members, by member ID: (nonce, when asked).
    asked: Mutex<HashMap<String, ([u8; 32], u64)>>,
    /// When each member last quoted well, as this service saw it.
    attested: Mutex<HashMap<String, u64>>,
    /// When this service first saw each member (a member admitted later gets a whole grace
    /// period from then).
    first_seen: Mutex<HashMap<String, u64>>,
}

/// A good quote, as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attested {
    /// When, seconds since the Unix epoch.
    pub unix_time: u64,
    /// The release and phase it matched (`v2 worker`).
    pub release: String,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Reattestation {
    /// Re-attestation every `interval`, evicting after `grace`, against AKs certified by
    /// `ak_trust` and the lock of `cluster_id`.
    pub fn new(
        interval: Duration,
        grace: Duration,
        ak_trust: AkTrust,
        cluster_id: [u8; 32],
    ) -> Self {
        Self {
            interval,
            grace: grace.max(interval),
            ak_trust,
            cluster_id,
            started_unix: now_unix(),
            asked: Mutex::new(HashMap::new()),
            attested: Mutex::new(HashMap::new()),
            first_seen: Mutex::new(HashMap::new()),
        }
    }
}

/// What a poll's evidence came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No evidence, or evidence for a nonce this service did not ask (another join service's):
    /// nothing decided.
    Nothing,
    /// A good quote of this release and phase.
    Good(String),
    /// The member is evicted for this reason.
    Evicted(String),
}

impl JoinCore {
    /// The releases a member's quote may match: the store's and this service's own image.
    fn running_releases(&self) -> Vec<Release> {
        let policy = self.policy().current();
        let mut stored = self.policy().stored_releases();
        let own = releases::enforced_map(&policy.measurements);
        let digest = releases::measurements_digest(&own);
        if !stored.iter().any(|r| r.digest == digest)
            && let Ok(release) = Release::new(
                &releases::own_release_name(&digest),
                &policy.measurements,
                None,
                "this join service's image",
                0,
            )
        {
            stored.push(release);
        }
        stored
    }

    /// Judges member `id`'s `evidence` (if any) and says whether to ask it for a quote now
    /// (the nonce to send). Blocking (the store).
    pub fn reattest_poll(&self, id: &str, evidence: &[u8]) -> (Verdict, Option<[u8; 32]>) {
        let Some(re) = self.reattestation() else {
            return (Verdict::Nothing, None);
        };
        // Only nodes re-attest: a member whose ID is a disk bound to an AK.
        let Ok(uuid) = hawser_keys::canonical_uuid(id) else {
            return (Verdict::Nothing, None);
        };
        let verdict = if evidence.is_empty() {
            Verdict::Nothing
        } else {
            let asked = lock(&re.asked).remove(id);
            match asked {
                Some((nonce, _)) => self.judge(re, &uuid, &nonce, evidence),
                None => Verdict::Nothing,
            }
        };
        if let Verdict::Evicted(reason) = &verdict {
            self.evict(id, reason);
            return (verdict, None);
        }
        let now = now_unix();
        lock(&re.first_seen).entry(id.to_owned()).or_insert(now);
        let last = lock(&re.attested).get(id).copied().unwrap_or(0);
        let pending = lock(&re.asked).get(id).map(|(_, at)| *at);
        let due = now.saturating_sub(last) >= re.interval.as_secs()
            && pending.is_none_or(|at| now.saturating_sub(at) >= re.interval.as_secs());
        if !due {
            return (verdict, None);
        }
        let mut nonce = [0u8; 32];
        match hawser_keys::random_bytes(32) {
            Ok(bytes) => nonce.copy_from_slice(&bytes),
            Err(_) => return (verdict, None),
        }
        lock(&re.asked).insert(id.to_owned(), (nonce, now));
        (verdict, Some(nonce))
    }

    fn judge(&self, re: &Reattestation, uuid: &str, nonce: &[u8; 32], evidence: &[u8]) -> Verdict {
        let set = releases::running_release_set(&self.running_releases(), &re.cluster_id);
        let validator = match Validator::for_releases(set, re.ak_trust.clone()) {
            Ok(validator) => validator,
            Err(e) => {
                tracing::error!("cannot judge re-attestation: {e}");
                return Verdict::Nothing;
            }
        };
        let binding = Binding {
            role: Role::Client,
            nonce,
            tls_spki_der: &[],
        };
        let valid = match validator.validate(evidence, &binding) {
            Ok(valid) => valid,
            // Not this service's question: another join service asked, or a stale answer.
            Err(EvidenceError::NonceMismatch { .. }) => return Verdict::Nothing,
            Err(e) => {
                return Verdict::Evicted(format!(
                    "re-attestation failed: {}",
                    hawser_attestation::error_chain(&e)
                ));
            }
        };
        if valid.user_data != hawser_proto::mesh::REATTEST_USER_DATA {
            return Verdict::Evicted("re-attestation failed: not a re-attestation quote".into());
        }
        let name = validator
            .releases()
            .check(&valid.pcrs)
            .map(|(name, _)| name.to_owned())
            .unwrap_or_default();
        if name.ends_with(INITRAMFS_PHASE) {
            // Not pivoted yet (the tunnel starts in the initramfs): nothing proven, nothing
            // held against it; a node that never pivots runs out of its grace period.
            tracing::debug!(
                disk_uuid = uuid,
                "re-attestation before the pivot: asked again later"
            );
            return Verdict::Nothing;
        }
        let ak_name = hex::encode(&valid.ak_name);
        match self
            .store()
            .disk_binding(uuid, ReadConsistency::LatestOrLocal)
        {
            Ok(Some(DiskBinding::Bound(bound))) if bound != ak_name => {
                return Verdict::Evicted(format!(
                    "re-attestation failed: quoted by AK {ak_name}, but disk {uuid} is bound to AK {bound}"
                ));
            }
            _ => {}
        }
        let now = now_unix();
        lock(&re.attested).insert(uuid.to_owned(), now);
        let record = Attested {
            unix_time: now,
            release: name.clone(),
        };
        if let Ok(json) = serde_json::to_vec(&record)
            && let Err(e) =
                self.store()
                    .put_record(RecordKind::Attested, uuid, &json, PutMode::Replace)
        {
            tracing::debug!(
                disk_uuid = uuid,
                "the re-attestation is not recorded: {}",
                hawser_attestation::error_chain(&e)
            );
        }
        tracing::debug!(disk_uuid = uuid, release = %name, "re-attested");
        Verdict::Good(name)
    }

    /// Revokes member `id` for `reason` and takes it out of the mesh.
    fn evict(&self, id: &str, reason: &str) {
        match crate::admin::revoke_member(self, id, reason) {
            Ok(()) => {
                tracing::warn!(target: "audit", disk_uuid = id, reason, "member evicted from the mesh and revoked: {reason}")
            }
            Err(e) => tracing::error!(
                disk_uuid = id,
                "cannot evict the member ({reason}): {}",
                hawser_attestation::error_chain(&e)
            ),
        }
        if let Some(re) = self.reattestation() {
            lock(&re.attested).remove(id);
            lock(&re.first_seen).remove(id);
        }
    }

    /// Evicts every member of the mesh (a node: its ID a disk UUID) whose last good quote, in
    /// the store or seen here, is older than the grace period (this service's start counts as
    /// one). Blocking. Returns the evicted IDs.
    pub fn evict_stale(&self) -> Vec<String> {
        let Some(re) = self.reattestation() else {
            return Vec::new();
        };
        let Ok(Some(registry)) = self.store().vpn_registry(ReadConsistency::Latest) else {
            return Vec::new();
        };
        let stored = match self
            .store()
            .records(RecordKind::Attested, ReadConsistency::Latest)
        {
            Ok(stored) => stored,
            Err(e) => {
                tracing::debug!(
                    "cannot read the members' attestations: {}",
                    hawser_attestation::error_chain(&e)
                );
                return Vec::new();
            }
        };
        let now = now_unix();
        let mut evicted = Vec::new();
        for (id, _) in registry.members() {
            if hawser_keys::canonical_uuid(id).is_err() {
                continue;
            }
            let in_store = stored
                .get(id)
                .and_then(|b| serde_json::from_slice::<Attested>(b).ok())
                .map_or(0, |a| a.unix_time);
            let seen = lock(&re.attested).get(id).copied().unwrap_or(0);
            let first = *lock(&re.first_seen).entry(id.to_owned()).or_insert(now);
            let last = in_store.max(seen).max(re.started_unix).max(first);
            if now.saturating_sub(last) > re.grace.as_secs() {
                evicted.push(id.to_owned());
            }
        }
        for id in &evicted {
            self.evict(
                id,
                &format!(
                    "no fresh attestation for {} s (the grace period): it stopped quoting, or \
                     was cut off that long",
                    re.grace.as_secs()
                ),
            );
        }
        evicted
    }
}

/// Evicts stale members every half interval, until the task is dropped.
pub async fn watch(core: Arc<JoinCore>) {
    let Some(interval) = core.reattestation().map(|r| r.interval) else {
        return;
    };
    loop {
        tokio::time::sleep(interval / 2).await;
        let core = Arc::clone(&core);
        let _ = tokio::task::spawn_blocking(move || core.evict_stale()).await;
    }
}
