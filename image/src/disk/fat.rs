//! The FAT32 volumes (the ESP), made by the reference tools: `mkfs.vfat` (dosfstools) and
//! `mmd`/`mcopy` (mtools) at the partition's offset in the image.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::plan::Planned;
use super::{ALIGNMENT, DiskError, FatVolume, MIB, SECTOR_SIZE};
use crate::tool;

/// UEFI asks for FAT32 on fixed disks; FAT32 needs 65525 clusters, i.e. 32 MiB with 512-byte
/// clusters. The image is sparse, so unused room costs nothing locally.
const MIN_FAT_BYTES: u64 = 64 * MIB;
/// The largest file FAT32 can hold.
const FAT_MAX_FILE_BYTES: u64 = u32::MAX as u64;
/// FAT time stamps run from 1980-01-01T00:00:00Z …
const FAT_EPOCH_MIN: u64 = 315_532_800;
/// … to 2107-12-31T23:59:58Z.
const FAT_EPOCH_MAX: u64 = 4_354_819_198;
/// A FAT volume label is at most 11 bytes.
const FAT_LABEL_MAX: usize = 11;

/// The ESP's path components, validated.
fn fat_components(path: &str) -> Option<Vec<&str>> {
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

/// The size of a FAT partition for `volume`: its files with cluster rounding (clusters of up
/// to 64 KiB) and a directory entry each, 5% and 4 MiB of room, at least 64 MiB, in MiB.
pub(super) fn fat_partition_bytes(volume: &FatVolume, out: &Path) -> Result<u64, DiskError> {
    let invalid = |reason: String| DiskError::InvalidLayout {
        image: out.to_path_buf(),
        reason,
    };
    if volume.volume_label.is_empty()
        || volume.volume_label.len() > FAT_LABEL_MAX
        || !volume
            .volume_label
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || " -_".contains(c))
    {
        return Err(invalid(format!(
            "FAT volume label {:?} must be 1 to {FAT_LABEL_MAX} upper-case ASCII letters, digits, ' ', '-' or '_'",
            volume.volume_label
        )));
    }
    let mut content_bytes = 0u64;
    for file in volume.files {
        if fat_components(&file.path).is_none() {
            return Err(invalid(format!(
                "{:?} is not a valid path on the ESP",
                file.path
            )));
        }
        let length = std::fs::metadata(&file.source)
            .map_err(|source| DiskError::Input {
                role: "ESP file",
                path: file.source.clone(),
                source,
            })?
            .len();
        if length > FAT_MAX_FILE_BYTES {
            return Err(DiskError::TooLarge {
                role: "ESP file",
                path: file.source.clone(),
                bytes: length,
                limit: FAT_MAX_FILE_BYTES,
                reason: "a FAT32 file can hold",
            });
        }
        content_bytes += length.div_ceil(64 * 1024) * 64 * 1024 + 64 * 1024;
    }
    Ok((content_bytes + content_bytes / 20 + 4 * MIB)
        .max(MIN_FAT_BYTES)
        .div_ceil(ALIGNMENT)
        * ALIGNMENT)
}

/// Formats the partition as FAT32 and copies the files in, with mtools addressing the
/// partition as `image@@offset`.
pub(super) fn make_fat(
    volume: &FatVolume,
    partition: &Planned,
    image: &Path,
) -> Result<(), DiskError> {
    let mkfs = find_tool("mkfs.vfat", "dosfstools")?;
    let mcopy = find_tool("mcopy", "mtools")?;
    let mmd = find_tool("mmd", "mtools")?;

    let partition_bytes = partition.sectors * SECTOR_SIZE;
    let mut format = Command::new(&mkfs);
    format
        .args(["-F", "32", "--invariant", "-i"])
        .arg(format!("{:08X}", volume.volume_id))
        .args(["-n", volume.volume_label])
        .arg("-s")
        .arg(fat32_sectors_per_cluster(partition_bytes).to_string())
        .arg(format!("--offset={}", partition.first_lba))
        .arg(image)
        .arg((partition_bytes / 1024).to_string());
    run_tool(format, image)?;

    let mut target = image.as_os_str().to_owned();
    target.push(format!("@@{}", partition.first_lba * SECTOR_SIZE));
    let timestamp = volume.timestamp.clamp(FAT_EPOCH_MIN, FAT_EPOCH_MAX);
    // The image has no CHS geometry, so mtools' geometry check is skipped; no user or system
    // mtools.conf may change the result; new entries get SOURCE_DATE_EPOCH, in UTC.
    let mtools = |binary: &Path| {
        let mut command = Command::new(binary);
        command
            .env("MTOOLS_SKIP_CHECK", "1")
            .env("MTOOLSRC", "/dev/null")
            .env("SOURCE_DATE_EPOCH", timestamp.to_string())
            .env("TZ", "UTC")
            .arg("-i")
            .arg(&target);
        command
    };
    let mut made_dirs = BTreeSet::new();
    for file in volume.files {
        let parts = fat_components(&file.path).ok_or_else(|| DiskError::InvalidLayout {
            image: image.to_path_buf(),
            reason: format!("{:?} is not a valid path on the ESP", file.path),
        })?;
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
    Ok(())
}

/// The FAT32 cluster size for a volume of `bytes`, in 512-byte sectors, after Microsoft's
/// table (FAT32 needs at least 65525 clusters). Passed to mkfs.fat explicitly: with `--offset`
/// it sizes clusters by the whole image file, not the partition, and on a disk much larger than
/// its ESP chooses clusters too large for FAT32 (which mtools then cannot read).
fn fat32_sectors_per_cluster(bytes: u64) -> u64 {
    const GIB: u64 = 1024 * MIB;
    // (largest volume, cluster size in bytes)
    let table = [
        (260 * MIB, 512),
        (8 * GIB, 4096),
        (16 * GIB, 8192),
        (32 * GIB, 16384),
    ];
    let cluster_bytes = table
        .iter()
        .find(|(largest, _)| bytes <= *largest)
        .map_or(32768, |(_, cluster)| *cluster);
    cluster_bytes / SECTOR_SIZE
}

/// Finds a host tool ([`crate::locate_tool`]); missing, it is a [`DiskError::ToolMissing`]
/// naming its Debian package.
fn find_tool(tool: &'static str, package: &'static str) -> Result<PathBuf, DiskError> {
    crate::locate_tool(tool).ok_or(DiskError::ToolMissing { tool, package })
}

/// Runs a dosfstools/mtools command on `image`; a failure carries its command line and output.
fn run_tool(mut command: Command, image: &Path) -> Result<(), DiskError> {
    tool::run_tool(&mut command)
        .map(drop)
        .map_err(|source| DiskError::Tool {
            image: image.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;
    use crate::disk::EspFile;

    #[test]
    fn invalid_fat_paths_are_refused() {
        assert_eq!(
            fat_components("\\EFI\\BOOT\\BOOTX64.EFI"),
            Some(vec!["EFI", "BOOT", "BOOTX64.EFI"])
        );
        assert_eq!(fat_components("../x"), None);
        assert_eq!(fat_components("/"), None);
        assert_eq!(fat_components("a/\u{7}b"), None);
    }

    #[test]
    fn fat_partitions_are_at_least_64_mib_and_whole_mib() {
        let dir = tempfile::tempdir().expect("tempdir");
        let small = dir.path().join("small");
        std::fs::write(&small, b"x").expect("write");
        let big = dir.path().join("big");
        File::create(&big)
            .and_then(|f| f.set_len(100 * MIB + 1))
            .expect("sparse file");
        let volume = |files| FatVolume {
            files,
            volume_id: 1,
            volume_label: "X",
            timestamp: 0,
        };
        let out = Path::new("/x.img");
        let files = [EspFile::new("a", &small)];
        assert_eq!(fat_partition_bytes(&volume(&files), out).unwrap(), 64 * MIB);
        let files = [EspFile::new("a", &big)];
        let bytes = fat_partition_bytes(&volume(&files), out).unwrap();
        assert_eq!(bytes % MIB, 0);
        assert!(bytes >= 105 * MIB, "{bytes}");
        let files = [EspFile::new("a", &small)];
        let mut lower_case = volume(&files);
        lower_case.volume_label = "esp";
        let error = fat_partition_bytes(&lower_case, out).unwrap_err();
        assert!(error.to_string().contains("\"esp\""), "{error}");
    }
}
