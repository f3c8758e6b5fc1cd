//! The join services a node has heard of, and when it stops believing in them: a pure state
//! machine over instants the caller passes in (no clock, no sockets).
//!
//! ```text
//!            observe (room, or a dead entry to evict)     observe: refreshes last_seen,
//!   (none) ──────────────────────────────────────► live ◄─ adds new addresses (never replaces)
//!     │ observe, table full of live entries          │ │
//!     ▼                                              │ └─ now > last_seen + 3.5 × interval ──► expired
//!   refused                                 goodbye  │
//!                                                    ▼
//!                          leaving: still offered, last; each address goes when it fails a
//!                          probe, the entry when none is left (or at its expiry); a new
//!                          announcement makes it live again
//! ```
//!
//! Everything here comes from anyone on the LAN, so every rule is written against a forger
//! (issue 28):
//!
//! - **Capped**: at most [`MAX_INSTANCES`] entries, [`MAX_PER_CLUSTER`] claiming any one
//!   cluster ID, [`MAX_ADDRESSES`] addresses per entry. A newcomer over a cap takes the place of
//!   a *dead* entry (one that said goodbye, or whose every address failed its last probe or a
//!   join attempt); when every entry is alive it is refused, so a flood can never push out a
//!   join service that answers. A joined node reserves [`MAX_PER_CLUSTER`] places for its own
//!   cluster ([`Sightings::reserve_for`]): adverts of other clusters, which it never probes,
//!   share the rest.
//! - **Expired**: an advert that states its announcement interval is dropped after three missed
//!   announcements, each counting as missed half an interval after it was due; one that states
//!   none is taken to announce every [`DEFAULT_INTERVAL`] (it used to live forever). Each
//!   address expires the same way, counted from the last announcement that listed it.
//! - **Addresses add up**: a new address (a forged A record, or a renumbered host) is added
//!   beside the ones already known, never in their place, so a forged address costs one probe
//!   and the real one stays.
//! - **A goodbye is a hint**: a forged one must not remove a real join service, so the entry is
//!   kept (offered last) until its addresses fail a probe; a real goodbye's closed port fails at
//!   once.
//!
//! This is kept apart from mdns-sd's record cache, whose TTLs (75 minutes for TXT) are for
//! another purpose.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::advert::JoinServiceAdvert;
use crate::{Candidate, Source};

/// How many announcements an entry may miss before it expires.
pub const MISSED_ANNOUNCEMENTS: u32 = 3;
/// The announcement interval assumed for an advert that states none (Avahi's, or a forger's):
/// hawser-joind's default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The most entries kept: bounds memory and the probes of a round.
pub const MAX_INSTANCES: usize = 512;
/// The most entries claiming one cluster ID (a joined node tries only its own cluster's: this
/// bounds its rounds whatever other clusters claim).
pub const MAX_PER_CLUSTER: usize = 256;
/// The most addresses kept per entry.
pub const MAX_ADDRESSES: usize = 8;

/// What an observation changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A join service not known before.
    Appeared(SocketAddr),
    /// A known one, announced again at the addresses known.
    Refreshed,
    /// A known one, announced with an address not known before, now offered beside the others.
    AddressAdded(SocketAddr),
    /// An observation without any address: nothing to reach, nothing changed.
    Unreachable,
    /// A join service not known before, left out: the table (or its cluster's share) is full
    /// of entries that answer.
    Refused,
}

#[derive(Debug, Clone)]
struct Address {
    /// The last announcement that listed it.
    last_seen: Instant,
    /// Failed probes since it last answered one.
    probe_failures: u32,
    /// Join attempts that failed there.
    attempt_failures: u32,
}

impl Address {
    fn new(now: Instant) -> Self {
        Address {
            last_seen: now,
            probe_failures: 0,
            attempt_failures: 0,
        }
    }

    fn failed(&self) -> bool {
        self.probe_failures > 0 || self.attempt_failures > 0
    }

    fn failures(&self) -> u32 {
        self.probe_failures.saturating_add(self.attempt_failures)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    advert: JoinServiceAdvert,
    addresses: BTreeMap<IpAddr, Address>,
    last_seen: Instant,
    /// A goodbye was heard since the last announcement.
    leaving: bool,
}

impl Entry {
    fn lifetime(&self) -> Duration {
        lifetime(self.advert.interval.unwrap_or(DEFAULT_INTERVAL))
    }

    fn expires_after(&self) -> Instant {
        self.last_seen + self.lifetime()
    }

    /// Said goodbye, or every address failed its last probe or a join attempt: its place can
    /// go to a newcomer.
    fn dead(&self) -> bool {
        self.leaving || self.addresses.values().all(Address::failed)
    }
}

/// The adverts heard, by instance name.
#[derive(Debug, Default, Clone)]
pub struct Sightings {
    entries: BTreeMap<String, Entry>,
    refused: u64,
    /// The cluster a joined node belongs to: [`MAX_PER_CLUSTER`] places are kept for it.
    reserved: Option<String>,
}

impl Sightings {
    /// No adverts heard yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An announcement of `advert` from `addresses` at `now`. Addresses not known before are
    /// added (up to [`MAX_ADDRESSES`], taking the place of one that failed its probes); known
    /// ones are refreshed; none is removed here (see [`Sightings::expire`]).
    pub fn observe(
        &mut self,
        advert: JoinServiceAdvert,
        addresses: &[IpAddr],
        now: Instant,
    ) -> Change {
        if addresses.is_empty() {
            return Change::Unreachable;
        }
        let port = advert.port;
        let instance = advert.instance.clone();
        if let Some(entry) = self.entries.get_mut(&instance) {
            entry.advert = advert;
            entry.last_seen = now;
            entry.leaving = false;
            let mut added = None;
            for &ip in addresses {
                if let Some(known) = entry.addresses.get_mut(&ip) {
                    known.last_seen = now;
                } else if make_room(&mut entry.addresses) {
                    entry.addresses.insert(ip, Address::new(now));
                    added.get_or_insert(SocketAddr::new(ip, port));
                }
            }
            return added.map_or(Change::Refreshed, Change::AddressAdded);
        }
        if !self.room_for(&advert.cluster_id) {
            self.refused = self.refused.saturating_add(1);
            return Change::Refused;
        }
        let addresses: BTreeMap<IpAddr, Address> = addresses
            .iter()
            .take(MAX_ADDRESSES)
            .map(|&ip| (ip, Address::new(now)))
            .collect();
        let first = addresses.keys().next().copied();
        self.entries.insert(
            instance,
            Entry {
                advert,
                addresses,
                last_seen: now,
                leaving: false,
            },
        );
        first.map_or(Change::Unreachable, |ip| {
            Change::Appeared(SocketAddr::new(ip, port))
        })
    }

    /// Keeps [`MAX_PER_CLUSTER`] places for `cluster_id` (a joined node's cluster; `None`:
    /// a fresh node, every cluster alike): other clusters' adverts share the rest, and when the
    /// table is full one of theirs makes room for one of this cluster's.
    pub fn reserve_for(&mut self, cluster_id: Option<String>) {
        self.reserved = cluster_id;
    }

    /// Whether a new entry claiming `cluster_id` fits, evicting one if a cap is reached: a dead
    /// entry of the share that is full (the one heard of longest ago), or for the reserved
    /// cluster, when the whole table is full, any entry of another cluster.
    fn room_for(&mut self, cluster_id: &str) -> bool {
        let reserved = self.reserved.as_deref();
        let same_cluster = self
            .entries
            .values()
            .filter(|entry| entry.advert.cluster_id == cluster_id)
            .count();
        let others_full = reserved.is_some_and(|own| {
            own != cluster_id
                && self
                    .entries
                    .values()
                    .filter(|entry| entry.advert.cluster_id != own)
                    .count()
                    >= MAX_INSTANCES - MAX_PER_CLUSTER
        });
        let table_full = self.entries.len() >= MAX_INSTANCES;
        let cluster_full = same_cluster >= MAX_PER_CLUSTER;
        if !cluster_full && !table_full && !others_full {
            return true;
        }
        // Whose place a newcomer may take.
        let evictable = |entry: &Entry| {
            let theirs = &entry.advert.cluster_id;
            if cluster_full {
                entry.dead() && theirs == cluster_id
            } else if others_full {
                entry.dead() && Some(theirs.as_str()) != reserved
            } else if reserved == Some(cluster_id) {
                theirs != cluster_id || entry.dead()
            } else {
                entry.dead()
            }
        };
        let victim = self
            .entries
            .iter()
            .filter(|(_, entry)| evictable(entry))
            .min_by_key(|(_, entry)| (!entry.dead(), entry.last_seen))
            .map(|(instance, _)| instance.clone());
        match victim {
            Some(victim) => {
                tracing::debug!(%victim, "a join service advert makes room for a new one");
                self.entries.remove(&victim);
                true
            }
            None => false,
        }
    }

    /// A goodbye (records with TTL 0) for `instance`: it is offered last from now on, and goes
    /// as soon as its addresses fail a probe (anyone can forge a goodbye). Returns whether it
    /// was known.
    pub fn goodbye(&mut self, instance: &str) -> bool {
        match self.entries.get_mut(instance) {
            Some(entry) => {
                entry.leaving = true;
                true
            }
            None => false,
        }
    }

    /// The outcome of a probe of `endpoint` (a TCP connection): an answer clears the failed
    /// probes of every entry's address there, a failure counts one more.
    pub fn probed(&mut self, endpoint: SocketAddr, answered: bool) {
        self.failed_or_not(endpoint, |address| {
            if answered {
                address.probe_failures = 0;
            } else {
                address.probe_failures = address.probe_failures.saturating_add(1);
            }
            !answered
        });
    }

    /// A join attempt at `endpoint` failed (no join service, a refusal, another cluster's): it
    /// is offered after those not tried yet, and its place can go to a newcomer.
    pub fn attempt_failed(&mut self, endpoint: SocketAddr) {
        self.failed_or_not(endpoint, |address| {
            address.attempt_failures = address.attempt_failures.saturating_add(1);
            true
        });
    }

    /// Applies `update` to every entry's address at `endpoint`; where it reports a failure, an
    /// entry that said goodbye loses the address at once, and goes with its last one.
    fn failed_or_not(
        &mut self,
        endpoint: SocketAddr,
        mut update: impl FnMut(&mut Address) -> bool,
    ) {
        let ip = endpoint.ip();
        let mut gone = Vec::new();
        for (instance, entry) in &mut self.entries {
            if entry.advert.port != endpoint.port() {
                continue;
            }
            let Some(address) = entry.addresses.get_mut(&ip) else {
                continue;
            };
            if update(address) && entry.leaving {
                entry.addresses.remove(&ip);
                if entry.addresses.is_empty() {
                    gone.push(instance.clone());
                }
            }
        }
        for instance in gone {
            tracing::info!(%instance, "a join service that said goodbye does not answer: gone");
            self.entries.remove(&instance);
        }
    }

    /// Drops the entries that missed [`MISSED_ANNOUNCEMENTS`] announcements by `now`, and the
    /// addresses no announcement listed for as long; returns the instance names dropped.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        for (instance, entry) in &mut self.entries {
            let lifetime = entry.lifetime();
            entry
                .addresses
                .retain(|_, address| now <= address.last_seen + lifetime);
            if now > entry.expires_after() || entry.addresses.is_empty() {
                expired.push(instance.clone());
            }
        }
        for instance in &expired {
            self.entries.remove(instance);
        }
        expired
    }

    /// When the next entry expires, for a caller that wants to sleep until then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries.values().map(Entry::expires_after).min()
    }

    /// Every endpoint of every entry as a candidate, by instance name then address.
    pub fn candidates(&self) -> Vec<Candidate> {
        self.entries
            .values()
            .flat_map(|entry| {
                entry.addresses.iter().map(|(&ip, address)| Candidate {
                    endpoint: SocketAddr::new(ip, entry.advert.port),
                    instance: Some(entry.advert.instance.clone()),
                    cluster_id: Some(entry.advert.cluster_id.clone()),
                    version: Some(entry.advert.version.clone()),
                    api_port: Some(entry.advert.api_port),
                    source: Source::Mdns,
                    last_seen: address.last_seen,
                    failures: address.failures(),
                    leaving: entry.leaving,
                })
            })
            .collect()
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many new adverts were refused because the table was full of live entries.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

/// Makes room for one more address: true if there is some, or once the address with the most
/// failed probes is dropped; false when every address answers (the new one is then ignored).
fn make_room(addresses: &mut BTreeMap<IpAddr, Address>) -> bool {
    if addresses.len() < MAX_ADDRESSES {
        return true;
    }
    let worst = addresses
        .iter()
        .filter(|(_, address)| address.failed())
        .max_by_key(|(_, address)| address.failures())
        .map(|(&ip, _)| ip);
    worst.is_some_and(|ip| addresses.remove(&ip).is_some())
}

/// The deadline rule, for documentation and tests: how long after its last announcement an
/// advert with `interval` lives.
pub fn lifetime(interval: Duration) -> Duration {
    interval * MISSED_ANNOUNCEMENTS + interval / 2
}

#[cfg(test)]
#[path = "sightings_tests.rs"]
mod tests;
