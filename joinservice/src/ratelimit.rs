//! Per-peer rate limits: a token bucket per peer IP address.
//!
//! A node retries with backoff, so a peer that exceeds the limit is either broken or hostile;
//! it gets `RESOURCE_EXHAUSTED` with a retry hint while other peers are served normally.
//!
//! The buckets are the ones aTLS listeners pace their quotes with
//! ([`hawser_attestation::atls::limits`]): one implementation of the arithmetic, used for calls
//! here and for handshakes there.

pub use hawser_attestation::atls::limits::{Limited, RateLimiter};
