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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Subcommand;

use crate::cluster;
use crate::options::{UpOptions, local_dir};

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
    /// Roll the running cluster onto a new node image: add its release, reboot the control
    /// planes then the workers into it one at a time (each with its own disk), verify every
    /// node on it, retire the old release (docs/lifecycle.md).
    Upgrade {
        /// The new image's directory (`hawser image build --out DIR`, built with this
        /// cluster's provider CA).
        #[arg(long)]
        image: PathBuf,
        /// The new release's name (default: `image-` and its measurements' digest).
        #[arg(long)]
        name: Option<String>,
        /// Then boot a worker from the retired image once and require its refusal by name.
        #[arg(long)]
        check_retired: bool,
    },
    /// Revoke a node as the admin (`hawser node revoke`): its AK and disk on the deny-list,
    /// out of the mesh; waits until the other nodes' tunnels have dropped it.
    Revoke {
        /// The node, e.g. node-3.
        node: String,
        /// Why (kept in the cluster store and the audit log).
        #[arg(long, default_value = "revoked by the admin of the local cluster")]
        reason: String,
    },
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
        LocalCommand::Upgrade {
            image,
            name,
            check_retired,
        } => upgrade(&image, name.as_deref(), check_retired),
        LocalCommand::Revoke { node, reason } => ask(
            &format!("revoke {node} {}", reason.replace('\n', " ")),
            "revoke",
        ),
    }
}

/// `hawser local upgrade`: asks the running `local up` on its control socket.
fn upgrade(image: &Path, name: Option<&str>, check_retired: bool) -> anyhow::Result<()> {
    let image = image
        .canonicalize()
        .with_context(|| format!("the image directory {}", image.display()))?;
    let dir = image.to_str().filter(|d| !d.contains(char::is_whitespace));
    let Some(dir) = dir else {
        bail!(
            "the image directory {} must be a path without spaces",
            image.display()
        );
    };
    if let Some(name) = name {
        hawser_joinservice::store::releases::check_name(name)?;
    }
    let flag = if check_retired {
        " --check-retired"
    } else {
        ""
    };
    ask(
        &format!("upgrade {dir} {}{flag}", name.unwrap_or("-")),
        "upgrade",
    )
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
    let flag = if new_disk { " --new-disk" } else { "" };
    ask(&format!("{} {node}{flag}", action.name()), action.name())
}

/// Sends `request` to the running `local up`, prints what it says meanwhile, and fails with
/// its reason.
fn ask(request: &str, what: &str) -> anyhow::Result<()> {
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
                        what
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
    writeln!(stream, "{request}").context("asking `hawser local up`")?;
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
        crate::single::up_single(opts, &stop)
    } else {
        cluster::up(&opts, &stop)
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
