//! The harness's one error type.
//!
//! A failing VM test is debugged from its error message alone, often in CI: errors about a VM
//! carry the last console lines and the tail of QEMU's own output, and errors about host tools
//! name the Debian package that provides them.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// What went wrong while preparing, running or talking to a VM.
///
/// `Debug` prints the same text as `Display` (plus the source chain), so that a test's
/// `.expect()` shows the console tail as lines, not as a struct dump.
#[derive(thiserror::Error)]
pub enum QemuError {
    /// A host binary the harness runs is not installed.
    #[error(
        "`{binary}` was not found in PATH; run scripts/setup-host (it installs the Debian package `{package}`)"
    )]
    HostToolMissing {
        binary: String,
        package: &'static str,
    },
    /// A firmware file (OVMF) is missing.
    #[error("firmware file {path} does not exist; install the Debian package `{package}`")]
    FirmwareMissing {
        path: PathBuf,
        package: &'static str,
    },
    /// The VM or swtpm configuration cannot be turned into a command line.
    #[error("invalid VM configuration: {reason}")]
    InvalidConfig { reason: String },
    /// A file-system operation of the harness failed.
    #[error("could not {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A child process could not be started.
    #[error("could not start `{binary}`")]
    Spawn {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    /// swtpm exited before it was ready to serve.
    #[error("swtpm exited before it was ready ({status}); its log {log} ends with:\n{log_tail}")]
    SwtpmExited {
        status: ExitStatus,
        log: PathBuf,
        log_tail: String,
    },
    /// swtpm did not open its sockets in time.
    #[error("swtpm did not become ready within {timeout:?}; its log {log} ends with:\n{log_tail}")]
    SwtpmNotReady {
        timeout: Duration,
        log: PathBuf,
        log_tail: String,
    },
    /// The awaited console line did not appear in time.
    #[error("VM `{vm}`: timed out after {timeout:?} waiting for {waiting_for}\n{diagnostics}")]
    Timeout {
        vm: String,
        waiting_for: String,
        timeout: Duration,
        diagnostics: Box<Diagnostics>,
    },
    /// QEMU exited while the harness was waiting for something else.
    #[error("VM `{vm}`: QEMU exited ({status}) while waiting for {waiting_for}\n{diagnostics}")]
    QemuExited {
        vm: String,
        status: ExitStatus,
        waiting_for: String,
        diagnostics: Box<Diagnostics>,
    },
    /// The console printed a line that means the boot failed (see `VmConfig::fail_patterns`).
    #[error(
        "VM `{vm}`: console line {line:?} matches failure pattern {pattern:?} while waiting for {waiting_for}\n{diagnostics}"
    )]
    ConsoleFailure {
        vm: String,
        line: String,
        pattern: String,
        waiting_for: String,
        diagnostics: Box<Diagnostics>,
    },
    /// The QMP socket could not be reached or broke.
    #[error("QMP socket {socket}: could not {action}")]
    QmpIo {
        socket: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// QEMU sent something that is not QMP.
    #[error("QMP protocol error: {reason}")]
    QmpProtocol { reason: String },
    /// QEMU refused a QMP command.
    #[error("QMP command `{command}` failed: {class}: {desc}")]
    QmpCommand {
        command: String,
        class: String,
        desc: String,
    },
    /// The ESP image could not be built.
    #[error("could not build the ESP image {image}")]
    Esp {
        image: PathBuf,
        #[source]
        source: hawser_image::disk::DiskError,
    },
}

impl fmt::Debug for QemuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, "\ncaused by: {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl QemuError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        QemuError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        QemuError::InvalidConfig {
            reason: reason.into(),
        }
    }
}

/// The context printed with VM errors: the end of the serial console and of QEMU's stderr.
#[derive(Debug, Clone, Default)]
pub struct Diagnostics {
    /// The last console lines (cleaned of terminal escape sequences).
    pub console_tail: Vec<String>,
    /// Where the full console log is (or will be kept, with `keep_logs_dir`).
    pub console_log: PathBuf,
    /// The last lines QEMU wrote to stdout/stderr.
    pub qemu_output_tail: Vec<String>,
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "--- last {} console lines ({}) ---",
            self.console_tail.len(),
            self.console_log.display()
        )?;
        for line in &self.console_tail {
            writeln!(f, "  | {line}")?;
        }
        writeln!(
            f,
            "--- QEMU output (last {} lines) ---",
            self.qemu_output_tail.len()
        )?;
        for line in &self.qemu_output_tail {
            writeln!(f, "  | {line}")?;
        }
        write!(f, "---")
    }
}
