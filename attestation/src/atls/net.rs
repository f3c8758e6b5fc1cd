//! aTLS as tonic's transport: tonic cannot take a custom rustls verifier, so the TLS runs here
//! and tonic gets the streams (`Server::serve_with_incoming`, `Endpoint::connect_with_connector`).
//!
//! ```no_run
//! # async fn demo(server: hawser_attestation::atls::AtlsServer,
//! #               client: hawser_attestation::atls::AtlsClient) -> Result<(), Box<dyn std::error::Error>> {
//! use tonic::transport::{Endpoint, Server};
//! # let service = tonic_health::server::health_reporter().1;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(Server::builder().add_service(service).serve_with_incoming(server.incoming(listener)));
//! // "http": tonic must not add TLS of its own; aTLS is underneath.
//! let channel = Endpoint::from_shared(format!("http://{addr}"))?
//!     .connect_with_connector(client.connector())
//!     .await?;
//! # drop(channel); Ok(()) }
//! ```
//!
//! Every socket gets `TCP_NODELAY` (without it each RPC waits ≈ 40 ms for delayed ACKs).
//! A gRPC handler reads what the client proved from the request:
//! `request.extensions().get::<AtlsConnectInfo>()`.
//!
//! A listener applies its [`ConnectionLimits`] (see [`super::limits`]): connections over the
//! per-source or total handshake bound are closed as soon as they are accepted, quotes are
//! paced, and an established connection with no call in progress for the idle timeout is
//! closed. Which calls are in progress is seen by [`CallTracking`], a tower layer every server
//! on these connections must add (`Server::builder().layer(CallTracking)`): without it every
//! connection counts as idle, and is closed at the idle timeout even during a call.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::idle::{CallInProgress, ConnectionActivity, IdleWatch};
use super::limits::{Admission, ConnectionLimits, QuotePacer};
use super::{AtlsClient, AtlsError, AtlsServer, AtlsStream, PeerAttestation};

/// Accepted connections waiting for tonic to take them.
const ACCEPTED_QUEUE: usize = 16;

/// What tonic puts into every request's extensions for a connection accepted through
/// [`AtlsServer::incoming`].
#[derive(Debug, Clone)]
pub struct AtlsConnectInfo {
    /// The client's address.
    pub remote_addr: Option<SocketAddr>,
    /// Our address.
    pub local_addr: Option<SocketAddr>,
    /// What the client proved.
    pub peer: Arc<PeerAttestation>,
    /// The connection's calls in progress, for its idle timeout ([`CallTracking`]).
    activity: Option<Arc<ConnectionActivity>>,
}

impl tonic::transport::server::Connected for AtlsStream<TcpStream> {
    type ConnectInfo = AtlsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        AtlsConnectInfo {
            remote_addr: self.get_ref().peer_addr().ok(),
            local_addr: self.get_ref().local_addr().ok(),
            peer: self.peer_attestation_arc(),
            activity: self.idle.as_ref().map(|idle| Arc::clone(&idle.activity)),
        }
    }
}

/// A tower layer that tells each aTLS connection's idle timer which calls are in progress: a
/// call counts from its request until its response body has ended (a streaming response
/// keeps its connection open). Every tonic server on [`AtlsServer::incoming`] connections adds
/// it: `Server::builder().layer(CallTracking)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallTracking;

impl<S> tower_layer::Layer<S> for CallTracking {
    type Service = CallTrackingService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallTrackingService { inner }
    }
}

/// [`CallTracking`]'s service.
#[derive(Debug, Clone)]
pub struct CallTrackingService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for CallTrackingService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<TrackedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = request
            .extensions()
            .get::<AtlsConnectInfo>()
            .and_then(|info| info.activity.as_ref())
            .map(ConnectionActivity::begin_call);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| TrackedBody {
                inner: Box::pin(body),
                _call: call,
            }))
        })
    }
}

/// A response body that holds its call in progress until it ends or is dropped.
pub struct TrackedBody<B> {
    inner: Pin<Box<B>>,
    _call: Option<CallInProgress>,
}

impl<B> std::fmt::Debug for TrackedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedBody").finish_non_exhaustive()
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The stream of accepted aTLS connections of one listener, for
/// `tonic::transport::Server::serve_with_incoming`. Handshakes run concurrently in their own
/// tasks; failed or refused ones are logged (with the peer address) and never reach tonic.
/// Dropping it stops accepting.
pub struct AtlsIncoming {
    accepted: mpsc::Receiver<AtlsStream<TcpStream>>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for AtlsIncoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsIncoming").finish_non_exhaustive()
    }
}

impl futures_core::Stream for AtlsIncoming {
    type Item = Result<AtlsStream<TcpStream>, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx).map(|stream| stream.map(Ok))
    }
}

impl Drop for AtlsIncoming {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl AtlsServer {
    /// Accepts TCP connections from `listener` and runs the aTLS handshake on each, within the
    /// default [`ConnectionLimits`] (must be called within a tokio runtime).
    pub fn incoming(&self, listener: TcpListener) -> AtlsIncoming {
        let server = self.clone();
        incoming_from(listener, ConnectionLimits::default(), move || {
            Some(server.clone())
        })
    }
}

/// Like [`AtlsServer::incoming`], for a server whose configuration changes while it listens:
/// `server_for_connection` is asked for the server to run each new connection's handshake
/// with (e.g. one rebuilt after the expected measurements were reloaded); `None` drops the
/// connection (the closure logs why). `limits` bound what unauthenticated clients can make
/// the listener do (see [`super::limits`]); a connection over a handshake bound is closed
/// when it is accepted, before the closure is asked. Must be called within a tokio runtime.
pub fn incoming_from(
    listener: TcpListener,
    limits: ConnectionLimits,
    server_for_connection: impl Fn() -> Option<AtlsServer> + Send + 'static,
) -> AtlsIncoming {
    incoming_with(listener, limits, None, server_for_connection)
}

/// Like [`incoming_from`], except that a connection over its source's handshake bound waits,
/// accepted and unread, for the next place of its source (first come, first served) for at
/// most `max_wait`, instead of being closed at once: nodes behind one address (a NAT, a
/// benchmark) queue when the service is busy rather than see their connections reset. At most
/// [`ConnectionLimits::max_handshakes`] wait in all; beyond that, and over the listener's total
/// bound, connections are closed on accept as with [`incoming_from`]. A waiting connection
/// costs a socket: no TLS, no TPM work, and other sources are not delayed by it.
pub fn incoming_queued_from(
    listener: TcpListener,
    limits: ConnectionLimits,
    max_wait: Duration,
    server_for_connection: impl Fn() -> Option<AtlsServer> + Send + 'static,
) -> AtlsIncoming {
    incoming_with(listener, limits, Some(max_wait), server_for_connection)
}

fn incoming_with(
    listener: TcpListener,
    limits: ConnectionLimits,
    max_wait: Option<Duration>,
    server_for_connection: impl Fn() -> Option<AtlsServer> + Send + 'static,
) -> AtlsIncoming {
    let (sender, accepted) = mpsc::channel(ACCEPTED_QUEUE);
    let admission = Arc::new(Admission::new(&limits));
    let pacer = Arc::new(QuotePacer::new(&limits));
    let idle_timeout = limits.idle_timeout;
    let acceptor = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Usually EMFILE or a connection reset before accept: retry shortly.
                    tracing::warn!(%err, "accepting a TCP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if sender.is_closed() {
                break;
            }
            // Over a bound: dropping the socket closes it, before any TLS or TPM work.
            let admitted = match max_wait {
                None => admission.admit(peer.ip()).map(Ok),
                Some(_) => admission.admit_or_wait(peer.ip()),
            };
            let Ok(admitted) = admitted else {
                continue;
            };
            if let Err(err) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, %err, "cannot set TCP_NODELAY");
            }
            // The policy in force when the connection is accepted, also for one that waits.
            let Some(server) = server_for_connection() else {
                continue;
            };
            let pacer = Arc::clone(&pacer);
            let sender = sender.clone();
            tokio::spawn(
                async move {
                    let admitted = match admitted {
                        Ok(admitted) => admitted,
                        Err(waiting) => {
                            let Some(admitted) =
                                waiting.admitted(max_wait.unwrap_or_default()).await
                            else {
                                tracing::debug!(
                                    "closed a connection that waited in vain for a place of its source"
                                );
                                return;
                            };
                            admitted
                        }
                    };
                    let server = server.with_quote_pacer(pacer);
                    let result = server.accept_from(tcp, Some(peer.ip())).await;
                    drop(admitted);
                    if let Ok(mut stream) = result {
                        stream.idle = Some(IdleWatch::new(idle_timeout));
                        // A closed receiver means the server is shutting down.
                        let _ = sender.send(stream).await;
                    }
                }
                .instrument(tracing::info_span!("atls_accept", %peer)),
            );
        }
    });
    AtlsIncoming { accepted, acceptor }
}

/// A tonic connector: `Endpoint::connect_with_connector(client.connector())`. It resolves the
/// URI's host and port, connects over TCP with `TCP_NODELAY` and runs the aTLS client
/// handshake; a channel that reconnects attests afresh each time.
#[derive(Debug, Clone)]
pub struct AtlsConnector {
    client: AtlsClient,
}

impl AtlsClient {
    /// This client as a tonic connector.
    pub fn connector(&self) -> AtlsConnector {
        AtlsConnector {
            client: self.clone(),
        }
    }
}

impl tower_service::Service<http::Uri> for AtlsConnector {
    type Response = TokioIo<AtlsStream<TcpStream>>;
    type Error = AtlsError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let client = self.client.clone();
        Box::pin(async move {
            let target = uri.to_string();
            let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
                return Err(AtlsError::Connect {
                    target,
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "the URI needs a host and an explicit port",
                    ),
                });
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let tcp =
                TcpStream::connect((host, port))
                    .await
                    .map_err(|source| AtlsError::Connect {
                        target: target.clone(),
                        source,
                    })?;
            if let Err(err) = tcp.set_nodelay(true) {
                tracing::debug!(%target, %err, "cannot set TCP_NODELAY");
            }
            let stream = client
                .connect(tcp)
                .instrument(tracing::info_span!("atls_connect", %target))
                .await?;
            Ok(TokioIo::new(stream))
        })
    }
}
