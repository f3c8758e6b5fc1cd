//! The cluster state hawser-joind keeps, behind one interface: which AK each joined disk is
//! bound to (the clone protection), which AKs may join as control planes ([`approvals`]), and
//! the WireGuard mesh: its versioned peer registry ([`Registry`]), every node's last poll
//! ([`PollStatus`]) and what they say of each member ([`members`]).
//!
//! A crate of its own, below the join service: `hawser-joind` keeps its state here, and the
//! admin's `hawser peers` reads and edits the same state without linking the join service's
//! server.
//!
//! Two backends, chosen by `hawser-joind`'s flags:
//!
//! - [`FileStore`]: local files, for a single join service (the out-of-cluster one of tests
//!   and `hawser local up`). The registry of joined disks and the approvals file as before.
//! - [`EtcdStore`]: the control planes' etcd (v3 API over TLS with client certificates), so
//!   that every control plane's join service sees, and atomically writes, the same state. Binding
//!   a disk is one etcd transaction (create if absent, else compare): of two join services that
//!   race to bind one disk to two AKs, exactly one wins.
//!
//! The layout, the consistency rules and what happens while etcd loses quorum are in
//! `docs/cluster-state.md`.

pub mod approvals;
mod etcd;
mod file;
mod flags;
pub mod members;
pub mod releases;
pub mod reload;
pub mod revocations;

pub use etcd::{
    EtcdConfig, EtcdStore, KEY_PREFIX, VPN_POLLS_PREFIX, VPN_REGISTRY_KEY, approval_key, disk_key,
    record_key, vpn_poll_key,
};
pub use file::{FileStore, VPN_POLLS_DIR, VPN_REGISTRY_FILE};
pub use flags::EtcdFlags;

use std::collections::BTreeMap;
use std::sync::Arc;

use hawser_mesh::{Ipv4Net, MeshError, PeerStats, Registry};

/// A node's last poll of the mesh's peer API: its heartbeat, the registry version it held and
/// its tunnel's statistics (what `hawser peers` shows).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PollStatus {
    /// When the poll arrived, seconds since the Unix epoch.
    pub unix_time: u64,
    /// The registry version the node held; `None` before its first update.
    pub known_version: Option<u64>,
    /// Its tunnel's statistics, one per peer.
    pub stats: Vec<PeerStats>,
}

/// A change of the VPN registry, for [`ClusterStore::update_vpn_registry`]. It may run more
/// than once (etcd: again on a conflicting write), each time on a fresh copy.
pub type RegistryChange<'a> = &'a mut dyn FnMut(&mut Registry) -> Result<(), MeshError>;

/// What the store knows of a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskBinding {
    /// The disk joined with the AK of this name (lowercase hex).
    Bound(String),
    /// The disk joined before disks were bound to AKs (file backend only): its next join or
    /// rejoin binds it.
    Unbound,
}

/// The result of [`ClusterStore::bind_disk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    /// The disk was not known; it is now bound to the AK.
    New,
    /// The disk was already bound to this AK.
    Same,
    /// The disk was known without an AK (file backend); it is now bound to this one.
    BoundLegacy,
    /// The disk is bound to another AK (lowercase hex): a clone, refused.
    Another(String),
}

/// Runs `write` on the blocking pool until the store takes it, every `retry` while it cannot
/// (etcd not up yet, or without quorum: after a whole-cluster restart the first control plane's
/// member has none until another one's is back, and that one rejoins through this very join
/// service — so nothing at start may wait for a write). Logs each failure with `what`.
pub async fn write_until_done<T: Send + 'static>(
    what: &str,
    retry: std::time::Duration,
    write: impl Fn() -> Result<T, StoreError> + Send + Sync + 'static,
) -> T {
    let write = Arc::new(write);
    loop {
        let attempt = Arc::clone(&write);
        match tokio::task::spawn_blocking(move || attempt()).await {
            Ok(Ok(done)) => return done,
            Ok(Err(e)) => tracing::warn!(
                "cannot {what} yet, retrying in {:.0} s: {e}",
                retry.as_secs_f32()
            ),
            Err(e) => tracing::warn!("the task to {what} failed, retrying: {e}"),
        }
        tokio::time::sleep(retry).await;
    }
}

/// Binds a control plane's own state disk to its AK (`hawser-joind --own-disk`), as a join
/// would have bound it: the first control plane, made by `hawser init` rather than a join,
/// then rejoins through any other control plane's join service. Retries while the store
/// cannot be written ([`write_until_done`]); returns what the store decided. A disk bound to
/// another AK is left as it is and logged as an error.
pub async fn bind_own_disk(
    store: Arc<dyn ClusterStore>,
    uuid: String,
    ak_name: String,
    retry: std::time::Duration,
) -> BindOutcome {
    let (u, a) = (uuid.clone(), ak_name.clone());
    let outcome = write_until_done("bind this node's own disk", retry, move || {
        store.bind_disk(&u, &a)
    })
    .await;
    match &outcome {
        BindOutcome::Another(registered) => tracing::error!(
            disk = %uuid,
            registered = %registered,
            ak = %ak_name,
            "this node's own disk is bound to another AK in the cluster store (a cloned \
             disk?); left as it is"
        ),
        BindOutcome::Same => {
            tracing::info!(disk = %uuid, "this node's own disk is bound to its AK")
        }
        BindOutcome::New | BindOutcome::BoundLegacy => tracing::info!(
            disk = %uuid,
            ak = %ak_name,
            "bound this node's own disk to its AK: it rejoins through any control plane's join \
             service"
        ),
    }
    outcome
}

/// Records in the store: JSON documents by name. Releases and revocations are written only by
/// the admin's authenticated calls ([`releases`], [`revocations`]); a member's re-attestation
/// by the join service that judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A release: the measurements of a node image the join services accept (or refuse, once
    /// retired), by release name.
    Release,
    /// A revoked node: its AK and disk, refused from then on, by AK name.
    Revocation,
    /// A mesh member's last good re-attestation, by member ID (written by the join services).
    Attested,
}

impl RecordKind {
    /// The etcd prefix of this kind's keys.
    pub fn etcd_prefix(self) -> &'static str {
        match self {
            RecordKind::Release => "/hawser/v1/releases/",
            RecordKind::Revocation => "/hawser/v1/revoked/",
            RecordKind::Attested => "/hawser/v1/vpn/attested/",
        }
    }

    /// The directory of this kind's files beside the registry of joined disks.
    pub fn dir_name(self) -> &'static str {
        match self {
            RecordKind::Release => "releases",
            RecordKind::Revocation => "revoked",
            RecordKind::Attested => "vpn-attested",
        }
    }
}

/// How [`ClusterStore::put_record`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Only if no record of that name exists (atomically).
    Create,
    /// Whatever is there.
    Replace,
}

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadConsistency {
    /// The latest committed value (etcd: a linearizable read, which needs quorum).
    Latest,
    /// The latest value, or where that cannot be had (etcd quorum lost), the value a reachable
    /// member holds. Right for write-once values such as a disk's binding.
    LatestOrLocal,
}

/// The cluster state hawser-joind keeps. Blocking: call from a thread outside the async
/// runtime (the service runs the core on the blocking pool).
pub trait ClusterStore: Send + Sync {
    /// What a disk is bound to; `None` if it never joined.
    fn disk_binding(
        &self,
        uuid: &str,
        consistency: ReadConsistency,
    ) -> Result<Option<DiskBinding>, StoreError>;

    /// Binds disk `uuid` to the AK named `ak_name` (lowercase hex) unless it is bound already,
    /// atomically with respect to every join service sharing the store.
    fn bind_disk(&self, uuid: &str, ak_name: &str) -> Result<BindOutcome, StoreError>;

    /// Whether the AK named `ak_name` (lowercase hex) may join as a control plane, as of now.
    fn approves_control_plane(&self, ak_name: &str) -> Result<bool, StoreError>;

    /// Where an admin approves an AK, for the refusal message.
    fn approvals_location(&self, ak_name: &str) -> String;

    /// Reads the VPN registry, applies `change` to it and writes it back if it changed,
    /// atomically with respect to every join service sharing the store; returns the registry
    /// as written (or as read, when `change` changed nothing). A registry that does not exist
    /// yet starts as `Registry::new(prefix)`; a stored one for another prefix is refused
    /// ([`StoreError::VpnPrefix`]). A refusal of `change` is [`StoreError::Mesh`], and nothing
    /// is written.
    fn update_vpn_registry(
        &self,
        prefix: Ipv4Net,
        change: RegistryChange<'_>,
    ) -> Result<Registry, StoreError>;

    /// The VPN registry; `None` if the mesh never had a member.
    fn vpn_registry(&self, consistency: ReadConsistency) -> Result<Option<Registry>, StoreError>;

    /// Records node `node_id`'s poll (last writer wins: it is a heartbeat).
    fn record_vpn_poll(&self, node_id: &str, status: &PollStatus) -> Result<(), StoreError>;

    /// Every node's last poll, by node ID.
    fn vpn_polls(&self) -> Result<BTreeMap<String, PollStatus>, StoreError>;

    /// Writes record `name` of `kind` (JSON); returns whether it was written (`false`: `Create`
    /// found one of that name).
    fn put_record(
        &self,
        kind: RecordKind,
        name: &str,
        json: &[u8],
        mode: PutMode,
    ) -> Result<bool, StoreError>;

    /// Every record of `kind`, by name. `LatestOrLocal`: where etcd has no quorum, as a
    /// reachable member holds them.
    fn records(
        &self,
        kind: RecordKind,
        consistency: ReadConsistency,
    ) -> Result<BTreeMap<String, Vec<u8>>, StoreError>;
}

/// Applies `change` to `stored` (or a new registry for `prefix`): the shared part of both
/// backends' [`ClusterStore::update_vpn_registry`]. Returns the new registry and whether it
/// differs from the stored one.
fn apply_vpn_change(
    stored: Option<Registry>,
    prefix: Ipv4Net,
    change: RegistryChange<'_>,
) -> Result<(Registry, bool), StoreError> {
    let prefix = prefix.trunc();
    let before = match stored {
        Some(registry) if registry.prefix() != prefix => {
            return Err(StoreError::VpnPrefix {
                stored: registry.prefix(),
                configured: prefix,
            });
        }
        Some(registry) => Some(registry),
        None => None,
    };
    let mut registry = match &before {
        Some(registry) => registry.clone(),
        None => Registry::new(prefix)?,
    };
    change(&mut registry)?;
    let changed = before.as_ref() != Some(&registry);
    Ok((registry, changed))
}

/// Why the cluster state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The registry file of joined disks could not be read or written.
    #[error("cannot read or write the registry of joined disks {path}")]
    Registry {
        /// The registry file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A line of the registry file is not `<disk uuid> [<AK name, hex>]`.
    #[error("line {line} of the registry of joined disks {path} is not `<disk uuid> [<AK name>]`")]
    RegistryLine {
        /// The registry file.
        path: String,
        /// 1-based line number.
        line: usize,
    },
    /// etcd answered an operation with an error (unreachable members, lost quorum, refused
    /// certificate).
    #[error("etcd ({endpoints}) failed to {operation}")]
    Etcd {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// What the join service asked, e.g. `bind disk <uuid>`.
        operation: String,
        #[source]
        source: etcd_client::Error,
    },
    /// etcd did not answer within the timeout (typically: quorum lost, or no member reachable).
    #[error("etcd ({endpoints}) did not answer within {timeout:?} to {operation}")]
    EtcdTimeout {
        /// The configured endpoints, comma-separated.
        endpoints: String,
        /// What the join service asked.
        operation: String,
        /// The timeout of every etcd call.
        timeout: std::time::Duration,
    },
    /// A value in etcd is not what hawser writes there.
    #[error("etcd key {key} holds a value that is not an AK name (hex)")]
    EtcdValue {
        /// The key.
        key: String,
    },
    /// A TLS file for the etcd client could not be read.
    #[error("cannot read the etcd TLS file {path}")]
    TlsFile {
        /// The file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// No etcd endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// etcd endpoints were given without the CA, client certificate and key.
    #[error("--etcd-endpoints needs --etcd-ca, --etcd-cert and --etcd-key")]
    IncompleteEtcdFlags,
    /// The mesh refused a change of the VPN registry (a key change, a full prefix, a clash).
    #[error("the VPN registry refused the change")]
    Mesh(#[from] MeshError),
    /// The stored VPN registry was made for another prefix than the configured one.
    #[error(
        "the stored VPN registry is for prefix {stored}, but this join service is configured \
         with {configured}: the prefix of a mesh cannot change while it has members"
    )]
    VpnPrefix {
        /// The stored registry's prefix.
        stored: Ipv4Net,
        /// The configured prefix.
        configured: Ipv4Net,
    },
    /// A stored VPN registry or poll is not the JSON hawser writes.
    #[error("{location} does not hold the JSON hawser writes for the VPN {what}")]
    VpnJson {
        /// The file or etcd key.
        location: String,
        /// `registry` or `poll`.
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A stored admin record is not the JSON hawser writes.
    #[error("the cluster store's {kind} record {name} is not the JSON hawser writes")]
    RecordJson {
        /// `release` or `revocation`.
        kind: &'static str,
        /// The record's name.
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// A VPN registry or poll file could not be read or written.
    #[error("cannot read or write {path}")]
    VpnFile {
        /// The file or directory.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The registry as written lacks the member just admitted (a store that lost the write).
    #[error("the VPN registry, as written, has no member {id}")]
    VpnMemberMissing {
        /// The member's ID.
        id: String,
    },
    /// Concurrent writers kept changing the VPN registry under this one.
    #[error("the VPN registry changed under every one of {attempts} attempts to update it")]
    VpnContention {
        /// How many read-modify-write rounds were tried.
        attempts: u32,
    },
}

impl StoreError {
    /// Whether the error is etcd being unreachable or without quorum (the node should retry
    /// later), as opposed to a local fault.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Etcd { .. } | Self::EtcdTimeout { .. } | Self::VpnContention { .. }
        )
    }
}

/// Whether `name` looks like an AK name as hawser writes it: lowercase hex, even length.
fn is_ak_name(name: &str) -> bool {
    !name.is_empty()
        && name.len().is_multiple_of(2)
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
