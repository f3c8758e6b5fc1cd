//! Joining a cluster: the node proves what it booted to the join service over aTLS and receives
//! its state-disk key, then takes the node lock.
//!
//! - [`JoinEndpoint`] and [`JoinServiceTrust`]: where the join service is (fw_cfg or the
//!   command line: unmeasured is fine, trust comes from attestation) and how the node trusts it
//!   (the *measured* `hawser.join_service_trust`: `attested`, the default, or `insecure-dev`).
//! - [`Backoff`]: exponential backoff with jitter between attempts (pure).
//! - [`lock::NodeLock`]: the point of no return. Whoever first gets the cluster's secrets takes
//!   it; taking it extends PCR 15 with the cluster ID, so the node can never attest as fresh
//!   again in this boot. The state machine is pure; the TPM extension is a closure.
//! - [`client::JoinClient`]: the gRPC client with retries.

pub mod client;
pub mod lock;

use std::fmt;
use std::time::Duration;

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

/// The warning logged on every boot with `hawser.join_service_trust=insecure-dev`.
pub const INSECURE_TRUST_WARNING: &str = "INSECURE: hawser.join_service_trust=insecure-dev: the \
     node does not authenticate the join service; whoever answers at the join endpoint chooses \
     this node's state disk key and cluster. For development only.";

/// Exponential backoff with jitter: attempt `n` (from 0) waits a uniformly random time in
/// `[d/2, d]` where `d = min(max, base · 2ⁿ)` ("equal jitter": never a thundering herd, never
/// a zero wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(500),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
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
    // SAFETY: getrandom(2) writes at most `bytes.len()` bytes into the live buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    if n != 8 {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_jitters_within_half() {
        let b = Backoff::default();
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
    fn trust_names_round_trip() {
        for t in [JoinServiceTrust::Attested, JoinServiceTrust::InsecureDev] {
            assert_eq!(JoinServiceTrust::from_cmdline(t.cmdline_name()), Some(t));
        }
        assert_eq!(JoinServiceTrust::from_cmdline("none"), None);
    }
}
