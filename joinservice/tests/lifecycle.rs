//! A cluster's life after formation, on the host with the real `hawser-joind` and swtpms
//! (docs/lifecycle.md): the admin adds and retires releases over the attested admin API, the
//! join service accepts a new image's nodes and refuses a retired one's by name, a revoked node
//! is refused until readmitted, and `hawser verify` judges a running node's fresh quote (which
//! tpm2-tools' own `tpm2_checkquote` verifies too).
//!
//! Run with `cargo test -p hawser-joinservice --test lifecycle`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy};
use hawser_attestation::evidence::{Binding, Evidence, Role};
use hawser_attestation::validator::AkTrust;
use hawser_attestation::{Tpm, TpmIssuer};
use hawser_cli::lifecycle::{AdminTarget, verify_node};
use hawser_cluster_store::releases::Release;
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_init::disk::key::DiskStatus;
use hawser_init::enrollment::client::JoinClient;
use hawser_init::enrollment::{JoinEndpoints, JoinServicePolicy};
use hawser_keys::MasterSecret;
use hawser_pcr::{PCR_CLUSTER_ID, PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD};
use prost::Message as _;

const DISK_A: &str = "0a0e4c1f-2b3d-4e5f-8a9b-0c1d2e3f4a5b";
const DISK_B: &str = "0b0e4c1f-2b3d-4e5f-8a9b-0c1d2e3f4a5b";

/// A fresh node of the first image (`None`: PCR 11 at `enter-initrd`, what the service's
/// measurements file expects) or of another one (PCR 11 holds `image` before `enter-initrd`,
/// as another UKI's sections would).
fn node_of_image(ca: &ProviderCa, image: Option<&str>) -> (Arc<TpmIssuer>, Swtpm) {
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"));
    ca.provision(&swtpm).expect("provider provisions the TPM");
    let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open swtpm");
    if let Some(image) = image {
        tpm.extend_phase(PCR_KERNEL_BOOT, image).expect("extend");
    }
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
        .expect("extend enter-initrd");
    (
        Arc::new(TpmIssuer::new(Arc::new(tpm)).expect("issuer")),
        swtpm,
    )
}

/// The measurements file of a node whose TPM is `issuer`'s now (PCR 11).
fn measurements_of(issuer: &TpmIssuer) -> String {
    let pcrs = issuer
        .tpm()
        .read_pcrs_sha256([PCR_KERNEL_BOOT])
        .expect("read PCR 11");
    format!(
        r#"{{"11": {{"expected": "{}", "warnOnly": false}}}}"#,
        hex::encode(pcrs[&PCR_KERNEL_BOOT])
    )
}

/// Asks the service for a disk's key once (a few seconds); `true` if granted.
fn fetch_once(
    runtime: &tokio::runtime::Runtime,
    issuer: &Arc<TpmIssuer>,
    port: u16,
    uuid: &str,
    status: DiskStatus,
) -> bool {
    let client = JoinClient::new(
        JoinEndpoints::parse(&format!("127.0.0.1:{port}")).expect("endpoints"),
        JoinServicePolicy::Unauthenticated,
        Arc::clone(issuer),
    );
    runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(4), client.fetch(uuid, 64, status)).await
        })
        .is_ok()
}

/// What the service's aTLS handshake says to a node of `issuer` (its refusal, or "accepted").
fn handshake_verdict(
    runtime: &tokio::runtime::Runtime,
    issuer: &Arc<TpmIssuer>,
    port: u16,
) -> String {
    let client = AtlsClient::new(
        Identity::attested(
            Arc::clone(issuer) as Arc<dyn hawser_attestation::evidence::EvidenceIssuer>
        ),
        PeerPolicy::Unauthenticated,
    );
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        match client.connect(tcp).await {
            Ok(_) => "accepted".to_owned(),
            Err(e) => hawser_attestation::error_chain(&e),
        }
    })
}

struct Cluster {
    service: Service,
    admin_port: u16,
    ca: ProviderCa,
}

impl Cluster {
    /// A join service attesting as a control plane of the first image locked to its cluster,
    /// serving the admin API, its policy refreshed every second.
    fn start() -> Self {
        let ca = ProviderCa::generate("test provider").expect("CA");
        let mut service = Service::new(&ca);
        let cluster = service.cluster_id();
        service.attest_with(service_tpm(&ca, Pivoted::ControlPlane, &cluster));
        std::fs::write(service.path("go"), "").expect("write");
        let admin_port = free_port();
        let admin = format!("127.0.0.1:{admin_port}");
        service.start_with(
            None,
            SocketAddr::from(([127, 0, 0, 1], service.port)),
            &["--admin-listen", &admin, "--policy-poll-secs", "1"],
        );
        Cluster {
            service,
            admin_port,
            ca,
        }
    }

    fn release_v1(&self) -> Release {
        let text = std::fs::read_to_string(self.service.path("measurements.json")).unwrap();
        Release::from_measurements_text("v1", &text, "admin", 0).unwrap()
    }

    fn admin_with(&self, master: &MasterSecret) -> AdminTarget {
        AdminTarget::new(
            &format!("127.0.0.1:{}", self.admin_port),
            vec![self.release_v1()],
            self.service.cluster_id(),
            &self.ca.certificate_pem(),
            master,
        )
        .expect("admin target")
    }
}

/// The release model end to end: a new image's node is refused until the admin adds its
/// release, then joins (the audit names the release); retiring the first release refuses its
/// nodes by name in the handshake; only the admin token is heard, and only by a control plane.
#[test]
fn the_admin_adds_and_retires_releases_and_the_join_service_follows() {
    let runtime = runtime();
    let cluster = Cluster::start();
    let admin = cluster.admin_with(&cluster.service.master);
    let port = cluster.service.port;
    let (v1_node, _v1_tpm) = node_of_image(&cluster.ca, None);
    let (v2_node, _v2_tpm) = node_of_image(&cluster.ca, Some("hawser test image v2"));
    let v1_text = measurements_of(&v1_node);
    let v2_text = measurements_of(&v2_node);

    assert_eq!(handshake_verdict(&runtime, &v1_node, port), "accepted");
    let refused = handshake_verdict(&runtime, &v2_node, port);
    assert!(refused.contains("PCR 11"), "{refused}");

    let stranger = MasterSecret::generate().unwrap();
    let err = runtime
        .block_on(cluster.admin_with(&stranger).add_release("v2", &v2_text))
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("not the admin's token"),
        "{err:#}"
    );

    let (v1, new) = runtime.block_on(admin.add_release("v1", &v1_text)).unwrap();
    assert!(new && v1.name == "v1");
    let (_, new) = runtime.block_on(admin.add_release("v2", &v2_text)).unwrap();
    assert!(new);
    let names: Vec<String> = runtime
        .block_on(admin.list_releases())
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["v1", "v2"]);
    wait_for("the policy to take v2", || {
        handshake_verdict(&runtime, &v2_node, port) == "accepted"
    });
    assert!(fetch_once(
        &runtime,
        &v2_node,
        port,
        DISK_B,
        DiskStatus::New
    ));
    let log = cluster.service.log();
    let granted = log
        .lines()
        .find(|l| l.contains("IssueJoinTicket") && l.contains("granted"))
        .unwrap_or_else(|| panic!("no granted join:\n{log}"));
    assert!(
        granted.contains("release=\"v2\"") || granted.contains("release=v2"),
        "{granted}"
    );

    let (retired, changed) = runtime.block_on(admin.retire_release("v1")).unwrap();
    assert!(changed && retired.is_retired());
    wait_for("the policy to refuse v1", || {
        handshake_verdict(&runtime, &v1_node, port) != "accepted"
    });
    let refused = handshake_verdict(&runtime, &v1_node, port);
    assert!(
        refused.contains("the node runs release v1, which the cluster's admin retired"),
        "{refused}"
    );
    let last = runtime.block_on(admin.retire_release("v2")).unwrap_err();
    assert!(
        format!("{last:#}").contains("only accepted release"),
        "{last:#}"
    );
}

/// A worker's TPM serving the admin API is refused by the admin before the token is sent.
#[test]
fn the_admin_talks_only_to_a_control_plane_of_the_cluster() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let mut fake = Service::new(&ca);
    let cluster = fake.cluster_id();
    fake.attest_with(service_tpm(&ca, Pivoted::Worker, &cluster));
    let admin_port = free_port();
    fake.start_with(
        None,
        SocketAddr::from(([127, 0, 0, 1], fake.port)),
        &["--admin-listen", &format!("127.0.0.1:{admin_port}")],
    );
    let text = std::fs::read_to_string(fake.path("measurements.json")).unwrap();
    let admin = AdminTarget::new(
        &format!("127.0.0.1:{admin_port}"),
        vec![Release::from_measurements_text("v1", &text, "admin", 0).unwrap()],
        cluster,
        &ca.certificate_pem(),
        &fake.master,
    )
    .unwrap();
    let err = runtime().block_on(admin.list_releases()).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("cannot reach a verified control plane"),
        "{text}"
    );
    assert!(!fake.log().contains("ListReleases"), "{}", fake.log());
}

/// Revocation: a joined node's rejoin is refused naming the revocation, and granted again once
/// the admin readmits it.
#[test]
fn a_revoked_node_is_refused_until_the_admin_readmits_it() {
    let runtime = runtime();
    let cluster = Cluster::start();
    let admin = cluster.admin_with(&cluster.service.master);
    let port = cluster.service.port;
    let (node, _tpm) = node_of_image(&cluster.ca, None);
    assert!(fetch_once(&runtime, &node, port, DISK_A, DiskStatus::New));

    let (revocation, _) = runtime
        .block_on(admin.revoke(DISK_A, "lost in transit"))
        .unwrap();
    assert_eq!(revocation.ak_name, hex::encode(node.ak_name()));
    assert!(!fetch_once(
        &runtime,
        &node,
        port,
        DISK_A,
        DiskStatus::Initialized
    ));
    let log = cluster.service.log();
    assert!(
        log.contains("was revoked by the cluster's admin: lost in transit"),
        "{log}"
    );
    runtime.block_on(admin.readmit(DISK_A)).unwrap();
    assert!(fetch_once(
        &runtime,
        &node,
        port,
        DISK_A,
        DiskStatus::Initialized
    ));
}

/// `hawser verify` of a running node: its fresh quote names the release and phase; tpm2-tools'
/// own verifier accepts the same answer for the same qualifying data; a PCR 11 extended after
/// the pivot, and a retired release, fail by name.
#[test]
fn verify_judges_a_running_nodes_fresh_quote() {
    let runtime = runtime();
    let ca = ProviderCa::generate("test provider").expect("CA");
    let cluster_id = [7u8; 32];
    let (issuer, _swtpm) = node_of_image(&ca, None);
    let release =
        Release::from_measurements_text("v1", &measurements_of(&issuer), "admin", 0).unwrap();
    let tpm = issuer.tpm();
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_LEAVE_INITRD)
        .unwrap();
    tpm.extend_sha256_digest(PCR_CLUSTER_ID, &cluster_id)
        .unwrap();
    let claims = hawser_init::attest_server::Claims {
        node_name: Some("hawser-0a0e4c1f".into()),
        role: "worker",
        hawser_version: "test",
    };
    let address = runtime
        .block_on(hawser_init::attest_server::spawn_on(
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&issuer),
            claims,
        ))
        .unwrap()
        .to_string();
    let trust = AkTrust::from_pem(&ca.certificate_pem()).unwrap();

    let verdict = runtime.block_on(verify_node(
        &address,
        std::slice::from_ref(&release),
        &cluster_id,
        &trust,
    ));
    assert!(verdict.ok, "{verdict:?}");
    assert_eq!(verdict.release.as_deref(), Some("v1"));
    assert_eq!(verdict.phase.as_deref(), Some("worker"));
    assert_eq!(verdict.node, "hawser-0a0e4c1f");
    assert_eq!(
        verdict.ak.as_deref(),
        Some(hex::encode(issuer.ak_name()).as_str())
    );

    // Independently: tpm2_checkquote on the node's answer.
    let nonce = [9u8; 32];
    let answer = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client =
            hawser_proto::attest::node_attestation_client::NodeAttestationClient::new(channel);
        tokio::time::sleep(Duration::from_millis(300)).await;
        client
            .attest(hawser_proto::attest::AttestRequest {
                nonce: nonce.to_vec(),
            })
            .await
            .unwrap()
            .into_inner()
    });
    let evidence = Evidence::decode(answer.evidence.as_slice()).unwrap();
    let qualifying = Binding {
        role: Role::Server,
        nonce: &nonce,
        tls_spki_der: &[],
    }
    .qualifying_data(answer.claims_json.as_bytes());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ak.pub"), &evidence.ak_public).unwrap();
    std::fs::write(dir.path().join("attest.bin"), &evidence.quote).unwrap();
    std::fs::write(dir.path().join("sig.bin"), &evidence.signature).unwrap();
    // A missing tpm2_checkquote fails naming its Debian package (tpm2-tools).
    let checkquote = hawser_harness::find_binary(std::path::Path::new("tpm2_checkquote"))
        .unwrap_or_else(|e| panic!("{e}"));
    let check = |qualification: [u8; 32]| {
        Command::new(&checkquote)
            .args([
                "-u",
                "ak.pub",
                "-m",
                "attest.bin",
                "-s",
                "sig.bin",
                "-g",
                "sha256",
            ])
            .args(["-q", &hex::encode(qualification)])
            .current_dir(dir.path())
            .output()
            .expect("tpm2_checkquote runs")
    };
    let out = check(qualifying);
    assert!(
        out.status.success(),
        "tpm2_checkquote refused the node's answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut other = qualifying;
    other[0] ^= 1;
    assert!(
        !check(other).status.success(),
        "tpm2_checkquote accepted another nonce"
    );

    // A retired release fails by name.
    let mut retired = release.clone();
    retired.retired_unix = Some(1);
    let mut v2 = Release::from_measurements_text(
        "v2",
        &format!(r#"{{"11": {{"expected": "{}"}}}}"#, "ab".repeat(32)),
        "admin",
        0,
    )
    .unwrap();
    v2.added_unix = 1;
    let verdict = runtime.block_on(verify_node(
        &address,
        &[retired, v2.clone()],
        &cluster_id,
        &trust,
    ));
    assert!(!verdict.ok);
    assert_eq!(
        verdict.reason.as_deref(),
        Some("it runs release v1, which is retired"),
        "{verdict:?}"
    );

    // Something extended PCR 11 after the pivot: named.
    tpm.extend_phase(PCR_KERNEL_BOOT, "tampered").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let verdict = runtime.block_on(verify_node(&address, &[release, v2], &cluster_id, &trust));
    assert!(!verdict.ok);
    let reason = verdict.reason.unwrap_or_default();
    assert!(
        reason.contains(
            "its image is release v1, but PCR 11 is neither a worker's nor a control plane's"
        ),
        "{reason}"
    );
    assert_eq!(verdict.pcr15.as_deref(), Some("ok"));
}
