//! The device-mapper tables of the state disk, and loading them through the kernel's ioctls.
//!
//! Every parameter of the tables comes from hawser's constants ([`hawser_luks2`]) and the
//! measured integrity mode — never from the disk's header. They are the tables cryptsetup
//! loads for the same LUKS2 header, so `cryptsetup open --volume-key-file` and hawser map the
//! same plaintext:
//!
//! ```text
//! none:         0 <len> crypt aes-xts-plain64 :64:logon:hawser:state-disk-<uuid> 0 <disk> 32768
//!                         1 sector_size:4096
//! hmac-sha256:  0 <len> integrity <disk> 32768 32 J 2 block_size:4096 fix_padding
//!               0 <len> crypt capi:authenc(hmac(sha256),xts(aes))-plain64
//!                         :96:logon:hawser:state-disk-<uuid> 0 <integrity> 0
//!                         2 integrity:32:aead sector_size:4096
//! ```
//!
//! LUKS2 counts the IV in 512-byte units even with 4096-byte sectors (no `iv_large_sectors`).
//!
//! The key never enters a table: it goes into the kernel keyring as a `logon` key (which user
//! space cannot read back) of the calling thread, the table names it (`:<bytes>:logon:<desc>`),
//! dm-crypt copies it when the table is loaded, and the key is then revoked and unlinked. So it
//! is in no ioctl buffer, in no `dmsetup table --showkeys`, and in no log of the devicemapper
//! crate. cryptsetup does the same.
//!
//! There is no udev: the mapped device is `/dev/dm-<minor>`, which devtmpfs creates.

use std::path::PathBuf;

use hawser_luks2::{self as luks2, Integrity};

use crate::platform::dm::{self as platform_dm, DeviceMapper, LogonKey, NODE_WAIT, TableMode};
pub use crate::platform::dm::{DevNum, DmError, TableLine};

use super::key::VolumeKey;

/// Name of the mapped state disk (`/dev/mapper/` has no node without udev: use the path
/// [`Mapped::path`] gives).
pub const DM_NAME: &str = "hawser-state";
/// Name of the dm-integrity device under it in integrity mode (cryptsetup's `<name>_dif`).
pub const DM_INTEGRITY_NAME: &str = "hawser-state_dif";
/// Bytes of authentication tag per sector (HMAC-SHA256).
pub const INTEGRITY_TAG_SIZE: u32 = 32;

const SECTOR: u64 = 512;

/// The keyring description of a disk's key (a `logon` key needs a `prefix:` description).
pub fn key_description(luks_uuid: &str) -> String {
    format!("hawser:state-disk-{luks_uuid}")
}

/// The device-mapper UUID cryptsetup gives a LUKS2 mapping, so `cryptsetup status` and
/// `lsblk` recognize hawser's mapping as the LUKS2 volume it is.
pub fn dm_uuid(luks_uuid: &str, name: &str) -> String {
    let kind = if name == DM_INTEGRITY_NAME {
        "SUBDEV"
    } else {
        "LUKS2"
    };
    format!("CRYPT-{kind}-{}-{name}", luks_uuid.replace('-', ""))
}

/// 512-byte sectors of the data segment of a `disk_size`-byte disk, whole 4096-byte sectors only.
pub fn data_sectors(disk_size: u64) -> u64 {
    let bytes = disk_size.saturating_sub(luks2::DATA_OFFSET);
    bytes / u64::from(luks2::SECTOR_SIZE) * (u64::from(luks2::SECTOR_SIZE) / SECTOR)
}

/// The crypt table line. `backing` holds the data at `offset_sectors`; `length` sectors.
pub fn crypt_line(
    integrity: Integrity,
    luks_uuid: &str,
    backing: DevNum,
    offset_sectors: u64,
    length: u64,
) -> TableLine {
    let key = format!(
        ":{}:logon:{}",
        integrity.key_len(),
        key_description(luks_uuid)
    );
    let params = match integrity {
        Integrity::None => format!(
            "{} {key} 0 {backing} {offset_sectors} 1 sector_size:{}",
            luks2::CIPHER,
            luks2::SECTOR_SIZE
        ),
        Integrity::HmacSha256 => format!(
            "capi:authenc(hmac(sha256),xts(aes))-plain64 {key} 0 {backing} {offset_sectors} \
             2 integrity:{INTEGRITY_TAG_SIZE}:aead sector_size:{}",
            luks2::SECTOR_SIZE
        ),
    };
    (0, length, "crypt".to_owned(), params)
}

/// The dm-integrity table line: journaled ('J', crash-consistent data and tags), tags supplied
/// by dm-crypt (no internal hash), 4096-byte blocks. A zeroed superblock is formatted by the
/// kernel on the first load.
pub fn integrity_line(backing: DevNum, length: u64) -> TableLine {
    (
        0,
        length,
        "integrity".to_owned(),
        format!(
            "{backing} {} {INTEGRITY_TAG_SIZE} J 2 block_size:{} fix_padding",
            luks2::DATA_OFFSET / SECTOR,
            luks2::SECTOR_SIZE
        ),
    )
}

/// `provided_data_sectors` from a dm-integrity status line (`<mismatches> <provided> <recalc>`).
pub fn provided_data_sectors(status: &str) -> Option<u64> {
    status.split_whitespace().nth(1)?.parse().ok()
}

/// The mapped state disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// `/dev/dm-<minor>`.
    pub path: PathBuf,
    pub devnum: DevNum,
    /// Bytes of the mapped device.
    pub size: u64,
}

/// Creates device `name` with `table` and activates it.
fn create(
    dm: &DeviceMapper,
    name: &'static str,
    luks_uuid: &str,
    table: &[TableLine],
) -> Result<DevNum, DmError> {
    dm.create(
        name,
        &dm_uuid(luks_uuid, name),
        table,
        TableMode::SecureData,
    )
}

/// Removes device `name` if it exists (cleanup after a failed step).
pub fn remove(name: &'static str) -> Result<(), DmError> {
    platform_dm::remove(name)
}

/// Maps the data segment of `disk` (`disk_size` bytes) with `key`: dm-crypt, on dm-integrity
/// in integrity mode. Returns the plaintext device.
pub fn map(
    disk: DevNum,
    disk_size: u64,
    luks_uuid: &str,
    integrity: Integrity,
    key: &VolumeKey,
) -> Result<Mapped, DmError> {
    let dm = DeviceMapper::open()?;
    let key_ref = LogonKey::add(&key_description(luks_uuid), key.as_bytes())?;
    let (backing, offset, length) = match integrity {
        Integrity::None => (disk, luks2::DATA_OFFSET / SECTOR, data_sectors(disk_size)),
        Integrity::HmacSha256 => {
            let (dif, provided) = map_integrity(&dm, disk, luks_uuid)?;
            (dif, 0, provided)
        }
    };
    let crypt = create(
        &dm,
        DM_NAME,
        luks_uuid,
        &[crypt_line(integrity, luks_uuid, backing, offset, length)],
    );
    drop(key_ref);
    let devnum = match crypt {
        Ok(devnum) => devnum,
        Err(e) => {
            if integrity != Integrity::None {
                let _ = remove(DM_INTEGRITY_NAME);
            }
            return Err(e);
        }
    };
    let path = platform_dm::wait_for_node(devnum, NODE_WAIT)?;
    Ok(Mapped {
        path,
        devnum,
        size: length * SECTOR,
    })
}

/// Creates the dm-integrity device: first with a one-block table (the kernel formats a zeroed
/// superblock and computes the usable size), then reloaded with that size.
fn map_integrity(
    dm: &DeviceMapper,
    disk: DevNum,
    luks_uuid: &str,
) -> Result<(DevNum, u64), DmError> {
    let block = u64::from(luks2::SECTOR_SIZE) / SECTOR;
    let devnum = create(
        dm,
        DM_INTEGRITY_NAME,
        luks_uuid,
        &[integrity_line(disk, block)],
    )?;
    let resized = dm.status(DM_INTEGRITY_NAME).and_then(|status| {
        let provided = provided_data_sectors(&status)
            .map(|sectors| sectors / block * block)
            .filter(|&sectors| sectors > 0)
            .ok_or(DmError::IntegrityStatus { status })?;
        dm.reload(DM_INTEGRITY_NAME, &[integrity_line(disk, provided)])?;
        Ok(provided)
    });
    match resized {
        Ok(provided) => Ok((devnum, provided)),
        Err(e) => {
            let _ = dm.remove(DM_INTEGRITY_NAME);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c";
    const DISK: DevNum = DevNum {
        major: 252,
        minor: 16,
    };

    #[test]
    fn the_plain_table_is_cryptsetups_for_hawsers_header() {
        let size: u64 = 1 << 30;
        let line = crypt_line(Integrity::None, UUID, DISK, 32768, data_sectors(size));
        assert_eq!(
            line,
            (
                0,
                (1 << 30) / 512 - 32768,
                "crypt".to_owned(),
                "aes-xts-plain64 :64:logon:hawser:state-disk-0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c \
                 0 252:16 32768 1 sector_size:4096"
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_integrity_tables_stack_crypt_on_integrity() {
        let line = integrity_line(DISK, 8);
        assert_eq!(line.2, "integrity");
        assert_eq!(line.3, "252:16 32768 32 J 2 block_size:4096 fix_padding");
        let dif = DevNum {
            major: 253,
            minor: 0,
        };
        let line = crypt_line(Integrity::HmacSha256, UUID, dif, 0, 1000);
        assert_eq!(
            line.3,
            "capi:authenc(hmac(sha256),xts(aes))-plain64 \
             :96:logon:hawser:state-disk-0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c \
             0 253:0 0 2 integrity:32:aead sector_size:4096"
        );
    }

    #[test]
    fn data_sectors_are_whole_4k_sectors_after_the_header() {
        assert_eq!(data_sectors(luks2::DATA_OFFSET), 0);
        assert_eq!(data_sectors(luks2::DATA_OFFSET + 4095), 0);
        assert_eq!(data_sectors(luks2::DATA_OFFSET + 4096 + 512), 8);
        assert_eq!(data_sectors(0), 0);
    }

    #[test]
    fn names_follow_cryptsetup() {
        assert_eq!(
            dm_uuid(UUID, DM_NAME),
            "CRYPT-LUKS2-0f8a41cf4c2e4e769a3b5d1e2f3a4b5c-hawser-state"
        );
        assert_eq!(
            dm_uuid(UUID, DM_INTEGRITY_NAME),
            "CRYPT-SUBDEV-0f8a41cf4c2e4e769a3b5d1e2f3a4b5c-hawser-state_dif"
        );
        assert_eq!(DevNum::parse("252:16\n"), Some(DISK));
        assert_eq!(DevNum::parse("252"), None);
    }

    #[test]
    fn integrity_status_gives_the_usable_size() {
        assert_eq!(provided_data_sectors("0 2015232 -"), Some(2015232));
        assert_eq!(provided_data_sectors("0"), None);
    }
}
