//! What the discovery tests share: the host check, logs, adverts, and waiting on a browser.

#![allow(dead_code)] // each test file uses its own part

use std::process::Command;
use std::time::{Duration, Instant};

use hawser_discovery::{Browser, Candidate, JoinServiceAdvert, ServiceDaemon};
use hawser_mesh::netns;

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
        browser.update(Duration::from_millis(100));
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
