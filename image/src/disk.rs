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
//! The file is raw and sparse. Clouds take it converted, losslessly:
//! `qemu-img convert -f raw -O vpc -o subformat=fixed,force_size disk.raw disk.vhd` (Azure, which
//! wants a virtual size that is a whole number of MiB: it is), `qemu-img convert -f raw -O qcow2
//! disk.raw disk.qcow2` (OpenStack, libvirt), or the raw file as `disk.raw` in a tar (GCP).
//!
//! [`build_gpt_disk`] is the general builder (any partitions, each a FAT volume or a file's
//! bytes); [`build_disk_image`] is the hawser layout on top of it. The QEMU harness builds its
//! ESP-only test disks with [`build_gpt_disk`] too.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::{
    self, ESP_TYPE, ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE, root_partuuids,
};
use hawser_disk_format::verity::{self, VeritySuperblock};
use sha2::{Digest, Sha256};

/// The logical sector size of the image.
pub const SECTOR_SIZE: u64 = 512;
const MIB: u64 = 1024 * 1024;
/// Partitions start and end on 1 MiB boundaries, as partitioning tools and clouds expect.
pub const ALIGNMENT: u64 = MIB;
/// The first partition starts at 1 MiB; the last MiB holds the backup GPT.
const FIRST_PARTITION_LBA: u64 = ALIGNMENT / SECTOR_SIZE;
const TAIL_SECTORS: u64 = ALIGNMENT / SECTOR_SIZE;
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
    #[error("cannot read the {role} {path}: {source}")]
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
    /// The disk description is inconsistent (names, GUIDs, paths on the ESP).
    #[error("invalid disk layout for {image}: {reason}")]
    InvalidLayout { image: PathBuf, reason: String },
    /// A host tool the builder runs is not installed.
    #[error(
        "`{tool}` was not found in PATH, /usr/sbin or /sbin; install the Debian package `{package}`"
    )]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    /// A host tool could not be started.
    #[error("could not start `{tool}`: {source}")]
    Spawn {
        tool: String,
        #[source]
        source: io::Error,
    },
    /// A host tool failed.
    #[error("`{command}` failed on {image} ({status}): {stderr}")]
    Tool {
        command: String,
        image: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    /// The partition table could not be written.
    #[error("writing the partition table of {image} failed: {source}")]
    Gpt {
        image: PathBuf,
        #[source]
        source: gptman::Error,
    },
    /// The output could not be written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> DiskError {
    let path = path.to_path_buf();
    move |source| DiskError::Io {
        action,
        path,
        source,
    }
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

/// A partition with its place on the disk, before anything is written.
struct Planned<'s, 'a> {
    spec: &'s PartitionSpec<'a>,
    first_lba: u64,
    sectors: u64,
    /// For a file partition: the file's length.
    content_bytes: u64,
}

/// Builds a GPT disk at `out` (replacing it) from `spec`: protective MBR, primary and backup
/// GPT, and each partition's content.
pub fn build_gpt_disk(spec: &GptDiskSpec, out: &Path) -> Result<DiskImage, DiskError> {
    let invalid = |reason: String| DiskError::InvalidLayout {
        image: out.to_path_buf(),
        reason,
    };
    if out
        .as_os_str()
        .as_encoded_bytes()
        .windows(2)
        .any(|w| w == b"@@")
    {
        // mtools reads `image@@offset`: such a path would be cut.
        return Err(invalid("the output path contains \"@@\"".into()));
    }
    if spec.partitions.is_empty() {
        return Err(invalid("a disk needs at least one partition".into()));
    }
    if spec.disk_guid.is_nil() {
        return Err(invalid("the disk GUID is all zeros".into()));
    }
    let mut partuuids = BTreeSet::new();
    for partition in &spec.partitions {
        if partition.label.encode_utf16().count() > gpt::NAME_UNITS {
            return Err(invalid(format!(
                "partition name {:?} is longer than {} UTF-16 code units",
                partition.label,
                gpt::NAME_UNITS
            )));
        }
        if partition.type_guid.is_nil() || partition.partuuid.is_nil() {
            return Err(invalid(format!(
                "partition {:?} has an all-zero type or unique GUID",
                partition.label
            )));
        }
        if !partuuids.insert(partition.partuuid) {
            return Err(invalid(format!(
                "PARTUUID {} is given twice",
                partition.partuuid
            )));
        }
    }

    // Plan: sizes from the inputs, every partition a whole number of MiB.
    let mut planned = Vec::with_capacity(spec.partitions.len());
    let mut next_lba = FIRST_PARTITION_LBA;
    for partition in &spec.partitions {
        let (content_bytes, bytes) = match &partition.content {
            PartitionContent::Fat(volume) => (0, fat_partition_bytes(volume, out)?),
            PartitionContent::File(path) => {
                let length = std::fs::metadata(path)
                    .map_err(|source| DiskError::Input {
                        role: partition.label_role(),
                        path: path.to_path_buf(),
                        source,
                    })?
                    .len();
                if length == 0 {
                    return Err(DiskError::EmptyInput {
                        role: partition.label_role(),
                        path: path.to_path_buf(),
                    });
                }
                (length, length.div_ceil(ALIGNMENT) * ALIGNMENT)
            }
        };
        let sectors = bytes / SECTOR_SIZE;
        planned.push(Planned {
            spec: partition,
            first_lba: next_lba,
            sectors,
            content_bytes,
        });
        next_lba += sectors;
    }
    let total_sectors = next_lba + TAIL_SECTORS;
    let total_bytes = total_sectors * SECTOR_SIZE;

    let mut disk = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(out)
        .map_err(io_error("create", out))?;
    disk.set_len(total_bytes)
        .map_err(io_error("set the size of", out))?;
    write_gpt(&mut disk, spec.disk_guid, &planned).map_err(|source| DiskError::Gpt {
        image: out.to_path_buf(),
        source,
    })?;

    for partition in &planned {
        if let PartitionContent::File(path) = &partition.spec.content {
            copy_into(&disk, partition, path, out)?;
        }
    }
    disk.sync_all().map_err(io_error("sync", out))?;
    drop(disk);
    for partition in &planned {
        if let PartitionContent::Fat(volume) = &partition.spec.content {
            make_fat(volume, partition, out)?;
        }
    }

    let partitions = planned
        .iter()
        .map(|p| PartitionInfo {
            name: p.spec.label.to_owned(),
            type_guid: p.spec.type_guid,
            partuuid: p.spec.partuuid,
            first_lba: p.first_lba,
            last_lba: p.first_lba + p.sectors - 1,
        })
        .collect();
    tracing::debug!(image = %out.display(), bytes = total_bytes, "built GPT disk");
    Ok(DiskImage {
        path: out.to_path_buf(),
        bytes: total_bytes,
        disk_guid: spec.disk_guid,
        partitions,
    })
}

impl PartitionSpec<'_> {
    /// How errors name this partition's input file.
    fn label_role(&self) -> &'static str {
        match self.type_guid {
            ROOT_X86_64_TYPE => "root file system image",
            ROOT_X86_64_VERITY_TYPE => "dm-verity hash tree",
            _ => "partition content",
        }
    }
}

/// Protective MBR, primary GPT at LBA 1..33, backup GPT in the last 33 sectors.
fn write_gpt(disk: &mut File, disk_guid: Guid, planned: &[Planned]) -> gptman::Result<()> {
    let mut gpt = gptman::GPT::new_from(disk, SECTOR_SIZE, disk_guid.to_gpt_bytes())?;
    gpt.align = ALIGNMENT / SECTOR_SIZE;
    for (number, partition) in (1u32..).zip(planned) {
        gpt[number] = gptman::GPTPartitionEntry {
            partition_type_guid: partition.spec.type_guid.to_gpt_bytes(),
            unique_partition_guid: partition.spec.partuuid.to_gpt_bytes(),
            starting_lba: partition.first_lba,
            ending_lba: partition.first_lba + partition.sectors - 1,
            attribute_bits: 0,
            partition_name: partition.spec.label.into(),
        };
    }
    gpt.write_into(disk)?;
    gptman::GPT::write_protective_mbr_into(disk, SECTOR_SIZE)
}

/// Copies `path` into the partition; the rest of the partition stays zero (a hole).
fn copy_into(disk: &File, partition: &Planned, path: &Path, out: &Path) -> Result<(), DiskError> {
    let role = partition.spec.label_role();
    let input = File::open(path).map_err(|source| DiskError::Input {
        role,
        path: path.to_path_buf(),
        source,
    })?;
    let copied = copy_sparse(
        &mut input.take(partition.content_bytes),
        disk,
        partition.first_lba * SECTOR_SIZE,
    )
    .map_err(|source| DiskError::Io {
        action: "copy a partition into",
        path: out.to_path_buf(),
        source,
    })?;
    if copied != partition.content_bytes {
        return Err(DiskError::Input {
            role,
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "it shrank from {} to {copied} bytes while the image was built",
                    partition.content_bytes
                ),
            ),
        });
    }
    Ok(())
}

/// Block size of [`copy_sparse`]: all-zero blocks of this size are skipped.
const SPARSE_BLOCK: usize = 64 * 1024;

/// Copies `input` to `out` at `offset`, skipping all-zero blocks: `out` is already sized and
/// zero there, so a skipped block reads back as zeros and stays a hole on disk (an image with
/// a mostly empty partition costs its data, not its size). Returns the bytes read.
fn copy_sparse(input: &mut impl Read, out: &File, offset: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; SPARSE_BLOCK];
    let mut done = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if filled == 0 {
            return Ok(done);
        }
        let block = &buf[..filled];
        if block.iter().any(|&b| b != 0) {
            out.write_all_at(block, offset + done)?;
        }
        done += filled as u64;
    }
}

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
fn fat_partition_bytes(volume: &FatVolume, out: &Path) -> Result<u64, DiskError> {
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
fn make_fat(volume: &FatVolume, partition: &Planned, image: &Path) -> Result<(), DiskError> {
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

/// Finds a host tool ([`crate::locate_tool`]); missing, it names its Debian package.
fn find_tool(tool: &'static str, package: &'static str) -> Result<PathBuf, DiskError> {
    crate::locate_tool(tool).ok_or(DiskError::ToolMissing { tool, package })
}

/// Runs a dosfstools/mtools command; a failure carries its stderr.
fn run_tool(mut command: Command, image: &Path) -> Result<(), DiskError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| DiskError::Spawn {
            tool: program.clone(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let args: Vec<String> = command
        .get_args()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    Err(DiskError::Tool {
        command: format!("{program} {}", args.join(" ")),
        image: image.to_path_buf(),
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// The dm-verity root hash of the tree in `verity` (sha256, format 1, with superblock, as
/// `veritysetup format` writes it) over `rootfs`.
///
/// Reads the superblock and the tree's top block only; it checks that the tree covers exactly
/// `rootfs`, not every block (`veritysetup verify` does that).
pub fn verity_root_hash(rootfs: &Path, verity: &Path) -> Result<[u8; 32], DiskError> {
    let refuse = |reason: String| DiskError::Verity {
        verity: verity.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
        reason,
    };
    let read_error = |role: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| DiskError::Input { role, path, source }
    };
    let tree = File::open(verity).map_err(read_error("dm-verity hash tree", verity))?;
    let mut superblock = [0u8; verity::SUPERBLOCK_SIZE];
    tree.read_exact_at(&mut superblock, 0)
        .map_err(read_error("dm-verity hash tree", verity))?;
    let superblock =
        VeritySuperblock::parse(&superblock).map_err(|source| DiskError::VeritySuperblock {
            verity: verity.to_path_buf(),
            source,
        })?;
    if superblock.hash_type != verity::HASH_TYPE || superblock.algorithm != verity::HASH_ALGORITHM {
        return Err(refuse(format!(
            "it is hash type {} with {:?}; hawser uses type {} with {}",
            superblock.hash_type,
            superblock.algorithm,
            verity::HASH_TYPE,
            verity::HASH_ALGORITHM
        )));
    }
    let data_block_size = u64::from(superblock.data_block_size);
    let rootfs_bytes = std::fs::metadata(rootfs)
        .map_err(read_error("root file system image", rootfs))?
        .len();
    let covered = superblock.data_blocks.checked_mul(data_block_size);
    if superblock.data_blocks == 0 || covered != Some(rootfs_bytes) {
        return Err(refuse(format!(
            "the tree covers {} blocks of {data_block_size} bytes, but the root file system is {rootfs_bytes} bytes",
            superblock.data_blocks
        )));
    }

    // With one data block there is no tree: the root hash is that block's hash. Otherwise the
    // top level (one block) is stored first, in the hash block after the superblock.
    let geometry = superblock.geometry();
    let hash_block_size = u64::from(superblock.hash_block_size);
    let (top_block, source, offset, block_size) = if superblock.data_blocks == 1 {
        (
            File::open(rootfs).map_err(read_error("root file system image", rootfs))?,
            rootfs,
            0,
            data_block_size,
        )
    } else {
        (tree, verity, geometry.top_block_offset(), hash_block_size)
    };
    let block_len = usize::try_from(block_size).map_err(|_| refuse("block too large".into()))?;
    let mut block = vec![0u8; block_len];
    top_block.read_exact_at(&mut block, offset).map_err(|e| {
        refuse(format!(
            "cannot read the top hash block at offset {offset} of {}: {e}",
            source.display()
        ))
    })?;
    Ok(verity::root_hash_of(&superblock.salt, &block))
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
