//! The cluster the disk belongs to, in hawser's LUKS2 token: checked against the node lock's
//! and recorded when the disk records none yet.

use hawser_luks2 as luks2;

use super::probe::BlockIo;
use super::{LifecycleError, Platform, write_copy};

/// Checks the lock's cluster against the one `selected` records, and records it if the disk
/// records none yet (a disk initialized before hawser recorded it): both copies at a higher
/// seqid, the copy not relied on first, so a cut leaves either the old header or the new one.
pub(super) fn record_cluster_id(
    disk: &dyn BlockIo,
    selected: &luks2::Selected,
    locked: Option<[u8; 32]>,
    platform: &dyn Platform,
) -> Result<(), LifecycleError> {
    let uuid = &selected.header.uuid;
    let locked = match (selected.header.cluster_id, locked) {
        (_, None) => return Ok(()),
        (Some(recorded), Some(locked)) if recorded == locked => return Ok(()),
        (Some(recorded), Some(locked)) => {
            return Err(LifecycleError::OtherCluster {
                uuid: uuid.clone(),
                recorded,
                locked,
            });
        }
        (None, Some(locked)) => locked,
    };
    let seqid = selected.header.seqid.max(selected.source.seqid) + 1;
    let first = selected.source.slot.other();
    for slot in [first, first.other()] {
        let mut salt = [0u8; luks2::HEADER_SALT_LEN];
        platform.random(&mut salt).map_err(LifecycleError::Random)?;
        let copy = luks2::copy_recording_cluster_id(&selected.source, slot, seqid, &locked, salt)
            .map_err(|source| LifecycleError::Record {
            uuid: uuid.clone(),
            source,
        })?;
        write_copy(disk, slot, &copy)?;
    }
    tracing::info!(
        "recorded cluster {} in the header of state disk {uuid}",
        hex::encode(locked)
    );
    Ok(())
}
