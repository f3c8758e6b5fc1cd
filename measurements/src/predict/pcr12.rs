//! PCR 12 for a UKI booted with a profile other than the default: systemd-stub 257 measures
//! the profile's number (`measure_profile`, `src/boot/stub.c`), and systemd-boot, which passes
//! the number as `@N` in the UKI's load options, measures those first (`image_start`,
//! `src/boot/boot.c`). Profile 0 measures nothing, whoever starts it.

use sha2::{Digest, Sha256};

use super::{PredictedEvent, event_type};

/// `UKI_PROFILE_EVENT_TAG_ID` (`src/fundamental/tpm2-pcr.h`): the tag of the stub's event for
/// the chosen profile.
pub const UKI_PROFILE_EVENT_TAG: u32 = 0x13ae_d6db;

/// UTF-16LE with a NUL terminator, as `strsize16` counts it.
fn utf16_with_nul(text: &str) -> Vec<u8> {
    text.encode_utf16()
        .chain([0])
        .flat_map(u16::to_le_bytes)
        .collect()
}

/// The stub's tagged event for `profile` (none for profile 0): the digest of the profile's
/// number in decimal, UTF-16 with its NUL (`xasprintf("%u", profile)`, `strsize16`).
pub(super) fn profile_event(profile: u32) -> Option<PredictedEvent> {
    (profile != 0).then(|| PredictedEvent {
        pcr: 12,
        event_type: event_type::EV_EVENT_TAG,
        key: format!("tag:{UKI_PROFILE_EVENT_TAG:#010x}"),
        description: format!("systemd-stub: the chosen profile \"{profile}\""),
        covers: format!("profile {profile}, which the boot entry chose with @{profile}"),
        digest: Sha256::digest(utf16_with_nul(&profile.to_string())).into(),
        phase: None,
    })
}

/// systemd-boot's event for the load options it passes a UKI's profile entry: `@N` (the
/// entry's own options are implied by the UKI's `.cmdline`, so nothing follows it).
pub(super) fn systemd_boot_options_event(profile: u32) -> Option<PredictedEvent> {
    (profile != 0).then(|| {
        let options = format!("@{profile}");
        PredictedEvent {
            pcr: 12,
            event_type: event_type::EV_IPL,
            key: format!("ipl:{options}#1"),
            description: format!("systemd-boot: the load options \"{options}\" (UTF-16)"),
            covers: format!("systemd-boot's menu entry for profile {profile}"),
            digest: Sha256::digest(utf16_with_nul(&options)).into(),
            phase: None,
        }
    })
}
