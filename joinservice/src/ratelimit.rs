//! Per-peer rate limits: a token bucket per peer IP address.
//!
//! A node retries with backoff, so a peer that exceeds the limit is either broken or hostile;
//! it gets `RESOURCE_EXHAUSTED` with a retry hint while other peers are served normally.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Token buckets keyed by peer address.
#[derive(Debug)]
pub struct RateLimiter {
    rate_per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The peer is over its limit; it may retry after this long.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("rate limit exceeded for {peer}; retry in {:.1} s", retry_after.as_secs_f64())]
pub struct Limited {
    pub peer: IpAddr,
    pub retry_after: Duration,
}

/// Buckets idle this long are forgotten (they would be full again anyway).
const IDLE: Duration = Duration::from_secs(300);

impl RateLimiter {
    /// `rate_per_sec` sustained requests per peer, bursts of up to `burst`.
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        Self {
            rate_per_sec: rate_per_sec.max(f64::MIN_POSITIVE),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `peer` at time `now`.
    pub fn check(&self, peer: IpAddr, now: Instant) -> Result<(), Limited> {
        let mut buckets = match self.buckets.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if buckets.len() > 10_000 {
            buckets.retain(|_, b| now.saturating_duration_since(b.updated) < IDLE);
        }
        let bucket = buckets.entry(peer).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate_per_sec).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Limited {
                peer,
                retry_after: Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate_per_sec),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_limits_then_refills_per_peer() {
        let limiter = RateLimiter::new(2.0, 3);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            limiter.check(a, t0).unwrap();
        }
        let limited = limiter.check(a, t0).unwrap_err();
        assert_eq!(limited.peer, a);
        assert!(
            (limited.retry_after.as_secs_f64() - 0.5).abs() < 1e-6,
            "{limited}"
        );
        // Another peer is unaffected.
        limiter.check(b, t0).unwrap();
        // Half a second later one token is back, not more.
        let t1 = t0 + Duration::from_millis(500);
        limiter.check(a, t1).unwrap();
        assert!(limiter.check(a, t1).is_err());
        // Refill is capped at the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            limiter.check(a, t2).unwrap();
        }
        assert!(limiter.check(a, t2).is_err());
    }
}
