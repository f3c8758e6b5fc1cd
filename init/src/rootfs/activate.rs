//! Mapping the dm-verity device through the kernel's device-mapper ioctls.
//!
//! The table is this module's; loading it goes through [`crate::platform::dm`], as the state
//! disk's tables do: create, load the table, resume. The table is loaded read-only (`DM_READONLY`): dm-verity refuses a writable table
//! ("Device must be readonly"). The name and UUID follow cryptsetup's conventions
//! (`CRYPT-VERITY-<uuid>-<name>`), so `veritysetup status` recognizes the mapping. There is no
//! udev: the device is `/dev/dm-<minor>`, which devtmpfs creates.
//!
//! This needs device-mapper and so the guest kernel; the host tests stop before it.

use std::path::PathBuf;

use crate::platform::dm::{self, DeviceMapper, NODE_WAIT, TableMode};

use super::locate::VerityTarget;
use super::verity::{self, DevNum};
use super::{RootHash, RootfsError};

/// Name of the verified rootfs mapping.
pub const DM_NAME: &str = "hawser-root";

/// The mapped, verified rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityDevice {
    /// `/dev/dm-<minor>`: what erofs is mounted from.
    pub path: PathBuf,
    pub devnum: DevNum,
    /// Bytes of verified data.
    pub data_bytes: u64,
    /// `/dev/vda1`, for the log.
    pub data_partition: String,
    /// `/dev/vda2`, for the log.
    pub hash_partition: String,
}

/// The device-mapper UUID cryptsetup gives a verity mapping.
pub fn dm_uuid(superblock_uuid: &str) -> String {
    format!(
        "CRYPT-VERITY-{}-{DM_NAME}",
        superblock_uuid.replace('-', "")
    )
}

/// Creates, loads and resumes the verity mapping of `target`.
pub fn activate(target: &VerityTarget, root_hash: &RootHash) -> Result<VerityDevice, RootfsError> {
    let line = verity::table_line(
        &target.superblock,
        target.partitions.data.devnum,
        target.partitions.hash.devnum,
        root_hash,
    );
    let uuid = dm_uuid(&target.superblock.uuid.to_string());
    let devnum = DeviceMapper::open()
        .and_then(|dm| dm.create(DM_NAME, &uuid, &[line], TableMode::ReadOnly))
        .map_err(RootfsError::Dm)?;
    let path = dm::wait_for_node(devnum, NODE_WAIT).map_err(RootfsError::Dm)?;
    Ok(VerityDevice {
        path,
        devnum,
        data_bytes: target.superblock.data_bytes(),
        data_partition: target.partitions.data.to_string(),
        hash_partition: target.partitions.hash.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_is_named_as_cryptsetup_names_it() {
        assert_eq!(
            dm_uuid("12345678-1234-1234-1234-123456789abc"),
            "CRYPT-VERITY-12345678123412341234123456789abc-hawser-root"
        );
    }
}
