use hawser_proto::mesh::peer_to_wire;

use super::*;

fn key(n: u8) -> PrivateKey {
    PrivateKey::from_random([n; 32])
}

fn wire_peer(n: u8, ip: &str) -> hawser_proto::vpn::Peer {
    peer_to_wire(&Peer {
        name: format!("node-{n}"),
        public_key: key(n).public_key(),
        vpn_ip: ip.parse().unwrap(),
        endpoint: None,
        coordinator: n == 1,
    })
}

fn config() -> VpnConfig {
    VpnConfig {
        node_vpn_ip: "10.99.0.3".into(),
        prefix: "10.99.0.0/16".into(),
        mtu: 1420,
        registry_version: 4,
        peers: vec![wire_peer(1, "10.99.0.1"), wire_peer(2, "10.99.0.3")],
        vpn_api_port: 9091,
        ..Default::default()
    }
}

#[test]
fn a_ticket_without_a_mesh_is_no_mesh() {
    assert_eq!(MeshGrant::from_wire(&VpnConfig::default()).unwrap(), None);
}

#[test]
fn a_ticket_mesh_is_checked_and_finds_the_node_itself() {
    let grant = MeshGrant::from_wire(&config()).unwrap().unwrap();
    assert_eq!(grant.own.public_key, key(2).public_key());
    assert_eq!(grant.mtu, 1420);
    assert_eq!(grant.peers.version(), 4);
    type Change = fn(&mut VpnConfig);
    let cases: Vec<(Change, &str)> = vec![
        (|c| c.node_vpn_ip = "10.99.0.300".into(), "node address"),
        (|c| c.node_vpn_ip = "10.98.0.3".into(), "outside the prefix"),
        (|c| c.prefix = "10.99.0.0".into(), "prefix"),
        (|c| c.mtu = 100, "MTU"),
        (|c| c.vpn_api_port = 70000, "peer API port"),
        (
            |c| {
                c.peers[0].public_key.pop();
            },
            "malformed",
        ),
        (|c| c.node_vpn_ip = "10.99.0.9".into(), "no member there"),
    ];
    for (change, says) in cases {
        let mut config = config();
        change(&mut config);
        let error = MeshGrant::from_wire(&config).unwrap_err().to_string();
        assert!(error.contains(says), "`{error}` should say `{says}`");
    }
}

fn keep(root: &Path, bytes: &[u8]) {
    crate::platform::fs::write_atomically(&root.join(KEY_FILE), bytes, 0o600).unwrap();
}

#[test]
fn the_first_boot_keeps_the_generated_key_and_every_boot_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let grant = MeshGrant::from_wire(&config()).unwrap().unwrap();
    keep(dir.path(), &key_to_keep(&key(2), &grant).unwrap());
    let kept = node_key(dir.path(), &grant).unwrap();
    assert_eq!(kept.public_key(), key(2).public_key());
}

#[test]
fn the_first_node_takes_the_first_address_and_a_later_boot_takes_its_kept_place() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(kept_grant(dir.path()).unwrap(), None, "never in a mesh");
    let endpoint = Some("192.168.76.10:51820".parse().unwrap());
    let first = MeshGrant::first_node(
        "10.99.0.0/24".parse().unwrap(),
        "hawser-0123abcd",
        key(1).public_key(),
        endpoint,
    )
    .unwrap();
    assert_eq!(first.node_ip, Ipv4Addr::new(10, 99, 0, 1));
    assert_eq!(first.mtu, 1420);
    assert_eq!(first.api_port, PEER_API_PORT);
    assert_eq!(first.own.endpoint, endpoint);
    keep(dir.path(), &key_to_keep(&key(1), &first).unwrap());
    crate::platform::fs::write_atomically(
        &dir.path().join(SETTINGS_FILE),
        &serde_json::to_vec(&first.settings()).unwrap(),
        0o600,
    )
    .unwrap();
    let kept = kept_grant(dir.path()).unwrap().unwrap();
    assert_eq!(kept.settings(), first.settings());
    assert_eq!(kept.own.public_key, key(1).public_key());
    assert_eq!(
        node_key(dir.path(), &kept).unwrap().public_key(),
        key(1).public_key()
    );
    assert_eq!(kept.peers.version(), 0, "no peers kept yet");
    // The peers the tunnel last had come back with it (a whole-cluster restart).
    let mut view = MeshView::new(key(1).public_key(), first.node_ip, first.prefix);
    let peer = |n: u8, ip: &str| Peer {
        name: format!("node-{n}"),
        public_key: key(n).public_key(),
        vpn_ip: ip.parse().unwrap(),
        endpoint: Some(format!("192.168.76.{}:51820", 9 + n).parse().unwrap()),
        coordinator: n == 2,
    };
    view.apply(&PeerUpdate::Full {
        version: 7,
        peers: vec![
            peer(1, "10.99.0.1"),
            peer(2, "10.99.0.2"),
            peer(3, "10.99.0.3"),
        ],
    })
    .unwrap();
    let mut warned = false;
    keep_peers(dir.path(), &view, &mut warned);
    assert!(!warned);
    let kept = kept_grant(dir.path()).unwrap().unwrap();
    assert_eq!(kept.peers.version(), 7);
    let mut again = MeshView::new(key(1).public_key(), kept.node_ip, kept.prefix);
    again.apply(&kept.peers).unwrap();
    assert_eq!(
        again.peers().count(),
        2,
        "node-2 and node-3, not node-1 itself"
    );
    assert_eq!(again.coordinators().count(), 1);
    // A damaged peers file costs the head start only.
    std::fs::write(dir.path().join(PEERS_FILE), "[").unwrap();
    assert_eq!(kept_grant(dir.path()).unwrap().unwrap().peers.version(), 0);
    // A ticket's grant is kept the same way.
    let ticketed = MeshGrant::from_wire(&config()).unwrap().unwrap();
    assert_eq!(ticketed.settings().address, Ipv4Addr::new(10, 99, 0, 3));
    std::fs::write(dir.path().join(SETTINGS_FILE), "{}").unwrap();
    let error = kept_grant(dir.path()).unwrap_err();
    assert!(error.to_string().contains("mesh.json"), "{error}");
    assert!(
        MeshGrant::first_node(
            "10.99.0.0/31".parse().unwrap(),
            "n",
            key(1).public_key(),
            None
        )
        .is_err()
    );
}

#[test]
fn a_key_the_registry_does_not_hold_is_refused_and_never_kept() {
    let dir = tempfile::tempdir().unwrap();
    let grant = MeshGrant::from_wire(&config()).unwrap().unwrap();
    let error = key_to_keep(&key(7), &grant).unwrap_err();
    assert!(
        matches!(error, MeshSetupError::KeyMismatch { .. }),
        "{error}"
    );
    // No key on the disk (it was lost): the error names the file, never a fresh key.
    let error = node_key(dir.path(), &grant).unwrap_err();
    assert!(error.to_string().contains("wireguard.key"), "{error}");
    keep(dir.path(), key(7).to_base64().as_bytes());
    let error = node_key(dir.path(), &grant).unwrap_err();
    assert!(
        error.to_string().contains("remove it from the mesh"),
        "{error}"
    );
    keep(dir.path(), b"garbage");
    let error = node_key(dir.path(), &grant).unwrap_err();
    assert!(
        matches!(error, MeshSetupError::KeyFileContent { .. }),
        "{error}"
    );
    assert!(!error.to_string().contains("garbage"));
}
