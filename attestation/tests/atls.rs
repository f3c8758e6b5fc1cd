//! aTLS end to end on the host: real swtpm TPMs provisioned by the harness's provider CA, the
//! TPM issuer, the pure-Rust validator, rustls handshakes over loopback TCP, and tonic on top.
//! Run with `cargo test -p hawser-attestation --features tpm,tonic --test atls`.
#![cfg(all(feature = "tpm", feature = "tonic"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use hawser_attestation::atls::{
    AtlsClient, AtlsError, AtlsServer, AtlsStream, CertificateMinter, Identity, MintedCertificate,
    PeerAttestation, PeerPolicy, TlsKey, encode_evidence_extension,
};
use hawser_attestation::evidence::{Binding, Evidence, EvidenceIssuer, Nonce, Role};
use hawser_attestation::tpm::TpmError;
use hawser_attestation::validator::EvidenceError;
use hawser_attestation::{AkTrust, ExpectedMeasurements, IssuerError, Tpm, TpmIssuer, Validator};
use hawser_harness::provider::{self, ProviderCa};
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, extend_sha256, phase_digest};
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A node: a provisioned swtpm with PCR 11 extended like a booted hawser node, and its issuer.
struct Node {
    issuer: Arc<TpmIssuer>,
    pcrs: BTreeMap<u8, [u8; 32]>,
    // Last: the TPM connection inside the issuer closes before swtpm is killed.
    _swtpm: Swtpm,
}

fn start_swtpm() -> Swtpm {
    Swtpm::start(&SwtpmOptions::tcp()).unwrap_or_else(|e| panic!("swtpm: {e}"))
}

fn tcti(swtpm: &Swtpm) -> String {
    swtpm.tcti().expect("a TCP swtpm has a TCTI")
}

fn node(ca: &ProviderCa) -> Node {
    let swtpm = start_swtpm();
    let provisioned = ca.provision(&swtpm).expect("provider provisions the TPM");
    let tpm = Tpm::open(&tcti(&swtpm)).expect("open swtpm");
    tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
        .expect("extend enter-initrd");
    let pcrs = tpm.read_pcrs_sha256(0..=23).expect("read PCRs");
    let issuer = TpmIssuer::new(Arc::new(tpm)).expect("issuer reads the AK certificate");
    assert_eq!(
        issuer.ak_name(),
        provisioned.ak_name,
        "provider and guest derive one AK"
    );
    assert_eq!(issuer.ak_cert_chain(), [provisioned.certificate]);
    Node {
        issuer: Arc::new(issuer),
        pcrs,
        _swtpm: swtpm,
    }
}

/// What a booted node's PCRs are expected to be: PCR 4 (zero here) and PCR 11 enforced, PCR 0
/// warn-only with a value that differs.
fn measurements(pcr11: [u8; 32]) -> ExpectedMeasurements {
    ExpectedMeasurements::from_json(&format!(
        r#"{{"4": {{"expected": "{}", "warnOnly": false}},
            "11": {{"expected": "{}", "warnOnly": false}},
            "0": {{"expected": "{}", "warnOnly": true}},
            "image": "test"}}"#,
        "00".repeat(32),
        hex::encode(pcr11),
        "ab".repeat(32)
    ))
    .expect("measurements parse")
}

fn booted_pcr11() -> [u8; 32] {
    extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD))
}

fn validator(ca: &ProviderCa, measurements: ExpectedMeasurements) -> Arc<Validator> {
    let trust = AkTrust::from_der([ca.certificate_der()]).expect("CA is an anchor");
    Arc::new(Validator::new(measurements, trust).expect("validator"))
}

fn verify(ca: &ProviderCa) -> PeerPolicy {
    PeerPolicy::Verify(validator(ca, measurements(booted_pcr11())))
}

fn attested(node: &Node) -> Identity {
    Identity::attested(Arc::clone(&node.issuer) as Arc<dyn EvidenceIssuer>)
}

type Handshake = (
    Result<AtlsStream<TcpStream>, AtlsError>,
    Result<AtlsStream<TcpStream>, AtlsError>,
);

/// One handshake over loopback TCP: (server's result, client's result).
async fn handshake(server: &AtlsServer, client: &AtlsClient) -> Handshake {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server_side = async {
        let (tcp, _) = listener.accept().await.expect("accept");
        server.accept(tcp).await
    };
    let client_side = async {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        client.connect(tcp).await
    };
    tokio::join!(server_side, client_side)
}

/// Both sides exchange a line over an established connection.
async fn talk(server: &mut AtlsStream<TcpStream>, client: &mut AtlsStream<TcpStream>) {
    client.write_all(b"ping\n").await.expect("client writes");
    client.flush().await.expect("flush");
    let mut buf = [0u8; 5];
    server.read_exact(&mut buf).await.expect("server reads");
    assert_eq!(&buf, b"ping\n");
    server.write_all(b"pong\n").await.expect("server writes");
    server.flush().await.expect("flush");
    client.read_exact(&mut buf).await.expect("client reads");
    assert_eq!(&buf, b"pong\n");
}

fn expect_refusal(result: Handshake) -> (AtlsError, AtlsError) {
    match result {
        (Err(server), Err(client)) => (server, client),
        (server, client) => panic!(
            "expected both sides to fail, got server {:?} client {:?}",
            server.map(|s| s.peer_attestation().clone()),
            client.map(|s| s.peer_attestation().clone())
        ),
    }
}

/// The client refused the server's evidence with `reason`, and the server was told so.
fn assert_client_refused_server(result: Handshake) -> String {
    let (server_err, client_err) = expect_refusal(result);
    let AtlsError::PeerRefused {
        peer: Role::Server,
        reason,
    } = &client_err
    else {
        panic!("client: expected a refusal of the server, got {client_err}");
    };
    let reason = error_chain(reason);
    match &server_err {
        AtlsError::RefusedByPeer {
            peer: Role::Client,
            reason: told,
        } => assert_eq!(told, &reason, "the server is told the client's reason"),
        other => panic!("server: expected to be told the refusal, got {other}"),
    }
    reason
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_attests_client_attests_and_mutual() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let server_node = node(&ca);
    let client_node = node(&ca);
    assert_ne!(server_node.issuer.ak_name(), client_node.issuer.ak_name());

    // Server attests.
    let server = AtlsServer::new(attested(&server_node), PeerPolicy::Unauthenticated);
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));
    let (s, c) = handshake(&server, &client).await;
    let (mut s, mut c) = (s.expect("server"), c.expect("client"));
    talk(&mut s, &mut c).await;
    assert_eq!(s.peer_attestation(), &PeerAttestation::Unattested);
    let evidence = c.peer_attestation().evidence().expect("server attested");
    assert_eq!(evidence.ak_name, server_node.issuer.ak_name());
    assert_eq!(evidence.pcrs, server_node.pcrs);
    assert_eq!(evidence.pcrs[&11], booted_pcr11());
    assert_eq!(evidence.warnings.len(), 1, "PCR 0 differs, warn-only");
    assert_eq!(evidence.warnings[0].0.pcr, 0);
    assert!(evidence.ak_certificate_subject.contains("AK 000b"));

    // Client attests, with user data bound into the quote.
    let server = AtlsServer::new(Identity::Unattested, verify(&ca));
    let client = AtlsClient::new(
        Identity::Attested {
            issuer: Arc::clone(&client_node.issuer) as Arc<dyn EvidenceIssuer>,
            user_data: Arc::from(&b"wireguard public key"[..]),
        },
        PeerPolicy::Unauthenticated,
    );
    let (s, c) = handshake(&server, &client).await;
    let (mut s, mut c) = (s.expect("server"), c.expect("client"));
    talk(&mut s, &mut c).await;
    assert_eq!(c.peer_attestation(), &PeerAttestation::Unattested);
    let evidence = s.peer_attestation().evidence().expect("client attested");
    assert_eq!(evidence.ak_name, client_node.issuer.ak_name());
    assert_eq!(evidence.user_data, b"wireguard public key");

    // Mutual.
    let server = AtlsServer::new(attested(&server_node), verify(&ca));
    let client = AtlsClient::new(attested(&client_node), verify(&ca));
    for _ in 0..3 {
        let (s, c) = handshake(&server, &client).await;
        let (mut s, mut c) = (s.expect("server"), c.expect("client"));
        talk(&mut s, &mut c).await;
        let of_client = s.peer_attestation().evidence().expect("client attested");
        let of_server = c.peer_attestation().evidence().expect("server attested");
        assert_eq!(of_client.ak_name, client_node.issuer.ak_name());
        assert_eq!(of_server.ak_name, server_node.issuer.ak_name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_attestation_is_tonics_transport() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let ca = ProviderCa::generate("test provider").expect("CA");
    let server_node = node(&ca);
    let client_node = node(&ca);
    let server = AtlsServer::new(attested(&server_node), verify(&ca));
    let client = AtlsClient::new(attested(&client_node), verify(&ca));

    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("hawser.Join", tonic_health::ServingStatus::Serving)
        .await;
    // What a handler sees of the caller: the client's AK, via the connect info.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_handler = Arc::clone(&seen);
    let interceptor = move |request: tonic::Request<()>| {
        let info = request
            .extensions()
            .get::<hawser_attestation::atls::AtlsConnectInfo>()
            .cloned();
        if let Some(evidence) = info.as_ref().and_then(|i| i.peer.evidence()) {
            seen_in_handler
                .lock()
                .expect("lock")
                .push(evidence.ak_name.clone());
        }
        Ok(request)
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = server.incoming(listener);
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(tonic::service::InterceptorLayer::new(interceptor))
            .add_service(service)
            .serve_with_incoming(incoming),
    );

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_with_connector(client.connector())
        .await
        .expect("aTLS channel");
    let mut health = HealthClient::new(channel);
    for _ in 0..3 {
        let response = health
            .check(HealthCheckRequest {
                service: "hawser.Join".into(),
            })
            .await
            .expect("gRPC over aTLS");
        assert_eq!(response.into_inner().status, ServingStatus::Serving as i32);
    }
    assert_eq!(
        seen.lock().expect("lock").as_slice(),
        vec![client_node.issuer.ak_name().to_vec(); 3],
        "every RPC carries the client's verified AK"
    );

    // A client the server refuses never reaches the service, and learns why.
    let stranger = AtlsClient::new(Identity::Unattested, verify(&ca));
    let err = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_with_connector(stranger.connector())
        .await
        .expect_err("refused");
    let chain = error_chain(&err);
    assert!(
        chain.contains(
            "the server refused our attestation: the certificate carries no evidence extension"
        ),
        "{chain}"
    );
    serving.abort();
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_pcr_is_refused_naming_the_pcr_on_both_sides() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let server_node = node(&ca);
    let client_node = node(&ca);
    let expected = [0x11; 32];
    let strict = PeerPolicy::Verify(validator(&ca, measurements(expected)));
    let needle = format!(
        "measurements differ from the expected ones: PCR 11 expected {} actual {}",
        hex::encode(expected),
        hex::encode(booted_pcr11())
    );

    // The client refuses the server.
    let server = AtlsServer::new(attested(&server_node), PeerPolicy::Unauthenticated);
    let client = AtlsClient::new(Identity::Unattested, strict.clone());
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert_eq!(reason, needle);

    // The server refuses the client: the client's error carries the server's reason.
    let server = AtlsServer::new(attested(&server_node), strict);
    let client = AtlsClient::new(attested(&client_node), verify(&ca));
    let (server_err, client_err) = expect_refusal(handshake(&server, &client).await);
    assert!(
        matches!(&server_err, AtlsError::PeerRefused { peer: Role::Client, reason }
            if error_chain(reason) == needle),
        "{server_err}"
    );
    assert_eq!(
        client_err.to_string(),
        format!("the server refused our attestation: {needle}")
    );
}

/// Presents whatever `forge` makes of the peer's nonce (tests of refusals).
struct Forge<F>(F);

impl<F> CertificateMinter for Forge<F>
where
    F: Fn(Role, Option<&Nonce>) -> MintedCertificate + Send + Sync,
{
    fn mint(&self, role: Role, nonce: Option<&Nonce>) -> Result<MintedCertificate, AtlsError> {
        Ok((self.0)(role, nonce))
    }
}

fn forged(
    forge: impl Fn(Role, Option<&Nonce>) -> MintedCertificate + Send + Sync + 'static,
) -> Identity {
    Identity::Custom(Arc::new(Forge(forge)))
}

/// A certificate for a fresh key carrying `extension` as the evidence extension's value.
fn certificate_with(extension: Option<&[u8]>) -> MintedCertificate {
    let key = TlsKey::generate().expect("key");
    let cert = key.self_signed_certificate(extension).expect("certificate");
    MintedCertificate::new(&key, cert)
}

fn issue(issuer: &TpmIssuer, role: Role, nonce: &Nonce, key: &TlsKey) -> Evidence {
    issuer
        .issue(
            &Binding {
                role,
                nonce,
                tls_spki_der: key.spki_der(),
            },
            b"",
        )
        .expect("evidence")
}

fn certificate_for(key: &TlsKey, evidence: &Evidence) -> MintedCertificate {
    let cert = key
        .self_signed_certificate(Some(&encode_evidence_extension(&evidence.encode_to_vec())))
        .expect("certificate");
    MintedCertificate::new(key, cert)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_certificate_is_refused_as_stale() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let issuer = Arc::clone(&node.issuer);
    // Mints honestly once, then presents that certificate again (with its key: the strongest
    // replay, by someone who even holds the TLS key).
    let first: Arc<Mutex<Option<(MintedCertificate, Nonce)>>> = Arc::new(Mutex::new(None));
    let remembered = Arc::clone(&first);
    let server = AtlsServer::new(
        forged(move |role, nonce| {
            let mut first = remembered.lock().expect("lock");
            if let Some((cert, _)) = first.as_ref() {
                return cert.clone();
            }
            let nonce = nonce.expect("client nonce");
            let key = TlsKey::generate().expect("key");
            let cert = certificate_for(&key, &issue(&issuer, role, nonce, &key));
            *first = Some((cert.clone(), *nonce));
            cert
        }),
        PeerPolicy::Unauthenticated,
    );
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));
    let (s, c) = handshake(&server, &client).await;
    s.expect("first connection");
    c.expect("first connection is fresh");

    let reason = assert_client_refused_server(handshake(&server, &client).await);
    let old_nonce = first.lock().expect("lock").as_ref().expect("minted").1;
    assert!(
        reason.starts_with(&format!(
            "nonce mismatch: the evidence answers nonce {}, but this connection's nonce is ",
            hex::encode(old_nonce)
        )),
        "{reason}"
    );
    assert!(
        reason.ends_with("(a replayed or stale attestation)"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_bound_to_another_tls_key_is_refused() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let issuer = Arc::clone(&node.issuer);
    let server = AtlsServer::new(
        forged(move |role, nonce| {
            let bound = TlsKey::generate().expect("key");
            let evidence = issue(&issuer, role, nonce.expect("nonce"), &bound);
            // The evidence of `bound` in the certificate of another key.
            certificate_for(&TlsKey::generate().expect("key"), &evidence)
        }),
        PeerPolicy::Unauthenticated,
    );
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert!(
        reason.starts_with("the evidence is bound to another TLS key: it binds key hash "),
        "{reason}"
    );

    // Evidence made for the client role is not accepted from a server either.
    let issuer = Arc::clone(&node.issuer);
    let server = AtlsServer::new(
        forged(move |_role, nonce| {
            let key = TlsKey::generate().expect("key");
            certificate_for(
                &key,
                &issue(&issuer, Role::Client, nonce.expect("nonce"), &key),
            )
        }),
        PeerPolicy::Unauthenticated,
    );
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert!(
        reason.contains("expected") && reason.contains("for this connection's role (server)"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ak_without_a_valid_provider_certificate_is_refused() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));

    // An AK certified by another provider.
    let rogue = ProviderCa::generate("rogue provider").expect("rogue CA");
    let rogue_node = node(&rogue);
    let server = AtlsServer::new(attested(&rogue_node), PeerPolicy::Unauthenticated);
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert!(
        reason.starts_with(&format!(
            "untrusted AK {}: its certificate (subject",
            hex::encode(rogue_node.issuer.ak_name())
        )) && reason.contains("issuer \"O=hawser QEMU provider, CN=rogue provider\"")
            && reason.contains("does not chain to a configured provider CA: no chain to a provider CA: UnknownIssuer"),
        "{reason}"
    );

    // An AK with no certificate at all.
    let swtpm = start_swtpm();
    let bare = Arc::new(
        TpmIssuer::with_ak_cert_chain(
            Arc::new(Tpm::open(&tcti(&swtpm)).expect("open")),
            Vec::new(),
        )
        .expect("issuer"),
    );
    let server = AtlsServer::new(
        Identity::attested(Arc::clone(&bare) as Arc<dyn EvidenceIssuer>),
        PeerPolicy::Unauthenticated,
    );
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert_eq!(
        reason,
        format!(
            "untrusted AK {}: the evidence carries no AK certificate",
            hex::encode(bare.ak_name())
        )
    );

    // A genuine provider certificate, but for another TPM's AK.
    let other = node(&ca);
    let borrowed = Arc::new(
        TpmIssuer::with_ak_cert_chain(
            Arc::clone(bare.tpm()),
            other.issuer.ak_cert_chain().to_vec(),
        )
        .expect("issuer"),
    );
    let server = AtlsServer::new(
        Identity::attested(borrowed as Arc<dyn EvidenceIssuer>),
        PeerPolicy::Unauthenticated,
    );
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert!(
        reason.contains("certifies another key")
            && reason.contains("not the AK that signed the quote"),
        "{reason}"
    );
}

#[test]
fn issuer_refuses_a_tpm_without_or_with_a_foreign_ak_certificate() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let swtpm = start_swtpm();
    let err = TpmIssuer::new(Arc::new(Tpm::open(&tcti(&swtpm)).expect("open")))
        .expect_err("not provisioned");
    assert!(
        matches!(
            err,
            IssuerError::Tpm(TpmError::NvIndexMissing {
                index: 0x01c1_0002,
                ..
            })
        ),
        "{err}"
    );

    // The certificate of another TPM's AK stored in this TPM's NV.
    let other = start_swtpm();
    let other_cert = ca.provision(&other).expect("provision").certificate;
    provider::store_nv(&swtpm, 0x01c1_0002, &other_cert).expect("store");
    let err = TpmIssuer::new(Arc::new(Tpm::open(&tcti(&swtpm)).expect("open")))
        .expect_err("foreign certificate");
    assert!(
        matches!(err, IssuerError::CertificateForAnotherKey { .. }),
        "{err}"
    );

    // Garbage in the index.
    provider::store_nv(&swtpm, 0x01c1_0002, b"not a certificate").expect("store");
    let err =
        TpmIssuer::new(Arc::new(Tpm::open(&tcti(&swtpm)).expect("open"))).expect_err("garbage");
    assert_eq!(
        error_chain(&err),
        "the AK certificate in NV index 0x01c10002 is unusable: the AK certificate NV data has \
         tag 0x6e at offset 0, expected a DER SEQUENCE (0x30)"
    );

    // Provisioning again replaces the index (the platform owns it).
    ca.provision(&swtpm).expect("re-provision");
    TpmIssuer::new(Arc::new(Tpm::open(&tcti(&swtpm)).expect("open"))).expect("provisioned");
}

#[test]
fn provisioned_state_dir_carries_the_certificate_to_the_next_swtpm() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let provisioned = ca.provision_state_dir(dir.path()).expect("provision");
    // As QEMU's swtpm would, a new swtpm on the same state.
    let swtpm = Swtpm::start(&SwtpmOptions::tcp().with_state_dir(dir.path())).expect("swtpm");
    let issuer = TpmIssuer::new(Arc::new(Tpm::open(&tcti(&swtpm)).expect("open"))).expect("issuer");
    assert_eq!(issuer.ak_name(), provisioned.ak_name);
    assert_eq!(issuer.ak_public(), provisioned.ak_public);
    assert_eq!(issuer.ak_cert_chain(), [provisioned.certificate]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signature_from_another_key_is_refused() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node_a = node(&ca);
    let node_b = node(&ca);
    let (a, b) = (Arc::clone(&node_a.issuer), Arc::clone(&node_b.issuer));
    let server = AtlsServer::new(
        forged(move |role, nonce| {
            let key = TlsKey::generate().expect("key");
            let nonce = nonce.expect("nonce");
            let mut evidence = issue(&a, role, nonce, &key);
            // B's signature over B's quote of the same binding, in A's evidence.
            evidence.signature = issue(&b, role, nonce, &key).signature;
            certificate_for(&key, &evidence)
        }),
        PeerPolicy::Unauthenticated,
    );
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert_eq!(
        reason,
        format!(
            "the quote is invalid: the quote signature does not verify with the AK {} over the attest",
            hex::encode(node_a.issuer.ak_name())
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_extensions_are_clear_errors() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));
    let genuine = {
        let issuer = Arc::clone(&node.issuer);
        move |role, nonce: Option<&Nonce>, key: &TlsKey| {
            issue(&issuer, role, nonce.expect("nonce"), key).encode_to_vec()
        }
    };

    type Tamper = Box<dyn Fn(Vec<u8>) -> Vec<u8> + Send + Sync>;
    let cases: Vec<(&str, Tamper, &str)> = vec![
        (
            "truncated evidence",
            Box::new(|ev: Vec<u8>| encode_evidence_extension(&ev[..ev.len() / 2])),
            "the evidence is not a hawser Evidence protobuf",
        ),
        (
            "garbage",
            Box::new(|ev: Vec<u8>| {
                let garbage: Vec<u8> = (0..ev.len()).map(|i| (i * 151 % 251) as u8).collect();
                encode_evidence_extension(&garbage)
            }),
            "the evidence is not a hawser Evidence protobuf",
        ),
        (
            "not an OCTET STRING",
            Box::new(|ev: Vec<u8>| ev),
            "the evidence extension's value is malformed at offset 0: expected an OCTET STRING (tag 0x04)",
        ),
        (
            "OCTET STRING cut short",
            Box::new(|ev: Vec<u8>| encode_evidence_extension(&ev)[..40].to_vec()),
            "the evidence extension's value is malformed at offset 4: the content is shorter than its length",
        ),
        (
            "truncated quote inside the evidence",
            Box::new(|ev: Vec<u8>| {
                let mut evidence = Evidence::decode(ev.as_slice()).expect("decode");
                evidence.quote.truncate(60);
                encode_evidence_extension(&evidence.encode_to_vec())
            }),
            "the quote is invalid: field quote does not parse: TPMS_ATTEST: field",
        ),
        (
            "oversized (20 KiB)",
            Box::new(|ev: Vec<u8>| {
                let mut evidence = Evidence::decode(ev.as_slice()).expect("decode");
                evidence.user_data = vec![0; 20 * 1024];
                encode_evidence_extension(&evidence.encode_to_vec())
            }),
            "the evidence is 2",
        ),
    ];
    for (what, tamper, needle) in cases {
        let genuine = genuine.clone();
        let server = AtlsServer::new(
            forged(move |role, nonce| {
                let key = TlsKey::generate().expect("key");
                let value = tamper(genuine(role, nonce, &key));
                let cert = key
                    .self_signed_certificate(Some(&value))
                    .expect("certificate");
                MintedCertificate::new(&key, cert)
            }),
            PeerPolicy::Unauthenticated,
        );
        let reason = assert_client_refused_server(handshake(&server, &client).await);
        assert!(reason.contains(needle), "{what}: {reason}");
        if what.starts_with("oversized") {
            assert!(
                reason.contains("bytes, more than the 16384 bytes"),
                "{reason}"
            );
        }
    }

    // No extension at all.
    let server = AtlsServer::new(
        forged(|_, _| certificate_with(None)),
        PeerPolicy::Unauthenticated,
    );
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    assert_eq!(
        reason,
        "the certificate carries no evidence extension (2.25.259585599674992434533360243935770434412.1)"
    );

    // Beyond what TLS carries at all: rustls refuses the handshake message itself.
    let server = AtlsServer::new(
        forged(|_, _| certificate_with(Some(&encode_evidence_extension(&vec![7; 70 * 1024])))),
        PeerPolicy::Unauthenticated,
    );
    let (_, client_err) = expect_refusal(handshake(&server, &client).await);
    assert!(
        client_err
            .to_string()
            .contains("exceeds the TLS limit of 64 KiB"),
        "{client_err}"
    );

    // Not a certificate at all: the handshake cannot go on, and the client says why.
    let server = AtlsServer::new(
        forged(|_, _| {
            let key = TlsKey::generate().expect("key");
            MintedCertificate::new(&key, b"\x30\x03\x02\x01\x00".to_vec())
        }),
        PeerPolicy::Unauthenticated,
    );
    let (_, client_err) = expect_refusal(handshake(&server, &client).await);
    assert!(
        error_chain(&client_err).starts_with(
            "refused the server's attestation: the certificate does not parse as X.509"
        ),
        "{client_err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_nonce_or_evidence_are_refused() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);

    // A plain TLS client (no aTLS nonce in the SNI) cannot make the server attest.
    let server = AtlsServer::new(attested(&node), PeerPolicy::Unauthenticated);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepting = async {
        let (tcp, _) = listener.accept().await.expect("accept");
        server.accept(tcp).await
    };
    let plain = async {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await.expect("connect");
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(
                rustls::pki_types::ServerName::try_from("example.com").expect("name"),
                tcp,
            )
            .await
    };
    let (server_result, plain_result) = tokio::join!(accepting, plain);
    assert!(plain_result.is_err());
    let err = server_result.expect_err("no nonce");
    assert_eq!(
        err.to_string(),
        "the client sent no aTLS nonce (expected SNI <hex>.<hex>.atls-nonce.hawser.invalid, got \
         Some(\"example.com\")): is it an aTLS client?"
    );

    // An unattested client against a server that requires attestation.
    let server = AtlsServer::new(Identity::Unattested, verify(&ca));
    let client = AtlsClient::new(Identity::Unattested, PeerPolicy::Unauthenticated);
    let (server_err, client_err) = expect_refusal(handshake(&server, &client).await);
    assert_eq!(
        error_chain(&server_err),
        "refused the client's attestation: the certificate carries no evidence extension \
         (2.25.259585599674992434533360243935770434412.1)"
    );
    assert_eq!(
        client_err.to_string(),
        "the server refused our attestation: the certificate carries no evidence extension \
         (2.25.259585599674992434533360243935770434412.1)"
    );
}

#[test]
fn pcr_changes_between_quotes_keep_evidence_consistent() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let policy = validator(&ca, measurements(booted_pcr11()));
    let nonce = [9u8; 32];
    let key = TlsKey::generate().expect("key");
    let binding = Binding {
        role: Role::Server,
        nonce: &nonce,
        tls_spki_der: key.spki_der(),
    };
    let first = issue(&node.issuer, Role::Server, &nonce, &key);
    policy
        .validate(&first.encode_to_vec(), &binding)
        .expect("valid");

    // A phase extended after the issuer cached the PCRs: the next evidence still verifies and
    // carries the new value (and so fails the old expectations, naming PCR 11).
    node.issuer
        .tpm()
        .extend_phase(PCR_KERNEL_BOOT, "leave-initrd")
        .expect("extend");
    let second = issue(&node.issuer, Role::Server, &nonce, &key);
    let err = policy
        .validate(&second.encode_to_vec(), &binding)
        .expect_err("PCR 11 moved");
    let EvidenceError::Measurements(mismatch) = &err else {
        panic!("expected a measurement mismatch, got {err}");
    };
    assert_eq!(mismatch.mismatches.len(), 1);
    assert_eq!(mismatch.mismatches[0].pcr, 11);
    assert_eq!(
        mismatch.mismatches[0].actual,
        Some(extend_sha256(
            &booted_pcr11(),
            &phase_digest("leave-initrd")
        ))
    );
}

#[test]
fn tpm2_checkquote_verifies_atls_evidence() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let nonce = [3u8; 32];
    let key = TlsKey::generate().expect("key");
    let evidence = issue(&node.issuer, Role::Client, &nonce, &key);
    let qualifying = Binding {
        role: Role::Client,
        nonce: &nonce,
        tls_spki_der: key.spki_der(),
    }
    .qualifying_data(b"");

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("ak.pub"), &evidence.ak_public).expect("write");
    std::fs::write(dir.path().join("attest.bin"), &evidence.quote).expect("write");
    std::fs::write(dir.path().join("sig.bin"), &evidence.signature).expect("write");
    // A missing tpm2_checkquote fails naming its Debian package (tpm2-tools).
    let tpm2_checkquote = hawser_harness::find_binary(std::path::Path::new("tpm2_checkquote"))
        .unwrap_or_else(|e| panic!("{e}"));
    // tpm2-tools' own verifier: the signature over the attest with the AK, and the qualifying
    // data it must find for this binding.
    let checkquote = |qualification: &str| {
        Command::new(&tpm2_checkquote)
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
            .args(["-q", qualification])
            .current_dir(dir.path())
            .output()
            .expect("tpm2_checkquote runs")
    };
    let out = checkquote(&hex::encode(qualifying));
    assert!(
        out.status.success(),
        "tpm2_checkquote refused aTLS evidence: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other = Binding {
        role: Role::Server,
        nonce: &nonce,
        tls_spki_der: key.spki_der(),
    }
    .qualifying_data(b"");
    assert!(!checkquote(&hex::encode(other)).status.success());
}

/// On a current-thread runtime the client's quote runs inline in the handshake (there is no
/// other worker to hand tasks to); mutual attestation still works.
#[tokio::test(flavor = "current_thread")]
async fn mutual_attestation_on_a_current_thread_runtime() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let server_node = node(&ca);
    let client_node = node(&ca);
    let server = AtlsServer::new(attested(&server_node), verify(&ca));
    let client = AtlsClient::new(attested(&client_node), verify(&ca));
    let (s, c) = handshake(&server, &client).await;
    let (mut s, mut c) = (s.expect("server"), c.expect("client"));
    talk(&mut s, &mut c).await;
    assert!(s.peer_attestation().evidence().is_some());
    assert!(c.peer_attestation().evidence().is_some());
}

/// Tamper row: a boot-report quote replayed as aTLS evidence
///
/// The host chooses the boot report's nonce (fw_cfg `quote_nonce`), and the boot report is
/// quoted with the AK that signs aTLS evidence. A host that sets the nonce to the qualifying
/// data an aTLS verifier expects for a TLS key it holds gets a quote of the node's real PCRs —
/// and the verifier still refuses it: the boot report binds a labelled hash of the nonce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_boot_report_quote_cannot_be_used_as_atls_evidence() {
    let ca = ProviderCa::generate("test provider").expect("CA");
    let node = node(&ca);
    let issuer = Arc::clone(&node.issuer);
    let pcrs = node.pcrs.clone();
    let host_nonces: Arc<Mutex<Vec<[u8; 32]>>> = Arc::default();
    let chosen = Arc::clone(&host_nonces);
    let server = AtlsServer::new(
        forged(move |role, nonce| {
            let key = TlsKey::generate().expect("key");
            let binding = Binding {
                role,
                nonce: nonce.expect("client nonce"),
                tls_spki_der: key.spki_der(),
            };
            // The host's nonce for the next boot report: exactly what aTLS expects.
            let host_nonce = binding.qualifying_data(b"");
            chosen.lock().expect("lock").push(host_nonce);
            let tpm = issuer.tpm();
            let ak = tpm.create_attestation_key().expect("AK");
            let all: Vec<u8> = pcrs.keys().copied().collect();
            let quote = tpm
                .quote_boot_report(&ak, &host_nonce, &all)
                .expect("the boot report's quote");
            let evidence = Evidence {
                version: 1,
                variant: hawser_attestation::Variant::QemuVtpm as i32,
                ak_public: hex::decode(&quote.ak_public).expect("hex"),
                quote: hex::decode(&quote.attest).expect("hex"),
                signature: hex::decode(&quote.signature).expect("hex"),
                pcrs_sha256: pcrs
                    .iter()
                    .map(|(pcr, value)| (u32::from(*pcr), value.to_vec()))
                    .collect(),
                ak_cert_chain: issuer.ak_cert_chain().to_vec(),
                user_data: Vec::new(),
                nonce: binding.nonce.to_vec(),
                tls_key_hash: binding.tls_key_hash().to_vec(),
                platform_report: Vec::new(),
                platform_aux: Vec::new(),
            };
            certificate_for(&key, &evidence)
        }),
        PeerPolicy::Unauthenticated,
    );
    let client = AtlsClient::new(Identity::Unattested, verify(&ca));
    let reason = assert_client_refused_server(handshake(&server, &client).await);
    let host_nonce = host_nonces.lock().expect("lock")[0];
    assert_eq!(
        reason,
        format!(
            "the quote's qualifying data is {}, expected {} for this connection's role \
             (server), nonce, TLS key and user data",
            hex::encode(hawser_attestation::report::boot_report_qualifying_data(
                &host_nonce
            )),
            hex::encode(host_nonce)
        )
    );

    // The same node's honest evidence passes the same verifier: the refusal is the binding's,
    // not the AK's or the PCRs'.
    let server = AtlsServer::new(attested(&node), PeerPolicy::Unauthenticated);
    let (s, c) = handshake(&server, &client).await;
    s.expect("server side");
    c.expect("honest evidence verifies");
}
