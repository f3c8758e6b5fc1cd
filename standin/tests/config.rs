//! kubeadm configuration decoding and validation: what is accepted, and every refusal reason,
//! each with the document and field it must name.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use hawser_standin::config::{Phase, Problem, parse};

const INIT: &str = r#"apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: abcdef.0123456789abcdef
  ttl: 24h0m0s
  usages: [signing, authentication]
  groups: ["system:bootstrappers:kubeadm:default-node-token"]
nodeRegistration:
  name: node-1
  criSocket: unix:///run/containerd/containerd.sock
  taints:
  - key: node-role.kubernetes.io/control-plane
    effect: NoSchedule
  kubeletExtraArgs:
  - name: node-ip
    value: 10.42.0.1
localAPIEndpoint:
  advertiseAddress: 10.42.0.1
  bindPort: 6443
timeouts:
  controlPlaneComponentHealthCheck: 4m0s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.33.0
controlPlaneEndpoint: 10.42.0.1:6443
clusterName: hawser
networking:
  serviceSubnet: 10.96.0.0/12
  podSubnet: 10.244.0.0/16
  dnsDomain: cluster.local
apiServer:
  certSANs: [10.42.0.1, cp.hawser.internal]
  extraArgs:
  - name: audit-log-maxage
    value: "30"
etcd:
  local:
    dataDir: /var/lib/etcd
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
"#;

/// hawser writes JSON documents; kubeadm reads them as YAML.
const JOIN_JSON: &str = r#"{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
 "nodeRegistration": {"name": "node-2", "taints": null},
 "discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef",
   "apiServerEndpoint": "10.42.0.1:6443",
   "caCertHashes": ["sha256:1e7b760dd1502195b749d8e39fea1452c86c12d03940b34e196dcabe5ee40da1"]}}}
"#;

fn refused(text: &str, phase: Phase) -> Vec<Problem> {
    match parse(text, phase) {
        Ok(_) => panic!("accepted, but should be refused:\n{text}"),
        Err(problems) => problems,
    }
}

/// Asserts exactly one problem, naming `document` (1-based), `field` and containing `message`.
fn assert_one(problems: &[Problem], document: Option<usize>, field: Option<&str>, message: &str) {
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let p = &problems[0];
    assert_eq!(p.document.as_ref().map(|d| d.0), document, "{p}");
    assert_eq!(p.field.as_deref(), field, "{p}");
    assert!(p.message.contains(message), "{p:?} lacks {message:?}");
}

#[test]
fn a_full_init_configuration_is_accepted_and_decoded() {
    let config = parse(INIT, Phase::Init).unwrap_or_else(|p| panic!("{p:#?}"));
    let init = config.init.expect("InitConfiguration");
    assert_eq!(init.node_registration.name, "node-1");
    assert_eq!(init.local_api_endpoint.advertise_address, "10.42.0.1");
    assert_eq!(init.local_api_endpoint.port(), 6443);
    assert_eq!(init.bootstrap_tokens[0].token, "abcdef.0123456789abcdef");
    let cluster = config.cluster.expect("ClusterConfiguration");
    assert_eq!(cluster.kubernetes_version, "v1.33.0");
    assert_eq!(cluster.networking.pod_subnet, "10.244.0.0/16");
    // Passed through untouched.
    assert_eq!(config.kubelet.expect("kubelet")["cgroupDriver"], "systemd");
    assert_eq!(config.kube_proxy.expect("kube-proxy")["mode"], "nftables");
    assert_eq!(config.documents.len(), 4);
}

#[test]
fn json_documents_and_nulls_are_read_as_kubeadm_reads_them() {
    let config = parse(JOIN_JSON, Phase::Join).unwrap_or_else(|p| panic!("{p:#?}"));
    let join = config.join.expect("JoinConfiguration");
    let discovery = join.discovery.bootstrap_token.expect("bootstrapToken");
    assert_eq!(discovery.api_server_endpoint, "10.42.0.1:6443");
    assert!(join.node_registration.taints.is_none());
    assert!(join.control_plane.is_none());
}

#[test]
fn a_bind_port_of_zero_is_defaulted_and_empty_documents_are_skipped() {
    let text = "---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n\
                localAPIEndpoint: {advertiseAddress: 'fd00::1'}\n---\n";
    let config = parse(text, Phase::Init).unwrap_or_else(|p| panic!("{p:#?}"));
    assert_eq!(config.init.unwrap().local_api_endpoint.port(), 6443);
}

#[test]
fn a_control_plane_join_is_accepted_with_its_local_endpoint() {
    let text = JOIN_JSON.replace(
        r#""discovery""#,
        r#""controlPlane": {"localAPIEndpoint": {"advertiseAddress": "10.42.0.2", "bindPort": 6443}},
           "discovery""#,
    );
    let config = parse(&text, Phase::Join).unwrap_or_else(|p| panic!("{p:#?}"));
    let cp = config.join.unwrap().control_plane.expect("controlPlane");
    assert_eq!(cp.local_api_endpoint.advertise_address, "10.42.0.2");
}

#[test]
fn unknown_fields_are_refused_with_their_path() {
    let text = INIT.replace("    effect: NoSchedule", "    efect: NoSchedule");
    let problems = refused(&text, Phase::Init);
    assert_one(
        &problems,
        Some(1),
        Some("nodeRegistration.taints[0].efect"),
        "unknown field `efect`",
    );
    assert_eq!(
        problems[0].document.as_ref().unwrap().1.as_deref(),
        Some("InitConfiguration")
    );

    let text = JOIN_JSON.replace(r#""caCertHashes""#, r#""caCertHash""#);
    assert_one(
        &refused(&text, Phase::Join),
        Some(1),
        Some("discovery.bootstrapToken.caCertHash"),
        "unknown field",
    );
    // A top-level field of v1beta3 that v1beta4 dropped.
    let text = INIT.replace(
        "kind: ClusterConfiguration\n",
        "kind: ClusterConfiguration\nuseHyperKubeImage: true\n",
    );
    assert_one(
        &refused(&text, Phase::Init),
        Some(2),
        Some("useHyperKubeImage"),
        "unknown field",
    );
}

#[test]
fn wrong_types_are_refused_with_their_path() {
    let text = INIT.replace("  bindPort: 6443", "  bindPort: \"6443\"");
    assert_one(
        &refused(&text, Phase::Init),
        Some(1),
        Some("localAPIEndpoint.bindPort"),
        "invalid type",
    );
}

#[test]
fn unknown_kinds_and_api_versions_are_refused() {
    let cases = [
        (
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfig\n",
            Some("kind"),
            "unknown kind \"InitConfig\"",
        ),
        (
            "apiVersion: kubeadm.k8s.io/v1beta3\nkind: InitConfiguration\n",
            Some("apiVersion"),
            "implements kubeadm.k8s.io/v1beta4 only",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\n",
            Some("apiVersion"),
            "unknown apiVersion/kind v1/ConfigMap",
        ),
        ("kind: InitConfiguration\n", Some("apiVersion"), "required"),
        (
            "apiVersion: kubeadm.k8s.io/v1beta4\n",
            Some("kind"),
            "required",
        ),
        (
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ResetConfiguration\n",
            None,
            "another kubeadm command",
        ),
    ];
    for (text, field, message) in cases {
        assert_one(&refused(text, Phase::Init), Some(1), field, message);
    }
}

#[test]
fn kinds_that_do_not_belong_to_the_command_are_refused() {
    assert_one(
        &refused(JOIN_JSON, Phase::Init),
        Some(1),
        None,
        "no effect on kubeadm init",
    );
    let text = format!(
        "{JOIN_JSON}---\napiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
    );
    assert_one(
        &refused(&text, Phase::Join),
        Some(2),
        None,
        "no effect on kubeadm join",
    );
    let cluster_only = INIT.split("---\n").nth(1).unwrap();
    assert_one(
        &refused(cluster_only, Phase::Init),
        None,
        None,
        "no InitConfiguration",
    );
    assert_one(
        &refused("", Phase::Join),
        None,
        None,
        "no JoinConfiguration",
    );
}

#[test]
fn lists_duplicates_and_garbage_are_refused() {
    assert_one(
        &refused(
            "[{\"apiVersion\": \"kubeadm.k8s.io/v1beta4\"}]",
            Phase::Init,
        ),
        Some(1),
        None,
        "is a list",
    );
    let twice = format!("{JOIN_JSON}---\n{JOIN_JSON}");
    assert_one(
        &refused(&twice, Phase::Join),
        Some(2),
        None,
        "appears twice",
    );
    assert_one(
        &refused("a: [unclosed", Phase::Init),
        Some(1),
        None,
        "not valid YAML",
    );
    assert_one(
        &refused("42", Phase::Init),
        Some(1),
        None,
        "not a configuration object",
    );
}

/// Each (replace this, with that) in the init configuration, and the field it must name.
#[test]
fn every_init_field_check_refuses_what_kubeadm_refuses() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "- token: abcdef.0123456789abcdef",
            "- token: ABCDEF.0123456789abcdef",
            "bootstrapTokens[0].token",
            "[a-z0-9]{6}",
        ),
        (
            "  ttl: 24h0m0s",
            "  ttl: one day",
            "bootstrapTokens[0].ttl",
            "not a duration",
        ),
        (
            "usages: [signing, authentication]",
            "usages: [signing, encryption]",
            "bootstrapTokens[0].usages[1]",
            "signing or authentication",
        ),
        (
            "groups: [\"system:bootstrappers:kubeadm:default-node-token\"]",
            "groups: [\"system:masters\"]",
            "bootstrapTokens[0].groups[0]",
            "system:bootstrappers",
        ),
        (
            "  name: node-1",
            "  name: Node_1",
            "nodeRegistration.name",
            "DNS-1123",
        ),
        (
            "criSocket: unix:///run/containerd/containerd.sock",
            "criSocket: /run/containerd/containerd.sock",
            "nodeRegistration.criSocket",
            "unix://",
        ),
        (
            "    effect: NoSchedule",
            "    effect: Never",
            "nodeRegistration.taints[0].effect",
            "NoSchedule, PreferNoSchedule or NoExecute",
        ),
        (
            "  - key: node-role.kubernetes.io/control-plane",
            "  - key: \"\"",
            "nodeRegistration.taints[0].key",
            "qualified name",
        ),
        (
            "  - name: node-ip",
            "  - name: --node-ip",
            "nodeRegistration.kubeletExtraArgs[0].name",
            "without leading dashes",
        ),
        (
            "  advertiseAddress: 10.42.0.1",
            "  advertiseAddress: 10.42.0.300",
            "localAPIEndpoint.advertiseAddress",
            "not a usable IP",
        ),
        (
            "  advertiseAddress: 10.42.0.1",
            "  advertiseAddress: 0.0.0.0",
            "localAPIEndpoint.advertiseAddress",
            "not a usable IP",
        ),
        (
            "  advertiseAddress: 10.42.0.1\n",
            "",
            "localAPIEndpoint.advertiseAddress",
            "required by the stand-in",
        ),
        (
            "  bindPort: 6443",
            "  bindPort: 70000",
            "localAPIEndpoint.bindPort",
            "between 1 and 65535",
        ),
        (
            "  bindPort: 6443",
            "  bindPort: -1",
            "localAPIEndpoint.bindPort",
            "between 1 and 65535",
        ),
        (
            "controlPlaneComponentHealthCheck: 4m0s",
            "controlPlaneComponentHealthCheck: 4 minutes",
            "timeouts.controlPlaneComponentHealthCheck",
            "not a duration",
        ),
        (
            "kubernetesVersion: v1.33.0",
            "kubernetesVersion: stable-1",
            "kubernetesVersion",
            "v1.33.0",
        ),
        (
            "controlPlaneEndpoint: 10.42.0.1:6443",
            "controlPlaneEndpoint: 10.42.0.1:99999",
            "controlPlaneEndpoint",
            "port number",
        ),
        (
            "controlPlaneEndpoint: 10.42.0.1:6443",
            "controlPlaneEndpoint: cp_1:6443",
            "controlPlaneEndpoint",
            "DNS-1123",
        ),
        (
            "serviceSubnet: 10.96.0.0/12",
            "serviceSubnet: 10.96.0.0/40",
            "networking.serviceSubnet",
            "not a CIDR",
        ),
        (
            "podSubnet: 10.244.0.0/16",
            "podSubnet: 10.244.0.0",
            "networking.podSubnet",
            "not a CIDR",
        ),
        (
            "podSubnet: 10.244.0.0/16",
            "podSubnet: 10.244.0.0/16,10.245.0.0/16",
            "networking.podSubnet",
            "one IPv4 and one IPv6",
        ),
        (
            "dnsDomain: cluster.local",
            "dnsDomain: Cluster_Local",
            "networking.dnsDomain",
            "DNS-1123",
        ),
        (
            "certSANs: [10.42.0.1, cp.hawser.internal]",
            "certSANs: [10.42.0.1, \"cp hawser\"]",
            "apiServer.certSANs[1]",
            "neither an IP",
        ),
        (
            "  - name: audit-log-maxage",
            "  - name: \"\"",
            "apiServer.extraArgs[0].name",
            "required",
        ),
        (
            "    dataDir: /var/lib/etcd",
            "    dataDir: /var/lib/etcd\n  external:\n    endpoints: [https://10.0.0.1:2379]",
            "etcd",
            "mutually exclusive",
        ),
    ];
    for (from, to, field, message) in cases {
        assert!(INIT.contains(from), "the base config lacks {from:?}");
        let text = INIT.replacen(from, to, 1);
        let problems = refused(&text, Phase::Init);
        assert_eq!(problems.len(), 1, "{from:?} -> {to:?}: {problems:#?}");
        assert_eq!(
            problems[0].field.as_deref(),
            Some(*field),
            "{from:?} -> {to:?}: {}",
            problems[0]
        );
        assert!(
            problems[0].message.contains(message),
            "{from:?} -> {to:?}: {} lacks {message:?}",
            problems[0]
        );
    }
}

#[test]
fn every_join_field_check_refuses_what_kubeadm_refuses() {
    let hash = "sha256:1e7b760dd1502195b749d8e39fea1452c86c12d03940b34e196dcabe5ee40da1";
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "\"token\": \"abcdef.0123456789abcdef\"",
            "\"token\": \"abcdef\"",
            "discovery.bootstrapToken.token",
            "[a-z0-9]{6}",
        ),
        (
            "\"apiServerEndpoint\": \"10.42.0.1:6443\",",
            "",
            "discovery.bootstrapToken.apiServerEndpoint",
            "required",
        ),
        (
            "\"apiServerEndpoint\": \"10.42.0.1:6443\"",
            "\"apiServerEndpoint\": \"10.42.0.1\"",
            "discovery.bootstrapToken.apiServerEndpoint",
            "host:port",
        ),
        (
            hash,
            "sha256:xyz",
            "discovery.bootstrapToken.caCertHashes[0]",
            "sha256:<64 hex digits>",
        ),
        (
            &format!("\"caCertHashes\": [\"{hash}\"]"),
            "\"caCertHashes\": []",
            "discovery.bootstrapToken",
            "unsafeSkipCAVerification",
        ),
        (
            "\"name\": \"node-2\"",
            "\"name\": \"node 2\"",
            "nodeRegistration.name",
            "DNS-1123",
        ),
        (
            "\"discovery\": {",
            "\"caCertPath\": \"ca.crt\", \"discovery\": {",
            "caCertPath",
            "absolute",
        ),
        (
            "\"discovery\": {",
            "\"controlPlane\": {\"localAPIEndpoint\": {\"bindPort\": 6443}}, \"discovery\": {",
            "controlPlane.localAPIEndpoint.advertiseAddress",
            "required",
        ),
        (
            "\"discovery\": {",
            "\"controlPlane\": {\"localAPIEndpoint\": {\"advertiseAddress\": \"10.0.0.2\"}, \"certificateKey\": \"abc\"}, \"discovery\": {",
            "controlPlane.certificateKey",
            "64 hex",
        ),
        (
            "\"discovery\": {",
            "\"discovery\": {\"tlsBootstrapToken\": \"nope\", ",
            "discovery.tlsBootstrapToken",
            "[a-z0-9]{6}",
        ),
        (
            "\"discovery\": {\"bootstrapToken\"",
            "\"discovery\": {\"file\": {\"kubeConfigPath\": \"/x\"}, \"bootstrapToken\"",
            "discovery",
            "mutually exclusive",
        ),
    ];
    for (from, to, field, message) in cases {
        assert!(JOIN_JSON.contains(from), "the base config lacks {from:?}");
        let text = JOIN_JSON.replacen(from, to, 1);
        let problems = refused(&text, Phase::Join);
        assert_eq!(problems.len(), 1, "{from:?} -> {to:?}: {problems:#?}");
        assert_eq!(
            problems[0].field.as_deref(),
            Some(*field),
            "{from:?} -> {to:?}: {}",
            problems[0]
        );
        assert!(
            problems[0].message.contains(message),
            "{from:?} -> {to:?}: {} lacks {message:?}",
            problems[0]
        );
    }
    // Skipping CA verification is allowed when asked for explicitly, as in kubeadm.
    let text = JOIN_JSON.replace(
        &format!("\"caCertHashes\": [\"{hash}\"]"),
        "\"unsafeSkipCAVerification\": true",
    );
    parse(&text, Phase::Join).unwrap_or_else(|p| panic!("{p:#?}"));
    // File discovery is kubeadm's, but not the stand-in's.
    let text = r#"{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
                   "discovery": {"file": {"kubeConfigPath": "/etc/kubernetes/discovery.conf"}}}"#;
    assert_one(
        &refused(text, Phase::Join),
        Some(1),
        Some("discovery.file"),
        "bootstrap-token discovery only",
    );
}

#[test]
fn all_problems_are_reported_at_once_and_read_as_sentences() {
    let text = INIT
        .replace(
            "  bindPort: 6443",
            "  bindPort: 0\n  advertiseAddress: nope",
        )
        .replacen("  advertiseAddress: 10.42.0.1\n", "", 1)
        .replace("kubernetesVersion: v1.33.0", "kubernetesVersion: latest");
    let problems = refused(&text, Phase::Init);
    let rendered: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        [
            "document 1 (InitConfiguration): localAPIEndpoint.advertiseAddress: \"nope\" is not a usable IP address",
            "document 2 (ClusterConfiguration): kubernetesVersion: \"latest\" is not a version such as v1.33.0 (the stand-in resolves no labels like \"stable\")",
        ]
    );
}

/// The shape hawser's PID 1 writes (init/src/kubeadm.rs): pretty-printed JSON documents in a
/// `---` stream. Kept here as text so a change on either side shows up as a failing test.
#[test]
fn the_configurations_hawser_writes_are_accepted() {
    let init = r#"{
  "apiVersion": "kubeadm.k8s.io/v1beta4",
  "kind": "InitConfiguration",
  "bootstrapTokens": [
    {
      "token": "abcdef.0123456789abcdef",
      "description": "created by hawser at kubeadm init",
      "ttl": "3600s",
      "usages": ["signing", "authentication"],
      "groups": ["system:bootstrappers:kubeadm:default-node-token"]
    }
  ],
  "nodeRegistration": {
    "name": "node-1",
    "criSocket": "unix:///run/containerd/containerd.sock",
    "kubeletExtraArgs": [{"name": "node-ip", "value": "fd00::15"}],
    "ignorePreflightErrors": ["SystemVerification"]
  },
  "localAPIEndpoint": {"advertiseAddress": "fd00::15", "bindPort": 6443}
}
---
{
  "apiVersion": "kubeadm.k8s.io/v1beta4",
  "kind": "ClusterConfiguration",
  "clusterName": "hawser",
  "kubernetesVersion": "v1.31.2",
  "controlPlaneEndpoint": "[fd00::15]:6443",
  "networking": {"serviceSubnet": "10.96.0.0/12", "podSubnet": "10.244.0.0/16"},
  "apiServer": {"certSANs": ["10.0.2.100", "api.hawser.example"]}
}
---
{
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "kind": "KubeletConfiguration",
  "cgroupDriver": "cgroupfs"
}
"#;
    parse(init, Phase::Init).unwrap_or_else(|p| panic!("{p:#?}"));
    let join = r#"{
  "apiVersion": "kubeadm.k8s.io/v1beta4",
  "kind": "JoinConfiguration",
  "discovery": {"bootstrapToken": {
    "token": "abcdef.0123456789abcdef",
    "apiServerEndpoint": "10.0.2.15:6443",
    "caCertHashes": ["sha256:1e7b760dd1502195b749d8e39fea1452c86c12d03940b34e196dcabe5ee40da1"]
  }},
  "nodeRegistration": {
    "name": "node-2",
    "criSocket": "unix:///run/containerd/containerd.sock",
    "kubeletExtraArgs": [{"name": "node-ip", "value": "10.0.2.16"}]
  },
  "controlPlane": {
    "localAPIEndpoint": {"advertiseAddress": "10.0.2.16", "bindPort": 6443},
    "certificateKey": "abababababababababababababababababababababababababababababababab"
  }
}
"#;
    parse(join, Phase::Join).unwrap_or_else(|p| panic!("{p:#?}"));
}
