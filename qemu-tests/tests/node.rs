//! A whole node: OVMF boots the disk image's UKI; PID 1 attests to `hawser-joind` on the host,
//! opens its encrypted state disk, verifies the rootfs with dm-verity against the root hash on
//! its measured command line, pivots into it, starts containerd and the kubelet, and runs
//! `kubeadm join` with the configuration built from its join ticket — once per node lifetime.
//!
//! The rootfs of these machines' offline builds carries hawser's kubeadm and kubelet
//! *stand-ins* (crate `hawser-standin`, never Kubernetes): the stand-in kubeadm validates the
//! configuration against the v1beta4 API and prints it (secrets redacted), which is what the
//! test checks.
//!
//! Boots (OVMF under TCG, ~1 min each to the kubeadm call), sharing one image and one cluster:
//! 1. fresh node: join → pivot → `kubeadm join` with the ticket's endpoint, which nothing
//!    answers yet: the stand-in waits in discovery, and the power is cut
//!    ([`fault_power_cut_before_kubeadm_finished`]);
//! 2. reboot with the endpoint reachable: rejoin → the boot report names the pending attempt →
//!    `kubeadm reset -f` → `kubeadm join` with the ticket's endpoint, token and CA hash, node
//!    name and IP, once; then ACPI power-off: services stop in order, the state disk is
//!    unmounted and closed, the VM powers off;
//! 3. reboot: rejoin (IssueRejoinTicket) → the same disk reopens, the state file system was
//!    cleanly unmounted, the kubelet starts, kubeadm does not run again;
//! 4. the disk image with one byte of the rootfs partition flipped: dm-verity refuses the
//!    block, the node stops with a clear message and never runs kubeadm.
//!
//! `#[ignore]`d in plain `cargo test`; run with
//! `cargo test -p hawser-qemu --test node -- --ignored --test-threads=1 --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::SocketAddr;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_harness::{Vm, VmConfig, format_timeline};
use hawser_image::pipeline::{DEFAULT_CMDLINE, NodeImage};
use hawser_local::localhost::{self, free_port};

mod common;
use common::{
    CONFIG_RECEIVED, Host, NO_SECOND_KUBEADM, PrivateNetwork, build_node_image,
    kubeadm_document as document, kubeadm_documents, pings,
};

/// Generous: OVMF + pivot + services under TCG on a loaded 2-core CI machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(360);
/// The kubelet stand-in's line once it runs with the configuration kubeadm wrote.
const KUBELET_RUNNING: &str = "[kubelet] kubelet STAND-IN (not Kubernetes): started for node";
/// PID 1's teardown with every file system unmounted and the state disk closed.
const CLEAN_TEARDOWN: &str = "device-mapper devices (0 failed)";
/// PID 1's console line with kubeadm's status (`hawser_init::node::intent`).
const KUBEADM_STATUS: &str = "HAWSER_KUBEADM_STATUS ";
/// PID 1's line on a state disk that was cleanly unmounted.
const CLEAN_STATE: &str = "state file system: clean (nothing in its journal to replay)";

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-node", name)
}

fn image() -> &'static NodeImage {
    static IMAGE: OnceLock<NodeImage> = OnceLock::new();
    IMAGE.get_or_init(|| {
        build_node_image(
            &scratch("image"),
            &localhost::node_cmdline(DEFAULT_CMDLINE, true),
            None,
        )
    })
}

fn console(vm: &Vm) -> String {
    vm.console_lines().join("\n")
}

fn wait(vm: &Vm, label: &str, what: &str) -> String {
    vm.wait_for_marker(label, what, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", console(vm)))
}

#[test]
#[ignore = "boots QEMU four times (~5 min under TCG); run by scripts/test"]
fn a_node_joins_runs_kubeadm_once_and_rejoins_after_a_clean_power_off() {
    let image = image();
    let host = Host::new(&scratch("cluster"), &image.image.uki.path);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    // The host's stand-in for the control plane the join service names (10.0.2.100:6443):
    // a listener on loopback that counts the connections kubeadm's discovery makes.
    let api_server = ApiServer::start();

    // Boots 1 and 2: a power cut while kubeadm join waits in discovery, then the retry.
    let (join, config_line, kubelet_line, first) =
        fault_power_cut_before_kubeadm_finished(&host, port, &api_server);

    // The configuration kubeadm received is the join ticket's, for this node.
    let docs = kubeadm_documents(&config_line);
    let join_config = document(&docs, "JoinConfiguration");
    assert_eq!(join_config["apiVersion"], "kubeadm.k8s.io/v1beta4");
    let discovery = &join_config["discovery"]["bootstrapToken"];
    // What the local cluster's join service hands out (no control plane on the host).
    assert_eq!(
        discovery["apiServerEndpoint"], "10.0.2.100:6443",
        "{docs:#?}"
    );
    assert_eq!(discovery["token"], "nocpln.<redacted>", "{docs:#?}");
    assert_eq!(
        discovery["caCertHashes"][0],
        format!("sha256:{}", "00".repeat(32)).as_str()
    );
    let registration = &join_config["nodeRegistration"];
    let node_name = hawser_init_node_name(&join.disk_uuid);
    assert_eq!(registration["name"], node_name.as_str(), "{docs:#?}");
    assert!(
        registration.to_string().contains("10.0.2.15"),
        "the node IP: {docs:#?}"
    );
    // Services ran, and stopped in order at power-off (the kubelet before containerd); every
    // file system was unmounted and the state disk closed.
    let kubelet_stop = first.find("[kubelet] kubelet STAND-IN (not Kubernetes): SIGTERM received");
    let containerd_stop = first.find("containerd stopped");
    assert!(
        kubelet_stop.is_some() && containerd_stop.is_some(),
        "{first}"
    );
    assert!(kubelet_stop < containerd_stop, "{first}");
    assert!(first.contains(CLEAN_TEARDOWN), "{first}");
    assert!(first.contains("containerd successfully booted"), "{first}");
    // The kubelet runs as the node kubeadm registered (the hostname PID 1 set).
    assert!(
        kubelet_line.contains(&format!("started for node {node_name} ")),
        "{kubelet_line}"
    );
    assert!(!first.contains("FATAL"), "{first}");

    // Boot 3: rejoin, no second kubeadm.
    let vm = Vm::start(with_api_server(
        host.node(VmConfig::uefi_disk(&image.disk.path), "node-3", port, false),
        port,
        &api_server,
    ))
    .unwrap();
    let rejoin_line = wait(&vm, "join report", JOIN_REPORT_MARKER);
    let rejoin = JoinReport::find_in_console(&rejoin_line).unwrap().unwrap();
    wait(&vm, "no second kubeadm", NO_SECOND_KUBEADM);
    wait(&vm, "kubelet running", KUBELET_RUNNING);
    vm.kill();
    let second = console(&vm);
    eprintln!("boot 3: {}", format_timeline(&vm.timeline()));
    host.runtime.block_on(service.shutdown());
    assert_eq!(rejoin.rpc, "IssueRejoinTicket", "{second}");
    assert_eq!(rejoin.disk_uuid, join.disk_uuid);
    assert_eq!(rejoin.key_fingerprint, join.key_fingerprint);
    assert!(!second.contains(CONFIG_RECEIVED), "{second}");
    assert!(!second.contains("running kubeadm"), "{second}");
    // The power-off of boot 2 left the state file system clean: no journal replay.
    assert!(second.contains(CLEAN_STATE), "{second}");
    assert!(!second.contains("FATAL"), "{second}");
}

/// Fault "power cut after the lock and before kubeadm finished", steps of
/// [`a_node_joins_runs_kubeadm_once_and_rejoins_after_a_clean_power_off`]. Boot 1: a fresh
/// node joins (the disk is formatted and locked to the cluster), but nothing answers at the
/// API server endpoint the ticket names, so the stand-in's `kubeadm join` waits in discovery;
/// the power is cut (QMP `quit`) while it waits. Boot 2, with the endpoint reachable: the
/// rejoining node finds kubeadm's intent and no marker, reports the pending attempt, cleans up
/// (`kubeadm reset -f`) and runs `kubeadm join` again, which succeeds exactly once; then an
/// ACPI power-off. Returns boot 2's join report (of boot 1), configuration line, kubelet line
/// and console.
fn fault_power_cut_before_kubeadm_finished(
    host: &Host,
    port: u16,
    api_server: &ApiServer,
) -> (JoinReport, String, String, String) {
    let image = image();
    // Boot 1: join, pivot, kubeadm join waiting for an endpoint nothing forwards.
    let vm =
        Vm::start(host.node(VmConfig::uefi_disk(&image.disk.path), "node-1", port, true)).unwrap();
    let join_line = wait(&vm, "join report", JOIN_REPORT_MARKER);
    let join = JoinReport::find_in_console(&join_line).unwrap().unwrap();
    wait(&vm, "pivot", "switched into the rootfs");
    wait(
        &vm,
        "kubeadm in discovery",
        "discovery: waiting for the API server endpoint 10.0.2.100:6443",
    );
    vm.quit().unwrap();
    let _ = vm.wait_for_exit(Duration::from_secs(30));
    let cut = console(&vm);
    eprintln!("boot 1: {}", format_timeline(&vm.timeline()));
    assert_eq!(join.rpc, "IssueJoinTicket", "{cut}");
    assert!(!cut.contains("kubeadm join succeeded"), "{cut}");
    assert!(
        !cut.contains(KUBEADM_STATUS),
        "no attempt ended before the cut: {cut}"
    );
    assert_eq!(api_server.connections(), 0);

    // Boot 2: rejoin; kubeadm join again, reaching the endpoint.
    let vm = Vm::start(with_api_server(
        host.node(VmConfig::uefi_disk(&image.disk.path), "node-2", port, false),
        port,
        api_server,
    ))
    .unwrap();
    let rejoin_line = wait(&vm, "join report", JOIN_REPORT_MARKER);
    let rejoin = JoinReport::find_in_console(&rejoin_line).unwrap().unwrap();
    let report_line = wait(&vm, "boot report", BOOT_REPORT_MARKER);
    wait(&vm, "pivot", "switched into the rootfs");
    let config_line = wait(&vm, "kubeadm call", CONFIG_RECEIVED);
    wait(&vm, "kubeadm done", "kubeadm join succeeded");
    let status_line = wait(&vm, "kubeadm status", KUBEADM_STATUS);
    let kubelet_line = wait(&vm, "kubelet running", KUBELET_RUNNING);
    vm.powerdown().unwrap();
    let status = vm
        .wait_for_exit(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("no power-off after ACPI: {e}\n{}", console(&vm)));
    let text = console(&vm);
    eprintln!("boot 2: {}", format_timeline(&vm.timeline()));
    // PID 1's memory after the pivot and kubeadm, for docs/rootfs.md: its code maps from the
    // rootfs copies, nothing from the initramfs, and the printed parts add up.
    let memory = text
        .lines()
        .find(|l| l.contains("boot complete; idle; PID 1 resident memory"))
        .unwrap_or_else(|| panic!("no memory line\n{text}"));
    eprintln!("boot 2: {memory}");
    assert!(
        text.contains("PID 1's code now maps from the rootfs copies"),
        "{text}"
    );
    check_memory_accounting(memory);
    assert!(status.success(), "{status:?}\n{text}");
    // The same disk: the lock of boot 1 holds, nothing was formatted again.
    assert_eq!(rejoin.rpc, "IssueRejoinTicket", "{text}");
    assert_eq!(rejoin.disk_uuid, join.disk_uuid);
    assert_eq!(rejoin.key_fingerprint, join.key_fingerprint);
    // The boot report names the attempt boot 1 left pending.
    let report = BootReport::find_in_console(&report_line).unwrap().unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w
                .starts_with("kubeadm join is pending from an earlier boot after 1 attempt(s)")),
        "{:?}",
        report.warnings
    );
    // Cleaned up, then one join that reached the endpoint and succeeded.
    assert!(text.contains("kubeadm reset -f done"), "{text}");
    assert_eq!(
        text.matches("kubeadm join succeeded in").count(),
        1,
        "{text}"
    );
    assert!(api_server.connections() >= 1);
    let status_json =
        &status_line[status_line.find(KUBEADM_STATUS).unwrap() + KUBEADM_STATUS.len()..];
    let status: serde_json::Value = serde_json::from_str(status_json.trim()).unwrap();
    assert_eq!(status["state"], "done", "{status_line}");
    assert_eq!(status["attempts"], 2, "{status_line}");
    assert!(!text.contains("FATAL"), "{text}");
    (join, config_line, kubelet_line, text)
}

/// A TCP listener on the host's loopback standing in for the API server endpoint: it accepts
/// connections and closes them, counting them.
struct ApiServer {
    port: u16,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ApiServer {
    fn start() -> Self {
        Self::start_at("127.0.0.1:0")
    }

    /// A listener on `address` (of the thread's network namespace).
    fn start_at(address: &str) -> Self {
        let listener = std::net::TcpListener::bind(address).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                if connection.is_ok() {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        ApiServer { port, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `config` with the API server endpoint forwarded to `api_server` (the NIC arguments of
/// `Host::node`, replaced).
fn with_api_server(mut config: VmConfig, join_port: u16, api_server: &ApiServer) -> VmConfig {
    let nic = localhost::user_net_args(Some(join_port), &[]);
    let at = config
        .extra_args
        .windows(nic.len())
        .position(|w| w == nic.as_slice())
        .expect("the node's NIC arguments");
    config.extra_args.splice(
        at..at + nic.len(),
        localhost::user_net_args_with_api_server(Some(join_port), Some(api_server.port), &[]),
    );
    config
}

/// The node name PID 1 derives from the disk UUID (`init::join::client::node_name`).
/// The memory line's parts: resident = anonymous + files + shared (each printed to 0.1 MiB),
/// no initramfs file still mapped, nothing resident from it.
fn check_memory_accounting(line: &str) {
    let mib = |label: &str| -> f64 {
        let before = line
            .split(label)
            .next()
            .unwrap_or_else(|| panic!("{label:?} missing in {line}"));
        let number = before.trim_end().rsplit(' ').nth(1).unwrap_or("");
        number
            .parse()
            .unwrap_or_else(|_| panic!("no number before {label:?} in {line}"))
    };
    let rss = line
        .split("PID 1 resident memory ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no resident figure in {line}"));
    let (anon, file, shared) = (mib(" anonymous"), mib(" files"), mib(" shared (initramfs)"));
    assert!(
        (anon + file + shared - rss).abs() <= 0.15,
        "{anon} + {file} + {shared} is not {rss}: {line}"
    );
    assert!(line.contains(" 0 mappings of initramfs files"), "{line}");
    assert_eq!(shared, 0.0, "{line}");
}

fn hawser_init_node_name(disk_uuid: &str) -> String {
    format!("hawser-{}", &disk_uuid[..8])
}

#[test]
#[ignore = "boots QEMU (~1 min under TCG); run by scripts/test"]
fn a_flipped_rootfs_byte_stops_the_node_before_kubeadm() {
    let image = image();
    let dir = scratch("verity");
    let disk = dir.join("tampered.raw");
    std::fs::copy(&image.disk.path, &disk).unwrap();
    // One byte of the erofs superblock (1024 bytes into the root partition): read at mount.
    let root = &image.disk.partitions[1];
    let offset = root.offset() + 1024 + 8;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&disk)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0x01], offset).unwrap();
    drop(file);

    let host = Host::new(&dir.join("cluster"), &image.image.uki.path);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    let vm = Vm::start(host.node(VmConfig::uefi_disk(&disk), "tampered", port, true)).unwrap();
    // The kernel's own lines: dm-verity names the block, then panics (panic_on_corruption).
    let line = vm
        .wait_for_line(
            |line: &str| line.contains("device-mapper: verity") && line.contains("is corrupted"),
            BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", console(&vm)));
    eprintln!("verity: {line}");
    wait(
        &vm,
        "kernel panic",
        "Kernel panic - not syncing: dm-verity device corrupted",
    );
    // Give a wrongly continuing boot the time to reach kubeadm, then look.
    std::thread::sleep(Duration::from_secs(20));
    vm.kill();
    host.runtime.block_on(service.shutdown());
    let console = console(&vm);
    assert!(!console.contains(CONFIG_RECEIVED), "{console}");
    assert!(!console.contains("switched into the rootfs"), "{console}");
}

/// Join credentials naming one API server endpoint until [`SwitchableTokens::switch`], then
/// another (the local cluster's placeholder credentials: there is no control plane here).
#[derive(Clone)]
struct SwitchableTokens {
    first: localhost::NoControlPlaneTokens,
    then: localhost::NoControlPlaneTokens,
    switched: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SwitchableTokens {
    fn new(first: &str, then: &str) -> Self {
        SwitchableTokens {
            first: localhost::NoControlPlaneTokens::at(first).unwrap(),
            then: localhost::NoControlPlaneTokens::at(then).unwrap(),
            switched: Default::default(),
        }
    }

    fn switch(&self) {
        self.switched
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl hawser_joinservice::tokens::BootstrapTokenIssuer for SwitchableTokens {
    fn issue(
        &self,
        ttl: Duration,
    ) -> Result<hawser_joinservice::tokens::JoinCredentials, hawser_joinservice::tokens::TokenError>
    {
        if self.switched.load(std::sync::atomic::Ordering::SeqCst) {
            self.then.issue(ttl)
        } else {
            self.first.issue(ttl)
        }
    }
}

/// The mesh: 10.99.0.0/24, the host's join service at 10.99.0.1 with its tunnel on UDP 51820.
const MESH_PREFIX: &str = "10.99.0.0/24";
const MESH_JOIN_SERVICE: &str = "10.99.0.1";
/// PID 1's line once its tunnel is up (`hawser_init::mesh::start`).
const MESH_UP: &str = "mesh up: ";

/// A mesh node `name` of `host`'s cluster: its own TPM and state disk, its WireGuard port
/// published on the namespace's loopback as `wireguard_port` and announced to the join service
/// as 10.0.2.2:`wireguard_port` (fw_cfg `vpn_endpoint`), where the other VMs reach it.
fn mesh_node(host: &Host, name: &str, join_port: u16, wireguard_port: u16) -> VmConfig {
    let dir = host.cluster.dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    host.cluster.provision_tpm(&dir.join("tpm")).unwrap();
    let disk = dir.join("state.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(256 << 20))
        .unwrap();
    let mut config = VmConfig::uefi_disk(&image().disk.path)
        .name(name)
        .tpm(hawser_harness::TpmConfig {
            state_dir: Some(dir.join("tpm")),
            ..hawser_harness::TpmConfig::default()
        })
        .disk(&disk, localhost::STATE_DISK_SERIAL)
        .fw_cfg_string("vpn_endpoint", format!("10.0.2.2:{wireguard_port}"))
        .keep_logs_in(host.cluster.dir.join("logs").join(name));
    config
        .extra_args
        .extend(localhost::user_net_args_in_namespace(
            join_port,
            wireguard_port,
        ));
    config
}

/// Two nodes join a cluster whose join service runs a WireGuard mesh: each gets its VPN
/// address in the join ticket and brings its boringtun tunnel up in PID 1 before the pivot;
/// the first learns of the second by polling the join service's peer API inside the mesh; the
/// host reaches both by VPN address; the two nodes' tunnels handshake with each other (their
/// polls report it); kubeadm's configuration carries the VPN address as the node IP; A's
/// kubeadm join discovery reaches the API server endpoint at the join service's VPN address,
/// and B's (pointed at A's VPN address) is answered by A's kernel, both through the mesh.
/// Everything runs in a network namespace the test creates.
#[test]
#[ignore = "boots QEMU twice (~3 min under TCG); run by scripts/test"]
fn two_nodes_join_the_mesh_and_reach_each_other_by_vpn_address() {
    let image = image(); // built in the host's namespace (it may download)
    let _network = PrivateNetwork::enter();
    let host = Host::new(&scratch("mesh"), &image.image.uki.path);
    let port = free_port().unwrap();
    // A's ticket names the API server endpoint at the join service's VPN address; B's names
    // A's VPN address, where nothing listens: B's kubeadm discovery is answered by A's kernel
    // (a TCP reset), through the mesh, B to A and back.
    let tokens = SwitchableTokens::new(&format!("{MESH_JOIN_SERVICE}:6443"), "10.99.0.2:6443");
    let mesh = localhost::LocalMesh {
        prefix: MESH_PREFIX.parse().unwrap(),
        endpoint: "10.0.2.2:51820".parse().unwrap(),
        listen_port: 51820,
        api_port: 9091,
        interface: "hawser0".into(),
    };
    let service = host
        .runtime
        .block_on(host.cluster.start_join_service_with(
            SocketAddr::from(([127, 0, 0, 1], port)),
            &host.measurements,
            tokens.clone(),
            Some(mesh),
        ))
        .unwrap();
    // The API server endpoint inside the mesh: kubeadm's discovery reaches it through the
    // tunnels or not at all.
    let api_server = ApiServer::start_at(&format!("{MESH_JOIN_SERVICE}:6443"));

    let a = Vm::start(mesh_node(&host, "mesh-a", port, 51821)).unwrap();
    let a_up = wait(&a, "A's tunnel", MESH_UP);
    tokens.switch();
    let b = Vm::start(mesh_node(&host, "mesh-b", port, 51822)).unwrap();
    let b_up = wait(&b, "B's tunnel", MESH_UP);
    assert!(a_up.contains(" is 10.99.0.2/24 on hawser0"), "{a_up}");
    assert!(b_up.contains(" is 10.99.0.3/24 on hawser0"), "{b_up}");

    // kubeadm: the VPN address is the node IP, and join discovery goes through the mesh.
    let config_line = wait(&a, "kubeadm configuration", CONFIG_RECEIVED);
    let docs = kubeadm_documents(&config_line);
    let join = document(&docs, "JoinConfiguration");
    assert!(
        join["nodeRegistration"].to_string().contains("10.99.0.2"),
        "node IP 10.99.0.2: {docs:#?}"
    );
    assert_eq!(
        join["discovery"]["bootstrapToken"]["apiServerEndpoint"],
        "10.99.0.1:6443"
    );
    // B's discovery dials A's VPN address, where nothing listens: "connection refused" is
    // A's kernel answering through the mesh (without it, 10.99.0.2 has no route at all).
    wait(
        &b,
        "B's discovery reaches A",
        "waiting for the API server endpoint 10.99.0.2:6443 (Connection refused",
    );
    wait(&a, "A's kubeadm done", "kubeadm join succeeded");
    assert!(
        api_server.connections() >= 1,
        "A's discovery through the mesh"
    );

    // A, up first, learns of B by polling the join service inside the mesh.
    wait(&a, "A learns of B", "mesh: registry version");
    // The host reaches both by VPN address, through the join service's tunnel.
    assert!(pings("10.99.0.2"), "node A by VPN address\n{}", console(&a));
    assert!(pings("10.99.0.3"), "node B by VPN address\n{}", console(&b));
    // A and B handshake with each other: their polls report it.
    let store =
        hawser_joinservice::store::FileStore::open(&host.cluster.dir.join("joined-disks")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (a_key, b_key) = loop {
        use hawser_joinservice::store::{ClusterStore as _, ReadConsistency};
        let registry = store
            .vpn_registry(ReadConsistency::Latest)
            .unwrap()
            .unwrap();
        let key = |ip: &str| {
            registry
                .member_by_ip(ip.parse().unwrap())
                .map(|(id, peer)| (id.to_owned(), peer.public_key))
                .unwrap()
        };
        let ((a_id, a_key), (b_id, b_key)) = (key("10.99.0.2"), key("10.99.0.3"));
        let polls = store.vpn_polls().unwrap();
        // A session with the other (a completed handshake: its initiation and its response
        // crossed), and packets received from it (B's discovery and A's resets).
        let shook = |id: &str, other| {
            polls.get(id).is_some_and(|poll| {
                poll.stats.iter().any(|s| {
                    s.public_key == other && s.last_handshake_unix.is_some() && s.rx_bytes > 0
                })
            })
        };
        if shook(&a_id, b_key) && shook(&b_id, a_key) {
            break (a_key, b_key);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "A and B never reported a handshake with each other: {polls:#?}\nA:\n{}\nB:\n{}",
            console(&a),
            console(&b)
        );
        std::thread::sleep(Duration::from_secs(3));
    };
    eprintln!("A ({a_key}) and B ({b_key}) handshook through the mesh");
    // `hawser peers` on the join service's store: both nodes polling, each with a recent
    // handshake with the other.
    let report =
        hawser_cli::peers::mesh_report(&store, "the local cluster", Duration::from_secs(30))
            .unwrap();
    let table = hawser_cli::peers::table(&report);
    eprintln!("hawser peers:\n{table}");
    let member = |ip: &str| report.members.iter().find(|m| m.vpn_ip == ip).unwrap();
    for (ip, other) in [("10.99.0.2", "10.99.0.3"), ("10.99.0.3", "10.99.0.2")] {
        let (member, other) = (member(ip), &member(other).name);
        assert_eq!(
            member.polling,
            hawser_joinservice::vpn::Polling::Polling,
            "{table}"
        );
        assert!(
            member.peers.iter().any(|p| p.name.as_ref() == Some(other)
                && p.last_handshake_age_secs.is_some_and(|age| age < 180)),
            "{ip} has no recent handshake with {other}:\n{table}"
        );
    }
    a.kill();
    b.kill();
    host.runtime.block_on(service.shutdown());
    for vm in [&a, &b] {
        assert!(!console(vm).contains("FATAL"), "{}", console(vm));
    }
}
