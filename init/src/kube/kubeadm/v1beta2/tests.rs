//! The `v1beta2` documents hawser writes for Kubernetes 1.20: their exact shape (string maps,
//! `timeoutForControlPlane`), the preflight phase skipped on the command line, and the API read
//! back from a stored configuration. Real kubeadm 1.20.2 reads them in `init/tests/kubeadm_real.rs`.

use serde_json::json;
use zeroize::Zeroizing;

use super::super::tests::{HASH, TOKEN, documents, init_request, ticket};
use super::super::{
    ControlPlaneJoin, InitRequest, JoinRequest, KubeadmConfig, Verb, command_flags, init_config,
    join_config,
};
use super::TIMEOUT_FOR_CONTROL_PLANE;
use hawser_kube_types::KubeadmApi;

fn v1_20(request: InitRequest) -> InitRequest {
    InitRequest {
        kubernetes_version: "v1.20.2".parse().unwrap(),
        ..request
    }
}

fn join_1_20(control_plane: bool) -> JoinRequest {
    JoinRequest {
        kubernetes_version: "v1.20.2".parse().unwrap(),
        ..ticket(control_plane)
    }
}

#[test]
fn init_configuration_is_v1beta2_with_map_style_kubelet_args() {
    let config = init_config(&v1_20(init_request())).unwrap();
    assert_eq!(config.api(), Some(KubeadmApi::V1beta2));
    assert_eq!(
        documents(&config),
        [
            json!({
                "apiVersion": "kubeadm.k8s.io/v1beta2",
                "kind": "InitConfiguration",
                "bootstrapTokens": [{
                    "token": TOKEN,
                    "description": "created by hawser at kubeadm init",
                    "ttl": "3600s",
                    "usages": ["signing", "authentication"],
                    "groups": ["system:bootstrappers:kubeadm:default-node-token"]
                }],
                "nodeRegistration": {
                    "name": "node-1",
                    "criSocket": "unix:///run/containerd/containerd.sock",
                    "kubeletExtraArgs": {"node-ip": "10.0.2.15"}
                },
                "localAPIEndpoint": {"advertiseAddress": "10.0.2.15", "bindPort": 6443}
            }),
            json!({
                "apiVersion": "kubeadm.k8s.io/v1beta2",
                "kind": "ClusterConfiguration",
                "clusterName": "hawser",
                "kubernetesVersion": "v1.20.2",
                "controlPlaneEndpoint": "10.0.2.15:6443",
                "networking": {"serviceSubnet": "10.96.0.0/12", "podSubnet": "10.244.0.0/16"},
                "apiServer": {
                    "certSANs": ["10.0.2.100", "api.hawser.example"],
                    "timeoutForControlPlane": "10m0s"
                }
            }),
            json!({
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "cgroupDriver": "cgroupfs"
            }),
        ]
    );
    assert_eq!(TIMEOUT_FOR_CONTROL_PLANE, "10m0s");
}

#[test]
fn init_in_the_mesh_uses_the_vpn_address_everywhere() {
    // What grants.rs renders: no token, no pod CIDR, the node's mesh address.
    let request = v1_20(InitRequest {
        bootstrap_token: None,
        pod_cidr: None,
        cert_sans: vec![],
        node_ip: "10.123.0.1".parse().unwrap(),
        ..init_request()
    });
    let docs = documents(&init_config(&request).unwrap());
    assert!(docs[0].get("bootstrapTokens").is_none());
    assert_eq!(
        docs[0]["nodeRegistration"]["kubeletExtraArgs"],
        json!({"node-ip": "10.123.0.1"})
    );
    assert_eq!(
        docs[0]["localAPIEndpoint"]["advertiseAddress"],
        "10.123.0.1"
    );
    assert_eq!(docs[1]["controlPlaneEndpoint"], "10.123.0.1:6443");
    assert_eq!(
        docs[1]["apiServer"],
        json!({"timeoutForControlPlane": "10m0s"})
    );
}

#[test]
fn worker_join_configuration() {
    let config = join_config(&JoinRequest {
        ignore_preflight_errors: vec![],
        ..join_1_20(false)
    })
    .unwrap();
    assert_eq!(config.api(), Some(KubeadmApi::V1beta2));
    assert_eq!(
        documents(&config),
        [json!({
            "apiVersion": "kubeadm.k8s.io/v1beta2",
            "kind": "JoinConfiguration",
            "discovery": {"bootstrapToken": {
                "token": TOKEN,
                "apiServerEndpoint": "10.0.2.15:6443",
                "caCertHashes": [HASH]
            }},
            "nodeRegistration": {
                "name": "node-2",
                "criSocket": "unix:///run/containerd/containerd.sock",
                "kubeletExtraArgs": {"node-ip": "10.0.2.16"}
            }
        })]
    );
}

#[test]
fn control_plane_join_configuration() {
    let docs = documents(&join_config(&join_1_20(true)).unwrap());
    assert_eq!(docs[0]["apiVersion"], "kubeadm.k8s.io/v1beta2");
    assert_eq!(
        docs[0]["controlPlane"],
        json!({
            "localAPIEndpoint": {"advertiseAddress": "10.0.2.16", "bindPort": 6443},
            "certificateKey": "ab".repeat(32)
        })
    );
    assert_eq!(
        docs[0]["nodeRegistration"]["ignorePreflightErrors"],
        json!(["SystemVerification"])
    );
    // As grants.rs renders it: the shared files are put in place, no certificate key.
    let without_key = JoinRequest {
        control_plane: Some(ControlPlaneJoin {
            certificate_key: None,
        }),
        ..join_1_20(true)
    };
    let docs = documents(&join_config(&without_key).unwrap());
    assert_eq!(
        docs[0]["controlPlane"],
        json!({"localAPIEndpoint": {"advertiseAddress": "10.0.2.16", "bindPort": 6443}})
    );
}

#[test]
fn the_preflight_phase_is_skipped_on_the_command_line_also_for_a_stored_config() {
    for verb in [Verb::Init, Verb::Join] {
        assert_eq!(
            command_flags(KubeadmApi::V1beta2, verb, None),
            ["--skip-phases=preflight"]
        );
    }
    for config in [
        init_config(&v1_20(init_request())).unwrap(),
        join_config(&join_1_20(false)).unwrap(),
        join_config(&join_1_20(true)).unwrap(),
    ] {
        // v1beta2 has no skipPhases: nothing in the documents says it.
        assert!(!config.as_str().contains("skipPhases"));
        let stored = KubeadmConfig::from_stored(Zeroizing::new(config.as_str().to_owned()));
        assert_eq!(stored.api(), Some(KubeadmApi::V1beta2));
    }
}
