//! kubeadm's pin of the cluster CA: `sha256:` and the SHA-256 of its SubjectPublicKeyInfo.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// The only hash algorithm kubeadm pins a CA with, as the text form's prefix.
const PREFIX: &str = "sha256:";

/// A discovery CA certificate hash, `sha256:<64 lowercase hex>`: the SHA-256 of the cluster
/// CA certificate's DER-encoded SubjectPublicKeyInfo. `kubeadm token create
/// --print-join-command` prints it as `--discovery-token-ca-cert-hash`, and a
/// JoinConfiguration lists it in `discovery.bootstrapToken.caCertHashes`: the joining node
/// trusts an API server only if its CA's public key has this hash.
///
/// The text form is the lowercase one kubeadm prints; uppercase is refused (kubeadm itself would
/// accept it), so one pin has one spelling.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CaCertHash([u8; 32]);

/// Why a text is not a CA certificate hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaCertHashError {
    /// The text does not start with `sha256:`.
    #[error(
        "not a CA certificate hash: expected sha256:<64 lowercase hex digits> (the SPKI hash \
         kubeadm prints; SHA-256 is the only algorithm it pins with)"
    )]
    Algorithm,
    /// The digest after `sha256:` is not 64 characters long.
    #[error(
        "not a CA certificate hash: the digest after sha256: has {len} characters, expected 64 \
         lowercase hex digits"
    )]
    DigestLength {
        /// Characters (bytes) after the prefix.
        len: usize,
    },
    /// The digest after `sha256:` has a character other than `0-9a-f`.
    #[error("not a CA certificate hash: the digest after sha256: is not lowercase hex (0-9, a-f)")]
    DigestCharacters,
}

impl CaCertHash {
    /// The pin of a CA whose certificate has this DER-encoded SubjectPublicKeyInfo (the whole
    /// SEQUENCE: algorithm identifier and public key bit string).
    pub fn of_spki_der(spki_der: &[u8]) -> CaCertHash {
        CaCertHash(Sha256::digest(spki_der).into())
    }

    /// A pin from its SHA-256 digest.
    pub fn from_sha256(digest: [u8; 32]) -> CaCertHash {
        CaCertHash(digest)
    }

    /// The SHA-256 digest.
    pub fn sha256(&self) -> &[u8; 32] {
        &self.0
    }
}

impl FromStr for CaCertHash {
    type Err = CaCertHashError;

    fn from_str(text: &str) -> Result<CaCertHash, CaCertHashError> {
        let digest = text
            .strip_prefix(PREFIX)
            .ok_or(CaCertHashError::Algorithm)?;
        if digest.len() != 64 {
            return Err(CaCertHashError::DigestLength { len: digest.len() });
        }
        if !digest
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(CaCertHashError::DigestCharacters);
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(digest, &mut bytes).map_err(|_| CaCertHashError::DigestCharacters)?;
        Ok(CaCertHash(bytes))
    }
}

impl fmt::Display for CaCertHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", hex::encode(self.0))
    }
}

impl fmt::Debug for CaCertHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaCertHash({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef";

    #[test]
    fn the_pin_is_the_sha256_of_the_spki_as_openssl_computes_it() {
        // A P-256 CA's SubjectPublicKeyInfo and its pin, both from openssl, as kubeadm's docs
        // compute it: `openssl x509 -pubkey -in ca.crt | openssl pkey -pubin -outform der |
        // openssl dgst -sha256`.
        let spki = hex::decode(
            "3059301306072a8648ce3d020106082a8648ce3d03010703420004eeb1f51e188edb2d793821aca19788\
             57fd4503ee7a8f9ca84129d6f887f38530bcbed4dcbd9e578600c70fd5d85b35b8e02dce2b653a5bd47d\
             b7fc3636854b99",
        )
        .unwrap();
        let pin = CaCertHash::of_spki_der(&spki);
        assert_eq!(
            pin.to_string(),
            "sha256:4621734252ba3a4b0e853fd7969f7a7a4d2a129eba1588f528f6eab975824154"
        );
        assert_eq!(pin.to_string().parse::<CaCertHash>(), Ok(pin));
    }

    #[test]
    fn the_text_form_round_trips() {
        let hash: CaCertHash = HASH.parse().unwrap();
        assert_eq!(hash.to_string(), HASH);
        assert_eq!(hash.sha256()[..2], [0x12, 0x34]);
        assert_eq!(CaCertHash::from_sha256(*hash.sha256()), hash);
        assert_eq!(format!("{hash:?}"), format!("CaCertHash({HASH})"));
    }

    #[test]
    fn malformed_hashes_are_refused_with_the_reason() {
        let digest = HASH.trim_start_matches("sha256:");
        for (bad, expected) in [
            ("sha1:abcd".to_owned(), CaCertHashError::Algorithm),
            (HASH.to_uppercase(), CaCertHashError::Algorithm),
            (digest.to_owned(), CaCertHashError::Algorithm),
            (format!(" {HASH}"), CaCertHashError::Algorithm),
            (
                "sha256:xyz".to_owned(),
                CaCertHashError::DigestLength { len: 3 },
            ),
            (
                "sha256:".to_owned(),
                CaCertHashError::DigestLength { len: 0 },
            ),
            (
                format!("{HASH}0"),
                CaCertHashError::DigestLength { len: 65 },
            ),
            (
                format!("{HASH}\n"),
                CaCertHashError::DigestLength { len: 65 },
            ),
            (
                format!("sha256:{}", digest.to_uppercase()),
                CaCertHashError::DigestCharacters,
            ),
            (
                format!("sha256:{}g", &digest[1..]),
                CaCertHashError::DigestCharacters,
            ),
            // 64 bytes, but not 64 characters of hex: a multi-byte character is refused.
            (
                format!("sha256:{}é", &digest[2..]),
                CaCertHashError::DigestCharacters,
            ),
        ] {
            let err = bad.parse::<CaCertHash>().unwrap_err();
            assert_eq!(err, expected, "{bad:?}");
            assert!(err.to_string().contains("CA certificate hash"), "{err}");
        }
    }
}
