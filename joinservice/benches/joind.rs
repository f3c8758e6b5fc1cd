//! Join throughput of one `hawser-joind` process: many concurrent nodes, each making a fresh
//! aTLS connection (its swtpm quotes the server's nonce, the server validates the evidence)
//! and one IssueJoinTicket call (PCR check, HKDF, a bootstrap token from the kubeadm stand-in,
//! registry append), at 16, 64 and 256 concurrent clients.
//!
//! The server is the real binary, started afresh per level, so its peak memory (VmHWM) belongs
//! to that level. Clients run in this process on a 2-worker runtime, with their quotes spread
//! over several swtpms; server and clients share the machine's 2 cores.
//!
//! `cargo bench -p hawser-joinservice --bench joind` (prints a table).
//! `HAWSER_BENCH_JOINS` (default 1500) joins per level; `HAWSER_BENCH_SWTPMS` (default 4);
//! `HAWSER_BENCH_KUBEADM` replaces the kubeadm stand-in.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy};
use hawser_attestation::evidence::EvidenceIssuer;
use hawser_attestation::{Tpm, TpmIssuer};
use hawser_keys::MasterSecret;
use hawser_measurements::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, extend_sha256, phase_digest};
use hawser_proto::join::IssueJoinTicketRequest;
use hawser_proto::join::join_service_client::JoinServiceClient;
use hawser_qemu::provider::ProviderCa;
use hawser_qemu::{Swtpm, SwtpmOptions};
use tonic::transport::Endpoint;

const LEVELS: [usize; 3] = [16, 64, 256];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let joins = env_usize("HAWSER_BENCH_JOINS", 1500);
    let swtpms = env_usize("HAWSER_BENCH_SWTPMS", 4).max(1);
    let kubeadm = std::env::var_os("HAWSER_BENCH_KUBEADM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubeadm-standin")
        });
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = ProviderCa::generate("bench provider").expect("CA");
    std::fs::write(dir.path().join("ca.pem"), ca.certificate_pem()).expect("write");
    MasterSecret::generate()
        .expect("secret")
        .write_new_file(&dir.path().join("master.json"))
        .expect("write");
    let pcr11 = extend_sha256(&[0; 32], &phase_digest(PHASE_ENTER_INITRD));
    std::fs::write(
        dir.path().join("measurements.json"),
        format!(
            r#"{{"4": {{"expected": "{}", "warnOnly": false}}, "11": {{"expected": "{}", "warnOnly": false}}}}"#,
            "00".repeat(32),
            hex::encode(pcr11)
        ),
    )
    .expect("write");
    std::fs::write(dir.path().join("admin.conf"), "kind: Config\n").expect("write");

    let tpms: Vec<Swtpm> = (0..swtpms)
        .map(|_| {
            let swtpm = Swtpm::start(&SwtpmOptions::tcp()).expect("swtpm");
            ca.provision(&swtpm).expect("provision");
            swtpm
        })
        .collect();
    let issuers: Vec<Arc<TpmIssuer>> = tpms
        .iter()
        .map(|swtpm| {
            let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open");
            tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
                .expect("extend");
            Arc::new(TpmIssuer::new(Arc::new(tpm)).expect("issuer"))
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    println!(
        "hawser-joind: {joins} joins per level, each a fresh aTLS connection (client quote on one of {swtpms} swtpms) + IssueJoinTicket; kubeadm = {}",
        kubeadm.display()
    );
    println!(
        "{:>11} | {:>8} | {:>8} | {:>8} | {:>8} | {:>10} | {:>6}",
        "concurrent", "joins/s", "p50 ms", "p99 ms", "max ms", "VmHWM MiB", "errors"
    );
    for level in LEVELS {
        let state = dir.path().join(format!("state-{level}"));
        let mut joind = start_joind(dir.path(), &state, &kubeadm);
        let addr = read_listen_addr(&mut joind);
        let result = runtime.block_on(run_level(&addr, level, joins, &issuers));
        let hwm = vm_hwm_kib(joind.id());
        let _ = joind.kill();
        let _ = joind.wait();
        let mut latencies = result.latencies;
        latencies.sort_unstable();
        let pct = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "{:>11} | {:>8.0} | {:>8.1} | {:>8.1} | {:>8.1} | {:>10.1} | {:>6}",
            level,
            latencies.len() as f64 / result.elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
            pct(1.0),
            hwm as f64 / 1024.0,
            result.errors
        );
        if let Some(e) = result.first_error {
            println!("    first error: {e}");
        }
    }
    drop(runtime); // its tasks may hold issuers
    drop(issuers);
    drop(tpms);
}

fn start_joind(dir: &Path, state: &Path, kubeadm: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hawser-joind"))
        .args(["--listen", "127.0.0.1:0", "--kubernetes-version", "v1.33.4"])
        .arg("--measurements")
        .arg(dir.join("measurements.json"))
        .arg("--master-secret")
        .arg(dir.join("master.json"))
        .arg("--provider-ca")
        .arg(dir.join("ca.pem"))
        .arg("--kubeadm")
        .arg(kubeadm)
        .arg("--kubeconfig")
        .arg(dir.join("admin.conf"))
        .arg("--state-dir")
        .arg(state)
        // All clients come from 127.0.0.1: lift the per-peer limit for the benchmark.
        .args(["--rate-per-sec", "1000000", "--burst", "1000000"])
        .args(["--log", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hawser-joind")
}

fn read_listen_addr(joind: &mut Child) -> String {
    let stdout = joind.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read joind stdout");
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected joind output {line:?}"))
        .to_owned()
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

struct LevelResult {
    latencies: Vec<Duration>,
    elapsed: Duration,
    errors: usize,
    first_error: Option<String>,
}

async fn run_level(
    addr: &str,
    level: usize,
    joins: usize,
    issuers: &[Arc<TpmIssuer>],
) -> LevelResult {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..level {
        let issuer = Arc::clone(&issuers[worker % issuers.len()]) as Arc<dyn EvidenceIssuer>;
        let client = AtlsClient::new(Identity::attested(issuer), PeerPolicy::Unauthenticated);
        let next = Arc::clone(&next);
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= joins {
                    break;
                }
                let t = Instant::now();
                let result = async {
                    let channel = endpoint
                        .connect_with_connector(client.connector())
                        .await
                        .map_err(|e| format!("connect: {e:?}"))?;
                    JoinServiceClient::new(channel)
                        .issue_join_ticket(IssueJoinTicketRequest {
                            disk_uuid: format!("{level:08x}-0000-4000-8000-{i:012x}"),
                            node_name: format!("node-{i}"),
                            is_control_plane: false,
                            kubelet_csr: Vec::new(),
                        })
                        .await
                        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
                }
                .await;
                match result {
                    Ok(_) => latencies.push(t.elapsed()),
                    Err(e) => errors.push(e),
                }
            }
            (latencies, errors)
        }));
    }
    let mut result = LevelResult {
        latencies: Vec::new(),
        elapsed: Duration::ZERO,
        errors: 0,
        first_error: None,
    };
    for task in tasks {
        let (latencies, errors) = task.await.expect("client task");
        result.latencies.extend(latencies);
        result.errors += errors.len();
        if result.first_error.is_none() {
            result.first_error = errors.into_iter().next();
        }
    }
    result.elapsed = started.elapsed();
    result
}
