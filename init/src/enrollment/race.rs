//! The race for the node lock: the join client and the init server, whichever gets the
//! cluster's secrets first.
//!
//! [`Enrollment`] is the state disk's key source in the product
//! (`hawser.state_disk_key_source=join-service`). [`Enrollment::race`] (async) starts the init
//! server (for `hawser init` on a new disk, `hawser recover` on an initialized one) and, when a
//! join endpoint is configured, the join client, and returns the first of them to get secrets as
//! a [`KeyGrant`]:
//!
//! - the join service answered → its key, the cluster ID from its measurement secret and salt;
//! - the admin's request was valid → the key derived from the master secret for this disk's
//!   UUID (exactly what a join service of that cluster would derive), the cluster ID from the
//!   master secret's measurement secret and the admin's salt.
//!
//! The loser is cancelled (the join client) or refuses every later request (the init server,
//! which keeps serving the winning admin's call until boot reports its outcome). The grant
//! carries the key by value; the boot checks it against the disk's LUKS2 digest first, and
//! only then does [`KeyGrant::take_lock`] take the [`NodeLock`] (PCR 15 ← cluster ID): a key
//! that does not open the disk never marks the node as belonging to a cluster.

use std::sync::Arc;

use hawser_attestation::TpmIssuer;
use hawser_attestation::report::JoinReport;
use hawser_attestation::tpm::Tpm;
use tokio::sync::oneshot;
use tracing::{info, warn};
use zeroize::Zeroizing;

use super::client::{JoinClient, KubeadmTicket, Secrets, describe};
use super::init_server::{self, GrantKind, InitServer, Progress};
use super::lock::{LockError, MarkError, NodeLock, Owner, PCR_CLUSTER_ID, cluster_lock_pcr};
use crate::disk::key::{DiskStatus, KeyError, VolumeKey};
use crate::platform::error_chain;

/// What the race and the lock decided.
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

/// Why the race gave no key, or the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum EnrollmentError {
    /// No join endpoint is configured and the init server could not start.
    #[error("the join service gave no key: neither a join endpoint nor a working init server")]
    NoContestant,
    /// The init server ended (its task failed) before any admin request was granted.
    #[error("the join service gave no key: the init server stopped")]
    InitServerStopped,
    /// The disk's LUKS2 UUID is not in the canonical form keys are derived for.
    #[error("the join service gave no key: the disk's LUKS2 UUID {uuid:?} is not canonical")]
    Uuid {
        uuid: String,
        #[source]
        source: hawser_keys::KeyError,
    },
    /// The admin's master secret cannot give a key of the configured length.
    #[error("the join service gave no key: cannot derive the state disk key")]
    DeriveKey(#[source] hawser_keys::KeyError),
    /// The winner's key has the wrong length for the configured integrity mode.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The node lock is held already, or the TPM refused the PCR 15 extension.
    #[error("the join service gave no key: cannot take the node lock")]
    Lock(#[source] LockError<MarkError>),
}

/// The winner of the race, before the lock.
enum Winner {
    Join(Secrets, u32),
    Admin(init_server::Grant),
}

/// What the race won: the key (by value) and who gave it, before the node lock.
#[derive(Debug)]
pub struct KeyGrant {
    key: VolumeKey,
    luks_uuid: String,
    cluster_id: [u8; 32],
    owner: Owner,
    rpc: &'static str,
    attempts: u32,
    admin: Option<(GrantKind, Progress)>,
    kubeadm: Option<KubeadmTicket>,
    secrets: Option<ClusterSecrets>,
}

impl KeyGrant {
    /// The state disk key (a copy: the grant keeps its own until it is dropped).
    pub fn key(&self) -> VolumeKey {
        self.key.clone()
    }

    /// Ends the winning admin's call (if an admin won) with `reason`; the grant is spent.
    pub fn fail(self, reason: &str) {
        if let Some((_, progress)) = self.admin {
            progress.fail(reason);
        }
    }

    /// The point of no return: takes the node lock (PCR 15 ← cluster ID) for the winner.
    /// Blocking (the TPM). Call only after the key was checked against the disk.
    pub fn take_lock(self, lock: &NodeLock, tpm: &Tpm) -> Result<Outcome, EnrollmentError> {
        let locked = lock.lock(self.owner, self.cluster_id, |id| {
            super::lock::mark_tpm(tpm, id)
        });
        if let Err(e) = locked {
            let e = EnrollmentError::Lock(e);
            if let Some((_, progress)) = self.admin {
                progress.fail(&error_chain(&e));
            }
            return Err(e);
        }
        let summary = JoinReport {
            disk_uuid: self.luks_uuid,
            rpc: self.rpc.to_owned(),
            via: if self.admin.is_some() {
                "admin"
            } else {
                "join-service"
            }
            .to_owned(),
            attempts: self.attempts,
            key_fingerprint: hawser_keys::fingerprint(self.key.as_bytes()),
            cluster_id: hex::encode(self.cluster_id),
            pcr15: hex::encode(cluster_lock_pcr(&self.cluster_id)),
        };
        info!(
            "node lock taken by {} ({}, {} attempt(s)): cluster {}, PCR {PCR_CLUSTER_ID} \
             extended; state disk key fingerprint {}",
            self.owner, self.rpc, self.attempts, summary.cluster_id, summary.key_fingerprint
        );
        Ok(Outcome {
            summary,
            cluster_id: self.cluster_id,
            admin: self.admin,
            kubeadm: self.kubeadm,
            secrets: self.secrets,
        })
    }
}

/// The product's key source: the join client and the init server, and the node lock they
/// race for.
pub struct Enrollment {
    join: Option<JoinClient>,
    init_port: u16,
    issuer: Arc<TpmIssuer>,
    lock: Arc<NodeLock>,
}

impl Enrollment {
    /// `join` is `None` when no join endpoint is configured: then only `hawser init` or
    /// `hawser recover` can give the node its key.
    pub fn new(join: Option<JoinClient>, init_port: u16, issuer: Arc<TpmIssuer>) -> Self {
        Enrollment {
            join,
            init_port,
            issuer,
            lock: Arc::new(NodeLock::new()),
        }
    }

    /// The cluster the state disk records: the join client refuses (and asks past) a join
    /// service of another cluster, before the lock ([`JoinClient::disk_cluster`]).
    pub fn disk_cluster(mut self, cluster_id: Option<[u8; 32]>) -> Self {
        self.join = self.join.map(|join| join.disk_cluster(cluster_id));
        self
    }

    /// The node lock the init server watches and [`KeyGrant::take_lock`] takes.
    pub fn node_lock(&self) -> Arc<NodeLock> {
        Arc::clone(&self.lock)
    }

    /// Races the join client against the init server for the key of the disk with this LUKS2
    /// UUID (`len` bytes); returns the winner's grant, before the node lock.
    pub async fn race(
        &self,
        luks_uuid: &str,
        len: usize,
        status: DiskStatus,
    ) -> Result<KeyGrant, EnrollmentError> {
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
        match self.first_with_secrets(luks_uuid, status).await? {
            Winner::Join(secrets, attempts) => {
                let cluster_id =
                    hawser_keys::cluster_id(&secrets.measurement_secret, &secrets.measurement_salt);
                check_length(&secrets.state_disk_key, len)?;
                Ok(KeyGrant {
                    key: VolumeKey::new(Zeroizing::new(secrets.state_disk_key.to_vec())),
                    luks_uuid: luks_uuid.to_owned(),
                    cluster_id,
                    owner: Owner::JoinClient,
                    rpc: describe(status),
                    attempts,
                    admin: None,
                    kubeadm: secrets.ticket,
                    secrets: None,
                })
            }
            Winner::Admin(grant) => {
                let derived = hawser_keys::canonical_uuid(luks_uuid)
                    .map_err(|source| EnrollmentError::Uuid {
                        uuid: luks_uuid.to_owned(),
                        source,
                    })
                    .and_then(|uuid| {
                        grant
                            .master
                            .data_key(&uuid, len)
                            .map_err(EnrollmentError::DeriveKey)
                    })
                    .and_then(|key| Ok(check_length(&key, len).map(|()| key)?));
                let key = match derived {
                    Ok(key) => key,
                    Err(e) => {
                        grant.progress.fail(&error_chain(&e));
                        return Err(e);
                    }
                };
                let cluster_id = hawser_keys::cluster_id(
                    grant.master.measurement_secret().as_slice(),
                    &grant.measurement_salt,
                );
                Ok(KeyGrant {
                    key: VolumeKey::new(Zeroizing::new(key.to_vec())),
                    luks_uuid: luks_uuid.to_owned(),
                    cluster_id,
                    owner: Owner::InitServer,
                    rpc: grant.kind.rpc(),
                    attempts: 1,
                    admin: Some((grant.kind, grant.progress)),
                    kubeadm: None,
                    secrets: Some(ClusterSecrets {
                        master: grant.master,
                        measurement_salt: grant.measurement_salt,
                    }),
                })
            }
        }
    }

    /// Runs both contestants; returns the first to get secrets.
    async fn first_with_secrets(
        &self,
        luks_uuid: &str,
        status: DiskStatus,
    ) -> Result<Winner, EnrollmentError> {
        let (grant_sender, grant) = oneshot::channel();
        let server = InitServer::new(status, Arc::clone(&self.lock), grant_sender);
        let server_task =
            match init_server::spawn(server, self.init_port, Arc::clone(&self.issuer)).await {
                Ok(task) => Some(task),
                Err(e) => {
                    warn!(
                        "no `hawser init`/`hawser recover` for this node: {}",
                        error_chain(&e)
                    );
                    None
                }
            };
        let winner = match (&self.join, server_task.is_some()) {
            (None, false) => Err(EnrollmentError::NoContestant),
            (Some(client), false) => {
                let (secrets, attempts) = client.fetch(luks_uuid, status).await;
                Ok(Winner::Join(secrets, attempts))
            }
            (None, true) => grant
                .await
                .map(Winner::Admin)
                .map_err(|_| EnrollmentError::InitServerStopped),
            (Some(client), true) => {
                tokio::select! {
                    (secrets, attempts) = client.fetch(luks_uuid, status) => {
                        Ok(Winner::Join(secrets, attempts))
                    }
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
        winner
    }
}

/// The join service's (or the admin's) key must fit the configured integrity mode.
fn check_length(key: &[u8], len: usize) -> Result<(), KeyError> {
    if key.len() == len {
        return Ok(());
    }
    Err(KeyError::Length {
        source_name: "the join service",
        found: key.len(),
        expected: len,
        mode: "as configured by hawser.state_disk_integrity",
    })
}

/// The CLI command that can give a disk in `status` its key.
fn admin_verb(status: DiskStatus) -> &'static str {
    match status {
        DiskStatus::New => "init",
        DiskStatus::Initialized => "recover",
    }
}
