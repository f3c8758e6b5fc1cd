//! The evidence a hawser node presents, and what binds it to one connection.
//!
//! Evidence is the protobuf `hawser.evidence.v1.Evidence` (crate `hawser-proto`): the AK's
//! `TPM2B_PUBLIC`, the quote's `TPMS_ATTEST` and `TPMT_SIGNATURE`, the quoted sha256 PCR values,
//! the AK certificate chain and optional user data. It is small (about 1.5 KiB with 24 PCRs
//! and one AK certificate) because it travels inside a TLS certificate.
//!
//! # The binding
//!
//! A quote proves the PCR values only if it is fresh and tied to the channel it arrives on, so
//! the quote's qualifying data (`extraData`) is
//!
//! ```text
//! SHA-256( "hawser aTLS evidence v1\0"      24 bytes, domain separation
//!        || role                             1 byte: 's' server, 'c' client
//!        || nonce                            32 bytes chosen by the verifier
//!        || SHA-256(TLS SubjectPublicKeyInfo DER)
//!        || SHA-256(user_data) )
//! ```
//!
//! The domain-separation prefix keeps the TPM's signature from meaning anything in another
//! protocol that also quotes with this AK; the role keeps a server's evidence from being
//! replayed as a client's; the nonce makes it fresh; the key hash ties it to the TLS key whose
//! possession the handshake's CertificateVerify proves.

use sha2::{Digest, Sha256};
use thiserror::Error;

pub use hawser_proto::evidence::{Evidence, Variant};

/// The `Evidence.version` this crate writes and accepts.
pub const EVIDENCE_VERSION: u32 = 1;

/// The largest encoded evidence a verifier looks at. A TLS 1.3 handshake message is at most
/// 64 KiB (rustls' limit); evidence is ~1.5 KiB, so 16 KiB leaves room for intermediate
/// certificates and user data while keeping a hostile peer from making us parse megabytes.
pub const MAX_EVIDENCE_LEN: usize = 16 * 1024;

/// Length of a verifier's nonce.
pub const NONCE_LEN: usize = 32;

/// A verifier's nonce.
pub type Nonce = [u8; NONCE_LEN];

/// The first bytes hashed into the qualifying data (see the module docs).
pub const QUALIFYING_DATA_PREFIX: &[u8; 24] = b"hawser aTLS evidence v1\0";

/// Which end of a TLS connection the evidence speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The TLS server (evidence in the server's Certificate message).
    Server,
    /// The TLS client (evidence in the client's Certificate message).
    Client,
}

impl Role {
    fn tag(self) -> u8 {
        match self {
            Role::Server => b's',
            Role::Client => b'c',
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Server => "server",
            Role::Client => "client",
        })
    }
}

/// What one piece of evidence is bound to: the attesting side's role, the verifier's nonce and
/// the attester's TLS public key.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The side that attests.
    pub role: Role,
    /// The verifier's nonce.
    pub nonce: &'a Nonce,
    /// The DER `SubjectPublicKeyInfo` of the attester's TLS key.
    pub tls_spki_der: &'a [u8],
}

impl Binding<'_> {
    /// SHA-256 of the TLS key's `SubjectPublicKeyInfo`.
    pub fn tls_key_hash(&self) -> [u8; 32] {
        Sha256::digest(self.tls_spki_der).into()
    }

    /// The quote's qualifying data for this binding and `user_data` (see the module docs).
    pub fn qualifying_data(&self, user_data: &[u8]) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(QUALIFYING_DATA_PREFIX);
        hasher.update([self.role.tag()]);
        hasher.update(self.nonce);
        hasher.update(self.tls_key_hash());
        hasher.update(Sha256::digest(user_data));
        hasher.finalize().into()
    }
}

/// Something that produces evidence for a binding: the TPM issuer (`issuer::TpmIssuer`,
/// feature `tpm`) in a hawser node. Blocking: aTLS runs it on a blocking thread.
pub trait EvidenceIssuer: Send + Sync {
    /// Evidence whose quote binds `binding` and `user_data`.
    fn issue(&self, binding: &Binding<'_>, user_data: &[u8]) -> Result<Evidence, IssueError>;
}

/// Why evidence could not be produced.
#[derive(Debug, Error)]
#[error("cannot produce attestation evidence: {context}")]
pub struct IssueError {
    /// What was being done.
    pub context: String,
    /// What failed.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl IssueError {
    /// An error with `context` around `source`.
    pub fn new(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// A malformed certificate chain as stored in the AK certificate NV index.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// The NV index holds no certificate at all.
    #[error("the AK certificate NV data holds no certificate ({len} bytes)")]
    Empty { len: usize },
    /// Something other than a DER SEQUENCE where a certificate should start.
    #[error(
        "the AK certificate NV data has tag {tag:#04x} at offset {offset}, expected a DER SEQUENCE (0x30)"
    )]
    Tag { offset: usize, tag: u8 },
    /// A DER length that is malformed or runs past the end.
    #[error(
        "the AK certificate NV data has a malformed or truncated DER length at offset {offset}"
    )]
    Length { offset: usize },
}

/// Splits NV data into DER certificates: one or more concatenated DER SEQUENCEs (leaf first),
/// optionally followed by padding of 0x00 or 0xFF bytes (NV indices are often larger than
/// their content and erased to one of those).
pub fn split_certificate_chain(data: &[u8]) -> Result<Vec<Vec<u8>>, ChainError> {
    let mut certs = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let rest = &data[offset..];
        if rest.iter().all(|&b| b == 0x00) || rest.iter().all(|&b| b == 0xff) {
            break;
        }
        if rest[0] != 0x30 {
            return Err(ChainError::Tag {
                offset,
                tag: rest[0],
            });
        }
        let len = der_element_len(rest).ok_or(ChainError::Length { offset })?;
        certs.push(rest[..len].to_vec());
        offset += len;
    }
    if certs.is_empty() {
        return Err(ChainError::Empty { len: data.len() });
    }
    Ok(certs)
}

/// The total length (header + content) of the DER element at the start of `der`, if its length
/// field is well-formed and the element fits.
fn der_element_len(der: &[u8]) -> Option<usize> {
    let first = *der.get(1)?;
    let (header, content) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let count = usize::from(first & 0x7f);
        // Certificates are far below 4 GiB; 0x80 (indefinite) is not DER.
        if count == 0 || count > 4 {
            return None;
        }
        let bytes = der.get(2..2 + count)?;
        let content = bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (2 + count, content)
    };
    let total = header.checked_add(content)?;
    (total <= der.len()).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualifying_data_depends_on_every_input() {
        let nonce = [7u8; 32];
        let other_nonce = [8u8; 32];
        let base = Binding {
            role: Role::Server,
            nonce: &nonce,
            tls_spki_der: b"spki",
        };
        let qd = base.qualifying_data(b"");
        assert_eq!(qd, base.qualifying_data(b""), "deterministic");
        let variants = [
            Binding {
                role: Role::Client,
                ..base
            }
            .qualifying_data(b""),
            Binding {
                nonce: &other_nonce,
                ..base
            }
            .qualifying_data(b""),
            Binding {
                tls_spki_der: b"spkj",
                ..base
            }
            .qualifying_data(b""),
            base.qualifying_data(b"user"),
        ];
        for v in variants {
            assert_ne!(v, qd);
        }
        // The layout written in the module docs.
        let mut input = QUALIFYING_DATA_PREFIX.to_vec();
        input.push(b's');
        input.extend_from_slice(&nonce);
        input.extend_from_slice(&Sha256::digest(b"spki"));
        input.extend_from_slice(&Sha256::digest(b""));
        assert_eq!(qd, <[u8; 32]>::from(Sha256::digest(&input)));
    }

    #[test]
    fn splits_concatenated_certificates_and_ignores_padding() {
        let short = [0x30, 0x03, 1, 2, 3];
        let mut long = vec![0x30, 0x81, 0x80];
        long.extend_from_slice(&[0xaa; 0x80]);
        let mut data = short.to_vec();
        data.extend_from_slice(&long);
        data.extend_from_slice(&[0xff; 7]);
        let certs = split_certificate_chain(&data).expect("two certificates");
        assert_eq!(certs, vec![short.to_vec(), long]);

        assert_eq!(
            split_certificate_chain(&[0; 16]),
            Err(ChainError::Empty { len: 16 })
        );
        assert_eq!(
            split_certificate_chain(&[0x30, 0x03, 1, 2, 3, 0x02, 0x01, 0]),
            Err(ChainError::Tag {
                offset: 5,
                tag: 0x02
            })
        );
        assert_eq!(
            split_certificate_chain(&[0x30, 0x05, 1]),
            Err(ChainError::Length { offset: 0 })
        );
        assert_eq!(
            split_certificate_chain(&[0x30, 0x85, 1, 1, 1, 1, 1]),
            Err(ChainError::Length { offset: 0 })
        );
        assert_eq!(
            split_certificate_chain(&[0x30]),
            Err(ChainError::Length { offset: 0 })
        );
    }
}
