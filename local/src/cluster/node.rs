//! One node of the local cluster as `local up` drives it: its VM booted with its TPM, disk,
//! role and networks; the waits on its console; its join and boot reports verified; its
//! power-off; its console echoed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_harness::{TpmConfig, Vm, VmConfig};
use hawser_keys::{MasterSecret, StateDiskKeyLength};

use super::{
    API_SERVER_PORT, BOOT_TIMEOUT, BootImage, Events, Formation, Interrupted, Node, UpOptions,
};
use crate::local_cluster::{Role, Stage, observe};
use crate::options::wait_or_stop;
use crate::{lan, localhost};

/// Waits until the node's console shows kubeadm succeeded (on this boot or, on a rejoin, on an
/// earlier one); a fatal error is an error naming PID 1's last word. Reads the whole console,
/// so a line an earlier wait passed over counts.
pub(super) fn wait_for_kubeadm(node: &Node, stop: &AtomicBool) -> anyhow::Result<()> {
    let deadline = Instant::now() + BOOT_TIMEOUT;
    loop {
        let lines = node.vm.console_lines();
        let seen = observe(&lines);
        // A failed attempt is retried by PID 1 (its reason is the node's last error meanwhile).
        if seen.stage == Some(Stage::KubeadmDone) {
            return Ok(());
        }
        if seen.stage > Some(Stage::KubeadmDone) {
            bail!(
                "{}'s kubeadm did not succeed: {}; console log {}",
                node.spec.name,
                seen.last_error.as_deref().unwrap_or("(no reason printed)"),
                node.vm.console_log_path().display()
            );
        }
        if stop.load(Ordering::Relaxed) {
            return Err(Interrupted {
                node: node.spec.name.clone(),
                what: "kubeadm".to_owned(),
            }
            .into());
        }
        if let Some(status) = node.vm.exit_status() {
            bail!(
                "{}'s QEMU exited ({status}) before kubeadm's outcome; console log {}",
                node.spec.name,
                node.vm.console_log_path().display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} showed no kubeadm outcome within {} s; console log {}",
                node.spec.name,
                BOOT_TIMEOUT.as_secs(),
                node.vm.console_log_path().display()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Starts node `i`'s VM: its TPM and disk, its role, a nonce for its boot report, and its
/// network: node-1's platform carries the init secret's hash; every node is on the LAN, where
/// the others find the join services by mDNS and node-1's API server at its LAN address.
pub(super) fn boot(
    opts: &UpOptions,
    f: &Formation<'_>,
    i: usize,
    nonce: &[u8],
    image: &BootImage,
) -> anyhow::Result<Vm> {
    let spec = &f.layout.nodes[i];
    let node_dir = f.dir.join(&spec.name);
    let mut config = VmConfig::uefi_disk(&image.disk_image)
        .name(&spec.name)
        .memory_mib(opts.memory_mib(spec.role))
        .cpus(opts.cpus())
        .tpm(TpmConfig {
            state_dir: Some(node_dir.join("tpm")),
            ..TpmConfig::default()
        })
        .disk(node_dir.join("state.img"), localhost::STATE_DISK_SERIAL)
        .fw_cfg_string("quote_nonce", hex::encode(nonce))
        .fw_cfg_string("role", spec.role.fw_cfg())
        .keep_logs_in(node_dir.join("logs"));
    let own = f.ports[i];
    // The host reaches a control plane's join service and its init server (`hawser init` of
    // node-1, `hawser recover` of each). No join endpoint is configured: nodes find the join services by
    // their mDNS adverts on the LAN, and reach the API server at node-1's LAN address.
    // Every node answers `hawser verify`; a control plane serves its join service and the
    // latter's admin API too.
    let mut published = vec![(own.attest, localhost::NODE_ATTEST_PORT)];
    if spec.role == Role::ControlPlane {
        published.push((own.joind, localhost::NODE_JOIND_PORT));
        published.push((own.admin, localhost::NODE_ADMIN_PORT));
    }
    // Every control plane waits for the admin too (`hawser recover` after a whole-cluster
    // restart); node-1 also for `hawser init`.
    // The host reaches the API server of every control plane (`kubectl` with the admin's
    // host kubeconfig).
    if spec.role == Role::ControlPlane {
        published.push((own.init, localhost::NODE_INIT_PORT));
        published.push((own.api, API_SERVER_PORT));
    }
    config
        .extra_args
        .extend(localhost::user_net_args(None, &published));
    // The LAN between the nodes: the second NIC, its address through fw_cfg.
    config = config.fw_cfg_string("lan_net", lan::address(i));
    config.extra_args.extend(lan::nic_args(&f.lan[i], i));
    if let Some(accel) = &opts.accel {
        config = config.accel(accel.clone());
    }
    let vm = if opts.quiet {
        Vm::start(config)?
    } else {
        Vm::start_echoing(config, Box::new(NodeEcho::new(&spec.name)))?
    };
    Ok(vm)
}

/// Waits for the node's join report and signed boot report; verifies the quote (this run's
/// nonce), that PCR 15 is the lock for `cluster_id`, and that the node's disk key derives from
/// the admin's master secret at the length of the image's integrity mode.
pub(super) fn check_reports(
    node: &Node,
    nonce: &[u8],
    master: &MasterSecret,
    key_length: StateDiskKeyLength,
    cluster_id: &[u8; 32],
    stop: &AtomicBool,
    events: &Events,
) -> anyhow::Result<()> {
    let name = &node.spec.name;
    let line = wait_for(node, JOIN_REPORT_MARKER, stop, "its join report")?;
    let join = JoinReport::find_in_console(&line)
        .context("join report marker without a report")?
        .context("the node's join report is not valid JSON")?;
    let expected_key = hawser_keys::fingerprint(
        master
            .state_disk_key(&join.disk_uuid, key_length)?
            .as_slice(),
    );
    if join.key_bytes != key_length.bytes() {
        bail!(
            "{name} got a {}-byte key for disk {}; its image's integrity mode needs {}",
            join.key_bytes,
            join.disk_uuid,
            key_length.bytes()
        );
    }
    if join.key_fingerprint != expected_key {
        bail!(
            "{name} got key {} for disk {}, but the cluster's master secret derives {expected_key}",
            join.key_fingerprint,
            join.disk_uuid
        );
    }
    if join.cluster_id != hex::encode(cluster_id) {
        bail!(
            "{name} locked itself to cluster {}, not {}",
            join.cluster_id,
            hex::encode(cluster_id)
        );
    }
    // How it found the join service: PID 1 names the adverts it heard on the LAN.
    let found = node
        .vm
        .console_lines()
        .iter()
        .find_map(|l| {
            l.split_once("join services advertised on the LAN: ")
                .map(|(_, adverts)| format!(" (found by mDNS: {adverts})"))
        })
        .unwrap_or_default();
    events.say(format!(
        "{name} attested ({} via {}, {} attempt(s)) and got the key of disk {}{found}",
        join.rpc, join.via, join.attempts, join.disk_uuid
    ));
    let line = wait_for(node, BOOT_REPORT_MARKER, stop, "its boot report")?;
    let report = BootReport::find_in_console(&line)
        .context("boot report marker without a report")?
        .context("the boot report is not valid JSON")?;
    let verified = report.verify(Some(nonce)).map_err(|e| {
        anyhow::anyhow!(
            "{name}'s boot report does not verify: {}",
            hawser_attestation::error_chain(&e)
        )
    })?;
    let pcr15 = verified.pcrs.get(&15).copied().unwrap_or_default();
    if pcr15 != hawser_pcr::cluster_lock_pcr(cluster_id) {
        bail!(
            "{name}'s quoted PCR 15 is {}, not the lock for cluster {}",
            hex::encode(pcr15),
            hex::encode(cluster_id)
        );
    }
    node.quote_verified.store(true, Ordering::Relaxed);
    events.say(format!(
        "{name}: quote verified (AK {}…, this run's nonce), PCR 15 = lock for this cluster",
        &hex::encode(verified.quote.ak_fingerprint)[..16]
    ));
    Ok(())
}

/// Waits for `what` on the node's console; a stop signal, the VM's exit or PID 1's `FATAL`
/// end the wait with an error that names the node and its console log.
pub(super) fn wait_for(
    node: &Node,
    what: impl hawser_harness::LineMatcher + Copy,
    stop: &AtomicBool,
    label: &str,
) -> anyhow::Result<String> {
    let name = &node.spec.name;
    let fatal_or = move |line: &str| what.is_match(line) || line.contains("FATAL: ");
    let line = wait_or_stop(&node.vm, fatal_or, BOOT_TIMEOUT, stop)
        .with_context(|| {
            format!(
                "{name}: {label} (console log {})",
                node.vm.console_log_path().display()
            )
        })?
        .ok_or_else(|| Interrupted {
            node: name.clone(),
            what: label.to_owned(),
        })?;
    if !what.is_match(&line) {
        bail!(
            "{name} stopped: {}; console log {}",
            line.split_once("hawser: ")
                .map_or(line.as_str(), |(_, t)| t),
            node.vm.console_log_path().display()
        );
    }
    Ok(line)
}

/// Workers first, then the control planes, node-1 last: each by its ACPI power button and
/// PID 1's orderly shutdown (services stopped, file systems unmounted, disk closed).
pub(super) fn power_off_in_order(nodes: &[Arc<Node>], events: &Events) {
    let mut order: Vec<&Arc<Node>> = nodes.iter().collect();
    order.sort_by_key(|n| (n.spec.role == Role::ControlPlane, n.spec.name.clone()));
    order.reverse();
    order.sort_by_key(|n| n.spec.role == Role::ControlPlane);
    for node in order {
        if node.vm.exit_status().is_none() {
            power_off(node, events);
        }
    }
}

/// Presses the node's ACPI power button and waits for PID 1's orderly shutdown (killed after
/// 90 s); a node powered off this way is not an error of the running cluster.
pub(super) fn power_off(node: &Node, events: &Events) {
    node.held.store(true, Ordering::Relaxed);
    let t = Instant::now();
    let outcome = node
        .vm
        .powerdown()
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(node.vm.wait_for_exit(Duration::from_secs(90))?));
    match outcome {
        Ok(status) => events.say(format!(
            "{} powered off in {:.1}s ({status})",
            node.spec.name,
            t.elapsed().as_secs_f64()
        )),
        Err(e) => events.say(format!(
            "{} did not power off cleanly ({e:#}); it is killed",
            node.spec.name
        )),
    }
}

/// Echoes a node's console lines to stderr, prefixed with its name, dimmed on a terminal;
/// its services' routine output stays in the console log
/// ([`crate::local_cluster::echo_text`]).
pub(super) struct NodeEcho {
    prefix: String,
    pending: Vec<u8>,
}

impl NodeEcho {
    pub(super) fn new(name: &str) -> Self {
        NodeEcho {
            prefix: format!("{name:<6} │ "),
            pending: Vec::new(),
        }
    }
}

impl std::io::Write for NodeEcho {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::io::IsTerminal as _;
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line);
            let Some(text) = crate::local_cluster::echo_text(text.trim_end()) else {
                continue;
            };
            if text.is_empty() {
                continue;
            }
            let mut err = std::io::stderr().lock();
            if err.is_terminal() {
                writeln!(err, "\x1b[2m{}{text}\x1b[0m", self.prefix)?;
            } else {
                writeln!(err, "{}{text}", self.prefix)?;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
