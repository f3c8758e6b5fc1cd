//! The aTLS certificate: a fresh P-256 key per connection and a self-signed X.509 v3
//! certificate that carries the evidence in one non-critical extension.
//!
//! The certificate is written here with a few lines of DER rather than with a certificate
//! library: the extension's OID has a 128-bit arc (`2.25.<uuid>`), which rcgen's `u64` OID
//! arcs cannot express, and the structure is fixed. Its validity period is meaningless (freshness
//! comes from the nonce), so it spans 1970 to 9999, and the issuer and subject are both
//! `CN=hawser aTLS`.
//!
//! ```text
//! Extension ::= SEQUENCE {
//!     extnID      2.25.259585599674992434533360243935770434412.1,
//!     critical    FALSE (omitted),
//!     extnValue   OCTET STRING (DER of: OCTET STRING <protobuf Evidence>) }
//! ```

use std::sync::Arc;

use rustls::SignatureScheme;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::SigningKey;
use thiserror::Error;
use x509_parser::prelude::{FromDer as _, X509Certificate};
use zeroize::Zeroizing;

/// The arc under which hawser's aTLS object identifiers live: `2.25.<uuid>` with the UUID
/// c34a5e32-4571-4382-9104-34c2ce89db6c (ITU-T X.667: no registration needed, no collision).
pub const ATLS_OID_ARC: &str = "2.25.259585599674992434533360243935770434412";

/// The evidence extension's OID, `ATLS_OID_ARC.1`.
pub const EVIDENCE_EXTENSION_OID: &str = "2.25.259585599674992434533360243935770434412.1";

/// The nonce attribute's OID in the CertificateRequest's certificate_authorities,
/// `ATLS_OID_ARC.2`.
pub const NONCE_ATTRIBUTE_OID: &str = "2.25.259585599674992434533360243935770434412.2";

/// DER content octets of [`EVIDENCE_EXTENSION_OID`] (a unit test derives them from the text).
pub(crate) const EVIDENCE_OID_BYTES: [u8; 21] = [
    0x69, 0x83, 0x86, 0xca, 0xaf, 0x8c, 0xc8, 0xd7, 0x8a, 0x8e, 0x85, 0x91, 0x82, 0x8d, 0x98, 0xac,
    0xf4, 0xa7, 0xb6, 0x6c, 0x01,
];

/// DER content octets of [`NONCE_ATTRIBUTE_OID`].
pub(crate) const NONCE_OID_BYTES: [u8; 21] = [
    0x69, 0x83, 0x86, 0xca, 0xaf, 0x8c, 0xc8, 0xd7, 0x8a, 0x8e, 0x85, 0x91, 0x82, 0x8d, 0x98, 0xac,
    0xf4, 0xa7, 0xb6, 0x6c, 0x02,
];

/// `SubjectPublicKeyInfo` of a P-256 key up to the point: SEQUENCE { SEQUENCE { id-ecPublicKey,
/// prime256v1 }, BIT STRING (66 bytes: 0 unused bits, then the uncompressed point) }.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// AlgorithmIdentifier ecdsa-with-SHA256 (1.2.840.10045.4.3.2), no parameters.
const ECDSA_WITH_SHA256: [u8; 12] = [
    0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02,
];

/// Name `CN=hawser aTLS`.
const NAME: [u8; 24] = [
    0x30, 0x16, 0x31, 0x14, 0x30, 0x12, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x0b, b'h', b'a', b'w',
    b's', b'e', b'r', b' ', b'a', b'T', b'L', b'S',
];

/// Validity 1970-01-01 to 9999-12-31 (UTCTime, GeneralizedTime as RFC 5280 prescribes).
const VALIDITY: [u8; 34] = [
    0x30, 0x20, 0x17, 0x0d, b'7', b'0', b'0', b'1', b'0', b'1', b'0', b'0', b'0', b'0', b'0', b'0',
    b'Z', 0x18, 0x0f, b'9', b'9', b'9', b'9', b'1', b'2', b'3', b'1', b'2', b'3', b'5', b'9', b'5',
    b'9', b'Z',
];

/// A problem with a peer's aTLS certificate.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CertificateError {
    /// Not an X.509 certificate.
    #[error("the certificate does not parse as X.509")]
    X509(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// Bytes after the certificate.
    #[error("{count} bytes follow the certificate's DER")]
    TrailingBytes { count: usize },
    /// No evidence extension.
    #[error("the certificate carries no evidence extension ({EVIDENCE_EXTENSION_OID})")]
    MissingEvidence,
    /// The evidence extension's value is not one DER OCTET STRING.
    #[error("the evidence extension's value is malformed at offset {offset}: {reason}")]
    EvidenceEncoding { offset: usize, reason: &'static str },
}

/// A failure to make our own certificate.
#[derive(Debug, Error)]
pub enum MintError {
    /// The system RNG failed.
    #[error("the system random number generator failed")]
    Random,
    /// rustls could not load the key.
    #[error("cannot set up the TLS key")]
    Key(#[source] rustls::Error),
    /// The loaded key offers no ECDSA P-256 SHA-256 signer.
    #[error("cannot set up the TLS key: it cannot sign ECDSA P-256 SHA-256")]
    NoSigner,
    /// Signing the certificate failed.
    #[error("cannot sign the aTLS certificate")]
    Sign(#[source] rustls::Error),
    /// Evidence larger than a verifier accepts.
    #[error("the evidence is {size} bytes, more than the {max} bytes a verifier accepts")]
    EvidenceTooLarge { size: usize, max: usize },
}

/// A fresh ECDSA P-256 key for one connection. The private scalar lives in the signing key
/// only (ring's, which does not zeroize it when dropped); the PKCS#8 encoding made on the way
/// is zeroized.
pub struct TlsKey {
    signing_key: Arc<dyn SigningKey>,
    spki_der: Vec<u8>,
}

impl std::fmt::Debug for TlsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsKey")
            .field("spki_der", &hex::encode(&self.spki_der))
            .finish_non_exhaustive()
    }
}

impl TlsKey {
    /// Generates a key from the system RNG (ring: its P-256 arithmetic is several times faster
    /// than a pure-Rust one, and every aTLS connection makes a key on both ends).
    pub fn generate() -> Result<Self, MintError> {
        let rng = ring::rand::SystemRandom::new();
        let document = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &rng,
        )
        .map_err(|_| MintError::Random)?;
        let pkcs8 = Zeroizing::new(document.as_ref().to_vec());
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.as_slice()));
        let signing_key =
            rustls::crypto::ring::sign::any_ecdsa_type(&der).map_err(MintError::Key)?;
        let spki_der = signing_key
            .public_key()
            .map(|spki| spki.as_ref().to_vec())
            .filter(|spki| {
                spki.len() == P256_SPKI_PREFIX.len() + 65 && spki.starts_with(&P256_SPKI_PREFIX)
            })
            .ok_or(MintError::NoSigner)?;
        Ok(Self {
            signing_key,
            spki_der,
        })
    }

    /// The DER `SubjectPublicKeyInfo` (what the evidence binds).
    pub fn spki_der(&self) -> &[u8] {
        &self.spki_der
    }

    /// The rustls signing key.
    pub fn signing_key(&self) -> &Arc<dyn SigningKey> {
        &self.signing_key
    }

    /// A self-signed certificate for this key carrying `extension_value` (the evidence
    /// extension's raw `extnValue` content) if given. [`encode_evidence_extension`] makes the
    /// value from encoded evidence; tests pass anything.
    pub fn self_signed_certificate(
        &self,
        extension_value: Option<&[u8]>,
    ) -> Result<Vec<u8>, MintError> {
        let rng = ring::rand::SystemRandom::new();
        let mut serial = [0u8; 16];
        ring::rand::SecureRandom::fill(&rng, &mut serial).map_err(|_| MintError::Random)?;
        serial[0] &= 0x7f; // a positive INTEGER
        serial[0] |= 0x01; // and minimal (no leading zero byte)

        let mut tbs = Vec::with_capacity(512 + extension_value.map_or(0, <[u8]>::len));
        tbs.extend_from_slice(&[0xa0, 0x03, 0x02, 0x01, 0x02]); // [0] version v3
        tbs.extend(tlv(0x02, &serial));
        tbs.extend_from_slice(&ECDSA_WITH_SHA256);
        tbs.extend_from_slice(&NAME);
        tbs.extend_from_slice(&VALIDITY);
        tbs.extend_from_slice(&NAME);
        tbs.extend_from_slice(&self.spki_der);
        if let Some(value) = extension_value {
            let mut extension = tlv(0x06, &EVIDENCE_OID_BYTES);
            extension.extend(tlv(0x04, value));
            let extensions = tlv(0x30, &tlv(0x30, &extension));
            tbs.extend(tlv(0xa3, &extensions));
        }
        let tbs = tlv(0x30, &tbs);

        let signer = self
            .signing_key
            .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
            .ok_or(MintError::NoSigner)?;
        let signature = signer.sign(&tbs).map_err(MintError::Sign)?;
        let mut bit_string = vec![0x00];
        bit_string.extend_from_slice(&signature);

        let mut certificate = tbs;
        certificate.extend_from_slice(&ECDSA_WITH_SHA256);
        certificate.extend(tlv(0x03, &bit_string));
        Ok(tlv(0x30, &certificate))
    }
}

/// The evidence extension's `extnValue` content for encoded evidence: a DER OCTET STRING.
pub fn encode_evidence_extension(evidence: &[u8]) -> Vec<u8> {
    tlv(0x04, evidence)
}

/// What a verifier needs from a peer's aTLS certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCertificate {
    /// The DER `SubjectPublicKeyInfo` (the key the handshake's CertificateVerify is checked
    /// with and the evidence must bind).
    pub spki_der: Vec<u8>,
    /// The evidence extension's raw `extnValue` content, if the certificate has the extension.
    pub evidence_extension: Option<Vec<u8>>,
}

impl ParsedCertificate {
    /// The encoded evidence in the extension.
    pub fn evidence(&self) -> Result<&[u8], CertificateError> {
        let value = self
            .evidence_extension
            .as_deref()
            .ok_or(CertificateError::MissingEvidence)?;
        octet_string_content(value)
    }
}

/// Parses a peer's certificate: its key and, if present, its evidence extension. A certificate
/// with the extension twice is refused by the X.509 parser.
pub fn parse_certificate(der: &[u8]) -> Result<ParsedCertificate, CertificateError> {
    let (rest, cert) = X509Certificate::from_der(der).map_err(CertificateError::X509)?;
    if !rest.is_empty() {
        return Err(CertificateError::TrailingBytes { count: rest.len() });
    }
    let spki_der = cert.public_key().raw.to_vec();
    let evidence_extension = cert
        .extensions()
        .iter()
        .find(|ext| ext.oid.as_bytes() == EVIDENCE_OID_BYTES)
        .map(|ext| ext.value.to_vec());
    Ok(ParsedCertificate {
        spki_der,
        evidence_extension,
    })
}

/// The content of `der` if it is exactly one DER OCTET STRING.
fn octet_string_content(der: &[u8]) -> Result<&[u8], CertificateError> {
    let err = |offset, reason| CertificateError::EvidenceEncoding { offset, reason };
    match der.first() {
        Some(0x04) => {}
        Some(_) => return Err(err(0, "expected an OCTET STRING (tag 0x04)")),
        None => return Err(err(0, "the value is empty")),
    }
    let first = *der.get(1).ok_or(err(1, "the length is missing"))?;
    let (header, len) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 3 {
            return Err(err(1, "the length is indefinite or absurdly long"));
        }
        let bytes = der
            .get(2..2 + count)
            .ok_or(err(2, "the length is truncated"))?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        if bytes[0] == 0 || len < 0x80 {
            return Err(err(1, "the length is not minimally encoded (not DER)"));
        }
        (2 + count, len)
    };
    let content = der
        .get(header..)
        .ok_or(err(header, "the content is missing"))?;
    if content.len() < len {
        return Err(err(header, "the content is shorter than its length"));
    }
    if content.len() > len {
        return Err(err(header + len, "bytes follow the OCTET STRING"));
    }
    Ok(content)
}

/// A DER TLV with a definite length.
pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let len = content.len();
    let mut out = Vec::with_capacity(len + 6);
    out.push(tag);
    if len < 0x80 {
        out.push(len as u8); // < 0x80
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8); // at most 8 length bytes
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Base-128 OID encoding of a dotted string, to check the constant byte arrays.
    fn encode_oid(text: &str) -> Vec<u8> {
        let arcs: Vec<u128> = text.split('.').map(|a| a.parse().expect("arc")).collect();
        let mut out = Vec::new();
        let mut push = |mut v: u128| {
            let mut tmp = vec![(v & 0x7f) as u8];
            v >>= 7;
            while v > 0 {
                tmp.push(0x80 | (v & 0x7f) as u8);
                v >>= 7;
            }
            tmp.reverse();
            out.extend(tmp);
        };
        push(arcs[0] * 40 + arcs[1]);
        for &arc in &arcs[2..] {
            push(arc);
        }
        out
    }

    #[test]
    fn oid_constants_match_their_text() {
        assert_eq!(encode_oid(EVIDENCE_EXTENSION_OID), EVIDENCE_OID_BYTES);
        assert_eq!(encode_oid(NONCE_ATTRIBUTE_OID), NONCE_OID_BYTES);
        assert!(EVIDENCE_EXTENSION_OID.starts_with(ATLS_OID_ARC));
        // The arc is the UUID as one integer (ITU-T X.667).
        let uuid = u128::from_str_radix("c34a5e3245714382910434c2ce89db6c", 16).expect("hex");
        assert_eq!(ATLS_OID_ARC, format!("2.25.{uuid}"));
    }

    #[test]
    fn certificate_round_trips_through_x509_parser_and_webpki() {
        let key = TlsKey::generate().expect("key");
        let evidence = vec![0x5a; 1500];
        let cert = key
            .self_signed_certificate(Some(&encode_evidence_extension(&evidence)))
            .expect("certificate");
        let parsed = parse_certificate(&cert).expect("parses");
        assert_eq!(parsed.spki_der, key.spki_der());
        assert_eq!(parsed.evidence(), Ok(evidence.as_slice()));

        let (_, x509) = X509Certificate::from_der(&cert).expect("x509");
        let ext = &x509.extensions()[0];
        assert!(!ext.critical, "the evidence extension is non-critical");
        assert_eq!(ext.oid.as_bytes(), EVIDENCE_OID_BYTES);
        assert_eq!(x509.subject().to_string(), "CN=hawser aTLS");
        assert_eq!(x509.version(), x509_parser::x509::X509Version::V3);
        // Self-signed with the key it certifies.
        let point = &key.spki_der()[P256_SPKI_PREFIX.len()..];
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, point)
            .verify(x509.tbs_certificate.as_ref(), &x509.signature_value.data)
            .expect("self-signature verifies");

        // webpki, which rustls uses elsewhere, reads it too.
        let der = rustls::pki_types::CertificateDer::from(cert.as_slice());
        webpki::EndEntityCert::try_from(&der).expect("webpki parses the certificate");

        // Two keys are different.
        let other = TlsKey::generate().expect("key");
        assert_ne!(other.spki_der(), key.spki_der());
    }

    #[test]
    fn certificate_without_evidence_and_malformed_values() {
        let key = TlsKey::generate().expect("key");
        let cert = key.self_signed_certificate(None).expect("certificate");
        assert_eq!(
            parse_certificate(&cert).expect("parses").evidence(),
            Err(CertificateError::MissingEvidence)
        );

        let bad_values: [(&[u8], usize); 6] = [
            (b"", 0),
            (b"\x30\x00", 0),
            (b"\x04", 1),
            (b"\x04\x05ab", 2),
            (b"\x04\x01ab", 3),
            (b"\x04\x81\x01a", 1),
        ];
        for (value, offset) in bad_values {
            let cert = key
                .self_signed_certificate(Some(value))
                .expect("certificate");
            let err = parse_certificate(&cert)
                .expect("the certificate parses")
                .evidence()
                .expect_err("malformed value");
            assert!(
                matches!(err, CertificateError::EvidenceEncoding { offset: o, .. } if o == offset),
                "{value:?}: {err}"
            );
        }
        assert!(matches!(
            parse_certificate(b"\x30\x03\x02\x01\x00"),
            Err(CertificateError::X509(_))
        ));
        let mut trailing = cert.clone();
        trailing.push(0);
        assert_eq!(
            parse_certificate(&trailing),
            Err(CertificateError::TrailingBytes { count: 1 })
        );
    }

    #[test]
    fn tlv_lengths() {
        assert_eq!(tlv(4, &[]), [4, 0]);
        assert_eq!(tlv(4, &[0; 0x7f])[..2], [4, 0x7f]);
        assert_eq!(tlv(4, &[0; 0x80])[..3], [4, 0x81, 0x80]);
        assert_eq!(tlv(4, &[0; 0x1234])[..4], [4, 0x82, 0x12, 0x34]);
    }
}
