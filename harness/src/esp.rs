//! ESP disk images: a GPT disk holding one EFI System Partition (FAT32).
//!
//! OVMF boots it like a real disk: it finds the ESP by its partition type, and with no boot
//! entries in a fresh variable store it boots the removable-media path
//! `\EFI\BOOT\BOOTX64.EFI`. A bare FAT image ("superfloppy") boots too, but a cloud VM's
//! disk is partitioned, and OVMF measures the GPT into PCR 5, so the test platform should
//! look like the real one.
//!
//! The disk is built by the image builder's [`hawser_image::disk::build_gpt_disk`], the same
//! code that writes the product disk image (ESP + root + verity), so there is one GPT and FAT
//! writer. What is fixed here are the identities of the test disk: disk and partition GUIDs,
//! the FAT volume id and the FAT time stamp (1980-01-01). The same files give the same bytes,
//! hence the same PCR 5 from boot to boot, and the same PCR 5 as when the reference
//! measurements were taken (a test below pins the GPT bytes).

use std::path::Path;

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::ESP_TYPE;
use hawser_image::disk::{
    self, DiskError, ESP_LABEL, ESP_VOLUME_LABEL, FatVolume, GptDiskSpec, PartitionContent,
    PartitionSpec,
};

use crate::QemuError;
use crate::host::debian_package_for;

pub use hawser_image::disk::EspFile;

/// The EFI System Partition type, C12A7328-F81F-11D2-BA4B-00A0C93EC93B, in its on-disk
/// (mixed-endian) form.
pub const ESP_TYPE_GUID: [u8; 16] = ESP_TYPE.to_gpt_bytes();
/// The fixed disk GUID of hawser test ESP disks.
const DISK_GUID: Guid = Guid::from_u128(0x6861_7773_6572_4553_8000_4553_5044_4953);
/// The fixed unique GUID of the ESP on those disks.
const PARTITION_GUID: Guid = Guid::from_u128(0x6861_7773_6572_4553_8001_4553_5050_4152);
/// The FAT volume id ("HAWS").
const VOLUME_ID: u32 = 0x4841_5753;
/// 1980-01-01T00:00:00Z, the FAT epoch: the time stamped on every ESP file and directory.
const FAT_EPOCH: u64 = 315_532_800;

/// Builds a GPT disk image at `image` holding one FAT EFI System Partition with `files`.
/// Returns the image size in bytes.
pub fn build_esp_image(image: &Path, files: &[EspFile]) -> Result<u64, QemuError> {
    let spec = GptDiskSpec {
        disk_guid: DISK_GUID,
        partitions: vec![PartitionSpec {
            label: ESP_LABEL,
            type_guid: ESP_TYPE,
            partuuid: PARTITION_GUID,
            content: PartitionContent::Fat(FatVolume {
                files,
                volume_id: VOLUME_ID,
                volume_label: ESP_VOLUME_LABEL,
                timestamp: FAT_EPOCH,
            }),
        }],
    };
    let built = disk::build_gpt_disk(&spec, image).map_err(|error| match error {
        DiskError::ToolMissing { tool, .. } => QemuError::HostToolMissing {
            binary: tool.to_owned(),
            package: debian_package_for(tool),
        },
        source => QemuError::Esp {
            image: image.to_path_buf(),
            source,
        },
    })?;
    tracing::debug!(image = %image.display(), bytes = built.bytes, files = files.len(), "built ESP image");
    Ok(built.bytes)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use sha2::{Digest, Sha256};

    use super::*;

    const SECTOR: u64 = 512;
    const GPT_ENTRY_SECTORS: u64 = 32;
    const PARTITION_START_LBA: u64 = 2048;

    fn u64_at(bytes: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
    }

    fn u32_at(bytes: &[u8], offset: usize) -> u32 {
        u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
    }

    /// The IEEE CRC-32 that GPT uses, written out here on purpose to check the tables
    /// independently of the crates that write (gptman) and read (`hawser_disk_format::gpt`)
    /// them.
    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn esp_type_guid_has_the_on_disk_byte_order() {
        // As written by fdisk/sgdisk: 28 73 2a c1 1f f8 d2 11 ba 4b 00 a0 c9 3e c9 3b.
        assert_eq!(
            ESP_TYPE_GUID,
            [
                0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e,
                0xc9, 0x3b
            ]
        );
    }

    #[test]
    fn invalid_esp_paths_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = build_esp_image(
            &dir.path().join("esp.img"),
            &[EspFile::new("EFI/../x", "/dev/null")],
        )
        .unwrap_err();
        let chain = hawser_attestation::error_chain(&error);
        assert!(chain.contains("EFI/../x"), "{chain}");
        let error = build_esp_image(
            &dir.path().join("esp.img"),
            &[EspFile::default_boot_loader(dir.path().join("missing.efi"))],
        )
        .unwrap_err();
        let chain = hawser_attestation::error_chain(&error);
        assert!(chain.contains("missing.efi"), "{chain}");
    }

    #[test]
    fn esp_image_is_a_valid_gpt_disk_whose_fat_holds_the_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let loader = dir.path().join("loader.efi");
        let loader_bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&loader, &loader_bytes).expect("write loader");
        let conf = dir.path().join("loader.conf");
        std::fs::write(&conf, "timeout 0\n").expect("write conf");
        let image = dir.path().join("esp.img");
        let size = build_esp_image(
            &image,
            &[
                EspFile::default_boot_loader(&loader),
                EspFile::new("loader/loader.conf", &conf),
            ],
        )
        .expect("build");
        let disk = std::fs::read(&image).expect("read image");
        assert_eq!(disk.len() as u64, size);
        let total_sectors = size / SECTOR;

        // The tables OVMF measures into PCR 5 (MBR + primary GPT, and the backup GPT) are the
        // ones the reference measurements were taken with: they depend only on the partition
        // size, 64 MiB for these files.
        assert_eq!(
            hex::encode(Sha256::digest(&disk[..34 * SECTOR as usize])),
            "5c0706f9ca2ca9450ba3a10898c5db182f13a4ab87de23a3483664cc0f39a09d"
        );
        assert_eq!(
            hex::encode(Sha256::digest(&disk[disk.len() - 33 * SECTOR as usize..])),
            "4754efb91abe1e6be6dc51b48010887c9f9fb594f542be764f3de9c1fa67174c"
        );

        // Protective MBR.
        assert_eq!(&disk[510..512], &[0x55, 0xAA]);
        assert_eq!(disk[446 + 4], 0xEE);

        // Primary and backup headers agree and carry valid CRCs.
        let primary = &disk[512..1024];
        let backup = &disk[((total_sectors - 1) * SECTOR) as usize..];
        for (header, my_lba, entries_lba) in [
            (primary, 1, 2),
            (
                backup,
                total_sectors - 1,
                total_sectors - 1 - GPT_ENTRY_SECTORS,
            ),
        ] {
            assert_eq!(&header[0..8], b"EFI PART");
            let mut copy = header[..92].to_vec();
            copy[16..20].fill(0);
            assert_eq!(crc32(&copy), u32_at(header, 16), "header CRC");
            assert_eq!(u64_at(header, 24), my_lba);
            assert_eq!(u64_at(header, 72), entries_lba);
            let entries_start = (entries_lba * SECTOR) as usize;
            let entries = &disk[entries_start..entries_start + 128 * 128];
            assert_eq!(crc32(entries), u32_at(header, 88), "entries CRC");
            assert_eq!(&entries[0..16], &ESP_TYPE_GUID);
            assert_eq!(u64_at(entries, 32), PARTITION_START_LBA);
            assert!(
                u64_at(entries, 40) <= u64_at(header, 48),
                "partition ends past last usable LBA"
            );
        }

        // The FAT inside the partition passes fsck and has the files with their contents.
        let first = u64_at(&disk[1024..], 32);
        let last = u64_at(&disk[1024..], 40);
        let partition_image = dir.path().join("partition.img");
        std::fs::write(
            &partition_image,
            &disk[(first * SECTOR) as usize..((last + 1) * SECTOR) as usize],
        )
        .expect("write partition");
        let fsck = Command::new("fsck.vfat")
            .arg("-n")
            .arg(&partition_image)
            .output()
            .expect("run fsck.vfat (dosfstools)");
        assert!(
            fsck.status.success(),
            "fsck.vfat: {}{}",
            String::from_utf8_lossy(&fsck.stdout),
            String::from_utf8_lossy(&fsck.stderr)
        );
        let read_back = |path: &str| {
            let output = Command::new("mtype")
                .env("MTOOLSRC", "/dev/null")
                .env("MTOOLS_SKIP_CHECK", "1")
                .arg("-i")
                .arg(&partition_image)
                .arg(format!("::{path}"))
                .output()
                .expect("run mtype (mtools)");
            assert!(
                output.status.success(),
                "mtype {path}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            output.stdout
        };
        assert!(
            read_back("EFI/BOOT/BOOTX64.EFI") == loader_bytes,
            "BOOTX64.EFI content differs"
        );
        assert_eq!(read_back("loader/loader.conf"), b"timeout 0\n");
    }

    #[test]
    fn esp_image_is_reproducible() {
        // Built at different times, from files with different mtimes.
        let dir = tempfile::tempdir().expect("tempdir");
        let loader = dir.path().join("a.efi");
        std::fs::write(&loader, b"MZ not really a PE").expect("write");
        let first = dir.path().join("1.img");
        let second = dir.path().join("2.img");
        build_esp_image(&first, &[EspFile::default_boot_loader(&loader)]).expect("build 1");
        std::thread::sleep(std::time::Duration::from_millis(2100));
        std::fs::write(&loader, b"MZ not really a PE").expect("rewrite");
        build_esp_image(&second, &[EspFile::default_boot_loader(&loader)]).expect("build 2");
        let (first, second) = (
            std::fs::read(first).expect("read"),
            std::fs::read(second).expect("read"),
        );
        assert!(first == second, "two builds of the same ESP differ");
    }
}
