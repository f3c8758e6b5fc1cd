//! The race for the node lock: the join client and the init server, whichever gets the
//! cluster's secrets first.
//!
//! [`ClusterKeySource`] is the state disk's key source in the product
//! (`hawser.state_disk_key_source=join-service`). Asked for the key of a disk, it starts the
//! init server (for `hawser init` on a new disk, `hawser recover` on an initialized one) and,
//! when a join endpoint is configured, the join client, and waits for the first of them:
//!
//! - the join service answered → its key, the cluster ID from its measurement secret and salt;
//! - the admin's request was valid → the key derived from the master secret for this disk's
//!   UUID (exactly what a join service of that cluster would derive), the cluster ID from the
//!   master secret's measurement secret and the admin's salt.
//!
//! The winner takes the [`NodeLock`] (PCR 15 ← cluster ID) before the key is handed to the disk
//! code; the loser is cancelled (the join client) or refuses every later request (the init
//! server, which keeps serving the winning admin's call until boot reports its outcome).

use std::sync::{Arc, Mutex};

use hawser_attestation::TpmIssuer;
use hawser_attestation::report::JoinReport;
use hawser_attestation::tpm::Tpm;
use tokio::sync::oneshot;
use tracing::{info, warn};
use zeroize::Zeroizing;

use super::client::{JoinClient, KubeadmTicket, Secrets, describe};
use super::init_server::{self, GrantKind, InitServer, Progress};
use super::lock::{NodeLock, Owner, PCR_CLUSTER_ID, cluster_lock_pcr};
use crate::disk::key::{DiskStatus, KeyError, KeySource, VolumeKey};
use crate::platform::error_chain;

/// What the race decided.
#[derive(Debug)]
pub struct Outcome {
    pub summary: JoinReport,
    pub cluster_id: [u8; 32],
    /// The admin's open call, when the init server won: boot reports the result through it.
    pub admin: Option<(GrantKind, Progress)>,
    /// The join ticket's Kubernetes half, when the join service answered `IssueJoinTicket`.
    pub kubeadm: Option<KubeadmTicket>,
    /// The cluster's secrets, when the admin sent them (`hawser init`/`recover`): the first
    /// control-plane node runs the cluster's join service with them.
    pub secrets: Option<ClusterSecrets>,
}

/// The master secret and measurement salt the admin sent (redacted in Debug).
pub struct ClusterSecrets {
    pub master: hawser_keys::MasterSecret,
    pub measurement_salt: Vec<u8>,
}

impl std::fmt::Debug for ClusterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecrets(<redacted>)")
    }
}

/// The winner of the race, before the lock.
enum Winner {
    Join(Secrets, u32),
    Admin(init_server::Grant),
}

/// The product's key source: the race between the join client and the init server.
pub struct ClusterKeySource {
    join: Option<JoinClient>,
    init_port: u16,
    issuer: Arc<TpmIssuer>,
    runtime: tokio::runtime::Handle,
    lock: Arc<NodeLock>,
    tpm: Arc<Tpm>,
    outcome: Mutex<Option<Outcome>>,
}

impl ClusterKeySource {
    /// `join` is `None` when no join endpoint is configured: then only `hawser init` or
    /// `hawser recover` can give the node its key.
    pub fn new(
        join: Option<JoinClient>,
        init_port: u16,
        issuer: Arc<TpmIssuer>,
        runtime: tokio::runtime::Handle,
        tpm: Arc<Tpm>,
    ) -> Self {
        ClusterKeySource {
            join,
            init_port,
            issuer,
            runtime,
            lock: Arc::new(NodeLock::new()),
            tpm,
            outcome: Mutex::new(None),
        }
    }

    /// What the race decided, once the key was handed out (taken: the admin's call is moved out).
    pub fn take_outcome(&self) -> Option<Outcome> {
        self.outcome
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    /// Runs both contestants on the runtime; returns the first to get secrets.
    fn race(&self, luks_uuid: &str, status: DiskStatus) -> Result<Winner, KeyError> {
        let (grant_sender, grant) = oneshot::channel();
        let server = InitServer::new(status, Arc::clone(&self.lock), grant_sender);
        let (port, issuer, join) = (self.init_port, Arc::clone(&self.issuer), self.join.clone());
        let uuid = luks_uuid.to_owned();
        let (sender, receiver) = oneshot::channel();
        self.runtime.spawn(async move {
            let server_task = match init_server::spawn(server, port, issuer).await {
                Ok(task) => Some(task),
                Err(e) => {
                    warn!("no `hawser init`/`hawser recover` for this node: {}", error_chain(&e));
                    None
                }
            };
            let winner = match (join, server_task.is_some()) {
                (None, false) => Err("neither a join endpoint nor a working init server".to_owned()),
                (Some(client), false) => {
                    let (secrets, attempts) = client.fetch(&uuid, status).await;
                    Ok(Winner::Join(secrets, attempts))
                }
                (None, true) => grant
                    .await
                    .map(Winner::Admin)
                    .map_err(|_| "the init server stopped".to_owned()),
                (Some(client), true) => {
                    tokio::select! {
                        (secrets, attempts) = client.fetch(&uuid, status) => Ok(Winner::Join(secrets, attempts)),
                        Ok(grant) = grant => Ok(Winner::Admin(grant)),
                    }
                }
            };
            if matches!(winner, Ok(Winner::Join(..))) {
                // Nobody is waiting on the init server: it only refuses from now on. Stop it.
                if let Some(task) = server_task {
                    task.abort();
                }
            }
            let _ = sender.send(winner);
        });
        receiver
            .blocking_recv()
            .map_err(|_| "the race task ended without a winner".to_owned())
            .and_then(|winner| winner)
            .map_err(|reason| KeyError::JoinService { reason })
    }
}

impl KeySource for ClusterKeySource {
    fn volume_key(
        &self,
        luks_uuid: &str,
        len: usize,
        status: DiskStatus,
    ) -> Result<VolumeKey, KeyError> {
        let failed = |reason: String| KeyError::JoinService { reason };
        match &self.join {
            Some(client) => info!(
                "asking the join service at {} for the key of disk {luks_uuid} ({}), and \
                 accepting `hawser {}` on port {}",
                client.endpoint,
                describe(status),
                admin_verb(status),
                self.init_port
            ),
            None => info!(
                "no join endpoint configured: waiting for `hawser {}` on port {} to get the key \
                 of disk {luks_uuid}",
                admin_verb(status),
                self.init_port
            ),
        }
        let mut kubeadm = None;
        let mut cluster_secrets = None;
        let (key, cluster_id, owner, rpc, attempts, admin) = match self.race(luks_uuid, status)? {
            Winner::Join(secrets, attempts) => {
                let cluster_id =
                    hawser_keys::cluster_id(&secrets.measurement_secret, &secrets.measurement_salt);
                kubeadm = secrets.ticket;
                (
                    secrets.state_disk_key,
                    cluster_id,
                    Owner::JoinClient,
                    describe(status),
                    attempts,
                    None,
                )
            }
            Winner::Admin(grant) => {
                let uuid =
                    hawser_keys::canonical_uuid(luks_uuid).map_err(|e| failed(e.to_string()))?;
                let key = match grant.master.data_key(&uuid, len) {
                    Ok(key) => key,
                    Err(e) => {
                        let reason = format!("cannot derive the state disk key: {e}");
                        grant.progress.fail(&reason);
                        return Err(failed(reason));
                    }
                };
                let cluster_id = hawser_keys::cluster_id(
                    grant.master.measurement_secret().as_slice(),
                    &grant.measurement_salt,
                );
                let rpc = grant.kind.rpc();
                cluster_secrets = Some(ClusterSecrets {
                    master: grant.master,
                    measurement_salt: grant.measurement_salt,
                });
                (
                    key,
                    cluster_id,
                    Owner::InitServer,
                    rpc,
                    1,
                    Some((grant.kind, grant.progress)),
                )
            }
        };
        if key.len() != len {
            return Err(KeyError::Length {
                source_name: "the join service",
                found: key.len(),
                expected: len,
                mode: "as configured by hawser.state_disk_integrity",
            });
        }
        // The point of no return: the node belongs to this cluster from here on.
        if let Err(e) = self.lock.lock(owner, cluster_id, |id| {
            self.tpm.extend_sha256_digest(PCR_CLUSTER_ID, id)
        }) {
            let reason = error_chain(&e);
            if let Some((_, progress)) = admin {
                progress.fail(&reason);
            }
            return Err(failed(reason));
        }
        let summary = JoinReport {
            disk_uuid: luks_uuid.to_owned(),
            rpc: rpc.to_owned(),
            via: if admin.is_some() {
                "admin"
            } else {
                "join-service"
            }
            .to_owned(),
            attempts,
            key_fingerprint: hawser_keys::fingerprint(&key),
            cluster_id: hex::encode(cluster_id),
            pcr15: hex::encode(cluster_lock_pcr(&cluster_id)),
        };
        info!(
            "node lock taken by {owner} ({rpc}, {attempts} attempt(s)): cluster {}, PCR \
             {PCR_CLUSTER_ID} extended; state disk key fingerprint {}",
            summary.cluster_id, summary.key_fingerprint
        );
        *self
            .outcome
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Outcome {
            summary,
            cluster_id,
            admin,
            kubeadm,
            secrets: cluster_secrets,
        });
        Ok(VolumeKey::new(Zeroizing::new(key.to_vec())))
    }
}

/// The CLI command that can give a disk in `status` its key.
fn admin_verb(status: DiskStatus) -> &'static str {
    match status {
        DiskStatus::New => "init",
        DiskStatus::Initialized => "recover",
    }
}
