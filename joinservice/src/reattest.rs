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
//!
//! The decisions are the join core's (`core/reattest.rs`); this module holds their settings and
//! state.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hawser_attestation::validator::AkTrust;

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
    pub(crate) ak_trust: AkTrust,
    pub(crate) cluster_id: [u8; 32],
    pub(crate) started_unix: u64,
    /// Nonces asked of members, by member ID: (nonce, when asked).
    pub(crate) asked: Mutex<HashMap<String, ([u8; 32], u64)>>,
    /// When each member last quoted well, as this service saw it.
    pub(crate) attested: Mutex<HashMap<String, u64>>,
    /// When this service first saw each member (a member admitted later gets a whole grace
    /// period from then).
    pub(crate) first_seen: Mutex<HashMap<String, u64>>,
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

pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
