//! Pre-authentication limits of an aTLS listener, and the token buckets they are made of.
//!
//! An aTLS server quotes with its TPM for every ClientHello, before the client has proved
//! anything, and a TPM does one quote at a time (≈ 10 ms on swtpm, ≈ 100 ms in a TCG guest).
//! Without limits, a few hundred connection loops queue enough TPM work that a genuine client's
//! handshake times out, and connections that finish their handshake and then say nothing are
//! held for ever. [`ConnectionLimits`] bounds each of these, and every bound refuses *before*
//! the TPM is asked:
//!
//! - **In flight, per source and in total** ([`ConnectionLimits::max_handshakes_per_source`],
//!   [`ConnectionLimits::max_handshakes`]): connections accepted and not yet through their
//!   handshake. The excess is closed as soon as it is accepted, so the kernel's backlog keeps
//!   draining and a genuine client is not queued behind a flood. One attacker address cannot
//!   take more than its share; IPv6 sources count per /64 (one host gets a whole /64).
//! - **Quote rate** ([`QuotePacer`]): the handshakes of one listener take their quote in
//!   arrival order (first come, first served), at most [`ConnectionLimits::quotes_per_sec`]
//!   sustained; at most [`ConnectionLimits::max_queued_quotes_per_source`] from one source
//!   and [`ConnectionLimits::max_queued_quotes`] in all wait or quote at once, and the next is
//!   refused at once (after its ClientHello, before the TPM). A genuine client therefore waits
//!   behind an attacker with `S` addresses for at most about
//!   `S × max_queued_quotes_per_source / quotes_per_sec` (0.8 s for 4 addresses with the
//!   defaults). Only an attacker with more than `max_queued_quotes / per_source` addresses (32
//!   with the defaults) can keep the queue full, and then the genuine client's retries compete
//!   with its connections for the freed places.
//! - **Idle connections** ([`ConnectionLimits::idle_timeout`]): an established connection with
//!   no call in progress for this long is closed (see `CallTracking` in the `tonic` feature).
//!   Established connections therefore number at most about
//!   `quotes_per_sec × idle_timeout + quote_burst` for a server that quotes per connection.
//! - The handshake itself is bounded by the server's handshake timeout
//!   ([`super::DEFAULT_HANDSHAKE_TIMEOUT`]).
//!
//! Refusals are logged at most once per [`REFUSAL_LOG_INTERVAL`] per listener and cause, with the
//! number refused meanwhile: a flood does not become a log flood.
//!
//! [`RateLimiter`] (per-address buckets that refuse with a retry hint) is the join service's
//! per-call limit; it lives here because it shares the bucket arithmetic.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::AtlsError;

/// Default of [`ConnectionLimits::max_handshakes`].
pub const DEFAULT_MAX_HANDSHAKES: usize = 64;
/// Default of [`ConnectionLimits::max_handshakes_per_source`]: a genuine client runs one
/// handshake at a time; a few more allow for retries overlapping a dying attempt and for
/// several genuine clients behind one NAT.
pub const DEFAULT_MAX_HANDSHAKES_PER_SOURCE: usize = 8;
/// Default of [`ConnectionLimits::quotes_per_sec`]: about what a vTPM under TCG can do (≈ 100 ms
/// per quote), so the pacing costs a genuine client nothing when the listener is quiet.
pub const DEFAULT_QUOTES_PER_SEC: f64 = 10.0;
/// Default of [`ConnectionLimits::quote_burst`].
pub const DEFAULT_QUOTE_BURST: u32 = 10;
/// Default of [`ConnectionLimits::max_queued_quotes`]: at the default rate, the last of them
/// gets its quote after ≈ 6.4 s, inside the default handshake timeout of 10 s.
pub const DEFAULT_MAX_QUEUED_QUOTES: usize = 64;
/// Default of [`ConnectionLimits::max_queued_quotes_per_source`]: a genuine client quotes once
/// per handshake; the second is a retry overlapping its abandoned attempt.
pub const DEFAULT_MAX_QUEUED_QUOTES_PER_SOURCE: usize = 2;
/// Default of [`ConnectionLimits::idle_timeout`]: a client connects to make a call; a minute
/// without one is not a client.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// At most one refusal line per listener and cause this often.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What an aTLS listener allows clients that have not authenticated yet (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionLimits {
    /// Connections accepted and not yet through their handshake, in total.
    pub max_handshakes: usize,
    /// Connections accepted and not yet through their handshake, from one source address
    /// (IPv6: one /64).
    pub max_handshakes_per_source: usize,
    /// Quotes per second the listener's handshakes may take, sustained.
    pub quotes_per_sec: f64,
    /// Quotes taken at once after a quiet period.
    pub quote_burst: u32,
    /// Handshakes waiting for their quote or quoting, at most; the next is refused at once.
    pub max_queued_quotes: usize,
    /// Handshakes from one source address (IPv6: one /64) waiting for their quote or quoting,
    /// at most: what keeps the first-come-first-served queue fair between addresses.
    pub max_queued_quotes_per_source: usize,
    /// An established connection with no call in progress for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
            quotes_per_sec: DEFAULT_QUOTES_PER_SEC,
            quote_burst: DEFAULT_QUOTE_BURST,
            max_queued_quotes: DEFAULT_MAX_QUEUED_QUOTES,
            max_queued_quotes_per_source: DEFAULT_MAX_QUEUED_QUOTES_PER_SOURCE,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// One token bucket: `rate_per_sec` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate_per_sec: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate_per_sec: rate_per_sec.max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            updated: now,
        }
    }

    /// Takes one token at `now`, or says how long until there is one.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_sec).min(self.burst);
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.rate_per_sec,
            ))
        }
    }

    fn last_update(&self) -> Instant {
        self.updated
    }
}

/// Token buckets keyed by peer address.
#[derive(Debug)]
pub struct RateLimiter {
    rate_per_sec: f64,
    burst: u32,
    buckets: Mutex<HashMap<IpAddr, TokenBucket>>,
}

/// The peer is over its limit; it may retry after this long.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("rate limit exceeded for {peer}; retry in {:.1} s", retry_after.as_secs_f64())]
pub struct Limited {
    pub peer: IpAddr,
    pub retry_after: Duration,
}

/// Buckets idle this long are forgotten (they would be full again anyway).
const IDLE_BUCKET: Duration = Duration::from_secs(300);
/// Buckets kept before idle ones are swept.
const MAX_BUCKETS: usize = 10_000;

impl RateLimiter {
    /// `rate_per_sec` sustained requests per peer, bursts of up to `burst`.
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        Self {
            rate_per_sec,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `peer` at time `now`.
    pub fn check(&self, peer: IpAddr, now: Instant) -> Result<(), Limited> {
        let mut buckets = lock(&self.buckets);
        if buckets.len() > MAX_BUCKETS {
            buckets.retain(|_, b| now.saturating_duration_since(b.last_update()) < IDLE_BUCKET);
        }
        buckets
            .entry(peer)
            .or_insert_with(|| TokenBucket::new(self.rate_per_sec, self.burst, now))
            .take(now)
            .map_err(|retry_after| Limited { peer, retry_after })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a connection was refused before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its source already has the most handshakes in flight.
    SourceBusy,
    /// The listener already has the most handshakes in flight.
    ListenerBusy,
    /// The most handshakes already wait for a quote.
    QuoteQueueFull,
    /// The most handshakes from its source already wait for a quote.
    SourceQuotesQueued,
}

impl Refused {
    fn describe(self, limit: usize) -> String {
        match self {
            Refused::SourceBusy => {
                format!("its source address already has {limit} handshakes in progress")
            }
            Refused::ListenerBusy => {
                format!("the listener already has {limit} handshakes in progress")
            }
            Refused::QuoteQueueFull => format!("{limit} handshakes already wait for a TPM quote"),
            Refused::SourceQuotesQueued => {
                format!("{limit} handshakes from its source address already wait for a TPM quote")
            }
        }
    }
}

/// Logs refusals of one cause at most once per [`REFUSAL_LOG_INTERVAL`], with a count of those
/// refused since the last line.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    cause: Refused,
    limit: usize,
    window: Mutex<(Option<Instant>, u64)>,
}

impl RefusalLog {
    pub(crate) fn new(cause: Refused, limit: usize) -> Self {
        Self {
            cause,
            limit,
            window: Mutex::new((None, 0)),
        }
    }

    pub(crate) fn refused(&self, peer: Option<IpAddr>) {
        let now = Instant::now();
        let mut window = lock(&self.window);
        let (last, suppressed) = &mut *window;
        if last.is_some_and(|last| now.saturating_duration_since(last) < REFUSAL_LOG_INTERVAL) {
            *suppressed += 1;
            return;
        }
        let since_last = std::mem::take(suppressed);
        *last = Some(now);
        drop(window);
        let peer = peer.map_or_else(|| "?".to_owned(), |p| p.to_string());
        tracing::warn!(
            %peer,
            refused_since_last_report = since_last,
            "refused an unauthenticated connection: {} (further refusals are counted, reported \
             at most every {} s)",
            self.cause.describe(self.limit),
            REFUSAL_LOG_INTERVAL.as_secs()
        );
    }
}

/// The key a source address is counted under: IPv4 (and IPv4-mapped IPv6) per address, IPv6
/// per /64, since one host is routinely given a whole /64.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

/// Counts connections in their handshake, per source and in total; and, for a listener that
/// queues ([`super::incoming_queued_from`]), the connections waiting for a place of their
/// source, first come first served.
#[derive(Debug)]
pub(crate) struct Admission {
    max_total: usize,
    max_per_source: usize,
    counts: Mutex<Counts>,
    source_busy: RefusalLog,
    listener_busy: RefusalLog,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
    /// Per source, the connections waiting for its next free place (a place is handed over
    /// by the handshake that ends, without being counted free in between).
    waiting: HashMap<IpAddr, std::collections::VecDeque<tokio::sync::oneshot::Sender<()>>>,
    /// Entries of `waiting` (those whose connection gave up are removed when reached).
    waiting_total: usize,
}

/// A connection waiting for a place of its source ([`Admission::wait`]).
#[derive(Debug)]
pub(crate) struct Waiting {
    admission: Arc<Admission>,
    source: IpAddr,
    place: tokio::sync::oneshot::Receiver<()>,
}

impl Waiting {
    /// Its place, once a handshake of its source ends, or `None` after `max_wait`.
    pub(crate) async fn admitted(mut self, max_wait: Duration) -> Option<Admitted> {
        let handed = match tokio::time::timeout(max_wait, &mut self.place).await {
            Ok(result) => result.is_ok(),
            Err(_) => {
                // A place handed over just as the wait ended is still this connection's.
                self.place.close();
                self.place.try_recv().is_ok()
            }
        };
        handed.then(|| Admitted {
            admission: Arc::clone(&self.admission),
            source: self.source,
        })
    }
}

/// A connection counted by [`Admission`] until it is dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    source: IpAddr,
}

impl Admission {
    pub(crate) fn new(limits: &ConnectionLimits) -> Self {
        let max_total = limits.max_handshakes.max(1);
        let max_per_source = limits.max_handshakes_per_source.max(1);
        Self {
            max_total,
            max_per_source,
            counts: Mutex::new(Counts::default()),
            source_busy: RefusalLog::new(Refused::SourceBusy, max_per_source),
            listener_busy: RefusalLog::new(Refused::ListenerBusy, max_total),
        }
    }

    /// Counts a new connection from `peer`, or refuses it (and logs that, rate-limited).
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, Refused> {
        let source = source_key(peer);
        let mut counts = lock(&self.counts);
        let refused = if counts.total >= self.max_total {
            Some((Refused::ListenerBusy, &self.listener_busy))
        } else if counts.per_source.get(&source).copied().unwrap_or(0) >= self.max_per_source {
            Some((Refused::SourceBusy, &self.source_busy))
        } else {
            None
        };
        if let Some((cause, log)) = refused {
            drop(counts);
            log.refused(Some(peer));
            return Err(cause);
        }
        counts.total += 1;
        *counts.per_source.entry(source).or_insert(0) += 1;
        Ok(Admitted {
            admission: Arc::clone(self),
            source,
        })
    }

    /// Like [`Admission::admit`], but a connection refused only because its source is busy
    /// waits for that source's next free place (see [`Waiting::admitted`]) instead, while
    /// fewer than the listener's total bound wait in all. Nothing is read from a waiting
    /// connection: it costs a socket, no TLS and no TPM work.
    pub(crate) fn admit_or_wait(
        self: &Arc<Self>,
        peer: IpAddr,
    ) -> Result<Result<Admitted, Waiting>, Refused> {
        let source = source_key(peer);
        {
            let mut counts = lock(&self.counts);
            let busy = counts.total < self.max_total
                && counts.per_source.get(&source).copied().unwrap_or(0) >= self.max_per_source;
            if busy && counts.waiting_total < self.max_total {
                let (handed, place) = tokio::sync::oneshot::channel();
                counts.waiting.entry(source).or_default().push_back(handed);
                counts.waiting_total += 1;
                return Ok(Err(Waiting {
                    admission: Arc::clone(self),
                    source,
                    place,
                }));
            }
        }
        self.admit(peer).map(Ok)
    }

    /// A connection of `source` left its handshake: its place goes to the first connection of
    /// the same source still waiting, else it is free.
    fn release(&self, source: IpAddr) {
        let mut counts = lock(&self.counts);
        let counts = &mut *counts;
        if let Some(queue) = counts.waiting.get_mut(&source) {
            while let Some(waiter) = queue.pop_front() {
                counts.waiting_total = counts.waiting_total.saturating_sub(1);
                if waiter.send(()).is_ok() {
                    if queue.is_empty() {
                        counts.waiting.remove(&source);
                    }
                    return;
                }
            }
            counts.waiting.remove(&source);
        }
        counts.total = counts.total.saturating_sub(1);
        if let Some(count) = counts.per_source.get_mut(&source) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.per_source.remove(&source);
            }
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.release(self.source);
    }
}

/// Paces the quotes of one listener's handshakes: first come, first served, at most
/// `quotes_per_sec` sustained, at most `max_queued` waiting or quoting (see the module docs).
/// Shared by every handshake of a listener ([`super::AtlsServer::with_quote_pacer`]).
#[derive(Debug)]
pub struct QuotePacer {
    /// tokio's mutex queues its waiters in order: the pacing is first come, first served.
    bucket: tokio::sync::Mutex<TokenBucket>,
    /// Waiting or quoting: in total, and per source.
    queued: Mutex<(usize, HashMap<IpAddr, usize>)>,
    max_queued: usize,
    max_per_source: usize,
    queue_full: RefusalLog,
    source_queued: RefusalLog,
}

/// A handshake's turn to quote; the queue place is held until it is dropped (after the quote).
#[derive(Debug)]
pub struct QuotePermit {
    pacer: Arc<QuotePacer>,
    source: Option<IpAddr>,
}

impl Drop for QuotePermit {
    fn drop(&mut self) {
        let mut queued = lock(&self.pacer.queued);
        let (total, per_source) = &mut *queued;
        *total = total.saturating_sub(1);
        if let Some(source) = self.source
            && let Some(count) = per_source.get_mut(&source)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                per_source.remove(&source);
            }
        }
    }
}

impl QuotePacer {
    /// A pacer for `limits`' quote rate, burst and queue.
    pub fn new(limits: &ConnectionLimits) -> Self {
        let max_queued = limits.max_queued_quotes.max(1);
        let max_per_source = limits.max_queued_quotes_per_source.max(1);
        Self {
            bucket: tokio::sync::Mutex::new(TokenBucket::new(
                limits.quotes_per_sec,
                limits.quote_burst,
                tokio::time::Instant::now().into_std(),
            )),
            queued: Mutex::new((0, HashMap::new())),
            max_queued,
            max_per_source,
            queue_full: RefusalLog::new(Refused::QuoteQueueFull, max_queued),
            source_queued: RefusalLog::new(Refused::SourceQuotesQueued, max_per_source),
        }
    }

    /// Waits for this handshake's turn to quote, or refuses at once when the queue, or the
    /// share of it that `peer`'s source may take, is full.
    pub async fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<QuotePermit, AtlsError> {
        let source = peer.map(source_key);
        {
            let mut queued = lock(&self.queued);
            let (total, per_source) = &mut *queued;
            let of_source = source
                .and_then(|s| per_source.get(&s).copied())
                .unwrap_or(0);
            if *total >= self.max_queued {
                drop(queued);
                self.queue_full.refused(peer);
                return Err(AtlsError::QuoteQueueFull {
                    queued: self.max_queued,
                });
            }
            if of_source >= self.max_per_source {
                drop(queued);
                self.source_queued.refused(peer);
                return Err(AtlsError::QuoteQueueFull {
                    queued: self.max_per_source,
                });
            }
            *total += 1;
            if let Some(source) = source {
                *per_source.entry(source).or_insert(0) += 1;
            }
        }
        let permit = QuotePermit {
            pacer: Arc::clone(self),
            source,
        };
        let mut bucket = self.bucket.lock().await;
        // tokio's clock, so that tests with paused time see the pacing.
        while let Err(wait) = bucket.take(tokio::time::Instant::now().into_std()) {
            tokio::time::sleep(wait).await;
        }
        Ok(permit)
    }

    /// Handshakes waiting for their quote or quoting now.
    pub fn queued(&self) -> usize {
        lock(&self.queued).0
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

    #[test]
    fn sources_count_per_address_and_per_ipv6_64() {
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(source_key(v4), v4);
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(source_key(mapped), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        assert_ne!(source_key(a), source_key(c));
    }

    #[test]
    fn admission_bounds_each_source_and_the_total_and_releases_on_drop() {
        let admission = Arc::new(Admission::new(&ConnectionLimits {
            max_handshakes: 3,
            max_handshakes_per_source: 2,
            ..ConnectionLimits::default()
        }));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let first = admission.admit(a).unwrap();
        let _second = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refused::SourceBusy);
        let _third = admission.admit(b).unwrap();
        assert_eq!(admission.admit(c).unwrap_err(), Refused::ListenerBusy);
        drop(first);
        let _again = admission.admit(a).unwrap();
    }

    #[tokio::test]
    async fn over_its_sources_bound_a_connection_waits_for_that_sources_next_place() {
        let admission = Arc::new(Admission::new(&ConnectionLimits {
            max_handshakes: 3,
            max_handshakes_per_source: 1,
            ..ConnectionLimits::default()
        }));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = admission.admit_or_wait(a).unwrap().unwrap();
        let waiting = admission.admit_or_wait(a).unwrap().unwrap_err();
        // Another source is admitted at once.
        let _other = admission.admit_or_wait(b).unwrap().unwrap();
        // Without a free place, a wait ends empty-handed.
        let in_vain = admission.admit_or_wait(a).unwrap().unwrap_err();
        assert!(in_vain.admitted(Duration::from_millis(20)).await.is_none());
        // The first to wait gets the place the first handshake leaves, handed over: the
        // source still holds one place, so a further one is over its bound.
        let handed = tokio::spawn(waiting.admitted(Duration::from_secs(5)));
        drop(first);
        let second = handed.await.unwrap().expect("the place was handed over");
        assert_eq!(admission.admit(a).unwrap_err(), Refused::SourceBusy);
        // At most `max_handshakes` wait (the one that gave up counts until it is reached):
        // beyond, refused as without queueing.
        let queued: Vec<_> = (0..2)
            .map(|_| admission.admit_or_wait(a).unwrap().unwrap_err())
            .collect();
        assert_eq!(admission.admit_or_wait(a).unwrap_err(), Refused::SourceBusy);
        drop(queued);
        // Places of waiters that gave up are not handed to them: freed.
        drop(second);
        let _again = admission.admit(a).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_pacer_paces_and_refuses_beyond_its_queue() {
        let pacer = Arc::new(QuotePacer::new(&ConnectionLimits {
            quotes_per_sec: 10.0,
            quote_burst: 1,
            max_queued_quotes: 3,
            max_queued_quotes_per_source: 2,
            ..ConnectionLimits::default()
        }));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = pacer.admit(Some(a)).await.unwrap();
        // The second waits for the bucket's next token (100 ms at 10/s).
        let started = tokio::time::Instant::now();
        let second = pacer.admit(Some(a)).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(90));
        // Its source's share is taken: a third from it is refused at once, another source's
        // is not.
        assert!(matches!(
            pacer.admit(Some(a)).await,
            Err(AtlsError::QuoteQueueFull { queued: 2 })
        ));
        let third = pacer.admit(Some(b)).await.unwrap();
        // Three hold the queue: the next is refused at once, whatever its source.
        assert!(matches!(
            pacer.admit(None).await,
            Err(AtlsError::QuoteQueueFull { queued: 3 })
        ));
        drop((first, second, third));
        assert_eq!(pacer.queued(), 0);
    }
}
