//! The join client: asks the join service for the state-disk key over aTLS, retrying with
//! backoff until it gets an answer.
//!
//! A fresh disk (about to be formatted) asks `IssueJoinTicket`; an initialized disk asks
//! `IssueRejoinTicket`. The node lock is taken by the race in [`super::race`], not here. Every failed attempt is logged with its reason — the join service's
//! refusal names the PCRs that differ — and retried after [`Backoff`]: a join service that is
//! down at boot and up later is normal (the first node of a cluster boots before its join
//! service exists). The key, measurement secret and salt are zeroized; only the key's
//! fingerprint and the public cluster ID are ever logged.

use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::TpmIssuer;
use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy};
use hawser_proto::join::join_service_client::JoinServiceClient;
use hawser_proto::join::{IssueJoinTicketRequest, IssueRejoinTicketRequest};
use tracing::warn;
use zeroize::Zeroizing;

use super::{Backoff, INSECURE_TRUST_WARNING, JoinEndpoint, jitter_unit};
use crate::disk::key::DiskStatus;
use crate::fatal::error_chain;
use crate::kubeadm::BootstrapToken;

/// Deadline of one attempt (connect, handshake with quotes on both sides, call).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the join client cannot start.
#[derive(Debug, thiserror::Error)]
pub enum JoinSetupError {
    #[error(
        "hawser.join_service_trust=attested needs the provider CA that certifies the join \
         service's attestation key in the image ({path}; build with `hawser image build \
         --provider-ca FILE`), and this image carries none; use \
         hawser.join_service_trust=insecure-dev for development"
    )]
    NoProviderCa { path: &'static str },
    #[error("the image's provider CA {path} is unusable")]
    ProviderCa {
        path: &'static str,
        #[source]
        source: hawser_attestation::validator::AkTrustError,
    },
    #[error("cannot read this node's own PCRs to build the join service's expected measurements")]
    OwnPcrs(#[source] hawser_attestation::tpm::TpmError),
}

/// What the join service sent, secrets zeroized on drop.
pub struct Secrets {
    pub state_disk_key: Zeroizing<Vec<u8>>,
    pub measurement_secret: Zeroizing<Vec<u8>>,
    pub measurement_salt: Vec<u8>,
    /// What `kubeadm join` needs (`IssueJoinTicket` only; a rejoining node joined before).
    pub ticket: Option<KubeadmTicket>,
}

/// The Kubernetes half of a join ticket. The token is secret (zeroized, redacted in `Debug`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeadmTicket {
    pub api_server_endpoint: String,
    pub token: BootstrapToken,
    pub ca_cert_hashes: Vec<String>,
    pub kubernetes_version: String,
    /// A control-plane join: the cluster's shared certificates and keys (name relative to
    /// `/etc/kubernetes/pki`, content); `None` for a worker.
    pub control_plane_files: Option<Vec<ControlPlaneFile>>,
}

/// One of the cluster's shared control-plane files. The content is key material: zeroized on
/// drop and never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlPlaneFile {
    pub name: String,
    pub data: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for ControlPlaneFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ControlPlaneFile({}, <{} bytes>)",
            self.name,
            self.data.len()
        )
    }
}

/// Whether this disk is new (join) or initialized (rejoin).
pub fn describe(status: DiskStatus) -> &'static str {
    match status {
        DiskStatus::New => "IssueJoinTicket",
        DiskStatus::Initialized => "IssueRejoinTicket",
    }
}

/// The gRPC join client.
#[derive(Debug, Clone)]
pub struct JoinClient {
    pub(super) endpoint: JoinEndpoint,
    atls: AtlsClient,
    backoff: Backoff,
    /// Ask for a control-plane join (fw_cfg `role=control-plane`).
    control_plane: bool,
}

impl JoinClient {
    /// A client that attests with `issuer` (the node's TPM) and requires `policy` of the join
    /// service (see [`super::join_service_policy`]).
    pub fn new(endpoint: JoinEndpoint, policy: PeerPolicy, issuer: Arc<TpmIssuer>) -> Self {
        if matches!(policy, PeerPolicy::Unauthenticated) {
            warn!("{INSECURE_TRUST_WARNING}");
        }
        let atls =
            AtlsClient::new(Identity::attested(issuer), policy).handshake_timeout(ATTEMPT_TIMEOUT);
        JoinClient {
            endpoint,
            atls,
            backoff: Backoff::default(),
            control_plane: false,
        }
    }

    /// Asks for a control-plane join instead of a worker join.
    pub fn control_plane(mut self, control_plane: bool) -> Self {
        self.control_plane = control_plane;
        self
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
                    is_control_plane: self.control_plane,
                    kubelet_csr: Vec::new(),
                };
                let mut response = client
                    .issue_join_ticket(request)
                    .await
                    .map_err(status_text)?
                    .into_inner();
                let token = BootstrapToken::parse(&response.bootstrap_token)
                    .map_err(|e| format!("the join service sent an unusable bootstrap token: {e}"));
                zeroize::Zeroize::zeroize(&mut response.bootstrap_token);
                let secrets = Secrets {
                    state_disk_key: Zeroizing::new(std::mem::take(&mut response.state_disk_key)),
                    measurement_secret: Zeroizing::new(std::mem::take(
                        &mut response.measurement_secret,
                    )),
                    measurement_salt: std::mem::take(&mut response.measurement_salt),
                    ticket: Some(KubeadmTicket {
                        api_server_endpoint: std::mem::take(&mut response.api_server_endpoint),
                        token: token?,
                        ca_cert_hashes: std::mem::take(&mut response.discovery_ca_cert_hashes),
                        kubernetes_version: std::mem::take(&mut response.kubernetes_version),
                        control_plane_files: self.control_plane.then(|| {
                            response
                                .control_plane_files
                                .iter_mut()
                                .map(|file| ControlPlaneFile {
                                    name: std::mem::take(&mut file.name),
                                    data: Zeroizing::new(std::mem::take(&mut file.data)),
                                })
                                .collect()
                        }),
                    }),
                };
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
                    ticket: None,
                })
            }
        }
    }
}

/// The node's name as the join service records it.
pub fn node_name(disk_uuid: &str) -> String {
    format!("hawser-{}", disk_uuid.get(..8).unwrap_or(disk_uuid))
}
