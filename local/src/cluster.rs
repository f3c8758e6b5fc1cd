//! `hawser local up` with a cluster: N nodes, M of them control planes, formed the way a real
//! cluster is, with attested trust both ways and no development shortcut:
//!
//! 1. **Created once** (or again with `--fresh`), in `~/.cache/hawser/local/cluster`: a provider
//!    CA that certifies each node's TPM attestation key (as a cloud's vTPM comes certified), the
//!    image built to carry that CA, one TPM and one state disk per node, and the admin's init
//!    secret, whose hash node-1's platform gives it (fw_cfg, as instance metadata would).
//! 2. **node-1 waits** for the admin; `local up` is the admin: it runs `hawser init` (the same
//!    library the `hawser init` command runs), which attests node-1 against the measurements
//!    predicted from the UKI before it sends the init secret and a new master secret. node-1
//!    formats its disk, locks PCR 15 to the new cluster, runs `kubeadm init` and starts the
//!    cluster's join service. The other control planes' AKs are approved in that same `init`.
//! 3. **The other nodes join** a join service they find by its mDNS advert on the LAN between
//!    the VMs ([`lan`]): they attest to it and it to them (`join_service_trust=attested`, the
//!    image's default), get the keys of their disks derived from the cluster's master secret,
//!    lock to the same cluster and run `kubeadm join`; further control planes join etcd and run
//!    a join service of their own.
//! 4. **Each node's signed boot report is verified** on the host (quote, this run's nonce, PCR 15
//!    = the lock for the cluster ID `hawser init` computed), and the summary says so per node.
//!
//! `local up` on an existing cluster boots the same disks: node-1 finds its disk initialized
//! and waits for `hawser recover` (no join service is left when the whole cluster was down),
//! which `local up` runs with the admin's master secret; the other nodes rejoin through it.
//!
//! While it runs, `hawser local stop|start|restart <node>` ask it on a control socket
//! ([`control_socket`]) to power one node off or boot it again; a node started while another
//! control plane runs rejoins through that one's join service.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hawser_cli::cluster;
use hawser_harness::{ProviderCa, Vm};
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_keys::StateDiskKeyLength;

use crate::local_cluster::{Layout, NodeSpec, Role};
use crate::options::UpOptions;
use crate::{lan, localhost};

mod control;
mod form;
mod kube;
mod node;
mod status;
mod upgrade;

pub use control::{NodeAction, control_socket};
use control::{TEE, serve};
use form::{form, recover_control_plane, start_node};
use node::{check_reports, power_off, power_off_in_order, wait_for, wait_for_kubeadm};
use status::{keep_status, summary, write_status};
pub use upgrade::UpgradeRequest;

/// The local cluster's directory.
pub fn cluster_dir() -> PathBuf {
    crate::options::local_dir().join("cluster")
}

const PROVIDER_CA: &str = "provider-ca.pem";
const MEASUREMENTS: &str = "measurements.json";
/// The admin's files: master secret, cluster file, admin kubeconfig, init secret.
const ADMIN: &str = "admin";
/// The line PID 1's init server prints once it waits for `hawser init` or `hawser recover`.
const WAITING_FOR_ADMIN: &str = "init server listening on";
/// What the cluster's join service on node-1 prints once it serves.
const JOIN_SERVICE_UP: &str = "[hawser-joind] listening on";
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// The port of the API server (with stand-ins: the kubelet stand-in's listener) on a control
/// plane.
const API_SERVER_PORT: u16 = 6443;

/// The admin's files of the local cluster.
struct Admin {
    dir: PathBuf,
}

impl Admin {
    fn master_secret(&self) -> PathBuf {
        self.dir.join("master-secret.json")
    }
    fn cluster_file(&self) -> PathBuf {
        self.dir.join("cluster.json")
    }
    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.conf")
    }
    /// `admin.conf` pointed at node-1's API server forwarded to the host's loopback.
    fn host_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    fn init_secret(&self) -> PathBuf {
        self.dir.join(hawser_cli::cluster::INIT_SECRET_FILE)
    }
    fn approvals(&self) -> PathBuf {
        self.dir.join("control-plane-approvals")
    }
    /// Whether `hawser init` made the cluster (node-1's disk is then initialized).
    fn initialized(&self) -> bool {
        self.cluster_file().is_file()
    }
}

/// The host ports forwarded to one node's init server, join service, its admin API, API
/// server and attestation port.
#[derive(Debug, Clone, Copy)]
struct Ports {
    init: u16,
    joind: u16,
    admin: u16,
    api: u16,
    attest: u16,
}

impl Ports {
    fn free() -> anyhow::Result<Self> {
        Ok(Ports {
            init: localhost::free_port()?,
            joind: localhost::free_port()?,
            admin: localhost::free_port()?,
            api: localhost::free_port()?,
            attest: localhost::free_port()?,
        })
    }
}

/// A node image the cluster's nodes boot: its release name (as the join services know it),
/// its disk image and the measurements predicted from its UKI.
#[derive(Debug, Clone)]
struct BootImage {
    release: String,
    disk_image: PathBuf,
    measurements: PathBuf,
}

impl BootImage {
    /// The image in `image_dir`, its measurements predicted into `measurements`; named
    /// `release`, or as a join service names an image the store does not know
    /// (`image-<digest>`).
    fn open(image_dir: &Path, measurements: &Path, release: Option<&str>) -> anyhow::Result<Self> {
        let uki = image_dir.join(hawser_image::build::UKI_FILE);
        let disk_image = image_dir.join(pipeline::DISK_FILE);
        for file in [&uki, &disk_image] {
            if !file.is_file() {
                bail!(
                    "{} does not exist: build the node image with `hawser image build --out {}`",
                    file.display(),
                    image_dir.display(),
                );
            }
        }
        localhost::write_expected_measurements(&uki, measurements)?;
        let text = std::fs::read_to_string(measurements)?;
        let digest = hawser_joinservice::store::releases::Release::from_measurements_text(
            "measured", &text, "admin", 0,
        )?
        .digest;
        Ok(Self {
            release: release.map_or_else(
                || hawser_joinservice::store::releases::own_release_name(&digest),
                str::to_owned,
            ),
            disk_image,
            measurements: measurements.to_owned(),
        })
    }
}

/// What happened when, since `local up` started: printed as it happens and as the closing
/// timeline.
struct Events {
    started: Instant,
    events: Mutex<Vec<(Duration, String)>>,
}

impl Events {
    fn say(&self, what: impl Into<String>) {
        let what = what.into();
        let at = self.started.elapsed();
        eprintln!("[{:>6.1}s] {what}", at.as_secs_f64());
        TEE.with_borrow_mut(|tee| {
            if let Some(stream) = tee.as_mut()
                && writeln!(stream, "{what}").is_err()
            {
                *tee = None;
            }
        });
        if let Ok(mut events) = self.events.lock() {
            events.push((at, what));
        }
    }
}

/// One running node and what `local up` verified of it.
struct Node {
    spec: NodeSpec,
    vm: Vm,
    /// The release it booted.
    release: String,
    quote_verified: AtomicBool,
    /// Powered off by `hawser local stop`: its QEMU's exit is no failure.
    held: AtomicBool,
}

/// `hawser local up` of a cluster: its host side created (or reused), its image built (or the
/// one given), the cluster formed and verified, then served until a stop signal (or at once
/// powered off with `--once`).
pub fn up(opts: &UpOptions, stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    let events = Events {
        started: Instant::now(),
        events: Mutex::new(Vec::new()),
    };
    let dir = cluster_dir();
    let admin = Admin {
        dir: dir.join(ADMIN),
    };
    let layout = open_layout(opts, &dir, &admin, &events)?;
    let image_dir = node_image(opts, &dir, &admin, &events)?;
    if opts.build_only {
        events.say(format!(
            "--build-only: the node image for this cluster is in {}; `hawser local upgrade \
             --image {}` rolls a running cluster onto it",
            image_dir.display(),
            image_dir.display()
        ));
        return Ok(());
    }
    let uki = image_dir.join(hawser_image::build::UKI_FILE);
    let image = BootImage::open(&image_dir, &dir.join(MEASUREMENTS), None).with_context(|| {
        format!(
            "the node image (build it with `hawser image build --provider-ca {}`)",
            dir.join(PROVIDER_CA).display()
        )
    })?;
    let key_length = localhost::state_disk_key_length(&uki)?;
    let real_kubernetes = localhost::image_runs_real_kubernetes(&uki)?;

    let ports: Vec<Ports> = layout
        .nodes
        .iter()
        .map(|_| Ports::free())
        .collect::<anyhow::Result<_>>()?;
    let hub = lan::Hub::start(&dir.join("lan"), layout.nodes.len())?;
    let nodes: Mutex<Vec<Arc<Node>>> = Mutex::new(Vec::new());
    let formation = Formation {
        dir: &dir,
        admin: &admin,
        layout: &layout,
        image: std::sync::RwLock::new(image),
        key_length,
        real_kubernetes,
        mesh_prefix: opts.mesh_prefix(),
        ports: &ports,
        lan: &hub.ports,
        events: &events,
    };
    let result = form_and_serve(opts, stop, &formation, &nodes);
    // How each node ended, for `hawser local status` after this process is gone.
    let nodes = nodes.into_inner().unwrap_or_default();
    write_status(&dir, &admin, &layout, &nodes, None);
    match result {
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("{e}; the nodes are off, their disks kept (`hawser local up` rejoins them)");
            Ok(())
        }
        other => other,
    }
}

/// The cluster's layout: the existing cluster's if it is the one asked for (its disks rejoin),
/// else a new cluster created (`--fresh` removes an old one first; a different existing one
/// is refused).
fn open_layout(
    opts: &UpOptions,
    dir: &Path,
    admin: &Admin,
    events: &Events,
) -> anyhow::Result<Layout> {
    let wanted = Layout::new(opts.nodes, opts.control_planes)?;
    if opts.fresh && dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the old cluster in {}", dir.display()))?;
        events.say(format!(
            "--fresh: removed the old cluster in {}",
            dir.display()
        ));
    }
    match Layout::read(dir)? {
        Some(layout) if layout == wanted => {
            events.say(format!(
                "reusing the local cluster in {} ({}): its disks rejoin",
                dir.display(),
                describe(&layout)
            ));
            Ok(layout)
        }
        Some(layout) => bail!(
            "the local cluster in {} has {}; `hawser local up --fresh` starts a new one with \
             --nodes {} --control-planes {} (its disks and secrets are removed)",
            dir.display(),
            describe(&layout),
            opts.nodes,
            opts.control_planes
        ),
        None => {
            create(dir, admin, &wanted, opts, events)?;
            Ok(wanted)
        }
    }
}

/// The directory of the node image: `--image`, or one built now into `--out` for this
/// cluster (its provider CA, the admin's init secret hash, mDNS discovery).
fn node_image(
    opts: &UpOptions,
    dir: &Path,
    admin: &Admin,
    events: &Events,
) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &opts.image {
        return Ok(dir.clone());
    }
    let ws = hawser_cli::image_build::workspace()?;
    let mut build = PipelineOptions::new(&ws, &opts.out);
    // Real Kubernetes (minutes per node under TCG), or the stand-ins with `--kubernetes
    // stand-in`; the image build says which.
    build.kubernetes = opts.kubernetes().into();
    // Nodes given no join endpoint look for the join service on the LAN (mDNS).
    // The admin's init secret hash is measured: only `hawser init` with this
    // cluster's init secret can initialize (or recover) its nodes.
    let init_secret_hash = cluster::init_secret_hash(&admin.init_secret())?;
    let log = opts
        .node_log
        .as_deref()
        .map_or_else(String::new, |level| format!(" hawser.log={level}"));
    build.cmdline = opts.profile().cmdline(&format!(
        "{} hawser.join_discovery=mdns hawser.init_secret_hash={}{log}",
        localhost::node_cmdline(pipeline::DEFAULT_CMDLINE, false),
        hex::encode(init_secret_hash)
    ))?;
    build.provider_ca = Some(dir.join(PROVIDER_CA));
    events.say(format!(
        "building the {} node image into {} (it carries this cluster's provider CA) …",
        if opts.production {
            "production (state disks with HMAC-SHA256 integrity)"
        } else {
            "development (state disks without integrity; --production for the image \
             users ship)"
        },
        opts.out.display()
    ));
    let (node, timeline) = pipeline::build_node_image(&build, &mut |line| eprintln!("{line}"))?;
    eprintln!("{node}");
    hawser_cli::image_build::print_timeline(&timeline);
    events.say("node image built");
    Ok(opts.out.clone())
}

/// Forms the cluster and, unless `--once`, serves `hawser local stop|start|restart` until a
/// stop signal; then powers every node off in order. `status.json` is kept current meanwhile.
fn form_and_serve(
    opts: &UpOptions,
    stop: &Arc<AtomicBool>,
    formation: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
) -> anyhow::Result<()> {
    let running = AtomicBool::new(true);
    let (dir, admin, layout, events) = (
        formation.dir,
        formation.admin,
        formation.layout,
        formation.events,
    );
    std::thread::scope(|scope| {
        scope.spawn(|| keep_status(dir, admin, layout, nodes, &running));
        let result = form(opts, stop, formation, nodes).and_then(|()| {
            let formed = nodes.lock().map(|n| n.clone()).unwrap_or_default();
            let kubernetes = if formation.real_kubernetes {
                Some(kube::wait_ready(formation, &formed, stop)?)
            } else {
                None
            };
            if !summary(&formed, layout, admin, kubernetes.as_deref(), events) {
                bail!("not every node is verified and locked to the cluster (see the table)");
            }
            if opts.once {
                return Ok(());
            }
            serve(opts, stop, formation, nodes)
        });
        let last = nodes.lock().map(|n| n.clone()).unwrap_or_default();
        power_off_in_order(&last, events);
        running.store(false, Ordering::Relaxed);
        result
    })
}

impl Formation<'_> {
    /// The image nodes boot from now.
    fn image(&self) -> BootImage {
        match self.image.read() {
            Ok(image) => image.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// A stop signal (Ctrl-C, `hawser local down`) arrived while the cluster was forming.
#[derive(Debug, thiserror::Error)]
#[error("interrupted while {node} was at: {what}")]
struct Interrupted {
    node: String,
    what: String,
}

fn describe(layout: &Layout) -> String {
    format!(
        "{} node(s), {} control plane(s)",
        layout.nodes.len(),
        layout.control_planes()
    )
}

/// Creates the cluster's host side: provider CA, one certified TPM and one blank state disk per
/// node, the admin's init secret and the control planes the admin will approve. The layout
/// file is written last: a directory without it is an unfinished creation, made again.
fn create(
    dir: &Path,
    admin: &Admin,
    layout: &Layout,
    opts: &UpOptions,
    events: &Events,
) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the unfinished cluster in {}", dir.display()))?;
    }
    std::fs::create_dir_all(&admin.dir)
        .with_context(|| format!("creating {}", admin.dir.display()))?;
    let provider = ProviderCa::generate("hawser local provider")?;
    std::fs::write(dir.join(PROVIDER_CA), provider.certificate_pem())?;
    let mut approvals = Vec::new();
    for (i, node) in layout.nodes.iter().enumerate() {
        let node_dir = dir.join(&node.name);
        let ak = provider
            .provision_state_dir(&node_dir.join("tpm"))
            .with_context(|| format!("provisioning {}'s TPM", node.name))?
            .ak_name;
        // node-1 is initialized by `hawser init`; the other control planes join with approval.
        if i > 0 && node.role == Role::ControlPlane {
            approvals.push(hex::encode(&ak));
        }
        std::fs::File::create(node_dir.join("state.img"))
            .and_then(|f| f.set_len(opts.state_disk_bytes(node.role)))
            .with_context(|| format!("creating {}'s state disk", node.name))?;
    }
    std::fs::write(admin.approvals(), approvals.join("\n"))?;
    cluster::write_new_init_secret(&admin.init_secret())?;
    layout.write(dir)?;
    events.say(format!(
        "created a local cluster in {} ({}): provider CA, TPMs with certified AKs, blank state \
         disks, the admin's init secret",
        dir.display(),
        describe(layout)
    ));
    Ok(())
}

/// What forming the cluster needs.
struct Formation<'a> {
    dir: &'a Path,
    admin: &'a Admin,
    layout: &'a Layout,
    /// The image nodes boot from now (`hawser local upgrade` changes it).
    image: std::sync::RwLock<BootImage>,
    /// The state-disk key length the image's measured integrity mode asks for.
    key_length: StateDiskKeyLength,
    /// The image carries real Kubernetes (not the stand-ins): `local up` waits for every node
    /// `Ready` through kubectl.
    real_kubernetes: bool,
    /// The cluster's WireGuard mesh (`hawser init --vpn-prefix`); `None`: `--no-mesh`.
    mesh_prefix: Option<hawser_mesh::Ipv4Net>,
    ports: &'a [Ports],
    lan: &'a [lan::Port],
    events: &'a Events,
}
