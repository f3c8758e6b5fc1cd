//! The race for the node lock: the join client and the init server, whichever gets the
//! cluster's secrets first.
//!
//! [`Enrollment`] is the state disk's key source in the product
//! (`hawser.state_disk_key_source=join-service`). [`Enrollment::race`] (async) starts the init
//! server (for `hawser init` on a new disk, `hawser recover` on an initialized one; only when the
//! platform gave an init secret hash) and, when a join endpoint is configured, the join client,
//! and returns the first of them to get secrets as a [`Won`]: the state disk's [`KeyGrant`]
//! apart from the node's [`Membership`] (the kubeadm ticket or the admin's call, the mesh
//! grant, the cluster's secrets), which only the phases after the disk use:
//!
//! - the join service answered → its key, the cluster ID from its measurement secret and salt;
//! - the admin's request was valid → the key derived from the master secret for this disk's
//!   UUID (exactly what a join service of that cluster would derive), the cluster ID from the
//!   master secret's measurement secret and the admin's salt.
//!
//! The loser is cancelled (the join client) or stops listening (the init server, which keeps
//! serving the winning admin's call until boot reports its outcome). The grant carries the key
//! by value; the boot checks it against the disk's LUKS2 digest first, and only then does
//! [`KeyGrant::take_lock`] take the [`NodeLock`] (PCR 15 ← cluster ID): a key that does not
//! open the disk never marks the node as belonging to a cluster. An admin's grant refused that
//! way (the admin told through [`Membership::fail`]) leaves the init server serving: the boot
//! races again.

use std::sync::Arc;

use hawser_attestation::TpmIssuer;
use hawser_attestation::report::JoinReport;
use hawser_attestation::tpm::Tpm;
use tokio::sync::{Notify, mpsc};
use tracing::{info, warn};
use zeroize::Zeroizing;

use hawser_kube_types::JoinTicket;

use super::client::{JoinClient, Secrets, describe};
use super::init_secret::InitSecretHash;
use super::init_server::{self, Grant, GrantKind, InitServer, Progress};
use super::lock::{LockError, MarkError, NodeLock, Owner, PCR_CLUSTER_ID, cluster_lock_pcr};
use crate::disk::key::{DiskStatus, KeyError, VolumeKey};
use crate::platform::error_chain;

/// What the race won, as two values with two purposes: the state disk key, which the state
/// disk phase consumes (checked against the disk, then the node lock, then the disk), and the
/// node's membership, which goes on to the phases after the disk. The disk never sees the
/// membership; the membership never carries the key.
#[derive(Debug)]
pub struct Won {
    pub key: KeyGrant,
    pub membership: Membership,
}

/// What the winner granted besides the key: the node's place in the cluster, for the phases
/// after the disk (and the one-time grants a new disk keeps before its "initialized" mark).
#[derive(Debug)]
pub struct Membership {
    /// The admin's open call, when the init server won: boot reports the result through it.
    pub admin: Option<(GrantKind, Progress)>,
    /// The join ticket's Kubernetes half, when the join service answered `IssueJoinTicket`.
    pub kubeadm: Option<JoinTicket>,
    /// The cluster's secrets, when the admin sent them (`hawser init`/`recover`) or a
    /// control plane's join brought them: the control plane runs the cluster's join service
    /// with them.
    pub secrets: Option<ClusterSecrets>,
    /// The node's place in the WireGuard mesh, when the join service gave one.
    pub mesh: Option<crate::mesh::MeshGrant>,
}

impl Membership {
    /// Ends the winning admin's call (if an admin won) with `reason`; the membership is spent.
    pub fn fail(self, reason: &str) {
        if let Some((_, progress)) = self.admin {
            progress.fail(reason);
        }
    }
}

/// The node lock, taken: the join summary and the cluster the node now belongs to.
#[derive(Debug)]
pub struct Locked {
    pub summary: JoinReport,
    pub cluster_id: [u8; 32],
}

/// What the state disk phase hands the phases after it: the lock it took and the membership
/// it carried past the disk untouched.
#[derive(Debug)]
pub struct Outcome {
    pub locked: Locked,
    pub membership: Membership,
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
    /// No join endpoint is configured, and the init server could not start or has no init
    /// secret hash to check requests against.
    #[error(
        "the join service gave no key: neither a join endpoint nor an init server (an init \
         server needs an init secret hash on the measured command line: \
         hawser.init_secret_hash)"
    )]
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

/// What the race won for the state disk: the key (by value), who gave it and the cluster it
/// locks the node to, before the node lock. Nothing of the membership rides along.
#[derive(Debug)]
pub struct KeyGrant {
    key: VolumeKey,
    luks_uuid: String,
    cluster_id: [u8; 32],
    owner: Owner,
    rpc: &'static str,
    attempts: u32,
}

impl KeyGrant {
    /// The state disk key (a copy: the grant keeps its own until it is dropped).
    pub fn key(&self) -> VolumeKey {
        self.key.clone()
    }

    /// The RPC that gave the key (`Init`, `Recover`, or the join service's).
    pub fn rpc(&self) -> &'static str {
        self.rpc
    }

    /// Whether the admin's `hawser init`/`recover` gave this grant (rather than the join
    /// service).
    pub fn from_admin(&self) -> bool {
        self.owner == Owner::InitServer
    }

    /// The point of no return: takes the node lock (PCR 15 ← cluster ID) for the winner.
    /// Blocking (the TPM). Call only after the key was checked against the disk; when it
    /// fails, the caller tells the winning admin ([`Membership::fail`]).
    pub fn take_lock(self, lock: &NodeLock, tpm: &Tpm) -> Result<Locked, EnrollmentError> {
        lock.lock(self.owner, self.cluster_id, |id| {
            super::lock::mark_tpm(tpm, id)
        })
        .map_err(EnrollmentError::Lock)?;
        let via = if self.from_admin() {
            "admin"
        } else {
            "join-service"
        };
        let summary = JoinReport {
            disk_uuid: self.luks_uuid,
            rpc: self.rpc.to_owned(),
            via: via.to_owned(),
            attempts: self.attempts,
            key_fingerprint: hawser_keys::fingerprint(self.key.as_bytes()),
            key_bytes: self.key.as_bytes().len(),
            cluster_id: hex::encode(self.cluster_id),
            pcr15: hex::encode(cluster_lock_pcr(&self.cluster_id)),
        };
        info!(
            "node lock taken by {} ({}, {} attempt(s)): cluster {}, PCR {PCR_CLUSTER_ID} \
             extended; state disk key fingerprint {}",
            self.owner, self.rpc, self.attempts, summary.cluster_id, summary.key_fingerprint
        );
        Ok(Locked {
            summary,
            cluster_id: self.cluster_id,
        })
    }
}

/// The product's key source: the join client and the init server, and the node lock they
/// race for.
pub struct Enrollment {
    join: Option<JoinClient>,
    init_port: u16,
    /// `None`: the platform gave no init secret hash, so no init server runs.
    init_secret_hash: Option<InitSecretHash>,
    issuer: Arc<TpmIssuer>,
    lock: Arc<NodeLock>,
    /// The init server, once started (it outlives a refused grant).
    init_server: Option<RunningInitServer>,
    /// The image's Kubernetes version, for the init server's checks.
    image_kubernetes: Option<hawser_kube_types::KubernetesVersion>,
}

/// A listening init server: where its grants arrive and how to stop it.
struct RunningInitServer {
    grants: mpsc::Receiver<Grant>,
    stop: Arc<Notify>,
}

impl Enrollment {
    /// `join` is `None` when no join endpoint is configured: then only `hawser init` or
    /// `hawser recover` can give the node its key, and only with an `init_secret_hash`.
    pub fn new(
        join: Option<JoinClient>,
        init_port: u16,
        init_secret_hash: Option<InitSecretHash>,
        issuer: Arc<TpmIssuer>,
    ) -> Self {
        Enrollment {
            join,
            init_port,
            init_secret_hash,
            issuer,
            lock: Arc::new(NodeLock::new()),
            init_server: None,
            image_kubernetes: None,
        }
    }

    /// The image's Kubernetes version (`hawser.kubernetes`): the init server installs it when
    /// `hawser init` names none, and refuses any other ([`InitServer::image_kubernetes`]).
    pub fn image_kubernetes(
        mut self,
        version: Option<hawser_kube_types::KubernetesVersion>,
    ) -> Self {
        self.image_kubernetes = version;
        self
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
    /// UUID (`len` bytes); returns the winner's key grant, before the node lock, apart from
    /// the membership it brought.
    pub async fn race(
        &mut self,
        luks_uuid: &str,
        len: usize,
        status: DiskStatus,
    ) -> Result<Won, EnrollmentError> {
        match (&self.join, self.init_secret_hash.is_some()) {
            (Some(client), true) => info!(
                "asking the join service at {} for the key of disk {luks_uuid} ({}), and \
                 accepting `hawser {}` with the init secret on port {}",
                client.endpoints,
                describe(status),
                admin_verb(status),
                self.init_port
            ),
            (Some(client), false) => info!(
                "asking the join service at {} for the key of disk {luks_uuid} ({}); no init \
                 secret hash configured, so no init server",
                client.endpoints,
                describe(status),
            ),
            (None, _) => info!(
                "no join endpoint configured: waiting for `hawser {}` on port {} to get the key \
                 of disk {luks_uuid}",
                admin_verb(status),
                self.init_port
            ),
        }
        match self.first_with_secrets(luks_uuid, len, status).await? {
            Winner::Join(secrets, attempts) => {
                let cluster_id =
                    hawser_keys::cluster_id(&secrets.measurement_secret, &secrets.measurement_salt);
                check_length(&secrets.state_disk_key, len)?;
                Ok(Won {
                    key: KeyGrant {
                        key: VolumeKey::new(Zeroizing::new(secrets.state_disk_key.to_vec())),
                        luks_uuid: luks_uuid.to_owned(),
                        cluster_id,
                        owner: Owner::JoinClient,
                        rpc: describe(status),
                        attempts,
                    },
                    membership: Membership {
                        admin: None,
                        // A control plane's join brings the master secret: it runs the
                        // cluster's join service too (the measurement salt is the cluster's).
                        secrets: secrets.master_secret.map(|master| ClusterSecrets {
                            master,
                            measurement_salt: secrets.measurement_salt.clone(),
                        }),
                        kubeadm: secrets.ticket,
                        mesh: secrets.mesh,
                    },
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
                Ok(Won {
                    key: KeyGrant {
                        key: VolumeKey::new(Zeroizing::new(key.to_vec())),
                        luks_uuid: luks_uuid.to_owned(),
                        cluster_id,
                        owner: Owner::InitServer,
                        rpc: grant.kind.rpc(),
                        attempts: 1,
                    },
                    membership: Membership {
                        admin: Some((grant.kind, grant.progress)),
                        kubeadm: None,
                        mesh: None,
                        secrets: Some(ClusterSecrets {
                            master: grant.master,
                            measurement_salt: grant.measurement_salt,
                        }),
                    },
                })
            }
        }
    }

    /// Starts the init server once, if an init secret hash is configured.
    async fn start_init_server(&mut self, status: DiskStatus) {
        let Some(secret_hash) = self.init_secret_hash else {
            return;
        };
        if self.init_server.is_some() {
            return;
        }
        // One grant at a time: the server refuses others while one is being decided.
        let (grant_sender, grants) = mpsc::channel(1);
        let stop = Arc::new(Notify::new());
        let server = InitServer::new(
            status,
            Arc::clone(&self.lock),
            secret_hash,
            grant_sender,
            Arc::clone(&stop),
        )
        .image_kubernetes(self.image_kubernetes.clone());
        let spawned = init_server::spawn(
            server,
            self.init_port,
            Arc::clone(&self.issuer),
            Arc::clone(&stop),
        )
        .await;
        match spawned {
            Ok(_task) => self.init_server = Some(RunningInitServer { grants, stop }),
            Err(e) => warn!(
                "no `hawser init`/`hawser recover` for this node: {}",
                error_chain(&e)
            ),
        }
    }

    /// Stops the init server from listening (open calls may finish): the join service won.
    fn stop_init_server(&mut self) {
        if let Some(server) = self.init_server.take() {
            server.stop.notify_one();
        }
    }

    /// Runs both contestants; returns the first to get secrets.
    async fn first_with_secrets(
        &mut self,
        luks_uuid: &str,
        len: usize,
        status: DiskStatus,
    ) -> Result<Winner, EnrollmentError> {
        self.start_init_server(status).await;
        let grants = self.init_server.as_mut().map(|server| &mut server.grants);
        let winner = match (&self.join, grants) {
            (None, None) => Err(EnrollmentError::NoContestant),
            (Some(client), None) => {
                let (secrets, attempts) = client.fetch(luks_uuid, len, status).await;
                Ok(Winner::Join(secrets, attempts))
            }
            (None, Some(grants)) => grants
                .recv()
                .await
                .map(Winner::Admin)
                .ok_or(EnrollmentError::InitServerStopped),
            (Some(client), Some(grants)) => {
                tokio::select! {
                    (secrets, attempts) = client.fetch(luks_uuid, len, status) => {
                        Ok(Winner::Join(secrets, attempts))
                    }
                    Some(grant) = grants.recv() => Ok(Winner::Admin(grant)),
                }
            }
        };
        if matches!(winner, Ok(Winner::Join(..))) {
            // Nobody is waiting on the init server: it only refuses from now on. Stop it.
            self.stop_init_server();
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
