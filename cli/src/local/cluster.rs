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
use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport, JOIN_REPORT_MARKER, JoinReport};
use hawser_cli::cluster::{self, ClusterFile, InitOptions, RecoverOptions};
use hawser_cli::local_cluster::{Layout, NodeSpec, NodeStatus, Role, Stage, StatusFile, observe};
use hawser_cli::{lan, localhost};
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_keys::{MasterSecret, StateDiskKeyLength};
use hawser_qemu::{ProviderCa, TpmConfig, Vm, VmConfig};

use super::{UpOptions, wait_or_stop};

mod control;
pub use control::{NodeAction, control_socket};
use control::{TEE, serve};

/// The local cluster's directory.
pub fn cluster_dir() -> PathBuf {
    super::local_dir().join("cluster")
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
/// Size of a local node's (sparse) state disk.
const STATE_DISK_BYTES: u64 = 256 << 20;

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

/// The host ports forwarded to one node's init server and join service.
#[derive(Debug, Clone, Copy)]
struct Ports {
    init: u16,
    joind: u16,
}

impl Ports {
    fn free() -> anyhow::Result<Self> {
        Ok(Ports {
            init: localhost::free_port()?,
            joind: localhost::free_port()?,
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
    quote_verified: AtomicBool,
    /// Powered off by `hawser local stop`: its QEMU's exit is no failure.
    held: AtomicBool,
}

pub fn up(opts: &UpOptions, stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    let events = Events {
        started: Instant::now(),
        events: Mutex::new(Vec::new()),
    };
    let dir = cluster_dir();
    let admin = Admin {
        dir: dir.join(ADMIN),
    };
    let wanted = Layout::new(opts.nodes, opts.control_planes)?;
    if opts.fresh && dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the old cluster in {}", dir.display()))?;
        events.say(format!(
            "--fresh: removed the old cluster in {}",
            dir.display()
        ));
    }
    let layout = match Layout::read(&dir)? {
        Some(layout) if layout == wanted => {
            events.say(format!(
                "reusing the local cluster in {} ({}): its disks rejoin",
                dir.display(),
                describe(&layout)
            ));
            layout
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
            create(&dir, &admin, &wanted, &events)?;
            wanted
        }
    };

    let image_dir = match &opts.image {
        Some(dir) => dir.clone(),
        None => {
            let ws = crate::image::workspace()?;
            let mut build = PipelineOptions::new(&ws, &opts.out);
            // Nodes given no join endpoint look for the join service on the LAN (mDNS).
            // The admin's init secret hash is measured: only `hawser init` with this
            // cluster's init secret can initialize (or recover) its nodes.
            let init_secret_hash = cluster::init_secret_hash(&admin.init_secret())?;
            build.cmdline = opts.profile().cmdline(&format!(
                "{} hawser.join_discovery=mdns hawser.init_secret_hash={}",
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
            let (node, timeline) =
                pipeline::build_node_image(&build, &mut |line| eprintln!("{line}"))?;
            eprintln!("{node}");
            crate::image::print_timeline(&timeline);
            events.say("node image built");
            opts.out.clone()
        }
    };
    let uki = image_dir.join(hawser_image::build::UKI_FILE);
    let disk_image = image_dir.join(pipeline::DISK_FILE);
    for file in [&uki, &disk_image] {
        if !file.is_file() {
            bail!(
                "{} does not exist: build the node image with `hawser image build --out {} \
                 --provider-ca {}`",
                file.display(),
                image_dir.display(),
                dir.join(PROVIDER_CA).display()
            );
        }
    }
    let measurements = dir.join(MEASUREMENTS);
    localhost::write_expected_measurements(&uki, &measurements)?;
    let key_length = localhost::state_disk_key_length(&uki)?;

    let ports: Vec<Ports> = layout
        .nodes
        .iter()
        .map(|_| Ports::free())
        .collect::<anyhow::Result<_>>()?;
    let hub = lan::Hub::start(&dir.join("lan"), layout.nodes.len())?;
    let nodes: Mutex<Vec<Arc<Node>>> = Mutex::new(Vec::new());
    let running = AtomicBool::new(true);
    let formation = Formation {
        dir: &dir,
        admin: &admin,
        layout: &layout,
        disk_image: &disk_image,
        measurements: &measurements,
        key_length,
        ports: &ports,
        lan: &hub.ports,
        events: &events,
    };
    let result = std::thread::scope(|scope| {
        scope.spawn(|| keep_status(&dir, &admin, &layout, &nodes, &running));
        let result = form(opts, stop, &formation, &nodes).and_then(|()| {
            let formed = nodes.lock().map(|n| n.clone()).unwrap_or_default();
            if !summary(&formed, &admin, &events) {
                bail!("not every node is verified and locked to the cluster (see the table)");
            }
            if opts.once {
                return Ok(());
            }
            serve(opts, stop, &formation, &nodes)
        });
        let last = nodes.lock().map(|n| n.clone()).unwrap_or_default();
        power_off_in_order(&last, &events);
        running.store(false, Ordering::Relaxed);
        result
    });
    // How each node ended, for `hawser local status` after this process is gone.
    let nodes = nodes.into_inner().unwrap_or_default();
    write_status(&dir, &admin, &layout, &nodes);
    match result {
        Err(e) if e.is::<Interrupted>() => {
            eprintln!("{e}; the nodes are off, their disks kept (`hawser local up` rejoins them)");
            Ok(())
        }
        other => other,
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
fn create(dir: &Path, admin: &Admin, layout: &Layout, events: &Events) -> anyhow::Result<()> {
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
            .and_then(|f| f.set_len(STATE_DISK_BYTES))
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
    disk_image: &'a Path,
    measurements: &'a Path,
    /// The state-disk key length the image's measured integrity mode asks for.
    key_length: StateDiskKeyLength,
    ports: &'a [Ports],
    lan: &'a [lan::Port],
    events: &'a Events,
}

/// `hawser recover` of control plane `i`, as the admin: its disk is initialized and no join
/// service can answer it (the whole cluster was down: a join service needs its etcd, and etcd
/// a majority of the control planes' members).
fn recover_control_plane(
    f: &Formation<'_>,
    i: usize,
    node: &Node,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<cluster::Established> {
    let recover = RecoverOptions {
        node: format!("127.0.0.1:{}", f.ports[i].init),
        measurements: f.measurements.to_owned(),
        provider_ca: f.dir.join(PROVIDER_CA),
        master_secret: f.admin.master_secret(),
        cluster_file: f.admin.cluster_file(),
        init_secret: f.admin.init_secret(),
    };
    runtime.block_on(cluster::recover(
        &recover,
        &mut |l| eprintln!("  hawser recover: {l}"),
        &mut |l| eprintln!("  {} │ {l}", node.spec.name),
    ))
}

/// Boots node `i` with a new nonce for its boot report; it takes the place of an earlier VM of
/// the same node in `nodes`.
fn start_node(
    opts: &UpOptions,
    f: &Formation<'_>,
    i: usize,
    nodes: &Mutex<Vec<Arc<Node>>>,
) -> anyhow::Result<(Arc<Node>, Vec<u8>)> {
    let spec = f.layout.nodes[i].clone();
    let nonce = hawser_keys::random_bytes(32)?;
    let vm = boot(opts, f, i, &nonce)?;
    f.events.say(format!(
        "{} ({}) booting: OVMF, UKI, swtpm; console log {}",
        spec.name,
        spec.role,
        vm.console_log_path().display()
    ));
    let node = Arc::new(Node {
        spec,
        vm,
        quote_verified: AtomicBool::new(false),
        held: AtomicBool::new(false),
    });
    if let Ok(mut nodes) = nodes.lock() {
        nodes.retain(|n| n.spec.name != node.spec.name);
        nodes.push(Arc::clone(&node));
    }
    Ok((node, nonce))
}

/// Boots node-1, initializes (or recovers) it as the admin, then boots the other nodes, which
/// join through its join service; verifies each node's boot report.
fn form(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
) -> anyhow::Result<()> {
    let start = |i: usize| start_node(opts, f, i, nodes);
    let (first, first_nonce) = start(0)?;
    // After a whole-cluster restart no join service answers until a majority of the control
    // planes' etcd members run: every control plane is recovered by the admin.
    let mut started = Vec::new();
    if f.admin.initialized() {
        for i in 1..f.layout.nodes.len() {
            if f.layout.nodes[i].role == Role::ControlPlane {
                started.push((i, start(i)?));
            }
        }
    }
    wait_for(&first, WAITING_FOR_ADMIN, stop, "waiting for the admin")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let node_address = format!("127.0.0.1:{}", f.ports[0].init);
    let established = if f.admin.initialized() {
        f.events.say(format!(
            "{}'s disk belongs to the cluster already: `hawser recover` (the whole cluster was \
             down, so no join service is left to ask)",
            first.spec.name
        ));
        recover_control_plane(f, 0, &first, &runtime)
    } else {
        f.events.say(format!(
            "`hawser init` of {}: attest it, then send the init secret and a new master secret",
            first.spec.name
        ));
        let approvals = std::fs::read_to_string(f.admin.approvals())?
            .lines()
            .filter(|l| !l.is_empty())
            .map(hex::decode)
            .collect::<Result<Vec<_>, _>>()
            .context("the control-plane approvals file")?;
        let init = InitOptions {
            node: node_address,
            measurements: f.measurements.to_owned(),
            provider_ca: f.dir.join(PROVIDER_CA),
            master_secret: f.admin.master_secret(),
            cluster_file: f.admin.cluster_file(),
            kubeconfig: f.admin.kubeconfig(),
            cluster_name: "hawser-local".into(),
            kubernetes_version: localhost::KUBERNETES_VERSION.parse()?,
            service_cidr: "10.96.0.0/12".into(),
            api_server_cert_sans: vec![lan::host(0)],
            // Where the other nodes reach the API server, and a joining control plane the
            // stand-in's etcd: node-1's LAN address, kubeadm's choice when no load balancer is
            // in front of the control planes. (Its kubelet stand-in listens on port 6443.)
            control_plane_endpoint: Some(format!("{}:{API_SERVER_PORT}", lan::host(0)).parse()?),
            init_secret: f.admin.init_secret(),
            control_plane_approvals: approvals,
        };
        runtime.block_on(cluster::init(
            &init,
            &mut |l| eprintln!("  hawser init: {l}"),
            &mut |l| eprintln!("  {} │ {l}", first.spec.name),
        ))
    }
    .with_context(|| {
        format!(
            "{} was not initialized; its console log: {}",
            first.spec.name,
            first.vm.console_log_path().display()
        )
    })?;
    let cluster_id = hex::encode(established.cluster_id);
    f.events.say(format!(
        "{} {} cluster {cluster_id}",
        first.spec.name,
        if established.kubeconfig_written {
            "initialized"
        } else {
            "locked to"
        }
    ));
    let master = MasterSecret::read_file(&f.admin.master_secret())?;
    check_reports(
        &first,
        &first_nonce,
        &master,
        f.key_length,
        &established.cluster_id,
        stop,
        f.events,
    )?;
    for (i, (node, _)) in &started {
        wait_for(node, WAITING_FOR_ADMIN, stop, "waiting for the admin")?;
        f.events.say(format!(
            "`hawser recover` of {} too (its etcd member counts for the majority)",
            node.spec.name
        ));
        if let Err(e) = recover_control_plane(f, *i, node, &runtime) {
            // It may have rejoined through a join service meanwhile.
            if !node
                .vm
                .console_lines()
                .iter()
                .any(|l| l.contains(JOIN_REPORT_MARKER))
            {
                return Err(e.context(format!("{} was not recovered", node.spec.name)));
            }
        }
    }
    if f.layout.nodes.len() > 1 {
        wait_for(
            &first,
            JOIN_SERVICE_UP,
            stop,
            "the cluster's join service up",
        )?;
    }
    let mut others: Vec<(Arc<Node>, Vec<u8>)> =
        started.into_iter().map(|(_, started)| started).collect();
    for i in 1..f.layout.nodes.len() {
        if !others
            .iter()
            .any(|(n, _)| n.spec.name == f.layout.nodes[i].name)
        {
            others.push(start(i)?);
        }
    }
    for (node, nonce) in &others {
        check_reports(
            node,
            nonce,
            &master,
            f.key_length,
            &established.cluster_id,
            stop,
            f.events,
        )?;
    }
    for node in std::iter::once(&first).chain(others.iter().map(|(n, _)| n)) {
        wait_for_kubeadm(node, stop)?;
        f.events.say(format!("{}: kubeadm done", node.spec.name));
    }
    Ok(())
}

/// Waits until the node's console shows kubeadm succeeded (on this boot or, on a rejoin, on an
/// earlier one); a fatal error is an error naming PID 1's last word. Reads the whole console,
/// so a line an earlier wait passed over counts.
fn wait_for_kubeadm(node: &Node, stop: &AtomicBool) -> anyhow::Result<()> {
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
fn boot(opts: &UpOptions, f: &Formation<'_>, i: usize, nonce: &[u8]) -> anyhow::Result<Vm> {
    let spec = &f.layout.nodes[i];
    let node_dir = f.dir.join(&spec.name);
    let mut config = VmConfig::uefi_disk(f.disk_image)
        .name(&spec.name)
        .memory_mib(opts.memory)
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
    let mut published = vec![(own.joind, localhost::NODE_JOIND_PORT)];
    if spec.role == Role::Worker {
        published.clear();
    }
    // Every control plane waits for the admin too (`hawser recover` after a whole-cluster
    // restart); node-1 also for `hawser init`.
    if spec.role == Role::ControlPlane {
        published.push((own.init, localhost::NODE_INIT_PORT));
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

/// The port of the API server (the kubelet stand-in's listener) on a control plane.
const API_SERVER_PORT: u16 = 6443;

/// Waits for the node's join report and signed boot report; verifies the quote (this run's
/// nonce), that PCR 15 is the lock for `cluster_id`, and that the node's disk key derives from
/// the admin's master secret at the length of the image's integrity mode.
fn check_reports(
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
fn wait_for(
    node: &Node,
    what: impl hawser_qemu::LineMatcher + Copy,
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

/// Keeps `status.json` current while `local up` runs.
fn keep_status(
    dir: &Path,
    admin: &Admin,
    layout: &Layout,
    nodes: &Mutex<Vec<Arc<Node>>>,
    running: &AtomicBool,
) {
    while running.load(Ordering::Relaxed) {
        let nodes = nodes.lock().map(|n| n.clone()).unwrap_or_default();
        write_status(dir, admin, layout, &nodes);
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn write_status(dir: &Path, admin: &Admin, layout: &Layout, nodes: &[Arc<Node>]) {
    let status = StatusFile {
        pid: std::process::id(),
        cluster_id: ClusterFile::read(&admin.cluster_file())
            .ok()
            .map(|c| c.cluster_id),
        nodes: layout
            .nodes
            .iter()
            .map(|spec| {
                let node = nodes.iter().find(|n| n.spec.name == spec.name);
                let mut seen = node
                    .map(|n| observe(&n.vm.console_lines()))
                    .unwrap_or_default();
                if node.is_some_and(|n| n.vm.exit_status().is_some()) {
                    seen.stage = Some(Stage::Off);
                }
                NodeStatus {
                    name: spec.name.clone(),
                    role: spec.role,
                    seen,
                    quote_verified: node.is_some_and(|n| n.quote_verified.load(Ordering::Relaxed)),
                    // The live log while it exists (QEMU runs, or a node powered off by
                    // `hawser local stop`); the copy kept in the node's directory after.
                    console_log: node
                        .filter(|n| n.vm.console_log_path().exists())
                        .map_or_else(
                            || {
                                dir.join(&spec.name)
                                    .join("logs")
                                    .join(format!("{}.console.log", spec.name))
                            },
                            |n| n.vm.console_log_path().to_owned(),
                        ),
                }
            })
            .collect(),
    };
    if let Err(e) = status.write(dir) {
        tracing::warn!("{e:#}");
    }
}

/// Workers first, then the control planes, node-1 last: each by its ACPI power button and
/// PID 1's orderly shutdown (services stopped, file systems unmounted, disk closed).
fn power_off_in_order(nodes: &[Arc<Node>], events: &Events) {
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
fn power_off(node: &Node, events: &Events) {
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

/// The closing summary: one line per node, the cluster, and the timeline.
fn summary(nodes: &[Arc<Node>], admin: &Admin, events: &Events) -> bool {
    let mut out = std::io::stdout().lock();
    let cluster_id = ClusterFile::read(&admin.cluster_file())
        .ok()
        .map(|c| c.cluster_id);
    let _ = writeln!(
        out,
        "\n── local cluster ───────────────────────────────────────────"
    );
    let status = StatusFile {
        pid: std::process::id(),
        cluster_id: cluster_id.clone(),
        nodes: nodes
            .iter()
            .map(|n| NodeStatus {
                name: n.spec.name.clone(),
                role: n.spec.role,
                seen: observe(&n.vm.console_lines()),
                quote_verified: n.quote_verified.load(Ordering::Relaxed),
                console_log: n.vm.console_log_path().to_owned(),
            })
            .collect(),
    };
    let _ = write!(out, "{}", status.table());
    let all = status.nodes.iter().all(|n| {
        n.quote_verified
            && n.seen.cluster_id == cluster_id
            && n.seen.cluster_id.is_some()
            && n.seen.stage == Some(Stage::KubeadmDone)
    });
    let _ = writeln!(
        out,
        "{} node(s) attested (both ways on joins), quotes verified here, locked to cluster {}, \
         past kubeadm: {}",
        status.nodes.len(),
        cluster_id.as_deref().unwrap_or("-"),
        if all { "yes" } else { "NO" }
    );
    let _ = writeln!(
        out,
        "admin files (master secret, cluster file, kubeconfig): {}",
        admin.dir.display()
    );
    let _ = writeln!(out, "timeline:");
    if let Ok(events) = events.events.lock() {
        for (at, what) in events.iter() {
            let _ = writeln!(out, "  {:>7.1}s  {what}", at.as_secs_f64());
        }
    }
    all
}

/// Echoes a node's console lines to stderr, prefixed with its name, dimmed on a terminal;
/// its services' routine output stays in the console log
/// ([`hawser_cli::local_cluster::echo_text`]).
struct NodeEcho {
    prefix: String,
    pending: Vec<u8>,
}

impl NodeEcho {
    fn new(name: &str) -> Self {
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
            let Some(text) = hawser_cli::local_cluster::echo_text(text.trim_end()) else {
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
