//! `hawser init` and `hawser recover` against a real node: PID 1's init server attests over
//! aTLS, the admin's CLI (the library the `hawser` binary runs) verifies it against the
//! measurements predicted from the UKI, and only then sends the init secret (whose hash the
//! node got through fw_cfg, as from a cloud's instance metadata) and the master secret.
//!
//! Nodes booted from the node disk image (UKI + verified rootfs with the kubeadm and kubelet
//! stand-ins; the image carries the provider CA), three boots: (1) a fresh node with no join
//! service waits; a CLI holding wrong measurements is refused naming the PCR and writes nothing;
//! an Init without the right init secret is refused and leaves the node fresh
//! ([`tamper_init_without_the_secret`]); the right one initializes the cluster, approving the
//! second node's AK as a control plane: the node pivots into its rootfs and runs `kubeadm
//! init` with the configuration built from the admin's request (checked as the stand-in received
//! it), and the admin kubeconfig comes back to the CLI; the signed quote shows PCR 15 = the node
//! lock for the cluster ID the CLI computed, and the quote the CLI verified after the node lock
//! (from the node in its rootfs) equals `hawser measurements predict --cluster-id` of the UKI for
//! every predicted PCR: PCR 11 after `control-plane` and `leave-initrd` (a control plane), PCR 15 the lock. (1b) A second node joins through the first node's
//! `hawser-joind` as a worker, both sides attesting: it gets the key derived from the admin's
//! master secret, and runs `kubeadm join`, whose discovery reaches the first node's (stand-in)
//! API server through the cluster's control-plane endpoint (`hawser init
//! --control-plane-endpoint`).
//! Then a second init of the first node is refused: its init server stopped listening after the
//! lock. (2) The first node (same TPM, same disk) boots again, waits for `hawser recover` (an
//! initialized disk refuses `init`); a Recover with a wrong init secret and one with another
//! cluster's master secret are refused without locking or rebooting the node
//! ([`tamper_recover_with_a_wrong_secret`]); the right one reopens
//! its disk with the key derived from the master secret, locks to the same cluster, and starts
//! its services without running kubeadm again.
//!
//! `#[ignore]`d like the other boot tests: `cargo test -p hawser-qemu --test init -- --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::Path;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_cli::cluster::{self, ClusterFile, InitOptions, RecoverOptions, write_new_init_secret};
use hawser_harness::{TpmConfig, Vm, VmConfig};
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_keys::MasterSecret;
use hawser_local::localhost::{self, LocalCluster, free_port, luks_uuid};
use hawser_measurements::predict::{Phase, Prediction};

mod common;
use common::{CONFIG_RECEIVED, NO_SECOND_KUBEADM, kubeadm_document, kubeadm_documents};

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const WAITING: &str = "init server listening on 0.0.0.0:9000";
/// The named reason of a refused init secret (PID 1's `InitSecretError`).
const WRONG_INIT_SECRET: &str = "init secret does not match the node's init secret hash";

fn console(vm: &Vm) -> String {
    vm.console_lines().join("\n")
}

fn boot(
    image: &Path,
    cluster: &LocalCluster,
    disk: &Path,
    (init_port, joind_port, api_port): (u16, u16, u16),
    name: &str,
) -> Vm {
    let mut config = VmConfig::uefi_disk(image)
        .name(name)
        .tpm(TpmConfig {
            state_dir: Some(cluster.dir.join("tpm")),
            ..TpmConfig::default()
        })
        .disk(disk, localhost::STATE_DISK_SERIAL)
        // A host's own init secret hash on fw_cfg: PID 1 refuses it by name (it would let the
        // host `hawser init` the node into a cluster of its own); the measured one counts.
        .fw_cfg_string("init_secret_hash", "11".repeat(32))
        .keep_logs_in(cluster.dir.join(format!("logs-{name}")));
    config.extra_args.extend(localhost::user_net_args(
        None,
        &[
            (init_port, localhost::NODE_INIT_PORT),
            (joind_port, localhost::NODE_JOIND_PORT),
            // The kubelet stand-in's listener in place of the API server (the control-plane
            // endpoint other nodes' kubeadm discovery reaches).
            (api_port, API_SERVER_PORT),
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

/// The quote the CLI verified after the node lock came from the node in its rootfs: every
/// predicted PCR equals `hawser measurements predict --cluster-id` of the UKI
/// ([`Prediction::pcrs_in_cluster`] at [`Phase::LeaveInitrdControlPlane`]): PCR 11 with PID 1's
/// phases and the control-plane marker (`hawser init` made the node the cluster's first control
/// plane), PCR 15 the node lock for the cluster `hawser init` created.
fn pivoted_quote_equals_the_prediction(uki: &Path, done: &cluster::Established) {
    assert!(
        done.quoted_after_pivot,
        "the node answered the re-attestation from its initramfs, not from its rootfs"
    );
    let bytes = std::fs::read(uki).unwrap();
    let prediction = Prediction::from_uki(&bytes, "the node UKI").unwrap();
    let predicted =
        prediction.pcrs_in_cluster(Phase::LeaveInitrdControlPlane, Some(&done.cluster_id));
    for (pcr, value) in &predicted {
        assert_eq!(
            done.quoted.get(pcr).map(hex::encode),
            Some(hex::encode(value)),
            "PCR {pcr} of the pivoted node's quote differs from the prediction for cluster {}",
            hex::encode(done.cluster_id)
        );
    }
    assert_ne!(
        predicted[&11],
        prediction.pcr(11, Phase::EnterInitrd),
        "leave-initrd is in PCR 11"
    );
    eprintln!(
        "pivoted node's quote = prediction: PCR 11 {} (control-plane, leave-initrd), PCR 15 {} \
         (cluster {})",
        hex::encode(predicted[&11]),
        hex::encode(predicted[&15]),
        hex::encode(done.cluster_id)
    );
}

/// The API server port the kubelet stand-in listens on for the first control plane.
const API_SERVER_PORT: u16 = 6443;

#[test]
#[ignore = "boots QEMU twice (~2 min under TCG)"]
fn hawser_init_then_hawser_recover_on_a_real_node() {
    let dir = common::fresh_scratch("e2e-init", "node");
    let cluster = LocalCluster::create(&dir.join("host")).unwrap();
    // The image carries the provider CA: the node's join service verifies joining nodes' AKs
    // with it, and joining nodes (`join_service_trust=attested`, the default) the service's.
    // Who creates the node holds the init secret; its hash is on the image's measured command
    // line (PID 1 refuses one from fw_cfg).
    let admin = dir.join("admin");
    std::fs::create_dir_all(&admin).unwrap();
    let init_secret = admin.join("init-secret");
    let init_secret_hash = write_new_init_secret(&init_secret).unwrap();
    let node_image = common::build_node_image(
        &dir.join("image"),
        &format!(
            "{} hawser.init_secret_hash={}",
            localhost::node_cmdline(DEFAULT_CMDLINE, false),
            hex::encode(init_secret_hash)
        ),
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
    let port = free_port().unwrap();
    let joind_port = free_port().unwrap();
    let api_port = free_port().unwrap();
    let ports = (port, joind_port, api_port);
    let node = format!("127.0.0.1:{port}");
    let rt = runtime();
    // The second node's TPM exists before the cluster: its AK is approved in `hawser init`.
    let second_tpm = dir.join("second/tpm");
    let second_ak = cluster.provision_tpm(&second_tpm).unwrap();

    // (1) A fresh node waits for `hawser init`.
    let vm = boot(&node_image.disk.path, &cluster, &disk, ports, "init");
    vm.wait_for_line(WAITING, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    assert!(
        console(&vm).contains("fw_cfg opt/hawser/init_secret_hash is refused"),
        "the host's fw_cfg init secret hash was not refused by name:\n{}",
        console(&vm)
    );

    let opts = InitOptions {
        node: node.clone(),
        measurements: measurements.clone(),
        provider_ca: cluster.provider_ca_path(),
        master_secret: admin.join("master-secret.json"),
        cluster_file: admin.join("cluster.json"),
        kubeconfig: admin.join("admin.conf"),
        cluster_name: "demo".into(),
        kubernetes_version: Some("v1.33.4".parse().unwrap()),
        service_cidr: "10.96.0.0/12".into(),
        api_server_cert_sans: vec!["10.0.2.15".into(), "10.0.2.100".into()],
        // What other nodes reach the API server at: forwarded to this node's port 6443.
        control_plane_endpoint: Some(localhost::GUEST_API_SERVER_ENDPOINT.parse().unwrap()),
        init_secret: init_secret.clone(),
        control_plane_approvals: vec![second_ak.clone()],
        // These nodes reach each other only through the host's forwarded ports, not a LAN a
        // WireGuard mesh could run on: the local cluster's tests form clusters on the mesh.
        vpn_prefix: None,
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
    tamper_init_without_the_secret(&rt, &vm, &opts, &admin);

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
    pivoted_quote_equals_the_prediction(&image.uki.path, &done);
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
    let key = master
        .state_disk_key(&uuid, hawser_keys::StateDiskKeyLength::Xts)
        .unwrap();
    assert_eq!(
        join.key_fingerprint,
        hawser_keys::fingerprint(&key).as_str()
    );
    assert_eq!(cluster_file.cluster_id, hex::encode(done.cluster_id));
    assert_eq!(pcr15, hawser_pcr::cluster_lock_pcr(&done.cluster_id));
    assert_eq!(pcr15, done.pcr15);

    // (1b) A second node joins through the first one's join service as a worker: both attest
    // (mutual aTLS), the service derives the new node's disk key from the admin's master
    // secret, and the new node runs `kubeadm join` against the first one's (stand-in) control
    // plane at the cluster's control-plane endpoint.
    second_node_joins(
        &vm,
        &node_image.disk.path,
        &dir,
        (joind_port, api_port),
        &master,
        &done.cluster_id,
    );

    // The node is taken: its init server stopped listening once the lock was taken and the
    // admin's call ended, so a second init finds nothing to talk to; overwriting the admin's
    // files is refused too.
    let text = console(&vm);
    assert!(
        text.contains("the init server on 0.0.0.0:9000 has stopped"),
        "{text}"
    );
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
    // Nothing answers on the node's port 9000 (QEMU's forward accepts, the guest refuses).
    let again = format!("{again:#}");
    assert!(
        again.contains("attesting the node") || again.contains("cannot connect to the node"),
        "{again}"
    );
    assert!(!admin.join("other-secret.json").exists());
    let overwrite = rt
        .block_on(cluster::init(&opts, &mut |_| {}, &mut |_| {}))
        .unwrap_err();
    assert!(
        format!("{overwrite:#}").contains("refusing to overwrite"),
        "{overwrite:#}"
    );
    let text = console(&vm);
    assert!(
        !text.contains(&hex::encode(&*key)),
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
    let recover = RecoverOptions {
        node: node.clone(),
        measurements: measurements.clone(),
        provider_ca: cluster.provider_ca_path(),
        master_secret: opts.master_secret.clone(),
        cluster_file: opts.cluster_file.clone(),
        init_secret: init_secret.clone(),
    };
    tamper_recover_with_a_wrong_secret(&rt, &vm, &recover, &admin, &cluster_file);
    let done = rt
        .block_on(cluster::recover(&recover, &mut |_| {}, &mut |_| {}))
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
    // One boot: the refused Recovers neither rebooted nor stopped the node.
    assert!(!text.contains("FATAL"), "{text}");
    assert_eq!(text.matches(WAITING).count(), 1, "{text}");
    vm.kill();
}

/// Tamper row: Init without the secret — an `Init` whose init secret is not the one whose
/// hash the node's platform gave it is refused (`PERMISSION_DENIED`, named reason), and the
/// node is not locked: PCR 15 stays zero, so the right `Init` afterwards still succeeds (the
/// CLI attests the node as fresh before it sends anything).
fn tamper_init_without_the_secret(
    rt: &tokio::runtime::Runtime,
    vm: &Vm,
    opts: &InitOptions,
    admin: &Path,
) {
    let wrong_secret = admin.join("someone-elses-init-secret");
    write_new_init_secret(&wrong_secret).unwrap();
    let refused = rt
        .block_on(cluster::init(
            &InitOptions {
                init_secret: wrong_secret.clone(),
                master_secret: admin.join("intruder-secret.json"),
                cluster_file: admin.join("intruder-cluster.json"),
                kubeconfig: admin.join("intruder-admin.conf"),
                ..opts.clone()
            },
            &mut |_| {},
            &mut |_| {},
        ))
        .unwrap_err();
    let refused = format!("{refused:#}");
    assert!(refused.contains("PermissionDenied"), "{refused}");
    assert!(refused.contains(WRONG_INIT_SECRET), "{refused}");
    assert!(
        refused.contains(&wrong_secret.display().to_string()),
        "{refused}"
    );
    let text = console(vm);
    assert!(
        text.contains(&format!("Init refused: {WRONG_INIT_SECRET}")),
        "the refusal is not on the node's console:\n{text}"
    );
    assert!(!text.contains("node lock taken"), "{text}");
    let secret = std::fs::read_to_string(&wrong_secret).unwrap();
    assert!(
        !text.contains(secret.trim()),
        "the init secret reached the console"
    );
    // Not locked: the CLI's attestation (which requires PCR 15 = 0) is the proof; the right
    // Init that follows in the caller depends on it.
}

/// Tamper row: Recover with a wrong secret (node not locked, no reboot) — a `Recover` with a
/// wrong init secret is refused (`PERMISSION_DENIED`), and one with the right init secret but
/// another cluster's master secret is refused after its key fails the disk's LUKS2 digest; the
/// node stays unlocked on the same boot and the right `Recover` then succeeds.
fn tamper_recover_with_a_wrong_secret(
    rt: &tokio::runtime::Runtime,
    vm: &Vm,
    recover: &RecoverOptions,
    admin: &Path,
    cluster_file: &ClusterFile,
) {
    let wrong_init_secret = admin.join("wrong-init-secret");
    write_new_init_secret(&wrong_init_secret).unwrap();
    let refused = rt
        .block_on(cluster::recover(
            &RecoverOptions {
                init_secret: wrong_init_secret,
                ..recover.clone()
            },
            &mut |_| {},
            &mut |_| {},
        ))
        .unwrap_err();
    let refused = format!("{refused:#}");
    assert!(refused.contains("PermissionDenied"), "{refused}");
    assert!(refused.contains(WRONG_INIT_SECRET), "{refused}");

    // Another cluster's master secret, with a cluster file that matches it (so the CLI sends
    // it): the node derives a key that does not open its disk.
    let other_master = MasterSecret::generate().unwrap();
    let other_secret = admin.join("other-cluster-secret.json");
    other_master.write_new_file(&other_secret).unwrap();
    let salt = cluster_file.salt().unwrap();
    let other_file = admin.join("other-cluster-file.json");
    let other = ClusterFile {
        cluster_id: hex::encode(hawser_keys::cluster_id(
            other_master.measurement_secret().as_slice(),
            &salt,
        )),
        ..cluster_file.clone()
    };
    std::fs::write(&other_file, serde_json::to_string(&other).unwrap()).unwrap();
    let refused = rt
        .block_on(cluster::recover(
            &RecoverOptions {
                master_secret: other_secret,
                cluster_file: other_file,
                ..recover.clone()
            },
            &mut |_| {},
            &mut |_| {},
        ))
        .unwrap_err();
    let refused = format!("{refused:#}");
    assert!(
        refused.contains(
            "Recover refused: the master secret does not give this node's state disk key"
        ),
        "{refused}"
    );
    assert!(refused.contains("the node is not locked"), "{refused}");
    let text = console(vm);
    assert!(!text.contains("node lock taken"), "{text}");
    assert!(!text.contains("FATAL"), "{text}");
}

/// Boots a second node of the same image whose join endpoint (fw_cfg, unmeasured) is the first
/// node's join service, and checks what it got.
fn second_node_joins(
    first: &Vm,
    image: &Path,
    dir: &Path,
    (joind_port, api_port): (u16, u16),
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
    // Provisioned (and its AK approved in `hawser init`) before the cluster existed.
    let tpm_dir = node_dir.join("tpm");
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
        .keep_logs_in(node_dir.join("logs"));
    config
        .extra_args
        .extend(localhost::user_net_args_with_api_server(
            Some(joind_port),
            Some(api_port),
            &[],
        ));
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
    let key = master
        .state_disk_key(&uuid, hawser_keys::StateDiskKeyLength::Xts)
        .unwrap();
    assert_eq!(
        join.key_fingerprint,
        hawser_keys::fingerprint(&key).as_str()
    );
    // Same cluster, locked.
    assert_eq!(join.cluster_id, hex::encode(cluster_id).as_str());
    assert_eq!(pcr15, hawser_pcr::cluster_lock_pcr(cluster_id));
    // The image names the admin (its measured init secret hash), so this node's init server
    // listened too; the join service answered first.
    assert!(
        text.contains("and accepting `hawser init` with the init secret on port"),
        "{text}"
    );
    assert_eq!(join.via, "join-service", "{text}");
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
    // A worker: no shared certificates, no master secret, no join service of its own. (A
    // control-plane join needs the two VMs on one network with distinct addresses for their
    // etcd members — each VM has its own user-mode network and the same address until the
    // multi-node network; it is tested on the host: standin/tests/etcd.rs,
    // joinservice/tests/service.rs.)
    assert!(join_config.get("controlPlane").is_none(), "{docs:#?}");
    assert!(!text.contains("shared certificate and key files"), "{text}");
    assert!(!text.contains("kept the cluster's master secret"), "{text}");
    // kubeadm's discovery reached the first node's API server (its kubelet stand-in's
    // listener) through the cluster's control-plane endpoint.
    assert!(
        discovery["apiServerEndpoint"] == localhost::GUEST_API_SERVER_ENDPOINT,
        "{docs:#?}"
    );
    assert!(
        !text.contains("PRIVATE KEY"),
        "key material on the console:\n{text}"
    );
    eprintln!("second node joined: {join:?}");
}
