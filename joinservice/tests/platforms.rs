//! The join service judges the platform profile its measurements file selects
//! (`attestationVariant`), with the real `hawser-joind` binary and nodes on swtpm:
//!
//! - a node whose vTPM is laid out as GCE's (Google's RSA AK template in NV 0x01C10001, its
//!   certificate in NV 0x01C10000, issued by a test CA shaped like Google's: see
//!   `hawser_harness::provider_gce`), attesting with PID 1's own issuer
//!   (`hawser_platforms::node::issuer_for`), joins a service whose measurements select `gce`
//!   and whose trust bundle is that test CA;
//! - a node of the QEMU profile (the provider CA's ECC AK) is refused by that service, by name;
//! - and the GCE node is refused, by name, by a service of the QEMU profile.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::sync::Arc;

use hawser_attestation::Tpm;
use hawser_harness::provider::ProviderCa;
use hawser_harness::provider_gce::{GceTestCa, GceTestInstance};
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD};
use hawser_platforms::profile::{Platform, VARIANT_KEY};

mod common;
use common::{Node, Service, join, runtime, wait_for};

/// A node of the `gce` profile: a swtpm the test CA provisioned as GCE's, PCR 11 at
/// `enter-initrd`, and PID 1's issuer for the profile.
fn gce_node(ca: &GceTestCa) -> Node {
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"));
    ca.provision(&swtpm, &GceTestInstance::example())
        .expect("the test CA provisions the vTPM as GCE's");
    let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open swtpm");
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
        .expect("extend enter-initrd");
    let issuer = hawser_platforms::node::issuer_for(Platform::Gce, Arc::new(tpm))
        .expect("PID 1's gce issuer");
    assert_eq!(issuer.variant(), hawser_attestation::Variant::GceVtpm);
    let ak_hex = hex::encode(issuer.ak_name());
    Node {
        issuer: Arc::new(issuer),
        ak_hex,
        attested: hawser_init::enrollment::JoinServicePolicy::Unauthenticated,
        _swtpm: swtpm,
    }
}

/// A join service of the `gce` profile: its measurements file names the variant, and its
/// "provider CA" file is the GCE trust bundle (the test root and intermediate).
fn gce_service(ca: &GceTestCa) -> Service {
    let mut service = Service::new(&ProviderCa::generate("test provider").expect("a CA"));
    let path = service.path("measurements.json");
    let mut measurements: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    measurements[VARIANT_KEY] = Platform::Gce.attestation_variant().into();
    std::fs::write(&path, measurements.to_string()).expect("write");
    std::fs::write(service.path("provider-ca.pem"), ca.bundle_pem()).expect("write");
    std::fs::write(service.path("go"), "").expect("write");
    service.start();
    service
}

fn qemu_service(ca: &ProviderCa) -> Service {
    let mut service = Service::new(ca);
    std::fs::write(service.path("go"), "").expect("write");
    service.start();
    service
}

/// Waits until the service's log holds a refusal of a join that names `reason`.
fn refused(service: &Service, reason: &str) -> String {
    wait_for(&format!("a refusal naming {reason:?}"), || {
        service.log().contains(reason)
    });
    service
        .log()
        .lines()
        .find(|l| l.contains(reason))
        .expect("the line")
        .to_owned()
}

#[test]
fn a_gce_node_joins_the_gce_profile_and_a_qemu_node_is_refused_by_name() {
    let runtime = runtime();
    let gce_ca = GceTestCa::generate().expect("the GCE test CA");
    let service = gce_service(&gce_ca);
    assert!(
        service
            .log()
            .contains("trusting a gce root that is not one of Google's"),
        "the test root is trusted only because the bundle names it, and the log says so:\n{}",
        service.log()
    );

    let node = gce_node(&gce_ca);
    let (secrets, attempts) = runtime
        .block_on(join(&runtime, &node, &[service.port]))
        .expect("the gce node's join");
    assert_eq!(attempts, 1);
    assert_eq!(secrets.state_disk_key.len(), 64);
    assert_eq!(service.granted_joins(), 1, "{}", service.log());
    assert!(
        service.registry().iter().any(|l| l.contains(&node.ak_hex)),
        "the disk is recorded under the GCE AK's name:\n{:?}",
        service.registry()
    );

    // A QEMU node (the provider CA's AK) presents the other profile's evidence.
    let provider = ProviderCa::generate("test provider").expect("a provider CA");
    let qemu_node = common::node(&provider);
    let before = service.granted_joins();
    let attempt = join(&runtime, &qemu_node, &[service.port]);
    let line = refused(
        &service,
        "the cluster's measurements select the gce profile; the peer presented qemu evidence",
    );
    eprintln!("refused: {line}");
    attempt.abort();
    assert_eq!(service.granted_joins(), before);
}

#[test]
fn a_qemu_profile_service_refuses_a_gce_node_by_name() {
    let runtime = runtime();
    let provider = ProviderCa::generate("test provider").expect("a provider CA");
    let service = qemu_service(&provider);
    let gce_ca = GceTestCa::generate().expect("the GCE test CA");
    let node = gce_node(&gce_ca);
    let attempt = join(&runtime, &node, &[service.port]);
    let line = refused(
        &service,
        "the cluster's measurements select the qemu profile; the peer presented gce evidence",
    );
    eprintln!("refused: {line}");
    attempt.abort();
    assert_eq!(service.granted_joins(), 0, "{}", service.log());
}
