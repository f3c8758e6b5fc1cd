//! ESP disk images: a GPT disk holding one EFI System Partition (FAT32).
//!
//! OVMF boots it like a real disk: it finds the ESP by its partition type, and with no boot
//! entries in a fresh variable store it boots the removable-media path
//! `\EFI\BOOT\BOOTX64.EFI`. A bare FAT image ("superfloppy") boots too, but a cloud VM's
//! disk is partitioned, and OVMF measures the GPT into PCR 5, so the test platform should
//! look like the real one.
//!
//! The GPT is written here (a few fixed structures); the FAT is made by the reference tools,
//! `mkfs.vfat` (dosfstools) and `mcopy` (mtools), working at the partition's offset. (The
//! pure-Rust `fatfs` 0.3 writes long-name entries for `.` and `..`, which `fsck.fat` rejects.)
//!
//! The image is deterministic: fixed disk and partition GUIDs, a fixed FAT volume id,
//! `--invariant` formatting and file times pinned with `SOURCE_DATE_EPOCH`. The same files
//! give the same bytes, hence the same PCR 5 from boot to boot.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::QemuError;
use crate::host::find_binary;

const SECTOR: u64 = 512;
/// The partition starts at 1 MiB, as partitioning tools align it.
const PARTITION_START_LBA: u64 = 2048;
/// Room after the partition for the backup GPT (33 sectors), rounded up to 1 MiB.
const TAIL_SECTORS: u64 = 2048;
const GPT_ENTRY_COUNT: u32 = 128;
const GPT_ENTRY_SIZE: u32 = 128;
const GPT_ENTRY_SECTORS: u64 = (GPT_ENTRY_COUNT as u64 * GPT_ENTRY_SIZE as u64) / SECTOR;
const MIB: u64 = 1024 * 1024;
/// The smallest partition built: FAT32 needs 65525 clusters (32 MiB with 512-byte clusters).
/// The image is sparse, so unused room costs nothing.
const MIN_PARTITION_BYTES: u64 = 64 * MIB;
/// 1980-01-01T00:00:00Z, the FAT epoch: the time stamped on every ESP file and directory.
const FAT_EPOCH: &str = "315532800";

/// The EFI System Partition type, C12A7328-F81F-11D2-BA4B-00A0C93EC93B.
pub const ESP_TYPE_GUID: [u8; 16] = guid(
    0xC12A_7328,
    0xF81F,
    0x11D2,
    [0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B],
);
/// The fixed disk GUID of hawser test ESP disks, 6861_7773-6572-4553-8000-455350444953.
const DISK_GUID: [u8; 16] = guid(
    0x6861_7773,
    0x6572,
    0x4553,
    [0x80, 0x00, 0x45, 0x53, 0x50, 0x44, 0x49, 0x53],
);
/// The fixed unique GUID of the ESP on those disks, 6861_7773-6572-4553-8001-455350504152.
const PARTITION_GUID: [u8; 16] = guid(
    0x6861_7773,
    0x6572,
    0x4553,
    [0x80, 0x01, 0x45, 0x53, 0x50, 0x50, 0x41, 0x52],
);
/// The FAT volume id ("HAWS").
const VOLUME_ID: &str = "48415753";

/// A GUID in its on-disk (mixed-endian) form.
const fn guid(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> [u8; 16] {
    let a = d1.to_le_bytes();
    let b = d2.to_le_bytes();
    let c = d3.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d4[0], d4[1], d4[2], d4[3], d4[4], d4[5],
        d4[6], d4[7],
    ]
}

/// A file to put on the ESP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EspFile {
    /// Path inside the ESP, `/` or `\` separated, e.g. `EFI/BOOT/BOOTX64.EFI`.
    pub path: String,
    /// The host file to copy.
    pub source: PathBuf,
}

impl EspFile {
    /// A file for the ESP.
    pub fn new(path: impl Into<String>, source: impl Into<PathBuf>) -> Self {
        EspFile {
            path: path.into(),
            source: source.into(),
        }
    }

    /// The file at the removable-media boot path OVMF boots by default.
    pub fn default_boot_loader(source: impl Into<PathBuf>) -> Self {
        EspFile::new("EFI/BOOT/BOOTX64.EFI", source)
    }
}

/// The IEEE CRC-32 that GPT uses.
pub(crate) fn crc32(data: &[u8]) -> u32 {
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

/// The ESP's path components, validated.
fn esp_components(path: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = path
        .split(['/', '\\'])
        .filter(|part| !part.is_empty())
        .collect();
    let valid = !parts.is_empty()
        && parts
            .iter()
            .all(|part| *part != "." && *part != ".." && !part.chars().any(char::is_control));
    valid.then_some(parts)
}

/// Builds a GPT disk image at `image` holding one FAT EFI System Partition with `files`.
/// Returns the image size in bytes.
pub fn build_esp_image(image: &Path, files: &[EspFile]) -> Result<u64, QemuError> {
    let esp_error = |reason: String| QemuError::Esp {
        image: image.to_path_buf(),
        reason,
    };
    let mut content_bytes = 0u64;
    for file in files {
        if esp_components(&file.path).is_none() {
            return Err(esp_error(format!(
                "{:?} is not a valid path on the ESP",
                file.path
            )));
        }
        let length = std::fs::metadata(&file.source)
            .map_err(|e| QemuError::io("read the size of", &file.source, e))?
            .len();
        // Cluster rounding (up to 64 KiB clusters) and directory entries.
        content_bytes += length.div_ceil(64 * 1024) * 64 * 1024 + 64 * 1024;
    }
    let partition_bytes = (content_bytes + content_bytes / 20 + 4 * MIB)
        .max(MIN_PARTITION_BYTES)
        .div_ceil(MIB)
        * MIB;
    let partition_sectors = partition_bytes / SECTOR;
    let total_sectors = PARTITION_START_LBA + partition_sectors + TAIL_SECTORS;

    let mkfs = find_binary(Path::new("mkfs.vfat"))?;
    let mcopy = find_binary(Path::new("mcopy"))?;
    let mmd = find_binary(Path::new("mmd"))?;

    let disk = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(image)
        .map_err(|e| QemuError::io("create", image, e))?;
    disk.set_len(total_sectors * SECTOR)
        .map_err(|e| QemuError::io("size", image, e))?;
    write_gpt(&disk, total_sectors, partition_sectors)
        .map_err(|e| QemuError::io("write the partition table of", image, e))?;
    disk.sync_all()
        .map_err(|e| QemuError::io("sync", image, e))?;
    drop(disk);

    let mut format = Command::new(&mkfs);
    format
        .args([
            "-F",
            "32",
            "--invariant",
            "-i",
            VOLUME_ID,
            "-n",
            "HAWSER ESP",
        ])
        .arg(format!("--offset={PARTITION_START_LBA}"))
        .arg(image)
        .arg((partition_bytes / 1024).to_string());
    run_tool(format, image)?;

    // mtools addresses the partition as `image@@offset`; the image has no CHS geometry, so
    // its geometry check is skipped, and no user or system mtools.conf may change the result.
    let mut target = image.as_os_str().to_owned();
    target.push(format!("@@{}", PARTITION_START_LBA * SECTOR));
    let mtools = |binary: &Path| {
        let mut command = Command::new(binary);
        command
            .env("MTOOLS_SKIP_CHECK", "1")
            .env("MTOOLSRC", "/dev/null")
            .env("SOURCE_DATE_EPOCH", FAT_EPOCH)
            .env("TZ", "UTC")
            .arg("-i")
            .arg(&target);
        command
    };
    let mut made_dirs = BTreeSet::new();
    for file in files {
        let parts = esp_components(&file.path)
            .ok_or_else(|| esp_error(format!("{:?} is not a valid path on the ESP", file.path)))?;
        for depth in 1..parts.len() {
            let dir = parts[..depth].join("/");
            if made_dirs.insert(dir.clone()) {
                let mut command = mtools(&mmd);
                command.arg(format!("::{dir}"));
                run_tool(command, image)?;
            }
        }
        let mut command = mtools(&mcopy);
        command
            .arg("-o")
            .arg(&file.source)
            .arg(format!("::{}", parts.join("/")));
        run_tool(command, image)?;
    }
    tracing::debug!(image = %image.display(), bytes = total_sectors * SECTOR, files = files.len(), "built ESP image");
    Ok(total_sectors * SECTOR)
}

/// Runs a dosfstools/mtools command; a failure carries its stderr.
fn run_tool(mut command: Command, image: &Path) -> Result<(), QemuError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| QemuError::Spawn {
            binary: program.clone(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let args: Vec<String> = command
        .get_args()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    Err(QemuError::Esp {
        image: image.to_path_buf(),
        reason: format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    })
}

fn write_gpt(disk: &File, total_sectors: u64, partition_sectors: u64) -> io::Result<()> {
    let last_lba = total_sectors - 1;

    // Protective MBR: one partition of type 0xEE covering the disk.
    let mut mbr = [0u8; SECTOR as usize];
    let mbr_size = u32::try_from(total_sectors - 1).unwrap_or(u32::MAX);
    mbr[446..462].copy_from_slice(&[
        0x00, 0x00, 0x02, 0x00, 0xEE, 0xFF, 0xFF, 0xFF, 1, 0, 0, 0, 0, 0, 0, 0,
    ]);
    mbr[458..462].copy_from_slice(&mbr_size.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    disk.write_all_at(&mbr, 0)?;

    let mut entries = vec![0u8; (GPT_ENTRY_COUNT * GPT_ENTRY_SIZE) as usize];
    let entry = &mut entries[..GPT_ENTRY_SIZE as usize];
    entry[0..16].copy_from_slice(&ESP_TYPE_GUID);
    entry[16..32].copy_from_slice(&PARTITION_GUID);
    entry[32..40].copy_from_slice(&PARTITION_START_LBA.to_le_bytes());
    entry[40..48].copy_from_slice(&(PARTITION_START_LBA + partition_sectors - 1).to_le_bytes());
    for (i, unit) in "EFI System Partition".encode_utf16().enumerate() {
        entry[56 + 2 * i..58 + 2 * i].copy_from_slice(&unit.to_le_bytes());
    }
    let entries_crc = crc32(&entries);

    let header = |my_lba: u64, alternate_lba: u64, entries_lba: u64| {
        let mut header = [0u8; SECTOR as usize];
        header[0..8].copy_from_slice(b"EFI PART");
        header[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        header[12..16].copy_from_slice(&92u32.to_le_bytes());
        header[24..32].copy_from_slice(&my_lba.to_le_bytes());
        header[32..40].copy_from_slice(&alternate_lba.to_le_bytes());
        header[40..48].copy_from_slice(&(2 + GPT_ENTRY_SECTORS).to_le_bytes());
        header[48..56].copy_from_slice(&(last_lba - 1 - GPT_ENTRY_SECTORS).to_le_bytes());
        header[56..72].copy_from_slice(&DISK_GUID);
        header[72..80].copy_from_slice(&entries_lba.to_le_bytes());
        header[80..84].copy_from_slice(&GPT_ENTRY_COUNT.to_le_bytes());
        header[84..88].copy_from_slice(&GPT_ENTRY_SIZE.to_le_bytes());
        header[88..92].copy_from_slice(&entries_crc.to_le_bytes());
        let header_crc = crc32(&header[..92]);
        header[16..20].copy_from_slice(&header_crc.to_le_bytes());
        header
    };
    let backup_entries_lba = last_lba - GPT_ENTRY_SECTORS;
    disk.write_all_at(&header(1, last_lba, 2), SECTOR)?;
    disk.write_all_at(&entries, 2 * SECTOR)?;
    disk.write_all_at(&entries, backup_entries_lba * SECTOR)?;
    disk.write_all_at(&header(last_lba, 1, backup_entries_lba), last_lba * SECTOR)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64_at(bytes: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
    }

    fn u32_at(bytes: &[u8], offset: usize) -> u32 {
        u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
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
        assert_eq!(
            esp_components("\\EFI\\BOOT\\BOOTX64.EFI"),
            Some(vec!["EFI", "BOOT", "BOOTX64.EFI"])
        );
        assert_eq!(esp_components("../x"), None);
        assert_eq!(esp_components("/"), None);
        let dir = tempfile::tempdir().expect("tempdir");
        let error = build_esp_image(
            &dir.path().join("esp.img"),
            &[EspFile::new("EFI/../x", "/dev/null")],
        )
        .unwrap_err();
        assert!(error.to_string().contains("EFI/../x"), "{error}");
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
