//! `hawser local up` of one node: `--init` (it waits for the user's `hawser init`) or
//! `--insecure-dev-join-service` (a join service on the host that the node trusts without
//! attesting it). The host side (provider CA, master secret, the join service in this process)
//! is [`LocalCluster`]'s; this module boots the node and verifies on the host what it proves:
//! its key against the host's own derivation, its signed boot report, PCR 15's node lock.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hawser_attestation::report::{
    BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport, VerifiedReport,
};
use hawser_harness::{TpmConfig, Vm, VmConfig, format_timeline};
use hawser_image::pipeline::{self, PipelineOptions};

use crate::localhost::{self, LocalCluster};
use crate::options::{UpOptions, local_dir, wait_or_stop};

/// One node: `--init` (it waits for the user's `hawser init`) or
/// `--insecure-dev-join-service`.
pub(crate) fn up_single(opts: UpOptions, stop: &AtomicBool) -> anyhow::Result<()> {
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
    let dir = local_dir().join("single");
    let mut cluster = LocalCluster::create(&dir)?;
    let init_secret = dir.join(hawser_cli::cluster::INIT_SECRET_FILE);
    let image_dir = node_image(&opts, &cluster, &init_secret)?;
    let uki = image_dir.join(hawser_image::build::UKI_FILE);
    let disk_image = image_dir.join(pipeline::DISK_FILE);
    for file in [&uki, &disk_image] {
        if !file.is_file() {
            bail!(
                "{} does not exist: build the node image with `hawser image build --out {} \
                 --kubernetes stand-in`",
                file.display(),
                image_dir.display()
            );
        }
    }
    // The join service hands out the Kubernetes version the image carries (a node refuses any
    // other before it formats its disk).
    if let Some(version) = localhost::image_kubernetes_version(&uki)? {
        cluster.set_kubernetes_version(&version);
    }

    // Expected measurements and the join service.
    let measurements = dir.join("measurements.json");
    localhost::write_expected_measurements(&uki, &measurements)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let host = start_host_services(&opts, &cluster, &runtime, &measurements)?;
    let nonce = hawser_keys::random_bytes(32)?;
    let vm = boot(&opts, &cluster, &disk_image, host, &nonce)?;
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
    if !verify_boot_report(&vm, &nonce, &joined, started, stop)? {
        return power_off(&vm, "interrupted before the boot report");
    }
    // After the pivot: kubeadm, once per node lifetime.
    match wait_or_stop(&vm, kubeadm_outcome, Duration::from_secs(600), stop)? {
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

/// The directory of the node image: `--image`, or one built now into `--out` with the local
/// command line (with `--init`: this run's provider CA and the init secret's hash, measured).
fn node_image(
    opts: &UpOptions,
    cluster: &LocalCluster,
    init_secret: &Path,
) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &opts.image {
        return Ok(dir.clone());
    }
    let ws = hawser_cli::image_build::workspace()?;
    let mut build = PipelineOptions::new(&ws, &opts.out);
    // Real Kubernetes (minutes per node under TCG), or the stand-ins with `--kubernetes
    // stand-in`; the image build says which.
    build.kubernetes = opts.kubernetes().into();
    build.cmdline = opts.profile().cmdline(&localhost::node_cmdline(
        pipeline::DEFAULT_CMDLINE,
        !opts.init,
    ))?;
    if opts.init {
        build.provider_ca = Some(cluster.provider_ca_path());
        // The node runs an init server only for whoever holds this secret: its hash is
        // on the measured command line (never from the host's fw_cfg).
        let hash = hawser_cli::cluster::write_new_init_secret(init_secret)?;
        build
            .cmdline
            .push_str(&format!(" hawser.init_secret_hash={}", hex::encode(hash)));
    }
    eprintln!(
        "building the node image into {} (command line: {}) …",
        opts.out.display(),
        build.cmdline
    );
    let (node, timeline) = pipeline::build_node_image(&build, &mut |line| eprintln!("{line}"))?;
    eprintln!("{node}");
    hawser_cli::image_build::print_timeline(&timeline);
    Ok(opts.out.clone())
}

/// The host ports the node's user network forwards to.
#[derive(Debug, Clone, Copy)]
struct HostServices {
    /// The join service in this process (none with `--init`).
    join_port: Option<u16>,
    /// The API server stand-in the joining node's kubeadm discovery reaches.
    api_server_port: Option<u16>,
}

/// Without `--init`: the join service on loopback (it runs until this process exits) and the
/// API server stand-in. With it: nothing, but the init port must be free.
fn start_host_services(
    opts: &UpOptions,
    cluster: &LocalCluster,
    runtime: &tokio::runtime::Runtime,
    measurements: &Path,
) -> anyhow::Result<HostServices> {
    let join_port = if opts.init {
        None
    } else {
        let port = localhost::free_port()?;
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let service = runtime.block_on(cluster.start_join_service(listen, measurements))?;
        eprintln!(
            "hawser-joind listening on {listen} (the guest's {}), verifying nodes against {} \
             with a fresh master secret in {}",
            localhost::GUEST_JOIN_ENDPOINT,
            measurements.display(),
            cluster.dir.display()
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
    Ok(HostServices {
        join_port,
        api_server_port,
    })
}

/// Boots the node: its TPM provisioned by the provider CA, a blank state disk, the nonce of
/// its boot report, and the user network to the host's services.
fn boot(
    opts: &UpOptions,
    cluster: &LocalCluster,
    disk_image: &Path,
    host: HostServices,
    nonce: &[u8],
) -> anyhow::Result<Vm> {
    let tpm_dir = cluster.dir.join("tpm");
    cluster.provision_tpm(&tpm_dir)?;
    let disk = cluster.dir.join("state.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(opts.state_disk_bytes(crate::local_cluster::Role::ControlPlane)))
        .with_context(|| format!("creating the state disk {}", disk.display()))?;

    let mut config = VmConfig::uefi_disk(disk_image)
        .name("hawser-local")
        .memory_mib(opts.memory_mib(crate::local_cluster::Role::ControlPlane))
        .cpus(opts.cpus())
        .tpm(TpmConfig {
            state_dir: Some(tpm_dir),
            ..TpmConfig::default()
        })
        .disk(&disk, localhost::STATE_DISK_SERIAL)
        .fw_cfg_string("quote_nonce", hex::encode(nonce));
    config
        .extra_args
        .extend(localhost::user_net_args_with_api_server(
            host.join_port,
            host.api_server_port,
            &[(opts.init_port, localhost::NODE_INIT_PORT)],
        ));
    if let Some(accel) = &opts.accel {
        config = config.accel(accel.clone());
    }
    eprintln!(
        "booting {} in QEMU ({}, OVMF, swtpm); Ctrl-C powers it off",
        disk_image.display(),
        config.accel
    );
    Ok(if opts.quiet {
        Vm::start(config)?
    } else {
        Vm::start_echoing(config, Box::new(ConsoleEcho))?
    })
}

/// Waits for the signed boot report and verifies it (this run's nonce; PCR 15 the node lock
/// of the cluster the node joined); `false` if a stop signal came first. A report that does
/// not verify powers the node off and is an error.
fn verify_boot_report(
    vm: &Vm,
    nonce: &[u8],
    joined: &JoinReport,
    started: Instant,
    stop: &AtomicBool,
) -> anyhow::Result<bool> {
    let line = wait_or_stop(vm, BOOT_REPORT_MARKER, Duration::from_secs(600), stop)?;
    let Some(line) = line else {
        return Ok(false);
    };
    let report = BootReport::find_in_console(&line)
        .context("boot report marker without a report")?
        .context("the boot report is not valid JSON")?;
    match report.verify(Some(nonce)) {
        Ok(verified) => {
            print_summary(&report, &verified, vm, started);
            let pcr15 = verified.pcrs.get(&15).map(hex::encode).unwrap_or_default();
            if pcr15 != joined.pcr15 {
                power_off(vm, "PCR 15 mismatch")?;
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
            Ok(true)
        }
        Err(e) => {
            let reason = hawser_attestation::error_chain(&e);
            eprintln!("\nBOOT REPORT DOES NOT VERIFY: {reason}");
            power_off(vm, "verification failed")?;
            bail!("the boot report did not verify: {reason}");
        }
    }
}

/// The console line that tells what kubeadm did, once per node lifetime.
fn kubeadm_outcome(line: &str) -> bool {
    line.contains("kubeadm init succeeded")
        || line.contains("kubeadm join succeeded")
        || line.contains("kubeadm does not run again")
        || (line.contains("kubeadm") && line.contains("failed"))
        || line.contains("containerd, kubelet and kubeadm are not started")
}

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
