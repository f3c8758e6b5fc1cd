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
//! A node image's reference (its command line carries the rootfs's root hash) also records the
//! rootfs's package lock, `rootfs.lock`: its digest (`rootfsLockDigest`, as `inputLockDigest`
//! records `inputs.lock`) and each package's version (`rootfsPackages`).
//!
//! [`diff`] compares a reference with a fresh prediction and names what changed: PCRs, UKI
//! sections, locked input packages, the rootfs's locked packages, initramfs files.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::predict::{BootPath, PREDICTED_PCRS, Phase, Prediction};

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
    /// Further values the PCR may hold (PCR 4 on the allowed boot paths, `metadata.bootPaths`);
    /// readers of Constellation's format ignore it and enforce `expected` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_expected: Vec<String>,
}

/// PCR index → expected value.
pub type Measurements = BTreeMap<u8, Measurement>;

/// One allowed boot path and the PCR 4 it gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootPathRecord {
    /// The path in words ("after 1 failed boot option").
    pub path: String,
    /// PCR 4 on it.
    pub pcr4: String,
}

/// How many failed boot options before the UKI a reference accepts: firmware that tries an
/// empty drive or a network option first. A failed option runs no code (it adds only OVMF's
/// "Returning…"/"Calling…" actions), so accepting it admits no other software.
pub const ALLOWED_FAILED_BOOT_OPTIONS: u8 = 2;

/// The boot paths a reference accepts besides the direct boot: 1 to
/// [`ALLOWED_FAILED_BOOT_OPTIONS`] failed boot options, and each of `boot_managers` in front of
/// the UKI.
pub fn allowed_boot_paths(boot_managers: &[(String, [u8; 32])]) -> Vec<BootPath> {
    let mut paths: Vec<BootPath> = (1..=ALLOWED_FAILED_BOOT_OPTIONS)
        .map(|count| BootPath::FailedBootOptions { count })
        .collect();
    paths.extend(
        boot_managers
            .iter()
            .map(|(name, authenticode)| BootPath::BootManager {
                name: name.clone(),
                authenticode: *authenticode,
            }),
    );
    paths
}

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
    /// sha256 of the rootfs lock (`RootfsLock::digest()`), for a node image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_lock_digest: Option<String>,
    /// The rootfs's locked Debian packages, name → version, for a node image.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rootfs_packages: BTreeMap<String, String>,
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
    /// The firmware boot paths besides the direct one whose PCR 4 the file accepts
    /// (`alsoExpected` of PCR 4), each with its value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boot_paths: Vec<BootPathRecord>,
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
    /// Boot managers allowed in front of the UKI: (name, Authenticode hash).
    pub boot_managers: Vec<(String, [u8; 32])>,
    /// The rootfs lock's digest and packages (name → version), for a node image.
    pub rootfs_lock_digest: Option<String>,
    pub rootfs_packages: BTreeMap<String, String>,
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
            also_expected: Vec::new(),
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
        let boot_paths: Vec<BootPathRecord> = allowed_boot_paths(&inputs.boot_managers)
            .into_iter()
            .map(|path| BootPathRecord {
                pcr4: hex::encode(prediction.pcr4_on(&path)),
                path: path.to_string(),
            })
            .collect();
        if let Some(pcr4) = measurements.get_mut(&4) {
            pcr4.also_expected = boot_paths.iter().map(|b| b.pcr4.clone()).collect();
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
                rootfs_lock_digest: inputs.rootfs_lock_digest,
                rootfs_packages: inputs.rootfs_packages,
                uki: FileDigest {
                    size: prediction.uki_size,
                    sha256: hex::encode(prediction.uki_sha256),
                },
                uki_authenticode: hex::encode(prediction.uki_authenticode),
                kernel_authenticode: hex::encode(prediction.kernel_authenticode),
                sections,
                cmdline: prediction.cmdline.clone(),
                pcr11_after_stub: hex::encode(prediction.pcr(11, Phase::Stub)),
                boot_paths,
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
    /// The rootfs's locked packages (`what` is the package name) and, if only it changed,
    /// the rootfs lock's digest.
    pub rootfs: Vec<Change>,
    pub initramfs: Vec<Change>,
    pub other: Vec<Change>,
}

impl Diff {
    /// Whether nothing that is predicted differs (firmware values are not compared).
    pub fn is_empty(&self) -> bool {
        self.pcrs.is_empty()
            && self.sections.is_empty()
            && self.inputs.is_empty()
            && self.rootfs.is_empty()
            && self.initramfs.is_empty()
            && self.other.is_empty()
    }
}

/// Which UKI sections each predicted PCR depends on (PCR 4 depends on the whole file).
fn sections_measured_into(pcr: u8) -> &'static [&'static str] {
    match pcr {
        9 => &[".cmdline", ".initrd", ".osrel", ".ucode"],
        11 => crate::models::ALL_PCR11_SECTIONS,
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
    d.rootfs = compare_maps(
        rm.rootfs_packages
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
        cm.rootfs_packages
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
        "",
    );
    if d.rootfs.is_empty() && rm.rootfs_lock_digest != cm.rootfs_lock_digest {
        d.rootfs.push(Change {
            what: "rootfs lock digest".to_owned(),
            before: rm.rootfs_lock_digest.clone(),
            after: cm.rootfs_lock_digest.clone(),
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

fn write_groups(f: &mut fmt::Formatter<'_>, groups: &[(&str, &Vec<Change>)]) -> fmt::Result {
    for (title, changes) in groups {
        if changes.is_empty() {
            continue;
        }
        writeln!(f, "{title}:")?;
        for c in changes.iter() {
            writeln!(f, "    {c}")?;
        }
    }
    Ok(())
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
        let groups: [(&str, &Vec<Change>); 2] = [
            ("UKI sections", &self.sections),
            ("input lock", &self.inputs),
        ];
        write_groups(f, &groups)?;
        if !self.rootfs.is_empty() {
            writeln!(f, "rootfs packages (rootfs.lock; reference → rebuild):")?;
            let version = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
            for c in &self.rootfs {
                writeln!(
                    f,
                    "    {} {} → {}",
                    c.what,
                    version(&c.before),
                    version(&c.after)
                )?;
            }
        }
        let groups: [(&str, &Vec<Change>); 2] =
            [("initramfs files", &self.initramfs), ("other", &self.other)];
        write_groups(f, &groups)?;
        if !self.sections.is_empty() && self.inputs.is_empty() && self.rootfs.is_empty() {
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
    use crate::test_fixtures::{tiny_kernel, tiny_uki};

    fn uki(cmdline: &[u8], initrd: &[u8]) -> Vec<u8> {
        let kernel = tiny_kernel(b"kernel code");
        tiny_uki(&[
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
            ..ReferenceInputs::default()
        }
    }

    fn node_inputs(bash_version: &str) -> ReferenceInputs {
        ReferenceInputs {
            rootfs_lock_digest: Some(format!("rootfs-lock-{bash_version}")),
            rootfs_packages: BTreeMap::from([
                ("bash".to_owned(), bash_version.to_owned()),
                ("libc6".to_owned(), "2.36-9+deb12u13".to_owned()),
            ]),
            ..inputs("1")
        }
    }

    #[test]
    fn a_node_reference_records_its_rootfs_lock_and_a_uki_reference_does_not() {
        let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
        let node = ReferenceMeasurements::new(&p, node_inputs("5.2.15-2+b7"));
        let v: serde_json::Value = serde_json::from_str(&node.render()).expect("json");
        assert_eq!(v["metadata"]["rootfsLockDigest"], "rootfs-lock-5.2.15-2+b7");
        assert_eq!(v["metadata"]["rootfsPackages"]["bash"], "5.2.15-2+b7");
        assert_eq!(
            ReferenceMeasurements::parse(&node.render()).expect("parse"),
            node
        );
        let uki_only = ReferenceMeasurements::new(&p, inputs("1")).render();
        assert!(!uki_only.contains("rootfs"), "{uki_only}");
    }

    #[test]
    fn a_changed_rootfs_package_is_named_with_both_versions() {
        let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
        let a = ReferenceMeasurements::new(&p, node_inputs("5.2.15-2+b7"));
        let b = ReferenceMeasurements::new(&p, node_inputs("5.2.15-2+b8"));
        let d = diff(&a, &b);
        assert!(!d.is_empty());
        assert_eq!(d.rootfs.len(), 1, "{d}");
        let text = d.to_string();
        assert!(
            text.contains("rootfs packages (rootfs.lock; reference → rebuild):\n    bash 5.2.15-2+b7 → 5.2.15-2+b8\n"),
            "{text}"
        );
        // The same versions with other files: the digest names the change.
        let mut c = node_inputs("5.2.15-2+b7");
        c.rootfs_lock_digest = Some("another".into());
        let d = diff(&a, &ReferenceMeasurements::new(&p, c));
        assert!(
            d.to_string()
                .contains("rootfs lock digest rootfs-lock-5.2.15-2+b7 → another"),
            "{d}"
        );
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
