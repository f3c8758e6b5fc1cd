//! The admin's side of a cluster's life after formation (`docs/lifecycle.md`): the releases the
//! join services accept, revocations, and `hawser verify` of running nodes.
//!
//! - **The admin API** of a control plane's join service ([`AdminTarget`]): before anything is
//!   sent, the join service must attest as a *control plane* (PCR 11 with the `control-plane`
//!   marker after the pivot) of a release the admin trusts (PCRs 4, 9, 12, 13) *locked to this
//!   cluster* (PCR 15), with an AK certified by the provider CA. Then the admin token (derived
//!   from the master secret) goes with each call.
//! - **`hawser verify`** ([`verify_node`]): each node quotes its PCRs for a fresh nonce; the
//!   answer is checked against every accepted release in both phases a running node can be in
//!   (a worker's or a control plane's PCR 11 after the pivot) and PCR 15 = this cluster's lock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hawser_attestation::atls::{AtlsClient, Identity, PeerPolicy};
use hawser_attestation::evidence::{Binding, Evidence, NONCE_LEN, Role};
use hawser_attestation::releases::ReleaseSet;
use hawser_attestation::validator::{AkTrust, EvidenceError, Validator};
use hawser_cluster_store::releases::{
    INITRAMFS_PHASE, Release, running_node_measurements, running_release_set,
};
use hawser_cluster_store::revocations::Revocation;
use hawser_keys::MasterSecret;
use hawser_pcr::{PCR_CLUSTER_ID, PCR_KERNEL_BOOT, cluster_lock_pcr};
use hawser_platforms::profile::Platform;
use hawser_proto::admin::admin_client::AdminClient;
use hawser_proto::admin::{
    AddReleaseRequest, ListNodesRequest, ListReleasesRequest, ReadmitNodeRequest,
    RetireReleaseRequest, RevokeNodeRequest,
};
use hawser_proto::attest::AttestRequest;
use hawser_proto::attest::node_attestation_client::NodeAttestationClient;
use prost::Message as _;
use zeroize::Zeroizing;

/// How long a connection and its handshake (a quote under TCG included) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A control plane's join service, reached by the admin.
pub struct AdminTarget {
    /// `host:port` of its admin API (port 7001 on a node).
    pub address: String,
    /// The releases the admin trusts it to run.
    pub trusted: Vec<Release>,
    /// The cluster its PCR 15 must be locked to.
    pub cluster_id: [u8; 32],
    /// The provider CA that certifies its AK.
    pub ak_trust: AkTrust,
    /// The admin token ([`MasterSecret::admin_token`]).
    pub token: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for AdminTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminTarget")
            .field("address", &self.address)
            .field("trusted", &self.trusted.len())
            .finish_non_exhaustive()
    }
}

/// The AK trust of the platform profile `releases` were published for (their
/// `attestationVariant`; `qemu` without): the provider CA, or the platform's verifier over the
/// roots of `provider_ca_pem`. Releases of different profiles are refused: a cluster runs on one.
pub fn releases_ak_trust(releases: &[Release], provider_ca_pem: &str) -> anyhow::Result<AkTrust> {
    let mut platforms = releases.iter().map(|release| {
        release
            .attestation_variant
            .as_deref()
            .map_or(Ok(Platform::Qemu), Platform::from_name)
    });
    let platform = platforms.next().transpose()?.unwrap_or(Platform::Qemu);
    for other in platforms {
        let other = other?;
        if other != platform {
            bail!(
                "the releases are for two platform profiles ({platform} and {other}); a cluster runs on one"
            );
        }
    }
    hawser_platforms::verifier::ak_trust(platform, provider_ca_pem)
        .with_context(|| format!("the {platform} trust from the provider CA file"))
}

impl AdminTarget {
    /// The target at `address`, trusting `trusted` releases, with `master`'s token.
    pub fn new(
        address: &str,
        trusted: Vec<Release>,
        cluster_id: [u8; 32],
        provider_ca_pem: &str,
        master: &MasterSecret,
    ) -> anyhow::Result<Self> {
        if trusted.is_empty() {
            bail!("no release to verify the join service against: give --measurements");
        }
        let ak_trust = releases_ak_trust(&trusted, provider_ca_pem)?;
        Ok(Self {
            address: address.to_owned(),
            trusted,
            cluster_id,
            ak_trust,
            token: master.admin_token(),
        })
    }

    async fn client(&self) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
        let mut set = ReleaseSet::default();
        for release in &self.trusted {
            set.accept(
                format!("{} control-plane", release.name),
                running_node_measurements(release, &self.cluster_id, true),
            );
        }
        let validator = Validator::for_releases(set, self.ak_trust.clone())?;
        let atls = AtlsClient::new(
            Identity::Unattested,
            PeerPolicy::Verify(Arc::new(validator)),
        )
        .handshake_timeout(CONNECT_TIMEOUT);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.address))
            .with_context(|| format!("{} is not a host:port", self.address))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector(atls.connector())
            .await
            .with_context(|| {
                format!(
                    "cannot reach a verified control plane's admin API at {} (it must attest as \
                     a control plane of a trusted release locked to this cluster)",
                    self.address
                )
            })?;
        Ok(AdminClient::new(channel))
    }

    fn token(&self) -> Vec<u8> {
        self.token.to_vec()
    }

    /// Every release of the cluster, oldest first.
    pub async fn list_releases(&self) -> anyhow::Result<Vec<Release>> {
        let response = self
            .client()
            .await?
            .list_releases(ListReleasesRequest {
                admin_token: self.token(),
            })
            .await
            .map_err(status_error("list the releases"))?
            .into_inner();
        response
            .release_json
            .iter()
            .map(|j| serde_json::from_str(j).context("the join service sent a malformed release"))
            .collect()
    }

    /// Adds release `name` of `measurements_json`; returns it and whether it is new.
    pub async fn add_release(
        &self,
        name: &str,
        measurements_json: &str,
    ) -> anyhow::Result<(Release, bool)> {
        let response = self
            .client()
            .await?
            .add_release(AddReleaseRequest {
                admin_token: self.token(),
                name: name.to_owned(),
                measurements_json: measurements_json.to_owned(),
            })
            .await
            .map_err(status_error(&format!("add release {name}")))?
            .into_inner();
        Ok((
            serde_json::from_str(&response.release_json)?,
            response.changed,
        ))
    }

    /// Retires release `name`.
    pub async fn retire_release(&self, name: &str) -> anyhow::Result<(Release, bool)> {
        let response = self
            .client()
            .await?
            .retire_release(RetireReleaseRequest {
                admin_token: self.token(),
                name: name.to_owned(),
            })
            .await
            .map_err(status_error(&format!("retire release {name}")))?
            .into_inner();
        Ok((
            serde_json::from_str(&response.release_json)?,
            response.changed,
        ))
    }

    /// Revokes `node` (disk UUID, AK name, mesh name or VPN address).
    pub async fn revoke(&self, node: &str, reason: &str) -> anyhow::Result<(Revocation, bool)> {
        let response = self
            .client()
            .await?
            .revoke_node(RevokeNodeRequest {
                admin_token: self.token(),
                node: node.to_owned(),
                reason: reason.to_owned(),
            })
            .await
            .map_err(status_error(&format!("revoke {node}")))?
            .into_inner();
        Ok((
            serde_json::from_str(&response.revocation_json)?,
            response.removed_from_mesh,
        ))
    }

    /// Readmits `node` (disk UUID or AK name).
    pub async fn readmit(&self, node: &str) -> anyhow::Result<Revocation> {
        let response = self
            .client()
            .await?
            .readmit_node(ReadmitNodeRequest {
                admin_token: self.token(),
                node: node.to_owned(),
            })
            .await
            .map_err(status_error(&format!("readmit {node}")))?
            .into_inner();
        Ok(serde_json::from_str(&response.revocation_json)?)
    }

    /// The nodes the store knows (JSON objects).
    pub async fn list_nodes(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let response = self
            .client()
            .await?
            .list_nodes(ListNodesRequest {
                admin_token: self.token(),
            })
            .await
            .map_err(status_error("list the nodes"))?
            .into_inner();
        response
            .node_json
            .iter()
            .map(|j| serde_json::from_str(j).context("the join service sent a malformed node"))
            .collect()
    }
}

fn status_error(what: &str) -> impl FnOnce(tonic::Status) -> anyhow::Error + '_ {
    move |status| anyhow::anyhow!("cannot {what}: {} ({:?})", status.message(), status.code())
}

/// One node's answer to `hawser verify`, judged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    /// Where it was asked (`host:port`).
    pub address: String,
    /// The node's name as it claims it (signed through the quote).
    pub node: String,
    /// The accepted release its measurements match.
    pub release: Option<String>,
    /// `worker` or `control-plane` (PCR 11 after the pivot); `None` if neither matched.
    pub phase: Option<String>,
    /// `ok`, `zero` (not locked), or `another cluster`; `None` without a verified quote.
    pub pcr15: Option<String>,
    /// The AK's name (hex), once the quote verified.
    pub ak: Option<String>,
    /// Whether the node passed.
    pub ok: bool,
    /// Why not.
    pub reason: Option<String>,
}

/// Asks the node at `address` for a quote of its state for a fresh nonce and judges it against
/// `releases` (accepted and retired), `cluster_id` and the provider CA.
pub async fn verify_node(
    address: &str,
    releases: &[Release],
    cluster_id: &[u8; 32],
    ak_trust: &AkTrust,
) -> NodeVerdict {
    let mut verdict = NodeVerdict {
        address: address.to_owned(),
        node: String::new(),
        release: None,
        phase: None,
        pcr15: None,
        ak: None,
        ok: false,
        reason: None,
    };
    let answer = match ask(address).await {
        Ok(answer) => answer,
        Err(e) => {
            verdict.reason = Some(format!("{e:#}"));
            return verdict;
        }
    };
    let (nonce, evidence_bytes, claims_json) = answer;
    let claims: serde_json::Value = serde_json::from_str(&claims_json).unwrap_or_default();
    verdict.node = claims["nodeName"].as_str().unwrap_or("").to_owned();
    let set = running_release_set(releases, cluster_id);
    let validator = match Validator::for_releases(set, ak_trust.clone()) {
        Ok(validator) => validator,
        Err(e) => {
            verdict.reason = Some(format!("no accepted release to verify against: {e}"));
            return verdict;
        }
    };
    let binding = Binding {
        role: Role::Server,
        nonce: &nonce,
        tls_spki_der: &[],
    };
    // The claims must be the quote's user data.
    let evidence = match Evidence::decode(evidence_bytes.as_slice()) {
        Ok(evidence) if evidence.user_data == claims_json.as_bytes() => evidence,
        Ok(_) => {
            verdict.reason = Some("the node's claims are not what its quote signed".into());
            return verdict;
        }
        Err(e) => {
            verdict.reason = Some(format!("the node's evidence does not decode: {e}"));
            return verdict;
        }
    };
    let lock = cluster_lock_pcr(cluster_id);
    let describe_pcr15 = |evidence: &Evidence| {
        evidence
            .pcrs_sha256
            .get(&u32::from(PCR_CLUSTER_ID))
            .map(|v| match v.as_slice() {
                v if v == lock => "ok".to_owned(),
                v if v == [0u8; 32] => "zero (not locked)".to_owned(),
                _ => "another cluster".to_owned(),
            })
    };
    match validator.validate_decoded(&evidence, &binding) {
        Ok(valid) => {
            // The validator accepted these PCRs, so a release matches them.
            let name = validator
                .releases()
                .check(&valid.pcrs)
                .map(|(name, _)| name)
                .unwrap_or_default();
            let (release, phase) = name.rsplit_once(' ').unwrap_or((name, ""));
            verdict.release = Some(release.to_owned());
            verdict.phase = Some(phase.to_owned());
            verdict.ak = Some(hex::encode(&valid.ak_name));
            if phase == INITRAMFS_PHASE {
                verdict.pcr15 = Some("zero (not locked)".into());
                verdict.reason = Some(
                    "it has not joined the cluster: still in its initramfs, waiting for its \
                     disk's key"
                        .into(),
                );
            } else {
                verdict.pcr15 = Some("ok".into());
                verdict.ok = true;
            }
        }
        // The quote and its AK verified; only the measurements are wrong.
        Err(e @ (EvidenceError::Measurements(_) | EvidenceError::Release(_))) => {
            if let EvidenceError::Release(
                hawser_attestation::releases::ReleaseMismatch::Retired { name, .. },
            ) = &e
            {
                let (release, phase) = name.rsplit_once(' ').unwrap_or((name.as_str(), ""));
                verdict.release = Some(release.to_owned());
                verdict.phase = Some(phase.to_owned());
            }
            verdict.pcr15 = describe_pcr15(&evidence);
            verdict.ak = ak_name_of(&evidence);
            verdict.reason = Some(explain(&e, &evidence, releases, cluster_id));
        }
        Err(e) => {
            verdict.reason = Some(hawser_attestation::error_chain(&e));
        }
    }
    verdict
}

/// The name of the AK that signed `evidence` (from its public area, as the validator computes it).
fn ak_name_of(evidence: &Evidence) -> Option<String> {
    hawser_attestation::tpm_types::EccPublic::parse(&evidence.ak_public)
        .ok()
        .and_then(|ak| ak.name())
        .map(hex::encode)
}

/// A short reason for a node whose quote verified but whose measurements are not accepted.
fn explain(
    error: &EvidenceError,
    evidence: &Evidence,
    releases: &[Release],
    cluster_id: &[u8; 32],
) -> String {
    if let EvidenceError::Release(hawser_attestation::releases::ReleaseMismatch::Retired {
        name,
        ..
    }) = error
    {
        let (release, phase) = name.rsplit_once(' ').unwrap_or((name.as_str(), ""));
        let before_pivot = if phase == INITRAMFS_PHASE {
            " (it waits in its initramfs: no join service of the cluster runs its image)"
        } else {
            ""
        };
        return format!("it runs release {release}, which is retired{before_pivot}");
    }
    let pcrs: BTreeMap<u8, [u8; 32]> = evidence
        .pcrs_sha256
        .iter()
        .filter_map(|(p, v)| Some((u8::try_from(*p).ok()?, v.as_slice().try_into().ok()?)))
        .collect();
    if pcrs.get(&PCR_CLUSTER_ID) != Some(&cluster_lock_pcr(cluster_id)) {
        return "PCR 15 is not this cluster's lock".into();
    }
    let image_of = releases.iter().find(|r| {
        r.expected()
            .iter()
            .filter(|(pcr, _)| *pcr != PCR_KERNEL_BOOT && *pcr != PCR_CLUSTER_ID)
            .all(|(pcr, e)| pcrs.get(&pcr) == Some(&e.expected))
    });
    match image_of {
        Some(release) => format!(
            "its image is release {}, but PCR 11 is neither a worker's nor a control plane's \
             after the pivot (extended since, or not pivoted)",
            release.name
        ),
        None => format!(
            "its image is no accepted release: {}",
            hawser_attestation::error_chain(error)
        ),
    }
}

async fn ask(address: &str) -> anyhow::Result<([u8; NONCE_LEN], Vec<u8>, String)> {
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&hawser_keys::random_bytes(NONCE_LEN)?);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .with_context(|| format!("{address} is not a host:port"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .with_context(|| format!("cannot reach the node's attestation port at {address}"))?;
    let mut client = NodeAttestationClient::new(channel);
    // The node paces its quotes; a busy node is asked again.
    let mut attempt = 0;
    let response = loop {
        attempt += 1;
        match client
            .attest(AttestRequest {
                nonce: nonce.to_vec(),
            })
            .await
        {
            Ok(response) => break response.into_inner(),
            Err(status) if status.code() == tonic::Code::ResourceExhausted && attempt < 10 => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(status) => bail!("the node did not quote: {}", status.message()),
        }
    };
    Ok((nonce, response.evidence, response.claims_json))
}

/// `hawser verify`'s table.
pub fn verdict_table(verdicts: &[NodeVerdict]) -> String {
    let mut out = format!(
        "{:<22} {:<24} {:<22} {:<14} {:<18} {:<18} {}\n",
        "NODE", "ADDRESS", "RELEASE", "PHASE", "PCR 15", "AK", "VERDICT"
    );
    for v in verdicts {
        let ak =
            v.ak.as_deref()
                .map_or("-".to_owned(), |a| format!("{}…", &a[..a.len().min(16)]));
        let verdict = if v.ok {
            "ok".to_owned()
        } else {
            format!("FAILED: {}", v.reason.as_deref().unwrap_or("?"))
        };
        out.push_str(&format!(
            "{:<22} {:<24} {:<22} {:<14} {:<18} {:<18} {}\n",
            if v.node.is_empty() { "?" } else { &v.node },
            v.address,
            v.release.as_deref().unwrap_or("-"),
            v.phase.as_deref().unwrap_or("-"),
            v.pcr15.as_deref().unwrap_or("-"),
            ak,
            verdict
        ));
    }
    out
}
