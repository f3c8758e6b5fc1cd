//! The join core's re-attestation decisions ([`crate::reattest`]): judging a member's quote,
//! asking for the next one, evicting the member whose quote fails or goes stale.

use std::sync::Arc;

use hawser_attestation::evidence::{Binding, Role};
use hawser_attestation::validator::{EvidenceError, Validator};
use hawser_cluster_store::releases::{self, INITRAMFS_PHASE, Release};
use hawser_cluster_store::{DiskBinding, PutMode, ReadConsistency, RecordKind};

use super::JoinCore;
use crate::reattest::{Attested, Reattestation, Verdict, lock, now_unix};

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
        match self.revoke_node(id, reason).map(|_| ()) {
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

impl JoinCore {
    /// Evicts stale members every half interval, until the task is dropped.
    pub async fn watch_reattestation(core: Arc<JoinCore>) {
        let Some(interval) = core.reattestation().map(|r| r.interval) else {
            return;
        };
        loop {
            tokio::time::sleep(interval / 2).await;
            let core = Arc::clone(&core);
            let _ = tokio::task::spawn_blocking(move || core.evict_stale()).await;
        }
    }
}
