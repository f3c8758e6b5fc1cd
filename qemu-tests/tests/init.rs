//! `hawser init` and `hawser recover` against a real node: PID 1's init server attests over
//! aTLS, the admin's CLI (the library the `hawser` binary runs) verifies it against the
//! measurements predicted from the UKI, and only then sends the master secret.
//!
//! One node, two boots: (1) a fresh node with no join service waits; a CLI holding wrong
//! measurements is refused naming the PCR and writes nothing; the right one initializes the
//! cluster, and the signed quote shows PCR 15 = the node lock for the cluster ID the CLI
//! computed; a second init is refused. (2) The same node (same TPM, same disk) boots again,
//! waits for `hawser recover` (an initialized disk refuses `init`), reopens its disk with the
//! key derived from the master secret, and locks to the same cluster.
//!
//! `#[ignore]`d like the other boot tests: `cargo test -p hawser-qemu --test init -- --ignored`.

use std::path::Path;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_cli::cluster::{self, ClusterFile, InitOptions, RecoverOptions};
use hawser_cli::localhost::{self, LocalCluster, free_port, luks_uuid};
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_keys::MasterSecret;
use hawser_qemu::{TpmConfig, Vm, VmConfig};

mod common;

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const WAITING: &str = "init server listening on 0.0.0.0:9000";

fn console(vm: &Vm) -> String {
    vm.console_lines().join("\n")
}

fn boot(uki: &Path, cluster: &LocalCluster, disk: &Path, init_port: u16, name: &str) -> Vm {
    let mut config = VmConfig::uefi(uki)
        .name(name)
        .tpm(TpmConfig {
            state_dir: Some(cluster.dir.join("tpm")),
            ..TpmConfig::default()
        })
        .disk(disk, localhost::STATE_DISK_SERIAL)
        .keep_logs_in(cluster.dir.join(format!("logs-{name}")));
    config
        .extra_args
        .extend(localhost::user_net_args(None, Some(init_port)));
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
    let image = common::build_image(
        &dir.join("image"),
        Some(&localhost::node_cmdline(DEFAULT_CMDLINE, false)),
    );
    let cluster = LocalCluster::create(&dir.join("host")).unwrap();
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
    let node = format!("127.0.0.1:{port}");
    let rt = runtime();

    // (1) A fresh node waits for `hawser init`.
    let vm = boot(&image.uki.path, &cluster, &disk, port, "init");
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
        kubernetes_version: "v1.33.4".into(),
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
    assert!(!done.kubeconfig_written, "this image has no Kubernetes");

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

    // The node is taken: a second init is refused, and overwriting the admin's files too.
    let again = rt
        .block_on(cluster::init(
            &InitOptions {
                master_secret: admin.join("other-secret.json"),
                cluster_file: admin.join("other-cluster.json"),
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
    let vm = boot(&image.uki.path, &cluster, &disk, port, "recover");
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
    let text = console(&vm);
    assert!(text.contains("opened LUKS2 volume"), "{text}");
    vm.kill();
}
