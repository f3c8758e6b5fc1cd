//! Finding the join service on the LAN (`hawser.join_discovery=mdns`), for a node that is given
//! no join endpoint: browse for `_hawser-join._tcp` adverts (hawser-discovery, over mdns-sd) and
//! hand the join client, for each round, the join services advertised at that moment.
//!
//! Nothing found here is trusted: every endpoint is attested over aTLS before the node takes
//! anything from it, and once its disk records a cluster the node tries only adverts of that
//! cluster (and refuses any other cluster's answer by its cluster ID). A fake advert can only
//! cost an attempt.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hawser_discovery::{Browser, Candidate, MdnsError, ServiceDaemon, rank};
use tracing::info;

use super::JoinEndpoint;

/// How long a round waits for a first advert before it reports that nothing is advertised.
pub const ROUND_WAIT: Duration = Duration::from_secs(5);
/// How often the browser takes in what the mDNS daemon heard while a round waits.
const POLL: Duration = Duration::from_millis(250);

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
    browser: Mutex<Browser>,
    /// The mDNS daemon (a thread of its own), shut down on drop.
    daemon: ServiceDaemon,
}

impl std::fmt::Debug for LanDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LanDiscovery(mDNS)")
    }
}

impl Drop for LanDiscovery {
    /// Stops the mDNS daemon's thread and closes its sockets once the join is done.
    fn drop(&mut self) {
        let _ = self.daemon.shutdown();
    }
}

impl LanDiscovery {
    /// Starts the mDNS daemon on every interface and browses for join services.
    pub fn start() -> Result<Self, DiscoveryError> {
        let daemon = ServiceDaemon::new().map_err(DiscoveryError::Daemon)?;
        let browser = Browser::start(&daemon, None).map_err(DiscoveryError::Browse)?;
        info!(
            "browsing the LAN for the join service (mDNS {})",
            hawser_discovery::MDNS_SERVICE_TYPE
        );
        Ok(LanDiscovery {
            browser: Mutex::new(browser),
            daemon,
        })
    }

    /// The join services advertised now, in the order to try them (see
    /// [`hawser_discovery::rank`]: the disk's cluster first, other clusters dropped once the
    /// disk records one); waits up to `wait` for a first advert.
    pub async fn round(
        self: &std::sync::Arc<Self>,
        disk_cluster: Option<[u8; 32]>,
        wait: Duration,
    ) -> Vec<JoinEndpoint> {
        let lan = std::sync::Arc::clone(self);
        let own = disk_cluster.map(hex::encode);
        let found = tokio::task::spawn_blocking(move || lan.look(own.as_deref(), wait))
            .await
            .unwrap_or_default();
        if !found.is_empty() {
            info!(
                "join services advertised on the LAN: {}",
                found.iter().map(describe).collect::<Vec<_>>().join(", ")
            );
        }
        found.iter().filter_map(endpoint).collect()
    }

    fn look(&self, own_cluster: Option<&str>, wait: Duration) -> Vec<Candidate> {
        let Ok(mut browser) = self.browser.lock() else {
            return Vec::new();
        };
        let deadline = Instant::now() + wait;
        loop {
            if let Err(e) = browser.update(POLL) {
                tracing::warn!("mDNS: {}", crate::platform::error_chain(&e));
                return Vec::new();
            }
            let found = rank(browser.seen(), own_cluster);
            if !found.is_empty() || Instant::now() >= deadline {
                return found;
            }
        }
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
