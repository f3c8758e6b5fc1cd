//! Faults during a join, end to end on the host: the node's own join client (PID 1's
//! `JoinClient`, attesting with a provisioned swtpm) against the real `hawser-joind` binary, with
//! the join service killed or the network cut while a join is inside the service. Each test
//! proves a row of docs/security.md's Faults table: the node ends with the key of its disk, the
//! disk is bound once to the node's AK, and nothing is lost.
//!
//! The moment "inside the service" is made exact with the token issuer: the service runs
//! `kubeadm token create` while it decides a join, and here that `kubeadm` is a wrapper that
//! says it was called (a file), waits for the test's "go" (another file), then runs the
//! kubeadm stand-in (`tests/fixtures/kubeadm-standin`, which says what it is).
//!
//! The tamper tests run the node as PID 1 does with `hawser.join_service_trust=attested`: the
//! join service must attest as a control plane of the node's image (a second swtpm, provisioned
//! by the same provider, with PCR 11 after `control-plane` and `leave-initrd` and PCR 15 locked
//! to its cluster), and the fakes are attested too where it matters: a worker's TPM of the same
//! image, a control plane of another cluster.
//!
//! Run with `cargo test -p hawser-joinservice --test join_faults`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use common::*;
use hawser_harness::provider::ProviderCa;
use hawser_init::disk::key::DiskStatus;
use hawser_init::enrollment::client::{JoinClient, Secrets};
use hawser_init::enrollment::{JoinEndpoints, JoinServicePolicy, WORKER_JOIN_SERVICE};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

/// What the proxy does with the bytes between node and service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Both ways.
    Up,
    /// The node's bytes reach the service; the service's answers are lost.
    AnswersLost,
    /// Every connection is closed (the node sees its connection end).
    Cut,
}

/// A TCP proxy on loopback between the node and the service, whose link the test controls.
/// Returns its address and how many connections it has closed because the link was cut: the
/// test waits for that count, not for a time, before it brings the link up again (a proxy task
/// that ran only after the link was up again would otherwise pass the lost answer on).
async fn proxy(to: SocketAddr, link: watch::Receiver<Link>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut_connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&cut_connections);
    tokio::spawn(async move {
        while let Ok((node_side, _)) = listener.accept().await {
            let link = link.clone();
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let Ok(service_side) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                let (mut node_read, mut node_write) = node_side.into_split();
                let (mut service_read, mut service_write) = service_side.into_split();
                let mut cut = link.clone();
                let up = async move {
                    let mut buf = vec![0; 16 * 1024];
                    while let Ok(n @ 1..) = node_read.read(&mut buf).await {
                        if service_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0; 16 * 1024];
                    while let Ok(n @ 1..) = service_read.read(&mut buf).await {
                        // Only an up link carries answers: bytes read once the link is
                        // cut (before this connection's cut branch ran) are lost too.
                        if *link.borrow() != Link::Up {
                            continue;
                        }
                        if node_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                // Dropping both halves closes the node's connection and the service's.
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                    _ = cut.wait_for(|l| *l == Link::Cut) => {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (addr, cut_connections)
}

/// The node got its disk's key, and the disk is bound once, to the node's AK.
fn assert_recovered(service: &Service, node: &Node, secrets: &Secrets, attempts: u32) {
    let log = service.log();
    assert!(
        attempts >= 2,
        "the fault cost no attempt ({attempts}):\n{log}"
    );
    let key = service
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{log}");
    assert!(secrets.ticket.is_some(), "a new disk gets a join ticket");
    assert_eq!(
        service.registry(),
        vec![format!("{UUID} {}", node.ak_hex)],
        "{log}"
    );
    // No secret reaches the service's log.
    assert!(!log.contains(&hex::encode(&*key)), "{log}");
}

/// Faults row: the join service restarted mid-join. The service is killed while a node's join
/// is inside it (its bootstrap token is being created); the node's attempt fails, it keeps
/// asking, and the restarted service (same state directory) grants the join.
#[test]
fn fault_join_service_restarted_mid_join() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut service = Service::new(&ca);
    service.start();
    let joining = join(&runtime, &node, &[service.port]);

    wait_for("the join inside the service", || {
        service.path("token-requested").exists()
    });
    service.kill();
    assert_eq!(service.granted_joins(), 0, "{}", service.log());
    std::fs::write(service.path("go"), "").expect("write");
    service.start();

    let (secrets, attempts) = runtime
        .block_on(async { tokio::time::timeout(STEP, joining).await })
        .expect("the node joins after the restart")
        .expect("join task");
    assert_recovered(&service, &node, &secrets, attempts);
    assert_eq!(service.granted_joins(), 1, "{}", service.log());
}

/// Faults row: the network cut mid-join. The node's request reaches the service, the service
/// decides it (the disk is bound, a token issued), and the answer is lost on the way back; then
/// the connection is cut. The node asks again, and the service grants the same disk to the same
/// AK again: the node ends with its key and nothing is bound twice.
#[test]
fn fault_network_cut_mid_join() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut service = Service::new(&ca);
    service.start();
    let (link, link_rx) = watch::channel(Link::Up);
    let to = SocketAddr::from(([127, 0, 0, 1], service.port));
    let (via, cut_connections) = runtime.block_on(proxy(to, link_rx));
    let joining = join(&runtime, &node, &[via.port()]);

    wait_for("the join inside the service", || {
        service.path("token-requested").exists()
    });
    link.send_replace(Link::AnswersLost);
    std::fs::write(service.path("go"), "").expect("write");
    wait_for("the service to grant the join whose answer is lost", || {
        service.granted_joins() == 1
    });
    assert_eq!(service.registry().len(), 1, "{}", service.log());
    link.send_replace(Link::Cut);
    wait_for("the proxy to cut the node's connection", || {
        cut_connections.load(Ordering::SeqCst) >= 1
    });
    link.send_replace(Link::Up);

    let (secrets, attempts) = runtime
        .block_on(async { tokio::time::timeout(STEP, joining).await })
        .expect("the node joins after the cut")
        .expect("join task");
    assert_recovered(&service, &node, &secrets, attempts);
    assert_eq!(service.granted_joins(), 2, "{}", service.log());
}

/// Faults row: a control plane's join service down, another's up. The node is given both
/// endpoints; the first refuses connections (its control plane is down), and the node asks the
/// next one at once, without waiting for a backoff.
#[test]
fn fault_a_control_planes_join_service_down_the_next_one_answers() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut service = Service::new(&ca);
    std::fs::write(service.path("go"), "").expect("write");
    service.start();
    let down = free_port();

    let (secrets, attempts) = runtime
        .block_on(async {
            tokio::time::timeout(STEP, join(&runtime, &node, &[down, service.port])).await
        })
        .expect("the node joins through the second endpoint")
        .expect("join task");
    assert_eq!(attempts, 2, "{}", service.log());
    assert_recovered(&service, &node, &secrets, attempts);
    assert_eq!(service.granted_joins(), 1, "{}", service.log());
}

/// Tamper row: root on a worker answers as the join service. The fake is *attested*: a real
/// `hawser-joind` (with a master secret of the attacker's choosing) on a TPM of the same image
/// and of the real cluster, pivoted as a worker (PCR 11 ← enter-initrd, leave-initrd). A fresh
/// node given the fake's endpoint first refuses it by name in the handshake (the fake's log
/// shows the node's verdict), before any call, and takes its key from the cluster's control
/// plane, whose TPM the node accepts (PCR 11 with the control-plane marker).
#[test]
fn tamper_a_workers_tpm_cannot_act_as_the_join_service() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut real = Service::new(&ca);
    let cluster = real.cluster_id();
    real.start_attested(&ca, Pivoted::ControlPlane, &cluster);
    let mut fake = Service::new(&ca);
    fake.start_attested(&ca, Pivoted::Worker, &cluster);

    let (secrets, attempts) = attested_fetch(&runtime, &node, &[fake.port, real.port], None);
    let key = real
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{}", fake.log());
    assert_eq!(attempts, 2, "the worker costs one attempt");
    let refused = fake.refused_by_clients();
    assert_eq!(refused.len(), 1, "{}", fake.log());
    assert!(refused[0].contains(WORKER_JOIN_SERVICE), "{}", refused[0]);
    // The node made no call: the fake decided nothing and bound nothing.
    assert_eq!(fake.granted_joins(), 0, "{}", fake.log());
    assert!(fake.registry().is_empty(), "{}", fake.log());
    assert_eq!(real.registry(), vec![format!("{UUID} {}", node.ak_hex)]);
    assert!(real.refused_by_clients().is_empty(), "{}", real.log());
}

/// Tamper row: a control plane of another cluster answers a rejoin. Both join services attest
/// as control planes of the node's image; the other's TPM is locked to its own cluster. A node
/// whose disk records the real cluster refuses the other in the handshake, naming its own
/// cluster (PCR 15), before it sends the other anything, and rejoins through the real one.
#[test]
fn tamper_a_control_plane_of_another_cluster_cannot_answer_a_rejoin() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let mut real = Service::new(&ca);
    let cluster = real.cluster_id();
    real.start_attested(&ca, Pivoted::ControlPlane, &cluster);
    let mut other = Service::new(&ca);
    let other_cluster = other.cluster_id();
    other.start_attested(&ca, Pivoted::ControlPlane, &other_cluster);

    // The first join: the disk is the real cluster's.
    let (secrets, attempts) = attested_fetch(&runtime, &node, &[real.port], None);
    let key = real
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(
        (*secrets.state_disk_key == key.to_vec(), attempts),
        (true, 1)
    );

    // The rejoin, the other cluster's control plane asked first.
    let (secrets, attempts) =
        attested_fetch(&runtime, &node, &[other.port, real.port], Some(cluster));
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{}", other.log());
    assert_eq!(attempts, 2, "the other cluster costs one attempt");
    let refused = other.refused_by_clients();
    assert_eq!(refused.len(), 1, "{}", other.log());
    assert!(
        refused[0].contains(&format!(
            "locked to another cluster than the one this node's disk records ({})",
            hex::encode(cluster)
        )),
        "{}",
        refused[0]
    );
    assert!(
        !other.log().contains("IssueRejoinTicket"),
        "the node asked the other cluster: {}",
        other.log()
    );
}

/// Tamper row: a fake join service advert on the LAN. On a LAN of network namespaces this test
/// creates, the real `hawser-joind` advertises itself over mDNS (`--mdns-instance`) and attests
/// as a control plane of the node's image (its swtpm in its namespace). So does a fake, whose
/// instance name sorts first: a real `hawser-joind` of another master secret (a cluster of the
/// attacker's), which would hand the node a key, but does not attest. A fresh node given no
/// endpoint (`hawser.join_discovery=mdns`, `hawser.join_service_trust=attested`) tries the
/// fake, refuses it in the handshake (one attempt, no call made), then gets the key of its disk
/// from the real one. A node whose disk records the real cluster never tries the fake: its
/// advert names another cluster. Without attestation the fake's key would be taken.
#[test]
fn tamper_fake_join_service_advert_only_costs_an_attempt() {
    use hawser_init::enrollment::client::JoinSource;
    use hawser_init::enrollment::discover::LanDiscovery;
    use hawser_mesh_device::netns::{self, Underlay};

    hawser_mesh_device::netns::require_host();
    let ca = Arc::new(ProviderCa::generate("test provider").expect("CA"));
    let lan = Underlay::new(3, 171);
    // The node's swtpm lives in its namespace, where its join client reaches it on loopback.
    let node = {
        let ca = Arc::clone(&ca);
        netns::in_namespace(&lan.members[2], move || node(&ca))
    };
    // member 0: the real join service; member 1: the fake; member 2: the node.
    let mut service = Service::new(&ca);
    let real_cluster = service.cluster_id();
    let tpm = {
        let ca = Arc::clone(&ca);
        netns::in_namespace(&lan.members[0], move || {
            service_tpm(&ca, Pivoted::ControlPlane, &real_cluster)
        })
    };
    service.attest_with(tpm);
    std::fs::write(service.path("go"), "").expect("write");
    let real = SocketAddr::from((lan.ip(0), 7000));
    service.start_with(
        Some(&lan.members[0]),
        real,
        &["--mdns-instance", "real-cp", "--mdns-interval-secs", "1"],
    );
    assert!(
        service
            .log()
            .contains("advertising real-cp._hawser-join._tcp.local."),
        "{}",
        service.log()
    );
    let mut fake = Service::new(&ca);
    std::fs::write(fake.path("go"), "").expect("write");
    fake.start_with(
        Some(&lan.members[1]),
        SocketAddr::from((lan.ip(1), 7000)),
        &["--mdns-instance", "a-fake", "--mdns-interval-secs", "1"],
    );

    let issuer = Arc::clone(&node.issuer);
    let policy = node.attested.clone();
    let (fresh, pinned) = netns::in_namespace(&lan.members[2], move || {
        let runtime = runtime();
        runtime.block_on(async move {
            let lan = Arc::new(LanDiscovery::start().expect("browse"));
            // Both adverts heard first, so that the count of attempts below is exact.
            let heard = tokio::time::timeout(STEP, async {
                while lan.round(None, Duration::from_secs(1)).await.len() < 2 {}
            });
            heard.await.expect("the node hears both adverts");
            let fresh = JoinClient::new(
                JoinSource::Discovered(Arc::clone(&lan)),
                policy.clone(),
                Arc::clone(&issuer),
            );
            let fresh = tokio::time::timeout(STEP, fresh.fetch(UUID, 64, DiskStatus::New))
                .await
                .expect("the fresh node joins through the real advert");
            let pinned = JoinClient::new(JoinSource::Discovered(lan), policy, issuer)
                .disk_cluster(Some(real_cluster));
            let pinned =
                tokio::time::timeout(STEP, pinned.fetch(UUID, 64, DiskStatus::Initialized))
                    .await
                    .expect("the joined node rejoins through the real advert");
            (fresh, pinned)
        })
    });
    let (secrets, attempts) = fresh;
    let key = service
        .master
        .state_disk_key(UUID, hawser_keys::StateDiskKeyLength::Xts)
        .expect("key");
    assert_eq!(*secrets.state_disk_key, key.to_vec(), "{}", fake.log());
    // Tried in a random order (docs/discovery.md): the fake costs at most one attempt.
    assert!(
        attempts <= 2,
        "the fake costs one attempt, no more ({attempts})"
    );
    assert_eq!(fake.granted_joins(), 0, "{}", fake.log());
    assert!(fake.registry().is_empty(), "{}", fake.log());
    let (secrets, attempts) = pinned;
    assert_eq!(*secrets.state_disk_key, key.to_vec());
    assert_eq!(
        attempts, 1,
        "a node of the real cluster never tries the fake"
    );
    assert_eq!(
        service.registry(),
        vec![format!("{UUID} {}", node.ak_hex)],
        "{}",
        service.log()
    );
}

/// Tamper row: a bootstrap token read from one node (its disk's ticket, or a pod on it). Every
/// join gets a token of its own, asked of kubeadm with the short lifetime: a token admits the
/// node it was issued to, for 30 minutes, and never another node's join. The same with tokens
/// minted ahead (`--token-pool`): each pooled token goes to one join.
#[test]
fn tamper_a_bootstrap_token_belongs_to_one_join_and_is_short_lived() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    for pool in ["0", "3"] {
        let mut service = Service::new(&ca);
        std::fs::write(service.path("go"), "").expect("write");
        let listen = SocketAddr::from(([127, 0, 0, 1], service.port));
        service.start_with(None, listen, &["--token-pool", pool]);
        if pool != "0" {
            wait_for("the token pool to fill", || {
                service.log().contains("bootstrap token pool filled")
            });
        }
        let endpoints =
            JoinEndpoints::parse(&format!("127.0.0.1:{}", service.port)).expect("endpoints");
        let mut tokens = Vec::new();
        for uuid in [
            UUID,
            "0b1c2d3e-4f50-4612-8a9b-0c1d2e3f4a5b",
            "1b1c2d3e-4f50-4612-8a9b-0c1d2e3f4a5b",
            "2b1c2d3e-4f50-4612-8a9b-0c1d2e3f4a5b",
        ] {
            let node = node(&ca);
            let client = JoinClient::new(
                endpoints.clone(),
                JoinServicePolicy::Unauthenticated,
                Arc::clone(&node.issuer),
            );
            let (secrets, _) = runtime
                .block_on(async {
                    tokio::time::timeout(STEP, client.fetch(uuid, 64, DiskStatus::New)).await
                })
                .expect("the node joins");
            let ticket = secrets.ticket.expect("a new disk gets a join ticket");
            tokens.push(ticket.token.expose_secret().to_owned());
        }
        let calls = std::fs::read_to_string(service.path("kubeadm-calls")).expect("kubeadm ran");
        let mut distinct = tokens.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            tokens.len(),
            "two joins shared one token (pool {pool}):\n{calls}"
        );
        let creates: Vec<&str> = calls
            .lines()
            .filter(|l| l.starts_with("token create"))
            .collect();
        if pool == "0" {
            assert_eq!(
                creates.len(),
                4,
                "one `kubeadm token create` per join:\n{calls}"
            );
        } else {
            // The pool's 3, and the refills after joins took them: each token minted once.
            assert!(creates.len() >= 4, "{calls}");
        }
        assert!(creates.iter().all(|l| l.contains("--ttl 1800s")), "{calls}");
        // No token in the service's log.
        let log = service.log();
        assert!(
            tokens.iter().all(|t| !log.contains(t.as_str())),
            "a token in the log"
        );
    }
}
