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
    table: &'p [SectionHeader],
    /// (name in the stub's enum, index in `table`, where it sits), in the enum's order.
    entries: Vec<(&'static str, usize, Origin)>,
    /// What the `.dtbauto` choice was based on, if the stub made one.
    pub dtbauto: Option<String>,
    /// How many profiles the UKI has to this stub (1 without `.profile` sections, or for a
    /// stub without profiles).
    pub profiles: u32,
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
    fn entry(&self, name: &str) -> Option<&(&'static str, usize, Origin)> {
        self.entries.iter().find(|(n, _, _)| *n == name)
    }

    /// The index in the section table of the section the stub uses for `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.entry(name).map(|(_, i, _)| *i)
    }

    /// The section the stub uses for `name`.
    pub fn get(&self, name: &str) -> Option<&'p SectionHeader> {
        self.index(name).and_then(|i| self.table.get(i))
    }

    /// "the .cmdline section" or "the .cmdline section of profile 1".
    pub fn describe(&self, name: &str) -> String {
        match self.entry(name) {
            Some((_, _, Origin::Profile(p))) => format!("the {name} section of profile {p}"),
            _ => format!("the {name} section"),
        }
    }
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
    let table = pe.sections.as_slice();
    let starts: Vec<usize> = if model.has_profiles() {
        table
            .iter()
            .enumerate()
            .filter(|(_, s)| s.name == ".profile")
            .map(|(i, _)| i)
            .collect()
    } else {
        if profile != 0 {
            return Err(PredictError::NoProfiles {
                uki: label.to_owned(),
                stub: stub.clone(),
            });
        }
        Vec::new()
    };
    let profiles = u32::try_from(starts.len().max(1)).unwrap_or(u32::MAX);
    let base_end = starts.first().copied().unwrap_or(table.len());
    let mut dtbauto = None;
    let mut entries: Vec<(&'static str, usize, Origin)> =
        locate(pe, model, table, 0..base_end, &names, &mut dtbauto)
            .into_iter()
            .map(|(n, i)| (n, i, Origin::Base))
            .collect();
    let p = usize::try_from(profile).unwrap_or(usize::MAX);
    match starts.get(p) {
        Some(&start) => {
            let end = starts.get(p + 1).copied().unwrap_or(table.len());
            let mut profile_dtbauto = None;
            for (n, i) in locate(pe, model, table, start..end, &names, &mut profile_dtbauto) {
                entries.retain(|(m, _, _)| *m != n);
                entries.push((n, i, Origin::Profile(profile)));
            }
            if profile_dtbauto.is_some() {
                dtbauto = profile_dtbauto;
            }
        }
        // "The first profile is implied if it doesn't exist" (`find_sections`).
        None if profile == 0 => {}
        None => {
            return Err(PredictError::NoSuchProfile {
                uki: label.to_owned(),
                profile,
                profiles,
            });
        }
    }
    // Keep the enum's order.
    entries.sort_by_key(|(n, _, _)| names.iter().position(|m| m == n));
    Ok(Chosen {
        table,
        entries,
        dtbauto,
        profiles,
    })
}

/// The index of the section `model` finds for `name` among `table[range]` ([`SectionLookup`]).
fn find(
    model: &StubModel,
    table: &[SectionHeader],
    range: std::ops::Range<usize>,
    name: &str,
) -> Option<usize> {
    let mut candidates = range.filter(|&i| model.lookup.matches(&table[i].name, name));
    match model.lookup {
        SectionLookup::LastByPrefix => candidates.next_back(),
        SectionLookup::FirstExact => candidates.next(),
    }
}

/// `pe_locate_sections` over `table[range]`: the section [`find`] gives for each name, except
/// `.dtbauto` where the stub picks one (see the module docs). `dtbauto` receives what the
/// choice was based on.
fn locate(
    pe: &PeImage<'_>,
    model: &StubModel,
    table: &[SectionHeader],
    range: std::ops::Range<usize>,
    names: &[&'static str],
    dtbauto: &mut Option<String>,
) -> Vec<(&'static str, usize)> {
    let mut found = Vec::new();
    for &name in names {
        if name == ".dtbauto" && model.picks_dtbauto() {
            let part = &table[range.clone()];
            let (chosen, why) = pick_dtbauto(pe, part);
            if part.iter().any(|s| s.name == ".dtbauto") {
                *dtbauto = Some(why);
            }
            if let Some(i) = chosen {
                found.push((name, range.start + i));
            }
        } else if let Some(i) = find(model, table, range.clone(), name) {
            found.push((name, i));
        }
    }
    found
}

/// The `.dtbauto` of `part` systemd-stub 257 installs on the QEMU reference platform (no
/// firmware devicetree): the first compatible with the device `part`'s `.hwids` name for the
/// platform's hardware IDs, or none. With the reason, in words.
fn pick_dtbauto(pe: &PeImage<'_>, part: &[SectionHeader]) -> (Option<usize>, String) {
    let Some(hwids_section) = part.iter().find(|s| s.name == ".hwids") else {
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
            Some(i),
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
