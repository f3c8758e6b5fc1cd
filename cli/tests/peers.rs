//! `hawser peers` as a real binary over a join service's state directory filled through the
//! store API: three members (the join service, a node that polls, a node that stopped), the
//! table and the JSON checked.
//! Run with `cargo test -p hawser-cli --test peers`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::Path;
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use hawser_cluster_store::{ClusterStore, FileStore, PollStatus};
use hawser_mesh::{Ipv4Net, PeerStats, PublicKey};

const WORKER_1: &str = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
const WORKER_2: &str = "00000000-1111-4222-8333-444444444444";

fn key(n: u8) -> PublicKey {
    PublicKey::from_slice(&[n; 32]).unwrap()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A state directory as hawser-joind leaves it: the join service at .1, worker-1 at .2 (polled
/// 3 s ago, one version behind, with a handshake to the join service), worker-2 at .3 (last
/// poll 10 minutes ago).
fn state_dir(dir: &Path) {
    let store = FileStore::open(&dir.join("joined-disks")).unwrap();
    let prefix: Ipv4Net = "10.99.0.0/24".parse().unwrap();
    store
        .update_vpn_registry(prefix, &mut |registry| {
            let reserved = registry.reserved_address();
            registry.admit(
                "join-service/joind",
                "joind",
                key(200),
                Some("192.0.2.1:51820".parse().unwrap()),
                true,
                Some(reserved),
            )?;
            registry.admit(
                WORKER_1,
                "worker-1",
                key(1),
                Some("192.0.2.10:51820".parse().unwrap()),
                false,
                None,
            )?;
            registry.admit(WORKER_2, "worker-2", key(2), None, false, None)?;
            Ok(())
        })
        .unwrap();
    let now = now();
    store
        .record_vpn_poll(
            WORKER_1,
            &PollStatus {
                unix_time: now - 3,
                known_version: Some(2),
                stats: vec![
                    PeerStats {
                        public_key: key(200),
                        endpoint: Some("192.0.2.1:51820".parse().unwrap()),
                        last_handshake_unix: Some(now - 40),
                        rx_bytes: 3 * 1024 * 1024,
                        tx_bytes: 2048,
                    },
                    PeerStats {
                        public_key: key(2),
                        endpoint: None,
                        last_handshake_unix: None,
                        rx_bytes: 0,
                        tx_bytes: 148,
                    },
                ],
            },
        )
        .unwrap();
    store
        .record_vpn_poll(
            WORKER_2,
            &PollStatus {
                unix_time: now - 600,
                known_version: Some(3),
                stats: vec![],
            },
        )
        .unwrap();
}

fn hawser_peers(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hawser"))
        .arg("peers")
        .arg("--state-dir")
        .arg(dir)
        .args(extra)
        .output()
        .unwrap()
}

fn row<'a>(table: &'a str, name: &str) -> &'a str {
    table
        .lines()
        .find(|line| line.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
}

#[test]
fn hawser_peers_shows_every_member_its_polls_and_who_stopped() {
    let dir = tempfile::tempdir().unwrap();
    state_dir(dir.path());

    let output = hawser_peers(dir.path(), &[]);
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        table.starts_with("mesh 10.99.0.0/24 at registry version 3 (3 members)\n"),
        "{table}"
    );
    let joind = row(&table, "joind");
    for says in [
        "join-service",
        "10.99.0.1",
        "192.0.2.1:51820",
        &key(200).to_string(),
        "serves polls",
    ] {
        assert!(joind.contains(says), "{says}: {joind}");
    }
    let worker_1 = row(&table, "worker-1");
    for says in [
        " node ",
        "10.99.0.2",
        "192.0.2.10:51820",
        &key(1).to_string(),
        "2/3",
        "behind",
        "s ago (joind)",
        "3.0 MiB",
        "2.0 KiB",
    ] {
        assert!(worker_1.contains(says), "{says}: {worker_1}");
    }
    let worker_2 = row(&table, "worker-2");
    for says in ["10.99.0.3", "3/3", "STOPPED POLLING", "10m0"] {
        assert!(worker_2.contains(says), "{says}: {worker_2}");
    }
    assert!(
        table.contains("stopped polling (no poll for more than 30s): worker-2\n"),
        "{table}"
    );

    // A stale limit above ten minutes: nobody stopped.
    let output = hawser_peers(dir.path(), &["--stale-after", "3600"]);
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(!table.contains("STOPPED"), "{table}");
}

#[test]
fn hawser_peers_json_has_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    state_dir(dir.path());
    let output = hawser_peers(dir.path(), &["--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["prefix"], "10.99.0.0/24");
    assert_eq!(json["registry_version"], 3);
    assert_eq!(json["stale_after_secs"], 30);
    assert_eq!(json["stopped_polling"], serde_json::json!(["worker-2"]));
    let members = json["members"].as_array().unwrap();
    let names: Vec<&str> = members
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["joind", "worker-1", "worker-2"], "by VPN address");

    let joind = &members[0];
    assert_eq!(joind["id"], "join-service/joind");
    assert_eq!(joind["role"], "join-service");
    assert_eq!(joind["polling"], "coordinator");
    assert_eq!(joind["last_poll_unix"], serde_json::Value::Null);

    let worker_1 = &members[1];
    assert_eq!(worker_1["id"], WORKER_1);
    assert_eq!(worker_1["role"], "node");
    assert_eq!(worker_1["vpn_ip"], "10.99.0.2");
    assert_eq!(worker_1["public_key"], key(1).to_string());
    assert_eq!(worker_1["endpoint"], "192.0.2.10:51820");
    assert_eq!(worker_1["polling"], "polling");
    assert_eq!(worker_1["known_version"], 2);
    assert_eq!(worker_1["behind"], true);
    assert!(worker_1["last_poll_age_secs"].as_u64().unwrap() >= 3);
    let peers = worker_1["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 2, "every peer's statistics");
    assert_eq!(peers[0]["name"], "joind");
    assert_eq!(peers[0]["public_key"], key(200).to_string());
    assert_eq!(peers[0]["endpoint"], "192.0.2.1:51820");
    assert_eq!(peers[0]["rx_bytes"], 3 * 1024 * 1024);
    assert_eq!(peers[0]["tx_bytes"], 2048);
    assert!(peers[0]["last_handshake_age_secs"].as_u64().unwrap() >= 40);
    assert_eq!(peers[1]["name"], "worker-2");
    assert_eq!(peers[1]["last_handshake_unix"], serde_json::Value::Null);

    let worker_2 = &members[2];
    assert_eq!(worker_2["polling"], "stopped");
    assert_eq!(worker_2["behind"], false);
    assert_eq!(worker_2["endpoint"], serde_json::Value::Null);
}

#[test]
fn hawser_peers_without_a_mesh_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let output = hawser_peers(dir.path(), &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no WireGuard mesh in")
            && stderr.contains(&dir.path().display().to_string()),
        "{stderr}"
    );
}

#[test]
fn hawser_peers_remove_frees_the_address_and_unknown_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    state_dir(dir.path());
    let output = hawser_peers(dir.path(), &["--remove", "worker-2"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("removed worker-2 ({WORKER_2}, 10.99.0.3"))
            && stdout.contains("registry version 4"),
        "{stdout}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&hawser_peers(dir.path(), &["--json"]).stdout).unwrap();
    assert_eq!(json["registry_version"], 4);
    assert_eq!(json["members"].as_array().unwrap().len(), 2);

    // The disk may come back with a new key, and gets the lowest free address again.
    let store = FileStore::open(&dir.path().join("joined-disks")).unwrap();
    let again = store
        .update_vpn_registry("10.99.0.0/24".parse().unwrap(), &mut |registry| {
            registry.admit(WORKER_2, "worker-2", key(22), None, false, None)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(
        again.member(WORKER_2).unwrap().vpn_ip.to_string(),
        "10.99.0.3"
    );

    let output = hawser_peers(dir.path(), &["--remove", "worker-9"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("\"worker-9\" is no member"), "{stderr}");
}
