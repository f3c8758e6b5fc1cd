//! Join throughput and latency of one `hawser-joind` process: many concurrent nodes, each
//! making a fresh aTLS connection (its swtpm quotes the server's nonce, the server validates
//! the evidence) and one IssueJoinTicket call (PCR check, HKDF, a bootstrap token from the
//! service's token cache, registry append + fsync, audit line), at 16, 64 and 256 concurrent
//! clients.
//!
//! Two load models, because they answer different questions:
//!
//! - **Closed loop** (default): N clients, each starts its next join when its last one ends.
//!   This finds the throughput ceiling, but its latency is fixed by Little's law (N in flight /
//!   throughput) and hides queueing: a slow server also slows the arrivals.
//! - **Open loop** (`HAWSER_BENCH_RATE=<joins per second>`): joins *arrive* on a fixed schedule
//!   (arrival i at start + i / rate) whatever the server does; each runs as its own task, at most
//!   N in flight. An arrival that finds N in flight waits for a slot, and that wait is part of
//!   its latency: latency runs from the *scheduled* arrival time, so a stalled server or a late
//!   arrival loop cannot hide queueing (no coordinated omission).
//!
//! The server is the real binary, started afresh per level, so its peak memory (VmHWM) belongs
//! to that level; it logs at `info` (the audit lines) to a file. Clients run in this process on
//! a 2-worker runtime, with their quotes spread over several swtpms; server, clients and swtpms
//! share the machine. Because the machine may be shared, each row also says how busy it was:
//! the 1-minute load average before the level, and the CPU that processes other than the
//! benchmark, its swtpms and `hawser-joind` used during the level (in cores).
//!
//! `cargo bench -p hawser-joinservice --bench joind` prints a Markdown table. Environment:
//! - `HAWSER_BENCH_JOINS` (default 1500): joins per level;
//! - `HAWSER_BENCH_LEVELS` (default `16,64,256`): concurrency levels;
//! - `HAWSER_BENCH_RATE`: open loop at this many joins per second (unset: closed loop);
//! - `HAWSER_BENCH_SWTPMS` (default 4): swtpms the clients quote on, round robin;
//! - `HAWSER_BENCH_KUBEADM`: replaces the kubeadm stand-in;
//! - `HAWSER_BENCH_MAX_LOAD`: before each level, wait while the 1-minute load average is above
//!   this (polled every 30 s, for at most `HAWSER_BENCH_MAX_WAIT_SECS`, default 600), then run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

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
use tokio::sync::Semaphore;
use tonic::transport::Endpoint;

const DEFAULT_LEVELS: [usize; 3] = [16, 64, 256];

/// `/proc` reports CPU time in USER_HZ ticks, which the kernel fixes at 100 per second on every
/// mainstream architecture (it is part of the ABI, independent of CONFIG_HZ).
const TICKS_PER_SEC: f64 = 100.0;

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
    let clients: Vec<AtlsClient> = tpms
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
            "open loop: {rate} joins/s arriving, at most <concurrent> in flight, latency from the scheduled arrival"
        ),
        None => "closed loop: <concurrent> clients, each starts its next join when its last ends"
            .to_owned(),
    };
    println!(
        "hawser-joind, {mode}; {joins} joins per level, each a fresh aTLS connection (client quote on one of {swtpms} swtpms) + IssueJoinTicket; kubeadm = {}",
        kubeadm.display()
    );
    println!(
        "| concurrent | offered/s | joins/s | p50 ms | p99 ms | max ms | VmHWM MiB | errors | queued | load1 | other cores | joind CPU ms/join | client CPU ms/join |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for level in levels {
        let load1 = wait_for_quiet(max_load, max_wait);
        let state = dir.path().join(format!("state-{level}"));
        let log = dir.path().join(format!("joind-{level}.log"));
        let mut joind = start_joind(dir.path(), &state, &kubeadm, &log);
        let addr = read_listen_addr(&mut joind, &log);
        let before = CpuSample::take(joind.id(), &swtpm_pids);
        let result = match rate {
            Some(rate) => runtime.block_on(run_open_loop(&addr, level, joins, rate, &clients)),
            None => runtime.block_on(run_closed_loop(&addr, level, joins, &clients)),
        };
        let after = CpuSample::take(joind.id(), &swtpm_pids);
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
        let done = latencies.len().max(1) as f64;
        let secs = result.elapsed.as_secs_f64();
        let machine = after.machine_busy.saturating_sub(before.machine_busy);
        let joind_cpu = after.joind.saturating_sub(before.joind);
        let clients_cpu = after.clients.saturating_sub(before.clients);
        let other = machine.saturating_sub(joind_cpu + clients_cpu);
        let ms_per_join = |ticks: u64| ticks as f64 / TICKS_PER_SEC * 1e3 / done;
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} |",
            level,
            rate.map_or_else(|| "—".to_owned(), |r| format!("{r:.0}")),
            latencies.len() as f64 / secs,
            pct(0.50),
            pct(0.99),
            pct(1.0),
            hwm as f64 / 1024.0,
            result.errors,
            rate.map_or_else(|| "—".to_owned(), |_| result.queued.to_string()),
            load1,
            other as f64 / TICKS_PER_SEC / secs,
            ms_per_join(joind_cpu),
            ms_per_join(clients_cpu),
        );
        if let Some(e) = result.first_error {
            println!("    first error: {e}");
        }
    }
    drop(runtime); // its tasks may hold issuers
    drop(clients);
    drop(tpms);
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

/// CPU time in ticks: the whole machine (busy, all CPUs), `hawser-joind` (with the children it
/// waited for, i.e. kubeadm), and the client side (this process and the swtpms).
struct CpuSample {
    machine_busy: u64,
    joind: u64,
    clients: u64,
}

impl CpuSample {
    fn take(joind: u32, swtpms: &[u32]) -> Self {
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
            joind: process_ticks(&joind.to_string(), true).unwrap_or(0),
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

fn start_joind(dir: &Path, state: &Path, kubeadm: &Path, log: &Path) -> Child {
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
        // All clients come from 127.0.0.1: lift the per-peer limit for the benchmark.
        .args(["--rate-per-sec", "1000000", "--burst", "1000000"])
        // As in production: one audit line per join.
        .args(["--log", "info"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start hawser-joind")
}

fn read_listen_addr(joind: &mut Child, log: &Path) -> String {
    let stdout = joind.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read joind stdout");
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| {
            panic!(
                "unexpected joind output {line:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
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
    /// Open loop: arrivals that found every slot taken and waited for one.
    queued: usize,
    first_error: Option<String>,
}

/// One join: a fresh aTLS connection and one IssueJoinTicket with a new disk UUID.
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

/// `level` clients, each looping: join, then the next join as soon as the last ended.
async fn run_closed_loop(
    addr: &str,
    level: usize,
    joins: usize,
    clients: &[AtlsClient],
) -> LevelResult {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..level {
        let client = clients[worker % clients.len()].clone();
        let next = Arc::clone(&next);
        let endpoint = endpoint(addr);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= joins {
                    break;
                }
                let t = Instant::now();
                match join(&endpoint, &client, level, i).await {
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
/// flight; latency from the scheduled arrival to the end of the call. `elapsed` runs from the
/// first scheduled arrival to the last completion, so joins/s is the achieved rate.
async fn run_open_loop(
    addr: &str,
    level: usize,
    joins: usize,
    rate: f64,
    clients: &[AtlsClient],
) -> LevelResult {
    let slots = Arc::new(Semaphore::new(level));
    let endpoint = endpoint(addr);
    let start = tokio::time::Instant::now();
    let mut queued = 0;
    let mut tasks = Vec::with_capacity(joins);
    for i in 0..joins {
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
        let client = clients[i % clients.len()].clone();
        let endpoint = endpoint.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = join(&endpoint, &client, level, i).await;
            let done = tokio::time::Instant::now();
            drop(permit);
            (outcome.map(|()| done - scheduled), done)
        }));
    }
    let mut result = LevelResult {
        latencies: Vec::with_capacity(joins),
        elapsed: Duration::ZERO,
        errors: 0,
        queued,
        first_error: None,
    };
    let mut last = start;
    for task in tasks {
        let (outcome, done) = task.await.expect("join task");
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
