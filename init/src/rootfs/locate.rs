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

/// The GPT partitions of `disk` with its logical block size, or a note saying why there are
/// none to use. A disk that cannot be read (an empty CD drive) is only a note: the boot disk
/// may be another one.
fn read_table(
    sys_block: &Path,
    dev_dir: &Path,
    disk: &str,
) -> Result<(u64, Vec<GptPartition>), String> {
    let block_size = sysfs_number(sys_block.join(disk).join("queue/logical_block_size"))
        .map_err(|e| crate::platform::error_chain(&e))?;
    if !(512..=4096).contains(&block_size) || !block_size.is_power_of_two() {
        return Err(format!("logical block size {block_size}"));
    }
    let node = dev_dir.join(disk);
    let read = |offset: u64, len: usize| {
        read_at(&node, offset, len).map_err(|e| crate::platform::error_chain(&e))
    };
    let header =
        gpt::parse_header(&read(block_size, block_size as usize)?).map_err(|e| e.to_string())?;
    let entries = read(
        header.partition_entry_lba.saturating_mul(block_size),
        header.entries_len(),
    )?;
    let partitions = gpt::parse_entries(&header, &entries).map_err(|e| e.to_string())?;
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
                scanned.push(format!("{}: {note}", disk.name));
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
mod tests {
    use super::*;
    use std::process::Command;

    /// A boot disk image as the image builder makes it: GPT by sfdisk, an erofs-sized data
    /// partition of random blocks, and a hash partition by `veritysetup format`.
    struct BootDisk {
        _dir: tempfile::TempDir,
        sys_block: PathBuf,
        dev_dir: PathBuf,
        root_hash: RootHash,
    }

    const DATA_BLOCKS: u64 = 300;
    const SALT: &str = "a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0";

    fn run(command: &mut Command) -> String {
        let output = command.output().unwrap_or_else(|e| {
            panic!("cannot run {command:?}: {e} (install fdisk and cryptsetup-bin)")
        });
        assert!(
            output.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn write_attr(dir: &Path, name: &str, value: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), format!("{value}\n")).unwrap();
    }

    /// `uuid_override` replaces the data partition's PARTUUID (a disk of another image).
    fn boot_disk(uuid_override: Option<&str>) -> BootDisk {
        let dir = tempfile::tempdir().unwrap();
        let data_path = dir.path().join("data");
        let hash_path = dir.path().join("hash");
        let data: Vec<u8> = (0..DATA_BLOCKS * 4096)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&data_path, &data).unwrap();
        let out = run(Command::new("veritysetup")
            .args(["format", "--hash=sha256", "--data-block-size=4096"])
            .args(["--hash-block-size=4096", &format!("--salt={SALT}")])
            .args(["--uuid=12345678-1234-1234-1234-123456789abc"])
            .arg(&data_path)
            .arg(&hash_path));
        let root_hex = out
            .lines()
            .find_map(|l| l.strip_prefix("Root hash:"))
            .expect("veritysetup prints the root hash")
            .trim()
            .to_owned();
        let root_hash = RootHash::parse(&root_hex).unwrap();

        let hash = std::fs::read(&hash_path).unwrap();
        // Partitions in 512-byte sectors, 1 MiB aligned.
        let data_sectors = data.len() as u64 / 512;
        let hash_sectors = (hash.len() as u64).div_ceil(512);
        let data_start = 2048u64;
        let hash_start = data_start + data_sectors.div_ceil(2048) * 2048;
        let total = hash_start + hash_sectors.div_ceil(2048) * 2048 + 2048;
        let image = dir.path().join("disk.img");
        let file = File::create(&image).unwrap();
        file.set_len(total * 512).unwrap();
        drop(file);
        let data_uuid = uuid_override
            .map(str::to_owned)
            .unwrap_or_else(|| root_hash.data_partition_uuid().to_string());
        let script = format!(
            "label: gpt\nunit: sectors\n\
             start={data_start}, size={data_sectors}, type={ROOT_X86_64_TYPE}, uuid={data_uuid}\n\
             start={hash_start}, size={hash_sectors}, type={ROOT_X86_64_VERITY_TYPE}, uuid={}\n",
            root_hash.verity_partition_uuid()
        );
        let mut child = Command::new("sfdisk")
            .args(["--no-reread", "--no-tell-kernel", "-q"])
            .arg(&image)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sfdisk (package fdisk) is installed");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
        let disk = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        disk.write_all_at(&data, data_start * 512).unwrap();
        disk.write_all_at(&hash, hash_start * 512).unwrap();
        drop(disk);

        // The kernel's view: /sys/block/vda{,/vda1,/vda2} and /dev/vda{,1,2}.
        let sys_block = dir.path().join("sys/block");
        let dev_dir = dir.path().join("dev");
        let vda = sys_block.join("vda");
        write_attr(&vda, "dev", "254:0");
        write_attr(&vda, "size", &total.to_string());
        write_attr(&vda, "ro", "0");
        write_attr(&vda.join("queue"), "logical_block_size", "512");
        for (n, start, sectors) in [(1, data_start, data_sectors), (2, hash_start, hash_sectors)] {
            let part = vda.join(format!("vda{n}"));
            write_attr(&part, "partition", &n.to_string());
            write_attr(&part, "start", &start.to_string());
            write_attr(&part, "size", &sectors.to_string());
            write_attr(&part, "dev", &format!("254:{n}"));
        }
        std::fs::create_dir_all(&dev_dir).unwrap();
        std::fs::copy(&image, dev_dir.join("vda")).unwrap();
        std::fs::copy(&data_path, dev_dir.join("vda1")).unwrap();
        std::fs::copy(&hash_path, dev_dir.join("vda2")).unwrap();
        // A second disk without a partition table (the state disk).
        let vdb = sys_block.join("vdb");
        write_attr(&vdb, "dev", "254:16");
        write_attr(&vdb, "size", "8192");
        write_attr(&vdb, "ro", "0");
        write_attr(&vdb.join("queue"), "logical_block_size", "512");
        std::fs::write(dev_dir.join("vdb"), vec![0u8; 8192 * 512]).unwrap();

        BootDisk {
            _dir: dir,
            sys_block,
            dev_dir,
            root_hash,
        }
    }

    #[test]
    fn the_partitions_of_a_veritysetup_image_are_found_and_verified() {
        let disk = boot_disk(None);
        let PartitionLookup::Found(partitions) =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap()
        else {
            panic!("partitions not found");
        };
        assert_eq!(partitions.data.name, "vda1");
        assert_eq!(partitions.hash.name, "vda2");
        assert_eq!(
            partitions.hash.devnum,
            DevNum {
                major: 254,
                minor: 2
            }
        );
        assert_eq!(partitions.data.size, DATA_BLOCKS * 4096);

        let target = check_verity(partitions, &disk.dev_dir, &disk.root_hash).unwrap();
        assert_eq!(target.superblock.data_blocks, DATA_BLOCKS);
        assert_eq!(hex::encode(&target.superblock.salt), SALT);
        assert_eq!(
            target.superblock.uuid.to_string(),
            "12345678-1234-1234-1234-123456789abc"
        );
        // 300 blocks: 3 leaf blocks and the top block.
        assert_eq!(target.geometry.level_blocks, [1, 3]);
    }

    #[test]
    fn another_images_root_hash_finds_nothing_and_says_what_it_saw() {
        let disk = boot_disk(None);
        let other = RootHash([0x5a; 32]);
        let PartitionLookup::Missing { scanned } =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &other).unwrap()
        else {
            panic!("found partitions of another image");
        };
        assert_eq!(
            describe_scanned(&scanned),
            "vda: GPT with 2 partitions, not both rootfs partitions; vdb: no GPT signature at LBA 1"
        );
    }

    #[test]
    fn a_stale_hash_tree_is_refused_with_both_root_hashes() {
        let disk = boot_disk(None);
        // The same partitions, but the tree's top block was rewritten.
        let hash_node = disk.dev_dir.join("vda2");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&hash_node)
            .unwrap();
        file.write_all_at(&[0xff; 32], 4096).unwrap();
        let PartitionLookup::Found(partitions) =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap()
        else {
            panic!("partitions not found");
        };
        let err = check_verity(partitions, &disk.dev_dir, &disk.root_hash).unwrap_err();
        let message = crate::platform::error_chain(&err);
        assert!(message.starts_with(&format!("verity partition {}", hash_node.display())));
        assert!(
            message.contains(&format!(
                "but the kernel command line's hawser.root_hash is {}",
                disk.root_hash
            )),
            "{message}"
        );
    }

    #[test]
    fn a_kernel_view_that_disagrees_with_the_table_is_refused() {
        let disk = boot_disk(None);
        write_attr(&disk.sys_block.join("vda/vda2"), "start", "4096");
        let err =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("partition /dev/vda2: the kernel's start is 4096 sectors"),
            "{err}"
        );
    }

    #[test]
    fn a_superblock_that_is_not_verity_names_the_device() {
        let disk = boot_disk(None);
        let hash_node = disk.dev_dir.join("vda2");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&hash_node)
            .unwrap();
        file.write_all_at(&2u32.to_le_bytes(), 8).unwrap();
        let PartitionLookup::Found(partitions) =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap()
        else {
            panic!("partitions not found");
        };
        let err = check_verity(partitions, &disk.dev_dir, &disk.root_hash).unwrap_err();
        assert_eq!(
            crate::platform::error_chain(&err),
            format!(
                "verity partition {}: verity superblock field version is 2, expected 1",
                hash_node.display()
            )
        );
    }

    #[test]
    fn an_unreadable_disk_is_noted_and_the_boot_disk_still_found() {
        let disk = boot_disk(None);
        // An empty CD drive: listed in sysfs, its node cannot be read.
        let sr0 = disk.sys_block.join("sr0");
        write_attr(&sr0, "dev", "11:0");
        write_attr(&sr0, "size", "0");
        write_attr(&sr0, "ro", "1");
        write_attr(&sr0.join("queue"), "logical_block_size", "2048");
        // A disk with a logical block size no GPT reader here expects.
        let vdc = disk.sys_block.join("vdc");
        write_attr(&vdc, "dev", "254:32");
        write_attr(&vdc, "size", "8");
        write_attr(&vdc, "ro", "0");
        write_attr(&vdc.join("queue"), "logical_block_size", "520");
        let lookup =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap();
        assert!(matches!(lookup, PartitionLookup::Found(_)), "{lookup:?}");
        let PartitionLookup::Missing { scanned } =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &RootHash([1; 32])).unwrap()
        else {
            panic!("found partitions of another image");
        };
        let sr0_note = scanned.iter().find(|n| n.starts_with("sr0: ")).unwrap();
        assert!(
            sr0_note.contains("cannot read 2048 bytes at offset 2048"),
            "{sr0_note}"
        );
        assert!(
            scanned.contains(&"vdc: logical block size 520".to_owned()),
            "{scanned:?}"
        );
    }

    #[test]
    fn a_disk_with_only_the_data_partition_is_not_the_boot_disk() {
        let disk = boot_disk(Some("99999999-9999-9999-9999-999999999999"));
        let lookup =
            find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap();
        assert!(
            matches!(lookup, PartitionLookup::Missing { .. }),
            "{lookup:?}"
        );
    }
}
