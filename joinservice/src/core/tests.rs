//! The join decisions' tests: keys of the right disk and length, refusals naming PCRs and fields,
//! disk bindings, control-plane approvals and files, the mesh's admissions and polls.

use super::*;
use crate::tokens::KubeadmTokenIssuer;
use crate::vpn::PeerApiError;
use hawser_mesh::{PeerUpdate, PublicKey, Registry};
use std::net::Ipv4Addr;

const UUID: &str = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

struct Fixture {
    _dir: tempfile::TempDir,
    core: JoinCore,
    master: MasterSecret,
    measurements: PathBuf,
}

fn fixture(pki: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let measurements = dir.path().join("measurements.json");
    std::fs::write(
        &measurements,
        format!(r#"{{"9": {{"expected": "{}", "warnOnly": false}}, "0": {{"expected": "{}", "warnOnly": true}}}}"#, "99".repeat(32), "00".repeat(32)),
    )
    .unwrap();
    let kubeconfig = dir.path().join("admin.conf");
    std::fs::write(&kubeconfig, "kind: Config\n").unwrap();
    let pki_dir = dir.path().join("pki");
    if pki {
        for name in CONTROL_PLANE_FILES {
            let path = pki_dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("content of {name}")).unwrap();
        }
    }
    let master = MasterSecret::new(vec![5; 32], vec![6; 32]).unwrap();
    let core = JoinCore::new(
        Arc::new(PolicyStore::load(&measurements).unwrap()),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kubeadm-standin"),
            kubeconfig,
        }),
        JoinCoreConfig {
            master_secret: master.clone(),
            measurement_salt: vec![7; 32],
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(3600),
            pki_dir: pki.then_some(pki_dir),
            registry_file: dir.path().join("joined"),
        },
    )
    .unwrap()
    .with_control_plane_approvals(Arc::new(
        ApprovalStore::load(&dir.path().join("control-plane-approvals")).unwrap(),
    ));
    Fixture {
        _dir: dir,
        core,
        master,
        measurements,
    }
}

/// The TPM name of the AK of the node `peer` stands for.
const AK: [u8; 34] = [0xa1; 34];
/// The AK of another machine.
const OTHER_AK: [u8; 34] = [0xb2; 34];

fn peer(pcr9: u8) -> VerifiedPeer {
    peer_with_ak(pcr9, &AK)
}

fn peer_with_ak(pcr9: u8, ak_name: &[u8]) -> VerifiedPeer {
    VerifiedPeer {
        address: Some("127.0.0.1".parse().unwrap()),
        pcrs: BTreeMap::from([(9, [pcr9; 32]), (0, [1; 32])]),
        ak_name: ak_name.to_vec(),
    }
}

/// Writes the approvals file with `ak_names` and reloads it.
fn approve(f: &Fixture, ak_names: &[&[u8]]) {
    let text: String = ak_names
        .iter()
        .map(|name| format!("{}\n", hex::encode(name)))
        .collect();
    std::fs::write(f.core.approvals().path().unwrap(), text).unwrap();
    assert!(matches!(
        f.core.approvals().reload_if_changed(),
        crate::policy::ReloadOutcome::Reloaded { .. }
    ));
}

fn core_over_registry(f: &Fixture, registry_file: PathBuf) -> JoinCore {
    JoinCore::new(
        Arc::clone(f.core.policy()),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: "/nonexistent".into(),
            kubeconfig: "/nonexistent".into(),
        }),
        JoinCoreConfig {
            master_secret: f.master.clone(),
            measurement_salt: vec![7; 32],
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(60),
            pki_dir: f.core.config.pki_dir.clone(),
            registry_file,
        },
    )
    .unwrap()
}

fn request(control_plane: bool) -> JoinRequest {
    JoinRequest {
        disk_uuid: UUID.to_uppercase(),
        node_name: "worker-1".into(),
        is_control_plane: control_plane,
        ..JoinRequest::default()
    }
}

#[test]
fn a_node_with_integrity_gets_a_96_byte_key_and_a_length_no_disk_uses_records_nothing() {
    let f = fixture(false);
    let integrity = JoinRequest {
        state_disk_key_length: 96,
        ..request(false)
    };
    let ticket = f.core.issue_join_ticket(&peer(0x99), &integrity).unwrap();
    assert_eq!(
        *ticket.state_disk_key,
        *f.master
            .state_disk_key(UUID, StateDiskKeyLength::XtsHmacSha256)
            .unwrap()
    );
    let rejoin = f
        .core
        .issue_rejoin_ticket_at(
            &peer(0x99),
            &RejoinRequest {
                disk_uuid: UUID.into(),
                state_disk_key_length: 96,
                ..RejoinRequest::default()
            },
        )
        .unwrap();
    assert_eq!(*rejoin.state_disk_key, *ticket.state_disk_key);
    // An XTS-only disk (or a node that does not say) keeps its 64-byte key: the prefix.
    let xts = f.core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
    assert_eq!(&xts.state_disk_key[..], &ticket.state_disk_key[..64]);

    // A length no disk uses is refused by name, before the disk is bound to the AK.
    let other = "0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c";
    for bad in [32, 65, 128] {
        let err = f
            .core
            .issue_join_ticket(
                &peer(0x98),
                &JoinRequest {
                    disk_uuid: other.into(),
                    state_disk_key_length: bad,
                    ..request(false)
                },
            )
            .unwrap_err();
        assert!(matches!(err, JoinError::DiskKeyLength(_)), "{err}");
        let chain = hawser_attestation::error_chain(&err);
        assert!(chain.contains(&format!("{bad}-byte key")), "{chain}");
        assert_eq!(
            crate::service::status_of(&err).code(),
            tonic::Code::InvalidArgument
        );
    }
    assert!(
        f.core
            .store()
            .disk_binding(other, ReadConsistency::Latest)
            .unwrap()
            .is_none(),
        "a refused length recorded the disk"
    );
}

#[test]
fn a_genuine_node_gets_the_key_of_its_disk_and_can_rejoin() {
    let f = fixture(false);
    let ticket = f
        .core
        .issue_join_ticket(&peer(0x99), &request(false))
        .unwrap();
    assert_eq!(
        *ticket.state_disk_key,
        *f.master
            .state_disk_key(UUID, StateDiskKeyLength::Xts)
            .unwrap()
    );
    assert_eq!(*ticket.measurement_secret, *f.master.measurement_secret());
    assert!(!format!("{ticket:?}").contains(ticket.kubeadm.token.expose_secret()));
    assert!(!format!("{ticket:?}").contains(&hex::encode(&ticket.state_disk_key[..8])));
    let rejoin = f.core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
    assert_eq!(*rejoin.state_disk_key, *ticket.state_disk_key);
}

#[test]
fn a_wrong_pcr_is_refused_naming_expected_and_actual() {
    let f = fixture(false);
    let err = f
        .core
        .issue_join_ticket(&peer(0x98), &request(false))
        .unwrap_err();
    let msg = hawser_attestation::error_chain(&err);
    assert!(
        msg.contains("PCR 9") && msg.contains(&"99".repeat(32)) && msg.contains(&"98".repeat(32)),
        "{msg}"
    );
    // warnOnly PCR 0 differs too, but is not a reason to refuse.
    assert!(!msg.contains("PCR 0"), "{msg}");
}

#[test]
fn rejoin_of_an_unknown_disk_is_refused_and_the_registry_survives_restarts() {
    let f = fixture(false);
    let err = f.core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap_err();
    assert!(matches!(err, JoinError::UnknownDisk(_)), "{err}");
    f.core
        .issue_join_ticket(&peer(0x99), &request(false))
        .unwrap();
    let again = JoinCore::new(
        Arc::clone(f.core.policy()),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: "/nonexistent".into(),
            kubeconfig: "/nonexistent".into(),
        }),
        JoinCoreConfig {
            master_secret: f.master.clone(),
            measurement_salt: vec![7; 32],
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(60),
            pki_dir: None,
            registry_file: f.core.config.registry_file.clone(),
        },
    )
    .unwrap();
    again.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
}

#[test]
fn malformed_requests_are_refused_with_the_reason() {
    let f = fixture(false);
    let mut bad = request(false);
    bad.disk_uuid = "../../etc/passwd".into();
    let err = f.core.issue_join_ticket(&peer(0x99), &bad).unwrap_err();
    let chain = hawser_attestation::error_chain(&err);
    assert!(chain.contains("is not a UUID"), "{chain}");
    let mut bad = request(false);
    bad.node_name = "Worker_1".into();
    let err = f.core.issue_join_ticket(&peer(0x99), &bad).unwrap_err();
    let chain = hawser_attestation::error_chain(&err);
    assert!(chain.contains("DNS subdomain"), "{chain}");
    let err = f
        .core
        .issue_join_ticket(&peer(0x99), &request(true))
        .unwrap_err();
    assert!(err.to_string().contains("control-plane"), "{err}");
}

#[test]
fn control_plane_joins_receive_the_pki_files() {
    let f = fixture(true);
    approve(&f, &[&AK]);
    let ticket = f
        .core
        .issue_join_ticket(&peer(0x99), &request(true))
        .unwrap();
    let files = ticket.kubeadm.control_plane_files.as_deref().unwrap();
    let names: Vec<&str> = files.iter().map(|file| file.name.as_str()).collect();
    assert_eq!(names, CONTROL_PLANE_FILES);
    assert_eq!(&**files[1].data, b"content of ca.key");
}

#[test]
fn a_reloaded_policy_applies_to_the_next_request() {
    let f = fixture(false);
    std::fs::write(
        &f.measurements,
        format!(
            r#"{{"9": {{"expected": "{}", "warnOnly": false}}}}"#,
            "98".repeat(32)
        ),
    )
    .unwrap();
    f.core.policy().reload_if_changed();
    f.core
        .issue_join_ticket(&peer(0x98), &request(false))
        .unwrap();
    assert!(
        f.core
            .issue_join_ticket(&peer(0x99), &request(false))
            .is_err()
    );
}

#[test]
fn a_control_plane_join_needs_an_approved_ak_and_workers_do_not() {
    let f = fixture(true);
    let err = f
        .core
        .issue_join_ticket(&peer(0x99), &request(true))
        .unwrap_err();
    let file = f.core.approvals().path().unwrap().display().to_string();
    assert_eq!(
        err.to_string(),
        format!(
            "control-plane join refused: AK {} is not approved; add it to {file}",
            hex::encode(AK)
        )
    );
    // The same node joins as a worker.
    let ticket = f
        .core
        .issue_join_ticket(&peer(0x99), &request(false))
        .unwrap();
    assert!(ticket.kubeadm.control_plane_files.is_none());
    // Another machine's approval does not admit this one; its own does, until revoked.
    approve(&f, &[&OTHER_AK]);
    assert!(matches!(
        f.core.issue_join_ticket(&peer(0x99), &request(true)),
        Err(JoinError::ControlPlaneNotApproved { .. })
    ));
    approve(&f, &[&OTHER_AK, &AK]);
    f.core
        .issue_join_ticket(&peer(0x99), &request(true))
        .unwrap();
    std::fs::remove_file(f.core.approvals().path().unwrap()).unwrap();
    f.core.approvals().reload_if_changed();
    assert!(matches!(
        f.core.issue_join_ticket(&peer(0x99), &request(true)),
        Err(JoinError::ControlPlaneNotApproved { .. })
    ));
}

#[test]
fn without_an_approvals_file_no_control_plane_joins() {
    let f = fixture(true);
    let core = core_over_registry(&f, f.core.config.registry_file.clone());
    let err = core
        .issue_join_ticket(&peer(0x99), &request(true))
        .unwrap_err();
    assert!(err.to_string().contains("none configured"), "{err}");
}

#[test]
fn a_disk_is_bound_to_the_ak_of_its_first_join() {
    let f = fixture(false);
    f.core
        .issue_join_ticket(&peer(0x99), &request(false))
        .unwrap();
    let registry = std::fs::read_to_string(&f.core.config.registry_file).unwrap();
    assert_eq!(registry, format!("{UUID} {}\n", hex::encode(AK)));

    let clone = peer_with_ak(0x99, &OTHER_AK);
    let err = f.core.issue_rejoin_ticket(&clone, UUID).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "disk {UUID} joined with AK {}; this rejoin comes from AK {}: a cloned disk on another machine?",
            hex::encode(AK),
            hex::encode(OTHER_AK)
        )
    );
    // Nor can the clone ask for the disk's key as a fresh join.
    let err = f
        .core
        .issue_join_ticket(&clone, &request(false))
        .unwrap_err();
    assert!(err.to_string().contains("this join comes from AK"), "{err}");
    // The binding survives a restart; the node itself still rejoins.
    let again = core_over_registry(&f, f.core.config.registry_file.clone());
    assert!(matches!(
        again.issue_rejoin_ticket(&clone, UUID),
        Err(JoinError::AnotherAk { .. })
    ));
    again.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
}

#[test]
fn a_disk_recorded_without_an_ak_is_bound_at_its_next_rejoin() {
    let f = fixture(false);
    let other = "00000000-1111-4222-8333-444444444444";
    let registry_file = f.core.config.registry_file.clone();
    std::fs::write(&registry_file, format!("{UUID}\n{other}\n")).unwrap();
    let core = core_over_registry(&f, registry_file.clone());
    core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
    assert_eq!(
        std::fs::read_to_string(&registry_file).unwrap(),
        format!("{other}\n{UUID} {}\n", hex::encode(AK))
    );
    assert!(matches!(
        core.issue_rejoin_ticket(&peer_with_ak(0x99, &OTHER_AK), UUID),
        Err(JoinError::AnotherAk { .. })
    ));
    // The other legacy disk is still unbound, and binds to whoever comes first.
    core.issue_rejoin_ticket(&peer_with_ak(0x99, &OTHER_AK), other)
        .unwrap();
}

#[test]
fn a_malformed_registry_line_stops_the_start() {
    let f = fixture(false);
    let registry_file = f.core.config.registry_file.clone();
    std::fs::write(&registry_file, format!("{UUID} zz-not-hex\n")).unwrap();
    let err = JoinCore::new(
        Arc::clone(f.core.policy()),
        Arc::new(KubeadmTokenIssuer {
            kubeadm: "/nonexistent".into(),
            kubeconfig: "/nonexistent".into(),
        }),
        JoinCoreConfig {
            master_secret: f.master.clone(),
            measurement_salt: vec![7; 32],
            kubernetes_version: "v1.33.4".into(),
            token_ttl: Duration::from_secs(60),
            pki_dir: None,
            registry_file,
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            JoinError::Store(StoreError::RegistryLine { line: 1, .. })
        ),
        "{err}"
    );
}

mod mesh {
    use super::*;
    use crate::vpn::{JoinServiceAddress, admit_join_service};
    use hawser_mesh::{Peer, PeerStats};

    const OTHER_UUID: &str = "00000000-1111-4222-8333-444444444444";

    fn vpn_key(n: u8) -> PublicKey {
        PublicKey::from_slice(&[n; 32]).unwrap()
    }

    /// The fixture's core with the mesh on `prefix`, the join service admitted at the
    /// reserved address.
    fn meshed(prefix: &str) -> Fixture {
        let f = fixture(false);
        let prefix = prefix.parse().unwrap();
        let coordinator = admit_join_service(
            f.core.store().as_ref(),
            prefix,
            "joind",
            vpn_key(200),
            Some("192.0.2.1:51820".parse().unwrap()),
            JoinServiceAddress::Reserved,
        )
        .unwrap();
        let settings = MeshSettings {
            prefix,
            mtu: 1420,
            coordinator,
            vpn_api_port: 9091,
        };
        Fixture {
            core: f.core.with_mesh(settings),
            ..f
        }
    }

    fn join_request(uuid: &str, name: &str, key: u8, endpoint: &str) -> JoinRequest {
        JoinRequest {
            disk_uuid: uuid.into(),
            node_name: name.into(),
            is_control_plane: false,
            vpn_public_key: vpn_key(key).as_bytes().to_vec(),
            vpn_endpoint: endpoint.into(),
            state_disk_key_length: 0,
        }
    }

    fn join(f: &Fixture, req: &JoinRequest) -> Result<VpnTicket, JoinError> {
        Ok(f.core.issue_join_ticket(&peer(0x99), req)?.vpn.unwrap())
    }

    fn names(peers: &[Peer]) -> Vec<&str> {
        peers.iter().map(|p| p.name.as_str()).collect()
    }

    fn registry(f: &Fixture) -> Option<Registry> {
        f.core
            .store()
            .vpn_registry(ReadConsistency::Latest)
            .unwrap()
    }

    #[test]
    fn joining_nodes_get_addresses_and_each_other_and_keep_them_on_rejoin() {
        let f = meshed("10.99.0.0/24");
        let a = join(&f, &join_request(UUID, "worker-1", 1, "192.0.2.10:51820")).unwrap();
        assert_eq!(a.node.vpn_ip, Ipv4Addr::new(10, 99, 0, 2));
        assert_eq!(a.node.public_key, vpn_key(1));
        assert_eq!(a.node.endpoint, Some("192.0.2.10:51820".parse().unwrap()));
        assert_eq!(a.registry_version, 2);
        assert_eq!(names(&a.peers), ["worker-1", "joind"]);
        assert_eq!(a.coordinator.vpn_ip, Ipv4Addr::new(10, 99, 0, 1));
        assert!(a.coordinator.coordinator);
        assert_eq!((a.mtu, a.vpn_api_port), (1420, 9091));
        assert_eq!(a.prefix.to_string(), "10.99.0.0/24");

        let b = join(&f, &join_request(OTHER_UUID, "worker-2", 2, "")).unwrap();
        assert_eq!(b.node.vpn_ip, Ipv4Addr::new(10, 99, 0, 3));
        assert_eq!(b.node.endpoint, None);
        assert_eq!(b.registry_version, 3);
        assert_eq!(names(&b.peers), ["worker-2", "worker-1", "joind"]);

        // A rejoin from elsewhere: the same address, the new endpoint recorded, the
        // mesh as it is now.
        let rejoin = f
            .core
            .issue_rejoin_ticket_at(
                &peer(0x99),
                &RejoinRequest {
                    disk_uuid: UUID.to_string(),
                    vpn_endpoint: "198.51.100.7:51820".into(),
                    ..RejoinRequest::default()
                },
            )
            .unwrap()
            .vpn
            .unwrap();
        assert_eq!(rejoin.node.vpn_ip, a.node.vpn_ip);
        assert_eq!(
            rejoin.node.endpoint,
            Some("198.51.100.7:51820".parse().unwrap())
        );
        assert_eq!(rejoin.registry_version, 4);
        assert_eq!(rejoin.peers.len(), 3);
        // Without an endpoint, nothing changes.
        let quiet = f.core.issue_rejoin_ticket(&peer(0x99), UUID).unwrap();
        assert_eq!(quiet.vpn.unwrap().registry_version, 4);
        // A second join of the same disk and key: the same address again.
        let again = join(&f, &join_request(UUID, "worker-1", 1, "")).unwrap();
        assert_eq!(again.node.vpn_ip, a.node.vpn_ip);
    }

    #[test]
    fn malformed_vpn_fields_are_refused_naming_the_field_and_take_nothing() {
        let f = meshed("10.99.0.0/24");
        let before = registry(&f);
        let mut short_key = join_request(UUID, "worker-1", 1, "");
        short_key.vpn_public_key.pop();
        let error = f
            .core
            .issue_join_ticket(&peer(0x99), &short_key)
            .unwrap_err();
        assert!(error.to_string().contains("vpn_public_key"), "{error}");
        assert_eq!(
            crate::service::status_of(&error).code(),
            tonic::Code::InvalidArgument
        );
        let bad_endpoint = join_request(UUID, "worker-1", 1, "node.example:51820");
        let error = f
            .core
            .issue_join_ticket(&peer(0x99), &bad_endpoint)
            .unwrap_err();
        assert!(
            error.to_string().contains("vpn_endpoint")
                && error.to_string().contains("node.example:51820"),
            "{error}"
        );
        assert_eq!(
            crate::service::status_of(&error).code(),
            tonic::Code::InvalidArgument
        );
        // Neither bound the disk nor took an address.
        assert!(matches!(
            f.core.issue_rejoin_ticket(&peer(0x99), UUID),
            Err(JoinError::UnknownDisk(_))
        ));
        assert_eq!(registry(&f), before);
        // A join refused for its measurements takes no address either.
        assert!(
            f.core
                .issue_join_ticket(&peer(0x98), &join_request(UUID, "worker-1", 1, ""))
                .is_err()
        );
        assert_eq!(registry(&f), before);
        // A rejoin with a malformed endpoint is refused too.
        join(&f, &join_request(UUID, "worker-1", 1, "")).unwrap();
        let error = f
            .core
            .issue_rejoin_ticket_at(
                &peer(0x99),
                &RejoinRequest {
                    disk_uuid: UUID.to_string(),
                    vpn_endpoint: "nowhere".into(),
                    ..RejoinRequest::default()
                },
            )
            .unwrap_err();
        assert!(matches!(error, JoinError::VpnEndpoint { .. }), "{error}");
    }

    #[test]
    fn a_key_change_is_refused_and_the_mesh_stays_as_it_was() {
        let f = meshed("10.99.0.0/24");
        join(&f, &join_request(UUID, "worker-1", 1, "")).unwrap();
        let before = registry(&f);
        let error = f
            .core
            .issue_join_ticket(&peer(0x99), &join_request(UUID, "worker-1", 9, ""))
            .unwrap_err();
        let chain = hawser_attestation::error_chain(&error);
        assert!(chain.contains("key change is refused"), "{chain}");
        assert_eq!(
            crate::service::status_of(&error).code(),
            tonic::Code::FailedPrecondition
        );
        // Another disk presenting the same key.
        let error = f
            .core
            .issue_join_ticket(&peer(0x99), &join_request(OTHER_UUID, "worker-2", 1, ""))
            .unwrap_err();
        assert!(matches!(error, JoinError::Mesh { .. }), "{error}");
        assert_eq!(registry(&f), before);
    }

    #[test]
    fn a_full_prefix_is_resource_exhausted() {
        // A /30: .1 is the join service's, .2 the only node address.
        let f = meshed("10.99.0.0/30");
        join(&f, &join_request(UUID, "worker-1", 1, "")).unwrap();
        let error = f
            .core
            .issue_join_ticket(&peer(0x99), &join_request(OTHER_UUID, "worker-2", 2, ""))
            .unwrap_err();
        assert_eq!(
            crate::service::status_of(&error).code(),
            tonic::Code::ResourceExhausted
        );
        assert!(
            hawser_attestation::error_chain(&error).contains("no free address"),
            "{error}"
        );
    }

    #[test]
    fn without_the_mesh_or_a_key_tickets_carry_no_vpn() {
        let f = fixture(false);
        let ticket = f
            .core
            .issue_join_ticket(&peer(0x99), &join_request(UUID, "worker-1", 1, ""))
            .unwrap();
        assert!(ticket.vpn.is_none());
        assert!(
            f.core
                .store()
                .vpn_registry(ReadConsistency::Latest)
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            f.core.get_peers(Ipv4Addr::new(10, 99, 0, 2), None, vec![]),
            Err(PeerApiError::MeshOff)
        ));

        let f = meshed("10.99.0.0/24");
        let ticket = f
            .core
            .issue_join_ticket(&peer(0x99), &request(false))
            .unwrap();
        assert!(ticket.vpn.is_none());
        let rejoin = f
            .core
            .issue_rejoin_ticket_at(
                &peer(0x99),
                &RejoinRequest {
                    disk_uuid: UUID.to_string(),
                    vpn_endpoint: "192.0.2.9:51820".into(),
                    ..RejoinRequest::default()
                },
            )
            .unwrap();
        assert!(rejoin.vpn.is_none());
        assert_eq!(registry(&f).unwrap().members().count(), 1);
    }

    #[test]
    fn polls_are_answered_by_source_address_and_recorded() {
        let f = meshed("10.99.0.0/24");
        let a = join(&f, &join_request(UUID, "worker-1", 1, "")).unwrap();
        let error = f
            .core
            .get_peers(Ipv4Addr::new(10, 99, 0, 77), None, vec![])
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "10.99.0.77 is no member's VPN address: polls are only answered inside the mesh"
        );
        assert_eq!(
            crate::vpnapi::status_of(&error).code(),
            tonic::Code::PermissionDenied
        );
        assert!(f.core.store().vpn_polls().unwrap().is_empty());

        let stats = PeerStats {
            public_key: vpn_key(200),
            endpoint: Some("192.0.2.1:51820".parse().unwrap()),
            last_handshake_unix: Some(1_700_000_000),
            rx_bytes: 100,
            tx_bytes: 200,
        };
        let full = f
            .core
            .get_peers(a.node.vpn_ip, None, vec![stats.clone()])
            .unwrap();
        assert!(
            matches!(&full, PeerUpdate::Full { version: 2, peers } if peers.len() == 2),
            "{full:?}"
        );
        let polls = f.core.store().vpn_polls().unwrap();
        assert_eq!(polls[UUID].known_version, None);
        assert_eq!(polls[UUID].stats, vec![stats]);
        assert!(polls[UUID].unix_time > 1_700_000_000);

        assert_eq!(
            f.core.get_peers(a.node.vpn_ip, Some(2), vec![]).unwrap(),
            PeerUpdate::Current { version: 2 }
        );
        let b = join(&f, &join_request(OTHER_UUID, "worker-2", 2, "")).unwrap();
        assert_eq!(
            f.core.get_peers(a.node.vpn_ip, Some(2), vec![]).unwrap(),
            PeerUpdate::Delta {
                base: 2,
                version: 3,
                upserts: vec![b.node],
                removed: vec![]
            }
        );
        assert_eq!(
            f.core.store().vpn_polls().unwrap()[UUID].known_version,
            Some(2)
        );
    }
}
