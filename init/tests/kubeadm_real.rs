//! Real kubeadm 1.20.2 reads every kubeadm configuration hawser writes for Kubernetes 1.20.
//!
//! The unit tests (`src/kube/kubeadm/`) pin the documents' shape and the stand-in kubeadm
//! (`standin/`) checks them with its own rules; this is the first opinion: kubeadm itself,
//! the binary the node image carries, taken from `HAWSER_KUBEADM` (made by `hawser image
//! kubernetes --only kubeadm`; the test fails, naming that command, when it is unset).
//!
//! For each configuration PID 1 writes (`kube::grants`: `kubeadm init`, a worker's and a
//! control plane's `kubeadm join`, each with the node's LAN address and with its mesh address;
//! and with the optional token and certificate key the writer supports), kubeadm decodes,
//! defaults and validates it without a cluster and without touching this host's
//! `/etc/kubernetes`: every command runs with `--rootfs DIR`, which chroots kubeadm (static)
//! into a fresh directory holding only the configuration.
//!
//! - init: `kubeadm init phase certs all`, `kubeconfig all`, `control-plane all`, `etcd local`,
//!   `kubelet-start`: the PKI, the kubeconfigs, the static Pod manifests and the kubelet's
//!   configuration are written, and carry the node's address, name and cgroup driver; then
//!   PID 1's own command line, `kubeadm init --config … --skip-phases=preflight`, with
//!   `--dry-run`;
//! - with the images of a real-Kubernetes image (`kube::kubeadm::images`): `kubeadm config
//!   images list` names exactly the images the image's archive carries, but CoreDNS, whose
//!   addon phase PID 1's command line skips; the manifests of `init phase control-plane all`
//!   and `etcd local` name those images, and the kubelet's flags the pause image;
//! - joins (and init again): `kubeadm config migrate --old-config`, which in 1.20 decodes each
//!   document, applies the dynamic defaults and runs kubeadm's validation
//!   (`documentMapToInitConfiguration` / `documentMapToJoinConfiguration`), as `kubeadm join
//!   --config` does before its discovery.
//!
//! kubeadm 1.20 only *warns* about unknown fields ("error unmarshaling configuration …",
//! `strict.VerifyUnmarshalStrict`): such a warning counts as a refusal here. Broken
//! configurations (a misspelled field, a malformed CA pin, an address that is none, the
//! `v1beta4` hawser writes for 1.31, a malformed token or endpoint, a node name or address that
//! is none) are refused by the same commands, so the test can fail. kubeadm 1.20 checks the CA
//! pins' and the certificate key's format only when it uses them (discovery, the certificate
//! download): hawser's own types check those (`hawser-kube-types`, `kube::kubeadm`).
//!
//! `#[ignore]`d in plain `cargo test`: it needs the real kubeadm binary (and root, for chroot).
//! Run by `scripts/test`'s "real kubeadm" stage, after `hawser image kubernetes --only
//! kubeadm`, as `HAWSER_KUBEADM=<path> cargo test -p hawser-init --test kubeadm_real --
//! --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hawser_init::kube::kubeadm::{
    CertificateKey, ControlPlaneJoin, InitBootstrapToken, InitRequest, JoinRequest, KubeadmConfig,
    Verb, command_flags, init_config, join_config, with_images,
};
use hawser_kube_types::{ImageSet, KubeadmApi};

/// The version kubeadm must be: what the image builds from Debian's source.
const KUBEADM_VERSION: &str = "v1.20.2";
const TOKEN: &str = "abcdef.0123456789abcdef";
const HASH: &str = "sha256:1234567890abcdef1234567890abcdef1234567890abcdef1234567890abcdef";
/// The first node's address on the LAN (QEMU's user network) and in the mesh.
const LAN_IP: &str = "10.0.2.15";
const MESH_IP: &str = "10.99.0.1";
/// The joining node's.
const LAN_JOIN_IP: &str = "10.0.2.16";
const MESH_JOIN_IP: &str = "10.99.0.2";

/// The kubeadm under test, from `HAWSER_KUBEADM`; fails the test naming how to get it.
fn kubeadm() -> PathBuf {
    let Some(path) = std::env::var_os("HAWSER_KUBEADM") else {
        panic!(
            "HAWSER_KUBEADM is not set: this test needs the real kubeadm {KUBEADM_VERSION}; \
             build it with `hawser image kubernetes --only kubeadm` and set HAWSER_KUBEADM to \
             the path it prints"
        );
    };
    let path = PathBuf::from(path);
    let out = Command::new(&path)
        .args(["version", "-o", "short"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run HAWSER_KUBEADM={}: {e}", path.display()));
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(
        version,
        KUBEADM_VERSION,
        "HAWSER_KUBEADM={} is kubeadm {version:?}, not {KUBEADM_VERSION}",
        path.display()
    );
    assert!(
        nix::unistd::geteuid().is_root(),
        "kubeadm --rootfs chroots: run this test as root"
    );
    path
}

/// What one kubeadm command said.
struct Outcome {
    accepted: bool,
    output: String,
}

/// A fresh chroot for kubeadm holding only `/kubeadm.yaml`.
struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    fn with(config: &str) -> Root {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kubeadm.yaml"), config).unwrap();
        Root { dir }
    }

    fn path(&self, inside: &str) -> PathBuf {
        self.dir.path().join(inside.trim_start_matches('/'))
    }

    fn read(&self, inside: &str) -> String {
        std::fs::read_to_string(self.path(inside))
            .unwrap_or_else(|e| panic!("kubeadm did not write {inside}: {e}"))
    }

    /// `kubeadm ARGS --rootfs DIR`: accepted when it exits 0 and did not warn about a field
    /// it could not decode.
    fn run(&self, kubeadm: &Path, args: &[&str]) -> Outcome {
        let started = Instant::now();
        let out = Command::new(kubeadm)
            .args(args)
            .arg("--rootfs")
            .arg(self.dir.path())
            .output()
            .unwrap();
        let output = format!(
            "kubeadm {} ({:.1} s, {}):\n{}{}",
            args.join(" "),
            started.elapsed().as_secs_f64(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // kubeadm 1.20's strict decoding only warns: a field it does not know, or a
        // document of a kind or version it does not know.
        let strict_warning = output.contains("error unmarshaling configuration")
            || output.contains("unknown configuration schema");
        Outcome {
            accepted: out.status.success() && !strict_warning,
            output,
        }
    }

    fn accepts(&self, kubeadm: &Path, args: &[&str]) {
        let outcome = self.run(kubeadm, args);
        assert!(outcome.accepted, "refused: {}", outcome.output);
        eprintln!("{}", outcome.output.lines().next().unwrap());
    }
}

const MIGRATE: [&str; 6] = [
    "config",
    "migrate",
    "--old-config",
    "/kubeadm.yaml",
    "--new-config",
    "/migrated.yaml",
];

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// `hawser init`'s configuration as `kube::grants` renders it (no token, no pod CIDR), or
/// with the writer's optional bootstrap token.
fn init_request(node_ip: &str, token: bool) -> InitRequest {
    InitRequest {
        cluster_name: "hawser".into(),
        kubernetes_version: KUBEADM_VERSION.parse().unwrap(),
        service_cidr: "10.96.0.0/12".parse().unwrap(),
        pod_cidr: token.then(|| "10.244.0.0/16".parse().unwrap()),
        control_plane_endpoint: token.then(|| "api.hawser.example:6443".parse().unwrap()),
        cert_sans: vec!["10.0.2.100".into(), "api.hawser.example".into()],
        node_name: "hawser-0f1e2d3c".into(),
        node_ip: ip(node_ip),
        bootstrap_token: token.then(|| InitBootstrapToken {
            token: TOKEN.parse().unwrap(),
            ttl: Duration::from_secs(3600),
        }),
        ignore_preflight_errors: Vec::new(),
    }
}

/// A join ticket's configuration as `kube::grants` renders it (a control plane gets the shared
/// files, no certificate key), or with the writer's optional certificate key.
fn join_request(node_ip: &str, control_plane: bool, certificate_key: bool) -> JoinRequest {
    JoinRequest {
        kubernetes_version: KUBEADM_VERSION.parse().unwrap(),
        api_server_endpoint: format!("{MESH_IP}:6443").parse().unwrap(),
        token: TOKEN.parse().unwrap(),
        ca_cert_hashes: vec![HASH.parse().unwrap()],
        node_name: "hawser-4b5a6978".into(),
        node_ip: ip(node_ip),
        control_plane: control_plane.then(|| ControlPlaneJoin {
            certificate_key: certificate_key
                .then(|| CertificateKey::parse(&"ab".repeat(32)).unwrap()),
        }),
        ignore_preflight_errors: Vec::new(),
    }
}

fn v1beta2(config: KubeadmConfig) -> String {
    assert_eq!(config.api(), Some(KubeadmApi::V1beta2));
    config.as_str().to_owned()
}

/// kubeadm init's phases on hawser's configuration, in a chroot: what they write carries the
/// node's address and name.
fn init_phases(kubeadm: &Path, config: &str, node_ip: &str, node_name: &str) {
    let root = Root::with(config);
    for phase in [
        &["certs", "all"][..],
        &["kubeconfig", "all"],
        &["control-plane", "all"],
        &["etcd", "local"],
        &["kubelet-start"],
    ] {
        let mut args = vec!["init", "phase"];
        args.extend_from_slice(phase);
        args.extend_from_slice(&["--config", "/kubeadm.yaml"]);
        root.accepts(kubeadm, &args);
    }
    let apiserver = root.read("/etc/kubernetes/manifests/kube-apiserver.yaml");
    assert!(
        apiserver.contains(&format!("--advertise-address={node_ip}")),
        "{apiserver}"
    );
    assert!(apiserver.contains("--service-cluster-ip-range=10.96.0.0/12"));
    let etcd = root.read("/etc/kubernetes/manifests/etcd.yaml");
    assert!(
        etcd.contains(&format!(
            "--initial-advertise-peer-urls=https://{node_ip}:2380"
        )),
        "{etcd}"
    );
    assert!(etcd.contains(&format!("--name={node_name}")), "{etcd}");
    for manifest in ["kube-controller-manager.yaml", "kube-scheduler.yaml"] {
        root.read(&format!("/etc/kubernetes/manifests/{manifest}"));
    }
    for file in ["ca.crt", "apiserver.crt", "etcd/ca.crt", "sa.key"] {
        assert!(root.path(&format!("/etc/kubernetes/pki/{file}")).is_file());
    }
    let admin = root.read("/etc/kubernetes/admin.conf");
    assert!(admin.contains("server: https://"), "{admin}");
    let flags = root.read("/var/lib/kubelet/kubeadm-flags.env");
    assert!(flags.contains(&format!("--node-ip={node_ip}")), "{flags}");
    assert!(
        flags.contains("--container-runtime-endpoint=unix:///run/containerd/containerd.sock"),
        "{flags}"
    );
    let kubelet = root.read("/var/lib/kubelet/config.yaml");
    assert!(kubelet.contains("cgroupDriver: cgroupfs"), "{kubelet}");
    // The whole `kubeadm init` on PID 1's command line (`kube::attempts`), dry-run: every
    // phase but the preflight one, writing only under /etc/kubernetes/tmp of a fresh chroot.
    let root = Root::with(config);
    let flags = command_flags(KubeadmApi::V1beta2, Verb::Init, None);
    let mut args = vec!["init", "--config", "/kubeadm.yaml"];
    args.extend(flags.iter().map(String::as_str));
    args.push("--dry-run");
    let outcome = root.run(kubeadm, &args);
    assert!(outcome.accepted, "refused: {}", outcome.output);
    for text in [
        "[init] Using Kubernetes version: v1.20.2",
        "[etcd] Creating static Pod manifest for local etcd",
        "Your Kubernetes control-plane has initialized successfully!",
    ] {
        assert!(
            outcome.output.contains(text),
            "{text:?} not in: {}",
            outcome.output
        );
    }
    assert!(
        !outcome.output.contains("[preflight]"),
        "{}",
        outcome.output
    );
}

/// `kubeadm config migrate` on hawser's configuration: decoded, defaulted, validated; the
/// result keeps what hawser set.
fn migrate(kubeadm: &Path, config: &str, expected: &[&str]) {
    let root = Root::with(config);
    root.accepts(kubeadm, &MIGRATE);
    let migrated = root.read("/migrated.yaml");
    for text in expected {
        assert!(migrated.contains(text), "{text:?} not in:\n{migrated}");
    }
}

#[test]
#[ignore = "needs the real kubeadm 1.20.2 (HAWSER_KUBEADM) and root; run by scripts/test's \
            real-kubeadm stage"]
fn real_kubeadm_accepts_every_configuration_hawser_writes_for_1_20() {
    let kubeadm = kubeadm();
    let started = Instant::now();
    // init, without and with the mesh, as rendered and with a token.
    for (node_ip, token) in [(LAN_IP, false), (MESH_IP, false), (MESH_IP, true)] {
        let config = v1beta2(init_config(&init_request(node_ip, token)).unwrap());
        init_phases(&kubeadm, &config, node_ip, "hawser-0f1e2d3c");
        let mut expected = vec![
            "kind: InitConfiguration",
            "kind: ClusterConfiguration",
            "kubernetesVersion: v1.20.2",
            "timeoutForControlPlane: 10m0s",
            "criSocket: unix:///run/containerd/containerd.sock",
            "name: hawser-0f1e2d3c",
        ];
        let address = format!("advertiseAddress: {node_ip}");
        let node_ip_arg = format!("node-ip: {node_ip}");
        expected.extend([address.as_str(), node_ip_arg.as_str()]);
        if token {
            expected.extend(["token: abcdef.0123456789abcdef", "podSubnet: 10.244.0.0/16"]);
        }
        migrate(&kubeadm, &config, &expected);
    }
    // Joins: a worker and a control plane, without and with the mesh; a certificate key.
    for (node_ip, control_plane, key) in [
        (LAN_JOIN_IP, false, false),
        (MESH_JOIN_IP, false, false),
        (LAN_JOIN_IP, true, false),
        (MESH_JOIN_IP, true, false),
        (MESH_JOIN_IP, true, true),
    ] {
        let config = v1beta2(join_config(&join_request(node_ip, control_plane, key)).unwrap());
        let node_ip_arg = format!("node-ip: {node_ip}");
        let address = format!("advertiseAddress: {node_ip}");
        let mut expected = vec![
            "kind: JoinConfiguration",
            "apiServerEndpoint: 10.99.0.1:6443",
            HASH,
            "name: hawser-4b5a6978",
            node_ip_arg.as_str(),
        ];
        if control_plane {
            expected.push(address.as_str());
        }
        migrate(&kubeadm, &config, &expected);
        if !control_plane {
            let migrated = {
                let root = Root::with(&config);
                root.accepts(&kubeadm, &MIGRATE);
                root.read("/migrated.yaml")
            };
            assert!(!migrated.contains("controlPlane:"), "{migrated}");
        }
    }
    // The flag PID 1 adds for v1beta2 is one kubeadm 1.20's init and join know.
    for (verb, command) in [("init", Verb::Init), ("join", Verb::Join)] {
        let flags = command_flags(KubeadmApi::V1beta2, command, None);
        let flag = &flags[0];
        let out = Command::new(&kubeadm)
            .args([verb, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let name = flag.split('=').next().unwrap();
        assert!(help.contains(name), "kubeadm {verb} has no {name}:\n{help}");
        assert!(help.contains("preflight"), "kubeadm {verb}: {help}");
    }
    eprintln!(
        "real kubeadm {KUBEADM_VERSION} accepted 8 configurations in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs the real kubeadm 1.20.2 (HAWSER_KUBEADM) and root; run by scripts/test's \
            real-kubeadm stage"]
fn real_kubeadm_refuses_broken_configurations_with_the_same_commands() {
    let kubeadm = kubeadm();
    let init = v1beta2(init_config(&init_request(LAN_IP, true)).unwrap());
    let join = v1beta2(join_config(&join_request(MESH_JOIN_IP, true, true)).unwrap());
    // Refused, and for the reason meant (`because` is in kubeadm's output).
    let refused = |config: &str, args: &[&str], what: &str, because: &str| {
        let outcome = Root::with(config).run(&kubeadm, args);
        assert!(
            !outcome.accepted,
            "kubeadm accepted {what}: {}",
            outcome.output
        );
        assert!(
            outcome.output.contains(because),
            "{what}: refused, but not saying {because:?}: {}",
            outcome.output
        );
        let reason = outcome
            .output
            .lines()
            .find(|line| {
                !line.is_empty() && !line.starts_with("kubeadm ") && !line.contains("--v=5")
            })
            .unwrap_or("");
        eprintln!("refused as expected: {what}: {reason}");
    };
    let certs = ["init", "phase", "certs", "all", "--config", "/kubeadm.yaml"];
    // What hawser writes for 1.31 is not for kubeadm 1.20: the API choice matters.
    let newer = InitRequest {
        kubernetes_version: "v1.31.2".parse().unwrap(),
        ..init_request(LAN_IP, true)
    };
    let v1beta4 = init_config(&newer).unwrap();
    assert_eq!(v1beta4.api(), Some(KubeadmApi::V1beta4));
    refused(
        v1beta4.as_str(),
        &certs,
        "a v1beta4 InitConfiguration",
        "Version:\"v1beta4\"",
    );
    refused(
        v1beta4.as_str(),
        &MIGRATE,
        "a v1beta4 InitConfiguration",
        "Version:\"v1beta4\"",
    );
    let v1beta4_join = join_config(&JoinRequest {
        kubernetes_version: "v1.31.2".parse().unwrap(),
        ..join_request(MESH_JOIN_IP, false, false)
    })
    .unwrap();
    refused(
        v1beta4_join.as_str(),
        &MIGRATE,
        "a v1beta4 JoinConfiguration",
        "Version:\"v1beta4\"",
    );
    // v1beta4's list-style kubelet arguments in a v1beta2 document.
    let list_args = init.replace(
        &format!("\"kubeletExtraArgs\": {{\n      \"node-ip\": \"{LAN_IP}\"\n    }}"),
        &format!("\"kubeletExtraArgs\": [{{\"name\": \"node-ip\", \"value\": \"{LAN_IP}\"}}]"),
    );
    assert_ne!(list_args, init, "the substitution must change the text");
    refused(
        &list_args,
        &certs,
        "list-style kubeletExtraArgs in v1beta2",
        "cannot unmarshal array",
    );
    // A misspelled field: kubeadm 1.20 only warns, which counts as a refusal here.
    let misspelled = init.replace("\"timeoutForControlPlane\"", "\"timeoutForControlPlan\"");
    assert_ne!(misspelled, init);
    refused(
        &misspelled,
        &MIGRATE,
        "a misspelled field",
        "unknown field \"timeoutForControlPlan\"",
    );
    // Values kubeadm's validation refuses.
    let bad_address = init.replace(
        &format!("\"advertiseAddress\": \"{LAN_IP}\""),
        "\"advertiseAddress\": \"10.0.2.999\"",
    );
    assert_ne!(bad_address, init);
    refused(
        &bad_address,
        &certs,
        "an advertise address that is none",
        "couldn't use \"10.0.2.999\"",
    );
    // A join's validation: the token, the endpoint, the node's name, the control plane's
    // address. (kubeadm 1.20 checks the CA pins' and the certificate key's format only when
    // it uses them, at discovery and certificate download: hawser's types check those.)
    for (from, to, what, because) in [
        (
            TOKEN,
            "abcdef.0123456789",
            "a malformed bootstrap token",
            "the bootstrap token is invalid",
        ),
        (
            "\"10.99.0.1:6443\"",
            "\"10.99.0.1\"",
            "an API server endpoint without a port",
            "missing port in address",
        ),
        (
            "hawser-4b5a6978",
            "Hawser_4b5a6978",
            "a node name that is no DNS name",
            "lowercase RFC 1123 subdomain",
        ),
        (
            "\"advertiseAddress\": \"10.99.0.2\"",
            "\"advertiseAddress\": \"node-2\"",
            "a control-plane address that is none",
            "couldn't use \"node-2\"",
        ),
    ] {
        let broken = join.replace(from, to);
        assert_ne!(
            broken, join,
            "{what}: the substitution must change the text"
        );
        refused(&broken, &MIGRATE, what, because);
    }
}

/// The repository of the images a real-Kubernetes image carries.
const IMAGE_REPOSITORY: &str = "registry.hawser.invalid/kubernetes";

/// What the image builder writes into `/usr/share/hawser/kubernetes.json` for v1.20.2: the six
/// images it puts into the archive.
fn image_set() -> ImageSet {
    ImageSet::named(
        IMAGE_REPOSITORY,
        "/usr/share/hawser/kubernetes",
        "v1.20.2",
        "3.4.23-0",
        "3.2",
    )
}

#[test]
#[ignore = "needs the real kubeadm 1.20.2 (HAWSER_KUBEADM) and root; run by scripts/test's \
            real-kubeadm stage"]
fn real_kubeadm_names_exactly_the_images_the_image_carries() {
    let kubeadm = kubeadm();
    let images = image_set();
    let plain = init_config(&init_request(LAN_IP, false)).unwrap();
    let config = v1beta2(with_images(&plain, &images).unwrap());
    let root = Root::with(&config);

    // The images kubeadm would run: the archive's, but CoreDNS.
    let out = Command::new(&kubeadm)
        .args([
            "config",
            "images",
            "list",
            "--config",
            "/kubeadm.yaml",
            "--rootfs",
        ])
        .arg(root.dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubeadm config images list: {}{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: std::collections::BTreeSet<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let carried: std::collections::BTreeSet<&str> =
        images.images.iter().map(String::as_str).collect();
    let missing: Vec<&&str> = carried.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "kubeadm does not name {missing:?}: {stdout}"
    );
    let extra: Vec<&&str> = listed.difference(&carried).collect();
    assert!(
        extra.len() <= 1
            && extra
                .iter()
                .all(|name| name.starts_with(&format!("{IMAGE_REPOSITORY}/coredns:"))),
        "kubeadm names images the archive lacks (only CoreDNS may be one): {extra:?}"
    );
    if !extra.is_empty() {
        let flags = command_flags(KubeadmApi::V1beta2, Verb::Init, Some(&images));
        assert_eq!(
            flags,
            ["--skip-phases=preflight,addon/coredns,addon/kube-proxy"]
        );
    }
    eprintln!("kubeadm config images list: {listed:?} (the archive: {carried:?})");

    // The static Pods name the archive's images; the kubelet, its pause image.
    for phase in [
        &["certs", "all"][..],
        &["control-plane", "all"],
        &["etcd", "local"],
        &["kubelet-start"],
    ] {
        let mut args = vec!["init", "phase"];
        args.extend_from_slice(phase);
        args.extend_from_slice(&["--config", "/kubeadm.yaml"]);
        root.accepts(&kubeadm, &args);
    }
    for (manifest, image) in [
        ("kube-apiserver", "kube-apiserver:v1.20.2"),
        ("kube-controller-manager", "kube-controller-manager:v1.20.2"),
        ("kube-scheduler", "kube-scheduler:v1.20.2"),
        ("etcd", "etcd:3.4.23-0"),
    ] {
        let text = root.read(&format!("/etc/kubernetes/manifests/{manifest}.yaml"));
        let line = format!("image: {IMAGE_REPOSITORY}/{image}");
        assert!(
            text.contains(&line),
            "{manifest}.yaml lacks {line:?}:\n{text}"
        );
    }
    let flags = root.read("/var/lib/kubelet/kubeadm-flags.env");
    let pause = format!("--pod-infra-container-image={IMAGE_REPOSITORY}/pause:3.2");
    assert!(flags.contains(&pause), "{flags}");
    // The controller manager's FlexVolume host path is on the state disk: kubeadm's default
    // under /usr cannot be created in the read-only rootfs, and its pod would never start.
    let manager = root.read("/etc/kubernetes/manifests/kube-controller-manager.yaml");
    assert!(
        manager.contains("--flex-volume-plugin-dir=/var/lib/kubelet/volumeplugins")
            && manager.contains("path: /var/lib/kubelet/volumeplugins")
            && !manager.contains("/usr/libexec/kubernetes"),
        "{manager}"
    );
    // Leader election that survives a slow API server, in both leaders' manifests.
    for manifest in ["kube-controller-manager.yaml", "kube-scheduler.yaml"] {
        let text = root.read(&format!("/etc/kubernetes/manifests/{manifest}"));
        assert!(
            text.contains("--leader-elect-lease-duration=60s")
                && text.contains("--leader-elect-renew-deadline=40s"),
            "{manifest}:\n{text}"
        );
    }

    // PID 1's whole `kubeadm init`, dry-run: CoreDNS's and kube-proxy's addons are skipped.
    let flags = command_flags(KubeadmApi::V1beta2, Verb::Init, Some(&images));
    let mut args = vec!["init", "--config", "/kubeadm.yaml"];
    args.extend(flags.iter().map(String::as_str));
    args.push("--dry-run");
    let outcome = Root::with(&config).run(&kubeadm, &args);
    assert!(outcome.accepted, "refused: {}", outcome.output);
    assert!(
        !outcome
            .output
            .contains("Applied essential addon: kube-proxy")
            && !outcome.output.contains("/kube-proxy:"),
        "{}",
        outcome.output
    );
    assert!(
        !outcome.output.contains("Applied essential addon: CoreDNS")
            && !outcome.output.contains("/coredns:"),
        "{}",
        outcome.output
    );

    // A join with the image's pause image.
    let join = with_images(
        &join_config(&join_request(LAN_JOIN_IP, true, false)).unwrap(),
        &images,
    )
    .unwrap();
    let pause_arg = format!("pod-infra-container-image: {IMAGE_REPOSITORY}/pause:3.2");
    migrate(
        &kubeadm,
        &v1beta2(join),
        &["kind: JoinConfiguration", pause_arg.as_str()],
    );
    // And the init configuration's image settings survive kubeadm's decoding.
    let repository = format!("imageRepository: {IMAGE_REPOSITORY}");
    migrate(
        &kubeadm,
        &config,
        &[
            repository.as_str(),
            "imageTag: 3.4.23-0",
            pause_arg.as_str(),
        ],
    );
}
