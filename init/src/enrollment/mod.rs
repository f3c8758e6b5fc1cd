//! Joining a cluster: the node proves what it booted to the join service over aTLS and receives
//! its state-disk key, then takes the node lock.
//!
//! - [`JoinEndpoints`] and [`JoinServiceTrust`]: where the join services are (fw_cfg or the
//!   command line, one or more, tried in turn: unmeasured is fine, trust comes from attestation
//!   and, for an initialized disk, the cluster ID it records) and how the node trusts them
//!   (the *measured* `hawser.join_service_trust`: `attested`, the default, or `insecure-dev`).
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
use hawser_measurements::{PHASE_LEAVE_INITRD, extend_sha256, phase_digest};

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

/// What an attested join service must prove: it runs *this image*, after its pivot into the
/// rootfs (where the in-cluster join service runs). PCRs [`SAME_IMAGE_PCRS`] equal this node's
/// own; PCR 11 equals this node's (after `enter-initrd`) extended with `leave-initrd`. PCR 15
/// (its own cluster ID) and the firmware's PCRs are not pinned: they differ between nodes.
pub fn same_image_measurements(own: &BTreeMap<u8, [u8; 32]>) -> ExpectedMeasurements {
    let mut expected = ExpectedMeasurements::new();
    for pcr in SAME_IMAGE_PCRS {
        if let Some(value) = own.get(&pcr) {
            expected.insert(
                pcr,
                ExpectedPcr {
                    expected: *value,
                    warn_only: false,
                },
            );
        }
    }
    if let Some(pcr11) = own.get(&hawser_measurements::PCR_KERNEL_BOOT) {
        expected.insert(
            hawser_measurements::PCR_KERNEL_BOOT,
            ExpectedPcr {
                expected: extend_sha256(pcr11, &phase_digest(PHASE_LEAVE_INITRD)),
                warn_only: false,
            },
        );
    }
    expected
}

/// What the cluster's join service expects of a joining node booted from this same image:
/// PCRs [`SAME_IMAGE_PCRS`] and PCR 11 (after `enter-initrd`) equal this node's own values at
/// the same phase, PCR 15 zero (a fresh node). The expected-measurements JSON of `hawser-joind`.
pub fn fresh_node_measurements_json(own: &BTreeMap<u8, [u8; 32]>) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for pcr in SAME_IMAGE_PCRS
        .into_iter()
        .chain([hawser_measurements::PCR_KERNEL_BOOT])
    {
        if let Some(value) = own.get(&pcr) {
            map.insert(
                pcr.to_string(),
                serde_json::json!({"expected": hex::encode(value), "warnOnly": false}),
            );
        }
    }
    map.insert(
        hawser_measurements::PCR_CLUSTER_ID.to_string(),
        serde_json::json!({"expected": hex::encode([0u8; 32]), "warnOnly": false}),
    );
    map.into()
}

/// The join client's policy for the join service, per the measured `trust`. Blocking (reads
/// the TPM's PCRs). `attested` needs the provider CA the image carries at `provider_ca`.
pub fn join_service_policy(
    trust: JoinServiceTrust,
    tpm: &Tpm,
    provider_ca: &Path,
) -> Result<PeerPolicy, JoinSetupError> {
    match trust {
        JoinServiceTrust::InsecureDev => Ok(PeerPolicy::Unauthenticated),
        JoinServiceTrust::Attested => {
            let pem =
                std::fs::read_to_string(provider_ca).map_err(|_| JoinSetupError::NoProviderCa {
                    path: PROVIDER_CA_PATH,
                })?;
            let ak_trust =
                AkTrust::from_pem(&pem).map_err(|source| JoinSetupError::ProviderCa {
                    path: PROVIDER_CA_PATH,
                    source,
                })?;
            let mut pcrs: Vec<u8> = SAME_IMAGE_PCRS.to_vec();
            pcrs.push(hawser_measurements::PCR_KERNEL_BOOT);
            let own = tpm
                .read_pcrs_sha256(pcrs)
                .map_err(JoinSetupError::OwnPcrs)?;
            // Never empty: PCR 11 is always read.
            let validator =
                Validator::new(same_image_measurements(&own), ak_trust).map_err(|_| {
                    JoinSetupError::NoProviderCa {
                        path: PROVIDER_CA_PATH,
                    }
                })?;
            Ok(PeerPolicy::Verify(Arc::new(validator)))
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
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_jitters_within_half() {
        let b = RetryBackoff::default();
        assert_eq!(b.ceiling(0), Duration::from_millis(500));
        assert_eq!(b.ceiling(1), Duration::from_secs(1));
        assert_eq!(b.ceiling(4), Duration::from_secs(8));
        assert_eq!(b.ceiling(5), Duration::from_secs(10));
        assert_eq!(b.ceiling(1000), Duration::from_secs(10));
        assert_eq!(b.delay(2, 0.0), Duration::from_secs(1));
        let almost = b.delay(2, 0.999_999);
        assert!(almost > Duration::from_millis(1999) && almost < Duration::from_secs(2));
        assert_eq!(b.delay(30, 1.0), Duration::from_secs(10));
        assert_eq!(b.delay(0, f64::NAN), Duration::from_millis(375));
        let unit = jitter_unit();
        assert!((0.0..1.0).contains(&unit));
    }

    #[test]
    fn endpoints_need_host_and_port() {
        let e = JoinEndpoint::parse("10.0.2.100:7000").unwrap();
        assert_eq!(e.uri(), "http://10.0.2.100:7000");
        assert_eq!(
            JoinEndpoint::parse("join.example:443").unwrap().to_string(),
            "join.example:443"
        );
        for bad in ["", "10.0.2.100", ":7000", "h:0", "h:70000", "a b:1", "h:x"] {
            assert_eq!(JoinEndpoint::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn endpoint_lists_keep_their_order_and_bad_lists_are_refused() {
        let list =
            JoinEndpoints::parse("10.0.2.100:7000, 10.0.2.101:7000,cp3.example:7000").unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(
            list.to_string(),
            "10.0.2.100:7000,10.0.2.101:7000,cp3.example:7000"
        );
        let order: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(
            order,
            ["10.0.2.100:7000", "10.0.2.101:7000", "cp3.example:7000"]
        );
        let seventeen: Vec<String> = (1..=17).map(|i| format!("10.0.0.{i}:7000")).collect();
        assert!(JoinEndpoints::parse(&seventeen[..16].join(",")).is_some());
        for bad in [
            "",
            ",",
            "10.0.2.100:7000,",
            "10.0.2.100:7000,10.0.2.100:7000",
            "10.0.2.100:7000;10.0.2.101:7000",
            &seventeen.join(","),
        ] {
            assert_eq!(JoinEndpoints::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_attested_join_service_must_run_this_image_after_its_pivot() {
        let own: BTreeMap<u8, [u8; 32]> = [
            (4, [4; 32]),
            (9, [9; 32]),
            (11, [11; 32]),
            (12, [12; 32]),
            (13, [0; 32]),
        ]
        .into();
        let expected = same_image_measurements(&own);
        let pinned: Vec<u8> = expected.enforced().collect();
        assert_eq!(pinned, [4, 9, 11, 12, 13]);
        assert_eq!(expected.get(9).unwrap().expected, [9; 32]);
        assert_eq!(
            expected.get(11).unwrap().expected,
            extend_sha256(&[11; 32], &phase_digest("leave-initrd"))
        );
        assert!(
            expected.get(15).is_none(),
            "the join service's cluster ID is not pinned"
        );
    }

    #[test]
    fn attested_trust_without_a_provider_ca_is_a_clear_error() {
        // The error names the file and the build flag; no TPM is touched before the CA is read.
        let err = JoinSetupError::NoProviderCa {
            path: PROVIDER_CA_PATH,
        };
        let text = err.to_string();
        assert!(text.contains("/etc/hawser/provider-ca.pem"), "{text}");
        assert!(text.contains("--provider-ca"), "{text}");
    }

    #[test]
    fn trust_names_round_trip() {
        for t in [JoinServiceTrust::Attested, JoinServiceTrust::InsecureDev] {
            assert_eq!(JoinServiceTrust::from_cmdline(t.cmdline_name()), Some(t));
        }
        assert_eq!(JoinServiceTrust::from_cmdline("none"), None);
    }

    #[test]
    fn a_fresh_node_of_this_image_is_what_the_in_cluster_join_service_expects() {
        let own: BTreeMap<u8, [u8; 32]> = [
            (4, [4; 32]),
            (9, [9; 32]),
            (11, [11; 32]),
            (12, [12; 32]),
            (13, [13; 32]),
            (15, [15; 32]),
            (0, [0xaa; 32]),
        ]
        .into_iter()
        .collect();
        let json = fresh_node_measurements_json(&own);
        let expected = ExpectedMeasurements::from_json(&json.to_string()).unwrap();
        for pcr in [4u8, 9, 11, 12, 13] {
            assert_eq!(expected.get(pcr).unwrap().expected, [pcr; 32], "PCR {pcr}");
        }
        // A joining node is fresh: its PCR 15 is zero, whatever this node's lock is.
        assert_eq!(expected.get(15).unwrap().expected, [0; 32]);
        // Firmware PCRs differ between VMs and are not pinned.
        assert!(expected.get(0).is_none());
    }
}
