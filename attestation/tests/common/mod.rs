//! A real swtpm for the TPM tests: one private instance per test, on a free loopback port pair,
//! killed when the guard drops.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Swtpm {
    child: Child,
    port: u16,
    // Kept alive until swtpm is gone: its state lives here.
    _state: tempfile::TempDir,
}

impl Swtpm {
    /// Starts `swtpm socket --tpm2` with a fresh state directory, already started up
    /// (TPM2_Startup(CLEAR)), and waits until it accepts connections.
    pub fn start() -> Swtpm {
        for _attempt in 0..20 {
            let Some(port) = free_port_pair() else {
                continue;
            };
            let state = tempfile::tempdir().expect("temporary state directory");
            let state_dir = state.path().canonicalize().expect("absolute state path");
            let log = std::fs::File::create(state_dir.join("swtpm.log")).expect("log file");
            let mut child = Command::new("swtpm")
                .arg("socket")
                .arg("--tpm2")
                .args([
                    "--server",
                    &format!("type=tcp,port={port},bindaddr=127.0.0.1"),
                ])
                .args([
                    "--ctrl",
                    &format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1),
                ])
                .args(["--tpmstate", &format!("dir={}", state_dir.display())])
                .args(["--flags", "not-need-init,startup-clear"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("swtpm is installed");
            if wait_listening(&mut child, port) {
                return Swtpm {
                    child,
                    port,
                    _state: state,
                };
            }
            // Lost a race for the ports (or swtpm failed): try another pair.
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start swtpm on any free port pair");
    }

    /// The TCTI string for tss-esapi / tpm2-tools.
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// Runs a tpm2-tools command against this swtpm (no Tpm connection may be open: swtpm
    /// serves one client at a time).
    pub fn tpm2_tool(&self, tool: &str, args: &[&str], cwd: &Path) -> std::process::Output {
        Command::new(tool)
            .args(args)
            .env("TPM2TOOLS_TCTI", self.tcti())
            .current_dir(cwd)
            .output()
            .unwrap_or_else(|e| panic!("{tool} runs: {e}"))
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port_pair() -> Option<u16> {
    let first = TcpListener::bind("127.0.0.1:0").ok()?;
    let port = first.local_addr().ok()?.port();
    let _second = TcpListener::bind(("127.0.0.1", port.checked_add(1)?)).ok()?;
    Some(port)
}

fn wait_listening(child: &mut Child, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        // swtpm serves one client at a time; a probe that closes at once frees the slot again.
        if TcpStream::connect(("127.0.0.1", port + 1)).is_ok()
            && TcpStream::connect(("127.0.0.1", port)).is_ok()
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
