//! Bootstrap tokens minted ahead of the joins: a bounded pool of single-use tokens, refilled in
//! the background, so that no `kubeadm token create` runs on a join's path.
//!
//! The pool keeps every property of a token minted for its join:
//!
//! - **one join, one token**: a token leaves the pool when a join takes it (under the pool's
//!   lock) and is never put back, also when that join is refused afterwards;
//! - **short-lived, with most of its life left**: tokens are minted with the join path's TTL
//!   (`--token-ttl-secs`), and a pooled token is handed out only while it is younger than
//!   [`TokenPool::max_age`] (a sixth of the TTL: 5 minutes of the default 30), so every node
//!   receives a token with at least five sixths of its lifetime left. Older ones are discarded
//!   unused (they expire in the cluster unseen: nobody but this process ever held them);
//! - **never shown**: tokens are [`BootstrapToken`](hawser_kube_types::BootstrapToken)s
//!   (zeroized, redacted in `Debug`); the pool's `Debug` and logs give counts only.
//!
//! A join that finds the pool empty (a burst larger than the pool, or a TTL other than the
//! pool's) mints its own token, as without a pool. The refiller (one thread) tops the pool up
//! to its size whenever it falls below the low-water mark (half the size) or a token aged out,
//! one `kubeadm token create` at a time; a failing issuer is retried with a doubling pause
//! (1 s to 30 s) and logged without the token.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::{BootstrapTokenIssuer, JoinCredentials, TokenError};

/// Default of `--token-pool`: a burst of this many joins runs without a kubeadm process.
pub const DEFAULT_POOL_SIZE: usize = 32;
/// The refiller's first pause after a failed mint; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// A pool of pre-minted single-use bootstrap tokens in front of an issuer (see the module
/// docs). It is itself an issuer: [`BootstrapTokenIssuer::issue`] takes a pooled token, or
/// mints one when none is fit.
pub struct TokenPool {
    shared: Arc<Shared>,
}

struct Shared {
    issuer: Arc<dyn BootstrapTokenIssuer>,
    ttl: Duration,
    size: usize,
    low_water: usize,
    max_age: Duration,
    state: Mutex<State>,
    /// Wakes the refiller: a take left the pool below its low-water mark, or the pool closed.
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// Oldest first, each with the time its mint began (its expiry is at most `ttl` later).
    tokens: VecDeque<(JoinCredentials, Instant)>,
    /// Set when the pool first reached its size (logged once).
    filled_once: bool,
    closed: bool,
}

impl std::fmt::Debug for TokenPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenPool")
            .field("size", &self.shared.size)
            .field("ttl", &self.shared.ttl)
            .field("pooled", &self.pooled())
            .finish_non_exhaustive()
    }
}

impl TokenPool {
    /// A pool of `size` tokens of lifetime `ttl` minted by `issuer`, and its refiller thread,
    /// which starts filling it at once. `size` 0 is a pool that is never filled (every join
    /// mints its token).
    pub fn start(
        issuer: Arc<dyn BootstrapTokenIssuer>,
        ttl: Duration,
        size: usize,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            issuer,
            ttl,
            size,
            low_water: size.div_ceil(2),
            max_age: Self::max_age(ttl),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        if size > 0 {
            let weak = Arc::downgrade(&shared);
            std::thread::Builder::new()
                .name("token-pool".into())
                .spawn(move || refill(weak))?;
        }
        Ok(Self { shared })
    }

    /// How old a pooled token may be when a join takes it: a sixth of its lifetime.
    pub fn max_age(ttl: Duration) -> Duration {
        ttl / 6
    }

    /// Tokens in the pool now (stale ones included until the refiller or a take drops them).
    pub fn pooled(&self) -> usize {
        lock(&self.shared.state).tokens.len()
    }

    /// Takes the oldest pooled token still young enough, dropping the stale ones in front of
    /// it; `None` when none is fit. Wakes the refiller below the low-water mark.
    fn take(&self, now: Instant) -> Option<JoinCredentials> {
        let shared = &self.shared;
        let mut state = lock(&shared.state);
        let mut taken = None;
        while let Some((credentials, minted)) = state.tokens.pop_front() {
            if now.saturating_duration_since(minted) <= shared.max_age {
                taken = Some(credentials);
                break;
            }
        }
        if state.tokens.len() < shared.low_water {
            shared.wake.notify_one();
        }
        taken
    }
}

impl Drop for TokenPool {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.wake.notify_all();
    }
}

impl BootstrapTokenIssuer for TokenPool {
    fn issue(&self, ttl: Duration) -> Result<JoinCredentials, TokenError> {
        if ttl == self.shared.ttl
            && let Some(credentials) = self.take(Instant::now())
        {
            return Ok(credentials);
        }
        self.shared.issuer.issue(ttl)
    }
}

/// The refiller: tops the pool up to its size, one mint at a time, whenever it is below its
/// low-water mark or its oldest token ages out; ends when the pool is dropped.
fn refill(shared: Weak<Shared>) {
    let mut retry = FIRST_RETRY;
    loop {
        let Some(pool) = shared.upgrade() else {
            return;
        };
        {
            let mut state = lock(&pool.state);
            loop {
                if state.closed {
                    return;
                }
                let now = Instant::now();
                let before = state.tokens.len();
                state
                    .tokens
                    .retain(|(_, minted)| now.saturating_duration_since(*minted) <= pool.max_age);
                let dropped = before - state.tokens.len();
                if dropped > 0 {
                    tracing::debug!(dropped, "bootstrap tokens aged out of the pool unused");
                }
                // Topping up runs to the full size once started; it starts below the
                // low-water mark, and after an age-out (the pool then stays full when idle).
                if state.tokens.len() < pool.low_water || dropped > 0 {
                    break;
                }
                let until_stale = state
                    .tokens
                    .front()
                    .map(|(_, minted)| {
                        (*minted + pool.max_age).saturating_duration_since(now)
                            + Duration::from_millis(1)
                    })
                    .unwrap_or(pool.max_age);
                state = match pool.wake.wait_timeout(state, until_stale) {
                    Ok((guard, _)) => guard,
                    Err(poisoned) => poisoned.into_inner().0,
                };
            }
        }
        // Top up without holding the lock: joins take tokens meanwhile.
        loop {
            if lock(&pool.state).closed {
                return;
            }
            let minted = Instant::now();
            match pool.issuer.issue(pool.ttl) {
                Ok(credentials) => {
                    retry = FIRST_RETRY;
                    let mut state = lock(&pool.state);
                    state.tokens.push_back((credentials, minted));
                    if state.tokens.len() >= pool.size {
                        if !state.filled_once {
                            state.filled_once = true;
                            tracing::info!(tokens = pool.size, "bootstrap token pool filled");
                        }
                        break;
                    }
                }
                Err(err) => {
                    // The error never holds a token (`TokenError` redacts kubeadm's output).
                    tracing::warn!(
                        err = hawser_attestation::error_chain(&err),
                        retry_in = ?retry,
                        "cannot mint a bootstrap token for the pool; joins mint their own meanwhile"
                    );
                    let state = lock(&pool.state);
                    let _ = pool.wake.wait_timeout(state, retry);
                    retry = (retry * 2).min(MAX_RETRY);
                    break;
                }
            }
        }
    }
}

fn lock(mutex: &Mutex<State>) -> MutexGuard<'_, State> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
