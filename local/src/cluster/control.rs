//! The control socket of a running `local up`: `hawser local stop|start|restart <node>
//! [--new-disk]` power one node off or boot it again while the others go on. Each request is
//! answered on its own thread, and what `local up` says meanwhile goes to the asker too.

use std::io::{BufRead as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::local_cluster::Role;
use anyhow::{Context as _, bail};
use hawser_cli::cluster::ClusterFile;
use hawser_keys::MasterSecret;

use super::{
    Formation, Node, UpOptions, WAITING_FOR_ADMIN, check_reports, cluster_dir, power_off,
    recover_control_plane, start_node, wait_for, wait_for_kubeadm, write_status,
};

thread_local! {
    /// The `hawser local stop|start|restart` this thread answers: it sees what is said meanwhile.
    pub(super) static TEE: std::cell::RefCell<Option<UnixStream>> = const { std::cell::RefCell::new(None) };
}

/// The control socket of a running `local up`, for `hawser local stop|start|restart <node>`.
pub fn control_socket() -> PathBuf {
    cluster_dir().join("control.sock")
}

/// What `hawser local stop|start|restart` asks of a running `local up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAction {
    /// ACPI power-off, waiting for PID 1's orderly shutdown.
    Stop,
    /// Boot it again and verify it as on `local up`: its rejoin, quote and cluster lock.
    Start,
    /// Stop, then start.
    Restart,
}

impl NodeAction {
    pub fn name(self) -> &'static str {
        match self {
            NodeAction::Stop => "stop",
            NodeAction::Start => "start",
            NodeAction::Restart => "restart",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        [NodeAction::Stop, NodeAction::Start, NodeAction::Restart]
            .into_iter()
            .find(|a| a.name() == word)
    }
}

/// The formed cluster runs until a stop signal: a node's QEMU that exits without being asked
/// to is an error; each request on the control socket is answered on its own thread (a node
/// that waits for another to come back must not hold up the request that brings it back), one
/// at a time per node.
pub(super) fn serve(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
) -> anyhow::Result<()> {
    let socket = control_socket();
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("opening the control socket {}", socket.display()))?;
    listener.set_nonblocking(true)?;
    eprintln!(
        "\nthe cluster is up; `hawser local status` shows it, `hawser local stop|start|restart \
         <node>` powers one node off or on, Ctrl-C or `hawser local down` powers it all off"
    );
    let busy: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let result = std::thread::scope(|scope| {
        let result = (|| {
            while !stop.load(Ordering::Relaxed) {
                let running = nodes.lock().map(|n| n.clone()).unwrap_or_default();
                for node in running.iter().filter(|n| !n.held.load(Ordering::Relaxed)) {
                    if let Some(status) = node.vm.exit_status() {
                        bail!(
                            "{}'s QEMU exited on its own ({status}); console log: {}",
                            node.spec.name,
                            node.vm.console_log_path().display()
                        );
                    }
                }
                match listener.accept() {
                    Ok((stream, _)) => {
                        let busy = &busy;
                        scope.spawn(move || answer(opts, stop, f, nodes, busy, stream));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(e).context("the control socket"),
                }
            }
            Ok(())
        })();
        // The requests still being answered end too (they wait on `stop`).
        stop.store(true, Ordering::Relaxed);
        result
    });
    let _ = std::fs::remove_file(&socket);
    result
}

/// Answers one request on the control socket: `<action> <node> [--new-disk]`; what is said
/// meanwhile goes to the asker too, and the last line is `ok` or `error: <reason>`.
fn answer(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    busy: &Mutex<Vec<String>>,
    stream: UnixStream,
) {
    let _ = stream.set_nonblocking(false);
    let mut line = String::new();
    let read = std::io::BufReader::new(&stream).read_line(&mut line);
    let Ok(mut reply) = stream.try_clone() else {
        return;
    };
    TEE.set(stream.try_clone().ok());
    let outcome = read.context("reading the request").and_then(|_| {
        if let Some(request) = parse_upgrade(&line)? {
            return super::upgrade::upgrade(opts, stop, f, nodes, &request);
        }
        if let Some(rest) = line.trim().strip_prefix("revoke ") {
            let (node, reason) = rest.split_once(' ').unwrap_or((rest, ""));
            return super::upgrade::revoke(f, nodes, node, reason, stop);
        }
        let mut words = line.split_whitespace();
        let (Some(action), Some(name), flag, None) = (
            words.next().and_then(NodeAction::parse),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            bail!(
                "not a request: {:?} (expected `stop|start|restart <node> [--new-disk]`)",
                line.trim()
            );
        };
        let new_disk = match flag {
            None => false,
            Some("--new-disk") if action != NodeAction::Stop => true,
            Some(other) => bail!("`{}` takes no {other}", action.name()),
        };
        {
            let mut busy = busy
                .lock()
                .map_err(|_| anyhow::anyhow!("the control state is poisoned"))?;
            if busy.iter().any(|b| b == name) {
                bail!("{name} is being stopped or started by another request; try again after it");
            }
            busy.push(name.to_owned());
        }
        let outcome = act(opts, stop, f, nodes, action, name, new_disk);
        // `hawser local status` right after the answer shows what it did.
        let now = nodes.lock().map(|n| n.clone()).unwrap_or_default();
        write_status(f.dir, f.admin, f.layout, &now, None);
        if let Ok(mut busy) = busy.lock() {
            busy.retain(|b| b != name);
        }
        outcome
    });
    TEE.set(None);
    let _ = match outcome {
        Ok(()) => writeln!(reply, "ok"),
        Err(e) => {
            f.events.say(format!("{} failed: {e:#}", line.trim()));
            writeln!(reply, "error: {e:#}")
        }
    };
}

/// `upgrade <image dir> <name or -> [--check-retired]`, if the line is one.
fn parse_upgrade(line: &str) -> anyhow::Result<Option<super::UpgradeRequest>> {
    let mut words = line.split_whitespace();
    if words.next() != Some("upgrade") {
        return Ok(None);
    }
    let (Some(dir), Some(name)) = (words.next(), words.next()) else {
        bail!(
            "not a request: {:?} (expected `upgrade <image dir> <name|-> [--check-retired]`)",
            line.trim()
        );
    };
    let check_retired = match words.next() {
        None => false,
        Some("--check-retired") => true,
        Some(other) => bail!("`upgrade` takes no {other}"),
    };
    Ok(Some(super::UpgradeRequest {
        image_dir: PathBuf::from(dir),
        name: (name != "-").then(|| name.to_owned()),
        check_retired,
    }))
}

fn act(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    action: NodeAction,
    name: &str,
    new_disk: bool,
) -> anyhow::Result<()> {
    let Some(i) = f.layout.nodes.iter().position(|n| n.name == name) else {
        bail!(
            "no node {name} in this cluster (its nodes: {})",
            f.layout
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let current = nodes
        .lock()
        .ok()
        .and_then(|n| n.iter().find(|n| n.spec.name == name).cloned());
    let is_on = current
        .as_ref()
        .is_some_and(|n| n.vm.exit_status().is_none());
    if matches!(action, NodeAction::Stop | NodeAction::Restart) {
        match current.as_ref().filter(|_| is_on) {
            Some(node) => {
                power_off(node, f.events);
                // `hawser local status` right after `stop` shows it off.
                let now = nodes.lock().map(|n| n.clone()).unwrap_or_default();
                write_status(f.dir, f.admin, f.layout, &now, None);
            }
            None if action == NodeAction::Stop => bail!("{name} is off already"),
            None => {}
        }
    }
    if action == NodeAction::Stop {
        return Ok(());
    }
    if action == NodeAction::Start && is_on {
        bail!("{name} is running already");
    }
    if new_disk {
        // A new node on the same machine: same TPM, a blank disk (a new LUKS2 UUID), so it
        // joins anew — its admission needs the cluster store to take a new binding.
        let disk = f.dir.join(name).join("state.img");
        std::fs::File::create(&disk)
            .and_then(|file| file.set_len(opts.state_disk_bytes(f.layout.nodes[i].role)))
            .with_context(|| format!("giving {name} a blank state disk {}", disk.display()))?;
        f.events.say(format!(
            "{name} has a blank state disk: it joins as a new node"
        ));
    }
    let master = MasterSecret::read_file(&f.admin.master_secret())?;
    let cluster_id: [u8; 32] = hex::decode(ClusterFile::read(&f.admin.cluster_file())?.cluster_id)
        .ok()
        .and_then(|id| id.try_into().ok())
        .context("the cluster file's cluster ID is not 32 bytes of hex")?;
    // Whether a join service is left to rejoin through: another control plane that runs.
    let other_control_plane = nodes.lock().ok().and_then(|n| {
        n.iter()
            .find(|n| {
                n.spec.name != name
                    && n.spec.role == Role::ControlPlane
                    && n.vm.exit_status().is_none()
            })
            .map(|n| n.spec.name.clone())
    });
    let (node, nonce) = start_node(opts, f, i, nodes)?;
    match (node.spec.role, other_control_plane) {
        (Role::ControlPlane, None) if !new_disk => {
            f.events.say(format!(
                "no other control plane runs: `hawser recover` of {name}"
            ));
            wait_for(&node, WAITING_FOR_ADMIN, stop, "waiting for the admin")?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            recover_control_plane(f, i, &node, &runtime)?;
        }
        (_, Some(other)) => f.events.say(format!(
            "{name} {} through a running control plane's join service ({other}'s, found by \
             mDNS)",
            if new_disk { "joins" } else { "rejoins" }
        )),
        (_, None) => f.events.say(format!(
            "{name} asks for a join service; none runs until a control plane is started"
        )),
    }
    check_reports(
        &node,
        &nonce,
        &master,
        f.key_length,
        &cluster_id,
        stop,
        f.events,
    )?;
    wait_for_kubeadm(&node, stop)?;
    f.events
        .say(format!("{name}: back in the cluster, kubeadm done"));
    Ok(())
}
