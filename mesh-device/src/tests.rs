//! Unit tests of the tunnel's configuration checks and UAPI exchanges, without a tun device.

use super::*;

fn config() -> TunnelConfig {
    TunnelConfig {
        interface: "hawser0".into(),
        private_key: PrivateKey::from_random([9; 32]),
        listen_port: 0,
        address: Ipv4Addr::new(10, 99, 0, 2),
        prefix: "10.99.0.0/24".parse().unwrap(),
        mtu: hawser_mesh::tunnel_mtu(1500),
        threads: 1,
        pod_routes: false,
    }
}

#[test]
fn a_tunnel_can_be_shared_between_tasks_and_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tunnel>();
}

#[test]
fn a_good_config_passes() {
    config().check().unwrap();
}

#[test]
fn interface_names_are_checked() {
    for bad in [
        "",
        "sixteen-bytes-xx",
        "a/b",
        "a b",
        "a\0",
        "7",
        "42",
        ".",
        "..",
    ] {
        let config = TunnelConfig {
            interface: bad.into(),
            ..config()
        };
        assert!(
            matches!(config.check(), Err(DeviceError::InterfaceName { name }) if name == bad),
            "{bad:?}"
        );
    }
    for good in ["hawser0", "wg0", "fifteen-bytes-x"] {
        TunnelConfig {
            interface: good.into(),
            ..config()
        }
        .check()
        .unwrap();
    }
}

#[test]
fn the_address_is_a_host_of_the_prefix() {
    for bad in [[10, 98, 0, 2], [10, 99, 0, 0], [10, 99, 0, 255]] {
        let config = TunnelConfig {
            address: Ipv4Addr::from(bad),
            ..config()
        };
        let error = config.check().unwrap_err();
        assert!(
            matches!(error, DeviceError::AddressOutsidePrefix { address, .. } if address == Ipv4Addr::from(bad)),
            "{error}"
        );
    }
}

#[test]
fn mtu_and_threads_are_checked() {
    for mtu in [0, 67, 1501, 8921] {
        let error = TunnelConfig { mtu, ..config() }.check().unwrap_err();
        assert!(
            matches!(error, DeviceError::Mtu { mtu: m } if m == mtu),
            "{error}"
        );
    }
    let error = TunnelConfig {
        threads: 0,
        pod_routes: false,
        ..config()
    }
    .check()
    .unwrap_err();
    assert!(matches!(error, DeviceError::NoThreads));
}

#[test]
fn the_config_never_shows_the_private_key() {
    let config = config();
    let shown = format!("{config:?}");
    let hex = config.private_key.to_hex();
    let base64 = config.private_key.to_base64();
    assert!(!shown.contains(hex.as_str()), "{shown}");
    assert!(!shown.contains(base64.as_str()), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

#[test]
fn stats_turn_the_time_since_the_handshake_into_a_unix_time() {
    let key = PublicKey::from_slice(&[3; 32]).unwrap();
    let answer = format!(
        "public_key={}\nendpoint=192.0.2.7:51820\nlast_handshake_time_sec=5\n\
             last_handshake_time_nsec=250000000\nrx_bytes=10\ntx_bytes=20\n\
             public_key={}\nrx_bytes=0\ntx_bytes=0\nerrno=0\n\n",
        key.to_hex(),
        "04".repeat(32)
    );
    let state = uapi::parse_answer(&answer).unwrap();
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let stats: Vec<PeerStats> = state
        .peers
        .into_iter()
        .map(|p| peer_stats(p, now))
        .collect();
    assert_eq!(
        stats[0],
        PeerStats {
            public_key: key,
            endpoint: Some("192.0.2.7:51820".parse().unwrap()),
            // 5.25 s before now: the second it began in.
            last_handshake_unix: Some(1_799_999_994),
            rx_bytes: 10,
            tx_bytes: 20,
        }
    );
    assert_eq!(stats[1].last_handshake_unix, None);
    assert_eq!(stats[1].endpoint, None);
}

#[test]
fn address_clashes_are_found() {
    let key = |b: u8| PublicKey::from_slice(&[b; 32]).unwrap();
    let section = |b: u8, ip: [u8; 4]| {
        (
            key(b),
            PeerSection {
                public_key: key(b),
                vpn_ip: Ipv4Addr::from(ip),
                endpoint: None,
                pod_range: None,
            },
        )
    };
    let fine: BTreeMap<_, _> = [section(1, [10, 0, 0, 1]), section(2, [10, 0, 0, 2])].into();
    check_addresses(&fine).unwrap();
    let clash: BTreeMap<_, _> = [section(1, [10, 0, 0, 1]), section(2, [10, 0, 0, 1])].into();
    let error = check_addresses(&clash).unwrap_err();
    assert!(
        matches!(error, DeviceError::AddressClash { ip, first, second }
                if ip == Ipv4Addr::new(10, 0, 0, 1) && first == key(1) && second == key(2)),
        "{error}"
    );
}
