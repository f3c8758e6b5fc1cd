//! The `kubeadm` stand-in binary, run as hawser runs it, under a temporary root.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use hawser_joinservice::tokens::{BootstrapTokenIssuer, KubeadmTokenIssuer};
use hawser_standin::pki;
use serde_json::Value;

const KUBEADM: &str = env!("CARGO_BIN_EXE_kubeadm");
const LABEL: &str = "kubeadm STAND-IN (not Kubernetes)";

const INIT: &str = r#"{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
 "bootstrapTokens": [{"token": "abcdef.0123456789abcdef", "ttl": "1h"}],
 "nodeRegistration": {"name": "node-1", "criSocket": "unix:///run/containerd/containerd.sock",
   "kubeletExtraArgs": [{"name": "node-ip", "value": "10.42.0.1"}]},
 "localAPIEndpoint": {"advertiseAddress": "10.42.0.1", "bindPort": 6443}}
---
{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
 "kubernetesVersion": "v1.33.0", "networking": {"podSubnet": "10.244.0.0/16"}}
---
{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
 "cgroupDriver": "systemd"}
"#;

const JOIN: &str = r#"{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
 "nodeRegistration": {"name": "node-2"},
 "discovery": {"bootstrapToken": {"token": "abcdef.0123456789abcdef",
   "apiServerEndpoint": "10.42.0.1:6443",
   "caCertHashes": ["sha256:1e7b760dd1502195b749d8e39fea1452c86c12d03940b34e196dcabe5ee40da1"]}}}
"#;

struct Node {
    root: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path(rel);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn kubeadm(&self, args: &[&str]) -> Output {
        Command::new(KUBEADM)
            .args(args)
            .env("HAWSER_STANDIN_ROOT", self.root.path())
            .output()
            .unwrap()
    }

    fn records(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.path("var/log/hawser-standin/kubeadm.jsonl")).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every line either command prints names the stand-in.
fn assert_labelled(o: &Output) {
    for line in stdout(o).lines().chain(stderr(o).lines()) {
        assert!(line.contains(LABEL), "unlabelled output line: {line:?}");
    }
}

fn kubeconfig(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.starts_with(pki::KUBECONFIG_HEADER), "{text}");
    serde_norway::from_str(&text).unwrap()
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_writes_what_hawser_reads_after_kubeadm_init() {
    let node = Node::new();
    let config = node.write("init.yaml", INIT);
    let out = node.kubeadm(&["init", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_labelled(&out);
    assert!(
        stdout(&out).contains("would run init for node node-1: API server https://10.42.0.1:6443"),
        "{}",
        stdout(&out)
    );

    // A real CA, labelled as the stand-in's.
    let ca_pem = std::fs::read_to_string(node.path("etc/kubernetes/pki/ca.crt")).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
    let ca = pem.parse_x509().unwrap();
    assert!(ca.is_ca());
    assert!(
        ca.subject()
            .to_string()
            .contains("hawser kubeadm stand-in CA"),
        "{}",
        ca.subject()
    );
    assert_eq!(mode(&node.path("etc/kubernetes/pki/ca.key")), 0o600);
    // The key material other control-plane nodes share (handed out by hawser-joind).
    for name in pki::SHARED_CONTROL_PLANE_FILES {
        let path = node.path(&format!("etc/kubernetes/pki/{name}"));
        let expected = if name.ends_with(".key") { 0o600 } else { 0o644 };
        assert_eq!(mode(&path), expected, "{name}");
    }

    // admin.conf: a standin-named cluster at the advertised endpoint, its CA, a client
    // certificate the CA signed.
    let admin = kubeconfig(&node.path("etc/kubernetes/admin.conf"));
    assert_eq!(mode(&node.path("etc/kubernetes/admin.conf")), 0o600);
    let cluster = &admin["clusters"][0];
    assert!(cluster["name"].as_str().unwrap().contains("standin"));
    assert_eq!(cluster["cluster"]["server"], "https://10.42.0.1:6443");
    let info = pki::read_cluster_info(&node.path("etc/kubernetes/admin.conf")).unwrap();
    assert_eq!(info.ca_pem.as_deref(), Some(ca_pem.as_str()));
    assert!(
        admin["users"][0]["name"]
            .as_str()
            .unwrap()
            .contains("standin")
    );
    assert!(
        admin["current-context"]
            .as_str()
            .unwrap()
            .contains("standin")
    );
    let client_pem = base64_decode(
        admin["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .unwrap(),
    );
    let (_, client) = x509_parser::pem::parse_x509_pem(client_pem.as_bytes()).unwrap();
    let client = client.parse_x509().unwrap();
    client
        .verify_signature(Some(ca.public_key()))
        .expect("admin.conf's certificate is signed by the stand-in CA");

    let kubelet = kubeconfig(&node.path("etc/kubernetes/kubelet.conf"));
    assert!(
        kubelet["users"][0]["name"]
            .as_str()
            .unwrap()
            .contains("standin")
    );

    // The kubelet's files, as kubeadm writes them: the KubeletConfiguration passed through,
    // the CRI socket and extra args as flags.
    let kubelet_config: Value = serde_norway::from_str(
        &std::fs::read_to_string(node.path("var/lib/kubelet/config.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(kubelet_config["kind"], "KubeletConfiguration");
    assert_eq!(kubelet_config["cgroupDriver"], "systemd");
    assert_eq!(
        std::fs::read_to_string(node.path("var/lib/kubelet/kubeadm-flags.env")).unwrap(),
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=10.42.0.1\"\n"
    );

    // The record: the call and the parsed config, without the token's secret.
    let records = node.records();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["subcommand"], "init");
    assert_eq!(r["node"], "node-1");
    assert_eq!(r["config"][0]["kind"], "InitConfiguration");
    assert_eq!(r["config"][1]["kubernetesVersion"], "v1.33.0");
    assert_eq!(
        r["ca_cert_hash"].as_str().unwrap(),
        pki::ca_cert_hash(&ca_pem).unwrap()
    );
    let raw = std::fs::read_to_string(node.path("var/log/hawser-standin/kubeadm.jsonl")).unwrap();
    assert!(
        !raw.contains("0123456789abcdef"),
        "the record leaks the token: {raw}"
    );
    assert!(raw.contains("abcdef.<redacted>"));

    // A second init reuses the CA, as kubeadm does.
    let again = node.kubeadm(&["init", "--config", config.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains("(reused)"), "{}", stdout(&again));
    assert_eq!(
        std::fs::read_to_string(node.path("etc/kubernetes/pki/ca.crt")).unwrap(),
        ca_pem
    );
}

fn base64_decode(s: &str) -> String {
    use base64::Engine as _;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
}

#[test]
fn an_invalid_configuration_fails_naming_file_document_field_and_problem() {
    let node = Node::new();
    let config = node.write(
        "init.yaml",
        &INIT.replace(
            "\"bindPort\": 6443",
            "\"bindPort\": 6443, \"bindAddress\": \"x\"",
        ),
    );
    let out = node.kubeadm(&["init", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_labelled(&out);
    let err = stderr(&out);
    assert!(err.contains("init.yaml is invalid"), "{err}");
    assert!(
        err.contains("document 1 (InitConfiguration): localAPIEndpoint.bindAddress: strict decoding error: unknown field `bindAddress`"),
        "{err}"
    );
    // Nothing was written, nothing recorded.
    assert!(!node.path("etc/kubernetes").exists());
    assert!(!node.path("var/log/hawser-standin/kubeadm.jsonl").exists());

    let missing = node.kubeadm(&["init", "--config", "/nonexistent/init.yaml"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("cannot read the kubeadm configuration /nonexistent/init.yaml")
    );
}

#[test]
fn usage_errors_exit_64() {
    let node = Node::new();
    for args in [
        &["init"][..],
        &["init", "--config"],
        &["init", "--config", "x", "--pod-network-cidr", "10.0.0.0/8"],
        &["join", "10.0.0.1:6443", "--config", "x"],
        &["reset", "-f", "now"],
        &["token", "list"],
        &[],
    ] {
        let out = node.kubeadm(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert_labelled(&out);
        assert!(stderr(&out).contains("usage:"), "{args:?}");
    }
}

#[test]
fn join_writes_the_kubelet_kubeconfig_and_records_the_call() {
    let node = Node::new();
    // Discovery reaches the API server endpoint: a listener on loopback stands in for it.
    let api_server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = api_server.local_addr().unwrap().to_string();
    let join = JOIN.replace("10.42.0.1:6443", &endpoint);
    let config = node.write("join.json", &join);
    let out = node.kubeadm(&["join", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_labelled(&out);
    assert!(
        stdout(&out).contains(&format!(
            "would run join for node node-2 as a worker via API server https://{endpoint}"
        )),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(&format!(
            "discovery: reached the API server endpoint {endpoint}"
        )),
        "{}",
        stdout(&out)
    );
    let kubelet = kubeconfig(&node.path("etc/kubernetes/kubelet.conf"));
    assert_eq!(mode(&node.path("etc/kubernetes/kubelet.conf")), 0o600);
    assert_eq!(kubelet["clusters"][0]["name"], "hawser-standin");
    assert_eq!(
        kubelet["clusters"][0]["cluster"]["server"],
        format!("https://{endpoint}").as_str()
    );
    assert!(node.path("var/lib/kubelet/config.yaml").is_file());
    let r = &node.records()[0];
    assert_eq!(r["subcommand"], "join");
    assert_eq!(r["role"], "worker");
    assert_eq!(
        r["config"][0]["discovery"]["bootstrapToken"]["token"],
        "abcdef.<redacted>"
    );

    let cp = node.write(
        "cp.json",
        &join.replace(
            "\"discovery\"",
            "\"controlPlane\": {\"localAPIEndpoint\": {\"advertiseAddress\": \"10.42.0.2\"}}, \"discovery\"",
        ),
    );
    // Without a certificate key the shared certificates must be in place, as for kubeadm.
    let out = node.kubeadm(&["join", "--config", cp.to_str().unwrap(), "--v=5"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("missing ca.crt, ca.key, sa.key, sa.pub, front-proxy-ca.crt"),
        "{}",
        stderr(&out)
    );
    let pki_dir = node.path("etc/kubernetes/pki");
    let (ca, _) = pki::Ca::load_or_create(&pki_dir).unwrap();
    let shared = pki::create_shared_control_plane_files(&pki_dir).unwrap();
    assert_eq!(shared.len(), pki::SHARED_CONTROL_PLANE_FILES.len());
    assert_eq!(mode(&pki_dir.join("sa.key")), 0o600);
    // A dry run: a real one adds the node to the etcd cluster at 10.42.0.1 (tests/etcd.rs).
    let out = node.kubeadm(&[
        "join",
        "--config",
        cp.to_str().unwrap(),
        "--v=5",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("as a control-plane node"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(&ca.cert_hash().unwrap()),
        "{}",
        stdout(&out)
    );
}

#[test]
fn dry_runs_write_nothing_but_are_recorded() {
    let node = Node::new();
    let config = node.write("init.yaml", INIT);
    let out = node.kubeadm(&["init", "--config", config.to_str().unwrap(), "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("dry run: no files written"));
    assert!(!node.path("etc/kubernetes").exists());
    assert_eq!(node.records()[0]["dry_run"], true);
}

#[test]
fn token_create_prints_a_join_command_joinservice_accepts() {
    let node = Node::new();
    let config = node.write("init.yaml", INIT);
    assert!(
        node.kubeadm(&["init", "--config", config.to_str().unwrap()])
            .status
            .success()
    );
    let admin = node.path("etc/kubernetes/admin.conf");
    let ca_pem = std::fs::read_to_string(node.path("etc/kubernetes/pki/ca.crt")).unwrap();

    let out = node.kubeadm(&[
        "token",
        "create",
        "--kubeconfig",
        admin.to_str().unwrap(),
        "--ttl",
        "1h0m0s",
        "--print-join-command",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_labelled(&out);
    let line = stdout(&out);
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..3], ["kubeadm", "join", "10.42.0.1:6443"], "{line}");
    assert_eq!(words[3], "--token");
    assert!(
        hawser_standin::validate::is_bootstrap_token(words[4]),
        "{line}"
    );
    assert_eq!(words[5], "--discovery-token-ca-cert-hash");
    // The pin is the real one of the CA init wrote.
    assert_eq!(words[6], pki::ca_cert_hash(&ca_pem).unwrap());
    // Fresh tokens each time.
    let again = node.kubeadm(&[
        "token",
        "create",
        "--print-join-command",
        "--kubeconfig",
        admin.to_str().unwrap(),
    ]);
    assert_ne!(stdout(&again), line);

    // joinservice's real issuer, pointed at the stand-in, gets usable credentials. (A wrapper
    // keeps the stand-in's record under the test root.)
    let wrapper = node.write(
        "kubeadm-wrapper",
        &format!(
            "#!/bin/sh\nHAWSER_STANDIN_ROOT={} exec {KUBEADM} \"$@\"\n",
            node.root.path().display()
        ),
    );
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let issuer = KubeadmTokenIssuer {
        kubeadm: wrapper.clone(),
        kubeconfig: admin.clone(),
    };
    let creds = issuer.issue(Duration::from_secs(600)).unwrap();
    // Compared as text: the stand-in's pin, computed by its own code, is the one hawser parsed.
    assert_eq!(creds.api_server_endpoint.to_string(), "10.42.0.1:6443");
    assert_eq!(
        creds
            .discovery_ca_cert_hashes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [pki::ca_cert_hash(&ca_pem).unwrap()]
    );
    // ...and refuses, as with kubeadm, when the kubeconfig is missing.
    let missing = KubeadmTokenIssuer {
        kubeadm: wrapper,
        kubeconfig: node.path("nope.conf"),
    };
    let err = missing
        .issue(Duration::from_secs(600))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope.conf"), "{err}");

    // Without --print-join-command: the bare token, as kubeadm prints it.
    let out = node.kubeadm(&[
        "token",
        "create",
        "abcdef.0123456789abcdef",
        "--kubeconfig",
        admin.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "abcdef.0123456789abcdef\n");
    assert!(stderr(&out).contains(LABEL));

    let records = node.records();
    let tokens: Vec<&Value> = records
        .iter()
        .filter(|r| r["subcommand"] == "token create")
        .collect();
    assert_eq!(tokens.len(), 4);
    assert_eq!(tokens[0]["ttl"], "1h0m0s");
    assert_eq!(tokens[2]["ttl"], "600s");
    let raw = std::fs::read_to_string(node.path("var/log/hawser-standin/kubeadm.jsonl")).unwrap();
    assert!(!raw.contains(words[4]), "the record leaks a token");

    // A malformed ttl or token is refused.
    let bad_ttl = node.kubeadm(&[
        "token",
        "create",
        "--ttl",
        "forever",
        "--kubeconfig",
        admin.to_str().unwrap(),
    ]);
    assert_eq!(bad_ttl.status.code(), Some(64));
    assert!(stderr(&bad_ttl).contains("--ttl"));
    let bad_token = node.kubeadm(&[
        "token",
        "create",
        "ABC.def",
        "--kubeconfig",
        admin.to_str().unwrap(),
    ]);
    assert_eq!(bad_token.status.code(), Some(1));
}

#[test]
fn version_says_what_it_is() {
    let node = Node::new();
    let out = node.kubeadm(&["version"]);
    assert!(out.status.success());
    assert_labelled(&out);
    assert!(stdout(&out).contains("runs no Kubernetes component"));
}

#[test]
fn join_discovery_fails_naming_an_endpoint_nothing_listens_at() {
    let node = Node::new();
    // A port that was just free on loopback: nothing listens there.
    let endpoint = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let join = JOIN.replace("10.42.0.1:6443", &endpoint).replace(
        "\"discovery\"",
        "\"timeouts\": {\"discovery\": \"2s\"}, \"discovery\"",
    );
    let config = node.write("join.json", &join);
    let started = std::time::Instant::now();
    let out = node.kubeadm(&["join", "--config", config.to_str().unwrap()]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_labelled(&out);
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "discovery: waiting for the API server endpoint {endpoint}"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "error: discovery: could not reach the API server endpoint {endpoint} within 2 s: "
        )),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // Nothing written, nothing recorded: the join did not happen.
    assert!(!node.path("etc/kubernetes/kubelet.conf").exists());
    assert!(!node.path("var/log/hawser-standin/kubeadm.jsonl").exists());
}

#[test]
fn reset_removes_what_init_wrote_and_is_recorded() {
    let node = Node::new();
    let config = node.write("init.json", INIT);
    let out = node.kubeadm(&["init", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        node.path("etc/kubernetes/manifests/kube-apiserver.yaml")
            .is_file()
    );
    let env = hawser_standin::StandinEnv {
        root: node.root.path().to_owned(),
        hostname: "node-1".into(),
    };
    // The kubelet stand-in opens the API server's port on a control plane.
    assert_eq!(hawser_standin::kubelet::api_server_port(&env), Some(6443));
    let out = node.kubeadm(&["reset"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("without --force (-f)"),
        "{}",
        stderr(&out)
    );
    assert!(node.path("etc/kubernetes/admin.conf").exists());

    let out = node.kubeadm(&["reset", "-f"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_labelled(&out);
    for gone in [
        "etc/kubernetes/admin.conf",
        "etc/kubernetes/kubelet.conf",
        "etc/kubernetes/pki",
        "etc/kubernetes/manifests",
        "var/lib/kubelet/config.yaml",
        "var/lib/kubelet/kubeadm-flags.env",
    ] {
        assert!(!node.path(gone).exists(), "{gone} is left");
        assert!(
            stdout(&out).contains(&format!("removed {}", node.path(gone).display())),
            "{}",
            stdout(&out)
        );
    }
    assert_eq!(hawser_standin::kubelet::api_server_port(&env), None);
    let records = node.records();
    assert_eq!(records.last().unwrap()["subcommand"], "reset");
    // Init runs again on the cleaned node, with a new CA.
    let out = node.kubeadm(&["init", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("(new)"), "{}", stdout(&out));
    let out = node.kubeadm(&["reset", "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = node.kubeadm(&["reset", "-f"]);
    assert!(
        stdout(&out).contains("nothing to remove"),
        "{}",
        stdout(&out)
    );
}
