//! Certificate chains to a pinned root, checked at an explicit time.
//!
//! Hardware vendors' chains are short and fixed (AMD: ARK → ASK → VCEK), and their
//! certificates have quirks general-purpose path builders refuse (AMD's VCEK has serial number
//! 0 and its chip ID as a raw extension; every AMD link is RSA-PSS with explicit parameters).
//! So the walk is written out here: each certificate is parsed with x509-parser, its signature
//! checked with the issuer's key (ring, through x509-parser's `verify`: RSA PKCS#1, RSA-PSS,
//! ECDSA), its validity compared with the verification time the caller gives, and the root is
//! accepted only by the SHA-256 of its DER. Nothing here fetches or checks revocation: the
//! caller's documentation says so for each platform.

use sha2::{Digest as _, Sha256};
use x509_parser::prelude::{FromDer as _, X509Certificate};

/// Why a certificate of a chain is refused; `which` names it ("the VCEK", "the ASK", …).
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("{which} is not a DER X.509 certificate: {reason}")]
    Parse { which: String, reason: String },
    #[error(
        "{which} is not valid at the verification time {at} (valid from {not_before} to \
         {not_after})"
    )]
    Validity {
        which: String,
        at: String,
        not_before: String,
        not_after: String,
    },
    #[error("{which} is not signed by {issuer}: {reason}")]
    Signature {
        which: String,
        issuer: String,
        reason: String,
    },
    #[error("{which} is not a pinned root (its SHA-256 is {fingerprint}; pinned: {pinned})")]
    UnpinnedRoot {
        which: String,
        fingerprint: String,
        pinned: String,
    },
}

/// A verification time: seconds since the Unix epoch (UTC). Evidence is judged at the time the
/// caller says, never at an implicit "now": certificates and collateral expire, and captured
/// vectors are checked at the time they were captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct VerificationTime(pub i64);

impl VerificationTime {
    /// The host's clock.
    pub fn now() -> Self {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self(i64::try_from(secs).unwrap_or(i64::MAX))
    }

    /// RFC 3339 (`2025-06-01T00:00:00Z`), for messages.
    pub fn rfc3339(self) -> String {
        rfc3339(self.0)
    }
}

/// `2025-06-01T00:00:00Z` for Unix seconds (UTC); for a time no RFC 3339 date can say (past
/// the year 9999), the seconds themselves: the text is for messages only.
fn rfc3339(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|at| {
            at.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{secs} s after 1970-01-01T00:00:00Z"))
}

/// A parsed certificate with the name the errors use for it.
pub struct Cert<'a> {
    pub which: &'static str,
    pub der: &'a [u8],
    pub x509: X509Certificate<'a>,
}

impl<'a> Cert<'a> {
    /// Parses `der`, which must be one certificate and nothing after it.
    pub fn parse(which: &'static str, der: &'a [u8]) -> Result<Self, ChainError> {
        let (rest, x509) = X509Certificate::from_der(der).map_err(|e| ChainError::Parse {
            which: which.into(),
            reason: e.to_string(),
        })?;
        if !rest.is_empty() {
            return Err(ChainError::Parse {
                which: which.into(),
                reason: format!("{} bytes after the certificate", rest.len()),
            });
        }
        Ok(Self { which, der, x509 })
    }

    /// The SHA-256 of the DER, hex.
    pub fn fingerprint(&self) -> String {
        hex::encode(Sha256::digest(self.der))
    }

    /// Refused unless valid at `at`.
    pub fn valid_at(&self, at: VerificationTime) -> Result<(), ChainError> {
        let validity = self.x509.validity();
        let (from, to) = (
            validity.not_before.timestamp(),
            validity.not_after.timestamp(),
        );
        if at.0 < from || at.0 > to {
            return Err(ChainError::Validity {
                which: self.which.into(),
                at: rfc3339(at.0),
                not_before: rfc3339(from),
                not_after: rfc3339(to),
            });
        }
        Ok(())
    }

    /// Refused unless `issuer`'s key signed this certificate and its issuer name is
    /// `issuer`'s subject.
    pub fn signed_by(&self, issuer: &Cert<'_>) -> Result<(), ChainError> {
        let refuse = |reason: String| ChainError::Signature {
            which: self.which.into(),
            issuer: issuer.which.into(),
            reason,
        };
        if self.x509.issuer() != issuer.x509.subject() {
            return Err(refuse(format!(
                "its issuer is \"{}\", the issuer's subject \"{}\"",
                self.x509.issuer(),
                issuer.x509.subject()
            )));
        }
        self.x509
            .verify_signature(Some(issuer.x509.public_key()))
            .map_err(|e| refuse(e.to_string()))
    }

    /// Refused unless the SHA-256 of this certificate's DER is one of `pinned` (hex).
    pub fn pinned(&self, pinned: &[&str]) -> Result<(), ChainError> {
        let fingerprint = self.fingerprint();
        if pinned.contains(&fingerprint.as_str()) {
            return Ok(());
        }
        Err(ChainError::UnpinnedRoot {
            which: self.which.into(),
            fingerprint,
            pinned: pinned.join(", "),
        })
    }
}

/// A big-endian integer without leading zero bytes.
pub(crate) fn trim(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// Checks `chain` (leaf first, the root last): every certificate valid at `at`, each signed by
/// the next, the root self-signed and pinned by fingerprint.
pub fn verify_chain(
    chain: &[&Cert<'_>],
    pinned_roots: &[&str],
    at: VerificationTime,
) -> Result<(), ChainError> {
    let Some(root) = chain.last() else {
        return Ok(());
    };
    root.pinned(pinned_roots)?;
    root.signed_by(root)?;
    for cert in chain {
        cert.valid_at(at)?;
    }
    for pair in chain.windows(2) {
        pair[0].signed_by(pair[1])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_780_922_561), "2026-06-08T12:42:41Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    }
}
