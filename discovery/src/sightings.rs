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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::advert::JoinServiceAdvert;
use crate::{Candidate, Source};

/// How many announcements an entry may miss before it expires.
pub const MISSED_ANNOUNCEMENTS: u32 = 3;
/// The announcement interval assumed for an advert that states none (Avahi's, or a forger's):
/// hawser-joind's default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The most entries kept: bounds memory (a few MiB) and the rounds a flood of adverts with
/// fixed names can cost (a round probes [`crate::lan::PROBE_BUDGET`] of them).
pub const MAX_INSTANCES: usize = 8192;
/// The most entries claiming one cluster ID, and the places a joined node keeps for its own
/// cluster whatever other clusters claim.
pub const MAX_PER_CLUSTER: usize = MAX_INSTANCES / 2;
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
    /// Its last probe answered.
    answered: bool,
    /// When a probe last answered: a join service that answers is alive, announced or not
    /// (an attacker can keep mDNS from resolving it for a while).
    last_answered: Option<Instant>,
}

impl Address {
    fn new(now: Instant) -> Self {
        Address {
            last_seen: now,
            probe_failures: 0,
            attempt_failures: 0,
            answered: false,
            last_answered: None,
        }
    }

    fn failed(&self) -> bool {
        self.probe_failures > 0 || self.attempt_failures > 0
    }

    fn failures(&self) -> u32 {
        self.probe_failures.saturating_add(self.attempt_failures)
    }

    /// The last sign of life: its last announcement, or its last answer to a probe.
    fn alive_at(&self) -> Instant {
        self.last_answered
            .map_or(self.last_seen, |answered| answered.max(self.last_seen))
    }
}

#[derive(Debug, Clone)]
struct Entry {
    advert: JoinServiceAdvert,
    addresses: BTreeMap<IpAddr, Address>,
    last_seen: Instant,
    /// A goodbye was heard since the last announcement.
    leaving: bool,
    /// Where it is in [`Census::dead`]: its `last_seen` when it was last found dead.
    dead_as_of: Option<Instant>,
}

impl Entry {
    fn lifetime(&self) -> Duration {
        lifetime(self.advert.interval.unwrap_or(DEFAULT_INTERVAL))
    }

    /// Three and a half intervals after its last announcement, or after an address last
    /// answered a probe.
    fn expires_after(&self) -> Instant {
        let answered = self
            .addresses
            .values()
            .filter_map(|a| a.last_answered)
            .max();
        answered.map_or(self.last_seen, |answered| answered.max(self.last_seen)) + self.lifetime()
    }

    /// Said goodbye, or every address failed its last probe or a join attempt: its place can
    /// go to a newcomer.
    fn dead(&self) -> bool {
        self.leaving || self.addresses.values().all(Address::failed)
    }
}

/// Who claims which cluster and which entries are dead, kept up to date with every change,
/// so that a full table chooses whose place a newcomer takes without searching (a flood
/// brings thousands of newcomers a second).
#[derive(Debug, Default, Clone)]
struct Census {
    /// Instance names by the cluster they claim.
    members: HashMap<String, BTreeSet<String>>,
    /// The dead entries, heard of longest ago first.
    dead: BTreeSet<(Instant, String)>,
    /// The same, by the cluster they claim.
    dead_in: HashMap<String, BTreeSet<(Instant, String)>>,
}

impl Census {
    fn count(&self, cluster_id: &str) -> usize {
        self.members.get(cluster_id).map_or(0, BTreeSet::len)
    }

    fn join(&mut self, cluster_id: &str, instance: &str) {
        self.members
            .entry(cluster_id.to_owned())
            .or_default()
            .insert(instance.to_owned());
    }

    fn leave(&mut self, cluster_id: &str, instance: &str) {
        if let Some(members) = self.members.get_mut(cluster_id) {
            members.remove(instance);
            if members.is_empty() {
                self.members.remove(cluster_id);
            }
        }
    }

    fn mark_dead(&mut self, cluster_id: &str, key: (Instant, String)) {
        self.dead_in
            .entry(cluster_id.to_owned())
            .or_default()
            .insert(key.clone());
        self.dead.insert(key);
    }

    fn unmark_dead(&mut self, cluster_id: &str, key: &(Instant, String)) {
        self.dead.remove(key);
        if let Some(dead) = self.dead_in.get_mut(cluster_id) {
            dead.remove(key);
            if dead.is_empty() {
                self.dead_in.remove(cluster_id);
            }
        }
    }
}

/// The adverts heard, by instance name.
#[derive(Debug, Default, Clone)]
pub struct Sightings {
    entries: BTreeMap<String, Entry>,
    census: Census,
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
        // An instance that now claims another cluster is a new advert, admitted as one.
        if self
            .entries
            .get(&instance)
            .is_some_and(|entry| entry.advert.cluster_id != advert.cluster_id)
        {
            self.remove(&instance);
        }
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
            self.reindex(&instance);
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
        self.census.join(&advert.cluster_id, &instance);
        self.entries.insert(
            instance,
            Entry {
                advert,
                addresses,
                last_seen: now,
                leaving: false,
                dead_as_of: None,
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
    /// cluster, when the whole table is full, a dead entry or else another cluster's.
    fn room_for(&mut self, cluster_id: &str) -> bool {
        let census = &self.census;
        let reserved = self.reserved.as_deref();
        let cluster_full = census.count(cluster_id) >= MAX_PER_CLUSTER;
        let others_full = reserved.is_some_and(|own| {
            own != cluster_id
                && self.entries.len() - census.count(own) >= MAX_INSTANCES - MAX_PER_CLUSTER
        });
        let table_full = self.entries.len() >= MAX_INSTANCES;
        if !cluster_full && !others_full && !table_full {
            return true;
        }
        let cluster_of = |instance: &str| {
            self.entries
                .get(instance)
                .map(|entry| entry.advert.cluster_id.as_str())
        };
        let victim = if cluster_full {
            census
                .dead_in
                .get(cluster_id)
                .and_then(BTreeSet::first)
                .map(|(_, instance)| instance)
        } else if others_full {
            census
                .dead
                .iter()
                .map(|(_, instance)| instance)
                .find(|instance| cluster_of(instance) != reserved)
        } else if reserved == Some(cluster_id) {
            // Only the reserved cluster takes the place of a live entry (another cluster's,
            // which a joined node never tries).
            census
                .dead
                .first()
                .map(|(_, instance)| instance)
                .or_else(|| {
                    census
                        .members
                        .iter()
                        .find(|(cluster, _)| cluster.as_str() != cluster_id)
                        .and_then(|(_, members)| members.first())
                })
        } else {
            census.dead.first().map(|(_, instance)| instance)
        };
        match victim.cloned() {
            Some(victim) => {
                tracing::debug!(%victim, "a join service advert makes room for a new one");
                self.remove(&victim);
                true
            }
            None => false,
        }
    }

    /// Removes an entry, from the census too.
    fn remove(&mut self, instance: &str) {
        let Some(entry) = self.entries.remove(instance) else {
            return;
        };
        let cluster_id = &entry.advert.cluster_id;
        self.census.leave(cluster_id, instance);
        if let Some(as_of) = entry.dead_as_of {
            self.census
                .unmark_dead(cluster_id, &(as_of, instance.to_owned()));
        }
    }

    /// Brings the census up to date after a change to `instance`'s entry.
    fn reindex(&mut self, instance: &str) {
        let Some(entry) = self.entries.get_mut(instance) else {
            return;
        };
        let now_dead = entry.dead().then_some(entry.last_seen);
        if now_dead == entry.dead_as_of {
            return;
        }
        let cluster_id = &entry.advert.cluster_id;
        if let Some(as_of) = entry.dead_as_of {
            self.census
                .unmark_dead(cluster_id, &(as_of, instance.to_owned()));
        }
        if let Some(as_of) = now_dead {
            self.census
                .mark_dead(cluster_id, (as_of, instance.to_owned()));
        }
        entry.dead_as_of = now_dead;
    }

    /// A goodbye (records with TTL 0) for `instance`: it is offered last from now on, and goes
    /// as soon as its addresses fail a probe (anyone can forge a goodbye). Returns whether it
    /// was known.
    pub fn goodbye(&mut self, instance: &str) -> bool {
        match self.entries.get_mut(instance) {
            Some(entry) => {
                entry.leaving = true;
                self.reindex(instance);
                true
            }
            None => false,
        }
    }

    /// The outcome at `now` of a probe of `endpoint` (a TCP connection): an answer clears the
    /// failed probes of every entry's address there and keeps it alive as an announcement
    /// would, a failure counts one more.
    pub fn probed(&mut self, endpoint: SocketAddr, answered: bool, now: Instant) {
        self.failed_or_not(endpoint, |address| {
            address.answered = answered;
            if answered {
                address.probe_failures = 0;
                address.last_answered = Some(now);
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
        let mut touched = Vec::new();
        for (instance, entry) in &mut self.entries {
            if entry.advert.port != endpoint.port() {
                continue;
            }
            let Some(address) = entry.addresses.get_mut(&ip) else {
                continue;
            };
            let failed = update(address);
            touched.push(instance.clone());
            if failed && entry.leaving {
                entry.addresses.remove(&ip);
                if entry.addresses.is_empty() {
                    gone.push(instance.clone());
                }
            }
        }
        for instance in touched {
            self.reindex(&instance);
        }
        for instance in gone {
            tracing::info!(%instance, "a join service that said goodbye does not answer: gone");
            self.remove(&instance);
        }
    }

    /// Drops the entries that missed [`MISSED_ANNOUNCEMENTS`] announcements by `now`, and the
    /// addresses no announcement listed for as long; returns the instance names dropped.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        let mut touched = Vec::new();
        for (instance, entry) in &mut self.entries {
            let lifetime = entry.lifetime();
            let before = entry.addresses.len();
            entry
                .addresses
                .retain(|_, address| now <= address.alive_at() + lifetime);
            if now > entry.expires_after() || entry.addresses.is_empty() {
                expired.push(instance.clone());
            } else if entry.addresses.len() != before {
                touched.push(instance.clone());
            }
        }
        for instance in &expired {
            self.remove(instance);
        }
        for instance in &touched {
            self.reindex(instance);
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
                    answered: address.answered && address.attempt_failures == 0,
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
