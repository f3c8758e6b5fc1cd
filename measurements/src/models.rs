//! Which stub and which kernel a UKI carries, and what each of them measures.
//!
//! A UKI is three programs: systemd-stub (its identity in `.sdmagic`), the Linux kernel in
//! `.linux` (its version in the bzImage setup header) and the initrd. What lands in PCRs 4, 9 and
//! 11 depends on the first two: which sections the stub measures into PCR 11 and in what order,
//! which cpios it appends to the initrd the kernel measures into PCR 9, whether it edits the
//! command line, and which of those the kernel's EFI stub measures. The predictor models each
//! version it has been proven on by a real OVMF + swtpm boot (`qemu-tests/tests/stubs.rs` with
//! `measurements/stubs.lock`, `qemu-tests/tests/kernels.rs` with `measurements/kernels.lock`)
//! and refuses every other one by name rather than guess. Where the
//! rules come from: `docs/research/systemd-stub-versions.md`.

use hawser_pe::PeImage;

/// The systemd-stub of a UKI, from its `.sdmagic` section
/// (`"#### LoaderInfo: systemd-stub 257.13-1~deb13u1 ####"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StubIdentity {
    /// The loader's name: `systemd-stub`, or another loader's (Ubuntu's `ubustub`).
    pub name: String,
    /// The version as built, e.g. `257.13-1~deb13u1` (Debian) or `255.4-1ubuntu8` (Ubuntu).
    pub version: String,
    /// systemd's major version, e.g. 257; `None` when the version does not start with one.
    pub major: Option<u32>,
}

impl std::fmt::Display for StubIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// Why a UKI's stub or kernel cannot be identified or is not modelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// No `.sdmagic` section, or one that is not systemd's `LoaderInfo` line.
    #[error(
        "the UKI {uki} does not say which stub it has ({why}); hawser predicts only systemd-stub UKIs, whose .sdmagic section reads \"#### LoaderInfo: systemd-stub <version> ####\""
    )]
    UnknownStub { uki: String, why: String },
    /// A stub whose measurements are not modelled.
    #[error(
        "{stub} in the UKI {uki} is not modelled: its measurements were never compared with a real boot, so a prediction would be a guess; modelled: {known}"
    )]
    UnmodelledStub {
        uki: String,
        stub: StubIdentity,
        known: String,
    },
    /// A modelled stub whose behaviour depends on a section's contents in a way not modelled.
    #[error("the UKI {uki}: {stub} {why}")]
    StubBehaviour {
        uki: String,
        stub: StubIdentity,
        why: String,
    },
    /// `--assume-stub` named a version no model exists for.
    #[error("there is no model of systemd-stub {major} to assume; modelled: {known}")]
    UnknownAssumption { major: u32, known: String },
    /// The kernel in `.linux` carries no readable version.
    #[error(
        "the kernel in the .linux section of the UKI {uki} has no readable version ({why}); hawser predicts only x86 bzImage kernels"
    )]
    UnknownKernel { uki: String, why: String },
    /// A kernel whose EFI stub's measurements are not modelled.
    #[error(
        "Linux {release} in the UKI {uki} is not modelled: its EFI stub's PCR 9 measurements were never compared with a real boot; modelled: {known}"
    )]
    UnmodelledKernel {
        uki: String,
        release: String,
        known: String,
    },
}

/// How a modelled systemd-stub measures a UKI and what it hands the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StubModel {
    /// systemd's major version.
    pub major: u32,
    /// The builds this model was proven on by a boot (`measurements/stubs.lock`, `inputs.lock`).
    pub proven_with: &'static str,
    /// The sections measured into PCR 11, in the order of the version's `enum UnifiedSection`
    /// (`.pcrsig` is in every enum but never measured, so it is not listed).
    pub pcr11_sections: &'static [&'static str],
    /// The sections handed to the kernel as they are, at the start of its initrd, in this order
    /// (257 prepends `.ucode` to `.initrd`).
    pub initrd_sections: &'static [&'static str],
    /// The sections passed to the kernel after them as one `/.extra/<file>` cpio each, in the
    /// stub's order: (section, file). The kernel measures them into PCR 9 with the rest.
    pub extra_cpios: &'static [(&'static str, &'static str)],
    /// How the stub finds a section by name.
    pub lookup: SectionLookup,
    /// Why this version's measurements cannot be predicted at all, if they cannot.
    pub refusal: Option<&'static str>,
    /// Sections this version turns into something the predictor does not model, and what.
    pub unmodelled_sections: &'static [(&'static str, &'static str)],
}

/// How a stub version finds a section by name in the section table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionLookup {
    /// Before 257 (`locate_sections`, `src/boot/efi/pe.c`): every section whose name *starts
    /// with* the wanted one (`memcmp` over the wanted name's length), the last in the table
    /// winning. A `.dtbauto` is taken for `.dtb`, and in a multi-profile UKI the last
    /// profile's sections win.
    LastByPrefix,
    /// 257 on (`pe_locate_sections_internal`): the first section of exactly that name (up to
    /// 8 characters), per profile.
    FirstExact,
}

impl SectionLookup {
    /// Whether a section called `have` answers a lookup of `want`.
    pub fn matches(self, have: &str, want: &str) -> bool {
        match self {
            SectionLookup::LastByPrefix => have.starts_with(want),
            SectionLookup::FirstExact => have == want,
        }
    }
}

impl StubModel {
    /// Whether `.profile` sections split a UKI into profiles, one chosen at boot (257 on:
    /// `.profile` is in its section enum).
    pub fn has_profiles(&self) -> bool {
        self.pcr11_sections.contains(&".profile")
    }

    /// Whether the stub picks one of several `.dtbauto` sections by the firmware's devicetree
    /// or hardware IDs (257 on).
    pub fn picks_dtbauto(&self) -> bool {
        self.pcr11_sections.contains(&".dtbauto")
    }
}

const EFIFW: (&str, &str) = (
    ".efifw",
    "carries firmware images the stub selects by the firmware's hardware IDs",
);

/// The `/.extra` cpios of 252 to 255 (`pack_cpio_literal` calls in `run()`, `src/boot/efi/stub.c`),
/// after `.initrd`, credentials and sysexts.
const EXTRA_CPIOS_252: &[(&str, &str)] = &[
    (".pcrsig", "tpm2-pcr-signature.json"),
    (".pcrpkey", "tpm2-pcr-public-key.pem"),
];
/// The `/.extra` cpios of 257 and 262 (`generate_embedded_initrds`, `enum InitrdType` order).
const EXTRA_CPIOS_257: &[(&str, &str)] = &[
    (".pcrsig", "tpm2-pcr-signature.json"),
    (".pcrpkey", "tpm2-pcr-public-key.pem"),
    (".osrel", "os-release"),
    (".profile", "profile"),
];
/// 257's embedded initrds before the cpios (`lookup_embedded_initrds`): microcode first.
const INITRD_SECTIONS_257: &[&str] = &[".ucode", ".initrd"];

/// PCR 11's sections from systemd 254 on (252's and `.uname .sbat`), in `enum UnifiedSection`
/// order; 255 has the same enum.
const SECTIONS_254: &[&str] = &[
    ".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".uname", ".sbat", ".pcrpkey",
];
/// 257's enum: `.ucode` after `.initrd`, `.profile .dtbauto .hwids` after `.pcrpkey`.
const SECTIONS_257: &[&str] = &[
    ".linux", ".osrel", ".cmdline", ".initrd", ".ucode", ".splash", ".dtb", ".uname", ".sbat",
    ".pcrpkey", ".profile", ".dtbauto", ".hwids",
];
/// 262's enum: 257's, then `.efifw`. Every earlier enum is a subset of it.
const SECTIONS_262: &[&str] = &[
    ".linux", ".osrel", ".cmdline", ".initrd", ".ucode", ".splash", ".dtb", ".uname", ".sbat",
    ".pcrpkey", ".profile", ".dtbauto", ".hwids", ".efifw",
];

/// Every section some modelled stub measures into PCR 11.
pub(crate) const ALL_PCR11_SECTIONS: &[&str] = SECTIONS_262;

/// The sections among `names` that some stub acts on and `model`'s version does not look up
/// (`.pcrsig` is known to every version), each once, in the order found.
pub fn ignored_sections<'a>(
    model: &StubModel,
    names: impl Iterator<Item = &'a str>,
) -> Vec<String> {
    let mut ignored: Vec<String> = Vec::new();
    for name in names {
        if ALL_PCR11_SECTIONS.contains(&name)
            && !model
                .pcr11_sections
                .iter()
                .any(|&want| model.lookup.matches(name, want))
            && !ignored.iter().any(|i| i == name)
        {
            ignored.push(name.to_owned());
        }
    }
    ignored
}

/// Every systemd-stub version the predictor models, each proven by a boot; a version whose
/// measurements are known not to be predictable carries the reason it is refused. The rules per
/// version are in `docs/research/systemd-stub-versions.md`.
pub const STUB_MODELS: &[StubModel] = &[
    StubModel {
        major: 252,
        proven_with: "Debian 12 systemd-boot-efi 252.39-1~deb12u2",
        pcr11_sections: &[
            ".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrpkey",
        ],
        initrd_sections: &[".initrd"],
        extra_cpios: EXTRA_CPIOS_252,
        lookup: SectionLookup::LastByPrefix,
        refusal: None,
        unmodelled_sections: &[],
    },
    StubModel {
        major: 254,
        proven_with: "Debian 12 bookworm-backports systemd-boot-efi 254.26-1~bpo12+1",
        pcr11_sections: SECTIONS_254,
        initrd_sections: &[".initrd"],
        extra_cpios: EXTRA_CPIOS_252,
        lookup: SectionLookup::LastByPrefix,
        refusal: None,
        unmodelled_sections: &[],
    },
    StubModel {
        major: 255,
        proven_with: "Ubuntu 24.04 systemd-boot-efi 255.4-1ubuntu8",
        pcr11_sections: SECTIONS_254,
        initrd_sections: &[".initrd"],
        extra_cpios: EXTRA_CPIOS_252,
        lookup: SectionLookup::LastByPrefix,
        refusal: None,
        unmodelled_sections: &[],
    },
    StubModel {
        major: 257,
        proven_with: "Debian 13 systemd-boot-efi 257.13-1~deb13u1 (hawser's own stub)",
        pcr11_sections: SECTIONS_257,
        initrd_sections: INITRD_SECTIONS_257,
        extra_cpios: EXTRA_CPIOS_257,
        lookup: SectionLookup::FirstExact,
        refusal: None,
        unmodelled_sections: &[],
    },
    StubModel {
        major: 262,
        proven_with: "Debian forky systemd-boot-efi 262-1",
        pcr11_sections: SECTIONS_262,
        initrd_sections: INITRD_SECTIONS_257,
        extra_cpios: EXTRA_CPIOS_257,
        lookup: SectionLookup::FirstExact,
        refusal: Some(
            "appends a per-machine boot secret (/.extra/boot-secret, derived from an EFI variable it creates and a mixin it writes to the ESP) to the initrd the kernel measures into PCR 9, so PCR 9 differs from machine to machine and cannot be predicted from the UKI (two boots of UKIs with the same kernel, initrd and command line quote different PCR 9 values)",
        ),
        unmodelled_sections: &[EFIFW],
    },
];

/// The magic line's frame (systemd's `stub.c`: `"#### LoaderInfo: systemd-stub " GIT_VERSION " ####"`).
const SDMAGIC_PREFIX: &str = "#### LoaderInfo: ";
const SDMAGIC_SUFFIX: &str = " ####";

/// Reads the stub's identity from the UKI's `.sdmagic` section.
pub fn stub_identity(pe: &PeImage<'_>, label: &str) -> Result<StubIdentity, ModelError> {
    let unknown = |why: String| ModelError::UnknownStub {
        uki: label.to_owned(),
        why,
    };
    let section = pe
        .section(".sdmagic")
        .ok_or_else(|| unknown("it has no .sdmagic section".into()))?;
    let bytes = pe.loaded(section).to_vec();
    let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
    let text =
        std::str::from_utf8(text).map_err(|_| unknown(".sdmagic is not UTF-8 text".into()))?;
    StubIdentity::parse(text).ok_or_else(|| unknown(format!(".sdmagic reads {text:?}")))
}

impl StubIdentity {
    /// Parses systemd's magic line, `"#### LoaderInfo: <name> <version> ####"`.
    pub fn parse(line: &str) -> Option<StubIdentity> {
        let inner = line
            .trim()
            .strip_prefix(SDMAGIC_PREFIX)?
            .strip_suffix(SDMAGIC_SUFFIX)?;
        let (name, version) = inner.rsplit_once(' ')?;
        let digits: String = version.chars().take_while(char::is_ascii_digit).collect();
        Some(StubIdentity {
            name: name.to_owned(),
            version: version.to_owned(),
            major: digits.parse().ok(),
        })
    }
}

/// The model of `stub`, or why there is none.
pub fn stub_model(stub: &StubIdentity, label: &str) -> Result<&'static StubModel, ModelError> {
    let model = STUB_MODELS
        .iter()
        .find(|m| stub.name == "systemd-stub" && stub.major == Some(m.major))
        .ok_or_else(|| ModelError::UnmodelledStub {
            uki: label.to_owned(),
            stub: stub.clone(),
            known: known_stubs(),
        })?;
    match model.refusal {
        Some(why) => Err(ModelError::StubBehaviour {
            uki: label.to_owned(),
            stub: stub.clone(),
            why: why.to_owned(),
        }),
        None => Ok(model),
    }
}

/// "systemd-stub 252 (…), 254 (…), …" for error messages and `--help`.
pub fn known_stubs() -> String {
    STUB_MODELS
        .iter()
        .filter(|m| m.refusal.is_none())
        .map(|m| format!("systemd-stub {} ({})", m.major, m.proven_with))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A kernel series whose EFI stub is proven to measure what it is handed as 6.12's does: the
/// `LoadOptions` it got (the UTF-16 command line, tag `0x8F3B22ED`), then the initrd it loads
/// through `LINUX_EFI_INITRD_MEDIA_GUID` (tag `0x8F3B22EC`), both into PCR 9.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelModel {
    /// The `major.minor` series.
    pub series: (u32, u32),
    /// The builds this model was proven on by a boot (`qemu-tests/tests/kernels.rs`).
    pub proven_with: &'static str,
}

/// Every kernel series the predictor models, each proven by a boot.
pub const KERNEL_MODELS: &[KernelModel] = &[
    KernelModel {
        series: (6, 1),
        proven_with: "Debian 12 linux-image 6.1.0-50-cloud-amd64 (6.1.176-1)",
    },
    KernelModel {
        series: (6, 8),
        proven_with: "Ubuntu 24.04 linux-image 6.8.0-31-generic (6.8.0-31.31)",
    },
    KernelModel {
        series: (6, 12),
        proven_with: "Debian 13 linux-image 6.12.117+deb13-cloud-amd64 (hawser's own kernel)",
    },
];

/// The kernel's release (`uname -r`) from a bzImage: the setup header's `kernel_version`
/// field (offset 0x20e, a pointer relative to 0x200) points at the version string, e.g.
/// `"6.12.117+deb13-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP …"`.
pub fn kernel_release(bzimage: &[u8]) -> Result<String, String> {
    const HDRS: usize = 0x202;
    if bzimage.get(HDRS..HDRS + 4) != Some(b"HdrS") {
        return Err("no \"HdrS\" setup header at 0x202".into());
    }
    let ptr = bzimage
        .get(0x20e..0x210)
        .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
        .ok_or("the setup header is truncated")?;
    if ptr == 0 {
        return Err("the setup header's kernel_version field is 0".into());
    }
    let start = 0x200 + ptr;
    let tail = bzimage
        .get(start..)
        .ok_or_else(|| format!("kernel_version points past the end ({start:#x})"))?;
    let text: Vec<u8> = tail
        .iter()
        .take(256)
        .take_while(|&&b| b != 0)
        .copied()
        .collect();
    let text = String::from_utf8_lossy(&text);
    let release = text.split(' ').next().unwrap_or_default();
    if release.is_empty() || !release.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("kernel_version reads {text:?}"));
    }
    Ok(release.to_owned())
}

/// The model of the kernel `release`, or why there is none.
pub fn kernel_model(release: &str, label: &str) -> Result<&'static KernelModel, ModelError> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let series = (
        parts.next().and_then(|p| p.parse().ok()),
        parts.next().and_then(|p| p.parse().ok()),
    );
    KERNEL_MODELS
        .iter()
        .find(|m| (Some(m.series.0), Some(m.series.1)) == series)
        .ok_or_else(|| ModelError::UnmodelledKernel {
            uki: label.to_owned(),
            release: release.to_owned(),
            known: KERNEL_MODELS
                .iter()
                .map(|m| format!("Linux {}.{} ({})", m.series.0, m.series.1, m.proven_with))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(line: &str) -> StubIdentity {
        StubIdentity::parse(line).unwrap()
    }

    #[test]
    fn every_model_measures_a_subset_of_all_pcr11_sections() {
        for m in STUB_MODELS {
            for s in m.pcr11_sections {
                assert!(ALL_PCR11_SECTIONS.contains(s), "{} measures {s}", m.major);
            }
        }
    }

    #[test]
    fn every_distribution_stub_maps_to_its_model_and_others_are_refused_by_name() {
        for (line, major) in [
            ("#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####", 252),
            ("#### LoaderInfo: systemd-stub 254.26-1~bpo12+1 ####", 254),
            ("#### LoaderInfo: systemd-stub 255.4-1ubuntu8 ####", 255),
            ("#### LoaderInfo: systemd-stub 257.13-1~deb13u1 ####", 257),
        ] {
            assert_eq!(stub_model(&identity(line), "x").unwrap().major, major);
        }
        for line in [
            "#### LoaderInfo: systemd-stub 249.11-0ubuntu3 ####",
            "#### LoaderInfo: systemd-stub 258.2-1.fc43 ####",
            "#### LoaderInfo: ubustub 259-1ubuntu1 ####",
        ] {
            let err = stub_model(&identity(line), "x.efi")
                .unwrap_err()
                .to_string();
            let id = identity(line);
            assert!(
                err.contains(&format!(
                    "{} {} in the UKI x.efi is not modelled",
                    id.name, id.version
                )),
                "{err}"
            );
            assert!(err.contains("systemd-stub 257 (Debian 13"), "{err}");
        }
        let err = stub_model(
            &identity("#### LoaderInfo: systemd-stub 262-1 ####"),
            "x.efi",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("the UKI x.efi: systemd-stub 262-1 appends a per-machine boot secret"),
            "{err}"
        );
    }

    #[test]
    fn kernel_release_comes_from_the_setup_header() {
        let mut image = vec![0u8; 0x1000];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x20e..0x210].copy_from_slice(&0x600u16.to_le_bytes());
        let version = b"6.12.117+deb13-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP\0";
        image[0x800..0x800 + version.len()].copy_from_slice(version);
        assert_eq!(
            kernel_release(&image).unwrap(),
            "6.12.117+deb13-cloud-amd64"
        );
        assert_eq!(
            kernel_model("6.12.117+deb13-cloud-amd64", "x")
                .unwrap()
                .series,
            (6, 12)
        );
        assert_eq!(
            kernel_model("6.1.0-50-cloud-amd64", "x").unwrap().series,
            (6, 1)
        );
        let err = kernel_model("5.15.0-91-generic", "x.efi")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("Linux 5.15.0-91-generic in the UKI x.efi is not modelled"),
            "{err}"
        );
        image[0x202] = b'X';
        assert!(kernel_release(&image).unwrap_err().contains("HdrS"));
    }
}
