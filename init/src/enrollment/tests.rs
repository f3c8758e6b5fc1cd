//! The enrollment's shared pieces, tested: the retry backoff, join endpoints, and the policy an
//! attested join service must satisfy.

use super::*;

#[test]
fn backoff_doubles_up_to_the_maximum_and_jitters_within_half() {
    let b = RetryBackoff::default();
    assert_eq!(b.ceiling(0), Duration::from_millis(500));
    assert_eq!(b.ceiling(1), Duration::from_secs(1));
    assert_eq!(b.ceiling(4), Duration::from_secs(8));
    assert_eq!(b.ceiling(5), Duration::from_secs(10));
    assert_eq!(b.ceiling(1000), Duration::from_secs(10));
    assert_eq!(b.delay(2, 0.0), Duration::from_secs(1));
    let almost = b.delay(2, 0.999_999);
    assert!(almost > Duration::from_millis(1999) && almost < Duration::from_secs(2));
    assert_eq!(b.delay(30, 1.0), Duration::from_secs(10));
    assert_eq!(b.delay(0, f64::NAN), Duration::from_millis(375));
    let unit = jitter_unit();
    assert!((0.0..1.0).contains(&unit));
}

#[test]
fn endpoints_need_host_and_port() {
    let e = JoinEndpoint::parse("10.0.2.100:7000").unwrap();
    assert_eq!(e.uri(), "http://10.0.2.100:7000");
    assert_eq!(
        JoinEndpoint::parse("join.example:443").unwrap().to_string(),
        "join.example:443"
    );
    for bad in ["", "10.0.2.100", ":7000", "h:0", "h:70000", "a b:1", "h:x"] {
        assert_eq!(JoinEndpoint::parse(bad), None, "{bad}");
    }
}

#[test]
fn endpoint_lists_keep_their_order_and_bad_lists_are_refused() {
    let list = JoinEndpoints::parse("10.0.2.100:7000, 10.0.2.101:7000,cp3.example:7000").unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(
        list.to_string(),
        "10.0.2.100:7000,10.0.2.101:7000,cp3.example:7000"
    );
    let order: Vec<String> = list.iter().map(ToString::to_string).collect();
    assert_eq!(
        order,
        ["10.0.2.100:7000", "10.0.2.101:7000", "cp3.example:7000"]
    );
    let seventeen: Vec<String> = (1..=17).map(|i| format!("10.0.0.{i}:7000")).collect();
    assert!(JoinEndpoints::parse(&seventeen[..16].join(",")).is_some());
    for bad in [
        "",
        ",",
        "10.0.2.100:7000,",
        "10.0.2.100:7000,10.0.2.100:7000",
        "10.0.2.100:7000;10.0.2.101:7000",
        &seventeen.join(","),
    ] {
        assert_eq!(JoinEndpoints::parse(bad), None, "{bad}");
    }
}

fn own() -> BTreeMap<u8, [u8; 32]> {
    [
        (4, [4; 32]),
        (9, [9; 32]),
        (11, [11; 32]),
        (12, [12; 32]),
        (13, [0; 32]),
    ]
    .into()
}

fn quote(pcr11: [u8; 32], pcr15: [u8; 32]) -> BTreeMap<u8, [u8; 32]> {
    let mut quote = own();
    quote.insert(11, pcr11);
    quote.insert(15, pcr15);
    quote
}

#[test]
fn an_attested_join_service_must_be_a_control_plane_of_this_image() {
    let expected = join_service_measurements(&own(), None);
    let pinned: Vec<u8> = expected.enforced().collect();
    assert_eq!(pinned, [4, 9, 11, 12, 13], "a fresh disk pins no cluster");
    assert_eq!(expected.get(9).unwrap().expected, [9; 32]);
    let control_plane = pcr11_after_pivot(&[11; 32], true);
    assert_eq!(expected.get(11).unwrap().expected, control_plane);
    let locked = cluster_lock_pcr(&[0xc1; 32]);
    assert_eq!(expected.check(&quote(control_plane, locked)), Ok(vec![]));

    // A worker of the same image, pivoted: refused by name.
    let worker = pcr11_after_pivot(&[11; 32], false);
    let err = expected.check(&quote(worker, locked)).unwrap_err();
    assert!(err.to_string().contains(WORKER_JOIN_SERVICE), "{err}");
    // Root on that worker extending the marker after the pivot gets neither value.
    let late = hawser_pcr::extend_sha256(
        &worker,
        &hawser_pcr::phase_digest(hawser_pcr::PHASE_CONTROL_PLANE),
    );
    let err = expected.check(&quote(late, locked)).unwrap_err();
    assert!(err.to_string().contains(NOT_A_CONTROL_PLANE), "{err}");
    // A node in its initramfs, or another image: not a control plane of this image.
    let err = expected.check(&quote([11; 32], locked)).unwrap_err();
    assert!(err.to_string().contains(NOT_A_CONTROL_PLANE), "{err}");
    // A TPM without a lock (PCR 15 zero) is no cluster's join service.
    let err = expected.check(&quote(control_plane, [0; 32])).unwrap_err();
    assert!(err.to_string().contains(UNLOCKED_JOIN_SERVICE), "{err}");
}

#[test]
fn on_a_rejoin_the_join_service_must_be_of_the_disks_cluster() {
    let ours = [0xc1; 32];
    let expected = join_service_measurements(&own(), Some(&ours));
    let pinned: Vec<u8> = expected.enforced().collect();
    assert_eq!(pinned, [4, 9, 11, 12, 13, 15]);
    let control_plane = pcr11_after_pivot(&[11; 32], true);
    assert_eq!(
        expected.check(&quote(control_plane, cluster_lock_pcr(&ours))),
        Ok(vec![])
    );
    let err = expected
        .check(&quote(control_plane, cluster_lock_pcr(&[0xc2; 32])))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("locked to another cluster than the one this node's disk records"),
        "{text}"
    );
    assert!(text.contains(&hex::encode(ours)), "{text}");
    let err = expected.check(&quote(control_plane, [0; 32])).unwrap_err();
    assert!(err.to_string().contains(UNLOCKED_JOIN_SERVICE), "{err}");
}

#[test]
fn a_policy_needs_this_nodes_pcr_11() {
    let provider = hawser_harness::provider::ProviderCa::generate("test provider").unwrap();
    let ca = AkTrust::from_pem(&provider.certificate_pem()).unwrap();
    let mut without = own();
    without.remove(&11);
    assert!(ControlPlaneOfThisImage::new(without, ca.clone()).is_none());
    let policy = JoinServicePolicy::ControlPlane(
        ControlPlaneOfThisImage::new(own(), ca).expect("PCR 11 is there"),
    );
    let PeerPolicy::Verify(validator) = policy.peer_policy(Some(&[1; 32])).unwrap() else {
        panic!("an attested policy verifies");
    };
    assert_eq!(
        validator.measurements().get(15).unwrap().expected,
        cluster_lock_pcr(&[1; 32])
    );
    assert!(matches!(
        JoinServicePolicy::Unauthenticated.peer_policy(Some(&[1; 32])),
        Ok(PeerPolicy::Unauthenticated)
    ));
}

#[test]
fn attested_trust_without_a_provider_ca_is_a_clear_error() {
    // The error names the file and the build flag; no TPM is touched before the CA is read.
    let err = JoinSetupError::NoProviderCa {
        path: PROVIDER_CA_PATH,
    };
    let text = err.to_string();
    assert!(text.contains("/etc/hawser/provider-ca.pem"), "{text}");
    assert!(text.contains("--provider-ca"), "{text}");
}

#[test]
fn trust_names_round_trip() {
    for t in [JoinServiceTrust::Attested, JoinServiceTrust::InsecureDev] {
        assert_eq!(JoinServiceTrust::from_cmdline(t.cmdline_name()), Some(t));
    }
    assert_eq!(JoinServiceTrust::from_cmdline("none"), None);
}

#[test]
fn a_fresh_node_of_this_image_is_what_the_in_cluster_join_service_expects() {
    let own: BTreeMap<u8, [u8; 32]> = [
        (4, [4; 32]),
        (9, [9; 32]),
        (11, [11; 32]),
        (12, [12; 32]),
        (13, [13; 32]),
        (15, [15; 32]),
        (0, [0xaa; 32]),
    ]
    .into_iter()
    .collect();
    let json = fresh_node_measurements_json(&own);
    let expected = ExpectedMeasurements::from_json(&json.to_string()).unwrap();
    for pcr in [4u8, 9, 11, 12, 13] {
        assert_eq!(expected.get(pcr).unwrap().expected, [pcr; 32], "PCR {pcr}");
    }
    // A joining node is fresh: its PCR 15 is zero, whatever this node's lock is.
    assert_eq!(expected.get(15).unwrap().expected, [0; 32]);
    // Firmware PCRs differ between VMs and are not pinned.
    assert!(expected.get(0).is_none());
}
