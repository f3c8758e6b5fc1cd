//! Pre-authentication limits of an aTLS listener under attack, on the host: a real listener
//! ([`incoming_from`]) serving tonic's health service, a "TPM" that takes 50 ms per quote one at
//! a time (as a vTPM under TCG does), and attackers connecting from other loopback addresses
//! (127.0.0.x all reach the listener on Linux). Each test fails without the protection it names.
//! Run with `cargo test -p hawser-attestation --features tonic --test preauth`.
#![cfg(feature = "tonic")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hawser_attestation::atls::{
    AtlsClient, AtlsError, AtlsServer, CallTracking, CertificateMinter, ConnectionLimits, Identity,
    MintedCertificate, PeerPolicy, incoming_from,
};
use hawser_attestation::evidence::{Nonce, Role};
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// How long the slow TPM takes per quote.
const QUOTE_TIME: Duration = Duration::from_millis(50);

/// A TPM that quotes one at a time, [`QUOTE_TIME`] each, and counts its quotes.
#[derive(Default)]
struct SlowTpm {
    busy: Mutex<()>,
    quotes: AtomicUsize,
}

impl CertificateMinter for SlowTpm {
    fn mint(&self, _role: Role, _nonce: Option<&Nonce>) -> Result<MintedCertificate, AtlsError> {
        let _tpm = self.busy.lock().unwrap();
        std::thread::sleep(QUOTE_TIME);
        self.quotes.fetch_add(1, Ordering::SeqCst);
        MintedCertificate::unattested()
    }
}

struct Listener {
    addr: SocketAddr,
    tpm: Arc<SlowTpm>,
    serving: tokio::task::JoinHandle<()>,
    reporter: tonic_health::server::HealthReporter,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

/// A listener like the init server's: it quotes for everyone and asks nothing of clients.
async fn listen(limits: ConnectionLimits) -> Listener {
    let tpm = Arc::new(SlowTpm::default());
    let minter: Arc<dyn CertificateMinter> = tpm.clone();
    let server = AtlsServer::new(Identity::Custom(minter), PeerPolicy::Unauthenticated);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = incoming_from(listener, limits, move || Some(server.clone()));
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("hawser.Test", tonic_health::ServingStatus::Serving)
        .await;
    let serving = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .layer(CallTracking)
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    Listener {
        addr,
        tpm,
        serving,
        reporter,
    }
}

fn client() -> AtlsClient {
    AtlsClient::new(Identity::Unattested, PeerPolicy::Unauthenticated)
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A TCP connection to `addr` from `source`.
async fn connect_from(source: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(addr).await
}

/// `loops` attackers on each of `sources`, each running aTLS handshakes (each costs the server
/// a quote) as fast as it is let, until `stop`.
fn flood(addr: SocketAddr, sources: &[IpAddr], loops: usize, stop: &Arc<AtomicBool>) {
    for &source in sources {
        for _ in 0..loops {
            let stop = Arc::clone(stop);
            tokio::spawn(async move {
                let client = client().handshake_timeout(Duration::from_secs(30));
                while !stop.load(Ordering::Relaxed) {
                    match connect_from(source, addr).await {
                        Ok(tcp) => {
                            if client.connect(tcp).await.is_err() {
                                // Refused: back off a little, so the test machine's two cores
                                // are not spent on reconnecting alone.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            });
        }
    }
}

/// A genuine client's health check over a fresh aTLS channel, retried until `deadline`: how
/// long it took until one succeeded, or `None`.
async fn genuine_call(addr: SocketAddr, deadline: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < deadline {
        let attempt = async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_with_connector(client().connector())
                .await
                .ok()?;
            HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: "hawser.Test".into(),
                })
                .await
                .ok()
        };
        let left = deadline.saturating_sub(started.elapsed());
        if let Ok(Some(_)) = tokio::time::timeout(left, attempt).await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// 200 attacker loops on four addresses flood a listener whose handshake bounds are as
/// generous as the join service's (1024 there): each address gets 2 places in the quote
/// queue, so the genuine client waits behind at most 8 quotes (≈ 0.4 s), not behind 200 (10 s:
/// its handshake timeout). Without the per-source share of the queue, it does not get through
/// within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_handshake_flood_from_several_addresses() {
    let limits = ConnectionLimits {
        max_handshakes: 512,
        max_handshakes_per_source: 128,
        quotes_per_sec: 100.0,
        quote_burst: 10,
        max_queued_quotes: 512,
        max_queued_quotes_per_source: 2,
        idle_timeout: Duration::from_secs(60),
    };
    let listener = listen(limits).await;
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<IpAddr> = (2..=5).map(loopback).collect();
    flood(listener.addr, &attackers, 50, &stop);
    // Let the flood build up its queue first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let quotes_before = listener.tpm.quotes.load(Ordering::SeqCst);

    let took = genuine_call(listener.addr, Duration::from_secs(8)).await;
    let quotes_during = listener.tpm.quotes.load(Ordering::SeqCst) - quotes_before;
    stop.store(true, Ordering::Relaxed);
    let took = took.expect("the genuine client got through within 8 s");
    assert!(
        took < Duration::from_secs(3),
        "the genuine client took {took:?} behind the flood"
    );
    assert!(
        quotes_during > 0,
        "the attackers were quoting meanwhile (the flood was real)"
    );
}

/// The quotes of a flooded listener stay within its rate: the burst plus `quotes_per_sec` per
/// second, although the TPM could do 20 a second. Without the pacer, the TPM's own speed is
/// the only bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_quote_rate_under_flood() {
    let limits = ConnectionLimits {
        max_handshakes: 64,
        max_handshakes_per_source: 16,
        quotes_per_sec: 5.0,
        quote_burst: 2,
        max_queued_quotes: 8,
        max_queued_quotes_per_source: 4,
        idle_timeout: Duration::from_secs(60),
    };
    let listener = listen(limits).await;
    let stop = Arc::new(AtomicBool::new(false));
    let window = Duration::from_secs(3);
    let started = Instant::now();
    flood(listener.addr, &[loopback(2), loopback(3)], 20, &stop);
    tokio::time::sleep(window).await;
    let quotes = listener.tpm.quotes.load(Ordering::SeqCst);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    // Burst + rate × time, and one for a quote that started just before the count.
    let bound = 2 + (5.0 * elapsed).ceil() as usize + 1;
    assert!(
        quotes <= bound,
        "{quotes} quotes in {elapsed:.1} s (at most {bound})"
    );
    assert!(quotes >= 5, "the flood got quotes at all ({quotes})");
}

/// Connections over the per-source bound are closed as soon as they are accepted, before any
/// TLS or TPM work; those within it, and another address, are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_handshakes_over_the_per_source_bound() {
    let limits = ConnectionLimits {
        max_handshakes: 64,
        max_handshakes_per_source: 4,
        ..ConnectionLimits::default()
    };
    let listener = listen(limits).await;
    // Six connections from one address that never send a ClientHello.
    let mut silent = Vec::new();
    for _ in 0..6 {
        silent.push(connect_from(loopback(2), listener.addr).await.unwrap());
    }
    let closed_soon = |mut tcp: TcpStream| async move {
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    };
    let over: Vec<TcpStream> = silent.split_off(4);
    for (i, tcp) in over.into_iter().enumerate() {
        assert!(
            closed_soon(tcp).await,
            "connection {} from the busy address was not closed at once",
            i + 5
        );
    }
    for (i, tcp) in silent.into_iter().enumerate() {
        assert!(
            !closed_soon(tcp).await,
            "connection {} within the bound was closed",
            i + 1
        );
    }
    // Another address is served meanwhile, and no quote was spent on the refused ones.
    let tcp = connect_from(loopback(3), listener.addr).await.unwrap();
    client()
        .connect(tcp)
        .await
        .expect("another address gets its handshake");
    assert_eq!(listener.tpm.quotes.load(Ordering::SeqCst), 1);
}

/// An established connection without a call is closed after the idle timeout; one with a call
/// in progress (a streaming watch) is kept however long the call lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_idle_connections_after_the_handshake() {
    let idle = Duration::from_millis(300);
    let limits = ConnectionLimits {
        idle_timeout: idle,
        ..ConnectionLimits::default()
    };
    let listener = listen(limits).await;

    // Handshake, then nothing: closed after the idle timeout.
    let tcp = TcpStream::connect(listener.addr).await.unwrap();
    let mut idle_stream = client().connect(tcp).await.expect("handshake");
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            // The server's HTTP/2 preface may come first; the close follows.
            match idle_stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(read.is_ok(), "an idle connection was still open after 5 s");
    assert!(
        started.elapsed() >= idle.mul_f32(0.8),
        "closed before its idle timeout ({:?})",
        started.elapsed()
    );

    // A streaming call outlives several idle timeouts on its connection.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", listener.addr))
        .unwrap()
        .connect_with_connector(client().connector())
        .await
        .expect("channel");
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: "hawser.Test".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    watch
        .message()
        .await
        .expect("first status")
        .expect("status");
    tokio::time::sleep(idle * 4).await;
    listener
        .reporter
        .set_service_status("hawser.Test", tonic_health::ServingStatus::NotServing)
        .await;
    let update = tokio::time::timeout(Duration::from_secs(2), watch.message())
        .await
        .expect("the update arrives")
        .expect("the call in progress kept its connection");
    assert!(update.is_some());
}
