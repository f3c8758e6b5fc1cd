//! Which section of each name systemd-stub uses.
//!
//! Before 257 the stub takes the last section whose name starts with the wanted one
//! ([`SectionLookup::LastByPrefix`]: a `.dtbauto` is its `.dtb`, a multi-profile UKI's last
//! profile wins, `.profile` means nothing). From 257 on
//! (`pe_locate_profile_sections`, `src/boot/pe.c`) a UKI may carry profiles: the sections
//! before the first `.profile` are the base, each `.profile` starts a profile that runs to the
//! next one, and the stub takes the base's sections overridden by those of the chosen profile
//! (profile 0 when the boot entry passes no `@N`; a UKI without `.profile` has only that one).
//! Within each part, `.dtbauto` is not simply the first of its name: the stub takes the first
//! whose devicetree is compatible with the device its `.hwids` name for this machine
//! ([`crate::hwids`]), and none when no device matches.

use hawser_pe::{PeImage, SectionHeader};

use super::PredictError;
use crate::hwids;
use crate::models::{SectionLookup, StubIdentity, StubModel};

/// The sections a stub uses, by name, and which part of the UKI each comes from.
pub(crate) struct Chosen<'p> {
    entries: Vec<(&'static str, &'p SectionHeader, Origin)>,
    /// What the `.dtbauto` choice was based on, if the stub made one.
    pub dtbauto: Option<String>,
}

/// Where a chosen section sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A UKI without profiles, or the base before the first `.profile`.
    Base,
    /// The chosen profile's sections.
    Profile(u32),
}

impl<'p> Chosen<'p> {
    /// The section the stub uses for `name`.
    pub fn get(&self, name: &str) -> Option<&'p SectionHeader> {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, s, _)| *s)
    }

    /// "the .cmdline section" or "the .cmdline section of profile 1".
    pub fn describe(&self, name: &str) -> String {
        match self.entries.iter().find(|(n, _, _)| *n == name) {
            Some((_, _, Origin::Profile(p))) => format!("the {name} section of profile {p}"),
            _ => format!("the {name} section"),
        }
    }
}

/// The number of profiles of a UKI to a stub with profiles: one per `.profile` section, and
/// the implied profile 0 when there is none.
pub(crate) fn profile_count(pe: &PeImage<'_>) -> u32 {
    let n = pe.sections.iter().filter(|s| s.name == ".profile").count();
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// The sections `model` uses in `pe` when booted with `profile`.
pub(crate) fn choose<'p>(
    pe: &'p PeImage<'_>,
    model: &StubModel,
    stub: &StubIdentity,
    profile: u32,
    label: &str,
) -> Result<Chosen<'p>, PredictError> {
    // Every name of the stub's enum: the measured ones and `.pcrsig`.
    let names: Vec<&'static str> = model
        .pcr11_sections
        .iter()
        .copied()
        .chain([".pcrsig"])
        .collect();
    let table = &pe.sections;
    if !model.has_profiles() {
        if profile != 0 {
            return Err(PredictError::NoProfiles {
                uki: label.to_owned(),
                stub: stub.clone(),
            });
        }
        let entries = names
            .iter()
            .filter_map(|&n| {
                let mut candidates = table.iter().filter(|s| model.lookup.matches(&s.name, n));
                let found = match model.lookup {
                    SectionLookup::LastByPrefix => candidates.next_back(),
                    SectionLookup::FirstExact => candidates.next(),
                };
                found.map(|s| (n, s, Origin::Base))
            })
            .collect();
        return Ok(Chosen {
            entries,
            dtbauto: None,
        });
    }
    let starts: Vec<usize> = table
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name == ".profile")
        .map(|(i, _)| i)
        .collect();
    let base_end = starts.first().copied().unwrap_or(table.len());
    let mut dtbauto = None;
    let mut entries: Vec<(&'static str, &'p SectionHeader, Origin)> =
        locate(pe, model, &table[..base_end], &names, &mut dtbauto)
            .into_iter()
            .map(|(n, s)| (n, s, Origin::Base))
            .collect();
    let p = usize::try_from(profile).unwrap_or(usize::MAX);
    match starts.get(p) {
        Some(&start) => {
            let end = starts.get(p + 1).copied().unwrap_or(table.len());
            let mut profile_dtbauto = None;
            for (n, s) in locate(pe, model, &table[start..end], &names, &mut profile_dtbauto) {
                entries.retain(|(m, _, _)| *m != n);
                entries.push((n, s, Origin::Profile(profile)));
            }
            if profile_dtbauto.is_some() {
                dtbauto = profile_dtbauto;
            }
        }
        // "The first profile is implied if it doesn't exist" (`find_sections`).
        None if profile == 0 && starts.is_empty() => {}
        None => {
            return Err(PredictError::NoSuchProfile {
                uki: label.to_owned(),
                profile,
                profiles: profile_count(pe),
            });
        }
    }
    // Keep the enum's order.
    entries.sort_by_key(|(n, _, _)| names.iter().position(|m| m == n));
    Ok(Chosen { entries, dtbauto })
}

fn first<'p>(part: &'p [SectionHeader], name: &str) -> Option<&'p SectionHeader> {
    part.iter().find(|s| s.name == name)
}

/// `pe_locate_sections` over one part of the table: the first section of each name, except
/// `.dtbauto` (see the module docs). `dtbauto` receives what the choice was based on.
fn locate<'p>(
    pe: &PeImage<'_>,
    model: &StubModel,
    part: &'p [SectionHeader],
    names: &[&'static str],
    dtbauto: &mut Option<String>,
) -> Vec<(&'static str, &'p SectionHeader)> {
    let mut found = Vec::new();
    for &name in names {
        if name == ".dtbauto" && model.picks_dtbauto() {
            let (chosen, why) = pick_dtbauto(pe, part);
            if part.iter().any(|s| s.name == ".dtbauto") {
                *dtbauto = Some(why);
            }
            if let Some(s) = chosen {
                found.push((name, s));
            }
        } else if let Some(s) = first(part, name) {
            found.push((name, s));
        }
    }
    found
}

/// The `.dtbauto` of `part` systemd-stub 257 installs on the QEMU reference platform (no
/// firmware devicetree): the first compatible with the device `part`'s `.hwids` name for the
/// platform's hardware IDs, or none. With the reason, in words.
fn pick_dtbauto<'p>(
    pe: &PeImage<'_>,
    part: &'p [SectionHeader],
) -> (Option<&'p SectionHeader>, String) {
    let Some(hwids_section) = first(part, ".hwids") else {
        return (
            None,
            "no .hwids section beside it, and the platform has no firmware devicetree: no .dtbauto is used".into(),
        );
    };
    let table = pe.loaded(hwids_section).to_vec();
    let devices = match hwids::parse_hwids(&table) {
        Ok(devices) => devices,
        Err(e) => {
            return (
                None,
                format!("the .hwids section is not usable ({e}): no .dtbauto is used"),
            );
        }
    };
    let machine = hwids::chids(&hwids::QEMU_REFERENCE_SMBIOS);
    let Some(device) = hwids::matched_device(&devices, &machine) else {
        return (
            None,
            format!(
                "none of the {} devices in .hwids has a hardware ID of the QEMU reference platform: no .dtbauto is used",
                devices.len()
            ),
        );
    };
    let blobs: Vec<(usize, Vec<u8>)> = part
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name == ".dtbauto")
        .map(|(i, s)| (i, pe.loaded(s).to_vec()))
        .collect();
    let pick = hwids::select_dtbauto(blobs.iter().map(|(i, b)| (*i, b.as_slice())), Some(device));
    match pick {
        Some(i) => (
            part.get(i),
            format!(
                "the .hwids device {:?} matches the QEMU reference platform; the .dtbauto compatible with {:?} is used",
                device.name.as_deref().unwrap_or("(unnamed)"),
                device.compatible.as_deref().unwrap_or("(none)")
            ),
        ),
        None => (
            None,
            format!(
                "the .hwids device {:?} matches the QEMU reference platform, but no .dtbauto is compatible with {:?}: none is used",
                device.name.as_deref().unwrap_or("(unnamed)"),
                device.compatible.as_deref().unwrap_or("(none)")
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
