//! Reading QEMU fw_cfg entries from sysfs (module `qemu_fw_cfg`).
//!
//! QEMU's `-fw_cfg name=opt/hawser/<key>,string=<value>` shows up as
//! `/sys/firmware/qemu_fw_cfg/by_name/opt/hawser/<key>/raw`. What the keys may say is decided
//! by [`crate::config::parse_fw_cfg`]; this module only reads them.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Where hawser's fw_cfg keys appear.
pub const FW_CFG_HAWSER_DIR: &str = "/sys/firmware/qemu_fw_cfg/by_name/opt/hawser";
/// fw_cfg entries larger than this are not read (the only allowed key is a 64-byte nonce).
pub const MAX_ENTRY_SIZE: u64 = 4096;

/// An fw_cfg entry that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FwCfgError {
    /// The fw_cfg directory exists but cannot be listed.
    #[error("cannot list fw_cfg entries in {path}")]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An fw_cfg entry cannot be read.
    #[error("cannot read fw_cfg entry {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An fw_cfg entry is larger than any hawser key needs.
    #[error("fw_cfg entry {path} holds {size} bytes, more than the {MAX_ENTRY_SIZE} accepted")]
    TooLarge { path: PathBuf, size: u64 },
}

/// The entries directly below `dir`, by key. A missing `dir` (no fw_cfg device, or no hawser
/// keys) is an empty map. Nested directories (`opt/hawser/a/b`) are not keys and are skipped.
pub fn read_entries(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, FwCfgError> {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(FwCfgError::List {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut entries = BTreeMap::new();
    for entry in listing {
        let entry = entry.map_err(|source| FwCfgError::List {
            path: dir.to_owned(),
            source,
        })?;
        let raw = entry.path().join("raw");
        let size = match std::fs::metadata(&raw) {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(FwCfgError::Read { path: raw, source }),
        };
        // sysfs reports the entry's real size for fw_cfg's `raw` attribute.
        if size > MAX_ENTRY_SIZE {
            return Err(FwCfgError::TooLarge { path: raw, size });
        }
        let value = std::fs::read(&raw).map_err(|source| FwCfgError::Read {
            path: raw.clone(),
            source,
        })?;
        entries.insert(entry.file_name().to_string_lossy().into_owned(), value);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keys_with_raw_files_and_skips_the_rest() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("opt/hawser");
        std::fs::create_dir_all(dir.join("quote_nonce")).unwrap();
        std::fs::write(dir.join("quote_nonce/raw"), "abcd").unwrap();
        std::fs::create_dir_all(dir.join("nested/deeper")).unwrap();
        std::fs::write(dir.join("nested/deeper/raw"), "x").unwrap();
        let entries = read_entries(&dir).unwrap();
        assert_eq!(
            entries,
            BTreeMap::from([("quote_nonce".to_owned(), b"abcd".to_vec())])
        );
    }

    #[test]
    fn no_fw_cfg_means_no_entries() {
        let root = tempfile::tempdir().unwrap();
        assert!(
            read_entries(&root.path().join("absent"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn oversized_entries_are_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("big")).unwrap();
        std::fs::write(root.path().join("big/raw"), vec![b'a'; 5000]).unwrap();
        let err = read_entries(root.path()).unwrap_err();
        assert!(err.to_string().contains("holds 5000 bytes"), "{err}");
    }
}
