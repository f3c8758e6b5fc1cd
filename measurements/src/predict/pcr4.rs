//! PCR 4 on the QEMU reference platform: OVMF's boot manager action and separator, the boot path
//! that led to the UKI, the UKI's Authenticode hash and that of the kernel systemd-stub loads.

use std::borrow::Cow;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::sections::Chosen;
use super::{
    PredictError, PredictedEvent, Prediction, REQUIRED_SECTIONS, event_type, extend_sha256,
    missing_section, size,
};
use crate::authenticode::authenticode_sha256;

use crate::models::{self, ModelError};
use hawser_pe::PeImage;

/// The EV_EFI_ACTION string OVMF's boot manager measures into PCR 4 right before it starts a
/// boot option (EDK II `Tcg2Dxe.c`, `OnReadyToBoot()`, `EFI_CALLING_EFI_APPLICATION`).
pub const OVMF_CALLING_EFI_APPLICATION: &str = "Calling EFI Application from Boot Option";

/// The EV_EFI_ACTION string OVMF measures into PCR 4 when a boot option returned (failed) and
/// the boot manager goes on to the next one (EDK II `Tcg2Dxe.c`, `OnReadyToBoot()` on every
/// attempt after the first, followed by [`OVMF_CALLING_EFI_APPLICATION`] again).
pub const OVMF_RETURNING_FROM_EFI_APPLICATION: &str =
    "Returning from EFI Application from Boot Option";

/// How the firmware reached the UKI: what PCR 4 holds between the firmware's separator and
/// the UKI's own event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum BootPath {
    /// The UKI is the first boot option the firmware tries.
    Direct,
    /// `count` boot options failed before the UKI's (an empty drive, a missing file): each adds
    /// "Returning from EFI Application from Boot Option" and "Calling EFI Application from Boot
    /// Option" again. A failed option runs no code, so nothing else is measured.
    FailedBootOptions { count: u8 },
    /// A boot manager (e.g. systemd-boot) started the UKI: its Authenticode hash precedes the
    /// UKI's. Only a boot manager whose hash the reference lists is accepted.
    BootManager {
        name: String,
        #[serde(serialize_with = "crate::hex_serde::serialize")]
        authenticode: [u8; 32],
    },
}

impl std::fmt::Display for BootPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootPath::Direct => f.write_str("the UKI as the first boot option"),
            BootPath::FailedBootOptions { count: 1 } => f.write_str("after 1 failed boot option"),
            BootPath::FailedBootOptions { count } => {
                write!(f, "after {count} failed boot options")
            }
            BootPath::BootManager { name, authenticode } => write!(
                f,
                "started by the boot manager {name} (Authenticode {})",
                hex::encode(&authenticode[..8])
            ),
        }
    }
}

/// The kernel in the UKI's `.linux`, as OVMF measures it when systemd-stub loads it.
pub(super) struct LinuxKernel {
    /// Its size as loaded (`VirtualSize`).
    size: u64,
    /// What OVMF extends into PCR 4 for it.
    pub authenticode: [u8; 32],
    /// Its release (`uname -r`), from the setup header.
    pub release: String,
}

impl LinuxKernel {
    /// The kernel of `pe`; without `assume_stub` its release must be a modelled one.
    pub(super) fn from_uki(
        pe: &PeImage<'_>,
        chosen: &Chosen<'_>,
        label: &str,
        assume_stub: Option<u32>,
    ) -> Result<Self, PredictError> {
        let linux_header = chosen
            .get(".linux")
            .ok_or_else(|| missing_section(pe, label, ".linux", REQUIRED_SECTIONS[0].1))?;
        let linux = pe.loaded(linux_header);
        // The kernel is loaded from the section's memory; VirtualSize beyond the file data is
        // zeros, which a PE parse of the kernel must see too.
        let linux_bytes: Cow<'_, [u8]> = if linux.zeros == 0 {
            Cow::Borrowed(linux.data)
        } else {
            Cow::Owned(linux.to_vec())
        };
        let kernel = PeImage::parse(
            &linux_bytes,
            format!("kernel in the .linux section of {label}"),
        )?;
        let authenticode = authenticode_sha256(&kernel)?;
        let release = match (models::kernel_release(&linux_bytes), assume_stub) {
            (Ok(release), None) => {
                models::kernel_model(&release, label)?;
                release
            }
            (Ok(release), Some(_)) => release,
            (Err(_), Some(_)) => "(unreadable)".to_owned(),
            (Err(why), None) => {
                return Err(ModelError::UnknownKernel {
                    uki: label.to_owned(),
                    why,
                }
                .into());
            }
        };
        Ok(LinuxKernel {
            size: linux.len() as u64,
            authenticode,
            release,
        })
    }
}

/// PCR 4's events when the UKI is the first boot option: OVMF's action and separator, then the
/// UKI (`uki_size` bytes) and the kernel it loads, each by its Authenticode hash.
pub(super) fn boot_events(
    uki_size: u64,
    uki_authenticode: [u8; 32],
    kernel: &LinuxKernel,
) -> [PredictedEvent; 4] {
    [
        PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_ACTION,
            key: format!("action:{OVMF_CALLING_EFI_APPLICATION}"),
            description: format!("OVMF: EV_EFI_ACTION \"{OVMF_CALLING_EFI_APPLICATION}\""),
            covers: "the firmware starting a boot option (constant)".into(),
            digest: Sha256::digest(OVMF_CALLING_EFI_APPLICATION.as_bytes()).into(),
            phase: None,
        },
        PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_SEPARATOR,
            key: "separator".into(),
            description: "OVMF: EV_SEPARATOR (pre-OS to OS-present)".into(),
            covers: "the end of the firmware's own PCR 4 measurements (constant)".into(),
            digest: Sha256::digest([0u8; 4]).into(),
            phase: None,
        },
        PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_BOOT_SERVICES_APPLICATION,
            key: "app#1".into(),
            description: "OVMF: EV_EFI_BOOT_SERVICES_APPLICATION, the UKI (Authenticode)".into(),
            covers: format!(
                "the whole UKI file ({}): the stub and every section",
                size(uki_size)
            ),
            digest: uki_authenticode,
            phase: None,
        },
        PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_BOOT_SERVICES_APPLICATION,
            key: "app#2".into(),
            description:
                "OVMF: EV_EFI_BOOT_SERVICES_APPLICATION, the kernel systemd-stub loads (Authenticode)"
                    .into(),
            covers: format!("the .linux section ({})", size(kernel.size)),
            digest: kernel.authenticode,
            phase: None,
        },
    ]
}

impl Prediction {
    /// PCR 4's predicted events on `path`: the firmware's, the boot path's, the UKI's and the
    /// kernel's.
    pub fn pcr4_events(&self, path: &BootPath) -> Vec<PredictedEvent> {
        let direct: Vec<&PredictedEvent> = self.events.iter().filter(|e| e.pcr == 4).collect();
        let mut events = Vec::new();
        let action = |text: &str, n: usize| PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_ACTION,
            key: format!("action:{text}#{n}"),
            description: format!("OVMF: EV_EFI_ACTION \"{text}\""),
            covers: format!("the firmware's boot path: {path}"),
            digest: Sha256::digest(text.as_bytes()).into(),
            phase: None,
        };
        for e in direct {
            let before_uki = e.key == "app#1";
            if before_uki {
                match path {
                    BootPath::Direct => {}
                    BootPath::FailedBootOptions { count } => {
                        for n in 0..usize::from(*count) {
                            events.push(action(OVMF_RETURNING_FROM_EFI_APPLICATION, n + 1));
                            events.push(action(OVMF_CALLING_EFI_APPLICATION, n + 2));
                        }
                    }
                    BootPath::BootManager { name, authenticode } => events.push(PredictedEvent {
                        pcr: 4,
                        event_type: event_type::EV_EFI_BOOT_SERVICES_APPLICATION,
                        key: "app#1".into(),
                        description: format!(
                            "OVMF: EV_EFI_BOOT_SERVICES_APPLICATION, the boot manager {name} (Authenticode)"
                        ),
                        covers: format!("the boot manager {name}"),
                        digest: *authenticode,
                        phase: None,
                    }),
                }
            }
            // The boot manager is the first application the log counts: the UKI and the
            // kernel come one later (`app#2`, `app#3`).
            let mut e = e.clone();
            if matches!(path, BootPath::BootManager { .. })
                && let Some(n) = e
                    .key
                    .strip_prefix("app#")
                    .and_then(|n| n.parse::<u32>().ok())
            {
                e.key = format!("app#{}", n + 1);
            }
            events.push(e);
        }
        events
    }

    /// The prediction of a boot on `path`: PCR 4's events as [`Self::pcr4_events`] gives them,
    /// and, for a profile other than 0 started by the boot manager (systemd-boot, which passes
    /// the profile as `@N`), its measurement of those load options in PCR 12 before the
    /// stub's. On the direct path the firmware's boot entry carries `@N` and measures nothing.
    pub fn on_path(&self, path: &BootPath) -> Prediction {
        let mut events = self.pcr4_events(path);
        events.extend(
            self.events
                .iter()
                .filter(|e| e.pcr != 4 && e.pcr != 12)
                .cloned(),
        );
        if matches!(path, BootPath::BootManager { .. }) {
            events.extend(super::pcr12::systemd_boot_options_event(self.profile));
        }
        events.extend(self.events.iter().filter(|e| e.pcr == 12).cloned());
        Prediction {
            events,
            ..self.clone()
        }
    }

    /// PCR 4's predicted value on `path` ([`Self::pcr4_events`]).
    pub fn pcr4_on(&self, path: &BootPath) -> [u8; 32] {
        self.pcr4_events(path)
            .iter()
            .fold([0u8; 32], |value, e| extend_sha256(&value, &e.digest))
    }
}
