//! The mkosi tree normalised for erofs: times clamped, and a digest of what erofs will store.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::RootfsError;
use crate::tool::io_error;

/// Clamps every regular file's and directory's mtime to `epoch` (what mkosi does; files added
/// after it get the same) and returns a sha256 over the tree as erofs will store it: for each
/// entry in byte-sorted path order, its path, type, mode, owner, size, device number, link
/// target and content digest. Timestamps are left out: `mkfs.erofs -T` replaces them all.
pub fn normalize_tree(tree: &Path, epoch: u64) -> Result<[u8; 32], RootfsError> {
    let epoch_time = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch);
    let mut digest = Sha256::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let path = tree.join(&rel);
        let meta = std::fs::symlink_metadata(&path).map_err(io_error("stat", &path))?;
        let kind = meta.file_type();
        digest.update(rel.as_os_str().as_encoded_bytes());
        digest.update([0u8]);
        digest.update(
            format!(
                "{:o} {}:{} {} {} {}\0",
                meta.mode(),
                meta.uid(),
                meta.gid(),
                meta.size(),
                meta.rdev(),
                meta.nlink()
            )
            .as_bytes(),
        );
        // Symlinks keep their (mkosi-clamped) time: std cannot set a link's own mtime, and
        // erofs ignores it anyway.
        if (kind.is_file() || kind.is_dir())
            && meta.mtime() > i64::try_from(epoch).unwrap_or(i64::MAX)
        {
            let file = std::fs::File::open(&path).map_err(io_error("open", &path))?;
            file.set_modified(epoch_time)
                .map_err(io_error("set the mtime of", &path))?;
        }
        if kind.is_symlink() {
            let target = std::fs::read_link(&path).map_err(io_error("read the link", &path))?;
            digest.update(target.as_os_str().as_encoded_bytes());
        } else if kind.is_file() {
            digest.update(sha256_file(&path)?);
        } else if kind.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path)
                .map_err(io_error("list", &path))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<_, _>>()
                .map_err(io_error("list", &path))?;
            // Reverse byte order on the stack pops them in byte order.
            names.sort_by(|a, b| b.as_encoded_bytes().cmp(a.as_encoded_bytes()));
            stack.extend(names.into_iter().map(|n| rel.join(n)));
        }
        digest.update([0xffu8]);
    }
    Ok(digest.finalize().into())
}

/// The sha256 of a file's contents, read 1 MiB at a time.
pub(super) fn sha256_file(path: &Path) -> Result<[u8; 32], RootfsError> {
    let mut file = std::fs::File::open(path).map_err(io_error("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_error("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}
