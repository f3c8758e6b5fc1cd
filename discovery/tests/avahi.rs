//! Interop with Avahi, the mDNS stack of Debian and most Linux distributions, on a LAN of
//! network namespaces this test creates: `avahi-browse` sees hawser's advert with its TXT
//! data, and hawser's browser finds a service published with `avahi-publish` (and sees its
//! goodbye).
//!
//! avahi-daemon and its clients talk over D-Bus: the test runs a private `dbus-daemon` (a
//! system-bus style configuration in a temporary directory) and points
//! `DBUS_SYSTEM_BUS_ADDRESS` at it. avahi-daemon runs in member 1's network namespace and in a
//! private mount namespace with a tmpfs on /run, so that its pid file and socket clash with
//! nothing on the host; its configuration allows eth0 only, IPv4 only, no wide-area.
//!
//! Needs root, iproute2, dbus-daemon, avahi-daemon and avahi-utils; without them the test fails
//! naming what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use common::{
    CLUSTER, Children, JOIN_PORT, advert, browser_in, eventually, has, output_in, require_host,
    wait_for,
};
use hawser_discovery::{Advertiser, ServiceDaemon};
use hawser_mesh_device::netns::{self, Underlay};

const TOOLS: &[(&str, &str)] = &[
    ("dbus-daemon", "dbus-daemon"),
    ("avahi-daemon", "avahi-daemon"),
    ("avahi-browse", "avahi-utils"),
    ("avahi-publish", "avahi-utils"),
    ("unshare", "util-linux"),
];

/// A private system bus and an avahi-daemon on it, in namespace `ns`.
struct Avahi {
    children: Children,
    bus_address: String,
    _dir: tempfile::TempDir,
}

impl Avahi {
    fn start(ns: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("system_bus_socket");
        let bus_address = format!("unix:path={}", socket.display());
        let bus_config = dir.path().join("bus.conf");
        std::fs::write(&bus_config, bus_config_text(&bus_address)).unwrap();
        let avahi_config = dir.path().join("avahi-daemon.conf");
        std::fs::write(&avahi_config, AVAHI_CONFIG).unwrap();

        let mut children = Children::default();
        children.spawn_in(
            ns,
            &[],
            &[
                "dbus-daemon",
                "--nofork",
                "--nopidfile",
                "--config-file",
                path(&bus_config),
            ],
        );
        assert!(
            eventually(Duration::from_secs(5), || socket.exists()),
            "the private dbus-daemon did not create its socket"
        );
        let script = format!(
            "mount -t tmpfs tmpfs /run && mkdir /run/avahi-daemon && \
             exec avahi-daemon --no-drop-root --no-chroot --no-rlimits -f {}",
            path(&avahi_config)
        );
        children.spawn_in(
            ns,
            &[("DBUS_SYSTEM_BUS_ADDRESS", &bus_address)],
            &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ],
        );
        // Ready once it answers on the bus.
        let mut avahi = Avahi {
            children,
            bus_address,
            _dir: dir,
        };
        let ready = eventually(Duration::from_secs(10), || {
            std::process::Command::new("ip")
                .args(["netns", "exec", ns, "avahi-browse", "-atp"])
                .env("DBUS_SYSTEM_BUS_ADDRESS", &avahi.bus_address)
                .output()
                .is_ok_and(|o| o.status.success())
        });
        avahi.children.assert_running();
        assert!(ready, "avahi-daemon did not come up on the private bus");
        avahi
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("DBUS_SYSTEM_BUS_ADDRESS", self.bus_address.as_str())]
    }
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A system bus (the type avahi-daemon expects) that lets everyone own and call anything:
/// it only ever has this test's processes on it.
fn bus_config_text(address: &str) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>{address}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#
    )
}

const AVAHI_CONFIG: &str = "\
[server]
host-name=hawser-avahi
use-ipv4=yes
use-ipv6=no
allow-interfaces=eth0
enable-dbus=yes
disallow-other-stacks=no
ratelimit-interval-usec=1000000
ratelimit-burst=1000

[wide-area]
enable-wide-area=no

[publish]
publish-hinfo=no
publish-workstation=no
publish-addresses=yes
";

#[test]
fn avahi_browse_sees_hawser_s_advert() {
    require_host(TOOLS);
    let underlay = Underlay::new(2, 166);
    let avahi = Avahi::start(&underlay.members[1]);
    let (_daemon, _advertiser) = netns::in_namespace(&underlay.members[0], || {
        let daemon = ServiceDaemon::new().unwrap();
        let advertiser =
            Advertiser::start(&daemon, advert("cp-0", CLUSTER), "cp-0.local.").unwrap();
        (daemon, advertiser)
    });

    // `=;eth0;IPv4;cp-0;_hawser-join._tcp;local;cp-0.local;192.168.166.10;9090;"k=v" …`
    let mut line = None;
    let found = eventually(Duration::from_secs(15), || {
        let out = output_in(
            &underlay.members[1],
            &avahi.env(),
            &["avahi-browse", "-rpt", "_hawser-join._tcp"],
        );
        line = out
            .lines()
            .find(|l| l.starts_with("=;") && l.split(';').nth(3) == Some("cp-0"))
            .map(str::to_owned);
        line.is_some()
    });
    assert!(found, "avahi-browse did not resolve hawser's advert");
    let line = line.unwrap();
    let fields: Vec<&str> = line.split(';').collect();
    assert_eq!(fields[4], "_hawser-join._tcp");
    assert_eq!(fields[6], "cp-0.local");
    assert_eq!(fields[7], underlay.ip(0).to_string());
    assert_eq!(fields[8], JOIN_PORT.to_string());
    let txt = fields[9];
    for entry in [
        format!("\"cluster={CLUSTER}\""),
        "\"version=0.1.0\"".into(),
        "\"api=6443\"".into(),
        "\"interval=1\"".into(),
    ] {
        assert!(txt.contains(&entry), "{entry} missing from {txt}");
    }
}

#[test]
fn hawser_s_browser_finds_a_service_avahi_publishes() {
    require_host(TOOLS);
    let underlay = Underlay::new(2, 167);
    let mut avahi = Avahi::start(&underlay.members[1]);
    let bus_address = avahi.bus_address.clone();
    let env = [("DBUS_SYSTEM_BUS_ADDRESS", bus_address.as_str())];
    let cluster = format!("cluster={CLUSTER}");
    avahi.children.spawn_in(
        &underlay.members[1],
        &env,
        &[
            "avahi-publish",
            "-s",
            "cp-avahi",
            "_hawser-join._tcp",
            "9191",
            &cluster,
            "version=0.2.0",
            "api=6444",
            "color=blue",
        ],
    );
    let (_daemon, mut browser) = browser_in(&underlay.members[0], Some(CLUSTER));

    wait_for(&mut browser, Duration::from_secs(15), |seen| {
        has(seen, "cp-avahi")
    })
    .expect("hawser's browser did not find the service avahi-publish published");
    let candidates = browser.candidates();
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    let found = &candidates[0];
    assert_eq!(
        found.endpoint,
        SocketAddr::new(IpAddr::V4(underlay.ip(1)), 9191)
    );
    assert_eq!(found.cluster_id.as_deref(), Some(CLUSTER));
    assert_eq!(found.version.as_deref(), Some("0.2.0"));
    assert_eq!(found.api_port, Some(6444));

    // avahi-publish withdraws its service when stopped: the goodbye reaches hawser, which
    // offers it last from then on (a goodbye can be forged) until its port fails a probe.
    avahi.children.terminate("avahi-publish");
    wait_for(&mut browser, Duration::from_secs(5), |seen| {
        seen.iter()
            .any(|c| c.instance.as_deref() == Some("cp-avahi") && c.leaving)
    })
    .expect("avahi's goodbye did not reach hawser's browser");
}
