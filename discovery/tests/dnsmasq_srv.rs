//! WAN discovery against a real DNS server: dnsmasq in one network namespace this test creates
//! serves SRV records `_hawser-join._tcp.cluster.test` and its targets' A records; hawser's
//! `resolve_srv`, pointed at it from another namespace, returns the endpoints in RFC 2782
//! order. Nothing is queried in the host's own namespace.
//!
//! Needs root, iproute2 and dnsmasq (package dnsmasq-base); without them the test fails naming
//! what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::{Children, eventually, require_host};
use hawser_discovery::{NameServers, SrvEndpoint, SrvError, resolve_srv};
use hawser_mesh_device::netns::{self, Underlay};

const SUBNET: u8 = 168;

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, SUBNET, last)
}

/// dnsmasq on member 1, answering for cluster.test only.
fn start_dnsmasq(underlay: &Underlay, children: &mut Children) -> SocketAddr {
    let listen = underlay.ip(1);
    let srv = |target: &str, port: u16, priority: u16, weight: u16| {
        format!(
            "--srv-host=_hawser-join._tcp.cluster.test,{target}.cluster.test,{port},{priority},{weight}"
        )
    };
    let host =
        |name: &str, address: Ipv4Addr| format!("--host-record={name}.cluster.test,{address}");
    let args: Vec<String> = [
        "dnsmasq".to_owned(),
        "--keep-in-foreground".into(),
        "--log-facility=-".into(),
        "--log-queries".into(),
        "--conf-file=/dev/null".into(),
        "--pid-file=".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--port=53".into(),
        format!("--listen-address={listen}"),
        "--bind-interfaces".into(),
        // Priority 10, two records of equal weight; 5 before them, 20 after.
        srv("joind-1", 7000, 10, 5),
        srv("joind-3", 7003, 10, 5),
        srv("joind-0", 7002, 5, 1),
        srv("joind-2", 7001, 20, 5),
        // Priority 30: a target without an address, left out.
        srv("joind-9", 7009, 30, 5),
        host("joind-0", ip(20)),
        host("joind-1", ip(21)),
        host("joind-2", ip(22)),
        host("joind-3", ip(23)),
    ]
    .into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    children.spawn_in(&underlay.members[1], &[], &args);
    let ns = underlay.members[1].clone();
    let listening = eventually(Duration::from_secs(5), || {
        let out = hawser_mesh_device::netns::run(&["ip", "netns", "exec", &ns, "ss", "-lun"]);
        String::from_utf8_lossy(&out.stdout).contains(&format!("{listen}:53"))
    });
    children.assert_running();
    assert!(listening, "dnsmasq did not start listening on {listen}:53");
    SocketAddr::new(IpAddr::V4(listen), 53)
}

/// `resolve_srv` from inside member 0, on a current-thread runtime as in PID 1.
fn resolve_in(
    ns: &str,
    domain: &'static str,
    server: SocketAddr,
) -> Result<Vec<SrvEndpoint>, SrvError> {
    netns::in_namespace(ns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(resolve_srv(domain, &NameServers::At(vec![server])))
    })
}

fn endpoint(last: u8, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip(last)), port)
}

#[test]
fn srv_records_from_dnsmasq_come_in_rfc_2782_order() {
    require_host(&[("dnsmasq", "dnsmasq-base"), ("ss", "iproute2")]);
    let underlay = Underlay::new(2, SUBNET);
    let mut children = Children::default();
    let server = start_dnsmasq(&underlay, &mut children);

    for _ in 0..3 {
        let found = resolve_in(&underlay.members[0], "cluster.test", server).unwrap();
        let endpoints: Vec<SocketAddr> = found.iter().map(|e| e.endpoint).collect();
        assert_eq!(endpoints.len(), 4, "{found:?}");
        assert_eq!(endpoints[0], endpoint(20, 7002));
        // Equal priority and weight: either order, both before the next priority.
        let mut middle = endpoints[1..3].to_vec();
        middle.sort();
        assert_eq!(middle, [endpoint(21, 7000), endpoint(23, 7003)]);
        assert_eq!(endpoints[3], endpoint(22, 7001));
        assert_eq!(found[0].record.target, "joind-0.cluster.test");
        assert_eq!((found[0].record.priority, found[0].record.weight), (5, 1));
    }

    // A trailing dot is the same domain.
    let found = resolve_in(&underlay.members[0], "cluster.test.", server).unwrap();
    assert_eq!(found.len(), 4);

    // A domain without the records is an error naming the query.
    let error = resolve_in(&underlay.members[0], "elsewhere.test", server).unwrap_err();
    assert!(
        matches!(&error, SrvError::Query { name, .. } if name == "_hawser-join._tcp.elsewhere.test."),
        "{error:?}"
    );
}
