//! The join client: asks the join service for the state-disk key over aTLS, retrying with
//! backoff until it gets an answer, then takes the node lock.
//!
//! A fresh disk (about to be formatted) asks `IssueJoinTicket`; an initialized disk asks
//! `IssueRejoinTicket`. Every failed attempt is logged with its reason — the join service's
//! refusal names the PCRs that differ — and retried after [`Backoff`]: a join service that is
//! down at boot and up later is normal (the first node of a cluster boots before its join
//! service exists). The key, measurement secret and salt are zeroized; only the key's
//! fingerprint and the public cluster ID are ever logged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy};
use hawser_attestation::tpm::Tpm;
use hawser_attestation::{IssuerError, TpmIssuer};
use hawser_proto::join::join_service_client::JoinServiceClient;
use hawser_proto::join::{IssueJoinTicketRequest, IssueRejoinTicketRequest};
use serde::Serialize;
use tracing::{info, warn};
use zeroize::Zeroizing;

use super::lock::{NodeLock, Owner, PCR_CLUSTER_ID};
use super::{Backoff, INSECURE_TRUST_WARNING, JoinEndpoint, JoinServiceTrust, jitter_unit};
use crate::disk::key::{DiskStatus, KeyError, KeySource, VolumeKey};
use crate::fatal::error_chain;

/// Deadline of one attempt (connect, handshake with quotes on both sides, call).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// The console line marker of the join summary (one JSON object follows).
pub const JOIN_REPORT_MARKER: &str = "HAWSER_JOIN_REPORT ";

/// Why the join client cannot start.
#[derive(Debug, thiserror::Error)]
pub enum JoinSetupError {
    #[error(
        "hawser.join_service_trust=attested needs the join service's provider CA and expected \
         measurements, which this image does not configure yet (no hawser.join_service_ca); \
         use hawser.join_service_trust=insecure-dev for development"
    )]
    AttestedTrustUnconfigured,
    #[error(
        "hawser.state_disk_key_source=join-service needs a join endpoint: hawser.join_endpoint= \
         on the command line or fw_cfg opt/hawser/join_endpoint"
    )]
    NoEndpoint,
    #[error("cannot attest to the join service: the TPM issuer cannot start")]
    Issuer(#[source] IssuerError),
}

/// What the join service sent, secrets zeroized on drop.
pub struct Secrets {
    pub state_disk_key: Zeroizing<Vec<u8>>,
    pub measurement_secret: Zeroizing<Vec<u8>>,
    pub measurement_salt: Vec<u8>,
}

/// Whether this disk is new (join) or initialized (rejoin).
fn describe(status: DiskStatus) -> &'static str {
    match status {
        DiskStatus::New => "IssueJoinTicket",
        DiskStatus::Initialized => "IssueRejoinTicket",
    }
}

/// The gRPC join client.
#[derive(Debug, Clone)]
pub struct JoinClient {
    endpoint: JoinEndpoint,
    atls: AtlsClient,
    backoff: Backoff,
}

impl JoinClient {
    /// A client that attests with the node's TPM and trusts the join service per `trust`.
    /// Blocking (the issuer reads the AK certificate from the TPM).
    pub fn new(
        endpoint: JoinEndpoint,
        trust: JoinServiceTrust,
        tpm: Arc<Tpm>,
    ) -> Result<Self, JoinSetupError> {
        let policy = match trust {
            JoinServiceTrust::InsecureDev => {
                warn!("{INSECURE_TRUST_WARNING}");
                PeerPolicy::Unauthenticated
            }
            JoinServiceTrust::Attested => return Err(JoinSetupError::AttestedTrustUnconfigured),
        };
        let issuer = TpmIssuer::new(tpm).map_err(JoinSetupError::Issuer)?;
        let atls = AtlsClient::new(Identity::attested(Arc::new(issuer)), policy)
            .handshake_timeout(ATTEMPT_TIMEOUT);
        Ok(JoinClient {
            endpoint,
            atls,
            backoff: Backoff::default(),
        })
    }

    /// Asks until the join service answers. Returns the secrets and the number of attempts.
    pub async fn fetch(&self, disk_uuid: &str, status: DiskStatus) -> (Secrets, u32) {
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let result =
                tokio::time::timeout(ATTEMPT_TIMEOUT, self.attempt(disk_uuid, status)).await;
            let reason = match result {
                Ok(Ok(secrets)) => return (secrets, attempt),
                Ok(Err(reason)) => reason,
                Err(_) => format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs()),
            };
            let delay = self.backoff.delay(attempt.saturating_sub(1), jitter_unit());
            warn!(
                "join attempt {attempt} ({} to {}) failed: {reason}; retrying in {:.1} s",
                describe(status),
                self.endpoint,
                delay.as_secs_f64()
            );
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(&self, disk_uuid: &str, status: DiskStatus) -> Result<Secrets, String> {
        let channel = tonic::transport::Endpoint::from_shared(self.endpoint.uri())
            .map_err(|e| format!("bad endpoint: {}", error_chain(&e)))?
            .connect_timeout(ATTEMPT_TIMEOUT)
            .connect_with_connector(self.atls.connector())
            .await
            .map_err(|e| error_chain(&e))?;
        let mut client = JoinServiceClient::new(channel);
        let status_text = |s: tonic::Status| format!("refused ({:?}): {}", s.code(), s.message());
        match status {
            DiskStatus::New => {
                let request = IssueJoinTicketRequest {
                    disk_uuid: disk_uuid.to_owned(),
                    node_name: node_name(disk_uuid),
                    is_control_plane: false,
                    kubelet_csr: Vec::new(),
                };
                let mut response = client
                    .issue_join_ticket(request)
                    .await
                    .map_err(status_text)?
                    .into_inner();
                let secrets = Secrets {
                    state_disk_key: Zeroizing::new(std::mem::take(&mut response.state_disk_key)),
                    measurement_secret: Zeroizing::new(std::mem::take(
                        &mut response.measurement_secret,
                    )),
                    measurement_salt: std::mem::take(&mut response.measurement_salt),
                };
                // The rest of the ticket (bootstrap token, control-plane files) is for a later
                // issue (kubeadm join); wipe what may be secret.
                zeroize::Zeroize::zeroize(&mut response.bootstrap_token);
                for file in &mut response.control_plane_files {
                    zeroize::Zeroize::zeroize(&mut file.data);
                }
                Ok(secrets)
            }
            DiskStatus::Initialized => {
                let mut response = client
                    .issue_rejoin_ticket(IssueRejoinTicketRequest {
                        disk_uuid: disk_uuid.to_owned(),
                    })
                    .await
                    .map_err(status_text)?
                    .into_inner();
                Ok(Secrets {
                    state_disk_key: Zeroizing::new(std::mem::take(&mut response.state_disk_key)),
                    measurement_secret: Zeroizing::new(std::mem::take(
                        &mut response.measurement_secret,
                    )),
                    measurement_salt: std::mem::take(&mut response.measurement_salt),
                })
            }
        }
    }
}

/// The node's name as the join service records it.
pub fn node_name(disk_uuid: &str) -> String {
    format!("hawser-{}", disk_uuid.get(..8).unwrap_or(disk_uuid))
}

/// What the node got, for the console (no secrets: a fingerprint and the public cluster ID).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct JoinSummary {
    pub disk_uuid: String,
    pub rpc: &'static str,
    pub attempts: u32,
    pub key_fingerprint: String,
    pub cluster_id: String,
    pub pcr15: String,
}

/// The join-service key source: called by the disk code (on a blocking thread) with the disk's
/// LUKS2 UUID; runs the join client on the PID 1 runtime, takes the node lock, hands the key.
pub struct JoinKeySource {
    client: JoinClient,
    runtime: tokio::runtime::Handle,
    lock: Arc<NodeLock>,
    tpm: Arc<Tpm>,
    summary: Mutex<Option<JoinSummary>>,
}

impl JoinKeySource {
    pub fn new(
        client: JoinClient,
        runtime: tokio::runtime::Handle,
        lock: Arc<NodeLock>,
        tpm: Arc<Tpm>,
    ) -> Self {
        JoinKeySource {
            client,
            runtime,
            lock,
            tpm,
            summary: Mutex::new(None),
        }
    }

    /// The summary of the join, once the key was handed out.
    pub fn summary(&self) -> Option<JoinSummary> {
        self.summary
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl KeySource for JoinKeySource {
    fn volume_key(
        &self,
        luks_uuid: &str,
        len: usize,
        status: DiskStatus,
    ) -> Result<VolumeKey, KeyError> {
        let failed = |reason: String| KeyError::JoinService { reason };
        info!(
            "asking the join service at {} for the key of disk {luks_uuid} ({})",
            self.client.endpoint,
            describe(status)
        );
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let client = self.client.clone();
        let uuid = luks_uuid.to_owned();
        self.runtime.spawn(async move {
            let _ = sender.send(client.fetch(&uuid, status).await);
        });
        let (secrets, attempts) = receiver
            .blocking_recv()
            .map_err(|_| failed("the join client task ended without an answer".to_owned()))?;
        if secrets.state_disk_key.len() != len {
            return Err(KeyError::Length {
                source_name: "the join service",
                found: secrets.state_disk_key.len(),
                expected: len,
                mode: "as configured by hawser.state_disk_integrity",
            });
        }
        let cluster_id =
            hawser_keys::cluster_id(&secrets.measurement_secret, &secrets.measurement_salt);
        // The point of no return: the node belongs to this cluster from here on.
        self.lock
            .lock(Owner::JoinClient, cluster_id, |id| {
                self.tpm.extend_sha256_digest(PCR_CLUSTER_ID, id)
            })
            .map_err(|e| failed(error_chain(&e)))?;
        let summary = JoinSummary {
            disk_uuid: luks_uuid.to_owned(),
            rpc: describe(status),
            attempts,
            key_fingerprint: hawser_keys::fingerprint(&secrets.state_disk_key),
            cluster_id: hex::encode(cluster_id),
            pcr15: hex::encode(super::lock::predicted_pcr15(&cluster_id)),
        };
        info!(
            "joined cluster {} after {attempts} attempt(s): node lock taken (PCR {PCR_CLUSTER_ID}), \
             state disk key fingerprint {}",
            summary.cluster_id, summary.key_fingerprint
        );
        *self
            .summary
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(summary);
        Ok(VolumeKey::new(Zeroizing::new(
            secrets.state_disk_key.to_vec(),
        )))
    }
}
