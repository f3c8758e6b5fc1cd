//! The mesh against the reference WireGuard: hawser's tunnel (boringtun, `hawser_mesh_device`,
//! the code PID 1 runs) and the Linux kernel's WireGuard configured by the standard `wg` tool
//! (Debian's wireguard-tools).
//!
//! Both run on the image's own kernel (Debian's trixie cloud kernel, whose `wireguard.ko` the
//! image does not ship): a throwaway test VM ([`common::toolbox`]) boots it with the image's
//! initramfs plus busybox, iproute2, wireguard-tools, the `mesh-bench` tools and the modules,
//! under `rdinit=/mesh-init`. Nothing of hawser's boot path runs in it.
//!
//! - The interop test: hawser's tunnel in the test's private network namespace on the host,
//!   the kernel's WireGuard in the VM behind QEMU's user network. Each side initiates a
//!   handshake once; pings and a TCP stream cross in both directions.
//! - The benchmark (run explicitly): inside one VM, TCP throughput and round-trip latency
//!   between two network namespaces over a veth pair, plain, through the kernel's WireGuard,
//!   through hawser's tunnel and through the same packet path as a tokio task, in interleaved
//!   rounds; with the tunnel processes' CPU and memory.
//!   The numbers are in docs/mesh.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use hawser_harness::{Vm, VmConfig};
use hawser_image::build::BuildOutput;
use hawser_mesh::{Peer, PrivateKey};
use hawser_mesh_device::{Tunnel, TunnelConfig};

mod common;
use common::toolbox::{Toolbox, kernel_modules_dir, module_load_order};
use common::{PrivateNetwork, build_image, pings};

/// A direct kernel boot with a test initramfs under TCG, then the script.
const TIMEOUT: Duration = Duration::from_secs(240);
/// The host's tunnel: its address and WireGuard port (in the test's namespace).
const HOST_VPN_IP: &str = "10.99.0.1";
const HOST_WG_PORT: u16 = 51820;
/// The guest's kernel WireGuard: its address, and the namespace's loopback port QEMU forwards
/// to its WireGuard port.
const GUEST_VPN_IP: &str = "10.99.0.2";
const GUEST_WG_FORWARD: u16 = 51821;
/// The TCP port `mesh-bench serve` listens on in the guest.
const GUEST_TCP_PORT: u16 = 7001;

fn scratch(name: &str) -> PathBuf {
    common::scratch("mesh-interop", name)
}

/// The initramfs-only image: its kernel, modules and initramfs carry the test VM.
fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(&scratch("image"), None))
}

/// A fixed test key (these VMs and namespaces are throwaway).
fn key(seed: u8) -> PrivateKey {
    PrivateKey::from_random([seed; 32])
}

/// `mesh-bench` built with the `image` profile, PID 1's (opt-level "s", fat LTO): the
/// benchmark measures the tunnel as PID 1 runs it, never a debug build.
fn mesh_bench_as_pid1_is_built() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building mesh-bench with the image profile (as PID 1 is built)");
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--locked",
            "--profile",
            "image",
            "-p",
            "hawser-qemu",
        ])
        .args(["--bin", "mesh-bench"])
        .current_dir(common::workspace())
        .status()
        .expect("cargo");
    assert!(
        status.success(),
        "cargo build --profile image --bin mesh-bench"
    );
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::workspace().join("target"))
        .join("image/mesh-bench")
}

/// The test initramfs with `script` as `/mesh-init`, `mesh_bench` and `files`.
fn mesh_initrd(name: &str, mesh_bench: &str, script: &str, files: &[(&str, String)]) -> PathBuf {
    let image = image();
    let modules_dir = kernel_modules_dir(&image.kernel_release);
    // The image's modules (virtio, among them the network's) and what the test adds.
    let mut names: Vec<String> = image
        .modules
        .iter()
        .map(|m| hawser_kmod::normalize_name(m))
        .collect();
    names.extend(["wireguard".to_owned(), "veth".to_owned()]);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut toolbox = Toolbox::new();
    toolbox
        .program("/usr/bin/ip", "iproute2")
        .program("/usr/bin/wg", "wireguard-tools")
        .program(mesh_bench, "(built with this test)")
        .modules(&modules_dir, &module_load_order(&modules_dir, &names));
    for (path, text) in files {
        toolbox.file(path, 0o600, text.clone().into_bytes());
    }
    toolbox.write(
        &image.initrd.path,
        "mesh-init",
        &script.replace("@MESH_BENCH@", mesh_bench),
        &scratch(name).join("initrd"),
    )
}

fn test_vm(name: &str, initrd: PathBuf, cpus: u32) -> VmConfig {
    let mut config = VmConfig::direct_kernel(
        &image().kernel.path,
        Some(initrd),
        "console=ttyS0 quiet rdinit=/mesh-init",
    )
    .name(name);
    config.cpus = cpus;
    config
}

/// After the toolbox's prelude (mounts, modules): iproute2, loopback, the test's markers.
const GUEST_PRELUDE: &str = r#"
export PATH=/usr/bin:/bin
# iproute2's, not busybox's applet (which this busybox's shell would prefer).
ip() { /usr/bin/ip "$@"; }
$B mkdir -p /tmp /var/run
ip link set lo up
step() { echo "MESH-TEST $*"; }
fail() { echo "MESH-TEST FAILED: $*"; $B poweroff -f; }
"#;

/// The interop guest: kernel WireGuard `wg0` at 10.99.0.2 with the host's tunnel as its peer
/// (at 10.0.2.2, the host's loopback in QEMU's user network). It waits for the host to start
/// a handshake, then drops its session (the peer removed and added again) and starts one
/// itself, then serves TCP through the tunnel.
const INTEROP_SCRIPT: &str = r#"
while [ ! -e /sys/class/net/eth0 ]; do $B sleep 0.1; done
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
ip link add wg0 type wireguard || fail "ip link add wg0 type wireguard"
peer() { wg set wg0 peer "$HOST_KEY" allowed-ips 10.99.0.1/32 endpoint 10.0.2.2:51820; }
wg set wg0 private-key /mesh/guest.key listen-port 51820 || fail "wg set"
peer || fail "wg set peer"
ip addr add 10.99.0.2/24 dev wg0
ip link set wg0 mtu 1420 up
step "kernel wireguard up: $(wg show wg0 public-key)"
handshake() { wg show wg0 latest-handshakes | $B awk '{print $2}'; }
n=0; while [ "$(handshake)" = "0" ]; do n=$((n+1)); [ $n -gt 600 ] && fail "no handshake from the host"; $B sleep 0.2; done
step "handshake started by the host: $(wg show wg0 dump | $B tail -1)"
wg set wg0 peer "$HOST_KEY" remove
peer
[ "$(handshake)" = "0" ] || fail "the session survived the peer's removal"
$B ping -c 3 -W 5 10.99.0.1 > /run/ping 2>&1 || { $B cat /run/ping; fail "ping 10.99.0.1"; }
step "ping from the kernel's side: $($B grep -o '[0-9]* packets received' /run/ping)"
step "handshake started by the guest: $(wg show wg0 dump | $B tail -1)"
@MESH_BENCH@ serve 7001 &
$B sleep 1
step "serving tcp"
while true; do $B sleep 5; step "transfer: $(wg show wg0 transfer)"; done
"#;

/// hawser's tunnel on the host and the kernel's WireGuard in a VM handshake (each side
/// initiating once), and pings and a TCP stream cross between them by VPN address.
#[test]
#[ignore = "boots QEMU once (~1 min under TCG); run by scripts/test"]
fn hawsers_tunnel_and_the_kernels_wireguard_handshake_and_carry_traffic() {
    let (host_key, guest_key) = (key(1), key(2));
    let script = format!(
        "{GUEST_PRELUDE}HOST_KEY={}\n{INTEROP_SCRIPT}",
        host_key.public_key()
    );
    let initrd = mesh_initrd(
        "interop",
        env!("CARGO_BIN_EXE_mesh-bench"),
        &script,
        &[("mesh/guest.key", guest_key.to_base64().to_string())],
    );

    let _network = PrivateNetwork::enter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tunnel = runtime
        .block_on(Tunnel::start(TunnelConfig {
            interface: "hawser0".into(),
            private_key: host_key,
            listen_port: HOST_WG_PORT,
            address: HOST_VPN_IP.parse().unwrap(),
            prefix: "10.99.0.0/24".parse().unwrap(),
            mtu: hawser_mesh::tunnel_mtu(1500),
            threads: 1,
            pod_routes: false,
        }))
        .expect("hawser's tunnel (needs root and /dev/net/tun)");
    let guest_peer = Peer {
        name: "kernel-wireguard".into(),
        public_key: guest_key.public_key(),
        vpn_ip: GUEST_VPN_IP.parse().unwrap(),
        endpoint: Some(format!("127.0.0.1:{GUEST_WG_FORWARD}").parse().unwrap()),
        coordinator: false,
    };
    tunnel.apply(&[guest_peer], &[]).unwrap();

    let mut config = test_vm("mesh-interop", initrd, 1);
    config.extra_args.extend([
        "-netdev".to_owned(),
        format!("user,id=n0,restrict=off,hostfwd=udp:127.0.0.1:{GUEST_WG_FORWARD}-10.0.2.15:51820"),
        "-device".to_owned(),
        "virtio-net-pci,netdev=n0".to_owned(),
    ]);
    config.fail_patterns.push("MESH-TEST FAILED".into());
    let vm = Vm::start(config).unwrap();
    let wait = |what: &str| {
        vm.wait_for_line(what, TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let up = wait("MESH-TEST kernel wireguard up: ");
    assert!(up.contains(&guest_key.public_key().to_string()), "{up}");

    // The host's tunnel starts the first handshake (its first packet goes to the guest).
    assert!(pings(GUEST_VPN_IP), "no ping through the tunnels");
    eprintln!("{}", wait("MESH-TEST handshake started by the host"));
    // The guest drops its session and starts the next one with its own ping.
    let ping = wait("MESH-TEST ping from the kernel's side");
    assert!(ping.contains("3 packets received"), "{ping}");
    eprintln!("{}", wait("MESH-TEST handshake started by the guest"));
    wait("MESH-TEST serving tcp");

    // A TCP stream both ways: 4 MiB echoed back intact.
    let mut stream = TcpStream::connect((GUEST_VPN_IP, GUEST_TCP_PORT)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(b"E").unwrap();
    let sent: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let reader = {
        let mut stream = stream.try_clone().unwrap();
        let len = sent.len();
        std::thread::spawn(move || {
            let mut back = vec![0u8; len];
            stream.read_exact(&mut back).map(|()| back)
        })
    };
    stream.write_all(&sent).unwrap();
    let back = reader
        .join()
        .unwrap()
        .expect("the echo through the tunnels");
    assert!(back == sent, "the echoed stream differs");

    let stats = tunnel.stats().unwrap();
    let guest = stats
        .iter()
        .find(|s| s.public_key == guest_key.public_key())
        .unwrap();
    assert!(guest.last_handshake_unix.is_some(), "{stats:?}");
    assert!(
        guest.rx_bytes > 4 << 20 && guest.tx_bytes > 4 << 20,
        "{stats:?}"
    );
    eprintln!(
        "hawser's tunnel: handshake at {:?}, rx {} B, tx {} B",
        guest.last_handshake_unix, guest.rx_bytes, guest.tx_bytes
    );
    eprintln!("{}", wait("MESH-TEST transfer: "));
    vm.kill();
    tunnel.stop();
}

/// The benchmark guest: two namespace pairs over veth, one pair joined by the kernel's
/// WireGuard, the other by hawser's tunnel (same keys, same MTU), and a sink and echo in the
/// receiving namespace of each. Then rounds of: plain veth, kernel WireGuard, hawser's tunnel,
/// each a throughput run and a latency run.
const BENCH_SCRIPT: &str = r#"
MB=@MESH_BENCH@
pair() { # ns-a ns-b veth-a veth-b subnet
  ip netns add $1; ip netns add $2
  ip link add $3 netns $1 type veth peer name $4 netns $2
  ip -n $1 link set lo up; ip -n $2 link set lo up
  ip -n $1 addr add $5.1/24 dev $3; ip -n $2 addr add $5.2/24 dev $4
  ip -n $1 link set $3 up; ip -n $2 link set $4 up
}
pair ka kb k1 k2 192.168.60
pair ba bb b1 b2 192.168.61
pair ta tb t1 t2 192.168.62
kwg() { # ns key peer-key address peer-address peer-endpoint
  ip -n $1 link add wg0 type wireguard || fail "ip link add wg0 type wireguard"
  ip netns exec $1 wg set wg0 private-key $2 listen-port 51820 peer $3 allowed-ips $5/32 endpoint $6:51820
  ip -n $1 addr add $4/24 dev wg0; ip -n $1 link set wg0 mtu 1420 up
}
kwg ka /mesh/a.key "$KEY_B" 10.98.0.1 10.98.0.2 192.168.60.2
# The tunnels run from /usr/bin/ip directly (not the function), so that $! is their process.
kwg kb /mesh/b.key "$KEY_A" 10.98.0.2 10.98.0.1 192.168.60.1
/usr/bin/ip netns exec ba $MB tunnel hawser0 /mesh/a.key 51820 10.97.0.1/24 "$KEY_B" 10.97.0.2 192.168.61.2:51820 &
TA=$!
/usr/bin/ip netns exec bb $MB tunnel hawser0 /mesh/b.key 51820 10.97.0.2/24 "$KEY_A" 10.97.0.1 192.168.61.1:51820 &
TB=$!
/usr/bin/ip netns exec ta $MB tunnel-task hawser0 /mesh/a.key 51820 10.96.0.1/24 "$KEY_B" 192.168.62.2:51820 &
XA=$!
/usr/bin/ip netns exec tb $MB tunnel-task hawser0 /mesh/b.key 51820 10.96.0.2/24 "$KEY_A" 192.168.62.1:51820 &
XB=$!
ip netns exec kb $MB serve 7001 &
ip netns exec bb $MB serve 7001 &
ip netns exec tb $MB serve 7001 &
$B sleep 2
for target in ka:10.98.0.2 ba:10.97.0.2 ta:10.96.0.2; do
  ip netns exec ${target%%:*} $B ping -c 2 -W 5 ${target#*:} > /dev/null || fail "ping ${target#*:}"
done
step "bench ready: tunnel pids $TA $TB, task pids $XA $XB"
for round in 1 2 3; do
  for path in plain:ka:192.168.60.2 kernel:ka:10.98.0.2 hawser:ba:10.97.0.2 task:ta:10.96.0.2; do
    name=${path%%:*}; rest=${path#*:}; ns=${rest%%:*}; ip=${rest#*:}
    pids=""; [ $name = hawser ] && pids="$TA $TB"; [ $name = task ] && pids="$XA $XB"
    echo "MESH-BENCH round=$round path=$name $(ip netns exec $ns $MB send $ip:7001 $MIB $pids | $B sed 's/^MESH-BENCH //')"
    echo "MESH-BENCH round=$round path=$name $(ip netns exec $ns $MB rtt $ip:7001 $RTTS | $B sed 's/^MESH-BENCH //')"
  done
done
step "bench done"
$B poweroff -f
"#;

/// Numbers for docs/mesh.md: TCP throughput and latency through the kernel's WireGuard, through
/// hawser's tunnel (boringtun's device thread, as PID 1 runs it) and through the same packet
/// path as a tokio task (`mesh-bench tunnel-task`), each between two namespaces of one VM
/// (plain veth for reference), three interleaved rounds, with the tunnels' CPU time and memory. Prints
/// `MESH-BENCH` lines and a summary; run explicitly:
/// `cargo test -p hawser-qemu --test mesh -- --ignored --nocapture benchmark`
/// (`MESH_BENCH_MIB`, default 64; `MESH_BENCH_CPUS`, default 2).
#[test]
#[ignore = "benchmark: boots QEMU once and moves ~600 MiB under TCG; run explicitly"]
fn benchmark_hawsers_tunnel_against_the_kernels_wireguard() {
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (mib, cpus) = (env("MESH_BENCH_MIB", 64), env("MESH_BENCH_CPUS", 2));
    let (a, b) = (key(3), key(4));
    let script = format!(
        "{GUEST_PRELUDE}KEY_A={}\nKEY_B={}\nMIB={mib}\nRTTS=500\n{BENCH_SCRIPT}",
        a.public_key(),
        b.public_key()
    );
    let mesh_bench = mesh_bench_as_pid1_is_built();
    let initrd = mesh_initrd(
        "bench",
        &mesh_bench.to_string_lossy(),
        &script,
        &[
            ("mesh/a.key", a.to_base64().to_string()),
            ("mesh/b.key", b.to_base64().to_string()),
        ],
    );
    let mut config = test_vm("mesh-bench", initrd, cpus);
    config.fail_patterns.push("MESH-TEST FAILED".into());
    let vm = Vm::start(config).unwrap();
    vm.wait_for_line("MESH-TEST bench ready", TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    vm.wait_for_line("MESH-TEST bench done", Duration::from_secs(3600))
        .unwrap_or_else(|e| panic!("{e}"));
    let lines: Vec<String> = vm
        .console_lines()
        .into_iter()
        .filter(|l| l.starts_with("MESH-BENCH "))
        .collect();
    for line in &lines {
        eprintln!("{line}");
    }
    eprintln!("{}", summary(&lines, mib, cpus));
}

/// Medians per path, and the ratios to the kernel's WireGuard.
fn summary(lines: &[String], mib: u32, cpus: u32) -> String {
    let value = |line: &str, key: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
    };
    let median = |path: &str, key: &str| -> f64 {
        let mut values: Vec<f64> = lines
            .iter()
            .filter(|l| l.contains(&format!(" path={path} ")))
            .filter_map(|l| value(l, key))
            .collect();
        assert!(!values.is_empty(), "no {key} for {path}: {lines:#?}");
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut text = format!(
        "mesh benchmark: {mib} MiB per run, TCG, {cpus} vCPUs, medians of 3 rounds\n\
         path     Mbit/s  guest CPU busy  RTT p50 us  RTT p99 us\n"
    );
    for path in ["plain", "kernel", "hawser", "task"] {
        text.push_str(&format!(
            "{path:<8} {:>6.1}  {:>14.2}  {:>10.0}  {:>10.0}\n",
            median(path, "mbit_s"),
            median(path, "guest_cpu_busy"),
            median(path, "p50_us"),
            median(path, "p99_us"),
        ));
    }
    for path in ["hawser", "task"] {
        text.push_str(&format!(
            "{path} / kernel: throughput {:.2}, RTT p50 {:.2}\n",
            median(path, "mbit_s") / median("kernel", "mbit_s"),
            median(path, "p50_us") / median("kernel", "p50_us"),
        ));
    }
    for path in ["hawser", "task"] {
        let processes = lines
            .iter()
            .rev()
            .find(|l| l.contains(&format!(" path={path} ")) && l.contains("_rss_kib="))
            .map(|l| {
                l.split_whitespace()
                    .filter(|kv| kv.starts_with("pid"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        text.push_str(&format!(
            "{path} tunnel processes (last run): {processes}\n"
        ));
    }
    text
}
