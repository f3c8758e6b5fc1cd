//! GCE's image import: one file named `disk.raw`, in a tar archive in GNU format, gzip-compressed
//! (<https://cloud.google.com/compute/docs/import/import-existing-image#requirements>; Google's
//! own command is `tar --format=oldgnu -Sczf compressed-image.tar.gz disk.raw`).
//!
//! The archive is written here rather than by GNU tar so that it is reproducible: one member,
//! an old-GNU header (magic `ustar  \0`, which is what both `--format=oldgnu` and
//! `--format=gnu` write for such a member), mode 0644, owner and group 0 without names, the
//! modification time `SOURCE_DATE_EPOCH`; a gzip header with modification time 0, no file name
//! and OS 3 (Unix). `disk.raw` is the raw disk followed by zeros up to a whole GiB: tools that
//! import raw disks into GCE round the file to whole GiB (GCE's disks come in GiB), and the
//! padding costs a few KiB compressed. The member is a plain (not GNU sparse) file: GCE
//! accepts both.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use flate2::{Compression, GzBuilder};

use super::{
    ExportError, ExportedDisk, GIB, HashingWriter, Progress, check_read, finish, open_disk,
    partial_path, round_up,
};
use crate::platform::DiskFormat;
use crate::tool::io_error;

/// The file a GCE image build writes next to the raw disk.
pub const GCE_FILE: &str = "hawser-gce.tar.gz";
/// The one member GCE's import reads.
pub const MEMBER: &str = "disk.raw";
/// `disk.raw` is a multiple of this.
pub const ALIGNMENT: u64 = GIB;
/// The member's permission bits.
pub const MEMBER_MODE: u32 = 0o644;
/// The operating-system byte of the gzip header (RFC 1952: 3 = Unix).
pub const GZIP_OS_UNIX: u8 = 3;

/// The tar header of a `disk.raw` of `size` bytes made at `source_date_epoch`.
pub fn member_header(size: u64, source_date_epoch: u64) -> Result<tar::Header, ExportError> {
    let mut header = tar::Header::new_gnu();
    header
        .set_path(MEMBER)
        .map_err(|source| ExportError::TarHeader {
            member: MEMBER,
            source,
        })?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(MEMBER_MODE);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(source_date_epoch);
    header.set_cksum();
    Ok(header)
}

/// Writes `raw` as `disk.raw`, padded to a whole GiB, into the gzip'd GNU tar `out`.
pub fn write_gce_tar_gz(
    raw: &Path,
    out: &Path,
    source_date_epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<ExportedDisk, ExportError> {
    let disk_bytes = {
        let (_, raw_bytes) = open_disk(raw)?;
        round_up(raw_bytes, ALIGNMENT)
    };
    let partial = partial_path(out);
    let written = write_archive(raw, source_date_epoch, &partial, progress).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    finish(&partial, out)?;
    Ok(ExportedDisk {
        format: DiskFormat::GceTarGz,
        path: out.to_path_buf(),
        bytes: written.1,
        disk_bytes,
        sha256: written.0,
    })
}

/// The archive at `partial`; returns its sha256 and size.
fn write_archive(
    raw: &Path,
    source_date_epoch: u64,
    partial: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(String, u64), ExportError> {
    let (disk, raw_bytes) = open_disk(raw)?;
    let member_size = round_up(raw_bytes, ALIGNMENT);
    let header = member_header(member_size, source_date_epoch)?;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(partial)
        .map_err(io_error("create", partial))?;
    let hashing = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let gzip = GzBuilder::new()
        .mtime(0)
        .operating_system(GZIP_OS_UNIX)
        .write(hashing, Compression::default());
    let mut archive = tar::Builder::new(gzip);
    let data = disk
        .take(raw_bytes)
        .chain(io::repeat(0).take(member_size - raw_bytes));
    let mut reader = Progress::new(data, member_size, "gce: disk.raw compressed", progress);
    archive
        .append(&header, &mut reader)
        .map_err(io_error("write", partial))?;
    // The zeros of the padding always arrive; a short read is the raw disk's.
    check_read(raw, reader.read() - (member_size - raw_bytes), raw_bytes)?;
    let gzip = archive.into_inner().map_err(io_error("write", partial))?;
    let mut hashing = gzip.finish().map_err(io_error("write", partial))?;
    hashing.flush().map_err(io_error("write", partial))?;
    let HashingWriter {
        inner,
        hasher,
        written,
    } = hashing;
    let file = inner
        .into_inner()
        .map_err(|error| io_error("write", partial)(error.into_error()))?;
    file.sync_all().map_err(io_error("write", partial))?;
    Ok((hex::encode(sha2::Digest::finalize(hasher)), written))
}

#[cfg(test)]
mod header_tests {
    use super::*;

    #[test]
    fn the_member_header_is_old_gnu_with_fixed_owner_mode_and_time() {
        let header = member_header(3 * GIB, 1_795_305_600).unwrap();
        let bytes = header.as_bytes();
        assert_eq!(&bytes[257..265], b"ustar  \0", "old GNU magic and version");
        assert!(header.as_gnu().is_some());
        assert_eq!(header.path().unwrap().to_str(), Some(MEMBER));
        assert_eq!(header.entry_type(), tar::EntryType::Regular);
        assert_eq!(header.size().unwrap(), 3 * GIB);
        assert_eq!(header.mode().unwrap(), 0o644);
        assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
        assert_eq!(header.username().unwrap(), Some(""));
        assert_eq!(header.groupname().unwrap(), Some(""));
        assert_eq!(header.mtime().unwrap(), 1_795_305_600);
        // Over 8 GiB the size needs GNU's base-256 field, which GNU tar reads.
        let big = member_header(9 * GIB, 0).unwrap();
        assert_eq!(big.size().unwrap(), 9 * GIB);
        assert_eq!(big.as_bytes()[124] & 0x80, 0x80);
    }
}
