//! What a first boot keeps on the new filesystem before the disk is marked "initialized": a list
//! of directories and files, in order, given by the caller ([`super::Options::first_boot`]).
//!
//! The lifecycle does not know what they are (the node's one-time grants: its WireGuard key,
//! kubeadm's intent, a control plane's secrets; see `crate::kube::grants`); it only promises
//! where they land in its order: after the filesystem and its marker file, before the mark. A
//! power cut before the mark leaves a disk that is formatted again (and the node asks for its
//! grants again); a cut after it leaves every one of them on the disk.

use std::io;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// A directory or a file kept on the new filesystem; paths are relative to its mount point.
#[derive(Clone, PartialEq, Eq)]
pub enum Kept {
    /// A directory with `mode`, made if missing (its parent comes earlier in the list, or
    /// exists): the modes of the directories a file lands in are chosen, not defaulted.
    Dir { path: PathBuf, mode: u32 },
    /// A file with `mode`, written whole ([`crate::platform::fs::write_atomically`]: a cut
    /// leaves no file or all of it). `bytes` may be key material: zeroized, never in `Debug`.
    File {
        path: PathBuf,
        bytes: Zeroizing<Vec<u8>>,
        mode: u32,
    },
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kept::Dir { path, mode } => write!(f, "Dir({}, {mode:o})", path.display()),
            Kept::File { path, bytes, mode } => write!(
                f,
                "File({}, {} bytes, {mode:o})",
                path.display(),
                bytes.len()
            ),
        }
    }
}

impl Kept {
    /// A file of `bytes` at `path` (relative) with `mode`.
    pub fn file(path: impl Into<PathBuf>, bytes: Zeroizing<Vec<u8>>, mode: u32) -> Self {
        Kept::File {
            path: path.into(),
            bytes,
            mode,
        }
    }

    /// A directory at `path` (relative) with `mode`.
    pub fn dir(path: impl Into<PathBuf>, mode: u32) -> Self {
        Kept::Dir {
            path: path.into(),
            mode,
        }
    }

    /// Where it lands, relative to the mount point.
    pub fn path(&self) -> &Path {
        match self {
            Kept::Dir { path, .. } | Kept::File { path, .. } => path,
        }
    }

    /// Writes it under `root` durably: a directory is made (and given its mode) if missing, a
    /// file replaced atomically.
    pub fn write_under(&self, root: &Path) -> io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        let path = root.join(self.path());
        match self {
            Kept::Dir { mode, .. } => {
                match std::fs::DirBuilder::new().mode(*mode).create(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
                    Err(e) => return Err(e),
                }
                // The umask may have taken bits away from a new one; an old one gets its mode.
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))
            }
            Kept::File { bytes, mode, .. } => {
                crate::platform::fs::write_atomically(&path, bytes, *mode)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn directories_and_files_land_with_their_modes_and_debug_shows_no_bytes() {
        let root = tempfile::tempdir().unwrap();
        let kept = [
            Kept::dir("var", 0o755),
            Kept::dir("var/lib", 0o700),
            Kept::file(
                "var/lib/secret",
                Zeroizing::new(b"KEY MATERIAL".to_vec()),
                0o600,
            ),
        ];
        for item in &kept {
            item.write_under(root.path()).unwrap();
            // Again: a boot that keeps them twice changes nothing.
            item.write_under(root.path()).unwrap();
        }
        let mode = |p: &str| {
            std::fs::metadata(root.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("var"), 0o755);
        assert_eq!(mode("var/lib"), 0o700);
        assert_eq!(mode("var/lib/secret"), 0o600);
        assert_eq!(
            std::fs::read(root.path().join("var/lib/secret")).unwrap(),
            b"KEY MATERIAL"
        );
        let shown = format!("{kept:?}");
        assert!(!shown.contains("KEY MATERIAL"), "{shown}");
        assert!(shown.contains("var/lib/secret, 12 bytes, 600"), "{shown}");
    }
}
