//! [`diff`]: a reference held against a rebuild's, naming what changed (PCRs with the measured
//! sections behind them, UKI sections, locked inputs, rootfs packages, initramfs files) and
//! rendering it for a person.

use std::collections::BTreeMap;
use std::fmt;

use super::ReferenceMeasurements;
use crate::predict::PREDICTED_PCRS;

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
    if rm.kubernetes_lock_digest != cm.kubernetes_lock_digest {
        d.rootfs.push(Change {
            what: "kubernetes.lock digest".to_owned(),
            before: rm.kubernetes_lock_digest.clone(),
            after: cm.kubernetes_lock_digest.clone(),
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
