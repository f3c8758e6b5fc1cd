//! The image's Kubernetes description checked against the command line, and the ctr commands
//! with their "already present" check on `ctr images ls -q` output.

use hawser_kube_types::KubernetesOrigin;

use super::*;

const REPO: &str = "registry.hawser.invalid/kubernetes";

fn real() -> ImageKubernetes {
    ImageKubernetes {
        origin: KubernetesOrigin::Source,
        version: "v1.20.2".into(),
        images: Some(ImageSet::named(
            REPO,
            "/usr/share/hawser/kubernetes/images.tar",
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
    let import = import_command(&images);
    assert_eq!(
        import.args[4..],
        [
            "images",
            "import",
            "/usr/share/hawser/kubernetes/images.tar"
        ]
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
    assert!(missing(&images, &all).is_empty());
    let others: Vec<String> = images
        .images
        .iter()
        .filter(|name| !name.ends_with("/pause:3.2"))
        .cloned()
        .collect();
    assert_eq!(missing(&images, &format!("{REPO}/pause:3.2\n")), others);
    assert_eq!(missing(&images, "").len(), images.images.len());
    // A name is a whole line: a longer tag is another image.
    assert_eq!(
        missing(&images, &all.replace("pause:3.2", "pause:3.21")),
        [format!("{REPO}/pause:3.2")]
    );
}
