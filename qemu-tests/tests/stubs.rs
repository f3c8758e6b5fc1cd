//! Predictions for UKIs hawser did not assemble, around stubs hawser does not ship, proven on
//! real boots.
//!
//! hawser's kernel, initramfs, command line and os-release are assembled around every
//! systemd-stub pinned in `measurements/stubs.lock` (Debian 12's 252, bookworm-backports' 254,
//! Ubuntu 24.04's 255, Debian forky's 262) and hawser's own 257, each twice: with objcopy, the
//! way distributions' and users' scripts did before ukify (the recipe of the Arch wiki and
//! systemd's documentation), and with ukify 257. For every UKI `hawser measurements predict`
//! must name the stub and kernel it models, and a boot under OVMF + swtpm must quote exactly the
//! predicted PCRs 4, 9, 11 (before and after hawser's phase), 12, 13 and 15, with the event log
//! lining up event for event. All UKIs are booted before anything is asserted, so one run shows
//! every stub's result.
//!
//! A stub the predictor does not model is refused by name before any boot: the same UKI with
//! `.sdmagic` saying systemd-stub 249.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test stubs -- --ignored --test-threads=1 --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_image::build::BuildOutput;
use hawser_image::inputs::{self, InputLock};
use hawser_measurements::explain::{EventMatch, explain};
use hawser_measurements::models::STUB_MODELS;
use hawser_measurements::predict::Prediction;

mod common;

/// The input cache's subdirectory for other distributions' packages.
const OTHER_DISTRIBUTIONS: &str = "other-distributions";
use common::quote::{Boot, boot, boot_matches};
use common::{build_image, workspace};

fn scratch(name: &str) -> PathBuf {
    common::scratch("stubs-tests", name)
}

/// Where a `systemd-boot-efi` package keeps the stub.
const STUB_IN_PACKAGE: &str = "usr/lib/systemd/boot/efi/linuxx64.efi.stub";

/// The parts every UKI here is assembled from: hawser's, from the image build.
struct Parts {
    linux: PathBuf,
    initrd: PathBuf,
    cmdline: PathBuf,
    osrel: PathBuf,
}

fn parts(image: &BuildOutput, dir: &Path) -> Parts {
    let uki = std::fs::read(&image.uki.path).expect("read hawser's UKI");
    let osrel = hawser_image::uki::read_uki_sections(&uki)
        .expect("hawser's UKI parses")
        .into_iter()
        .find(|s| s.name == ".osrel")
        .expect("hawser's UKI has .osrel")
        .data;
    let osrel_path = dir.join("os-release");
    std::fs::write(&osrel_path, osrel.strip_suffix(b"\0").unwrap_or(&osrel)).unwrap();
    Parts {
        linux: image.kernel.path.clone(),
        initrd: image.initrd.path.clone(),
        cmdline: image.cmdline.path.clone(),
        osrel: osrel_path,
    }
}

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

fn run(mut command: Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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

fn ukify_uki(ukify: &Path, stub: &Path, parts: &Parts, out: &Path) {
    let mut c = Command::new("/usr/bin/python3");
    c.arg(ukify).arg("build").arg("--stub").arg(stub);
    c.arg("--linux")
        .arg(&parts.linux)
        .arg("--initrd")
        .arg(&parts.initrd);
    c.arg(format!("--cmdline=@{}", parts.cmdline.display()));
    c.arg(format!("--os-release=@{}", parts.osrel.display()));
    c.arg("--output").arg(out);
    run(c, "ukify 257 (systemd-ukify, python3-pefile)");
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
    let parts = parts(&image, &dir);
    let ukify = inputs::cached(
        &InputLock::load(&workspace().join("inputs.lock")).unwrap(),
        &inputs::cache_dir(),
    )
    .expect("inputs fetched by the image build")
    .ukify;

    let mut built = Vec::new();
    for (version, stub) in stubs() {
        for tool in ["objcopy", "ukify"] {
            let name = format!("stub-{}-{tool}", version.split(['-', '~']).next().unwrap());
            let out = dir.join(format!("{name}.efi"));
            match tool {
                "objcopy" => objcopy_uki(&stub, &parts, &out),
                _ => ukify_uki(&ukify, &stub, &parts, &out),
            }
            built.push((name, version.clone(), out));
        }
    }

    let mut failures = Vec::new();
    // UKIs of a stub the predictor refuses, with the quoted PCR 9 of their boots.
    let mut refused: Vec<(String, [u8; 32])> = Vec::new();
    for (name, version, uki) in &built {
        let prediction = match Prediction::from_uki(&std::fs::read(uki).unwrap(), name) {
            Ok(p) => p,
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
                let quoted = boot(name, uki);
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
        let quoted = boot(name, uki);
        match boot_matches(&prediction, &quoted) {
            Ok(()) => eprintln!("{name}: the boot quoted exactly the predicted PCRs"),
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
    let (_, version, first) = &built[0];
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
        built.len(),
        failures.join("\n\n")
    );
}
