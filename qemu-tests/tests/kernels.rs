//! Predictions for UKIs around other distributions' kernels, proven on real boots.
//!
//! The Linux EFI stub measures the command line and the initrd into PCR 9; which kernels do so,
//! and how, is what [`hawser_measurements::models::KERNEL_MODELS`] claims. Each kernel pinned in
//! `measurements/kernels.lock` (Debian 12's 6.1, Ubuntu 24.04's 6.8) and hawser's own 6.12 is
//! assembled with hawser's systemd-stub 257 around the event-log fixture's freestanding `/init`
//! (`measurements/tests/fixtures/ovmf-boot`: it needs no modules, prints the PCRs it reads from
//! sysfs and the firmware's event log, and powers off), and its awkward `.cmdline` (leading
//! blanks, a tab, non-ASCII, a trailing newline; `loglevel=1` added, see [`quiet_cmdline`]).
//! Every UKI is booted under OVMF + swtpm; PCRs 4, 9 and 11 (there is no hawser phase) and 12,
//! 13, 15 must equal the prediction, and the event log must line up with it.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test kernels -- --ignored --test-threads=1 --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hawser_harness::{TpmConfig, Vm, VmConfig};
use hawser_image::inputs::{self, InputLock};
use hawser_image::uki::{UkiSections, assemble_uki};
use hawser_measurements::eventlog::{self, EventLog};
use hawser_measurements::explain::explain;
use hawser_measurements::predict::{PREDICTED_PCRS, Phase, Prediction};

mod common;

/// The input cache's subdirectory for other distributions' packages.
const OTHER_DISTRIBUTIONS: &str = "other-distributions";
use common::quote::BOOT_TIMEOUT;
use common::workspace;

fn fixture(name: &str) -> Vec<u8> {
    let path = workspace()
        .join("measurements/tests/fixtures/ovmf-boot")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fixture's awkward command line with `loglevel=1` added before its trailing newline: the
/// fixture prints its PCRs and the base64 event log on the console, and a kernel message printed
/// meanwhile (under TCG, the clocksource watchdog marking the TSC unstable, `random: crng init
/// done`, a late probe) would land inside those lines. Panics (`KERN_EMERG`) still print.
fn quiet_cmdline() -> Vec<u8> {
    let mut cmdline = fixture("cmdline");
    let end = cmdline.len() - usize::from(cmdline.ends_with(b"\n"));
    cmdline.splice(end..end, *b" loglevel=1");
    cmdline
}

/// (release, vmlinuz) of every kernel: hawser's own, then `measurements/kernels.lock`'s.
fn kernels() -> (Vec<u8>, Vec<(String, PathBuf)>) {
    let cache = inputs::cache_dir();
    // Other distributions' packages live apart from the image's inputs: tools that look for
    // "the" kernel or stub among the cached inputs must never find one of these.
    let other_distributions = cache.join(OTHER_DISTRIBUTIONS);
    let own = InputLock::load(&workspace().join("inputs.lock")).expect("inputs.lock");
    let fetched = inputs::fetch(&own, &cache).expect("fetch inputs.lock");
    let stub = std::fs::read(&fetched.stub).unwrap();
    let mut kernels = vec![(fetched.kernel_release.clone(), fetched.kernel_image.clone())];
    let others = InputLock::load(&workspace().join("measurements/kernels.lock"))
        .expect("measurements/kernels.lock");
    let n = others.packages.len();
    for (i, pkg) in others.packages.iter().enumerate() {
        let root =
            inputs::fetch_package(pkg, &other_distributions, &format!("kernel {}/{n}", i + 1))
                .unwrap_or_else(|e| panic!("{e}"));
        let release = pkg
            .name
            .strip_prefix("linux-image-")
            .expect("a linux-image package")
            .to_owned();
        kernels.push((
            release.clone(),
            root.join(format!("boot/vmlinuz-{release}")),
        ));
    }
    (stub, kernels)
}

/// Boots `uki`; the PCRs the fixture's /init read and the event log it printed.
fn boot(name: &str, uki: &std::path::Path) -> (BTreeMap<u8, [u8; 32]>, EventLog) {
    let vm = Vm::start(VmConfig::uefi(uki).name(name).tpm(TpmConfig::default())).expect("start VM");
    let line = vm
        .wait_for_marker("event log", hawser_pcr::EVENT_LOG_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{name}: the fixture printed no event log: {e}"));
    let log = EventLog::parse(
        &eventlog::find_in_console(&line)
            .expect("marker")
            .unwrap_or_else(|e| panic!("{name}: {e}")),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let pcrs: BTreeMap<u8, [u8; 32]> = vm
        .console_lines()
        .iter()
        .filter_map(|l| {
            let rest = &l[l.find("FIXTURE_PCR ")? + "FIXTURE_PCR ".len()..];
            let (n, hex_value) = rest.trim().split_once(' ')?;
            let value: [u8; 32] = hex::decode(hex_value.trim()).ok()?.try_into().ok()?;
            Some((n.parse().ok()?, value))
        })
        .collect();
    let _ = vm.shutdown(Duration::from_secs(30));
    assert!(
        PREDICTED_PCRS.iter().all(|p| pcrs.contains_key(p)),
        "{name}: the fixture printed PCRs {:?}",
        pcrs.keys().collect::<Vec<_>>()
    );
    (pcrs, log)
}

#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn ukis_around_other_distributions_kernels_boot_to_exactly_the_predicted_pcrs() {
    let dir = common::scratch("kernels-tests", "ukis");
    let (stub, kernels) = kernels();
    let mut failures = Vec::new();
    for (release, vmlinuz) in &kernels {
        let name = format!("kernel-{}", release.replace('+', "_"));
        let uki = assemble_uki(
            &stub,
            &UkiSections {
                osrel: fixture("osrel"),
                cmdline: quiet_cmdline(),
                uname: release.as_bytes().to_vec(),
                linux: std::fs::read(vmlinuz).unwrap(),
                initrd: fixture("initrd.cpio.zst"),
            },
        )
        .expect("assemble");
        let path = dir.join(format!("{name}.efi"));
        std::fs::write(&path, &uki).unwrap();
        let prediction = match Prediction::from_uki(&uki, &name) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: not predicted: {e}"));
                continue;
            }
        };
        assert_eq!(
            &prediction.kernel_release, release,
            "the release read from .linux"
        );
        let (pcrs, log) = boot(&name, &path);
        let mut differ = Vec::new();
        for pcr in PREDICTED_PCRS {
            // No hawser PID 1 here: PCR 11 is systemd-stub's alone.
            let predicted = prediction.pcr(pcr, Phase::Stub);
            if pcrs[&pcr] != predicted {
                differ.push(format!(
                    "PCR {pcr}: read {}, predicted {}",
                    hex::encode(pcrs[&pcr]),
                    hex::encode(predicted)
                ));
            }
        }
        let diagnosis = explain(&prediction, &log, Some(&pcrs), &[]).expect("explain");
        if differ.is_empty() && diagnosis.ok() {
            eprintln!("{name}: the boot read exactly the predicted PCRs");
        } else {
            failures.push(format!("{name}:\n{}\n{diagnosis}", differ.join("\n")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} kernels:\n\n{}",
        failures.len(),
        kernels.len(),
        failures.join("\n\n")
    );
}
