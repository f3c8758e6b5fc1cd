//! `mesh-bench`: the tools of the mesh's interop test and benchmark (qemu-tests/tests/mesh.rs),
//! run inside a throwaway test VM. Not part of any image.
//!
//! - `tunnel IFACE KEY_FILE PORT ADDRESS/PREFIX PEER_KEY PEER_IP [PEER_ENDPOINT] [THREADS]`:
//!   hawser's tunnel (`hawser_mesh::device::Tunnel`, boringtun, as PID 1 runs it) with one
//!   peer, until killed.
//! - `serve PORT`: a TCP server; a connection's first byte picks `S` (sink: count the bytes
//!   until EOF, answer the count) or `E` (echo).
//! - `send HOST:PORT MIB [PID...]`: sends MIB MiB to a sink; prints the throughput, the guest's
//!   CPU use over the transfer (all CPUs, from /proc/stat) and, for each PID, its CPU time and
//!   memory (/proc/PID/stat, /proc/PID/status).
//! - `rtt HOST:PORT COUNT`: COUNT 64-byte round trips to an echo; prints the percentiles.
//!
//! Output lines start with `MESH-BENCH ` and are `key=value` pairs.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use hawser_mesh::PrivateKey;
use hawser_mesh::device::{Tunnel, TunnelConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["tunnel", rest @ ..] => tunnel(rest),
        ["serve", port] => serve(port),
        ["send", to, mib, pids @ ..] => send(to, mib, pids),
        ["rtt", to, count] => rtt(to, count),
        _ => Err(format!("usage: see the top of {}", file!())),
    };
    if let Err(e) = result {
        eprintln!("mesh-bench: {e}");
        std::process::exit(1);
    }
}

fn tunnel(args: &[&str]) -> Result<(), String> {
    let [
        interface,
        key_file,
        port,
        address,
        peer_key,
        peer_ip,
        rest @ ..,
    ] = args
    else {
        return Err(
            "tunnel IFACE KEY_FILE PORT ADDRESS/PREFIX PEER_KEY PEER_IP [PEER_ENDPOINT] [THREADS]"
                .into(),
        );
    };
    let key = std::fs::read_to_string(key_file).map_err(|e| format!("{key_file}: {e}"))?;
    let private_key = PrivateKey::from_base64(&key).map_err(|e| e.to_string())?;
    let prefix: ipnet::Ipv4Net = address.parse().map_err(|e| format!("{address}: {e}"))?;
    let endpoint = match rest.first() {
        Some(e) if *e != "-" => Some(e.parse::<SocketAddr>().map_err(|e| e.to_string())?),
        _ => None,
    };
    let threads = match rest.get(1) {
        Some(t) => t.parse().map_err(|e| format!("threads {t}: {e}"))?,
        None => 1,
    };
    let config = TunnelConfig {
        interface: (*interface).to_owned(),
        private_key,
        listen_port: port.parse().map_err(|e| format!("port {port}: {e}"))?,
        address: prefix.addr(),
        prefix: prefix.trunc(),
        mtu: hawser_mesh::tunnel_mtu(1500),
        threads,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let tunnel = runtime
        .block_on(Tunnel::start(config))
        .map_err(|e| e.to_string())?;
    let peer = hawser_mesh::Peer {
        name: "peer".into(),
        public_key: peer_key.parse().map_err(|e| format!("{peer_key}: {e}"))?,
        vpn_ip: peer_ip.parse().map_err(|e| format!("{peer_ip}: {e}"))?,
        endpoint,
        coordinator: false,
    };
    tunnel.apply(&[peer], &[]).map_err(|e| e.to_string())?;
    println!(
        "MESH-BENCH tunnel=up interface={interface} pid={}",
        std::process::id()
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn serve(port: &str) -> Result<(), String> {
    let listener = TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|e| e.to_string())?;
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let _ = answer(stream);
        });
    }
    Ok(())
}

fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut mode = [0u8; 1];
    stream.read_exact(&mut mode)?;
    let mut buf = vec![0u8; 1 << 16];
    match mode[0] {
        b'S' => {
            let mut total = 0u64;
            loop {
                let n = stream.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            stream.write_all(&total.to_be_bytes())
        }
        _ => loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            stream.write_all(&buf[..n])?;
        },
    }
}

/// Busy and total jiffies of all CPUs (the `cpu` line of /proc/stat).
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// utime + stime of `pid`, in clock ticks.
fn process_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(14) + field(15)
}

/// A `Vm…` line of /proc/PID/status, in KiB.
fn status_kib(pid: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn send(to: &str, mib: &str, pids: &[&str]) -> Result<(), String> {
    let mib: u64 = mib.parse().map_err(|e| format!("MiB {mib}: {e}"))?;
    let ticks_per_sec = 100.0; // USER_HZ on Linux/x86-64
    let before: Vec<u64> = pids.iter().map(|p| process_ticks(p)).collect();
    let (busy0, total0) = cpu_jiffies();
    let start = Instant::now();
    let mut stream = TcpStream::connect(to).map_err(|e| format!("{to}: {e}"))?;
    stream.write_all(b"S").map_err(|e| e.to_string())?;
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..mib {
        stream.write_all(&chunk).map_err(|e| e.to_string())?;
    }
    stream
        .shutdown(Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let mut count = [0u8; 8];
    stream.read_exact(&mut count).map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    let (busy1, total1) = cpu_jiffies();
    let received = u64::from_be_bytes(count);
    if received != mib << 20 {
        return Err(format!(
            "the sink counted {received} bytes of {}",
            mib << 20
        ));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy_share = (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;
    let mut line = format!(
        "MESH-BENCH send to={to} bytes={received} secs={secs:.3} mbit_s={:.1} guest_cpu_busy={:.3} guest_cpus={cpus}",
        received as f64 * 8.0 / secs / 1e6,
        busy_share
    );
    for (pid, before) in pids.iter().zip(before) {
        let cpu = (process_ticks(pid) - before) as f64 / ticks_per_sec;
        line.push_str(&format!(
            " pid{pid}_cpu_s={cpu:.2} pid{pid}_cpu_share={:.3} pid{pid}_rss_kib={} pid{pid}_hwm_kib={}",
            cpu / secs,
            status_kib(pid, "VmRSS:"),
            status_kib(pid, "VmHWM:")
        ));
    }
    println!("{line}");
    Ok(())
}

fn rtt(to: &str, count: &str) -> Result<(), String> {
    let count: usize = count.parse().map_err(|e| format!("count {count}: {e}"))?;
    let mut stream = TcpStream::connect(to).map_err(|e| format!("{to}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream.write_all(b"E").map_err(|e| e.to_string())?;
    let message = [0x42u8; 64];
    let mut back = [0u8; 64];
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        stream.write_all(&message).map_err(|e| e.to_string())?;
        stream.read_exact(&mut back).map_err(|e| e.to_string())?;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "MESH-BENCH rtt to={to} count={count} p50_us={:.0} p90_us={:.0} p99_us={:.0} mean_us={:.0}",
        at(0.5),
        at(0.9),
        at(0.99),
        samples.iter().sum::<f64>() / samples.len() as f64
    );
    Ok(())
}
