//! The mDNS side, over mdns-sd's [`ServiceDaemon`] (a thread of its own, no async runtime):
//! the join service's [`Advertiser`] and the node's [`Browser`].
//!
//! mdns-sd reports a service when its records change, not each time they are announced again.
//! So that every announcement is seen (and an advertiser that stops announcing expires after
//! three intervals), the advertiser counts its announcements in a TXT key `seq` that decoders
//! ignore.
//!
//! mdns-sd hands a browser its events through a queue of 1000 and ends the subscription when
//! the queue is full (a LAN flooded with adverts, a browser not drained for a while): the
//! browser then subscribes again at once ([`Browser::restarts`]), and mdns-sd replays what its
//! cache holds. It used to stop there and report nothing for the rest of the boot.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};

use crate::advert::JoinServiceAdvert;
use crate::sightings::{Change, Sightings};
use crate::{Candidate, MDNS_SERVICE_TYPE};

/// The announcement interval of an advert that names none.
pub const DEFAULT_ANNOUNCE_INTERVAL: Duration = crate::sightings::DEFAULT_INTERVAL;

/// The most events one [`Browser::update`] takes in.
const EVENTS_PER_UPDATE: usize = 1000;

/// TXT key: the announcement's sequence number (see the module's note).
const KEY_SEQUENCE: &str = "seq";

/// What went wrong on the mDNS side.
#[derive(Debug, thiserror::Error)]
pub enum MdnsError {
    /// The advert to publish is not valid.
    #[error("refusing to advertise an invalid join service advert")]
    Advert(#[source] crate::AdvertError),
    /// The service could not be handed to the mDNS daemon.
    #[error("could not register {fullname} with the mDNS daemon")]
    Register {
        /// The service's full name.
        fullname: String,
        /// The daemon's error.
        #[source]
        source: mdns_sd::Error,
    },
    /// The goodbye could not be sent.
    #[error("could not unregister {fullname} from the mDNS daemon")]
    Unregister {
        /// The service's full name.
        fullname: String,
        /// The daemon's error.
        #[source]
        source: mdns_sd::Error,
    },
    /// The daemon did not confirm the goodbye.
    #[error("the mDNS daemon did not confirm the goodbye of {fullname}")]
    Goodbye {
        /// The service's full name.
        fullname: String,
    },
    /// Browsing could not start.
    #[error("could not browse for {MDNS_SERVICE_TYPE}")]
    Browse(#[source] mdns_sd::Error),
    /// The daemon's setting could not be changed.
    #[error("could not set the mDNS daemon's address check interval")]
    Setting(#[source] mdns_sd::Error),
    /// The mDNS daemon stopped reporting to the browser and cannot browse again: it shut down.
    #[error("the mDNS daemon stopped reporting to the browser and cannot browse again")]
    DaemonGone(#[source] mdns_sd::Error),
    /// The announcement thread could not start.
    #[error("could not start the announcement thread")]
    Thread(#[source] std::io::Error),
}

/// A join service's advert on the LAN: announced at once, again every interval (following the
/// host's addresses), and withdrawn with a goodbye by [`Advertiser::stop`] or on drop.
pub struct Advertiser {
    daemon: ServiceDaemon,
    fullname: String,
    stop: Option<mpsc::Sender<()>>,
    announcer: Option<JoinHandle<()>>,
}

impl Advertiser {
    /// Publishes `advert` from host `host_name` (e.g. `cp-0.local.`) on every interface of
    /// `daemon`, at the interface's addresses. An advert without interval gets
    /// [`DEFAULT_ANNOUNCE_INTERVAL`]. The daemon checks the host's addresses once per interval
    /// from then on, so that a new address is announced within one.
    pub fn start(
        daemon: &ServiceDaemon,
        mut advert: JoinServiceAdvert,
        host_name: &str,
    ) -> Result<Self, MdnsError> {
        advert.validate().map_err(MdnsError::Advert)?;
        let interval = *advert.interval.get_or_insert(DEFAULT_ANNOUNCE_INTERVAL);
        let interval_secs = u32::try_from(interval.as_secs()).unwrap_or(u32::MAX);
        daemon
            .set_ip_check_interval(interval_secs)
            .map_err(MdnsError::Setting)?;

        let first = service_info(&advert, host_name, 0)?;
        let fullname = first.get_fullname().to_owned();
        daemon
            .register(first)
            .map_err(|source| MdnsError::Register {
                fullname: fullname.clone(),
                source,
            })?;
        tracing::info!(%fullname, cluster_id = %advert.cluster_id, port = advert.port, ?interval, "advertising the join service");

        let (stop, stopped) = mpsc::channel();
        let announcer_daemon = daemon.clone();
        let host_name = host_name.to_owned();
        let announcer = std::thread::Builder::new()
            .name("hawser-advert".into())
            .spawn(move || announce(&announcer_daemon, &advert, &host_name, &stopped))
            .map_err(MdnsError::Thread)?;
        Ok(Advertiser {
            daemon: daemon.clone(),
            fullname,
            stop: Some(stop),
            announcer: Some(announcer),
        })
    }

    /// The advert's full mDNS name (`<instance>._hawser-join._tcp.local.`).
    pub fn fullname(&self) -> &str {
        &self.fullname
    }

    /// Stops announcing and says goodbye, waiting (up to a second) for the daemon to confirm.
    pub fn stop(mut self) -> Result<(), MdnsError> {
        self.withdraw()
    }

    fn withdraw(&mut self) -> Result<(), MdnsError> {
        // Dropping the sender wakes the announcer, which then ends.
        if self.stop.take().is_none() {
            return Ok(());
        }
        if let Some(announcer) = self.announcer.take() {
            let _ = announcer.join();
        }
        let status =
            self.daemon
                .unregister(&self.fullname)
                .map_err(|source| MdnsError::Unregister {
                    fullname: self.fullname.clone(),
                    source,
                })?;
        match status.recv_timeout(Duration::from_secs(1)) {
            Ok(mdns_sd::UnregisterStatus::OK) => {
                tracing::info!(fullname = %self.fullname, "join service advert withdrawn");
                Ok(())
            }
            _ => Err(MdnsError::Goodbye {
                fullname: self.fullname.clone(),
            }),
        }
    }
}

impl Drop for Advertiser {
    fn drop(&mut self) {
        if let Err(error) = self.withdraw() {
            tracing::warn!(error = %error, "the join service advert left without a goodbye");
        }
    }
}

/// Announces `advert` every interval until `stopped` says so (or its sender is gone).
fn announce(
    daemon: &ServiceDaemon,
    advert: &JoinServiceAdvert,
    host_name: &str,
    stopped: &mpsc::Receiver<()>,
) {
    let interval = advert.interval.unwrap_or(DEFAULT_ANNOUNCE_INTERVAL);
    let mut sequence: u64 = 0;
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
        sequence += 1;
        let result = service_info(advert, host_name, sequence).and_then(|info| {
            daemon.register(info).map_err(|source| MdnsError::Register {
                fullname: advert.instance.clone(),
                source,
            })
        });
        if let Err(error) = result {
            tracing::warn!(error = %error, "could not announce the join service again; stopping");
            return;
        }
    }
}

fn service_info(
    advert: &JoinServiceAdvert,
    host_name: &str,
    sequence: u64,
) -> Result<ServiceInfo, MdnsError> {
    let mut txt: HashMap<String, String> = advert.to_txt().into_iter().collect();
    txt.insert(KEY_SEQUENCE.to_owned(), sequence.to_string());
    let info = ServiceInfo::new(
        MDNS_SERVICE_TYPE,
        &advert.instance,
        host_name,
        (),
        advert.port,
        txt,
    )
    .map_err(|source| MdnsError::Register {
        fullname: fullname(advert),
        source,
    })?;
    Ok(info.enable_addr_auto())
}

fn fullname(advert: &JoinServiceAdvert) -> String {
    format!("{}.{MDNS_SERVICE_TYPE}", advert.instance)
}

/// A node's view of the join services on the LAN.
pub struct Browser {
    daemon: ServiceDaemon,
    events: mdns_sd::Receiver<ServiceEvent>,
    sightings: Sightings,
    cluster_filter: Option<String>,
    restarts: u64,
}

impl Browser {
    /// Starts browsing on `daemon`. With `cluster_filter`, [`Browser::candidates`] lists only
    /// that cluster's join services (a node that has joined before can join no other);
    /// [`Browser::seen`] still lists every advert.
    pub fn start(
        daemon: &ServiceDaemon,
        cluster_filter: Option<String>,
    ) -> Result<Self, MdnsError> {
        let events = daemon
            .browse(MDNS_SERVICE_TYPE)
            .map_err(MdnsError::Browse)?;
        let mut sightings = Sightings::new();
        sightings.reserve_for(cluster_filter.clone());
        Ok(Browser {
            daemon: daemon.clone(),
            events,
            sightings,
            cluster_filter,
            restarts: 0,
        })
    }

    /// Waits up to `wait` for news, takes in everything that arrived, and expires what missed
    /// its announcements. Call it often (a thread of its own, as [`crate::LanBrowser`] does):
    /// mdns-sd ends a subscription that falls 1000 events behind, and the browser then browses
    /// again (mdns-sd replays its cache). Fails only once the daemon has shut down.
    pub fn update(&mut self, wait: Duration) -> Result<(), MdnsError> {
        match self.events.recv_timeout(wait) {
            Ok(event) => self.take(event),
            Err(mdns_sd::RecvTimeoutError::Timeout) => {}
            Err(mdns_sd::RecvTimeoutError::Disconnected) => self.browse_again()?,
        }
        // A bounded batch, so that a caller between batches (the rounds' questions) is not
        // starved by a flood that never lets the queue run empty.
        for _ in 0..EVENTS_PER_UPDATE {
            match self.events.try_recv() {
                Ok(event) => self.take(event),
                Err(mdns_sd::TryRecvError::Empty) => break,
                Err(mdns_sd::TryRecvError::Disconnected) => {
                    self.browse_again()?;
                    break;
                }
            }
        }
        for instance in self.sightings.expire(Instant::now()) {
            tracing::info!(%instance, "a join service stopped announcing itself");
        }
        Ok(())
    }

    /// Subscribes again after mdns-sd ended the subscription (never silently: it is logged and
    /// counted).
    fn browse_again(&mut self) -> Result<(), MdnsError> {
        self.events = self
            .daemon
            .browse(MDNS_SERVICE_TYPE)
            .map_err(MdnsError::DaemonGone)?;
        self.restarts += 1;
        tracing::warn!(
            restarts = self.restarts,
            entries = self.sightings.len(),
            "mdns-sd ended the browser's subscription (1000 events queued: a flood of adverts?); \
             browsing again"
        );
        Ok(())
    }

    /// How often mdns-sd ended the subscription and the browser browsed again.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Keeps [`crate::sightings::MAX_PER_CLUSTER`] places for the node's own cluster, once it
    /// knows it (see [`Sightings::reserve_for`]).
    pub fn reserve_for(&mut self, cluster_id: Option<String>) {
        self.sightings.reserve_for(cluster_id);
    }

    /// A probe of `endpoint` answered or not (see [`Sightings::probed`]).
    pub fn probed(&mut self, endpoint: std::net::SocketAddr, answered: bool) {
        self.sightings.probed(endpoint, answered, Instant::now());
    }

    /// A join attempt at `endpoint` failed (see [`Sightings::attempt_failed`]).
    pub fn attempt_failed(&mut self, endpoint: std::net::SocketAddr) {
        self.sightings.attempt_failed(endpoint);
    }

    /// How many new adverts were left out because the table was full of live ones.
    pub fn refused(&self) -> u64 {
        self.sightings.refused()
    }

    /// The join services to try, in the filter's cluster if there is one, by instance name.
    pub fn candidates(&self) -> Vec<Candidate> {
        let mut candidates = self.sightings.candidates();
        if let Some(cluster_id) = &self.cluster_filter {
            candidates.retain(|candidate| candidate.claims_cluster(cluster_id));
        }
        candidates
    }

    /// Every join service advertised, whatever its cluster.
    pub fn seen(&self) -> Vec<Candidate> {
        self.sightings.candidates()
    }

    fn take(&mut self, event: ServiceEvent) {
        match event {
            ServiceEvent::ServiceResolved(service) => {
                let Some(instance) = instance_name(&service.fullname) else {
                    return;
                };
                let txt: HashMap<String, Vec<u8>> = service
                    .txt_properties
                    .iter()
                    .map(|p| (p.key().to_owned(), p.val().unwrap_or_default().to_vec()))
                    .collect();
                let advert = match JoinServiceAdvert::from_txt(instance, service.port, &txt) {
                    Ok(advert) => advert,
                    Err(error) => {
                        tracing::warn!(%instance, error = %error, "ignoring a join service advert");
                        return;
                    }
                };
                let addresses = dialable(service.addresses.iter().map(|ip| ip.to_ip_addr()));
                let cluster_id = advert.cluster_id.clone();
                match self.sightings.observe(advert, &addresses, Instant::now()) {
                    Change::Appeared(endpoint) => {
                        tracing::info!(%instance, %endpoint, %cluster_id, "found a join service");
                    }
                    Change::AddressAdded(endpoint) => {
                        tracing::info!(%instance, %endpoint, "a join service has a new address");
                    }
                    Change::Refused => {
                        let refused = self.sightings.refused();
                        // Logged at 1, 2, 4, 8…: a flood must not flood the log too.
                        if refused.is_power_of_two() {
                            tracing::warn!(%instance, %cluster_id, refused, "too many join service adverts that answer: this one is left out");
                        }
                    }
                    Change::Refreshed | Change::Unreachable => {}
                }
            }
            ServiceEvent::ServiceRemoved(_, fullname) => {
                let Some(instance) = instance_name(&fullname) else {
                    return;
                };
                if self.sightings.goodbye(instance) {
                    tracing::info!(%instance, "a join service said goodbye: offered last until it fails a probe");
                }
            }
            _ => {}
        }
    }
}

/// The addresses a node can dial, sorted: IPv6 link-local ones left out (an endpoint would
/// need its interface, which a socket address does not carry), and only IPv4 where there is
/// any (a dual-stack advertiser's endpoint then stays put, instead of moving to whichever
/// family was announced last).
fn dialable(addresses: impl Iterator<Item = IpAddr>) -> Vec<IpAddr> {
    let mut addresses: Vec<IpAddr> = addresses
        .filter(|ip| !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local()))
        .collect();
    if addresses.iter().any(IpAddr::is_ipv4) {
        addresses.retain(IpAddr::is_ipv4);
    }
    addresses.sort();
    addresses.dedup();
    addresses
}

/// The instance label of a full name in hawser's service type.
fn instance_name(fullname: &str) -> Option<&str> {
    let instance = fullname
        .strip_suffix(MDNS_SERVICE_TYPE)?
        .strip_suffix('.')?;
    (!instance.is_empty()).then_some(instance)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dual_stack_advert_is_dialled_over_ipv4_and_link_local_v6_never() {
        let v4: std::net::IpAddr = "192.168.76.11".parse().unwrap();
        let link_local: std::net::IpAddr = "fe80::1".parse().unwrap();
        let global: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(super::dialable([link_local, v4, global].into_iter()), [v4]);
        assert_eq!(super::dialable([link_local, global].into_iter()), [global]);
        assert!(super::dialable([link_local].into_iter()).is_empty());
    }

    use super::*;

    #[test]
    fn instance_names_come_from_full_names_of_our_type() {
        assert_eq!(instance_name("cp-0._hawser-join._tcp.local."), Some("cp-0"));
        assert_eq!(instance_name("cp-0._http._tcp.local."), None);
        assert_eq!(instance_name("._hawser-join._tcp.local."), None);
    }

    #[test]
    fn announcements_carry_a_sequence_number() {
        let advert = JoinServiceAdvert {
            instance: "cp-0".into(),
            cluster_id: "0123456789abcdef".into(),
            version: "0.1.0".into(),
            port: 9090,
            api_port: 6443,
            interval: Some(Duration::from_secs(1)),
        };
        let info = service_info(&advert, "cp-0.local.", 7).unwrap();
        assert_eq!(info.get_property_val_str(KEY_SEQUENCE), Some("7"));
        assert_eq!(
            info.get_property_val_str("cluster"),
            Some("0123456789abcdef")
        );
        assert_eq!(info.get_fullname(), "cp-0._hawser-join._tcp.local.");
    }
}
