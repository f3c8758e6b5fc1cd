//! The join client's tests: another cluster's join service refused before the lock, endpoints
//! asked in turn with backoff between rounds, a control plane's master secret checked.

use super::*;

fn secrets_of(measurement_secret: &[u8], key: u8) -> Secrets {
    Secrets {
        state_disk_key: Zeroizing::new(vec![key; 64]),
        measurement_secret: Zeroizing::new(measurement_secret.to_vec()),
        measurement_salt: b"salt".to_vec(),
        ticket: None,
        master_secret: None,
        mesh: None,
    }
}

fn endpoint() -> JoinEndpoint {
    JoinEndpoint::parse("10.0.2.2:9090").unwrap()
}

#[test]
fn a_join_service_of_the_disks_cluster_or_any_for_a_disk_without_one_is_accepted() {
    let ours = hawser_keys::cluster_id(b"our secret", b"salt");
    check_cluster(&endpoint(), Some(&ours), &secrets_of(b"our secret", 1)).unwrap();
    check_cluster(&endpoint(), None, &secrets_of(b"their secret", 1)).unwrap();
    let err = check_cluster(&endpoint(), Some(&ours), &secrets_of(b"their secret", 1)).unwrap_err();
    let theirs = hawser_keys::cluster_id(b"their secret", b"salt");
    assert_eq!(
        err.to_string(),
        format!(
            "the join service at 10.0.2.2:9090 belongs to cluster {}; this node's disk \
             belongs to cluster {}",
            hex::encode(theirs),
            hex::encode(ours)
        )
    );
    // The salt is part of the cluster ID, as in the node lock.
    let mut salted = secrets_of(b"our secret", 1);
    salted.measurement_salt = b"other salt".to_vec();
    assert!(check_cluster(&endpoint(), Some(&ours), &salted).is_err());
}

/// Tamper row: a join service of another cluster
///
/// A node whose disk records cluster A asks a join service that answers for cluster B (a
/// misconfigured endpoint, or someone else's join service of the same image): the answer is
/// refused before the node lock and the client keeps asking — here the endpoint answers for
/// A on the third attempt, and only that answer comes back.
#[tokio::test(start_paused = true)]
async fn tamper_join_service_of_another_cluster() {
    let ours = hawser_keys::cluster_id(b"our secret", b"salt");
    let endpoints = JoinEndpoints::one(endpoint());
    let backoff = RetryBackoff::default();
    let endpoints = JoinSource::Configured(endpoints);
    let retry = Retry {
        endpoints: &endpoints,
        backoff: &backoff,
        disk_cluster: Some(&ours),
        status: DiskStatus::Initialized,
    };
    let answers = std::cell::RefCell::new(vec![
        secrets_of(b"our secret", 3),
        secrets_of(b"their secret", 2),
        secrets_of(b"their secret", 1),
    ]);
    let (secrets, attempts) = retry
        .run(|_| {
            let answer = answers.borrow_mut().pop();
            async move { answer.ok_or_else(|| std::io::Error::other("no more answers")) }
        })
        .await;
    assert_eq!(attempts, 3, "two refusals, then the disk's cluster");
    assert_eq!(*secrets.state_disk_key, vec![3; 64]);
    assert_eq!(
        hawser_keys::cluster_id(&secrets.measurement_secret, &secrets.measurement_salt),
        ours
    );
}

/// The endpoints are asked in turn: the next one of a round at once, the backoff only after
/// a whole round failed; each attempt goes to its own endpoint.
#[tokio::test(start_paused = true)]
async fn endpoints_are_asked_in_turn_with_backoff_between_rounds() {
    let endpoints = JoinEndpoints::parse("10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000").unwrap();
    let backoff = RetryBackoff::default();
    let endpoints = JoinSource::Configured(endpoints);
    let retry = Retry {
        endpoints: &endpoints,
        backoff: &backoff,
        disk_cluster: None,
        status: DiskStatus::New,
    };

    // The first two are down, the third answers: three attempts, no waiting.
    let asked = std::cell::RefCell::new(Vec::new());
    let start = tokio::time::Instant::now();
    let (_, attempts) = retry
        .run(|endpoint| {
            asked.borrow_mut().push(endpoint.to_string());
            let up = endpoint.host == "10.0.0.3";
            async move {
                up.then(|| secrets_of(b"s", 1))
                    .ok_or_else(|| std::io::Error::other("connection refused"))
            }
        })
        .await;
    assert_eq!(attempts, 3);
    assert_eq!(
        *asked.borrow(),
        ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"]
    );
    assert_eq!(start.elapsed(), Duration::ZERO);

    // All down for two rounds, then the second answers: the waits are the backoff's first
    // two steps, taken after each whole round.
    asked.borrow_mut().clear();
    let start = tokio::time::Instant::now();
    let (_, attempts) = retry
        .run(|endpoint| {
            let round = asked.borrow().len() / 3;
            asked.borrow_mut().push(endpoint.to_string());
            let up = round == 2 && endpoint.host == "10.0.0.2";
            async move {
                up.then(|| secrets_of(b"s", 1))
                    .ok_or_else(|| std::io::Error::other("connection refused"))
            }
        })
        .await;
    assert_eq!(attempts, 8);
    assert_eq!(asked.borrow()[6..], ["10.0.0.1:7000", "10.0.0.2:7000"]);
    let waited = start.elapsed();
    let least = backoff.ceiling(0) / 2 + backoff.ceiling(1) / 2;
    let most = backoff.ceiling(0) + backoff.ceiling(1);
    assert!(waited >= least && waited <= most, "{waited:?}");
}

/// A control plane takes the master secret only if it derives what the rest of the
/// answer says: the disk key of this disk and the measurement secret.
#[test]
fn a_control_planes_master_secret_must_derive_the_rest_of_the_answer() {
    let master = MasterSecret::new(vec![1; 32], vec![2; 32]).unwrap();
    let uuid = "6a0e4c1f-2b3d-4e5f-8a9b-0c1d2e3f4a5b";
    let key = master
        .state_disk_key(uuid, hawser_keys::StateDiskKeyLength::Xts)
        .unwrap();
    let measurement = master.measurement_secret();
    let taken =
        checked_master_secret(&[1; 32], &[2; 32], uuid, &key[..], &measurement[..]).unwrap();
    assert_eq!(taken.key_bytes(), master.key_bytes());

    let other = MasterSecret::new(vec![3; 32], vec![2; 32]).unwrap();
    let other_key = other
        .state_disk_key(uuid, hawser_keys::StateDiskKeyLength::Xts)
        .unwrap();
    for (key, measurement) in [
        (&other_key[..], &measurement[..]),
        (&key[..], &other.measurement_secret()[..]),
    ] {
        let err = error_chain(
            &checked_master_secret(&[1; 32], &[2; 32], uuid, key, measurement).unwrap_err(),
        );
        assert!(err.contains("does not derive the disk key"), "{err}");
    }
    let err = error_chain(
        &checked_master_secret(&[1; 4], &[2; 32], uuid, &key[..], &measurement[..]).unwrap_err(),
    );
    assert!(
        err.starts_with("the join service sent an unusable master secret"),
        "{err}"
    );
    assert!(!err.contains("0101"), "no key material in the error: {err}");
}
