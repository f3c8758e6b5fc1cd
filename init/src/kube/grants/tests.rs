//! The grants on an in-memory state disk (the lifecycle's test doubles): the order they are
//! kept in, and a power cut at every step from the disk key to the "initialized" mark, after
//! which the next boots come back by themselves.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use hawser_luks2::{HEADER_SIZE, Integrity};
use hawser_mesh::{Peer, PeerUpdate};
use zeroize::Zeroizing;

use super::super::{KubeadmWork, kubeadm_work};
use super::*;
use crate::disk::key::{DiskStatus, VolumeKey};
use crate::disk::lifecycle::testing::{MemDisk, Recorder};
use crate::disk::lifecycle::{self, Action, LifecycleError, Options};
use crate::platform::timings::PhaseTimer;
use hawser_kube_types::ControlPlaneFile;

const CLUSTER: [u8; 32] = [9; 32];

fn mesh_key(n: u8) -> PrivateKey {
    PrivateKey::from_random([n; 32])
}

/// The ticket's mesh, registered for the key of join number `n`.
fn mesh_grant(n: u8) -> MeshGrant {
    let own = Peer {
        name: "node".into(),
        public_key: mesh_key(n).public_key(),
        vpn_ip: "10.99.0.3".parse().unwrap(),
        endpoint: None,
        coordinator: false,
    };
    MeshGrant {
        node_ip: own.vpn_ip,
        prefix: "10.99.0.0/16".parse().unwrap(),
        mtu: 1420,
        own: own.clone(),
        peers: PeerUpdate::Full {
            version: 1,
            peers: vec![own],
        },
        api_port: 9091,
    }
}

fn secrets() -> ClusterSecrets {
    ClusterSecrets {
        master: hawser_keys::MasterSecret::new(vec![7; 32], vec![8; 32]).unwrap(),
        measurement_salt: b"salt".to_vec(),
    }
}

fn ticket() -> JoinTicket {
    JoinTicket {
        api_server_endpoint: "10.0.2.100:6443".parse().unwrap(),
        token: "abcdef.0123456789abcdef".parse().unwrap(),
        ca_cert_hashes: vec![format!("sha256:{}", "00".repeat(32)).parse().unwrap()],
        kubernetes_version: "v1.33.4".into(),
        control_plane_files: Some(vec![ControlPlaneFile {
            name: "ca.key".into(),
            data: Zeroizing::new(b"CA KEY".to_vec()),
        }]),
    }
}

fn spec() -> ClusterSpec {
    ClusterSpec {
        cluster_name: "hawser".into(),
        kubernetes_version: "v1.33.4".parse().unwrap(),
        service_cidr: "10.96.0.0/12".parse().unwrap(),
        api_server_cert_sans: Vec::new(),
        control_plane_endpoint: None,
        mesh_prefix: None,
        control_plane_approvals: vec!["000b0123".into()],
    }
}

/// What a first boot is granted: a control-plane join with the mesh, or the admin's init.
#[derive(Clone, Copy, Debug)]
enum Grant {
    ControlPlaneJoin,
    Init,
}

/// The grants of join (or init) number `n` for disk `uuid`: what is kept, and what the node's
/// later boots must find.
struct Expected {
    kept: Vec<Kept>,
    mesh: Option<MeshGrant>,
    intent: KubeadmIntent,
    identity: NodeIdentity,
    approvals: bool,
}

fn granted(grant: Grant, n: u8, uuid: &str) -> Expected {
    let (ticket, spec, secrets) = (ticket(), spec(), secrets());
    let mesh = matches!(grant, Grant::ControlPlaneJoin).then(|| mesh_grant(n));
    let kubeadm = match grant {
        Grant::ControlPlaneJoin => KubeadmGrant::Join(&ticket),
        Grant::Init => KubeadmGrant::Init(&spec),
    };
    let granted = Granted {
        disk_uuid: uuid,
        kubeadm: Some(kubeadm),
        secrets: Some(&secrets),
        mesh: mesh.as_ref(),
    };
    let first = FirstBoot {
        image_kubernetes: None,
        mesh_key: &mesh_key(n),
        rootfs: true,
        underlay_ip: Some("10.0.2.15".parse().unwrap()),
    };
    let identity = NodeIdentity {
        name: crate::enrollment::client::node_name(uuid),
        ip: mesh
            .as_ref()
            .map_or("10.0.2.15".parse::<Ipv4Addr>().unwrap(), |m| m.node_ip)
            .into(),
    };
    Expected {
        kept: first_boot_files(&granted, &first).unwrap(),
        intent: render_intent(kubeadm, &identity).unwrap(),
        mesh,
        identity,
        approvals: matches!(grant, Grant::Init),
    }
}

fn volume_key(n: u8) -> VolumeKey {
    VolumeKey::new(Zeroizing::new(vec![n; Integrity::None.key_len()]))
}

fn options<'a>(fs: &'a Path, first_boot: &'a [Kept]) -> Options<'a> {
    Options {
        integrity: Integrity::None,
        mount_point: fs,
        formatted_by: "hawser test",
        cluster_id: Some(CLUSTER),
        first_boot,
    }
}

/// Where the power goes on a first boot, after the join granted the disk key.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// n bytes into the "formatting" header's writes.
    Formatting(usize),
    /// During mkfs.
    Mkfs,
    /// While keeping file number n of the grants (from 0).
    Keeping(usize),
    /// n bytes into the "initialized" mark's header writes.
    Marking(usize),
    Never,
}

/// A boot of a blank (or never initialized) disk: the join number `n` is granted for the disk
/// the plan names, the disk formatted keeping the grants, the power cut as `cut` says.
fn first_boot(
    disk: &MemDisk,
    fs: &Path,
    grant: Grant,
    n: u8,
    cut: Cut,
) -> (Expected, Result<lifecycle::Outcome, LifecycleError>) {
    let mut timer = PhaseTimer::start();
    let platform = Recorder {
        filesystem: Some(fs.to_owned()),
        cut_keep_at: match cut {
            Cut::Keeping(at) => Some(at),
            _ => None,
        },
        fail_mkfs: matches!(cut, Cut::Mkfs),
        ..Recorder::default()
    };
    let plan = lifecycle::prepare(disk, &options(fs, &[]), &platform, &mut timer).unwrap();
    assert_eq!(plan.status(), DiskStatus::New, "the node asks for a join");
    let expected = granted(grant, n, plan.luks_uuid());
    let options = options(fs, &expected.kept);
    let key = lifecycle::verify(&plan, volume_key(n), &options, &mut timer).unwrap();
    match cut {
        Cut::Formatting(bytes) => *disk.budget.borrow_mut() = Some(bytes),
        // Integrity off: the format wrote both header copies once before the mark.
        Cut::Marking(bytes) => *disk.budget.borrow_mut() = Some(2 * HEADER_SIZE + bytes),
        _ => {}
    }
    let result = lifecycle::apply(disk, plan, key, &options, &platform, &mut timer);
    *disk.budget.borrow_mut() = None;
    (expected, result)
}

/// A rejoin of an initialized disk: it opens with the key of the join that formatted it, and
/// finds every grant that join gave — the WireGuard key the registry holds, kubeadm's intent,
/// the cluster's secrets (and the admin's approvals): nothing wedges it.
fn rejoin_comes_back(disk: &MemDisk, fs: &Path, n: u8, expected: &Expected) {
    let mut timer = PhaseTimer::start();
    let platform = Recorder::default();
    let options = options(fs, &[]);
    let plan = lifecycle::prepare(disk, &options, &platform, &mut timer).unwrap();
    assert_eq!(plan.status(), DiskStatus::Initialized);
    let key = lifecycle::verify(&plan, volume_key(n), &options, &mut timer).unwrap();
    let opened = lifecycle::apply(disk, plan, key, &options, &platform, &mut timer).unwrap();
    assert_eq!(opened.action, Action::Opened);
    if let Some(grant) = &expected.mesh {
        let key = mesh::node_key(fs, grant).unwrap_or_else(|e| panic!("the mesh: {e}"));
        assert_eq!(key.public_key(), mesh_key(n).public_key());
    }
    match kubeadm_work(&Role::Rejoin, &expected.identity, fs) {
        KubeadmWork::Run { intent, .. } => assert_eq!(*intent, expected.intent),
        _ => panic!("the rejoin has no kubeadm intent: services only"),
    }
    let cluster = fs.join(on_state_disk(Path::new(join_service::CLUSTER_DIR)));
    let (secrets, version) = join_service::load(&cluster)
        .unwrap()
        .expect("the control plane kept no secrets: no join service");
    assert_eq!(secrets.master.key_bytes(), &[7; 32]);
    assert_eq!(version.to_string(), "v1.33.4");
    let approvals = fs.join(on_state_disk(Path::new(join_service::JOIND_APPROVALS)));
    assert_eq!(approvals.exists(), expected.approvals);
}

/// What the next boot does with the disk: open it (a rejoin) or format it (asked again).
fn next_boot(disk: &MemDisk, fs: &Path) -> DiskStatus {
    let plan = lifecycle::prepare(
        disk,
        &options(fs, &[]),
        &Recorder::default(),
        &mut PhaseTimer::start(),
    );
    plan.unwrap_or_else(|e| panic!("the next boot refuses the disk: {e}"))
        .status()
}

/// Cuts the first boot at every step from the key to the mark, and after it; each time the
/// node comes back by itself: a disk left unmarked is formatted again and the node's second
/// join keeps its own grants, a marked one rejoins and finds the first join's.
fn a_power_cut_anywhere_from_the_key_to_the_mark_comes_back(grant: Grant) {
    let steps = granted(grant, 1, "00000000-0000-4000-8000-000000000000")
        .kept
        .len();
    let headers = [
        0,
        512,
        4096,
        HEADER_SIZE,
        HEADER_SIZE + 4096,
        2 * HEADER_SIZE - 512,
    ];
    // Every sector of the header writes is cut in the lifecycle's own tests; here a few.
    let cuts = [0, 512, HEADER_SIZE + 4096]
        .map(Cut::Formatting)
        .into_iter()
        .chain([Cut::Mkfs])
        .chain((0..steps).map(Cut::Keeping))
        .chain(headers.map(Cut::Marking))
        .chain([Cut::Never]);
    for cut in cuts {
        let disk = MemDisk::new();
        let fs = tempfile::tempdir().unwrap();
        let (first, result) = first_boot(&disk, fs.path(), grant, 1, cut);
        match (cut, &result) {
            (Cut::Keeping(_), Err(LifecycleError::Keep { .. })) => {}
            (Cut::Keeping(_), other) => panic!("{grant:?} cut at {cut:?}: {other:?}"),
            (_, _) => {}
        }
        match next_boot(&disk, fs.path()) {
            DiskStatus::Initialized => rejoin_comes_back(&disk, fs.path(), 1, &first),
            DiskStatus::New => {
                assert!(
                    !matches!(cut, Cut::Never),
                    "{grant:?}: a boot that was not cut left the disk unmarked"
                );
                // Asked again: a fresh join (a new UUID, key and WireGuard key) or the
                // admin's init again, whose grants are all kept before the mark.
                let (second, result) = first_boot(&disk, fs.path(), grant, 2, Cut::Never);
                result.unwrap_or_else(|e| panic!("{grant:?} after a cut at {cut:?}: {e}"));
                rejoin_comes_back(&disk, fs.path(), 2, &second);
            }
        }
    }
}

#[test]
fn fault_power_cut_between_the_key_and_the_last_grant_of_a_join() {
    a_power_cut_anywhere_from_the_key_to_the_mark_comes_back(Grant::ControlPlaneJoin);
}

#[test]
fn fault_power_cut_between_the_key_and_the_last_grant_of_hawser_init() {
    a_power_cut_anywhere_from_the_key_to_the_mark_comes_back(Grant::Init);
}

#[test]
fn the_grants_are_kept_after_their_directories_in_order_with_their_modes() {
    let expected = granted(
        Grant::ControlPlaneJoin,
        1,
        "0123abcd-0000-4000-8000-000000000000",
    );
    let listed: Vec<(String, String)> = expected
        .kept
        .iter()
        .map(|kept| {
            let (kind, mode) = match kept {
                Kept::Dir { mode, .. } => ("dir", mode),
                Kept::File { mode, .. } => ("file", mode),
            };
            (
                kept.path().display().to_string(),
                format!("{kind} {mode:o}"),
            )
        })
        .collect();
    let want = [
        ("lib", "dir 700"),
        ("lib/hawser", "dir 700"),
        ("lib/hawser/mesh", "dir 700"),
        ("lib/hawser/mesh/wireguard.key", "file 600"),
        ("lib/hawser/mesh/mesh.json", "file 600"),
        ("var", "dir 755"),
        ("var/lib", "dir 755"),
        ("var/lib/hawser", "dir 700"),
        ("var/lib/hawser/kubeadm-intent.json", "file 600"),
        ("var/lib/hawser/cluster", "dir 700"),
        ("var/lib/hawser/cluster/master-secret.json", "file 600"),
        ("var/lib/hawser/cluster/measurement-salt", "file 600"),
        ("var/lib/hawser/cluster/kubernetes-version", "file 600"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(p, m)| (p.to_string(), m.to_string()))
        .collect();
    assert_eq!(listed, want);
    // The admin's init: no mesh, and its approvals for the join service.
    let init = granted(Grant::Init, 1, "0123abcd-0000-4000-8000-000000000000");
    let last: Vec<String> = init
        .kept
        .iter()
        .rev()
        .take(2)
        .map(|k| k.path().display().to_string())
        .collect();
    assert_eq!(
        last,
        [
            "var/lib/hawser-joind/control-plane-approvals",
            "var/lib/hawser-joind"
        ]
    );
    assert!(!init.kept.iter().any(|k| k.path().starts_with("lib")));
    // Written, the directories have their modes.
    let fs = tempfile::tempdir().unwrap();
    for kept in &expected.kept {
        kept.write_under(fs.path()).unwrap();
    }
    let mode = |p: &str| {
        std::fs::metadata(fs.path().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("var"), 0o755);
    assert_eq!(mode("var/lib/hawser/cluster"), 0o700);
}

#[test]
fn a_ticket_for_another_wireguard_key_is_refused_before_anything_is_kept() {
    let grant = mesh_grant(2);
    let granted = Granted {
        disk_uuid: "0123abcd-0000-4000-8000-000000000000",
        kubeadm: None,
        secrets: None,
        mesh: Some(&grant),
    };
    let first = FirstBoot {
        image_kubernetes: None,
        mesh_key: &mesh_key(1),
        rootfs: true,
        underlay_ip: None,
    };
    let error = first_boot_files(&granted, &first).unwrap_err();
    assert!(
        matches!(error, MeshSetupError::KeyMismatch { .. }),
        "{error}"
    );
}

#[test]
fn an_image_without_kubernetes_keeps_only_the_nodes_place_in_the_mesh() {
    let (ticket, secrets, grant) = (ticket(), secrets(), mesh_grant(1));
    let granted = Granted {
        disk_uuid: "0123abcd-0000-4000-8000-000000000000",
        kubeadm: Some(KubeadmGrant::Join(&ticket)),
        secrets: Some(&secrets),
        mesh: Some(&grant),
    };
    let first = FirstBoot {
        image_kubernetes: None,
        mesh_key: &mesh_key(1),
        rootfs: false,
        underlay_ip: None,
    };
    let kept = first_boot_files(&granted, &first).unwrap();
    assert_eq!(
        kept.last()
            .map(|k| k.path().display().to_string())
            .as_deref(),
        Some("lib/hawser/mesh/mesh.json"),
        "{kept:?}"
    );
}

#[test]
fn a_ticket_for_another_kubernetes_than_the_images_is_refused_naming_both() {
    let image: KubernetesVersion = "v1.20.2".parse().unwrap();
    let mut ticket = ticket();
    let err = check_ticket_version(Some(&ticket), Some(&image)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the join service hands out Kubernetes v1.33.4, but this image carries v1.20.2 \
         (hawser.kubernetes on its command line) and installs no other: run the cluster's join \
         service with --kubernetes-version v1.20.2, or boot this node from an image of v1.33.4"
    );
    ticket.kubernetes_version = "1.20".into();
    let err = check_ticket_version(Some(&ticket), Some(&image)).unwrap_err();
    assert!(
        matches!(err, TicketVersionError::Malformed { .. }),
        "{err:?}"
    );
    // The image's own version; no ticket (the admin's init, a recover); no version on the
    // image's command line (no rootfs): nothing to refuse.
    ticket.kubernetes_version = "v1.20.2".into();
    assert!(check_ticket_version(Some(&ticket), Some(&image)).is_ok());
    assert!(check_ticket_version(None, Some(&image)).is_ok());
    assert!(check_ticket_version(Some(&self::ticket()), None).is_ok());
}
