//! The audit trail: one structured log line per join decision.
//!
//! Fields: the peer's address and AK name (its TPM), node name, disk UUID, the PCRs checked
//! (enforced ones), the release the peer's measurements match, the outcome and its reason.
//! Never a key, token or secret. The target is `audit`, so operators can route these lines.

use std::net::IpAddr;

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Granted,
    Refused,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::Refused => "refused",
        }
    }
}

/// One decision, as logged.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    pub call: &'static str,
    pub peer: Option<IpAddr>,
    /// The TPM name of the peer's AK, hex.
    pub ak_name: &'a str,
    pub node: &'a str,
    pub disk_uuid: &'a str,
    pub pcrs_checked: &'a [u8],
    pub policy_digest: &'a str,
    /// The accepted release the peer's measurements match, if any.
    pub release: Option<&'a str>,
    pub outcome: Outcome,
    pub reason: &'a str,
}

/// Logs `decision` as one line.
pub fn record(decision: &Decision<'_>) {
    let pcrs = decision
        .pcrs_checked
        .iter()
        .map(u8::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let peer = decision.peer.map(|p| p.to_string()).unwrap_or_default();
    let policy = &decision.policy_digest[..decision.policy_digest.len().min(16)];
    match decision.outcome {
        Outcome::Granted => tracing::info!(
            target: "audit",
            call = decision.call,
            %peer,
            ak = decision.ak_name,
            node = decision.node,
            disk_uuid = decision.disk_uuid,
            pcrs = %pcrs,
            policy,
            release = decision.release.unwrap_or("none"),
            outcome = decision.outcome.as_str(),
            reason = decision.reason,
        ),
        Outcome::Refused => tracing::warn!(
            target: "audit",
            call = decision.call,
            %peer,
            ak = decision.ak_name,
            node = decision.node,
            disk_uuid = decision.disk_uuid,
            pcrs = %pcrs,
            policy,
            release = decision.release.unwrap_or("none"),
            outcome = decision.outcome.as_str(),
            reason = decision.reason,
        ),
    }
}
