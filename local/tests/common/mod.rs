//! What the QEMU tests of `hawser local` share: the `hawser-local` binary run as a user runs
//! it, in a directory of the test's own, and the nodes' console logs.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// Where a test's cluster and image live (never a developer's `~/.cache/hawser/local`).
pub fn test_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// `hawser local ARGS…` as a user types it runs `hawser-local ARGS…` (the `hawser` CLI execs
/// it): `args` start with `local`.
pub fn hawser(dir: &Path, args: &[&str]) -> Command {
    let Some((&"local", args)) = args.split_first() else {
        panic!("not a `hawser local` command: {args:?}");
    };
    let mut command = Command::new(env!("CARGO_BIN_EXE_hawser-local"));
    command
        .args(args)
        .env("HAWSER_LOCAL_DIR", dir.join("local"));
    command
}

/// Runs `hawser local <args>`; fails the test with its output unless it succeeded. Returns its
/// standard output.
pub fn local(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["local"];
    all.extend_from_slice(args);
    eprintln!("$ hawser {}", all.join(" "));
    let Output {
        status,
        stdout,
        stderr,
    } = hawser(dir, &all).output().unwrap();
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    let stderr = String::from_utf8_lossy(&stderr);
    eprint!("{stdout}");
    assert!(
        status.success(),
        "`hawser {}` failed ({status}): {stderr}\n{}",
        all.join(" "),
        console_tails(dir, &["node-1", "node-2", "node-3"])
    );
    stdout
}

/// The last lines of each of `nodes`' console logs, for a failure's message.
pub fn console_tails(dir: &Path, nodes: &[&str]) -> String {
    let cluster = dir.join("local/cluster");
    let mut out = String::new();
    for node in nodes {
        let log = cluster.join(node).join(format!("logs/{node}.console.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(25).collect();
        out.push_str(&format!("── {} ──\n", log.display()));
        for line in tail.iter().rev() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A `hawser local up` running in the background; killed (its VMs with it) if the test fails.
pub struct Up(pub Child);

impl Up {
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        let mut all = vec!["local", "up", "--quiet"];
        all.extend_from_slice(args);
        eprintln!("$ hawser {} &", all.join(" "));
        let mut child = hawser(dir, &all).stdout(Stdio::null()).spawn().unwrap();
        // `local stop|start|restart` ask the process recorded in up.pid: wait for it.
        let pid_file = dir.join("local/up.pid");
        while !pid_file.exists() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "`hawser local up` exited at once"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Up(child)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits (up to 10 minutes) for a line of `node`'s console, read from the log `hawser local
/// status` names.
pub fn wait_for_console(
    dir: &Path,
    node: &str,
    nodes: &[&str],
    wanted: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        let status = hawser(dir, &["local", "status"]).output().unwrap();
        let status = String::from_utf8_lossy(&status.stdout).into_owned();
        let log = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{node}: console log ")))
            .map(str::to_owned);
        if let Some(log) = log
            && let Ok(text) = std::fs::read_to_string(log.trim())
            && let Some(line) = text.lines().find(|l| wanted(l))
        {
            return line.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{node} never printed the line waited for:\n{status}\n{}",
            console_tails(dir, nodes)
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}
