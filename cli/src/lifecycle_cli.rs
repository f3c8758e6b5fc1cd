//! `hawser release`, `hawser node`, `hawser verify`: the cluster's life after formation
//! (docs/lifecycle.md), over [`hawser_cli::lifecycle`].

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use hawser_cli::cluster::ClusterFile;
use hawser_cli::lifecycle::{self, AdminTarget, NodeVerdict};
use hawser_cluster_store::releases::Release;
use hawser_keys::MasterSecret;

/// The cluster's files the admin keeps.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The CA that certifies nodes' attestation keys.
    #[arg(long, value_name = "PEM")]
    provider_ca: PathBuf,
    /// The cluster's master secret (the admin's credential is derived from it).
    #[arg(long, default_value = "hawser-master-secret.json")]
    master_secret: PathBuf,
    /// The cluster file written by `hawser init` (the cluster ID PCR 15 must be locked to).
    #[arg(long, default_value = "hawser-cluster.json")]
    cluster_file: PathBuf,
}

/// How the admin reaches and verifies a control plane's join service.
#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The admin API of a control plane's join service (`host:7001`).
    #[arg(long, value_name = "HOST:PORT")]
    join_service: String,
    /// Measurements of the release(s) the join service may run (a verifier map or `hawser
    /// measurements publish`'s file; repeat for several): it must attest as a control plane of
    /// one of them, locked to this cluster, before anything is sent.
    #[arg(long = "measurements", value_name = "FILE", required = true)]
    measurements: Vec<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
}

impl AdminArgs {
    fn target(&self) -> anyhow::Result<AdminTarget> {
        admin_target(&self.join_service, &self.measurements, &self.cluster)
    }
}

fn admin_target(
    join_service: &str,
    measurements: &[PathBuf],
    files: &ClusterArgs,
) -> anyhow::Result<AdminTarget> {
    let trusted = measurements
        .iter()
        .enumerate()
        .map(|(i, path)| read_release(&format!("trusted-{i}"), path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let cluster = ClusterFile::read(&files.cluster_file)?;
    let master = MasterSecret::read_file(&files.master_secret).with_context(|| {
        format!(
            "reading the master secret {}",
            files.master_secret.display()
        )
    })?;
    AdminTarget::new(
        join_service,
        trusted,
        cluster_id(&cluster)?,
        &read_text(&files.provider_ca)?,
        &master,
    )
}

fn read_text(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn read_release(name: &str, path: &PathBuf) -> anyhow::Result<Release> {
    Release::from_measurements_text(name, &read_text(path)?, "admin", 0)
        .with_context(|| format!("{} is not a measurements file", path.display()))
}

fn cluster_id(cluster: &ClusterFile) -> anyhow::Result<[u8; 32]> {
    hex::decode(&cluster.cluster_id)
        .ok()
        .and_then(|b| b.try_into().ok())
        .context("the cluster file's cluster_id is not 32 bytes of hex")
}

#[derive(Subcommand, Debug)]
pub enum ReleaseCommand {
    /// The releases the cluster's join services accept, and the retired ones.
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Accept the nodes of a new image (before rolling nodes onto it).
    Add {
        #[command(flatten)]
        admin: AdminArgs,
        /// The release's name (`v2`, a date, …).
        #[arg(long)]
        name: String,
        /// Its measurements: `hawser measurements publish`'s file, or a verifier map.
        #[arg(long = "release-measurements", value_name = "FILE")]
        release_measurements: PathBuf,
    },
    /// Refuse the nodes of a release from now on, by name.
    Retire {
        #[command(flatten)]
        admin: AdminArgs,
        /// The release to retire.
        #[arg(long)]
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Put a node's AK and disk on the deny-list and take it out of the mesh.
    Revoke {
        #[command(flatten)]
        admin: AdminArgs,
        /// The node: its disk UUID, AK name, mesh name or mesh address.
        node: String,
        /// Why (kept in the store and the audit log).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lift a revocation.
    Readmit {
        #[command(flatten)]
        admin: AdminArgs,
        /// Disk UUID or AK name.
        node: String,
    },
    /// The nodes the cluster store knows, with their mesh place and revocations.
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `hawser verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// A node's attestation port (`host:9443`); repeat for several.
    #[arg(long = "node", value_name = "HOST:PORT", required = true)]
    nodes: Vec<String>,
    /// The accepted releases, read from this control plane's admin API (with the flags of
    /// `hawser release list`); without it, the `--measurements` files are the accepted releases.
    #[arg(long, value_name = "HOST:PORT")]
    join_service: Option<String>,
    /// Measurements the join service may run (with `--join-service`), or the accepted releases.
    #[arg(long = "measurements", value_name = "FILE")]
    measurements: Vec<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Print the verdicts as JSON (for CI).
    #[arg(long)]
    json: bool,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn print_release(release: &Release) {
    let state = match release.retired_unix {
        Some(at) => format!("retired (unix {at})"),
        None => "accepted".to_owned(),
    };
    println!(
        "{:<24} {:<20} {:<14} {}…",
        release.name,
        state,
        release.version.as_deref().unwrap_or("-"),
        &release.digest[..16]
    );
}

pub fn release(command: ReleaseCommand) -> anyhow::Result<()> {
    let rt = runtime()?;
    match command {
        ReleaseCommand::List { admin } => {
            let releases = rt.block_on(admin.target()?.list_releases())?;
            println!("{:<24} {:<20} {:<14} DIGEST", "RELEASE", "STATE", "VERSION");
            releases.iter().for_each(print_release);
        }
        ReleaseCommand::Add {
            admin,
            name,
            release_measurements,
        } => {
            let text = read_text(&release_measurements)?;
            let (release, new) = rt.block_on(admin.target()?.add_release(&name, &text))?;
            println!(
                "{} release {} (digest {}…): the join services accept its nodes within seconds",
                if new { "added" } else { "already had" },
                release.name,
                &release.digest[..16]
            );
        }
        ReleaseCommand::Retire { admin, name } => {
            let (release, changed) = rt.block_on(admin.target()?.retire_release(&name))?;
            println!(
                "{} release {}: its nodes are refused by name from now on",
                if changed {
                    "retired"
                } else {
                    "already retired:"
                },
                release.name
            );
        }
    }
    Ok(())
}

pub fn node(command: NodeCommand) -> anyhow::Result<()> {
    let rt = runtime()?;
    match command {
        NodeCommand::Revoke {
            admin,
            node,
            reason,
        } => {
            let (revocation, removed) = rt.block_on(admin.target()?.revoke(&node, &reason))?;
            println!(
                "revoked {} (AK {}, disk {}): joins and rejoins refused{}",
                revocation.node,
                revocation.ak_name,
                revocation.disk_uuid.as_deref().unwrap_or("unknown"),
                if removed {
                    "; taken out of the mesh (its peers drop it at their next poll)"
                } else {
                    ""
                }
            );
        }
        NodeCommand::Readmit { admin, node } => {
            let revocation = rt.block_on(admin.target()?.readmit(&node))?;
            println!(
                "readmitted {} (AK {}): it may rejoin",
                revocation.node, revocation.ak_name
            );
        }
        NodeCommand::List { admin } => {
            for node in rt.block_on(admin.target()?.list_nodes())? {
                println!("{node}");
            }
        }
    }
    Ok(())
}

pub fn verify(args: VerifyArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let cluster = ClusterFile::read(&args.cluster.cluster_file)?;
    let cluster_id = cluster_id(&cluster)?;
    let provider_ca = read_text(&args.cluster.provider_ca)?;
    let releases = match &args.join_service {
        Some(join_service) => {
            let admin = admin_target(join_service, &args.measurements, &args.cluster)?;
            rt.block_on(admin.list_releases())?
        }
        None => {
            if args.measurements.is_empty() {
                bail!(
                    "give the accepted releases: --join-service (with --measurements), or --measurements"
                );
            }
            args.measurements
                .iter()
                .map(|path| {
                    let name = path
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .unwrap_or("release")
                        .to_owned();
                    read_release(&name, path)
                })
                .collect::<anyhow::Result<Vec<_>>>()?
        }
    };
    let trust = lifecycle::releases_ak_trust(&releases, &provider_ca)?;
    let verdicts: Vec<NodeVerdict> = rt.block_on(async {
        let mut verdicts = Vec::new();
        for node in &args.nodes {
            verdicts.push(lifecycle::verify_node(node, &releases, &cluster_id, &trust).await);
        }
        verdicts
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&verdicts)?);
    } else {
        print!("{}", lifecycle::verdict_table(&verdicts));
    }
    let failed = verdicts.iter().filter(|v| !v.ok).count();
    if failed > 0 {
        bail!("{failed} of {} nodes failed verification", verdicts.len());
    }
    Ok(())
}
