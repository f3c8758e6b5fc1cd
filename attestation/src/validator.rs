//! The pure-Rust evidence validator: what the join service, the CLI and a node verifying its
//! peer run. No libtss2, no TPM.
//!
//! [`Validator::validate`] accepts evidence only if all of these hold, checked in this order
//! so that the first refusal is the most specific one:
//!
//! 1. it decodes, within [`MAX_EVIDENCE_LEN`], with a known version and variant, and its PCR
//!    map holds 32-byte values for PCRs 0 to 23;
//! 2. the quote is a TPM-generated quote (`TPM_GENERATED_VALUE`, `TPM_ST_ATTEST_QUOTE`) signed
//!    with ECDSA P-256/SHA-256 by the AK in the evidence, a restricted signing key that is a
//!    primary of the endorsement hierarchy (see [`crate::report`]);
//! 3. its qualifying data is the binding of this verifier's nonce, the attester's TLS key and
//!    the user data (see [`crate::evidence`]); when it is not, the unauthenticated hint fields
//!    tell a stale nonce from another TLS key for the error message;
//! 4. the AK is trusted: its certificate chains to a configured provider CA (webpki, EKU
//!    tcg-kp-AIKCertificate 2.23.133.8.3) and certifies exactly the quote's AK;
//! 5. the PCR values hash to the quoted digest, and they match the expected measurements
//!    (exact match; `warnOnly` PCRs are logged and returned as warnings).

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message as _;
use rustls_pki_types::TrustAnchor;
use rustls_pki_types::{CertificateDer, UnixTime, pem::PemObject as _};
use thiserror::Error;
use webpki::{EndEntityCert, KeyUsage};
use x509_parser::prelude::{FromDer as _, X509Certificate};

use crate::evidence::{Binding, EVIDENCE_VERSION, Evidence, MAX_EVIDENCE_LEN, Variant};
use crate::measurements::{ExpectedMeasurements, MeasurementMismatch, MeasurementWarning};
use crate::platform::{PlatformRefusal, PlatformVerified, PlatformVerifier, profile_name};
use crate::releases::{ReleaseMismatch, ReleaseSet};
use crate::report::{FieldNames, QuoteParts, VerifyError, verify_quote};
use crate::tpm_types::ClockInfo;

/// `tcg-kp-AIKCertificate` (2.23.133.8.3), DER content octets: the extended key usage an AK
/// certificate must carry (TCG EK Credential Profile).
pub const TCG_KP_AIK_CERTIFICATE: &[u8] = &[0x67, 0x81, 0x05, 0x08, 0x03];

/// The PCRs of a PC-client TPM.
const MAX_PCR: u32 = 23;

const EVIDENCE_FIELDS: FieldNames = FieldNames {
    ak_public: "ak_public",
    attest: "quote",
    signature: "signature",
};

/// Signature algorithms accepted on AK certificate chains.
static CHAIN_ALGORITHMS: &[&dyn rustls_pki_types::SignatureVerificationAlgorithm] = &[
    webpki::ring::ECDSA_P256_SHA256,
    webpki::ring::ECDSA_P384_SHA384,
    webpki::ring::ECDSA_P256_SHA384,
    webpki::ring::ECDSA_P384_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA384,
    webpki::ring::RSA_PKCS1_2048_8192_SHA512,
    webpki::ring::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
    webpki::ring::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
    webpki::ring::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
];

/// A provider CA certificate that cannot be a trust anchor.
#[derive(Debug, Error)]
pub enum AkTrustError {
    /// The PEM text holds no certificate.
    #[error("the provider CA file holds no PEM certificate")]
    NoCertificates,
    /// The PEM text does not parse.
    #[error("the provider CA file is not valid PEM")]
    Pem(#[source] rustls_pki_types::pem::Error),
    /// A certificate that webpki cannot use as an anchor.
    #[error("provider CA certificate #{index} cannot be a trust anchor")]
    Anchor {
        index: usize,
        #[source]
        source: webpki::Error,
    },
}

/// The roots an AK certificate must chain to: the provider CAs (the QEMU harness's local CA;
/// a cloud's AK CA).
#[derive(Debug, Clone)]
pub struct AkTrust {
    anchors: Vec<TrustAnchor<'static>>,
    /// A cloud platform's verifier in the provider CA's place (see [`crate::platform`]).
    platform: Option<Arc<dyn PlatformVerifier>>,
}

impl AkTrust {
    /// Trusts the given DER CA certificates.
    pub fn from_der<I, C>(certificates: I) -> Result<Self, AkTrustError>
    where
        I: IntoIterator<Item = C>,
        C: AsRef<[u8]>,
    {
        let mut anchors = Vec::new();
        for (index, der) in certificates.into_iter().enumerate() {
            let der = CertificateDer::from(der.as_ref());
            let anchor = webpki::anchor_from_trusted_cert(&der)
                .map_err(|source| AkTrustError::Anchor { index, source })?;
            anchors.push(anchor.to_owned());
        }
        if anchors.is_empty() {
            return Err(AkTrustError::NoCertificates);
        }
        Ok(Self {
            anchors,
            platform: None,
        })
    }

    /// Trusts AKs the way a cloud platform vouches for them: `verifier` checks the platform's
    /// evidence (see [`crate::platform`]), and evidence of any other variant is refused.
    pub fn platform(verifier: Arc<dyn PlatformVerifier>) -> Self {
        Self {
            anchors: Vec::new(),
            platform: Some(verifier),
        }
    }

    /// The evidence variant this trust accepts: the platform's, else QEMU's provider CA.
    pub fn variant(&self) -> Variant {
        self.platform
            .as_ref()
            .map_or(Variant::QemuVtpm, |platform| platform.variant())
    }

    /// Trusts every certificate in a PEM file's text.
    pub fn from_pem(pem: &str) -> Result<Self, AkTrustError> {
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(AkTrustError::Pem)?;
        Self::from_der(certs)
    }

    /// How many provider CA roots are trusted (0 for a platform's trust).
    pub fn len(&self) -> usize {
        self.anchors.len()
    }

    /// Whether no provider CA root is trusted (a platform's trust).
    pub fn is_empty(&self) -> bool {
        self.anchors.is_empty()
    }
}

/// A validator that cannot be built.
#[derive(Debug, Error)]
pub enum ValidatorError {
    /// Expected measurements with no enforced PCR would accept any image.
    #[error("the expected measurements enforce no PCR, so any image would be accepted")]
    NothingEnforced,
}

/// Why evidence was refused. Every variant names the field, the values, or the PCR involved.
#[derive(Debug, Error)]
pub enum EvidenceError {
    /// Evidence larger than a verifier parses.
    #[error("the evidence is {size} bytes, more than the {max} bytes a hawser verifier accepts")]
    TooLarge { size: usize, max: usize },
    /// Not a protobuf `Evidence`.
    #[error("the evidence is not a hawser Evidence protobuf")]
    Decode(#[from] prost::DecodeError),
    /// A version this verifier does not know.
    #[error("the evidence has version {found}; this verifier understands version {supported}")]
    Version { found: u32, supported: u32 },
    /// A variant this verifier does not know.
    #[error("the evidence variant is {found}, which no hawser platform profile has")]
    Variant { found: i32 },
    /// Evidence of another platform than the one this verifier trusts.
    #[error(
        "the cluster's measurements select the {expected} profile; the peer presented {found} evidence"
    )]
    Platform {
        expected: &'static str,
        found: &'static str,
    },
    /// The platform's own check refused the evidence.
    #[error(transparent)]
    PlatformRefused(#[from] PlatformRefusal),
    /// A PCR index outside 0..=23.
    #[error("pcrs_sha256 lists PCR {pcr}, but a TPM has PCRs 0 to 23")]
    PcrIndex { pcr: u32 },
    /// A PCR value that is not 32 bytes.
    #[error("pcrs_sha256[{pcr}] holds {len} bytes, a sha256 PCR holds 32")]
    PcrLength { pcr: u32, len: usize },
    /// The quote itself is invalid (malformed structure with its offset, bad signature,
    /// unsuitable AK, PCR values that do not hash to the quoted digest, …).
    #[error("the quote is invalid")]
    Quote(#[source] VerifyError),
    /// The quote answers another nonce: a replayed or stale certificate.
    #[error(
        "nonce mismatch: the evidence answers nonce {answered}, but this connection's nonce is {expected} (a replayed or stale attestation)"
    )]
    NonceMismatch { expected: String, answered: String },
    /// The quote binds another TLS key than the one the peer proved it holds.
    #[error(
        "the evidence is bound to another TLS key: it binds key hash {bound}, but the peer's certificate key hashes to {presented}"
    )]
    KeyBindingMismatch { presented: String, bound: String },
    /// The qualifying data matches neither the binding nor its hints.
    #[error(
        "the quote's qualifying data is {actual}, expected {expected} for this connection's role ({role}), nonce, TLS key and user data"
    )]
    QualifyingData {
        role: String,
        expected: String,
        actual: String,
    },
    /// No AK certificate.
    #[error("untrusted AK {ak_name}: the evidence carries no AK certificate")]
    AkCertificateMissing { ak_name: String },
    /// The AK certificate does not parse.
    #[error("untrusted AK {ak_name}: AK certificate #{index} does not parse")]
    AkCertificateParse {
        ak_name: String,
        index: usize,
        #[source]
        source: x509_parser::nom::Err<x509_parser::error::X509Error>,
    },
    /// Bytes follow the AK certificate's DER.
    #[error(
        "untrusted AK {ak_name}: AK certificate #{index} does not parse: {count} bytes follow the certificate"
    )]
    AkCertificateTrailingBytes {
        ak_name: String,
        index: usize,
        count: usize,
    },
    /// The AK certificate does not chain to a provider CA.
    #[error(
        "untrusted AK {ak_name}: its certificate (subject \"{subject}\", issuer \"{issuer}\") does not chain to a configured provider CA{gloss}"
    )]
    AkUntrusted {
        ak_name: String,
        subject: String,
        issuer: String,
        /// What webpki's error means to an operator (empty, or `: ` and a phrase).
        gloss: &'static str,
        #[source]
        source: Box<webpki::Error>,
    },
    /// The AK certificate certifies another key.
    #[error(
        "untrusted AK {ak_name}: the AK certificate (subject \"{subject}\") certifies another key ({certified}), not the AK that signed the quote"
    )]
    AkCertificateKeyMismatch {
        ak_name: String,
        subject: String,
        certified: String,
    },
    /// Enforced PCRs differ from the expected measurements.
    #[error(transparent)]
    Measurements(#[from] MeasurementMismatch),
    /// The measurements match no accepted release (or a retired one).
    #[error(transparent)]
    Release(ReleaseMismatch),
}

impl From<ReleaseMismatch> for EvidenceError {
    fn from(mismatch: ReleaseMismatch) -> Self {
        match mismatch {
            ReleaseMismatch::Single(mismatch) => EvidenceError::Measurements(mismatch),
            other => EvidenceError::Release(other),
        }
    }
}

/// What accepted evidence proves about its issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedEvidence {
    /// The platform variant.
    pub variant: Variant,
    /// The AK's TPM name (`000b || SHA256(TPMT_PUBLIC)`): a stable identity of the node's TPM.
    pub ak_name: Vec<u8>,
    /// The AK certificate's subject, as the provider wrote it.
    pub ak_certificate_subject: String,
    /// The quoted sha256 PCR values.
    pub pcrs: BTreeMap<u8, [u8; 32]>,
    /// `warnOnly` PCRs that differ from their expectation.
    pub warnings: Vec<MeasurementWarning>,
    /// The user data the quote binds.
    pub user_data: Vec<u8>,
    /// The TPM's clock, reset and restart counters when it signed.
    pub clock_info: ClockInfo,
    /// The TPM's firmware version.
    pub firmware_version: u64,
}

/// Checks evidence against expected measurements and an AK trust root (see the module docs).
#[derive(Debug, Clone)]
pub struct Validator {
    releases: ReleaseSet,
    ak_trust: AkTrust,
}

impl Validator {
    /// A validator for `measurements` (at least one PCR enforced) and AKs certified under
    /// `ak_trust`.
    pub fn new(
        measurements: ExpectedMeasurements,
        ak_trust: AkTrust,
    ) -> Result<Self, ValidatorError> {
        Self::for_releases(ReleaseSet::single("", measurements), ak_trust)
    }

    /// A validator that accepts a quote matching any accepted release of `releases` (each
    /// enforcing at least one PCR), and refuses one of a retired release by name.
    pub fn for_releases(releases: ReleaseSet, ak_trust: AkTrust) -> Result<Self, ValidatorError> {
        if !releases.enforces_something() {
            return Err(ValidatorError::NothingEnforced);
        }
        Ok(Self { releases, ak_trust })
    }

    /// The expected measurements (of the first accepted release).
    pub fn measurements(&self) -> &ExpectedMeasurements {
        &self.releases.accepted()[0].measurements
    }

    /// The releases this validator accepts and refuses.
    pub fn releases(&self) -> &ReleaseSet {
        &self.releases
    }

    /// Decodes and validates encoded evidence for `binding`.
    pub fn validate(
        &self,
        evidence: &[u8],
        binding: &Binding<'_>,
    ) -> Result<ValidatedEvidence, EvidenceError> {
        if evidence.len() > MAX_EVIDENCE_LEN {
            return Err(EvidenceError::TooLarge {
                size: evidence.len(),
                max: MAX_EVIDENCE_LEN,
            });
        }
        let evidence = Evidence::decode(evidence)?;
        self.validate_decoded(&evidence, binding)
    }

    /// Validates decoded evidence for `binding`.
    pub fn validate_decoded(
        &self,
        evidence: &Evidence,
        binding: &Binding<'_>,
    ) -> Result<ValidatedEvidence, EvidenceError> {
        if evidence.version != EVIDENCE_VERSION {
            return Err(EvidenceError::Version {
                found: evidence.version,
                supported: EVIDENCE_VERSION,
            });
        }
        let variant = match Variant::try_from(evidence.variant) {
            Ok(Variant::Unspecified) | Err(_) => {
                return Err(EvidenceError::Variant {
                    found: evidence.variant,
                });
            }
            Ok(variant) => variant,
        };
        let expected = self.ak_trust.variant();
        if variant != expected {
            return Err(EvidenceError::Platform {
                expected: profile_name(expected),
                found: profile_name(variant),
            });
        }
        let mut pcrs = BTreeMap::new();
        for (&pcr, value) in &evidence.pcrs_sha256 {
            let index = u8::try_from(pcr)
                .ok()
                .filter(|&p| u32::from(p) <= MAX_PCR)
                .ok_or(EvidenceError::PcrIndex { pcr })?;
            let value: [u8; 32] =
                value
                    .as_slice()
                    .try_into()
                    .map_err(|_| EvidenceError::PcrLength {
                        pcr,
                        len: value.len(),
                    })?;
            pcrs.insert(index, value);
        }
        let selection: Vec<u8> = pcrs.keys().copied().collect();

        let qualifying_data = binding.qualifying_data(&evidence.user_data);
        if let Some(platform) = &self.ak_trust.platform {
            let verified = platform.verify(evidence, &qualifying_data)?;
            return self.judge_platform(variant, verified, evidence);
        }
        let quote = verify_quote(
            QuoteParts {
                ak_public: &evidence.ak_public,
                attest: &evidence.quote,
                signature: &evidence.signature,
            },
            &EVIDENCE_FIELDS,
            &selection,
            &qualifying_data,
        )
        .map_err(|err| match err {
            VerifyError::UnexpectedNonce { expected, actual } => {
                binding_error(evidence, binding, expected, actual)
            }
            other => EvidenceError::Quote(other),
        })?;
        let ak_name = hex::encode(&quote.ak_name);

        let ak_certificate_subject =
            self.check_ak_certificate(evidence, &ak_name, &quote.ak_public_point)?;

        quote.check_pcrs(&pcrs).map_err(EvidenceError::Quote)?;
        let (_, warnings) = self.releases.check(&pcrs)?;
        for warning in &warnings {
            tracing::warn!(ak = %ak_name, %warning, "accepting evidence despite a warnOnly PCR difference");
        }

        Ok(ValidatedEvidence {
            variant,
            ak_name: quote.ak_name,
            ak_certificate_subject,
            pcrs,
            warnings,
            user_data: evidence.user_data.clone(),
            clock_info: quote.clock_info,
            firmware_version: quote.firmware_version,
        })
    }

    /// The measurements of evidence a platform verified.
    fn judge_platform(
        &self,
        variant: Variant,
        verified: PlatformVerified,
        evidence: &Evidence,
    ) -> Result<ValidatedEvidence, EvidenceError> {
        let (_, warnings) = self.releases.check(&verified.pcrs)?;
        let ak_name = hex::encode(&verified.ak_name);
        for warning in &warnings {
            tracing::warn!(ak = %ak_name, %warning, "accepting evidence despite a warnOnly PCR difference");
        }
        Ok(ValidatedEvidence {
            variant,
            ak_name: verified.ak_name,
            ak_certificate_subject: verified.ak_certificate_subject,
            pcrs: verified.pcrs,
            warnings,
            user_data: evidence.user_data.clone(),
            clock_info: verified.clock_info,
            firmware_version: verified.firmware_version,
        })
    }

    /// Checks the AK certificate chain and that it certifies `ak_point`; returns the subject.
    fn check_ak_certificate(
        &self,
        evidence: &Evidence,
        ak_name: &str,
        ak_point: &[u8; 65],
    ) -> Result<String, EvidenceError> {
        let Some((leaf, intermediates)) = evidence.ak_cert_chain.split_first() else {
            return Err(EvidenceError::AkCertificateMissing {
                ak_name: ak_name.to_string(),
            });
        };
        let (rest, parsed) = X509Certificate::from_der(leaf).map_err(|source| {
            EvidenceError::AkCertificateParse {
                ak_name: ak_name.to_string(),
                index: 0,
                source,
            }
        })?;
        if !rest.is_empty() {
            return Err(EvidenceError::AkCertificateTrailingBytes {
                ak_name: ak_name.to_string(),
                index: 0,
                count: rest.len(),
            });
        }
        let subject = parsed.subject().to_string();
        let issuer = parsed.issuer().to_string();

        let leaf_der = CertificateDer::from(leaf.as_slice());
        let intermediates: Vec<CertificateDer<'_>> = intermediates
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        let untrusted = |source: webpki::Error| EvidenceError::AkUntrusted {
            ak_name: ak_name.to_string(),
            subject: subject.clone(),
            issuer: issuer.clone(),
            gloss: gloss(&source),
            source: Box::new(source),
        };
        let end_entity = EndEntityCert::try_from(&leaf_der).map_err(untrusted)?;
        end_entity
            .verify_for_usage(
                CHAIN_ALGORITHMS,
                &self.ak_trust.anchors,
                &intermediates,
                UnixTime::now(),
                KeyUsage::required(TCG_KP_AIK_CERTIFICATE),
                None,
                None,
            )
            .map_err(untrusted)?;

        let certified = certified_p256_point(&parsed);
        if certified.as_ref() != Some(ak_point) {
            let certified = match certified {
                Some(point) => format!("P-256 point {}", hex::encode(point)),
                None => format!(
                    "a {} key",
                    parsed.public_key().algorithm.algorithm.to_id_string()
                ),
            };
            return Err(EvidenceError::AkCertificateKeyMismatch {
                ak_name: ak_name.to_string(),
                subject,
                certified,
            });
        }
        Ok(subject)
    }
}

/// The refusal for qualifying data that differs from the binding, as specific as the
/// (unauthenticated) hint fields allow.
fn binding_error(
    evidence: &Evidence,
    binding: &Binding<'_>,
    expected: String,
    actual: String,
) -> EvidenceError {
    if !evidence.nonce.is_empty() && evidence.nonce.as_slice() != binding.nonce.as_slice() {
        return EvidenceError::NonceMismatch {
            expected: hex::encode(binding.nonce),
            answered: hex::encode(&evidence.nonce),
        };
    }
    let presented = binding.tls_key_hash();
    if !evidence.tls_key_hash.is_empty() && evidence.tls_key_hash.as_slice() != presented {
        return EvidenceError::KeyBindingMismatch {
            presented: hex::encode(presented),
            bound: hex::encode(&evidence.tls_key_hash),
        };
    }
    EvidenceError::QualifyingData {
        role: binding.role.to_string(),
        expected,
        actual,
    }
}

#[cfg(feature = "tpm")]
/// The key a DER certificate certifies as an uncompressed P-256 point, if it parses and is one.
pub(crate) fn certified_p256_point_of(der: &[u8]) -> Option<[u8; 65]> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    certified_p256_point(&cert)
}

/// The certificate's key as an uncompressed P-256 point, if it is an id-ecPublicKey on P-256.
fn certified_p256_point(cert: &X509Certificate<'_>) -> Option<[u8; 65]> {
    use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
    let spki = cert.public_key();
    if spki.algorithm.algorithm != OID_KEY_TYPE_EC_PUBLIC_KEY {
        return None;
    }
    let curve = spki.algorithm.parameters.as_ref()?.as_oid().ok()?;
    if curve != OID_EC_P256 {
        return None;
    }
    let key = p256::PublicKey::from_sec1_bytes(&spki.subject_public_key.data).ok()?;
    let encoded = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&key, false);
    encoded.as_bytes().try_into().ok()
}

/// A gloss (`: ` and a phrase) for the webpki errors an operator meets; webpki's own error
/// follows it in the chain.
fn gloss(err: &webpki::Error) -> &'static str {
    match err {
        webpki::Error::UnknownIssuer => ": no chain to a provider CA",
        webpki::Error::CertExpired { .. } => ": the certificate has expired",
        webpki::Error::CertNotValidYet { .. } => ": the certificate is not valid yet",
        webpki::Error::RequiredEkuNotFoundContext(_) => {
            ": the certificate lacks the tcg-kp-AIKCertificate extended key usage"
        }
        webpki::Error::InvalidSignatureForPublicKey => ": a signature in the chain is invalid",
        webpki::Error::CaUsedAsEndEntity => ": a CA certificate is used as the AK certificate",
        webpki::Error::BadDer | webpki::Error::BadDerTime => ": malformed DER",
        _ => "",
    }
}

#[cfg(test)]
mod tests;
