//! The init secret: what `hawser init` and `hawser recover` prove they know.
//!
//! As with Constellation's bootstrapper, the node learns only the SHA-256 hash of a
//! high-entropy secret (32 random bytes the admin's CLI generated), but unlike Constellation
//! only from the measured kernel command line (`hawser.init_secret_hash=<hex>`): a hash from
//! the platform's unmeasured metadata (fw_cfg on QEMU) would let whoever runs the VM `Init` a
//! fresh node into a cluster of their own, so PID 1 refuses it by name. `Init` and `Recover`
//! carry the secret itself; the node compares `SHA-256(secret)` with the hash in constant time
//! before it looks at anything else in the request. A node without a hash runs no init server.
//!
//! The hash is public (the host sees it); the secret is only ever sent over aTLS to a node
//! whose measurements and AK the CLI has verified, so only the image the admin expects sees it.
//! Guessing is moot: the secret has 256 bits; refusals are still delayed a little
//! ([`REFUSAL_DELAY`]) so a flood of guesses costs the guesser time, not the node.

use std::time::Duration;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// Length of the init secret the CLI generates.
pub const INIT_SECRET_LEN: usize = 32;
/// How long a refused request waits before its answer.
pub const REFUSAL_DELAY: Duration = Duration::from_millis(500);

/// The SHA-256 hash of the cluster admin's init secret, as the platform gave it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InitSecretHash([u8; 32]);

impl std::fmt::Debug for InitSecretHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Public, but long: the first bytes identify it in a log line.
        write!(f, "InitSecretHash({}…)", hex::encode(&self.0[..4]))
    }
}

/// Why a request's init secret is refused. Every message starts with the same named reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitSecretError {
    /// The request carries no init secret (an old CLI, or `--init-secret` pointing nowhere).
    #[error(
        "init secret does not match the node's init secret hash: the request carries none \
         (hawser init|recover --init-secret FILE)"
    )]
    Missing,
    /// The request's init secret is not [`INIT_SECRET_LEN`] bytes.
    #[error(
        "init secret does not match the node's init secret hash: it is {found} bytes, \
         expected {INIT_SECRET_LEN}"
    )]
    Length {
        /// The length the request carried.
        found: usize,
    },
    /// `SHA-256(secret)` differs from the node's hash.
    #[error("init secret does not match the node's init secret hash")]
    Mismatch,
}

impl InitSecretHash {
    /// The hash of `secret` (what the CLI passes to the platform).
    pub fn of(secret: &[u8]) -> Self {
        InitSecretHash(Sha256::digest(secret).into())
    }

    /// The hash as raw bytes.
    pub fn from_bytes(hash: [u8; 32]) -> Self {
        InitSecretHash(hash)
    }

    /// Checks `secret` against the hash in constant time (the length is not secret).
    pub fn check(&self, secret: &[u8]) -> Result<(), InitSecretError> {
        if secret.is_empty() {
            return Err(InitSecretError::Missing);
        }
        if secret.len() != INIT_SECRET_LEN {
            return Err(InitSecretError::Length {
                found: secret.len(),
            });
        }
        let digest: [u8; 32] = Sha256::digest(secret).into();
        if bool::from(digest.ct_eq(&self.0)) {
            Ok(())
        } else {
            Err(InitSecretError::Mismatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_secret_passes_and_a_wrong_missing_or_short_one_is_refused() {
        let secret = [7u8; INIT_SECRET_LEN];
        let hash = InitSecretHash::of(&secret);
        assert_eq!(hash.check(&secret), Ok(()));

        let mut wrong = secret;
        wrong[31] ^= 1;
        assert_eq!(hash.check(&wrong), Err(InitSecretError::Mismatch));
        assert_eq!(hash.check(&[]), Err(InitSecretError::Missing));
        assert_eq!(
            hash.check(&secret[..16]),
            Err(InitSecretError::Length { found: 16 })
        );
        // A secret whose hash is right but whose length is not cannot exist; a 33-byte secret
        // that starts with the right one is still refused.
        let mut long = secret.to_vec();
        long.push(0);
        assert_eq!(
            hash.check(&long),
            Err(InitSecretError::Length { found: 33 })
        );
        for refusal in [
            InitSecretError::Missing,
            InitSecretError::Length { found: 1 },
            InitSecretError::Mismatch,
        ] {
            assert!(
                refusal
                    .to_string()
                    .starts_with("init secret does not match the node's init secret hash"),
                "{refusal}"
            );
        }
    }

    #[test]
    fn the_hash_is_sha256_of_the_secret_and_debug_shows_only_a_prefix() {
        let hash = InitSecretHash::of(b"abc");
        assert_eq!(
            hash,
            InitSecretHash::from_bytes(
                hex::decode("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
                    .unwrap()
                    .try_into()
                    .unwrap()
            )
        );
        assert_eq!(format!("{hash:?}"), "InitSecretHash(ba7816bf…)");
    }
}
