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

/// Installs the panic hook. A panic on PID 1's main thread (where `boot::run` and the runtime's
/// tasks run) is fatal; one on any other thread is contained: it is logged, naming the thread,
/// and that thread unwinds. Other threads are helpers whose owner sees the failure as a value
/// (a `JoinError`, a closed channel) and decides: a library's own thread (mdns-sd's daemon,
/// which parses every packet on the LAN; boringtun's workers) must not turn one bad packet
/// into a reboot of a node that is already locked to its cluster.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        match on_panic(thread.name(), info) {
            PanicAction::Fatal(reason) => fatal(&reason),
            PanicAction::Contained(line) => console::emit(None, &line),
        }
    }));
}

/// What the panic hook does with one panic.
#[derive(Debug, PartialEq, Eq)]
enum PanicAction {
    /// Log `FATAL: <reason>` and apply the reboot policy.
    Fatal(String),
    /// Log this line; the panicking thread unwinds.
    Contained(String),
}

/// Decides a panic on thread `thread` (its name; the main thread is `main`).
fn on_panic(thread: Option<&str>, info: &std::panic::PanicHookInfo<'_>) -> PanicAction {
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
    match thread {
        Some("main") => PanicAction::Fatal(format!("panic{location}: {payload}")),
        other => PanicAction::Contained(format!(
            "ERROR: panic in thread {:?}{location}: {payload} (contained: that thread stops, \
             its owner sees the failure; PID 1 goes on)",
            other.unwrap_or("<unnamed>")
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `body` on a thread named `name` (None: unnamed) under a hook that records what
    /// [`on_panic`] decides instead of acting on it (acting would reboot the test machine).
    fn decide(name: Option<&str>, body: impl FnOnce() + Send + 'static) -> (PanicAction, bool) {
        let decided = std::sync::Arc::new(Mutex::new(None));
        let recorded = std::sync::Arc::clone(&decided);
        let ours = std::sync::Arc::new(Mutex::new(None));
        let ours_in_hook = std::sync::Arc::clone(&ours);
        let previous = std::sync::Arc::new(std::panic::take_hook());
        let others = std::sync::Arc::clone(&previous);
        // Only the spawned thread's panic is recorded: tests run side by side in one process.
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if *ours_in_hook.lock().unwrap() == Some(thread.id()) {
                *recorded.lock().unwrap() = Some(on_panic(thread.name(), info));
            } else {
                others(info);
            }
        }));
        let mut builder = std::thread::Builder::new();
        if let Some(name) = name {
            builder = builder.name(name.to_owned());
        }
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let thread = builder
            .spawn(move || {
                let _ = wait.recv();
                body();
            })
            .unwrap();
        *ours.lock().unwrap() = Some(thread.thread().id());
        go.send(()).unwrap();
        let unwound = thread.join().is_err();
        drop(std::panic::take_hook());
        if let Ok(previous) = std::sync::Arc::try_unwrap(previous) {
            std::panic::set_hook(previous);
        }
        let action = decided.lock().unwrap().take().unwrap();
        (action, unwound)
    }

    #[test]
    fn a_panic_off_the_main_thread_is_contained_and_named() {
        // One test for both: the panic hook is process-wide.
        let (action, unwound) = decide(Some("mDNS_daemon"), || panic!("bad packet"));
        assert!(
            unwound,
            "the helper thread unwinds, its owner sees the failure"
        );
        let PanicAction::Contained(line) = action else {
            panic!("a helper thread's panic was fatal: {action:?}");
        };
        assert!(line.contains("\"mDNS_daemon\""), "{line}");
        assert!(line.contains("bad packet"), "{line}");
        assert!(line.contains("fatal.rs:"), "{line}");
        let (action, _) = decide(None, || panic!("{}", String::from("owned message")));
        assert!(
            matches!(&action, PanicAction::Contained(line) if line.contains("<unnamed>") && line.contains("owned message")),
            "{action:?}"
        );
        // The main thread's panics stay fatal, with their place and message.
        let (action, _) = decide(Some("main"), || panic!("in boot"));
        assert!(
            matches!(&action, PanicAction::Fatal(reason) if reason.starts_with("panic at ") && reason.ends_with(": in boot")),
            "{action:?}"
        );
    }
}
