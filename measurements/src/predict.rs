//! PCR prediction from a built UKI: every event firmware, systemd-stub, the Linux EFI stub and
//! hawser's PID 1 extend into PCRs 4, 9, 11, 12, 13 and 15 on the QEMU reference platform, each
//! with the digest it will carry, and the PCR values they fold into.
//!
//! The prediction is a pure function of the UKI's bytes. It keeps the individual events (not
//! only the final PCR values) because a mismatch is only diagnosable event by event: the
//! [`crate::explain`] module lines them up with a real boot's TCG event log.
//!
//! | PCR | events, in order | source |
//! |---|---|---|
//! | 4 | EV_EFI_ACTION "Calling EFI Application from Boot Option"; EV_SEPARATOR; the UKI's Authenticode hash; the kernel's (`.linux`) Authenticode hash | OVMF's boot manager and `DxeTpm2MeasureBootLib` (the kernel is measured when systemd-stub calls `LoadImage()` on `.linux`) |
//! | 9 | the UTF-16 command line (tag `0x8F3B22ED`); the initrd the kernel loads (tag `0x8F3B22EC`) = `.initrd`, and from systemd-stub 257 on, zero-padded to 4 bytes and followed by the `.osrel` cpio | the Linux 6.12 EFI stub |
//! | 11 | for each section present, in the stub version's order ([`crate::models::StubModel::pcr11_sections`]): its name with NUL, then its `VirtualSize` bytes; then hawser's `enter-initrd`, later `leave-initrd` (a control plane's PID 1 extends `control-plane` just before it) | systemd-stub; hawser PID 1 |
//!
//! The stub's version (`.sdmagic`) and the kernel's (`.linux`) select the model
//! ([`crate::models`]); a version never proven on a real boot is refused by name.
//! | 12, 13, 15 | nothing (no command-line override, credentials, sysexts; a fresh node) | |

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::authenticode::authenticode_sha256;
use crate::models::{self, ModelError, StubIdentity, StubModel};
use crate::stub::{load_options_utf16, osrel_cpio};
use hawser_pcr::{
    PHASE_CONTROL_PLANE, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, extend_sha256, phase_digest,
};
use hawser_pe::{PeError, PeImage};

/// The PCRs a prediction covers (the firmware's own PCRs 0–3 and 5–7 are not predicted).
pub const PREDICTED_PCRS: [u8; 6] = [4, 9, 11, 12, 13, 15];

/// TCG event types (TCG PC Client Platform Firmware Profile, "Event Types").
pub mod event_type {
    pub const EV_NO_ACTION: u32 = 0x3;
    pub const EV_SEPARATOR: u32 = 0x4;
    pub const EV_EVENT_TAG: u32 = 0x6;
    pub const EV_IPL: u32 = 0xd;
    pub const EV_EFI_BOOT_SERVICES_APPLICATION: u32 = 0x8000_0003;
    pub const EV_EFI_ACTION: u32 = 0x8000_0007;
    /// Not a TCG type: marks an extension made by hawser's PID 1 after the kernel started,
    /// which is in no firmware event log.
    pub const HAWSER_PHASE: u32 = 0xffff_ffff;
}

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

/// Event tag of the Linux EFI stub's command-line measurement (`efistub.h`).
pub const LINUX_TAG_LOAD_OPTIONS: u32 = 0x8F3B_22ED;
/// Event tag of the Linux EFI stub's initrd measurement (`efistub.h`).
pub const LINUX_TAG_INITRD: u32 = 0x8F3B_22EC;

/// How far into the boot a PCR 11 value is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// After systemd-stub, before hawser extends anything (the boot report's
    /// `pcr11_before_phase`; what a firmware event log replays to).
    Stub,
    /// After hawser's `enter-initrd`: what the boot report quotes.
    EnterInitrd,
    /// After hawser's `leave-initrd`, just before switch_root: a worker in its rootfs.
    LeaveInitrd,
    /// A control plane in its rootfs: `control-plane`, then `leave-initrd`
    /// ([`hawser_pcr::pcr11_after_pivot`]). Not a later point of the same boot: a worker never
    /// reaches it.
    LeaveInitrdControlPlane,
}

impl Phase {
    fn includes(self, phase_word: &str) -> bool {
        match phase_word {
            PHASE_ENTER_INITRD => self >= Phase::EnterInitrd,
            PHASE_CONTROL_PLANE => self == Phase::LeaveInitrdControlPlane,
            PHASE_LEAVE_INITRD => self >= Phase::LeaveInitrd,
            _ => false,
        }
    }
}

/// One predicted extension of a PCR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PredictedEvent {
    pub pcr: u8,
    /// The TCG event type the firmware log will show ([`event_type::HAWSER_PHASE`] for
    /// hawser's own extensions, which are in no firmware log).
    pub event_type: u32,
    /// Identifies the event for lining it up with a log (see [`crate::eventlog::Event::key`]).
    pub key: String,
    /// What the event is, in words.
    pub description: String,
    /// Which input it covers, for diagnosis ("the .initrd section (3.7 MiB) …").
    pub covers: String,
    /// The sha256 digest extended.
    #[serde(serialize_with = "crate::hex_serde::serialize")]
    pub digest: [u8; 32],
    /// For hawser's phase extensions: the phase word.
    pub phase: Option<&'static str>,
}

/// sha256 and size of one PE section as loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SectionDigest {
    pub name: String,
    /// `VirtualSize`.
    pub size: u64,
    #[serde(serialize_with = "crate::hex_serde::serialize")]
    pub sha256: [u8; 32],
}

/// Everything predicted from one UKI.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    /// The systemd-stub the UKI carries (its `.sdmagic`).
    pub stub: StubIdentity,
    /// The kernel's release (`uname -r`), from `.linux`'s setup header.
    pub kernel_release: String,
    pub uki_size: u64,
    #[serde(serialize_with = "crate::hex_serde::serialize")]
    pub uki_sha256: [u8; 32],
    /// What OVMF extends into PCR 4 for the UKI.
    #[serde(serialize_with = "crate::hex_serde::serialize")]
    pub uki_authenticode: [u8; 32],
    /// What OVMF extends into PCR 4 for the kernel in `.linux`.
    #[serde(serialize_with = "crate::hex_serde::serialize")]
    pub kernel_authenticode: [u8; 32],
    /// Every PE section of the UKI (the stub's own included), in section-table order.
    pub sections: Vec<SectionDigest>,
    /// The command line the kernel receives (after systemd-stub's conversion).
    pub cmdline: String,
    /// Size of the initrd the kernel loads and measures (`.initrd` + padding + `.osrel` cpio).
    pub initrd_size: u64,
    /// Every predicted event, PCR by PCR in boot order.
    pub events: Vec<PredictedEvent>,
}

/// Why a UKI cannot be predicted.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    /// The UKI (or its `.linux`) is not a usable PE image.
    #[error(transparent)]
    Pe(#[from] PeError),
    /// The stub or the kernel is not one whose measurements are modelled.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A section hawser's boot depends on is missing.
    #[error("the UKI {uki} has no {section} section (its sections: {present}): {why}")]
    MissingSection {
        /// The file, as labelled by the caller.
        uki: String,
        section: &'static str,
        why: &'static str,
        /// The names of the sections it has.
        present: String,
    },
    /// A section whose effect this predictor does not model is present.
    #[error(
        "the UKI {uki} has a {section} section, whose measurements hawser's predictor does not model: {stub} {why}"
    )]
    UnmodelledSection {
        uki: String,
        section: &'static str,
        stub: StubIdentity,
        why: &'static str,
    },
    /// A text section is implausibly large.
    #[error(
        "the {section} section of the UKI {uki} is {size} bytes, more than the {limit} bytes hawser accepts for it"
    )]
    TooLarge {
        uki: String,
        section: &'static str,
        size: u64,
        limit: u64,
    },
}

/// The largest `.cmdline` or `.osrel` accepted (both are short text; the kernel's own command
/// line limit on x86 is 2 KiB).
const MAX_TEXT_SECTION: usize = 1 << 20;

/// The sections a hawser UKI must have, and why.
const REQUIRED_SECTIONS: [(&str, &str); 3] = [
    (
        ".linux",
        "systemd-stub refuses to boot a UKI without a kernel (\"Image lacks .linux section\")",
    ),
    (
        ".cmdline",
        "without it the stub boots with whatever command line the boot manager passes, which hawser does not accept",
    ),
    (
        ".initrd",
        "hawser's PID 1 lives in the initramfs; without it the kernel has no /init to run",
    ),
];

impl Prediction {
    /// Predicts every event of a boot of `uki`; `label` names the file in errors. The stub and
    /// the kernel must be modelled versions ([`crate::models`]).
    pub fn from_uki(uki: &[u8], label: &str) -> Result<Prediction, PredictError> {
        Self::from_uki_assuming(uki, label, None)
    }

    /// As [`Self::from_uki`], but with `assume_stub` (a major version in
    /// [`models::STUB_MODELS`]) the UKI is predicted as if it carried that stub and a modelled
    /// kernel, whatever it really carries, refused or not. Not a prediction to trust: it is what
    /// `hawser measurements explain --assume-stub` lines a boot up with, so that the event that
    /// differs is named for a UKI the predictor refuses.
    pub fn from_uki_assuming(
        uki: &[u8],
        label: &str,
        assume_stub: Option<u32>,
    ) -> Result<Prediction, PredictError> {
        let pe = PeImage::parse(uki, format!("UKI {label}"))?;
        let missing = |section: &'static str, why: &'static str| PredictError::MissingSection {
            uki: label.to_owned(),
            section,
            why,
            present: if pe.sections.is_empty() {
                "none".to_owned()
            } else {
                pe.sections
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        };
        for (section, why) in REQUIRED_SECTIONS {
            if pe.section(section).is_none() {
                return Err(missing(section, why));
            }
        }
        let (stub, model) = match assume_stub {
            None => {
                let stub = models::stub_identity(&pe, label)?;
                let model = models::stub_model(&stub, label)?;
                (stub, model)
            }
            Some(major) => {
                let model = models::STUB_MODELS
                    .iter()
                    .find(|m| m.major == major)
                    .ok_or_else(|| ModelError::UnknownAssumption {
                        major,
                        known: models::known_stubs(),
                    })?;
                let stub = models::stub_identity(&pe, label).unwrap_or_else(|_| StubIdentity {
                    name: "unidentified stub".into(),
                    version: "(no .sdmagic)".into(),
                    major: None,
                });
                (stub, model)
            }
        };
        for &(section, why) in model.unmodelled_sections {
            if pe.section(section).is_some() {
                return Err(PredictError::UnmodelledSection {
                    uki: label.to_owned(),
                    section,
                    stub: stub.clone(),
                    why,
                });
            }
        }

        let sections: Vec<SectionDigest> = pe
            .sections
            .iter()
            .map(|s| {
                let mut h = Sha256::new();
                pe.loaded(s).feed(|b| h.update(b));
                SectionDigest {
                    name: s.name.clone(),
                    size: u64::from(s.virtual_size),
                    sha256: h.finalize().into(),
                }
            })
            .collect();
        // The first section of a name is the one systemd-stub uses.
        let digest_of = |name: &str| {
            sections
                .iter()
                .find(|s| s.name == name)
                .map(|s| (s.sha256, s.size))
        };

        let mut events = Vec::new();

        // PCR 4: OVMF's boot manager, then the two images it loads.
        let uki_authenticode = authenticode_sha256(&pe)?;
        let linux_header = pe
            .section(".linux")
            .ok_or_else(|| missing(".linux", REQUIRED_SECTIONS[0].1))?;
        let linux = pe.loaded(linux_header);
        // The kernel is loaded from the section's memory; VirtualSize beyond the file data is
        // zeros, which a PE parse of the kernel must see too.
        let linux_bytes: std::borrow::Cow<'_, [u8]> = if linux.zeros == 0 {
            std::borrow::Cow::Borrowed(linux.data)
        } else {
            std::borrow::Cow::Owned(linux.to_vec())
        };
        let kernel = PeImage::parse(
            &linux_bytes,
            format!("kernel in the .linux section of {label}"),
        )?;
        let kernel_authenticode = authenticode_sha256(&kernel)?;
        let kernel_release = match (models::kernel_release(&linux_bytes), assume_stub) {
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
        events.push(PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_ACTION,
            key: format!("action:{OVMF_CALLING_EFI_APPLICATION}"),
            description: format!("OVMF: EV_EFI_ACTION \"{OVMF_CALLING_EFI_APPLICATION}\""),
            covers: "the firmware starting a boot option (constant)".into(),
            digest: Sha256::digest(OVMF_CALLING_EFI_APPLICATION.as_bytes()).into(),
            phase: None,
        });
        events.push(PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_SEPARATOR,
            key: "separator".into(),
            description: "OVMF: EV_SEPARATOR (pre-OS to OS-present)".into(),
            covers: "the end of the firmware's own PCR 4 measurements (constant)".into(),
            digest: Sha256::digest([0u8; 4]).into(),
            phase: None,
        });
        events.push(PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_BOOT_SERVICES_APPLICATION,
            key: "app#1".into(),
            description: "OVMF: EV_EFI_BOOT_SERVICES_APPLICATION, the UKI (Authenticode)".into(),
            covers: format!(
                "the whole UKI file ({}): the stub and every section",
                size(uki.len() as u64)
            ),
            digest: uki_authenticode,
            phase: None,
        });
        events.push(PredictedEvent {
            pcr: 4,
            event_type: event_type::EV_EFI_BOOT_SERVICES_APPLICATION,
            key: "app#2".into(),
            description:
                "OVMF: EV_EFI_BOOT_SERVICES_APPLICATION, the kernel systemd-stub loads (Authenticode)"
                    .into(),
            covers: format!("the .linux section ({})", size(linux.len() as u64)),
            digest: kernel_authenticode,
            phase: None,
        });

        // PCR 9: the Linux EFI stub.
        let cmdline_header = pe
            .section(".cmdline")
            .ok_or_else(|| missing(".cmdline", REQUIRED_SECTIONS[1].1))?;
        let cmdline_loaded = pe.loaded(cmdline_header);
        if cmdline_loaded.len() > MAX_TEXT_SECTION {
            return Err(PredictError::TooLarge {
                uki: label.to_owned(),
                section: ".cmdline",
                size: cmdline_loaded.len() as u64,
                limit: MAX_TEXT_SECTION as u64,
            });
        }
        let cmdline_bytes = cmdline_loaded.to_vec();
        let load_options = load_options_utf16(&cmdline_bytes);
        let cmdline = crate::stub::effective_cmdline(&cmdline_bytes);
        events.push(PredictedEvent {
            pcr: 9,
            event_type: event_type::EV_EVENT_TAG,
            key: format!("tag:{LINUX_TAG_LOAD_OPTIONS:#010x}"),
            description: "Linux EFI stub: LOADED_IMAGE::LoadOptions (UTF-16 command line)".into(),
            covers: format!("the .cmdline section, as the kernel receives it: {cmdline:?}"),
            digest: Sha256::digest(&load_options).into(),
            phase: None,
        });
        let (initrd_digest, initrd_size, initrd_covers) = initrd_measurement(&pe, label, model)?;
        events.push(PredictedEvent {
            pcr: 9,
            event_type: event_type::EV_EVENT_TAG,
            key: format!("tag:{LINUX_TAG_INITRD:#010x}"),
            description: "Linux EFI stub: Linux initrd".into(),
            covers: initrd_covers,
            digest: initrd_digest,
            phase: None,
        });

        // PCR 11: systemd-stub's sections, then hawser's phases.
        for &name in model.pcr11_sections {
            let Some((content, len)) = digest_of(name) else {
                continue;
            };
            let mut with_nul = name.as_bytes().to_vec();
            with_nul.push(0);
            events.push(PredictedEvent {
                pcr: 11,
                event_type: event_type::EV_IPL,
                key: format!("ipl:{name}#1"),
                description: format!("systemd-stub: section name \"{name}\\0\""),
                covers: format!("the presence of a {name} section"),
                digest: Sha256::digest(&with_nul).into(),
                phase: None,
            });
            events.push(PredictedEvent {
                pcr: 11,
                event_type: event_type::EV_IPL,
                key: format!("ipl:{name}#2"),
                description: format!("systemd-stub: contents of {name}"),
                covers: format!("the {name} section ({})", size(len)),
                digest: content,
                phase: None,
            });
        }
        // In the order PID 1 extends them; `control-plane` only on a control plane (see
        // `Phase::includes`).
        for word in [PHASE_ENTER_INITRD, PHASE_CONTROL_PLANE, PHASE_LEAVE_INITRD] {
            events.push(PredictedEvent {
                pcr: 11,
                event_type: event_type::HAWSER_PHASE,
                key: format!("phase:{word}"),
                description: format!("hawser PID 1: boot phase \"{word}\""),
                covers: "hawser's boot phase (constant)".into(),
                digest: phase_digest(word),
                phase: Some(word),
            });
        }

        Ok(Prediction {
            stub,
            kernel_release,
            uki_size: uki.len() as u64,
            uki_sha256: Sha256::digest(uki).into(),
            uki_authenticode,
            kernel_authenticode,
            sections,
            cmdline,
            initrd_size,
            events,
        })
    }

    /// The predicted value of `pcr` at `phase` (phase only matters for PCR 11).
    pub fn pcr(&self, pcr: u8, phase: Phase) -> [u8; 32] {
        self.events
            .iter()
            .filter(|e| e.pcr == pcr)
            .filter(|e| e.phase.is_none_or(|word| phase.includes(word)))
            .fold([0u8; 32], |value, e| extend_sha256(&value, &e.digest))
    }

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
                        key: "app#0".into(),
                        description: format!(
                            "OVMF: EV_EFI_BOOT_SERVICES_APPLICATION, the boot manager {name} (Authenticode)"
                        ),
                        covers: format!("the boot manager {name}"),
                        digest: *authenticode,
                        phase: None,
                    }),
                }
            }
            events.push(e.clone());
        }
        events
    }

    /// PCR 4's predicted value on `path` ([`Self::pcr4_events`]).
    pub fn pcr4_on(&self, path: &BootPath) -> [u8; 32] {
        self.pcr4_events(path)
            .iter()
            .fold([0u8; 32], |value, e| extend_sha256(&value, &e.digest))
    }

    /// The predicted values of all [`PREDICTED_PCRS`] at `phase`.
    pub fn pcrs(&self, phase: Phase) -> BTreeMap<u8, [u8; 32]> {
        PREDICTED_PCRS
            .iter()
            .map(|&pcr| (pcr, self.pcr(pcr, phase)))
            .collect()
    }

    /// The predicted values of all [`PREDICTED_PCRS`] at `phase` on a node locked to
    /// `cluster_id`: PCR 15 holds PID 1's node lock ([`hawser_pcr::cluster_lock_pcr`]) instead of
    /// zeros. `None` is a fresh node ([`Self::pcrs`]).
    pub fn pcrs_in_cluster(
        &self,
        phase: Phase,
        cluster_id: Option<&[u8; 32]>,
    ) -> BTreeMap<u8, [u8; 32]> {
        let mut pcrs = self.pcrs(phase);
        if let Some(id) = cluster_id {
            pcrs.insert(hawser_pcr::PCR_CLUSTER_ID, hawser_pcr::cluster_lock_pcr(id));
        }
        pcrs
    }

    /// The expected measurements at `phase` in Constellation's format (what `hawser-joind`,
    /// `hawser init` and the validator read): `{"<pcr>": {"expected": hex, "warnOnly": false}}`,
    /// every predicted PCR enforced.
    pub fn expected_measurements_json(&self, phase: Phase) -> serde_json::Value {
        self.expected_measurements_json_in_cluster(phase, None)
    }

    /// [`Self::expected_measurements_json`] of a node locked to `cluster_id`
    /// ([`Self::pcrs_in_cluster`]).
    pub fn expected_measurements_json_in_cluster(
        &self,
        phase: Phase,
        cluster_id: Option<&[u8; 32]>,
    ) -> serde_json::Value {
        self.pcrs_in_cluster(phase, cluster_id)
            .into_iter()
            .map(|(pcr, value)| {
                (
                    pcr.to_string(),
                    serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
                )
            })
            .collect::<serde_json::Map<String, serde_json::Value>>()
            .into()
    }

    /// The digest of the first section called `name`.
    pub fn section(&self, name: &str) -> Option<&SectionDigest> {
        self.sections.iter().find(|s| s.name == name)
    }
}

/// The digest and size of the initrd the kernel loads, and a description of its parts.
///
/// systemd-stub 257 (`run()` and `combine_initrds()` in `src/boot/stub.c`) hands the kernel
/// the parts `.ucode`, `.initrd` and the `.osrel` cpio (stubs before 257 pass no such cpio:
/// [`StubModel::osrel_cpio`]) (other parts come from files on the ESP
/// or sections refused earlier); a single part is passed as is, several are each zero-padded to
/// a multiple of 4 bytes and concatenated.
fn initrd_measurement(
    pe: &PeImage<'_>,
    label: &str,
    model: &StubModel,
) -> Result<([u8; 32], u64, String), PredictError> {
    let osrel_cpio = match pe.section(".osrel").filter(|_| model.osrel_cpio) {
        Some(s) => {
            let loaded = pe.loaded(s);
            if loaded.len() > MAX_TEXT_SECTION {
                return Err(PredictError::TooLarge {
                    uki: label.to_owned(),
                    section: ".osrel",
                    size: loaded.len() as u64,
                    limit: MAX_TEXT_SECTION as u64,
                });
            }
            Some(osrel_cpio(&loaded.to_vec()))
        }
        None => None,
    };
    let mut parts: Vec<(String, hawser_pe::Loaded<'_>)> = Vec::new();
    for name in [".ucode", ".initrd"] {
        if let Some(s) = pe.section(name) {
            let loaded = pe.loaded(s);
            if !loaded.is_empty() {
                parts.push((name.to_owned(), loaded));
            }
        }
    }
    if let Some(cpio) = &osrel_cpio {
        parts.push((
            ".osrel as /.extra/os-release (systemd-stub's cpio)".to_owned(),
            hawser_pe::Loaded {
                data: cpio,
                zeros: 0,
            },
        ));
    }
    let mut hasher = Sha256::new();
    let mut total: u64 = 0;
    let pad = parts.len() > 1;
    let mut described = Vec::new();
    for (name, loaded) in &parts {
        loaded.feed(|b| hasher.update(b));
        let mut len = loaded.len() as u64;
        if pad {
            let padding = (4 - len % 4) % 4;
            hasher.update(&[0u8; 3][..padding as usize]);
            len += padding;
            described.push(if padding > 0 {
                format!(
                    "{name} ({} + {padding} zero bytes)",
                    size(loaded.len() as u64)
                )
            } else {
                format!("{name} ({})", size(loaded.len() as u64))
            });
        } else {
            described.push(format!("{name} ({})", size(len)));
        }
        total += len;
    }
    Ok((
        hasher.finalize().into(),
        total,
        format!("the initrd the kernel loads: {}", described.join(" ‖ ")),
    ))
}

/// A size for people: bytes, KiB or MiB.
pub(crate) fn size(bytes: u64) -> String {
    if bytes < 10 * 1024 {
        format!("{bytes} bytes")
    } else if bytes < 1024 * 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::{SDMAGIC_257, tiny_kernel, tiny_uki as tiny_pe_uki};
    use hawser_pe::test_support::tiny_pe;

    fn sha(data: &[u8]) -> [u8; 32] {
        Sha256::digest(data).into()
    }

    /// The keys of systemd-stub's PCR 11 events, in order.
    fn stub_pcr11_keys(p: &Prediction) -> Vec<&str> {
        p.events
            .iter()
            .filter(|e| e.pcr == 11 && e.phase.is_none())
            .map(|e| e.key.as_str())
            .collect()
    }

    /// A UKI-shaped PE whose .linux is itself a (tiny) PE.
    fn tiny_uki(cmdline: &[u8], initrd: &[u8]) -> Vec<u8> {
        let kernel = tiny_kernel(b"kernel code");
        tiny_pe_uki(&[
            (".text", b"stub code"),
            (".osrel", b"ID=hawser\n"),
            (".cmdline", cmdline),
            (".uname", b"6.12.0"),
            (".linux", &kernel),
            (".initrd", initrd),
            (".sbat", b"sbat,1\n"),
        ])
    }

    #[test]
    fn pcr11_is_name_then_contents_in_stub_order() {
        let uki = tiny_uki(b"console=ttyS0", b"INITRD");
        let p = Prediction::from_uki(&uki, "t").expect("predict");
        assert_eq!(
            stub_pcr11_keys(&p),
            [
                "ipl:.linux#1",
                "ipl:.linux#2",
                "ipl:.osrel#1",
                "ipl:.osrel#2",
                "ipl:.cmdline#1",
                "ipl:.cmdline#2",
                "ipl:.initrd#1",
                "ipl:.initrd#2",
                "ipl:.uname#1",
                "ipl:.uname#2",
                "ipl:.sbat#1",
                "ipl:.sbat#2",
            ]
        );
        // Recompute PCR 11 by hand from the raw bytes.
        let kernel = tiny_kernel(b"kernel code");
        let mut v = [0u8; 32];
        for (name, data) in [
            (".linux", kernel.as_slice()),
            (".osrel", b"ID=hawser\n"),
            (".cmdline", b"console=ttyS0"),
            (".initrd", b"INITRD"),
            (".uname", b"6.12.0"),
            (".sbat", b"sbat,1\n"),
        ] {
            v = extend_sha256(&v, &sha(format!("{name}\0").as_bytes()));
            v = extend_sha256(&v, &sha(data));
        }
        assert_eq!(p.pcr(11, Phase::Stub), v);
        let enter = extend_sha256(&v, &phase_digest("enter-initrd"));
        assert_eq!(p.pcr(11, Phase::EnterInitrd), enter);
        assert_eq!(
            p.pcr(11, Phase::LeaveInitrd),
            extend_sha256(&enter, &phase_digest("leave-initrd"))
        );
        let marked = extend_sha256(&enter, &phase_digest("control-plane"));
        assert_eq!(
            p.pcr(11, Phase::LeaveInitrdControlPlane),
            extend_sha256(&marked, &phase_digest("leave-initrd"))
        );
        assert_eq!(
            p.pcr(11, Phase::LeaveInitrdControlPlane),
            hawser_pcr::pcr11_after_pivot(&enter, true)
        );
        // The marker is PCR 11's alone, and a worker's phases never include it.
        for pcr in [4, 9, 12, 13, 15] {
            assert_eq!(
                p.pcr(pcr, Phase::LeaveInitrdControlPlane),
                p.pcr(pcr, Phase::LeaveInitrd)
            );
        }
        assert_eq!(p.pcr(11, Phase::EnterInitrd), enter);
    }

    #[test]
    fn pcr9_is_utf16_cmdline_then_padded_initrd_and_osrel_cpio() {
        let uki = tiny_uki(b"console=ttyS0\n", b"12345");
        let p = Prediction::from_uki(&uki, "t").expect("predict");
        let cmd: Vec<u8> = "console=ttyS0\0"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        let mut initrd = b"12345\0\0\0".to_vec();
        initrd.extend_from_slice(&osrel_cpio(b"ID=hawser\n"));
        let expected = extend_sha256(&extend_sha256(&[0; 32], &sha(&cmd)), &sha(&initrd));
        assert_eq!(p.pcr(9, Phase::Stub), expected);
        assert_eq!(p.initrd_size, initrd.len() as u64);
        assert_eq!(p.cmdline, "console=ttyS0");
    }

    #[test]
    fn pcr4_is_ovmf_prefix_then_both_authenticode_hashes() {
        let uki = tiny_uki(b"c", b"i");
        let p = Prediction::from_uki(&uki, "t").expect("predict");
        let pcr4: Vec<[u8; 32]> = p
            .events
            .iter()
            .filter(|e| e.pcr == 4)
            .map(|e| e.digest)
            .collect();
        assert_eq!(pcr4.len(), 4);
        // sha256("Calling EFI Application from Boot Option") and sha256(00000000), computed
        // with coreutils: printf … | sha256sum.
        assert_eq!(
            hex::encode(pcr4[0]),
            "3d6772b4f84ed47595d72a2c4c5ffd15f5bb72c7507fe26f2aaee2c69d5633ba"
        );
        assert_eq!(
            hex::encode(pcr4[1]),
            "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119"
        );
        assert_eq!(pcr4[2], p.uki_authenticode);
        assert_eq!(pcr4[3], p.kernel_authenticode);
        assert_ne!(p.uki_authenticode, p.kernel_authenticode);
    }

    #[test]
    fn other_pcrs_are_zero_and_predictions_follow_every_byte() {
        let a = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRD"), "a").expect("a");
        for pcr in [12, 13, 15] {
            assert_eq!(a.pcr(pcr, Phase::LeaveInitrd), [0; 32]);
        }
        let b = Prediction::from_uki(&tiny_uki(b"console=ttyS1", b"INITRD"), "b").expect("b");
        let c = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRE"), "c").expect("c");
        for pcr in [4, 9, 11] {
            assert_ne!(
                a.pcr(pcr, Phase::EnterInitrd),
                b.pcr(pcr, Phase::EnterInitrd)
            );
            assert_ne!(
                a.pcr(pcr, Phase::EnterInitrd),
                c.pcr(pcr, Phase::EnterInitrd)
            );
        }
        // Deterministic.
        let again = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRD"), "a").expect("a");
        assert_eq!(a.pcrs(Phase::EnterInitrd), again.pcrs(Phase::EnterInitrd));
    }

    #[test]
    fn missing_and_unmodelled_sections_are_named() {
        let kernel = tiny_kernel(b"k");
        let no_initrd = tiny_pe(&[(".cmdline", b"c"), (".linux", &kernel)]);
        let err = Prediction::from_uki(&no_initrd, "x.efi").unwrap_err();
        assert!(
            err.to_string().starts_with(
                "the UKI x.efi has no .initrd section (its sections: .cmdline .linux)"
            ),
            "{err}"
        );
        let no_linux = tiny_pe(&[(".cmdline", b"c"), (".initrd", b"i")]);
        let err = Prediction::from_uki(&no_linux, "x.efi").unwrap_err();
        assert!(
            err.to_string().contains("x.efi has no .linux section"),
            "{err}"
        );
        let with_pcrsig = tiny_pe_uki(&[
            (".cmdline", b"c"),
            (".linux", &kernel),
            (".initrd", b"i"),
            (".pcrsig", b"{}"),
        ]);
        let err = Prediction::from_uki(&with_pcrsig, "x.efi").unwrap_err();
        assert!(err.to_string().contains(".pcrsig"), "{err}");
        let bad_kernel = tiny_pe_uki(&[
            (".cmdline", b"c"),
            (".linux", b"not a PE"),
            (".initrd", b"i"),
        ]);
        let err = Prediction::from_uki(&bad_kernel, "x.efi").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the kernel in the .linux section of x.efi is not a PE image"),
            "{err}"
        );
    }

    #[test]
    fn the_stub_version_selects_pcr11_sections_and_the_osrel_cpio() {
        let kernel = tiny_kernel(b"kernel code");
        let with_stub = |magic: &[u8]| {
            tiny_pe(&[
                (".sdmagic", magic),
                (".osrel", b"ID=hawser\n"),
                (".cmdline", b"console=ttyS0"),
                (".uname", b"6.12.0"),
                (".linux", &kernel),
                (".initrd", b"INITRD"),
                (".sbat", b"sbat,1\n"),
            ])
        };
        let old = Prediction::from_uki(
            &with_stub(b"#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####\0"),
            "252.efi",
        )
        .expect("systemd-stub 252 is modelled");
        assert_eq!(old.stub.version, "252.39-1~deb12u2");
        assert_eq!(old.kernel_release, crate::test_fixtures::KERNEL_RELEASE);
        // 252 knows neither .uname nor .sbat.
        assert_eq!(
            stub_pcr11_keys(&old),
            [
                "ipl:.linux#1",
                "ipl:.linux#2",
                "ipl:.osrel#1",
                "ipl:.osrel#2",
                "ipl:.cmdline#1",
                "ipl:.cmdline#2",
                "ipl:.initrd#1",
                "ipl:.initrd#2"
            ]
        );
        // Before 257 the kernel gets .initrd as it is: no padding, no os-release cpio.
        assert_eq!(old.initrd_size, 6);
        let initrd_event = old
            .events
            .iter()
            .find(|e| e.key.ends_with("0x8f3b22ec"))
            .unwrap();
        assert_eq!(initrd_event.digest, sha(b"INITRD"));

        let new = Prediction::from_uki(&with_stub(SDMAGIC_257), "257.efi").expect("257");
        assert!(new.initrd_size > 8, "257 appends the os-release cpio");
        assert_ne!(new.pcr(11, Phase::Stub), old.pcr(11, Phase::Stub));
    }

    #[test]
    fn unknown_stubs_and_kernels_are_refused_by_name() {
        let refusal = |uki: &[u8]| Prediction::from_uki(uki, "x.efi").unwrap_err().to_string();
        let kernel = tiny_kernel(b"k");
        let no_magic = tiny_pe(&[(".cmdline", b"c"), (".linux", &kernel), (".initrd", b"i")]);
        let err = refusal(&no_magic);
        assert!(
            err.starts_with(
                "the UKI x.efi does not say which stub it has (it has no .sdmagic section)"
            ),
            "{err}"
        );
        let old = tiny_pe(&[
            (
                ".sdmagic",
                b"#### LoaderInfo: systemd-stub 249.11-0ubuntu3 ####\0",
            ),
            (".cmdline", b"c"),
            (".linux", &kernel),
            (".initrd", b"i"),
        ]);
        let err = refusal(&old);
        assert!(
            err.starts_with("systemd-stub 249.11-0ubuntu3 in the UKI x.efi is not modelled"),
            "{err}"
        );
        let with_kernel = |kernel: &[u8]| {
            tiny_pe_uki(&[(".cmdline", b"c"), (".linux", kernel), (".initrd", b"i")])
        };
        let mut other_kernel = tiny_kernel(b"k");
        other_kernel[0x300..0x302].copy_from_slice(b"5.");
        let err = refusal(&with_kernel(&other_kernel));
        assert!(
            err.starts_with("Linux 5.12.0-test in the UKI x.efi is not modelled"),
            "{err}"
        );
        let err = refusal(&with_kernel(&tiny_pe(&[(".text", b"k")])));
        assert!(
            err.contains("has no readable version (no \"HdrS\" setup header"),
            "{err}"
        );
    }

    #[test]
    fn boot_paths_insert_their_firmware_events_before_the_uki() {
        let p = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRD"), "t").unwrap();
        assert_eq!(p.pcr4_on(&BootPath::Direct), p.pcr(4, Phase::Stub));
        let keys = |path| {
            p.pcr4_events(&path)
                .into_iter()
                .map(|e| e.key)
                .collect::<Vec<_>>()
        };
        let calling = format!("action:{OVMF_CALLING_EFI_APPLICATION}");
        let returning = format!("action:{OVMF_RETURNING_FROM_EFI_APPLICATION}");
        assert_eq!(
            keys(BootPath::FailedBootOptions { count: 2 }),
            [
                calling.clone(),
                "separator".into(),
                format!("{returning}#1"),
                format!("{calling}#2"),
                format!("{returning}#2"),
                format!("{calling}#3"),
                "app#1".into(),
                "app#2".into()
            ]
        );
        // Recomputed by hand: the direct value's events with one retry inserted.
        let mut v = [0u8; 32];
        for digest in [
            sha(OVMF_CALLING_EFI_APPLICATION.as_bytes()),
            sha(&[0u8; 4]),
            sha(OVMF_RETURNING_FROM_EFI_APPLICATION.as_bytes()),
            sha(OVMF_CALLING_EFI_APPLICATION.as_bytes()),
            p.uki_authenticode,
            p.kernel_authenticode,
        ] {
            v = extend_sha256(&v, &digest);
        }
        assert_eq!(p.pcr4_on(&BootPath::FailedBootOptions { count: 1 }), v);
        let manager = BootPath::BootManager {
            name: "systemd-boot".into(),
            authenticode: [7; 32],
        };
        assert_eq!(
            keys(manager.clone()),
            [
                calling.clone(),
                "separator".into(),
                "app#0".into(),
                "app#1".into(),
                "app#2".into()
            ]
        );
        let other = BootPath::BootManager {
            name: "systemd-boot".into(),
            authenticode: [8; 32],
        };
        assert_ne!(
            p.pcr4_on(&manager),
            p.pcr4_on(&other),
            "another application, another value"
        );
    }

    #[test]
    fn truncated_or_corrupted_ukis_are_errors_never_panics() {
        let uki = tiny_uki(b"console=ttyS0", b"INITRD");
        for len in 0..uki.len() {
            assert!(
                Prediction::from_uki(&uki[..len], "t").is_err(),
                "a {len}-byte prefix predicted"
            );
        }
        // Every single-byte corruption of the headers either predicts or fails cleanly.
        for at in 0..hawser_pe::test_support::TINY_HEADERS {
            for value in [0x00, 0x7f, 0xff] {
                let mut bad = uki.clone();
                bad[at] = value;
                let _ = Prediction::from_uki(&bad, "t");
            }
        }
    }
}
