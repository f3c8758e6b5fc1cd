//! Several accepted sets of expected measurements at once: the *releases* of a cluster.
//!
//! While a cluster is upgraded, its join services accept the nodes of the old image and of the
//! new one; once the old one is retired, its nodes are refused *by name*, so an operator reads
//! "release `v1` was retired" rather than a list of PCR differences. Each release is a whole
//! [`ExpectedMeasurements`]: a quote matches a release when it matches every enforced PCR of
//! that release; PCRs of two releases never mix.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::measurements::{ExpectedMeasurements, MeasurementMismatch, MeasurementWarning};

/// One release: its name and the measurements its nodes quote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedMeasurements {
    /// The release's name (`v1.2.0`, or the digest of an unnamed one).
    pub name: String,
    /// What a node of this release quotes.
    pub measurements: ExpectedMeasurements,
}

/// The releases accepted now, and the retired ones, refused by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseSet {
    accepted: Vec<NamedMeasurements>,
    retired: Vec<NamedMeasurements>,
}

/// Why no release admits a quote.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReleaseMismatch {
    /// The quote is exactly a retired release's.
    #[error(
        "the node runs release {name}, which the cluster's admin retired; boot it from an \
         accepted release ({accepted})"
    )]
    Retired {
        /// The retired release.
        name: String,
        /// The accepted releases' names, comma-separated.
        accepted: String,
    },
    /// One accepted release, and the quote differs from it.
    #[error(transparent)]
    Single(MeasurementMismatch),
    /// Several accepted releases, and the quote differs from each.
    #[error("the measurements match no accepted release: {}", describe(.0))]
    NoRelease(Vec<(String, MeasurementMismatch)>),
    /// Nothing is accepted at all.
    #[error("no release is accepted (every release of the cluster is retired)")]
    NothingAccepted,
}

fn describe(mismatches: &[(String, MeasurementMismatch)]) -> String {
    mismatches
        .iter()
        .map(|(name, mismatch)| format!("release {name}: {mismatch}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ReleaseSet {
    /// A set that accepts `measurements` only, under `name`.
    pub fn single(name: impl Into<String>, measurements: ExpectedMeasurements) -> Self {
        Self {
            accepted: vec![NamedMeasurements {
                name: name.into(),
                measurements,
            }],
            retired: Vec::new(),
        }
    }

    /// Adds an accepted release.
    pub fn accept(&mut self, name: impl Into<String>, measurements: ExpectedMeasurements) {
        self.accepted.push(NamedMeasurements {
            name: name.into(),
            measurements,
        });
    }

    /// Adds a retired release: a quote that matches it is refused naming it.
    pub fn retire(&mut self, name: impl Into<String>, measurements: ExpectedMeasurements) {
        self.retired.push(NamedMeasurements {
            name: name.into(),
            measurements,
        });
    }

    /// The accepted releases, in the order they were added.
    pub fn accepted(&self) -> &[NamedMeasurements] {
        &self.accepted
    }

    /// The retired releases.
    pub fn retired(&self) -> &[NamedMeasurements] {
        &self.retired
    }

    /// Whether every accepted release enforces at least one PCR, and there is one.
    pub fn enforces_something(&self) -> bool {
        !self.accepted.is_empty()
            && self
                .accepted
                .iter()
                .all(|r| r.measurements.enforced().next().is_some())
    }

    /// The PCRs any accepted release enforces, ascending.
    pub fn enforced(&self) -> Vec<u8> {
        let mut pcrs: Vec<u8> = self
            .accepted
            .iter()
            .flat_map(|r| r.measurements.enforced())
            .collect();
        pcrs.sort_unstable();
        pcrs.dedup();
        pcrs
    }

    /// The first accepted release `actual` matches, with its warnings; else why none does. A
    /// quote that matches no accepted release but exactly a retired one is refused naming the
    /// retired release.
    pub fn check(
        &self,
        actual: &BTreeMap<u8, [u8; 32]>,
    ) -> Result<(&str, Vec<MeasurementWarning>), ReleaseMismatch> {
        let mut mismatches = Vec::new();
        for release in &self.accepted {
            match release.measurements.check(actual) {
                Ok(warnings) => return Ok((&release.name, warnings)),
                Err(mismatch) => mismatches.push((release.name.clone(), mismatch)),
            }
        }
        if let Some(retired) = self
            .retired
            .iter()
            .find(|r| r.measurements.check(actual).is_ok())
        {
            return Err(ReleaseMismatch::Retired {
                name: retired.name.clone(),
                accepted: self
                    .accepted
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        match mismatches.len() {
            0 => Err(ReleaseMismatch::NothingAccepted),
            1 => Err(ReleaseMismatch::Single(mismatches.remove(0).1)),
            _ => Err(ReleaseMismatch::NoRelease(mismatches)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurements::ExpectedPcr;

    fn release(pcr4: u8, pcr11: u8) -> ExpectedMeasurements {
        let enforce = |v: u8| ExpectedPcr {
            expected: [v; 32],
            warn_only: false,
        };
        let mut m = ExpectedMeasurements::new();
        m.insert(4, enforce(pcr4)).insert(11, enforce(pcr11));
        m
    }

    fn quote(pcr4: u8, pcr11: u8) -> BTreeMap<u8, [u8; 32]> {
        BTreeMap::from([(4, [pcr4; 32]), (11, [pcr11; 32])])
    }

    #[test]
    fn a_quote_matches_the_release_it_was_booted_from_and_pcrs_of_two_releases_never_mix() {
        let mut set = ReleaseSet::single("v1", release(1, 1));
        set.accept("v2", release(2, 2));
        assert_eq!(set.check(&quote(1, 1)).unwrap().0, "v1");
        assert_eq!(set.check(&quote(2, 2)).unwrap().0, "v2");
        let mixed = set.check(&quote(1, 2)).unwrap_err();
        let text = mixed.to_string();
        assert!(matches!(mixed, ReleaseMismatch::NoRelease(_)), "{text}");
        assert!(
            text.contains("release v1: ") && text.contains("release v2: "),
            "{text}"
        );
        assert_eq!(set.enforced(), vec![4, 11]);
    }

    #[test]
    fn a_retired_release_is_refused_by_name_and_one_release_reports_as_before() {
        let mut set = ReleaseSet::single("v2", release(2, 2));
        set.retire("v1", release(1, 1));
        let err = set.check(&quote(1, 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the node runs release v1, which the cluster's admin retired; boot it from an \
             accepted release (v2)"
        );
        let other = set.check(&quote(3, 3)).unwrap_err();
        assert!(matches!(other, ReleaseMismatch::Single(_)), "{other}");
        assert!(
            other
                .to_string()
                .starts_with("measurements differ from the expected ones: PCR 4"),
            "{other}"
        );
        let empty = ReleaseSet::default();
        assert!(!empty.enforces_something());
        assert_eq!(
            empty.check(&quote(1, 1)).unwrap_err(),
            ReleaseMismatch::NothingAccepted
        );
    }
}
