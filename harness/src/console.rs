//! The serial console: QEMU writes it to a file, a tailer thread turns it into timestamped lines.
//!
//! QEMU writes the guest's serial port straight to a file (`-chardev file`), so the log is
//! complete even if the harness dies, and QEMU never blocks on a slow reader. A tailer thread
//! polls that file, splits it into lines, strips terminal escape sequences (OVMF clears the
//! screen and sets modes), stamps each line with its arrival time, optionally echoes it, and
//! notices when QEMU exits. Waiters block on a condition variable.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::process::Supervised;

/// How often the tailer looks at the console file and the QEMU process.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// One console line and when the harness saw it.
#[derive(Debug, Clone)]
pub(crate) struct ConsoleLine {
    pub(crate) at: Instant,
    pub(crate) text: String,
}

/// What the tailer has seen so far.
#[derive(Debug, Default)]
pub(crate) struct ConsoleState {
    pub(crate) lines: Vec<ConsoleLine>,
    /// Index of the first line the next `wait_for_line` looks at.
    pub(crate) cursor: usize,
    pub(crate) first_output: Option<Instant>,
    /// QEMU's exit status and when it was noticed; set after the last line was read.
    pub(crate) exited: Option<(ExitStatus, Instant)>,
    /// The tailer has stopped (QEMU exited, or the VM is being torn down).
    pub(crate) finished: bool,
}

/// State shared between the tailer thread and the [`crate::Vm`].
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<ConsoleState>,
    pub(crate) changed: Condvar,
    pub(crate) stop: AtomicBool,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ConsoleState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Splits a byte stream into cleaned lines.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; returns the lines completed by them.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        for &byte in bytes {
            if byte == b'\n' {
                lines.push(clean_line(&self.partial));
                self.partial.clear();
            } else {
                self.partial.push(byte);
            }
        }
        lines
    }

    /// The unterminated rest, if any (used when QEMU has exited).
    pub(crate) fn finish(&mut self) -> Option<String> {
        if self.partial.is_empty() {
            return None;
        }
        let line = clean_line(&self.partial);
        self.partial.clear();
        Some(line)
    }
}

/// Decodes a console line and removes terminal control: ANSI escape sequences (CSI, OSC and
/// two-byte escapes), carriage returns and other control characters except tab.
pub(crate) fn clean_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates, then one final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: up to BEL or ST (ESC \).
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                // Any other escape is two characters long.
                _ => {}
            },
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The last `count` lines of a text file (empty if it cannot be read).
pub(crate) fn file_tail(path: &Path, count: usize) -> Vec<String> {
    const MAX_READ: u64 = 64 * 1024;
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
    if length > MAX_READ && file.seek(SeekFrom::Start(length - MAX_READ)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let mut splitter = LineSplitter::default();
    let mut lines = splitter.push(&bytes);
    lines.extend(splitter.finish());
    let skip = lines.len().saturating_sub(count);
    lines.split_off(skip)
}

/// Starts the tailer thread for `console_log`, watching `qemu` for its exit.
pub(crate) fn spawn_tailer(
    vm_name: &str,
    console_log: PathBuf,
    qemu: Arc<Supervised>,
    shared: Arc<Shared>,
    echo: Option<Box<dyn Write + Send>>,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(format!("console-{vm_name}"))
        .spawn(move || tail(console_log, qemu, shared, echo))
}

fn tail(
    console_log: PathBuf,
    qemu: Arc<Supervised>,
    shared: Arc<Shared>,
    mut echo: Option<Box<dyn Write + Send>>,
) {
    let mut splitter = LineSplitter::default();
    let mut file: Option<File> = None;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        // Read the exit status first, so that the read below sees everything QEMU wrote.
        let exit = qemu.try_wait();
        let stopping = shared.stop.load(Ordering::Acquire);
        if file.is_none() {
            file = File::open(&console_log).ok();
        }
        let mut lines = Vec::new();
        let mut saw_bytes = false;
        if let Some(file) = file.as_mut() {
            loop {
                match file.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n) => {
                        saw_bytes = true;
                        lines.extend(splitter.push(&buffer[..n]));
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        tracing::warn!(log = %console_log.display(), %error, "cannot read console log");
                        break;
                    }
                }
            }
        }
        let done = exit.is_some() || stopping;
        if done {
            lines.extend(splitter.finish());
        }
        let now = Instant::now();
        if let Some(echo) = echo.as_mut() {
            for line in &lines {
                // The echo is a convenience; a closed terminal must not stop the tailer.
                let _ = writeln!(echo, "{line}");
            }
            let _ = echo.flush();
        }
        if saw_bytes || done {
            let mut state = shared.lock();
            if saw_bytes && state.first_output.is_none() {
                state.first_output = Some(now);
            }
            state
                .lines
                .extend(lines.into_iter().map(|text| ConsoleLine { at: now, text }));
            if let Some(status) = exit {
                state.exited = Some((status, now));
            }
            state.finished = done;
            drop(state);
            shared.changed.notify_all();
        }
        if done {
            return;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ovmf_screen_control_is_stripped() {
        let raw = b"\x1b[2J\x1b[01;01H\x1b[=3h\x1b[2J\x1b[01;01HBdsDxe: loading Boot0001 \"UEFI Misc Device\"\r";
        assert_eq!(
            clean_line(raw),
            "BdsDxe: loading Boot0001 \"UEFI Misc Device\""
        );
    }

    #[test]
    fn osc_and_two_byte_escapes_are_stripped_but_tabs_kept() {
        assert_eq!(clean_line(b"\x1b]0;title\x07a\tb\x1bcc"), "a\tbc");
        assert_eq!(clean_line(b"\x1b]0;title\x1b\\x"), "x");
        assert_eq!(clean_line(b"bad \xff byte"), "bad \u{fffd} byte");
    }

    #[test]
    fn lines_are_split_across_reads() {
        let mut splitter = LineSplitter::default();
        assert_eq!(splitter.push(b"[    0.0] Linux ver"), Vec::<String>::new());
        assert_eq!(
            splitter.push(b"sion 6.12\r\nsecond\r\nthi"),
            vec![
                "[    0.0] Linux version 6.12".to_owned(),
                "second".to_owned()
            ]
        );
        assert_eq!(splitter.finish(), Some("thi".to_owned()));
        assert_eq!(splitter.finish(), None);
    }

    #[test]
    fn file_tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).expect("write");
        assert_eq!(file_tail(&path, 3), vec!["line 98", "line 99", "line 100"]);
        assert!(file_tail(&dir.path().join("missing"), 3).is_empty());
    }
}
