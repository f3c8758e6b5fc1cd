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
//! | 12, 13, 15 | nothing (no command-line override, credentials, sysexts; a fresh node) | |
//!
//! The stub's version (`.sdmagic`) and the kernel's (`.linux`) select the model
//! ([`crate::models`]); a version never proven on a real boot is refused by name.
//!
//! Each PCR's events are built in a module of its own (`pcr4`, with the boot paths; `pcr9`;
//! `pcr11`); this file holds the types, the order they are built in, and the PCR values.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::authenticode::authenticode_sha256;
use crate::models::{self, ModelError, StubIdentity};
use hawser_pcr::{
    PHASE_CONTROL_PLANE, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, extend_sha256, phase_digest,
};
use hawser_pe::{PeError, PeImage};

mod pcr11;
mod pcr12;
mod pcr4;
mod pcr9;
mod sections;

pub use pcr4::{BootPath, OVMF_CALLING_EFI_APPLICATION, OVMF_RETURNING_FROM_EFI_APPLICATION};
pub use pcr9::{LINUX_TAG_INITRD, LINUX_TAG_LOAD_OPTIONS};
pub use pcr12::UKI_PROFILE_EVENT_TAG;

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
    /// The profile predicted (the boot entry's `@N`; 0 when it passes none).
    pub profile: u32,
    /// How many profiles the UKI has (1 for a UKI without `.profile` sections).
    pub profiles: u32,
    /// Sections of the UKI specification the UKI has but this stub version ignores (a newer
    /// stub acts on them): they are in no PCR but PCR 4's Authenticode hash of the whole file.
    pub ignored_sections: Vec<String>,
    /// Which `.dtbauto` the stub uses and why, when the UKI has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtbauto: Option<String>,
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
    /// `--profile` named a profile the UKI does not have.
    #[error(
        "the UKI {uki} has no profile {profile}: it has {profiles} (numbered from 0), one per .profile section"
    )]
    NoSuchProfile {
        uki: String,
        profile: u32,
        profiles: u32,
    },
    /// `--profile` for a stub that has no profiles.
    #[error(
        "the UKI {uki} carries {stub}, which has no profiles (they came with systemd-stub 257): it boots only what profile 0 would"
    )]
    NoProfiles { uki: String, stub: StubIdentity },
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

/// How a UKI is booted, beyond its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PredictOptions {
    /// Predict as if the UKI carried this stub ([`Prediction::from_uki_assuming`]).
    pub assume_stub: Option<u32>,
    /// The profile the boot entry selects with `@N` (systemd-stub 257 on); 0 when it passes
    /// none.
    pub profile: u32,
}

impl Prediction {
    /// Predicts every event of a boot of `uki`; `label` names the file in errors. The stub and
    /// the kernel must be modelled versions ([`crate::models`]).
    pub fn from_uki(uki: &[u8], label: &str) -> Result<Prediction, PredictError> {
        Self::from_uki_with(uki, label, PredictOptions::default())
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
        Self::from_uki_with(
            uki,
            label,
            PredictOptions {
                assume_stub,
                profile: 0,
            },
        )
    }

    /// Predicts a boot of `uki` as `options` say it is booted.
    pub fn from_uki_with(
        uki: &[u8],
        label: &str,
        options: PredictOptions,
    ) -> Result<Prediction, PredictError> {
        let PredictOptions {
            assume_stub,
            profile,
        } = options;
        let pe = PeImage::parse(uki, format!("UKI {label}"))?;
        for (section, why) in REQUIRED_SECTIONS {
            if pe.section(section).is_none() {
                return Err(missing_section(&pe, label, section, why));
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

        let chosen = sections::choose(&pe, model, &stub, profile, label)?;
        for (section, why) in REQUIRED_SECTIONS {
            if chosen.get(section).is_none() {
                return Err(missing_section(&pe, label, section, why));
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

        let mut events = Vec::new();

        // PCR 4: OVMF's boot manager, then the two images it loads.
        let uki_authenticode = authenticode_sha256(&pe)?;
        let kernel = pcr4::LinuxKernel::from_uki(&pe, &chosen, label, assume_stub)?;
        events.extend(pcr4::boot_events(
            uki.len() as u64,
            uki_authenticode,
            &kernel,
        ));

        // PCR 9: the Linux EFI stub.
        let (cmdline, load_options_event) = pcr9::load_options(&pe, &chosen, label)?;
        events.push(load_options_event);
        let (initrd_size, initrd_event) = pcr9::initrd(&pe, &chosen, label, model)?;
        events.push(initrd_event);

        // PCR 11: systemd-stub's sections, then hawser's phases.
        events.extend(pcr11::events(model, &chosen, &sections));

        // PCR 12: the profile, if not the default one.
        events.extend(pcr12::profile_event(profile));

        Ok(Prediction {
            stub,
            kernel_release: kernel.release,
            uki_size: uki.len() as u64,
            uki_sha256: Sha256::digest(uki).into(),
            uki_authenticode,
            kernel_authenticode: kernel.authenticode,
            sections,
            cmdline,
            initrd_size,
            profile,
            profiles: chosen.profiles,
            dtbauto: chosen.dtbauto.clone(),
            ignored_sections: models::ignored_sections(
                model,
                pe.sections.iter().map(|s| s.name.as_str()),
            ),
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

/// The error for a UKI without the required `section`, listing the sections it has.
fn missing_section(
    pe: &PeImage<'_>,
    label: &str,
    section: &'static str,
    why: &'static str,
) -> PredictError {
    PredictError::MissingSection {
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
    }
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
mod tests;
