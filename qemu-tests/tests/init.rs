//! `hawser init` and `hawser recover` against a real node: PID 1's init server attests over
//! aTLS, the admin's CLI (the library the `hawser` binary runs) verifies it against the
//! measurements predicted from the UKI, and only then sends the master secret.
//!
//! Nodes booted from the node disk image (UKI + verified rootfs with the kubeadm and kubelet
//! stand-ins; the image carries the provider CA), three boots: (1) a fresh node with no join
//! service waits; a CLI holding wrong measurements is refused naming the PCR and writes nothing;
//! the right one initializes the cluster: the node pivots into its rootfs and runs `kubeadm
//! init` with the configuration built from the admin's request (checked as the stand-in received
//! it), and the admin kubeconfig comes back to the CLI; the signed quote shows PCR 15 = the node
//! lock for the cluster ID the CLI computed. (1b) A second node joins through the first node's
//! `hawser-joind` as a control-plane node, both sides attesting: it gets the key derived from
//! the admin's master secret and the cluster's shared certificates, and runs `kubeadm join`.
//! Then a second init of the first node is refused. (2) The first node (same TPM, same disk)
//! boots again, waits for `hawser recover` (an initialized disk refuses `init`), reopens
//! its disk with the key derived from the master secret, locks to the same cluster, and starts
//! its services without running kubeadm again.
//!
//! `#[ignore]`d like the other boot tests: `cargo test -p hawser-qemu --test init -- --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::Path;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_cli::cluster::{self, ClusterFile, InitOptions, RecoverOptions};
use hawser_cli::localhost::{self, LocalCluster, free_port, luks_uuid};
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_keys::MasterSecret;
use hawser_qemu::{TpmConfig, Vm, VmConfig};

mod common;
use common::{CONFIG_RECEIVED, NO_SECOND_KUBEADM, kubeadm_document, kubeadm_documents};

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const WAITING: &str = "init server listening on 0.0.0.0:9000";

fn console(vm: &Vm) -> String {
    vm.console_lines().join("\n")
}

fn boot(
    image: &Path,
    cluster: &LocalCluster,
    disk: &Path,
    (init_port, joind_port): (u16, u16),
    name: &str,
) -> Vm {
    let mut config = VmConfig::uefi_disk(image)
        .name(name)
        .tpm(TpmConfig {
            state_dir: Some(cluster.dir.join("tpm")),
            ..TpmConfig::default()
        })
        .disk(disk, localhost::STATE_DISK_SERIAL)
        .keep_logs_in(cluster.dir.join(format!("logs-{name}")));
    config.extra_args.extend(localhost::user_net_args(
        None,
        &[
            (init_port, localhost::NODE_INIT_PORT),
            (joind_port, localhost::NODE_JOIND_PORT),
        ],
    ));
    Vm::start(config).unwrap()
}

/// The node's `HAWSER_JOIN_REPORT` and the PCR 15 of its verified boot report.
fn reports(vm: &Vm) -> (JoinReport, [u8; 32]) {
    let line = vm
        .wait_for_marker("join report", JOIN_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(vm)));
    let join = JoinReport::find_in_console(&line).unwrap().unwrap();
    let line = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(vm)));
    let report = BootReport::find_in_console(&line).unwrap().unwrap();
    let verified = report.verify(None).unwrap();
    (join, verified.pcrs[&15])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
#[ignore = "boots QEMU twice (~2 min under TCG)"]
fn hawser_init_then_hawser_recover_on_a_real_node() {
    let dir = common::fresh_scratch("e2e-init", "node");
    let cluster = LocalCluster::create(&dir.join("host")).unwrap();
    // The image carries the provider CA: the node's join service verifies joining nodes' AKs
    // with it, and joining nodes (`join_service_trust=attested`, the default) the service's.
    let node_image = common::build_node_image(
        &dir.join("image"),
        &localhost::node_cmdline(DEFAULT_CMDLINE, false),
        Some(&cluster.provider_ca_path()),
    );
    let image = &node_image.image;
    cluster.provision_tpm(&cluster.dir.join("tpm")).unwrap();
    let measurements = cluster.dir.join("measurements.json");
    localhost::write_expected_measurements(&image.uki.path, &measurements).unwrap();
    let disk = cluster.dir.join("state.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let admin = dir.join("admin");
    std::fs::create_dir_all(&admin).unwrap();
    let port = free_port().unwrap();
    let joind_port = free_port().unwrap();
    let ports = (port, joind_port);
    let node = format!("127.0.0.1:{port}");
    let rt = runtime();

    // (1) A fresh node waits for `hawser init`.
    let vm = boot(&node_image.disk.path, &cluster, &disk, ports, "init");
    vm.wait_for_line(WAITING, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));

    let opts = InitOptions {
        node: node.clone(),
        measurements: measurements.clone(),
        provider_ca: cluster.provider_ca_path(),
        master_secret: admin.join("master-secret.json"),
        cluster_file: admin.join("cluster.json"),
        kubeconfig: admin.join("admin.conf"),
        cluster_name: "demo".into(),
        kubernetes_version: "v1.33.4".parse().unwrap(),
        service_cidr: "10.96.0.0/12".into(),
        api_server_cert_sans: vec!["10.0.2.15".into()],
    };
    // Measurements of another image: refused before any secret is made or sent.
    let mut wrong: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&measurements).unwrap()).unwrap();
    wrong["9"]["expected"] = serde_json::Value::String("ab".repeat(32));
    let wrong_path = dir.join("wrong-measurements.json");
    std::fs::write(&wrong_path, wrong.to_string()).unwrap();
    let refused = rt
        .block_on(cluster::init(
            &InitOptions {
                measurements: wrong_path,
                ..opts.clone()
            },
            &mut |_| {},
            &mut |_| {},
        ))
        .unwrap_err();
    let refused = format!("{refused:#}");
    assert!(refused.contains("PCR  9  expected abab"), "{refused}");
    assert!(refused.contains("nothing was sent"), "{refused}");
    assert!(
        !opts.master_secret.exists(),
        "a refused init wrote a master secret"
    );

    let mut said = Vec::new();
    let mut node_lines = Vec::new();
    let done = rt
        .block_on(cluster::init(
            &opts,
            &mut |l| said.push(l.to_owned()),
            &mut |l| node_lines.push(l.to_owned()),
        ))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", console(&vm)));
    eprintln!("cli: {said:#?}\nnode lines streamed: {}", node_lines.len());
    assert!(
        node_lines
            .iter()
            .any(|l| l.contains("node lock taken by the init server")),
        "{node_lines:#?}"
    );
    // kubeadm init ran with the admin's cluster, and its admin kubeconfig came back.
    assert!(done.kubeconfig_written, "{said:#?}");
    let kubeconfig = std::fs::read_to_string(&opts.kubeconfig).unwrap();
    assert!(
        kubeconfig.contains("kubernetes-admin") && kubeconfig.contains("client-key-data"),
        "{kubeconfig}"
    );
    let config_line = node_lines
        .iter()
        .chain(
            console(&vm)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
                .iter(),
        )
        .find(|l| l.contains(CONFIG_RECEIVED))
        .cloned()
        .unwrap_or_else(|| panic!("no kubeadm configuration line\n{}", console(&vm)));
    let docs = kubeadm_documents(&config_line);
    let cluster_config = kubeadm_document(&docs, "ClusterConfiguration");
    assert_eq!(cluster_config["apiVersion"], "kubeadm.k8s.io/v1beta4");
    assert_eq!(cluster_config["clusterName"], "demo", "{docs:#?}");
    assert_eq!(cluster_config["kubernetesVersion"], "v1.33.4", "{docs:#?}");
    assert_eq!(
        cluster_config["networking"]["serviceSubnet"], "10.96.0.0/12",
        "{docs:#?}"
    );
    assert!(
        cluster_config["apiServer"]["certSANs"]
            .to_string()
            .contains("10.0.2.15"),
        "{docs:#?}"
    );

    let (join, pcr15) = reports(&vm);
    let master = MasterSecret::read_file(&opts.master_secret).unwrap();
    let cluster_file = ClusterFile::read(&opts.cluster_file).unwrap();
    let uuid = luks_uuid(&disk).expect("the node formatted its state disk");
    assert_eq!(join.disk_uuid, uuid.as_str());
    assert_eq!(join.rpc, "Init");
    assert_eq!(join.via, "admin");
    let key = master.state_disk_key(&uuid).unwrap();
    assert_eq!(
        join.key_fingerprint,
        hawser_keys::fingerprint(&*key).as_str()
    );
    assert_eq!(cluster_file.cluster_id, hex::encode(done.cluster_id));
    assert_eq!(
        pcr15,
        hawser_measurements::cluster_lock_pcr(&done.cluster_id)
    );
    assert_eq!(pcr15, done.pcr15);

    // (1b) A second node joins through the first one's join service as a control-plane node:
    // both attest (mutual aTLS), the service derives the new node's disk key from the admin's
    // master secret and hands out the cluster's shared certificates, and the new node runs
    // `kubeadm join --control-plane` against the first one's (stand-in) control plane.
    second_node_joins(
        &vm,
        &node_image.disk.path,
        &cluster,
        &dir,
        joind_port,
        &master,
        &done.cluster_id,
    );

    // The node is taken: a second init is refused, and overwriting the admin's files too.
    let again = rt
        .block_on(cluster::init(
            &InitOptions {
                master_secret: admin.join("other-secret.json"),
                cluster_file: admin.join("other-cluster.json"),
                kubeconfig: admin.join("other-admin.conf"),
                ..opts.clone()
            },
            &mut |_| {},
            &mut |_| {},
        ))
        .unwrap_err();
    // A locked node's quote has PCR 15 ≠ 0: the CLI refuses it as not fresh.
    assert!(format!("{again:#}").contains("PCR 15"), "{again:#}");
    let overwrite = rt
        .block_on(cluster::init(&opts, &mut |_| {}, &mut |_| {}))
        .unwrap_err();
    assert!(
        format!("{overwrite:#}").contains("refusing to overwrite"),
        "{overwrite:#}"
    );
    let text = console(&vm);
    assert!(
        !text.contains(&hex::encode(*key)),
        "the key reached the console"
    );
    assert!(!text.contains("FATAL"), "{text}");
    vm.powerdown().unwrap();
    vm.wait_for_exit(Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));

    // (2) The same node boots again: its disk is initialized, so it waits for `recover`.
    let vm = boot(&node_image.disk.path, &cluster, &disk, ports, "recover");
    vm.wait_for_line(WAITING, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    let done = rt
        .block_on(cluster::recover(
            &RecoverOptions {
                node: node.clone(),
                measurements: measurements.clone(),
                provider_ca: cluster.provider_ca_path(),
                master_secret: opts.master_secret.clone(),
                cluster_file: opts.cluster_file.clone(),
            },
            &mut |_| {},
            &mut |_| {},
        ))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", console(&vm)));
    let (join, pcr15) = reports(&vm);
    assert_eq!(join.rpc, "Recover");
    assert_eq!(join.disk_uuid, uuid.as_str(), "the disk was reformatted");
    assert_eq!(pcr15, done.pcr15);
    assert_eq!(hex::encode(done.cluster_id), cluster_file.cluster_id);
    vm.wait_for_line(NO_SECOND_KUBEADM, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    let text = console(&vm);
    assert!(text.contains("opened LUKS2 volume"), "{text}");
    assert!(
        !text.contains(CONFIG_RECEIVED),
        "kubeadm ran again:\n{text}"
    );
    vm.kill();
}

/// Boots a second node of the same image whose join endpoint (fw_cfg, unmeasured) is the first
/// node's join service, and checks what it got.
fn second_node_joins(
    first: &Vm,
    image: &Path,
    cluster: &LocalCluster,
    dir: &Path,
    joind_port: u16,
    master: &MasterSecret,
    cluster_id: &[u8; 32],
) {
    first
        .wait_for_line("[hawser-joind]", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(first)));
    let first_console = console(first);
    let pin = first_console
        .split("pin ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no stand-in CA pin on the first node:\n{first_console}"))
        .to_owned();
    let node_dir = dir.join("second");
    std::fs::create_dir_all(&node_dir).unwrap();
    let tpm_dir = node_dir.join("tpm");
    cluster.provision_tpm(&tpm_dir).unwrap();
    let disk = node_dir.join("state.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(256 << 20))
        .unwrap();
    let mut config = VmConfig::uefi_disk(image)
        .name("second")
        .tpm(TpmConfig {
            state_dir: Some(tpm_dir),
            ..TpmConfig::default()
        })
        .disk(&disk, localhost::STATE_DISK_SERIAL)
        .fw_cfg_string("join_endpoint", localhost::GUEST_JOIN_ENDPOINT)
        .fw_cfg_string("role", "control-plane")
        .keep_logs_in(node_dir.join("logs"));
    config
        .extra_args
        .extend(localhost::user_net_args(Some(joind_port), &[]));
    let vm = Vm::start(config).unwrap();
    let (join, pcr15) = reports(&vm);
    let config_line = vm
        .wait_for_line(CONFIG_RECEIVED, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    vm.wait_for_line("kubeadm join succeeded", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    vm.kill();
    let text = console(&vm);
    assert_eq!(join.rpc, "IssueJoinTicket", "{text}");
    assert_eq!(join.via, "join-service");
    // The service derived the key from the admin's master secret, for this disk.
    let uuid = luks_uuid(&disk).expect("the second node formatted its state disk");
    assert_eq!(join.disk_uuid, uuid.as_str());
    let key = master.state_disk_key(&uuid).unwrap();
    assert_eq!(
        join.key_fingerprint,
        hawser_keys::fingerprint(&*key).as_str()
    );
    // Same cluster, locked.
    assert_eq!(join.cluster_id, hex::encode(cluster_id).as_str());
    assert_eq!(pcr15, hawser_measurements::cluster_lock_pcr(cluster_id));
    // It verified the service (attested trust is the default of this image).
    assert!(!text.contains("INSECURE"), "{text}");
    // kubeadm join: the first node's control plane, its CA pin, a token from its kubeadm.
    let docs = kubeadm_documents(&config_line);
    let join_config = kubeadm_document(&docs, "JoinConfiguration");
    let discovery = &join_config["discovery"]["bootstrapToken"];
    assert_eq!(discovery["caCertHashes"][0], pin.as_str(), "{docs:#?}");
    assert!(
        discovery["token"]
            .as_str()
            .is_some_and(|t| t.ends_with(".<redacted>")),
        "{docs:#?}"
    );
    assert!(
        discovery["apiServerEndpoint"]
            .as_str()
            .is_some_and(|e| e.ends_with(":6443")),
        "{docs:#?}"
    );
    // A control-plane join: the service handed out the cluster's shared certificates (from
    // the first node's /etc/kubernetes/pki), written before kubeadm ran; no key was shown.
    assert!(
        join_config["controlPlane"]["localAPIEndpoint"]["advertiseAddress"] == "10.0.2.15",
        "{docs:#?}"
    );
    assert!(
        text.contains("wrote the cluster's 8 shared certificate and key files"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "the shared certificates are in /etc/kubernetes/pki (cluster CA {pin})"
        )),
        "{text}"
    );
    assert!(text.contains("as a control-plane node"), "{text}");
    assert!(
        !text.contains("PRIVATE KEY"),
        "key material on the console:\n{text}"
    );
    eprintln!("second node joined: {join:?}");
}
