//! The API filesystems PID 1 mounts, in order, and their teardown in reverse order.
//!
//! The plan is data ([`EARLY_MOUNTS`]) and the code that executes it only talks to
//! [`Syscalls`], so the order is unit-tested. `/proc` comes first: the tokio runtime and the
//! kernel command line both need it. securityfs sits inside sysfs and therefore after it.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};

use crate::syscalls::{MountSpec, Syscalls};

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

/// The mounts made so far, in mount order: what the shutdown unmounts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MountTable {
    mounted: Vec<MountSpec>,
}

impl MountTable {
    pub const fn new() -> Self {
        Self {
            mounted: Vec::new(),
        }
    }

    /// The mounts, in the order they were made.
    pub fn mounted(&self) -> &[MountSpec] {
        &self.mounted
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
        self.mounted.push(*spec);
        Ok(())
    }

    /// Mounts every spec in order; stops at the first failure.
    pub fn mount_all(&mut self, sys: &dyn Syscalls, specs: &[MountSpec]) -> Result<(), MountError> {
        specs.iter().try_for_each(|spec| self.mount(sys, spec))
    }

    /// Detaches every mount in reverse mount order and forgets it. Returns the failures (each is
    /// also worth a log line, but teardown never stops half-way).
    ///
    /// The API filesystems are detached lazily (`MNT_DETACH`): PID 1 itself keeps
    /// `/dev/console` and `/dev/kmsg` open until the power goes off, so a plain unmount of
    /// `/dev` would fail with EBUSY, and no data lives on them.
    pub fn unmount_all(&mut self, sys: &dyn Syscalls) -> Vec<MountError> {
        let mut failures = Vec::new();
        while let Some(spec) = self.mounted.pop() {
            if let Err(source) = sys.unmount(Path::new(spec.target), MntFlags::MNT_DETACH) {
                failures.push(MountError {
                    fstype: spec.fstype,
                    target: spec.target,
                    source,
                });
            }
        }
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscalls::{Call, RecordingSyscalls};
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
    fn teardown_detaches_in_reverse_order_and_continues_past_failures() {
        let sys = RecordingSyscalls::new();
        let mut table = MountTable::new();
        table.mount_all(&sys, &EARLY_MOUNTS).unwrap();
        let sys = RecordingSyscalls::new();
        sys.fail(
            Call::Unmount(PathBuf::from("/dev"), MntFlags::MNT_DETACH),
            Errno::EINVAL,
        );
        let failures = table.unmount_all(&sys);
        let unmounted: Vec<_> = sys
            .calls()
            .into_iter()
            .map(|call| match call {
                Call::Unmount(path, MntFlags::MNT_DETACH) => path,
                other => panic!("unexpected call {other:?}"),
            })
            .collect();
        assert_eq!(
            unmounted,
            ["/sys/kernel/security", "/run", "/dev", "/sys", "/proc"].map(PathBuf::from)
        );
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].target, "/dev");
        assert!(table.mounted().is_empty());
    }
}
