//! Finding the rootfs partitions and reading their verity metadata.
//!
//! There is no udev (and so no `/dev/disk/by-partuuid`): every whole disk in `/sys/block` is
//! opened read-only through its devtmpfs node and its primary GPT is read with the strict reader
//! of [`hawser_disk_format::gpt`]. The partition whose type is the root type and whose unique
//! GUID is the first half of the root hash is the data partition; the verity type with the
//! second half is the hash partition ([`hawser_disk_format::gpt::root_partuuids`]). Both must be
//! on the same disk and on exactly one disk. Disks without a GPT (the LUKS2 state disk) are
//! skipped.
//!
//! The kernel's partition device (`/sys/block/vda/vda2`) is matched to the table entry by
//! number, and its start and size must agree with the table just read: the host could rewrite
//! the table after the kernel scanned it, and the partitions used must be the ones described.
//!
//! All of this is plain file reading, so the tests run it against a sysfs tree in a temporary
//! directory and a disk image partitioned by `sfdisk` and filled by `veritysetup format`.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::{self, GptPartition, ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE};
use hawser_disk_format::verity::{self as verity_format, TreeGeometry, VeritySuperblock};

use super::verity::{self, DevNum};
use super::{RootHash, RootfsError};
use crate::platform::block::{self as device, SysfsError};

/// Where whole disks are listed.
pub const SYS_BLOCK: &str = "/sys/block";
/// Where devtmpfs puts block device nodes.
pub const DEV_DIR: &str = "/dev";

/// A partition as the kernel sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The whole disk, e.g. `vda`.
    pub disk: String,
    /// Kernel name, e.g. `vda2`.
    pub name: String,
    pub number: u32,
    pub devnum: DevNum,
    /// Bytes.
    pub size: u64,
}

impl Partition {
    pub fn path(&self, dev_dir: &Path) -> PathBuf {
        dev_dir.join(&self.name)
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/dev/{}", self.name)
    }
}

/// The two rootfs partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityPartitions {
    pub data: Partition,
    pub hash: Partition,
}

/// The outcome of one look at the disks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionLookup {
    Found(VerityPartitions),
    /// Not (yet) there; one note per disk looked at, for the error message.
    Missing {
        scanned: Vec<String>,
    },
}

/// "vda: no GPT; vdb: no partition with …" or "none".
pub fn describe_scanned(scanned: &[String]) -> String {
    if scanned.is_empty() {
        "none".to_owned()
    } else {
        scanned.join("; ")
    }
}

fn read_at(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>, RootfsError> {
    let error = |source| RootfsError::Read {
        device: path.to_owned(),
        offset,
        len,
        source,
    };
    let file = File::open(path).map_err(error)?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset).map_err(error)?;
    Ok(buf)
}

fn sysfs_number(path: PathBuf) -> Result<u64, SysfsError> {
    let text = std::fs::read_to_string(&path).map_err(|source| SysfsError {
        path: path.clone(),
        source,
    })?;
    text.trim().parse().map_err(|_| SysfsError {
        path,
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected contents {:?}", text.trim()),
        ),
    })
}

/// Why a disk has no GPT partitions to look in: a note for the error message, not an error of
/// the search (the boot disk may be another one).
#[derive(Debug, thiserror::Error)]
enum TableNote {
    /// Its logical block size cannot be read from sysfs.
    #[error(transparent)]
    BlockSize(SysfsError),
    /// Its logical block size is not a power of two from 512 to 4096.
    #[error("logical block size {0}")]
    OddBlockSize(u64),
    /// Its GPT cannot be read (an empty CD drive).
    #[error(transparent)]
    Read(Box<RootfsError>),
    /// What it holds is not a GPT hawser can use.
    #[error(transparent)]
    Gpt(gpt::GptError),
}

/// The GPT partitions of `disk` with its logical block size, or a note saying why there are
/// none to use. A disk that cannot be read (an empty CD drive) is only a note: the boot disk
/// may be another one.
fn read_table(
    sys_block: &Path,
    dev_dir: &Path,
    disk: &str,
) -> Result<(u64, Vec<GptPartition>), TableNote> {
    let block_size = sysfs_number(sys_block.join(disk).join("queue/logical_block_size"))
        .map_err(TableNote::BlockSize)?;
    if !(512..=4096).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(TableNote::OddBlockSize(block_size));
    }
    let node = dev_dir.join(disk);
    let read = |offset: u64, len: usize| {
        read_at(&node, offset, len).map_err(|e| TableNote::Read(Box::new(e)))
    };
    let header =
        gpt::parse_header(&read(block_size, block_size as usize)?).map_err(TableNote::Gpt)?;
    let entries = read(
        header.partition_entry_lba.saturating_mul(block_size),
        header.entries_len(),
    )?;
    let partitions = gpt::parse_entries(&header, &entries).map_err(TableNote::Gpt)?;
    Ok((block_size, partitions))
}

/// The kernel's device for entry `entry` of `disk`, checked against the table.
fn kernel_partition(
    sys_block: &Path,
    disk: &str,
    block_size: u64,
    entry: &GptPartition,
) -> Result<Option<Partition>, RootfsError> {
    let disk_dir = sys_block.join(disk);
    let listing = std::fs::read_dir(&disk_dir).map_err(|source| {
        RootfsError::Sysfs(SysfsError {
            path: disk_dir.clone(),
            source,
        })
    })?;
    for child in listing.flatten() {
        let dir = child.path();
        let Ok(number) = sysfs_number(dir.join("partition")) else {
            continue;
        };
        if number != u64::from(entry.number) {
            continue;
        }
        let name = child.file_name().to_string_lossy().into_owned();
        let sectors_per_block = block_size / 512;
        for (field, kernel, table) in [
            (
                "start",
                sysfs_number(dir.join("start")).map_err(RootfsError::Sysfs)?,
                entry.first_lba * sectors_per_block,
            ),
            (
                "size",
                sysfs_number(dir.join("size")).map_err(RootfsError::Sysfs)?,
                entry.blocks() * sectors_per_block,
            ),
        ] {
            if kernel != table {
                return Err(RootfsError::PartitionMismatch {
                    partition: format!("/dev/{name}"),
                    field,
                    kernel,
                    table,
                });
            }
        }
        let dev_path = dir.join("dev");
        let dev_text = std::fs::read_to_string(&dev_path).map_err(|source| {
            RootfsError::Sysfs(SysfsError {
                path: dev_path.clone(),
                source,
            })
        })?;
        let devnum = DevNum::parse(&dev_text).ok_or_else(|| {
            RootfsError::Sysfs(SysfsError {
                path: dev_path,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unexpected contents {:?}", dev_text.trim()),
                ),
            })
        })?;
        return Ok(Some(Partition {
            disk: disk.to_owned(),
            name,
            number: entry.number,
            devnum,
            size: entry.blocks() * block_size,
        }));
    }
    Ok(None)
}

/// Looks once at every disk for the partitions `root_hash` names.
pub fn find_verity_partitions(
    sys_block: &Path,
    dev_dir: &Path,
    root_hash: &RootHash,
) -> Result<PartitionLookup, RootfsError> {
    let (data_type, verity_type) = (ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE);
    let data_uuid = root_hash.data_partition_uuid();
    let verity_uuid = root_hash.verity_partition_uuid();

    let mut scanned = Vec::new();
    let mut found = Vec::new();
    for disk in device::list_disks(sys_block).map_err(RootfsError::Sysfs)? {
        let (block_size, partitions) = match read_table(sys_block, dev_dir, &disk.name) {
            Ok(table) => table,
            Err(note) => {
                scanned.push(format!(
                    "{}: {}",
                    disk.name,
                    crate::platform::error_chain(&note)
                ));
                continue;
            }
        };
        let find = |type_guid: Guid, uuid: Guid| {
            partitions
                .iter()
                .find(|p| p.type_guid == type_guid && p.unique_guid == uuid)
        };
        let (Some(data), Some(hash)) = (find(data_type, data_uuid), find(verity_type, verity_uuid))
        else {
            scanned.push(format!(
                "{}: GPT with {} partitions, not both rootfs partitions",
                disk.name,
                partitions.len()
            ));
            continue;
        };
        let data = kernel_partition(sys_block, &disk.name, block_size, data)?;
        let hash = kernel_partition(sys_block, &disk.name, block_size, hash)?;
        match (data, hash) {
            (Some(data), Some(hash)) => found.push(VerityPartitions { data, hash }),
            _ => scanned.push(format!(
                "{}: the kernel has not created the rootfs partition devices",
                disk.name
            )),
        }
    }
    match found.len() {
        0 => Ok(PartitionLookup::Missing { scanned }),
        1 => Ok(PartitionLookup::Found(found.remove(0))),
        _ => Err(RootfsError::Ambiguous {
            disks: found
                .iter()
                .map(|p| p.data.disk.clone())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The rootfs partitions with their checked verity metadata: what the table is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityTarget {
    pub partitions: VerityPartitions,
    pub superblock: VeritySuperblock,
    pub geometry: TreeGeometry,
}

/// Reads the verity superblock, checks that both partitions are large enough for it, and
/// checks the hash tree's top block against `root_hash`.
pub fn check_verity(
    partitions: VerityPartitions,
    dev_dir: &Path,
    root_hash: &RootHash,
) -> Result<VerityTarget, RootfsError> {
    let hash_path = partitions.hash.path(dev_dir);
    let verity_error = |source| RootfsError::Verity {
        device: hash_path.clone(),
        source,
    };
    let superblock =
        VeritySuperblock::parse_hawser(&read_at(&hash_path, 0, verity_format::SUPERBLOCK_SIZE)?)
            .map_err(|e| verity_error(e.into()))?;
    let geometry = superblock.geometry();
    for (partition, needed) in [
        (&partitions.data, superblock.data_bytes()),
        (&partitions.hash, geometry.hash_device_bytes()),
    ] {
        if partition.size < needed {
            return Err(RootfsError::TooSmall {
                device: partition.path(dev_dir),
                size: partition.size,
                needed,
            });
        }
    }
    let top_block = read_at(
        &hash_path,
        geometry.top_block_offset(),
        geometry.hash_block_size as usize,
    )?;
    verity::check_root(&superblock, &top_block, root_hash).map_err(verity_error)?;
    Ok(VerityTarget {
        partitions,
        superblock,
        geometry,
    })
}

#[cfg(test)]
mod tests;
