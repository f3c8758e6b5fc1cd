//! Device-mapper through the kernel's ioctls (the `devicemapper` crate; no libdevmapper, no
//! udev): create a device, load its table, resume it, wait for `/dev/dm-<minor>`, remove it;
//! and `logon` keys in the kernel keyring, which a dm-crypt table can name instead of carrying
//! the key.
//!
//! Both users sit on this one module: the state disk's dm-crypt (and dm-integrity) tables
//! ([`crate::disk::dm`]) and the rootfs's dm-verity table ([`crate::rootfs::activate`]). What a
//! table says is theirs; how it reaches the kernel is here.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use devicemapper::{DM, DevId, DmFlags, DmName, DmOptions, DmUuid};

use super::poll;

/// How long to wait for devtmpfs to create `/dev/dm-N`.
pub const NODE_WAIT: Duration = Duration::from_secs(5);
/// How often the wait for `/dev/dm-N` looks.
const NODE_POLL: Duration = Duration::from_millis(5);

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

    /// The device node devtmpfs creates for a device-mapper device.
    pub fn dm_node(self) -> PathBuf {
        PathBuf::from(format!("/dev/dm-{}", self.minor))
    }
}

/// One line of a device-mapper table: start, length (512-byte sectors), target, parameters.
pub type TableLine = (u64, u64, String, String);

/// A device-mapper step that failed.
#[derive(Debug, thiserror::Error)]
pub enum DmError {
    /// `/dev/mapper/control` cannot be opened (no device-mapper in the kernel, or no devtmpfs).
    #[error("cannot open the device-mapper control node /dev/mapper/control")]
    Control(#[source] io::Error),
    /// add_key(2) refused the key (a description with a NUL byte, or the keyring is full).
    #[error("cannot put the key into the kernel keyring (add_key logon)")]
    Keyring(#[source] io::Error),
    /// A device-mapper ioctl on device `name` failed; the source is the kernel's errno.
    #[error("device-mapper {step} of {name} failed")]
    Ioctl {
        step: &'static str,
        name: &'static str,
        #[source]
        source: io::Error,
    },
    /// dm-integrity's status line has no usable size (the kernel could not format it).
    #[error("dm-integrity on the state disk reports no usable size (status {status:?})")]
    IntegrityStatus { status: String },
    /// devtmpfs did not create the mapped device's node in time.
    #[error("{} did not appear within {} s", path.display(), waited.as_secs())]
    NoNode { path: PathBuf, waited: Duration },
}

/// The errno of a failed ioctl (the crate's own message dumps whole ioctl headers).
fn os_error(error: &devicemapper::DmError) -> io::Error {
    match error {
        devicemapper::DmError::Core(devicemapper::errors::Error::Ioctl(_, _, _, errno)) => {
            io::Error::from_raw_os_error(**errno as i32)
        }
        other => io::Error::other(other.to_string()),
    }
}

fn ioctl_error(
    step: &'static str,
    name: &'static str,
) -> impl FnOnce(devicemapper::DmError) -> DmError {
    move |e| DmError::Ioctl {
        step,
        name,
        source: os_error(&e),
    }
}

/// An open `/dev/mapper/control`.
pub struct DeviceMapper {
    dm: DM,
}

/// How a table is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableMode {
    /// Writable; the table's parameters are wiped from kernel buffers after use
    /// (`DM_SECURE_DATA`): dm-crypt.
    SecureData,
    /// Read-only (`DM_READONLY`): dm-verity refuses a writable table.
    ReadOnly,
}

impl DeviceMapper {
    /// Opens the control node.
    pub fn open() -> Result<Self, DmError> {
        let dm = DM::new().map_err(|e| DmError::Control(os_error(&e)))?;
        Ok(DeviceMapper { dm })
    }

    fn name(name: &'static str) -> Result<&'static DmName, DmError> {
        DmName::new(name).map_err(ioctl_error("naming", name))
    }

    /// Creates device `name` (device-mapper UUID `uuid`), loads `table` and activates it; a
    /// device whose table does not load is removed again.
    pub fn create(
        &self,
        name: &'static str,
        uuid: &str,
        table: &[TableLine],
        mode: TableMode,
    ) -> Result<DevNum, DmError> {
        let dm_name = Self::name(name)?;
        let uuid = DmUuid::new(uuid).map_err(ioctl_error("naming", name))?;
        let (create_options, load_options) = match mode {
            TableMode::SecureData => (
                DmOptions::private(),
                DmOptions::private().set_flags(DmFlags::DM_SECURE_DATA),
            ),
            TableMode::ReadOnly => {
                let read_only = DmOptions::private().set_flags(DmFlags::DM_READONLY);
                (read_only, read_only)
            }
        };
        let info = self
            .dm
            .device_create(dm_name, Some(uuid), create_options)
            .map_err(ioctl_error("create", name))?;
        let loaded = self
            .dm
            .table_load(&DevId::Name(dm_name), table, load_options)
            .map_err(ioctl_error("table load", name))
            .and_then(|_| self.resume(name));
        if let Err(e) = loaded {
            let _ = self
                .dm
                .device_remove(&DevId::Name(dm_name), DmOptions::private());
            return Err(e);
        }
        let device = info.device();
        Ok(DevNum {
            major: device.major,
            minor: device.minor,
        })
    }

    /// Replaces the table of the active device `name` and activates the new one.
    pub fn reload(&self, name: &'static str, table: &[TableLine]) -> Result<(), DmError> {
        let id = DevId::Name(Self::name(name)?);
        self.dm
            .table_load(&id, table, DmOptions::private())
            .map_err(ioctl_error("table reload", name))?;
        self.resume(name)
    }

    /// Resuming (suspend without `DM_SUSPEND`) activates the loaded table.
    fn resume(&self, name: &'static str) -> Result<(), DmError> {
        let id = DevId::Name(Self::name(name)?);
        self.dm
            .device_suspend(&id, DmOptions::private())
            .map(|_| ())
            .map_err(ioctl_error("resume", name))
    }

    /// The status parameters of the first target of device `name`.
    pub fn status(&self, name: &'static str) -> Result<String, DmError> {
        let id = DevId::Name(Self::name(name)?);
        let (_, lines) = self
            .dm
            .table_status(&id, DmOptions::private())
            .map_err(ioctl_error("status", name))?;
        Ok(lines.first().map(|l| l.3.clone()).unwrap_or_default())
    }

    /// Removes device `name`.
    pub fn remove(&self, name: &'static str) -> Result<(), DmError> {
        let id = DevId::Name(Self::name(name)?);
        self.dm
            .device_remove(&id, DmOptions::private())
            .map(|_| ())
            .map_err(ioctl_error("remove", name))
    }
}

/// Removes device `name` if it exists (cleanup after a failed step, and shutdown).
pub fn remove(name: &'static str) -> Result<(), DmError> {
    DeviceMapper::open()?.remove(name)
}

/// Waits until devtmpfs has created `/dev/dm-<minor>` of `devnum`; returns its path.
pub fn wait_for_node(devnum: DevNum, limit: Duration) -> Result<PathBuf, DmError> {
    let path = devnum.dm_node();
    wait_for_path(&path, limit)?;
    Ok(path)
}

fn wait_for_path(path: &Path, limit: Duration) -> Result<(), DmError> {
    poll::wait_until_blocking(limit, NODE_POLL, || path.exists().then_some(())).ok_or_else(|| {
        DmError::NoNode {
            path: path.to_owned(),
            waited: limit,
        }
    })
}

/// A `logon` key in the calling thread's keyring; revoked and unlinked on drop. User space
/// cannot read a `logon` key back; a dm-crypt table names it as `:<bytes>:logon:<description>`.
pub struct LogonKey {
    serial: libc::c_long,
}

impl LogonKey {
    /// Adds `payload` under `description` (which needs a `prefix:`).
    pub fn add(description: &str, payload: &[u8]) -> Result<LogonKey, DmError> {
        let invalid = || DmError::Keyring(io::Error::from(io::ErrorKind::InvalidInput));
        let description = CString::new(description).map_err(|_| invalid())?;
        // SAFETY: add_key(2) reads the two NUL-terminated strings and `payload.len()` bytes at
        // `payload`, all valid for the duration of the call; it keeps no pointer. Neither nix
        // nor rustix wraps add_key.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_nums_parse_from_sysfs_and_name_their_dm_node() {
        let devnum = DevNum::parse("253:2\n").unwrap();
        assert_eq!(
            devnum,
            DevNum {
                major: 253,
                minor: 2
            }
        );
        assert_eq!(devnum.to_string(), "253:2");
        assert_eq!(devnum.dm_node(), Path::new("/dev/dm-2"));
        assert_eq!(DevNum::parse("252"), None);
    }

    #[test]
    fn a_missing_node_is_reported_with_its_path_after_the_wait() {
        let err = wait_for_path(Path::new("/dev/dm-does-not-exist"), Duration::ZERO).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/dev/dm-does-not-exist did not appear within 0 s"
        );
    }
}
