//! The key check stored in the header: cryptsetup's `pbkdf2` digest of the volume key.

use std::fmt;

use sha2::Sha256;

/// PBKDF2 iterations of the digest hawser writes: cryptsetup's minimum. The volume key is 512
/// random bits, so stretching it buys nothing; see the crate documentation.
pub const DIGEST_ITERATIONS: u32 = 1000;
/// The most digest iterations hawser computes. cryptsetup benchmarks its digest to ~125 ms on
/// the formatting machine (a few 100 000 iterations); a header asking for more is refused
/// rather than allowed to stall the boot.
pub const MAX_DIGEST_ITERATIONS: u32 = 4_000_000;
/// Bytes of the digest salt (cryptsetup's `LUKS_SALTSIZE`).
pub const DIGEST_SALT_LEN: usize = 32;
/// Bytes of a PBKDF2-SHA256 digest.
pub const DIGEST_LEN: usize = 32;

/// The key check stored in the header: PBKDF2-SHA256(volume key, salt, iterations).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyDigest {
    /// The digest's salt, random per format.
    pub salt: [u8; DIGEST_SALT_LEN],
    /// PBKDF2 iterations: [`DIGEST_ITERATIONS`] in what hawser writes, cryptsetup's benchmark
    /// in what cryptsetup writes.
    pub iterations: u32,
    /// The PBKDF2 output.
    pub digest: [u8; DIGEST_LEN],
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not a secret, but a verifier of one: nothing a log needs.
        f.debug_struct("KeyDigest")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl KeyDigest {
    /// The digest of `key` with `salt`, as cryptsetup computes it.
    pub fn compute(key: &[u8], salt: [u8; DIGEST_SALT_LEN], iterations: u32) -> KeyDigest {
        KeyDigest {
            salt,
            iterations,
            digest: pbkdf2_sha256(key, &salt, iterations),
        }
    }

    /// Whether `key` is the volume key this digest was made from (constant-time comparison).
    pub fn matches(&self, key: &[u8]) -> bool {
        let actual = pbkdf2_sha256(key, &self.salt, self.iterations);
        actual
            .iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

fn pbkdf2_sha256(key: &[u8], salt: &[u8], iterations: u32) -> [u8; DIGEST_LEN] {
    let mut out = [0u8; DIGEST_LEN];
    pbkdf2::pbkdf2_hmac::<Sha256>(key, salt, iterations, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::key;

    #[test]
    fn the_digest_is_pbkdf2_sha256_of_the_key() {
        // RFC 7914 section 11 test vector for PBKDF2-HMAC-SHA256 (P="passwd", S="salt", c=1),
        // first 32 bytes.
        let mut salt = [0u8; 32];
        salt[..4].copy_from_slice(b"salt");
        let expected = "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc";
        assert_eq!(hex::encode(pbkdf2_sha256(b"passwd", b"salt", 1)), expected);
        let digest = KeyDigest::compute(&key(64), [3; 32], 1000);
        assert!(digest.matches(&key(64)));
        let mut wrong = key(64);
        wrong[63] ^= 1;
        assert!(!digest.matches(&wrong));
        assert_eq!(format!("{digest:?}"), "KeyDigest { iterations: 1000, .. }");
    }
}
