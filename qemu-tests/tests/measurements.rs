//! Measurements proven against reality: boot the image in QEMU (OVMF + swtpm) and hold the
//! TPM's verified quote and the firmware's event log against `hawser measurements predict`.
//!
//! Two boots, both OVMF + UKI (~20 s each under TCG), sharing one image build:
//! 1. the image as built: every predicted PCR (4, 9, 11 after `enter-initrd`, 12, 13, 15)
//!    equals the quoted value, PCR 11 before hawser's phase equals systemd-stub's prediction,
//!    and the event log lines up with the prediction event for event;
//! 2. a tampered image, one byte of the command line and one byte of the initramfs changed:
//!    the prediction changes (PCRs 4, 9, 11), the boot's quote equals the *new* prediction, and
//!    the diagnosis of that boot against the *original* image names exactly the `.cmdline` and
//!    `.initrd` events.
//!
//! Two rows of docs/security.md's tamper table share the image build without a boot: a UKI
//! with one byte of the kernel (`tamper_kernel_byte_…`) or of the initramfs
//! (`tamper_initrd_byte_…`) changed is held against the reference published for the original
//! image by the verifier's own code, which refuses it naming the PCRs and their values.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test measurements -- --ignored --test-threads=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hawser_attestation::ExpectedMeasurements;
use hawser_image::build::BuildOutput;
use hawser_image::uki::{UkiSections, assemble_uki, read_uki_sections};
use hawser_measurements::explain::{EventMatch, explain};
use hawser_measurements::predict::{PREDICTED_PCRS, Phase, Prediction};
use hawser_measurements::reference::{ReferenceInputs, ReferenceMeasurements};

mod common;
use common::quote::{assert_boot_matches, boot};
use common::{build_image, workspace};

fn scratch(name: &str) -> PathBuf {
    common::scratch("measurements-tests", name)
}

/// The image under test, built once per run from this workspace.
fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(&scratch("image"), None))
}

fn predict(uki: &Path) -> Prediction {
    let bytes = std::fs::read(uki).expect("read UKI");
    Prediction::from_uki(&bytes, &uki.display().to_string())
        .unwrap_or_else(|e| panic!("predicting {}: {e}", uki.display()))
}

/// The reference file `hawser measurements reference` would write for this image (firmware
/// values from the committed reference), read back by the verifier's own parser
/// (`hawser_attestation::ExpectedMeasurements`) and applied to the boot's verified PCRs: the
/// file format and the values are what a verifier accepts. Firmware PCRs that differ from the
/// committed warn-only values are printed (they depend on OVMF and QEMU, not on hawser).
fn verifier_accepts_the_reference(prediction: &Prediction, quoted: &BTreeMap<u8, [u8; 32]>) {
    let path = workspace().join("measurements/qemu.json");
    let committed = ReferenceMeasurements::parse(
        &std::fs::read_to_string(&path).expect("measurements/qemu.json is committed"),
    )
    .expect("the committed reference parses");
    let firmware: BTreeMap<u8, [u8; 32]> = committed
        .measurements
        .iter()
        .filter(|(_, m)| m.warn_only)
        .map(|(&pcr, m)| {
            let v: [u8; 32] = hex::decode(&m.expected)
                .expect("hex")
                .try_into()
                .expect("32 bytes");
            (pcr, v)
        })
        .collect();
    assert!(
        !firmware.is_empty(),
        "the committed reference records firmware values"
    );
    let reference = ReferenceMeasurements::new(
        prediction,
        ReferenceInputs {
            firmware_pcrs: firmware,
            ..ReferenceInputs::default()
        },
    );
    let expected = ExpectedMeasurements::from_json(&reference.render())
        .expect("the verifier parses the reference format");
    assert_eq!(
        expected.enforced().collect::<Vec<_>>(),
        PREDICTED_PCRS,
        "the verifier enforces exactly the predicted PCRs"
    );
    match expected.check(quoted) {
        Ok(warnings) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
        }
        Err(mismatch) => panic!("the verifier refuses the boot: {mismatch}"),
    }
}

#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn the_quote_of_a_real_boot_equals_the_prediction() {
    let image = image();
    let prediction = predict(&image.uki.path);
    let boot = boot("measure-original", &image.uki.path);
    assert_boot_matches("original image", &prediction, &boot);
    verifier_accepts_the_reference(&prediction, &boot.verified.pcrs);
}

/// Changes one byte of `panic=30` in the command line.
fn tamper_cmdline(cmdline: &[u8]) -> Vec<u8> {
    let mut out = cmdline.to_vec();
    let at = out
        .windows(8)
        .position(|w| w == b"panic=30")
        .expect("the default command line has panic=30");
    out[at + 7] = b'1';
    out
}

/// Changes one byte of the initramfs: the last hex digit of the cpio trailer's mtime field,
/// which the kernel ignores; then compresses it again.
fn tamper_initrd(compressed: &[u8]) -> Vec<u8> {
    let mut cpio = zstd::decode_all(compressed).expect("the initramfs is zstd");
    let trailer = cpio
        .windows(11)
        .rposition(|w| w == b"TRAILER!!!\0")
        .expect("a cpio trailer");
    // newc header: magic(6) ino mode uid gid nlink mtime … (8 hex digits each), name after 110.
    let mtime_last_digit = trailer - 110 + 6 + 5 * 8 + 7;
    cpio[mtime_last_digit] = if cpio[mtime_last_digit] == b'0' {
        b'1'
    } else {
        b'0'
    };
    zstd::encode_all(cpio.as_slice(), 3).expect("compress")
}

/// The built image taken apart: the locked stub, its sections, its bytes and its prediction.
/// Re-assembling the sections with the stub gives the same bytes (asserted), so a UKI
/// assembled from edited sections differs from the built one in exactly the bytes edited.
struct Sections {
    stub: Vec<u8>,
    base: UkiSections,
    original: Prediction,
}

fn sections() -> Sections {
    let image = image();
    let uki = std::fs::read(&image.uki.path).expect("read UKI");
    let original = Prediction::from_uki(&uki, "original").expect("predict");
    let lock = hawser_image::inputs::InputLock::load(&workspace().join("inputs.lock"))
        .expect("inputs.lock");
    let fetched = hawser_image::inputs::fetch(&lock, &hawser_image::inputs::cache_dir())
        .expect("inputs are fetched");
    let stub = std::fs::read(&fetched.stub).expect("read stub");
    let sections = read_uki_sections(&uki).expect("read sections");
    let section = |name: &str| {
        sections
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .loaded_data()
    };
    let base = UkiSections {
        osrel: section(".osrel"),
        cmdline: section(".cmdline"),
        uname: section(".uname"),
        linux: section(".linux"),
        initrd: section(".initrd"),
    };
    assert_eq!(
        assemble_uki(&stub, &base).expect("assemble"),
        uki,
        "re-assembling the built UKI from its sections must give the same bytes"
    );
    Sections {
        stub,
        base,
        original,
    }
}

/// What the verifier says about a boot of the UKI made of `tampered` sections, given the
/// reference published for the original image: the reference file is written from the
/// original's prediction and read by the verifier's own parser (as the join service reads
/// it); the PCRs held against it are the ones the tampered UKI's boot quotes, i.e. its
/// prediction (that a real boot quotes exactly its prediction, a tampered one included, is what
/// this file's two boot tests prove). Returns the PCRs the verifier names and its message.
fn verifier_refusal(s: &Sections, tampered: &UkiSections) -> (Vec<u8>, String) {
    let bytes = assemble_uki(&s.stub, tampered).expect("assemble the tampered UKI");
    let prediction = Prediction::from_uki(&bytes, "tampered").expect("predict the tampered UKI");
    let reference = ReferenceMeasurements::new(&s.original, ReferenceInputs::default());
    let expected = ExpectedMeasurements::from_json(&reference.render())
        .expect("the verifier parses the reference format");
    expected
        .check(&s.original.pcrs(Phase::EnterInitrd))
        .expect("the verifier accepts the original image");
    let mismatch = expected
        .check(&prediction.pcrs(Phase::EnterInitrd))
        .expect_err("the verifier accepts a tampered image");
    let pcrs = mismatch.mismatches.iter().map(|m| m.pcr).collect();
    for m in &mismatch.mismatches {
        assert_eq!(m.expected, s.original.pcr(m.pcr, Phase::EnterInitrd));
        assert_eq!(m.actual, Some(prediction.pcr(m.pcr, Phase::EnterInitrd)));
    }
    (pcrs, mismatch.to_string())
}

#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn one_changed_byte_changes_the_prediction_and_the_boot_follows_it() {
    let Sections {
        stub,
        base,
        original,
    } = sections();

    let cmdline_only = UkiSections {
        cmdline: tamper_cmdline(&base.cmdline),
        ..base.clone()
    };
    let initrd_only = UkiSections {
        initrd: tamper_initrd(&base.initrd),
        ..base.clone()
    };
    let both = UkiSections {
        cmdline: cmdline_only.cmdline.clone(),
        initrd: initrd_only.initrd.clone(),
        ..base.clone()
    };
    let mut predictions = Vec::new();
    for (what, s) in [
        ("command line", &cmdline_only),
        ("initrd", &initrd_only),
        ("both", &both),
    ] {
        let bytes = assemble_uki(&stub, s).expect("assemble tampered UKI");
        let p = Prediction::from_uki(&bytes, what).expect("predict tampered UKI");
        for pcr in [4, 9, 11] {
            assert_ne!(
                p.pcr(pcr, Phase::EnterInitrd),
                original.pcr(pcr, Phase::EnterInitrd),
                "changing the {what} must change the prediction of PCR {pcr}"
            );
        }
        for pcr in [12, 13, 15] {
            assert_eq!(p.pcr(pcr, Phase::EnterInitrd), [0; 32]);
        }
        predictions.push((bytes, p));
    }
    let (cmdline_pred, initrd_pred) = (&predictions[0].1, &predictions[1].1);
    assert_ne!(
        cmdline_pred.pcr(9, Phase::Stub),
        initrd_pred.pcr(9, Phase::Stub)
    );

    // Boot the image with both changes: its quote equals the new prediction …
    let (tampered_bytes, tampered) = &predictions[2];
    let path = scratch("tampered").join("hawser.efi");
    std::fs::write(&path, tampered_bytes).expect("write tampered UKI");
    let boot = boot("measure-tampered", &path);
    assert_boot_matches("tampered image", tampered, &boot);

    // … and its event log, held against the original image, names exactly what changed.
    let diagnosis = explain(
        &original,
        &boot.event_log,
        Some(&boot.verified.pcrs),
        &boot.verified.phases_extended,
    )
    .expect("explain");
    assert!(!diagnosis.ok());
    let differing = |pcr: u8| -> Vec<String> {
        diagnosis
            .pcr(pcr)
            .expect("pcr")
            .events
            .iter()
            .filter(|e| e.is_problem())
            .map(|e| match e {
                EventMatch::Differs { predicted, .. } => predicted.key.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(differing(4), ["app#1"], "\n{diagnosis}");
    assert_eq!(
        differing(9),
        ["tag:0x8f3b22ed", "tag:0x8f3b22ec"],
        "\n{diagnosis}"
    );
    assert_eq!(
        differing(11),
        ["ipl:.cmdline#2", "ipl:.initrd#2"],
        "\n{diagnosis}"
    );
    let text = diagnosis.to_string();
    assert!(
        text.contains("panic=30"),
        "names the expected command line:\n{text}"
    );
    eprintln!("diagnosis of the tampered boot against the original image:\n{text}");
}

/// Tamper row: kernel byte. One byte in the middle of the kernel (`.linux`) changed: the
/// verifier refuses the boot naming PCR 4 (the UKI's Authenticode hash covers `.linux`) and
/// PCR 11 (systemd-stub measures the section) with expected and actual values. No boot: the
/// reasoning from prediction to quote is the boot tests'.
#[test]
#[ignore = "builds the image (no boot); run by scripts/test"]
fn tamper_kernel_byte_is_refused_naming_pcrs_4_and_11() {
    let s = sections();
    let mut linux = s.base.linux.clone();
    let at = linux.len() / 2;
    linux[at] ^= 0x01;
    let tampered = UkiSections {
        linux,
        ..s.base.clone()
    };
    let (pcrs, message) = verifier_refusal(&s, &tampered);
    assert_eq!(pcrs, [4, 11], "{message}");
    assert!(
        message.starts_with("measurements differ from the expected ones: PCR 4 expected "),
        "{message}"
    );
    eprintln!("kernel byte {at} of {}: {message}", s.base.linux.len());
}

/// Tamper row: initrd byte. One byte of the initramfs changed (the cpio trailer's mtime, which
/// the kernel ignores: the image would boot): the verifier refuses it naming PCR 4 (UKI
/// Authenticode), PCR 9 (the Linux stub measures the initrd it loads) and PCR 11 (`.initrd`).
#[test]
#[ignore = "builds the image (no boot); run by scripts/test"]
fn tamper_initrd_byte_is_refused_naming_pcrs_4_9_and_11() {
    let s = sections();
    let tampered = UkiSections {
        initrd: tamper_initrd(&s.base.initrd),
        ..s.base.clone()
    };
    let (pcrs, message) = verifier_refusal(&s, &tampered);
    assert_eq!(pcrs, [4, 9, 11], "{message}");
    eprintln!("initrd byte: {message}");
}
