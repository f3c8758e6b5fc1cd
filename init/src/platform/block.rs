//! Finding the state disk by a stable identifier, in sysfs.
//!
//! Probing order (`vda`, `vdb`, …) changes with the VM's device list, so the disk is named on
//! the measured command line by its serial number. There is no udev in the initramfs and so no
//! `/dev/disk/by-id`: the serial is read where the drivers put it, `/sys/block/<name>/serial`
//! (virtio-blk) or `/sys/block/<name>/device/serial` (NVMe, some SCSI). Device-mapper, loop
//! and RAM disks are never candidates.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::dm::DevNum;

/// Longest accepted serial (virtio-blk and NVMe serials are at most 20 bytes).
pub const MAX_SERIAL_LEN: usize = 64;

/// How the state disk is named on the command line (`hawser.state_disk=serial:<serial>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSelector {
    Serial(String),
}

impl DiskSelector {
    /// Parses `serial:<serial>`; `None` if malformed.
    pub fn parse(value: &str) -> Option<DiskSelector> {
        let serial = value.strip_prefix("serial:")?;
        let valid = !serial.is_empty()
            && serial.len() <= MAX_SERIAL_LEN
            && serial
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        valid.then(|| DiskSelector::Serial(serial.to_owned()))
    }
}

impl fmt::Display for DiskSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskSelector::Serial(serial) => write!(f, "serial {serial:?}"),
        }
    }
}

/// A whole-disk block device, as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name, e.g. `vdb`.
    pub name: String,
    pub serial: Option<String>,
    pub devnum: DevNum,
    /// Bytes (sysfs `size` is in 512-byte sectors whatever the logical block size).
    pub size: u64,
    pub read_only: bool,
}

impl BlockDevice {
    /// `/dev/<name>` (devtmpfs).
    pub fn path(&self) -> PathBuf {
        Path::new("/dev").join(&self.name)
    }
}

impl fmt::Display for BlockDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/dev/{}", self.name)?;
        if let Some(serial) = &self.serial {
            write!(f, " (serial {serial:?})")?;
        }
        Ok(())
    }
}

/// Reading sysfs failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}", path.display())]
pub struct SysfsError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn read_attr(path: PathBuf) -> Result<Option<String>, SysfsError> {
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysfsError { path, source }),
    }
}

fn required_attr(path: PathBuf) -> Result<String, SysfsError> {
    read_attr(path.clone())?.ok_or_else(|| SysfsError {
        path,
        source: io::Error::from(io::ErrorKind::NotFound),
    })
}

fn malformed(path: PathBuf, text: &str) -> SysfsError {
    SysfsError {
        path,
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected contents {text:?}"),
        ),
    }
}

/// Every whole disk under `sys_block` (`/sys/block`), sorted by name.
pub fn list_disks(sys_block: &Path) -> Result<Vec<BlockDevice>, SysfsError> {
    let listing = std::fs::read_dir(sys_block).map_err(|source| SysfsError {
        path: sys_block.to_owned(),
        source,
    })?;
    let mut disks = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|source| SysfsError {
            path: sys_block.to_owned(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if ["dm-", "loop", "ram", "zram"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
        {
            continue;
        }
        let dir = sys_block.join(&name);
        let serial = match read_attr(dir.join("serial"))? {
            Some(serial) => Some(serial),
            None => read_attr(dir.join("device/serial"))?,
        }
        .filter(|serial| !serial.is_empty());
        let dev_path = dir.join("dev");
        let dev_text = required_attr(dev_path.clone())?;
        let devnum = DevNum::parse(&dev_text).ok_or_else(|| malformed(dev_path, &dev_text))?;
        let size_path = dir.join("size");
        let size_text = required_attr(size_path.clone())?;
        let sectors: u64 = size_text
            .parse()
            .map_err(|_| malformed(size_path, &size_text))?;
        let ro_path = dir.join("ro");
        let read_only = required_attr(ro_path)? == "1";
        disks.push(BlockDevice {
            name,
            serial,
            devnum,
            size: sectors.saturating_mul(512),
            read_only,
        });
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(disks)
}

/// The outcome of looking for the disk once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(BlockDevice),
    /// No disk matches; the disks that exist, for the error message.
    Missing(Vec<BlockDevice>),
    /// More than one disk matches: refusing to guess.
    Ambiguous(Vec<BlockDevice>),
}

/// Looks for the disk `selector` names among `disks`.
pub fn find(disks: Vec<BlockDevice>, selector: &DiskSelector) -> Lookup {
    let DiskSelector::Serial(serial) = selector;
    let (mut matching, others): (Vec<_>, Vec<_>) = disks
        .into_iter()
        .partition(|disk| disk.serial.as_deref() == Some(serial.as_str()));
    match matching.len() {
        0 => Lookup::Missing(others),
        1 => Lookup::Found(matching.remove(0)),
        _ => Lookup::Ambiguous(matching),
    }
}

/// "vda (serial "x"), vdb (no serial)" or "none".
pub fn describe_disks(disks: &[BlockDevice]) -> String {
    if disks.is_empty() {
        return "none".into();
    }
    disks
        .iter()
        .map(|d| match &d.serial {
            Some(serial) => format!("{} (serial {serial:?})", d.name),
            None => format!("{} (no serial)", d.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(root: &Path, name: &str, attrs: &[(&str, &str)]) {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("device")).unwrap();
        for (attr, value) in attrs {
            std::fs::write(dir.join(attr), format!("{value}\n")).unwrap();
        }
    }

    fn sysfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        add(p, "vda", &[("dev", "252:0"), ("size", "2048"), ("ro", "0")]);
        add(
            p,
            "vdb",
            &[
                ("dev", "252:16"),
                ("size", "524288"),
                ("ro", "0"),
                ("serial", "hawser-state"),
            ],
        );
        add(
            p,
            "nvme0n1",
            &[
                ("dev", "259:0"),
                ("size", "8"),
                ("ro", "1"),
                ("device/serial", "NVME1234  "),
            ],
        );
        add(
            p,
            "dm-0",
            &[
                ("dev", "253:0"),
                ("size", "8"),
                ("ro", "0"),
                ("serial", "hawser-state"),
            ],
        );
        add(p, "loop0", &[("dev", "7:0"), ("size", "0"), ("ro", "0")]);
        root
    }

    #[test]
    fn finds_the_disk_by_serial_whatever_its_name() {
        let root = sysfs();
        let disks = list_disks(root.path()).unwrap();
        let names: Vec<_> = disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["nvme0n1", "vda", "vdb"]);
        let Lookup::Found(disk) = find(disks.clone(), &DiskSelector::Serial("hawser-state".into()))
        else {
            panic!("not found")
        };
        assert_eq!(disk.name, "vdb");
        assert_eq!(
            disk.devnum,
            DevNum {
                major: 252,
                minor: 16
            }
        );
        assert_eq!(disk.size, 268_435_456);
        assert!(!disk.read_only);
        assert_eq!(disk.path(), PathBuf::from("/dev/vdb"));
        assert_eq!(disk.to_string(), "/dev/vdb (serial \"hawser-state\")");
        let Lookup::Found(nvme) = find(disks, &DiskSelector::Serial("NVME1234".into())) else {
            panic!("NVMe serial not read from device/serial")
        };
        assert!(nvme.read_only);
    }

    #[test]
    fn a_missing_disk_lists_what_exists() {
        let root = sysfs();
        let disks = list_disks(root.path()).unwrap();
        let Lookup::Missing(present) = find(disks, &DiskSelector::Serial("other".into())) else {
            panic!("found something")
        };
        assert_eq!(
            describe_disks(&present),
            "nvme0n1 (serial \"NVME1234\"), vda (no serial), vdb (serial \"hawser-state\")"
        );
    }

    #[test]
    fn two_disks_with_one_serial_are_ambiguous() {
        let root = sysfs();
        add(
            root.path(),
            "vdc",
            &[
                ("dev", "252:32"),
                ("size", "8"),
                ("ro", "0"),
                ("serial", "hawser-state"),
            ],
        );
        let disks = list_disks(root.path()).unwrap();
        assert!(matches!(
            find(disks, &DiskSelector::Serial("hawser-state".into())),
            Lookup::Ambiguous(d) if d.len() == 2
        ));
    }

    #[test]
    fn selectors_parse_strictly() {
        assert_eq!(
            DiskSelector::parse("serial:hawser-state"),
            Some(DiskSelector::Serial("hawser-state".into()))
        );
        for bad in [
            "hawser-state",
            "serial:",
            "serial:a b",
            "serial:../x",
            "path:/dev/vdb",
        ] {
            assert_eq!(DiskSelector::parse(bad), None, "{bad}");
        }
    }
}
