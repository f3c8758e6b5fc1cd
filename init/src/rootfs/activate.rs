//! Mapping the dm-verity device through the kernel's device-mapper ioctls.
//!
//! The same low-level calls as the state disk ([`crate::disk::dm`]): create, load the table,
//! resume. The table is loaded read-only (`DM_READONLY`): dm-verity refuses a writable table
//! ("Device must be readonly"). The name and UUID follow cryptsetup's conventions
//! (`CRYPT-VERITY-<uuid>-<name>`), so `veritysetup status` recognizes the mapping. There is no
//! udev: the device is `/dev/dm-<minor>`, which devtmpfs creates.
//!
//! This needs device-mapper and so the guest kernel; the host tests stop before it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use devicemapper::{DM, DevId, DmFlags, DmName, DmOptions, DmUuid};

use super::locate::VerityTarget;
use super::verity::{self, DevNum};
use super::{RootHash, RootfsError};
use crate::disk::dm::DmError;

/// Name of the verified rootfs mapping.
pub const DM_NAME: &str = "hawser-root";
/// How long to wait for devtmpfs to create `/dev/dm-N`.
pub const NODE_WAIT: Duration = Duration::from_secs(5);

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

/// The errno of a failed ioctl (the crate's own message dumps whole ioctl headers).
fn describe(error: &devicemapper::DmError) -> String {
    match error {
        devicemapper::DmError::Core(devicemapper::errors::Error::Ioctl(_, _, _, errno)) => {
            std::io::Error::from_raw_os_error(**errno as i32).to_string()
        }
        other => other.to_string(),
    }
}

fn ioctl_error(step: &'static str) -> impl FnOnce(devicemapper::DmError) -> RootfsError {
    move |e| {
        RootfsError::Dm(DmError::Ioctl {
            step,
            name: DM_NAME,
            reason: describe(&e),
        })
    }
}

/// Creates, loads and resumes the verity mapping of `target`.
pub fn activate(target: &VerityTarget, root_hash: &RootHash) -> Result<VerityDevice, RootfsError> {
    let dm = DM::new().map_err(|e| RootfsError::Dm(DmError::Control(describe(&e))))?;
    let name = DmName::new(DM_NAME).map_err(ioctl_error("naming"))?;
    let uuid_text = dm_uuid(&target.superblock.uuid.to_string());
    let uuid = DmUuid::new(&uuid_text).map_err(ioctl_error("naming"))?;
    let read_only = DmOptions::private().set_flags(DmFlags::DM_READONLY);
    let info = dm
        .device_create(name, Some(uuid), read_only)
        .map_err(ioctl_error("create"))?;
    let id = DevId::Name(name);
    let line = verity::table_line(
        &target.superblock,
        target.partitions.data.devnum,
        target.partitions.hash.devnum,
        root_hash,
    );
    let loaded = dm
        .table_load(&id, &[line], read_only)
        .map_err(ioctl_error("table load"))
        .and_then(|_| {
            // Resuming (suspend without DM_SUSPEND) activates the loaded table.
            dm.device_suspend(&id, DmOptions::private())
                .map_err(ioctl_error("resume"))
        });
    if let Err(e) = loaded {
        let _ = dm.device_remove(&id, DmOptions::private());
        return Err(e);
    }
    let device = info.device();
    let devnum = DevNum {
        major: device.major,
        minor: device.minor,
    };
    let path = PathBuf::from(format!("/dev/dm-{}", devnum.minor));
    wait_for_node(&path, NODE_WAIT)?;
    Ok(VerityDevice {
        path,
        devnum,
        data_bytes: target.superblock.data_bytes(),
        data_partition: target.partitions.data.to_string(),
        hash_partition: target.partitions.hash.to_string(),
    })
}

fn wait_for_node(path: &Path, limit: Duration) -> Result<(), RootfsError> {
    let start = std::time::Instant::now();
    while !path.exists() {
        if start.elapsed() >= limit {
            return Err(RootfsError::Dm(DmError::NoNode {
                path: path.to_owned(),
                waited: limit,
            }));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
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
