//! A partition with its place on the disk, before anything is written: what `gpt` plans and
//! writes, and what `fat` formats. In a module of its own so that neither imports the other
//! for it.

use super::PartitionSpec;

/// A partition with its place on the disk, before anything is written.
pub(super) struct Planned<'s, 'a> {
    pub(super) spec: &'s PartitionSpec<'a>,
    pub(super) first_lba: u64,
    pub(super) sectors: u64,
    /// For a file partition: the file's length.
    pub(super) content_bytes: u64,
}
