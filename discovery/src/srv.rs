//! WAN discovery: the join services listed as DNS SRV records `_hawser-join._tcp.<domain>`,
//! in the order RFC 2782 says to try them (lowest priority first; within a priority, a
//! weighted random order).
//!
//! The ordering is a pure function over an injected random source; the lookup is a thin
//! adapter over hickory-resolver (it needs a tokio runtime, but no tokio type crosses this API).

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use hickory_resolver::Resolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, RecordType};

use crate::{Candidate, SERVICE, Source};

/// Which name servers answer SRV queries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NameServers {
    /// The system's (`/etc/resolv.conf`).
    #[default]
    System,
    /// These, over UDP and TCP (tests, or a cluster's own DNS).
    At(Vec<SocketAddr>),
}

/// One SRV record, as RFC 2782 orders them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvRecord {
    /// The host to connect to, without the trailing dot.
    pub target: String,
    /// Its port.
    pub port: u16,
    /// Lower is tried first.
    pub priority: u16,
    /// Within a priority, the share of first tries.
    pub weight: u16,
}

/// An endpoint found through an SRV record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvEndpoint {
    /// The record it came from.
    pub record: SrvRecord,
    /// One address of the record's target, with the record's port.
    pub endpoint: SocketAddr,
}

impl SrvEndpoint {
    /// As a discovery candidate; SRV records say nothing of the cluster or version.
    pub fn to_candidate(&self, now: Instant) -> Candidate {
        Candidate {
            endpoint: self.endpoint,
            instance: Some(self.record.target.clone()),
            cluster_id: None,
            version: None,
            api_port: None,
            source: Source::DnsSrv,
            last_seen: now,
            failures: 0,
            answered: false,
            leaving: false,
        }
    }
}

/// Why SRV discovery found nothing.
#[derive(Debug, thiserror::Error)]
pub enum SrvError {
    /// The domain cannot carry the service name.
    #[error("{domain:?} is not a DNS domain")]
    Domain {
        /// The domain given.
        domain: String,
    },
    /// The system's resolver configuration could not be read.
    #[error("could not read the system's resolver configuration")]
    SystemConfig(#[source] hickory_resolver::net::NetError),
    /// The resolver could not be set up.
    #[error("could not set up the DNS resolver")]
    Resolver(#[source] hickory_resolver::net::NetError),
    /// The SRV query failed (no such name, no answer, a server error).
    #[error("the SRV query for {name} failed")]
    Query {
        /// The name queried.
        name: String,
        /// What went wrong.
        #[source]
        source: hickory_resolver::net::NetError,
    },
}

/// Looks up `_hawser-join._tcp.<domain>` and returns its endpoints in RFC 2782 order; the
/// addresses of each target in the order the resolver gave them. A target whose address
/// cannot be resolved is left out (and logged); "." (service decidedly not available) yields
/// nothing.
pub async fn resolve_srv(
    domain: &str,
    name_servers: &NameServers,
) -> Result<Vec<SrvEndpoint>, SrvError> {
    let domain = domain.trim_end_matches('.');
    if domain.is_empty() || domain.starts_with('.') || domain.contains("..") {
        return Err(SrvError::Domain {
            domain: domain.to_owned(),
        });
    }
    let name = format!("{SERVICE}.{domain}.");
    let resolver = resolver(name_servers)?;
    let lookup = resolver
        .lookup(name.as_str(), RecordType::SRV)
        .await
        .map_err(|source| SrvError::Query {
            name: name.clone(),
            source,
        })?;
    let records: Vec<SrvRecord> = lookup
        .answers()
        .iter()
        .filter_map(|record| match &record.data {
            RData::SRV(srv) => Some(SrvRecord {
                target: srv.target.to_ascii().trim_end_matches('.').to_owned(),
                port: srv.port,
                priority: srv.priority,
                weight: srv.weight,
            }),
            _ => None,
        })
        .collect();

    let mut endpoints = Vec::new();
    for record in order_srv(records, |max| fastrand::u32(0..=max)) {
        // An absolute name: no search domains appended.
        let target = format!("{}.", record.target);
        match resolver.lookup_ip(target.as_str()).await {
            Ok(ips) => endpoints.extend(ips.iter().map(|ip: IpAddr| SrvEndpoint {
                endpoint: SocketAddr::new(ip, record.port),
                record: record.clone(),
            })),
            Err(error) => {
                tracing::warn!(target = %record.target, %error, "an SRV target has no address");
            }
        }
    }
    Ok(endpoints)
}

fn resolver(name_servers: &NameServers) -> Result<Resolver<TokioRuntimeProvider>, SrvError> {
    let builder = match name_servers {
        NameServers::System => {
            Resolver::builder(TokioRuntimeProvider::default()).map_err(SrvError::SystemConfig)?
        }
        NameServers::At(servers) => {
            let mut config = ResolverConfig::default();
            for server in servers {
                let connections = [ConnectionConfig::udp(), ConnectionConfig::tcp()]
                    .into_iter()
                    .map(|mut connection| {
                        connection.port = server.port();
                        connection
                    })
                    .collect();
                config.add_name_server(NameServerConfig::new(server.ip(), true, connections));
            }
            Resolver::builder_with_config(config, TokioRuntimeProvider::default())
        }
    };
    builder.build().map_err(SrvError::Resolver)
}

/// RFC 2782's order: by priority, lowest first; within a priority, repeatedly pick a record
/// with probability proportional to its weight (weight-0 records come first in the running
/// sum, so they are picked only when the draw is 0). `random(max)` returns a number in
/// `0..=max`. A lone record with target "." means the service is decidedly not available.
pub fn order_srv(
    mut records: Vec<SrvRecord>,
    mut random: impl FnMut(u32) -> u32,
) -> Vec<SrvRecord> {
    if let [only] = records.as_slice()
        && (only.target.is_empty() || only.target == ".")
    {
        return Vec::new();
    }
    // Stable: within a priority, weight-0 records first, then as received.
    records.sort_by_key(|record| (record.priority, record.weight != 0));
    let mut ordered = Vec::with_capacity(records.len());
    while !records.is_empty() {
        let priority = records[0].priority;
        let group_len = records
            .iter()
            .take_while(|record| record.priority == priority)
            .count();
        let mut group: Vec<SrvRecord> = records.drain(..group_len).collect();
        while !group.is_empty() {
            let total: u32 = group.iter().map(|record| u32::from(record.weight)).sum();
            let draw = random(total).min(total);
            let mut running = 0;
            let position = group
                .iter()
                .position(|record| {
                    running += u32::from(record.weight);
                    running >= draw
                })
                .unwrap_or(group.len() - 1);
            ordered.push(group.remove(position));
        }
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(target: &str, priority: u16, weight: u16) -> SrvRecord {
        SrvRecord {
            target: target.into(),
            port: 7000,
            priority,
            weight,
        }
    }

    fn targets(records: &[SrvRecord]) -> Vec<&str> {
        records.iter().map(|r| r.target.as_str()).collect()
    }

    #[test]
    fn lower_priority_first_whatever_the_weights() {
        let records = vec![
            record("c", 30, 100),
            record("a", 10, 0),
            record("b", 20, 65535),
        ];
        for draw in [0, 1, u32::MAX] {
            let ordered = order_srv(records.clone(), |max| draw.min(max));
            assert_eq!(targets(&ordered), ["a", "b", "c"]);
        }
    }

    #[test]
    fn within_a_priority_the_draw_picks_by_running_sum() {
        // Running sums: a 10, b 30, c 60.
        let records = vec![
            record("a", 10, 10),
            record("b", 10, 20),
            record("c", 10, 30),
        ];
        // A draw of 25 picks b (first running sum ≥ 25); then of a+c (40), 40 picks c.
        let mut draws = [25, 40, 0].into_iter();
        let ordered = order_srv(records.clone(), |_| draws.next().unwrap());
        assert_eq!(targets(&ordered), ["b", "c", "a"]);
        // A draw of 0 picks the first.
        let ordered = order_srv(records, |_| 0);
        assert_eq!(targets(&ordered), ["a", "b", "c"]);
    }

    #[test]
    fn zero_weights_come_first_in_the_running_sum() {
        let records = vec![record("heavy", 10, 5), record("zero", 10, 0)];
        // A draw of 0 picks the weight-0 record…
        assert_eq!(
            targets(&order_srv(records.clone(), |_| 0)),
            ["zero", "heavy"]
        );
        // …any other draw the weighted one.
        let ordered = order_srv(records, |max| max);
        assert_eq!(targets(&ordered), ["heavy", "zero"]);
    }

    #[test]
    fn the_draw_is_bounded_by_the_total_weight() {
        let mut maxima = Vec::new();
        let records = vec![record("a", 10, 1), record("b", 10, 2), record("c", 20, 7)];
        let ordered = order_srv(records, |max| {
            maxima.push(max);
            u32::MAX
        });
        assert_eq!(targets(&ordered), ["b", "a", "c"]);
        assert_eq!(maxima, [3, 1, 7]);
    }

    #[test]
    fn weights_share_first_places() {
        let records = vec![record("light", 10, 1), record("heavy", 10, 3)];
        let mut seed = 0u32;
        let firsts = (0..4000)
            .filter(|_| {
                let ordered = order_srv(records.clone(), |max| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 8) % (max + 1)
                });
                ordered[0].target == "heavy"
            })
            .count();
        // RFC 2782 draws from 0..=4 inclusive: 0 and 1 pick the light record, 2 to 4 the
        // heavy one, so 3 of 5 first places (not 3 of 4), give or take.
        assert!((2250..2550).contains(&firsts), "{firsts}");
    }

    #[test]
    fn domains_that_cannot_carry_the_service_are_refused() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for domain in ["", ".", ".cluster.test", "cluster..test"] {
            let servers = NameServers::At(vec![SocketAddr::from(([192, 0, 2, 1], 53))]);
            let result = runtime.block_on(resolve_srv(domain, &servers));
            assert!(matches!(result, Err(SrvError::Domain { .. })), "{domain:?}");
        }
    }

    #[test]
    fn a_lone_dot_means_not_available() {
        assert!(order_srv(vec![record(".", 0, 0)], |_| 0).is_empty());
        assert!(order_srv(Vec::new(), |_| 0).is_empty());
    }
}
