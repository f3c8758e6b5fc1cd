//! The bootable disk image in QEMU: OVMF finds the UKI on the image's ESP and boots it.
//!
//! One boot (OVMF + swtpm, ~25–40 s under TCG) of a disk built by
//! `hawser_image::disk::build_disk_image` from the real UKI (the image pipeline, as the other
//! suites build it) and a small erofs root with its dm-verity tree, attached read-only with
//! [`VmConfig::uefi_disk`]. The test checks what a user would:
//! - PID 1 prints a boot report whose quote verifies against the host's nonce;
//! - PCRs 4, 9 and 11 equal the prediction for that UKI: firmware ran exactly this UKI;
//! - the GPT OVMF measured into PCR 5 (its `EV_EFI_GPT_EVENT`) is the image's own table, with
//!   the ESP, root and verity partitions and the root hash's halves as PARTUUIDs, and the event
//!   log replays to the quoted PCR 5: firmware saw the whole disk, and the quote covers it.
//!
//! The root here is a small synthetic erofs and the UKI has no `hawser.root_hash`, so PID 1 does
//! not pivot: the whole node (rootfs, pivot, kubeadm) is `tests/node.rs`.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test disk_image -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_image::test_support::require_tool;
use std::time::Instant;

use hawser_disk_format::gpt::{ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE, root_partuuids};
use hawser_harness::VmConfig;
use hawser_image::disk::{DiskLayout, build_disk_image};
use hawser_measurements::predict::{Phase, Prediction};

mod common;
use common::build_image;
use common::quote::{Boot, boot_with};

/// `EV_EFI_GPT_EVENT`: the firmware's measurement of the boot disk's GPT (`UEFI_GPT_DATA`).
const EV_EFI_GPT_EVENT: u32 = 0x8000_0006;
/// 2026-01-01T00:00:00Z.
const SOURCE_DATE_EPOCH: u64 = 1_767_225_600;

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// A small erofs root file system and its dm-verity tree (both reproducible); returns the root
/// hash.
fn synthetic_root(dir: &Path) -> (PathBuf, PathBuf, [u8; 32]) {
    let tree = dir.join("root-tree");
    std::fs::create_dir_all(tree.join("etc")).expect("create root tree");
    std::fs::write(
        tree.join("etc/os-release"),
        "ID=hawser-test\nPRETTY_NAME=\"hawser disk image test root\"\n",
    )
    .expect("write os-release");
    let rootfs = dir.join("rootfs.erofs");
    let verity = dir.join("rootfs.verity");
    let _ = std::fs::remove_file(&rootfs);
    let _ = std::fs::remove_file(&verity);
    run(Command::new(require_tool("mkfs.erofs", "erofs-utils"))
        .arg(format!("-T{SOURCE_DATE_EPOCH}"))
        .arg("-U68617773-6572-4000-8000-726f6f746673")
        .arg(&rootfs)
        .arg(&tree));
    let stdout = run(Command::new(require_tool("veritysetup", "cryptsetup-bin"))
        .args([
            "format",
            "--salt=6861777365722d6469736b2d696d616765",
            "--uuid=68617773-6572-4000-8000-766572697479",
            "--hash=sha256",
            "--data-block-size=4096",
            "--hash-block-size=4096",
        ])
        .arg(&rootfs)
        .arg(&verity));
    let hash = stdout
        .lines()
        .find_map(|line| line.strip_prefix("Root hash:"))
        .unwrap_or_else(|| panic!("no root hash in veritysetup output:\n{stdout}"))
        .trim();
    let mut root_hash = [0u8; 32];
    hex::decode_to_slice(hash, &mut root_hash).expect("hex root hash");
    (rootfs, verity, root_hash)
}

#[test]
#[ignore = "boots QEMU (~40 s under TCG); run by scripts/test"]
fn ovmf_boots_the_uki_from_the_disk_image_and_measures_its_gpt() {
    let dir = common::fresh_scratch("disk-image-tests", "disk");
    let image = build_image(&common::scratch("disk-image-tests", "image"), None);
    let (rootfs, verity, root_hash) = synthetic_root(&dir);
    let disk_path = dir.join("hawser-disk.raw");
    let started = Instant::now();
    let disk = build_disk_image(
        &DiskLayout {
            uki: &image.uki.path,
            rootfs: &rootfs,
            verity: &verity,
            root_hash,
            source_date_epoch: SOURCE_DATE_EPOCH,
        },
        &disk_path,
    )
    .unwrap_or_else(|e| panic!("building the disk image failed: {e}"));
    eprintln!(
        "disk image: {} bytes ({} MiB), built in {:?}; partitions: {:#?}",
        disk.bytes,
        disk.bytes / (1024 * 1024),
        started.elapsed(),
        disk.partitions
    );

    let disk_bytes = std::fs::read(&disk_path).expect("read disk image");
    let Boot {
        verified,
        event_log,
    } = boot_with("disk-image", VmConfig::uefi_disk(&disk_path));

    // Firmware ran exactly this UKI.
    let uki = std::fs::read(&image.uki.path).expect("read UKI");
    let prediction = Prediction::from_uki(&uki, "hawser.efi").expect("predict");
    for pcr in [4u8, 9, 11] {
        assert_eq!(
            hex::encode(verified.pcrs[&pcr]),
            hex::encode(prediction.pcr(pcr, Phase::EnterInitrd)),
            "quoted PCR {pcr} differs from the prediction for the UKI on the disk image"
        );
    }

    // The GPT firmware measured is the image's: `UEFI_GPT_DATA` = the primary header (92
    // bytes, or 96 where EDK2 copies its padded struct), the number of used entries (u64) and
    // those entries (128 bytes each).
    let gpt_events: Vec<_> = event_log
        .events_for(5)
        .filter(|event| event.event_type == EV_EFI_GPT_EVENT)
        .collect();
    assert_eq!(gpt_events.len(), 1, "one GPT event in PCR 5");
    let data = &gpt_events[0].data;
    let header_len = data
        .len()
        .checked_sub(8 + 3 * 128)
        .expect("GPT event too short for three partitions");
    assert!(
        header_len == 92 || header_len == 96,
        "GPT event of {} bytes: not a header and three partitions",
        data.len()
    );
    assert_eq!(
        &data[..header_len],
        &disk_bytes[512..512 + header_len],
        "the measured GPT header is not the image's"
    );
    let entries = &data[header_len + 8..];
    let partition_count = u64::from_le_bytes(
        data[header_len..header_len + 8]
            .try_into()
            .expect("8 bytes"),
    );
    assert_eq!(partition_count, 3, "partitions the firmware saw");
    assert_eq!(
        entries,
        &disk_bytes[1024..1024 + 3 * 128],
        "the measured partition entries are not the image's"
    );
    let (root_uuid, verity_uuid) = root_partuuids(&root_hash);
    assert_eq!(&entries[128..144], &ROOT_X86_64_TYPE.to_gpt_bytes());
    assert_eq!(&entries[144..160], &root_uuid.to_gpt_bytes());
    assert_eq!(&entries[256..272], &ROOT_X86_64_VERITY_TYPE.to_gpt_bytes());
    assert_eq!(&entries[272..288], &verity_uuid.to_gpt_bytes());
    // …and the quote covers it.
    let replay = event_log.replay_sha256().expect("replay the event log");
    assert_eq!(
        replay.get(&5),
        Some(&verified.pcrs[&5]),
        "the event log's PCR 5 differs from the quoted one"
    );
    // The image is attached read-only: the boot left it as built.
    assert!(
        std::fs::read(&disk_path).expect("re-read disk image") == disk_bytes,
        "the boot changed the disk image"
    );
}
