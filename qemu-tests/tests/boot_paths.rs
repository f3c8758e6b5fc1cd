//! PCR 4 on the boot paths a firmware really takes, proven on real boots.
//!
//! hawser's UKI, booted under OVMF + swtpm two ways besides the direct boot the other suites
//! use:
//! 1. an empty CD-ROM drive first in the boot order: OVMF tries it, fails, and boots the UKI.
//!    The quoted PCR 4 equals [`BootPath::FailedBootOptions`] `{ count: 1 }`'s prediction (the
//!    firmware's "Returning from EFI Application from Boot Option" and a second "Calling EFI
//!    Application from Boot Option"), not the direct one; every other predicted PCR is as
//!    direct. The verifier accepts it through the reference's `alsoExpected` and refuses it,
//!    naming PCR 4, from a reference without that path.
//! 2. systemd-boot (the pinned systemd-boot-efi 257.13, the same package as the stub) in front
//!    of the UKI, found in `\EFI\Linux\`: PCR 4 equals [`BootPath::BootManager`]'s prediction
//!    with systemd-boot's Authenticode hash.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test boot_paths -- --ignored --test-threads=1 --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::path::PathBuf;

use hawser_attestation::{ExpectedMeasurements, ExpectedPcr};
use hawser_harness::{Esp, EspFile, VmConfig};
use hawser_image::inputs::{self, InputLock};
use hawser_measurements::authenticode::authenticode_sha256;
use hawser_measurements::pe::PeImage;
use hawser_measurements::predict::{BootPath, PREDICTED_PCRS, Phase, Prediction};

mod common;
use common::quote::{Boot, boot_with};
use common::{build_image, workspace};

fn scratch(name: &str) -> PathBuf {
    common::scratch("boot-paths-tests", name)
}

/// Every predicted PCR of the boot equals the prediction, PCR 4 the one of `path`.
fn assert_quote_on(name: &str, prediction: &Prediction, path: &BootPath, boot: &Boot) {
    let quoted = &boot.verified.pcrs;
    let pcr4 = prediction.pcr4_on(path);
    assert_eq!(
        hex::encode(quoted[&4]),
        hex::encode(pcr4),
        "{name}: PCR 4 differs from the prediction for {path}; the event log:\n{:#?}",
        boot.event_log
            .events
            .iter()
            .filter(|e| e.pcr == 4)
            .collect::<Vec<_>>()
    );
    assert_ne!(pcr4, prediction.pcr(4, Phase::Stub), "{path} changes PCR 4");
    for pcr in PREDICTED_PCRS.into_iter().filter(|&p| p != 4) {
        assert_eq!(
            hex::encode(quoted[&pcr]),
            hex::encode(prediction.pcr(pcr, Phase::EnterInitrd)),
            "{name}: PCR {pcr} differs from the prediction"
        );
    }
    let replayed = boot.event_log.replay_sha256().expect("replay");
    assert_eq!(
        replayed.get(&4),
        quoted.get(&4),
        "{name}: the log replays to the quote"
    );
    eprintln!(
        "{name}: PCR 4 {} = prediction for {path}",
        hex::encode(pcr4)
    );
}

/// The verifier's view: the predicted map, with `also` as PCR 4's further accepted values.
fn verifier(prediction: &Prediction, also: &[[u8; 32]]) -> ExpectedMeasurements {
    let mut expected = ExpectedMeasurements::new();
    for (pcr, value) in prediction.pcrs(Phase::EnterInitrd) {
        expected.insert(
            pcr,
            ExpectedPcr {
                expected: value,
                warn_only: false,
            },
        );
    }
    for value in also {
        expected.also_accept(4, *value);
    }
    expected
}

fn systemd_boot() -> PathBuf {
    let lock = InputLock::load(&workspace().join("inputs.lock")).unwrap();
    let fetched = inputs::cached(&lock, &inputs::cache_dir()).expect("inputs fetched by the build");
    fetched
        .stub
        .parent()
        .expect("the stub's directory")
        .join("systemd-bootx64.efi")
}

#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn pcr4_after_a_failed_boot_option_and_behind_systemd_boot_is_predicted_and_accepted() {
    let image = build_image(&scratch("image"), None);
    let uki = &image.uki.path;
    let prediction = Prediction::from_uki(&std::fs::read(uki).unwrap(), "hawser.efi").unwrap();

    // 1. An empty CD-ROM first.
    let failed = BootPath::FailedBootOptions { count: 1 };
    let boot = boot_with("cdrom-first", VmConfig::uefi(uki).empty_cdroms_first(1));
    assert_quote_on("cdrom-first", &prediction, &failed, &boot);
    let quoted: &BTreeMap<u8, [u8; 32]> = &boot.verified.pcrs;
    let refused = verifier(&prediction, &[])
        .check(quoted)
        .expect_err("a reference without the path refuses the boot");
    assert_eq!(
        refused.mismatches.iter().map(|m| m.pcr).collect::<Vec<_>>(),
        [4],
        "{refused}"
    );
    verifier(&prediction, &[prediction.pcr4_on(&failed)])
        .check(quoted)
        .expect("a reference allowing one failed boot option accepts the boot");

    // 2. systemd-boot in front of the UKI.
    let sd_boot = systemd_boot();
    let bytes = std::fs::read(&sd_boot).unwrap();
    let authenticode =
        authenticode_sha256(&PeImage::parse(&bytes, "systemd-boot").unwrap()).unwrap();
    let manager = BootPath::BootManager {
        name: "systemd-boot 257.13".into(),
        authenticode,
    };
    let dir = scratch("sd-boot");
    let loader_conf = dir.join("loader.conf");
    std::fs::write(&loader_conf, "timeout 0\n").unwrap();
    let esp = Esp::Files(vec![
        EspFile::default_boot_loader(&sd_boot),
        EspFile::new("loader/loader.conf", &loader_conf),
        EspFile::new("EFI/Linux/hawser.efi", uki),
    ]);
    let boot = boot_with("systemd-boot", VmConfig::uefi_with_esp(esp));
    assert_quote_on("systemd-boot", &prediction, &manager, &boot);
    verifier(&prediction, &[prediction.pcr4_on(&manager)])
        .check(&boot.verified.pcrs)
        .expect("a reference allowing this boot manager accepts the boot");
    assert!(
        verifier(&prediction, &[prediction.pcr4_on(&failed)])
            .check(&boot.verified.pcrs)
            .is_err(),
        "an application the reference does not list is refused"
    );
}
