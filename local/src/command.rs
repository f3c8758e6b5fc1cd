//! `hawser local …`: boot a node on the local reference platform (QEMU + OVMF + swtpm), show
//! the console live, verify what it proves on the host, and power off on request.
//!
//! `local up` plays cloud and admin on loopback ([`crate::localhost`]): a provider CA
//! certifies the VM's attestation key, a fresh master secret backs a `hawser-joind` in this
//! process that checks the node against the measurements predicted from the booted UKI, and the
//! node gets its state-disk key from it over aTLS. `--init` starts no join service: the node
//! waits for `hawser init` (the command to run is printed).
//!
//! `local up` runs in the foreground and owns the VM: Ctrl-C, SIGTERM, or `hawser local down`
//! (which sends SIGTERM to the process recorded in the state file) press the VM's ACPI power
//! button and wait for PID 1's orderly shutdown. The harness kills QEMU and swtpm on every exit
//! path, so nothing is left running.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use std::net::SocketAddr;

use crate::localhost::{self, LocalCluster};
use hawser_attestation::report::{
    BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport, VerifiedReport,
};
use hawser_harness::{TpmConfig, Vm, VmConfig, format_timeline};
use hawser_image::inputs;
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_image::profile::ImageProfile;

use crate::cluster;

#[derive(Subcommand)]
pub enum LocalCommand {
    /// Build the node image (unless --image is given) and boot a cluster of QEMU nodes with
    /// software TPMs: `hawser init` of the first, attested joins of the others, verified
    /// rootfs, kubeadm. Again: the same disks rejoin (`hawser recover` of the first).
    Up(UpOptions),
    /// Each node's role, state, quote, VPN address, cluster lock and last error.
    Status,
    /// Power off the nodes started by `hawser local up` (workers first).
    Down,
    /// Power one node of the running cluster off (ACPI, PID 1's orderly shutdown); the others
    /// go on. Waits while `local up` is still forming the cluster.
    Stop {
        /// The node, e.g. node-1.
        node: String,
    },
    /// Boot a stopped node again and verify it as `local up` does: it rejoins through a running
    /// control plane's join service (a control plane started while no other runs gets `hawser
    /// recover`), quote, cluster lock, kubeadm.
    Start {
        /// The node, e.g. node-1.
        node: String,
        /// Give it a blank state disk first: a new node on the same machine, which joins (and
        /// is admitted) anew instead of rejoining.
        #[arg(long)]
        new_disk: bool,
    },
    /// Stop, then start, one node.
    Restart {
        /// The node, e.g. node-1.
        node: String,
        /// Give it a blank state disk before it starts again (see `start --new-disk`).
        #[arg(long)]
        new_disk: bool,
    },
}

/// Where local clusters live: `$HAWSER_LOCAL_DIR`, or `local/` in hawser's cache
/// (`~/.cache/hawser`). The test suite points it elsewhere, so that it never touches a
/// developer's own local cluster.
pub fn local_dir() -> PathBuf {
    std::env::var_os("HAWSER_LOCAL_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| inputs::cache_dir().join("local"), PathBuf::from)
}

/// Records which `local up` process owns the running VM.
fn state_file() -> PathBuf {
    local_dir().join("up.pid")
}

pub fn run(cmd: LocalCommand) -> anyhow::Result<()> {
    match cmd {
        LocalCommand::Up(opts) => up(opts),
        LocalCommand::Status => status(),
        LocalCommand::Down => down(),
        LocalCommand::Stop { node } => node_action(cluster::NodeAction::Stop, &node, false),
        LocalCommand::Start { node, new_disk } => {
            node_action(cluster::NodeAction::Start, &node, new_disk)
        }
        LocalCommand::Restart { node, new_disk } => {
            node_action(cluster::NodeAction::Restart, &node, new_disk)
        }
    }
}

/// Whether process `pid` exists and has not exited: a `local up` that ended but was not yet
/// reaped by its parent (a zombie, state `Z` in `/proc/<pid>/stat`) runs nothing any more.
fn is_running(pid: nix::unistd::Pid) -> bool {
    if nix::sys::signal::kill(pid, None).is_err() {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // `pid (comm) state …`: the state follows the last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X'))
}

/// The `local up` process recorded in the state file, if it still runs.
fn running_up() -> Option<nix::unistd::Pid> {
    let pid: i32 = std::fs::read_to_string(state_file())
        .ok()
        .and_then(|s| s.trim().parse().ok())?;
    let pid = nix::unistd::Pid::from_raw(pid);
    is_running(pid).then_some(pid)
}

/// `hawser local stop|start|restart <node>`: asks the running `local up` on its control
/// socket, prints what it says meanwhile, and fails with its reason.
fn node_action(action: cluster::NodeAction, node: &str, new_disk: bool) -> anyhow::Result<()> {
    use std::io::BufRead as _;
    let socket = cluster::control_socket();
    let deadline = Instant::now() + Duration::from_secs(30 * 60);
    let mut waiting = false;
    let mut stream = loop {
        match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(stream) => break stream,
            Err(e) => {
                if running_up().is_none() {
                    bail!(
                        "no `hawser local up` runs a cluster in {} (start one without --once; \
                         `hawser local {}` acts on its nodes): {e}",
                        local_dir().display(),
                        action.name()
                    );
                }
                if Instant::now() > deadline {
                    bail!("`hawser local up` did not finish forming the cluster in 30 minutes");
                }
                if !waiting {
                    println!("waiting for `hawser local up` to finish forming the cluster …");
                    waiting = true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    };
    let flag = if new_disk { " --new-disk" } else { "" };
    writeln!(stream, "{} {node}{flag}", action.name()).context("asking `hawser local up`")?;
    let mut last = String::new();
    for line in std::io::BufReader::new(stream).lines() {
        let line = line.context("reading `hawser local up`'s answer")?;
        if let Some(reason) = line.strip_prefix("error: ") {
            bail!("{reason}");
        }
        if line != "ok" {
            println!("{line}");
        }
        last = line;
    }
    if last != "ok" {
        bail!("`hawser local up` ended without an answer (did it stop?)");
    }
    Ok(())
}

fn down() -> anyhow::Result<()> {
    let path = state_file();
    let pid: i32 = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("no local VM is running (no {})", path.display()))?;
    let pid = nix::unistd::Pid::from_raw(pid);
    if !is_running(pid) {
        let _ = std::fs::remove_file(&path);
        bail!("no local VM is running (process {pid} is gone)");
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .with_context(|| format!("signalling `hawser local up` (pid {pid})"))?;
    println!("asked `hawser local up` (pid {pid}) to power its nodes off (workers first) …");
    // Each node gets up to 90 s for PID 1's orderly shutdown before it is killed.
    let deadline = Instant::now() + Duration::from_secs(600);
    while is_running(pid) {
        if Instant::now() > deadline {
            bail!("`hawser local up` (pid {pid}) is still running after 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("all nodes are off (`hawser local status` shows how each ended)");
    Ok(())
}

/// `hawser local status`: what the running (or last) `local up` wrote.
fn status() -> anyhow::Result<()> {
    let dir = cluster::cluster_dir();
    let Some(status) = crate::local_cluster::StatusFile::read(&dir)? else {
        bail!(
            "no local cluster in {} (`hawser local up` creates one)",
            dir.display()
        );
    };
    let alive = is_running(nix::unistd::Pid::from_raw(
        i32::try_from(status.pid).unwrap_or(i32::MAX),
    )) && state_file().exists();
    if alive {
        println!(
            "`hawser local up` (pid {}) runs the cluster in {}",
            status.pid,
            dir.display()
        );
    } else {
        println!(
            "no `hawser local up` is running; the cluster in {} as it was last seen:",
            dir.display()
        );
    }
    print!("{}", status.table());
    Ok(())
}

#[derive(Args)]
pub struct UpOptions {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 2)]
    pub(crate) nodes: usize,
    /// How many of the nodes are control planes (the first is initialized with `hawser init`,
    /// the others join with the admin's approval of their TPM's attestation key).
    #[arg(long, default_value_t = 1)]
    pub(crate) control_planes: usize,
    /// Start a new cluster: remove the local cluster's disks, TPMs and admin secrets first.
    #[arg(long)]
    pub(crate) fresh: bool,
    /// DEVELOPMENT SHORTCUT, one node: a join service on the host that the node trusts WITHOUT
    /// attesting it (`hawser.join_service_trust=insecure-dev` on its measured command line).
    #[arg(long, conflicts_with_all = ["init", "nodes", "control_planes", "fresh"])]
    pub(crate) insecure_dev_join_service: bool,
    /// Boot the node image already built in this directory (`hawser image build --out
    /// DIR` with the local command line: hawser.efi and hawser-disk.raw) instead of
    /// building one.
    #[arg(long)]
    pub(crate) image: Option<PathBuf>,
    /// Where to build the image.
    #[arg(long, default_value = "out")]
    pub(crate) out: PathBuf,
    /// Build the image users ship: a production image, whose state disks have HMAC-SHA256
    /// integrity (`hawser image build`'s default; 96-byte disk keys, a first-boot wipe of each
    /// disk). Without it `local up` builds a development image (AES-XTS only), the fast path.
    #[arg(long, conflicts_with = "image")]
    pub(crate) production: bool,
    /// QEMU accelerator (tcg, kvm); default: $HAWSER_QEMU_ACCEL or tcg.
    #[arg(long)]
    pub(crate) accel: Option<String>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 1024)]
    pub(crate) memory: u32,
    /// Do not echo the serial console (the boot report summary is still printed).
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Power off once the boot report is verified and kubeadm has run (or the node said why
    /// not), instead of waiting for Ctrl-C.
    #[arg(long)]
    pub(crate) once: bool,
    /// One node that waits for YOUR `hawser init` on 127.0.0.1:<init-port> (the command is
    /// printed).
    /// (The init secret's hash goes on the image's measured command line, so the image is
    /// built for it: not with --image.)
    #[arg(long, conflicts_with_all = ["nodes", "control_planes", "fresh", "image"])]
    pub(crate) init: bool,
    /// The host port forwarded to the node's init server (port 9000 in the guest).
    #[arg(long, default_value_t = 9000)]
    pub(crate) init_port: u16,
}

impl UpOptions {
    /// The image profile `--production` asks for.
    pub(crate) fn profile(&self) -> ImageProfile {
        if self.production {
            ImageProfile::Production
        } else {
            ImageProfile::Development
        }
    }
}

fn up(opts: UpOptions) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    let state = state_file();
    if let Some(dir) = state.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if let Some(pid) = std::fs::read_to_string(&state)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&pid| is_running(nix::unistd::Pid::from_raw(pid)))
    {
        bail!("`hawser local up` (pid {pid}) runs already; `hawser local down` stops it");
    }
    std::fs::write(&state, std::process::id().to_string())?;
    let _state_guard = RemoveOnDrop(state);
    if opts.init || opts.insecure_dev_join_service {
        up_single(opts, &stop)
    } else {
        cluster::up(&opts, &stop)
    }
}

/// One node: `--init` (it waits for the user's `hawser init`) or
/// `--insecure-dev-join-service`.
fn up_single(opts: UpOptions, stop: &AtomicBool) -> anyhow::Result<()> {
    let started = Instant::now();
    if opts.insecure_dev_join_service {
        eprintln!(
            "INSECURE DEVELOPMENT SHORTCUT: the node trusts the join service on this host \
             without attesting it (hawser.join_service_trust=insecure-dev, measured); whoever \
             answers there chooses its disk key and cluster. `hawser local up` without \
             --insecure-dev-join-service forms a cluster with attested trust both ways."
        );
    }
    // The host side first: provider CA, master secret. With --init, an image built here carries
    // this run's CA, so that after `hawser init` the node's own join service can verify joining
    // nodes' attestation keys with it (without, the node says it does not start the service).
    // Its own directory: `LocalCluster::create` empties it (a cluster's is never touched).
    let cluster_dir = local_dir().join("single");
    let cluster = LocalCluster::create(&cluster_dir)?;
    let init_secret = cluster_dir.join(hawser_cli::cluster::INIT_SECRET_FILE);
    let dir = match opts.image {
        Some(dir) => dir,
        None => {
            let ws = hawser_cli::image_build::workspace()?;
            let mut build = PipelineOptions::new(&ws, &opts.out);
            build.cmdline = opts.profile().cmdline(&localhost::node_cmdline(
                pipeline::DEFAULT_CMDLINE,
                !opts.init,
            ))?;
            if opts.init {
                build.provider_ca = Some(cluster.provider_ca_path());
                // The node runs an init server only for whoever holds this secret: its hash is
                // on the measured command line (never from the host's fw_cfg).
                let hash = hawser_cli::cluster::write_new_init_secret(&init_secret)?;
                build
                    .cmdline
                    .push_str(&format!(" hawser.init_secret_hash={}", hex::encode(hash)));
            }
            eprintln!(
                "building the node image into {} (command line: {}) …",
                opts.out.display(),
                build.cmdline
            );
            let (node, timeline) =
                pipeline::build_node_image(&build, &mut |line| eprintln!("{line}"))?;
            eprintln!("{node}");
            hawser_cli::image_build::print_timeline(&timeline);
            opts.out.clone()
        }
    };
    let uki = dir.join(hawser_image::build::UKI_FILE);
    let disk_image = dir.join(pipeline::DISK_FILE);
    for file in [&uki, &disk_image] {
        if !file.is_file() {
            bail!(
                "{} does not exist: build the node image with `hawser image build --out {}`",
                file.display(),
                dir.display()
            );
        }
    }

    // Expected measurements and the join service.
    let dir = cluster_dir;
    let measurements = dir.join("measurements.json");
    localhost::write_expected_measurements(&uki, &measurements)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let join_port = if opts.init {
        None
    } else {
        let port = localhost::free_port()?;
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let service = runtime.block_on(cluster.start_join_service(listen, &measurements))?;
        eprintln!(
            "hawser-joind listening on {listen} (the guest's {}), verifying nodes against {} \
             with a fresh master secret in {}",
            localhost::GUEST_JOIN_ENDPOINT,
            measurements.display(),
            dir.display()
        );
        // Runs until this process exits.
        std::mem::forget(service);
        Some(port)
    };
    // There is no control plane on the host: the joining node's kubeadm discovery reaches a
    // listener that stands in for one (it serves no API), and says so.
    let api_server_port = match join_port {
        Some(_) => {
            let port = localhost::api_server_stand_in()?;
            eprintln!(
                "API server STAND-IN on 127.0.0.1:{port} (the guest's {}): accepts TCP \
                 connections for kubeadm's discovery and serves no Kubernetes API",
                localhost::GUEST_API_SERVER_ENDPOINT
            );
            Some(port)
        }
        None => None,
    };
    if opts.init && std::net::TcpListener::bind(("127.0.0.1", opts.init_port)).is_err() {
        bail!(
            "127.0.0.1:{} is in use: choose another host port with --init-port",
            opts.init_port
        );
    }
    let tpm_dir = dir.join("tpm");
    cluster.provision_tpm(&tpm_dir)?;
    let disk = dir.join("state.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(STATE_DISK_BYTES))
        .with_context(|| format!("creating the state disk {}", disk.display()))?;

    let nonce = hawser_keys::random_bytes(32)?;
    let mut config = VmConfig::uefi_disk(&disk_image)
        .name("hawser-local")
        .memory_mib(opts.memory)
        .tpm(TpmConfig {
            state_dir: Some(tpm_dir),
            ..TpmConfig::default()
        })
        .disk(&disk, localhost::STATE_DISK_SERIAL)
        .fw_cfg_string("quote_nonce", hex::encode(&nonce));
    config
        .extra_args
        .extend(localhost::user_net_args_with_api_server(
            join_port,
            api_server_port,
            &[(opts.init_port, localhost::NODE_INIT_PORT)],
        ));
    if let Some(accel) = opts.accel {
        config = config.accel(accel);
    }
    eprintln!(
        "booting {} in QEMU ({}, OVMF, swtpm); Ctrl-C powers it off",
        disk_image.display(),
        config.accel
    );
    let vm = if opts.quiet {
        Vm::start(config)?
    } else {
        Vm::start_echoing(config, Box::new(ConsoleEcho))?
    };
    if opts.init {
        eprintln!(
            "\nthe node waits for `hawser init`; in another terminal run:\n\n  \
             cargo run -q -p hawser-cli -- init --node 127.0.0.1:{} --measurements {} \
             --provider-ca {} --init-secret {}\n",
            opts.init_port,
            measurements.display(),
            cluster.provider_ca_path().display(),
            init_secret.display()
        );
    }
    let Some(line) = wait_or_stop(&vm, JOIN_REPORT_MARKER, Duration::from_secs(3600), stop)? else {
        return power_off(&vm, "interrupted before the node got its key");
    };
    let joined = print_join(&line, &cluster, localhost::state_disk_key_length(&uki)?)?;

    let line = wait_or_stop(&vm, BOOT_REPORT_MARKER, Duration::from_secs(600), stop)?;
    let Some(line) = line else {
        return power_off(&vm, "interrupted before the boot report");
    };
    let report = BootReport::find_in_console(&line)
        .context("boot report marker without a report")?
        .context("the boot report is not valid JSON")?;
    match report.verify(Some(&nonce)) {
        Ok(verified) => {
            print_summary(&report, &verified, &vm, started);
            let pcr15 = verified.pcrs.get(&15).map(hex::encode).unwrap_or_default();
            if pcr15 != joined.pcr15 {
                power_off(&vm, "PCR 15 mismatch")?;
                bail!(
                    "the quoted PCR 15 is {pcr15}, but the node lock for cluster {} gives {}",
                    joined.cluster_id,
                    joined.pcr15
                );
            }
            println!(
                "PCR 15 (quoted) = node lock for cluster {}: this node can no longer attest as fresh",
                joined.cluster_id
            );
        }
        Err(e) => {
            let reason = hawser_attestation::error_chain(&e);
            eprintln!("\nBOOT REPORT DOES NOT VERIFY: {reason}");
            power_off(&vm, "verification failed")?;
            bail!("the boot report did not verify: {reason}");
        }
    }
    // After the pivot: kubeadm, once per node lifetime.
    let kubeadm = |line: &str| {
        line.contains("kubeadm init succeeded")
            || line.contains("kubeadm join succeeded")
            || line.contains("kubeadm does not run again")
            || (line.contains("kubeadm") && line.contains("failed"))
            || line.contains("containerd, kubelet and kubeadm are not started")
    };
    match wait_or_stop(&vm, kubeadm, Duration::from_secs(600), stop)? {
        Some(line) => print_kubernetes(&vm, &line),
        None => return power_off(&vm, "interrupted before kubeadm"),
    }
    if opts.once {
        return power_off(&vm, "--once");
    }
    eprintln!("node is up; Ctrl-C or `hawser local down` powers it off");
    while !stop.load(Ordering::Relaxed) {
        if let Some(status) = vm.exit_status() {
            bail!(
                "QEMU exited on its own ({status}); console log: {}",
                vm.console_log_path().display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    power_off(&vm, "requested")
}

/// Size of a local node's (sparse) state disk.
const STATE_DISK_BYTES: u64 = 256 << 20;
/// Prints how the node got its key, checked against the host's own derivation.
fn print_join(
    line: &str,
    cluster: &LocalCluster,
    key_length: hawser_keys::StateDiskKeyLength,
) -> anyhow::Result<JoinReport> {
    let report = JoinReport::find_in_console(line)
        .context("join report marker without a report")?
        .context("the node's join report is not valid JSON")?;
    let from_join_service = report.via == "join-service";
    let expected = hawser_keys::fingerprint(
        cluster
            .master_secret()
            .state_disk_key(&report.disk_uuid, key_length)?
            .as_slice(),
    );
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n── state disk key ──────────────────────────────────────────"
    );
    let _ = writeln!(
        out,
        "node attested and got the key of disk {} via {} ({}, {} attempt(s))",
        report.disk_uuid, report.via, report.rpc, report.attempts
    );
    if from_join_service {
        let _ = writeln!(
            out,
            "key fingerprint {} — host derivation HKDF(master secret, \"key-{}\"): {}",
            report.key_fingerprint,
            report.disk_uuid,
            if expected == report.key_fingerprint {
                "MATCHES".to_owned()
            } else {
                format!("{expected} (DIFFERS: the node got another cluster's key)")
            }
        );
    } else {
        let _ = writeln!(
            out,
            "key fingerprint {} — derived on the node from the master secret `hawser init` sent",
            report.key_fingerprint
        );
    }
    let _ = writeln!(
        out,
        "cluster ID {} → PCR 15 {}",
        report.cluster_id, report.pcr15
    );
    if from_join_service && expected != report.key_fingerprint {
        bail!("the node's key does not derive from this cluster's master secret");
    }
    Ok(report)
}

/// Waits for `marker`, returning `None` if a stop signal arrives first.
/// What the node did with Kubernetes: the kubeadm outcome, and what the stand-ins said.
fn print_kubernetes(vm: &Vm, outcome: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n── Kubernetes ──────────────────────────────────────────────"
    );
    let console = vm.console_lines();
    for line in console.iter().filter(|l| {
        l.contains("rootfs mapped at")
            || l.contains("switched into the rootfs")
            || l.contains("running kubeadm ")
            || l.contains("[kubeadm]")
            // PID 1's status after each attempt (`HAWSER_KUBEADM_STATUS {json}`).
            || l.contains("HAWSER_KUBEADM_STATUS ")
            || l.contains("STAND-IN (not Kubernetes): started")
    }) {
        let text = line
            .split_once("hawser: ")
            .map_or(line.as_str(), |(_, t)| t);
        let _ = writeln!(out, "{text}");
    }
    let text = outcome.split_once("hawser: ").map_or(outcome, |(_, t)| t);
    let _ = writeln!(out, "{text}");
    if console
        .iter()
        .any(|l| l.contains("STAND-IN (not Kubernetes)"))
    {
        let _ = writeln!(
            out,
            "(this image carries hawser's kubeadm and kubelet STAND-INS, not Kubernetes: \
             pkgs.k8s.io was not reachable when it was built)"
        );
    }
}

pub(crate) fn wait_or_stop(
    vm: &Vm,
    marker: impl hawser_harness::LineMatcher + Copy,
    timeout: Duration,
    stop: &AtomicBool,
) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + timeout;
    let label = marker.describe();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match vm.wait_for_marker(&label, marker, Duration::from_millis(500)) {
            Ok(line) => return Ok(Some(line)),
            Err(hawser_harness::QemuError::Timeout { .. }) if Instant::now() < deadline => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn power_off(vm: &Vm, why: &str) -> anyhow::Result<()> {
    eprintln!("\npowering off ({why}): ACPI power button …");
    let t = Instant::now();
    vm.powerdown().context("pressing the ACPI power button")?;
    let status = vm
        .wait_for_exit(Duration::from_secs(90))
        .context("the VM did not power off within 90 s (it is killed now)")?;
    eprintln!(
        "VM powered off in {:.1}s ({status})",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn print_summary(report: &BootReport, verified: &VerifiedReport, vm: &Vm, started: Instant) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n── boot report ─────────────────────────────────────────────"
    );
    let _ = writeln!(
        out,
        "hawser {} on Linux {} · TPM {}",
        report.hawser_version, report.kernel_release, report.tpm_device
    );
    let _ = writeln!(
        out,
        "quote VERIFIED: ECDSA P-256 signature by AK {}…, nonce from the host, PCR digest, PCR 11 = … ⊕ enter-initrd",
        &hex::encode(verified.quote.ak_fingerprint)[..16]
    );
    for (pcr, value) in &verified.pcrs {
        if *value != [0u8; 32] {
            let _ = writeln!(out, "  PCR {pcr:>2}  {}", hex::encode(value));
        }
    }
    let _ = writeln!(out, "  (PCRs not listed are zero)");
    let _ = writeln!(
        out,
        "PID 1 phases (ms since /init; kernel reached /init at {:.0} ms):",
        report.init_started_at_ms
    );
    for t in &report.timings {
        let _ = writeln!(
            out,
            "  {:>8.1} +{:>7.1}  {}",
            t.start_ms, t.duration_ms, t.name
        );
    }
    for w in &report.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "host timeline (wall clock since QEMU start):");
    let _ = write!(out, "{}", format_timeline(&vm.timeline()));
    let _ = writeln!(
        out,
        "total since `hawser local up`: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// Echoes console lines to stderr, dimmed, so the summary on stdout stands out.
struct ConsoleEcho;

impl std::io::Write for ConsoleEcho {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::io::IsTerminal as _;
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            err.write_all(b"\x1b[2m")?;
            err.write_all(buf)?;
            err.write_all(b"\x1b[0m")?;
        } else {
            err.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
