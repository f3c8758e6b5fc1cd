//! A deterministic writer for the newc ("070701") cpio format, the format the Linux kernel
//! unpacks an initramfs from.
//!
//! Why not a general archiver: the initramfs is measured (PCR 9 and, inside the UKI, PCR 11), so
//! the same inputs must give the same bytes on every machine. Everything a general archiver takes
//! from the build host is fixed here instead:
//!
//! - entries are written sorted by path (byte order), whatever order they were added in, and every
//!   parent directory exists as an entry before its children (a path's parent is a prefix of it,
//!   so it always sorts first);
//! - owner and group are 0, the modification time is the caller's `SOURCE_DATE_EPOCH`;
//! - inode numbers are 1, 2, 3, … in output order; device numbers of the archive are 0;
//! - regular files, symlinks and device nodes have one link, directories two: there are no hard
//!   links, so the kernel's hard-link detection (regular files with `nlink >= 2`) never triggers.
//!
//! Paths are relative ("usr/lib/…", no leading slash, no "." or ".." components); the root
//! directory itself is not an entry, as the kernel's rootfs already exists.

use std::collections::BTreeMap;
use std::fmt;

/// The newc magic: the "new ASCII" format without checksums.
const NEWC_MAGIC: &[u8; 6] = b"070701";
/// The name of the entry that ends every cpio archive.
const TRAILER_NAME: &str = "TRAILER!!!";

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;
const PERMISSION_BITS: u32 = 0o7777;

/// Mode of directories the archive creates on its own as parents of other entries.
const IMPLICIT_DIR_MODE: u32 = 0o755;

/// Why an entry could not be added or the archive could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    /// A path that a newc archive for the kernel cannot hold.
    #[error("cpio path {path:?} is invalid: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    /// Two different entries for the same path.
    #[error("cpio path {path:?} is already a {existing} and cannot also be a {new}")]
    Conflict {
        path: String,
        existing: EntryKindName,
        new: EntryKindName,
    },
    /// An entry whose parent path is already something other than a directory.
    #[error(
        "cannot add {path:?} to the cpio archive: its parent {parent:?} is a {existing}, not a directory"
    )]
    ParentNotDirectory {
        path: String,
        parent: String,
        existing: EntryKindName,
    },
    /// A value that does not fit the format's 32-bit header fields.
    #[error("cpio entry {path:?}: {field} {value} does not fit the newc format's 32-bit field")]
    FieldOverflow {
        path: String,
        field: &'static str,
        value: u64,
    },
    /// Permission bits outside 0o7777.
    #[error("cpio entry {path:?}: mode {mode:#o} has bits outside the permission bits 0o7777")]
    InvalidMode { path: String, mode: u32 },
}

/// The kind of an entry, for error messages and manifests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKindName {
    Directory,
    File,
    Symlink,
    CharDevice,
}

impl fmt::Display for EntryKindName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntryKindName::Directory => "directory",
            EntryKindName::File => "regular file",
            EntryKindName::Symlink => "symlink",
            EntryKindName::CharDevice => "character device",
        })
    }
}

/// One archive entry's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Directory { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: String },
    CharDevice { mode: u32, major: u32, minor: u32 },
}

impl Entry {
    /// The kind of this entry.
    pub fn kind(&self) -> EntryKindName {
        match self {
            Entry::Directory { .. } => EntryKindName::Directory,
            Entry::File { .. } => EntryKindName::File,
            Entry::Symlink { .. } => EntryKindName::Symlink,
            Entry::CharDevice { .. } => EntryKindName::CharDevice,
        }
    }

    /// The bytes stored after the header: file contents, or a symlink's target.
    pub fn data(&self) -> &[u8] {
        match self {
            Entry::File { data, .. } => data,
            Entry::Symlink { target } => target.as_bytes(),
            Entry::Directory { .. } | Entry::CharDevice { .. } => &[],
        }
    }

    /// The full `st_mode`: file type and permission bits.
    fn st_mode(&self) -> u32 {
        match self {
            Entry::Directory { mode } => S_IFDIR | mode,
            Entry::File { mode, .. } => S_IFREG | mode,
            Entry::Symlink { .. } => S_IFLNK | 0o777,
            Entry::CharDevice { mode, .. } => S_IFCHR | mode,
        }
    }
}

/// An in-memory newc archive: a map from path to entry, written in path order.
#[derive(Debug, Default, Clone)]
pub struct CpioArchive {
    entries: BTreeMap<String, Entry>,
}

impl CpioArchive {
    /// An empty archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a directory. Adding a directory that exists (also one created as a parent) sets its
    /// permission bits.
    pub fn add_dir(&mut self, path: &str, mode: u32) -> Result<(), CpioError> {
        self.insert(path, Entry::Directory { mode })
    }

    /// Adds a regular file. Adding the same path twice with identical content and mode is allowed.
    pub fn add_file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> Result<(), CpioError> {
        self.insert(path, Entry::File { mode, data })
    }

    /// Adds a symbolic link whose target is stored as written (relative or absolute).
    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<(), CpioError> {
        if target.is_empty() || target.contains('\0') {
            return Err(CpioError::InvalidPath {
                path: path.to_owned(),
                reason: "a symlink target must be non-empty and contain no NUL byte",
            });
        }
        self.insert(
            path,
            Entry::Symlink {
                target: target.to_owned(),
            },
        )
    }

    /// Adds a character device node.
    pub fn add_char_device(
        &mut self,
        path: &str,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), CpioError> {
        self.insert(path, Entry::CharDevice { mode, major, minor })
    }

    /// The entries in output order (sorted by path), parents before children.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries
            .iter()
            .map(|(path, entry)| (path.as_str(), entry))
    }

    /// The entry at `path`, if any.
    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// The number of entries (without the trailer).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the archive has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Serialises the archive with every entry's modification time set to `mtime`
    /// (`SOURCE_DATE_EPOCH`). The same entries and `mtime` always give the same bytes.
    pub fn to_bytes(&self, mtime: u64) -> Result<Vec<u8>, CpioError> {
        let mtime = u32::try_from(mtime).map_err(|_| CpioError::FieldOverflow {
            path: TRAILER_NAME.to_owned(),
            field: "mtime",
            value: mtime,
        })?;
        let capacity: usize = self
            .entries
            .iter()
            .map(|(path, entry)| 110 + path.len() + 4 + entry.data().len() + 3)
            .sum();
        let mut out = Vec::with_capacity(capacity + 128);
        for (index, (path, entry)) in self.entries.iter().enumerate() {
            let (rdev_major, rdev_minor) = match entry {
                Entry::CharDevice { major, minor, .. } => (*major, *minor),
                _ => (0, 0),
            };
            let data = entry.data();
            let size = u32::try_from(data.len()).map_err(|_| CpioError::FieldOverflow {
                path: path.clone(),
                field: "size",
                value: data.len() as u64,
            })?;
            let ino = u32::try_from(index + 1).map_err(|_| CpioError::FieldOverflow {
                path: path.clone(),
                field: "inode number",
                value: index as u64 + 1,
            })?;
            let header = Header {
                ino,
                mode: entry.st_mode(),
                nlink: if entry.kind() == EntryKindName::Directory {
                    2
                } else {
                    1
                },
                mtime,
                size,
                rdev_major,
                rdev_minor,
            };
            header.write(&mut out, path);
            out.extend_from_slice(data);
            pad4(&mut out);
        }
        let trailer = Header {
            ino: 0,
            mode: 0,
            nlink: 1,
            mtime: 0,
            size: 0,
            rdev_major: 0,
            rdev_minor: 0,
        };
        trailer.write(&mut out, TRAILER_NAME);
        Ok(out)
    }

    fn insert(&mut self, path: &str, entry: Entry) -> Result<(), CpioError> {
        validate_path(path)?;
        let mode = match &entry {
            Entry::Directory { mode }
            | Entry::File { mode, .. }
            | Entry::CharDevice { mode, .. } => Some(*mode),
            Entry::Symlink { .. } => None,
        };
        if let Some(mode) = mode
            && mode & !PERMISSION_BITS != 0
        {
            return Err(CpioError::InvalidMode {
                path: path.to_owned(),
                mode,
            });
        }
        self.ensure_parents(path)?;
        match self.entries.get_mut(path) {
            None => {
                self.entries.insert(path.to_owned(), entry);
                Ok(())
            }
            Some(Entry::Directory { mode }) if matches!(entry, Entry::Directory { .. }) => {
                if let Entry::Directory { mode: new_mode } = entry {
                    *mode = new_mode;
                }
                Ok(())
            }
            Some(existing) if *existing == entry => Ok(()),
            Some(existing) => Err(CpioError::Conflict {
                path: path.to_owned(),
                existing: existing.kind(),
                new: entry.kind(),
            }),
        }
    }

    /// Creates every missing ancestor of `path` as a directory (mode 0755).
    fn ensure_parents(&mut self, path: &str) -> Result<(), CpioError> {
        for (end, _) in path.match_indices('/') {
            let parent = &path[..end];
            match self.entries.get(parent) {
                None => {
                    self.entries.insert(
                        parent.to_owned(),
                        Entry::Directory {
                            mode: IMPLICIT_DIR_MODE,
                        },
                    );
                }
                Some(Entry::Directory { .. }) => {}
                Some(other) => {
                    return Err(CpioError::ParentNotDirectory {
                        path: path.to_owned(),
                        parent: parent.to_owned(),
                        existing: other.kind(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Rejects paths the kernel would interpret differently from what the caller meant.
fn validate_path(path: &str) -> Result<(), CpioError> {
    let invalid = |reason| {
        Err(CpioError::InvalidPath {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return invalid("it is empty");
    }
    if path.starts_with('/') {
        return invalid("it must be relative (no leading '/')");
    }
    if path.contains('\0') {
        return invalid("it contains a NUL byte");
    }
    if path == TRAILER_NAME {
        return invalid("it is the name of the end-of-archive marker");
    }
    for component in path.split('/') {
        match component {
            "" => return invalid("it has an empty component (\"//\" or a trailing '/')"),
            "." | ".." => return invalid("it has a \".\" or \"..\" component"),
            _ => {}
        }
    }
    Ok(())
}

/// The fields of a newc header that vary; the rest (uid, gid, device, check) are always 0.
struct Header {
    ino: u32,
    mode: u32,
    nlink: u32,
    mtime: u32,
    size: u32,
    rdev_major: u32,
    rdev_minor: u32,
}

impl Header {
    /// Appends the 110-byte header, the NUL-terminated name and the padding to a 4-byte boundary.
    fn write(&self, out: &mut Vec<u8>, name: &str) {
        let start = out.len();
        out.extend_from_slice(NEWC_MAGIC);
        // The name size counts the terminating NUL; names are validated to fit easily, and
        // a u32 overflow would need a 4 GiB path.
        let name_size = name.len() as u32 + 1;
        for field in [
            self.ino,
            self.mode,
            0, // uid
            0, // gid
            self.nlink,
            self.mtime,
            self.size,
            0, // devmajor
            0, // devminor
            self.rdev_major,
            self.rdev_minor,
            name_size,
            0, // check (unused by newc)
        ] {
            out.extend_from_slice(format!("{field:08X}").as_bytes());
        }
        debug_assert_eq!(out.len() - start, 110);
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        pad4(out);
    }
}

/// Pads with NUL bytes to a multiple of four. Every header starts 4-aligned, so aligning the
/// absolute offset aligns relative to the header as the format requires.
fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const EPOCH: u64 = 1_700_000_000;

    fn sample() -> CpioArchive {
        let mut archive = CpioArchive::new();
        archive
            .add_file("usr/bin/hello", 0o755, b"#!/bin/sh\necho hi\n".to_vec())
            .unwrap();
        archive.add_symlink("bin", "usr/bin").unwrap();
        archive.add_char_device("dev/console", 0o600, 5, 1).unwrap();
        archive.add_dir("proc", 0o555).unwrap();
        archive.add_file("init", 0o755, b"x".to_vec()).unwrap();
        archive
    }

    /// Reads a header field (0-based, after the magic) of the entry at `offset`.
    fn field(bytes: &[u8], offset: usize, index: usize) -> u32 {
        let start = offset + 6 + index * 8;
        u32::from_str_radix(std::str::from_utf8(&bytes[start..start + 8]).unwrap(), 16).unwrap()
    }

    #[test]
    fn tiny_archive_byte_layout() {
        let mut archive = CpioArchive::new();
        archive.add_file("a", 0o644, b"hello".to_vec()).unwrap();
        let bytes = archive.to_bytes(EPOCH).unwrap();
        // Header (110) + "a\0" (2) = 112, already aligned; data 5 -> padded to 8.
        let expected_header = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            1, 0o100644, 0, 0, 1, EPOCH, 5, 0, 0, 0, 0, 2, 0
        );
        assert_eq!(&bytes[..110], expected_header.as_bytes());
        assert_eq!(&bytes[110..112], b"a\0");
        assert_eq!(&bytes[112..117], b"hello");
        assert_eq!(&bytes[117..120], &[0, 0, 0]);
        // The trailer: header + "TRAILER!!!\0" (11) = 121 -> padded to 124.
        assert_eq!(&bytes[120..126], b"070701");
        assert_eq!(field(&bytes, 120, 11), 11);
        assert_eq!(&bytes[230..241], b"TRAILER!!!\0");
        assert_eq!(bytes.len(), 120 + 124);
        assert_eq!(bytes.len() % 4, 0);
    }

    #[test]
    fn entries_are_sorted_with_parents_first_and_numbered() {
        let archive = sample();
        let paths: Vec<&str> = archive.entries().map(|(path, _)| path).collect();
        assert_eq!(
            paths,
            [
                "bin",
                "dev",
                "dev/console",
                "init",
                "proc",
                "usr",
                "usr/bin",
                "usr/bin/hello"
            ]
        );
        let bytes = archive.to_bytes(EPOCH).unwrap();
        // Walk the headers: inode numbers count up from 1, nlink is 2 only for directories.
        let mut offset = 0;
        let mut ino = 1;
        loop {
            let name_size = field(&bytes, offset, 11) as usize;
            let name = &bytes[offset + 110..offset + 110 + name_size - 1];
            if name == TRAILER_NAME.as_bytes() {
                break;
            }
            let mode = field(&bytes, offset, 1);
            assert_eq!(field(&bytes, offset, 0), ino);
            assert_eq!(field(&bytes, offset, 2), 0, "uid");
            assert_eq!(field(&bytes, offset, 3), 0, "gid");
            let expected_nlink = if mode & 0o170000 == S_IFDIR { 2 } else { 1 };
            assert_eq!(field(&bytes, offset, 4), expected_nlink);
            assert_eq!(field(&bytes, offset, 5) as u64, EPOCH);
            let size = field(&bytes, offset, 6) as usize;
            offset = (offset + 110 + name_size).next_multiple_of(4);
            offset = (offset + size).next_multiple_of(4);
            ino += 1;
        }
        assert_eq!(ino, 9);
    }

    #[test]
    fn output_does_not_depend_on_insertion_order() {
        let forward = sample().to_bytes(EPOCH).unwrap();
        let mut reversed = CpioArchive::new();
        reversed.add_file("init", 0o755, b"x".to_vec()).unwrap();
        reversed.add_dir("proc", 0o555).unwrap();
        reversed
            .add_char_device("dev/console", 0o600, 5, 1)
            .unwrap();
        reversed.add_symlink("bin", "usr/bin").unwrap();
        reversed.add_dir("usr", 0o755).unwrap();
        reversed
            .add_file("usr/bin/hello", 0o755, b"#!/bin/sh\necho hi\n".to_vec())
            .unwrap();
        assert_eq!(forward, reversed.to_bytes(EPOCH).unwrap());
        assert_ne!(forward, sample().to_bytes(EPOCH + 1).unwrap());
    }

    #[test]
    fn gnu_cpio_lists_and_extracts_the_archive() {
        let bytes = sample().to_bytes(EPOCH).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let archive_path = dir.path().join("test.cpio");
        std::fs::write(&archive_path, &bytes).unwrap();

        let listing = Command::new("cpio")
            .args(["-t", "-v", "--quiet", "-F"])
            .arg(&archive_path)
            .env("TZ", "UTC")
            .env("LC_ALL", "C")
            .output()
            .expect("GNU cpio runs (Debian package cpio)");
        assert!(listing.status.success(), "{listing:?}");
        let listing = String::from_utf8(listing.stdout).unwrap();
        let lines: Vec<&str> = listing.lines().collect();
        assert_eq!(lines.len(), 8, "{listing}");
        assert!(lines[0].starts_with("lrwxrwxrwx"), "{}", lines[0]);
        assert!(lines[0].ends_with("bin -> usr/bin"), "{}", lines[0]);
        assert!(lines[2].starts_with("crw-------"), "{}", lines[2]);
        assert!(lines[2].contains("5,"), "{}", lines[2]);
        assert!(lines[4].starts_with("dr-xr-xr-x"), "{}", lines[4]);
        assert!(lines[7].starts_with("-rwxr-xr-x"), "{}", lines[7]);
        assert!(lines[7].contains(" root "), "{}", lines[7]);
        assert!(lines[7].contains("Nov 14  2023"), "{}", lines[7]);

        // Extract without device nodes' special permission needs: skip dev/console.
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let extract = Command::new("cpio")
            .args(["-i", "-d", "--quiet", "--no-absolute-filenames", "-F"])
            .arg(&archive_path)
            .arg("--nonmatching")
            .arg("dev/console")
            .current_dir(&out)
            .output()
            .unwrap();
        assert!(extract.status.success(), "{extract:?}");
        assert_eq!(
            std::fs::read(out.join("usr/bin/hello")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
        assert_eq!(
            std::fs::read_link(out.join("bin")).unwrap().to_str(),
            Some("usr/bin")
        );
        assert_eq!(std::fs::read(out.join("bin/hello")).unwrap().len(), 18);
        assert!(out.join("proc").is_dir());
    }

    #[test]
    fn rejects_paths_the_kernel_would_misread() {
        let mut archive = CpioArchive::new();
        for path in ["", "/init", "a//b", "a/", "./init", "a/../b", "TRAILER!!!"] {
            assert!(
                matches!(
                    archive.add_dir(path, 0o755),
                    Err(CpioError::InvalidPath { .. })
                ),
                "{path:?} accepted"
            );
        }
        assert!(matches!(
            archive.add_file("x", 0o104755, vec![]),
            Err(CpioError::InvalidMode { .. })
        ));
    }

    #[test]
    fn conflicting_entries_are_refused() {
        let mut archive = CpioArchive::new();
        archive.add_symlink("lib", "usr/lib").unwrap();
        archive.add_symlink("lib", "usr/lib").unwrap();
        let err = archive
            .add_file("lib/libc.so.6", 0o755, vec![1])
            .unwrap_err();
        assert!(matches!(err, CpioError::ParentNotDirectory { .. }), "{err}");
        assert!(err.to_string().contains("\"lib\" is a symlink"), "{err}");
        let err = archive.add_dir("lib", 0o755).unwrap_err();
        assert!(matches!(err, CpioError::Conflict { .. }), "{err}");
        archive.add_file("init", 0o755, vec![1]).unwrap();
        assert!(archive.add_file("init", 0o755, vec![2]).is_err());
        // A directory created as a parent takes the mode given when it is added explicitly.
        archive.add_file("etc/a", 0o644, vec![]).unwrap();
        archive.add_dir("etc", 0o700).unwrap();
        assert_eq!(archive.get("etc"), Some(&Entry::Directory { mode: 0o700 }));
    }

    #[test]
    fn mtime_beyond_the_format_is_an_error() {
        assert!(matches!(
            sample().to_bytes(u64::from(u32::MAX) + 1),
            Err(CpioError::FieldOverflow { field: "mtime", .. })
        ));
    }
}
