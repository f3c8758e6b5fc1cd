//! The marker file on the state file system: which LUKS2 volume it belongs to, who formatted
//! it, how many boots opened it. Written durably (temporary file, fsync, rename, fsync of the
//! directory), so a power cut leaves the old marker or the new one.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::LifecycleError;

/// The marker file hawser keeps on the state filesystem, relative to its mount point.
pub const MARKER_FILE: &str = "hawser/state-disk.json";

/// The marker file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub luks_uuid: String,
    pub formatted_by: String,
    pub boots: u64,
}

/// Reads the marker file; `None` if it does not exist.
pub fn read_marker(path: &Path) -> io::Result<Option<Marker>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces the marker file durably ([`crate::platform::fs::write_atomically`]).
pub fn write_marker(path: &Path, marker: &Marker) -> Result<(), LifecycleError> {
    let error = |source| LifecycleError::Marker {
        path: path.to_owned(),
        source,
    };
    let mut text = serde_json::to_vec(marker).map_err(|e| error(io::Error::other(e)))?;
    text.push(b'\n');
    crate::platform::fs::write_atomically(path, &text, 0o644).map_err(error)
}
