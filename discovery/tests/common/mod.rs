//! What the discovery tests share: the host check, logs, adverts, and waiting on a browser.

#![allow(dead_code)] // each test file uses its own part

pub mod forge;

use std::process::Command;
use std::time::{Duration, Instant};

use hawser_discovery::{Browser, Candidate, JoinServiceAdvert, ServiceDaemon};
use hawser_mesh_device::netns;

pub const CLUSTER: &str = "5f1c0de0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c";
pub const OTHER_CLUSTER: &str = "0b6f3e1a-94c4-4b8e-9a53-2d5c7e0f1a2b";
pub const JOIN_PORT: u16 = 9090;

/// Root, iproute2, and each `(tool, package)` given; the tests' logs in their output
/// (RUST_LOG=debug for more). Fails, never skips, naming what to install.
pub fn require_host(tools: &[(&str, &str)]) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
    assert!(
        nix::unistd::geteuid().is_root(),
        "the discovery namespace tests need root (network namespaces)"
    );
    assert!(
        Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success()),
        "the discovery namespace tests need `ip`: install iproute2"
    );
    for (tool, package) in tools {
        let found = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
                || ["/usr/sbin", "/sbin"]
                    .iter()
                    .any(|dir| std::path::Path::new(dir).join(tool).is_file())
        });
        assert!(found, "this test needs `{tool}`: install {package}");
    }
}

/// A join service's advert, announced every second.
pub fn advert(instance: &str, cluster_id: &str) -> JoinServiceAdvert {
    JoinServiceAdvert {
        instance: instance.into(),
        cluster_id: cluster_id.into(),
        version: "0.1.0".into(),
        port: JOIN_PORT,
        api_port: 6443,
        interval: Some(Duration::from_secs(1)),
    }
}

/// Starts a browser from inside namespace `ns` (its daemon's sockets live there).
pub fn browser_in(ns: &str, cluster_filter: Option<&str>) -> (ServiceDaemon, Browser) {
    let cluster_filter = cluster_filter.map(str::to_owned);
    netns::in_namespace(ns, move || {
        let daemon = ServiceDaemon::new().unwrap();
        let browser = Browser::start(&daemon, cluster_filter).unwrap();
        (daemon, browser)
    })
}

/// Updates `browser` until `done` holds for its candidates or `timeout` passes; returns how
/// long it took, or `None`.
pub fn wait_for(
    browser: &mut Browser,
    timeout: Duration,
    done: impl Fn(&[Candidate]) -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        browser.update(Duration::from_millis(100)).unwrap();
        if done(&browser.seen()) {
            return Some(start.elapsed());
        }
    }
    None
}

/// Whether `candidates` has the instance.
pub fn has(candidates: &[Candidate], instance: &str) -> bool {
    candidates
        .iter()
        .any(|c| c.instance.as_deref() == Some(instance))
}

/// Processes a test started, killed (by their own pid) and reaped when dropped, also while a
/// failed test unwinds; their output goes to files, shown when the test fails.
pub struct Children {
    running: Vec<(String, std::process::Child)>,
    logs: tempfile::TempDir,
}

impl Default for Children {
    fn default() -> Self {
        Children {
            running: Vec::new(),
            logs: tempfile::tempdir().unwrap(),
        }
    }
}

impl Children {
    /// Starts `args` in namespace `ns` with `env`, keeping it until the end of the test.
    pub fn spawn_in(&mut self, ns: &str, env: &[(&str, &str)], args: &[&str]) {
        let log_path = self
            .logs
            .path()
            .join(format!("{}-{}.log", self.running.len(), args[0]));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {args:?}: {e}"));
        self.running.push((args.join(" "), child));
    }

    /// Stops the child started last whose command line contains `what` with SIGTERM (so that
    /// it can say goodbye) and waits for it.
    pub fn terminate(&mut self, what: &str) {
        let position = self
            .running
            .iter()
            .rposition(|(line, _)| line.contains(what))
            .unwrap_or_else(|| panic!("no child runs {what:?}"));
        let (_, mut child) = self.running.remove(position);
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        child.wait().unwrap();
    }

    /// Fails if a child has already exited (a daemon that refused its configuration).
    pub fn assert_running(&mut self) {
        for (line, child) in &mut self.running {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{line:?} exited: {status}");
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in self.running.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for entry in std::fs::read_dir(self.logs.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
                eprintln!("--- {}:\n{log}", entry.file_name().to_string_lossy());
            }
        }
    }
}

/// Runs `args` in namespace `ns` with `env`, returning its stdout (panicking if it fails).
pub fn output_in(ns: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    let output = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("could not run {args:?}: {e}"));
    assert!(
        output.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Waits up to `timeout` for `done`, checking every 200 ms.
pub fn eventually(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
