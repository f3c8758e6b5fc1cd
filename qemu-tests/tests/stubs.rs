//! Predictions for UKIs hawser did not assemble, around stubs hawser does not ship, proven on
//! real boots.
//!
//! hawser's kernel, initramfs, command line and os-release are assembled around every
//! systemd-stub pinned in `measurements/stubs.lock` (Debian 12's 252, bookworm-backports' 254,
//! Ubuntu 24.04's 255, Debian forky's 262) and hawser's own 257, each twice: with objcopy, the
//! way distributions' and users' scripts did before ukify (the recipe of the Arch wiki and
//! systemd's documentation), and with ukify 257 and every option that adds a section every
//! stub version is handed alike: `--microcode` (`.ucode`), `--devicetree` (`.dtb`), `--pcrpkey`
//! and a `.pcrsig` signed by `systemd-measure` (this host's, systemd 252, which knows no
//! `.ucode`, so ukify's own `--pcr-private-key` cannot run it on a UKI with microcode: the
//! signature is made beforehand and added with `--section .pcrsig:@…`, in the place ukify's
//! signing would put it; its contents are data to every stub). 252's stub has header room for
//! one section more than ukify's plain UKI: its ukify UKI adds `--pcrpkey` alone.
//! Around 257 also the sections only it acts on: two `.dtbauto` with a `.hwids` table that
//! names the QEMU platform's hardware IDs (the stub must pick the devicetree of the most
//! specific match, not the first), and a two-profile UKI (`--profile`, `--join-profile`),
//! booted as profile 0 directly and as profile 1 from systemd-boot's menu entry
//! (`<uki>@<id>`, which passes `@1`).
//!
//! For every UKI `hawser measurements predict` must name the stub and kernel it models, and a
//! boot under OVMF + swtpm must quote exactly the predicted PCRs 4, 9, 11 (before and after
//! hawser's phase), 12, 13 and 15 on its boot path and profile, with the event log lining up
//! event for event. All UKIs are booted before anything is asserted, so one run shows every
//! result.
//!
//! A stub the predictor does not model is refused by name before any boot: the same UKI with
//! `.sdmagic` saying systemd-stub 249.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test stubs -- --ignored --test-threads=1 --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::{Path, PathBuf};
use std::process::Command;

use std::ffi::OsString;

use hawser_harness::{Esp, EspFile, VmConfig};
use hawser_image::inputs::{self, InputLock};
use hawser_measurements::authenticode::authenticode_sha256;
use hawser_measurements::explain::{EventMatch, explain};
use hawser_measurements::hwids;
use hawser_measurements::models::STUB_MODELS;
use hawser_measurements::pe::PeImage;
use hawser_measurements::predict::{BootPath, PredictOptions, Prediction};

mod common;

/// The input cache's subdirectory for other distributions' packages.
const OTHER_DISTRIBUTIONS: &str = "other-distributions";
use common::quote::{Boot, boot, boot_matches, boot_with};
use common::ukify::{self, Parts, run};
use common::{build_image, workspace};

fn scratch(name: &str) -> PathBuf {
    common::scratch("stubs-tests", name)
}

/// Where a `systemd-boot-efi` package keeps the stub.
const STUB_IN_PACKAGE: &str = "usr/lib/systemd/boot/efi/linuxx64.efi.stub";

/// Every stub to assemble around: hawser's own (inputs.lock) and each of `measurements/stubs.lock`,
/// fetched (and verified) into the input cache.
fn stubs() -> Vec<(String, PathBuf)> {
    let cache = inputs::cache_dir();
    // Other distributions' packages live apart from the image's inputs: tools that look for
    // "the" kernel or stub among the cached inputs must never find one of these.
    let other_distributions = cache.join(OTHER_DISTRIBUTIONS);
    let own = InputLock::load(&workspace().join("inputs.lock")).expect("inputs.lock");
    let fetched = inputs::fetch(&own, &cache).expect("fetch inputs.lock");
    let mut stubs = vec![(
        own.by_role(inputs::Role::Stub)
            .next()
            .expect("a stub")
            .version
            .clone(),
        fetched.stub,
    )];
    let others = InputLock::load(&workspace().join("measurements/stubs.lock"))
        .expect("measurements/stubs.lock");
    let n = others.packages.len();
    for (i, pkg) in others.packages.iter().enumerate() {
        let root = inputs::fetch_package(pkg, &other_distributions, &format!("stub {}/{n}", i + 1))
            .unwrap_or_else(|e| panic!("{e}"));
        stubs.push((pkg.version.clone(), root.join(STUB_IN_PACKAGE)));
    }
    stubs
}

/// `hawser measurements explain --assume-stub 257` of a boot of a refused 262 UKI names what
/// 262 does differently: PCR 4 lacks the kernel's `LoadImage()` event (262 loads the kernel
/// itself) and PCR 9's initrd event differs (the boot secret).
fn explained_against_257(uki: &Path, name: &str, boot: &Boot) -> Result<(), String> {
    let bytes = std::fs::read(uki).unwrap();
    let assumed =
        Prediction::from_uki_assuming(&bytes, name, Some(257)).map_err(|e| e.to_string())?;
    let diagnosis = explain(
        &assumed,
        &boot.event_log,
        Some(&boot.verified.pcrs),
        &boot.verified.phases_extended,
    )
    .map_err(|e| e.to_string())?;
    let text = diagnosis.to_string();
    let has = |pcr: u8, found: &dyn Fn(&EventMatch) -> bool| {
        diagnosis
            .pcrs
            .iter()
            .filter(|p| p.pcr == pcr)
            .flat_map(|p| &p.events)
            .any(found)
    };
    if !has(
        4,
        &|e| matches!(e, EventMatch::Missing { predicted } if predicted.key == "app#2"),
    ) {
        return Err(format!(
            "explain does not name the kernel's missing PCR 4 event:\n{text}"
        ));
    }
    if !has(
        9,
        &|e| matches!(e, EventMatch::Differs { predicted, .. } if predicted.key == "tag:0x8f3b22ec"),
    ) {
        return Err(format!(
            "explain does not name PCR 9's differing initrd event:\n{text}"
        ));
    }
    eprintln!(
        "{name}: explain --assume-stub 257 names the kernel's missing PCR 4 event and PCR 9's initrd"
    );
    Ok(())
}

/// Whether `version` is a stub the predictor refuses on purpose (its model carries a refusal).
fn refused_on_purpose(version: &str) -> bool {
    let major: u32 = version
        .split(['.', '-'])
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    STUB_MODELS
        .iter()
        .any(|m| m.major == major && m.refusal.is_some())
}

/// The objcopy recipe users ran before ukify (Arch wiki, "Unified kernel image", manual
/// assembly): each section placed after the stub's last one at the stub's section alignment,
/// in the order `.osrel .cmdline .initrd .linux`.
const OBJCOPY_RECIPE: &str = r#"
set -euo pipefail
stub=$1 osrel=$2 cmdline=$3 initrd=$4 linux=$5 out=$6
align=$((16#$(objdump -p "$stub" | awk '$1 == "SectionAlignment" { print $2 }')))
next() { local o=$(($1 + $2)); echo $((o + align - o % align)); }
read -r size vma < <(objdump -h "$stub" | awk 'NF == 7 { size = $3; vma = $4 } END { print size, vma }')
osrel_offs=$(next $((16#$vma)) $((16#$size)))
cmdline_offs=$(next "$osrel_offs" "$(stat -Lc%s "$osrel")")
initrd_offs=$(next "$cmdline_offs" "$(stat -Lc%s "$cmdline")")
linux_offs=$(next "$initrd_offs" "$(stat -Lc%s "$initrd")")
objcopy \
  --add-section .osrel="$osrel" --change-section-vma .osrel=$(printf 0x%x "$osrel_offs") \
  --add-section .cmdline="$cmdline" --change-section-vma .cmdline=$(printf 0x%x "$cmdline_offs") \
  --add-section .initrd="$initrd" --change-section-vma .initrd=$(printf 0x%x "$initrd_offs") \
  --add-section .linux="$linux" --change-section-vma .linux=$(printf 0x%x "$linux_offs") \
  "$stub" "$out"
"#;

fn objcopy_uki(stub: &Path, parts: &Parts, out: &Path) {
    let mut c = Command::new("bash");
    c.arg("-c").arg(OBJCOPY_RECIPE).arg("objcopy-uki");
    c.args([
        stub,
        &parts.osrel,
        &parts.cmdline,
        &parts.initrd,
        &parts.linux,
        out,
    ]);
    run(c, "the objcopy recipe (binutils)");
}

/// The section-adding options every stub is handed alike (see the module docs).
struct Extras {
    microcode: PathBuf,
    devicetree: PathBuf,
    pcr_public_key: PathBuf,
    pcr_signature: PathBuf,
}

impl Extras {
    fn new(dir: &Path, parts: &Parts) -> Extras {
        let devicetree = ukify::devicetree(dir, "qemu", "hawser,qemu-q35");
        let (private, public) = ukify::pcr_signing_key(dir);
        let pcr_signature = ukify::pcr_signature(dir, parts, &devicetree, &private, &public);
        Extras {
            microcode: ukify::microcode(dir),
            devicetree,
            pcr_public_key: public,
            pcr_signature,
        }
    }

    /// The options for a stub of `version`: all of them, but for 252 only `--pcrpkey`, the one
    /// extra section that fits its headers (seven free section slots; ukify needs six for the
    /// plain UKI and cannot grow them). 252's `.pcrsig`, `.dtb` and `.ucode` code is 254's.
    fn args(&self, version: &str) -> Vec<OsString> {
        if version.starts_with("252.") {
            return vec!["--pcrpkey".into(), self.pcr_public_key.clone().into()];
        }
        vec![
            "--microcode".into(),
            self.microcode.clone().into(),
            "--devicetree".into(),
            self.devicetree.clone().into(),
            "--pcrpkey".into(),
            self.pcr_public_key.clone().into(),
            format!("--section=.pcrsig:@{}", self.pcr_signature.display()).into(),
        ]
    }
}

/// One UKI to boot: how it was made, and how it is booted.
struct Case {
    name: String,
    /// The stub's version.
    version: String,
    uki: PathBuf,
    profile: u32,
    path: BootPath,
    /// The VM (its ESP) for a path other than the direct one.
    vm: Option<VmConfig>,
}

impl Case {
    fn direct(name: String, version: &str, uki: PathBuf) -> Case {
        Case {
            name,
            version: version.to_owned(),
            uki,
            profile: 0,
            path: BootPath::Direct,
            vm: None,
        }
    }

    fn boot(&self) -> Boot {
        match &self.vm {
            None => boot(&self.name, &self.uki),
            Some(vm) => boot_with(&self.name, vm.clone()),
        }
    }
}

/// What the prediction of a UKI made for one section must say before its boot can prove it.
fn special_case_wrong(case: &Case, p: &Prediction) -> Option<String> {
    let major: u32 = case.version[..3].parse().unwrap_or(0);
    if case.name.ends_with("-dtbauto") {
        let why = p.dtbauto.clone().unwrap_or_default();
        return (!why.contains("\"hawser,qemu-exact\"")).then(|| {
            format!("the prediction does not use the devicetree of the CHID-3 device: {why}")
        });
    }
    if case.profile != 0 {
        return (p.pcr(12, hawser_measurements::predict::Phase::Stub) == [0; 32])
            .then(|| "a profile other than 0 leaves PCR 12 empty in the prediction".into());
    }
    if case.name.ends_with("-ukify") && (254..257).contains(&major) {
        return (!p.ignored_sections.iter().any(|s| s == ".ucode")).then(|| {
            format!(
                "systemd-stub {major} does not know .ucode, yet the prediction does not list it as ignored: {:?}",
                p.ignored_sections
            )
        });
    }
    None
}

/// The UKIs of the sections only systemd-stub 257 acts on (see the module docs).
fn cases_of_257(ukify_script: &Path, stub: &Path, parts: &Parts, dir: &Path) -> Vec<Case> {
    let version = "257.13-1~deb13u1";
    // .dtbauto: three devicetrees, the .hwids naming two devices of this platform (CHID 3, the
    // most specific, and CHID 9: manufacturer and product name) and one of another. The stub
    // must use the devicetree of the CHID-3 device, the second .dtbauto.
    let machine = hwids::chids(&hwids::QEMU_REFERENCE_SMBIOS);
    let chid = |n: usize| machine[n].expect("the QEMU platform has this CHID");
    let hwids_dir = ukify::hwids(
        dir,
        &[
            ("another board", "hawser,other-board", [0x5a; 16]),
            ("QEMU q35, exactly", "hawser,qemu-exact", chid(3)),
            ("QEMU q35", "hawser,qemu-q35", chid(9)),
        ],
    );
    let mut args = ukify::base_args(parts);
    for (name, compatible) in [
        ("qemu-broad", "hawser,qemu-q35"),
        ("qemu-exact", "hawser,qemu-exact"),
        ("other", "hawser,other-board"),
    ] {
        args.push("--devicetree-auto".into());
        args.push(ukify::devicetree(dir, name, compatible).into());
    }
    args.push("--hwids".into());
    args.push(hwids_dir.into());
    let dtbauto = dir.join("stub-257-ukify-dtbauto.efi");
    ukify::build(ukify_script, stub, &args, &dtbauto);

    // Two profiles: 0 ("main") as the base, 1 ("debug") with its own command line, built (as
    // ukify does by default) around the addon stub, which carries no `.sbat` to import.
    let profile1 = dir.join("profile-debug.efi");
    let addon_stub = stub.with_file_name("addonx64.efi.stub");
    ukify::build(
        ukify_script,
        &addon_stub,
        &[
            "--profile=ID=debug\nTITLE=Debug".into(),
            format!("--cmdline={} loglevel=7", parts.cmdline_text()).into(),
        ],
        &profile1,
    );
    let mut args = ukify::base_args(parts);
    args.push("--profile=ID=main\nTITLE=Main".into());
    args.push("--join-profile".into());
    args.push(profile1.into());
    let two = dir.join("stub-257-two-profiles.efi");
    ukify::build(ukify_script, stub, &args, &two);

    // Profile 1 is chosen from systemd-boot's menu: its entry `<file>@<ID>`.
    let sd_boot = stub
        .parent()
        .expect("the stub's directory")
        .join("systemd-bootx64.efi");
    let bytes = std::fs::read(&sd_boot).unwrap();
    let authenticode =
        authenticode_sha256(&PeImage::parse(&bytes, "systemd-boot").unwrap()).unwrap();
    let loader_conf = dir.join("loader.conf");
    std::fs::write(
        &loader_conf,
        "timeout 0\ndefault stub-257-two-profiles.efi@debug\n",
    )
    .unwrap();
    let esp = Esp::Files(vec![
        EspFile::default_boot_loader(&sd_boot),
        EspFile::new("loader/loader.conf", &loader_conf),
        EspFile::new("EFI/Linux/stub-257-two-profiles.efi", &two),
    ]);
    vec![
        Case::direct("stub-257-ukify-dtbauto".into(), version, dtbauto),
        Case::direct("stub-257-two-profiles-0".into(), version, two.clone()),
        Case {
            name: "stub-257-two-profiles-1-systemd-boot".into(),
            version: version.to_owned(),
            uki: two,
            profile: 1,
            path: BootPath::BootManager {
                name: "systemd-boot 257.13".into(),
                authenticode,
            },
            vm: Some(VmConfig::uefi_with_esp(esp)),
        },
    ]
}

/// The UKI with its `.sdmagic` rewritten to a stub version no model covers.
fn with_stub_version(uki: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "same length keeps the PE layout");
    let needle = format!("#### LoaderInfo: systemd-stub {from} ####");
    let at = uki
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .expect("the stub's magic line");
    let mut out = uki.to_vec();
    let replacement = format!("#### LoaderInfo: systemd-stub {to} ####");
    out[at..at + needle.len()].copy_from_slice(replacement.as_bytes());
    out
}

#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn ukis_with_other_stubs_and_tools_boot_to_exactly_the_predicted_pcrs() {
    let image = build_image(&scratch("image"), None);
    let dir = scratch("ukis");
    let parts = Parts::of(&image, &dir);
    let ukify_script = inputs::cached(
        &InputLock::load(&workspace().join("inputs.lock")).unwrap(),
        &inputs::cache_dir(),
    )
    .expect("inputs fetched by the image build")
    .ukify;
    let extras = Extras::new(&dir, &parts);

    let mut cases = Vec::new();
    for (version, stub) in stubs() {
        for tool in ["objcopy", "ukify"] {
            let name = format!("stub-{}-{tool}", version.split(['-', '~']).next().unwrap());
            let out = dir.join(format!("{name}.efi"));
            match tool {
                "objcopy" => objcopy_uki(&stub, &parts, &out),
                _ => {
                    let mut args = ukify::base_args(&parts);
                    args.extend(extras.args(&version));
                    ukify::build(&ukify_script, &stub, &args, &out);
                }
            }
            cases.push(Case::direct(name, &version, out));
        }
        if version.starts_with("257.") {
            cases.extend(cases_of_257(&ukify_script, &stub, &parts, &dir));
        }
    }

    let mut failures = Vec::new();
    // UKIs of a stub the predictor refuses, with the quoted PCR 9 of their boots.
    let mut refused: Vec<(String, [u8; 32])> = Vec::new();
    for case in &cases {
        let (name, version, uki) = (&case.name, &case.version, &case.uki);
        let options = PredictOptions {
            assume_stub: None,
            profile: case.profile,
        };
        let prediction =
            match Prediction::from_uki_with(&std::fs::read(uki).unwrap(), name, options) {
                Ok(p) => p.on_path(&case.path),
                Err(e) if refused_on_purpose(version) => {
                    let err = e.to_string();
                    eprintln!("{name}: refused as it should be: {err}");
                    if !err.contains(&format!(
                        "systemd-stub {version} appends a per-machine boot secret"
                    )) {
                        failures.push(format!(
                            "{name}: the refusal does not name the stub and why: {err}"
                        ));
                    }
                    let quoted = case.boot();
                    refused.push((name.clone(), quoted.verified.pcrs[&9]));
                    if let Err(why) = explained_against_257(uki, name, &quoted) {
                        failures.push(format!("{name}: {why}"));
                    }
                    continue;
                }
                Err(e) => {
                    failures.push(format!(
                        "{name} (systemd-stub {version}): not predicted: {e}"
                    ));
                    continue;
                }
            };
        if let Some(why) = &prediction.dtbauto {
            eprintln!("{name}: .dtbauto: {why}");
        }
        if let Some(wrong) = special_case_wrong(case, &prediction) {
            failures.push(format!("{name}: {wrong}"));
        }
        let quoted = case.boot();
        match boot_matches(&prediction, &quoted) {
            Ok(()) => eprintln!(
                "{name}: the boot quoted exactly the predicted PCRs (profile {}, {})",
                case.profile, case.path
            ),
            Err(why) => failures.push(format!("{name} (systemd-stub {version}):\n{why}")),
        }
    }
    // The refusal is right: two boots of UKIs with the same stub, kernel, initrd and command line
    // quote different PCR 9 values (the boot secret), so no prediction from the UKI could hold.
    if let [(a, pcr9_a), (b, pcr9_b)] = refused.as_slice() {
        if pcr9_a == pcr9_b {
            failures.push(format!(
                "{a} and {b} quoted the same PCR 9 {}: the refused stub's PCR 9 looks predictable after all",
                hex::encode(pcr9_a)
            ));
        }
    } else {
        failures.push(format!(
            "expected the two UKIs of the refused stub, got {}",
            refused.len()
        ));
    }

    // A version no model covers is refused by name.
    let Case {
        version,
        uki: first,
        ..
    } = &cases[0];
    assert!(
        version.starts_with("257."),
        "the first UKI is hawser's stub's"
    );
    let bytes = std::fs::read(first).unwrap();
    let unmodelled = with_stub_version(&bytes, "257.13-1~deb13u1", "249.11-1~deb13u1");
    match Prediction::from_uki(&unmodelled, "unmodelled.efi") {
        Ok(_) => failures.push("a UKI with systemd-stub 249 was predicted, not refused".into()),
        Err(e) => {
            let err = e.to_string();
            if !(err.contains(
                "systemd-stub 249.11-1~deb13u1 in the UKI unmodelled.efi is not modelled",
            ) && err.contains("modelled: systemd-stub 252"))
            {
                failures.push(format!(
                    "the refusal of systemd-stub 249 does not name it: {err}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} UKIs:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
