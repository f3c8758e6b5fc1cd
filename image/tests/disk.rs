//! The bootable disk image, checked as a user would: built twice it is the same bytes; the
//! partition table read back by `gptman` and by util-linux's `sfdisk` has the right types,
//! PARTUUIDs from the root hash, names and 1 MiB alignment; the partitions hold the inputs byte
//! for byte; the ESP is a clean FAT with the UKI at the removable-media path and time stamps
//! from `SOURCE_DATE_EPOCH`; and `veritysetup verify` accepts the root and verity partitions
//! cut out of the image. The table the builder writes is also read back with PID 1's own strict
//! reader (`hawser_disk_format::gpt`).
//!
//! Host tools: `veritysetup` (cryptsetup-bin), `sfdisk` (fdisk), mtools, dosfstools (`fsck.vfat`);
//! a missing one fails the test, naming its Debian package.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::{
    self, ESP_TYPE, GptPartition, ROOT_X86_64_TYPE, ROOT_X86_64_VERITY_TYPE, root_partuuids,
};
use hawser_image::disk::{
    self, DiskError, DiskImage, DiskLayout, build_disk_image, derive_guid, verity_root_hash,
};
use hawser_image::test_support::{self, require_tool};

const MIB: u64 = 1024 * 1024;
/// 2023-11-14T22:13:20Z.
const EPOCH: u64 = 1_700_000_000;

/// Deterministic pseudo-random bytes (xorshift), so inputs do not compress to nothing.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

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

/// `veritysetup format` of `rootfs` into `verity`, with a fixed salt and UUID (reproducible);
/// returns the root hash.
fn veritysetup_format(rootfs: &Path, verity: &Path) -> [u8; 32] {
    let stdout = run(Command::new(require_tool("veritysetup", "cryptsetup-bin"))
        .args([
            "format",
            "--salt=6861777365722d746573742d73616c74",
            "--uuid=68617773-6572-4000-8000-766572697479",
            "--hash=sha256",
            "--data-block-size=4096",
            "--hash-block-size=4096",
        ])
        .arg(rootfs)
        .arg(verity));
    let hex_hash = stdout
        .lines()
        .find_map(|line| line.strip_prefix("Root hash:"))
        .unwrap_or_else(|| panic!("no root hash in veritysetup output:\n{stdout}"))
        .trim();
    let mut root_hash = [0u8; 32];
    hex::decode_to_slice(hex_hash, &mut root_hash).expect("hex root hash");
    root_hash
}

struct Inputs {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    uki: PathBuf,
    rootfs: PathBuf,
    verity: PathBuf,
    root_hash: [u8; 32],
}

impl Inputs {
    /// A 2.5 MB "UKI", a rootfs of 3 MiB + 5 blocks (not a whole MiB: the partition pads it)
    /// and its verity tree.
    fn new() -> Inputs {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_owned();
        let uki = dir.join("hawser.efi");
        let mut uki_bytes = pseudo_random(2_500_000, 1);
        uki_bytes[..2].copy_from_slice(b"MZ");
        std::fs::write(&uki, uki_bytes).expect("write uki");
        let rootfs = dir.join("rootfs.erofs");
        std::fs::write(&rootfs, pseudo_random(3 * MIB as usize + 5 * 4096, 2))
            .expect("write rootfs");
        let verity = dir.join("rootfs.verity");
        let root_hash = veritysetup_format(&rootfs, &verity);
        Inputs {
            _dir: tmp,
            dir,
            uki,
            rootfs,
            verity,
            root_hash,
        }
    }

    fn layout(&self) -> DiskLayout<'_> {
        DiskLayout {
            uki: &self.uki,
            rootfs: &self.rootfs,
            verity: &self.verity,
            root_hash: self.root_hash,
            source_date_epoch: EPOCH,
        }
    }
}

fn read_range(image: &Path, offset: u64, len: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; usize::try_from(len).expect("fits")];
    File::open(image)
        .expect("open image")
        .read_exact_at(&mut bytes, offset)
        .expect("read image range");
    bytes
}

/// mtools on the ESP inside the image, without any mtools.conf.
fn mtools(tool: &str, image: &Path, esp_offset: u64) -> Command {
    let mut command = Command::new(require_tool(tool, "mtools"));
    command
        .env("MTOOLSRC", "/dev/null")
        .env("MTOOLS_SKIP_CHECK", "1")
        .env("TZ", "UTC")
        .arg("-i")
        .arg(format!("{}@@{esp_offset}", image.display()));
    command
}

#[test]
fn disk_image_is_reproducible_and_reads_back_as_built() {
    let inputs = Inputs::new();
    let first_path = inputs.dir.join("disk-1.raw");
    let second_path = inputs.dir.join("disk-2.raw");
    let started = std::time::Instant::now();
    let first = build_disk_image(&inputs.layout(), &first_path).expect("build 1");
    eprintln!("disk image built in {:?}", started.elapsed());
    // Later, from inputs with other mtimes: the same bytes.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let uki_bytes = std::fs::read(&inputs.uki).expect("read uki");
    std::fs::write(&inputs.uki, &uki_bytes).expect("rewrite uki");
    let second = build_disk_image(&inputs.layout(), &second_path).expect("build 2");
    assert_eq!(first.partitions, second.partitions);
    let image = std::fs::read(&first_path).expect("read image 1");
    assert!(
        image == std::fs::read(&second_path).expect("read image 2"),
        "two builds of the same disk image differ"
    );
    assert!(
        !inputs.dir.join("disk-1.raw.partial").exists(),
        "the temporary image was left behind"
    );

    // Size: a whole number of MiB, as reported.
    let DiskImage {
        bytes, partitions, ..
    } = &first;
    assert_eq!(*bytes, image.len() as u64);
    assert_eq!(bytes % MIB, 0, "{bytes}");

    // The table as gptman reads it back.
    let (root_uuid, verity_uuid) = root_partuuids(&inputs.root_hash);
    let mut file = File::open(&first_path).expect("open image");
    let gpt = gptman::GPT::find_from(&mut file).expect("read GPT");
    assert_eq!(Guid::from_gpt_bytes(gpt.header.disk_guid), first.disk_guid);
    let used: Vec<_> = gpt.iter().filter(|(_, p)| p.is_used()).collect();
    assert_eq!(used.len(), 3);
    let expected = [
        ("EFI System Partition", ESP_TYPE, None),
        ("hawser-root", ROOT_X86_64_TYPE, Some(root_uuid)),
        (
            "hawser-root-verity",
            ROOT_X86_64_VERITY_TYPE,
            Some(verity_uuid),
        ),
    ];
    for ((number, entry), (info, (name, type_guid, partuuid))) in
        used.iter().zip(partitions.iter().zip(expected))
    {
        assert_eq!(entry.partition_name.as_str(), name, "partition {number}");
        assert_eq!(info.name, name);
        assert_eq!(Guid::from_gpt_bytes(entry.partition_type_guid), type_guid);
        assert_eq!(info.type_guid, type_guid);
        let unique = Guid::from_gpt_bytes(entry.unique_partition_guid);
        assert_eq!(unique, info.partuuid);
        if let Some(partuuid) = partuuid {
            assert_eq!(unique, partuuid, "{name}");
        }
        assert_eq!(entry.starting_lba, info.first_lba);
        assert_eq!(entry.ending_lba, info.last_lba);
        assert_eq!(info.offset() % MIB, 0, "{name} starts unaligned");
        assert_eq!(info.bytes() % MIB, 0, "{name} ends unaligned");
    }
    // The root and verity PARTUUIDs read as the root hash's hex halves.
    let hash_hex = hex::encode(inputs.root_hash);
    assert_eq!(
        root_uuid.to_string().replace('-', ""),
        hash_hex[..32],
        "root PARTUUID"
    );
    assert_eq!(
        verity_uuid.to_string().replace('-', ""),
        hash_hex[32..],
        "verity PARTUUID"
    );

    // The table as util-linux reads it: the same, and nothing to complain about.
    let sfdisk = require_tool("sfdisk", "fdisk");
    let dump: serde_json::Value =
        serde_json::from_str(&run(Command::new(&sfdisk).arg("--json").arg(&first_path)))
            .expect("sfdisk JSON");
    let table = &dump["partitiontable"];
    assert_eq!(table["label"], "gpt");
    assert_eq!(table["unit"], "sectors");
    assert_eq!(
        table["id"].as_str().map(str::to_lowercase),
        Some(first.disk_guid.to_string())
    );
    let sfdisk_partitions = table["partitions"].as_array().expect("partitions");
    assert_eq!(sfdisk_partitions.len(), 3);
    for (entry, info) in sfdisk_partitions.iter().zip(partitions) {
        assert_eq!(entry["start"].as_u64(), Some(info.first_lba), "{entry}");
        assert_eq!(
            entry["size"].as_u64(),
            Some(info.last_lba + 1 - info.first_lba),
            "{entry}"
        );
        assert_eq!(
            entry["type"].as_str().map(str::to_lowercase),
            Some(info.type_guid.to_string())
        );
        assert_eq!(
            entry["uuid"].as_str().map(str::to_lowercase),
            Some(info.partuuid.to_string())
        );
        assert_eq!(entry["name"].as_str(), Some(info.name.as_str()));
    }
    let verify = Command::new(&sfdisk)
        .arg("--verify")
        .arg(&first_path)
        .output()
        .expect("run sfdisk --verify");
    let verify_text = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && verify_text.contains("No errors detected"),
        "sfdisk --verify: {verify_text}{}",
        String::from_utf8_lossy(&verify.stderr)
    );

    // Root and verity partitions: the inputs byte for byte, then zeros.
    for (info, input) in [
        (&partitions[1], &inputs.rootfs),
        (&partitions[2], &inputs.verity),
    ] {
        let content = std::fs::read(input).expect("read input");
        let partition = read_range(&first_path, info.offset(), info.bytes());
        assert!(
            partition[..content.len()] == content[..],
            "{} does not hold {} byte for byte",
            info.name,
            input.display()
        );
        assert!(
            partition[content.len()..].iter().all(|&b| b == 0),
            "{} is not zero after its content",
            info.name
        );
        assert_eq!(
            info.bytes(),
            (content.len() as u64).div_ceil(MIB) * MIB,
            "{} is not its content rounded up to 1 MiB",
            info.name
        );
    }

    // The partitions cut out of the image verify against the root hash.
    let root_part = inputs.dir.join("root.part");
    let verity_part = inputs.dir.join("verity.part");
    for (info, path) in [(&partitions[1], &root_part), (&partitions[2], &verity_part)] {
        std::fs::write(path, read_range(&first_path, info.offset(), info.bytes()))
            .expect("write partition");
    }
    run(Command::new(require_tool("veritysetup", "cryptsetup-bin"))
        .arg("verify")
        .arg(&root_part)
        .arg(&verity_part)
        .arg(&hash_hex));

    // The ESP: a clean FAT32 with the UKI at the removable-media path, time-stamped from
    // SOURCE_DATE_EPOCH.
    let esp = &partitions[0];
    let esp_part = inputs.dir.join("esp.part");
    std::fs::write(
        &esp_part,
        read_range(&first_path, esp.offset(), esp.bytes()),
    )
    .expect("write ESP");
    run(Command::new(require_tool("fsck.vfat", "dosfstools"))
        .arg("-n")
        .arg(&esp_part));
    let boot_sector = read_range(&esp_part, 0, 512);
    assert_eq!(
        &boot_sector[82..90],
        b"FAT32   ",
        "file system type of the ESP"
    );
    let copied_out = inputs.dir.join("BOOTX64.EFI.out");
    run(mtools("mcopy", &first_path, esp.offset())
        .arg("::EFI/BOOT/BOOTX64.EFI")
        .arg(&copied_out));
    assert!(
        std::fs::read(&copied_out).expect("read copied UKI") == uki_bytes,
        "BOOTX64.EFI on the ESP differs from the UKI"
    );
    let listing = run(mtools("mdir", &first_path, esp.offset()).arg("::EFI/BOOT"));
    let bootx64 = listing
        .lines()
        .find(|line| line.starts_with("BOOTX64"))
        .unwrap_or_else(|| panic!("no BOOTX64.EFI in:\n{listing}"));
    assert!(
        bootx64.contains(" 2500000 ") && bootx64.contains("2023-11-14  22:13"),
        "size and SOURCE_DATE_EPOCH time stamp: {bootx64}"
    );
}

#[test]
fn verity_root_hash_matches_veritysetup_with_and_without_a_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, len) in [("one-block", 4096usize), ("many-blocks", 600 * 4096)] {
        let rootfs = dir.path().join(format!("{name}.img"));
        let verity = dir.path().join(format!("{name}.verity"));
        std::fs::write(&rootfs, pseudo_random(len, 7)).expect("write");
        let expected = veritysetup_format(&rootfs, &verity);
        assert_eq!(
            verity_root_hash(&rootfs, &verity).expect("root hash"),
            expected,
            "{name}"
        );
    }
}

#[test]
fn inconsistent_or_missing_inputs_are_refused_before_anything_is_written() {
    let inputs = Inputs::new();
    let out = inputs.dir.join("disk.raw");

    // A root hash that is not the tree's.
    let mut layout = inputs.layout();
    layout.root_hash[0] ^= 1;
    let error = build_disk_image(&layout, &out).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, DiskError::Verity { .. }), "{text}");
    assert!(text.contains("rootfs.verity"), "{text}");
    assert!(text.contains(&hex::encode(inputs.root_hash)), "{text}");
    assert!(text.contains(&hex::encode(layout.root_hash)), "{text}");
    assert!(!out.exists(), "an image was written for refused inputs");

    // A tree for a different root file system size.
    let longer = inputs.dir.join("longer.erofs");
    let mut bytes = std::fs::read(&inputs.rootfs).expect("read rootfs");
    bytes.extend_from_slice(&[0; 4096]);
    std::fs::write(&longer, bytes).expect("write");
    let mut layout = inputs.layout();
    layout.rootfs = &longer;
    let text = build_disk_image(&layout, &out).unwrap_err().to_string();
    assert!(
        text.contains("longer.erofs") && text.contains("773 blocks of 4096 bytes"),
        "{text}"
    );

    // The tree and the file system swapped.
    let mut layout = inputs.layout();
    layout.rootfs = &inputs.verity;
    layout.verity = &inputs.rootfs;
    let error = build_disk_image(&layout, &out).unwrap_err();
    let text = test_support::error_chain(&error);
    assert!(
        matches!(error, DiskError::VeritySuperblock { .. }),
        "{text}"
    );
    assert!(text.contains("no verity superblock"), "{text}");

    // A missing UKI, named.
    let missing = inputs.dir.join("missing.efi");
    let mut layout = inputs.layout();
    layout.uki = &missing;
    let error = build_disk_image(&layout, &out).unwrap_err();
    assert!(matches!(error, DiskError::Input { role: "UKI", .. }));
    assert!(error.to_string().contains("missing.efi"), "{error}");
    assert!(!out.exists(), "an image was written for refused inputs");
}

#[test]
fn general_gpt_disks_refuse_duplicate_partuuids_and_long_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let content = dir.path().join("content");
    std::fs::write(&content, b"data").expect("write");
    let partuuid = derive_guid("test", b"x");
    let partition = |label| disk::PartitionSpec {
        label,
        type_guid: ROOT_X86_64_TYPE,
        partuuid,
        content: disk::PartitionContent::File(&content),
    };
    let out = dir.path().join("disk.raw");
    let spec = disk::GptDiskSpec {
        disk_guid: derive_guid("disk", b"x"),
        partitions: vec![partition("a"), partition("b")],
    };
    let text = disk::build_gpt_disk(&spec, &out).unwrap_err().to_string();
    assert!(
        text.contains(&format!("{partuuid} is given twice")),
        "{text}"
    );
    let spec = disk::GptDiskSpec {
        disk_guid: derive_guid("disk", b"x"),
        partitions: vec![partition("a name longer than thirty-six characters")],
    };
    let text = disk::build_gpt_disk(&spec, &out).unwrap_err().to_string();
    assert!(text.contains("36 UTF-16 code units"), "{text}");

    // One small file partition: 1 MiB of GPT, 1 MiB of partition, 1 MiB of backup GPT.
    let spec = disk::GptDiskSpec {
        disk_guid: derive_guid("disk", b"x"),
        partitions: vec![partition("data")],
    };
    let built = disk::build_gpt_disk(&spec, &out).expect("build");
    assert_eq!(built.bytes, 3 * MIB);
    assert_eq!(read_range(&out, MIB, 4), b"data");
}

/// The writer (gptman, driven by `build_gpt_disk`) and PID 1's strict reader agree: the table
/// of a hawser-layout disk parses, and its root and verity partitions are found by type and by
/// the root hash's halves, where the builder put them. Needs no host tools.
#[test]
fn the_written_table_is_what_pid_1_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root.img");
    let tree = dir.path().join("root.verity");
    std::fs::write(&root, pseudo_random(3 * MIB as usize, 5)).expect("write");
    std::fs::write(&tree, pseudo_random(5000, 6)).expect("write");
    let root_hash: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
    let (root_uuid, verity_uuid) = root_partuuids(&root_hash);
    let spec = disk::GptDiskSpec {
        disk_guid: derive_guid("disk", &root_hash),
        partitions: vec![
            disk::PartitionSpec {
                label: disk::ROOT_LABEL,
                type_guid: ROOT_X86_64_TYPE,
                partuuid: root_uuid,
                content: disk::PartitionContent::File(&root),
            },
            disk::PartitionSpec {
                label: disk::VERITY_LABEL,
                type_guid: ROOT_X86_64_VERITY_TYPE,
                partuuid: verity_uuid,
                content: disk::PartitionContent::File(&tree),
            },
        ],
    };
    let out = dir.path().join("disk.raw");
    let built = disk::build_gpt_disk(&spec, &out).expect("build");

    let header = gpt::parse_header(&read_range(&out, disk::SECTOR_SIZE, 512)).expect("header");
    assert_eq!(header.disk_guid, built.disk_guid);
    let entries = read_range(
        &out,
        header.partition_entry_lba * disk::SECTOR_SIZE,
        header.entries_len() as u64,
    );
    let partitions = gpt::parse_entries(&header, &entries).expect("entries");
    let expected: Vec<GptPartition> = (1u32..)
        .zip(&built.partitions)
        .map(|(number, info)| GptPartition {
            number,
            type_guid: info.type_guid,
            unique_guid: info.partuuid,
            first_lba: info.first_lba,
            last_lba: info.last_lba,
        })
        .collect();
    assert_eq!(partitions, expected);
    let find = |type_guid: Guid, uuid: Guid| {
        partitions
            .iter()
            .find(|p| p.type_guid == type_guid && p.unique_guid == uuid)
            .map(|p| p.number)
    };
    assert_eq!(find(ROOT_X86_64_TYPE, root_uuid), Some(1));
    assert_eq!(find(ROOT_X86_64_VERITY_TYPE, verity_uuid), Some(2));
    assert_eq!(
        read_range(&out, partitions[0].first_lba * disk::SECTOR_SIZE, 4096),
        &std::fs::read(&root).expect("read")[..4096]
    );
}

/// mkfs.fat sizes clusters by the whole file when it formats at an offset: on a disk much
/// larger than its ESP it picked 4 KiB clusters for a 64 MiB FAT32 (too few clusters), which
/// mtools could then not write. The builder chooses the cluster size from the partition.
#[test]
fn the_esp_is_valid_fat32_on_a_disk_much_larger_than_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let loader = dir.path().join("loader.efi");
    std::fs::write(&loader, pseudo_random(100_000, 3)).expect("write loader");
    let big = dir.path().join("big.img");
    File::create(&big)
        .and_then(|f| f.set_len(400 * MIB))
        .expect("sparse 400 MiB file");
    let files = [disk::EspFile::default_boot_loader(&loader)];
    let spec = disk::GptDiskSpec {
        disk_guid: derive_guid("disk", b"large"),
        partitions: vec![
            disk::PartitionSpec {
                label: disk::ESP_LABEL,
                type_guid: ESP_TYPE,
                partuuid: derive_guid("esp", b"large"),
                content: disk::PartitionContent::Fat(disk::FatVolume {
                    files: &files,
                    volume_id: 0x1234_5678,
                    volume_label: disk::ESP_VOLUME_LABEL,
                    timestamp: EPOCH,
                }),
            },
            disk::PartitionSpec {
                label: "data",
                type_guid: ROOT_X86_64_TYPE,
                partuuid: derive_guid("data", b"large"),
                content: disk::PartitionContent::File(&big),
            },
        ],
    };
    let out = dir.path().join("disk.raw");
    let built = disk::build_gpt_disk(&spec, &out).expect("build");
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&out).expect("stat")) * 512;
    assert!(
        allocated < 80 * MIB,
        "the empty 400 MiB partition stays a hole: {allocated} bytes allocated"
    );
    let esp = &built.partitions[0];
    assert_eq!(esp.bytes(), 64 * MIB);
    let esp_part = dir.path().join("esp.part");
    std::fs::write(&esp_part, read_range(&out, esp.offset(), esp.bytes())).expect("write ESP");
    run(Command::new(require_tool("fsck.vfat", "dosfstools"))
        .arg("-n")
        .arg(&esp_part));
    let boot_sector = read_range(&esp_part, 0, 512);
    assert_eq!(&boot_sector[82..90], b"FAT32   ");
    assert_eq!(boot_sector[13], 1, "sectors per cluster of a 64 MiB FAT32");
    let copied_out = dir.path().join("out.efi");
    run(mtools("mcopy", &out, esp.offset())
        .arg("::EFI/BOOT/BOOTX64.EFI")
        .arg(&copied_out));
    assert!(std::fs::read(&copied_out).expect("read") == std::fs::read(&loader).expect("read"));
}
