//! The etcd backend: the cluster state in the control planes' etcd, as kubeadm's stacked etcd
//! runs it (v3 API, TLS with client certificates), through the `etcd-client` crate.
//!
//! Keys, under [`KEY_PREFIX`] (values are ASCII):
//!
//! | key                                         | value                                   |
//! |---------------------------------------------|-----------------------------------------|
//! | `/hawser/v1/disks/<disk uuid>`              | the AK name the disk joined with (hex)  |
//! | `/hawser/v1/control-plane-approvals/<ak>`   | where the approval came from (a note)   |
//! | `/hawser/v1/vpn/registry`                   | the mesh's peer registry (JSON)         |
//! | `/hawser/v1/vpn/polls/<node id>`            | a node's last poll (JSON)               |
//!
//! A disk's key is written once, by a transaction that creates it only if absent; nothing in
//! hawser overwrites or deletes it. The VPN registry is read, changed and written back by a
//! transaction that compares the key's `mod_revision` with the one read (or, for the first
//! write, that the key does not exist), and is read-modified-written again when another join
//! service won the race. A poll is a plain put: the last heartbeat wins.
//!
//! Every call runs under [`EtcdConfig::timeout`]: a lost quorum makes a call fail, never hang.

use std::path::Path;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, TlsOptions, Txn,
    TxnOp, TxnOpResponse,
};
use tokio::runtime::Handle;
use zeroize::Zeroizing;

use std::collections::BTreeMap;

use hawser_mesh::{Ipv4Net, Registry};

use super::{
    BindOutcome, ClusterStore, DiskBinding, PollStatus, PutMode, ReadConsistency, RecordKind,
    RegistryChange, StoreError, apply_vpn_change, is_ak_name,
};

/// A key and its value, as read.
type KeyValue = (Vec<u8>, Vec<u8>);

/// The etcd key of an admin record.
pub fn record_key(kind: RecordKind, name: &str) -> String {
    format!("{}{name}", kind.etcd_prefix())
}

/// The versioned prefix of every key hawser writes.
pub const KEY_PREFIX: &str = "/hawser/v1/";

/// The key of disk `uuid`'s binding.
pub fn disk_key(uuid: &str) -> String {
    format!("{KEY_PREFIX}disks/{uuid}")
}

/// The key of the control-plane approval of the AK named `ak_name` (lowercase hex).
pub fn approval_key(ak_name: &str) -> String {
    format!("{KEY_PREFIX}control-plane-approvals/{ak_name}")
}

/// The key of the mesh's peer registry.
pub const VPN_REGISTRY_KEY: &str = "/hawser/v1/vpn/registry";

/// The prefix of the nodes' last polls.
pub const VPN_POLLS_PREFIX: &str = "/hawser/v1/vpn/polls/";

/// The key of node `node_id`'s last poll.
pub fn vpn_poll_key(node_id: &str) -> String {
    format!("{VPN_POLLS_PREFIX}{node_id}")
}

/// Read-modify-write rounds of the VPN registry before giving up under contention.
const VPN_UPDATE_ATTEMPTS: u32 = 32;

/// How to reach etcd. Debug never shows the client key.
pub struct EtcdConfig {
    /// Client URLs, e.g. `https://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// PEM of the etcd CA (kubeadm: `/etc/kubernetes/pki/etcd/ca.crt`).
    pub ca_pem: Vec<u8>,
    /// PEM of the client certificate (kubeadm: `apiserver-etcd-client.crt`).
    pub cert_pem: Vec<u8>,
    /// PEM of the client key (kubeadm: `apiserver-etcd-client.key`).
    pub key_pem: Zeroizing<Vec<u8>>,
    /// Deadline of every etcd call.
    pub timeout: Duration,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdConfig {
    /// Reads the CA, client certificate and key from files.
    pub fn from_files(
        endpoints: Vec<String>,
        ca: &Path,
        cert: &Path,
        key: &Path,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| StoreError::TlsFile {
                path: path.display().to_string(),
                source,
            })
        };
        Ok(Self {
            endpoints,
            ca_pem: read(ca)?,
            cert_pem: read(cert)?,
            key_pem: Zeroizing::new(read(key)?),
            timeout,
        })
    }

    fn connect_options(&self) -> ConnectOptions {
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &*self.key_pem));
        ConnectOptions::new()
            .with_tls(tls)
            .with_timeout(self.timeout)
            .with_connect_timeout(self.timeout)
    }
}

/// The cluster state in etcd (see the module docs).
pub struct EtcdStore {
    config: EtcdConfig,
    client: Client,
    /// The runtime the etcd calls run on; [`ClusterStore`] calls block on it.
    runtime: Handle,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// A client for `config.endpoints`. Connections are made per call, so this succeeds while
    /// etcd is down; the calls then fail with [`StoreError::Etcd`] or
    /// [`StoreError::EtcdTimeout`]. Must run inside the multi-threaded tokio runtime the
    /// store's calls will use.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::NoEndpoints);
        }
        let endpoints = config.endpoints.join(",");
        let operation = "connect".to_owned();
        let client = match tokio::time::timeout(
            config.timeout,
            Client::connect(&config.endpoints, Some(config.connect_options())),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(source)) => {
                return Err(StoreError::Etcd {
                    endpoints,
                    operation,
                    source,
                });
            }
            Err(_) => {
                return Err(StoreError::EtcdTimeout {
                    endpoints,
                    operation,
                    timeout: config.timeout,
                });
            }
        };
        Ok(Self {
            config,
            client,
            runtime: Handle::current(),
        })
    }

    /// The endpoints, comma-separated.
    pub fn endpoints(&self) -> String {
        self.config.endpoints.join(",")
    }

    /// Writes an approval for each of `ak_names` (lowercase hex) that etcd does not hold yet,
    /// with `note` as its value: put-if-absent, one transaction each, so several join services
    /// seeding at once write each approval once. Returns the names it wrote. Blocking, like
    /// every [`ClusterStore`] call.
    ///
    /// A revocation is a deletion of the key; a join service started again with a seed file
    /// that still lists the AK writes it again, so take the AK out of the file as well.
    pub fn import_control_plane_approvals<'a>(
        &self,
        ak_names: impl IntoIterator<Item = &'a str>,
        note: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut written = Vec::new();
        for ak_name in ak_names {
            let key = approval_key(ak_name);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), note, None)]);
            let response = self.call(format!("import approval {key}"), || {
                let mut client = self.client.clone();
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })?;
            if response.succeeded() {
                tracing::info!(ak = ak_name, key = %key, "control-plane approval imported into etcd");
                written.push(ak_name.to_owned());
            }
        }
        Ok(written)
    }

    /// Runs one etcd call on the store's runtime under the timeout, again and again while
    /// etcd answers with a transient error ("leader changed", a member gone) and time is left,
    /// as etcd's own client does. Every hawser call is safe to repeat: a read, or a transaction
    /// that creates a key only if absent.
    fn call<T, F, Fut>(&self, operation: String, attempt: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(operation, true, attempt)
    }

    fn call_with<T, F, Fut>(
        &self,
        operation: String,
        retry: bool,
        mut attempt: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.config.timeout;
        // The timers are made inside `block_on`, in the runtime's context.
        let outcome = self.runtime.block_on(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut pause = Duration::from_millis(50);
            let mut last = None;
            loop {
                match tokio::time::timeout_at(deadline, attempt()).await {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(e)) if retry && is_transient(&e) => last = Some(e),
                    Ok(Err(e)) => return Err(Some(e)),
                    Err(_) => return Err(last),
                }
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(last);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        });
        outcome.map_err(|last| match last {
            Some(source) => StoreError::Etcd {
                endpoints: self.endpoints(),
                operation,
                source,
            },
            None => StoreError::EtcdTimeout {
                endpoints: self.endpoints(),
                operation,
                timeout,
            },
        })
    }

    /// The value of `key`, read linearizably (through the leader, needs quorum).
    fn get_latest(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let response = self.call(format!("read {key}"), || {
            let mut client = self.client.clone();
            async move { client.get(key, None).await }
        })?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The value of `key` as the first reachable member holds it (a serializable read, served
    /// by that member alone, so it works without quorum).
    fn get_local(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let kvs = self.get_local_with(key, false)?;
        Ok(kvs.into_iter().next().map(|(_, v)| v))
    }

    /// Every key and value under `key` (with `prefix`) or at `key`, as the first reachable
    /// member holds them (serializable).
    fn get_local_with(&self, key: &str, prefix: bool) -> Result<Vec<KeyValue>, StoreError> {
        let mut last = None;
        for endpoint in &self.config.endpoints {
            // One attempt per member: the next member is the retry.
            let read = self.call_with(
                format!("read {key} serializably from {endpoint}"),
                false,
                || async {
                    let options = self.config.connect_options();
                    let mut client = Client::connect([endpoint], Some(options)).await?;
                    let mut get = GetOptions::new().with_serializable();
                    if prefix {
                        get = get.with_prefix();
                    }
                    client.get(key, Some(get)).await
                },
            );
            match read {
                Ok(response) => {
                    return Ok(response
                        .kvs()
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                        .collect());
                }
                Err(e) => {
                    tracing::debug!(endpoint = %endpoint, "serializable read failed: {}", hawser_attestation::error_chain(&e));
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(StoreError::NoEndpoints))
    }

    /// The VPN registry and its `mod_revision` (0: absent), read linearizably.
    fn read_vpn_registry_latest(&self) -> Result<(Option<Registry>, i64), StoreError> {
        let response = self.call(format!("read {VPN_REGISTRY_KEY}"), || {
            let mut client = self.client.clone();
            async move { client.get(VPN_REGISTRY_KEY, None).await }
        })?;
        match response.kvs().first() {
            None => Ok((None, 0)),
            Some(kv) => Ok((Some(parse_registry(kv.value())?), kv.mod_revision())),
        }
    }

    fn ak_name_of(key: &str, value: Vec<u8>) -> Result<String, StoreError> {
        match String::from_utf8(value) {
            Ok(name) if is_ak_name(&name) => Ok(name),
            _ => Err(StoreError::EtcdValue {
                key: key.to_owned(),
            }),
        }
    }
}

fn parse_registry(value: &[u8]) -> Result<Registry, StoreError> {
    serde_json::from_slice(value).map_err(|source| StoreError::VpnJson {
        location: format!("etcd key {VPN_REGISTRY_KEY}"),
        what: "registry",
        source,
    })
}

/// Whether an etcd error may go away by itself soon: a leader election, a member that went
/// away, a connection that broke.
fn is_transient(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            // Cancelled: the connection to a member that went away closed under the call.
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Aborted
                | tonic::Code::Cancelled
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

impl ClusterStore for EtcdStore {
    fn disk_binding(
        &self,
        uuid: &str,
        consistency: ReadConsistency,
    ) -> Result<Option<DiskBinding>, StoreError> {
        let key = disk_key(uuid);
        let value = match self.get_latest(&key) {
            Ok(value) => value,
            Err(e) if e.is_unavailable() && consistency == ReadConsistency::LatestOrLocal => {
                // A binding is written once and never changed: any member's copy that has it is
                // the binding. A member that has not seen it yet answers "unknown disk", which
                // the node retries.
                tracing::warn!(
                    disk_uuid = uuid,
                    endpoints = %self.endpoints(),
                    "etcd has no quorum (the linearizable read failed); reading the disk's binding serializably from a reachable member: {}",
                    hawser_attestation::error_chain(&e)
                );
                self.get_local(&key)?
            }
            Err(e) => return Err(e),
        };
        value
            .map(|v| Self::ak_name_of(&key, v).map(DiskBinding::Bound))
            .transpose()
    }

    fn bind_disk(&self, uuid: &str, ak_name: &str) -> Result<BindOutcome, StoreError> {
        let key = disk_key(uuid);
        // Create if absent, else read what is there: one round trip, atomic across every join
        // service on this etcd.
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), ak_name, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let response = self.call(format!("bind disk {uuid}"), || {
            let mut client = self.client.clone();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })?;
        if response.succeeded() {
            return Ok(BindOutcome::New);
        }
        let registered = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            })
            .ok_or_else(|| StoreError::EtcdValue { key: key.clone() })?;
        let registered = Self::ak_name_of(&key, registered)?;
        Ok(if registered == ak_name {
            BindOutcome::Same
        } else {
            BindOutcome::Another(registered)
        })
    }

    fn approves_control_plane(&self, ak_name: &str) -> Result<bool, StoreError> {
        if !is_ak_name(ak_name) {
            return Ok(false);
        }
        Ok(self.get_latest(&approval_key(ak_name))?.is_some())
    }

    fn approvals_location(&self, ak_name: &str) -> String {
        format!(
            "etcd ({}) as key {}",
            self.endpoints(),
            approval_key(ak_name)
        )
    }

    fn update_vpn_registry(
        &self,
        prefix: Ipv4Net,
        change: RegistryChange<'_>,
    ) -> Result<Registry, StoreError> {
        for _ in 0..VPN_UPDATE_ATTEMPTS {
            let (stored, revision) = self.read_vpn_registry_latest()?;
            let (registry, changed) = apply_vpn_change(stored, prefix, change)?;
            if !changed {
                return Ok(registry);
            }
            let json = serde_json::to_vec(&registry).map_err(|source| StoreError::VpnJson {
                location: format!("etcd key {VPN_REGISTRY_KEY}"),
                what: "registry",
                source,
            })?;
            // Unchanged since read (absent: still absent), or someone else wrote: read again.
            let unchanged = if revision == 0 {
                Compare::create_revision(VPN_REGISTRY_KEY, CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(VPN_REGISTRY_KEY, CompareOp::Equal, revision)
            };
            let txn =
                Txn::new()
                    .when([unchanged])
                    .and_then([TxnOp::put(VPN_REGISTRY_KEY, json, None)]);
            let response = self.call(format!("write {VPN_REGISTRY_KEY}"), || {
                let mut client = self.client.clone();
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })?;
            if response.succeeded() {
                return Ok(registry);
            }
            tracing::debug!(
                key = VPN_REGISTRY_KEY,
                "the VPN registry changed since it was read; reading it again"
            );
        }
        Err(StoreError::VpnContention {
            attempts: VPN_UPDATE_ATTEMPTS,
        })
    }

    fn vpn_registry(&self, consistency: ReadConsistency) -> Result<Option<Registry>, StoreError> {
        let value = match self.get_latest(VPN_REGISTRY_KEY) {
            Ok(value) => value,
            Err(e) if e.is_unavailable() && consistency == ReadConsistency::LatestOrLocal => {
                tracing::warn!(
                    endpoints = %self.endpoints(),
                    "etcd has no quorum (the linearizable read failed); reading the VPN registry serializably from a reachable member: {}",
                    hawser_attestation::error_chain(&e)
                );
                self.get_local(VPN_REGISTRY_KEY)?
            }
            Err(e) => return Err(e),
        };
        value.map(|v| parse_registry(&v)).transpose()
    }

    fn record_vpn_poll(&self, node_id: &str, status: &PollStatus) -> Result<(), StoreError> {
        let key = vpn_poll_key(node_id);
        let json = serde_json::to_vec(status).map_err(|source| StoreError::VpnJson {
            location: format!("etcd key {key}"),
            what: "poll",
            source,
        })?;
        self.call(format!("write {key}"), || {
            let mut client = self.client.clone();
            let (key, json) = (key.clone(), json.clone());
            async move { client.put(key, json, None).await }
        })?;
        Ok(())
    }

    fn put_record(
        &self,
        kind: RecordKind,
        name: &str,
        json: &[u8],
        mode: PutMode,
    ) -> Result<bool, StoreError> {
        let key = record_key(kind, name);
        let put = TxnOp::put(key.clone(), json.to_vec(), None);
        let txn = match mode {
            PutMode::Create => Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([put]),
            PutMode::Replace => Txn::new().and_then([put]),
        };
        let response = self.call(format!("write {key}"), || {
            let mut client = self.client.clone();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })?;
        Ok(response.succeeded())
    }

    fn records(
        &self,
        kind: RecordKind,
        consistency: ReadConsistency,
    ) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        let prefix = kind.etcd_prefix();
        let latest = self.call(format!("read {prefix}*"), || {
            let mut client = self.client.clone();
            async move {
                client
                    .get(prefix, Some(GetOptions::new().with_prefix()))
                    .await
            }
        });
        let kvs: Vec<KeyValue> = match latest {
            Ok(response) => response
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect(),
            Err(e) if e.is_unavailable() && consistency == ReadConsistency::LatestOrLocal => {
                tracing::warn!(
                    endpoints = %self.endpoints(),
                    "etcd has no quorum; reading {prefix}* serializably from a reachable member: {}",
                    hawser_attestation::error_chain(&e)
                );
                self.get_local_with(prefix, true)?
            }
            Err(e) => return Err(e),
        };
        Ok(kvs
            .into_iter()
            .filter_map(|(key, value)| {
                let key = String::from_utf8(key).ok()?;
                Some((key.strip_prefix(prefix)?.to_owned(), value))
            })
            .collect())
    }

    fn vpn_polls(&self) -> Result<BTreeMap<String, PollStatus>, StoreError> {
        let response = self.call(format!("read {VPN_POLLS_PREFIX}*"), || {
            let mut client = self.client.clone();
            async move {
                client
                    .get(VPN_POLLS_PREFIX, Some(GetOptions::new().with_prefix()))
                    .await
            }
        })?;
        let mut polls = BTreeMap::new();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some(node_id) = key.strip_prefix(VPN_POLLS_PREFIX) else {
                continue;
            };
            let status =
                serde_json::from_slice(kv.value()).map_err(|source| StoreError::VpnJson {
                    location: format!("etcd key {key}"),
                    what: "poll",
                    source,
                })?;
            polls.insert(node_id.to_owned(), status);
        }
        Ok(polls)
    }
}
