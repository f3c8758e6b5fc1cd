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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport};
use hawser_image::build::BuildOutput;
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_joinservice::core::{JoinCore, JoinCoreConfig};
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::service::{self, RunningService, ServiceConfig};
use hawser_joinservice::tokens::{BootstrapTokenIssuer, JoinCredentials, TokenError};
use hawser_keys::MasterSecret;
use hawser_measurements::predict::{Phase, Prediction};
use hawser_qemu::{ProviderCa, TpmConfig, Vm, VmConfig};
use sha2::{Digest as _, Sha256};

mod common;
use common::build_image;

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-join", name)
}

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const SERIAL: &str = "hawser-state";
const JOIN_REPORT_MARKER: &str = "HAWSER_JOIN_REPORT ";

fn join_cmdline() -> String {
    format!(
        "{DEFAULT_CMDLINE} hawser.net=10.0.2.15/24,10.0.2.2 hawser.join_service_trust=insecure-dev \
         hawser.join_endpoint=10.0.2.100:7000 hawser.state_disk=serial:{SERIAL} \
         hawser.state_disk_key_source=join-service"
    )
}

fn build(name: &str, cmdline: &str) -> BuildOutput {
    build_image(&scratch(name), Some(cmdline))
}

fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build("image", &join_cmdline()))
}

/// Expected measurements (Constellation's format) predicted from the UKI, all enforced.
fn expected_measurements(uki: &Path, out: &Path) {
    let prediction = Prediction::from_uki(&std::fs::read(uki).unwrap(), "join test").unwrap();
    let map: serde_json::Map<String, serde_json::Value> = prediction
        .pcrs(Phase::EnterInitrd)
        .into_iter()
        .map(|(pcr, value)| {
            (
                pcr.to_string(),
                serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
            )
        })
        .collect();
    std::fs::write(out, serde_json::Value::Object(map).to_string()).unwrap();
}

/// An honest stand-in for kubeadm: there is no cluster in these tests.
struct FixedTokens;

impl BootstrapTokenIssuer for FixedTokens {
    fn issue(&self, _ttl: Duration) -> Result<JoinCredentials, TokenError> {
        Ok(JoinCredentials {
            api_server_endpoint: "10.0.2.100:6443".to_owned(),
            bootstrap_token: "abcdef.0123456789abcdef".to_owned(),
            discovery_ca_cert_hashes: vec![format!("sha256:{}", "ab".repeat(32))],
        })
    }
}

/// The host side: a provider CA, a master secret, a join service configuration.
struct Host {
    runtime: tokio::runtime::Runtime,
    dir: PathBuf,
    provider: ProviderCa,
    master: MasterSecret,
    salt: Vec<u8>,
}

impl Host {
    fn new(name: &str, uki: &Path) -> Host {
        let dir = scratch(name);
        expected_measurements(uki, &dir.join("measurements.json"));
        Host {
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
            provider: ProviderCa::generate("hawser join test provider").unwrap(),
            master: MasterSecret::generate().unwrap(),
            salt: Sha256::digest(name.as_bytes()).to_vec(),
            dir,
        }
    }

    fn start_service(&self, listen: SocketAddr) -> RunningService {
        let policy = Arc::new(PolicyStore::load(&self.dir.join("measurements.json")).unwrap());
        let core = JoinCore::new(
            policy,
            Arc::new(FixedTokens),
            JoinCoreConfig {
                master_secret: self.master.clone(),
                measurement_salt: self.salt.clone(),
                kubernetes_version: "v1.33.4".to_owned(),
                token_ttl: Duration::from_secs(600),
                pki_dir: None,
                registry_file: self.dir.join("joined-disks"),
            },
        )
        .unwrap();
        let config = ServiceConfig::new(listen, Arc::new(core), self.provider.certificate_pem());
        self.runtime.block_on(service::spawn(config)).unwrap()
    }

    /// A VM for `uki` whose NIC reaches only `port` on the host's loopback.
    fn boot(&self, uki: &Path, port: u16) -> (Vm, PathBuf) {
        let tpm_dir = self.dir.join("tpm");
        std::fs::create_dir_all(&tpm_dir).unwrap();
        self.provider.provision_state_dir(&tpm_dir).unwrap();
        let disk = self.dir.join("state.img");
        std::fs::File::create(&disk)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let mut config = VmConfig::uefi(uki)
            .name("join")
            .tpm(TpmConfig {
                state_dir: Some(tpm_dir),
                ..TpmConfig::default()
            })
            .disk(&disk, SERIAL)
            .keep_logs_in(self.dir.join("logs"));
        config.extra_args.extend([
            "-netdev".to_owned(),
            // A `tcp:` chardev target connects once, at QEMU start (and fails if the service
            // is down); `cmd:` runs a relay per guest connection (bash's /dev/tcp: there is no
            // netcat on these hosts), so the service may come up after the node booted.
            format!(
                "user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:7000-cmd:bash -c \
                 'exec 3<>/dev/tcp/127.0.0.1/{port} || exit 1; cat <&3 & cat >&3; kill %1'"
            ),
            "-device".to_owned(),
            "virtio-net-pci,netdev=n0".to_owned(),
        ]);
        (Vm::start(config).unwrap(), disk)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The LUKS2 UUID in the disk's primary binary header (offset 168, 40 bytes, NUL-padded).
fn luks_uuid(disk: &Path) -> String {
    use std::os::unix::fs::FileExt as _;
    let mut buf = [0u8; 40];
    std::fs::File::open(disk)
        .unwrap()
        .read_exact_at(&mut buf, 168)
        .unwrap();
    String::from_utf8_lossy(&buf)
        .trim_end_matches('\0')
        .to_owned()
}

/// Constellation's node lock: the sha256 bank of PCR 15 extended with the cluster ID itself.
fn pcr15_for(cluster_id: &[u8; 32]) -> [u8; 32] {
    Sha256::new()
        .chain_update([0u8; 32])
        .chain_update(cluster_id)
        .finalize()
        .into()
}

/// (1) + (2): the join service is down when the node boots; the node retries, logging why;
/// the service comes up; the node receives the key derived for its disk's UUID, and its quote
/// shows PCR 15 locked to the cluster ID.
#[test]
#[ignore = "boots QEMU (~1 min under TCG)"]
fn a_node_joins_after_retries_and_gets_the_key_of_its_disk() {
    let image = image();
    let host = Host::new("join", &image.uki.path);
    let port = free_port();
    let (vm, disk) = host.boot(&image.uki.path, port);

    let failure = vm
        .wait_for_line("join attempt 2", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    eprintln!("while the service is down: {failure}");
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));

    let line = vm
        .wait_for_marker("join report", JOIN_REPORT_MARKER, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let json = &line[line.find(JOIN_REPORT_MARKER).unwrap() + JOIN_REPORT_MARKER.len()..];
    let join: serde_json::Value = serde_json::from_str(json).unwrap();
    let report_line = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}\n{}", vm.console_lines().join("\n")));
    let report = BootReport::find_in_console(&report_line).unwrap().unwrap();
    let verified = report.verify(None).unwrap();
    vm.kill();
    let console = vm.console_lines().join("\n");
    host.runtime.block_on(service.shutdown());

    // The node told the truth about its disk, and its key is the KDF's for that disk.
    let uuid = luks_uuid(&disk);
    assert_eq!(join["disk_uuid"], uuid.as_str(), "{console}");
    assert_eq!(join["rpc"], "IssueJoinTicket");
    let expected_key = host.master.state_disk_key(&uuid).unwrap();
    assert_eq!(
        join["key_fingerprint"],
        hawser_keys::fingerprint(&*expected_key).as_str()
    );
    assert!(join["attempts"].as_u64().unwrap() >= 3, "{join}");
    assert!(
        console.contains("join attempt 1 (IssueJoinTicket to 10.0.2.100:7000) failed"),
        "{console}"
    );
    // The lock: PCR 15 in the signed quote is the cluster ID's extension.
    let cluster_id = hawser_keys::cluster_id(&*host.master.measurement_secret(), &host.salt);
    assert_eq!(join["cluster_id"], hex::encode(cluster_id).as_str());
    assert_eq!(verified.pcrs[&15], pcr15_for(&cluster_id));
    // Secrets never reach the console.
    assert!(!console.contains(&hex::encode(*expected_key)));
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
    let host = Host::new("join-refused", &good.uki.path);
    let port = free_port();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    let (vm, _disk) = host.boot(&bad.uki.path, port);
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
