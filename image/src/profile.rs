//! What an image is built for, production or development, as far as it changes the measured
//! kernel command line: today the state disk's integrity.
//!
//! A production image's state disk is dm-crypt on dm-integrity (`hmac-sha256`): without it the
//! host can change or roll back single sectors of AES-XTS ciphertext undetected
//! (docs/security.md). The price is a first-boot wipe proportional to the disk
//! (docs/benchmarks.md), which is why development images — the QEMU tests', `hawser local up`'s
//! — leave it out. The choice is on the measured command line, so a verifier sees which kind of
//! image a node booted.

/// The command-line key of the state disk's integrity mode (PID 1's `hawser.state_disk_integrity`).
pub const INTEGRITY_KEY: &str = "hawser.state_disk_integrity";
/// The integrity mode of production images.
pub const PRODUCTION_INTEGRITY: &str = "hmac-sha256";

/// What an image is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageProfile {
    /// The default of `hawser image build`: the state disk has `hmac-sha256` integrity.
    #[default]
    Production,
    /// `hawser image build --development`: AES-XTS only (confidentiality without integrity),
    /// no first-boot wipe. For tests and local development.
    Development,
}

/// Why a command line does not fit the profile.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    /// A production image's command line turns the state disk's integrity off (or asks for a
    /// mode production images do not use).
    #[error(
        "the command line sets {INTEGRITY_KEY}={found}, but production images use \
         {INTEGRITY_KEY}={PRODUCTION_INTEGRITY}: drop the key, or build with --development"
    )]
    IntegrityOff {
        /// The value the command line gives.
        found: String,
    },
}

impl ImageProfile {
    /// The measured command line of an image of this profile, from the one the builder was
    /// given: production adds `hawser.state_disk_integrity=hmac-sha256` unless the line already
    /// says so (and refuses a line that says otherwise); development adds nothing, so PID 1's
    /// default (no integrity) applies unless the line asks for it.
    pub fn cmdline(self, base: &str) -> Result<String, ProfileError> {
        let prefix = format!("{INTEGRITY_KEY}=");
        let given = base
            .split_ascii_whitespace()
            .filter_map(|word| word.strip_prefix(&prefix))
            .next_back();
        match (self, given) {
            (ImageProfile::Development, _) => Ok(base.to_owned()),
            (ImageProfile::Production, None) => {
                Ok(format!("{base} {INTEGRITY_KEY}={PRODUCTION_INTEGRITY}"))
            }
            (ImageProfile::Production, Some(PRODUCTION_INTEGRITY)) => Ok(base.to_owned()),
            (ImageProfile::Production, Some(found)) => Err(ProfileError::IntegrityOff {
                found: found.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::DEFAULT_CMDLINE;

    #[test]
    fn production_images_have_integrity_and_development_images_do_not() {
        assert_eq!(
            ImageProfile::default().cmdline(DEFAULT_CMDLINE).unwrap(),
            format!("{DEFAULT_CMDLINE} hawser.state_disk_integrity=hmac-sha256")
        );
        assert_eq!(
            ImageProfile::Development.cmdline(DEFAULT_CMDLINE).unwrap(),
            DEFAULT_CMDLINE
        );
    }

    #[test]
    fn a_production_line_that_asks_for_integrity_is_kept_and_one_that_turns_it_off_is_refused() {
        let with = "console=ttyS0 hawser.state_disk_integrity=hmac-sha256";
        assert_eq!(ImageProfile::Production.cmdline(with).unwrap(), with);
        let without = "console=ttyS0 hawser.state_disk_integrity=none";
        let err = ImageProfile::Production.cmdline(without).unwrap_err();
        assert_eq!(
            err,
            ProfileError::IntegrityOff {
                found: "none".into()
            }
        );
        assert!(err.to_string().contains("--development"), "{err}");
        // PID 1 uses the last occurrence of a key; so does the check.
        let last_wins = "hawser.state_disk_integrity=hmac-sha256 hawser.state_disk_integrity=none";
        assert!(ImageProfile::Production.cmdline(last_wins).is_err());
        // A development image may still ask for integrity explicitly.
        assert_eq!(ImageProfile::Development.cmdline(with).unwrap(), with);
    }
}
