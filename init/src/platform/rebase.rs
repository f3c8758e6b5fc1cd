//! After the pivot: PID 1's code comes from the verified rootfs, and the initramfs is freed.
//!
//! PID 1 was started from the initramfs, a tmpfs. The switch into the rootfs deletes the
//! initramfs's files, but a deleted file lives as long as something maps it, and PID 1 maps its
//! own binary and every library of its closure: ~17 MiB of tmpfs that stayed allocated for the
//! node's whole life, ~11 MiB of it resident in PID 1 (docs/rootfs.md).
//!
//! The node image carries byte-identical copies of those files in the verified rootfs
//! ([`hawser_disk_format::rootfs::PID1_COPIES`]). [`onto_rootfs`] moves every mapping of an
//! initramfs file onto its copy, in place, at the same address, without restarting anything:
//!
//! 1. `/proc/self/smaps` lists PID 1's mappings; those on the initramfs's device (the device
//!    of `/proc/self/exe`) are the ones to move. Each file is compared with its copy byte for
//!    byte (the old one read through `/proc/self/map_files`); any difference, a missing copy
//!    or a shared mapping stops the whole move before anything changed.
//! 2. A mapping no byte of which was ever written (`Anonymous: 0 kB`, not writable: code,
//!    read-only data, the gaps `ld.so` leaves) is replaced by the same range of the copy
//!    (`mmap(MAP_FIXED)` over it: the same bytes at the same address). A writable mapping or
//!    one with written pages (`.data`, the relocated RELRO pages) is replaced by an anonymous
//!    copy of its current contents (`mremap` of a filled copy over it, atomic).
//! 3. Other threads (tokio's blocking pool, boringtun's) could write a data mapping between
//!    its copy and its replacement, so they are parked first: a real-time signal whose handler
//!    waits on a futex. While they are parked this thread neither allocates nor logs nor
//!    locks (a parked thread may hold the allocator's or the console's lock): everything is
//!    prepared before, and reported after.
//! 4. `/proc/self/exe` is pointed at the copy of `init` (`PR_SET_MM_EXE_FILE`), the last
//!    reference to the old binary.
//!
//! Nothing is moved unless every check passed, and a failure after the park leaves the
//! mappings already moved in place (each one is a complete, correct replacement); the boot
//! goes on in every case, with a warning naming what is still held.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod park;

use self::park::park_other_threads;

/// One mapping of `/proc/self/smaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub offset: u64,
    /// Device `major:minor`.
    pub dev: (u32, u32),
    pub inode: u64,
    /// The path without a trailing ` (deleted)`; `None` for anonymous mappings.
    pub path: Option<String>,
    /// `Anonymous:` in kB: pages of this mapping that were written (copied on write).
    pub anonymous_kb: u64,
}

impl Mapping {
    fn len(&self) -> usize {
        self.end - self.start
    }

    fn prot(&self) -> libc::c_int {
        let mut prot = libc::PROT_NONE;
        if self.read {
            prot |= libc::PROT_READ;
        }
        if self.write {
            prot |= libc::PROT_WRITE;
        }
        if self.exec {
            prot |= libc::PROT_EXEC;
        }
        prot
    }
}

/// Why the mappings were not moved.
#[derive(Debug, thiserror::Error)]
pub enum RebaseError {
    #[error("cannot read {path}")]
    Read {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("/proc/self/smaps line {line} is malformed: {text:?}")]
    Malformed { line: usize, text: String },
    #[error("the rootfs has no copy of {path} at {copy}")]
    NoCopy {
        path: String,
        copy: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the rootfs copy {copy} differs from PID 1's {path}")]
    Differs { path: String, copy: PathBuf },
    #[error("{path} is mapped shared; only private mappings are moved")]
    Shared { path: String },
    #[error("cannot park PID 1's other threads: {0}")]
    Park(String),
    #[error("moving the mapping {start:#x}-{end:#x} of {path} failed")]
    Move {
        start: usize,
        end: usize,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// What [`onto_rootfs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebased {
    /// Mappings replaced by the rootfs copy of their file.
    pub from_copies: usize,
    /// Mappings replaced by an anonymous copy of their contents.
    pub anonymous: usize,
    /// Bytes copied into anonymous memory.
    pub copied_bytes: usize,
    /// Other threads parked while the mappings moved.
    pub parked_threads: usize,
    /// How long they were parked.
    pub parked_for: Duration,
    /// Whether `/proc/self/exe` now names the copy (else the old binary stays allocated).
    pub exe_moved: bool,
}

/// Parses `/proc/self/smaps` (the `maps` header lines and their `Anonymous:` fields).
pub fn parse_smaps(text: &str) -> Result<Vec<Mapping>, RebaseError> {
    let mut mappings: Vec<Mapping> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let malformed = || RebaseError::Malformed {
            line: index + 1,
            text: line.to_owned(),
        };
        let first = line.split_whitespace().next().unwrap_or_default();
        if let Some(range) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            mappings.push(parse_header(line, range).ok_or_else(malformed)?);
        } else if let Some(rest) = line.strip_prefix("Anonymous:") {
            let kb = rest
                .trim()
                .strip_suffix("kB")
                .and_then(|kb| kb.trim().parse().ok())
                .ok_or_else(malformed)?;
            if let Some(last) = mappings.last_mut() {
                last.anonymous_kb = kb;
            }
        }
    }
    Ok(mappings)
}

fn parse_header(line: &str, (start, end): (&str, &str)) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ').filter(|field| !field.is_empty());
    let _range = fields.next()?;
    let perms = fields.next()?.as_bytes();
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let path = fields
        .next()
        .map(str::trim)
        .filter(|path| !path.is_empty())
        .map(|path| path.strip_suffix(" (deleted)").unwrap_or(path).to_owned());
    if perms.len() != 4 {
        return None;
    }
    Some(Mapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        shared: perms[3] == b's',
        offset,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode,
        path,
        anonymous_kb: 0,
    })
}

/// How one mapping is moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// The same range of the copy (`copy` indexes the opened copies).
    FromCopy { mapping: Mapping, copy: usize },
    /// An anonymous copy of the current contents.
    Anonymous { mapping: Mapping },
}

/// Which mappings move, and how: those on `initramfs_dev` with a file. A mapping never
/// written is taken from the copy; a writable one, or one with written pages, is copied.
pub fn plan(
    mappings: &[Mapping],
    initramfs_dev: (u32, u32),
) -> Result<(Vec<String>, Vec<Move>), RebaseError> {
    let mut files: Vec<String> = Vec::new();
    let mut moves = Vec::new();
    for mapping in mappings {
        let Some(path) = &mapping.path else { continue };
        if mapping.dev != initramfs_dev || mapping.inode == 0 {
            continue;
        }
        if mapping.shared {
            return Err(RebaseError::Shared { path: path.clone() });
        }
        let copy = match files.iter().position(|file| file == path) {
            Some(index) => index,
            None => {
                files.push(path.clone());
                files.len() - 1
            }
        };
        moves.push(if mapping.write || mapping.anonymous_kb > 0 {
            Move::Anonymous {
                mapping: mapping.clone(),
            }
        } else {
            Move::FromCopy {
                mapping: mapping.clone(),
                copy,
            }
        });
    }
    Ok((files, moves))
}

/// Moves PID 1's mappings of initramfs files onto their copies under `/` +
/// [`hawser_disk_format::rootfs::PID1_COPIES`]. `Ok(None)`: nothing to move (no copies: an
/// image without a rootfs, or PID 1 not started from a tmpfs).
pub fn onto_rootfs() -> Result<Option<Rebased>, RebaseError> {
    let copies_root = Path::new("/").join(hawser_disk_format::rootfs::PID1_COPIES);
    if !copies_root.join("init").is_file() {
        return Ok(None);
    }
    let initramfs_dev = initramfs_device().ok_or(RebaseError::Read {
        path: "/proc/self/exe",
        source: io::Error::from(io::ErrorKind::NotFound),
    })?;
    let smaps = read_smaps()?;
    let (files, moves) = plan(&smaps, initramfs_dev)?;
    if moves.is_empty() {
        return Ok(None);
    }
    // Every file against its copy, before anything changes.
    let mut copies = Vec::with_capacity(files.len());
    for path in &files {
        let copy_path = copies_root.join(path.trim_start_matches('/'));
        let copy = File::open(&copy_path).map_err(|source| RebaseError::NoCopy {
            path: path.clone(),
            copy: copy_path.clone(),
            source,
        })?;
        let old = open_mapped(&moves, path)?;
        if !same_bytes(&old, &copy).map_err(|source| RebaseError::NoCopy {
            path: path.clone(),
            copy: copy_path.clone(),
            source,
        })? {
            return Err(RebaseError::Differs {
                path: path.clone(),
                copy: copy_path,
            });
        }
        copies.push(copy);
    }
    let exe_copy = files
        .iter()
        .position(|path| path == "/init")
        .map(|index| &copies[index]);

    let mut failures: Vec<Option<io::Error>> = Vec::with_capacity(moves.len());
    let parked = park_other_threads()?;
    let parked_at = Instant::now();
    for one in &moves {
        failures.push(match one {
            Move::FromCopy { mapping, copy } => from_copy(mapping, &copies[*copy]).err(),
            Move::Anonymous { mapping } => anonymous_copy(mapping).err(),
        });
    }
    let parked_for = parked_at.elapsed();
    let parked_threads = parked.count;
    drop(parked);

    let mut rebased = Rebased {
        parked_threads,
        parked_for,
        ..Rebased::default()
    };
    for (one, failure) in moves.iter().zip(failures) {
        let mapping = match one {
            Move::FromCopy { mapping, .. } | Move::Anonymous { mapping } => mapping,
        };
        if let Some(source) = failure {
            return Err(RebaseError::Move {
                start: mapping.start,
                end: mapping.end,
                path: mapping.path.clone().unwrap_or_default(),
                source,
            });
        }
        match one {
            Move::FromCopy { .. } => rebased.from_copies += 1,
            Move::Anonymous { mapping } => {
                rebased.anonymous += 1;
                rebased.copied_bytes += mapping.len();
            }
        }
    }
    if let Some(exe_copy) = exe_copy {
        rebased.exe_moved = set_exe_file(exe_copy).is_ok();
    }
    Ok(Some(rebased))
}

fn read_smaps() -> Result<Vec<Mapping>, RebaseError> {
    let text = std::fs::read_to_string("/proc/self/smaps").map_err(|source| RebaseError::Read {
        path: "/proc/self/smaps",
        source,
    })?;
    parse_smaps(&text)
}

/// The device PID 1 was started from (the initramfs), as `/proc/self/exe` named it at the first
/// call: [`remember_initramfs_device`] makes that call at the start of /init, before the move
/// points `/proc/self/exe` at the rootfs copy.
fn initramfs_device() -> Option<(u32, u32)> {
    static DEVICE: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *DEVICE.get_or_init(|| {
        let exe = std::fs::metadata("/proc/self/exe").ok()?;
        let dev = exe.dev() as libc::dev_t;
        Some((libc::major(dev), libc::minor(dev)))
    })
}

/// Notes the initramfs's device while `/proc/self/exe` is still on it; call first thing.
pub fn remember_initramfs_device() {
    initramfs_device();
}

/// The mappings still backed by the initramfs (for the memory line after the move).
pub fn initramfs_mappings() -> Option<usize> {
    let dev = initramfs_device()?;
    let smaps = read_smaps().ok()?;
    Some(
        smaps
            .iter()
            .filter(|m| m.path.is_some() && m.inode != 0 && m.dev == dev)
            .count(),
    )
}

/// The old (deleted) file behind a mapping of `path`, through `/proc/self/map_files`.
fn open_mapped(moves: &[Move], path: &str) -> Result<File, RebaseError> {
    let mapping = moves
        .iter()
        .map(|one| match one {
            Move::FromCopy { mapping, .. } | Move::Anonymous { mapping } => mapping,
        })
        .find(|mapping| mapping.path.as_deref() == Some(path));
    let Some(mapping) = mapping else {
        return Err(RebaseError::Read {
            path: "/proc/self/map_files",
            source: io::Error::from(io::ErrorKind::NotFound),
        });
    };
    File::open(format!(
        "/proc/self/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    ))
    .map_err(|source| RebaseError::Read {
        path: "/proc/self/map_files",
        source,
    })
}

fn same_bytes(a: &File, b: &File) -> io::Result<bool> {
    let (len_a, len_b) = (a.metadata()?.len(), b.metadata()?.len());
    if len_a != len_b {
        return Ok(false);
    }
    let mut buf_a = vec![0u8; 1 << 16];
    let mut buf_b = vec![0u8; 1 << 16];
    let mut offset = 0u64;
    while offset < len_a {
        let want = usize::try_from((len_a - offset).min(1 << 16)).unwrap_or(1 << 16);
        a.read_exact_at(&mut buf_a[..want], offset)?;
        b.read_exact_at(&mut buf_b[..want], offset)?;
        if buf_a[..want] != buf_b[..want] {
            return Ok(false);
        }
        offset += want as u64;
    }
    Ok(true)
}

/// Replaces `mapping` by the same range of `copy`. Runs parked: no allocation.
fn from_copy(mapping: &Mapping, copy: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let offset = libc::off_t::try_from(mapping.offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: MAP_FIXED over a mapping of PID 1 itself with the same length, protection and
    // offset of a file with the same bytes (checked by `same_bytes`): every byte at every
    // address stays what it was, so no code or data of this process sees a difference.
    let at = unsafe {
        libc::mmap(
            mapping.start as *mut libc::c_void,
            mapping.len(),
            mapping.prot(),
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            copy.as_raw_fd(),
            offset,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Replaces `mapping` by an anonymous copy of its current contents. Runs parked: no
/// allocation.
fn anonymous_copy(mapping: &Mapping) -> io::Result<()> {
    let len = mapping.len();
    // SAFETY: a fresh private anonymous mapping of `len` bytes.
    let fresh = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if fresh == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let undo = |error: io::Error| {
        // SAFETY: `fresh` is the mapping made above, not yet moved.
        unsafe { libc::munmap(fresh, len) };
        Err(error)
    };
    if mapping.read {
        // SAFETY: `mapping` is a readable mapping of this process of `len` bytes (from
        // smaps, unchanged since: every other thread is parked), `fresh` a writable one of the
        // same length; they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(mapping.start as *const u8, fresh.cast::<u8>(), len)
        };
    }
    // SAFETY: `fresh` is our mapping of `len` bytes.
    if unsafe { libc::mprotect(fresh, len, mapping.prot()) } != 0 {
        return undo(io::Error::last_os_error());
    }
    // SAFETY: moves `fresh` over `mapping` in one step (the old range is unmapped by the
    // kernel as part of the move); it holds the same bytes, with the same protection.
    let moved = unsafe {
        libc::mremap(
            fresh,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            mapping.start as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        return undo(io::Error::last_os_error());
    }
    Ok(())
}

/// `/proc/self/exe` → `copy` (`PR_SET_MM_EXE_FILE`; the kernel refuses while the old binary
/// is still mapped).
fn set_exe_file(copy: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: prctl with integer arguments; the descriptor is open for the call's duration.
    let result = unsafe {
        libc::prctl(
            libc::PR_SET_MM,
            libc::PR_SET_MM_EXE_FILE,
            copy.as_raw_fd() as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// --- parking the other threads ---------------------------------------------------------------

#[cfg(test)]
mod tests;
