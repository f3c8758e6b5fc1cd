//! The API filesystems PID 1 mounts, in order, and their teardown in reverse order.
//!
//! The plan is data ([`EARLY_MOUNTS`]) and the code that executes it only talks to
//! [`Syscalls`], so the order is unit-tested. `/proc` comes first: the tokio runtime and the
//! kernel command line both need it. securityfs sits inside sysfs and therefore after it.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

use crate::platform::syscalls::{MountSpec, Syscalls};

const PSEUDO: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// The mounts of the bring-up, in mount order.
pub const EARLY_MOUNTS: [MountSpec; 5] = [
    MountSpec {
        source: "proc",
        target: "/proc",
        fstype: "proc",
        flags: PSEUDO,
        data: None,
    },
    MountSpec {
        source: "sysfs",
        target: "/sys",
        fstype: "sysfs",
        flags: PSEUDO,
        data: None,
    },
    MountSpec {
        source: "devtmpfs",
        target: "/dev",
        fstype: "devtmpfs",
        flags: MsFlags::MS_NOSUID,
        data: Some("mode=0755"),
    },
    MountSpec {
        source: "tmpfs",
        target: "/run",
        fstype: "tmpfs",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV),
        data: Some("mode=0755"),
    },
    MountSpec {
        source: "securityfs",
        target: "/sys/kernel/security",
        fstype: "securityfs",
        flags: PSEUDO,
        data: None,
    },
];

/// A mount that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot mount {fstype} on {target}")]
pub struct MountError {
    pub fstype: &'static str,
    pub target: &'static str,
    #[source]
    pub source: io::Error,
}

/// A step of the teardown that failed.
#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    /// A file system PID 1 mounted cannot be unmounted, even lazily.
    #[error("cannot unmount {target} ({fstype})")]
    Unmount {
        fstype: &'static str,
        target: &'static str,
        #[source]
        source: io::Error,
    },
    /// A device-mapper device PID 1 created cannot be removed.
    #[error("cannot close the device-mapper device {name}")]
    CloseDevice {
        name: &'static str,
        #[source]
        source: io::Error,
    },
}

impl TeardownError {
    pub fn io(&self) -> &io::Error {
        match self {
            TeardownError::Unmount { source, .. } | TeardownError::CloseDevice { source, .. } => {
                source
            }
        }
    }
}

/// What the teardown undoes, in the order it was set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Mount(MountSpec),
    /// A device-mapper device: closed after the mounts made after it (the file system on it)
    /// are gone, and before the ones made before it (`/dev`, where its control node lives).
    Device(&'static str),
}

/// A handle on the one [`MountTable`] of PID 1, shared by whoever mounts (the bring-up, the
/// state disk, the pivot) and whoever unmounts (the shutdown, the panic path). Cloning it
/// shares the table. Poison is ignored: the table stays consistent between calls.
#[derive(Debug, Clone, Default)]
pub struct SharedMountTable(std::sync::Arc<std::sync::Mutex<MountTable>>);

impl SharedMountTable {
    /// Locks the table.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, MountTable> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The mounts made so far and the device-mapper devices under them, in setup order: what the
/// shutdown unmounts and closes, in reverse.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MountTable {
    entries: Vec<Entry>,
}

impl MountTable {
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// The mounts, in the order they were made.
    pub fn mounted(&self) -> Vec<MountSpec> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Mount(spec) => Some(*spec),
                Entry::Device(_) => None,
            })
            .collect()
    }

    /// The recorded devices, in recording order.
    pub fn devices(&self) -> Vec<&'static str> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Device(name) => Some(*name),
                Entry::Mount(_) => None,
            })
            .collect()
    }

    /// Records a mount made elsewhere (the pivot's, whose paths change with the switch).
    pub fn record(&mut self, spec: MountSpec) {
        self.entries.push(Entry::Mount(spec));
    }

    /// Records a device-mapper device just created (stacked devices in creation order).
    pub fn record_device(&mut self, name: &'static str) {
        if !self.entries.contains(&Entry::Device(name)) {
            self.entries.push(Entry::Device(name));
        }
    }

    /// Forgets a device that was closed on another path (cleanup after a failed step).
    pub fn forget_device(&mut self, name: &str) {
        self.entries
            .retain(|e| !matches!(e, Entry::Device(d) if *d == name));
    }

    /// Creates the mount point and mounts `spec`, recording it on success.
    pub fn mount(&mut self, sys: &dyn Syscalls, spec: &MountSpec) -> Result<(), MountError> {
        let error = |source| MountError {
            fstype: spec.fstype,
            target: spec.target,
            source,
        };
        sys.create_dir_all(Path::new(spec.target)).map_err(error)?;
        sys.mount(spec).map_err(error)?;
        self.entries.push(Entry::Mount(*spec));
        Ok(())
    }

    /// Mounts every spec in order; stops at the first failure.
    pub fn mount_all(&mut self, sys: &dyn Syscalls, specs: &[MountSpec]) -> Result<(), MountError> {
        specs.iter().try_for_each(|spec| self.mount(sys, spec))
    }

    /// Undoes everything in reverse setup order and forgets it: unmounts, and closes each
    /// device-mapper device once the file systems on it are gone. Returns the failures (each
    /// is also worth a log line, but teardown never stops half-way).
    ///
    /// A plain unmount comes first: for a disk file system it returns only once the file
    /// system is written back and marked clean. A mount still busy is then detached lazily
    /// (`MNT_DETACH`), which is expected for the API filesystems: PID 1 itself keeps
    /// `/dev/console` and `/dev/kmsg` open until the power goes off, and no data lives on them.
    pub fn unmount_all(&mut self, sys: &dyn Syscalls) -> Vec<TeardownError> {
        let mut failures = Vec::new();
        while let Some(entry) = self.entries.pop() {
            match entry {
                Entry::Mount(spec) => {
                    let target = Path::new(spec.target);
                    let result = sys
                        .unmount(target, MntFlags::empty())
                        .or_else(|_| sys.unmount(target, MntFlags::MNT_DETACH));
                    if let Err(source) = result {
                        failures.push(TeardownError::Unmount {
                            fstype: spec.fstype,
                            target: spec.target,
                            source,
                        });
                    }
                }
                Entry::Device(name) => {
                    if let Err(source) = sys.remove_dm_device(name) {
                        failures.push(TeardownError::CloseDevice { name, source });
                    }
                }
            }
        }
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::syscalls::{Call, RecordingSyscalls};
    use nix::errno::Errno;
    use std::path::PathBuf;

    fn mounted_targets(calls: &[Call]) -> Vec<&'static str> {
        calls
            .iter()
            .filter_map(|call| match call {
                Call::Mount(spec) => Some(spec.target),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn bring_up_mounts_proc_first_and_securityfs_after_sysfs() {
        let sys = RecordingSyscalls::new();
        let mut table = MountTable::new();
        table.mount_all(&sys, &EARLY_MOUNTS).unwrap();
        assert_eq!(
            mounted_targets(&sys.calls()),
            ["/proc", "/sys", "/dev", "/run", "/sys/kernel/security"]
        );
        // Every mount point is created right before its mount.
        let calls = sys.calls();
        for pair in calls.chunks(2) {
            let [Call::CreateDirAll(dir), Call::Mount(spec)] = pair else {
                panic!("unexpected call pair {pair:?}");
            };
            assert_eq!(dir, &PathBuf::from(spec.target));
        }
    }

    #[test]
    fn api_filesystems_have_the_expected_types_and_hardening() {
        let by_target = |target: &str| EARLY_MOUNTS.iter().find(|m| m.target == target).unwrap();
        assert_eq!(by_target("/dev").fstype, "devtmpfs");
        assert_eq!(by_target("/sys/kernel/security").fstype, "securityfs");
        for spec in &EARLY_MOUNTS {
            assert!(spec.flags.contains(MsFlags::MS_NOSUID), "{spec:?}");
        }
        // /dev holds device nodes, so it cannot be nodev; the others can.
        assert!(!by_target("/dev").flags.contains(MsFlags::MS_NODEV));
        assert!(by_target("/run").flags.contains(MsFlags::MS_NODEV));
    }

    #[test]
    fn a_failed_mount_names_the_target_and_stops_the_plan() {
        let sys = RecordingSyscalls::new();
        sys.fail(Call::Mount(EARLY_MOUNTS[2]), Errno::ENODEV);
        let mut table = MountTable::new();
        let err = table.mount_all(&sys, &EARLY_MOUNTS).unwrap_err();
        assert_eq!(err.to_string(), "cannot mount devtmpfs on /dev");
        assert_eq!(err.source.raw_os_error(), Some(libc::ENODEV));
        assert_eq!(mounted_targets(&sys.calls()), ["/proc", "/sys", "/dev"]);
        // Only what succeeded is torn down.
        let targets: Vec<_> = table.mounted().iter().map(|m| m.target).collect();
        assert_eq!(targets, ["/proc", "/sys"]);
    }

    #[test]
    fn teardown_unmounts_in_reverse_order_detaches_busy_ones_and_continues_past_failures() {
        let sys = RecordingSyscalls::new();
        let mut table = MountTable::new();
        table.mount_all(&sys, &EARLY_MOUNTS).unwrap();
        let sys = RecordingSyscalls::new();
        // /dev is busy (PID 1's console) and cannot even be detached; /run is busy and is.
        for flags in [MntFlags::empty(), MntFlags::MNT_DETACH] {
            sys.fail(Call::Unmount(PathBuf::from("/dev"), flags), Errno::EBUSY);
        }
        sys.fail(
            Call::Unmount(PathBuf::from("/run"), MntFlags::empty()),
            Errno::EBUSY,
        );
        let failures = table.unmount_all(&sys);
        let calls: Vec<_> = sys
            .calls()
            .into_iter()
            .map(|call| match call {
                Call::Unmount(path, flags) => (path, flags == MntFlags::MNT_DETACH),
                other => panic!("unexpected call {other:?}"),
            })
            .collect();
        let expected = [
            ("/sys/kernel/security", false),
            ("/run", false),
            ("/run", true),
            ("/dev", false),
            ("/dev", true),
            ("/sys", false),
            ("/proc", false),
        ]
        .map(|(path, lazy)| (PathBuf::from(path), lazy));
        assert_eq!(calls, expected);
        assert_eq!(failures.len(), 1);
        assert!(
            matches!(failures[0], TeardownError::Unmount { target: "/dev", .. }),
            "{failures:?}"
        );
        assert!(table.mounted().is_empty());
    }

    #[test]
    fn devices_close_after_the_file_systems_on_them_and_before_older_mounts() {
        let sys = RecordingSyscalls::new();
        let mut table = MountTable::new();
        table.mount_all(&sys, &EARLY_MOUNTS[2..3]).unwrap(); // /dev
        table.record_device("hawser-state_dif");
        table.record_device("hawser-state");
        table.record_device("hawser-state");
        table.record(MountSpec {
            source: "/dev/dm-1",
            target: "/run/hawser/state",
            fstype: "ext4",
            flags: MsFlags::empty(),
            data: None,
        });
        table.record(MountSpec {
            source: "/run/hawser/state/var",
            target: "/var",
            fstype: "bind",
            flags: MsFlags::MS_BIND,
            data: None,
        });
        let sys = RecordingSyscalls::new();
        assert!(table.unmount_all(&sys).is_empty());
        assert_eq!(
            sys.calls(),
            [
                Call::Unmount(PathBuf::from("/var"), MntFlags::empty()),
                Call::Unmount(PathBuf::from("/run/hawser/state"), MntFlags::empty()),
                Call::RemoveDmDevice("hawser-state"),
                Call::RemoveDmDevice("hawser-state_dif"),
                Call::Unmount(PathBuf::from("/dev"), MntFlags::empty()),
            ]
        );
        assert!(table.devices().is_empty() && table.mounted().is_empty());
    }
}
