//! The image's images in kubeadm's documents: set where kubeadm reads them, in each API's shape,
//! the rest of the documents unchanged; CoreDNS's addon skipped for an image without it.

use serde_json::json;

use super::super::tests::{TOKEN, documents, init_request, ticket};
use super::super::{InitRequest, JoinRequest, Verb, command_flags, init_config, join_config};
use super::*;

const REPO: &str = "registry.hawser.invalid/kubernetes";

/// What a real v1.20.2 image says (`/usr/share/hawser/kubernetes.json`).
pub(crate) fn images() -> ImageSet {
    ImageSet::named(
        "registry.hawser.invalid/kubernetes",
        "/usr/share/hawser/kubernetes/images.tar",
        "v1.20.2",
        "3.4.23-0",
        "3.2",
    )
}

fn v1_20_init() -> InitRequest {
    InitRequest {
        kubernetes_version: "v1.20.2".parse().unwrap(),
        ..init_request()
    }
}

fn v1_20_join(control_plane: bool) -> JoinRequest {
    JoinRequest {
        kubernetes_version: "v1.20.2".parse().unwrap(),
        ..ticket(control_plane)
    }
}

#[test]
fn init_names_the_images_repository_etcd_and_pause_and_changes_nothing_else() {
    let plain = init_config(&v1_20_init()).unwrap();
    let with = with_images(&plain, &images()).unwrap();
    let mut expected = documents(&plain);
    expected[0]["nodeRegistration"]["kubeletExtraArgs"]["pod-infra-container-image"] =
        json!(format!("{REPO}/pause:3.2"));
    expected[1]["imageRepository"] = json!(REPO);
    expected[1]["etcd"] = json!({"local": {"imageRepository": REPO, "imageTag": "3.4.23-0"}});
    // The read-only /usr: the FlexVolume directory on the state disk, for the controller
    // manager's static pod and the kubelet.
    let election = json!({
        "leader-elect-lease-duration": "60s",
        "leader-elect-renew-deadline": "40s",
        "leader-elect-retry-period": "5s",
    });
    let mut manager = election.clone();
    manager["flex-volume-plugin-dir"] = json!("/var/lib/kubelet/volumeplugins");
    expected[1]["controllerManager"] = json!({"extraArgs": manager});
    expected[1]["scheduler"] = json!({"extraArgs": election});
    expected[2]["volumePluginDir"] = json!("/var/lib/kubelet/volumeplugins");
    assert_eq!(documents(&with), expected);
    assert_eq!(with.api(), plain.api());
    assert!(with.as_str().contains(TOKEN), "the token is kept");
    // Applied again (every attempt, or an intent from an earlier boot): the same text.
    assert_eq!(with_images(&with, &images()).unwrap(), with);
}

#[test]
fn joins_name_the_pause_image_in_each_apis_shape() {
    for control_plane in [false, true] {
        let plain = join_config(&v1_20_join(control_plane)).unwrap();
        let docs = documents(&with_images(&plain, &images()).unwrap());
        assert_eq!(
            docs[0]["nodeRegistration"]["kubeletExtraArgs"],
            json!({"node-ip": "10.0.2.16", "pod-infra-container-image": format!("{REPO}/pause:3.2")})
        );
        assert_eq!(docs[0]["discovery"], documents(&plain)[0]["discovery"]);
    }
    // v1beta4's list of {name, value}: appended once, whatever ran before.
    let plain = join_config(&ticket(false)).unwrap();
    let twice = with_images(&with_images(&plain, &images()).unwrap(), &images()).unwrap();
    assert_eq!(
        documents(&twice)[0]["nodeRegistration"]["kubeletExtraArgs"],
        json!([
            {"name": "node-ip", "value": "10.0.2.16"},
            {"name": "pod-infra-container-image", "value": format!("{REPO}/pause:3.2")}
        ])
    );
}

#[test]
fn v1beta4_init_moves_the_flex_volume_directory_in_its_list_shape() {
    let plain = init_config(&init_request()).unwrap();
    let twice = with_images(&with_images(&plain, &images()).unwrap(), &images()).unwrap();
    let docs = documents(&twice);
    let cluster = docs
        .iter()
        .find(|d| d["kind"] == "ClusterConfiguration")
        .unwrap();
    assert_eq!(
        cluster["controllerManager"]["extraArgs"],
        json!([
            {"name": "flex-volume-plugin-dir", "value": "/var/lib/kubelet/volumeplugins"},
            {"name": "leader-elect-lease-duration", "value": "60s"},
            {"name": "leader-elect-renew-deadline", "value": "40s"},
            {"name": "leader-elect-retry-period", "value": "5s"}
        ])
    );
    assert_eq!(
        cluster["scheduler"]["extraArgs"].as_array().unwrap().len(),
        3
    );
}

#[test]
fn an_etcd_repository_kubeadm_cannot_name_is_refused() {
    let mut odd = images();
    odd.etcd.repository = "registry.hawser.invalid/etcd-server".into();
    let err = with_images(&init_config(&v1_20_init()).unwrap(), &odd).unwrap_err();
    assert!(
        err.to_string()
            .contains("the image's etcd repository \"registry.hawser.invalid/etcd-server\""),
        "{err}"
    );
}

#[test]
fn init_skips_coredns_and_kube_proxy_with_the_images_and_joins_never_name_them() {
    let images = images();
    assert!(!has_coredns(&images));
    assert_eq!(
        command_flags(KubeadmApi::V1beta2, Verb::Init, Some(&images)),
        ["--skip-phases=preflight,addon/coredns,addon/kube-proxy"]
    );
    assert_eq!(
        command_flags(KubeadmApi::V1beta2, Verb::Join, Some(&images)),
        ["--skip-phases=preflight"]
    );
    let mut with_coredns = images.clone();
    with_coredns.images.push(format!("{REPO}/coredns:1.7.0"));
    assert!(has_coredns(&with_coredns));
    assert_eq!(
        command_flags(KubeadmApi::V1beta2, Verb::Init, Some(&with_coredns)),
        ["--skip-phases=preflight,addon/kube-proxy"]
    );
}
