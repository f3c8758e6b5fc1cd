//! The token pool: each token to one join, none near its expiry, a join mints its own when the
//! pool has none, nothing shown.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Mints numbered tokens (`00000n.0123456789abcdef`), remembering when each was minted.
#[derive(Default)]
struct Counting {
    minted: AtomicU32,
    times: Mutex<Vec<Instant>>,
    fail: std::sync::atomic::AtomicBool,
}

impl Counting {
    fn number(credentials: &JoinCredentials) -> usize {
        usize::from_str_radix(credentials.bootstrap_token.id(), 16).unwrap()
    }
}

impl BootstrapTokenIssuer for Counting {
    fn issue(&self, _ttl: Duration) -> Result<JoinCredentials, TokenError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(TokenError::Failed {
                command: "kubeadm token create".into(),
                status: "exit status: 1".into(),
                stderr: "the API server is down".into(),
            });
        }
        let mut times = self.times.lock().unwrap();
        let n = self.minted.fetch_add(1, Ordering::SeqCst);
        times.push(Instant::now());
        Ok(JoinCredentials {
            api_server_endpoint: "h:1".parse().unwrap(),
            bootstrap_token: format!("{n:06x}.0123456789abcdef").parse().unwrap(),
            discovery_ca_cert_hashes: vec![HASH.parse().unwrap()],
        })
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn each_token_goes_to_one_join_and_the_pool_refills_in_the_background() {
    let issuer = Arc::new(Counting::default());
    let ttl = Duration::from_secs(1800);
    let pool = Arc::new(TokenPool::start(issuer.clone(), ttl, 8).unwrap());
    wait_until("the pool to fill", || pool.pooled() == 8);
    // 8 threads × 5 joins at once: 40 tokens, all different, more than the pool held.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                (0..5)
                    .map(|_| Counting::number(&pool.issue(ttl).unwrap()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut taken: Vec<usize> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    taken.sort_unstable();
    let before = taken.len();
    taken.dedup();
    assert_eq!(taken.len(), before, "a token went to two joins");
    // Below the low-water mark, the refiller tops the pool up again. The joins may have left
    // it anywhere from empty to full (a take above the mark wakes nobody): take it below the
    // mark first, then it refills to its size.
    while pool.pooled() >= 4 {
        pool.take(Instant::now());
    }
    wait_until("the pool to refill", || pool.pooled() == 8);
    let pooled = pool.take(Instant::now()).unwrap();
    assert!(!taken.contains(&Counting::number(&pooled)));
}

#[test]
fn a_pooled_token_is_handed_out_only_with_most_of_its_life_left() {
    let issuer = Arc::new(Counting::default());
    // max_age = 60 ms.
    let ttl = Duration::from_millis(360);
    assert_eq!(TokenPool::max_age(ttl), Duration::from_millis(60));
    let pool = TokenPool::start(issuer.clone(), ttl, 4).unwrap();
    wait_until("the pool to fill", || pool.pooled() == 4);
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(25));
        let taken = Instant::now();
        let credentials = pool.issue(ttl).unwrap();
        let minted = issuer.times.lock().unwrap()[Counting::number(&credentials)];
        let age = taken.saturating_duration_since(minted);
        assert!(
            age <= TokenPool::max_age(ttl),
            "a token {age:?} old was handed out (ttl {ttl:?})"
        );
    }
    // Stale tokens were replaced while idle: the pool holds fresh ones.
    std::thread::sleep(Duration::from_millis(150));
    let now = Instant::now();
    let times = issuer.times.lock().unwrap().clone();
    let pool_state = lock(&pool.shared.state);
    assert!(!pool_state.tokens.is_empty());
    for (credentials, minted) in &pool_state.tokens {
        // The pool stamps a token when its mint begins, the issuer inside the mint.
        let issued = times[Counting::number(credentials)];
        assert!(issued >= *minted && issued - *minted < Duration::from_secs(1));
        assert!(now.saturating_duration_since(*minted) <= TokenPool::max_age(ttl) * 2);
    }
}

#[test]
fn an_empty_pool_or_another_ttl_mints_for_the_join() {
    let issuer = Arc::new(Counting::default());
    let ttl = Duration::from_secs(1800);
    // Size 0: never filled, every join mints (as without a pool).
    let none = TokenPool::start(issuer.clone(), ttl, 0).unwrap();
    let a = none.issue(ttl).unwrap();
    let b = none.issue(ttl).unwrap();
    assert_ne!(a, b);
    assert_eq!(issuer.minted.load(Ordering::SeqCst), 2);
    assert_eq!(none.pooled(), 0);

    let issuer = Arc::new(Counting::default());
    let pool = TokenPool::start(issuer.clone(), ttl, 2).unwrap();
    wait_until("the pool to fill", || pool.pooled() == 2);
    // A TTL other than the pool's is minted for the join, never taken from the pool.
    pool.issue(Duration::from_secs(60)).unwrap();
    assert_eq!(pool.pooled(), 2);
    assert_eq!(issuer.minted.load(Ordering::SeqCst), 3);
}

#[test]
fn a_failing_issuer_fails_the_join_that_finds_the_pool_empty() {
    let issuer = Arc::new(Counting::default());
    issuer.fail.store(true, Ordering::SeqCst);
    let ttl = Duration::from_secs(1800);
    let pool = TokenPool::start(issuer.clone(), ttl, 4).unwrap();
    let err = pool.issue(ttl).unwrap_err();
    assert!(err.to_string().contains("the API server is down"), "{err}");
    // The refiller retries (after its pause) once the issuer works again.
    issuer.fail.store(false, Ordering::SeqCst);
    wait_until("the pool to fill after the issuer recovered", || {
        pool.pooled() == 4
    });
}

#[test]
fn debug_shows_counts_not_tokens() {
    let issuer = Arc::new(Counting::default());
    let pool = TokenPool::start(issuer, Duration::from_secs(1800), 2).unwrap();
    wait_until("the pool to fill", || pool.pooled() == 2);
    let debug = format!("{pool:?}");
    assert!(!debug.contains("0123456789abcdef"), "{debug}");
    assert!(debug.contains("pooled: 2"), "{debug}");
}
