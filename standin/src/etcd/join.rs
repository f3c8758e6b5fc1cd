//! A control-plane join's etcd member: MemberAdd (or, for a node whose disk was formatted again,
//! MemberRemove of its old member first) at an existing member, retried as kubeadm retries,
//! then the manifest joining the cluster and the wait until the new member serves.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, TlsOptions};

use super::{CLIENT_PORT, EtcdError, LocalMember, ports_for, url};
use crate::{StandinEnv, config, validate};

/// How long a join waits to reach the existing member, and for each etcd call.
const ETCD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a join waits for its new member to serve (kubeadm waits 40 s; the kubelet that
/// runs the member may be in its restart backoff when the manifest appears).
const JOIN_PATIENCE: Duration = Duration::from_secs(90);
/// How long a join retries MemberAdd / MemberRemove.
const RECONFIGURE_PATIENCE: Duration = Duration::from_secs(30);

/// `kubeadm join --control-plane`'s stacked etcd for `node`. Returns what to say and the
/// files written.
pub fn kubeadm_join(
    env: &StandinEnv,
    node: &str,
    control_plane: &config::JoinControlPlane,
    api_server_endpoint: &str,
) -> Result<(String, Vec<PathBuf>), EtcdError> {
    let member = LocalMember::new(
        env,
        node,
        "controlPlane.localAPIEndpoint.advertiseAddress",
        &control_plane.local_api_endpoint.advertise_address,
        None,
    )?;
    let joined = join_member(env, &member, api_server_endpoint)?;
    Ok((
        format!(
            "stacked etcd: member {} at {} {} the cluster through {}; --initial-cluster={}",
            member.name,
            member.client_url(),
            match joined.membership {
                Membership::Added => "added to",
                Membership::Listed => "already listed in (a retried join)",
                Membership::Replaced => "replaced its old member (its data directory is new) in",
            },
            joined.asked,
            joined.initial_cluster
        ),
        joined.written,
    ))
}

/// How a control-plane join became a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// MemberAdd added it.
    Added,
    /// A member with its peer URL was listed and may be this node's own (never started, or
    /// this node has its data): a retried join, nothing changed.
    Listed,
    /// A member with its peer URL had run, but this node has no etcd data (its disk was
    /// formatted again): that member was removed and this one added, since a member cannot
    /// rejoin with its state lost.
    Replaced,
}

/// What a control-plane join did in the etcd cluster.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The existing member's client URL that was asked.
    pub asked: String,
    /// What MemberAdd did.
    pub membership: Membership,
    /// `--initial-cluster` as written.
    pub initial_cluster: String,
    /// The files written.
    pub written: Vec<PathBuf>,
}

/// `kubeadm join --control-plane`'s etcd: certificates from the shared etcd CA, MemberAdd at
/// the existing member on `api_server_endpoint`'s host, and a manifest joining the cluster.
pub fn join_member(
    env: &StandinEnv,
    member: &LocalMember,
    api_server_endpoint: &str,
) -> Result<Joined, EtcdError> {
    let mut written = member.create_certificates()?;
    let (host, _) =
        validate::split_host_port(api_server_endpoint).map_err(|_| EtcdError::Endpoint {
            endpoint: api_server_endpoint.to_owned(),
        })?;
    let asked = match host.parse::<IpAddr>() {
        Ok(ip) => url("https", ip, ports_for(ip)?.client),
        Err(_) => format!("https://{host}:{CLIENT_PORT}"),
    };
    let tls = member.client_tls()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(EtcdError::Runtime)?;
    // etcd keeps a member's state in <data-dir>/member: without it, this node never ran etcd
    // (or its state disk was formatted again).
    let fresh = !member.data_dir.join("member").exists();
    let (membership, members) =
        runtime.block_on(add_member(&asked, tls, &member.peer_url(), fresh))?;
    let peer_url = member.peer_url();
    let mut entries = Vec::new();
    for m in &members {
        let Some(first) = m.peer_urls().first() else {
            return Err(EtcdError::MemberWithoutPeer { id: m.id() });
        };
        // As kubeadm: this node under its own name; an unstarted other member under its ID.
        let name = if m.peer_urls().contains(&peer_url) {
            member.name.clone()
        } else if m.name().is_empty() {
            format!("{:x}", m.id())
        } else {
            m.name().to_owned()
        };
        let url = if m.peer_urls().contains(&peer_url) {
            &peer_url
        } else {
            first
        };
        entries.push(format!("{name}={url}"));
    }
    let initial_cluster = entries.join(",");
    written.push(member.write_manifest(env, &initial_cluster, "existing")?);
    // As kubeadm's "Waiting for the new etcd member to join the cluster": the join succeeds
    // only once the kubelet runs the member and it serves a quorum read.
    let tls = member.client_tls()?;
    runtime.block_on(wait_until_serving(&member.client_url(), tls))?;
    Ok(Joined {
        asked,
        membership,
        initial_cluster,
        written,
    })
}

/// Waits up to [`JOIN_PATIENCE`] for a linearizable read at `endpoint` (this node's member).
async fn wait_until_serving(endpoint: &str, tls: TlsOptions) -> Result<(), EtcdError> {
    let deadline = tokio::time::Instant::now() + JOIN_PATIENCE;
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    let mut client = Client::connect([endpoint], Some(options))
        .await
        .map_err(|source| EtcdError::Connect {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    loop {
        match client.get("health", None).await {
            Ok(_) => return Ok(()),
            Err(source) if tokio::time::Instant::now() >= deadline => {
                return Err(EtcdError::NotServing {
                    endpoint: endpoint.to_owned(),
                    seconds: JOIN_PATIENCE.as_secs(),
                    source,
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Runs `call` until it succeeds or [`RECONFIGURE_PATIENCE`] has passed, as kubeadm retries
/// its member changes: etcd refuses them ("unhealthy cluster") until every member it counts on
/// has been connected for a few seconds, e.g. right after one restarted.
async fn retry<T, F, Fut>(mut call: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + RECONFIGURE_PATIENCE;
    let mut pause = Duration::from_millis(250);
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(e) if tokio::time::Instant::now() + pause > deadline => return Err(e),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(4));
            }
        }
    }
}

/// Lists the members at `endpoint` and adds `peer_url` unless a member with it is listed that
/// this node can continue: one never started, or any when this node has its etcd data (not
/// `fresh`). A started one and a fresh node: the old member is removed first. Returns what was
/// done and the member list after.
async fn add_member(
    endpoint: &str,
    tls: TlsOptions,
    peer_url: &str,
    fresh: bool,
) -> Result<(Membership, Vec<etcd_client::Member>), EtcdError> {
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(ETCD_TIMEOUT)
        .with_timeout(ETCD_TIMEOUT);
    let mut client = Client::connect([endpoint], Some(options))
        .await
        .map_err(|source| EtcdError::Connect {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let listed = client
        .member_list()
        .await
        .map_err(|source| EtcdError::MemberList {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let old = listed
        .members()
        .iter()
        .find(|m| m.peer_urls().iter().any(|u| u == peer_url));
    let membership = match old {
        Some(m) if m.name().is_empty() || !fresh => {
            return Ok((Membership::Listed, listed.members().to_vec()));
        }
        Some(m) => {
            let id = m.id();
            retry(|| {
                let mut client = client.clone();
                async move { client.member_remove(id).await }
            })
            .await
            .map_err(|source| EtcdError::MemberRemove {
                endpoint: endpoint.to_owned(),
                id: m.id(),
                source,
            })?;
            Membership::Replaced
        }
        None => Membership::Added,
    };
    let added = retry(|| {
        let mut client = client.clone();
        async move { client.member_add([peer_url], None).await }
    })
    .await
    .map_err(|source| EtcdError::MemberAdd {
        endpoint: endpoint.to_owned(),
        peer_url: peer_url.to_owned(),
        source,
    })?;
    Ok((membership, added.member_list().to_vec()))
}
