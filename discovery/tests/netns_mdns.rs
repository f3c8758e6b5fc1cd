//! hawser's advertiser and browser on a LAN of network namespaces this test creates (members
//! on a bridge, `hawser_mesh_device::netns::Underlay`): each side's mDNS daemon is started by a thread
//! that entered its member's namespace first, so its sockets and threads live there. Nothing
//! is sent in the host's own namespace.
//!
//! Adverts announce themselves every second, so an advertiser that vanishes expires after
//! three missed announcements, 3.5 s after the last one.
//!
//! Needs root and iproute2; without them the test fails naming what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::{CLUSTER, JOIN_PORT, OTHER_CLUSTER, advert, browser_in, has, require_host, wait_for};
use hawser_discovery::{Advertiser, ServiceDaemon, Source};
use hawser_mesh_device::netns::{self, Underlay, must};

const FOUND_WITHIN: Duration = Duration::from_secs(10);

/// Starts an advertiser for `instance` of `cluster_id` inside namespace `ns`.
fn advertise_in(ns: &str, instance: &str, cluster_id: &str) -> (ServiceDaemon, Advertiser) {
    let advert = advert(instance, cluster_id);
    let host_name = format!("{instance}.local.");
    netns::in_namespace(ns, move || {
        let daemon = ServiceDaemon::new().unwrap();
        let advertiser = Advertiser::start(&daemon, advert, &host_name).unwrap();
        (daemon, advertiser)
    })
}

fn endpoint(underlay: &Underlay, member: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(underlay.ip(member)), JOIN_PORT)
}

#[test]
fn a_browser_finds_the_advert_with_its_txt_data() {
    require_host(&[]);
    let underlay = Underlay::new(2, 161);
    let (_advertiser_daemon, _advertiser) = advertise_in(&underlay.members[0], "cp-0", CLUSTER);
    let (_browser_daemon, mut browser) = browser_in(&underlay.members[1], None);

    wait_for(&mut browser, FOUND_WITHIN, |seen| has(seen, "cp-0"))
        .expect("the browser in member 1 did not find member 0's advert");
    let candidates = browser.candidates();
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    let found = &candidates[0];
    assert_eq!(found.endpoint, endpoint(&underlay, 0));
    assert_eq!(found.cluster_id.as_deref(), Some(CLUSTER));
    assert_eq!(found.version.as_deref(), Some("0.1.0"));
    assert_eq!(found.api_port, Some(6443));
    assert_eq!(found.source, Source::Mdns);

    // The advert is announced again every second: it is still there after four.
    let later = Instant::now() + Duration::from_secs(4);
    while Instant::now() < later {
        browser.update(Duration::from_millis(200)).unwrap();
    }
    let candidates = browser.candidates();
    assert!(
        has(&candidates, "cp-0"),
        "the advert expired although announced"
    );
    assert!(
        candidates[0].last_seen > found.last_seen,
        "no announcement refreshed it"
    );
}

#[test]
fn an_advertiser_gone_without_goodbye_expires_after_three_missed_announcements() {
    require_host(&[]);
    let underlay = Underlay::new(2, 162);
    let (_advertiser_daemon, _advertiser) = advertise_in(&underlay.members[0], "cp-0", CLUSTER);
    let (_browser_daemon, mut browser) = browser_in(&underlay.members[1], None);
    wait_for(&mut browser, FOUND_WITHIN, |seen| has(seen, "cp-0"))
        .expect("the browser did not find the advert");

    // As if its node were killed or lost power: nothing more from it reaches the LAN, and no
    // goodbye. (mdns-sd's daemon says goodbye even when shut down, so the link is cut instead.)
    let killed = Instant::now();
    must(&[
        "ip",
        "-n",
        &underlay.members[0],
        "link",
        "set",
        "eth0",
        "down",
    ]);

    wait_for(&mut browser, Duration::from_secs(10), |seen| {
        !has(seen, "cp-0")
    })
    .expect("the advert did not expire");
    let gone = killed.elapsed();
    eprintln!("expired {gone:?} after the link was cut");
    // The last announcement was at most ~1 s before the kill; expiry is 3.5 s after it.
    assert!(
        (Duration::from_millis(2300)..Duration::from_secs(6)).contains(&gone),
        "expired {gone:?} after the kill, not after three missed announcements"
    );
}

#[test]
fn a_clean_stop_says_goodbye_and_the_entry_goes_at_its_first_failed_probe() {
    require_host(&[]);
    let underlay = Underlay::new(2, 163);
    let (_advertiser_daemon, advertiser) = advertise_in(&underlay.members[0], "cp-0", CLUSTER);
    let (_browser_daemon, mut browser) = browser_in(&underlay.members[1], None);
    wait_for(&mut browser, FOUND_WITHIN, |seen| has(seen, "cp-0"))
        .expect("the browser did not find the advert");

    let stopped = Instant::now();
    advertiser.stop().unwrap();
    wait_for(&mut browser, Duration::from_secs(10), |seen| {
        seen.iter().all(|c| c.leaving)
    })
    .expect("the goodbye was not heard");
    let heard = stopped.elapsed();
    eprintln!("goodbye heard {heard:?} after the stop");
    // A goodbye takes a second (RFC 6762 10.1: records with TTL 0 are kept for one), well
    // before the 2.5 s an expiry would take at the earliest.
    assert!(
        heard < Duration::from_secs(2),
        "heard after {heard:?}: no goodbye?"
    );
    // A goodbye can be forged: the entry stays (offered last) until its port fails a probe,
    // which a stopped join service's does at once.
    assert!(has(&browser.seen(), "cp-0"));
    let at = endpoint(&underlay, 0);
    let answered = netns::in_namespace(&underlay.members[1], move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(hawser_discovery::probe::probe(
            &[at],
            Duration::from_secs(2),
        ))
    });
    assert_eq!(answered, [false]);
    browser.probed(at, false);
    assert!(browser.seen().is_empty(), "{:?}", browser.seen());
}

#[test]
fn the_browser_follows_an_address_change() {
    require_host(&[]);
    let underlay = Underlay::new(2, 164);
    let (_advertiser_daemon, _advertiser) = advertise_in(&underlay.members[0], "cp-0", CLUSTER);
    let (_browser_daemon, mut browser) = browser_in(&underlay.members[1], None);
    wait_for(&mut browser, FOUND_WITHIN, |seen| has(seen, "cp-0"))
        .expect("the browser did not find the advert");
    assert_eq!(browser.candidates()[0].endpoint, endpoint(&underlay, 0));

    // Member 0 is renumbered.
    let ns = &underlay.members[0];
    let moved_to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 168, 164, 50)), JOIN_PORT);
    must(&["ip", "-n", ns, "addr", "flush", "dev", "eth0"]);
    must(&[
        "ip",
        "-n",
        ns,
        "addr",
        "add",
        "192.168.164.50/24",
        "dev",
        "eth0",
    ]);

    wait_for(&mut browser, FOUND_WITHIN, |seen| {
        seen.len() == 1 && seen[0].endpoint == moved_to
    })
    .unwrap_or_else(|| panic!("the browser did not follow the move: {:?}", browser.seen()));
    // And the entry stays alive at its new address.
    std::thread::sleep(Duration::from_secs(4));
    browser.update(Duration::ZERO).unwrap();
    let seen = browser.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].endpoint, moved_to);
}

#[test]
fn a_fake_advert_of_another_cluster_is_seen_but_filtered_out() {
    require_host(&[]);
    let underlay = Underlay::new(3, 165);
    let (_real_daemon, _real) = advertise_in(&underlay.members[0], "cp-0", CLUSTER);
    let (_fake_daemon, _fake) = advertise_in(&underlay.members[2], "cp-evil", OTHER_CLUSTER);
    let (_browser_daemon, mut browser) = browser_in(&underlay.members[1], Some(CLUSTER));

    wait_for(&mut browser, FOUND_WITHIN, |seen| {
        has(seen, "cp-0") && has(seen, "cp-evil")
    })
    .unwrap_or_else(|| panic!("the browser did not see both adverts: {:?}", browser.seen()));
    let fake = browser
        .seen()
        .into_iter()
        .find(|c| c.instance.as_deref() == Some("cp-evil"))
        .unwrap();
    assert_eq!(fake.endpoint, endpoint(&underlay, 2));
    assert_eq!(fake.cluster_id.as_deref(), Some(OTHER_CLUSTER));

    let candidates = browser.candidates();
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    assert_eq!(candidates[0].endpoint, endpoint(&underlay, 0));
    assert!(candidates[0].claims_cluster(CLUSTER));
}
