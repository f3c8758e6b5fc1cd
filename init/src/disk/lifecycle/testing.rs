//! Test doubles of the lifecycle's seams, for its own tests and for the tests of what runs on
//! top of it (the node's grants, `crate::kube::grants`): an in-memory disk that can lose power
//! after a number of bytes, and a platform that records its calls, can fail mkfs or mount,
//! and can lose power while the first boot keeps its files.

use std::cell::RefCell;
use std::io;
use std::path::{Path, PathBuf};

use hawser_luks2::Integrity;

use super::{BlockIo, DmError, Kept, MkfsError, Platform, VolumeKey};
use crate::disk::probe::MIN_DISK_SIZE;

/// An in-memory disk; optionally fails writes once `budget` bytes have been written (a
/// power cut: the failing write lands partially, in 512-byte sectors).
pub(crate) struct MemDisk {
    pub data: RefCell<Vec<u8>>,
    pub budget: RefCell<Option<usize>>,
}

impl MemDisk {
    pub fn new() -> Self {
        MemDisk {
            data: RefCell::new(vec![0; MIN_DISK_SIZE as usize]),
            budget: RefCell::new(None),
        }
    }
    pub fn bytes(&self) -> Vec<u8> {
        self.data.borrow().clone()
    }
}

impl BlockIo for MemDisk {
    fn size(&self) -> u64 {
        self.data.borrow().len() as u64
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let at = offset as usize;
        buf.copy_from_slice(&self.data.borrow()[at..at + buf.len()]);
        Ok(())
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let at = offset as usize;
        let mut budget = self.budget.borrow_mut();
        let n = match *budget {
            Some(left) if left < buf.len() => left / 512 * 512,
            _ => buf.len(),
        };
        self.data.borrow_mut()[at..at + n].copy_from_slice(&buf[..n]);
        if let Some(left) = budget.as_mut() {
            *left -= n;
            if n < buf.len() {
                return Err(io::Error::other("power cut"));
            }
        }
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Map(String, Integrity),
    Unmap,
    Wipe,
    Mkfs,
    Mount,
    Keep(PathBuf),
}

#[derive(Default)]
pub(crate) struct Recorder {
    pub calls: RefCell<Vec<Call>>,
    pub fail_mkfs: bool,
    pub fail_mount: bool,
    pub counter: RefCell<u8>,
    /// The directory that stands for the filesystem: mkfs empties it, as a real mkfs leaves
    /// nothing of an earlier boot's files.
    pub filesystem: Option<PathBuf>,
    /// The power goes while keeping the first boot's file number `n` (from 0): half of it
    /// reaches its temporary, nothing after it is written.
    pub cut_keep_at: Option<usize>,
}

impl Recorder {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }
}

impl Platform for Recorder {
    fn map(&self, uuid: &str, integrity: Integrity, key: &VolumeKey) -> Result<PathBuf, DmError> {
        assert_eq!(key.len(), integrity.key_len());
        self.calls
            .borrow_mut()
            .push(Call::Map(uuid.to_owned(), integrity));
        Ok(PathBuf::from("/dev/dm-0"))
    }
    fn unmap(&self) {
        self.calls.borrow_mut().push(Call::Unmap);
    }
    fn wipe(&self, _: &Path) -> io::Result<u64> {
        self.calls.borrow_mut().push(Call::Wipe);
        Ok(4096)
    }
    fn mkfs(&self, _: &Path) -> Result<(), MkfsError> {
        self.calls.borrow_mut().push(Call::Mkfs);
        if self.fail_mkfs {
            return Err(MkfsError::Spawn {
                program: "mke2fs",
                source: std::io::Error::other("power cut during mkfs"),
            });
        }
        if let Some(fs) = &self.filesystem {
            let failed = |source| MkfsError::Spawn {
                program: "mke2fs",
                source,
            };
            std::fs::remove_dir_all(fs).map_err(failed)?;
            std::fs::create_dir(fs).map_err(failed)?;
        }
        Ok(())
    }
    fn mount(&self, _: &Path, _: &Path) -> io::Result<()> {
        self.calls.borrow_mut().push(Call::Mount);
        if self.fail_mount {
            return Err(io::Error::from_raw_os_error(libc::EUCLEAN));
        }
        Ok(())
    }
    fn random(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut counter = self.counter.borrow_mut();
        *counter = counter.wrapping_add(1);
        buf.fill(*counter);
        Ok(())
    }
    fn keep(&self, root: &Path, kept: &Kept) -> io::Result<()> {
        let n = self
            .calls
            .borrow()
            .iter()
            .filter(|c| matches!(c, Call::Keep(_)))
            .count();
        self.calls
            .borrow_mut()
            .push(Call::Keep(kept.path().to_owned()));
        if self.cut_keep_at == Some(n) {
            if let Kept::File { path, bytes, .. } = kept {
                let mut temporary = root.join(path).into_os_string();
                temporary.push(".tmp");
                if let Some(parent) = root.join(path).parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(temporary, &bytes[..bytes.len() / 2])?;
            }
            return Err(io::Error::other("power cut"));
        }
        kept.write_under(root)
    }
}
