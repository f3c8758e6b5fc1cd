//! Joining a cluster: the node proves what it booted to the join service over aTLS and receives
//! its state-disk key, then takes the node lock.
//!
//! - [`JoinEndpoints`] and [`JoinServiceTrust`]: where the join services are (fw_cfg or the
//!   command line, one or more, tried in turn: unmeasured is fine, trust comes from attestation
//!   and, for an initialized disk, the cluster ID it records) and how the node trusts them
//!   (the *measured* `hawser.join_service_trust`: `attested`, the default, or `insecure-dev`).
//!   An attested join service must be one of the cluster's control planes
//!   ([`join_service_measurements`]): its PCR 11 carries the control-plane marker a worker can
//!   never produce, and on a rejoin its PCR 15 is the lock of the disk's cluster.
//! - [`RetryBackoff`]: exponential backoff with jitter between attempts (pure).
//! - [`lock::NodeLock`]: the point of no return. Whoever first gets the cluster's secrets takes
//!   it; taking it extends PCR 15 with the cluster ID, so the node can never attest as fresh
//!   again in this boot. The state machine is pure; the TPM extension is a closure.
//! - [`client::JoinClient`]: the gRPC client with retries.
//! - [`init_server::InitServer`]: the node's side of `hawser init` / `hawser recover`.
//! - [`race::Enrollment`]: runs both and returns the first to get secrets as a grant, which
//!   takes the lock once the boot has checked its key against the disk.

pub mod client;
pub mod discover;
pub mod init_secret;
pub mod init_server;
pub mod lock;
pub mod race;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hawser_attestation::atls::PeerPolicy;
use hawser_attestation::measurements::{ExpectedMeasurements, ExpectedPcr};
use hawser_attestation::tpm::Tpm;
use hawser_attestation::validator::{AkTrust, Validator};
use hawser_pcr::{PCR_CLUSTER_ID, PCR_KERNEL_BOOT, cluster_lock_pcr, pcr11_after_pivot};

use client::JoinSetupError;

/// The join service's address: `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinEndpoint {
    pub host: String,
    pub port: u16,
}

impl JoinEndpoint {
    /// Parses `<IPv4 address or DNS name>:<port>`.
    pub fn parse(text: &str) -> Option<Self> {
        let (host, port) = text.rsplit_once(':')?;
        let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
        host_ok.then(|| JoinEndpoint {
            host: host.to_owned(),
            port,
        })
    }

    /// The URI tonic connects to (the aTLS connector does the TLS; the scheme is nominal).
    pub fn uri(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }
}

impl fmt::Display for JoinEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The most join endpoints a node is given.
pub const MAX_JOIN_ENDPOINTS: usize = 16;

/// The join services a node may ask, in order: one per control-plane node of the cluster (each
/// runs one). The join client tries them in turn, so any one of them answers for the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinEndpoints(Vec<JoinEndpoint>);

impl JoinEndpoints {
    /// The syntax [`JoinEndpoints::parse`] accepts, for error messages.
    pub const SYNTAX: &'static str =
        "expected <IPv4 address or host name>:<port>[,<host>:<port>...] (at most 16, no repeats)";

    /// Parses a comma-separated list of [`JoinEndpoint`]s: at least one, at most
    /// [`MAX_JOIN_ENDPOINTS`], none twice.
    pub fn parse(text: &str) -> Option<Self> {
        let mut endpoints = Vec::new();
        for item in text.split(',') {
            let endpoint = JoinEndpoint::parse(item.trim())?;
            if endpoints.contains(&endpoint) || endpoints.len() == MAX_JOIN_ENDPOINTS {
                return None;
            }
            endpoints.push(endpoint);
        }
        Some(JoinEndpoints(endpoints))
    }

    /// A single endpoint.
    pub fn one(endpoint: JoinEndpoint) -> Self {
        JoinEndpoints(vec![endpoint])
    }

    /// How many endpoints there are (at least one).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: a list has at least one endpoint (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The endpoints in their order.
    pub fn iter(&self) -> impl Iterator<Item = &JoinEndpoint> {
        self.0.iter()
    }
}

impl fmt::Display for JoinEndpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, endpoint) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{endpoint}")?;
        }
        Ok(())
    }
}

/// How the node authenticates the join service (`hawser.join_service_trust`, measured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JoinServiceTrust {
    /// The join service must attest (production).
    #[default]
    Attested,
    /// DEVELOPMENT ONLY: the node gives its secrets' source no scrutiny at all: any server at
    /// the endpoint can hand it a key. Visible in PCR 11/9 through the command line.
    InsecureDev,
}

impl JoinServiceTrust {
    pub fn cmdline_name(self) -> &'static str {
        match self {
            JoinServiceTrust::Attested => "attested",
            JoinServiceTrust::InsecureDev => "insecure-dev",
        }
    }

    pub fn from_cmdline(value: &str) -> Option<Self> {
        [JoinServiceTrust::Attested, JoinServiceTrust::InsecureDev]
            .into_iter()
            .find(|t| t.cmdline_name() == value)
    }
}

/// Where the image carries the provider CA (`hawser image build --provider-ca`).
pub const PROVIDER_CA_PATH: &str = "/etc/hawser/provider-ca.pem";

/// The PCRs an attesting join service must share with this node because they depend only on
/// the image: the UKI as firmware loaded it (4), the command line and initrd as Linux's EFI stub
/// measured them (9), the stub's command line and extensions (12, 13).
pub const SAME_IMAGE_PCRS: [u8; 4] = [4, 9, 12, 13];

/// A join service on a worker's TPM: why it is refused, as the node's log and the verdict the
/// service receives say it.
pub const WORKER_JOIN_SERVICE: &str = "the join service's TPM is a worker's: its PCR 11 after \
     the pivot lacks the control-plane marker, so whoever answers is root on a worker, not one \
     of the cluster's control planes";
/// A join service whose PCR 11 is neither a control plane's nor a worker's of this image.
pub const NOT_A_CONTROL_PLANE: &str = "the join service's TPM did not boot this image into a \
     control plane's rootfs";
/// A join service whose TPM holds no cluster lock.
pub const UNLOCKED_JOIN_SERVICE: &str = "the join service's TPM is a fresh node's: its PCR 15 \
     holds no cluster lock";

/// What an attested join service must prove: it is a *control plane* of *this image*, in its
/// rootfs (where the in-cluster join service runs), and, when this node's disk records its
/// cluster (a rejoin), a control plane of *that* cluster.
///
/// - PCRs [`SAME_IMAGE_PCRS`] equal this node's own;
/// - PCR 11 equals this node's (after `enter-initrd`) extended with `control-plane` and then
///   `leave-initrd` ([`hawser_pcr::pcr11_after_pivot`]): a control plane's PID 1
///   extends the marker only when it holds the master secret of the cluster its PCR 15 is
///   locked to, and code in a worker's rootfs can only extend PCR 11 after `leave-initrd`, so
///   it can never produce this value. A worker's value is refused by name
///   ([`WORKER_JOIN_SERVICE`]);
/// - PCR 15: with `disk_cluster`, the node lock of that cluster (a control plane of another
///   cluster is refused, naming the disk's cluster); without (a fresh disk), any lock but none
///   ([`UNLOCKED_JOIN_SERVICE`]). A fresh disk has no cluster to check: a control plane of
///   *another* cluster made from this same image can still enrol it (see docs/security.md).
///
/// Firmware PCRs are not pinned: they differ between VMs.
pub fn join_service_measurements(
    own: &BTreeMap<u8, [u8; 32]>,
    disk_cluster: Option<&[u8; 32]>,
) -> ExpectedMeasurements {
    let enforce = |expected| ExpectedPcr {
        expected,
        warn_only: false,
    };
    let mut expected = ExpectedMeasurements::new();
    for pcr in SAME_IMAGE_PCRS {
        if let Some(value) = own.get(&pcr) {
            expected.insert(pcr, enforce(*value));
        }
    }
    if let Some(after_enter) = own.get(&PCR_KERNEL_BOOT) {
        expected
            .insert(
                PCR_KERNEL_BOOT,
                enforce(pcr11_after_pivot(after_enter, true)),
            )
            .refuse(
                PCR_KERNEL_BOOT,
                pcr11_after_pivot(after_enter, false),
                WORKER_JOIN_SERVICE,
            )
            .explain(PCR_KERNEL_BOOT, NOT_A_CONTROL_PLANE);
    }
    expected.refuse(PCR_CLUSTER_ID, [0; 32], UNLOCKED_JOIN_SERVICE);
    if let Some(cluster_id) = disk_cluster {
        expected
            .insert(PCR_CLUSTER_ID, enforce(cluster_lock_pcr(cluster_id)))
            .explain(
                PCR_CLUSTER_ID,
                format!(
                    "the join service's TPM is locked to another cluster than the one this \
                     node's disk records ({}): a control plane of another cluster",
                    hex::encode(cluster_id)
                ),
            );
    }
    expected
}

/// What the cluster's join service expects of a joining node booted from this same image:
/// PCRs [`SAME_IMAGE_PCRS`] and PCR 11 (after `enter-initrd`) equal this node's own values at
/// the same phase, PCR 15 zero (a fresh node). The expected-measurements JSON of `hawser-joind`.
pub fn fresh_node_measurements_json(own: &BTreeMap<u8, [u8; 32]>) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for pcr in SAME_IMAGE_PCRS.into_iter().chain([PCR_KERNEL_BOOT]) {
        if let Some(value) = own.get(&pcr) {
            map.insert(
                pcr.to_string(),
                serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
            );
        }
    }
    map.insert(
        PCR_CLUSTER_ID.to_string(),
        serde_json::json!({"expected": hex::encode([0u8; 32]), "warnOnly": false}),
    );
    // The node's platform profile, so that its join service judges joiners by it (a QEMU
    // file carries none: `qemu` is the default).
    let platform = crate::attest::platform();
    if platform != hawser_platforms::profile::Platform::Qemu {
        map.insert(
            hawser_platforms::profile::VARIANT_KEY.to_owned(),
            platform.attestation_variant().into(),
        );
    }
    map.into()
}

/// What the join client requires of the join service, per the measured
/// `hawser.join_service_trust`.
#[derive(Debug, Clone)]
pub enum JoinServicePolicy {
    /// `insecure-dev`: nothing (see [`INSECURE_TRUST_WARNING`]).
    Unauthenticated,
    /// `attested`: a control plane of this image, certified by the provider
    /// ([`join_service_measurements`]).
    ControlPlane(ControlPlaneOfThisImage),
}

/// The inputs of an attested join service's check: this node's own PCRs (after `enter-initrd`)
/// and the provider CA its AK certificate must chain to.
#[derive(Debug, Clone)]
pub struct ControlPlaneOfThisImage {
    own: BTreeMap<u8, [u8; 32]>,
    ak_trust: AkTrust,
}

impl ControlPlaneOfThisImage {
    /// From this node's own PCRs (PCR 11 at least: `None` without it, as a policy that pins
    /// nothing is no policy) and the provider's trust root.
    pub fn new(own: BTreeMap<u8, [u8; 32]>, ak_trust: AkTrust) -> Option<Self> {
        own.contains_key(&PCR_KERNEL_BOOT)
            .then_some(ControlPlaneOfThisImage { own, ak_trust })
    }
}

impl JoinServicePolicy {
    /// The aTLS peer policy for a join service, for a disk that records `disk_cluster` (a
    /// rejoin) or none.
    pub fn peer_policy(
        &self,
        disk_cluster: Option<&[u8; 32]>,
    ) -> Result<PeerPolicy, hawser_attestation::validator::ValidatorError> {
        match self {
            JoinServicePolicy::Unauthenticated => Ok(PeerPolicy::Unauthenticated),
            JoinServicePolicy::ControlPlane(image) => {
                let expected = join_service_measurements(&image.own, disk_cluster);
                let validator = Validator::new(expected, image.ak_trust.clone())?;
                Ok(PeerPolicy::Verify(Arc::new(validator)))
            }
        }
    }
}

/// The join client's policy for the join service, per the measured `trust`. Blocking (reads
/// the TPM's PCRs). `attested` needs the provider CA the image carries at `provider_ca` (on a
/// cloud profile: the platform's roots, as [`hawser_platforms::verifier::ak_trust`] reads them).
pub fn join_service_policy(
    trust: JoinServiceTrust,
    tpm: &Tpm,
    provider_ca: &Path,
) -> Result<JoinServicePolicy, JoinSetupError> {
    match trust {
        JoinServiceTrust::InsecureDev => Ok(JoinServicePolicy::Unauthenticated),
        JoinServiceTrust::Attested => {
            let pem =
                std::fs::read_to_string(provider_ca).map_err(|_| JoinSetupError::NoProviderCa {
                    path: PROVIDER_CA_PATH,
                })?;
            let ak_trust = hawser_platforms::verifier::ak_trust(crate::attest::platform(), &pem)
                .map_err(|source| JoinSetupError::ProviderCa {
                    path: PROVIDER_CA_PATH,
                    source,
                })?;
            let mut pcrs: Vec<u8> = SAME_IMAGE_PCRS.to_vec();
            pcrs.push(PCR_KERNEL_BOOT);
            let own = tpm
                .read_pcrs_sha256(pcrs)
                .map_err(JoinSetupError::OwnPcrs)?;
            ControlPlaneOfThisImage::new(own, ak_trust)
                .map(JoinServicePolicy::ControlPlane)
                .ok_or(JoinSetupError::OwnPcr11)
        }
    }
}

/// The warning logged on every boot with `hawser.join_service_trust=insecure-dev`.
pub const INSECURE_TRUST_WARNING: &str = "INSECURE: hawser.join_service_trust=insecure-dev: the \
     node does not authenticate the join service; whoever answers at the join endpoint chooses \
     this node's state disk key and cluster. For development only.";

/// Exponential backoff with jitter: attempt `n` (from 0) waits a uniformly random time in
/// `[d/2, d]` where `d = min(max, base · 2ⁿ)` ("equal jitter": never a thundering herd, never
/// a zero wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff {
            base: Duration::from_millis(500),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryBackoff {
    /// The ceiling for attempt `attempt`: `min(max, base · 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The wait before retry `attempt`, with `unit` a random number in `[0, 1)`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        ceiling / 2 + (ceiling / 2).mul_f64(unit)
    }
}

/// A random number in `[0, 1)` for jitter (not secret; falls back to 0.5 if the kernel has
/// none to give without blocking).
pub fn jitter_unit() -> f64 {
    let mut bytes = [0u8; 8];
    if !crate::platform::random::try_fill_nonblocking(&mut bytes) {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests;
