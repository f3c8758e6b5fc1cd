//! What a new header says ([`NewHeader`]): the input of both `metadata.rs` (its JSON area) and
//! `write.rs` (the copies), in a module of its own so that neither imports the other for it.

use crate::digest::KeyDigest;
use crate::layout::{DiskState, Integrity};

/// What a new header says.
#[derive(Debug, Clone)]
pub struct NewHeader {
    /// Lowercase UUID ([`uuid_from_random`](crate::uuid_from_random)).
    pub uuid: String,
    /// The measured mode the data segment is mapped with.
    pub integrity: Integrity,
    /// The check of the volume key.
    pub digest: KeyDigest,
    /// [`DiskState::Initialized`] writes hawser's token.
    pub state: DiskState,
    /// The cluster the disk belongs to, recorded in hawser's token (so only with
    /// [`DiskState::Initialized`]); `None` when the key did not come from a cluster.
    pub cluster_id: Option<[u8; 32]>,
    /// The sequence number: higher than that of any copy on the disk, so that this one wins.
    pub seqid: u64,
}
