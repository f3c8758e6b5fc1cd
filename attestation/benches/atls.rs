//! aTLS numbers on this machine, side by side in one run:
//!
//! 1. Issuer latency on swtpm: one quote (evidence), and a whole attested certificate (fresh
//!    P-256 key + quote + self-signed certificate), and a whole server-attests handshake.
//! 2. Validator throughput: verified aTLS handshakes per second over loopback TCP, against the
//!    raw floor, a plain TLS 1.3 handshake (same rustls, same P-256 keys) plus one ECDSA P-256
//!    verification, with the same concurrency on the same runtime. The aTLS server presents
//!    real swtpm evidence minted before the clock starts (one per connection, for nonces the
//!    benchmark's client then uses), so the TPM's speed does not cap the validator's.
//!
//! `cargo bench -p hawser-attestation --features tpm,tonic --bench atls` (prints a table).
//! `HAWSER_BENCH_HANDSHAKES` (default 1000) sets the handshakes per round.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_attestation::atls::{
    AtlsClient, AtlsError, AtlsServer, CertificateMinter, Identity, MintedCertificate, PeerPolicy,
    TlsKey,
};
use hawser_attestation::evidence::{Binding, EvidenceIssuer, Nonce, Role};
use hawser_attestation::{AkTrust, ExpectedMeasurements, Tpm, TpmIssuer, Validator};
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::{TcpListener, TcpStream};

const CONCURRENCY: usize = 8;
/// Rounds of each kind, interleaved (floor, aTLS, floor, …) so load from elsewhere on the
/// machine hits both alike.
const ROUNDS: usize = 4;

fn main() {
    let handshakes: usize = std::env::var("HAWSER_BENCH_HANDSHAKES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let ca = ProviderCa::generate("bench provider").expect("CA");
    let swtpm = Swtpm::start(&SwtpmOptions::tcp()).expect("swtpm");
    ca.provision(&swtpm).expect("provision");
    // Everything holding the TPM connection is dropped before swtpm is.
    measure(&runtime, &ca, &swtpm.tcti().expect("tcti"), handshakes);
    drop(runtime); // its tasks hold the issuer
    drop(swtpm);
}

fn measure(runtime: &tokio::runtime::Runtime, ca: &ProviderCa, tcti: &str, handshakes: usize) {
    let tpm = Arc::new(Tpm::open(tcti).expect("open"));
    tpm.extend_phase(11, "enter-initrd").expect("extend");
    let pcrs = tpm.read_pcrs_sha256(0..=23).expect("pcrs");
    let issuer = Arc::new(TpmIssuer::new(Arc::clone(&tpm)).expect("issuer"));
    let mut measurements = ExpectedMeasurements::new();
    for (pcr, value) in &pcrs {
        measurements.insert(
            *pcr,
            hawser_attestation::ExpectedPcr {
                expected: *value,
                warn_only: !matches!(pcr, 4 | 9 | 11 | 12 | 13 | 15),
            },
        );
    }
    let trust = AkTrust::from_der([ca.certificate_der()]).expect("trust");
    let validator = Arc::new(Validator::new(measurements, trust).expect("validator"));

    // 1. Issuer latency.
    let mut quote = Vec::new();
    let mut certificate = Vec::new();
    for i in 0..50u8 {
        let nonce = [i; 32];
        let key = TlsKey::generate().expect("key");
        let binding = Binding {
            role: Role::Server,
            nonce: &nonce,
            tls_spki_der: key.spki_der(),
        };
        let t = Instant::now();
        issuer.issue(&binding, b"").expect("evidence");
        quote.push(t.elapsed());
        let t = Instant::now();
        MintedCertificate::attested(Role::Server, &nonce, issuer.as_ref(), b"").expect("cert");
        certificate.push(t.elapsed());
    }
    let server = AtlsServer::new(
        Identity::attested(Arc::clone(&issuer) as Arc<dyn EvidenceIssuer>),
        PeerPolicy::Unauthenticated,
    );
    let client = AtlsClient::new(
        Identity::Unattested,
        PeerPolicy::Verify(Arc::clone(&validator)),
    );
    let sequential = runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = server.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.expect("accept");
                tcp.set_nodelay(true).expect("nodelay");
                let server = server.clone();
                tokio::spawn(async move { server.accept(tcp).await });
            }
        });
        let mut samples = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            let tcp = TcpStream::connect(addr).await.expect("connect");
            tcp.set_nodelay(true).expect("nodelay");
            client.connect(tcp).await.expect("attested handshake");
            samples.push(t.elapsed());
        }
        samples
    });
    println!("issuer latency on swtpm (median / p90 of 50):");
    println!(
        "  quote (evidence: TPM2_Quote, cached PCRs)     {}",
        stats(quote)
    );
    println!(
        "  attested certificate (key + quote + cert)     {}",
        stats(certificate)
    );
    println!(
        "  server-attests handshake, connect to verified {}",
        stats(sequential)
    );

    // 2. Validator throughput against the floor.
    let total = handshakes * ROUNDS;
    let t = Instant::now();
    let mut pool = HashMap::with_capacity(total);
    let mut nonces = Vec::with_capacity(total);
    for i in 0..total {
        let mut nonce = [0u8; 32];
        nonce[..8].copy_from_slice(&(i as u64).to_be_bytes());
        nonce[8..16].copy_from_slice(&0x5eed_u64.to_be_bytes());
        let cert = MintedCertificate::attested(Role::Server, &nonce, issuer.as_ref(), b"")
            .expect("pre-minted certificate");
        pool.insert(nonce, cert);
        nonces.push(nonce);
    }
    eprintln!(
        "pre-minted {total} attested certificates on swtpm in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let pool = Arc::new(Premade(Mutex::new(pool)));
    let atls_server = AtlsServer::new(Identity::Custom(pool), PeerPolicy::Unauthenticated);

    let mut floor_rates = Vec::new();
    let mut atls_rates = Vec::new();
    for round in 0..ROUNDS {
        let round_nonces = nonces[round * handshakes..(round + 1) * handshakes].to_vec();
        floor_rates.push(runtime.block_on(floor(handshakes)));
        atls_rates.push(runtime.block_on(attested(&atls_server, &client, round_nonces)));
    }
    let (floor_median, atls_median) = (median(&floor_rates), median(&atls_rates));
    println!(
        "validator throughput, 2 cores (client + server in one process, {CONCURRENCY} concurrent, {handshakes} handshakes per round, {ROUNDS} rounds interleaved):"
    );
    println!(
        "  raw floor: TLS 1.3 + 1 ECDSA verify   {floor_rates:>6.0?} /s  median {floor_median:.0}/s"
    );
    println!(
        "  aTLS, server attests, fully verified   {atls_rates:>6.0?} /s  median {atls_median:.0}/s"
    );
    println!(
        "  floor / aTLS (medians)                 {:.2}x",
        floor_median / atls_median
    );
}

fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

fn stats(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    format!(
        "{:>7.2} ms / {:>7.2} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3
    )
}

/// Hands out the pre-minted certificate for the client's nonce.
struct Premade(Mutex<HashMap<Nonce, MintedCertificate>>);

impl CertificateMinter for Premade {
    fn mint(&self, _role: Role, nonce: Option<&Nonce>) -> Result<MintedCertificate, AtlsError> {
        let nonce = nonce.ok_or(AtlsError::NoClientNonce { sni: None })?;
        self.0
            .lock()
            .expect("pool lock")
            .remove(nonce)
            .ok_or(AtlsError::NoClientNonce { sni: None })
    }
}

/// Runs `count` client operations with CONCURRENCY tasks; returns operations per second.
async fn run<F, Fut>(count: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let op = Arc::clone(&op);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    break;
                }
                op(i).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    count as f64 / start.elapsed().as_secs_f64()
}

async fn attested(server: &AtlsServer, client: &AtlsClient, nonces: Vec<Nonce>) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = server.clone();
    let acceptor = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.expect("accept");
            tcp.set_nodelay(true).expect("nodelay");
            let server = server.clone();
            tokio::spawn(async move { server.accept(tcp).await });
        }
    });
    let client = client.clone();
    let nonces = Arc::new(nonces);
    let count = nonces.len();
    let rate = run(count, move |i| {
        let client = client.clone();
        let nonce = nonces[i];
        async move {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            tcp.set_nodelay(true).expect("nodelay");
            let stream = client
                .connect_with_nonce(tcp, nonce)
                .await
                .expect("verified handshake");
            assert!(stream.peer_attestation().evidence().is_some());
        }
    })
    .await;
    acceptor.abort();
    rate
}

/// Accepts any certificate but checks the CertificateVerify with its key, like aTLS does.
#[derive(Debug)]
struct KeyOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for KeyOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::PeerIncompatible::Tls12NotOffered.into())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ECDSA_NISTP256_SHA256]
    }
}

/// Plain TLS 1.3 handshakes plus one ECDSA P-256 verification each.
async fn floor(count: usize) -> f64 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let cert = rcgen::CertificateParams::new(vec!["floor.invalid".into()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
        )
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let mut client_config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(KeyOnly(Arc::clone(&provider))))
        .with_no_client_auth();
    client_config.resumption = rustls::client::Resumption::disabled();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));

    // The one extra ECDSA verification: a signature over 145 bytes, like a quote's attest.
    let message = vec![0x42u8; 145];
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &rng,
    )
    .expect("pkcs8");
    let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .expect("signer");
    let signature = signer.sign(&rng, &message).expect("sign").as_ref().to_vec();
    let public = ring::signature::KeyPair::public_key(&signer)
        .as_ref()
        .to_vec();
    let check = Arc::new((message, signature, public));

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.expect("accept");
            tcp.set_nodelay(true).expect("nodelay");
            let acceptor = acceptor.clone();
            tokio::spawn(async move { acceptor.accept(tcp).await });
        }
    });
    let rate = run(count, move |_| {
        let connector = connector.clone();
        let check = Arc::clone(&check);
        async move {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            tcp.set_nodelay(true).expect("nodelay");
            connector
                .connect(ServerName::try_from("floor.invalid").expect("name"), tcp)
                .await
                .expect("handshake");
            let (message, signature, public) = &*check;
            ring::signature::UnparsedPublicKey::new(
                &ring::signature::ECDSA_P256_SHA256_ASN1,
                public,
            )
            .verify(message, signature)
            .expect("verify");
        }
    })
    .await;
    server.abort();
    rate
}
