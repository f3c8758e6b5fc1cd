//! The rootfs search's tests: a veritysetup image found and verified, another image's or a
//! stale tree refused by name, disagreeing kernel views and unreadable disks.

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
    let err = find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap_err();
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
    let lookup = find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap();
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
    let lookup = find_verity_partitions(&disk.sys_block, &disk.dev_dir, &disk.root_hash).unwrap();
    assert!(
        matches!(lookup, PartitionLookup::Missing { .. }),
        "{lookup:?}"
    );
}
