//! The unit tests of [`super::Sightings`]: every rule against a forger (issue 28) fails here
//! when it is taken out.

use super::*;
use std::net::Ipv4Addr;

const SECOND: Duration = Duration::from_secs(1);
const CLUSTER: &str = "0123456789abcdef";

fn advert_of(instance: &str, cluster_id: &str, interval: Option<Duration>) -> JoinServiceAdvert {
    JoinServiceAdvert {
        instance: instance.into(),
        cluster_id: cluster_id.into(),
        version: "0.1.0".into(),
        port: 9090,
        api_port: 6443,
        interval,
    }
}

fn advert(instance: &str, interval: Option<Duration>) -> JoinServiceAdvert {
    advert_of(instance, CLUSTER, interval)
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 168, 1, last))
}

fn ip_n(n: usize) -> IpAddr {
    let n = u32::try_from(n).unwrap();
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
}

fn endpoint(last: u8) -> SocketAddr {
    SocketAddr::new(ip(last), 9090)
}

fn instances(sightings: &Sightings) -> Vec<String> {
    let mut names: Vec<String> = sightings
        .candidates()
        .into_iter()
        .filter_map(|c| c.instance)
        .collect();
    names.dedup();
    names
}

fn endpoints(sightings: &Sightings) -> Vec<SocketAddr> {
    sightings.candidates().iter().map(|c| c.endpoint).collect()
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
    assert!(!candidates[0].leaving);
    assert_eq!(candidates[0].failures, 0);
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
fn an_advert_without_interval_expires_as_if_announced_every_30_s() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    sightings.observe(advert("avahi", None), &[ip(10)], t0);
    assert_eq!(sightings.next_deadline(), Some(t0 + 105 * SECOND));
    assert!(sightings.expire(t0 + 105 * SECOND).is_empty());
    assert_eq!(
        sightings.expire(t0 + 105 * SECOND + Duration::from_millis(1)),
        ["avahi"]
    );
}

#[test]
fn a_goodbye_keeps_the_entry_offered_until_it_fails_a_probe() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
    sightings.observe(advert("cp-1", Some(10 * SECOND)), &[ip(11)], t0);
    assert!(sightings.goodbye("cp-0"));
    assert!(!sightings.goodbye("unknown"));
    // A forged goodbye: still offered (marked), and a probe that answers keeps it.
    let leaving: Vec<bool> = sightings.candidates().iter().map(|c| c.leaving).collect();
    assert_eq!(leaving, [true, false]);
    sightings.probed(endpoint(10), true, t0);
    assert_eq!(instances(&sightings), ["cp-0", "cp-1"]);
    // Its next announcement makes it live again.
    sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0 + SECOND);
    assert!(!sightings.candidates()[0].leaving);
    // A real goodbye: the port is closed, one failed probe and it is gone.
    assert!(sightings.goodbye("cp-0"));
    sightings.probed(endpoint(10), false, t0);
    assert_eq!(instances(&sightings), ["cp-1"]);
}

#[test]
fn a_forged_address_is_added_beside_the_real_one_never_in_its_place() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(10)], t0);
    // A forged A record with mDNS's cache-flush bit: the daemon reports only the forged one.
    let change = sightings.observe(advert("cp-0", Some(10 * SECOND)), &[ip(66)], t0 + SECOND);
    assert_eq!(change, Change::AddressAdded(endpoint(66)));
    assert_eq!(endpoints(&sightings), [endpoint(10), endpoint(66)]);
    // The forged address fails its probe: the real one is still offered, and first in rank.
    sightings.probed(endpoint(66), false, t0);
    let candidates = crate::rank(sightings.candidates(), None);
    assert_eq!(candidates[0].endpoint, endpoint(10));
    assert_eq!(candidates[1].failures, 1);
    // The real one announces itself again: both are refreshed, the real one stays.
    let change = sightings.observe(
        advert("cp-0", Some(10 * SECOND)),
        &[ip(10)],
        t0 + 2 * SECOND,
    );
    assert_eq!(change, Change::Refreshed);
}

#[test]
fn a_renumbered_host_s_old_address_expires_when_no_longer_announced() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    sightings.observe(advert("cp-0", Some(SECOND)), &[ip(10)], t0);
    sightings.observe(advert("cp-0", Some(SECOND)), &[ip(50)], t0 + SECOND);
    assert_eq!(endpoints(&sightings), [endpoint(10), endpoint(50)]);
    sightings.observe(advert("cp-0", Some(SECOND)), &[ip(50)], t0 + 4 * SECOND);
    assert!(sightings.expire(t0 + 4 * SECOND).is_empty());
    assert_eq!(endpoints(&sightings), [endpoint(50)]);
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
fn a_cluster_s_share_is_capped_and_a_live_entry_never_evicted() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    let real = "real";
    sightings.observe(advert(real, Some(SECOND)), &[ip(10)], t0);
    for n in 1..MAX_PER_CLUSTER {
        let change = sightings.observe(advert(&format!("fake-{n}"), None), &[ip_n(n)], t0);
        assert!(matches!(change, Change::Appeared(_)), "{n}: {change:?}");
    }
    // The cluster's share is full of entries that have not failed: newcomers are refused…
    let late = advert("fake-late", None);
    assert_eq!(
        sightings.observe(late.clone(), &[ip_n(9999)], t0),
        Change::Refused
    );
    assert_eq!(sightings.refused(), 1);
    // …while another cluster still has room.
    let other = advert_of("other", "fedcba9876543210", None);
    assert!(matches!(
        sightings.observe(other, &[ip(20)], t0),
        Change::Appeared(_)
    ));
    // Every fake fails its probe and the real one answers: newcomers take the fakes' places,
    // never the real one's.
    for n in 1..MAX_PER_CLUSTER {
        sightings.probed(SocketAddr::new(ip_n(n), 9090), false, t0);
    }
    sightings.probed(endpoint(10), true, t0);
    for n in 0..2 * MAX_PER_CLUSTER {
        sightings.observe(
            advert(&format!("churn-{n}"), None),
            &[ip_n(10_000 + n)],
            t0 + SECOND,
        );
    }
    let names = instances(&sightings);
    assert!(
        names.iter().any(|name| name == real),
        "the real one evicted"
    );
    assert!(names.iter().any(|name| name == "other"));
    assert_eq!(sightings.len(), MAX_PER_CLUSTER + 1);
    // One refused before the probes, and the churn beyond the 255 dead fakes' places.
    let churn = 2 * MAX_PER_CLUSTER - (MAX_PER_CLUSTER - 1);
    assert_eq!(sightings.refused(), 1 + u64::try_from(churn).unwrap());
}

#[test]
fn the_table_is_capped_across_clusters() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    for n in 0..MAX_INSTANCES {
        let cluster = format!("{:016x}", n / (MAX_PER_CLUSTER / 2));
        sightings.observe(
            advert_of(&format!("fake-{n}"), &cluster, None),
            &[ip_n(n)],
            t0,
        );
    }
    assert_eq!(sightings.len(), MAX_INSTANCES);
    let newcomer = advert_of("new", "ffffffffffffffff", Some(SECOND));
    assert_eq!(
        sightings.observe(newcomer.clone(), &[ip(10)], t0),
        Change::Refused
    );
    // One entry fails its probe: the newcomer takes its place.
    sightings.probed(SocketAddr::new(ip_n(7), 9090), false, t0);
    assert_eq!(
        sightings.observe(newcomer, &[ip(10)], t0),
        Change::Appeared(endpoint(10))
    );
    assert_eq!(sightings.len(), MAX_INSTANCES);
    assert!(!instances(&sightings).contains(&"fake-7".to_owned()));
}

#[test]
fn an_entry_keeps_at_most_eight_addresses_and_a_failed_one_makes_room() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    let many: Vec<IpAddr> = (1..=20).map(ip).collect();
    sightings.observe(advert("cp-0", Some(SECOND)), &many, t0);
    assert_eq!(sightings.candidates().len(), MAX_ADDRESSES);
    // A ninth address is ignored while all eight answer…
    sightings.observe(advert("cp-0", Some(SECOND)), &[ip(100)], t0);
    assert!(!endpoints(&sightings).contains(&endpoint(100)));
    // …and takes the place of one that failed.
    sightings.probed(endpoint(3), false, t0);
    let change = sightings.observe(advert("cp-0", Some(SECOND)), &[ip(100)], t0);
    assert_eq!(change, Change::AddressAdded(endpoint(100)));
    assert!(!endpoints(&sightings).contains(&endpoint(3)));
    assert_eq!(sightings.candidates().len(), MAX_ADDRESSES);
}

#[test]
fn a_joined_node_s_cluster_keeps_its_places_whatever_other_clusters_claim() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    // Other clusters fill the table before the node knows its own (it never probes them).
    for n in 0..MAX_INSTANCES {
        let cluster = format!("{:016x}", n % 2);
        sightings.observe(
            advert_of(&format!("fake-{n}"), &cluster, None),
            &[ip_n(n)],
            t0,
        );
    }
    sightings.reserve_for(Some(CLUSTER.to_owned()));
    // The node's own cluster gets in, taking the place of another cluster's advert…
    assert_eq!(
        sightings.observe(advert("real", Some(SECOND)), &[ip(10)], t0),
        Change::Appeared(endpoint(10))
    );
    assert_eq!(sightings.len(), MAX_INSTANCES);
    // …and other clusters can no longer take more than their share.
    for n in 0..MAX_INSTANCES {
        sightings.observe(
            advert_of(&format!("more-{n}"), "0000000000000009", None),
            &[ip_n(20_000 + n)],
            t0,
        );
    }
    assert!(instances(&sightings).contains(&"real".to_owned()));
    for n in 0..MAX_PER_CLUSTER - 1 {
        let change = sightings.observe(advert(&format!("own-{n}"), None), &[ip_n(40_000 + n)], t0);
        assert!(matches!(change, Change::Appeared(_)), "{n}: {change:?}");
    }
    let own = sightings
        .candidates()
        .iter()
        .filter(|c| c.claims_cluster(CLUSTER))
        .count();
    assert_eq!(own, MAX_PER_CLUSTER);
    assert_eq!(sightings.len(), MAX_INSTANCES);
}

#[test]
fn a_failed_attempt_puts_an_endpoint_last_and_frees_its_place() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    sightings.observe(advert("answers-but-fake", Some(SECOND)), &[ip(66)], t0);
    sightings.observe(advert("real", Some(SECOND)), &[ip(10)], t0);
    sightings.attempt_failed(endpoint(66));
    // A probe that answers does not clear it: the attempt there failed.
    sightings.probed(endpoint(66), true, t0);
    for seed in 0..20 {
        let ranked = crate::rank_with(
            sightings.candidates(),
            None,
            &mut fastrand::Rng::with_seed(seed),
        );
        assert_eq!(ranked[0].endpoint, endpoint(10));
    }
    // A goodbye'd entry goes at its first failed attempt.
    sightings.goodbye("real");
    sightings.attempt_failed(endpoint(10));
    assert_eq!(instances(&sightings), ["answers-but-fake"]);
}

#[test]
fn an_address_that_answers_probes_lives_without_announcements() {
    let t0 = Instant::now();
    let mut sightings = Sightings::new();
    sightings.observe(advert("cp-0", Some(SECOND)), &[ip(10)], t0);
    // An attacker keeps mDNS from resolving it: no announcement is heard, but it answers.
    sightings.probed(endpoint(10), true, t0 + 3 * SECOND);
    assert!(sightings.expire(t0 + 6 * SECOND).is_empty());
    assert_eq!(endpoints(&sightings), [endpoint(10)]);
    assert_eq!(
        sightings.next_deadline(),
        Some(t0 + 6 * SECOND + SECOND / 2)
    );
    // It stops answering too: it goes 3.5 intervals after its last answer.
    sightings.probed(endpoint(10), false, t0 + 5 * SECOND);
    assert_eq!(sightings.expire(t0 + 7 * SECOND), ["cp-0"]);
}

#[test]
fn lifetime_is_three_and_a_half_intervals() {
    assert_eq!(lifetime(2 * SECOND), 7 * SECOND);
}
