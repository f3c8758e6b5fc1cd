//! Join throughput and latency of one `hawser-joind` process, side by side with its floor:
//! many concurrent nodes, each making a fresh aTLS connection (its swtpm quotes the server's
//! nonce, the server validates the evidence) and one IssueJoinTicket call as a worker node
//! (PCR check, HKDF, a bootstrap token of its own taken from the service's pool of tokens
//! minted ahead, disk bound to the AK in the registry: append + fdatasync, audit line), at 16,
//! 64 and 256 concurrent clients. The pool (`--token-pool`) holds a level's joins and is full
//! before the level starts: what is measured is a burst the pool covers; its minting (one
//! kubeadm stand-in process per token) runs before, and is reported apart.
//!
//! The floor, measured in the same run at the same levels with the same load model and the
//! same client runtime, is what any attested join must at least cost on this stack:
//!
//! - **TLS**: a plain TLS 1.3 handshake on a fresh connection, rustls with the same crypto
//!   provider as aTLS (ring, TLS 1.3 suites only), the server's certificate a self-signed
//!   ECDSA P-256 one made by the same code as `hawser-joind`'s (`TlsKey`), the client checking
//!   it as the bench's join clients check the service (the key's CertificateVerify), no
//!   resumption; then a 32-byte request and a 32-byte response.
//! - **TLS+verify**: the same plus one ECDSA P-256 SHA-256 verify per operation on the server
//!   (ring, as the validator checks a quote's signature), over a message the size of a quote.
//!
//! Each floor server is this bench binary re-run as a separate process
//! (`--floor-server tls|tls-verify`) on a default tokio runtime, as `hawser-joind` is, so its
//! CPU and peak memory are counted as the join service's are.
//!
//! Two load models, because they answer different questions:
//!
//! - **Closed loop** (default): N clients, each starts its next operation when its last one
//!   ends. This finds the throughput ceiling, but its latency is fixed by Little's law (N in
//!   flight / throughput) and hides queueing: a slow server also slows the arrivals.
//! - **Open loop** (`HAWSER_BENCH_RATE=<operations per second>`): operations *arrive* on a
//!   fixed schedule (arrival i at start + i / rate) whatever the server does; each runs as its
//!   own task, at most N in flight. An arrival that finds N in flight waits for a slot, and
//!   that wait is part of its latency: latency runs from the *scheduled* arrival time, so a
//!   stalled server or a late arrival loop cannot hide queueing (no coordinated omission).
//!
//! Each server is started afresh per level and workload, so its peak memory (VmHWM) belongs
//! to that measurement; `hawser-joind` logs at `info` (the audit lines) to a file. Clients run
//! in this process on a 2-worker runtime, with their quotes spread over several swtpms;
//! servers, clients and swtpms share the machine. Because the machine may be shared, each row
//! also says how busy it was: the 1-minute load average before the workload, and the CPU that
//! processes other than the benchmark, its swtpms and the server used during it (in cores).
//!
//! `cargo bench -p hawser-joinservice --bench joind` prints two Markdown tables: one row per
//! level and workload, then the join beside its floor per level. Environment:
//! - `HAWSER_BENCH_JOINS` (default 1500): operations per level and workload;
//! - `HAWSER_BENCH_LEVELS` (default `16,64,256`): concurrency levels;
//! - `HAWSER_BENCH_RATE`: open loop at this many operations per second (unset: closed loop);
//! - `HAWSER_BENCH_SWTPMS` (default 4): swtpms the clients quote on, round robin;
//! - `HAWSER_BENCH_KUBEADM`: replaces the kubeadm stand-in;
//! - `HAWSER_BENCH_TOKEN_POOL` (default: twice `HAWSER_BENCH_JOINS`, so that no refill runs during a level): `hawser-joind --token-pool`;
//!   the level starts once the pool is full (0: every join runs kubeadm);
//! - `HAWSER_BENCH_MAX_LOAD`: before each level, wait while the 1-minute load average is above
//!   this (polled every 30 s, for at most `HAWSER_BENCH_MAX_WAIT_SECS`, default 600), then run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::future::Future;
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy, TlsKey};
use hawser_attestation::evidence::EvidenceIssuer;
use hawser_attestation::{Tpm, TpmIssuer};
use hawser_harness::provider::ProviderCa;
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_keys::MasterSecret;
use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, extend_sha256, phase_digest};
use hawser_proto::join::IssueJoinTicketRequest;
use hawser_proto::join::join_service_client::JoinServiceClient;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::NoServerSessionStorage;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::Endpoint;

const DEFAULT_LEVELS: [usize; 3] = [16, 64, 256];

/// `/proc` reports CPU time in USER_HZ ticks, which the kernel fixes at 100 per second on every
/// mainstream architecture (it is part of the ABI, independent of CONFIG_HZ).
const TICKS_PER_SEC: f64 = 100.0;

/// The floor's request and response.
const FLOOR_REQUEST: [u8; 32] = [0x71; 32];
const FLOOR_RESPONSE: [u8; 32] = [0x72; 32];
/// A quote's signed TPMS_ATTEST over one sha256 PCR selection is about this long.
const QUOTE_ATTEST_LEN: usize = 145;

/// What one level measures, in the order it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// aTLS with the client's quote, then IssueJoinTicket, against `hawser-joind`.
    Join,
    /// The floor: a plain TLS 1.3 handshake and a 32-byte request and response.
    Tls,
    /// The floor plus one ECDSA P-256 verify per operation on the server.
    TlsVerify,
}

impl Workload {
    const ALL: [Workload; 3] = [Workload::Join, Workload::Tls, Workload::TlsVerify];

    fn name(self) -> &'static str {
        match self {
            Workload::Join => "join",
            Workload::Tls => "TLS",
            Workload::TlsVerify => "TLS+verify",
        }
    }

    /// The floor server's `--floor-server` argument.
    fn floor_arg(self) -> Option<&'static str> {
        match self {
            Workload::Join => None,
            Workload::Tls => Some("tls"),
            Workload::TlsVerify => Some("tls-verify"),
        }
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A positive number from the environment; unset or empty is `None`.
fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.parse::<f64>()
                .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        })
        .filter(|v| *v > 0.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(position) = args.iter().position(|a| a == "--floor-server") {
        let kind = args
            .get(position + 1)
            .expect("--floor-server tls|tls-verify");
        serve_floor(kind);
        return;
    }

    let joins = env_usize("HAWSER_BENCH_JOINS", 1500);
    let swtpms = env_usize("HAWSER_BENCH_SWTPMS", 4).max(1);
    let rate = env_f64("HAWSER_BENCH_RATE");
    let max_load = env_f64("HAWSER_BENCH_MAX_LOAD");
    let max_wait = Duration::from_secs(env_usize("HAWSER_BENCH_MAX_WAIT_SECS", 600) as u64);
    let levels: Vec<usize> = std::env::var("HAWSER_BENCH_LEVELS").map_or_else(
        |_| DEFAULT_LEVELS.to_vec(),
        |v| {
            v.split(',')
                .map(|l| {
                    l.trim()
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .unwrap_or_else(|| panic!("HAWSER_BENCH_LEVELS: {l:?} is not a level"))
                })
                .collect()
        },
    );
    let token_pool = env_usize("HAWSER_BENCH_TOKEN_POOL", 2 * joins);
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
    let swtpm_pids: Vec<u32> = tpms.iter().map(Swtpm::pid).collect();
    let clients: Arc<[AtlsClient]> = tpms
        .iter()
        .map(|swtpm| {
            let tpm = Tpm::open(&swtpm.tcti().expect("tcti")).expect("open");
            tpm.extend_phase(PCR_KERNEL_BOOT, PHASE_ENTER_INITRD)
                .expect("extend");
            let issuer = Arc::new(TpmIssuer::new(Arc::new(tpm)).expect("issuer"));
            AtlsClient::new(
                Identity::attested(issuer as Arc<dyn EvidenceIssuer>),
                PeerPolicy::Unauthenticated,
            )
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let mode = match rate {
        Some(rate) => format!(
            "open loop: {rate} operations/s arriving, at most <concurrent> in flight, latency from the scheduled arrival"
        ),
        None => {
            "closed loop: <concurrent> clients, each starts its next operation when its last ends"
                .to_owned()
        }
    };
    println!(
        "hawser-joind, {mode}; {joins} operations per level and workload. join = a fresh aTLS connection (client quote on one of {swtpms} swtpms) + IssueJoinTicket (worker); kubeadm = {}, token pool {token_pool} (full before each level). TLS = a fresh TLS 1.3 connection (ECDSA P-256 server certificate) + 32-byte request/response; TLS+verify = TLS + one ECDSA P-256 verify on the server",
        kubeadm.display()
    );
    println!(
        "| concurrent | workload | offered/s | ops/s | p50 ms | p99 ms | max ms | server VmHWM MiB | errors | queued | load1 | other cores | server CPU ms/op | client CPU ms/op |"
    );
    println!("|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut compared = Vec::new();
    for level in levels {
        let load1 = wait_for_quiet(max_load, max_wait);
        let mut measured = Vec::new();
        for workload in Workload::ALL {
            let (mut server, op) = match workload.floor_arg() {
                None => {
                    let state = dir.path().join(format!("state-{level}"));
                    let log = dir.path().join(format!("joind-{level}.log"));
                    let mut joind = start_joind(dir.path(), &state, &kubeadm, &log, token_pool);
                    let addr = read_stdout_lines(&mut joind, &log, 1)[0]
                        .strip_prefix("listening on ")
                        .expect("listening on")
                        .to_owned();
                    if token_pool > 0 {
                        let started = Instant::now();
                        wait_for_log(&log, "bootstrap token pool filled");
                        eprintln!(
                            "level {level}: {token_pool} tokens minted ahead in {:.1} s",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    (joind, join_op(&addr, level, Arc::clone(&clients)))
                }
                Some(kind) => {
                    let log = dir.path().join(format!("floor-{kind}-{level}.log"));
                    let mut floor = start_floor_server(kind, &log);
                    let lines = read_stdout_lines(&mut floor, &log, 2);
                    let addr = lines[0]
                        .strip_prefix("listening on ")
                        .expect("listening on")
                        .parse()
                        .expect("floor address");
                    let certificate = hex::decode(
                        lines[1]
                            .strip_prefix("certificate ")
                            .expect("floor certificate"),
                    )
                    .expect("floor certificate hex");
                    (floor, floor_op(addr, floor_connector(certificate)))
                }
            };
            // The first workload of a level waited for a quiet machine; the others follow it.
            let load1 = if workload == Workload::Join {
                load1
            } else {
                load_average()
            };
            let row = measure(
                &runtime,
                rate,
                level,
                joins,
                op,
                &server,
                &swtpm_pids,
                load1,
            );
            let _ = server.kill();
            let _ = server.wait();
            println!(
                "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                level,
                workload.name(),
                rate.map_or_else(|| "—".to_owned(), |r| format!("{r:.0}")),
                row.ops_per_sec,
                row.p50_ms,
                row.p99_ms,
                row.max_ms,
                row.hwm_mib,
                row.errors,
                rate.map_or_else(|| "—".to_owned(), |_| row.queued.to_string()),
                row.load1,
                row.other_cores,
                row.server_cpu_ms,
                row.client_cpu_ms,
            );
            if let Some(e) = &row.first_error {
                println!("    first {} error: {e}", workload.name());
            }
            measured.push(row);
        }
        compared.push((level, measured));
    }
    drop(runtime); // its tasks may hold issuers
    drop(clients);
    drop(tpms);

    println!();
    println!(
        "Join beside its floor (× = how many times the floor's cost a join is: floor ops/s ÷ joins/s, join p99 ÷ floor p99; CPU in ms per operation, server + client side):"
    );
    println!(
        "| concurrent | offered/s | joins/s | TLS/s | TLS+verify/s | × TLS | × TLS+verify | join p50/p99 ms | TLS p50/p99 ms | TLS+verify p50/p99 ms | p99 × TLS | p99 × TLS+verify | CPU join | CPU TLS | CPU TLS+verify |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (level, measured) in compared {
        let [join, tls, verify] = &measured[..] else {
            unreachable!("three workloads per level")
        };
        let cpu = |m: &Measured| format!("{:.2} + {:.2}", m.server_cpu_ms, m.client_cpu_ms);
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            level,
            rate.map_or_else(|| "—".to_owned(), |r| format!("{r:.0}")),
            join.ops_per_sec,
            tls.ops_per_sec,
            verify.ops_per_sec,
            tls.ops_per_sec / join.ops_per_sec,
            verify.ops_per_sec / join.ops_per_sec,
            join.p50_ms,
            join.p99_ms,
            tls.p50_ms,
            tls.p99_ms,
            verify.p50_ms,
            verify.p99_ms,
            join.p99_ms / tls.p99_ms,
            join.p99_ms / verify.p99_ms,
            cpu(join),
            cpu(tls),
            cpu(verify),
        );
    }
}

/// One workload at one level, summarised.
struct Measured {
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    hwm_mib: f64,
    errors: usize,
    queued: usize,
    load1: f64,
    /// CPU used by everything but the server, the bench process and its swtpms, in cores.
    other_cores: f64,
    server_cpu_ms: f64,
    client_cpu_ms: f64,
    first_error: Option<String>,
}

/// Runs `ops` operations of `op` at `level` against `server` and reads what it cost.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
fn measure(
    runtime: &tokio::runtime::Runtime,
    rate: Option<f64>,
    level: usize,
    ops: usize,
    op: Op,
    server: &Child,
    swtpm_pids: &[u32],
    load1: f64,
) -> Measured {
    let before = CpuSample::take(server.id(), swtpm_pids);
    let result = match rate {
        Some(rate) => runtime.block_on(run_open_loop(level, ops, rate, op)),
        None => runtime.block_on(run_closed_loop(level, ops, op)),
    };
    let after = CpuSample::take(server.id(), swtpm_pids);
    let hwm = vm_hwm_kib(server.id());

    let mut latencies = result.latencies;
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    let done = latencies.len().max(1) as f64;
    let secs = result.elapsed.as_secs_f64();
    let machine = after.machine_busy.saturating_sub(before.machine_busy);
    let server_cpu = after.server.saturating_sub(before.server);
    let clients_cpu = after.clients.saturating_sub(before.clients);
    let other = machine.saturating_sub(server_cpu + clients_cpu);
    let ms_per_op = |ticks: u64| ticks as f64 / TICKS_PER_SEC * 1e3 / done;
    Measured {
        ops_per_sec: latencies.len() as f64 / secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        hwm_mib: hwm as f64 / 1024.0,
        errors: result.errors,
        queued: result.queued,
        load1,
        other_cores: other as f64 / TICKS_PER_SEC / secs,
        server_cpu_ms: ms_per_op(server_cpu),
        client_cpu_ms: ms_per_op(clients_cpu),
        first_error: result.first_error,
    }
}

/// The 1-minute load average, after waiting (if `max_load` is set) for it to drop to
/// `max_load` or for `max_wait` to pass, whichever comes first.
fn wait_for_quiet(max_load: Option<f64>, max_wait: Duration) -> f64 {
    let started = Instant::now();
    loop {
        let load1 = load_average();
        match max_load {
            Some(max) if load1 > max && started.elapsed() < max_wait => {
                eprintln!(
                    "load average {load1:.2} > {max}: waiting 30 s (waited {} s so far)",
                    started.elapsed().as_secs()
                );
                std::thread::sleep(Duration::from_secs(30));
            }
            _ => return load1,
        }
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// CPU time in ticks: the whole machine (busy, all CPUs), the server (with the children it
/// waited for, i.e. `hawser-joind`'s kubeadm), and the client side (this process and the
/// swtpms).
struct CpuSample {
    machine_busy: u64,
    server: u64,
    clients: u64,
}

impl CpuSample {
    fn take(server: u32, swtpms: &[u32]) -> Self {
        let machine_busy = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let fields: Vec<u64> = s
                    .lines()
                    .next()?
                    .strip_prefix("cpu ")?
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal …: busy = all but idle, iowait.
                Some(fields.iter().take(8).sum::<u64>() - fields.get(3)? - fields.get(4)?)
            })
            .unwrap_or(0);
        Self {
            machine_busy,
            server: process_ticks(&server.to_string(), true).unwrap_or(0),
            clients: process_ticks("self", false).unwrap_or(0)
                + swtpms
                    .iter()
                    .map(|pid| process_ticks(&pid.to_string(), false).unwrap_or(0))
                    .sum::<u64>(),
        }
    }
}

/// utime + stime (+ cutime + cstime with `children`) of `/proc/<pid>/stat`.
fn process_ticks(pid: &str, children: bool) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; the fields after it are numbers.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14..=17.
    let count = if children { 4 } else { 2 };
    fields
        .get(11..11 + count)?
        .iter()
        .map(|v| v.parse::<u64>().ok())
        .sum()
}

/// Waits until `log` has a line containing `text` (at most 20 minutes).
fn wait_for_log(log: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(1200);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(text)
    {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn start_joind(dir: &Path, state: &Path, kubeadm: &Path, log: &Path, token_pool: usize) -> Child {
    let log = std::fs::File::create(log).expect("create the joind log");
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
        .args(["--token-pool", &token_pool.to_string()])
        // All clients come from 127.0.0.1: lift the per-peer limit for the benchmark.
        .args(["--rate-per-sec", "1000000", "--burst", "1000000"])
        // As in production: one audit line per join.
        .args(["--log", "info"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start hawser-joind")
}

/// This bench binary again, as the floor server of `kind`.
fn start_floor_server(kind: &str, log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("create the floor server's log");
    Command::new(std::env::current_exe().expect("the bench binary"))
        .args(["--floor-server", kind])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start the floor server")
}

/// The first `count` lines a server prints (its address, …).
fn read_stdout_lines(server: &mut Child, log: &Path, count: usize) -> Vec<String> {
    let mut stdout = BufReader::new(server.stdout.take().expect("stdout"));
    (0..count)
        .map(|_| {
            let mut line = String::new();
            stdout
                .read_line(&mut line)
                .expect("read the server's stdout");
            if line.is_empty() {
                panic!(
                    "the server ended its output early; its log:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            line.trim().to_owned()
        })
        .collect()
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
    /// Open loop: arrivals that found every slot taken and waited for one.
    queued: usize,
    first_error: Option<String>,
}

type OpFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
/// One operation of a workload, given its number in the level.
type Op = Arc<dyn Fn(usize) -> OpFuture + Send + Sync>;

/// Joins, each quoting on the next swtpm's client in turn.
fn join_op(addr: &str, level: usize, clients: Arc<[AtlsClient]>) -> Op {
    let endpoint = endpoint(addr);
    Arc::new(move |i| {
        let endpoint = endpoint.clone();
        let client = clients[i % clients.len()].clone();
        Box::pin(async move { join(&endpoint, &client, level, i).await })
    })
}

/// One join: a fresh aTLS connection and one IssueJoinTicket with a new disk UUID, as a
/// worker node (a control-plane join also needs its AK approved and reads the PKI files).
async fn join(
    endpoint: &Endpoint,
    client: &AtlsClient,
    level: usize,
    i: usize,
) -> Result<(), String> {
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
            ..Default::default()
        })
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    Ok(())
}

fn endpoint(addr: &str) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("endpoint")
}

/// rustls' ring provider with its TLS 1.3 suites only: aTLS's provider.
fn floor_provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .retain(|suite| suite.version() == &rustls::version::TLS13);
    Arc::new(provider)
}

/// The floor's clients: TLS 1.3 without resumption, trusting the floor server's certificate.
fn floor_connector(certificate: Vec<u8>) -> TlsConnector {
    let provider = floor_provider();
    let verifier = PinnedCertificate {
        certificate,
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    TlsConnector::from(Arc::new(config))
}

/// Floor operations: a fresh TLS connection each.
fn floor_op(addr: SocketAddr, connector: TlsConnector) -> Op {
    Arc::new(move |_| Box::pin(floor_round_trip(addr, connector.clone())))
}

/// One floor operation: connect, handshake, 32 bytes each way.
async fn floor_round_trip(addr: SocketAddr, connector: TlsConnector) -> Result<(), String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    let name = ServerName::try_from("floor.hawser.invalid").expect("a DNS name");
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(&FLOOR_REQUEST)
        .await
        .map_err(|e| format!("request: {e}"))?;
    tls.flush().await.map_err(|e| format!("request: {e}"))?;
    let mut response = [0u8; FLOOR_RESPONSE.len()];
    tls.read_exact(&mut response)
        .await
        .map_err(|e| format!("response: {e}"))?;
    if response != FLOOR_RESPONSE {
        return Err("unexpected response".to_owned());
    }
    Ok(())
}

/// A plain TLS client's check of a server it knows: the certificate is the one expected, and
/// the handshake's CertificateVerify verifies with its key.
#[derive(Debug)]
struct PinnedCertificate {
    certificate: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.certificate.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::PeerIncompatible::Tls12NotOffered.into())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What checking a quote's signature costs: a message the size of a quote's TPMS_ATTEST, its
/// ECDSA P-256 SHA-256 signature and the signer's public point, verified with ring as the
/// validator does (`verify_p256_sha256`).
struct SignedQuote {
    message: Vec<u8>,
    signature: Vec<u8>,
    public_point: Vec<u8>,
}

impl SignedQuote {
    fn new() -> Self {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("key");
        let message = vec![0x5a; QUOTE_ATTEST_LEN];
        let signature = key.sign(&rng, &message).expect("sign").as_ref().to_vec();
        Self {
            message,
            signature,
            public_point: key.public_key().as_ref().to_vec(),
        }
    }

    fn verify(&self) -> bool {
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            &self.public_point,
        )
        .verify(&self.message, &self.signature)
        .is_ok()
    }
}

/// The floor server (`--floor-server tls|tls-verify`): prints `listening on <addr>` and
/// `certificate <hex DER>`, then serves until killed.
fn serve_floor(kind: &str) {
    let quote = match kind {
        "tls" => None,
        "tls-verify" => Some(Arc::new(SignedQuote::new())),
        other => panic!("--floor-server {other:?}: expected tls or tls-verify"),
    };
    // As `hawser-joind`: a multi-threaded runtime with one worker per CPU.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let key = TlsKey::generate().expect("TLS key");
        let certificate = key.self_signed_certificate(None).expect("certificate");
        let certified = CertifiedKey::new(
            vec![CertificateDer::from(certificate.clone())],
            Arc::clone(key.signing_key()),
        );
        let mut config = ServerConfig::builder_with_provider(floor_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        // As aTLS: every connection a full handshake.
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        // `hawser-joind`'s listener, with its backlog.
        let listener =
            hawser_joinservice::service::bind_listener(SocketAddr::from(([127, 0, 0, 1], 0)))
                .expect("bind");
        println!("listening on {}", listener.local_addr().expect("address"));
        println!("certificate {}", hex::encode(&certificate));
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    eprintln!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let quote = quote.clone();
            tokio::spawn(async move {
                if let Err(e) = serve_floor_connection(acceptor, tcp, quote.as_deref()).await {
                    eprintln!("floor connection: {e}");
                }
            });
        }
    });
}

async fn serve_floor_connection(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    quote: Option<&SignedQuote>,
) -> Result<(), String> {
    tcp.set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    let mut tls = acceptor
        .accept(tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let mut request = [0u8; FLOOR_REQUEST.len()];
    tls.read_exact(&mut request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    if request != FLOOR_REQUEST {
        return Err("unexpected request".to_owned());
    }
    if let Some(quote) = quote
        && !quote.verify()
    {
        return Err("the quote signature does not verify".to_owned());
    }
    tls.write_all(&FLOOR_RESPONSE)
        .await
        .map_err(|e| format!("response: {e}"))?;
    tls.flush().await.map_err(|e| format!("response: {e}"))?;
    // The client closes, as a node does after its join; it sends no close_notify.
    let mut rest = [0u8; 1];
    let _ = tls.read(&mut rest).await;
    Ok(())
}

/// `level` clients, each looping: an operation, then the next as soon as the last ended.
async fn run_closed_loop(level: usize, ops: usize, op: Op) -> LevelResult {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..level {
        let op = Arc::clone(&op);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    break;
                }
                let t = Instant::now();
                match op(i).await {
                    Ok(()) => latencies.push(t.elapsed()),
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
        queued: 0,
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

/// Arrivals at `rate` per second on a fixed schedule, each its own task, at most `level` in
/// flight; latency from the scheduled arrival to the end of the operation. `elapsed` runs from
/// the first scheduled arrival to the last completion, so ops/s is the achieved rate.
async fn run_open_loop(level: usize, ops: usize, rate: f64, op: Op) -> LevelResult {
    let slots = Arc::new(Semaphore::new(level));
    let start = tokio::time::Instant::now();
    let mut queued = 0;
    let mut tasks = Vec::with_capacity(ops);
    for i in 0..ops {
        // From the start, not from the last tick, so that a late loop does not drift.
        let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(scheduled).await;
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                queued += 1;
                Arc::clone(&slots)
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed")
            }
        };
        let op = Arc::clone(&op);
        tasks.push(tokio::spawn(async move {
            let outcome = op(i).await;
            let done = tokio::time::Instant::now();
            drop(permit);
            (outcome.map(|()| done - scheduled), done)
        }));
    }
    let mut result = LevelResult {
        latencies: Vec::with_capacity(ops),
        elapsed: Duration::ZERO,
        errors: 0,
        queued,
        first_error: None,
    };
    let mut last = start;
    for task in tasks {
        let (outcome, done) = task.await.expect("operation task");
        last = last.max(done);
        match outcome {
            Ok(latency) => result.latencies.push(latency),
            Err(e) => {
                result.errors += 1;
                result.first_error.get_or_insert(e);
            }
        }
    }
    result.elapsed = last - start;
    result
}
