//! The bootable disk image: a GPT disk with the ESP, the root partition and its dm-verity tree.
//!
//! ```text
//!   LBA 0        protective MBR
//!   LBA 1..33    primary GPT (header + 128 entries)
//!   1 MiB        (1) ESP, FAT32, \EFI\BOOT\BOOTX64.EFI = the UKI     type C12A7328-…-00A0C93EC93B
//!                (2) hawser-root: the erofs image, byte for byte      type root-x86-64
//!                (3) hawser-root-verity: its dm-verity hash tree      type root-x86-64-verity
//!   last 1 MiB   backup GPT (entries + header in the last 33 sectors)
//! ```
//!
//! Firmware finds the ESP by its type GUID and, with no boot entries in a fresh variable store,
//! boots the removable-media path `\EFI\BOOT\BOOTX64.EFI`. PID 1 finds the root and verity
//! partitions by their PARTUUIDs, which are the two halves of the dm-verity root hash
//! ([`root_partuuids`], systemd-repart's convention). The root hash itself is on the measured
//! kernel command line, so the partition table needs no trust: a disk whose partitions do not
//! carry the measured hash's halves, or whose tree does not verify against it, does not boot.
//!
//! The image is a pure function of its inputs: the disk GUID, the ESP's PARTUUID and its FAT
//! volume id are derived from the root hash, FAT file times are `SOURCE_DATE_EPOCH` (through
//! mtools; the volume-label entry mkfs.fat writes is fixed by `--invariant`), every partition is
//! aligned to 1 MiB and the disk size is a whole number of MiB. The GPT is written with
//! [`gptman`] from fixed GUIDs, with the partition types and GUID byte order of
//! [`hawser_disk_format`] (the tests read what is written back with its reader, PID 1's); the
//! FAT is made by the reference tools, `mkfs.vfat` (dosfstools) and `mmd`/`mcopy` (mtools), at
//! the partition's offset. (The pure-Rust `fatfs` 0.3 writes long-name entries for `.` and `..`,
//! which `fsck.fat` rejects.)
//!
//! The file is raw and sparse. Clouds take it as it is (AWS imports a RAW snapshot) or
//! wrapped, losslessly: `hawser image build --platform gce|azure` writes GCE's `disk.raw` in a
//! gzip'd GNU tar and Azure's fixed VHD next to it ([`crate::export`]); for OpenStack or libvirt,
//! `qemu-img convert -f raw -O qcow2 disk.raw disk.qcow2`.
//!
//! [`build_gpt_disk`] is the general builder (any partitions, each a FAT volume or a file's
//! bytes); [`build_disk_image`] is the hawser layout on top of it. The QEMU harness builds its
//! ESP-only test disks with [`build_gpt_disk`] too.
//!
//! The code: this module has the types and the hawser layout; `gpt` plans and writes the disk,
//! `fat` makes the FAT volumes with dosfstools/mtools, `plan` is the planned partition both
//! use, `verity_tree` checks the root hash.

use std::io;
use std::path::{Path, PathBuf};

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::{
    ESP_TYPE, ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE, root_partuuids,
};
use hawser_disk_format::verity;
use sha2::{Digest, Sha256};

use crate::tool::{IoError, ToolError, io_error};

mod fat;
mod gpt;
mod plan;
mod verity_tree;

pub use gpt::build_gpt_disk;
pub use verity_tree::verity_root_hash;

/// The logical sector size of the image.
pub const SECTOR_SIZE: u64 = 512;
pub(crate) const MIB: u64 = 1024 * 1024;
/// Partitions start and end on 1 MiB boundaries, as partitioning tools and clouds expect.
pub const ALIGNMENT: u64 = MIB;
/// The first partition starts at 1 MiB; the last MiB holds the backup GPT.
pub(crate) const FIRST_PARTITION_LBA: u64 = ALIGNMENT / SECTOR_SIZE;
pub(crate) const TAIL_SECTORS: u64 = ALIGNMENT / SECTOR_SIZE;
/// The path firmware boots from an ESP when no boot entry says otherwise.
pub const BOOT_LOADER_PATH: &str = "EFI/BOOT/BOOTX64.EFI";
/// GPT name of the ESP.
pub const ESP_LABEL: &str = "EFI System Partition";
/// FAT volume label of hawser's ESPs.
pub const ESP_VOLUME_LABEL: &str = "HAWSER ESP";
/// GPT name of the root partition.
pub const ROOT_LABEL: &str = "hawser-root";
/// GPT name of the verity partition.
pub const VERITY_LABEL: &str = "hawser-root-verity";

/// A random-looking (RFC 4122 version 4) GUID derived from `purpose` and `seed`, so that the
/// same seed always gives the same GUID and different purposes different ones.
pub fn derive_guid(purpose: &str, seed: &[u8]) -> Guid {
    let digest = Sha256::new()
        .chain_update(b"hawser disk guid\0")
        .chain_update(purpose.as_bytes())
        .chain_update(b"\0")
        .chain_update(seed)
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Guid::version_4(bytes)
}

/// A file to put on a FAT volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EspFile {
    /// Path inside the volume, `/` or `\` separated, e.g. `EFI/BOOT/BOOTX64.EFI`.
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

    /// The file at the removable-media boot path firmware boots by default.
    pub fn default_boot_loader(source: impl Into<PathBuf>) -> Self {
        EspFile::new(BOOT_LOADER_PATH, source)
    }
}

/// A FAT32 volume to create in a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FatVolume<'a> {
    /// Its files; directories are created as needed.
    pub files: &'a [EspFile],
    /// The volume serial number.
    pub volume_id: u32,
    /// The volume label (at most 11 bytes).
    pub volume_label: &'a str,
    /// Time stamp of every file and directory, seconds since the Unix epoch, clamped to the
    /// range FAT can store (1980 to 2107).
    pub timestamp: u64,
}

/// What a partition holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionContent<'a> {
    /// A FAT32 file system made with these files, sized to fit them (at least 64 MiB).
    Fat(FatVolume<'a>),
    /// This file's bytes, followed by zeros up to the next 1 MiB boundary.
    File(&'a Path),
}

/// One partition of a [`GptDiskSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpec<'a> {
    /// The GPT partition name (at most 36 UTF-16 code units).
    pub label: &'a str,
    /// The partition type.
    pub type_guid: Guid,
    /// The unique partition GUID (PARTUUID).
    pub partuuid: Guid,
    /// The content.
    pub content: PartitionContent<'a>,
}

/// A GPT disk to build: partitions in this order, each 1 MiB-aligned, back to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptDiskSpec<'a> {
    /// The disk GUID.
    pub disk_guid: Guid,
    /// The partitions, numbered from 1 in this order.
    pub partitions: Vec<PartitionSpec<'a>>,
}

/// The inputs of the hawser disk image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskLayout<'a> {
    /// The UKI, installed as `\EFI\BOOT\BOOTX64.EFI` on the ESP.
    pub uki: &'a Path,
    /// The root file system image (erofs).
    pub rootfs: &'a Path,
    /// Its dm-verity hash tree, with superblock (`veritysetup format` output).
    pub verity: &'a Path,
    /// The dm-verity root hash of `verity` over `rootfs`; checked before anything is written.
    pub root_hash: [u8; 32],
    /// Time stamp of the files on the ESP.
    pub source_date_epoch: u64,
}

/// A partition of a built disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The GPT partition name.
    pub name: String,
    /// The partition type.
    pub type_guid: Guid,
    /// The unique partition GUID (PARTUUID).
    pub partuuid: Guid,
    /// The first sector.
    pub first_lba: u64,
    /// The last sector (inclusive).
    pub last_lba: u64,
}

impl PartitionInfo {
    /// The byte offset of the partition in the image.
    pub fn offset(&self) -> u64 {
        self.first_lba * SECTOR_SIZE
    }

    /// The partition's size in bytes.
    pub fn bytes(&self) -> u64 {
        (self.last_lba + 1 - self.first_lba) * SECTOR_SIZE
    }
}

/// A built disk image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskImage {
    /// The raw image file.
    pub path: PathBuf,
    /// Its size in bytes (a whole number of MiB).
    pub bytes: u64,
    /// The disk GUID.
    pub disk_guid: Guid,
    /// The partitions, in table order (partition number = index + 1).
    pub partitions: Vec<PartitionInfo>,
}

/// Why a disk image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// An input file could not be read.
    #[error("cannot read the {role} {path}")]
    Input {
        role: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An input file is empty.
    #[error("the {role} {path} is empty")]
    EmptyInput { role: &'static str, path: PathBuf },
    /// An input is larger than its place allows.
    #[error("the {role} {path} is {bytes} bytes, more than the {limit} bytes {reason}")]
    TooLarge {
        role: &'static str,
        path: PathBuf,
        bytes: u64,
        limit: u64,
        reason: &'static str,
    },
    /// The dm-verity tree's superblock is missing or not one `veritysetup format` writes.
    #[error("the dm-verity hash tree {verity} has a superblock hawser cannot use")]
    VeritySuperblock {
        verity: PathBuf,
        #[source]
        source: verity::SuperblockError,
    },
    /// The dm-verity tree does not match the root file system or root hash.
    #[error(
        "the dm-verity hash tree {verity} does not fit the root file system {rootfs}: {reason}"
    )]
    Verity {
        verity: PathBuf,
        rootfs: PathBuf,
        reason: String,
    },
    /// The block the root hash is computed from could not be read.
    #[error("cannot read the top hash block at offset {offset} of {path}")]
    TopHashBlock {
        path: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// The disk description is inconsistent (names, GUIDs, paths on the ESP).
    #[error("invalid disk layout for {image}: {reason}")]
    InvalidLayout { image: PathBuf, reason: String },
    /// A host tool the builder runs is not installed. (A variant of its own, not a
    /// [`ToolError::Missing`] under [`DiskError::Tool`]: callers such as the QEMU harness
    /// match on it to skip rather than fail.)
    #[error(
        "`{tool}` was not found in PATH, /usr/sbin or /sbin; install the Debian package `{package}`"
    )]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    /// mkfs.vfat or mtools failed while making a FAT volume in the image.
    #[error("making a FAT volume in {image} failed")]
    Tool {
        image: PathBuf,
        #[source]
        source: ToolError,
    },
    /// The partition table could not be written.
    #[error("writing the partition table of {image} failed")]
    Gpt {
        image: PathBuf,
        #[source]
        source: gptman::Error,
    },
    /// The output could not be written.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Builds the hawser disk image at `out`: ESP with the UKI, root, verity.
///
/// Before writing anything it checks that `root_hash` is the dm-verity root hash of `verity`
/// over `rootfs`, since the PARTUUIDs (and the booted command line) are derived from it. The
/// image is written under a temporary name next to `out` and renamed when complete.
pub fn build_disk_image(layout: &DiskLayout, out: &Path) -> Result<DiskImage, DiskError> {
    let uki_bytes = std::fs::metadata(layout.uki)
        .map_err(|source| DiskError::Input {
            role: "UKI",
            path: layout.uki.to_path_buf(),
            source,
        })?
        .len();
    if uki_bytes == 0 {
        return Err(DiskError::EmptyInput {
            role: "UKI",
            path: layout.uki.to_path_buf(),
        });
    }
    let actual = verity_root_hash(layout.rootfs, layout.verity)?;
    if actual != layout.root_hash {
        return Err(DiskError::Verity {
            verity: layout.verity.to_path_buf(),
            rootfs: layout.rootfs.to_path_buf(),
            reason: format!(
                "its root hash is {}, not the expected {}",
                hex::encode(actual),
                hex::encode(layout.root_hash)
            ),
        });
    }
    let (root_uuid, verity_uuid) = root_partuuids(&layout.root_hash);
    let esp_files = [EspFile::default_boot_loader(layout.uki)];
    let volume_id_digest = Sha256::new()
        .chain_update(b"hawser esp volume id\0")
        .chain_update(layout.root_hash)
        .finalize();
    let volume_id = u32::from_be_bytes([
        volume_id_digest[0],
        volume_id_digest[1],
        volume_id_digest[2],
        volume_id_digest[3],
    ]);
    let spec = GptDiskSpec {
        disk_guid: derive_guid("disk", &layout.root_hash),
        partitions: vec![
            PartitionSpec {
                label: ESP_LABEL,
                type_guid: ESP_TYPE,
                partuuid: derive_guid("esp", &layout.root_hash),
                content: PartitionContent::Fat(FatVolume {
                    files: &esp_files,
                    volume_id,
                    volume_label: ESP_VOLUME_LABEL,
                    timestamp: layout.source_date_epoch,
                }),
            },
            PartitionSpec {
                label: ROOT_LABEL,
                type_guid: ROOT_X86_64_TYPE,
                partuuid: root_uuid,
                content: PartitionContent::File(layout.rootfs),
            },
            PartitionSpec {
                label: VERITY_LABEL,
                type_guid: ROOT_X86_64_VERITY_TYPE,
                partuuid: verity_uuid,
                content: PartitionContent::File(layout.verity),
            },
        ],
    };

    let file_name = out
        .file_name()
        .ok_or_else(|| DiskError::InvalidLayout {
            image: out.to_path_buf(),
            reason: "the output path has no file name".into(),
        })?
        .to_owned();
    let mut partial_name = file_name;
    partial_name.push(".partial");
    let partial = out.with_file_name(partial_name);
    let built = build_gpt_disk(&spec, &partial).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    std::fs::rename(&partial, out).map_err(io_error("rename the finished image to", out))?;
    tracing::info!(
        image = %out.display(),
        bytes = built.bytes,
        root_partuuid = %root_uuid,
        verity_partuuid = %verity_uuid,
        "built disk image"
    );
    Ok(DiskImage {
        path: out.to_path_buf(),
        ..built
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_guids_are_stable_version_4_and_distinct_per_purpose() {
        let disk = derive_guid("disk", b"seed");
        assert_eq!(disk, derive_guid("disk", b"seed"));
        assert_ne!(disk, derive_guid("esp", b"seed"));
        assert_ne!(disk, derive_guid("disk", b"other seed"));
        let text = disk.to_string();
        assert_eq!(&text[14..15], "4", "{text}");
        assert!("89ab".contains(&text[19..20]), "{text}");
    }
}
