//! A Kubernetes release version as kubeadm's `kubernetesVersion`: `v1.33.4`, `v1.34.0-rc.1`.
//!
//! kubeadm reads `ClusterConfiguration.kubernetesVersion` in two steps
//! (`cmd/kubeadm/app/util/config.NormalizeKubernetesVersion`):
//! `kubeadmutil.KubernetesReleaseVersion` matches
//! `^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)([-\w.+]*)?$` (or resolves a label
//! such as `stable-1.33` or `ci/latest` over the network), then apimachinery's
//! `version.ParseSemantic` requires exactly three numbers without leading zeros (each fitting
//! 64 bits), an optional `-<pre-release>` of dot-separated `[0-9A-Za-z-]+` identifiers whose
//! numeric ones have no leading zeros either, and an optional `+<build metadata>`.
//!
//! hawser accepts the subset a node can install without asking the internet, in one spelling:
//!
//! - the `v` is required (kubeadm adds it when missing; one value, one text);
//! - release labels (`stable`, `latest-1.33`, `ci/…`) are refused: resolving them needs
//!   `dl.k8s.io`, and what a node runs must not depend on what a web server says that day;
//! - pre-release versions (`-alpha.1`, `-rc.0`) are accepted, as kubeadm accepts them: testing
//!   a release candidate is a legitimate cluster;
//! - build metadata (`+abc123`, CI builds) is refused: images carry released binaries, and the
//!   kubeadm stand-in (`standin/`) refuses it too.
//!
//! Whether this image's kubeadm can install the version (its skew policy) is kubeadm's check:
//! it depends on the binary, not on the text.

use std::fmt;
use std::str::FromStr;

/// A Kubernetes release version, `v<major>.<minor>.<patch>` with an optional
/// `-<pre-release>`, as kubeadm's `kubernetesVersion` accepts it (see the module docs for the
/// exact rule). `Display` gives the text it was parsed from, which is the only spelling
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KubernetesVersion {
    text: String,
    major: u64,
    minor: u64,
    patch: u64,
}

/// Which of the three release numbers a [`KubernetesVersionError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionNumber {
    /// The first number (`1` in `v1.33.4`).
    Major,
    /// The second number (`33` in `v1.33.4`).
    Minor,
    /// The third number (`4` in `v1.33.4`).
    Patch,
}

impl fmt::Display for VersionNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VersionNumber::Major => "major",
            VersionNumber::Minor => "minor",
            VersionNumber::Patch => "patch",
        })
    }
}

/// Why a text is not a Kubernetes release version hawser accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubernetesVersionError {
    /// The text does not start with `v`: a bare `1.33.4`, or a release label such as `stable`.
    #[error(
        "not a Kubernetes version: expected v<major>.<minor>.<patch>, e.g. v1.33.4 (with the \
         'v'; release labels such as stable are not resolved)"
    )]
    Prefix,
    /// There are not exactly three dot-separated numbers before the pre-release.
    #[error(
        "not a Kubernetes version: expected three numbers, v<major>.<minor>.<patch>, found \
         {count} dot-separated parts"
    )]
    NumberCount {
        /// How many dot-separated parts there are.
        count: usize,
    },
    /// A release number is empty or has a character other than `0-9`.
    #[error("not a Kubernetes version: the {number} version is not a decimal number")]
    NotANumber {
        /// Which number.
        number: VersionNumber,
    },
    /// A release number has a leading zero (`v1.033.0`), which kubeadm refuses.
    #[error(
        "not a Kubernetes version: the {number} version has a leading zero (kubeadm refuses it)"
    )]
    LeadingZero {
        /// Which number.
        number: VersionNumber,
    },
    /// A release number does not fit in 64 bits.
    #[error("not a Kubernetes version: the {number} version is too large")]
    TooLarge {
        /// Which number.
        number: VersionNumber,
    },
    /// The pre-release after `-` has an empty identifier (`v1.34.0-`, `v1.34.0-rc..1`) or a
    /// character other than `0-9`, `A-Z`, `a-z`, `-` and `.`.
    #[error(
        "not a Kubernetes version: the pre-release after '-' must be dot-separated identifiers \
         of letters, digits and '-', e.g. v1.34.0-rc.1"
    )]
    PreRelease,
    /// A numeric identifier of the pre-release has a leading zero (`v1.34.0-rc.01`), which
    /// kubeadm refuses.
    #[error(
        "not a Kubernetes version: a number in the pre-release has a leading zero (kubeadm \
         refuses it)"
    )]
    PreReleaseLeadingZero,
    /// The version carries `+<build metadata>`, as CI builds do.
    #[error(
        "not a Kubernetes version hawser installs: build metadata ('+…', CI builds) is not \
         accepted, only release and pre-release versions"
    )]
    BuildMetadata,
}

impl KubernetesVersion {
    /// The version's text, e.g. `v1.33.4`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The major version (`1` in `v1.33.4`).
    pub fn major(&self) -> u64 {
        self.major
    }

    /// The minor version (`33` in `v1.33.4`).
    pub fn minor(&self) -> u64 {
        self.minor
    }

    /// The patch version (`4` in `v1.33.4`).
    pub fn patch(&self) -> u64 {
        self.patch
    }

    /// The pre-release after `-` (`rc.1` in `v1.34.0-rc.1`), if any.
    pub fn pre_release(&self) -> Option<&str> {
        self.text.split_once('-').map(|(_, pre)| pre)
    }
}

/// One release number: `0` or digits without a leading zero, fitting 64 bits.
fn release_number(text: &str, number: VersionNumber) -> Result<u64, KubernetesVersionError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(KubernetesVersionError::NotANumber { number });
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(KubernetesVersionError::LeadingZero { number });
    }
    text.parse()
        .map_err(|_| KubernetesVersionError::TooLarge { number })
}

/// The pre-release after `-`, as semver and `version.ParseSemantic` allow it.
fn check_pre_release(pre_release: &str) -> Result<(), KubernetesVersionError> {
    for identifier in pre_release.split('.') {
        let valid = !identifier.is_empty()
            && identifier
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid {
            return Err(KubernetesVersionError::PreRelease);
        }
        let numeric = identifier.bytes().all(|b| b.is_ascii_digit());
        if numeric && identifier.len() > 1 && identifier.starts_with('0') {
            return Err(KubernetesVersionError::PreReleaseLeadingZero);
        }
    }
    Ok(())
}

impl FromStr for KubernetesVersion {
    type Err = KubernetesVersionError;

    fn from_str(text: &str) -> Result<KubernetesVersion, KubernetesVersionError> {
        let rest = text
            .strip_prefix('v')
            .ok_or(KubernetesVersionError::Prefix)?;
        if rest.contains('+') {
            return Err(KubernetesVersionError::BuildMetadata);
        }
        let (release, pre_release) = match rest.split_once('-') {
            Some((release, pre_release)) => (release, Some(pre_release)),
            None => (rest, None),
        };
        let numbers: Vec<&str> = release.split('.').collect();
        let [major, minor, patch] = numbers[..] else {
            return Err(KubernetesVersionError::NumberCount {
                count: numbers.len(),
            });
        };
        let major = release_number(major, VersionNumber::Major)?;
        let minor = release_number(minor, VersionNumber::Minor)?;
        let patch = release_number(patch, VersionNumber::Patch)?;
        if let Some(pre_release) = pre_release {
            check_pre_release(pre_release)?;
        }
        Ok(KubernetesVersion {
            text: text.to_owned(),
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KubernetesVersionError as E;
    use VersionNumber::{Major, Minor, Patch};

    fn version(text: &str) -> Result<KubernetesVersion, KubernetesVersionError> {
        text.parse()
    }

    #[test]
    fn release_and_pre_release_versions_parse_and_print_as_given() {
        for (text, numbers, pre_release) in [
            ("v1.33.4", (1, 33, 4), None),
            ("v1.31.12", (1, 31, 12), None),
            ("v1.0.0", (1, 0, 0), None),
            ("v0.0.0", (0, 0, 0), None),
            ("v1.34.0-rc.1", (1, 34, 0), Some("rc.1")),
            ("v1.34.0-alpha.0", (1, 34, 0), Some("alpha.0")),
            ("v1.34.0-beta.2.x-y", (1, 34, 0), Some("beta.2.x-y")),
            ("v1.34.0-0", (1, 34, 0), Some("0")),
            ("v18446744073709551615.0.0", (u64::MAX, 0, 0), None),
        ] {
            let parsed = version(text).unwrap();
            assert_eq!(
                (parsed.major(), parsed.minor(), parsed.patch()),
                numbers,
                "{text}"
            );
            assert_eq!(parsed.pre_release(), pre_release, "{text}");
            assert_eq!(parsed.as_str(), text);
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn what_kubeadm_refuses_or_would_fetch_is_refused_with_the_reason() {
        for (bad, expected) in [
            // Leading zeros: kubeadm's semantic version parser refuses them.
            ("v1.033.0", E::LeadingZero { number: Minor }),
            ("v01.33.0", E::LeadingZero { number: Major }),
            ("v1.33.00", E::LeadingZero { number: Patch }),
            ("v1.34.0-rc.01", E::PreReleaseLeadingZero),
            // The 'v' is required; labels need the network.
            ("1.33.4", E::Prefix),
            ("stable", E::Prefix),
            ("stable-1.33", E::Prefix),
            ("ci/latest", E::Prefix),
            ("V1.33.4", E::Prefix),
            (" v1.33.4", E::Prefix),
            ("", E::Prefix),
            // Three numbers, no more, no less.
            ("v1.33", E::NumberCount { count: 2 }),
            ("v1", E::NumberCount { count: 1 }),
            ("v1.33.4.1", E::NumberCount { count: 4 }),
            ("v", E::NumberCount { count: 1 }),
            ("v1..4", E::NotANumber { number: Minor }),
            ("v1.33.", E::NotANumber { number: Patch }),
            ("v1.x.4", E::NotANumber { number: Minor }),
            ("v1.33.4 ", E::NotANumber { number: Patch }),
            ("v1.33.4\n", E::NotANumber { number: Patch }),
            ("v1.33.٤", E::NotANumber { number: Patch }),
            ("v1.33.-4", E::NotANumber { number: Patch }),
            ("v18446744073709551616.0.0", E::TooLarge { number: Major }),
            // The pre-release.
            ("v1.33.0-", E::PreRelease),
            ("v1.34.0-rc..1", E::PreRelease),
            ("v1.34.0-rc.", E::PreRelease),
            ("v1.34.0-rc_1", E::PreRelease),
            ("v1.34.0-rc 1", E::PreRelease),
            // Build metadata (CI builds).
            ("v1.34.0-alpha.0.123+0123abcd", E::BuildMetadata),
            ("v1.33.4+build", E::BuildMetadata),
        ] {
            let err = version(bad).unwrap_err();
            assert_eq!(err, expected, "{bad:?}");
            assert!(err.to_string().contains("Kubernetes version"), "{err}");
        }
    }

    #[test]
    fn errors_name_the_number_but_never_repeat_the_input() {
        let err = version("v1.033.0").unwrap_err().to_string();
        assert_eq!(
            err,
            "not a Kubernetes version: the minor version has a leading zero (kubeadm refuses it)"
        );
        assert!(!err.contains("033"), "{err}");
    }
}
