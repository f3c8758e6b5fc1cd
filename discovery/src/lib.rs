//! Discovery of the join service (issue 16): how a node finds its cluster's join service when
//! no endpoint is configured.
//!
//! - On the LAN, each join service advertises `_hawser-join._tcp` over mDNS ([`mdns`]): its
//!   port in the SRV record, its cluster ID, version, Kubernetes API port and announcement
//!   interval in the TXT record ([`advert`]). It announces itself again every interval and says
//!   goodbye (TTL 0) when it stops.
//! - A node browses for it; what it heard is kept by [`sightings`], a pure state machine over
//!   instants passed in: an entry expires after three missed announcements, a goodbye removes
//!   it at once, and a new address replaces the old endpoint.
//! - On the WAN, SRV records `_hawser-join._tcp.<domain>` list join services in RFC 2782 order
//!   ([`srv`]), from the system's resolver or named servers.
//! - [`rank`] orders what was found: the node's own cluster first, then mDNS, then SRV.
//!
//! Discovery is not trusted. Anyone on the LAN can advertise, and DNS answers can be forged:
//! every endpoint found here is attested by the node afterwards (aTLS), and a node that has
//! joined once is pinned to its cluster, so a fake advert can only waste its time. No secret
//! travels in an advert.
//!
//! The design, the tests and what is not done yet are in `docs/discovery.md`.

pub mod advert;
pub mod mdns;
pub mod sightings;
#[cfg(feature = "srv")]
pub mod srv;

use std::net::SocketAddr;
use std::time::Instant;

pub use advert::{AdvertError, JoinServiceAdvert};
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
/// cluster). Within each group the given order is kept (SRV's RFC 2782 order).
pub fn rank(candidates: Vec<Candidate>, own_cluster: Option<&str>) -> Vec<Candidate> {
    let mut kept: Vec<Candidate> = candidates
        .into_iter()
        .filter(|candidate| match (own_cluster, &candidate.cluster_id) {
            (Some(own), Some(claimed)) => own == claimed,
            _ => true,
        })
        .collect();
    kept.sort_by_key(|candidate| {
        let own = own_cluster.is_some_and(|own| candidate.claims_cluster(own));
        (!own, candidate.source)
    });
    kept
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
        // A fresh node: mDNS, then SRV in their own order.
        assert_eq!(ports(&rank(candidates.clone(), None)), [2, 4, 1, 3]);
        // A joined node: its own cluster, then SRV; the other cluster's advert is dropped.
        assert_eq!(ports(&rank(candidates, Some("bbbbbbbb"))), [4, 1, 3]);
    }
}
