//! `mesh-bench`: the tools of the mesh's interop test and benchmark (qemu-tests/tests/mesh.rs),
//! run inside a throwaway test VM. Not part of any image.
//!
//! - `tunnel IFACE KEY_FILE PORT ADDRESS/PREFIX PEER_KEY PEER_IP [PEER_ENDPOINT] [THREADS]`:
//!   hawser's tunnel (`hawser_mesh_device::Tunnel`, boringtun, as PID 1 runs it) with one
//!   peer, until killed.
//! - `tunnel-task IFACE KEY_FILE PORT ADDRESS/PREFIX PEER_KEY PEER_ENDPOINT`: the same packet
//!   path as a task of a current-thread tokio runtime, written here over boringtun's `noise`
//!   API (one peer, IPv4, the interface set up with `ip`): what PID 1 would run instead of
//!   boringtun's device thread, for the thread-or-task measurement. Not hawser's tunnel.
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
use std::os::unix::fs::OpenOptionsExt as _;
use std::time::{Duration, Instant};

use hawser_mesh::PrivateKey;
use hawser_mesh_device::{Tunnel, TunnelConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["tunnel", rest @ ..] => tunnel(rest),
        ["tunnel-task", rest @ ..] => tunnel_task(rest),
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
        pod_routes: false,
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

fn tunnel_task(args: &[&str]) -> Result<(), String> {
    use boringtun::noise::{Tunn, TunnResult};
    use tokio::io::unix::AsyncFd;

    let [interface, key_file, port, address, peer_key, endpoint] = args else {
        return Err("tunnel-task IFACE KEY_FILE PORT ADDRESS/PREFIX PEER_KEY PEER_ENDPOINT".into());
    };
    let key = std::fs::read_to_string(key_file).map_err(|e| format!("{key_file}: {e}"))?;
    let private_key = PrivateKey::from_base64(&key).map_err(|e| e.to_string())?;
    let hex = private_key.to_hex();
    let mut secret = [0u8; 32];
    for (i, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    let peer: hawser_mesh::PublicKey = peer_key.parse().map_err(|e| format!("{peer_key}: {e}"))?;
    let mut endpoint: SocketAddr = endpoint.parse().map_err(|e| format!("{endpoint}: {e}"))?;
    let mut tunn = Tunn::new(
        boringtun::x25519::StaticSecret::from(secret),
        boringtun::x25519::PublicKey::from(*peer.as_bytes()),
        None,
        None,
        1,
        None,
    );
    let tun = create_tun(interface).map_err(|e| format!("tun {interface}: {e}"))?;
    for args in [
        vec!["addr", "add", address, "dev", interface],
        vec!["link", "set", interface, "mtu", "1420", "up"],
    ] {
        let status = std::process::Command::new("ip")
            .args(&args)
            .status()
            .map_err(|e| format!("ip: {e}"))?;
        if !status.success() {
            return Err(format!("ip {}: {status}", args.join(" ")));
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        // SAFETY: the OwnedFd owns its descriptor, keeps it open for as long as the AsyncFd
        // owns it, and always returns the same descriptor from as_raw_fd.
        let tun = unsafe { AsyncFd::register_with_interest(tun, tokio::io::Interest::READABLE) }
            .map_err(|e| e.to_string())?;
        let udp = tokio::net::UdpSocket::bind(format!("0.0.0.0:{port}"))
            .await
            .map_err(|e| e.to_string())?;
        println!(
            "MESH-BENCH tunnel=up interface={interface} pid={} mode=task",
            std::process::id()
        );
        let mut timers = tokio::time::interval(Duration::from_millis(250));
        let (mut packet, mut out) = (vec![0u8; 65536], vec![0u8; 65536]);
        loop {
            tokio::select! {
                ready = tun.readable() => {
                    let mut guard = ready.map_err(|e| e.to_string())?;
                    while let Ok(Ok(n)) = guard.try_io(|fd| read_fd(fd.get_ref(), &mut packet)) {
                        if let TunnResult::WriteToNetwork(data) = tunn.encapsulate(&packet[..n], &mut out) {
                            let _ = udp.send_to(data, endpoint).await;
                        }
                    }
                }
                received = udp.recv_from(&mut packet) => {
                    let Ok((n, from)) = received else { continue };
                    endpoint = from;
                    let mut result = tunn.decapsulate(Some(from.ip()), &packet[..n], &mut out);
                    loop {
                        match result {
                            TunnResult::WriteToNetwork(data) => {
                                let _ = udp.send_to(data, from).await;
                            }
                            TunnResult::WriteToTunnelV4(data, _) => {
                                let _ = write_fd(tun.get_ref(), data);
                                break;
                            }
                            _ => break,
                        }
                        // Packets queued behind a handshake go out now.
                        result = tunn.decapsulate(None, &[], &mut out);
                    }
                }
                _ = timers.tick() => {
                    if let TunnResult::WriteToNetwork(data) = tunn.update_timers(&mut out) {
                        let _ = udp.send_to(data, endpoint).await;
                    }
                }
            }
        }
    })
}

/// A tun interface `name` (no packet information header), non-blocking. The same ioctl as
/// `hawser_mesh_device`'s private `create_tun`, without its descriptor move (a boringtun
/// work-around this loop does not need); not shared, because making that function public
/// changes PID 1's measured binary for the sake of a test tool.
fn create_tun(name: &str) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd as _, OwnedFd};
    let tun: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")?
        .into();
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= request.ifr_name.len() {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.as_bytes()) {
        *slot = *byte as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads the ifreq, which lives across the call, on an open descriptor.
    let result = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut request) };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(tun)
}

fn read_fd(fd: &std::os::fd::OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `buf` is valid for writes of its length for the duration of the call.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn write_fd(fd: &std::os::fd::OwnedFd, data: &[u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `data` is valid for reads of its length for the duration of the call.
    let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
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
