//! DNS names as Kubernetes checks them (RFC 1123, lowercase): node names, endpoint hosts.

use std::fmt;
use std::str::FromStr;

/// The longest DNS subdomain.
pub const MAX_SUBDOMAIN_LEN: usize = 253;
/// The longest label of a DNS subdomain.
pub const MAX_LABEL_LEN: usize = 63;

/// A lowercase RFC 1123 subdomain, as Kubernetes requires of a node name
/// (`IsDNS1123Subdomain`): labels of 1 to 63 lowercase letters, digits and `-`, each starting
/// and ending with a letter or digit, joined by `.`, at most 253 characters in all.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DnsSubdomain(String);

/// Why a text is not a DNS subdomain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsSubdomainError {
    /// The name is longer than 253 characters.
    #[error("a DNS name has at most 253 characters, this one {len}")]
    TooLong {
        /// The length in bytes.
        len: usize,
    },
    /// The name is empty, starts or ends with `.`, or has `..`.
    #[error("a DNS name and each of its labels (between dots) must not be empty")]
    EmptyLabel,
    /// A label is longer than 63 characters.
    #[error("a label of a DNS name has at most 63 characters, one here has {len}")]
    LabelTooLong {
        /// The label's length in bytes.
        len: usize,
    },
    /// A character other than a lowercase ASCII letter, a digit, `-` or `.`.
    #[error("{character:?} is not allowed in a DNS name (lowercase letters, digits, '-' and '.')")]
    Character {
        /// The first character that is not allowed.
        character: char,
    },
    /// A label starts or ends with `-`.
    #[error("a label of a DNS name must start and end with a letter or digit, not '-'")]
    Hyphen,
}

impl DnsSubdomain {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the name is a single label (no dot), as a DNS-1123 label must be.
    pub fn is_label(&self) -> bool {
        !self.0.contains('.')
    }
}

impl FromStr for DnsSubdomain {
    type Err = DnsSubdomainError;

    fn from_str(text: &str) -> Result<DnsSubdomain, DnsSubdomainError> {
        if let Some(character) = text
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.')))
        {
            return Err(DnsSubdomainError::Character { character });
        }
        if text.len() > MAX_SUBDOMAIN_LEN {
            return Err(DnsSubdomainError::TooLong { len: text.len() });
        }
        for label in text.split('.') {
            if label.is_empty() {
                return Err(DnsSubdomainError::EmptyLabel);
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(DnsSubdomainError::LabelTooLong { len: label.len() });
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(DnsSubdomainError::Hyphen);
            }
        }
        Ok(DnsSubdomain(text.to_owned()))
    }
}

impl fmt::Display for DnsSubdomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Result<DnsSubdomain, DnsSubdomainError> {
        text.parse()
    }

    #[test]
    fn node_names_are_lowercase_rfc_1123_subdomains() {
        for good in [
            "node-1",
            "hawser-3f1c2d4e",
            "node-1.cluster.local",
            "10.0.2.15",
            "a",
            "0",
            &"a".repeat(63),
            &[
                "a".repeat(63),
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(61),
            ]
            .join("."),
        ] {
            let parsed = name(good).unwrap();
            assert_eq!(parsed.as_str(), good);
            assert_eq!(parsed.to_string(), good);
        }
        assert!(name("node-1").unwrap().is_label());
        assert!(!name("node-1.cluster.local").unwrap().is_label());
    }

    #[test]
    fn bad_names_are_refused_with_the_reason() {
        let too_long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62),
        ]
        .join(".");
        for (bad, expected) in [
            ("", DnsSubdomainError::EmptyLabel),
            ("node.", DnsSubdomainError::EmptyLabel),
            (".node", DnsSubdomainError::EmptyLabel),
            ("node..local", DnsSubdomainError::EmptyLabel),
            ("Node-1", DnsSubdomainError::Character { character: 'N' }),
            ("node_1", DnsSubdomainError::Character { character: '_' }),
            ("bad name", DnsSubdomainError::Character { character: ' ' }),
            (
                "*.hawser.example",
                DnsSubdomainError::Character { character: '*' },
            ),
            ("nöde", DnsSubdomainError::Character { character: 'ö' }),
            ("fd00::1", DnsSubdomainError::Character { character: ':' }),
            ("-node", DnsSubdomainError::Hyphen),
            ("node-", DnsSubdomainError::Hyphen),
            ("a.-b.c", DnsSubdomainError::Hyphen),
            (&"a".repeat(64), DnsSubdomainError::LabelTooLong { len: 64 }),
            (&too_long, DnsSubdomainError::TooLong { len: 254 }),
        ] {
            assert_eq!(name(bad), Err(expected), "{bad:?}");
        }
    }
}
