//! Logging for PID 1: every line goes to `/dev/console` and to `/dev/kmsg`.
//!
//! Console lines carry a CLOCK_MONOTONIC timestamp in the kernel's own style
//! (`[   12.345678] hawser: ...`), so they read alongside the kernel's messages on a serial
//! console. (printk stamps with the scheduler clock, which can drift from CLOCK_MONOTONIC by
//! some milliseconds on a VM: the order of nearby lines is not exact.)
//!
//! The copy in the kernel log (`dmesg`, and whatever collects it) is written with priority 7
//! (`KERN_DEBUG`). The kernel echoes a kmsg record to the console only when its level is below
//! `console_loglevel` (4 with `quiet`, 7 by default), so a debug-level record is never echoed and
//! each line appears on the console exactly once. Booting with `debug` or `loglevel=8` raises
//! `console_loglevel` above 7 and shows every line twice. The level of a line is in its text
//! (`warning:`, `error:`) rather than in the kmsg priority.
//!
//! The kernel rate-limits writers of `/dev/kmsg` to 10 lines per 5 s unless
//! `kernel.printk_devkmsg` is `on`; PID 1 sets it (see [`attach_kmsg`]).
//!
//! A [`tracing`] layer formats events into these lines. [`emit`] writes a line directly, for
//! the panic hook and for fatal errors, which must be printed even if tracing is not set up.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Mutex, OnceLock};

use nix::time::{ClockId, clock_gettime};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, reload};

/// kmsg priority of hawser's lines: `KERN_DEBUG`, never echoed at the default console levels.
pub const KMSG_PRIORITY: u8 = 7;
/// The kmsg record length limit (`PRINTKRB_RECORD_MAX` is 1024 minus a header); longer lines
/// are cut in the kernel log (the console still gets the whole line).
const KMSG_LINE_MAX: usize = 976;

struct Sinks {
    console: Option<File>,
    kmsg: Option<File>,
}

/// Global because every log line goes there, also from the panic hook and `fatal`, which get
/// no context.
static SINKS: Mutex<Sinks> = Mutex::new(Sinks {
    console: None,
    kmsg: None,
});
/// Global because the tracing subscriber is process-wide: the handle that changes its level.
static LEVEL_HANDLE: OnceLock<reload::Handle<LevelFilter, tracing_subscriber::Registry>> =
    OnceLock::new();

/// Copies of every log line for whoever listens (the init server streams them to the admin).
/// Global because the process-wide subscriber writes into it.
static TAP: OnceLock<tokio::sync::broadcast::Sender<String>> = OnceLock::new();

/// How many log lines a slow listener may fall behind before it misses some.
const TAP_CAPACITY: usize = 256;

/// A receiver of every log line emitted from now on (the text of [`line_text`], no timestamp).
/// A listener that falls more than [`TAP_CAPACITY`] lines behind is told how many it missed.
pub fn subscribe_lines() -> tokio::sync::broadcast::Receiver<String> {
    TAP.get_or_init(|| tokio::sync::broadcast::channel(TAP_CAPACITY).0)
        .subscribe()
}

fn sinks() -> std::sync::MutexGuard<'static, Sinks> {
    SINKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Makes sure file descriptors 0, 1 and 2 are open, on `/dev/console`.
///
/// The kernel opens `/dev/console` as fds 0–2 for init when the initramfs has that node; if it
/// does not (or the open failed), the first files PID 1 opens would become its stdout and
/// stderr, and children would inherit them.
pub fn ensure_std_fds() {
    for fd in 0..=2 {
        if nix::fcntl::fcntl(
            // SAFETY: fd 0-2 are only inspected with F_GETFD; a closed fd yields EBADF.
            unsafe { BorrowedFd::borrow_raw(fd) },
            nix::fcntl::FcntlArg::F_GETFD,
        )
        .is_ok()
        {
            continue;
        }
        let Ok(console) = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open("/dev/console")
        else {
            return;
        };
        let raw = console.into_raw_fd();
        if raw != fd {
            // SAFETY: dup2 onto a closed descriptor number we just checked; `raw` is ours and
            // is closed right after, so no descriptor is leaked or double-owned.
            unsafe {
                libc::dup2(raw, fd);
                libc::close(raw);
            }
        }
    }
}

/// Opens `/dev/console` for log lines (from the initramfs's node, before devtmpfs is mounted).
pub fn open_console() {
    let console = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/console");
    if let Ok(file) = console {
        sinks().console = Some(file);
    }
}

/// Opens `/dev/kmsg` (after devtmpfs is mounted) and lifts the kernel's rate limit for it.
/// Returns a warning to log if either failed.
pub fn attach_kmsg() -> Option<String> {
    let mut warning = None;
    if let Err(e) = std::fs::write("/proc/sys/kernel/printk_devkmsg", "on\n") {
        // Fails when printk.devkmsg= is given on the kernel command line (the setting is then
        // locked): the operator chose.
        warning = Some(format!(
            "cannot set kernel.printk_devkmsg=on ({e}); the kernel may rate-limit hawser's kernel log lines"
        ));
    }
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/kmsg")
    {
        Ok(file) => sinks().kmsg = Some(file),
        Err(e) => {
            warning = Some(format!(
                "cannot open /dev/kmsg ({e}); logging to the console only"
            ))
        }
    }
    warning
}

/// CLOCK_MONOTONIC in seconds: the clock of the kernel's printk timestamps.
pub fn monotonic_seconds() -> f64 {
    clock_seconds(ClockId::CLOCK_MONOTONIC)
}

/// CLOCK_BOOTTIME in seconds: like CLOCK_MONOTONIC, but counting suspend.
pub fn boottime_seconds() -> f64 {
    clock_seconds(ClockId::CLOCK_BOOTTIME)
}

fn clock_seconds(clock: ClockId) -> f64 {
    // clock_gettime only fails for an invalid clock id; these two always exist on Linux.
    clock_gettime(clock)
        .map(|ts| ts.tv_sec() as f64 + ts.tv_nsec() as f64 / 1e9)
        .unwrap_or(0.0)
}

/// `[   12.345678] ` for a time in seconds, as the kernel prints it.
pub fn format_timestamp(seconds: f64) -> String {
    let micros = (seconds * 1e6).round() as u64;
    format!("[{:5}.{:06}] ", micros / 1_000_000, micros % 1_000_000)
}

fn level_tag(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error: ",
        Level::WARN => "warning: ",
        Level::INFO => "",
        Level::DEBUG => "debug: ",
        Level::TRACE => "trace: ",
    }
}

/// The text of a log line without timestamp: `hawser: <tag><message>`.
pub fn line_text(level: Option<Level>, message: &str) -> String {
    format!("hawser: {}{message}", level.map_or("", level_tag))
}

/// Writes one line to the console (with timestamp) and to the kernel log.
/// `level` None writes the message without a level tag (`FATAL: ...`).
pub fn emit(level: Option<Level>, message: &str) {
    let text = line_text(level, message);
    if let Some(tap) = TAP.get() {
        // No receiver is fine: nobody is listening.
        let _ = tap.send(text.clone());
    }
    let mut sinks = sinks();
    if let Some(console) = &mut sinks.console {
        let line = format!("{}{text}\n", format_timestamp(monotonic_seconds()));
        // Nothing sensible can be done about a console that cannot be written to.
        let _ = console.write_all(line.as_bytes());
    }
    if let Some(kmsg) = &mut sinks.kmsg {
        for part in text.lines() {
            let mut record = format!("<{KMSG_PRIORITY}>");
            record.push_str(truncate(part, KMSG_LINE_MAX));
            // One write is one kmsg record.
            let _ = kmsg.write(record.as_bytes());
        }
    }
}

/// Writes a line to the console only, as is: no timestamp, no prefix, not in the kernel log.
/// Used for the boot report, a machine-readable line too long for a kmsg record.
pub fn emit_raw_console_line(line: &str) {
    let mut sinks = sinks();
    if let Some(console) = &mut sinks.console {
        let mut buffer = String::with_capacity(line.len() + 1);
        buffer.push_str(line);
        buffer.push('\n');
        let _ = console.write_all(buffer.as_bytes());
    }
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The tracing layer that formats events with [`emit`].
struct ConsoleLayer;

#[derive(Default)]
struct LineVisitor {
    message: String,
    fields: String,
}

impl tracing::field::Visit for LineVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for ConsoleLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut visitor = LineVisitor::default();
        event.record(&mut visitor);
        visitor.message.push_str(&visitor.fields);
        if is_interrupted_poll(event.metadata().target(), &visitor.message) {
            return;
        }
        emit(Some(*event.metadata().level()), &visitor.message);
    }
}

/// boringtun's event loop logs an `epoll_wait` that a signal interrupted (EINTR) as an error
/// and simply waits again: not an error. PID 1 interrupts it on purpose when it parks its
/// threads (`platform::rebase`), so the line is dropped.
fn is_interrupted_poll(target: &str, line: &str) -> bool {
    target.starts_with("boringtun")
        && line.starts_with("Poll error")
        && line.contains(&format!("(os error {})", libc::EINTR))
}

/// Installs the tracing subscriber (level INFO until [`set_level`]).
pub fn init_tracing() {
    let (filter, handle) = reload::Layer::new(LevelFilter::INFO);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(ConsoleLayer)
        .try_init();
    if installed.is_ok() {
        let _ = LEVEL_HANDLE.set(handle);
    }
}

/// Changes the log level (from `hawser.log`).
pub fn set_level(level: LevelFilter) {
    if let Some(handle) = LEVEL_HANDLE.get() {
        let _ = handle.modify(|filter| *filter = level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_boringtuns_interrupted_polls_are_dropped() {
        let eintr = "Poll error error=\"Interrupted system call (os error 4)\"";
        assert!(is_interrupted_poll("boringtun::device", eintr));
        assert!(!is_interrupted_poll("hawser_init::mesh", eintr));
        assert!(!is_interrupted_poll(
            "boringtun::device",
            "Poll error error=\"Bad file descriptor (os error 9)\""
        ));
    }

    #[test]
    fn timestamps_look_like_the_kernels() {
        assert_eq!(format_timestamp(12.345678), "[   12.345678] ");
        assert_eq!(format_timestamp(0.0000004), "[    0.000000] ");
        assert_eq!(format_timestamp(123456.5), "[123456.500000] ");
    }

    #[test]
    fn lines_carry_the_hawser_prefix_and_a_level_tag_except_for_info() {
        assert_eq!(
            line_text(Some(Level::INFO), "boot complete; idle"),
            "hawser: boot complete; idle"
        );
        assert_eq!(
            line_text(Some(Level::WARN), "unknown key"),
            "hawser: warning: unknown key"
        );
        assert_eq!(line_text(None, "FATAL: no TPM"), "hawser: FATAL: no TPM");
    }

    #[test]
    fn kmsg_records_are_cut_on_a_char_boundary() {
        let text = "é".repeat(600);
        let cut = truncate(&text, KMSG_LINE_MAX);
        assert!(cut.len() <= KMSG_LINE_MAX && cut.len() >= KMSG_LINE_MAX - 1);
        assert_eq!(truncate("short", KMSG_LINE_MAX), "short");
    }

    #[test]
    fn monotonic_clock_advances_and_boottime_is_not_behind_it() {
        let a = monotonic_seconds();
        let boot = boottime_seconds();
        let b = monotonic_seconds();
        assert!(a > 0.0 && b >= a);
        assert!(boot + 1e-3 >= a);
    }
}
