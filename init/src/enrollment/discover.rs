//! Finding the join service on the LAN (`hawser.join_discovery=mdns`), for a node that is given
//! no join endpoint: browse for `_hawser-join._tcp` adverts (hawser-discovery's
//! [`LanBrowser`], over mdns-sd, drained on a thread of its own) and hand the join client, for
//! each round, the join services advertised at that moment whose TCP port answers.
//!
//! Nothing found here is trusted: every endpoint is attested over aTLS before the node takes
//! anything from it, and once its disk records a cluster the node tries only adverts of that
//! cluster (and refuses any other cluster's answer by its cluster ID). A fake advert can only
//! cost time, and that is bounded (issue 28; `docs/discovery.md`): candidates come in a random
//! order, an endpoint that does not answer costs one probe of at most 2 s (all probed at
//! once), and one whose attempt failed is offered after those not tried yet.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use hawser_discovery::{Candidate, LanBrowser, MdnsError, ServiceDaemon};
use tracing::info;

use super::JoinEndpoint;

/// How long a round waits for a first advert before it reports that nothing is advertised.
pub const ROUND_WAIT: Duration = Duration::from_secs(5);
/// How many candidates a round's log line names (the rest are counted).
const LOGGED: usize = 8;

/// Why discovery cannot start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The mDNS daemon (its sockets, its thread) cannot start.
    #[error("cannot start the mDNS daemon")]
    Daemon(#[source] hawser_discovery::DaemonError),
    /// Browsing cannot start.
    #[error("cannot browse for the join service")]
    Browse(#[source] MdnsError),
}

/// The node's browser on the LAN.
pub struct LanDiscovery {
    /// The browser and its thread; `None` only while dropping.
    lan: Option<LanBrowser>,
    /// The endpoints the last round handed out: the join client asks for a new round only once
    /// it has tried them all, so each of them failed an attempt by then.
    handed_out: Mutex<Vec<SocketAddr>>,
    /// The mDNS daemon (a thread of its own), shut down on drop.
    daemon: ServiceDaemon,
}

impl std::fmt::Debug for LanDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LanDiscovery(mDNS)")
    }
}

impl Drop for LanDiscovery {
    /// Stops the browsing thread, then the mDNS daemon's thread and its sockets, once the join
    /// is done.
    fn drop(&mut self) {
        drop(self.lan.take());
        let _ = self.daemon.shutdown();
    }
}

impl LanDiscovery {
    /// Starts the mDNS daemon on every interface and browses for join services.
    pub fn start() -> Result<Self, DiscoveryError> {
        let daemon = ServiceDaemon::new().map_err(DiscoveryError::Daemon)?;
        let lan = LanBrowser::start(&daemon, None).map_err(DiscoveryError::Browse)?;
        info!(
            "browsing the LAN for the join service (mDNS {})",
            hawser_discovery::MDNS_SERVICE_TYPE
        );
        Ok(LanDiscovery {
            lan: Some(lan),
            handed_out: Mutex::new(Vec::new()),
            daemon,
        })
    }

    /// The join services advertised now whose port answers, in the order to try them (see
    /// [`hawser_discovery::rank`]: the disk's cluster first, other clusters dropped once the
    /// disk records one; random within, those that failed an attempt last); waits up to `wait`
    /// for a first advert.
    pub async fn round(
        self: &std::sync::Arc<Self>,
        disk_cluster: Option<[u8; 32]>,
        wait: Duration,
    ) -> Vec<JoinEndpoint> {
        let Some(lan) = self.lan.as_ref() else {
            return Vec::new();
        };
        let failed = std::mem::take(
            &mut *self
                .handed_out
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        lan.attempts_failed(&failed);
        let own = disk_cluster.map(hex::encode);
        let round = lan.round(own.as_deref(), wait).await;
        if !round.answered.is_empty() || !round.silent.is_empty() {
            info!(
                "join services advertised on the LAN: {} answering ({}), {} not answering{}",
                round.answered.len(),
                describe_some(&round.answered),
                round.silent.len(),
                if round.restarts > 0 || round.refused > 0 {
                    format!(
                        "; mdns-sd dropped the browser {} times, {} adverts left out (table full)",
                        round.restarts, round.refused
                    )
                } else {
                    String::new()
                }
            );
        }
        let endpoints: Vec<JoinEndpoint> = round.answered.iter().filter_map(endpoint).collect();
        *self
            .handed_out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = round
            .answered
            .iter()
            .filter(|candidate| candidate.endpoint.is_ipv4())
            .map(|candidate| candidate.endpoint)
            .collect();
        endpoints
    }
}

/// A candidate the join client can dial: IPv4 only (a link-local IPv6 address would need its
/// interface in the URI).
fn endpoint(candidate: &Candidate) -> Option<JoinEndpoint> {
    let address = candidate.endpoint;
    address.is_ipv4().then(|| JoinEndpoint {
        host: address.ip().to_string(),
        port: address.port(),
    })
}

/// The first [`LOGGED`] candidates, and how many more.
fn describe_some(candidates: &[Candidate]) -> String {
    let mut named: Vec<String> = candidates.iter().take(LOGGED).map(describe).collect();
    if candidates.len() > LOGGED {
        named.push(format!("{} more", candidates.len() - LOGGED));
    }
    named.join(", ")
}

fn describe(candidate: &Candidate) -> String {
    format!(
        "{} at {} (claims cluster {})",
        candidate.instance.as_deref().unwrap_or("?"),
        candidate.endpoint,
        candidate
            .cluster_id
            .as_deref()
            .map_or("?", |id| &id[..id.len().min(16)])
    )
}
