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

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devicemapper::{DM, DevId, DmFlags, DmName, DmOptions, DmUuid};
use hawser_luks2::{self as luks2, Integrity};

use super::key::VolumeKey;

/// Name of the mapped state disk (`/dev/mapper/` has no node without udev: use the path
/// [`Mapped::path`] gives).
pub const DM_NAME: &str = "hawser-state";
/// Name of the dm-integrity device under it in integrity mode (cryptsetup's `<name>_dif`).
pub const DM_INTEGRITY_NAME: &str = "hawser-state_dif";
/// Bytes of authentication tag per sector (HMAC-SHA256).
pub const INTEGRITY_TAG_SIZE: u32 = 32;
/// How long to wait for devtmpfs to create `/dev/dm-N`.
pub const NODE_WAIT: Duration = Duration::from_secs(5);

const SECTOR: u64 = 512;
const KEY_SPEC_THREAD_KEYRING: libc::c_long = -1;
const KEYCTL_REVOKE: libc::c_long = 3;
const KEYCTL_UNLINK: libc::c_long = 9;

/// A block device's `major:minor`, as device-mapper tables name devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl DevNum {
    /// Parses sysfs's `dev` attribute (`"252:16\n"`).
    pub fn parse(text: &str) -> Option<DevNum> {
        let (major, minor) = text.trim().split_once(':')?;
        Some(DevNum {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

/// One line of a device-mapper table: start, length (512-byte sectors), target, parameters.
pub type TableLine = (u64, u64, String, String);

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

/// A device-mapper step that failed.
#[derive(Debug, thiserror::Error)]
pub enum DmError {
    #[error("cannot open the device-mapper control node /dev/mapper/control: {0}")]
    Control(String),
    #[error("cannot put the key into the kernel keyring (add_key logon)")]
    Keyring(#[source] io::Error),
    #[error("device-mapper {step} of {name} failed: {reason}")]
    Ioctl {
        step: &'static str,
        name: &'static str,
        reason: String,
    },
    #[error("dm-integrity on the state disk reports no usable size (status {status:?})")]
    IntegrityStatus { status: String },
    #[error("{} did not appear within {} s", path.display(), waited.as_secs())]
    NoNode { path: PathBuf, waited: Duration },
}

/// A `logon` key in the calling thread's keyring; revoked and unlinked on drop.
struct LogonKey {
    serial: libc::c_long,
}

impl LogonKey {
    fn add(description: &str, payload: &[u8]) -> Result<LogonKey, DmError> {
        let invalid = || DmError::Keyring(io::Error::from(io::ErrorKind::InvalidInput));
        let description = CString::new(description).map_err(|_| invalid())?;
        // SAFETY: add_key(2) reads the two NUL-terminated strings and `payload.len()` bytes at
        // `payload`, all valid for the duration of the call; it keeps no pointer.
        let serial = unsafe {
            libc::syscall(
                libc::SYS_add_key,
                c"logon".as_ptr(),
                description.as_ptr(),
                payload.as_ptr(),
                payload.len(),
                KEY_SPEC_THREAD_KEYRING,
            )
        };
        if serial < 0 {
            return Err(DmError::Keyring(io::Error::last_os_error()));
        }
        Ok(LogonKey { serial })
    }
}

impl Drop for LogonKey {
    fn drop(&mut self) {
        // SAFETY: keyctl(2) with integer arguments only.
        unsafe {
            libc::syscall(libc::SYS_keyctl, KEYCTL_REVOKE, self.serial);
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_UNLINK,
                self.serial,
                KEY_SPEC_THREAD_KEYRING,
            );
        }
    }
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

fn ioctl_error(
    step: &'static str,
    name: &'static str,
) -> impl FnOnce(devicemapper::DmError) -> DmError {
    move |e| DmError::Ioctl {
        step,
        name,
        reason: describe(&e),
    }
}

/// The errno of a failed ioctl (the crate's message dumps whole ioctl headers).
fn describe(error: &devicemapper::DmError) -> String {
    match error {
        devicemapper::DmError::Core(devicemapper::errors::Error::Ioctl(_, _, _, errno)) => {
            io::Error::from_raw_os_error(**errno as i32).to_string()
        }
        other => other.to_string(),
    }
}

fn dm_name(name: &'static str) -> Result<&'static DmName, DmError> {
    DmName::new(name).map_err(ioctl_error("naming", name))
}

/// Creates device `name` with `table` and activates it.
fn create(
    dm: &DM,
    name: &'static str,
    luks_uuid: &str,
    table: &[TableLine],
) -> Result<DevNum, DmError> {
    let dm_name = dm_name(name)?;
    let uuid = dm_uuid(luks_uuid, name);
    let uuid = DmUuid::new(&uuid).map_err(ioctl_error("naming", name))?;
    let info = dm
        .device_create(dm_name, Some(uuid), DmOptions::private())
        .map_err(ioctl_error("create", name))?;
    let id = DevId::Name(dm_name);
    let loaded = dm
        .table_load(
            &id,
            table,
            DmOptions::private().set_flags(DmFlags::DM_SECURE_DATA),
        )
        .map_err(ioctl_error("table load", name))
        .and_then(|_| {
            // Resuming (suspend without DM_SUSPEND) activates the loaded table.
            dm.device_suspend(&id, DmOptions::private())
                .map_err(ioctl_error("resume", name))
        });
    if let Err(e) = loaded {
        let _ = dm.device_remove(&id, DmOptions::private());
        return Err(e);
    }
    let device = info.device();
    Ok(DevNum {
        major: device.major,
        minor: device.minor,
    })
}

/// Removes device `name` if it exists (cleanup after a failed step).
pub fn remove(name: &'static str) -> Result<(), DmError> {
    let dm = DM::new().map_err(|e| DmError::Control(describe(&e)))?;
    let dm_name = dm_name(name)?;
    dm.device_remove(&DevId::Name(dm_name), DmOptions::private())
        .map(|_| ())
        .map_err(ioctl_error("remove", name))
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
    let dm = DM::new().map_err(|e| DmError::Control(describe(&e)))?;
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
    let path = PathBuf::from(format!("/dev/dm-{}", devnum.minor));
    wait_for_node(&path, NODE_WAIT)?;
    Ok(Mapped {
        path,
        devnum,
        size: length * SECTOR,
    })
}

/// Creates the dm-integrity device: first with a one-block table (the kernel formats a zeroed
/// superblock and computes the usable size), then reloaded with that size.
fn map_integrity(dm: &DM, disk: DevNum, luks_uuid: &str) -> Result<(DevNum, u64), DmError> {
    let block = u64::from(luks2::SECTOR_SIZE) / SECTOR;
    let devnum = create(
        dm,
        DM_INTEGRITY_NAME,
        luks_uuid,
        &[integrity_line(disk, block)],
    )?;
    let id = DevId::Name(dm_name(DM_INTEGRITY_NAME)?);
    let resized = dm
        .table_status(&id, DmOptions::private())
        .map_err(ioctl_error("status", DM_INTEGRITY_NAME))
        .and_then(|(_, lines)| {
            let status = lines.first().map(|l| l.3.clone()).unwrap_or_default();
            provided_data_sectors(&status)
                .map(|sectors| sectors / block * block)
                .filter(|&sectors| sectors > 0)
                .ok_or(DmError::IntegrityStatus { status })
        })
        .and_then(|provided| {
            dm.table_load(&id, &[integrity_line(disk, provided)], DmOptions::private())
                .map_err(ioctl_error("table reload", DM_INTEGRITY_NAME))?;
            dm.device_suspend(&id, DmOptions::private())
                .map_err(ioctl_error("resume", DM_INTEGRITY_NAME))?;
            Ok(provided)
        });
    match resized {
        Ok(provided) => Ok((devnum, provided)),
        Err(e) => {
            let _ = dm.device_remove(&id, DmOptions::private());
            Err(e)
        }
    }
}

fn wait_for_node(path: &Path, limit: Duration) -> Result<(), DmError> {
    let start = std::time::Instant::now();
    while !path.exists() {
        if start.elapsed() >= limit {
            return Err(DmError::NoNode {
                path: path.to_owned(),
                waited: limit,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
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
