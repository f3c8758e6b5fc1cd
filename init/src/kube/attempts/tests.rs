//! kubeadm's attempts: the control-plane files' modes and names, the errors' layers, and
//! what each kind of boot runs; the ticket's version choosing the API and kubeadm's flags.

use super::*;
use crate::kube::intent::Verb;
use hawser_kube_types::JoinTicket;
use std::os::unix::fs::PermissionsExt as _;
use zeroize::Zeroizing;

fn file(name: &str, data: &[u8]) -> ControlPlaneFile {
    ControlPlaneFile {
        name: name.to_owned(),
        data: Zeroizing::new(data.to_vec()),
    }
}

#[test]
fn control_plane_files_land_under_pki_with_kubeadms_modes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    write_control_plane_files(
        &pki,
        &[
            file("ca.crt", b"cert"),
            file("ca.key", b"key"),
            file("etcd/ca.key", b"etcd"),
        ],
    )
    .unwrap();
    let mode = |p: &str| std::fs::metadata(pki.join(p)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("ca.crt"), 0o644);
    assert_eq!(mode("ca.key"), 0o600);
    assert_eq!(mode("etcd/ca.key"), 0o600);
    assert_eq!(std::fs::read(pki.join("etcd/ca.key")).unwrap(), b"etcd");
}

#[test]
fn kubeadm_failures_name_their_layer_and_show_each_cause_once() {
    let bad_key = kubeadm::CertificateKey::parse("x").unwrap_err();
    assert_eq!(
        error_chain(&KubeadmRunError::Config(bad_key)),
        "cannot write the kubeadm configuration: kubeadm configuration: certificate key is \
         invalid (value not shown: secret): expected 64 lowercase hex digits (32 bytes)"
    );
    let unreadable = std::io::Error::from(std::io::ErrorKind::NotFound);
    assert_eq!(
        error_chain(&KubeadmRunError::AdminKubeconfig(unreadable)),
        "kubeadm init succeeded but /etc/kubernetes/admin.conf is unreadable: entity not found"
    );
}

fn identity() -> NodeIdentity {
    NodeIdentity {
        name: "hawser-0123abcd".into(),
        ip: "10.0.2.15".parse().unwrap(),
    }
}

fn on_disk(root: &Path, path: &str) -> std::path::PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn join_intent() -> KubeadmIntent {
    KubeadmIntent {
        verb: Verb::Join,
        config: kubeadm::KubeadmConfig::from_stored(Zeroizing::new(
            "{\"kind\":\"JoinConfiguration\"}".into(),
        )),
        control_plane_files: Vec::new(),
        images: None,
    }
}

#[test]
fn a_join_runs_the_intent_its_first_boot_kept_on_the_state_disk() {
    let root = tempfile::tempdir().unwrap();
    let ticket = JoinTicket {
        api_server_endpoint: "10.0.2.100:6443".parse().unwrap(),
        token: "abcdef.0123456789abcdef".parse().unwrap(),
        ca_cert_hashes: vec![format!("sha256:{}", "00".repeat(32)).parse().unwrap()],
        kubernetes_version: "v1.31.2".into(),
        control_plane_files: Some(vec![file("ca.key", b"key")]),
    };
    let granted = grants::Granted {
        disk_uuid: "0123abcd-0000-4000-8000-000000000000",
        kubeadm: Some(grants::KubeadmGrant::Join(&ticket)),
        secrets: None,
        mesh: None,
    };
    let first_boot = grants::FirstBoot {
        image_kubernetes: None,
        mesh_key: &hawser_mesh::PrivateKey::from_random([1; 32]),
        rootfs: true,
        underlay_ip: Some("10.0.2.15".parse().unwrap()),
    };
    for kept in grants::first_boot_files(&granted, &first_boot).unwrap() {
        kept.write_under(root.path()).unwrap();
    }
    let KubeadmWork::Run { intent, status } =
        kubeadm_work(&Role::Join(ticket), &identity(), root.path())
    else {
        panic!("a join runs kubeadm");
    };
    assert_eq!(status, KubeadmStatus::new(Verb::Join));
    let path = on_disk(root.path(), KUBEADM_INTENT);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let kept = KubeadmIntent::load(&path).unwrap().unwrap();
    assert_eq!(kept, *intent);
    assert_eq!(kept.verb, Verb::Join);
    assert!(kept.config.as_str().contains("10.0.2.100:6443"));
    assert!(kept.config.as_str().contains("hawser-0123abcd"));
    assert_eq!(kept.control_plane_files, vec![file("ca.key", b"key")]);
}

#[test]
fn a_rejoin_with_the_marker_runs_no_kubeadm_even_with_an_intent() {
    let root = tempfile::tempdir().unwrap();
    join_intent()
        .save(&on_disk(root.path(), KUBEADM_INTENT))
        .unwrap();
    std::fs::write(on_disk(root.path(), KUBEADM_MARKER), "done").unwrap();
    let work = kubeadm_work(&Role::Rejoin, &identity(), root.path());
    assert!(matches!(work, KubeadmWork::Nothing));
}

#[test]
fn a_rejoin_without_the_marker_runs_the_kept_intent_counting_earlier_attempts() {
    let root = tempfile::tempdir().unwrap();
    join_intent()
        .save(&on_disk(root.path(), KUBEADM_INTENT))
        .unwrap();
    let mut status = KubeadmStatus::new(Verb::Join);
    status.attempts = 2;
    status.last_error = Some("kubeadm join failed (attempt 2)".into());
    status.save(&on_disk(root.path(), KUBEADM_STATUS)).unwrap();
    let KubeadmWork::Run {
        intent,
        status: kept,
    } = kubeadm_work(&Role::Rejoin, &identity(), root.path())
    else {
        panic!("kubeadm does not run again");
    };
    assert_eq!(*intent, join_intent());
    assert_eq!(kept, status);
}

#[test]
fn a_rejoin_with_no_intent_or_a_corrupt_one_runs_services_only() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(on_disk(root.path(), "/var/lib/hawser")).unwrap();
    let work = kubeadm_work(&Role::Rejoin, &identity(), root.path());
    assert!(matches!(work, KubeadmWork::Nothing));
    std::fs::write(on_disk(root.path(), KUBEADM_INTENT), "{\"version\":").unwrap();
    let work = kubeadm_work(&Role::Rejoin, &identity(), root.path());
    assert!(matches!(work, KubeadmWork::Nothing));
}

#[test]
fn control_plane_file_names_cannot_leave_the_pki_directory() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["../evil", "/etc/shadow", "", "a/../../b"] {
        let err = write_control_plane_files(dir.path(), &[file(name, b"x")]).unwrap_err();
        assert!(err.to_string().contains("refusing"), "{name}: {err}");
    }
}

fn ticket_for(version: &str) -> JoinTicket {
    JoinTicket {
        api_server_endpoint: "10.0.2.100:6443".parse().unwrap(),
        token: "abcdef.0123456789abcdef".parse().unwrap(),
        ca_cert_hashes: vec![format!("sha256:{}", "00".repeat(32)).parse().unwrap()],
        kubernetes_version: version.into(),
        control_plane_files: None,
    }
}

#[test]
fn the_tickets_version_chooses_the_api_and_kubeadms_flags_also_for_a_kept_intent() {
    for (version, api, args) in [
        (
            "v1.20.2",
            "kubeadm.k8s.io/v1beta2",
            &[
                KUBEADM,
                "join",
                "--config",
                KUBEADM_CONFIG,
                "--skip-phases=preflight",
            ][..],
        ),
        (
            "v1.33.4",
            "kubeadm.k8s.io/v1beta4",
            &[KUBEADM, "join", "--config", KUBEADM_CONFIG],
        ),
    ] {
        let KubeadmWork::Run { intent, .. } = kubeadm_work(
            &Role::Join(ticket_for(version)),
            &identity(),
            Path::new("/"),
        ) else {
            panic!("{version}: a join runs kubeadm");
        };
        assert!(intent.config.as_str().contains(api), "{version}");
        assert_eq!(kubeadm_args(&intent), args, "{version}");
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("intent.json");
        intent.save(&path).unwrap();
        let kept = KubeadmIntent::load(&path).unwrap().unwrap();
        assert_eq!(kubeadm_args(&kept), args, "{version}: kept");
    }
    // An intent without a kubeadm apiVersion (not hawser's): no flags, kubeadm says why.
    assert_eq!(
        kubeadm_args(&join_intent()),
        [KUBEADM, "join", "--config", KUBEADM_CONFIG]
    );
}

#[test]
fn a_ticket_for_a_version_hawser_cannot_write_for_is_unrunnable_saying_why() {
    for (version, reason) in [
        (
            "v1.25.3",
            "hawser writes no kubeadm configuration for Kubernetes v1.25.3: it writes for \
             v1.20.x (kubeadm.k8s.io/v1beta2) and v1.31.0 or later 1.x (kubeadm.k8s.io/v1beta4)",
        ),
        (
            "1.20.2",
            "the join ticket's Kubernetes version \"1.20.2\" is invalid",
        ),
    ] {
        let KubeadmWork::Unrunnable(message) = kubeadm_work(
            &Role::Join(ticket_for(version)),
            &identity(),
            Path::new("/"),
        ) else {
            panic!("{version}: kubeadm cannot run");
        };
        assert!(message.contains(reason), "{message}");
    }
}

#[test]
fn an_init_intent_kept_before_the_pivot_runs_with_the_images_of_the_image_it_boots() {
    let spec = crate::enrollment::init_server::ClusterSpec {
        cluster_name: "hawser".into(),
        kubernetes_version: "v1.20.2".parse().unwrap(),
        service_cidr: "10.96.0.0/12".parse().unwrap(),
        api_server_cert_sans: Vec::new(),
        control_plane_endpoint: None,
        mesh_prefix: None,
        control_plane_approvals: Vec::new(),
    };
    let rendered = grants::render_intent(grants::KubeadmGrant::Init(&spec), &identity()).unwrap();
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("intent.json");
    rendered.save(&path).unwrap();
    let mut kept = KubeadmIntent::load(&path).unwrap().unwrap();
    assert_eq!(kept.images, None, "images are never kept");
    assert_eq!(
        kubeadm_args(&kept),
        [
            KUBEADM,
            "init",
            "--config",
            KUBEADM_CONFIG,
            "--skip-phases=preflight"
        ]
    );
    let repo = "registry.hawser.invalid/kubernetes";
    kept.images = Some(hawser_kube_types::ImageSet::named(
        repo,
        "/usr/share/hawser/kubernetes",
        "v1.20.2",
        "3.4.23-0",
        "3.2",
    ));
    assert_eq!(
        kubeadm_args(&kept),
        [
            KUBEADM,
            "init",
            "--config",
            KUBEADM_CONFIG,
            "--skip-phases=preflight,addon/coredns,addon/kube-proxy"
        ]
    );
}
