//! Reference measurement files: the expected PCR values of a released image, in the JSON shape
//! Constellation users already have, plus the metadata needed to say *why* a rebuild differs.
//!
//! ```json
//! {
//!   "0":  { "expected": "…", "warnOnly": true },
//!   "4":  { "expected": "…", "warnOnly": false },
//!   "11": { "expected": "…", "warnOnly": false },
//!   "formatVersion": 1,
//!   "measurementsAfterLeaveInitrd": { "11": { "expected": "…", "warnOnly": false } },
//!   "metadata": { "imageVersion": "0.1.0", "inputLockDigest": "…", "inputs": […], "sections": {…}, … }
//! }
//! ```
//!
//! The decimal keys are exactly Constellation's measurements map (lowercase hex sha256-bank
//! values); every other key is metadata, which a reader of that format ignores (as
//! `hawser_attestation::measurements` does), so the file is a verifier's expected-measurements
//! file as it stands. PCR 11 there is the value the boot report quotes, after `enter-initrd`;
//! `measurementsAfterLeaveInitrd` is the same map for a node that has left the initramfs.
//! Firmware PCRs (0–3, 5–7) are recorded from a real boot and `warnOnly`.
//!
//! [`diff`] compares a reference with a fresh prediction and names what changed: PCRs, UKI
//! sections, locked input packages, initramfs files.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::predict::{PREDICTED_PCRS, Phase, Prediction};

/// The version of this file format.
pub const FORMAT_VERSION: u32 = 1;

/// One PCR's expected value (Constellation's `measurements.Measurement`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    /// Lowercase hex of the sha256-bank value.
    pub expected: String,
    /// A mismatch is reported but does not fail verification (absent = `false`).
    #[serde(default)]
    pub warn_only: bool,
}

/// PCR index → expected value.
pub type Measurements = BTreeMap<u8, Measurement>;

/// A reference measurement file (serialized flat: see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceMeasurements {
    pub format_version: u32,
    /// What a verifier checks for a node in the initramfs (PCR 11 after `enter-initrd`): the
    /// file's decimal keys.
    pub measurements: Measurements,
    /// PCR 11 after `leave-initrd` (other PCRs unchanged).
    pub measurements_after_leave_initrd: Measurements,
    pub metadata: Metadata,
}

/// The non-PCR keys of the file.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileRest {
    format_version: u32,
    measurements_after_leave_initrd: Measurements,
    metadata: Metadata,
}

impl Serialize for ReferenceMeasurements {
    /// PCR keys first in numeric order (serde_json's own maps would sort "11" before "2"), then
    /// the metadata keys.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(self.measurements.len() + 3))?;
        for (pcr, m) in &self.measurements {
            map.serialize_entry(&pcr.to_string(), m)?;
        }
        map.serialize_entry("formatVersion", &self.format_version)?;
        map.serialize_entry(
            "measurementsAfterLeaveInitrd",
            &self.measurements_after_leave_initrd,
        )?;
        map.serialize_entry("metadata", &self.metadata)?;
        map.end()
    }
}

/// Where the values come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// e.g. `hawser-qemu`.
    pub image: String,
    /// The hawser version the image was built from.
    pub image_version: String,
    /// The platform the firmware values are from, e.g. `QEMU q35 + OVMF (Debian 2022.11) + swtpm`.
    pub platform: String,
    /// sha256 of the input lock (`InputLock::digest()`).
    pub input_lock_digest: String,
    /// The locked input packages.
    pub inputs: Vec<InputPackage>,
    /// sha256 and size of the UKI file.
    pub uki: FileDigest,
    /// Authenticode hashes OVMF extends into PCR 4.
    pub uki_authenticode: String,
    pub kernel_authenticode: String,
    /// Every PE section of the UKI by name (first of a name), as loaded.
    pub sections: BTreeMap<String, FileDigest>,
    /// The command line the kernel receives.
    pub cmdline: String,
    /// PCR 11 after systemd-stub, before hawser's phases (the boot report's
    /// `pcr11_before_phase`).
    pub pcr11_after_stub: String,
    /// Initramfs entries (path → sha256 for files, or a description), from the build manifest.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub initramfs: BTreeMap<String, String>,
    /// How the warn-only firmware values were obtained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_values_from: Option<String>,
    /// The tool that wrote the file.
    pub generated_by: String,
}

/// A locked input package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputPackage {
    pub name: String,
    pub version: String,
    pub role: String,
    pub sha256: String,
}

/// Size and sha256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub size: u64,
    pub sha256: String,
}

/// Why a reference file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The text is not JSON, or not of the reference file's shape.
    #[error("the reference measurements are not valid JSON of the expected shape")]
    Json(#[from] serde_json::Error),
    /// The file was written by a hawser with another format.
    #[error(
        "the reference measurements have format version {found}; this hawser reads version {FORMAT_VERSION}"
    )]
    Version { found: u32 },
    /// A PCR value is not a sha256 digest in hex.
    #[error("the reference value of PCR {pcr} is not 64 hex digits: {value:?}")]
    BadValue { pcr: u8, value: String },
    /// A key of the PCR map is not a PCR index.
    #[error("the reference names PCR {key}, but a TPM has PCRs 0 to 23")]
    PcrIndex { key: String },
}

/// Everything a reference is made of besides the prediction.
#[derive(Debug, Clone, Default)]
pub struct ReferenceInputs {
    pub image: String,
    pub image_version: String,
    pub platform: String,
    pub input_lock_digest: String,
    pub inputs: Vec<InputPackage>,
    pub initramfs: BTreeMap<String, String>,
    /// Firmware PCR values (warn-only), e.g. from a verified boot report.
    pub firmware_pcrs: BTreeMap<u8, [u8; 32]>,
    pub firmware_values_from: Option<String>,
}

/// The firmware PCRs recorded as warn-only reference values.
pub const FIRMWARE_PCRS: [u8; 7] = [0, 1, 2, 3, 5, 6, 7];

impl ReferenceMeasurements {
    /// A reference from a prediction and its context.
    pub fn new(prediction: &Prediction, inputs: ReferenceInputs) -> Self {
        let m = |v: [u8; 32], warn_only: bool| Measurement {
            expected: hex::encode(v),
            warn_only,
        };
        let mut measurements: Measurements = prediction
            .pcrs(Phase::EnterInitrd)
            .into_iter()
            .map(|(pcr, v)| (pcr, m(v, false)))
            .collect();
        for (&pcr, &v) in &inputs.firmware_pcrs {
            if FIRMWARE_PCRS.contains(&pcr) {
                measurements.insert(pcr, m(v, true));
            }
        }
        let measurements_after_leave_initrd =
            BTreeMap::from([(11, m(prediction.pcr(11, Phase::LeaveInitrd), false))]);
        let mut sections = BTreeMap::new();
        for s in &prediction.sections {
            sections.entry(s.name.clone()).or_insert(FileDigest {
                size: s.size,
                sha256: hex::encode(s.sha256),
            });
        }
        ReferenceMeasurements {
            format_version: FORMAT_VERSION,
            measurements,
            measurements_after_leave_initrd,
            metadata: Metadata {
                image: inputs.image,
                image_version: inputs.image_version,
                platform: inputs.platform,
                input_lock_digest: inputs.input_lock_digest,
                inputs: inputs.inputs,
                uki: FileDigest {
                    size: prediction.uki_size,
                    sha256: hex::encode(prediction.uki_sha256),
                },
                uki_authenticode: hex::encode(prediction.uki_authenticode),
                kernel_authenticode: hex::encode(prediction.kernel_authenticode),
                sections,
                cmdline: prediction.cmdline.clone(),
                pcr11_after_stub: hex::encode(prediction.pcr(11, Phase::Stub)),
                initramfs: inputs.initramfs,
                firmware_values_from: inputs.firmware_values_from,
                generated_by: format!("hawser-measurements {}", env!("CARGO_PKG_VERSION")),
            },
        }
    }

    /// Parses and validates a reference file's text.
    pub fn parse(text: &str) -> Result<Self, ReferenceError> {
        // Read the format version first, so a future format fails with a version error rather
        // than with whatever field it renamed.
        let keys: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)?;
        if let Some(found) = keys
            .get("formatVersion")
            .and_then(serde_json::Value::as_u64)
            && found != u64::from(FORMAT_VERSION)
        {
            return Err(ReferenceError::Version {
                found: u32::try_from(found).unwrap_or(u32::MAX),
            });
        }
        let rest: FileRest = serde_json::from_str(text)?;
        let mut measurements = Measurements::new();
        for (key, value) in keys {
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let pcr: u8 = key
                .parse()
                .ok()
                .filter(|&pcr| pcr <= 23)
                .ok_or(ReferenceError::PcrIndex { key })?;
            measurements.insert(pcr, serde_json::from_value(value)?);
        }
        let r = ReferenceMeasurements {
            format_version: rest.format_version,
            measurements,
            measurements_after_leave_initrd: rest.measurements_after_leave_initrd,
            metadata: rest.metadata,
        };
        for (&pcr, m) in r
            .measurements
            .iter()
            .chain(&r.measurements_after_leave_initrd)
        {
            if m.expected.len() != 64 || !m.expected.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ReferenceError::BadValue {
                    pcr,
                    value: m.expected.clone(),
                });
            }
        }
        Ok(r)
    }

    /// The file's text: pretty JSON with a trailing newline.
    pub fn render(&self) -> String {
        // Serializing strings, integers and maps with string-like keys cannot fail.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// One PCR whose value changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrChange {
    pub pcr: u8,
    /// `None` for the main map, `Some("leave-initrd")` for the second.
    pub phase: Option<&'static str>,
    pub reference: Option<String>,
    pub current: Option<String>,
    pub warn_only: bool,
    /// Changed sections that are measured into this PCR.
    pub because_of: Vec<String>,
}

/// One changed item of the metadata (a section, an input package, an initramfs file…).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub what: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The difference between a reference and a rebuild.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub pcrs: Vec<PcrChange>,
    pub sections: Vec<Change>,
    pub inputs: Vec<Change>,
    pub initramfs: Vec<Change>,
    pub other: Vec<Change>,
}

impl Diff {
    /// Whether nothing that is predicted differs (firmware values are not compared).
    pub fn is_empty(&self) -> bool {
        self.pcrs.is_empty()
            && self.sections.is_empty()
            && self.inputs.is_empty()
            && self.initramfs.is_empty()
            && self.other.is_empty()
    }
}

/// Which UKI sections each predicted PCR depends on (PCR 4 depends on the whole file).
fn sections_measured_into(pcr: u8) -> &'static [&'static str] {
    match pcr {
        9 => &[".cmdline", ".initrd", ".osrel", ".ucode"],
        11 => &crate::stub::PCR11_SECTION_ORDER,
        _ => &[],
    }
}

/// Compares a reference with a rebuild's reference (made with [`ReferenceMeasurements::new`]
/// from the fresh prediction). Firmware PCRs are not compared: a rebuild cannot reproduce
/// them.
pub fn diff(reference: &ReferenceMeasurements, current: &ReferenceMeasurements) -> Diff {
    let mut d = Diff::default();
    let (rm, cm) = (&reference.metadata, &current.metadata);

    d.sections = compare_maps(
        rm.sections
            .iter()
            .map(|(k, v)| (k.clone(), format!("sha256 {} ({} bytes)", v.sha256, v.size))),
        cm.sections
            .iter()
            .map(|(k, v)| (k.clone(), format!("sha256 {} ({} bytes)", v.sha256, v.size))),
        "section ",
    );
    let changed_sections: Vec<String> = d
        .sections
        .iter()
        .map(|c| c.what.trim_start_matches("section ").to_owned())
        .collect();

    for (phase, r, c) in [
        (None, &reference.measurements, &current.measurements),
        (
            Some("leave-initrd"),
            &reference.measurements_after_leave_initrd,
            &current.measurements_after_leave_initrd,
        ),
    ] {
        for pcr in PREDICTED_PCRS {
            let (rv, cv) = (r.get(&pcr), c.get(&pcr));
            if phase.is_some() && rv.is_none() && cv.is_none() {
                continue;
            }
            if rv.map(|m| &m.expected) != cv.map(|m| &m.expected) {
                let because_of = if pcr == 4 {
                    if changed_sections.is_empty() {
                        vec!["the UKI file".to_owned()]
                    } else {
                        changed_sections.clone()
                    }
                } else {
                    changed_sections
                        .iter()
                        .filter(|s| sections_measured_into(pcr).contains(&s.as_str()))
                        .cloned()
                        .collect()
                };
                d.pcrs.push(PcrChange {
                    pcr,
                    phase,
                    reference: rv.map(|m| m.expected.clone()),
                    current: cv.map(|m| m.expected.clone()),
                    warn_only: rv.is_some_and(|m| m.warn_only),
                    because_of,
                });
            }
        }
    }

    d.inputs = compare_maps(
        rm.inputs.iter().map(|p| {
            (
                format!("{} package {}", p.role, p.name),
                p.version.clone() + " (sha256 " + &p.sha256 + ")",
            )
        }),
        cm.inputs.iter().map(|p| {
            (
                format!("{} package {}", p.role, p.name),
                p.version.clone() + " (sha256 " + &p.sha256 + ")",
            )
        }),
        "",
    );
    if d.inputs.is_empty() && rm.input_lock_digest != cm.input_lock_digest {
        d.inputs.push(Change {
            what: "input lock".to_owned(),
            before: Some(rm.input_lock_digest.clone()),
            after: Some(cm.input_lock_digest.clone()),
        });
    }
    d.initramfs = compare_maps(
        rm.initramfs.iter().map(|(k, v)| (k.clone(), v.clone())),
        cm.initramfs.iter().map(|(k, v)| (k.clone(), v.clone())),
        "/",
    );
    for (what, before, after) in [
        ("command line", &rm.cmdline, &cm.cmdline),
        ("image version", &rm.image_version, &cm.image_version),
    ] {
        if before != after {
            d.other.push(Change {
                what: what.to_owned(),
                before: Some(before.clone()),
                after: Some(after.clone()),
            });
        }
    }
    d
}

fn compare_maps(
    before: impl Iterator<Item = (String, String)>,
    after: impl Iterator<Item = (String, String)>,
    prefix: &str,
) -> Vec<Change> {
    let before: BTreeMap<String, String> = before.collect();
    let after: BTreeMap<String, String> = after.collect();
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| Change {
            what: format!("{prefix}{k}"),
            before: before.get(k).cloned(),
            after: after.get(k).cloned(),
        })
        .collect()
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.before, &self.after) {
            (Some(b), Some(a)) => write!(f, "{} changed from {b} to {a}", self.what),
            (None, Some(a)) => write!(f, "{} added: {a}", self.what),
            (Some(b), None) => write!(f, "{} removed (was {b})", self.what),
            (None, None) => write!(f, "{}", self.what),
        }
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "no differences");
        }
        for p in &self.pcrs {
            let name = match p.phase {
                Some(phase) => format!("PCR {} after {phase}", p.pcr),
                None => format!("PCR {}", p.pcr),
            };
            writeln!(
                f,
                "{name}{}: reference {}, rebuild {}",
                if p.warn_only { " (warn-only)" } else { "" },
                p.reference.as_deref().unwrap_or("(none)"),
                p.current.as_deref().unwrap_or("(none)")
            )?;
            if p.because_of.is_empty() {
                writeln!(
                    f,
                    "    no measured section changed: the rules of the predictor changed (a new hawser-measurements?)"
                )?;
            } else {
                writeln!(
                    f,
                    "    measured inputs that changed: {}",
                    p.because_of.join(", ")
                )?;
            }
        }
        let groups: [(&str, &Vec<Change>); 4] = [
            ("UKI sections", &self.sections),
            ("input lock", &self.inputs),
            ("initramfs files", &self.initramfs),
            ("other", &self.other),
        ];
        for (title, changes) in groups {
            if changes.is_empty() {
                continue;
            }
            writeln!(f, "{title}:")?;
            for c in changes.iter() {
                writeln!(f, "    {c}")?;
            }
        }
        if !self.sections.is_empty() && self.inputs.is_empty() {
            writeln!(
                f,
                "the input lock is unchanged: the difference comes from hawser's own sources (the init binary, the image builder) or from a build that is not reproducible"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_pe::test_support::tiny_pe;

    fn uki(cmdline: &[u8], initrd: &[u8]) -> Vec<u8> {
        let kernel = tiny_pe(&[(".text", b"kernel code")]);
        tiny_pe(&[
            (".osrel", b"ID=hawser\n"),
            (".cmdline", cmdline),
            (".linux", &kernel),
            (".initrd", initrd),
        ])
    }

    fn inputs(kernel_version: &str) -> ReferenceInputs {
        ReferenceInputs {
            image: "hawser-qemu".into(),
            image_version: "0.1.0".into(),
            platform: "test".into(),
            input_lock_digest: format!("lock-{kernel_version}"),
            inputs: vec![InputPackage {
                name: "linux-image-6.12".into(),
                version: kernel_version.into(),
                role: "kernel".into(),
                sha256: format!("sha-{kernel_version}"),
            }],
            initramfs: BTreeMap::from([("init".to_owned(), "aaaa".to_owned())]),
            firmware_pcrs: BTreeMap::from([(0, [7; 32]), (4, [9; 32])]),
            firmware_values_from: Some("a boot".into()),
        }
    }

    #[test]
    fn json_shape_is_constellation_compatible_and_round_trips() {
        let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
        let r = ReferenceMeasurements::new(&p, inputs("1"));
        let text = r.render();
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["0"]["warnOnly"], true);
        assert_eq!(v["4"]["warnOnly"], false);
        assert_eq!(
            v["4"]["expected"],
            hex::encode(p.pcr(4, Phase::EnterInitrd)),
            "a firmware value never overrides a predicted PCR"
        );
        assert_eq!(
            v["11"]["expected"],
            hex::encode(p.pcr(11, Phase::EnterInitrd))
        );
        assert_eq!(
            v["measurementsAfterLeaveInitrd"]["11"]["expected"],
            hex::encode(p.pcr(11, Phase::LeaveInitrd))
        );
        assert_eq!(v["12"]["expected"], "0".repeat(64));
        assert_eq!(v["15"]["expected"], "0".repeat(64));
        assert_eq!(v["metadata"]["inputLockDigest"], "lock-1");
        assert_eq!(ReferenceMeasurements::parse(&text).expect("parse"), r);
        // The PCR keys come first, in numeric order.
        let first_keys: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("  \""))
            .map(|l| l.trim().split('"').nth(1).expect("key"))
            .collect();
        assert_eq!(
            first_keys,
            [
                "0",
                "4",
                "9",
                "11",
                "12",
                "13",
                "15",
                "formatVersion",
                "measurementsAfterLeaveInitrd",
                "metadata"
            ]
        );
    }

    #[test]
    fn identical_builds_have_an_empty_diff() {
        let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
        let a = ReferenceMeasurements::new(&p, inputs("1"));
        let mut b = ReferenceMeasurements::new(&p, inputs("1"));
        // Firmware values are not compared.
        b.measurements.remove(&0);
        let d = diff(&a, &b);
        assert!(d.is_empty(), "{d}");
        assert_eq!(d.to_string(), "no differences\n");
    }

    #[test]
    fn diff_names_the_changed_section_and_package() {
        let a = ReferenceMeasurements::new(
            &Prediction::from_uki(&uki(b"console=ttyS0", b"initrd-1"), "a").expect("a"),
            inputs("6.12.117-1"),
        );
        let mut new_inputs = inputs("6.12.118-1");
        new_inputs
            .initramfs
            .insert("init".to_owned(), "bbbb".to_owned());
        let b = ReferenceMeasurements::new(
            &Prediction::from_uki(&uki(b"console=ttyS0", b"initrd-2"), "b").expect("b"),
            new_inputs,
        );
        let d = diff(&a, &b);
        let pcrs: Vec<(u8, Option<&str>)> = d.pcrs.iter().map(|p| (p.pcr, p.phase)).collect();
        assert_eq!(
            pcrs,
            [(4, None), (9, None), (11, None), (11, Some("leave-initrd"))]
        );
        for p in &d.pcrs {
            assert_eq!(p.because_of, [".initrd"], "PCR {}", p.pcr);
        }
        let text = d.to_string();
        assert!(
            text.contains(
                "kernel package linux-image-6.12 changed from 6.12.117-1 (sha256 sha-6.12.117-1) to 6.12.118-1"
            ),
            "{text}"
        );
        assert!(
            text.contains("section .initrd changed from sha256"),
            "{text}"
        );
        assert!(text.contains("/init changed from aaaa to bbbb"), "{text}");
    }

    #[test]
    fn a_changed_cmdline_is_named_without_input_changes() {
        let a = ReferenceMeasurements::new(
            &Prediction::from_uki(&uki(b"console=ttyS0 panic=30", b"i"), "a").expect("a"),
            inputs("1"),
        );
        let b = ReferenceMeasurements::new(
            &Prediction::from_uki(&uki(b"console=ttyS0 panic=31", b"i"), "b").expect("b"),
            inputs("1"),
        );
        let d = diff(&a, &b);
        assert!(
            d.pcrs
                .iter()
                .any(|p| p.pcr == 9 && p.because_of == [".cmdline"])
        );
        let text = d.to_string();
        assert!(
            text.contains(
                "command line changed from console=ttyS0 panic=30 to console=ttyS0 panic=31"
            ),
            "{text}"
        );
        assert!(text.contains("the input lock is unchanged"), "{text}");
    }

    #[test]
    fn malformed_references_are_refused_with_reasons() {
        let err = ReferenceMeasurements::parse("{").unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        let p = Prediction::from_uki(&uki(b"c", b"i"), "t").expect("predict");
        let mut r = ReferenceMeasurements::new(&p, inputs("1"));
        r.format_version = 7;
        let err = ReferenceMeasurements::parse(&r.render()).unwrap_err();
        assert!(err.to_string().contains("format version 7"), "{err}");
        let mut r = ReferenceMeasurements::new(&p, inputs("1"));
        r.measurements.get_mut(&9).expect("9").expected = "zz".into();
        let err = ReferenceMeasurements::parse(&r.render()).unwrap_err();
        assert!(err.to_string().contains("PCR 9"), "{err}");
    }
}
