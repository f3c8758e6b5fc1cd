//! The pivot plan's exact order of calls, through the recording syscalls.

use super::*;
use crate::platform::syscalls::{Call, RecordingSyscalls};
use nix::errno::Errno;
use std::cell::Cell;

fn dir(path: &str) -> Call {
    Call::CreateDirAll(PathBuf::from(path))
}

fn owned(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> OwnedMountSpec {
    OwnedMountSpec {
        source: source.map(str::to_owned),
        target: PathBuf::from(target),
        fstype: fstype.map(str::to_owned),
        flags,
        data: data.map(str::to_owned),
    }
}

fn mounted(source: &str, target: &str, fstype: &str, flags: MsFlags, data: Option<&str>) -> Call {
    Call::MountOwned(owned(Some(source), target, Some(fstype), flags, data))
}

fn bound(source: &str, target: &str) -> Call {
    Call::MountOwned(owned(Some(source), target, None, MsFlags::MS_BIND, None))
}

fn moved(source: &str, target: &str) -> Call {
    Call::MountOwned(owned(Some(source), target, None, MsFlags::MS_MOVE, None))
}

type Measured = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn no_measurement() -> impl FnMut(&'static str) -> Measured {
    |_| Ok(())
}

#[test]
fn the_switch_with_a_state_disk_runs_in_order() {
    let sys = RecordingSyscalls::new();
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let measured = std::cell::RefCell::new(Vec::new());
    let outcome = switch_root(&sys, &plan, &mut |phase| {
        measured.borrow_mut().push((phase, sys.calls().len()));
        Ok(())
    })
    .unwrap();
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let expected = [
        dir("/sysroot"),
        mounted(
            "/dev/dm-1",
            "/sysroot",
            "erofs",
            MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
            None,
        ),
        dir("/run/hawser/state/var"),
        dir("/run/hawser/state/etc/kubernetes"),
        dir("/sysroot/var"),
        bound("/run/hawser/state/var", "/sysroot/var"),
        Call::Symlink {
            target: "../run".into(),
            link: "/sysroot/var/run".into(),
        },
        Call::Symlink {
            target: "../run/lock".into(),
            link: "/sysroot/var/lock".into(),
        },
        dir("/run/hawser/etc-overlay/upper"),
        dir("/run/hawser/etc-overlay/work"),
        dir("/sysroot/etc"),
        mounted(
            "overlay",
            "/sysroot/etc",
            "overlay",
            nosuid_nodev,
            Some(
                "lowerdir=/sysroot/etc,upperdir=/run/hawser/etc-overlay/upper,\
                 workdir=/run/hawser/etc-overlay/work",
            ),
        ),
        dir("/sysroot/etc/kubernetes"),
        bound(
            "/run/hawser/state/etc/kubernetes",
            "/sysroot/etc/kubernetes",
        ),
        dir("/sysroot/tmp"),
        mounted(
            "tmpfs",
            "/sysroot/tmp",
            "tmpfs",
            nosuid_nodev,
            Some("mode=1777"),
        ),
        // The measurement happens here.
        Call::OpenOldRoot("/".into()),
        dir("/sysroot/dev"),
        moved("/dev", "/sysroot/dev"),
        dir("/sysroot/proc"),
        moved("/proc", "/sysroot/proc"),
        dir("/sysroot/sys"),
        moved("/sys", "/sysroot/sys"),
        dir("/sysroot/run"),
        moved("/run", "/sysroot/run"),
        Call::ChangeDir("/sysroot".into()),
        moved(".", "/"),
        Call::ChangeRoot(".".into()),
        Call::ChangeDir("/".into()),
        Call::MountOwned(owned(
            None,
            "/",
            None,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None,
        )),
    ];
    assert_eq!(sys.calls(), expected);
    // Every mount of the new root before the measurement, nothing moved before it.
    // A worker: leave-initrd alone, no control-plane marker.
    assert_eq!(*measured.borrow(), [("leave-initrd", 16)]);
}

/// A control plane's switch: the same calls as a worker's, and PCR 11 gets `control-plane`
/// immediately before `leave-initrd`, both after the last mount and before anything moves.
#[test]
fn a_control_plane_measures_its_marker_immediately_before_leave_initrd() {
    let worker = RecordingSyscalls::new();
    switch_root(
        &worker,
        &RootfsPlan::new("/dev/dm-1", StateBacking::Disk),
        &mut no_measurement(),
    )
    .unwrap();
    let sys = RecordingSyscalls::new();
    let plan =
        RootfsPlan::new("/dev/dm-1", StateBacking::Disk).measured_role(MeasuredRole::ControlPlane);
    let measured = std::cell::RefCell::new(Vec::new());
    switch_root(&sys, &plan, &mut |phase| {
        measured.borrow_mut().push((phase, sys.calls().len()));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        sys.calls(),
        worker.calls(),
        "the role changes no mount or move"
    );
    assert_eq!(
        *measured.borrow(),
        [("control-plane", 16), ("leave-initrd", 16)],
        "both after the 16 mount calls, nothing in between, marker first"
    );
    assert_eq!(
        plan.measured_phases(),
        [
            hawser_pcr::PHASE_CONTROL_PLANE,
            hawser_pcr::PHASE_LEAVE_INITRD
        ]
    );
    // In the plan itself: the two measurements are adjacent and the switch starts after them.
    let steps = plan.steps();
    let first = steps
        .iter()
        .position(|s| matches!(s, Step::MeasurePhase(_)))
        .unwrap();
    assert_eq!(
        steps[first..first + 3],
        [
            Step::MeasurePhase("control-plane"),
            Step::MeasurePhase("leave-initrd"),
            Step::OpenOldRoot("/".into()),
        ]
    );
    assert!(
        steps[..first]
            .iter()
            .all(|s| !matches!(s, Step::OpenOldRoot(_)))
    );
    // A worker's plan has no marker at all.
    let worker_steps = RootfsPlan::new("/dev/dm-1", StateBacking::Disk).steps();
    assert!(!worker_steps.contains(&Step::MeasurePhase("control-plane")));
}

/// A failed marker stops the switch before `leave-initrd` and before anything moves.
#[test]
fn a_failed_control_plane_marker_moves_nothing() {
    let sys = RecordingSyscalls::new();
    let plan =
        RootfsPlan::new("/dev/dm-1", StateBacking::Disk).measured_role(MeasuredRole::ControlPlane);
    let measured = std::cell::RefCell::new(Vec::new());
    let err = switch_root(&sys, &plan, &mut |phase| {
        measured.borrow_mut().push(phase);
        Err("TPM went away".into())
    })
    .unwrap_err();
    assert_eq!(
        crate::platform::error_chain(&err),
        "cannot switch to the verified rootfs: measuring control-plane into PCR 11 failed: \
         TPM went away"
    );
    assert_eq!(*measured.borrow(), ["control-plane"]);
    assert!(
        !sys.calls()
            .iter()
            .any(|call| matches!(call, Call::OpenOldRoot(_)))
    );
}

#[test]
fn without_a_state_disk_var_is_a_tmpfs_and_nothing_touches_the_state_mount() {
    let sys = RecordingSyscalls::new();
    let plan = RootfsPlan::new("/dev/dm-0", StateBacking::Ephemeral);
    switch_root(&sys, &plan, &mut no_measurement()).unwrap();
    let calls = sys.calls();
    assert!(calls.contains(&mounted(
        "tmpfs",
        "/sysroot/var",
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755")
    )));
    let touches_state = calls
        .iter()
        .any(|call| format!("{call:?}").contains(STATE_MOUNT_POINT));
    assert!(!touches_state, "{calls:?}");
}

#[test]
fn a_failed_mount_stops_before_the_measurement() {
    let sys = RecordingSyscalls::new();
    // The image has no /tmp: creating the mount point on the read-only erofs fails.
    sys.fail(dir("/sysroot/tmp"), Errno::EROFS);
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let measured = Cell::new(false);
    let err = switch_root(&sys, &plan, &mut |_| {
        measured.set(true);
        Ok(())
    })
    .unwrap_err();
    assert_eq!(
        crate::platform::error_chain(&err),
        "cannot switch to the verified rootfs: create directory /sysroot/tmp failed: \
         Read-only file system (os error 30)"
    );
    assert!(!measured.get());
    assert_eq!(sys.calls().last(), Some(&dir("/sysroot/tmp")));
}

#[test]
fn a_failed_measurement_moves_nothing() {
    let sys = RecordingSyscalls::new();
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let err = switch_root(&sys, &plan, &mut |_| Err("TPM went away".into())).unwrap_err();
    assert_eq!(
        crate::platform::error_chain(&err),
        "cannot switch to the verified rootfs: measuring leave-initrd into PCR 11 failed: \
         TPM went away"
    );
    assert!(
        !sys.calls()
            .iter()
            .any(|call| matches!(call, Call::OpenOldRoot(_) | Call::ChangeRoot(_)))
    );
}

#[test]
fn a_failed_move_names_the_mount() {
    let sys = RecordingSyscalls::new();
    sys.fail(moved("/sys", "/sysroot/sys"), Errno::EINVAL);
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let err = switch_root(&sys, &plan, &mut no_measurement()).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("move mount /sys to /sysroot/sys failed"),
        "{err}"
    );
    assert!(!sys.calls().contains(&Call::ChangeRoot(".".into())));
}

#[test]
fn the_initramfs_is_left_open_by_the_switch_and_a_failed_deletion_is_only_a_warning() {
    let sys = RecordingSyscalls::new();
    sys.fail(Call::RemoveOldRoot, Errno::EIO);
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let outcome = switch_root(&sys, &plan, &mut no_measurement()).unwrap();
    // The switch went on to the end without deleting anything.
    assert_eq!(
        sys.calls().last().map(|c| matches!(c, Call::MountOwned(_))),
        Some(true)
    );
    assert!(!sys.calls().contains(&Call::RemoveOldRoot));
    let (removed, warnings) = delete_old_root(&sys, outcome.old_root.unwrap());
    assert_eq!(removed, None);
    assert_eq!(
        warnings,
        [
            "cannot delete the initramfs contents (Input/output error (os error 5)); its memory \
          stays in use"
        ]
    );
}

#[test]
fn shutdown_mounts_are_the_plans_mounts_seen_from_the_new_root() {
    for state in [StateBacking::Disk, StateBacking::Ephemeral] {
        let plan = RootfsPlan::new("/dev/dm-1", state);
        let planned: Vec<PathBuf> = plan
            .mount_steps()
            .into_iter()
            .filter_map(|step| match step {
                Step::Mount(spec) if spec.target != Path::new(SYSROOT) => {
                    Some(Path::new("/").join(spec.target.strip_prefix(SYSROOT).unwrap()))
                }
                _ => None,
            })
            .collect();
        let recorded: Vec<PathBuf> = plan
            .shutdown_mounts()
            .iter()
            .map(|m| PathBuf::from(m.target))
            .collect();
        assert_eq!(planned, recorded, "{state:?}");
    }
}

#[test]
fn steps_read_as_sentences() {
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let text: Vec<String> = plan.steps().iter().map(Step::to_string).collect();
    assert_eq!(text[1], "mount erofs /dev/dm-1 on /sysroot read-only");
    assert_eq!(text[5], "bind-mount /run/hawser/state/var on /sysroot/var");
    assert_eq!(
        text.last().unwrap(),
        "make / and the mounts below it shared"
    );
}

#[test]
fn the_mounts_after_the_switch_are_the_new_roots_without_the_root_itself() {
    let plan = RootfsPlan::new("/dev/dm-1", StateBacking::Disk);
    let targets: Vec<_> = plan
        .mounts_after_switch()
        .iter()
        .map(|m| (m.target, m.fstype))
        .collect();
    assert_eq!(
        targets,
        [
            ("/var", "bind"),
            ("/etc", "overlay"),
            ("/etc/kubernetes", "bind"),
            ("/tmp", "tmpfs"),
        ]
    );
    let ephemeral = RootfsPlan::new("/dev/dm-1", StateBacking::Ephemeral);
    let targets: Vec<_> = ephemeral
        .mounts_after_switch()
        .iter()
        .map(|m| m.target)
        .collect();
    assert_eq!(targets, ["/var", "/etc", "/tmp"]);
}
