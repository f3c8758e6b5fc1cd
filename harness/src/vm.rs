//! A running VM: QEMU (+ swtpm), its console, QMP, timeline and teardown.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::QemuError;
use crate::config::{Boot, Esp, RuntimePaths, VmConfig};
use crate::console::{Shared, file_tail, spawn_tailer};
use crate::error::Diagnostics;
use crate::esp::build_esp_image;
use crate::host::{find_binary, require_firmware};
use crate::process::{Supervised, spawn_tied};
use crate::qmp::Qmp;
use crate::swtpm::{Swtpm, SwtpmOptions};

/// Console lines shown in errors.
const CONSOLE_TAIL_LINES: usize = 40;
/// QEMU output lines shown in errors.
const QEMU_TAIL_LINES: usize = 20;
/// How long QEMU gets to exit on SIGTERM before SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(3);
/// How long QEMU gets to open its QMP socket.
const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// `sun_path` is 108 bytes including the NUL.
const UNIX_SOCKET_PATH_MAX: usize = 107;

/// The end of a wait; `Duration::MAX` (or anything past the clock's range) waits forever.
struct Deadline(Option<Instant>);

impl Deadline {
    fn after(timeout: Duration) -> Self {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// The time left, `None` once it has passed. Without an end, an hour (waits re-check).
    fn remaining(&self) -> Option<Duration> {
        match self.0 {
            Some(end) => end
                .checked_duration_since(Instant::now())
                .filter(|left| !left.is_zero()),
            None => Some(Duration::from_secs(3600)),
        }
    }
}

/// Labelled points in time since [`Vm::start`] was called, in order.
pub type Timeline = Vec<(String, Duration)>;

/// What [`Vm::wait_for_line`] looks for.
///
/// Implemented for substrings (`&str`, `String`) and for predicates (`Fn(&str) -> bool`).
pub trait LineMatcher {
    /// Whether `line` (one console line without its line ending) matches.
    fn is_match(&self, line: &str) -> bool;
    /// What is being waited for, for errors and the timeline.
    fn describe(&self) -> String;
}

impl LineMatcher for &str {
    fn is_match(&self, line: &str) -> bool {
        line.contains(*self)
    }

    fn describe(&self) -> String {
        format!("a console line containing {self:?}")
    }
}

impl LineMatcher for String {
    fn is_match(&self, line: &str) -> bool {
        line.contains(self.as_str())
    }

    fn describe(&self) -> String {
        self.as_str().describe()
    }
}

impl<F: Fn(&str) -> bool> LineMatcher for F {
    fn is_match(&self, line: &str) -> bool {
        self(line)
    }

    fn describe(&self) -> String {
        "a console line matching a predicate".into()
    }
}

/// A running VM. Dropping it kills QEMU and swtpm and removes its temporary files (after
/// copying the logs to `keep_logs_dir`, if set).
pub struct Vm {
    name: String,
    started: Instant,
    qemu: Arc<Supervised>,
    shared: Arc<Shared>,
    tailer: Option<JoinHandle<()>>,
    qmp: Mutex<Option<Qmp>>,
    events: Mutex<Vec<(String, Instant)>>,
    paths: RuntimePaths,
    qemu_log: PathBuf,
    fail_patterns: Vec<String>,
    keep_logs_dir: Option<PathBuf>,
    swtpm: Option<Swtpm>,
    // Last: removed after everything that lives in it has stopped.
    workdir: tempfile::TempDir,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("name", &self.name)
            .field("pid", &self.qemu.pid())
            .field("workdir", &self.workdir.path())
            .finish_non_exhaustive()
    }
}

impl Vm {
    /// Starts the VM (and its swtpm) and returns at once; use [`Vm::wait_for_line`] to follow
    /// the boot.
    pub fn start(config: VmConfig) -> Result<Vm, QemuError> {
        Vm::start_inner(config, None)
    }

    /// Like [`Vm::start`], and writes every console line to `echo` as it arrives (for a CLI
    /// that shows the boot live).
    pub fn start_echoing(config: VmConfig, echo: Box<dyn Write + Send>) -> Result<Vm, QemuError> {
        Vm::start_inner(config, Some(echo))
    }

    fn start_inner(config: VmConfig, echo: Option<Box<dyn Write + Send>>) -> Result<Vm, QemuError> {
        let started = Instant::now();
        let mut events = Vec::new();
        let config = config.with_absolute_paths();
        config.validate()?;
        let qemu_binary = find_binary(&config.qemu_binary)?;
        if let Boot::Uefi { firmware, .. } = &config.boot {
            require_firmware(&firmware.code)?;
            require_firmware(&firmware.vars_template)?;
        }
        let workdir = tempfile::Builder::new()
            .prefix(&format!("hawser-{}-", config.name))
            .tempdir()
            .map_err(|e| {
                QemuError::io("create a temporary directory in", std::env::temp_dir(), e)
            })?;
        let dir = workdir.path();
        let qmp_socket = dir.join("qmp.sock");
        if qmp_socket.as_os_str().len() > UNIX_SOCKET_PATH_MAX {
            return Err(QemuError::invalid(format!(
                "the QMP socket path {} is longer than a unix socket path may be; set TMPDIR to a shorter directory",
                qmp_socket.display()
            )));
        }
        let console_log = dir.join("console.log");
        File::create(&console_log).map_err(|e| QemuError::io("create", &console_log, e))?;
        let qemu_log = dir.join("qemu.log");

        let (ovmf_vars, esp_image) = prepare_boot(&config.boot, dir, &mut events)?;

        let swtpm = match &config.tpm {
            Some(tpm) => {
                let mut options = SwtpmOptions::for_qemu();
                options.state_dir = tpm.state_dir.clone();
                let swtpm = Swtpm::start(&options)?;
                events.push(("swtpm ready".to_owned(), Instant::now()));
                Some(swtpm)
            }
            None => None,
        };

        let paths = RuntimePaths {
            console_log: console_log.clone(),
            qmp_socket,
            tpm_ctrl_socket: swtpm
                .as_ref()
                .and_then(|s| s.ctrl_socket().map(Path::to_path_buf)),
            ovmf_vars,
            esp_image,
        };
        let args = config.qemu_args(&paths)?;
        let qemu = spawn_qemu(&config.name, &qemu_binary, &args, dir, &qemu_log)?;
        events.push(("QEMU started".to_owned(), Instant::now()));

        let shared = Arc::new(Shared::default());
        let tailer = match spawn_tailer(
            &config.name,
            console_log,
            qemu.clone(),
            shared.clone(),
            echo,
        ) {
            Ok(tailer) => tailer,
            Err(source) => {
                qemu.terminate(TERMINATE_GRACE);
                return Err(QemuError::Spawn {
                    binary: "console tailer thread".into(),
                    source,
                });
            }
        };
        Ok(Vm {
            name: config.name,
            started,
            qemu,
            shared,
            tailer: Some(tailer),
            qmp: Mutex::new(None),
            events: Mutex::new(events),
            paths,
            qemu_log,
            fail_patterns: config.fail_patterns,
            keep_logs_dir: config.keep_logs_dir,
            swtpm,
            workdir,
        })
    }

    /// Waits for the next console line that `matcher` accepts and returns it. Each call
    /// continues after the line the previous call returned, so markers are awaited in order.
    /// The line's arrival is recorded in the [`Vm::timeline`] under the matcher's description.
    ///
    /// Fails early if QEMU exits or a line matches one of the config's `fail_patterns`; every
    /// failure carries the console and QEMU output tails.
    pub fn wait_for_line(
        &self,
        matcher: impl LineMatcher,
        timeout: Duration,
    ) -> Result<String, QemuError> {
        let label = matcher.describe();
        self.wait_for_marker(&label, matcher, timeout)
    }

    /// Like [`Vm::wait_for_line`], recording the line in the timeline under `label`
    /// (e.g. "kernel started").
    pub fn wait_for_marker(
        &self,
        label: &str,
        matcher: impl LineMatcher,
        timeout: Duration,
    ) -> Result<String, QemuError> {
        let deadline = Deadline::after(timeout);
        let mut state = self.shared.lock();
        loop {
            while state.cursor < state.lines.len() {
                let line = state.lines[state.cursor].clone();
                state.cursor += 1;
                if matcher.is_match(&line.text) {
                    drop(state);
                    self.record_at(label, line.at);
                    return Ok(line.text);
                }
                if let Some(pattern) = self
                    .fail_patterns
                    .iter()
                    .find(|pattern| line.text.contains(pattern.as_str()))
                {
                    drop(state);
                    return Err(QemuError::ConsoleFailure {
                        vm: self.name.clone(),
                        line: line.text,
                        pattern: pattern.clone(),
                        waiting_for: matcher.describe(),
                        diagnostics: Box::new(self.diagnostics()),
                    });
                }
            }
            if let Some((status, _)) = state.exited {
                drop(state);
                return Err(QemuError::QemuExited {
                    vm: self.name.clone(),
                    status,
                    waiting_for: matcher.describe(),
                    diagnostics: Box::new(self.diagnostics()),
                });
            }
            let Some(remaining) = deadline.remaining() else {
                drop(state);
                return Err(QemuError::Timeout {
                    vm: self.name.clone(),
                    waiting_for: matcher.describe(),
                    timeout,
                    diagnostics: Box::new(self.diagnostics()),
                });
            };
            state = self
                .shared
                .changed
                .wait_timeout(state, remaining)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Waits until QEMU exits (the guest powered off, or rebooted with `no_reboot`).
    pub fn wait_for_exit(&self, timeout: Duration) -> Result<ExitStatus, QemuError> {
        let deadline = Deadline::after(timeout);
        let mut state = self.shared.lock();
        loop {
            if let Some((status, _)) = state.exited {
                return Ok(status);
            }
            let Some(remaining) = deadline.remaining() else {
                drop(state);
                return Err(QemuError::Timeout {
                    vm: self.name.clone(),
                    waiting_for: "QEMU to exit".into(),
                    timeout,
                    diagnostics: Box::new(self.diagnostics()),
                });
            };
            state = self
                .shared
                .changed
                .wait_timeout(state, remaining)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// QEMU's exit status, if it has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.shared.lock().exited.map(|(status, _)| status)
    }

    /// Adds a labelled point in time (now) to the timeline.
    pub fn mark(&self, label: &str) {
        self.record_at(label, Instant::now());
    }

    fn record_at(&self, label: &str, at: Instant) {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push((label.to_owned(), at));
    }

    /// Labelled points in time since `start` was called, in time order: "ESP built",
    /// "swtpm ready", "QEMU started", "first console output", each awaited marker, "QEMU exited".
    pub fn timeline(&self) -> Timeline {
        let mut points: Vec<(String, Instant)> = self
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        {
            let state = self.shared.lock();
            if let Some(at) = state.first_output {
                points.push(("first console output".into(), at));
            }
            if let Some((_, at)) = state.exited {
                points.push(("QEMU exited".into(), at));
            }
        }
        points.sort_by_key(|(_, at)| *at);
        points
            .into_iter()
            .map(|(label, at)| (label, at.saturating_duration_since(self.started)))
            .collect()
    }

    /// Every console line so far (cleaned of terminal escapes).
    pub fn console_lines(&self) -> Vec<String> {
        self.shared
            .lock()
            .lines
            .iter()
            .map(|line| line.text.clone())
            .collect()
    }

    /// The raw console log QEMU writes (inside the VM's temporary directory).
    pub fn console_log_path(&self) -> &Path {
        &self.paths.console_log
    }

    /// QEMU's own stdout/stderr.
    pub fn qemu_log_path(&self) -> &Path {
        &self.qemu_log
    }

    /// The VM's temporary directory (removed on drop).
    pub fn workdir(&self) -> &Path {
        self.workdir.path()
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.qemu.pid()
    }

    /// The swtpm of this boot, if the VM has a TPM.
    pub fn swtpm(&self) -> Option<&Swtpm> {
        self.swtpm.as_ref()
    }

    /// Runs `f` on the QMP session, connecting (and negotiating) on first use.
    pub fn with_qmp<T>(
        &self,
        f: impl FnOnce(&mut Qmp) -> Result<T, QemuError>,
    ) -> Result<T, QemuError> {
        let mut qmp = self
            .qmp
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if qmp.is_none() {
            if let Some(status) = self.exit_status() {
                return Err(QemuError::QemuExited {
                    vm: self.name.clone(),
                    status,
                    waiting_for: "the QMP socket".into(),
                    diagnostics: Box::new(self.diagnostics()),
                });
            }
            *qmp = Some(Qmp::connect(&self.paths.qmp_socket, QMP_CONNECT_TIMEOUT)?);
        }
        match qmp.as_mut() {
            Some(session) => f(session),
            None => Err(QemuError::QmpProtocol {
                reason: "no QMP session".into(),
            }),
        }
    }

    /// Runs a QMP command and returns its result.
    pub fn qmp_execute(
        &self,
        command: &str,
        arguments: Option<&Value>,
    ) -> Result<Value, QemuError> {
        self.with_qmp(|qmp| qmp.execute(command, arguments))
    }

    /// The run state from `query-status` (e.g. `"running"`).
    pub fn query_status(&self) -> Result<String, QemuError> {
        self.with_qmp(Qmp::query_status)
    }

    /// Presses the ACPI power button.
    pub fn powerdown(&self) -> Result<(), QemuError> {
        self.with_qmp(Qmp::system_powerdown)
    }

    /// Makes QEMU exit at once (no guest shutdown).
    pub fn quit(&self) -> Result<(), QemuError> {
        self.with_qmp(Qmp::quit)
    }

    /// Presses the power button and waits for QEMU to exit.
    pub fn shutdown(&self, timeout: Duration) -> Result<ExitStatus, QemuError> {
        self.powerdown()?;
        self.wait_for_exit(timeout)
    }

    /// Kills QEMU now (SIGTERM, then SIGKILL) and waits for it; the console is read to the end.
    pub fn kill(&self) -> Option<ExitStatus> {
        let status = self.qemu.terminate(TERMINATE_GRACE);
        // The tailer notices the exit within one poll interval and reads the rest.
        let _ = self.wait_for_exit(Duration::from_secs(2));
        status
    }

    /// The console and QEMU output tails, as put into errors.
    pub fn diagnostics(&self) -> Diagnostics {
        let console_tail = {
            let state = self.shared.lock();
            let skip = state.lines.len().saturating_sub(CONSOLE_TAIL_LINES);
            state.lines[skip..]
                .iter()
                .map(|line| line.text.clone())
                .collect()
        };
        let console_log = match &self.keep_logs_dir {
            Some(dir) => self.kept_log_path(dir, "console"),
            None => self.paths.console_log.clone(),
        };
        Diagnostics {
            console_tail,
            console_log,
            qemu_output_tail: file_tail(&self.qemu_log, QEMU_TAIL_LINES),
        }
    }

    fn kept_log_path(&self, dir: &Path, kind: &str) -> PathBuf {
        dir.join(format!("{}.{kind}.log", self.name))
    }

    fn keep_logs(&self, dir: &Path) {
        if let Err(error) = std::fs::create_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), %error, "cannot create the log directory");
            return;
        }
        let mut sources = vec![
            ("console", self.paths.console_log.clone()),
            ("qemu", self.qemu_log.clone()),
        ];
        if let Some(swtpm) = &self.swtpm {
            sources.push(("swtpm", swtpm.log_path().to_path_buf()));
        }
        for (kind, source) in sources {
            let target = self.kept_log_path(dir, kind);
            if let Err(error) = std::fs::copy(&source, &target) {
                tracing::warn!(from = %source.display(), to = %target.display(), %error, "cannot keep log");
            }
        }
        tracing::info!(vm = %self.name, dir = %dir.display(), "kept VM logs");
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.qemu.terminate(TERMINATE_GRACE);
        self.shared.stop.store(true, Ordering::Release);
        if let Some(tailer) = self.tailer.take()
            && tailer.join().is_err()
        {
            tracing::warn!(vm = %self.name, "the console tailer thread panicked");
        }
        if let Ok(mut qmp) = self.qmp.lock() {
            qmp.take();
        }
        // swtpm exits by itself once QEMU has disconnected; give it the moment it needs to
        // finish writing its state before the log is copied and it is killed.
        if let Some(swtpm) = &self.swtpm {
            swtpm.wait_exit(Duration::from_secs(2));
        }
        if let Some(dir) = self.keep_logs_dir.clone() {
            self.keep_logs(&dir);
        }
        self.swtpm.take();
    }
}

/// The per-VM boot files: for UEFI, a copy of the OVMF variable store and the ESP (built from
/// files, or the caller's image, which must exist); for a direct kernel boot, none (the kernel
/// and initrd must exist). Returns the variable store and the ESP image.
fn prepare_boot(
    boot: &Boot,
    dir: &Path,
    events: &mut Vec<(String, Instant)>,
) -> Result<(Option<PathBuf>, Option<PathBuf>), QemuError> {
    match boot {
        Boot::Uefi { firmware, esp } => {
            let vars = dir.join("OVMF_VARS.fd");
            std::fs::copy(&firmware.vars_template, &vars)
                .map_err(|e| QemuError::io("copy the OVMF variable store to", &vars, e))?;
            let image = match esp {
                Esp::Files(files) => {
                    let image = dir.join("esp.img");
                    build_esp_image(&image, files)?;
                    events.push(("ESP built".to_owned(), Instant::now()));
                    image
                }
                Esp::Image(image) => {
                    if !image.is_file() {
                        return Err(QemuError::invalid(format!(
                            "the ESP image {} does not exist",
                            image.display()
                        )));
                    }
                    image.clone()
                }
            };
            Ok((Some(vars), Some(image)))
        }
        Boot::DirectKernel { kernel, initrd, .. } => {
            for file in std::iter::once(kernel).chain(initrd) {
                if !file.is_file() {
                    return Err(QemuError::invalid(format!(
                        "the kernel or initrd {} does not exist",
                        file.display()
                    )));
                }
            }
            Ok((None, None))
        }
    }
}

/// Starts QEMU with `args` in `dir`, its output into `qemu_log`, tied to this process (it dies
/// with it).
fn spawn_qemu(
    name: &str,
    qemu_binary: &Path,
    args: &[OsString],
    dir: &Path,
    qemu_log: &Path,
) -> Result<Arc<Supervised>, QemuError> {
    let output = File::create(qemu_log).map_err(|e| QemuError::io("create", qemu_log, e))?;
    let output_clone = output
        .try_clone()
        .map_err(|e| QemuError::io("duplicate the handle of", qemu_log, e))?;
    let mut command = Command::new(qemu_binary);
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(output_clone);
    tracing::info!(vm = %name, command = ?command, "starting QEMU");
    let child = spawn_tied(command).map_err(|source| QemuError::Spawn {
        binary: qemu_binary.display().to_string(),
        source,
    })?;
    Ok(Arc::new(Supervised::new(format!("qemu {name}"), child)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substrings_and_predicates_match_lines() {
        assert!("boot complete".is_match("hawser: boot complete; idle"));
        assert!(!"boot complete".is_match("hawser: booting"));
        assert_eq!(
            String::from("FATAL:").describe(),
            "a console line containing \"FATAL:\""
        );
        let predicate = |line: &str| line.starts_with("HAWSER_BOOT_REPORT ");
        assert!(predicate.is_match("HAWSER_BOOT_REPORT {}"));
        assert!(!predicate.is_match("x HAWSER_BOOT_REPORT {}"));
    }

    #[test]
    fn deadlines_expire_and_unbounded_waits_do_not_overflow() {
        assert_eq!(Deadline::after(Duration::ZERO).remaining(), None);
        assert!(Deadline::after(Duration::MAX).remaining().is_some());
        let left = Deadline::after(Duration::from_secs(60))
            .remaining()
            .expect("not expired");
        assert!(left <= Duration::from_secs(60) && left > Duration::from_secs(59));
    }
}
