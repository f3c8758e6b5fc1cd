//! WireGuard keys: Curve25519, 32 bytes, written in base64 as `wg` writes them.
//!
//! A node's private key is made in the node from the kernel's CSPRNG and never leaves it: only
//! its public key travels (in the join request). [`PrivateKey`] is zeroized on drop and its
//! `Debug` shows nothing of it.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use zeroize::{Zeroize as _, Zeroizing};

use crate::MeshError;

/// A WireGuard public key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// The key from its 32 bytes (as carried in protobuf `bytes` fields).
    pub fn from_slice(bytes: &[u8]) -> Result<Self, MeshError> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| MeshError::KeyLength {
            length: bytes.len(),
        })?;
        Ok(Self(bytes))
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, the form boringtun's UAPI protocol takes.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key from lowercase or uppercase hex (boringtun's UAPI `get` answers).
    pub fn from_hex(text: &str) -> Result<Self, MeshError> {
        let bytes = decode_hex32(text).ok_or_else(|| MeshError::KeyText {
            text: text.to_owned(),
        })?;
        Ok(Self(bytes))
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl FromStr for PublicKey {
    type Err = MeshError;

    /// Base64 of 32 bytes, as `wg pubkey` prints it.
    fn from_str(text: &str) -> Result<Self, MeshError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| MeshError::KeyText {
                text: text.to_owned(),
            })?;
        Self::from_slice(&bytes)
    }
}

impl serde::Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A WireGuard private key. Zeroized on drop; `Debug` is redacted; no `Display`.
pub struct PrivateKey(Zeroizing<[u8; 32]>);

impl PrivateKey {
    /// A key from 32 random bytes (the caller's CSPRNG), clamped as Curve25519 wants.
    pub fn from_random(mut bytes: [u8; 32]) -> Self {
        let secret = x25519_dalek::StaticSecret::from(bytes);
        bytes.zeroize();
        Self(Zeroizing::new(secret.to_bytes()))
    }

    /// The key from the base64 form [`PrivateKey::to_base64`] wrote (a node's key file).
    pub fn from_base64(text: &str) -> Result<Self, MeshError> {
        let bytes = Zeroizing::new(
            STANDARD
                .decode(text.trim())
                .map_err(|_| MeshError::PrivateKeyText)?,
        );
        let array: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| MeshError::PrivateKeyText)?;
        Ok(Self::from_random(array))
    }

    /// Base64, as `wg genkey` writes it: for the node's key file on the encrypted state disk.
    pub fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(STANDARD.encode(*self.0))
    }

    /// Hex, as boringtun's UAPI `set` takes it.
    pub fn to_hex(&self) -> Zeroizing<String> {
        Zeroizing::new(self.0.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        let secret = x25519_dalek::StaticSecret::from(*self.0);
        PublicKey(x25519_dalek::PublicKey::from(&secret).to_bytes())
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

fn decode_hex32(text: &str) -> Option<[u8; 32]> {
    let text = text.trim().as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_key_matches_the_rfc7748_test_vector() {
        // RFC 7748 §6.1: Alice's private key and public key.
        let private = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
        let public = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
        let key = PrivateKey::from_random(decode_hex32(private).unwrap());
        assert_eq!(key.public_key().to_hex(), public);
    }

    #[test]
    fn keys_round_trip_through_base64_and_hex() {
        let key = PrivateKey::from_random([7; 32]);
        let again = PrivateKey::from_base64(&key.to_base64()).unwrap();
        assert_eq!(key.public_key(), again.public_key());
        let public = key.public_key();
        assert_eq!(public.to_string().parse::<PublicKey>().unwrap(), public);
        assert_eq!(PublicKey::from_hex(&public.to_hex()).unwrap(), public);
        let json = serde_json::to_string(&public).unwrap();
        assert_eq!(serde_json::from_str::<PublicKey>(&json).unwrap(), public);
    }

    #[test]
    fn private_key_debug_is_redacted() {
        let key = PrivateKey::from_random([7; 32]);
        let shown = format!("{key:?}");
        assert_eq!(shown, "PrivateKey(<redacted>)");
        assert!(!shown.contains(&key.to_base64()[..8]));
    }

    #[test]
    fn malformed_keys_are_refused_naming_the_problem() {
        assert!(matches!(
            PublicKey::from_slice(&[0; 31]),
            Err(MeshError::KeyLength { length: 31 })
        ));
        let error = "not base64!".parse::<PublicKey>().unwrap_err();
        assert!(error.to_string().contains("not base64!"), "{error}");
        assert!(PublicKey::from_hex("zz").is_err());
        assert!(PrivateKey::from_base64("AAAA").is_err());
    }
}
