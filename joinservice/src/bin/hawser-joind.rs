//! `hawser-joind`: the join service daemon. Verifies joining nodes over attested TLS against an
//! expected-measurements file (reloaded when it changes), derives their state-disk keys from the
//! cluster's master secret and issues kubeadm bootstrap tokens. See docs/joinservice.md.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use hawser_attestation::atls::Identity;
use hawser_attestation::tpm::Tpm;
use hawser_discovery::{Advertiser, JoinServiceAdvert, ServiceDaemon};
use hawser_joinservice::approvals::ApprovalStore;
use hawser_joinservice::core::{JoinCore, JoinCoreConfig};
use hawser_joinservice::member;
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::service::{self, ServiceConfig};
use hawser_joinservice::store::{ClusterStore, EtcdFlags, EtcdStore};
use hawser_joinservice::tokens::{KubeadmTokenIssuer, TokenPool};
use hawser_joinservice::vpn::JoinServiceAddress;
use hawser_keys::MasterSecret;
use hawser_mesh::Ipv4Net;

/// The join service: nodes attest over aTLS and receive their state-disk key and join ticket.
#[derive(Debug, Parser)]
#[command(name = "hawser-joind", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:9090")]
    listen: SocketAddr,
    /// Serve the admin API (releases, revocations: docs/lifecycle.md) on this address: TLS
    /// where this service attests (with --attest-with-tpm) and callers show the admin token
    /// derived from the master secret. Off without it.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Expected-measurements JSON file (checked for changes while running).
    #[arg(long)]
    measurements: PathBuf,
    /// The cluster's master secret (JSON written by `hawser init`, mode 0600).
    #[arg(long)]
    master_secret: PathBuf,
    /// The measurement salt (raw bytes). Default: <state-dir>/measurement-salt, created with 32
    /// random bytes if missing.
    #[arg(long)]
    measurement_salt_file: Option<PathBuf>,
    /// PEM of the provider CA that certifies nodes' attestation keys.
    #[arg(long)]
    provider_ca: PathBuf,
    /// The kubeadm binary that issues bootstrap tokens.
    #[arg(long, default_value = "kubeadm")]
    kubeadm: PathBuf,
    /// The admin kubeconfig kubeadm uses.
    #[arg(long, default_value = "/etc/kubernetes/admin.conf")]
    kubeconfig: PathBuf,
    /// The cluster's PKI directory (control-plane joins receive its CA keys); without it
    /// control-plane joins are refused.
    #[arg(long)]
    pki_dir: Option<PathBuf>,
    /// The AK names allowed to join as control planes (one hex TPM name a line, `#` comments;
    /// checked for changes while running). Default: <state-dir>/control-plane-approvals. A
    /// missing file approves nobody. With etcd, the names in it are imported into etcd at
    /// start where etcd has no approval for them yet, and etcd's approvals decide.
    #[arg(long)]
    control_plane_approvals: Option<PathBuf>,
    #[command(flatten)]
    etcd: EtcdFlags,
    /// Directory for the registry of joined disks (and the measurement salt and control-plane
    /// approvals by default).
    #[arg(long, default_value = "/var/lib/hawser-joind")]
    state_dir: PathBuf,
    /// The Kubernetes version joining nodes install, e.g. v1.20.2. Default: the version this
    /// node's image carries (/usr/share/hawser/kubernetes.json); required elsewhere.
    #[arg(long)]
    kubernetes_version: Option<hawser_kube_types::KubernetesVersion>,
    /// Lifetime of each join's bootstrap token, in seconds: long enough for a control plane's
    /// `kubeadm join` under TCG (minutes), short enough that a token left on a disk soon
    /// admits nothing.
    #[arg(long, default_value_t = 1800)]
    token_ttl_secs: u64,
    /// Bootstrap tokens minted ahead (each for one join, at least 5/6 of its life left). 0: off.
    #[arg(long, default_value_t = hawser_joinservice::tokens::DEFAULT_POOL_SIZE)]
    token_pool: usize,
    /// Calls running at once.
    #[arg(long, default_value_t = 64)]
    max_concurrent_calls: usize,
    /// Sustained calls per second per peer address.
    #[arg(long, default_value_t = 5.0)]
    rate_per_sec: f64,
    /// Burst of calls per peer address.
    #[arg(long, default_value_t = 20)]
    burst: u32,
    /// Deadline of every call, in seconds.
    #[arg(long, default_value_t = 30)]
    call_timeout_secs: u64,
    /// Deadline of every aTLS handshake, in seconds.
    #[arg(long, default_value_t = 10)]
    handshake_timeout_secs: u64,
    /// Seconds between checks of the measurements file.
    #[arg(long, default_value_t = 2)]
    policy_poll_secs: u64,
    /// Worker threads of the async runtime (default: one per CPU).
    #[arg(long)]
    worker_threads: Option<usize>,
    /// Log filter (tracing EnvFilter syntax); RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    log: String,
    /// Attest the service itself with this TPM (a TCTI, e.g. `device:/dev/tpmrm0`), so that
    /// joining nodes with `hawser.join_service_trust=attested` can verify it (mutual aTLS):
    /// its attestation key must be certified by the provider. As hawser's PID 1 runs it on a
    /// cluster's first control-plane node.
    #[arg(long)]
    attest_with_tpm: Option<String>,
    /// The WireGuard mesh's IPv4 prefix, e.g. 10.99.0.0/16: turns the mesh on. Joining nodes
    /// that send a VPN key get an address from it (docs/mesh.md).
    #[arg(long)]
    vpn_prefix: Option<Ipv4Net>,
    /// host:port where nodes reach this join service's tunnel on the underlay network.
    /// Default: the --listen address with --vpn-listen-port, if --listen names one address.
    #[arg(long)]
    vpn_endpoint: Option<String>,
    /// The UDP port this join service's tunnel listens on.
    #[arg(long, default_value_t = hawser_mesh::DEFAULT_LISTEN_PORT)]
    vpn_listen_port: u16,
    /// The tunnel MTU handed to nodes (the underlay's minus WireGuard's 80 bytes).
    #[arg(long, default_value_t = hawser_mesh::tunnel_mtu(1500))]
    vpn_mtu: u32,
    /// The TCP port of the mesh's peer API, on this join service's VPN address.
    #[arg(long, default_value_t = 9091)]
    vpn_api_port: u16,
    /// This join service's WireGuard private key (base64, mode 0600), created if missing.
    /// Default: <state-dir>/vpn.key.
    #[arg(long)]
    vpn_key_file: Option<PathBuf>,
    /// Seconds without a poll after which a node is reported as stopped polling.
    #[arg(long, default_value_t = 30)]
    vpn_stale_after_secs: u64,

    /// With the mesh: how often each node proves its state again, riding on its polls (a fresh
    /// quote for this service's nonce; docs/lifecycle.md); 0 turns re-attestation off.
    #[arg(long, default_value_t = hawser_joinservice::reattest::DEFAULT_INTERVAL.as_secs())]
    reattest_interval_secs: u64,

    /// With re-attestation: how long a node may go without a good quote before it is evicted
    /// from the mesh and revoked (a network cut shorter than this costs nothing).
    #[arg(long, default_value_t = hawser_joinservice::reattest::DEFAULT_GRACE.as_secs())]
    reattest_grace_secs: u64,
    /// This join service's name in the mesh (its ID is `join-service/<name>`). Default: the
    /// host name.
    #[arg(long)]
    vpn_name: Option<String>,
    /// The interface of this join service's WireGuard tunnel.
    #[arg(long, default_value = "hawser0")]
    vpn_interface: String,
    /// This host's tunnel is the node's, run by hawser's PID 1, which polls this service: take
    /// the node's place in the mesh (the `--own-disk` member, as a coordinator, with
    /// `--vpn-public-key` at `--vpn-address`) and serve the peer API there, with no tunnel of
    /// this service's own. As PID 1 runs it on a control plane.
    #[arg(long, requires_all = ["vpn_prefix", "vpn_address", "vpn_public_key", "own_disk"])]
    vpn_node_tunnel: bool,
    /// The node's VPN address (`--vpn-node-tunnel`).
    #[arg(long, requires = "vpn_node_tunnel")]
    vpn_address: Option<std::net::Ipv4Addr>,
    /// The node's WireGuard public key, base64 (`--vpn-node-tunnel`).
    #[arg(long, requires = "vpn_node_tunnel")]
    vpn_public_key: Option<String>,
    /// Advertise this join service on the LAN over mDNS (`_hawser-join._tcp`) under this
    /// instance name, with the cluster ID, version and API server port in its TXT record, for
    /// nodes configured with `hawser.join_discovery=mdns`. No secret is in the advert.
    #[arg(long)]
    mdns_instance: Option<String>,
    /// Seconds between mDNS announcements (a node forgets the advert after three missed).
    #[arg(long, default_value_t = 30)]
    mdns_interval_secs: u64,
    /// The Kubernetes API server port the mDNS advert names.
    #[arg(long, default_value_t = 6443)]
    mdns_api_port: u16,
    /// The UUID of this node's own state disk: bound in the cluster store to this service's
    /// TPM attestation key at start, as a join would bind it. The first control plane is made
    /// by `hawser init`, not by a join; with its disk bound it rejoins through any other
    /// control plane's join service. Needs `--attest-with-tpm`; retried while the store is
    /// unavailable.
    #[arg(long, requires = "attest_with_tpm")]
    own_disk: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .context("invalid --log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.worker_threads {
        runtime.worker_threads(n.max(1));
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(args))
}

/// Where a hawser node's image says which Kubernetes it carries.
const IMAGE_KUBERNETES: &str = "/usr/share/hawser/kubernetes.json";

/// The version joining nodes install: `--kubernetes-version`, else the one the image of the
/// node this runs on carries (`image_file`), else an error saying to give the flag.
fn kubernetes_version(
    flag: Option<&hawser_kube_types::KubernetesVersion>,
    image_file: &Path,
) -> anyhow::Result<hawser_kube_types::KubernetesVersion> {
    if let Some(version) = flag {
        return Ok(version.clone());
    }
    let text = match std::fs::read_to_string(image_file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "--kubernetes-version is required: this machine has no {} (a hawser node's image \
             says its Kubernetes version there)",
            image_file.display()
        ),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", image_file.display()));
        }
    };
    let image = hawser_kube_types::ImageKubernetes::from_json(&text).with_context(|| {
        format!(
            "{} is not an image's Kubernetes description; give --kubernetes-version",
            image_file.display()
        )
    })?;
    Ok(image.kubernetes_version()?)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let kubernetes_version = kubernetes_version(
        args.kubernetes_version.as_ref(),
        Path::new(IMAGE_KUBERNETES),
    )?;
    let master_secret = MasterSecret::read_file(&args.master_secret).with_context(|| {
        format!(
            "cannot read the master secret {}",
            args.master_secret.display()
        )
    })?;
    std::fs::create_dir_all(&args.state_dir).with_context(|| {
        format!(
            "cannot create the state directory {}",
            args.state_dir.display()
        )
    })?;
    let measurement_salt = match &args.measurement_salt_file {
        Some(path) => std::fs::read(path)
            .with_context(|| format!("cannot read the measurement salt {}", path.display()))?,
        None => hawser_joinservice::startup::salt_in_state_dir(
            &args.state_dir.join("measurement-salt"),
        )?,
    };
    if measurement_salt.is_empty() {
        bail!("the measurement salt is empty");
    }
    let provider_ca_pem = std::fs::read_to_string(&args.provider_ca)
        .with_context(|| format!("cannot read the provider CA {}", args.provider_ca.display()))?;
    let platform = hawser_platforms::profile::Platform::from_measurements(
        &std::fs::read_to_string(&args.measurements).with_context(|| {
            format!(
                "cannot read the expected measurements {}",
                args.measurements.display()
            )
        })?,
    )
    .with_context(|| {
        format!(
            "{} selects no platform profile",
            args.measurements.display()
        )
    })?;
    let policy = Arc::new(PolicyStore::load(&args.measurements).with_context(|| {
        format!(
            "cannot load the expected measurements {}",
            args.measurements.display()
        )
    })?);
    // A token per join (docs/security.md), minted ahead: no kubeadm on a join's path.
    let token_ttl = Duration::from_secs(args.token_ttl_secs);
    let kubeadm = KubeadmTokenIssuer {
        kubeadm: args.kubeadm.clone(),
        kubeconfig: args.kubeconfig.clone(),
    };
    let tokens = TokenPool::start(Arc::new(kubeadm), token_ttl, args.token_pool)
        .context("cannot start the bootstrap token pool")?;
    let tokens = Arc::new(tokens);
    // Public: what every node of the cluster extends into PCR 15.
    let cluster_id = hawser_keys::cluster_id(
        master_secret.measurement_secret().as_slice(),
        &measurement_salt,
    );
    let core_config = JoinCoreConfig {
        master_secret,
        measurement_salt,
        kubernetes_version: kubernetes_version.to_string(),
        token_ttl,
        pki_dir: args.pki_dir.clone(),
        registry_file: args.state_dir.join("joined-disks"),
    };
    let approvals_file = args
        .control_plane_approvals
        .clone()
        .unwrap_or_else(|| args.state_dir.join("control-plane-approvals"));
    let approvals = Arc::new(ApprovalStore::load(&approvals_file).with_context(|| {
        format!(
            "cannot load the control-plane approvals {}",
            approvals_file.display()
        )
    })?);
    let approved = approvals.current().len();
    // With files, the approvals file decides (and is watched); with etcd, etcd's approvals
    // decide and the file only seeds them at start.
    let mesh = mesh_flags(&args)?;
    let (core, address) = match args.etcd.config()? {
        None => (
            JoinCore::new(Arc::clone(&policy), tokens, core_config)
                .context("cannot start the join core")?
                .with_control_plane_approvals(approvals),
            // The one out-of-cluster join service.
            JoinServiceAddress::Reserved,
        ),
        Some(etcd) => {
            let store = EtcdStore::connect(etcd)
                .await
                .context("cannot set up the etcd client")?;
            tracing::info!(endpoints = %store.endpoints(), "cluster state in etcd");
            let store = Arc::new(store);
            // In the background: without etcd quorum (a whole-cluster restart, before another
            // control plane's member is back) the service must still serve rejoins.
            tokio::spawn(hawser_joinservice::startup::import_approvals(
                Arc::clone(&store),
                approvals.current().ak_names().map(str::to_owned).collect(),
                approvals_file.clone(),
            ));
            let store: Arc<dyn ClusterStore> = store;
            tokio::spawn(hawser_joinservice::startup::seed_release(
                Arc::clone(&store),
                Arc::clone(&policy.current().measurements),
            ));
            (
                JoinCore::with_cluster_store(Arc::clone(&policy), tokens, core_config, store),
                // One join service per control plane: each takes a free address.
                JoinServiceAddress::Allocated,
            )
        }
    };
    let (core, membership, node_member) = match mesh {
        None => (core, None, None),
        Some(flags) if args.vpn_node_tunnel => {
            let node = node_member_of(&args, flags)?;
            (core.with_mesh(node.settings()), None, Some(node))
        }
        Some(flags) => {
            let options = member::MeshOptions {
                prefix: flags.prefix,
                endpoint: flags.endpoint,
                mtu: flags.mtu,
                api_port: flags.api_port,
                key_file: flags.key_file,
                name: flags.name,
                address,
                interface: args.vpn_interface.clone(),
                listen_port: args.vpn_listen_port,
            };
            let (core, membership) =
                tokio::task::spawn_blocking(move || member::admit(core, &options))
                    .await
                    .context("the mesh admission task failed")??;
            (core, Some(membership), None)
        }
    };
    let core = if core.mesh().is_some() && args.reattest_interval_secs > 0 {
        let trust = hawser_platforms::verifier::ak_trust(platform, &provider_ca_pem)
            .context("the provider CA cannot verify re-attestations")?;
        core.with_reattestation(hawser_joinservice::reattest::Reattestation::new(
            Duration::from_secs(args.reattest_interval_secs),
            Duration::from_secs(args.reattest_grace_secs),
            trust,
            cluster_id,
        ))
    } else {
        core
    };
    let core = Arc::new(core);
    tokio::spawn(JoinCore::watch_reattestation(Arc::clone(&core)));
    let (stop_mesh, mesh_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(node) = node_member {
        member::serve_on_node(Arc::clone(&core), node, async {
            let _ = mesh_stopped.await;
        })
        .await
        .context("cannot serve the mesh's peer API inside the node's tunnel")?;
        tokio::spawn(member::watch_polls(
            Arc::clone(&core),
            Duration::from_secs(args.vpn_stale_after_secs.max(1)),
        ));
    } else if let Some(membership) = membership {
        member::start(Arc::clone(&core), membership, async {
            let _ = mesh_stopped.await;
        })
        .await
        .with_context(|| {
            format!(
                "cannot take this join service's place in the WireGuard mesh (interface \
                 {}, UDP port {})",
                args.vpn_interface, args.vpn_listen_port
            )
        })?;
        tokio::spawn(member::watch_polls(
            Arc::clone(&core),
            Duration::from_secs(args.vpn_stale_after_secs.max(1)),
        ));
    }

    let own_disk = match &args.own_disk {
        Some(uuid) => Some(
            hawser_keys::canonical_uuid(uuid)
                .with_context(|| format!("--own-disk {uuid:?} is not a disk UUID"))?,
        ),
        None => None,
    };
    let mut config = ServiceConfig::new(args.listen, Arc::clone(&core), provider_ca_pem);
    config.platform = platform;
    if let Some(tcti) = &args.attest_with_tpm {
        let tpm = Tpm::open(tcti).with_context(|| format!("cannot open the TPM {tcti}"))?;
        let issuer =
            hawser_platforms::node::issuer_for(platform, Arc::new(tpm)).with_context(|| {
                format!("cannot load the {platform}-certified attestation key from the TPM {tcti}")
            })?;
        if let Some(uuid) = own_disk {
            tokio::spawn(hawser_joinservice::store::bind_own_disk(
                Arc::clone(core.store()),
                uuid,
                hex::encode(issuer.ak_name()),
                Duration::from_secs(5),
            ));
        }
        config.identity = Identity::attested(Arc::new(issuer));
    }
    config.max_concurrent_calls = args.max_concurrent_calls;
    config.rate_per_sec = args.rate_per_sec;
    config.burst = args.burst;
    config.call_timeout = Duration::from_secs(args.call_timeout_secs.max(1));
    config.handshake_timeout = Duration::from_secs(args.handshake_timeout_secs.max(1));
    config.policy_poll = Duration::from_secs(args.policy_poll_secs.max(1));
    let admin_identity = config.identity.clone();
    let admin_limits = config.connection_limits.clone();
    let admin_timeout = config.call_timeout;
    let running = service::spawn(config).await?;
    let admin = match args.admin_listen {
        Some(listen) => Some(
            hawser_joinservice::admin::spawn(
                listen,
                Arc::clone(&core),
                admin_identity,
                admin_limits,
                admin_timeout,
            )
            .await
            .with_context(|| format!("cannot serve the admin API on {listen}"))?,
        ),
        None => None,
    };

    let current = policy.current();
    let enforced: Vec<String> = current
        .measurements
        .enforced()
        .map(|p| p.to_string())
        .collect();
    // The summary line: never a secret (the master secret, salt and keys stay out of logs).
    tracing::info!(
        listen = %running.local_addr,
        policy = %current.digest,
        enforced_pcrs = %enforced.join(","),
        measurements = %args.measurements.display(),
        attested = args.attest_with_tpm.is_some(),
        control_plane_approvals = %approvals_file.display(),
        approved_control_plane_aks = approved,
        "hawser-joind listening (client-attested TLS; with `attested`, the service attests too)"
    );
    // Tests and scripts read the bound address from stdout.
    println!("listening on {}", running.local_addr);
    if let Some(admin) = &admin {
        println!("admin API on {}", admin.local_addr);
    }
    let advert = match &args.mdns_instance {
        Some(instance) => Some(advertise(
            instance,
            &cluster_id,
            running.local_addr.port(),
            args.mdns_api_port,
            Duration::from_secs(args.mdns_interval_secs),
        )?),
        None => None,
    };

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::select! {
        _ = sigterm.recv() => {}
        result = ctrl_c => result.context("cannot wait for SIGINT")?,
    }
    tracing::info!("shutting down");
    if let Some((advertiser, _daemon)) = advert {
        // The goodbye: nodes drop the advert at once instead of after three missed intervals.
        if let Err(e) = advertiser.stop() {
            tracing::warn!("{}", hawser_attestation::error_chain(&e));
        }
    }
    let _ = stop_mesh.send(());
    if let Some(admin) = admin {
        admin.shutdown().await;
    }
    running.shutdown().await;
    Ok(())
}

/// Starts the mDNS advert of this join service (see `--mdns-instance`).
fn advertise(
    instance: &str,
    cluster_id: &[u8; 32],
    port: u16,
    api_port: u16,
    interval: Duration,
) -> anyhow::Result<(Advertiser, ServiceDaemon)> {
    let daemon = ServiceDaemon::new().context("cannot start the mDNS daemon")?;
    let advert = JoinServiceAdvert {
        instance: instance.to_owned(),
        cluster_id: hex::encode(cluster_id),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        port,
        api_port,
        interval: Some(interval),
    };
    let advertiser = Advertiser::start(&daemon, advert, &format!("{instance}.local."))
        .with_context(|| format!("cannot advertise the join service as {instance:?} over mDNS"))?;
    println!("advertising {} over mDNS", advertiser.fullname());
    Ok((advertiser, daemon))
}

/// The mesh flags, checked; `None` without `--vpn-prefix`.
struct MeshFlags {
    prefix: Ipv4Net,
    endpoint: std::net::SocketAddr,
    mtu: u32,
    api_port: u16,
    key_file: PathBuf,
    name: String,
}

fn mesh_flags(args: &Args) -> anyhow::Result<Option<MeshFlags>> {
    let Some(prefix) = args.vpn_prefix else {
        return Ok(None);
    };
    if prefix != prefix.trunc() {
        bail!(
            "--vpn-prefix {prefix} has host bits set: give the network address, {}",
            prefix.trunc()
        );
    }
    hawser_mesh::Registry::new(prefix).context("--vpn-prefix is not usable")?;
    if args.vpn_mtu != 0 && !(576..=9000).contains(&args.vpn_mtu) {
        bail!(
            "--vpn-mtu {} is outside 576..=9000 (0 lets each node decide)",
            args.vpn_mtu
        );
    }
    if args.vpn_api_port == 0 {
        bail!("--vpn-api-port must not be 0");
    }
    let endpoint = match &args.vpn_endpoint {
        Some(text) => resolve_endpoint(text)?,
        None if !args.listen.ip().is_unspecified() => {
            std::net::SocketAddr::new(args.listen.ip(), args.vpn_listen_port)
        }
        None => bail!(
            "--vpn-prefix needs --vpn-endpoint (host:port where nodes reach this join service's \
             tunnel): --listen {} names no single address",
            args.listen
        ),
    };
    let name = match &args.vpn_name {
        Some(name) => name.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "hawser-joind".to_owned()),
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        bail!("--vpn-name {name:?} must be one word");
    }
    Ok(Some(MeshFlags {
        prefix,
        endpoint,
        mtu: args.vpn_mtu,
        api_port: args.vpn_api_port,
        key_file: args
            .vpn_key_file
            .clone()
            .unwrap_or_else(|| args.state_dir.join("vpn.key")),
        name,
    }))
}

/// The node's place in the mesh for `--vpn-node-tunnel`, from the checked mesh flags.
fn node_member_of(args: &Args, flags: MeshFlags) -> anyhow::Result<member::NodeMember> {
    let (Some(address), Some(key), Some(disk)) =
        (args.vpn_address, &args.vpn_public_key, &args.own_disk)
    else {
        bail!("--vpn-node-tunnel needs --vpn-address, --vpn-public-key and --own-disk");
    };
    if !hawser_mesh::registry::is_host_address(flags.prefix, address) {
        bail!(
            "--vpn-address {address} is not a host address of --vpn-prefix {}",
            flags.prefix
        );
    }
    let public_key: hawser_mesh::PublicKey = key
        .parse()
        .with_context(|| format!("--vpn-public-key {key:?} is not a WireGuard public key"))?;
    let member_id = hawser_keys::canonical_uuid(disk)
        .with_context(|| format!("--own-disk {disk:?} is not a disk UUID"))?;
    Ok(member::NodeMember {
        prefix: flags.prefix,
        node: hawser_mesh::Peer {
            name: flags.name,
            public_key,
            vpn_ip: address,
            endpoint: Some(flags.endpoint),
            coordinator: true,
        },
        member_id,
        mtu: flags.mtu,
        api_port: flags.api_port,
    })
}

/// `host:port` to one socket address (IPv4 preferred: the mesh's underlay is IPv4 or IPv6,
/// but a name must resolve to something).
fn resolve_endpoint(text: &str) -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs as _;
    let addrs: Vec<_> = text
        .to_socket_addrs()
        .with_context(|| format!("--vpn-endpoint {text:?} is not host:port"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .with_context(|| format!("--vpn-endpoint {text:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubernetes_version_defaults_to_the_images_and_is_required_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kubernetes.json");
        let flag: hawser_kube_types::KubernetesVersion = "v1.33.4".parse().unwrap();
        assert_eq!(kubernetes_version(Some(&flag), &file).unwrap(), flag);
        let err = format!("{:#}", kubernetes_version(None, &file).unwrap_err());
        assert!(
            err.starts_with("--kubernetes-version is required: this machine has no "),
            "{err}"
        );
        std::fs::write(
            &file,
            r#"{"origin": "stand-in", "version": "v1.33.4", "images": null}"#,
        )
        .unwrap();
        assert_eq!(kubernetes_version(None, &file).unwrap().as_str(), "v1.33.4");
        // The flag wins over the image's.
        let other: hawser_kube_types::KubernetesVersion = "v1.20.2".parse().unwrap();
        assert_eq!(kubernetes_version(Some(&other), &file).unwrap(), other);
        std::fs::write(&file, r#"{"origin": "stand-in", "version": "1.33"}"#).unwrap();
        let err = format!("{:#}", kubernetes_version(None, &file).unwrap_err());
        assert!(
            err.contains("is not an image's Kubernetes description; give --kubernetes-version"),
            "{err}"
        );
    }
}
