//! The boots of `scripts/bench-boot`: hawser's node image (first boot and rejoin, against
//! `hawser-joind` on the host, as `tests/node.rs` runs them) alternated with a Debian image the
//! script prepared, every boot with the same QEMU command line from the harness
//! ([`hawser_harness::VmConfig`]). Prints nothing to stdout; appends one line per boot to
//! `<out>/results.tsv` and one line per phase to `<out>/phases.tsv`, and keeps every console.
//!
//! ```text
//! boot-bench build <out>        build the node image into <out>/node (skipped if built)
//! boot-bench run <out> --debian-disk D --debian-root R [--runs N] [--smp 1,2] [--accel tcg]
//! ```
//!
//! Run through the script: `cargo run -p hawser-qemu --example boot-bench -- …`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)] // a benchmark driver

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hawser_attestation::report::{
    BOOT_REPORT_MARKER as BOOT_REPORT, JOIN_REPORT_MARKER as JOIN_REPORT,
};
use hawser_harness::{TpmConfig, Vm, VmConfig};
use hawser_image::pipeline::DEFAULT_CMDLINE;
use hawser_local::localhost::{self, free_port};

#[path = "../tests/common/mod.rs"]
mod common;

/// OVMF + bring-up + pivot under TCG on a loaded 2-core machine, with room to spare.
const BOOT_TIMEOUT: Duration = Duration::from_secs(360);
/// PID 1's first line: `hawser <version> starting; kernel handed over 3.123 s after boot`.
const INIT_STARTED: &str = "kernel handed over ";
/// PID 1's pivot line. Newer trees end it with `; /init → pivot 1234.5 ms (5.678 s after boot)`.
const PIVOTED: &str = "switched into the rootfs";
/// PID 1 watches the power button (after the pivot, from the rootfs's modules).
const POWER_BUTTON_WATCHED: &str = "ACPI power button(s)";
/// The Debian root's /sbin/init (written by the script): its first line, and its last after it
/// printed the kernel log as `BENCH_DMESG <line>`.
const ROOT_INIT: &str = "BENCH_ROOT_INIT";
const ROOT_DONE: &str = "BENCH_ROOT_DONE";
/// The Debian root disk's virtio serial (hawser's state disk has `hawser-state`).
const DEBIAN_ROOT_SERIAL: &str = "bench-root";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("build") if args.len() == 2 => build(Path::new(&args[1])),
        Some("run") if args.len() >= 2 => run(Path::new(&args[1]), &args[2..]),
        _ => {
            eprintln!(
                "usage: boot-bench build <out> | boot-bench run <out> --debian-disk D --debian-root R [--runs N] [--smp 1,2] [--accel tcg]"
            );
            std::process::exit(2);
        }
    }
}

/// The node image, as the node tests build it: the local cluster's measured command line
/// (static network, state disk keyed by the join service, its endpoint, insecure-dev trust).
fn build(out: &Path) {
    let dir = out.join("node");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let node =
        common::build_node_image(&dir, &localhost::node_cmdline(DEFAULT_CMDLINE, true), None);
    let summary = serde_json::json!({
        "uki": node.image.uki.path,
        "uki_sha256": node.image.uki.sha256,
        "uki_bytes": node.image.uki.size,
        "initrd": node.image.initrd.path,
        "initrd_bytes": node.image.initrd.size,
        "initramfs_uncompressed_bytes": node.image.initramfs_uncompressed_size,
        "initramfs_entries": node.image.initramfs_entries,
        "modules": node.image.modules.len(),
        "manifest": node.image.manifest,
        "cmdline": std::fs::read_to_string(&node.image.cmdline.path).unwrap_or_default(),
        "kernel": node.image.kernel.path,
        "kernel_release": node.image.kernel_release,
        "disk": node.disk.path,
        "disk_bytes": node.disk.bytes,
        "rootfs_erofs_bytes": node.rootfs.erofs_bytes,
    });
    std::fs::write(dir.join("node.txt"), node.to_string()).unwrap();
    std::fs::write(
        dir.join("node.json"),
        serde_json::to_string_pretty(&summary).unwrap(),
    )
    .unwrap();
}

struct Options {
    debian_disk: PathBuf,
    debian_root: PathBuf,
    runs: u32,
    smp: Vec<u32>,
    accel: String,
}

fn parse(args: &[String]) -> Options {
    let mut options = Options {
        debian_disk: PathBuf::new(),
        debian_root: PathBuf::new(),
        runs: 5,
        smp: vec![1],
        accel: "tcg".into(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--debian-disk" => options.debian_disk = value.into(),
            "--debian-root" => options.debian_root = value.into(),
            "--runs" => options.runs = value.parse().expect("--runs N"),
            "--smp" => {
                options.smp = value
                    .split(',')
                    .map(|n| n.parse().expect("--smp 1,2"))
                    .collect()
            }
            "--accel" => options.accel = value.clone(),
            other => panic!("unknown option {other}"),
        }
    }
    assert!(
        options.debian_disk.is_file() && options.debian_root.is_file(),
        "--debian-disk and --debian-root must name the script's Debian images"
    );
    options
}

/// One boot's numbers (seconds unless named otherwise; `None` = not seen).
#[derive(Default)]
struct Boot {
    image: String,
    run: u32,
    smp: u32,
    /// Guest: kernel start → /init (Debian: printk's "Run /init"; hawser: PID 1's start).
    kernel_to_init: Option<f64>,
    /// Guest: /init → switch_root (Debian: the root's /sbin/init in the kernel log) or pivot.
    init_to_end: Option<f64>,
    /// Where `init_to_end` comes from.
    end_source: &'static str,
    /// Host: QEMU start → first console byte (OVMF).
    first_console: Option<f64>,
    /// Host: QEMU start → the end line.
    wall_end: Option<f64>,
    /// Host: PID 1's first line → its pivot line (hawser only: Debian's /init is silent).
    wall_init_to_end: Option<f64>,
    /// The join RPC (hawser).
    rpc: String,
    /// Phases: (name, start ms since /init, duration ms).
    phases: Vec<(String, f64, f64)>,
    /// The boot before the rejoin powered off cleanly (hawser-first only).
    note: String,
}

fn run(out: &Path, args: &[String]) {
    let options = parse(args);
    let node: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("node/node.json"))
            .expect("no node image: run `boot-bench build` first"),
    )
    .unwrap();
    let uki = PathBuf::from(node["uki"].as_str().unwrap());
    let disk = PathBuf::from(node["disk"].as_str().unwrap());
    let logs = out.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).unwrap();
    let cluster_dir = out.join("cluster");
    let _ = std::fs::remove_dir_all(&cluster_dir);

    // The host side of the local cluster, as in tests/node.rs: provider CA, master secret,
    // measurements predicted from the UKI, hawser-joind on loopback (in this process).
    let host = common::Host::new(&cluster_dir, &uki);
    let port = free_port().unwrap();
    let service = host.start_service(SocketAddr::from(([127, 0, 0, 1], port)));
    let root_copy = out.join("debian-root.img");

    let results = out.join("results.tsv");
    let phases = out.join("phases.tsv");
    std::fs::write(
        &results,
        "image\trun\tsmp\tkernel_to_init_s\tinit_to_end_s\tend_source\tfirst_console_s\twall_end_s\tbefore_kernel_s\twall_init_to_end_s\trpc\tnote\n",
    )
    .unwrap();
    std::fs::write(&phases, "image\trun\tsmp\tphase\tstart_ms\tduration_ms\n").unwrap();

    let total = options.runs as usize * options.smp.len() * 3;
    let mut done = 0;
    for run in 1..=options.runs {
        for &smp in &options.smp {
            for image in ["debian", "hawser-first", "hawser-rejoin"] {
                done += 1;
                progress(&format!(
                    "boot {done}/{total}: {image}, run {run}/{}, -smp {smp}",
                    options.runs
                ));
                let base = |boot: VmConfig| {
                    boot.cpus(smp)
                        .accel(options.accel.clone())
                        .name(format!("{image}-smp{smp}-{run}"))
                };
                let boot = if image == "debian" {
                    // A pristine copy of the LUKS2 root for every boot (mounted read-only, but
                    // nothing the guest does may carry over).
                    std::fs::copy(&options.debian_root, &root_copy).unwrap();
                    // The same machine as hawser's node: TPM, boot disk, a second disk, NIC.
                    let mut config = base(VmConfig::uefi_disk(&options.debian_disk))
                        .tpm(TpmConfig::default())
                        .disk(&root_copy, DEBIAN_ROOT_SERIAL);
                    config
                        .extra_args
                        .extend(localhost::user_net_args(Some(port), &[]));
                    debian_boot(config)
                } else {
                    let fresh = image == "hawser-first";
                    let config = host.node(
                        base(VmConfig::uefi_disk(&disk)),
                        &format!("{image}-smp{smp}-{run}"),
                        port,
                        fresh,
                    );
                    // host.node names the VM; keep ours.
                    hawser_boot(config.name(format!("{image}-smp{smp}-{run}")), fresh)
                };
                let (mut boot, console) = match boot {
                    Ok(result) => result,
                    Err((message, console)) => {
                        let path = logs.join(format!("{image}-smp{smp}-{run}.console"));
                        std::fs::write(&path, &console).unwrap();
                        host.runtime.block_on(service.shutdown());
                        eprintln!("{message} (console: {})", path.display());
                        std::process::exit(1);
                    }
                };
                boot.image = image.into();
                boot.run = run;
                boot.smp = smp;
                std::fs::write(
                    logs.join(format!("{image}-smp{smp}-{run}.console")),
                    &console,
                )
                .unwrap();
                append(&results, &result_line(&boot));
                let mut lines = String::new();
                for (name, start, duration) in &boot.phases {
                    writeln!(
                        lines,
                        "{image}\t{run}\t{smp}\t{name}\t{start:.1}\t{duration:.1}"
                    )
                    .unwrap();
                }
                append(&phases, &lines);
                progress(&format!(
                    "  {image}: kernel → /init {} s, /init → {} {} s ({}), QEMU start → {} {} s",
                    secs(boot.kernel_to_init),
                    if image == "debian" {
                        "switch_root"
                    } else {
                        "pivot"
                    },
                    secs(boot.init_to_end),
                    boot.end_source,
                    if image == "debian" {
                        "root init"
                    } else {
                        "pivot"
                    },
                    secs(boot.wall_end),
                ));
            }
        }
    }
    host.runtime.block_on(service.shutdown());
    let _ = std::fs::remove_file(&root_copy);
}

fn progress(line: &str) {
    eprintln!("\x1b[1mbench-boot:\x1b[0m {line}");
}

fn secs(value: Option<f64>) -> String {
    value.map_or("?".into(), |v| format!("{v:.2}"))
}

fn append(path: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

fn result_line(boot: &Boot) -> String {
    let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
    let before_kernel = match (boot.wall_end, boot.kernel_to_init, boot.init_to_end) {
        (Some(w), Some(k), Some(i)) => Some(w - k - i),
        _ => None,
    };
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        boot.image,
        boot.run,
        boot.smp,
        f(boot.kernel_to_init),
        f(boot.init_to_end),
        boot.end_source,
        f(boot.first_console),
        f(boot.wall_end),
        f(before_kernel),
        f(boot.wall_init_to_end),
        if boot.rpc.is_empty() { "-" } else { &boot.rpc },
        if boot.note.is_empty() {
            "-"
        } else {
            &boot.note
        },
    )
}

type BootResult = Result<(Boot, String), (String, String)>;

fn console(vm: &Vm) -> String {
    let mut text = vm.console_lines().join("\n");
    text.push('\n');
    text
}

/// Seconds from "QEMU started" to `label` in the VM's timeline.
fn since_qemu_start(vm: &Vm, label: &str) -> Option<f64> {
    let timeline = vm.timeline();
    let start = timeline.iter().find(|(l, _)| l == "QEMU started")?.1;
    let at = timeline.iter().find(|(l, _)| l == label)?.1;
    Some(at.saturating_sub(start).as_secs_f64())
}

fn debian_boot(config: VmConfig) -> BootResult {
    let vm = Vm::start(config).map_err(|e| (e.to_string(), String::new()))?;
    let fail = |e: hawser_harness::QemuError| (e.to_string(), console(&vm));
    vm.wait_for_marker("end", ROOT_INIT, BOOT_TIMEOUT)
        .map_err(fail)?;
    vm.wait_for_marker("done", ROOT_DONE, BOOT_TIMEOUT)
        .map_err(fail)?;
    // The root's init powers off; give it a moment, then make sure.
    let _ = vm.wait_for_exit(Duration::from_secs(20));
    vm.kill();
    let text = console(&vm);
    let mut boot = Boot {
        first_console: since_qemu_start(&vm, "first console output"),
        wall_end: since_qemu_start(&vm, "end"),
        end_source: "kernel log",
        ..Boot::default()
    };
    // The kernel log the root's init printed: "BENCH_DMESG [    4.567890] text".
    let dmesg: Vec<(f64, &str)> = text
        .lines()
        .filter_map(|line| line.split_once("BENCH_DMESG ").map(|(_, rest)| rest))
        .filter_map(|line| {
            let rest = line.strip_prefix('[')?;
            let (stamp, text) = rest.split_once(']')?;
            Some((stamp.trim().parse().ok()?, text.trim()))
        })
        .collect();
    let find =
        |needle: &dyn Fn(&str) -> bool| dmesg.iter().find(|(_, t)| needle(t)).map(|(s, _)| *s);
    let init = find(&|t| t.starts_with("Run /init as init process"));
    let end = find(&|t| t.contains("bench: root /sbin/init reached"));
    boot.kernel_to_init = init;
    if let (Some(init), Some(end)) = (init, end) {
        boot.init_to_end = Some(end - init);
        // What the kernel log shows of Debian's initramfs, as milestones in ms since /init
        // (duration: since the previous milestone).
        type Matcher = fn(&str) -> bool;
        let milestones: [(&str, Matcher); 5] = [
            (
                "first kernel line after /init (udev coldplug loading drivers)",
                |_| true,
            ),
            ("root disk seen (virtio_blk [vdb])", |t| t.contains("[vdb]")),
            ("device-mapper loaded (dm_mod)", |t| {
                t.starts_with("device-mapper: ioctl")
            }),
            ("root mounted (EXT4-fs dm-0)", |t| {
                t.starts_with("EXT4-fs (dm-") && t.contains("mounted")
            }),
            ("root's /sbin/init", |t| {
                t.contains("bench: root /sbin/init reached")
            }),
        ];
        let mut previous = 0.0;
        for (name, matcher) in milestones {
            if let Some(at) = dmesg
                .iter()
                .find(|(s, t)| *s >= init + 0.05 && matcher(t))
                .map(|(s, _)| (s - init) * 1000.0)
            {
                boot.phases.push((name.into(), at, at - previous));
                previous = at;
            }
        }
    }
    Ok((boot, text))
}

fn hawser_boot(config: VmConfig, fresh: bool) -> BootResult {
    let vm = Vm::start(config).map_err(|e| (e.to_string(), String::new()))?;
    let fail = |e: hawser_harness::QemuError| (e.to_string(), console(&vm));
    let started = vm
        .wait_for_marker("init", INIT_STARTED, BOOT_TIMEOUT)
        .map_err(fail)?;
    let report = vm
        .wait_for_marker("report", BOOT_REPORT, BOOT_TIMEOUT)
        .map_err(fail)?;
    let pivot = vm
        .wait_for_marker("end", PIVOTED, BOOT_TIMEOUT)
        .map_err(fail)?;
    let mut note = String::new();
    if fresh {
        // A clean power-off, so that the rejoin finds the state file system clean (as after
        // any orderly shutdown); a power cut would add a journal replay to it. PID 1 loads the
        // power button's modules after the pivot: the press waits for its watch.
        let watched = vm
            .wait_for_line(POWER_BUTTON_WATCHED, Duration::from_secs(60))
            .is_ok();
        let clean =
            watched && vm.powerdown().is_ok() && vm.wait_for_exit(Duration::from_secs(180)).is_ok();
        if !clean {
            note = "no clean power-off: the rejoin may replay the journal".into();
        }
    }
    vm.kill();
    let text = console(&vm);
    let mut boot = Boot {
        first_console: since_qemu_start(&vm, "first console output"),
        wall_end: since_qemu_start(&vm, "end"),
        note,
        ..Boot::default()
    };
    if let (Some(a), Some(b)) = (since_qemu_start(&vm, "init"), boot.wall_end) {
        boot.wall_init_to_end = Some(b - a);
    }
    boot.rpc = text
        .lines()
        .find_map(|l| l.split_once(JOIN_REPORT).map(|(_, json)| json))
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json.trim()).ok())
        .and_then(|json| json["rpc"].as_str().map(str::to_owned))
        .unwrap_or_default();

    let json: Option<serde_json::Value> = report
        .split_once(BOOT_REPORT)
        .and_then(|(_, json)| serde_json::from_str(json.trim()).ok());
    // PID 1's start on the kernel's clock: the report's, else its first line's.
    let handed_over = started
        .split_once(INIT_STARTED)
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<f64>().ok());
    let init_at = json
        .as_ref()
        .and_then(|j| j["init_started_at_ms"].as_f64())
        .map(|ms| ms / 1000.0)
        .or(handed_over);
    boot.kernel_to_init = init_at;
    // /init → pivot: the line's own figure if it has one, else its console timestamp
    // (CLOCK_MONOTONIC, `[   12.345678]`) minus PID 1's start.
    if let Some(ms) = pivot_suffix(&pivot) {
        boot.init_to_end = Some(ms / 1000.0);
        boot.end_source = "pivot line's /init → pivot";
    } else if let (Some(stamp), Some(init_at)) = (console_stamp(&pivot), init_at) {
        boot.init_to_end = Some(stamp - init_at);
        boot.end_source = "pivot line's console stamp";
    } else {
        boot.end_source = "none";
    }
    if let Some(json) = &json {
        let mut report_end: f64 = 0.0;
        for timing in json["timings"].as_array().into_iter().flatten() {
            let (Some(name), Some(start), Some(duration)) = (
                timing["name"].as_str(),
                timing["start_ms"].as_f64(),
                timing["duration_ms"].as_f64(),
            ) else {
                continue;
            };
            boot.phases.push((name.to_owned(), start, duration));
            report_end = report_end.max(start + duration);
        }
        // What PID 1 logged between the report and the pivot, on its console clock: each gap
        // named after the line that ends it (digits masked, first words), for a breakdown.
        if let Some(init_at) = init_at {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.iter().position(|l| l.contains(BOOT_REPORT));
            let to = lines.iter().position(|l| l.contains(PIVOTED));
            if let (Some(from), Some(to)) = (from, to) {
                let mut previous = report_end;
                for line in &lines[from + 1..=to] {
                    let Some(stamp) = console_stamp(line) else {
                        continue;
                    };
                    let at = (stamp - init_at) * 1000.0;
                    let words: Vec<&str> = line
                        .split_once("] ")
                        .map_or(*line, |(_, t)| t)
                        .trim_start_matches("hawser: ")
                        .split_whitespace()
                        .take(6)
                        .collect();
                    let label: String = words
                        .join(" ")
                        .chars()
                        .map(|c| if c.is_ascii_digit() { 'N' } else { c })
                        .collect();
                    boot.phases
                        .push((format!("↳ … {label}"), previous, at - previous));
                    previous = at;
                }
            }
        }
        if let Some(end) = boot.init_to_end {
            let end_ms = end * 1000.0;
            // After the report: the event log line, the rootfs (dm-verity, erofs), PCR 11
            // "leave-initrd", switch_root.
            boot.phases.push((
                "(report → pivot: rootfs, leave-initrd, switch_root)".into(),
                report_end,
                end_ms - report_end,
            ));
        }
    }
    Ok((boot, text))
}

/// `… /init → pivot 1234.5 ms (5.678 s after boot)` → 1234.5.
fn pivot_suffix(line: &str) -> Option<f64> {
    let (_, rest) = line.split_once("/init → pivot ")?;
    let (ms, rest) = rest.split_once(" ms")?;
    rest.trim_start().starts_with('(').then_some(())?;
    ms.trim().parse().ok()
}

/// `[   12.345678] hawser: …` → 12.345678.
fn console_stamp(line: &str) -> Option<f64> {
    let rest = line.trim_start().strip_prefix('[')?;
    rest.split_once(']')?.0.trim().parse().ok()
}
