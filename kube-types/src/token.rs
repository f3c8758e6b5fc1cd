//! kubeadm's bootstrap token: `[a-z0-9]{6}.[a-z0-9]{16}`, a public ID and a secret.

use std::fmt;
use std::str::FromStr;

use zeroize::Zeroizing;

/// Characters of the token ID, before the dot.
pub const TOKEN_ID_LEN: usize = 6;
/// Characters of the secret, after the dot.
pub const TOKEN_SECRET_LEN: usize = 16;
/// Characters of a whole token: ID, dot, secret.
pub const TOKEN_LEN: usize = TOKEN_ID_LEN + 1 + TOKEN_SECRET_LEN;
/// How many random bytes [`BootstrapToken::from_random_bytes`] takes: four per character.
pub const TOKEN_RANDOM_BYTES: usize = 4 * (TOKEN_ID_LEN + TOKEN_SECRET_LEN);

/// The characters kubeadm's token pattern allows.
const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A kubeadm bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}` (kubeadm's `BootstrapTokenPattern`).
///
/// The ID before the dot is public: kubeadm names the token's Secret after it and prints it. The
/// part after the dot is the secret that lets a node join. The token is zeroized on drop,
/// `Debug` shows the ID only, and there is no `Display`: the whole token is read through
/// [`expose_secret`](Self::expose_secret), where it goes into a kubeadm configuration or a
/// join ticket.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken(Zeroizing<String>);

/// Why a text is not a bootstrap token. The text is never shown: it may hold a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapTokenError {
    /// There is no `.` between the token ID and the secret.
    #[error(
        "not a bootstrap token (value not shown: secret): no '.'; expected 6 and 16 lowercase \
         letters or digits separated by a dot"
    )]
    NoDot,
    /// The token ID, before the first `.`, is not six lowercase ASCII letters or digits.
    #[error(
        "not a bootstrap token (value not shown: secret): the token ID before the '.' is not 6 \
         lowercase letters or digits"
    )]
    Id,
    /// The secret, after the first `.`, is not sixteen lowercase ASCII letters or digits.
    #[error(
        "not a bootstrap token (value not shown: secret): the part after the '.' is not 16 \
         lowercase letters or digits"
    )]
    Secret,
}

impl BootstrapToken {
    /// The public token ID (the part before the dot).
    pub fn id(&self) -> &str {
        self.0.split_once('.').map_or("", |(id, _)| id)
    }

    /// The whole token, secret included: for the kubeadm configuration and the join ticket,
    /// never for a log.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// A new token from `random`, which the caller fills from a CSPRNG. Each character takes
    /// four bytes, read as a little-endian `u32` modulo 36: the bias towards the first four
    /// characters of the alphabet is below 10⁻⁹, where taking one byte per character would
    /// make them 14% likelier than the others.
    pub fn from_random_bytes(random: &[u8; TOKEN_RANDOM_BYTES]) -> BootstrapToken {
        let mut text = Zeroizing::new(String::with_capacity(TOKEN_LEN));
        for (i, chunk) in random.chunks_exact(4).enumerate() {
            if i == TOKEN_ID_LEN {
                text.push('.');
            }
            let value = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            // Cannot truncate: the value is below 36.
            let index = (value % ALPHABET.len() as u32) as usize;
            text.push(char::from(ALPHABET[index]));
        }
        BootstrapToken(text)
    }
}

impl FromStr for BootstrapToken {
    type Err = BootstrapTokenError;

    fn from_str(text: &str) -> Result<BootstrapToken, BootstrapTokenError> {
        let valid_part = |part: &str, len: usize| {
            part.len() == len
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        let (id, secret) = text.split_once('.').ok_or(BootstrapTokenError::NoDot)?;
        if !valid_part(id, TOKEN_ID_LEN) {
            return Err(BootstrapTokenError::Id);
        }
        if !valid_part(secret, TOKEN_SECRET_LEN) {
            return Err(BootstrapTokenError::Secret);
        }
        Ok(BootstrapToken(Zeroizing::new(text.to_owned())))
    }
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    #[test]
    fn bootstrap_tokens_are_validated_without_being_echoed_and_redacted_in_debug() {
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdefg",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdeF",
        ] {
            let err = bad.parse::<BootstrapToken>().unwrap_err().to_string();
            assert!(err.contains("value not shown"), "{err}");
            assert!(!err.contains(bad), "{err}");
        }
        let token: BootstrapToken = TOKEN.parse().unwrap();
        assert_eq!(token.id(), "abcdef");
        assert_eq!(token.expose_secret(), TOKEN);
        assert_eq!(format!("{token:?}"), "BootstrapToken(abcdef.<redacted>)");
    }

    #[test]
    fn each_malformed_part_is_named() {
        for (bad, expected) in [
            ("", BootstrapTokenError::NoDot),
            ("abcdef0123456789abcdef", BootstrapTokenError::NoDot),
            (".0123456789abcdef", BootstrapTokenError::Id),
            ("abc-ef.0123456789abcdef", BootstrapTokenError::Id),
            // Non-ASCII letters are not [a-z], even where they are lowercase.
            ("abcdéf.0123456789abcdef", BootstrapTokenError::Id),
            ("abcdé.0123456789abcdef", BootstrapTokenError::Id),
            (" abcdef.0123456789abcdef", BootstrapTokenError::Id),
            ("abcdef.", BootstrapTokenError::Secret),
            // A second dot is part of the secret, which then has a character it may not have.
            ("abcdef.01234567.9abcdef", BootstrapTokenError::Secret),
            ("abcdef.0123456789abcdef\n", BootstrapTokenError::Secret),
            ("abcdef.0123456789abcdef0", BootstrapTokenError::Secret),
        ] {
            assert_eq!(bad.parse::<BootstrapToken>(), Err(expected), "{bad:?}");
        }
    }

    #[test]
    fn a_token_from_random_bytes_takes_four_bytes_per_character() {
        let zeros = BootstrapToken::from_random_bytes(&[0; TOKEN_RANDOM_BYTES]);
        assert_eq!(zeros.expose_secret(), "aaaaaa.aaaaaaaaaaaaaaaa");
        // Character i from the u32 (LE) at bytes 4i..4i+4: 35 is '9', 36 wraps to 'a', the
        // largest u32 is 4294967295 = 36 · 119304647 + 3, so 'd'.
        let mut random = [0u8; TOKEN_RANDOM_BYTES];
        random[0..4].copy_from_slice(&35u32.to_le_bytes());
        random[4..8].copy_from_slice(&36u32.to_le_bytes());
        random[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        random[24..28].copy_from_slice(&25u32.to_le_bytes());
        random[84..88].copy_from_slice(&(26u32 + 36 * 1000).to_le_bytes());
        let token = BootstrapToken::from_random_bytes(&random);
        assert_eq!(token.expose_secret(), "9adaaa.zaaaaaaaaaaaaaa0");
        assert_eq!(token.expose_secret().parse::<BootstrapToken>(), Ok(token));
    }
}
