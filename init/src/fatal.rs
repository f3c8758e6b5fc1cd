//! Fatal errors and panics: log, then apply the reboot policy. PID 1 never exits.
//!
//! If PID 1 exits or its main thread unwinds out of `main`, the kernel panics with "Attempted
//! to kill init!" and the reason scrolls away. Instead, every fatal condition ends here: one
//! `FATAL: <reason>` line (console and kernel log), then either a reboot after
//! `hawser.reboot_delay` seconds (default 30, time to read the console) or, with
//! `hawser.reboot_delay=0`, a halt that lasts forever for debugging.
//!
//! The reboot policy is global because the panic hook must apply it without any context. Until
//! the kernel command line is read it is the default.

use std::error::Error;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::RebootPolicy;
use crate::platform::console;
pub use crate::platform::error_chain;
use crate::platform::syscalls::{LinuxSyscalls, PowerAction};
use crate::shutdown::{self, halt_forever};

/// Global because the panic hook applies it and gets no context.
static REBOOT_POLICY: Mutex<RebootPolicy> = Mutex::new(RebootPolicy::RebootAfter(
    crate::config::DEFAULT_REBOOT_DELAY,
));
/// Global because a fatal error on any thread (or in the panic hook) must see the first one.
static FATAL_IN_PROGRESS: AtomicBool = AtomicBool::new(false);

/// Sets the policy applied by [`fatal`] and the panic hook.
pub fn set_reboot_policy(policy: RebootPolicy) {
    *REBOOT_POLICY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
}

/// The policy applied by [`fatal`] and the panic hook.
pub fn reboot_policy() -> RebootPolicy {
    *REBOOT_POLICY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Installs the panic hook: a panic anywhere (any thread) is fatal.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        fatal(&format!("panic{location}: {payload}"));
    }));
}

/// Logs `FATAL: <reason>` and applies the reboot policy. Never returns.
///
/// Blocks the calling thread: during the reboot delay nothing else of PID 1 is expected to
/// run. A second fatal error while the first is being handled only logs and parks its thread.
pub fn fatal(reason: &str) -> ! {
    console::emit(None, &format!("FATAL: {reason}"));
    if FATAL_IN_PROGRESS.swap(true, Ordering::SeqCst) {
        halt_forever();
    }
    match reboot_policy() {
        RebootPolicy::HaltForever => {
            console::emit(
                None,
                "halting forever (hawser.reboot_delay=0); reset the machine to continue",
            );
            halt_forever();
        }
        RebootPolicy::RebootAfter(delay) => {
            console::emit(None, &format!("rebooting in {} s", delay.as_secs()));
            std::thread::sleep(delay);
        }
    }
    let sys = LinuxSyscalls;
    shutdown::stop_all_processes_unsupervised(&sys);
    console::emit(None, "rebooting");
    let error = shutdown::power_down(&sys, &mut shutdown::mount_table(), PowerAction::Reboot);
    console::emit(None, &format!("reboot(2) failed ({error}); halting"));
    halt_forever();
}

/// [`fatal`] with an error and its sources as the reason.
pub fn fatal_error(error: &dyn Error) -> ! {
    fatal(&error_chain(error))
}
