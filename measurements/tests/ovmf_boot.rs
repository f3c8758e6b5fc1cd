//! Test vectors captured from a real boot: QEMU q35 (TCG) + Debian's OVMF 4M + swtpm (tpm-crb),
//! booting a UKI made of the pinned trixie systemd-stub 257.13 and Linux 6.12.117 with a tiny
//! /init that prints the TPM's sha256 PCRs and the firmware's event log (see
//! `tests/fixtures/ovmf-boot/README.md`).
//!
//! The event log and the PCR values the guest read are committed; the UKI is not (12 MB), but it
//! is a pure function of the pinned inputs and the committed fixture files, so these tests
//! rebuild it from the input cache (`hawser image fetch`), predict it, and hold the prediction
//! against what firmware, systemd-stub and the kernel really measured. Without the input cache
//! they say so and skip; `HAWSER_REQUIRE_INPUTS=1` makes that a failure
//! (`hawser_image::test_support`). The event-log-only tests always run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::path::Path;

use hawser_measurements::authenticode::authenticode_sha256;
use hawser_measurements::eventlog::EventLog;
use hawser_measurements::explain::{EventMatch, explain};
use hawser_measurements::pe::PeImage;
use hawser_measurements::predict::{Phase, Prediction};
use hawser_measurements::stub::{effective_cmdline, load_options_utf16};
use sha2::{Digest, Sha256};

const RELEASE: &str = "6.12.117+deb13-cloud-amd64";

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ovmf-boot")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn log() -> EventLog {
    EventLog::parse(&fixture("event-log.bin")).expect("the captured log parses")
}

/// PCR values the guest read from /sys/class/tpm/tpm0/pcr-sha256/N.
fn guest_pcrs() -> BTreeMap<u8, [u8; 32]> {
    String::from_utf8(fixture("pcrs.txt"))
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (n, v) = l.split_once(' ').expect("'N HEX'");
            let v: [u8; 32] = hex::decode(v.trim())
                .expect("hex")
                .try_into()
                .expect("32 bytes");
            (n.parse().expect("PCR number"), v)
        })
        .collect()
}

/// The pinned kernel and stub, or `None` (test skipped, saying so) without the input cache; with
/// `HAWSER_REQUIRE_INPUTS=1`, a failure instead.
fn inputs() -> Option<(Vec<u8>, Vec<u8>)> {
    let lock_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
    let lock = hawser_image::inputs::InputLock::load(&lock_path).expect("inputs.lock");
    match hawser_image::inputs::cached(&lock, &hawser_image::inputs::cache_dir()) {
        Ok(c) => {
            // Another pinned kernel is no missing input but a stale fixture: never a skip.
            assert_eq!(
                c.kernel_release, RELEASE,
                "inputs.lock pins another kernel than the capture boot's: capture the fixture \
                 again (tests/fixtures/ovmf-boot/README.md)"
            );
            Some((
                std::fs::read(&c.stub).expect("read stub"),
                std::fs::read(&c.kernel_image).expect("read kernel"),
            ))
        }
        Err(hawser_image::inputs::InputError::NotFetched { name, version }) => {
            hawser_image::test_support::missing_input(&format!("{name} {version}"));
            None
        }
        Err(e) => panic!("the pinned stub and kernel are unusable: {e}"),
    }
}

/// The fixture UKI, exactly as `examples/fixture_uki.rs` builds it for the capture boot.
fn fixture_uki() -> Option<Vec<u8>> {
    let (stub, linux) = inputs()?;
    let sections = hawser_image::uki::UkiSections {
        osrel: fixture("osrel"),
        cmdline: fixture("cmdline"),
        uname: RELEASE.as_bytes().to_vec(),
        linux,
        initrd: fixture("initrd.cpio.zst"),
    };
    let uki = hawser_image::uki::assemble_uki(&stub, &sections).expect("assemble the fixture UKI");
    assert_eq!(
        hex::encode(Sha256::digest(&uki)),
        "f9ee14adc7bddc4844c3f0f97819698471a145e339685485a44bc7e76ffa18a1",
        "the rebuilt fixture UKI differs from the one that was booted"
    );
    Some(uki)
}

#[test]
fn the_log_replays_to_the_pcrs_the_guest_read() {
    let log = log();
    assert_eq!(
        log.spec.algorithms,
        [(0x4, 20), (0xb, 32), (0xc, 48), (0xd, 64)],
        "OVMF logs sha1, sha256, sha384, sha512"
    );
    let replay = log.replay_sha256().expect("replay");
    let guest = guest_pcrs();
    for pcr in [0u8, 1, 2, 3, 4, 5, 6, 7, 9, 11] {
        assert_eq!(
            replay.get(&u32::from(pcr)),
            Some(&guest[&pcr]),
            "PCR {pcr}: the log's replay differs from the TPM"
        );
    }
    // No events for 8, 12, 13 and 15: they stayed zero in the TPM.
    for pcr in [8u8, 12, 13, 15] {
        assert!(!replay.contains_key(&u32::from(pcr)));
        assert_eq!(guest[&pcr], [0; 32], "PCR {pcr}");
    }
}

#[test]
fn the_log_shows_the_stub_and_kernel_events_in_the_documented_order() {
    let log = log();
    let pcr4: Vec<String> = log
        .events_for(4)
        .map(|e| e.type_name().to_owned())
        .collect();
    assert_eq!(
        pcr4,
        [
            "EV_EFI_ACTION",
            "EV_SEPARATOR",
            "EV_EFI_BOOT_SERVICES_APPLICATION",
            "EV_EFI_BOOT_SERVICES_APPLICATION"
        ]
    );
    let pcr11: Vec<String> = log.events_for(11).map(|e| e.describe()).collect();
    let sections = [".linux", ".osrel", ".cmdline", ".initrd", ".uname", ".sbat"];
    let expected: Vec<String> = sections
        .iter()
        .flat_map(|s| [s.to_string(), s.to_string()])
        .collect();
    assert_eq!(pcr11, expected);
    let pcr9: Vec<String> = log.events_for(9).map(|e| e.describe()).collect();
    assert_eq!(
        pcr9,
        [
            "tag 0x8f3b22ed \"LOADED_IMAGE::LoadOptions\"",
            "tag 0x8f3b22ec \"Linux initrd\""
        ]
    );
}

#[test]
fn small_sections_and_the_command_line_match_the_log() {
    // These need no input cache: the section bytes are committed.
    let log = log();
    let pcr11: Vec<[u8; 32]> = log
        .events_for(11)
        .map(|e| e.sha256().expect("sha256"))
        .collect();
    let sha = |b: &[u8]| -> [u8; 32] { Sha256::digest(b).into() };
    // Name events include the NUL.
    assert_eq!(pcr11[0], sha(b".linux\0"));
    assert_eq!(pcr11[2], sha(b".osrel\0"));
    assert_eq!(pcr11[3], sha(&fixture("osrel")));
    // The raw .cmdline (leading blanks, tab, emoji, trailing newline) is in PCR 11 …
    assert_eq!(pcr11[5], sha(&fixture("cmdline")));
    assert_eq!(pcr11[7], sha(&fixture("initrd.cpio.zst")));
    assert_eq!(pcr11[9], sha(RELEASE.as_bytes()));
    // … while PCR 9 has systemd-stub's mangled UCS-2 version: blanks trimmed, the tab a space,
    // é and € kept, the emoji (above U+FFFF) dropped, a UTF-16 NUL appended.
    let pcr9: Vec<[u8; 32]> = log
        .events_for(9)
        .map(|e| e.sha256().expect("sha256"))
        .collect();
    assert_eq!(
        effective_cmdline(&fixture("cmdline")),
        "console=ttyS0 panic=-1 fixture.note=é€"
    );
    assert_eq!(pcr9[0], sha(&load_options_utf16(&fixture("cmdline"))));
}

#[test]
fn authenticode_of_the_pinned_kernel_matches_pcr4() {
    let Some((_, kernel)) = inputs() else { return };
    let pe = PeImage::parse(&kernel, "kernel").expect("the kernel is a PE image");
    // Debian's kernel is signed: the certificate table must be excluded.
    assert_ne!(pe.security_directory.1, 0);
    let logged = log()
        .events_for(4)
        .nth(3)
        .and_then(|e| e.sha256())
        .expect("4th PCR 4 event");
    assert_eq!(authenticode_sha256(&pe).expect("hash"), logged);
}

#[test]
fn the_prediction_of_the_fixture_uki_equals_the_real_boot() {
    let Some(uki) = fixture_uki() else { return };
    let prediction = Prediction::from_uki(&uki, "fixture.efi").expect("predict");
    let guest = guest_pcrs();
    for pcr in [4u8, 9, 12, 13, 15] {
        assert_eq!(
            prediction.pcr(pcr, Phase::Stub),
            guest[&pcr],
            "PCR {pcr}: prediction differs from the TPM"
        );
    }
    // The fixture's /init extends nothing: PCR 11 is the stub's value.
    assert_eq!(prediction.pcr(11, Phase::Stub), guest[&11]);

    // Event by event, too.
    let diagnosis = explain(&prediction, &log(), Some(&guest), &[]).expect("explain");
    assert!(diagnosis.ok(), "{diagnosis}");
    for p in &diagnosis.pcrs {
        assert!(p.events.iter().all(|e| !e.is_problem()), "{diagnosis}");
    }
}

#[test]
fn a_different_uki_is_diagnosed_event_by_event() {
    let Some(uki) = fixture_uki() else { return };
    let (stub, linux) = inputs().expect("inputs present");
    // The same UKI with one byte of the command line changed.
    let mut cmdline = fixture("cmdline");
    let at = cmdline
        .windows(8)
        .position(|w| w == b"panic=-1")
        .expect("panic=-1");
    cmdline[at + 7] = b'2';
    let other = hawser_image::uki::assemble_uki(
        &stub,
        &hawser_image::uki::UkiSections {
            osrel: fixture("osrel"),
            cmdline,
            uname: RELEASE.as_bytes().to_vec(),
            linux,
            initrd: fixture("initrd.cpio.zst"),
        },
    )
    .expect("assemble");
    assert_ne!(uki, other);
    let prediction = Prediction::from_uki(&other, "other.efi").expect("predict");
    let diagnosis = explain(&prediction, &log(), Some(&guest_pcrs()), &[]).expect("explain");
    assert!(!diagnosis.ok());
    let differing = |pcr: u8| -> Vec<String> {
        diagnosis
            .pcr(pcr)
            .expect("pcr")
            .events
            .iter()
            .filter_map(|e| match e {
                EventMatch::Differs { predicted, .. } => Some(predicted.key.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        differing(4),
        ["app#1"],
        "only the UKI's hash, not the kernel's"
    );
    assert_eq!(differing(9), ["tag:0x8f3b22ed"], "only the command line");
    assert_eq!(
        differing(11),
        ["ipl:.cmdline#2"],
        "only .cmdline's contents"
    );
    let text = diagnosis.to_string();
    assert!(
        text.contains("the kernel received another command line"),
        "{text}"
    );
    assert!(
        text.contains("panic=-2"),
        "the differing event names the predicted command line: {text}"
    );
}

#[test]
fn a_truncated_or_wrong_file_is_refused_with_a_reason() {
    let Some(uki) = fixture_uki() else { return };
    let cases: [(&str, &[u8], &str); 6] = [
        (
            "empty",
            &[],
            "the UKI empty is not a PE image: the file is empty",
        ),
        (
            "the event log",
            &fixture("event-log.bin"),
            "there is no MZ signature",
        ),
        (
            "half the headers",
            &uki[..0x300],
            "is truncated: SizeOfHeaders needs bytes 0x0..0x600",
        ),
        (
            "headers only",
            &uki[..0x600],
            "is truncated: the data of section",
        ),
        (
            "cut inside .linux",
            &uki[..uki.len() / 2],
            "is truncated: the data of section \".linux\"",
        ),
        (
            "one byte short",
            &uki[..uki.len() - 1],
            "is truncated: the data of section",
        ),
    ];
    for (what, bytes, expected) in cases {
        let err = Prediction::from_uki(bytes, what).expect_err(what);
        assert!(err.to_string().contains(expected), "{what}: {err}");
    }
    // The kernel alone is a PE image but not a UKI.
    let (_, kernel) = inputs().expect("inputs present");
    let err = Prediction::from_uki(&kernel, "vmlinuz").unwrap_err();
    assert!(
        err.to_string().starts_with(
            "the UKI vmlinuz has no .linux section (its sections: .setup .compat .text .data)"
        ),
        "{err}"
    );
}
