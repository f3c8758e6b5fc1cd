//! Platform profiles: which evidence a cluster's nodes present and how it is verified, chosen by
//! the cluster's measurements file.
//!
//! A measurements file (Constellation's format, see `hawser_attestation::measurements`) may name
//! its platform in the metadata key `attestationVariant`, the key Constellation's published
//! measurements carry per entry. Readers that do not know the key ignore it, as they ignore
//! every non-numeric key. Without it the file is for `qemu`, hawser's reference platform.
//!
//! | profile | `attestationVariant` (also accepted) | evidence | verified by |
//! |---|---|---|---|
//! | `qemu` | `qemu-vtpm` | TPM quote, AK certified by the provider CA (NV 0x01C10002) | `hawser_attestation::validator` |
//! | `gce` | `gcp-sev-es`, `gcp-sev-snp`, `gcp-tdx` | TPM quote, RSA AK certified by Google (NV 0x01C10000) | [`crate::gce`] |
//! | `azure-snp` | `azure-sev-snp` | HCL report (NV 0x01400001) with an SNP report, TPM quote by `HCLAkPub` | [`crate::azure`] + [`crate::snp`] |
//! | `azure-tdx` | `azure-tdx` | HCL report with a TDREPORT, its TD quote, TPM quote by `HCLAkPub` | [`crate::azure`] + [`crate::tdx`] |
//! | `sev-snp` | `qemu-sev-snp`, `aws-sev-snp` | an SNP report from configfs-tsm, REPORT_DATA the binding | [`crate::snp`] |
//! | `tdx` | `qemu-tdx` | a TD quote from configfs-tsm, REPORTDATA the binding | [`crate::tdx`] |
//!
//! [`verify`] runs a profile's verifier on [`PlatformEvidence`] and refuses evidence of another
//! platform by name: a node cannot choose a weaker profile than the cluster's file selects.

use std::collections::BTreeMap;
use std::fmt;

use crate::chain::VerificationTime;

/// The metadata key of a measurements file that selects the profile.
pub const VARIANT_KEY: &str = "attestationVariant";

/// A platform profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Platform {
    /// QEMU with swtpm and hawser's provider CA (the local and CI platform).
    Qemu,
    /// Google Compute Engine: a Shielded/Confidential VM's vTPM, AK certified by Google.
    Gce,
    /// Azure confidential VM on AMD SEV-SNP (DCasv5/ECasv5 and later).
    AzureSnp,
    /// Azure confidential VM on Intel TDX (DCesv5/ECesv5 and later).
    AzureTdx,
    /// A bare SEV-SNP guest: no vTPM trusted, the CPU's report alone.
    SevSnp,
    /// A bare TDX guest: the TD quote alone.
    Tdx,
}

/// Every profile, in the order the docs list them.
pub const ALL: [Platform; 6] = [
    Platform::Qemu,
    Platform::Gce,
    Platform::AzureSnp,
    Platform::AzureTdx,
    Platform::SevSnp,
    Platform::Tdx,
];

/// An NV index a profile's evidence is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvIndex {
    pub index: u32,
    /// What the platform keeps there.
    pub what: &'static str,
    /// Whether evidence without it is refused (the node then fails, naming the index).
    pub required: bool,
}

/// Where a profile's hardware report comes from, besides the TPM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardwareSource {
    /// None: the vTPM's AK certificate is the provider's word.
    None,
    /// Inside the HCL report in the vTPM's NV (Azure); the TD quote of it from Azure's
    /// quoting service (IMDS, `169.254.169.254/acc/tdquote`) on TDX.
    HclReport,
    /// Linux's configfs-tsm (`/sys/kernel/config/tsm/report`), provider `sev_guest` or
    /// `tdx_guest`.
    ConfigfsTsm { provider: &'static str },
}

/// Why a measurements file selects no known profile, or evidence does not fit its profile.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "the measurements file's {VARIANT_KEY} is {0:?}, which no hawser profile verifies (known: {known})",
        known = known_names()
    )]
    Unknown(String),
    #[error("the measurements file's {VARIANT_KEY} is not a string")]
    NotAString,
    #[error("the measurements file is not a JSON object: {0}")]
    Json(String),
    #[error(
        "the cluster's measurements select the {expected} profile; the node presented {found} evidence"
    )]
    Mismatch { expected: Platform, found: Platform },
    #[error(
        "{0} evidence is verified by hawser_attestation's validator (the provider CA), not here"
    )]
    NotHere(Platform),
    #[error(transparent)]
    Gce(#[from] crate::gce::GceError),
    #[error(transparent)]
    Azure(#[from] crate::azure::AzureError),
    #[error(transparent)]
    Snp(#[from] crate::snp::SnpError),
    #[error(transparent)]
    Tdx(#[from] crate::tdx::TdxError),
}

fn known_names() -> String {
    ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
}

impl Platform {
    /// hawser's name of the profile.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Qemu => "qemu",
            Platform::Gce => "gce",
            Platform::AzureSnp => "azure-snp",
            Platform::AzureTdx => "azure-tdx",
            Platform::SevSnp => "sev-snp",
            Platform::Tdx => "tdx",
        }
    }

    /// The `attestationVariant` hawser writes for the profile (Constellation's name where it
    /// has one).
    pub fn attestation_variant(self) -> &'static str {
        match self {
            Platform::Qemu => "qemu-vtpm",
            Platform::Gce => "gcp-sev-es",
            Platform::AzureSnp => "azure-sev-snp",
            Platform::AzureTdx => "azure-tdx",
            Platform::SevSnp => "qemu-sev-snp",
            Platform::Tdx => "qemu-tdx",
        }
    }

    /// The profile of a name: hawser's, or an `attestationVariant` of Constellation's.
    pub fn from_name(name: &str) -> Result<Platform, ProfileError> {
        let platform = match name {
            "qemu" | "qemu-vtpm" => Platform::Qemu,
            "gce" | "gcp-sev-es" | "gcp-sev-snp" | "gcp-tdx" => Platform::Gce,
            "azure-snp" | "azure-sev-snp" => Platform::AzureSnp,
            "azure-tdx" => Platform::AzureTdx,
            "sev-snp" | "qemu-sev-snp" | "aws-sev-snp" => Platform::SevSnp,
            "tdx" | "qemu-tdx" => Platform::Tdx,
            other => return Err(ProfileError::Unknown(other.to_owned())),
        };
        Ok(platform)
    }

    /// The profile a measurements file selects (its `attestationVariant`, `qemu` without one).
    pub fn from_measurements(text: &str) -> Result<Platform, ProfileError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ProfileError::Json(e.to_string()))?;
        let object = value
            .as_object()
            .ok_or_else(|| ProfileError::Json("not an object".into()))?;
        match object.get(VARIANT_KEY) {
            None => Ok(Platform::Qemu),
            Some(serde_json::Value::String(name)) => Platform::from_name(name),
            Some(_) => Err(ProfileError::NotAString),
        }
    }

    /// The profile a UKI's measured command line names (`hawser.platform=`, the last one, as
    /// PID 1 reads it), if it names one by a profile's name (`azure` and `aws` do not: an Azure
    /// image serves both Azure profiles, AWS has none).
    pub fn of_cmdline(cmdline: &str) -> Option<Platform> {
        cmdline
            .split_ascii_whitespace()
            .filter_map(|word| word.strip_prefix("hawser.platform="))
            .next_back()
            .and_then(|name| Platform::from_name(name).ok())
    }

    /// The NV indices a node of this profile reads its evidence from.
    pub fn nv_layout(self) -> &'static [NvIndex] {
        match self {
            Platform::Qemu => &[NvIndex {
                index: hawser_attestation::tpm_types::AK_CERT_NV_INDEX,
                what: "the ECC AK certificate the provider CA issued",
                required: true,
            }],
            Platform::Gce => &[
                NvIndex {
                    index: crate::gce::AK_CERT_NV_INDEX_RSA,
                    what: "the RSA AK certificate Google issued",
                    required: true,
                },
                NvIndex {
                    index: crate::gce::AK_TEMPLATE_NV_INDEX_RSA,
                    what: "the RSA AK template (the AK is created from it)",
                    required: true,
                },
            ],
            Platform::AzureSnp | Platform::AzureTdx => &[
                NvIndex {
                    index: crate::azure::HCL_REPORT_NV_INDEX,
                    what: "the HCL report (the CPU's report binding HCLAkPub)",
                    required: true,
                },
                NvIndex {
                    index: crate::azure::AK_CERT_NV_INDEX,
                    what: "the AK certificate Azure issued",
                    required: false,
                },
            ],
            Platform::SevSnp | Platform::Tdx => &[],
        }
    }

    /// Where the CPU's report comes from.
    pub fn hardware_source(self) -> HardwareSource {
        match self {
            Platform::Qemu | Platform::Gce => HardwareSource::None,
            Platform::AzureSnp | Platform::AzureTdx => HardwareSource::HclReport,
            Platform::SevSnp => HardwareSource::ConfigfsTsm {
                provider: "sev_guest",
            },
            Platform::Tdx => HardwareSource::ConfigfsTsm {
                provider: "tdx_guest",
            },
        }
    }

    /// The PCRs a cluster can enforce on this platform: the ones the image's own boot chain
    /// extends (UKI, stub, kernel, hawser). Firmware PCRs (0–3, 5–7) are the provider's and
    /// change with its firmware updates: warn-only everywhere. Bare SNP/TDX have no TPM: their
    /// launch measurement (and RTMRs on TDX) stand in for PCRs.
    pub fn enforceable_pcrs(self) -> &'static [u8] {
        match self {
            Platform::Qemu | Platform::Gce | Platform::AzureSnp | Platform::AzureTdx => {
                &[4, 9, 11, 12, 13, 15]
            }
            Platform::SevSnp | Platform::Tdx => &[],
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One platform's evidence, as a node presents it.
pub enum PlatformEvidence<'a> {
    Gce {
        evidence: crate::gce::GceEvidence<'a>,
        roots: &'a [&'a [u8]],
        policy: &'a crate::gce::GcePolicy,
    },
    Azure {
        evidence: crate::azure::AzureEvidence<'a>,
        roots: &'a [&'a [u8]],
    },
    SevSnp {
        report: &'a [u8],
        endorsement: crate::snp::SnpEndorsement<'a>,
        policy: &'a crate::snp::SnpPolicy,
    },
    Tdx {
        quote: &'a [u8],
        collateral: &'a dcap_qvl::QuoteCollateralV3,
        policy: &'a crate::tdx::TdxPolicy,
    },
}

impl PlatformEvidence<'_> {
    /// The profile this evidence is of.
    pub fn platform(&self) -> Platform {
        match self {
            PlatformEvidence::Gce { .. } => Platform::Gce,
            PlatformEvidence::Azure { evidence, .. } => match evidence.hardware {
                crate::azure::AzureHardware::SevSnp { .. } => Platform::AzureSnp,
                crate::azure::AzureHardware::Tdx { .. } => Platform::AzureTdx,
            },
            PlatformEvidence::SevSnp { .. } => Platform::SevSnp,
            PlatformEvidence::Tdx { .. } => Platform::Tdx,
        }
    }
}

/// What verified evidence shows, whatever the platform.
#[derive(Debug, Clone)]
pub struct VerifiedPlatform {
    pub platform: Platform,
    /// The quoted SHA-256 PCRs (none on bare SNP/TDX).
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    /// The launch measurement: SNP's MEASUREMENT (48 bytes) or TDX's MRTD (48 bytes), where the
    /// CPU reported one.
    pub launch_measurement: Option<Vec<u8>>,
}

/// Verifies `evidence` under the profile `expected` (the cluster's) with the verifier's
/// `nonce` at `at`. Evidence of another profile is refused before anything else.
///
/// The nonce is the quote's `extraData` on vTPM profiles; on bare SNP/TDX the binding is the
/// policy's `report_data`, which the caller sets from the nonce.
pub fn verify(
    expected: Platform,
    evidence: &PlatformEvidence<'_>,
    nonce: &[u8],
    at: VerificationTime,
) -> Result<VerifiedPlatform, ProfileError> {
    if expected == Platform::Qemu {
        return Err(ProfileError::NotHere(Platform::Qemu));
    }
    let found = evidence.platform();
    if found != expected {
        return Err(ProfileError::Mismatch { expected, found });
    }
    let verified = match evidence {
        PlatformEvidence::Gce {
            evidence,
            roots,
            policy,
        } => {
            let verified = crate::gce::verify(evidence, roots, nonce, at)?;
            crate::gce::judge(&verified, policy)?;
            VerifiedPlatform {
                platform: found,
                pcrs: verified.pcrs,
                launch_measurement: None,
            }
        }
        PlatformEvidence::Azure { evidence, roots } => {
            let verified = crate::azure::verify(evidence, roots, nonce, at)?;
            let launch_measurement = verified
                .hcl
                .snp
                .as_ref()
                .map(|snp| snp.report.measurement.to_vec());
            VerifiedPlatform {
                platform: found,
                pcrs: verified.pcrs,
                launch_measurement,
            }
        }
        PlatformEvidence::SevSnp {
            report,
            endorsement,
            policy,
        } => {
            let verified = crate::snp::verify(report, endorsement, policy, at)?;
            VerifiedPlatform {
                platform: found,
                pcrs: BTreeMap::new(),
                launch_measurement: Some(verified.report.measurement.to_vec()),
            }
        }
        PlatformEvidence::Tdx {
            quote,
            collateral,
            policy,
        } => {
            let verified = crate::tdx::verify(quote, collateral, policy, at)?;
            VerifiedPlatform {
                platform: found,
                pcrs: BTreeMap::new(),
                launch_measurement: Some(verified.report.mr_td.to_vec()),
            }
        }
    };
    Ok(verified)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_profile_is_found_by_its_name_and_its_variant() {
        for platform in ALL {
            assert_eq!(Platform::from_name(platform.name()).unwrap(), platform);
            assert_eq!(
                Platform::from_name(platform.attestation_variant()).unwrap(),
                platform
            );
        }
        let err = Platform::from_name("aws-nitro-tpm").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the measurements file's attestationVariant is \"aws-nitro-tpm\", which no hawser \
             profile verifies (known: qemu, gce, azure-snp, azure-tdx, sev-snp, tdx)"
        );
    }

    #[test]
    fn a_command_line_names_its_profile() {
        assert_eq!(Platform::of_cmdline("console=ttyS0 quiet"), None);
        assert_eq!(
            Platform::of_cmdline("hawser.platform=qemu hawser.platform=gce x"),
            Some(Platform::Gce)
        );
        assert_eq!(Platform::of_cmdline("hawser.platform=azure"), None);
        assert_eq!(
            Platform::of_cmdline("hawser.platform=azure-tdx"),
            Some(Platform::AzureTdx)
        );
    }

    #[test]
    fn a_measurements_file_selects_its_profile_and_qemu_without_one() {
        let qemu = r#"{"4": {"expected": "00", "warnOnly": false}}"#;
        assert_eq!(Platform::from_measurements(qemu).unwrap(), Platform::Qemu);
        let azure = r#"{"attestationVariant": "azure-sev-snp", "4": {"expected": "00"}}"#;
        assert_eq!(
            Platform::from_measurements(azure).unwrap(),
            Platform::AzureSnp
        );
        let bad = r#"{"attestationVariant": 3}"#;
        assert!(matches!(
            Platform::from_measurements(bad),
            Err(ProfileError::NotAString)
        ));
        assert!(matches!(
            Platform::from_measurements("[]"),
            Err(ProfileError::Json(_))
        ));
    }

    #[test]
    fn every_tpm_profile_reads_a_required_index_and_bare_cpus_read_configfs_tsm() {
        for platform in ALL {
            let layout = platform.nv_layout();
            match platform.hardware_source() {
                HardwareSource::ConfigfsTsm { .. } => {
                    assert!(layout.is_empty(), "{platform}");
                    assert!(platform.enforceable_pcrs().is_empty(), "{platform}");
                }
                _ => {
                    assert!(layout.iter().any(|nv| nv.required), "{platform}");
                    // Firmware PCRs are never enforceable.
                    for pcr in [0, 1, 2, 3, 5, 6, 7] {
                        assert!(!platform.enforceable_pcrs().contains(&pcr), "{platform}");
                    }
                }
            }
        }
    }
}
