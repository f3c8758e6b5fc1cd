//! The join services a node has heard of, and when it stops believing in them: a pure state
//! machine over instants the caller passes in (no clock, no sockets).
//!
//! ```text
//!            observe                observe (same address)
//!   (none) ──────────► live ◄──────────────────────────┐ refreshes last_seen
//!                       │ │ └────────────────────────────┘
//!                       │ │ observe (new address): endpoint moves, last_seen refreshed
//!       goodbye (TTL 0) │ └── now > last_seen + 3 × interval + interval / 2 ──► expired
//!                       ▼
//!                     gone
//! ```
//!
//! An advert that states its announcement interval expires after three missed announcements;
//! each counts as missed half an interval after it was due, which absorbs jitter and mDNS's
//! own delays. An advert that states no interval lives until its goodbye. This is kept apart
//! from mdns-sd's record cache, whose TTLs (75 minutes for TXT) are for another purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::advert::JoinServiceAdvert;
use crate::{Candidate, Source};

/// How many announcements an entry may miss before it expires.
pub const MISSED_ANNOUNCEMENTS: u32 = 3;

/// What an observation changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A join service not known before.
    Appeared(SocketAddr),
    /// A known one, announced again where it was.
    Refreshed,
    /// A known one, now at another address.
    Moved {
        /// Where it was.
        from: SocketAddr,
        /// Where it is.
        to: SocketAddr,
    },
    /// An observation without any address: nothing to reach, nothing changed.
    Unreachable,
}

#[derive(Debug, Clone)]
struct Entry {
    advert: JoinServiceAdvert,
    addresses: BTreeSet<IpAddr>,
    endpoint: SocketAddr,
    last_seen: Instant,
}

impl Entry {
    fn expires_after(&self) -> Option<Instant> {
        let interval = self.advert.interval?;
        Some(self.last_seen + interval * MISSED_ANNOUNCEMENTS + interval / 2)
    }
}

/// The adverts heard, by instance name.
#[derive(Debug, Default, Clone)]
pub struct Sightings {
    entries: BTreeMap<String, Entry>,
}

impl Sightings {
    /// No adverts heard yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An announcement of `advert` from `addresses` at `now`. When the address set changes, the
    /// endpoint moves to an address that was not there before (the new one, while the old one
    /// may still linger in mDNS caches for a second), or to the lowest left.
    pub fn observe(
        &mut self,
        advert: JoinServiceAdvert,
        addresses: &[IpAddr],
        now: Instant,
    ) -> Change {
        let new_addresses: BTreeSet<IpAddr> = addresses.iter().copied().collect();
        let port = advert.port;
        let instance = advert.instance.clone();
        match self.entries.get_mut(&instance) {
            Some(entry) => {
                let from = entry.endpoint;
                let ip = new_addresses
                    .difference(&entry.addresses)
                    .next()
                    .or_else(|| new_addresses.get(&from.ip()))
                    .or_else(|| new_addresses.first())
                    .copied();
                let Some(ip) = ip else {
                    return Change::Unreachable;
                };
                entry.endpoint = SocketAddr::new(ip, port);
                entry.addresses = new_addresses;
                entry.advert = advert;
                entry.last_seen = now;
                if entry.endpoint == from {
                    Change::Refreshed
                } else {
                    Change::Moved {
                        from,
                        to: entry.endpoint,
                    }
                }
            }
            None => {
                let Some(&ip) = new_addresses.first() else {
                    return Change::Unreachable;
                };
                let endpoint = SocketAddr::new(ip, port);
                let entry = Entry {
                    advert,
                    addresses: new_addresses,
                    endpoint,
                    last_seen: now,
                };
                self.entries.insert(instance, entry);
                Change::Appeared(endpoint)
            }
        }
    }

    /// A goodbye (records with TTL 0) for `instance`: it is gone at once. Returns whether it
    /// was known.
    pub fn goodbye(&mut self, instance: &str) -> bool {
        self.entries.remove(instance).is_some()
    }

    /// Drops the entries that missed [`MISSED_ANNOUNCEMENTS`] announcements by `now`, returning
    /// their instance names.
    pub fn expire(&mut self, now: Instant) -> Vec<String> {
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.expires_after().is_some_and(|deadline| now > deadline))
            .map(|(instance, _)| instance.clone())
            .collect();
        for instance in &expired {
            self.entries.remove(instance);
        }
        expired
    }

    /// When the next entry expires, for a caller that wants to sleep until then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries.values().filter_map(Entry::expires_after).min()
    }

    /// Every live entry as a candidate, by instance name.
    pub fn candidates(&self) -> Vec<Candidate> {
        self.entries
            .values()
            .map(|entry| Candidate {
                endpoint: entry.endpoint,
                instance: Some(entry.advert.instance.clone()),
                cluster_id: Some(entry.advert.cluster_id.clone()),
                version: Some(entry.advert.version.clone()),
                api_port: Some(entry.advert.api_port),
                source: Source::Mdns,
                last_seen: entry.last_seen,
            })
            .collect()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The deadline rule, for documentation and tests: how long after its last announcement an
/// advert with `interval` lives.
pub fn lifetime(interval: Duration) -> Duration {
    interval * MISSED_ANNOUNCEMENTS + interval / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const SECOND: Duration = Duration::from_secs(1);

    fn advert(instance: &str, interval: Option<Duration>) -> JoinServiceAdvert {
        JoinServiceAdvert {
            instance: instance.into(),
            cluster_id: "0123456789abcdef".into(),
            version: "0.1.0".into(),
            port: 9090,
            api_port: 6443,
            interval,
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 168, 1, last))
    }

    fn endpoint(last: u8) -> SocketAddr {
        SocketAddr::new(ip(last), 9090)
    }

    fn instances(sightings: &Sightings) -> Vec<String> {
        sightings
            .candidates()
            .into_iter()
            .filter_map(|c| c.instance)
            .collect()
    }

    #[test]
    fn a_first_announcement_makes_a_candidate() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        let change = sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        assert_eq!(change, Change::Appeared(endpoint(10)));
        let candidates = sightings.candidates();
        assert_eq!(candidates.len(), 1);
        assert_eq!(candidates[0].endpoint, endpoint(10));
        assert_eq!(candidates[0].last_seen, t0);
        assert_eq!(candidates[0].source, Source::Mdns);
    }

    #[test]
    fn expires_after_three_missed_announcements() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        assert_eq!(sightings.next_deadline(), Some(t0 + 35 * SECOND));
        // Two missed, and the third one only just due: still there.
        assert!(sightings.expire(t0 + 30 * SECOND).is_empty());
        assert!(sightings.expire(t0 + 35 * SECOND).is_empty());
        assert_eq!(
            sightings.expire(t0 + 35 * SECOND + Duration::from_millis(1)),
            ["cp-0"]
        );
        assert!(sightings.is_empty());
        assert_eq!(sightings.next_deadline(), None);
    }

    #[test]
    fn a_refresh_restarts_the_count() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        let change = sightings.observe(
            advert("cp-0", Some(10 * SECOND)),
            &[ip(10)],
            t0 + 30 * SECOND,
        );
        assert_eq!(change, Change::Refreshed);
        assert!(sightings.expire(t0 + 60 * SECOND).is_empty());
        assert_eq!(sightings.candidates()[0].last_seen, t0 + 30 * SECOND);
        assert_eq!(sightings.expire(t0 + 66 * SECOND), ["cp-0"]);
    }

    #[test]
    fn the_interval_is_the_latest_advert_s() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        sightings.observe(advert("cp-0", Some(SECOND)), &[ip(10)], t0);
        assert_eq!(sightings.expire(t0 + 4 * SECOND), ["cp-0"]);
    }

    #[test]
    fn an_advert_without_interval_lives_until_its_goodbye() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("avahi", None), &[ip(10)], t0);
        assert!(sightings.expire(t0 + 86_400 * SECOND).is_empty());
        assert_eq!(sightings.next_deadline(), None);
        assert!(sightings.goodbye("avahi"));
        assert!(sightings.is_empty());
    }

    #[test]
    fn a_goodbye_removes_at_once_and_only_that_instance() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        sightings.observe(advert("cp-1", Some(10 * SECOND)), &[ip(11)], t0);
        assert!(sightings.goodbye("cp-0"));
        assert!(!sightings.goodbye("cp-0"));
        assert!(!sightings.goodbye("unknown"));
        assert_eq!(instances(&sightings), ["cp-1"]);
    }

    #[test]
    fn an_address_change_moves_the_endpoint() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        // The new address arrives while caches still hold the old one…
        let change = sightings.observe(
            advert("cp-0", Some(10 * SECOND)),
            &[ip(10), ip(50)],
            t0 + SECOND,
        );
        assert_eq!(
            change,
            Change::Moved {
                from: endpoint(10),
                to: endpoint(50)
            }
        );
        // …which then goes: the endpoint stays on the new one.
        let change = sightings.observe(
            advert("cp-0", Some(10 * SECOND)),
            &[ip(50)],
            t0 + 2 * SECOND,
        );
        assert_eq!(change, Change::Refreshed);
        assert_eq!(sightings.candidates().len(), 1);
        assert_eq!(sightings.candidates()[0].endpoint, endpoint(50));
    }

    #[test]
    fn a_replaced_address_moves_the_endpoint() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        let change = sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(60)], t0);
        assert_eq!(
            change,
            Change::Moved {
                from: endpoint(10),
                to: endpoint(60)
            }
        );
    }

    #[test]
    fn a_lost_second_address_keeps_the_endpoint() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10), ip(20)], t0);
        assert_eq!(sightings.candidates()[0].endpoint, endpoint(10));
        let change = sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
        assert_eq!(change, Change::Refreshed);
    }

    #[test]
    fn an_announcement_without_addresses_changes_nothing() {
        let t0 = Instant::now();
        let mut sightings = Sightings::new();
        assert_eq!(
            sightings.observe(advert("cp-0", Some(SECOND)), &[], t0),
            Change::Unreachable
        );
        assert!(sightings.is_empty());
        sightings.observe(advert("cp-0", Some(SECOND)), &[ip(10)], t0);
        assert_eq!(
            sightings.observe(advert("cp-0", Some(SECOND)), &[], t0 + 3 * SECOND),
            Change::Unreachable
        );
        assert_eq!(sightings.expire(t0 + 4 * SECOND), ["cp-0"]);
    }

    #[test]
    fn lifetime_is_three_and_a_half_intervals() {
        assert_eq!(lifetime(2 * SECOND), 7 * SECOND);
    }
}
