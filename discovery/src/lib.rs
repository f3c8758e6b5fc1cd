//! Discovery of the join service (issue 16): how a node finds its cluster's join service when
//! no endpoint is configured.
//!
//! - On the LAN, each join service advertises `_hawser-join._tcp` over mDNS ([`mdns`]): its
//!   port in the SRV record, its cluster ID, version, Kubernetes API port and announcement
//!   interval in the TXT record ([`advert`]). It announces itself again every interval and says
//!   goodbye (TTL 0) when it stops.
//! - A node browses for it; what it heard is kept by [`sightings`], a pure state machine over
//!   instants passed in, written against a forger on the LAN: capped, an entry expires after
//!   three missed announcements, a new address is added beside the known ones, a goodbye only
//!   demotes an entry until its address fails a probe.
//! - On the WAN, SRV records `_hawser-join._tcp.<domain>` list join services in RFC 2782 order
//!   ([`srv`]), from the system's resolver or named servers.
//! - [`rank`] orders what was found: the node's own cluster first, then mDNS in a random order
//!   (failed and departing ones last), then SRV.
//! - [`lan::LanBrowser`] keeps the browser drained on a thread of its own (mdns-sd drops a
//!   subscription that falls 1000 events behind; the browser then subscribes again) and, for
//!   each round of join attempts, probes every candidate's TCP port at once ([`probe`]) so that
//!   an endpoint that does not answer costs one short probe, not an attempt.
//!
//! Discovery is not trusted. Anyone on the LAN can advertise, and DNS answers can be forged:
//! every endpoint found here is attested by the node afterwards (aTLS), and a node that has
//! joined once is pinned to its cluster, so a fake advert can only waste its time. No secret
//! travels in an advert.
//!
//! The design, the tests and what is not done yet are in `docs/discovery.md`.

pub mod advert;
pub mod lan;
pub mod mdns;
pub mod probe;
pub mod sightings;
#[cfg(feature = "srv")]
pub mod srv;

use std::net::SocketAddr;
use std::time::Instant;

pub use advert::{AdvertError, JoinServiceAdvert};
pub use lan::{LanBrowser, Round};
pub use mdns::{Advertiser, Browser, MdnsError};
/// The mDNS daemon's error (starting it, for one).
pub use mdns_sd::Error as DaemonError;
/// The mDNS daemon (mdns-sd's) that [`Advertiser`] and [`Browser`] run on.
pub use mdns_sd::ServiceDaemon;
pub use sightings::Sightings;
#[cfg(feature = "srv")]
pub use srv::{NameServers, SrvEndpoint, SrvError, resolve_srv};

/// The DNS-SD service the join service advertises (RFC 6763 `_service._proto`).
pub const SERVICE: &str = "_hawser-join._tcp";

/// The mDNS service type: [`SERVICE`] in `.local.`.
pub const MDNS_SERVICE_TYPE: &str = "_hawser-join._tcp.local.";

/// Where a candidate was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// An mDNS advert on the LAN.
    Mdns,
    /// A DNS SRV record.
    DnsSrv,
}

/// A join service the node may try, still to be attested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Where its join service listens.
    pub endpoint: SocketAddr,
    /// The mDNS instance name, or the SRV record's target.
    pub instance: Option<String>,
    /// The cluster it claims to belong to (mDNS only: SRV records carry none).
    pub cluster_id: Option<String>,
    /// The version it claims (mDNS only).
    pub version: Option<String>,
    /// The Kubernetes API server's port it claims (mDNS only).
    pub api_port: Option<u16>,
    /// How it was found.
    pub source: Source,
    /// When it was last heard of.
    pub last_seen: Instant,
    /// Probes of this endpoint that failed since it last answered one, and join attempts
    /// that failed there.
    pub failures: u32,
    /// Its last probe answered and no join attempt failed there: a live join service, perhaps
    /// not up yet.
    pub answered: bool,
    /// It said goodbye since its last announcement (a goodbye can be forged: it is still
    /// offered, last, until it fails a probe).
    pub leaving: bool,
}

impl Candidate {
    /// Whether it claims to belong to `cluster_id`.
    pub fn claims_cluster(&self, cluster_id: &str) -> bool {
        self.cluster_id.as_deref() == Some(cluster_id)
    }
}

/// The order a node tries candidates in. A node that has joined before (`own_cluster` set)
/// drops mDNS adverts of other clusters, which it could never join, and tries its own
/// cluster's first; then come the other mDNS adverts, then the SRV endpoints (which claim no
/// cluster, in their RFC 2782 order). Within the mDNS groups the order is random, so that no
/// advert can sort itself first (by its instance name, say), except that endpoints whose
/// last probe answered come first, and those that failed (a probe or a join attempt) and
/// adverts that said goodbye come last. An endpoint listed twice
/// (two adverts naming it) is kept once, where it first comes.
pub fn rank(candidates: Vec<Candidate>, own_cluster: Option<&str>) -> Vec<Candidate> {
    rank_with(candidates, own_cluster, &mut fastrand::Rng::new())
}

/// [`rank`] with the random order drawn from `rng` (tests give a seeded one).
pub fn rank_with(
    candidates: Vec<Candidate>,
    own_cluster: Option<&str>,
    rng: &mut fastrand::Rng,
) -> Vec<Candidate> {
    let (mut mdns, srv): (Vec<Candidate>, Vec<Candidate>) = candidates
        .into_iter()
        .filter(|candidate| match (own_cluster, &candidate.cluster_id) {
            (Some(own), Some(claimed)) => own == claimed,
            _ => true,
        })
        .partition(|candidate| candidate.source == Source::Mdns);
    rng.shuffle(&mut mdns);
    let mut ranked: Vec<Candidate> = mdns.into_iter().chain(srv).collect();
    // A stable sort: the shuffle stays within each key, SRV's order within its group.
    ranked.sort_by_key(|candidate| {
        let own = own_cluster.is_some_and(|own| candidate.claims_cluster(own));
        let mdns = candidate.source == Source::Mdns;
        (
            !own,
            candidate.source,
            mdns && candidate.leaving,
            if mdns { candidate.failures } else { 0 },
            mdns && !candidate.answered,
        )
    });
    let mut listed = std::collections::HashSet::new();
    ranked.retain(|candidate| listed.insert(candidate.endpoint));
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(port: u16, cluster_id: Option<&str>, source: Source) -> Candidate {
        Candidate {
            endpoint: SocketAddr::from(([192, 168, 1, 10], port)),
            instance: None,
            cluster_id: cluster_id.map(str::to_owned),
            version: None,
            api_port: None,
            source,
            last_seen: Instant::now(),
            failures: 0,
            answered: false,
            leaving: false,
        }
    }

    fn ports(candidates: &[Candidate]) -> Vec<u16> {
        candidates.iter().map(|c| c.endpoint.port()).collect()
    }

    #[test]
    fn own_cluster_first_then_mdns_then_srv() {
        let candidates = vec![
            candidate(1, None, Source::DnsSrv),
            candidate(2, Some("aaaaaaaa"), Source::Mdns),
            candidate(3, None, Source::DnsSrv),
            candidate(4, Some("bbbbbbbb"), Source::Mdns),
        ];
        // A fresh node: mDNS (in a random order), then SRV in their own order.
        let fresh = ports(&rank(candidates.clone(), None));
        assert!(fresh[..2] == [2, 4] || fresh[..2] == [4, 2], "{fresh:?}");
        assert_eq!(fresh[2..], [1, 3]);
        // A joined node: its own cluster, then SRV; the other cluster's advert is dropped.
        assert_eq!(ports(&rank(candidates, Some("bbbbbbbb"))), [4, 1, 3]);
    }

    /// Fakes named to sort before the real one (and claiming its cluster) get no head start:
    /// the real advert is first as often as any (1 in 101), and in the first half about half
    /// of the time. Seeded, so the counts are exact run to run.
    #[test]
    fn adverts_named_to_sort_first_gain_nothing() {
        let mut candidates: Vec<Candidate> = (0..100)
            .map(|n| {
                let mut fake = candidate(1000 + n, Some("aaaaaaaa"), Source::Mdns);
                fake.instance = Some(format!("aaa-{n:03}"));
                fake
            })
            .collect();
        let mut real = candidate(9090, Some("aaaaaaaa"), Source::Mdns);
        real.instance = Some("zzz-real".into());
        candidates.push(real);
        let mut rng = fastrand::Rng::with_seed(28);
        let (mut first, mut first_half) = (0, 0);
        for _ in 0..1000 {
            let ranked = rank_with(candidates.clone(), Some("aaaaaaaa"), &mut rng);
            let at = ranked
                .iter()
                .position(|c| c.endpoint.port() == 9090)
                .unwrap();
            first += usize::from(at == 0);
            first_half += usize::from(at < 50);
        }
        assert!((2..=30).contains(&first), "first {first} times in 1000");
        assert!((400..=600).contains(&first_half), "{first_half}");
    }

    #[test]
    fn failed_and_departing_endpoints_come_last_and_duplicates_once() {
        let mut failed = candidate(1, None, Source::Mdns);
        failed.failures = 2;
        let mut leaving = candidate(2, None, Source::Mdns);
        leaving.leaving = true;
        let fresh = candidate(3, None, Source::Mdns);
        let twice = candidate(3, Some("bbbbbbbb"), Source::Mdns);
        let once = candidate(4, None, Source::Mdns);
        for seed in 0..20 {
            let ranked = rank_with(
                vec![
                    failed.clone(),
                    leaving.clone(),
                    fresh.clone(),
                    twice.clone(),
                    once.clone(),
                ],
                None,
                &mut fastrand::Rng::with_seed(seed),
            );
            let ports = ports(&ranked);
            assert_eq!(ports.len(), 4, "{ports:?}");
            assert_eq!(ports[2..], [1, 2], "{ports:?}");
        }
    }
}
