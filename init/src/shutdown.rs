//! Orderly shutdown: stop every process, sync, unmount in reverse order, close the state
//! disk's device-mapper devices, power off or reboot.
//!
//! Used for a requested shutdown (SIGTERM, SIGINT, SIGPWR, the power button) and, with
//! [`PowerAction::Reboot`], after a fatal error. The order of the steps is unit-tested through
//! [`Syscalls`].

use std::sync::{MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::platform::mounts::{MountTable, SharedMountTable};
use crate::platform::syscalls::{PowerAction, Syscalls};

/// How long processes get between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long to wait for processes to disappear after SIGKILL.
pub const STRAGGLER_KILL_WAIT: Duration = Duration::from_secs(3);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Global because the panic hook and [`crate::fatal::fatal`] get no context: the mount table
/// they unmount, registered once by the boot ([`register_mount_table`]). Everything else
/// receives the [`SharedMountTable`] from the boot's context.
static PANIC_PATH_MOUNTS: OnceLock<SharedMountTable> = OnceLock::new();

/// Registers PID 1's mount table for the panic path ([`mount_table`]); the first call wins.
pub fn register_mount_table(mounts: &SharedMountTable) {
    let _ = PANIC_PATH_MOUNTS.set(mounts.clone());
}

/// The registered mount table (empty if the boot registered none yet). Only for the panic
/// path and [`crate::fatal::fatal`], which have no context to get it from.
pub fn mount_table() -> MutexGuard<'static, MountTable> {
    PANIC_PATH_MOUNTS
        .get_or_init(SharedMountTable::default)
        .lock()
}

/// What the sweep of every process (SIGTERM, then SIGKILL) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// No process was left after SIGTERM.
    Terminated,
    /// SIGKILL was needed, after which no process was left.
    Killed,
    /// Processes were still there after SIGKILL (stuck in the kernel, e.g. on I/O).
    Stuck,
}

/// Sends SIGTERM to every process, waits up to `grace` for all of them to go, then SIGKILL
/// and waits up to `kill_wait`. `processes_left` says whether any process other than PID 1 is
/// still alive; `sleep` waits one poll interval. Blocking: the async shutdown runs it on a
/// blocking thread so that the reaper and tokio's own child reaping keep running meanwhile.
pub fn stop_all_processes(
    sys: &dyn Syscalls,
    grace: Duration,
    kill_wait: Duration,
    mut processes_left: impl FnMut() -> bool,
    mut sleep: impl FnMut(Duration),
) -> Sweep {
    if !processes_left() {
        return Sweep::Terminated;
    }
    if let Err(e) = sys.kill_all(Signal::SIGTERM) {
        tracing::warn!("cannot send SIGTERM to all processes: {e}");
    }
    if wait_until_gone(grace, &mut processes_left, &mut sleep) {
        return Sweep::Terminated;
    }
    tracing::warn!(
        "processes still running {} s after SIGTERM; sending SIGKILL",
        grace.as_secs()
    );
    if let Err(e) = sys.kill_all(Signal::SIGKILL) {
        tracing::warn!("cannot send SIGKILL to all processes: {e}");
    }
    if wait_until_gone(kill_wait, &mut processes_left, &mut sleep) {
        Sweep::Killed
    } else {
        Sweep::Stuck
    }
}

fn wait_until_gone(
    limit: Duration,
    processes_left: &mut impl FnMut() -> bool,
    sleep: &mut impl FnMut(Duration),
) -> bool {
    let start = Instant::now();
    loop {
        if !processes_left() {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        sleep(POLL_INTERVAL);
    }
}

/// The last steps: sync, unmount in reverse order, close the recorded device-mapper devices,
/// sync, reboot(2). Returns the
/// error of reboot(2) if it returned at all (it does not on success).
pub fn power_down(
    sys: &dyn Syscalls,
    mounts: &mut MountTable,
    action: PowerAction,
) -> std::io::Error {
    sys.sync();
    let (mounted, devices) = (mounts.mounted().len(), mounts.devices().len());
    let failures = mounts.unmount_all(sys);
    for failure in &failures {
        tracing::warn!("{failure}: {}", failure.io());
    }
    tracing::info!(
        "unmounted {mounted} file systems and closed {devices} device-mapper devices ({} failed)",
        failures.len()
    );
    sys.sync();
    match sys.reboot(action) {
        Err(e) => e,
        Ok(()) => std::io::Error::other("reboot(2) returned"),
    }
}

/// Blocks the calling thread forever (a PID 1 that has nothing left to do must not exit).
pub fn halt_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Whether any process other than this one is alive. Every process of the system descends from
/// PID 1, and a process whose parent dies is re-parented to PID 1, so this is the same as having
/// a child that is not a zombie.
pub fn processes_left() -> bool {
    crate::platform::reaper::has_living_children()
}

/// [`stop_all_processes`] for paths where no runtime runs (panic hook, fatal error): reaps
/// every child itself, since nobody else will.
pub fn stop_all_processes_unsupervised(sys: &dyn Syscalls) -> Sweep {
    stop_all_processes(
        sys,
        STOP_GRACE,
        STRAGGLER_KILL_WAIT,
        || {
            crate::platform::reaper::reap_all();
            processes_left()
        },
        std::thread::sleep,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::mounts::EARLY_MOUNTS;
    use crate::platform::syscalls::{Call, RecordingSyscalls};
    use nix::mount::MntFlags;
    use std::cell::Cell;
    use std::path::PathBuf;

    fn no_sleep(_: Duration) {}

    #[test]
    fn power_down_syncs_unmounts_in_reverse_closes_devices_and_powers_off() {
        let mounter = RecordingSyscalls::new();
        let mut table = MountTable::new();
        table.mount_all(&mounter, &EARLY_MOUNTS[..4]).unwrap();
        table.record_device("hawser-state");
        table.mount_all(&mounter, &EARLY_MOUNTS[4..]).unwrap();
        let sys = RecordingSyscalls::new();
        let _ = power_down(&sys, &mut table, PowerAction::PowerOff);
        let unmount = |p: &str| Call::Unmount(PathBuf::from(p), MntFlags::empty());
        assert_eq!(
            sys.calls(),
            [
                Call::Sync,
                unmount("/sys/kernel/security"),
                Call::RemoveDmDevice("hawser-state"),
                unmount("/run"),
                unmount("/dev"),
                unmount("/sys"),
                unmount("/proc"),
                Call::Sync,
                Call::Reboot(PowerAction::PowerOff),
            ]
        );
    }

    #[test]
    fn a_failed_reboot_is_reported() {
        let sys = RecordingSyscalls::new();
        sys.fail(Call::Reboot(PowerAction::Reboot), nix::errno::Errno::EPERM);
        let err = power_down(&sys, &mut MountTable::new(), PowerAction::Reboot);
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn nothing_is_signalled_without_processes() {
        let sys = RecordingSyscalls::new();
        let outcome = stop_all_processes(&sys, STOP_GRACE, STRAGGLER_KILL_WAIT, || false, no_sleep);
        assert_eq!(outcome, Sweep::Terminated);
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn sigterm_is_enough_when_processes_exit() {
        let sys = RecordingSyscalls::new();
        // Alive at the first two checks, gone afterwards.
        let checks = Cell::new(0);
        let outcome = stop_all_processes(
            &sys,
            STOP_GRACE,
            STRAGGLER_KILL_WAIT,
            || {
                checks.set(checks.get() + 1);
                checks.get() <= 2
            },
            no_sleep,
        );
        assert_eq!(outcome, Sweep::Terminated);
        assert_eq!(sys.calls(), [Call::KillAll(Signal::SIGTERM)]);
    }

    #[test]
    fn sigkill_follows_the_grace_period() {
        let sys = RecordingSyscalls::new();
        let killed = || sys.calls().contains(&Call::KillAll(Signal::SIGKILL));
        let outcome = stop_all_processes(
            &sys,
            Duration::from_millis(30),
            Duration::from_millis(30),
            || !killed(),
            std::thread::sleep,
        );
        assert_eq!(outcome, Sweep::Killed);
        assert_eq!(
            sys.calls(),
            [
                Call::KillAll(Signal::SIGTERM),
                Call::KillAll(Signal::SIGKILL)
            ]
        );
    }

    #[test]
    fn processes_that_survive_sigkill_are_reported_stuck() {
        let sys = RecordingSyscalls::new();
        let started = Instant::now();
        let outcome = stop_all_processes(
            &sys,
            Duration::from_millis(30),
            Duration::from_millis(30),
            || true,
            std::thread::sleep,
        );
        assert_eq!(outcome, Sweep::Stuck);
        assert!(started.elapsed() >= Duration::from_millis(60));
    }
}
