//! The image's Kubernetes description checked against the command line, the ctr commands with
//! their "already present" check on `ctr images ls -q` output, and which archives a node
//! imports (a worker the node archive only).

use hawser_kube_types::{ControlPlaneFile, JoinTicket, KubernetesOrigin};
use zeroize::Zeroizing;

use crate::kube::intent::KubeadmIntent;
use crate::kube::kubeadm::KubeadmConfig;

use super::*;

const REPO: &str = "registry.hawser.invalid/kubernetes";

fn real() -> ImageKubernetes {
    ImageKubernetes {
        origin: KubernetesOrigin::Source,
        version: "v1.20.2".into(),
        images: Some(ImageSet::named(
            REPO,
            "/usr/share/hawser/kubernetes",
            "v1.20.2",
            "3.4.23-0",
            "3.2",
        )),
        absent: vec!["CoreDNS: not in Debian; cluster DNS is not installed".into()],
    }
}

fn root_with(text: Option<&str>) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    if let Some(text) = text {
        let path = root.path().join(IMAGE_KUBERNETES_PATH);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    root
}

fn version(text: &str) -> KubernetesVersion {
    text.parse().unwrap()
}

#[test]
fn the_description_must_say_the_command_lines_version() {
    let root = root_with(Some(&real().to_json()));
    let image = read(root.path(), Some(&version("v1.20.2")))
        .unwrap()
        .unwrap();
    assert_eq!(image, real());

    let err = read(root.path(), Some(&version("v1.33.4"))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the image is inconsistent: its command line says hawser.kubernetes=v1.33.4 but its \
         rootfs's /usr/share/hawser/kubernetes.json says v1.20.2; rebuild the image"
    );
    let err = read(root.path(), None).unwrap_err();
    assert!(
        err.to_string()
            .contains("hawser.kubernetes=(absent) but its rootfs's"),
        "{err}"
    );
    let empty = root_with(None);
    let err = read(empty.path(), Some(&version("v1.20.2"))).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("says nothing (no such file); rebuild the image"),
        "{err}"
    );
    // Neither: an image without Kubernetes, as before.
    assert_eq!(read(empty.path(), None).unwrap(), None);
}

#[test]
fn a_description_that_is_not_one_is_refused_by_path() {
    let root = root_with(Some("{\"origin\": \"source\"}"));
    let err = read(root.path(), Some(&version("v1.20.2"))).unwrap_err();
    assert!(
        matches!(err, ImageKubernetesError::Invalid { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "/usr/share/hawser/kubernetes.json is not a Kubernetes description hawser can use"
    );
}

#[test]
fn ctr_talks_to_containerds_socket_in_the_kubelets_namespace() {
    let images = real().images.unwrap();
    let list = list_command();
    assert_eq!(list.program, Path::new("/usr/bin/ctr"));
    assert_eq!(
        list.args,
        [
            "--address",
            "/run/containerd/containerd.sock",
            "-n",
            "k8s.io",
            "images",
            "ls",
            "-q"
        ]
    );
    let import = import_command(&images.node);
    assert_eq!(
        import.args[4..],
        [
            "images",
            "import",
            "/usr/share/hawser/kubernetes/node-images.tar"
        ]
    );
    assert_eq!(
        import_command(&images.control_plane).args[6],
        "/usr/share/hawser/kubernetes/control-plane-images.tar"
    );
    assert!(import.timeout.is_some() && list.timeout.is_some());
    assert_eq!(
        import.env,
        [("PATH".to_owned(), supervisor::SERVICE_PATH.to_owned())]
    );
}

#[test]
fn every_image_listed_means_nothing_to_import() {
    let images = real().images.unwrap();
    // After an import, containerd's CRI also lists each image by digest.
    let mut all: String = images
        .images
        .iter()
        .map(|name| format!("{name}\n"))
        .collect();
    all.push_str(&format!(
        "{REPO}/etcd@sha256:{0}\nsha256:{0}\n",
        "ab".repeat(32)
    ));
    assert!(missing(&images.images, &all).is_empty());
    let others: Vec<String> = images
        .images
        .iter()
        .filter(|name| !name.ends_with("/pause:3.2"))
        .cloned()
        .collect();
    assert_eq!(
        missing(&images.images, &format!("{REPO}/pause:3.2\n")),
        others
    );
    assert_eq!(missing(&images.images, "").len(), images.images.len());
    // A name is a whole line: a longer tag is another image.
    assert_eq!(
        missing(&images.images, &all.replace("pause:3.2", "pause:3.21")),
        [format!("{REPO}/pause:3.2")]
    );
}

#[test]
fn a_worker_checks_and_imports_the_node_archive_only() {
    let images = real().images.unwrap();
    // A worker's store after its first boot: the node archive's images, and no others.
    let worker_store: String = images
        .node
        .images
        .iter()
        .map(|name| format!("{name}\n"))
        .collect();
    let worker = images.archives(false);
    assert_eq!(worker, [&images.node]);
    for archive in &worker {
        assert!(missing(&archive.images, &worker_store).is_empty());
    }
    // The same store on a control plane lacks exactly the control-plane archive's images.
    let control_plane = images.archives(true);
    assert_eq!(control_plane, [&images.node, &images.control_plane]);
    assert!(missing(&control_plane[0].images, &worker_store).is_empty());
    assert_eq!(
        missing(&control_plane[1].images, &worker_store),
        [
            "etcd:3.4.23-0",
            "kube-apiserver:v1.20.2",
            "kube-controller-manager:v1.20.2",
            "kube-scheduler:v1.20.2"
        ]
        .map(|name| format!("{REPO}/{name}"))
    );
}

fn ticket(control_plane: bool) -> JoinTicket {
    JoinTicket {
        api_server_endpoint: "10.0.2.100:6443".parse().unwrap(),
        token: "abcdef.0123456789abcdef".parse().unwrap(),
        ca_cert_hashes: vec![format!("sha256:{}", "00".repeat(32)).parse().unwrap()],
        kubernetes_version: "v1.20.2".into(),
        control_plane_files: control_plane.then(|| {
            vec![ControlPlaneFile {
                name: "ca.key".into(),
                data: Zeroizing::new(b"key".to_vec()),
            }]
        }),
    }
}

fn kept(verb: Verb, control_plane: bool) -> KubeadmWork {
    let intent = KubeadmIntent {
        verb,
        config: KubeadmConfig::from_stored(Zeroizing::new("{}".into())),
        control_plane_files: ticket(control_plane)
            .control_plane_files
            .unwrap_or_default(),
        images: None,
    };
    KubeadmWork::Run {
        intent: Box::new(intent),
        status: crate::kube::intent::KubeadmStatus::new(verb),
    }
}

#[test]
fn what_kubeadm_runs_makes_a_worker_or_a_control_plane() {
    let nothing = || KubeadmWork::Nothing;
    let of = |role: &Role, work: &KubeadmWork| ImportFor::of_kubeadm(role, work);
    assert_eq!(
        of(&Role::Join(ticket(false)), &kept(Verb::Join, false)),
        Some(ImportFor::worker("a worker's join ticket"))
    );
    assert_eq!(
        of(&Role::Join(ticket(true)), &kept(Verb::Join, true)),
        Some(ImportFor::control_plane("a control-plane join ticket"))
    );
    // A rejoining node: the intent an earlier boot kept says what kubeadm runs again.
    assert!(
        !of(&Role::Rejoin, &kept(Verb::Join, false))
            .unwrap()
            .control_plane
    );
    assert!(
        of(&Role::Rejoin, &kept(Verb::Join, true))
            .unwrap()
            .control_plane
    );
    assert!(
        of(&Role::Rejoin, &kept(Verb::Init, false))
            .unwrap()
            .control_plane
    );
    // kubeadm done on an earlier boot: kubeadm says nothing.
    assert_eq!(of(&Role::Rejoin, &nothing()), None);
    assert_eq!(
        of(&Role::Rejoin, &KubeadmWork::Unrunnable("x".into())),
        None
    );
}

#[test]
fn the_kept_cluster_secrets_make_a_control_plane_and_nothing_unmakes_one() {
    let worker = ImportFor::worker("a worker's join ticket");
    let control_plane = ImportFor::control_plane("kubeadm init on this node");
    assert_eq!(ImportFor::decide(Some(worker), false), worker);
    assert_eq!(ImportFor::decide(Some(control_plane), false), control_plane);
    assert_eq!(ImportFor::decide(Some(control_plane), true), control_plane);
    // A worker's intent on a disk with a control plane's secrets: imports everything (a worker
    // that imports too much is slow; a control plane without its images cannot start).
    assert!(ImportFor::decide(Some(worker), true).control_plane);
    let rebooted_control_plane = ImportFor::decide(None, true);
    assert!(rebooted_control_plane.control_plane);
    assert!(
        rebooted_control_plane
            .because
            .contains("keeps the cluster's secrets"),
        "{rebooted_control_plane:?}"
    );
    let rebooted_worker = ImportFor::decide(None, false);
    assert!(!rebooted_worker.control_plane);
    assert_eq!(rebooted_worker.scope(), "a worker: node images only");
    assert_eq!(
        rebooted_control_plane.scope(),
        "a control plane: node and control-plane images"
    );
}

#[test]
fn the_kept_secrets_are_seen_by_their_master_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!crate::kube::join_service::keeps_secrets(dir.path()));
    std::fs::write(dir.path().join("master-secret.json"), "{}").unwrap();
    assert!(crate::kube::join_service::keeps_secrets(dir.path()));
}
