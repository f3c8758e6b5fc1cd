//! Attested TLS (aTLS) on rustls: TLS 1.3 in which either side, or both, prove with TPM
//! evidence which image they booted, bound to this very connection.
//!
//! # Protocol
//!
//! ```text
//! client                                                    server
//!   | ClientHello, SNI = <hex nonce_c>.atls-nonce.hawser.invalid |
//!   |----------------------------------------------------------->|  quote(nonce_c, H(spki_s))
//!   |   ServerHello, {CertificateRequest: CAs = [DN(nonce_s)]},  |  fresh key, self-signed cert
//!   |   {Certificate: cert_s + evidence ext}, {CertificateVerify}|  with the evidence extension
//!   |<-----------------------------------------------------------|
//!   | validate(evidence_s, nonce_c, spki_s)                      |
//!   | quote(nonce_s, H(spki_c)), fresh key, cert_c               |
//!   | {Certificate: cert_c + evidence ext}, {CertificateVerify}, |
//!   | {Finished}, verdict(client's judgement of the server)      |
//!   |----------------------------------------------------------->| validate(evidence_c, nonce_s, spki_c)
//!   |                 verdict(server's judgement of the client)  |
//!   |<-----------------------------------------------------------|
//!   | application data (gRPC) in both directions                 |
//! ```
//!
//! - TLS 1.3 only, one cipher-suite provider (ring), ECDSA P-256 only; no session tickets, no
//!   resumption, no 0-RTT: a resumed session would skip the certificates and with them the
//!   attestation.
//! - Each side that attests makes a fresh P-256 key and a self-signed certificate for every
//!   connection ([`cert`]), with the evidence (protobuf, [`crate::evidence`]) in a
//!   non-critical extension `2.25.<uuid>.1`. The quote's qualifying data binds the peer's nonce
//!   and the hash of that key; the handshake's CertificateVerify proves possession of the key.
//! - Nonces ([`nonce`]): the client's in the ClientHello's SNI, the server's in the
//!   CertificateRequest's certificate_authorities. Both come from the system RNG.
//! - The verdict: a TLS alert carries a code, not a reason, so the side that verifies lets the
//!   handshake complete and then sends one frame saying "accepted" or "refused: `<reason>`"
//!   (`HWV1`, status byte, u16 length, UTF-8 reason). The client always sends one (about the
//!   server, or "accepted" if it does not verify); the server sends one when it asked for the
//!   client's certificate. Nothing reaches the application before both verdicts are known, and
//!   a refusal ends the connection: [`AtlsServer::accept`] and [`AtlsClient::connect`] return
//!   an error that says why, on both sides, and log it.
//!
//! Modes: *server attests* (server [`Identity::Attested`], client [`PeerPolicy::Verify`]),
//! *client attests* (the reverse), *mutual* (both). [`PeerPolicy::Unauthenticated`] still
//! checks that the peer holds its certificate's key, and nothing else.
//!
//! With feature `tonic`, [`AtlsServer::incoming`] and [`AtlsClient::connector`] make these
//! connections the transport of a tonic server and channel, within the pre-authentication
//! [`limits`] (handshakes per source and in total, quote rate, idle connections).

pub mod cert;
mod handshake;
#[cfg(feature = "tonic")]
mod idle;
pub mod limits;
#[cfg(feature = "tonic")]
mod net;
pub mod nonce;
mod verify;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use thiserror::Error;

pub use cert::{
    ATLS_OID_ARC, CertificateError, EVIDENCE_EXTENSION_OID, MintError, NONCE_ATTRIBUTE_OID,
    ParsedCertificate, TlsKey, encode_evidence_extension, parse_certificate,
};
pub use handshake::{AtlsClient, AtlsServer, AtlsStream};
pub use limits::{ConnectionLimits, QuotePacer};
#[cfg(feature = "tonic")]
pub use net::{
    AtlsConnectInfo, AtlsConnector, AtlsIncoming, CallTracking, CallTrackingService, TrackedBody,
    incoming_from, incoming_queued_from,
};

use crate::evidence::{EvidenceIssuer, MAX_EVIDENCE_LEN, Nonce, Role};
use crate::validator::{EvidenceError, ValidatedEvidence, Validator};

/// How long a handshake, including the quote and the verdicts, may take by default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The crypto provider of every aTLS connection: rustls' ring provider, TLS 1.3 suites only.
pub(crate) static PROVIDER: LazyLock<Arc<CryptoProvider>> = LazyLock::new(|| {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .retain(|suite| suite.version() == &rustls::version::TLS13);
    Arc::new(provider)
});

/// What the peer proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAttestation {
    /// Its evidence was validated.
    Verified(Box<ValidatedEvidence>),
    /// It was not asked to attest ([`PeerPolicy::Unauthenticated`]).
    Unattested,
}

impl PeerAttestation {
    /// The validated evidence, if the peer attested.
    pub fn evidence(&self) -> Option<&ValidatedEvidence> {
        match self {
            PeerAttestation::Verified(evidence) => Some(evidence),
            PeerAttestation::Unattested => None,
        }
    }
}

/// Why we refused the peer's attestation.
#[derive(Debug, Error)]
pub enum Refusal {
    /// Its certificate is unusable or carries no evidence.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// Its evidence was refused.
    #[error(transparent)]
    Evidence(Box<EvidenceError>),
}

/// An aTLS connection that did not come about.
#[derive(Debug, Error)]
pub enum AtlsError {
    /// We refused the peer's attestation (the peer was told why).
    #[error("refused the {peer}'s attestation")]
    PeerRefused {
        peer: Role,
        #[source]
        reason: Refusal,
    },
    /// The peer refused our attestation and said why.
    #[error("the {peer} refused our attestation: {reason}")]
    RefusedByPeer { peer: Role, reason: String },
    /// The TLS handshake failed.
    #[error("the aTLS handshake failed{hint}")]
    Handshake {
        #[source]
        source: std::io::Error,
        /// What the failure means in aTLS terms (empty, or ` (` and a phrase and `)`).
        hint: &'static str,
    },
    /// The TCP connection could not be made.
    #[error("cannot connect to {target}")]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
    /// The connection's I/O failed after the handshake.
    #[error("aTLS connection I/O failed while {doing}")]
    Io {
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Too many handshakes already wait for a quote: refused before any TPM work.
    #[error(
        "refused before quoting: {queued} handshakes already wait for a TPM quote (the client may retry later)"
    )]
    QuoteQueueFull { queued: usize },
    /// The handshake (with quote and verdicts) took too long.
    #[error("the aTLS handshake did not complete within {0:?}")]
    Timeout(Duration),
    /// The ClientHello carried no aTLS nonce, so the server cannot attest.
    #[error(
        "the client sent no aTLS nonce (expected SNI <hex>.<hex>.{suffix}, got {sni:?}): is it an aTLS client?",
        suffix = nonce::SNI_SUFFIX
    )]
    NoClientNonce { sni: Option<String> },
    /// The server asked for a client certificate without an aTLS nonce.
    #[error(
        "the server asked for a client certificate without an aTLS nonce in certificate_authorities: is it an aTLS server?"
    )]
    NoServerNonce,
    /// Our own evidence could not be produced.
    #[error(transparent)]
    Issue(#[from] crate::evidence::IssueError),
    /// Our own key or certificate could not be made.
    #[error(transparent)]
    Mint(#[from] MintError),
    /// The peer spoke something else than the aTLS verdict after the handshake.
    #[error("the {peer} broke the aTLS protocol: {detail}")]
    Protocol { peer: Role, detail: String },
    /// rustls refused the configuration.
    #[error("cannot configure TLS")]
    Config(#[source] rustls::Error),
    /// A blocking task panicked or was cancelled.
    #[error("the attestation task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// A certificate and key for one connection.
#[derive(Clone)]
pub struct MintedCertificate {
    /// The DER certificate.
    pub certificate: Vec<u8>,
    /// The certificate with its signing key, as rustls uses it.
    pub certified_key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for MintedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MintedCertificate")
            .field("certificate_len", &self.certificate.len())
            .finish_non_exhaustive()
    }
}

impl MintedCertificate {
    /// Wraps a certificate and the key it certifies.
    pub fn new(key: &TlsKey, certificate: Vec<u8>) -> Self {
        let certified_key = Arc::new(CertifiedKey::new(
            vec![rustls::pki_types::CertificateDer::from(certificate.clone())],
            Arc::clone(key.signing_key()),
        ));
        Self {
            certificate,
            certified_key,
        }
    }

    /// A fresh key and a certificate carrying evidence from `issuer` for `role`, answering
    /// `nonce` and binding `user_data`.
    pub fn attested(
        role: Role,
        nonce: &Nonce,
        issuer: &dyn EvidenceIssuer,
        user_data: &[u8],
    ) -> Result<Self, AtlsError> {
        let key = TlsKey::generate()?;
        let binding = crate::evidence::Binding {
            role,
            nonce,
            tls_spki_der: key.spki_der(),
        };
        let evidence = issuer.issue(&binding, user_data)?;
        let encoded = prost::Message::encode_to_vec(&evidence);
        if encoded.len() > MAX_EVIDENCE_LEN {
            return Err(MintError::EvidenceTooLarge {
                size: encoded.len(),
                max: MAX_EVIDENCE_LEN,
            }
            .into());
        }
        let certificate =
            key.self_signed_certificate(Some(&encode_evidence_extension(&encoded)))?;
        Ok(Self::new(&key, certificate))
    }

    /// A fresh key and a certificate without evidence.
    pub fn unattested() -> Result<Self, AtlsError> {
        let key = TlsKey::generate()?;
        let certificate = key.self_signed_certificate(None)?;
        Ok(Self::new(&key, certificate))
    }
}

/// Makes the certificate one side presents on one connection. [`Identity`] covers the usual
/// cases; implement this to present something else (tests present stale or malformed
/// certificates this way; a benchmark presents pre-made ones).
pub trait CertificateMinter: Send + Sync {
    /// A certificate for `role` answering the peer's `nonce` (`None` if the peer sent none).
    /// Blocking (it may quote with a TPM).
    fn mint(&self, role: Role, nonce: Option<&Nonce>) -> Result<MintedCertificate, AtlsError>;
}

/// What a side presents.
#[derive(Clone)]
pub enum Identity {
    /// Attest: evidence from the issuer, binding the user data.
    Attested {
        /// The evidence issuer (a `TpmIssuer` in a node).
        issuer: Arc<dyn EvidenceIssuer>,
        /// Application data the quote binds (may be empty).
        user_data: Arc<[u8]>,
    },
    /// Do not attest: a plain self-signed certificate with a fresh key.
    Unattested,
    /// Whatever the minter makes.
    Custom(Arc<dyn CertificateMinter>),
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Attested { user_data, .. } => f
                .debug_struct("Attested")
                .field("user_data_len", &user_data.len())
                .finish_non_exhaustive(),
            Identity::Unattested => f.write_str("Unattested"),
            Identity::Custom(_) => f.write_str("Custom"),
        }
    }
}

impl Identity {
    /// Attest with `issuer` and no user data.
    pub fn attested(issuer: Arc<dyn EvidenceIssuer>) -> Self {
        Identity::Attested {
            issuer,
            user_data: Arc::from(&[][..]),
        }
    }

    fn minter(&self) -> Arc<dyn CertificateMinter> {
        Arc::new(IdentityMinter(self.clone()))
    }

    fn attests(&self) -> bool {
        !matches!(self, Identity::Unattested)
    }
}

struct IdentityMinter(Identity);

impl CertificateMinter for IdentityMinter {
    fn mint(&self, role: Role, nonce: Option<&Nonce>) -> Result<MintedCertificate, AtlsError> {
        match &self.0 {
            Identity::Attested { issuer, user_data } => {
                let nonce = nonce.ok_or(match role {
                    Role::Server => AtlsError::NoClientNonce { sni: None },
                    Role::Client => AtlsError::NoServerNonce,
                })?;
                MintedCertificate::attested(role, nonce, issuer.as_ref(), user_data)
            }
            Identity::Unattested => MintedCertificate::unattested(),
            Identity::Custom(minter) => minter.mint(role, nonce),
        }
    }
}

/// What a side requires of its peer.
#[derive(Debug, Clone)]
pub enum PeerPolicy {
    /// The peer must present evidence this validator accepts.
    Verify(Arc<Validator>),
    /// The peer need not attest; it only proves it holds its certificate's key. Nothing about
    /// its identity is established.
    Unauthenticated,
}
