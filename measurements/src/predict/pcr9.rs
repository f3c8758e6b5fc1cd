//! PCR 9: what the Linux EFI stub measures, the command line it passes the kernel (UTF-16) and
//! the initrd the kernel loads (systemd-stub's parts, padded and concatenated).

use sha2::{Digest, Sha256};

use super::sections::Chosen;
use super::{
    MAX_TEXT_SECTION, PredictError, PredictedEvent, REQUIRED_SECTIONS, event_type, missing_section,
    size,
};
use crate::models::StubModel;
use crate::stub::{extra_cpio, load_options_utf16};
use hawser_pe::PeImage;

/// Event tag of the Linux EFI stub's command-line measurement (`efistub.h`).
pub const LINUX_TAG_LOAD_OPTIONS: u32 = 0x8F3B_22ED;
/// Event tag of the Linux EFI stub's initrd measurement (`efistub.h`).
pub const LINUX_TAG_INITRD: u32 = 0x8F3B_22EC;

/// The command line the kernel receives (after systemd-stub's conversion) and the Linux EFI
/// stub's event for it.
pub(super) fn load_options(
    pe: &PeImage<'_>,
    chosen: &Chosen<'_>,
    label: &str,
) -> Result<(String, PredictedEvent), PredictError> {
    let cmdline_header = chosen
        .get(".cmdline")
        .ok_or_else(|| missing_section(pe, label, ".cmdline", REQUIRED_SECTIONS[1].1))?;
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
    let event = PredictedEvent {
        pcr: 9,
        event_type: event_type::EV_EVENT_TAG,
        key: format!("tag:{LINUX_TAG_LOAD_OPTIONS:#010x}"),
        description: "Linux EFI stub: LOADED_IMAGE::LoadOptions (UTF-16 command line)".into(),
        covers: format!(
            "{}, as the kernel receives it: {cmdline:?}",
            chosen.describe(".cmdline")
        ),
        digest: Sha256::digest(&load_options).into(),
        phase: None,
    };
    Ok((cmdline, event))
}

/// The size of the initrd the kernel loads and the Linux EFI stub's event for it.
pub(super) fn initrd(
    pe: &PeImage<'_>,
    chosen: &Chosen<'_>,
    label: &str,
    model: &StubModel,
) -> Result<(u64, PredictedEvent), PredictError> {
    let (initrd_digest, initrd_size, initrd_covers) = initrd_measurement(pe, chosen, label, model)?;
    let event = PredictedEvent {
        pcr: 9,
        event_type: event_type::EV_EVENT_TAG,
        key: format!("tag:{LINUX_TAG_INITRD:#010x}"),
        description: "Linux EFI stub: Linux initrd".into(),
        covers: initrd_covers,
        digest: initrd_digest,
        phase: None,
    };
    Ok((initrd_size, event))
}

/// The digest and size of the initrd the kernel loads, and a description of its parts.
///
/// systemd-stub (`run()` and `combine_initrds()` in 257's `src/boot/stub.c`) hands the kernel
/// the sections of [`StubModel::initrd_sections`] (257: `.ucode`, then `.initrd`), then one
/// `/.extra` cpio per section of [`StubModel::extra_cpios`] the UKI has (257: `.pcrsig`,
/// `.pcrpkey`, `.osrel`, `.profile`; other parts come from files on the ESP); a single part
/// is passed as is, several are each zero-padded to a multiple of 4 bytes and concatenated.
fn initrd_measurement(
    pe: &PeImage<'_>,
    chosen: &Chosen<'_>,
    label: &str,
    model: &StubModel,
) -> Result<([u8; 32], u64, String), PredictError> {
    let mut parts: Vec<(String, hawser_pe::Loaded<'_>)> = Vec::new();
    for &name in model.initrd_sections {
        if let Some(s) = chosen.get(name) {
            let loaded = pe.loaded(s);
            if !loaded.is_empty() {
                parts.push((chosen.describe(name), loaded));
            }
        }
    }
    let mut cpios = Vec::new();
    for &(name, file) in model.extra_cpios {
        let Some(s) = chosen.get(name) else {
            continue;
        };
        let loaded = pe.loaded(s);
        if loaded.len() > MAX_TEXT_SECTION {
            return Err(PredictError::TooLarge {
                uki: label.to_owned(),
                section: name,
                size: loaded.len() as u64,
                limit: MAX_TEXT_SECTION as u64,
            });
        }
        cpios.push((
            format!(
                "{} as /.extra/{file} (systemd-stub's cpio)",
                chosen.describe(name)
            ),
            extra_cpio(file, &loaded.to_vec()),
        ));
    }
    for (what, cpio) in &cpios {
        parts.push((
            what.clone(),
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
