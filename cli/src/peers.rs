//! `hawser peers`: the WireGuard mesh as the join service sees it, read from its cluster store
//! (the join service's state directory, or the control planes' etcd): every member's VPN
//! address, key, endpoint and role, and what its last poll of the peer API reported — when,
//! at which registry version, and its tunnel's handshakes and traffic. Nodes whose last poll is
//! older than `--stale-after` are marked "stopped polling".
//!
//! `--remove MEMBER` takes a member out of the registry (a node re-installed with a new key, or
//! gone for good).
//!
//! The data is the nodes' own reports (each poll carries the node's boringtun statistics), never
//! a guess. `--json` prints the shape documented in `docs/mesh.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use hawser_cluster_store::members::{MemberStatus, Polling, member_statuses};
use hawser_cluster_store::{
    ClusterStore, EtcdFlags, EtcdStore, FileStore, PollStatus, ReadConsistency,
};
use hawser_mesh::{PeerStats, PublicKey, Registry};

/// `hawser peers` arguments.
#[derive(Debug, Args)]
pub struct PeersArgs {
    /// The join service's state directory (file backend: `hawser-joind --state-dir`).
    #[arg(long, default_value = "/var/lib/hawser-joind")]
    state_dir: PathBuf,
    #[command(flatten)]
    etcd: EtcdFlags,
    /// Seconds without a poll after which a node is marked "stopped polling".
    #[arg(long, default_value_t = 30)]
    stale_after: u64,
    /// Print JSON (the shape in docs/mesh.md) instead of a table.
    #[arg(long)]
    json: bool,
    /// Remove this member (its name, disk UUID or `join-service/<name>`) from the mesh: its
    /// address becomes free, the other members drop it at their next poll, and its disk may
    /// join again with a new key (a re-installed node).
    #[arg(long, value_name = "MEMBER")]
    remove: Option<String>,
}

/// The mesh as `--json` prints it.
#[derive(Debug, serde::Serialize)]
pub struct MeshReport {
    /// The mesh prefix.
    pub prefix: String,
    /// The registry's current version.
    pub registry_version: u64,
    /// When the report was made, seconds since the Unix epoch.
    pub now_unix: u64,
    /// The stale limit used.
    pub stale_after_secs: u64,
    /// Every member, by VPN address.
    pub members: Vec<MemberReport>,
    /// Names of the nodes past the stale limit.
    pub stopped_polling: Vec<String>,
}

/// One member.
#[derive(Debug, serde::Serialize)]
pub struct MemberReport {
    /// Disk UUID, or `join-service/<name>`.
    pub id: String,
    /// Node (or join service) name.
    pub name: String,
    /// `node` or `join-service`.
    pub role: &'static str,
    /// Its address inside the mesh.
    pub vpn_ip: String,
    /// Its WireGuard public key (base64).
    pub public_key: String,
    /// Its underlay endpoint as registered, if any.
    pub endpoint: Option<String>,
    /// `polling`, `stopped`, `never` or `coordinator` (join services answer polls).
    pub polling: Polling,
    /// Its last poll, seconds since the Unix epoch.
    pub last_poll_unix: Option<u64>,
    /// Seconds since its last poll.
    pub last_poll_age_secs: Option<u64>,
    /// The registry version it held at its last poll.
    pub known_version: Option<u64>,
    /// Whether that version is lower than the registry's.
    pub behind: bool,
    /// What its tunnel reported of each peer at its last poll.
    pub peers: Vec<PeerReport>,
}

/// What a member's tunnel reported of one peer.
#[derive(Debug, serde::Serialize)]
pub struct PeerReport {
    /// The peer's key (base64).
    pub public_key: String,
    /// The peer's name in the registry; `None` for a key the registry does not know.
    pub name: Option<String>,
    /// Where the peer's packets last came from.
    pub endpoint: Option<String>,
    /// The last completed handshake, seconds since the Unix epoch.
    pub last_handshake_unix: Option<u64>,
    /// Seconds since then, as of the report.
    pub last_handshake_age_secs: Option<u64>,
    /// Bytes received from the peer.
    pub rx_bytes: u64,
    /// Bytes sent to the peer.
    pub tx_bytes: u64,
}

/// Runs `hawser peers`.
pub fn run(args: PeersArgs) -> anyhow::Result<()> {
    if let Some(member) = &args.remove {
        return with_store(&args, |store, location| remove(store, &location, member));
    }
    let stale_after = Duration::from_secs(args.stale_after);
    let report = with_store(&args, |store, location| {
        mesh_report(store, &location, stale_after)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// Runs `action` on the store the flags name, with a description of where it is.
fn with_store<T>(
    args: &PeersArgs,
    action: impl FnOnce(&dyn ClusterStore, String) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let Some(config) = args.etcd.config()? else {
        let registry_file = args.state_dir.join("joined-disks");
        let store = FileStore::open(&registry_file).with_context(|| {
            format!(
                "cannot open the join service's state in {}",
                args.state_dir.display()
            )
        })?;
        return action(&store, args.state_dir.display().to_string());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let store = runtime
        .block_on(EtcdStore::connect(config))
        .context("cannot set up the etcd client")?;
    // The store's calls block on its runtime: made from this thread, outside it.
    let location = format!("etcd ({})", store.endpoints());
    action(&store, location)
}

/// Removes `member` (a name or an ID) from the mesh's registry.
fn remove(store: &dyn ClusterStore, location: &str, member: &str) -> anyhow::Result<()> {
    let Some(registry) = store
        .vpn_registry(ReadConsistency::Latest)
        .with_context(|| format!("cannot read the VPN registry from {location}"))?
    else {
        bail!("no WireGuard mesh in {location}: nothing to remove");
    };
    let mut removed = None;
    let written = store
        .update_vpn_registry(registry.prefix(), &mut |registry| {
            let id = registry
                .members()
                .find(|(id, peer)| *id == member || peer.name == member)
                .map(|(id, _)| id.to_owned());
            removed = id.and_then(|id| registry.remove(&id).map(|peer| (id, peer)));
            Ok(())
        })
        .with_context(|| format!("cannot update the VPN registry in {location}"))?;
    let Some((id, peer)) = removed else {
        bail!("{member:?} is no member of the mesh in {location} (neither a name nor an ID)");
    };
    println!(
        "removed {} ({id}, {}, key {}) from the mesh; registry version {}",
        peer.name,
        peer.vpn_ip,
        peer.public_key,
        written.version()
    );
    Ok(())
}

/// The mesh as `store` (described as `location` in errors) shows it now.
pub fn mesh_report(
    store: &dyn ClusterStore,
    location: &str,
    stale_after: Duration,
) -> anyhow::Result<MeshReport> {
    let registry = store
        .vpn_registry(ReadConsistency::LatestOrLocal)
        .with_context(|| format!("cannot read the VPN registry from {location}"))?;
    let Some(registry) = registry else {
        bail!(
            "no WireGuard mesh in {location}: is the join service's mesh on (--vpn-prefix), and \
             is this its store?"
        );
    };
    let polls = store
        .vpn_polls()
        .with_context(|| format!("cannot read the nodes' polls from {location}"))?;
    Ok(report(&registry, &polls, unix_now(), stale_after))
}

/// The report of `registry` and `polls` at `now`.
pub fn report(
    registry: &Registry,
    polls: &BTreeMap<String, PollStatus>,
    now: u64,
    stale_after: Duration,
) -> MeshReport {
    let names: BTreeMap<PublicKey, String> = registry
        .members()
        .map(|(_, peer)| (peer.public_key, peer.name.clone()))
        .collect();
    let mut statuses = member_statuses(registry, polls, now, stale_after);
    statuses.sort_by_key(|s| s.peer.vpn_ip);
    let members: Vec<MemberReport> = statuses
        .into_iter()
        .map(|status| member_report(status, registry.version(), &names, now))
        .collect();
    let stopped_polling = members
        .iter()
        .filter(|m| m.polling == Polling::Stopped)
        .map(|m| m.name.clone())
        .collect();
    MeshReport {
        prefix: registry.prefix().to_string(),
        registry_version: registry.version(),
        now_unix: now,
        stale_after_secs: stale_after.as_secs(),
        members,
        stopped_polling,
    }
}

fn member_report(
    status: MemberStatus,
    version: u64,
    names: &BTreeMap<PublicKey, String>,
    now: u64,
) -> MemberReport {
    let known_version = status.last_poll.as_ref().and_then(|p| p.known_version);
    let polled = status.last_poll.is_some();
    MemberReport {
        role: if status.peer.coordinator {
            "join-service"
        } else {
            "node"
        },
        vpn_ip: status.peer.vpn_ip.to_string(),
        public_key: status.peer.public_key.to_string(),
        endpoint: status.peer.endpoint.map(|e| e.to_string()),
        polling: status.polling,
        last_poll_unix: status.last_poll.as_ref().map(|p| p.unix_time),
        last_poll_age_secs: status
            .last_poll
            .as_ref()
            .map(|p| now.saturating_sub(p.unix_time)),
        known_version,
        behind: polled && known_version.is_none_or(|known| known < version),
        peers: status
            .last_poll
            .iter()
            .flat_map(|p| &p.stats)
            .map(|stats| peer_report(stats, names, now))
            .collect(),
        id: status.id,
        name: status.peer.name,
    }
}

fn peer_report(stats: &PeerStats, names: &BTreeMap<PublicKey, String>, now: u64) -> PeerReport {
    PeerReport {
        public_key: stats.public_key.to_string(),
        name: names.get(&stats.public_key).cloned(),
        endpoint: stats.endpoint.map(|e| e.to_string()),
        last_handshake_unix: stats.last_handshake_unix,
        last_handshake_age_secs: stats.last_handshake_unix.map(|t| now.saturating_sub(t)),
        rx_bytes: stats.rx_bytes,
        tx_bytes: stats.tx_bytes,
    }
}

/// The peer a member's row shows: the most recent handshake, then the most traffic.
fn shown_peer(member: &MemberReport) -> Option<&PeerReport> {
    member
        .peers
        .iter()
        .max_by_key(|p| (p.last_handshake_unix, p.rx_bytes.saturating_add(p.tx_bytes)))
}

/// The report as a table, one member a line, with the stopped nodes named under it.
pub fn table(report: &MeshReport) -> String {
    let header = [
        "NAME",
        "ROLE",
        "VPN IP",
        "ENDPOINT",
        "PUBLIC KEY",
        "LAST POLL",
        "VERSION",
        "HANDSHAKE",
        "RX",
        "TX",
        "STATUS",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for member in &report.members {
        let peer = shown_peer(member);
        let version = match (member.polling, member.known_version) {
            (Polling::Coordinator, _) => "-".to_owned(),
            (_, known) => format!(
                "{}/{}",
                known.map_or("-".to_owned(), |v| v.to_string()),
                report.registry_version
            ),
        };
        let status = match member.polling {
            Polling::Coordinator => "serves polls".to_owned(),
            Polling::Never => "never polled".to_owned(),
            Polling::Stopped => "STOPPED POLLING".to_owned(),
            Polling::Polling if member.behind => "behind".to_owned(),
            Polling::Polling => "ok".to_owned(),
        };
        rows.push(vec![
            member.name.clone(),
            member.role.to_owned(),
            member.vpn_ip.clone(),
            member.endpoint.clone().unwrap_or_else(|| "-".to_owned()),
            member.public_key.clone(),
            member
                .last_poll_age_secs
                .map_or("-".to_owned(), |age| format!("{} ago", age_text(age))),
            version,
            peer.map_or("-".to_owned(), |p| {
                let age = p
                    .last_handshake_age_secs
                    .map_or("never".to_owned(), |age| format!("{} ago", age_text(age)));
                format!("{age} ({})", p.name.as_deref().unwrap_or("unknown key"))
            }),
            peer.map_or("-".to_owned(), |p| bytes_text(p.rx_bytes)),
            peer.map_or("-".to_owned(), |p| bytes_text(p.tx_bytes)),
            status,
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|col| {
            rows.iter()
                .map(|r| r[col].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = format!(
        "mesh {} at registry version {} ({} members)\n",
        report.prefix,
        report.registry_version,
        report.members.len()
    );
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        text.push_str(line.join("  ").trim_end());
        text.push('\n');
    }
    if !report.stopped_polling.is_empty() {
        text.push_str(&format!(
            "stopped polling (no poll for more than {}s): {}\n",
            report.stale_after_secs,
            report.stopped_polling.join(", ")
        ));
    }
    text
}

/// `42s`, `3m05s`, `2h07m`, `3d04h`.
fn age_text(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
        _ => format!("{}d{:02}h", secs / 86400, (secs % 86400) / 3600),
    }
}

/// `512 B`, `1.5 KiB`, `3.2 MiB`, `1.0 GiB`.
fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
