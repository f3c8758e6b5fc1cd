//! swtpm, the software TPM 2.0 that plays the VM's vTPM.
//!
//! Two ways to run it:
//! - [`SwtpmTransport::QemuChardev`]: a unix control socket for QEMU's `tpm-emulator` backend.
//!   QEMU sends `CMD_INIT` over that socket and the firmware sends `TPM2_Startup`, so no
//!   `--flags` are given. swtpm exits when QEMU disconnects (`--terminate`): one swtpm per boot.
//! - [`SwtpmTransport::Tcp`]: the TCP server pair the tss2 `swtpm` TCTI talks to
//!   (`swtpm:host=127.0.0.1,port=N`), with `not-need-init,startup-clear` so host code can use
//!   the TPM at once. This is how a test plays the cloud provider before boot (creating keys,
//!   writing NV indices) on a state directory that a later QEMU boot reuses.
//!
//! The state directory is either a fresh temporary one or a caller's directory, which is how a
//! node reboots with the same TPM. swtpm is killed (and reaped) when the [`Swtpm`] drops.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::QemuError;
use crate::host::{SWTPM_BINARY, find_binary};
use crate::process::{Supervised, spawn_tied};

/// How long swtpm may take to open its sockets.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the TCP transport retries with fresh ports when another process took them.
const PORT_ATTEMPTS: usize = 5;

/// Where swtpm listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwtpmTransport {
    /// A unix control socket for QEMU (`-chardev socket,path=…` + `-tpmdev emulator`).
    QemuChardev,
    /// TPM commands on a loopback TCP port and the control channel on the next port.
    Tcp,
}

/// How to start swtpm.
#[derive(Debug, Clone)]
pub struct SwtpmOptions {
    /// The transport; see [`SwtpmTransport`].
    pub transport: SwtpmTransport,
    /// Keep the TPM state here (created if missing) instead of in a temporary directory, so a
    /// later swtpm can continue with the same TPM.
    pub state_dir: Option<PathBuf>,
    /// The swtpm binary (default: `swtpm` from PATH).
    pub binary: PathBuf,
}

impl SwtpmOptions {
    /// Options for a QEMU vTPM with fresh state.
    pub fn for_qemu() -> Self {
        SwtpmOptions {
            transport: SwtpmTransport::QemuChardev,
            state_dir: None,
            binary: PathBuf::from(SWTPM_BINARY),
        }
    }

    /// Options for host-side TPM access over the `swtpm` TCTI, with fresh state.
    pub fn tcp() -> Self {
        SwtpmOptions {
            transport: SwtpmTransport::Tcp,
            ..SwtpmOptions::for_qemu()
        }
    }

    /// Uses (and keeps) the TPM state in `dir`.
    pub fn with_state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }
}

/// A running swtpm; killed when dropped.
#[derive(Debug)]
pub struct Swtpm {
    process: Supervised,
    state_dir: PathBuf,
    ctrl_socket: Option<PathBuf>,
    tcp_port: Option<u16>,
    log: PathBuf,
    // Last, so the directory (socket, log, maybe the state) goes after the process is dead.
    runtime_dir: tempfile::TempDir,
}

impl Swtpm {
    /// Starts swtpm and waits until it accepts connections.
    pub fn start(options: &SwtpmOptions) -> Result<Swtpm, QemuError> {
        let binary = find_binary(&options.binary)?;
        let runtime_dir = tempfile::Builder::new()
            .prefix("hawser-swtpm-")
            .tempdir()
            .map_err(|e| {
                QemuError::io("create a temporary directory in", std::env::temp_dir(), e)
            })?;
        // swtpm resolves a relative state path against its working directory at each open;
        // an absolute path is what works in every mode.
        let state_dir = match &options.state_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| QemuError::io("create", dir, e))?;
                dir.canonicalize()
                    .map_err(|e| QemuError::io("resolve", dir, e))?
            }
            None => {
                let dir = runtime_dir.path().join("state");
                std::fs::create_dir(&dir).map_err(|e| QemuError::io("create", &dir, e))?;
                dir
            }
        };
        let log = runtime_dir.path().join("swtpm.log");
        match options.transport {
            SwtpmTransport::QemuChardev => {
                let socket = runtime_dir.path().join("ctrl.sock");
                let args = qemu_chardev_args(&state_dir, &socket, &log)?;
                let process = spawn_swtpm(&binary, &args)?;
                wait_ready(&process, &log, || socket.exists())?;
                tracing::debug!(pid = process.pid(), socket = %socket.display(), "swtpm ready for QEMU");
                Ok(Swtpm {
                    process,
                    state_dir,
                    ctrl_socket: Some(socket),
                    tcp_port: None,
                    log,
                    runtime_dir,
                })
            }
            SwtpmTransport::Tcp => {
                let mut last_error = None;
                for _ in 0..PORT_ATTEMPTS {
                    let port = free_port_pair()?;
                    let args = tcp_args(&state_dir, port, &log)?;
                    let process = spawn_swtpm(&binary, &args)?;
                    // Ready when both the TPM port and the control port accept: swtpm opens
                    // them one after the other, and the TCTI connects to the TPM port first.
                    let accepts = |port: u16| {
                        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                        TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok()
                    };
                    match wait_ready(&process, &log, || accepts(port + 1) && accepts(port)) {
                        Ok(()) => {
                            tracing::debug!(pid = process.pid(), port, "swtpm ready on TCP");
                            return Ok(Swtpm {
                                process,
                                state_dir,
                                ctrl_socket: None,
                                tcp_port: Some(port),
                                log,
                                runtime_dir,
                            });
                        }
                        // Most likely another process bound the port in between: retry.
                        Err(error @ QemuError::SwtpmExited { .. }) => last_error = Some(error),
                        Err(error) => return Err(error),
                    }
                }
                Err(last_error
                    .unwrap_or_else(|| QemuError::invalid("no swtpm port attempt was made")))
            }
        }
    }

    /// The unix control socket for QEMU's `-chardev socket,path=` ([`SwtpmTransport::QemuChardev`]).
    pub fn ctrl_socket(&self) -> Option<&Path> {
        self.ctrl_socket.as_deref()
    }

    /// The tss2 TCTI string for host access ([`SwtpmTransport::Tcp`]), e.g.
    /// `swtpm:host=127.0.0.1,port=2321`.
    pub fn tcti(&self) -> Option<String> {
        self.tcp_port
            .map(|port| format!("swtpm:host=127.0.0.1,port={port}"))
    }

    /// The TPM command port ([`SwtpmTransport::Tcp`]); the control port is the next one.
    pub fn tcp_port(&self) -> Option<u16> {
        self.tcp_port
    }

    /// The directory holding the TPM state (`tpm2-00.permall`).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// swtpm's log file (removed with the runtime directory when this drops).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether swtpm is still running (it exits by itself when QEMU disconnects).
    pub fn is_running(&self) -> bool {
        self.process.try_wait().is_none()
    }

    /// Waits up to `timeout` for swtpm to exit by itself (after QEMU is gone), so the TPM state
    /// is complete before another swtpm uses the same state directory.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        self.process.wait_timeout(timeout).is_some()
    }

    /// The runtime directory (sockets, log; the state too unless a state dir was given).
    pub fn runtime_dir(&self) -> &Path {
        self.runtime_dir.path()
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        // swtpm writes its permanent state on every change and handles SIGTERM cleanly.
        self.process.terminate(Duration::from_secs(2));
    }
}

fn option_path(path: &Path) -> Result<String, QemuError> {
    let text = path
        .to_str()
        .ok_or_else(|| QemuError::invalid(format!("swtpm path {} is not UTF-8", path.display())))?;
    // swtpm's option parser has no escape for the separator.
    if text.contains(',') {
        return Err(QemuError::invalid(format!(
            "swtpm cannot take a path containing a comma: {text}"
        )));
    }
    Ok(text.to_owned())
}

/// The argument list for a QEMU vTPM (libvirt starts swtpm the same way).
pub(crate) fn qemu_chardev_args(
    state_dir: &Path,
    ctrl_socket: &Path,
    log: &Path,
) -> Result<Vec<String>, QemuError> {
    Ok(vec![
        "socket".into(),
        "--tpm2".into(),
        "--tpmstate".into(),
        format!("dir={},mode=0600", option_path(state_dir)?),
        "--ctrl".into(),
        format!("type=unixio,path={},mode=0600", option_path(ctrl_socket)?),
        "--log".into(),
        format!("file={},level=20", option_path(log)?),
        "--terminate".into(),
    ])
}

/// The argument list for host access over TCP on loopback.
pub(crate) fn tcp_args(state_dir: &Path, port: u16, log: &Path) -> Result<Vec<String>, QemuError> {
    Ok(vec![
        "socket".into(),
        "--tpm2".into(),
        "--tpmstate".into(),
        format!("dir={},mode=0600", option_path(state_dir)?),
        "--server".into(),
        format!("type=tcp,port={port},bindaddr=127.0.0.1"),
        "--ctrl".into(),
        format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1),
        "--flags".into(),
        "not-need-init,startup-clear".into(),
        "--log".into(),
        format!("file={},level=20", option_path(log)?),
    ])
}

fn spawn_swtpm(binary: &Path, args: &[String]) -> Result<Supervised, QemuError> {
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    tracing::debug!(binary = %binary.display(), ?args, "starting swtpm");
    let child = spawn_tied(command).map_err(|source| QemuError::Spawn {
        binary: binary.display().to_string(),
        source,
    })?;
    Ok(Supervised::new("swtpm", child))
}

fn wait_ready(
    process: &Supervised,
    log: &Path,
    mut ready: impl FnMut() -> bool,
) -> Result<(), QemuError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        // Ready only while swtpm still runs: if another process took a port, swtpm exits and
        // the listener that answered was not swtpm's.
        if ready() && process.try_wait().is_none() {
            return Ok(());
        }
        if let Some(status) = process.try_wait() {
            return Err(QemuError::SwtpmExited {
                status,
                log: log.to_path_buf(),
                log_tail: crate::console::file_tail(log, 20).join("\n"),
            });
        }
        if Instant::now() >= deadline {
            process.terminate(Duration::from_secs(1));
            return Err(QemuError::SwtpmNotReady {
                timeout: READY_TIMEOUT,
                log: log.to_path_buf(),
                log_tail: crate::console::file_tail(log, 20).join("\n"),
            });
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// A loopback port `p` such that `p` and `p + 1` are free right now.
fn free_port_pair() -> Result<u16, QemuError> {
    let bind = |port: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, port));
    for _ in 0..50 {
        let first = bind(0).map_err(|e| QemuError::io("bind a port on", "127.0.0.1", e))?;
        let port = first
            .local_addr()
            .map_err(|e| QemuError::io("read the bound port of", "127.0.0.1", e))?
            .port();
        if port < u16::MAX && bind(port + 1).is_ok() {
            return Ok(port);
        }
    }
    Err(QemuError::invalid(
        "found no two adjacent free loopback ports for swtpm",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_swtpm_needs_no_init_flags_and_terminates_with_qemu() {
        let args = qemu_chardev_args(
            Path::new("/run/t/state"),
            Path::new("/run/t/ctrl.sock"),
            Path::new("/run/t/swtpm.log"),
        )
        .expect("args");
        assert_eq!(
            args.join(" "),
            "socket --tpm2 --tpmstate dir=/run/t/state,mode=0600 \
             --ctrl type=unixio,path=/run/t/ctrl.sock,mode=0600 \
             --log file=/run/t/swtpm.log,level=20 --terminate"
        );
        assert!(!args.iter().any(|arg| arg.contains("not-need-init")));
    }

    #[test]
    fn tcp_swtpm_listens_on_loopback_only_and_starts_up_by_itself() {
        let args = tcp_args(Path::new("/s"), 2321, Path::new("/l")).expect("args");
        let joined = args.join(" ");
        assert!(
            joined.contains("--server type=tcp,port=2321,bindaddr=127.0.0.1"),
            "{joined}"
        );
        assert!(
            joined.contains("--ctrl type=tcp,port=2322,bindaddr=127.0.0.1"),
            "{joined}"
        );
        assert!(
            joined.contains("--flags not-need-init,startup-clear"),
            "{joined}"
        );
    }

    #[test]
    fn comma_in_state_path_is_refused() {
        let error =
            qemu_chardev_args(Path::new("/a,b"), Path::new("/s"), Path::new("/l")).unwrap_err();
        assert!(error.to_string().contains("/a,b"), "{error}");
    }
}
