//! Accepting and connecting: per-connection rustls configurations, the handshake and the
//! verdicts after it (see the protocol in the module docs of `atls`).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::server::{Acceptor, NoServerSessionStorage};
use rustls::{AlertDescription, ClientConfig, InvalidMessage, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::limits::QuotePacer;
use super::verify::{ClientAuthOutcome, ClientResolver, FixedCertificate, PeerVerifier};
use super::verify::{OutcomeSlot, outcome_slot, take_outcome};
use super::{
    AtlsError, CertificateMinter, DEFAULT_HANDSHAKE_TIMEOUT, Identity, PROVIDER, PeerAttestation,
    PeerPolicy, Refusal,
};
use crate::evidence::{NONCE_LEN, Nonce, Role};

/// The first bytes of a verdict frame.
const VERDICT_MAGIC: [u8; 4] = *b"HWV1";
const VERDICT_ACCEPTED: u8 = 0;
const VERDICT_REFUSED: u8 = 1;
/// The longest refusal reason sent (longer ones are cut at a character boundary).
const MAX_REASON_LEN: usize = 4096;

/// The accepting side of aTLS. Cheap to clone; every connection gets its own nonce, key,
/// certificate and rustls configuration.
#[derive(Clone)]
pub struct AtlsServer {
    minter: Arc<dyn CertificateMinter>,
    attests: bool,
    policy: PeerPolicy,
    timeout: Duration,
    /// Shared by the handshakes of one listener: quotes wait their turn here.
    pacer: Option<Arc<QuotePacer>>,
}

impl std::fmt::Debug for AtlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsServer")
            .field("attests", &self.attests)
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The connecting side of aTLS. Cheap to clone.
#[derive(Clone)]
pub struct AtlsClient {
    minter: Arc<dyn CertificateMinter>,
    policy: PeerPolicy,
    timeout: Duration,
}

impl std::fmt::Debug for AtlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsClient")
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// An established aTLS connection whose peer passed the policy.
pub struct AtlsStream<IO> {
    tls: tokio_rustls::TlsStream<IO>,
    peer: Arc<PeerAttestation>,
    /// Set on connections a listener accepted: closes the connection once it is idle.
    #[cfg(feature = "tonic")]
    pub(crate) idle: Option<super::idle::IdleWatch>,
}

impl<IO> std::fmt::Debug for AtlsStream<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsStream")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl<IO> AtlsStream<IO> {
    /// What the peer proved.
    pub fn peer_attestation(&self) -> &PeerAttestation {
        &self.peer
    }

    /// What the peer proved, shareable (tonic's connect info carries it).
    pub fn peer_attestation_arc(&self) -> Arc<PeerAttestation> {
        Arc::clone(&self.peer)
    }

    /// The underlying transport.
    pub fn get_ref(&self) -> &IO {
        match &self.tls {
            tokio_rustls::TlsStream::Client(tls) => tls.get_ref().0,
            tokio_rustls::TlsStream::Server(tls) => tls.get_ref().0,
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for AtlsStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // A server connection always has a read pending: this is where its idle time ends it.
        #[cfg(feature = "tonic")]
        if let Some(idle) = self.idle.as_mut()
            && let Poll::Ready(err) = idle.poll_expired(cx)
        {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for AtlsStream<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

fn random_nonce() -> Result<Nonce, AtlsError> {
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
        .map_err(|_| AtlsError::Mint(super::MintError::Random))?;
    Ok(nonce)
}

/// Logs the end of a handshake: refusals as warnings (both sides see the reason), transport
/// trouble quieter (scanners and dropped connections are common).
fn log_result<IO>(side: Role, result: &Result<AtlsStream<IO>, AtlsError>) {
    match result {
        Ok(stream) => match stream.peer.evidence() {
            Some(evidence) => tracing::debug!(
                %side,
                peer_ak = %hex::encode(&evidence.ak_name),
                "aTLS connection established; peer attested"
            ),
            None => tracing::debug!(%side, "aTLS connection established; peer not attested"),
        },
        // Counted and reported, rate-limited, by the pacer.
        Err(err @ AtlsError::QuoteQueueFull { .. }) => {
            tracing::debug!(%side, error = crate::error_chain(err), "aTLS connection refused")
        }
        Err(err @ (AtlsError::PeerRefused { .. } | AtlsError::RefusedByPeer { .. })) => {
            tracing::warn!(%side, error = crate::error_chain(err), "aTLS connection refused")
        }
        Err(err) => {
            tracing::info!(%side, error = crate::error_chain(err), "aTLS connection failed")
        }
    }
}

impl AtlsServer {
    /// A server presenting `identity` and requiring `policy` of its clients.
    pub fn new(identity: Identity, policy: PeerPolicy) -> Self {
        Self {
            minter: identity.minter(),
            attests: identity.attests(),
            policy,
            timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            pacer: None,
        }
    }

    /// Bounds the whole handshake (quote and verdicts included); default
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The handshake's quote waits its turn in `pacer` (shared by the handshakes of one
    /// listener), or is refused when too many already wait; without one it quotes at once.
    /// [`AtlsServer::incoming`] and [`super::incoming_from`] set one per listener.
    pub fn with_quote_pacer(mut self, pacer: Arc<QuotePacer>) -> Self {
        self.pacer = Some(pacer);
        self
    }

    /// Runs the server side of an aTLS handshake on `io`.
    pub async fn accept<IO>(&self, io: IO) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        self.accept_from(io, None).await
    }

    /// [`AtlsServer::accept`] for a connection from `peer` (named in refusals).
    pub(crate) async fn accept_from<IO>(
        &self,
        io: IO,
        peer: Option<std::net::IpAddr>,
    ) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let result = tokio::time::timeout(self.timeout, self.accept_inner(io, peer))
            .await
            .unwrap_or(Err(AtlsError::Timeout(self.timeout)));
        log_result(Role::Server, &result);
        result
    }

    async fn accept_inner<IO>(
        &self,
        io: IO,
        peer: Option<std::net::IpAddr>,
    ) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let start = LazyConfigAcceptor::new(Acceptor::default(), io)
            .await
            .map_err(handshake_error)?;
        let sni = start.client_hello().server_name().map(str::to_owned);
        let client_nonce = sni.as_deref().and_then(super::nonce::from_sni);
        if self.attests && client_nonce.is_none() {
            // Dropping the handshake closes the connection: there is no verdict channel yet.
            return Err(AtlsError::NoClientNonce { sni });
        }

        // The TPM's turn, before any work on it: the permit lives until the quote has ended,
        // even if this handshake times out meanwhile.
        let permit = match (&self.pacer, self.attests) {
            (Some(pacer), true) => Some(pacer.admit(peer).await?),
            _ => None,
        };
        let minter = Arc::clone(&self.minter);
        let minted = tokio::task::spawn_blocking(move || {
            let minted = minter.mint(Role::Server, client_nonce.as_ref());
            drop(permit);
            minted
        })
        .await
        .map_err(AtlsError::Task)??;

        let builder = ServerConfig::builder_with_provider(Arc::clone(&PROVIDER))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(AtlsError::Config)?;
        let (builder, outcome) = match &self.policy {
            PeerPolicy::Verify(_) => {
                let outcome = outcome_slot();
                let verifier = PeerVerifier::new(
                    self.policy.clone(),
                    Role::Client,
                    random_nonce()?,
                    Arc::clone(&outcome),
                    PROVIDER.signature_verification_algorithms,
                );
                (
                    builder.with_client_cert_verifier(Arc::new(verifier)),
                    Some(outcome),
                )
            }
            PeerPolicy::Unauthenticated => (builder.with_no_client_auth(), None),
        };
        let mut config =
            builder.with_cert_resolver(Arc::new(FixedCertificate(minted.certified_key)));
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;

        let mut tls = match start.into_stream(Arc::new(config)).await {
            Ok(tls) => tls,
            Err(err) => {
                if let Some(Err(reason)) = outcome.as_ref().and_then(take_outcome) {
                    return Err(AtlsError::PeerRefused {
                        peer: Role::Client,
                        reason,
                    });
                }
                return Err(handshake_error(err));
            }
        };

        let own = match &outcome {
            Some(slot) => {
                let own = take_outcome(slot).unwrap_or(Err(Refusal::Certificate(
                    super::cert::CertificateError::MissingEvidence,
                )));
                write_verdict(&mut tls, own.as_ref().err()).await?;
                own
            }
            None => Ok(PeerAttestation::Unattested),
        };
        let peer = match own {
            Ok(peer) => peer,
            Err(reason) => {
                let _ = tls.shutdown().await;
                return Err(AtlsError::PeerRefused {
                    peer: Role::Client,
                    reason,
                });
            }
        };
        if let Verdict::Refused(reason) = read_verdict(&mut tls, Role::Client).await? {
            let _ = tls.shutdown().await;
            return Err(AtlsError::RefusedByPeer {
                peer: Role::Client,
                reason,
            });
        }
        Ok(AtlsStream {
            tls: tokio_rustls::TlsStream::Server(tls),
            peer: Arc::new(peer),
            #[cfg(feature = "tonic")]
            idle: None,
        })
    }
}

impl AtlsClient {
    /// A client presenting `identity` (when the server asks) and requiring `policy` of the
    /// server.
    pub fn new(identity: Identity, policy: PeerPolicy) -> Self {
        Self {
            minter: identity.minter(),
            policy,
            timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// Bounds the whole handshake (quote and verdicts included); default
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the client side of an aTLS handshake on `io` with a nonce from the system RNG.
    pub async fn connect<IO>(&self, io: IO) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let nonce = random_nonce()?;
        self.connect_with_nonce(io, nonce).await
    }

    /// As [`AtlsClient::connect`] with a caller-chosen nonce, for verifiers that derive their
    /// challenge elsewhere. The nonce must never repeat and must be unpredictable to the
    /// server, or a recorded attestation could be replayed.
    pub async fn connect_with_nonce<IO>(
        &self,
        io: IO,
        nonce: Nonce,
    ) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let result = tokio::time::timeout(self.timeout, self.connect_inner(io, nonce))
            .await
            .unwrap_or(Err(AtlsError::Timeout(self.timeout)));
        log_result(Role::Client, &result);
        result
    }

    async fn connect_inner<IO>(&self, io: IO, nonce: Nonce) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let outcome: OutcomeSlot = outcome_slot();
        let verifier = PeerVerifier::new(
            self.policy.clone(),
            Role::Server,
            nonce,
            Arc::clone(&outcome),
            PROVIDER.signature_verification_algorithms,
        );
        let client_auth = Arc::new(Mutex::new(None));
        let resolver = ClientResolver {
            minter: Arc::clone(&self.minter),
            outcome: Arc::clone(&client_auth),
        };
        let mut config = ClientConfig::builder_with_provider(Arc::clone(&PROVIDER))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(AtlsError::Config)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_client_cert_resolver(Arc::new(resolver));
        config.resumption = rustls::client::Resumption::disabled();
        config.enable_early_data = false;
        let server_name = ServerName::try_from(super::nonce::to_sni(&nonce))
            .map_err(|e| AtlsError::Config(rustls::Error::General(e.to_string())))?;

        let take_client_auth = || {
            client_auth
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        };
        let mut tls = match TlsConnector::from(Arc::new(config))
            .connect(server_name, io)
            .await
        {
            Ok(tls) => tls,
            Err(err) => {
                if let Some(Err(reason)) = take_outcome(&outcome) {
                    return Err(AtlsError::PeerRefused {
                        peer: Role::Server,
                        reason,
                    });
                }
                if let Some(ClientAuthOutcome::Failed(own)) = take_client_auth() {
                    return Err(own);
                }
                return Err(handshake_error(err));
            }
        };

        // The server's certificate was judged during the handshake.
        let own = take_outcome(&outcome).unwrap_or(Err(Refusal::Certificate(
            super::cert::CertificateError::MissingEvidence,
        )));
        write_verdict(&mut tls, own.as_ref().err()).await?;
        let peer = match own {
            Ok(peer) => peer,
            Err(reason) => {
                let _ = tls.shutdown().await;
                return Err(AtlsError::PeerRefused {
                    peer: Role::Server,
                    reason,
                });
            }
        };
        match take_client_auth() {
            // The server did not ask us to attest, so it sends no verdict.
            None => {}
            Some(ClientAuthOutcome::Failed(own)) => return Err(own),
            Some(ClientAuthOutcome::Presented) => {
                if let Verdict::Refused(reason) = read_verdict(&mut tls, Role::Server).await? {
                    return Err(AtlsError::RefusedByPeer {
                        peer: Role::Server,
                        reason,
                    });
                }
            }
        }
        Ok(AtlsStream {
            tls: tokio_rustls::TlsStream::Client(tls),
            peer: Arc::new(peer),
            #[cfg(feature = "tonic")]
            idle: None,
        })
    }
}

/// A peer's verdict on our attestation.
enum Verdict {
    Accepted,
    Refused(String),
}

async fn write_verdict<S>(tls: &mut S, refusal: Option<&Refusal>) -> Result<(), AtlsError>
where
    S: AsyncWrite + Unpin,
{
    let mut frame = VERDICT_MAGIC.to_vec();
    match refusal {
        None => frame.extend_from_slice(&[VERDICT_ACCEPTED, 0, 0]),
        Some(reason) => {
            // The whole chain: the peer has no other way to learn why.
            let mut text = crate::error_chain(reason);
            if text.len() > MAX_REASON_LEN {
                let mut cut = MAX_REASON_LEN;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            frame.push(VERDICT_REFUSED);
            // At most MAX_REASON_LEN (4096) bytes: fits in u16.
            frame.extend_from_slice(&(text.len() as u16).to_be_bytes());
            frame.extend_from_slice(text.as_bytes());
        }
    }
    let io_error = |source| AtlsError::Io {
        doing: "sending the verdict",
        source,
    };
    tls.write_all(&frame).await.map_err(io_error)?;
    tls.flush().await.map_err(io_error)
}

async fn read_verdict<S>(tls: &mut S, peer: Role) -> Result<Verdict, AtlsError>
where
    S: AsyncRead + Unpin,
{
    let mut header = [0u8; 7];
    tls.read_exact(&mut header)
        .await
        .map_err(|err| match rustls_error(&err) {
            // The peer failed the handshake after our last flight: say what its alert means.
            Some(_) => handshake_error(err),
            None => AtlsError::Io {
                doing: "waiting for the peer's verdict",
                source: err,
            },
        })?;
    if header[..4] != VERDICT_MAGIC {
        return Err(AtlsError::Protocol {
            peer,
            detail: format!(
                "expected an aTLS verdict (HWV1), received {}",
                hex::encode(&header[..4])
            ),
        });
    }
    let len = usize::from(u16::from_be_bytes([header[5], header[6]]));
    if len > MAX_REASON_LEN {
        return Err(AtlsError::Protocol {
            peer,
            detail: format!("a verdict reason of {len} bytes (at most {MAX_REASON_LEN})"),
        });
    }
    let mut reason = vec![0u8; len];
    tls.read_exact(&mut reason)
        .await
        .map_err(|source| AtlsError::Io {
            doing: "reading the peer's verdict",
            source,
        })?;
    match header[4] {
        VERDICT_ACCEPTED if len == 0 => Ok(Verdict::Accepted),
        VERDICT_REFUSED => {
            // The peer's words end up in our logs: no control characters.
            let text: String = String::from_utf8_lossy(&reason)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            Ok(Verdict::Refused(text))
        }
        status => Err(AtlsError::Protocol {
            peer,
            detail: format!("a verdict with status {status} and a {len}-byte reason"),
        }),
    }
}

fn rustls_error(err: &std::io::Error) -> Option<&rustls::Error> {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// A handshake failure with a hint at what it means in aTLS terms.
fn handshake_error(source: std::io::Error) -> AtlsError {
    let hint = match rustls_error(&source) {
        Some(rustls::Error::AlertReceived(AlertDescription::CertificateRequired)) => {
            " (the server requires the client to attest)"
        }
        Some(rustls::Error::AlertReceived(
            AlertDescription::DecodeError | AlertDescription::BadCertificate,
        )) => " (the peer cannot parse our certificate; its log says why)",
        Some(rustls::Error::AlertReceived(AlertDescription::DecryptError)) => {
            " (the peer could not verify our CertificateVerify signature)"
        }
        Some(rustls::Error::AlertReceived(
            AlertDescription::ProtocolVersion | AlertDescription::HandshakeFailure,
        ))
        | Some(rustls::Error::PeerIncompatible(_)) => {
            " (aTLS needs TLS 1.3 with ECDSA P-256 on both sides)"
        }
        Some(rustls::Error::InvalidMessage(
            InvalidMessage::HandshakePayloadTooLarge | InvalidMessage::MessageTooLarge,
        )) => " (a handshake message exceeds the TLS limit of 64 KiB: an oversized certificate)",
        Some(_) => "",
        None if source.kind() == std::io::ErrorKind::UnexpectedEof => {
            " (the peer closed the connection during the handshake; an aTLS server does so when \
             the ClientHello carries no aTLS nonce or it cannot attest: its log says why)"
        }
        None => "",
    };
    AtlsError::Handshake { source, hint }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn verdict_frames_round_trip_and_reject_garbage() {
        let (mut a, mut b) = tokio::io::duplex(8192);
        write_verdict(&mut a, None).await.expect("write");
        assert!(matches!(
            read_verdict(&mut b, Role::Client).await,
            Ok(Verdict::Accepted)
        ));

        let refusal = Refusal::Certificate(super::super::cert::CertificateError::MissingEvidence);
        write_verdict(&mut a, Some(&refusal)).await.expect("write");
        match read_verdict(&mut b, Role::Client).await {
            Ok(Verdict::Refused(text)) => assert_eq!(text, crate::error_chain(&refusal)),
            _ => panic!("expected a refusal"),
        }

        a.write_all(b"HTTP/1.1").await.expect("write");
        let err = read_verdict(&mut b, Role::Server)
            .await
            .err()
            .expect("not a verdict");
        assert!(err.to_string().contains("broke the aTLS protocol"), "{err}");

        let (mut a, mut b) = tokio::io::duplex(8192);
        a.write_all(b"HWV1\x01\x00\x05ab\ncd").await.expect("write");
        match read_verdict(&mut b, Role::Server).await {
            Ok(Verdict::Refused(text)) => assert_eq!(text, "ab cd", "control characters removed"),
            _ => panic!("expected a refusal"),
        }

        let (mut a, mut b) = tokio::io::duplex(8192);
        a.write_all(b"HWV1\x01\xff\xff").await.expect("write");
        assert!(matches!(
            read_verdict(&mut b, Role::Server).await,
            Err(AtlsError::Protocol { .. })
        ));
        let (mut a, mut b) = tokio::io::duplex(8192);
        a.write_all(b"HWV1\x00\x00\x01x").await.expect("write");
        assert!(matches!(
            read_verdict(&mut b, Role::Server).await,
            Err(AtlsError::Protocol { .. })
        ));
        drop(a);
        assert!(matches!(
            read_verdict(&mut b, Role::Server).await,
            Err(AtlsError::Io { .. })
        ));
    }
}
