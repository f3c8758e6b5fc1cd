//! Forming the local cluster: node-1 booted and made the cluster's by the admin (`hawser init`,
//! or `hawser recover` after a whole-cluster restart), then the other nodes booted to join
//! through its join service, each one's reports verified and its kubeadm awaited.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use hawser_attestation::report::JOIN_REPORT_MARKER;
use hawser_cli::cluster::{self, InitOptions, RecoverOptions};
use hawser_keys::MasterSecret;

use super::node::{boot, check_reports, wait_for, wait_for_kubeadm};
use super::{
    API_SERVER_PORT, BootImage, Formation, JOIN_SERVICE_UP, Node, PROVIDER_CA, UpOptions,
    WAITING_FOR_ADMIN,
};
use crate::lan;
use crate::local_cluster::Role;

/// A node booted, with the nonce its boot report must carry.
type Booted = (Arc<Node>, Vec<u8>);

/// `hawser recover` of control plane `i`, as the admin: its disk is initialized and no join
/// service can answer it (the whole cluster was down: a join service needs its etcd, and etcd
/// a majority of the control planes' members).
pub(super) fn recover_control_plane(
    f: &Formation<'_>,
    i: usize,
    node: &Node,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<cluster::Established> {
    let recover = RecoverOptions {
        node: format!("127.0.0.1:{}", f.ports[i].init),
        measurements: f.image().measurements,
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
pub(super) fn start_node(
    opts: &UpOptions,
    f: &Formation<'_>,
    i: usize,
    nodes: &Mutex<Vec<Arc<Node>>>,
) -> anyhow::Result<Booted> {
    start_node_from(opts, f, i, nodes, &f.image())
}

/// [`start_node`] from `image` rather than the cluster's current one.
pub(super) fn start_node_from(
    opts: &UpOptions,
    f: &Formation<'_>,
    i: usize,
    nodes: &Mutex<Vec<Arc<Node>>>,
    image: &BootImage,
) -> anyhow::Result<Booted> {
    let spec = f.layout.nodes[i].clone();
    let nonce = hawser_keys::random_bytes(32)?;
    let vm = boot(opts, f, i, &nonce, image)?;
    f.events.say(format!(
        "{} ({}) booting: OVMF, UKI, swtpm; console log {}",
        spec.name,
        spec.role,
        vm.console_log_path().display()
    ));
    let node = Arc::new(Node {
        spec,
        vm,
        release: image.release.clone(),
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
pub(super) fn form(
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
    let established = establish(f, &first, &runtime)?;
    let master = MasterSecret::read_file(&f.admin.master_secret())?;
    let verify = |node: &Node, nonce: &[u8]| {
        check_reports(
            node,
            nonce,
            &master,
            f.key_length,
            &established.cluster_id,
            stop,
            f.events,
        )
    };
    verify(&first, &first_nonce)?;
    recover_restarted_control_planes(f, &started, &runtime, stop)?;
    if f.layout.nodes.len() > 1 {
        wait_for(
            &first,
            JOIN_SERVICE_UP,
            stop,
            "the cluster's join service up",
        )?;
    }
    let mut others: Vec<Booted> = started.into_iter().map(|(_, started)| started).collect();
    for i in 1..f.layout.nodes.len() {
        if !others
            .iter()
            .any(|(n, _)| n.spec.name == f.layout.nodes[i].name)
        {
            others.push(start(i)?);
        }
    }
    for (node, nonce) in &others {
        verify(node, nonce)?;
    }
    for node in std::iter::once(&first).chain(others.iter().map(|(n, _)| n)) {
        wait_for_kubeadm(node, stop)?;
        f.events.say(format!("{}: kubeadm done", node.spec.name));
    }
    Ok(())
}

/// The admin makes node-1 a cluster's: `hawser init` of a new cluster, or `hawser recover` of
/// one whose disk is initialized already.
fn establish(
    f: &Formation<'_>,
    first: &Node,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<cluster::Established> {
    let established = if f.admin.initialized() {
        f.events.say(format!(
            "{}'s disk belongs to the cluster already: `hawser recover` (the whole cluster was \
             down, so no join service is left to ask)",
            first.spec.name
        ));
        recover_control_plane(f, 0, first, runtime)
    } else {
        f.events.say(format!(
            "`hawser init` of {}: attest it, then send the init secret and a new master secret",
            first.spec.name
        ));
        let init = init_options(f)?;
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
    Ok(established)
}

/// What `hawser init` of node-1 is given: the local cluster's admin files, the control planes
/// the admin approves, the mesh prefix, and node-1's address as the control-plane endpoint:
/// in the mesh (its first host address, which node-1 takes), else on the LAN.
fn init_options(f: &Formation<'_>) -> anyhow::Result<InitOptions> {
    let endpoint_host = match f.mesh_prefix {
        Some(prefix) => hawser_mesh::Registry::new(prefix)?
            .reserved_address()
            .to_string(),
        None => lan::host(0),
    };
    let approvals = std::fs::read_to_string(f.admin.approvals())?
        .lines()
        .filter(|l| !l.is_empty())
        .map(hex::decode)
        .collect::<Result<Vec<_>, _>>()
        .context("the control-plane approvals file")?;
    Ok(InitOptions {
        node: format!("127.0.0.1:{}", f.ports[0].init),
        measurements: f.image().measurements,
        provider_ca: f.dir.join(PROVIDER_CA),
        master_secret: f.admin.master_secret(),
        cluster_file: f.admin.cluster_file(),
        kubeconfig: f.admin.kubeconfig(),
        cluster_name: "hawser-local".into(),
        // The node installs the version its image carries.
        kubernetes_version: None,
        service_cidr: "10.96.0.0/12".into(),
        // The host's kubectl reaches the API server forwarded to its loopback.
        api_server_cert_sans: vec![lan::host(0), "127.0.0.1".to_owned()],
        // Where the other nodes reach the API server, and a joining control plane the
        // stand-in's etcd: node-1's address, kubeadm's choice when no load balancer is in
        // front of the control planes. (Its kubelet stand-in listens on port 6443.)
        control_plane_endpoint: Some(format!("{endpoint_host}:{API_SERVER_PORT}").parse()?),
        init_secret: f.admin.init_secret(),
        control_plane_approvals: approvals,
        vpn_prefix: f.mesh_prefix,
    })
}

/// After a whole-cluster restart: `hawser recover` of the other control planes booted with
/// node-1 (`started`), whose etcd members count for the majority.
fn recover_restarted_control_planes(
    f: &Formation<'_>,
    started: &[(usize, Booted)],
    runtime: &tokio::runtime::Runtime,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    for (i, (node, _)) in started {
        wait_for(node, WAITING_FOR_ADMIN, stop, "waiting for the admin")?;
        f.events.say(format!(
            "`hawser recover` of {} too (its etcd member counts for the majority)",
            node.spec.name
        ));
        if let Err(e) = recover_control_plane(f, *i, node, runtime) {
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
    Ok(())
}
