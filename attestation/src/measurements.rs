//! Expected measurements: the sha256 PCR values a verifier accepts, per PCR, as released with
//! an image.
//!
//! The file format is Constellation's, a JSON object keyed by decimal PCR index:
//!
//! ```json
//! { "4":  { "expected": "<64 hex digits>", "warnOnly": false },
//!   "0":  { "expected": "<64 hex digits>", "warnOnly": true } }
//! ```
//!
//! Keys that are not decimal numbers are metadata (an image name, a version, a comment) and
//! are ignored, as are fields of an entry other than `expected` and `warnOnly`. A missing
//! `warnOnly` means `false`: a PCR is enforced unless the file says otherwise.
//!
//! One extension, which readers of Constellation's format ignore (they then enforce `expected`
//! alone, the stricter policy): `"alsoExpected": ["<64 hex digits>", …]` lists further values the
//! PCR may hold. hawser's reference files use it for PCR 4 on the firmware boot paths they allow
//! (boot options that failed before the UKI, a known boot manager in front of it): each value is
//! predicted from the image, and a path through any other application gives none of them.
//!
//! Semantics of [`ExpectedMeasurements::check`]: every enforced PCR must be present and equal
//! to its expected value or one of its `alsoExpected` values; a `warnOnly` PCR that differs or is
//! missing only produces a [`MeasurementWarning`], which the verifier logs and returns. PCRs the
//! evidence carries but the file does not mention are not judged, except for values refused by
//! name.
//!
//! Names for refusals (set in code, never read from a file): [`ExpectedMeasurements::refuse`]
//! names a value a PCR must not hold — the refusal then says what that value *is* (a worker's
//! PCR 11, a fresh node's PCR 15), whether or not the PCR has an expectation — and
//! [`ExpectedMeasurements::explain`] says what any other difference of a PCR means (a join
//! service of another cluster). Both only change what a refusal says, and the first adds a
//! refusal; neither accepts anything.

use std::collections::BTreeMap;
use std::path::Path;

use thiserror::Error;

/// The highest PCR index of a PC-client TPM.
const MAX_PCR: u8 = 23;

/// The expectation for one PCR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedPcr {
    /// The sha256-bank value.
    pub expected: [u8; 32],
    /// A difference is logged but not refused.
    pub warn_only: bool,
}

/// The expected sha256 PCR values of an image (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedMeasurements {
    pcrs: BTreeMap<u8, ExpectedPcr>,
    /// Further accepted values per PCR (`alsoExpected`).
    also: BTreeMap<u8, Vec<[u8; 32]>>,
    /// Values refused with a name, per PCR ([`ExpectedMeasurements::refuse`]).
    refused: BTreeMap<u8, Vec<([u8; 32], String)>>,
    /// What any other difference of a PCR means ([`ExpectedMeasurements::explain`]).
    meanings: BTreeMap<u8, String>,
}

/// A measurements file that cannot be used.
#[derive(Debug, Error)]
pub enum MeasurementsError {
    /// The file cannot be read.
    #[error("cannot read expected measurements from {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text is not JSON.
    #[error("expected measurements are not valid JSON")]
    Json(#[from] serde_json::Error),
    /// The top level is not an object.
    #[error("expected measurements must be a JSON object keyed by PCR index")]
    NotAnObject,
    /// A numeric key that is not a PCR index.
    #[error("expected measurements name PCR {key}, but a TPM has PCRs 0 to 23")]
    PcrIndex { key: String },
    /// An entry without a usable `expected` or `warnOnly` field.
    #[error("expected measurement for PCR {pcr} is malformed: {reason}")]
    Entry { pcr: u8, reason: String },
    /// An entry whose `expected` field is not hex.
    #[error("expected measurement for PCR {pcr} is malformed: \"expected\" is not hex")]
    Hex {
        pcr: u8,
        #[source]
        source: hex::FromHexError,
    },
}

/// A PCR that differs from its expectation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrMismatch {
    /// The PCR index.
    pub pcr: u8,
    /// The expected value.
    pub expected: [u8; 32],
    /// The value in the evidence; `None` if the evidence does not quote this PCR.
    pub actual: Option<[u8; 32]>,
    /// What the difference means, when the expectations name it
    /// ([`ExpectedMeasurements::refuse`], [`ExpectedMeasurements::explain`]).
    pub meaning: Option<String>,
}

impl std::fmt::Display for PcrMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.actual {
            Some(actual) => write!(
                f,
                "PCR {} expected {} actual {}",
                self.pcr,
                hex::encode(self.expected),
                hex::encode(actual)
            )?,
            None => write!(
                f,
                "PCR {} expected {} but it is not quoted",
                self.pcr,
                hex::encode(self.expected)
            )?,
        }
        match &self.meaning {
            Some(meaning) => write!(f, " ({meaning})"),
            None => Ok(()),
        }
    }
}

/// A PCR that holds a value refused by name ([`ExpectedMeasurements::refuse`]) and has no
/// expectation of its own that it missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedPcr {
    /// The PCR index.
    pub pcr: u8,
    /// The refused value it holds.
    pub value: [u8; 32],
    /// What that value is.
    pub meaning: String,
}

impl std::fmt::Display for RefusedPcr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PCR {} holds {} ({})",
            self.pcr,
            hex::encode(self.value),
            self.meaning
        )
    }
}

/// A `warnOnly` PCR that differs: logged and reported, not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeasurementWarning(pub PcrMismatch);

impl std::fmt::Display for MeasurementWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (warnOnly)", self.0)
    }
}

/// Enforced PCRs that differ from their expectation, and PCRs that hold a refused value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("measurements differ from the expected ones: {}", join(.mismatches, .refused))]
pub struct MeasurementMismatch {
    /// Every enforced PCR that differs, ascending.
    pub mismatches: Vec<PcrMismatch>,
    /// Every other PCR that holds a value refused by name, ascending.
    pub refused: Vec<RefusedPcr>,
}

fn join(mismatches: &[PcrMismatch], refused: &[RefusedPcr]) -> String {
    mismatches
        .iter()
        .map(ToString::to_string)
        .chain(refused.iter().map(ToString::to_string))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ExpectedMeasurements {
    /// No expectations (add them with [`ExpectedMeasurements::insert`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the JSON format described in the module docs.
    pub fn from_json(text: &str) -> Result<Self, MeasurementsError> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        let object = value.as_object().ok_or(MeasurementsError::NotAnObject)?;
        let mut pcrs = BTreeMap::new();
        let mut also = BTreeMap::new();
        for (key, entry) in object {
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
                continue; // metadata
            }
            let pcr = key
                .parse::<u8>()
                .ok()
                .filter(|pcr| *pcr <= MAX_PCR)
                .ok_or_else(|| MeasurementsError::PcrIndex { key: key.clone() })?;
            pcrs.insert(pcr, parse_entry(pcr, entry)?);
            let alternatives = parse_also(pcr, entry)?;
            if !alternatives.is_empty() {
                also.insert(pcr, alternatives);
            }
        }
        Ok(Self {
            pcrs,
            also,
            ..Self::default()
        })
    }

    /// Reads and parses a measurements file.
    pub fn from_json_file(path: &Path) -> Result<Self, MeasurementsError> {
        let text = std::fs::read_to_string(path).map_err(|source| MeasurementsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text)
    }

    /// Sets the expectation for `pcr` (replacing any previous one).
    pub fn insert(&mut self, pcr: u8, expected: ExpectedPcr) -> &mut Self {
        self.pcrs.insert(pcr, expected);
        self
    }

    /// Also accepts `value` for `pcr` (another allowed boot path's value).
    pub fn also_accept(&mut self, pcr: u8, value: [u8; 32]) -> &mut Self {
        self.also.entry(pcr).or_default().push(value);
        self
    }

    /// Refuses evidence whose `pcr` holds `value`, saying that it is `meaning` ("the join
    /// service's TPM is a worker's: …"), whether or not `pcr` has an expectation; an
    /// expectation `pcr` misses with that value carries the meaning too. Accepts nothing.
    pub fn refuse(&mut self, pcr: u8, value: [u8; 32], meaning: impl Into<String>) -> &mut Self {
        self.refused
            .entry(pcr)
            .or_default()
            .push((value, meaning.into()));
        self
    }

    /// Says what any other difference from `pcr`'s expectation means (one not named by
    /// [`ExpectedMeasurements::refuse`]). Accepts nothing.
    pub fn explain(&mut self, pcr: u8, meaning: impl Into<String>) -> &mut Self {
        self.meanings.insert(pcr, meaning.into());
        self
    }

    /// The name of `value` in `pcr`, if it is refused by name.
    fn refused_as(&self, pcr: u8, value: Option<[u8; 32]>) -> Option<&str> {
        let value = value?;
        self.refused
            .get(&pcr)?
            .iter()
            .find(|(refused, _)| *refused == value)
            .map(|(_, meaning)| meaning.as_str())
    }

    /// The further values accepted for `pcr` besides its expectation.
    pub fn also_accepted(&self, pcr: u8) -> &[[u8; 32]] {
        self.also.get(&pcr).map_or(&[], Vec::as_slice)
    }

    /// The expectation for `pcr`.
    pub fn get(&self, pcr: u8) -> Option<&ExpectedPcr> {
        self.pcrs.get(&pcr)
    }

    /// All expectations, by ascending PCR index.
    pub fn iter(&self) -> impl Iterator<Item = (u8, &ExpectedPcr)> {
        self.pcrs.iter().map(|(pcr, e)| (*pcr, e))
    }

    /// The PCRs whose difference is refused.
    pub fn enforced(&self) -> impl Iterator<Item = u8> + '_ {
        self.iter()
            .filter(|(_, e)| !e.warn_only)
            .map(|(pcr, _)| pcr)
    }

    /// Compares `actual` (sha256 PCR values from verified evidence) with the expectations:
    /// `Err` naming every enforced PCR that differs or is missing, else the warnings for
    /// `warnOnly` PCRs that differ.
    pub fn check(
        &self,
        actual: &BTreeMap<u8, [u8; 32]>,
    ) -> Result<Vec<MeasurementWarning>, MeasurementMismatch> {
        let mut mismatches = Vec::new();
        let mut warnings = Vec::new();
        for (pcr, expected) in self.iter() {
            let value = actual.get(&pcr).copied();
            if value == Some(expected.expected)
                || value.is_some_and(|v| self.also_accepted(pcr).contains(&v))
            {
                continue;
            }
            let meaning = self
                .refused_as(pcr, value)
                .or(self.meanings.get(&pcr).map(String::as_str))
                .map(str::to_owned);
            let mismatch = PcrMismatch {
                pcr,
                expected: expected.expected,
                actual: value,
                meaning,
            };
            if expected.warn_only {
                warnings.push(MeasurementWarning(mismatch));
            } else {
                mismatches.push(mismatch);
            }
        }
        // A refused value is refused even where nothing is expected (or only warned about).
        let refused: Vec<RefusedPcr> = self
            .refused
            .keys()
            .filter(|pcr| !mismatches.iter().any(|m| m.pcr == **pcr))
            .filter_map(|&pcr| {
                let value = actual.get(&pcr).copied()?;
                let meaning = self.refused_as(pcr, Some(value))?.to_owned();
                Some(RefusedPcr {
                    pcr,
                    value,
                    meaning,
                })
            })
            .collect();
        if mismatches.is_empty() && refused.is_empty() {
            Ok(warnings)
        } else {
            Err(MeasurementMismatch {
                mismatches,
                refused,
            })
        }
    }
}

fn parse_entry(pcr: u8, entry: &serde_json::Value) -> Result<ExpectedPcr, MeasurementsError> {
    let malformed = |reason: String| MeasurementsError::Entry { pcr, reason };
    let object = entry
        .as_object()
        .ok_or_else(|| malformed(format!("{entry} is not an object")))?;
    let expected = object
        .get("expected")
        .ok_or_else(|| malformed("it has no \"expected\" field".into()))?
        .as_str()
        .ok_or_else(|| malformed("\"expected\" is not a string".into()))?;
    let bytes = hex::decode(expected).map_err(|source| MeasurementsError::Hex { pcr, source })?;
    let len = bytes.len();
    let expected: [u8; 32] = bytes.try_into().map_err(|_| {
        malformed(format!(
            "\"expected\" holds {len} bytes, a sha256 PCR holds 32"
        ))
    })?;
    let warn_only = match object.get("warnOnly") {
        None => false,
        Some(value) => value
            .as_bool()
            .ok_or_else(|| malformed(format!("\"warnOnly\" is {value}, not a boolean")))?,
    };
    Ok(ExpectedPcr {
        expected,
        warn_only,
    })
}

/// An entry's `alsoExpected` values (absent: none).
fn parse_also(pcr: u8, entry: &serde_json::Value) -> Result<Vec<[u8; 32]>, MeasurementsError> {
    let malformed = |reason: String| MeasurementsError::Entry { pcr, reason };
    let Some(list) = entry.get("alsoExpected") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| malformed(format!("\"alsoExpected\" is {list}, not a list")))?;
    list.iter()
        .map(|v| {
            let text = v
                .as_str()
                .ok_or_else(|| malformed(format!("\"alsoExpected\" holds {v}, not a string")))?;
            let bytes =
                hex::decode(text).map_err(|source| MeasurementsError::Hex { pcr, source })?;
            let len = bytes.len();
            bytes.try_into().map_err(|_| {
                malformed(format!(
                    "\"alsoExpected\" holds {len} bytes, a sha256 PCR holds 32"
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn measurements() -> ExpectedMeasurements {
        ExpectedMeasurements::from_json(&format!(
            r#"{{
                "4": {{"expected": "{A}", "warnOnly": false}},
                "11": {{"expected": "{A}"}},
                "0": {{"expected": "{B}", "warnOnly": true, "description": "firmware"}},
                "image": "hawser-0.1.0",
                "measurementSalt": "ignored too"
            }}"#
        ))
        .expect("parses")
    }

    #[test]
    fn also_expected_values_are_accepted_and_nothing_else() {
        const C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
        let m = ExpectedMeasurements::from_json(&format!(
            r#"{{"4": {{"expected": "{A}", "warnOnly": false, "alsoExpected": ["{B}"]}},
                "11": {{"expected": "{A}"}}}}"#
        ))
        .expect("parses");
        assert_eq!(m.also_accepted(4), [[0xbb; 32]]);
        let quote = |pcr4: u8| BTreeMap::from([(4, [pcr4; 32]), (11, [0xaa; 32])]);
        assert!(m.check(&quote(0xaa)).is_ok());
        assert!(
            m.check(&quote(0xbb)).is_ok(),
            "an allowed boot path's PCR 4"
        );
        let refused = m.check(&quote(0xcc)).expect_err("an unknown path");
        assert_eq!(refused.mismatches[0].pcr, 4);
        // Only the PCR that lists it: PCR 11 does not accept PCR 4's alternative.
        let other = BTreeMap::from([(4, [0xaa; 32]), (11, [0xbb; 32])]);
        assert!(m.check(&other).is_err());
        for bad in [
            format!(r#"{{"4": {{"expected": "{A}", "alsoExpected": "{B}"}}}}"#),
            format!(r#"{{"4": {{"expected": "{A}", "alsoExpected": [1]}}}}"#),
            format!(
                r#"{{"4": {{"expected": "{A}", "alsoExpected": ["{}"]}}}}"#,
                &C[..62]
            ),
        ] {
            let err = ExpectedMeasurements::from_json(&bad)
                .expect_err(&bad)
                .to_string();
            assert!(
                err.contains("PCR 4") || err.contains("alsoExpected"),
                "{err}"
            );
        }
    }

    #[test]
    fn parses_constellation_format_and_ignores_metadata() {
        let m = measurements();
        assert_eq!(m.iter().map(|(pcr, _)| pcr).collect::<Vec<_>>(), [0, 4, 11]);
        assert!(m.get(0).expect("PCR 0").warn_only);
        assert!(!m.get(4).expect("PCR 4").warn_only);
        assert!(
            !m.get(11).expect("PCR 11").warn_only,
            "absent warnOnly enforces"
        );
        assert_eq!(m.get(4).expect("PCR 4").expected, [0xaa; 32]);
        assert_eq!(m.enforced().collect::<Vec<_>>(), [4, 11]);
    }

    #[test]
    fn exact_match_with_warn_only_semantics() {
        let m = measurements();
        let mut actual: BTreeMap<u8, [u8; 32]> = [
            (0, [0xbb; 32]),
            (4, [0xaa; 32]),
            (11, [0xaa; 32]),
            (12, [1; 32]),
        ]
        .into();
        assert_eq!(m.check(&actual), Ok(vec![]), "PCR 12 is not judged");

        actual.insert(0, [0xcc; 32]);
        let warnings = m.check(&actual).expect("warnOnly difference is accepted");
        assert_eq!(warnings.len(), 1);
        assert_eq!(
            warnings[0].to_string(),
            format!("PCR 0 expected {B} actual {} (warnOnly)", "cc".repeat(32))
        );

        actual.insert(4, [0xdd; 32]);
        actual.remove(&11);
        let err = m.check(&actual).expect_err("enforced PCRs differ");
        assert_eq!(
            err.to_string(),
            format!(
                "measurements differ from the expected ones: PCR 4 expected {A} actual {}; \
                 PCR 11 expected {A} but it is not quoted",
                "dd".repeat(32)
            )
        );
    }

    #[test]
    fn refused_values_are_named_and_refused_even_without_an_expectation() {
        let mut m = measurements();
        m.refuse(11, [0xee; 32], "a worker's PCR 11")
            .refuse(15, [0; 32], "a fresh node's PCR 15")
            .explain(11, "another image");
        let quote = |pcr11: u8, pcr15: u8| {
            BTreeMap::from([
                (0, [0xbb; 32]),
                (4, [0xaa; 32]),
                (11, [pcr11; 32]),
                (15, [pcr15; 32]),
            ])
        };
        assert_eq!(m.check(&quote(0xaa, 0x15)), Ok(vec![]));
        // The named value: one mismatch, with its name.
        let err = m.check(&quote(0xee, 0x15)).expect_err("a worker's value");
        assert_eq!(err.mismatches.len(), 1);
        assert!(err.refused.is_empty());
        assert_eq!(
            err.to_string(),
            format!(
                "measurements differ from the expected ones: PCR 11 expected {A} actual {} \
                 (a worker's PCR 11)",
                "ee".repeat(32)
            )
        );
        // Any other difference: the PCR's explanation.
        let err = m.check(&quote(0xcc, 0x15)).expect_err("another value");
        assert_eq!(err.mismatches[0].meaning.as_deref(), Some("another image"));
        // A refused value of a PCR nothing is expected of.
        let err = m.check(&quote(0xaa, 0)).expect_err("a fresh node");
        assert!(err.mismatches.is_empty());
        assert_eq!(
            err.to_string(),
            format!(
                "measurements differ from the expected ones: PCR 15 holds {} (a fresh node's \
                 PCR 15)",
                "00".repeat(32)
            )
        );
        // Both at once, and nothing named without a refusal to name.
        let err = m.check(&quote(0xee, 0)).expect_err("both");
        assert_eq!((err.mismatches.len(), err.refused.len()), (1, 1));
        assert_eq!(measurements().check(&quote(0xaa, 0)), Ok(vec![]));
        let plain = measurements().check(&quote(0xee, 0)).expect_err("differs");
        assert_eq!(plain.mismatches[0].meaning, None);
    }

    #[test]
    fn malformed_files_name_the_problem() {
        let cases = [
            ("[]", "must be a JSON object"),
            ("{\"24\": {\"expected\": \"00\"}}", "PCR 24"),
            ("{\"300\": {}}", "PCR 300"),
            ("{\"4\": \"aa\"}", "PCR 4 is malformed"),
            ("{\"4\": {}}", "no \"expected\" field"),
            ("{\"4\": {\"expected\": \"zz\"}}", "not hex"),
            ("{\"4\": {\"expected\": \"aabb\"}}", "holds 2 bytes"),
            (
                &format!("{{\"4\": {{\"expected\": \"{A}\", \"warnOnly\": \"yes\"}}}}"),
                "not a boolean",
            ),
            ("{", "not valid JSON"),
        ];
        for (text, needle) in cases {
            let err = ExpectedMeasurements::from_json(text).expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }
}
