//! The GPT disk: planning the partitions, the protective MBR and both GPTs (with [`gptman`],
//! from fixed GUIDs), and the file partitions' bytes, copied sparsely.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::{self, ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE};

use super::fat::{fat_partition_bytes, make_fat};
use super::plan::Planned;
use super::{
    ALIGNMENT, DiskError, DiskImage, FIRST_PARTITION_LBA, GptDiskSpec, PartitionContent,
    PartitionInfo, PartitionSpec, SECTOR_SIZE, TAIL_SECTORS,
};
use crate::tool::io_error;

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
    .map_err(io_error("copy a partition into", out))?;
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
