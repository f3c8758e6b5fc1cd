//! The file each cloud imports, written from the raw GPT disk next to it: for GCE `disk.raw` in
//! a GNU tar, gzip-compressed ([`gce`]); for Azure a fixed VHD ([`vhd`]); AWS and the bare
//! confidential guests take the raw disk itself.
//!
//! Like the disk, each file is a pure function of the raw disk and `SOURCE_DATE_EPOCH`: fixed
//! owners, modes and times, no host names or paths, no wall clock; a VHD's unique ID is derived
//! from the disk's content. The disk's bytes are never changed, only followed by zeros up to the
//! size the cloud requires (whole MiB for Azure, whole GiB for GCE): the primary GPT, which
//! firmware measures into PCR 5, stays as built, and the backup GPT stays where the raw disk has
//! it (clouds resize boot disks anyway; Linux and OVMF use the primary table).
//!
//! Each file is written under a temporary name and renamed when complete. Progress goes to the
//! caller's `progress` line by line, every [`PROGRESS_STEP`] bytes of disk.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::platform::{DiskFormat, ImagePlatform};
use crate::tool::{IoError, io_error};

pub mod gce;
#[cfg(test)]
mod tests;
pub mod vhd;

pub(crate) const MIB: u64 = 1024 * 1024;
pub(crate) const GIB: u64 = 1024 * MIB;

/// How much disk passes between two progress lines.
pub const PROGRESS_STEP: u64 = 256 * MIB;

/// The file a cloud imports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedDisk {
    pub format: DiskFormat,
    /// The file to upload.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// The size of the disk the cloud creates from it (the raw disk and its padding).
    pub disk_bytes: u64,
    /// sha256 of the file, lowercase hex.
    pub sha256: String,
}

impl std::fmt::Display for ExportedDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |n: u64| n as f64 / MIB as f64;
        let what = match self.format {
            DiskFormat::Raw => "raw disk",
            DiskFormat::GceTarGz => "tar.gz of disk.raw",
            DiskFormat::FixedVhd => "fixed VHD",
        };
        write!(
            f,
            "upload   {:>7.2} MiB {what} ({:.0} MiB disk)  {}\nsha256   {}  {}",
            mib(self.bytes),
            mib(self.disk_bytes),
            self.path.display(),
            self.sha256,
            self.path
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
        )
    }
}

/// Why a platform's file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The raw disk could not be read, or the output written.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The raw disk has no bytes.
    #[error("the raw disk {0} is empty")]
    EmptyDisk(PathBuf),
    /// The raw disk changed size while it was read.
    #[error(
        "the raw disk {path} changed while it was read: {read} bytes read, {expected} expected"
    )]
    DiskChanged {
        path: PathBuf,
        read: u64,
        expected: u64,
    },
    /// `SOURCE_DATE_EPOCH` is past what a VHD footer's time stamp (32-bit seconds since
    /// 2000-01-01) holds.
    #[error("SOURCE_DATE_EPOCH {epoch} is past 2136-02-07, the last time a VHD footer can hold")]
    VhdTimestamp { epoch: u64 },
    /// The tar header of the GCE archive could not be made.
    #[error("making the tar header of {member} failed")]
    TarHeader {
        member: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Writes the file `platform` imports for the raw disk `raw` into `out_dir` (nothing is
/// written for [`DiskFormat::Raw`]: the raw disk is the file, and only its digest is taken).
pub fn export_disk(
    platform: ImagePlatform,
    raw: &Path,
    out_dir: &Path,
    source_date_epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<ExportedDisk, ExportError> {
    match platform.disk_format() {
        DiskFormat::Raw => raw_disk(raw, progress),
        DiskFormat::GceTarGz => gce::write_gce_tar_gz(
            raw,
            &out_dir.join(gce::GCE_FILE),
            source_date_epoch,
            progress,
        ),
        DiskFormat::FixedVhd => vhd::write_fixed_vhd(
            raw,
            &out_dir.join(vhd::VHD_FILE),
            source_date_epoch,
            progress,
        ),
    }
}

/// The raw disk as the upload file: its size and digest.
fn raw_disk(raw: &Path, progress: &mut dyn FnMut(&str)) -> Result<ExportedDisk, ExportError> {
    let (mut file, bytes) = open_disk(raw)?;
    let mut reader = Progress::new(&mut file, bytes, "raw disk: sha256 of", progress);
    let mut hasher = Sha256::new();
    let read = io::copy(&mut reader, &mut hasher).map_err(io_error("read", raw))?;
    check_read(raw, read, bytes)?;
    Ok(ExportedDisk {
        format: DiskFormat::Raw,
        path: raw.to_path_buf(),
        bytes,
        disk_bytes: bytes,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// Opens the raw disk and returns it with its size, refusing an empty one.
pub(crate) fn open_disk(raw: &Path) -> Result<(File, u64), ExportError> {
    let file = File::open(raw).map_err(io_error("read", raw))?;
    let bytes = file.metadata().map_err(io_error("read", raw))?.len();
    if bytes == 0 {
        return Err(ExportError::EmptyDisk(raw.to_path_buf()));
    }
    Ok((file, bytes))
}

/// Refuses a read that did not return the size the disk had when it was opened.
pub(crate) fn check_read(raw: &Path, read: u64, expected: u64) -> Result<(), ExportError> {
    if read == expected {
        Ok(())
    } else {
        Err(ExportError::DiskChanged {
            path: raw.to_path_buf(),
            read,
            expected,
        })
    }
}

/// `bytes` rounded up to a multiple of `alignment`.
pub fn round_up(bytes: u64, alignment: u64) -> u64 {
    bytes.div_ceil(alignment) * alignment
}

/// `out` with `.partial` appended to its name: where a file is written before the rename.
pub(crate) fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    out.with_file_name(name)
}

/// Renames the finished `partial` to `out`.
pub(crate) fn finish(partial: &Path, out: &Path) -> Result<(), ExportError> {
    std::fs::rename(partial, out).map_err(io_error("rename the finished file to", out))?;
    Ok(())
}

/// A reader that reports every [`PROGRESS_STEP`] bytes, and at the end, how much of `total`
/// it has passed on.
pub(crate) struct Progress<'a, R> {
    inner: R,
    read: u64,
    total: u64,
    next_report: u64,
    what: &'static str,
    progress: &'a mut dyn FnMut(&str),
}

impl<'a, R: Read> Progress<'a, R> {
    pub(crate) fn new(
        inner: R,
        total: u64,
        what: &'static str,
        progress: &'a mut dyn FnMut(&str),
    ) -> Self {
        Progress {
            inner,
            read: 0,
            total,
            next_report: PROGRESS_STEP,
            what,
            progress,
        }
    }

    /// The bytes passed on so far.
    pub(crate) fn read(&self) -> u64 {
        self.read
    }
}

impl<R: Read> Read for Progress<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read >= self.next_report || (n == 0 && self.next_report != u64::MAX) {
            (self.progress)(&format!(
                "{} {} of {} MiB",
                self.what,
                self.read / MIB,
                self.total.div_ceil(MIB)
            ));
            self.next_report = if n == 0 {
                u64::MAX
            } else {
                self.read + PROGRESS_STEP
            };
        }
        Ok(n)
    }
}

/// A writer that hashes and counts what passes through it.
pub(crate) struct HashingWriter<W> {
    pub(crate) inner: W,
    pub(crate) hasher: Sha256,
    pub(crate) written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
