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

use serde::{Deserialize, Serialize};

use crate::predict::{BootPath, Phase, Prediction};

mod diff;

pub use diff::{Change, Diff, PcrChange, diff};

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
    /// The digest of the `kubernetes.lock` entries the node image's Kubernetes was made from
    /// (source or release), for a node image with real Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_lock_digest: Option<String>,
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
    /// The `kubernetes.lock` digest of the node image's Kubernetes, if it has real Kubernetes.
    pub kubernetes_lock_digest: Option<String>,
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
                kubernetes_lock_digest: inputs.kubernetes_lock_digest,
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

#[cfg(test)]
mod tests;
