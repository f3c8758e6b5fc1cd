//! Network namespaces for tests of the mesh and of discovery (feature `netns-testing`): members
//! in namespaces the test creates, plugged into a bridge in one more namespace (the
//! "underlay"), all deleted when the [`Underlay`] is dropped, also while a failed test unwinds.
//! Nothing here touches the host's own namespace beyond creating and deleting those.
//!
//! Needs root, iproute2 (`ip`), iputils-ping (`ping`) and /dev/net/tun: [`require_host`] fails
//! (never skips) naming what to install.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failed assumption fails the test

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sched::{CloneFlags, setns};

/// Fails (never skips) when the host lacks what namespace tests need.
pub fn require_host() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the mesh namespace tests need root (network namespaces, tun devices)"
    );
    let has = |tool: &str, arg: &str| {
        Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        has("ip", "-V"),
        "the mesh namespace tests need `ip`: install iproute2"
    );
    assert!(
        has("ping", "-V"),
        "the mesh namespace tests need `ping`: install iputils-ping"
    );
    assert!(
        Path::new("/dev/net/tun").exists(),
        "the mesh namespace tests need /dev/net/tun: load the tun module (modprobe tun)"
    );
}

/// Runs a command, panicking if it cannot start.
pub fn run(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("could not run {args:?}: {e}"))
}

/// Runs a command that must succeed.
pub fn must(args: &[&str]) {
    let output = run(args);
    assert!(
        output.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The namespaces of one test run, deleted when dropped.
pub struct Underlay {
    switch: String,
    /// The members' namespaces, by index.
    pub members: Vec<String>,
    subnet: u8,
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

impl Underlay {
    /// `count` member namespaces, member `i` at 192.168.`subnet`.(10+i)/24 on its `eth0`
    /// (with `lo` up), all plugged into a bridge in the switch namespace.
    pub fn new(count: usize, subnet: u8) -> Self {
        let run_id = format!(
            "hwmesh-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::SeqCst)
        );
        let mut underlay = Underlay {
            switch: format!("{run_id}-sw"),
            members: Vec::new(),
            subnet,
        };
        must(&["ip", "netns", "add", &underlay.switch]);
        let sw = underlay.switch.clone();
        must(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        must(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        for i in 0..count {
            let member = format!("{run_id}-m{i}");
            must(&["ip", "netns", "add", &member]);
            underlay.members.push(member.clone());
            let port = format!("m{i}");
            must(&[
                "ip", "-n", &member, "link", "add", "eth0", "type", "veth", "peer", "name", &port,
                "netns", &sw,
            ]);
            must(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"]);
            let address = format!("{}/24", underlay.ip(i));
            must(&["ip", "-n", &member, "addr", "add", &address, "dev", "eth0"]);
            must(&["ip", "-n", &member, "link", "set", "eth0", "up"]);
            must(&["ip", "-n", &member, "link", "set", "lo", "up"]);
        }
        underlay
    }

    /// Member `i`'s underlay address.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, self.subnet, 10 + u8::try_from(i).unwrap())
    }

    /// Whether one ping from member `from` to `to` is answered within 2 s.
    pub fn ping(&self, from: usize, to: Ipv4Addr) -> bool {
        let to = to.to_string();
        let ns = &self.members[from];
        run(&["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", &to])
            .status
            .success()
    }

    /// Whether a ping is answered within three tries (the first may wait for a handshake).
    pub fn pings(&self, from: usize, to: Ipv4Addr) -> bool {
        (0..3).any(|_| self.ping(from, to))
    }

    /// `ip -o <what> show dev <interface>` in member `i`, or `None` if it does not exist.
    pub fn link(&self, i: usize, what: &str, interface: &str) -> Option<String> {
        let ns = &self.members[i];
        let output = run(&["ip", "-n", ns, "-o", what, "show", "dev", interface]);
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for Underlay {
    fn drop(&mut self) {
        for ns in self.members.iter().chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Runs `work` on a new thread that first entered namespace `ns` (sockets, tun devices and
/// threads it creates belong to that namespace), and returns its result.
pub fn in_namespace<T: Send + 'static>(ns: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_in(ns, work).join().unwrap()
}

/// [`in_namespace`] without waiting: the thread's handle.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let namespace = File::open(&path).unwrap();
        setns(namespace, CloneFlags::CLONE_NEWNET).unwrap();
        work()
    })
}
