//! The per-connection rustls pieces: the verifiers that run the evidence validator on the peer's
//! certificate, the client's certificate resolver that attests on demand, and the server's
//! certificate resolver.
//!
//! A verifier does not fail the handshake when the evidence is refused: it records the outcome
//! in an [`Outcome`] slot and lets the handshake finish, so that the refusal can be sent to the
//! peer as text in the verdict that follows the handshake (a TLS alert carries only a code). The
//! handshake still fails when the certificate does not parse or the peer's CertificateVerify
//! does not verify with the certificate's key: without a proven key there is nobody to talk to.
//! No stream is handed to the application unless the outcome is an acceptance (see
//! `super::handshake`).

use std::sync::{Arc, Mutex, PoisonError};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls13_signature_with_raw_key};
use rustls::pki_types::{CertificateDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError as RustlsCertificateError, DigitallySignedStruct, DistinguishedName,
    SignatureScheme,
};

use super::cert::parse_certificate;
use super::{CertificateMinter, MintedCertificate, PeerAttestation, PeerPolicy, Refusal};
use crate::evidence::{Binding, Nonce, Role};

/// The only signature scheme aTLS keys use.
const SCHEME: SignatureScheme = SignatureScheme::ECDSA_NISTP256_SHA256;

/// What the verifier concluded about the peer, shared with the code that finishes the
/// handshake.
pub(super) type OutcomeSlot = Arc<Mutex<Option<Result<PeerAttestation, Refusal>>>>;

/// A new empty outcome slot.
pub(super) fn outcome_slot() -> OutcomeSlot {
    Arc::new(Mutex::new(None))
}

/// Takes the recorded outcome.
pub(super) fn take_outcome(slot: &OutcomeSlot) -> Option<Result<PeerAttestation, Refusal>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Verifies one peer certificate against the policy, for the peer's `role` and our `nonce`.
#[derive(Debug)]
pub(super) struct PeerVerifier {
    policy: PeerPolicy,
    /// The role of the peer whose certificate this checks.
    role: Role,
    /// Our nonce, which the peer's evidence must answer.
    nonce: Nonce,
    outcome: OutcomeSlot,
    /// The certificate's key, remembered for the CertificateVerify check.
    spki: Mutex<Option<Vec<u8>>>,
    algorithms: WebPkiSupportedAlgorithms,
    /// The server's CertificateRequest hint carrying the nonce (servers only).
    hints: Vec<DistinguishedName>,
}

impl PeerVerifier {
    pub(super) fn new(
        policy: PeerPolicy,
        role: Role,
        nonce: Nonce,
        outcome: OutcomeSlot,
        algorithms: WebPkiSupportedAlgorithms,
    ) -> Self {
        let hints = match role {
            Role::Client => vec![DistinguishedName::from(
                super::nonce::to_distinguished_name(&nonce),
            )],
            Role::Server => Vec::new(),
        };
        Self {
            policy,
            role,
            nonce,
            outcome,
            spki: Mutex::new(None),
            algorithms,
            hints,
        }
    }

    fn record(&self, outcome: Result<PeerAttestation, Refusal>) {
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    }

    /// Parses and judges the peer's end-entity certificate; `Err` only when the handshake
    /// cannot go on (no usable key).
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let parsed = match parse_certificate(end_entity) {
            Ok(parsed) => parsed,
            Err(err) => {
                self.record(Err(Refusal::Certificate(err)));
                return Err(rustls::Error::InvalidCertificate(
                    RustlsCertificateError::BadEncoding,
                ));
            }
        };
        let outcome = match &self.policy {
            PeerPolicy::Unauthenticated => Ok(PeerAttestation::Unattested),
            PeerPolicy::Verify(validator) => match parsed.evidence() {
                Err(err) => Err(Refusal::Certificate(err)),
                Ok(evidence) => validator
                    .validate(
                        evidence,
                        &Binding {
                            role: self.role,
                            nonce: &self.nonce,
                            tls_spki_der: &parsed.spki_der,
                        },
                    )
                    .map(|validated| PeerAttestation::Verified(Box::new(validated)))
                    .map_err(|err| Refusal::Evidence(Box::new(err))),
            },
        };
        self.record(outcome);
        *self.spki.lock().unwrap_or_else(PoisonError::into_inner) = Some(parsed.spki_der);
        Ok(())
    }

    fn verify_signature(
        &self,
        message: &[u8],
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme != SCHEME {
            return Err(rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into());
        }
        let spki = self.spki.lock().unwrap_or_else(PoisonError::into_inner);
        let spki = spki.as_deref().ok_or(rustls::Error::InvalidCertificate(
            RustlsCertificateError::BadEncoding,
        ))?;
        verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(spki),
            dss,
            &self.algorithms,
        )
    }
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)?;
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
        _cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_signature(message, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SCHEME]
    }
}

impl ClientCertVerifier for PeerVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)?;
        Ok(ClientCertVerified::assertion())
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
        _cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_signature(message, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SCHEME]
    }
}

/// What the client's resolver did when the server asked for a certificate.
#[derive(Debug)]
pub(super) enum ClientAuthOutcome {
    /// A certificate was presented.
    Presented,
    /// The client could not attest (no nonce from the server, or minting failed).
    Failed(super::AtlsError),
}

/// The client's certificate resolver: mints an attested certificate for the server's nonce
/// when the server asks.
pub(super) struct ClientResolver {
    pub(super) minter: Arc<dyn CertificateMinter>,
    pub(super) outcome: Arc<Mutex<Option<ClientAuthOutcome>>>,
}

impl std::fmt::Debug for ClientResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientResolver").finish_non_exhaustive()
    }
}

impl ClientResolver {
    fn record(&self, outcome: ClientAuthOutcome) {
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    }
}

impl rustls::client::ResolvesClientCert for ClientResolver {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let nonce = root_hint_subjects
            .iter()
            .find_map(|dn| super::nonce::from_distinguished_name(dn));
        let Some(nonce) = nonce else {
            self.record(ClientAuthOutcome::Failed(super::AtlsError::NoServerNonce));
            return None;
        };
        // The server's nonce arrives inside the handshake and rustls asks for the certificate
        // synchronously, so the TPM quote runs here. On a multi-threaded runtime the worker
        // hands its other tasks over first; elsewhere it blocks for the quote (~10 ms).
        let minter = Arc::clone(&self.minter);
        let mint = move || minter.mint(Role::Client, Some(&nonce));
        let minted = match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(mint)
            }
            _ => mint(),
        };
        match minted {
            Ok(MintedCertificate { certified_key, .. }) => {
                self.record(ClientAuthOutcome::Presented);
                Some(certified_key)
            }
            Err(err) => {
                self.record(ClientAuthOutcome::Failed(err));
                None
            }
        }
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The server's certificate for this one connection.
#[derive(Debug)]
pub(super) struct FixedCertificate(pub(super) Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for FixedCertificate {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}
