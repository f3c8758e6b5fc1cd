//! Periodic re-attestation of the mesh's members (docs/lifecycle.md), on the host: the real
//! join core and peer API, a node's provider-provisioned swtpm after its pivot, and the node's
//! own poll client (`GrpcPeers` with PID 1's kind of attester). A member that quotes well is
//! recorded as attested; a network cut shorter than the grace period evicts nobody; a member
//! whose PCR 11 was extended after its pivot is evicted and revoked at its next quote; a member
//! that stops quoting is evicted once the grace period has passed.
//! Run with `cargo test -p hawser-joinservice --test reattest`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::evidence::{Binding, EvidenceIssuer as _, Role};
use hawser_attestation::validator::AkTrust;
use hawser_attestation::{Tpm, TpmIssuer};
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_joinservice::core::{JoinCore, JoinCoreConfig};
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::reattest::Reattestation;
use hawser_joinservice::store::revocations;
use hawser_joinservice::store::{ReadConsistency, RecordKind};
use hawser_joinservice::tokens::KubeadmTokenIssuer;
use hawser_joinservice::vpn::{self, JoinServiceAddress, MeshSettings, PeerApiError};
use hawser_joinservice::vpnapi::serve_vpn_api;
use hawser_keys::MasterSecret;
use hawser_mesh::agent::PeerSource as _;
use hawser_mesh::{Ipv4Net, PublicKey};
use hawser_pcr::{
    PCR_CLUSTER_ID, PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, extend_sha256,
    phase_digest,
};
use hawser_proto::mesh::{GrpcPeers, REATTEST_USER_DATA};
use prost::Message as _;

const NODE: &str = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
const SILENT: &str = "4f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
const SALT: [u8; 32] = [7; 32];

fn master() -> MasterSecret {
    MasterSecret::new(vec![5; 32], vec![6; 32]).unwrap()
}

fn cluster_id() -> [u8; 32] {
    hawser_keys::cluster_id(master().measurement_secret().as_slice(), &SALT)
}

/// A worker of the image after its pivot, locked to the cluster: PCR 11 ← enter-initrd,
/// leave-initrd; PCR 15 ← the cluster ID.
fn pivoted_worker(ca: &ProviderCa) -> (Arc<TpmIssuer>, Swtpm) {
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"));
    ca.provision(&swtpm).expect("provider provisions the TPM");
    let tpm = Tpm::open(&swtpm.tcti().unwrap()).unwrap();
    for phase in [PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD] {
        tpm.extend_phase(PCR_KERNEL_BOOT, phase).unwrap();
    }
    tpm.extend_sha256_digest(PCR_CLUSTER_ID, &cluster_id())
        .unwrap();
    (Arc::new(TpmIssuer::new(Arc::new(tpm)).unwrap()), swtpm)
}

/// The join core: the image's fresh-node PCR 11 as its measurements, the mesh on 127.0.0.0/24
/// with `NODE` at 127.0.0.1 (its disk bound to `ak`) and `SILENT` at 127.0.0.3, re-attestation
/// every second with a grace period of three.
fn core(dir: &Path, ca: &ProviderCa, ak: &str) -> Arc<JoinCore> {
    let path = dir.join("measurements.json");
    let enter = extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD));
    std::fs::write(
        &path,
        format!(r#"{{"11": {{"expected": "{}"}}}}"#, hex::encode(enter)),
    )
    .unwrap();
    let core = JoinCore::new(
        Arc::new(PolicyStore::load(&path).unwrap()),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: "/nonexistent".into(),
            kubeconfig: "/nonexistent".into(),
        }),
        JoinCoreConfig {
            master_secret: master(),
            measurement_salt: SALT.to_vec(),
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(60),
            pki_dir: None,
            registry_file: dir.join("joined"),
        },
    )
    .unwrap();
    let prefix: Ipv4Net = "127.0.0.0/24".parse().unwrap();
    core.store().bind_disk(NODE, ak).unwrap();
    core.store()
        .update_vpn_registry(prefix, &mut |registry| {
            let key = |n: u8| PublicKey::from_slice(&[n; 32]).unwrap();
            registry.admit(
                NODE,
                "worker-1",
                key(1),
                None,
                false,
                Some(Ipv4Addr::LOCALHOST),
            )?;
            registry.admit(
                SILENT,
                "worker-2",
                key(2),
                None,
                false,
                Some(Ipv4Addr::new(127, 0, 0, 3)),
            )?;
            Ok(())
        })
        .unwrap();
    let coordinator = vpn::admit_join_service(
        core.store().as_ref(),
        prefix,
        "joind",
        PublicKey::from_slice(&[200; 32]).unwrap(),
        None,
        JoinServiceAddress::Allocated,
    )
    .unwrap();
    Arc::new(
        core.with_mesh(MeshSettings {
            prefix,
            mtu: 1420,
            coordinator,
            vpn_api_port: 9091,
        })
        .with_reattestation(Reattestation::new(
            Duration::from_secs(1),
            Duration::from_secs(3),
            AkTrust::from_pem(&ca.certificate_pem()).unwrap(),
            cluster_id(),
        )),
    )
}

/// The node's quote for `nonce`, as PID 1's attester makes it.
fn quote(issuer: &TpmIssuer, nonce: [u8; 32]) -> Vec<u8> {
    let binding = Binding {
        role: Role::Client,
        nonce: &nonce,
        tls_spki_der: &[],
    };
    issuer
        .issue(&binding, REATTEST_USER_DATA)
        .unwrap()
        .encode_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_prove_their_state_again_and_are_evicted_when_they_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ProviderCa::generate("test provider").unwrap();
    let (issuer, _swtpm) = pivoted_worker(&ca);
    let core = core(dir.path(), &ca, &hex::encode(issuer.ak_name()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_vpn_api(Arc::clone(&core), listener, async {
        let _ = stopped.await;
    }));

    // Over the wire, as PID 1 polls: the first answer asks for a quote, the next poll carries it.
    let attesting = Arc::clone(&issuer);
    let mut node =
        GrpcPeers::new(port).with_attester(Arc::new(move |nonce| Ok(quote(&attesting, nonce))));
    node.get_peers(Ipv4Addr::LOCALHOST, None, &[])
        .await
        .unwrap();
    node.get_peers(Ipv4Addr::LOCALHOST, Some(1), &[])
        .await
        .unwrap();
    let attested = core
        .store()
        .records(RecordKind::Attested, ReadConsistency::Latest)
        .unwrap();
    let record: serde_json::Value = serde_json::from_slice(&attested[NODE]).unwrap();
    assert!(
        record["release"].as_str().unwrap().ends_with(" worker"),
        "{record}"
    );

    // A cut shorter than the grace period: nobody is evicted (SILENT's grace counts from when
    // this service first saw it).
    let evicted = tokio::task::spawn_blocking({
        let core = Arc::clone(&core);
        move || core.evict_stale()
    })
    .await
    .unwrap();
    assert!(evicted.is_empty(), "{evicted:?}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let blocking = |f: fn(&JoinCore) -> Vec<String>| {
        let core = Arc::clone(&core);
        tokio::task::spawn_blocking(move || f(&core))
    };
    assert!(blocking(JoinCore::evict_stale).await.unwrap().is_empty());
    node.get_peers(Ipv4Addr::LOCALHOST, Some(1), &[])
        .await
        .unwrap();

    // PCR 11 extended after the pivot: the next quote evicts the member, by name.
    issuer
        .tpm()
        .extend_phase(PCR_KERNEL_BOOT, "tampered")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut refused = None;
    for _ in 0..3 {
        if let Err(e) = node.get_peers(Ipv4Addr::LOCALHOST, Some(1), &[]).await {
            refused = Some(e.to_string());
            break;
        }
    }
    let refused = refused.expect("the tampered member's poll is refused");
    assert!(
        refused.contains("evicted from the mesh: re-attestation failed")
            && refused.contains("PCR 11"),
        "{refused}"
    );
    let registry = core
        .store()
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap();
    assert!(
        registry.member(NODE).is_none(),
        "the member is out of the mesh"
    );
    let revoked = revocations::list(core.store().as_ref(), ReadConsistency::Latest).unwrap();
    assert!(
        revoked
            .iter()
            .any(|r| r.disk_uuid.as_deref() == Some(NODE) && r.reason.contains("PCR 11")),
        "{revoked:?}"
    );

    // SILENT never quoted: evicted once its grace period has passed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let evicted = blocking(JoinCore::evict_stale).await.unwrap();
    assert_eq!(evicted, vec![SILENT.to_owned()]);
    let registry = core
        .store()
        .vpn_registry(ReadConsistency::Latest)
        .unwrap()
        .unwrap();
    assert!(registry.member(SILENT).is_none());
    let err = core
        .poll(Ipv4Addr::new(127, 0, 0, 3), None, vec![], &[])
        .unwrap_err();
    assert!(matches!(err, PeerApiError::UnknownSource { .. }), "{err}");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// What re-attestation costs, printed (never asserted: these machines are noisy): the join
/// service's judgement of one quote (signature, AK certificate chain, the release set), and the
/// node's quote (swtpm here); per node and hour at the default interval.
/// `cargo test -p hawser-joinservice --test reattest cost -- --nocapture`
#[test]
fn reattestation_cost_per_node_and_hour() {
    use hawser_attestation::validator::Validator;
    use hawser_joinservice::reattest::DEFAULT_INTERVAL;
    use hawser_joinservice::store::releases::{Release, running_release_set};
    let ca = ProviderCa::generate("test provider").unwrap();
    let (issuer, _swtpm) = pivoted_worker(&ca);
    let nonce = [3u8; 32];
    let started = std::time::Instant::now();
    const QUOTES: u32 = 10;
    let mut evidence = Vec::new();
    for _ in 0..QUOTES {
        evidence = quote(&issuer, nonce);
    }
    let quote_ms = started.elapsed().as_secs_f64() * 1000.0 / f64::from(QUOTES);
    let enter = extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD));
    let release = Release::from_measurements_text(
        "v1",
        &format!(r#"{{"11": {{"expected": "{}"}}}}"#, hex::encode(enter)),
        "admin",
        0,
    )
    .unwrap();
    let validator = Validator::for_releases(
        running_release_set(&[release], &cluster_id()),
        AkTrust::from_pem(&ca.certificate_pem()).unwrap(),
    )
    .unwrap();
    let binding = Binding {
        role: Role::Client,
        nonce: &nonce,
        tls_spki_der: &[],
    };
    const JUDGED: u32 = 200;
    let started = std::time::Instant::now();
    for _ in 0..JUDGED {
        validator.validate(&evidence, &binding).unwrap();
    }
    let judge_ms = started.elapsed().as_secs_f64() * 1000.0 / f64::from(JUDGED);
    let per_hour = 3600.0 / DEFAULT_INTERVAL.as_secs_f64();
    println!(
        "re-attestation: the join service judges a quote in {judge_ms:.2} ms ({:.0} ms of CPU per \
         node per hour at one quote every {} s); the node quotes in {quote_ms:.1} ms (swtpm)",
        judge_ms * per_hour,
        DEFAULT_INTERVAL.as_secs()
    );
}
