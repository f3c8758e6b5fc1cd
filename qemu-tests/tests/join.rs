//! A node joins: it attests to a real `hawser-joind` on the host over aTLS, receives the key
//! derived for its state disk's LUKS2 UUID, takes the node lock (PCR 15 ← cluster ID), and a
//! node from an image whose command line differs by one byte is refused.
//!
//! The join service runs in this process on 127.0.0.1; the guest reaches it only through QEMU
//! user networking's `guestfwd` (10.0.2.100:7000 → the service), with `restrict=on` so the
//! guest reaches nothing else. Its trust in the service is `insecure-dev` (the host service does
//! not attest); the service verifies the node against the image's predicted measurements and
//! the harness's provider CA, which certified the node's AK before boot.
//!
//! `#[ignore]`d like the other boot tests (OVMF boots under TCG, ~25 s each):
//! `cargo test -p hawser-qemu --test join -- --ignored --test-threads=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_harness::{Vm, VmConfig};
use hawser_image::build::BuildOutput;
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_local::localhost::{self, free_port, luks_uuid};

mod common;
use common::{Host, build_image};

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-join", name)
}

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

fn join_cmdline() -> String {
    localhost::node_cmdline(DEFAULT_CMDLINE, true)
}

fn build(name: &str, cmdline: &str) -> BuildOutput {
    build_image(&scratch(name), Some(cmdline))
}

fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build("image", &join_cmdline()))
}

fn host(name: &str, uki: &Path) -> Host {
    Host::new(&scratch(name), uki)
}

/// A fresh node of `host` booting `uki`.
fn boot(host: &Host, uki: &Path, port: u16) -> (Vm, PathBuf) {
    let config = host.node(VmConfig::uefi(uki), "join", port, true);
    (Vm::start(config).unwrap(), host.state_disk())
}

/// (1) + (2): the join service is down when the node boots; the node retries, logging why;
/// the service comes up; the node receives the key derived for its disk's UUID, and its quote
/// shows PCR 15 locked to the cluster ID.
#[test]
#[ignore = "boots QEMU (~1 min under TCG)"]
fn a_node_joins_after_retries_and_gets_the_key_of_its_disk() {
    let image = image();
    let host = host("join", &image.uki.path);
    let port = free_port().unwrap();
    let (vm, disk) = boot(&host, &image.uki.path, port);

    let failure = vm
        .wait_for_line("join attempt 2", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    eprintln!("while the service is down: {failure}");
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));

    let line = vm
        .wait_for_marker("join report", JOIN_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let join = JoinReport::find_in_console(&line).unwrap().unwrap();
    let report_line = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let report = BootReport::find_in_console(&report_line).unwrap().unwrap();
    let verified = report.verify(None).unwrap();
    vm.kill();
    let console = vm.console_lines().join("\n");
    host.runtime.block_on(service.shutdown());

    // The node told the truth about its disk, and its key is the KDF's for that disk.
    let uuid = luks_uuid(&disk).expect("the node formatted its state disk");
    assert_eq!(join.disk_uuid, uuid.as_str(), "{console}");
    assert_eq!(join.rpc, "IssueJoinTicket");
    assert_eq!(join.via, "join-service");
    let expected_key = host
        .cluster
        .master_secret()
        .state_disk_key(&uuid, hawser_keys::StateDiskKeyLength::Xts)
        .unwrap();
    assert_eq!(
        join.key_fingerprint,
        hawser_keys::fingerprint(&expected_key).as_str()
    );
    assert!(u64::from(join.attempts) >= 3, "{join:?}");
    assert!(
        console.contains("join attempt 1 (IssueJoinTicket to 10.0.2.100:7000) failed"),
        "{console}"
    );
    // The lock: PCR 15 in the signed quote is the cluster ID's extension.
    let cluster_id = host.cluster.cluster_id();
    assert_eq!(join.cluster_id, hex::encode(cluster_id).as_str());
    assert_eq!(
        verified.pcrs[&15],
        hawser_pcr::cluster_lock_pcr(&cluster_id)
    );
    // Secrets never reach the console.
    assert!(!console.contains(&hex::encode(&*expected_key)));
    assert!(!console.contains("FATAL"), "{console}");
}

/// (3): an image whose command line differs by one byte is refused; the node's log names the
/// PCRs (9 and/or 11) that differ.
#[test]
#[ignore = "builds a second image and boots QEMU (~1 min under TCG)"]
fn a_node_with_a_changed_cmdline_is_refused_naming_the_pcr() {
    let good = image();
    let changed = join_cmdline().replace("panic=30", "panic=31");
    let bad = build("image-changed", &changed);
    let host = host("join-refused", &good.uki.path);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    let (vm, _disk) = boot(&host, &bad.uki.path, port);
    let refusal = vm
        .wait_for_line(
            |line: &str| {
                line.contains("join attempt") && (line.contains("PCR 9") || line.contains("PCR 11"))
            },
            BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    eprintln!("refusal: {refusal}");
    vm.kill();
    host.runtime.block_on(service.shutdown());
    assert!(!vm.console_lines().join("\n").contains(JOIN_REPORT_MARKER));
}

/// The GCE node's measured command line before `--platform gce` adds `hawser.platform=gce`:
/// neither an address nor a join endpoint (the cloud gives those).
fn gce_cmdline() -> String {
    format!(
        "{DEFAULT_CMDLINE} hawser.state_disk=serial:{} \
         hawser.state_disk_key_source=join-service hawser.join_service_trust=insecure-dev",
        localhost::STATE_DISK_SERIAL
    )
}

/// Where the emulated GCE node finds its join service: inside the user network's
/// 169.254.169.0/24 (slirp forwards only addresses there), told by the metadata server.
const GCE_JOIN_ENDPOINT: &str = "169.254.169.100:7000";

/// (4) The GCE path, emulated end to end: an image built for `gce` (its measured command line
/// names the platform; its trust bundle is a test CA shaped like Google's), a vTPM laid out as
/// GCE's (Google's AK template and an AK certificate from that CA in Google's NV indices), the
/// address by DHCP and the join endpoint and role from a metadata server in Google's format at
/// 169.254.169.254, and a join service whose measurements select the `gce` profile: the node
/// joins with GCE evidence. Then a node of the QEMU profile is refused by that service, by
/// name. (The reverse, a GCE node refused by a QEMU-profile service, is
/// `joinservice/tests/platforms.rs`'s, on swtpm.)
#[test]
#[ignore = "builds a GCE image and boots QEMU twice (~2 min under TCG)"]
fn a_gce_node_joins_a_gce_profile_service_with_its_settings_from_the_metadata_server() {
    use hawser_harness::TpmConfig;
    use hawser_harness::metadata_server::{MetadataServer, gce_user_netdev};
    use hawser_harness::provider_gce::{GceTestCa, GceTestInstance};

    let dir = scratch("gce");
    let ca = GceTestCa::generate().unwrap();
    let bundle = dir.join("gce-roots.pem");
    std::fs::write(&bundle, ca.bundle_pem()).unwrap();
    let mut opts =
        hawser_image::pipeline::PipelineOptions::new(&common::workspace(), &dir.join("image"));
    opts.cmdline = gce_cmdline();
    opts.platform = hawser_image::platform::ImagePlatform::Gce;
    opts.provider_ca = Some(bundle);
    let (gce, timeline) = hawser_image::pipeline::build_image(&opts).unwrap();
    eprintln!("gce image built: {timeline:?}");

    // The join service of the gce profile: the image's predicted measurements, which name the
    // profile its command line does; the test CA's roots in the provider CA's place.
    let host = host("gce-service", &gce.uki.path);
    let measurements: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&host.measurements).unwrap()).unwrap();
    assert_eq!(measurements["attestationVariant"], "gcp-sev-es");
    std::fs::write(
        host.cluster.dir.join(localhost::PLATFORM_ROOTS_FILE),
        ca.bundle_pem(),
    )
    .unwrap();
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));

    // The cloud: the vTPM, the metadata server, the network.
    let tpm_dir = host.cluster.dir.join("gce-tpm");
    let provisioned = ca
        .provision_state_dir(&tpm_dir, &GceTestInstance::example())
        .unwrap();
    let metadata = MetadataServer::gce([
        ("hawser-join_endpoint", GCE_JOIN_ENDPOINT),
        ("hawser-role", "worker"),
        ("startup-script", "not hawser's: ignored"),
    ])
    .unwrap();
    let disk = host.cluster.dir.join("gce-state.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(256 << 20))
        .unwrap();
    let (join_host, join_port) = GCE_JOIN_ENDPOINT.split_once(':').unwrap();
    let netdev = format!(
        "{},guestfwd=tcp:{join_host}:{join_port}-cmd:bash -c \
         'exec 3<>/dev/tcp/127.0.0.1/{port} || exit 1; cat <&3 & cat >&3; kill %1'",
        gce_user_netdev("n0", metadata.port())
    );
    let mut config = VmConfig::uefi(&gce.uki.path)
        .name("gce")
        .tpm(TpmConfig {
            state_dir: Some(tpm_dir),
            ..TpmConfig::default()
        })
        .disk(&disk, localhost::STATE_DISK_SERIAL)
        .keep_logs_in(host.cluster.dir.join("logs").join("gce"));
    config.extra_args.extend([
        "-netdev".to_owned(),
        netdev,
        "-device".to_owned(),
        "virtio-net-pci,netdev=n0".to_owned(),
    ]);
    let vm = Vm::start(config).unwrap();
    let line = vm
        .wait_for_marker("join report", JOIN_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let join = JoinReport::find_in_console(&line).unwrap().unwrap();
    vm.kill();
    let console = vm.console_lines().join("\n");

    assert_eq!(join.rpc, "IssueJoinTicket", "{console}");
    assert_eq!(
        join.cluster_id,
        hex::encode(host.cluster.cluster_id()).as_str()
    );
    let uuid = luks_uuid(&disk).expect("the node formatted its state disk");
    assert_eq!(join.disk_uuid, uuid.as_str(), "{console}");
    // The settings came from the cloud: the address by DHCP, the rest from the metadata
    // server, asked the way Google requires.
    for expected in [
        "platform: gce (hawser.platform)",
        "by DHCP from 169.254.169.2",
        "GCE instance metadata: join_endpoint, role",
    ] {
        assert!(
            console.contains(expected),
            "{expected:?} missing:\n{console}"
        );
    }
    let requests = metadata.requests();
    assert!(
        !requests.is_empty(),
        "no request reached the metadata server"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.header("Metadata-Flavor") == Some("Google")),
        "{requests:?}"
    );
    // The disk is recorded under the AK Google's template gives on this vTPM.
    let ak_name = {
        use sha2::{Digest as _, Sha256};
        let mut name = vec![0x00, 0x0b];
        name.extend_from_slice(&Sha256::digest(&provisioned.ak_public));
        hex::encode(name)
    };
    let registry = std::fs::read_to_string(host.cluster.dir.join("joined-disks")).unwrap();
    assert!(
        registry.contains(&format!("{uuid} {ak_name}")),
        "{registry}\n{console}"
    );

    // A node of the QEMU profile (the provider CA's AK) is refused by this service by name.
    let qemu = image();
    let (vm, _disk) = boot(&host, &qemu.uki.path, port);
    let reason =
        "the cluster's measurements select the gce profile; the peer presented qemu evidence";
    let refusal = vm
        .wait_for_line(
            |line: &str| line.contains("join attempt") && line.contains(reason),
            BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    eprintln!("refusal: {refusal}");
    vm.kill();
    host.runtime.block_on(service.shutdown());
}
