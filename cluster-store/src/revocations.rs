//! The deny-list: nodes the admin revoked (`hawser node revoke`), by AK name, with their disk.
//!
//! A revoked AK is refused every join and rejoin, naming the revocation, and so is its disk
//! from any AK; its mesh membership is removed by the same call. Readmitting keeps the record
//! (`readmitted_unix`), so the audit trail stays in the store.

use crate::{ClusterStore, PutMode, ReadConsistency, RecordKind, StoreError};

/// One revoked node (`/hawser/v1/revoked/<AK name>`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revocation {
    /// The AK's name, lowercase hex.
    pub ak_name: String,
    /// The node's state disk, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_uuid: Option<String>,
    /// The node's name as the admin knows it.
    pub node: String,
    /// Why (the admin's words, or the re-attestation failure).
    pub reason: String,
    /// When, seconds since the Unix epoch.
    pub revoked_unix: u64,
    /// When the admin readmitted it; `None` while revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readmitted_unix: Option<u64>,
}

impl Revocation {
    /// Its record's name: the AK's, or the disk's for a member whose AK is not known.
    pub fn key(&self) -> &str {
        if self.ak_name.is_empty() {
            self.disk_uuid.as_deref().unwrap_or("unknown")
        } else {
            &self.ak_name
        }
    }

    /// Whether it is in force.
    pub fn in_force(&self) -> bool {
        self.readmitted_unix.is_none()
    }
}

/// Every revocation, in force or not.
pub fn list(
    store: &dyn ClusterStore,
    consistency: ReadConsistency,
) -> Result<Vec<Revocation>, StoreError> {
    store
        .records(RecordKind::Revocation, consistency)?
        .into_iter()
        .map(|(name, bytes)| {
            serde_json::from_slice(&bytes).map_err(|source| StoreError::RecordJson {
                kind: "revocation",
                name,
                source,
            })
        })
        .collect()
}

/// The revocation in force that covers `ak_name` or `disk_uuid`, if any.
pub fn find<'a>(
    revocations: &'a [Revocation],
    ak_name: &str,
    disk_uuid: Option<&str>,
) -> Option<&'a Revocation> {
    revocations.iter().filter(|r| r.in_force()).find(|r| {
        (!r.ak_name.is_empty() && r.ak_name.eq_ignore_ascii_case(ak_name))
            || disk_uuid.is_some_and(|d| r.disk_uuid.as_deref() == Some(d))
    })
}

/// Writes `revocation` (replacing an earlier, readmitted one of the same AK).
pub fn revoke(store: &dyn ClusterStore, revocation: &Revocation) -> Result<(), StoreError> {
    let json = serde_json::to_vec_pretty(revocation).map_err(|source| StoreError::RecordJson {
        kind: "revocation",
        name: revocation.ak_name.clone(),
        source,
    })?;
    store.put_record(
        RecordKind::Revocation,
        &revocation.ak_name,
        &json,
        PutMode::Replace,
    )?;
    Ok(())
}

/// Marks the revocation named `key` ([`Revocation::key`]) readmitted; `Ok(None)` if there is
/// none in force.
pub fn readmit(
    store: &dyn ClusterStore,
    key: &str,
    now_unix: u64,
) -> Result<Option<Revocation>, StoreError> {
    let revocations = list(store, ReadConsistency::Latest)?;
    let Some(mut revocation) = revocations
        .into_iter()
        .find(|r| r.in_force() && r.key().eq_ignore_ascii_case(key))
    else {
        return Ok(None);
    };
    revocation.readmitted_unix = Some(now_unix);
    revoke(store, &revocation)?;
    Ok(Some(revocation))
}
