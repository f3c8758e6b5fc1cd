//! The platform files of a small synthetic disk, checked by the tools that read them: QEMU's
//! `qemu-img` (Debian `qemu-utils`), GNU `tar`, `gzip` and `file`. A missing tool fails the
//! test and names its package (scripts/setup-host installs them all).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::vhd::{DISK_TYPE_FIXED, FOOTER_LEN, Footer};
use super::*;
use crate::test_support::require_tool;

const EPOCH: u64 = 1_795_305_600;
/// 3 MiB and 7 sectors: not a whole MiB, so both formats pad.
const RAW_BYTES: u64 = 3 * MIB + 7 * 512;

/// A disk of `bytes` with data where a disk has it (the start, the middle, the end) and zeros
/// between, deterministic.
fn synthetic_disk(dir: &Path, bytes: u64) -> PathBuf {
    let mut data = vec![0u8; bytes as usize];
    let mut block = Sha256::digest(b"hawser synthetic disk");
    for range in [
        0..64 * 1024,
        MIB as usize..MIB as usize + 4096,
        data.len() - 4096..data.len(),
    ] {
        for chunk in data[range].chunks_mut(32) {
            chunk.copy_from_slice(&block[..chunk.len()]);
            block = Sha256::digest(block);
        }
    }
    let path = dir.join("hawser-disk.raw");
    std::fs::write(&path, data).unwrap();
    path
}

fn run(tool: &Path, args: &[&str]) -> String {
    wait(tool, args, start(tool, args))
}

/// Starts `tool` with its output captured, for [`wait`]: GNU tar and gzip each read a whole
/// GiB-sized archive, so they run side by side.
fn start(tool: &Path, args: &[&str]) -> Child {
    Command::new(tool)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait(tool: &Path, args: &[&str], child: Child) -> String {
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{} {args:?}: {}",
        tool.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn quiet(_: &str) {}

#[test]
fn the_vhd_is_the_disk_padded_to_whole_mib_and_a_fixed_footer() {
    let dir = tempfile::tempdir().unwrap();
    let raw = synthetic_disk(dir.path(), RAW_BYTES);
    let mut lines = Vec::new();
    let vhd = export_disk(ImagePlatform::Azure, &raw, dir.path(), EPOCH, &mut |line| {
        lines.push(line.to_owned())
    })
    .unwrap();
    assert_eq!(vhd.path, dir.path().join(vhd::VHD_FILE));
    assert_eq!(vhd.disk_bytes, 4 * MIB);
    let bytes = std::fs::read(&vhd.path).unwrap();
    assert_eq!(bytes.len() as u64, 4 * MIB + 512);
    assert_eq!(vhd.bytes, bytes.len() as u64);
    assert_eq!(vhd.sha256, hex::encode(Sha256::digest(&bytes)));
    let raw_data = std::fs::read(&raw).unwrap();
    assert_eq!(
        &bytes[..raw_data.len()],
        raw_data,
        "the disk is copied as it is"
    );
    assert!(
        bytes[raw_data.len()..4 * MIB as usize]
            .iter()
            .all(|&b| b == 0)
    );
    let footer = Footer::parse(&bytes[bytes.len() - FOOTER_LEN..]).unwrap();
    assert_eq!(footer.disk_type, DISK_TYPE_FIXED);
    assert_eq!(footer.current_size, 4 * MIB);
    assert_eq!(footer.current_size % MIB, 0);
    assert_eq!(footer.geometry, vhd::geometry(4 * MIB / 512));
    assert_eq!(
        lines.last().unwrap(),
        "azure: VHD of 3 of 4 MiB",
        "{lines:?}"
    );
}

#[test]
fn qemu_img_reads_the_vhd_as_a_vpc_disk_of_the_padded_size_with_the_same_content() {
    let qemu_img = require_tool("qemu-img", "qemu-utils");
    let dir = tempfile::tempdir().unwrap();
    let raw = synthetic_disk(dir.path(), RAW_BYTES);
    let vhd = export_disk(ImagePlatform::Azure, &raw, dir.path(), EPOCH, &mut quiet).unwrap();
    let path = vhd.path.to_str().unwrap();
    // A fixed VHD starts with the disk, not a footer copy: qemu-img's probe takes it for raw,
    // so the format is named, as `az`/Hyper-V know it from the file name.
    let info: Value = serde_json::from_str(&run(
        &qemu_img,
        &["info", "-f", "vpc", "--output=json", path],
    ))
    .unwrap();
    assert_eq!(info["format"], "vpc", "{info}");
    let virtual_size = info["virtual-size"].as_u64().unwrap();
    assert_eq!(virtual_size % MIB, 0, "{info}");
    assert!(virtual_size >= RAW_BYTES, "{info}");
    assert_eq!(virtual_size, vhd.disk_bytes);
    // qemu-img 10.0 prints no "format-specific" block for vpc, so the subformat is read from
    // the footer itself: disk type 2, fixed.
    assert!(info.get("format-specific").is_none(), "{info}");
    let bytes = std::fs::read(&vhd.path).unwrap();
    let footer = Footer::parse(&bytes[bytes.len() - FOOTER_LEN..]).unwrap();
    assert_eq!(footer.disk_type, DISK_TYPE_FIXED);
    // The disk qemu sees through the VHD is the raw disk, then zeros.
    run(
        &qemu_img,
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "vpc",
            raw.to_str().unwrap(),
            path,
        ],
    );
}

#[test]
fn the_gce_archive_holds_exactly_disk_raw_in_gnu_format_gzip_compressed() {
    let tar_tool = require_tool("tar", "tar");
    let gzip = require_tool("gzip", "gzip");
    let file = require_tool("file", "file");
    let dir = tempfile::tempdir().unwrap();
    let raw = synthetic_disk(dir.path(), RAW_BYTES);
    let gce = export_disk(ImagePlatform::Gce, &raw, dir.path(), EPOCH, &mut quiet).unwrap();
    assert_eq!(gce.path, dir.path().join(gce::GCE_FILE));
    assert_eq!(gce.disk_bytes, GIB);
    let archive = gce.path.to_str().unwrap();
    let archive_bytes = std::fs::read(&gce.path).unwrap();
    assert_eq!(gce.bytes, archive_bytes.len() as u64);
    assert_eq!(gce.sha256, hex::encode(Sha256::digest(&archive_bytes)));

    let tar_args = ["--numeric-owner", "--utc", "-tvzf", archive];
    let tar_run = start(&tar_tool, &tar_args);
    let gzip_run = start(&gzip, &["-l", archive]);
    // While they read: disk.raw is the raw disk, then zeros up to the GiB (read with the tar
    // crate: a second pass of GNU tar through a GiB would cost seconds more).
    let mut entries = tar::Archive::new(flate2::read::GzDecoder::new(&archive_bytes[..]));
    let mut entries = entries.entries().unwrap();
    let mut member = entries.next().unwrap().unwrap();
    let raw_data = std::fs::read(&raw).unwrap();
    let mut chunk = vec![0u8; raw_data.len()];
    member.read_exact(&mut chunk).unwrap();
    assert!(chunk == raw_data, "disk.raw starts with the raw disk");
    let zeros = vec![0u8; MIB as usize];
    let mut buffer = vec![0u8; MIB as usize];
    let mut rest = 0;
    loop {
        let n = member.read(&mut buffer).unwrap();
        if n == 0 {
            break;
        }
        assert!(buffer[..n] == zeros[..n], "zeros after the disk");
        rest += n as u64;
    }
    assert_eq!(rest, GIB - RAW_BYTES);
    drop(member);
    assert!(entries.next().is_none(), "one member");
    // GNU tar: one member, disk.raw, 0644, owned by 0/0, dated SOURCE_DATE_EPOCH.
    let listing = wait(&tar_tool, &tar_args, tar_run);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 1, "{listing}");
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        fields,
        [
            "-rw-r--r--",
            "0/0",
            &GIB.to_string(),
            "2026-11-22",
            "00:00",
            "disk.raw"
        ],
        "{listing}"
    );
    // The header's magic is old GNU's (GNU tar's --format=oldgnu and gnu).
    let mut header = [0u8; 512];
    flate2::read::GzDecoder::new(&archive_bytes[..])
        .read_exact(&mut header)
        .unwrap();
    assert_eq!(&header[257..265], b"ustar  \0");
    // gzip: no name, time 0, Unix; `gzip -l` agrees with the tar stream's length.
    assert_eq!(
        &archive_bytes[..4],
        [0x1f, 0x8b, 8, 0],
        "gzip, deflate, no flags"
    );
    assert_eq!(archive_bytes[4..8], [0; 4], "modification time 0");
    assert_eq!(archive_bytes[9], 3, "OS Unix");
    let described = run(&file, &["-b", archive]);
    assert!(described.starts_with("gzip compressed data"), "{described}");
    assert!(!described.contains("was \""), "no file name: {described}");
    let list = wait(&gzip, &["-l", archive], gzip_run);
    let sizes: Vec<u64> = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .take(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let tar_stream = 512 + GIB + 1024;
    assert_eq!(
        sizes,
        [archive_bytes.len() as u64, tar_stream % (1 << 32)],
        "{list}"
    );
    // ... and with `file`, which reads the size from the gzip trailer.
    assert!(
        described.ends_with(&format!("original size modulo 2^32 {}\n", sizes[1])),
        "{described}"
    );
}

#[test]
fn the_same_disk_and_epoch_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let raw = synthetic_disk(dir.path(), RAW_BYTES);
    for platform in [ImagePlatform::Azure, ImagePlatform::Gce] {
        let first_dir = dir.path().join(format!("{platform}-1"));
        let second_dir = dir.path().join(format!("{platform}-2"));
        let later_dir = dir.path().join(format!("{platform}-later"));
        for out in [&first_dir, &second_dir, &later_dir] {
            std::fs::create_dir(out).unwrap();
        }
        let first = export_disk(platform, &raw, &first_dir, EPOCH, &mut quiet).unwrap();
        let second = export_disk(platform, &raw, &second_dir, EPOCH, &mut quiet).unwrap();
        assert_eq!(
            std::fs::read(&first.path).unwrap(),
            std::fs::read(&second.path).unwrap(),
            "{platform}"
        );
        assert_eq!(first.sha256, second.sha256);
        // The epoch is the only time in them (the GCE archive's, its member's time, is checked
        // in its listing above: another GiB to deflate here would add nothing).
        if platform == ImagePlatform::Azure {
            let later = export_disk(platform, &raw, &later_dir, EPOCH + 1, &mut quiet).unwrap();
            assert_ne!(later.sha256, first.sha256, "{platform}");
        }
    }
}

#[test]
fn the_raw_platforms_upload_the_raw_disk_and_an_empty_disk_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let raw = synthetic_disk(dir.path(), 2 * MIB);
    for platform in [
        ImagePlatform::Aws,
        ImagePlatform::SevSnp,
        ImagePlatform::Tdx,
    ] {
        let exported = export_disk(platform, &raw, dir.path(), EPOCH, &mut quiet).unwrap();
        assert_eq!(exported.path, raw);
        assert_eq!(exported.format, crate::platform::DiskFormat::Raw);
        assert_eq!((exported.bytes, exported.disk_bytes), (2 * MIB, 2 * MIB));
        assert_eq!(
            exported.sha256,
            hex::encode(Sha256::digest(std::fs::read(&raw).unwrap()))
        );
    }
    // A disk of whole MiB is not padded.
    let vhd = export_disk(ImagePlatform::Azure, &raw, dir.path(), EPOCH, &mut quiet).unwrap();
    assert_eq!(vhd.bytes, 2 * MIB + 512);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no partial file left"
    );

    let empty = dir.path().join("empty.raw");
    std::fs::write(&empty, b"").unwrap();
    for platform in [ImagePlatform::Azure, ImagePlatform::Gce, ImagePlatform::Aws] {
        assert!(matches!(
            export_disk(platform, &empty, dir.path(), EPOCH, &mut quiet),
            Err(ExportError::EmptyDisk(_))
        ));
    }
}

#[test]
fn sizes_round_up_to_the_alignment() {
    assert_eq!(round_up(1, MIB), MIB);
    assert_eq!(round_up(MIB, MIB), MIB);
    assert_eq!(round_up(MIB + 1, MIB), 2 * MIB);
    assert_eq!(round_up(700 * MIB, gce::ALIGNMENT), GIB);
}
