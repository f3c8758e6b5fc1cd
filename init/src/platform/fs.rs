//! Files that must survive a power cut whole: the one durable-replace helper.

use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` durably: a temporary file beside it (`<path>.tmp`, `mode`),
/// fsynced, renamed over `path`, then the directory fsynced. A power cut leaves the old file or
/// the new one, never a torn one. Missing parent directories are created 0700.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    // A temporary left by an earlier cut is stale: start from nothing.
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_no_temporary_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/dir/file.json");
        // A stale temporary from an earlier power cut does not get in the way.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(dir.path().join("new/dir/file.json.tmp"), "torn").unwrap();
        write_atomically(&path, b"one", 0o600).unwrap();
        write_atomically(&path, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["file.json"]);
    }
}
