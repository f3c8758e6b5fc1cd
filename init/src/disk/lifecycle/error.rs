//! Why the state disk could not be brought up: the lifecycle's one error type.

use std::io;
use std::path::PathBuf;

use hawser_luks2 as luks2;

use super::super::dm::DmError;
use super::super::key::KeyError;
use super::super::probe::ProbeError;

/// Why the state disk could not be brought up. Nothing on the disk is overwritten on any of
/// these paths unless the disk was blank or hawser's and never initialized.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The disk is not one hawser formats or opens.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The key source gave no key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The key does not match the LUKS2 digest of an initialized disk.
    #[error(
        "the key does not open LUKS2 volume {uuid}: its digest does not match; nothing was written"
    )]
    WrongKey { uuid: String },
    /// The disk records another cluster than the one the node locked into.
    #[error(
        "LUKS2 volume {uuid} belongs to cluster {}, but the node locked into cluster {}; \
         nothing was written",
        hex::encode(recorded),
        hex::encode(locked)
    )]
    OtherCluster {
        uuid: String,
        recorded: [u8; 32],
        locked: [u8; 32],
    },
    /// The header copy recording the cluster ID cannot be made.
    #[error("cannot record the cluster ID in the header of LUKS2 volume {uuid}")]
    Record {
        uuid: String,
        #[source]
        source: luks2::RecordError,
    },
    /// The key has the wrong length for the measured integrity mode.
    #[error(
        "the key has {found} bytes; the state disk needs {expected} (as configured by \
         hawser.state_disk_integrity); nothing was written"
    )]
    KeyLength { found: usize, expected: usize },
    /// A header or superblock write (or its sync) failed.
    #[error("cannot write {what} at offset {offset}")]
    Write {
        what: &'static str,
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// getrandom(2) failed while making a UUID or salt.
    #[error("cannot get random bytes for the new header")]
    Random(#[source] io::Error),
    /// The dm-crypt (and dm-integrity) mapping cannot be created.
    #[error("cannot map the data segment of LUKS2 volume {uuid}")]
    Map {
        uuid: String,
        #[source]
        source: DmError,
    },
    /// Zeroing the mapped device for dm-integrity failed.
    #[error("cannot wipe {} for dm-integrity", mapped.display())]
    Wipe {
        mapped: PathBuf,
        #[source]
        source: io::Error,
    },
    /// mke2fs could not run or failed ([`MkfsError`]).
    #[error("cannot create the filesystem on {}", mapped.display())]
    Mkfs {
        mapped: PathBuf,
        #[source]
        source: MkfsError,
    },
    /// The state file system cannot be mounted.
    #[error("cannot mount {} (LUKS2 volume {uuid}) on {}", mapped.display(), target.display())]
    Mount {
        mapped: PathBuf,
        target: PathBuf,
        uuid: String,
        #[source]
        source: io::Error,
    },
    /// The marker file cannot be written durably.
    #[error("cannot write the marker file {}", path.display())]
    Marker {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// What the first boot keeps before the "initialized" mark cannot be written; the disk
    /// stays unmarked, so the next boot formats it again.
    #[error("cannot keep {} on the new filesystem before marking it initialized", path.display())]
    Keep {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Why the filesystem was not created on the mapped device.
#[derive(Debug, thiserror::Error)]
pub enum MkfsError {
    /// The mkfs program cannot be started.
    #[error("cannot run {program}")]
    Spawn {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    /// Waiting for the mkfs program failed.
    #[error("cannot wait for {program}")]
    Wait {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    /// The mkfs program failed; `output` is what it printed.
    #[error("{program} exited with {status}: {output}")]
    Failed {
        program: &'static str,
        status: std::process::ExitStatus,
        output: String,
    },
}
