//! The kubeadm configuration's tests: the init and join documents kubeadm reads, secrets
//! validated without being echoed, invalid input refused by field.

use super::*;
use serde_json::json;

pub(super) const TOKEN: &str = "abcdef.0123456789abcdef";
pub(super) const HASH: &str =
    "sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef";

pub(super) fn init_request() -> InitRequest {
    InitRequest {
        cluster_name: "hawser".into(),
        kubernetes_version: "v1.31.2".parse().unwrap(),
        service_cidr: "10.96.0.0/12".parse().unwrap(),
        pod_cidr: Some("10.244.0.0/16".parse().unwrap()),
        control_plane_endpoint: None,
        cert_sans: vec!["10.0.2.100".into(), "api.hawser.example".into()],
        node_name: "node-1".into(),
        node_ip: "10.0.2.15".parse().unwrap(),
        bootstrap_token: Some(InitBootstrapToken {
            token: TOKEN.parse().unwrap(),
            ttl: Duration::from_secs(3600),
        }),
        ignore_preflight_errors: vec![],
    }
}

pub(super) fn ticket(control_plane: bool) -> JoinRequest {
    JoinRequest {
        kubernetes_version: "v1.31.2".parse().unwrap(),
        api_server_endpoint: "10.0.2.15:6443".parse().unwrap(),
        token: TOKEN.parse().unwrap(),
        ca_cert_hashes: vec![HASH.parse().unwrap()],
        node_name: "node-2".into(),
        node_ip: "10.0.2.16".parse().unwrap(),
        control_plane: control_plane.then(|| ControlPlaneJoin {
            certificate_key: Some(CertificateKey::parse(&"ab".repeat(32)).unwrap()),
        }),
        ignore_preflight_errors: vec!["SystemVerification".into()],
    }
}

/// The documents of a YAML stream of JSON objects.
pub(super) fn documents(config: &KubeadmConfig) -> Vec<serde_json::Value> {
    config
        .as_str()
        .split("\n---\n")
        .map(|doc| serde_json::from_str(doc).unwrap())
        .collect()
}

#[test]
fn init_configuration_is_v1beta4_with_list_style_kubelet_args() {
    let config = init_config(&init_request()).unwrap();
    assert!(config.as_str().ends_with("}\n"));
    assert_eq!(
        documents(&config),
        [
            json!({
                "apiVersion": "kubeadm.k8s.io/v1beta4",
                "kind": "InitConfiguration",
                "bootstrapTokens": [{
                    "token": "abcdef.0123456789abcdef",
                    "description": "created by hawser at kubeadm init",
                    "ttl": "3600s",
                    "usages": ["signing", "authentication"],
                    "groups": ["system:bootstrappers:kubeadm:default-node-token"]
                }],
                "nodeRegistration": {
                    "name": "node-1",
                    "criSocket": "unix:///run/containerd/containerd.sock",
                    "kubeletExtraArgs": [{"name": "node-ip", "value": "10.0.2.15"}]
                },
                "localAPIEndpoint": {"advertiseAddress": "10.0.2.15", "bindPort": 6443}
            }),
            json!({
                "apiVersion": "kubeadm.k8s.io/v1beta4",
                "kind": "ClusterConfiguration",
                "clusterName": "hawser",
                "kubernetesVersion": "v1.31.2",
                "controlPlaneEndpoint": "10.0.2.15:6443",
                "networking": {"serviceSubnet": "10.96.0.0/12", "podSubnet": "10.244.0.0/16"},
                "apiServer": {"certSANs": ["10.0.2.100", "api.hawser.example"]}
            }),
            json!({
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "cgroupDriver": "cgroupfs"
            }),
        ]
    );
    // Documents are separated by a line of their own.
    assert_eq!(config.as_str().matches("\n---\n").count(), 2);
}

#[test]
fn init_without_a_token_or_pod_cidr_leaves_them_to_kubeadm() {
    let request = InitRequest {
        bootstrap_token: None,
        pod_cidr: None,
        cert_sans: vec![],
        control_plane_endpoint: Some("api.hawser.example".parse().unwrap()),
        node_ip: "fd00::15".parse().unwrap(),
        ignore_preflight_errors: vec!["SystemVerification".into()],
        ..init_request()
    };
    let docs = documents(&init_config(&request).unwrap());
    assert!(docs[0].get("bootstrapTokens").is_none());
    assert_eq!(
        docs[0]["nodeRegistration"]["ignorePreflightErrors"],
        json!(["SystemVerification"])
    );
    assert_eq!(docs[0]["localAPIEndpoint"]["advertiseAddress"], "fd00::15");
    assert_eq!(
        docs[1]["networking"],
        json!({"serviceSubnet": "10.96.0.0/12"})
    );
    assert_eq!(docs[1]["apiServer"], json!({}));
    assert_eq!(docs[1]["controlPlaneEndpoint"], "api.hawser.example");
    let v6 = InitRequest {
        control_plane_endpoint: None,
        ..request
    };
    assert_eq!(
        documents(&init_config(&v6).unwrap())[1]["controlPlaneEndpoint"],
        "[fd00::15]:6443"
    );
}

#[test]
fn worker_join_configuration() {
    let config = join_config(&JoinRequest {
        control_plane: None,
        ignore_preflight_errors: vec![],
        ..ticket(false)
    })
    .unwrap();
    assert_eq!(
        documents(&config),
        [json!({
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "JoinConfiguration",
            "discovery": {"bootstrapToken": {
                "token": "abcdef.0123456789abcdef",
                "apiServerEndpoint": "10.0.2.15:6443",
                "caCertHashes": [HASH]
            }},
            "nodeRegistration": {
                "name": "node-2",
                "criSocket": "unix:///run/containerd/containerd.sock",
                "kubeletExtraArgs": [{"name": "node-ip", "value": "10.0.2.16"}]
            }
        })]
    );
}

#[test]
fn control_plane_join_configuration() {
    let docs = documents(&join_config(&ticket(true)).unwrap());
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
    let without_key = JoinRequest {
        control_plane: Some(ControlPlaneJoin {
            certificate_key: None,
        }),
        ..ticket(true)
    };
    let docs = documents(&join_config(&without_key).unwrap());
    assert!(docs[0]["controlPlane"].get("certificateKey").is_none());
}

#[test]
fn secrets_are_validated_without_being_echoed_and_redacted_in_debug() {
    // The bootstrap token's own checks are hawser-kube-types' (token.rs).
    let key = CertificateKey::parse(&"0f".repeat(32)).unwrap();
    assert_eq!(format!("{key:?}"), "CertificateKey(<redacted>)");
    for bad in ["0f".repeat(31), "0F".repeat(32), "zz".repeat(32)] {
        let err = CertificateKey::parse(&bad).unwrap_err().to_string();
        assert!(!err.contains(&bad), "{err}");
    }
    let debug = format!("{:?} {:?}", ticket(true), init_request());
    assert!(!debug.contains("0123456789abcdef"), "{debug}");
    assert!(!debug.contains(&"ab".repeat(32)), "{debug}");
    let config = join_config(&ticket(true)).unwrap();
    assert!(format!("{config:?}").starts_with("KubeadmConfig("));
    assert!(!format!("{config:?}").contains("abcdef"));
}

#[test]
fn invalid_init_input_is_refused_naming_the_field() {
    type Edit = fn(&mut InitRequest);
    let cases: [(Edit, &str); 6] = [
        (
            |r| r.cluster_name = "Hawser".into(),
            "cluster name \"Hawser\"",
        ),
        (|r| r.node_name = "node_1".into(), "node name \"node_1\""),
        (|r| r.node_name = "-node".into(), "node name"),
        (
            |r| r.node_ip = "127.0.0.1".parse().unwrap(),
            "node IP \"127.0.0.1\"",
        ),
        (|r| r.node_ip = "0.0.0.0".parse().unwrap(), "node IP"),
        (|r| r.cert_sans.push("bad name".into()), "SAN \"bad name\""),
    ];
    // CIDRs, the control-plane endpoint and the Kubernetes version (`1.31.2`, `v1.31`,
    // `v1.033.0`) are checked where they are parsed: see hawser-kube-types (cidr.rs,
    // endpoint.rs, version.rs) and the init server's request checks.
    for (edit, message) in cases {
        let mut request = init_request();
        edit(&mut request);
        let err = init_config(&request).unwrap_err().to_string();
        assert!(err.contains(message), "{message}: {err}");
    }
    let mut request = init_request();
    request.bootstrap_token.as_mut().unwrap().ttl = Duration::ZERO;
    assert!(
        init_config(&request)
            .unwrap_err()
            .to_string()
            .contains("bootstrap token TTL")
    );
    // Wildcard SANs and IPv6 service ranges are fine.
    let mut request = init_request();
    request.cert_sans.push("*.hawser.example".into());
    request.service_cidr = "fd00:10:96::/108".parse().unwrap();
    let docs = documents(&init_config(&request).unwrap());
    assert_eq!(docs[1]["networking"]["serviceSubnet"], "fd00:10:96::/108");
}

#[test]
fn invalid_join_input_is_refused_naming_the_field() {
    type Edit = fn(&mut JoinRequest);
    // Malformed endpoints and hashes are refused where the ticket arrives (join client).
    let cases: [(Edit, &str); 3] = [
        (|t| t.ca_cert_hashes.clear(), "expected at least one"),
        (|t| t.node_ip = "224.0.0.1".parse().unwrap(), "node IP"),
        (
            |t| t.ignore_preflight_errors = vec!["all;rm".into()],
            "ignored preflight check",
        ),
    ];
    for (edit, message) in cases {
        let mut ticket = ticket(true);
        edit(&mut ticket);
        let err = join_config(&ticket).unwrap_err().to_string();
        assert!(err.contains(message), "{message}: {err}");
    }
    for endpoint in [
        "[fd00::1]:6443",
        "api.hawser.example:6443",
        "10.0.2.15:6443",
    ] {
        let ticket = JoinRequest {
            api_server_endpoint: endpoint.parse().unwrap(),
            ..ticket(false)
        };
        let docs = documents(&join_config(&ticket).unwrap());
        assert_eq!(
            docs[0]["discovery"]["bootstrapToken"]["apiServerEndpoint"],
            endpoint
        );
    }
}

#[test]
fn the_config_file_is_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeadm.yaml");
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = join_config(&ticket(false)).unwrap();
    write_config(&path, &config).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), config.as_str());
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn v1beta4_needs_no_command_flags_and_is_read_back_from_the_text() {
    let init = init_config(&init_request()).unwrap();
    assert_eq!(init.api(), Some(KubeadmApi::V1beta4));
    for verb in [Verb::Init, Verb::Join] {
        assert!(command_flags(KubeadmApi::V1beta4, verb, None).is_empty());
    }
    let stored = KubeadmConfig::from_stored(Zeroizing::new(init.as_str().to_owned()));
    assert_eq!(stored.api(), Some(KubeadmApi::V1beta4));
    let join = join_config(&ticket(true)).unwrap();
    assert_eq!(join.api(), Some(KubeadmApi::V1beta4));
    // A text hawser did not write names no API: no flags, kubeadm says what is wrong.
    for text in [
        "",
        "{}",
        "{\"apiVersion\": \"kubeadm.k8s.io/v1beta3\"}",
        "not json",
    ] {
        let config = KubeadmConfig::from_stored(Zeroizing::new(text.to_owned()));
        assert_eq!(config.api(), None, "{text}");
    }
}

#[test]
fn versions_without_a_writer_are_refused_by_name() {
    for version in ["v1.30.4", "v1.21.0", "v1.19.16", "v2.0.0"] {
        let request = InitRequest {
            kubernetes_version: version.parse().unwrap(),
            ..init_request()
        };
        let err = init_config(&request).unwrap_err();
        assert!(matches!(err, KubeadmConfigError::NoWriter(_)), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(version), "{message}");
        assert!(
            message.contains("v1.20.x (kubeadm.k8s.io/v1beta2)"),
            "{message}"
        );
        let ticket = JoinRequest {
            kubernetes_version: version.parse().unwrap(),
            ..ticket(false)
        };
        let message = join_config(&ticket).unwrap_err().to_string();
        assert!(message.contains(version), "{message}");
        assert!(message.contains("v1.31.0 or later"), "{message}");
    }
}

/// The v1beta4 text, byte for byte as hawser wrote it before it learnt v1beta2 (the stand-in
/// kubeadm and the QEMU tests read it; reference measurements do not change with it).
#[test]
fn v1beta4_text_is_byte_for_byte_unchanged() {
    let mut text = String::new();
    text.push_str(init_config(&init_request()).unwrap().as_str());
    text.push_str("=====\n");
    text.push_str(join_config(&ticket(true)).unwrap().as_str());
    text.push_str("=====\n");
    let worker = JoinRequest {
        control_plane: None,
        ..ticket(false)
    };
    text.push_str(join_config(&worker).unwrap().as_str());
    assert_eq!(text, include_str!("v1beta4.golden"));
}
