//! A node's browser for the join service on the LAN, as PID 1 uses it: drained on a thread of
//! its own, probed before each round of join attempts.
//!
//! Two things went wrong when the browser was only read while a round looked for adverts
//! (issue 28): mdns-sd ends a subscription that falls 1000 events behind, which a LAN of
//! hundreds of adverts did during one 30 s join attempt, and every advert, answering or not,
//! cost a whole join attempt. So:
//!
//! - a thread (`hawser-mdns-browse`) takes in mdns-sd's events as they come, and answers the
//!   rounds' questions; the browser subscribes again if mdns-sd still drops it;
//! - [`LanBrowser::round`] ranks what was heard ([`crate::rank`]: random order, those that
//!   answered before first, the failed and departing last), probes the first [`PROBE_BUDGET`]
//!   endpoints' TCP ports at once ([`crate::probe`]), tells the sightings which answered, and
//!   hands out only those, in rank order. The next round probes the next ones: those not
//!   probed yet rank before those that failed.
//!
//! The bound this gives is in `docs/discovery.md` ("How long a flood can delay a node").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mdns_sd::ServiceDaemon;

use crate::mdns::{Browser, MdnsError};
use crate::probe::{PROBE_TIMEOUT, probe};
use crate::{Candidate, rank};

/// How many endpoints a round probes at most: a flood of adverts costs a round of
/// [`PROBE_TIMEOUT`] per this many fakes.
pub const PROBE_BUDGET: usize = 256;
/// How long the browsing thread waits for an event before it answers the rounds (and looks at
/// its stop flag).
const DRAIN_WAIT: Duration = Duration::from_millis(100);
/// How often a round looks again while it waits for a first advert.
const POLL: Duration = Duration::from_millis(100);

/// What the browsing thread is told by the rounds.
enum Command {
    Probed(SocketAddr, bool),
    AttemptFailed(SocketAddr),
    Reserve(Option<String>),
    Report(tokio::sync::oneshot::Sender<Heard>),
}

/// What the browser heard, as the browsing thread reports it.
#[derive(Default)]
struct Heard {
    seen: Vec<Candidate>,
    restarts: u64,
    refused: u64,
}

struct Shared {
    stop: AtomicBool,
    /// The browsing thread ended: the daemon shut down.
    ended: AtomicBool,
}

/// One round's candidates.
#[derive(Debug, Clone, Default)]
pub struct Round {
    /// Those whose TCP port answered the probe, in the order to try them.
    pub answered: Vec<Candidate>,
    /// Those that did not answer within [`PROBE_TIMEOUT`] (or refused the connection).
    pub silent: Vec<Candidate>,
    /// How many more were heard, left for later rounds ([`PROBE_BUDGET`]).
    pub unprobed: usize,
    /// How often mdns-sd ended the subscription so far (and the browser browsed again).
    pub restarts: u64,
    /// How many adverts were left out so far because the table was full of live ones.
    pub refused: u64,
}

/// The browser on its thread.
pub struct LanBrowser {
    shared: Arc<Shared>,
    commands: Mutex<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<()>>,
}

impl LanBrowser {
    /// Browses on `daemon` (see [`Browser::start`] for `cluster_filter`) and starts the thread
    /// that drains it.
    pub fn start(
        daemon: &ServiceDaemon,
        cluster_filter: Option<String>,
    ) -> Result<Self, MdnsError> {
        let browser = Browser::start(daemon, cluster_filter)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        let (commands, received) = mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("hawser-mdns-browse".into())
            .spawn(move || drain(browser, &thread_shared, &received))
            .map_err(MdnsError::Thread)?;
        Ok(LanBrowser {
            shared,
            commands: Mutex::new(commands),
            thread: Some(thread),
        })
    }

    /// Every advert heard (any cluster).
    pub async fn seen(&self) -> Vec<Candidate> {
        self.heard().await.seen
    }

    /// How often mdns-sd ended the subscription and the browser browsed again.
    pub async fn restarts(&self) -> u64 {
        self.heard().await.restarts
    }

    /// Join attempts at `endpoints` failed: they are offered after the others from now on
    /// (a forged address costs one attempt), and their places can go to newcomers.
    pub fn attempts_failed(&self, endpoints: &[SocketAddr]) {
        for &endpoint in endpoints {
            self.send(Command::AttemptFailed(endpoint));
        }
    }

    /// The candidates of a round of join attempts: waits up to `wait` for a first advert (of
    /// `own_cluster`, if given: other clusters' are left out, and [`MAX_PER_CLUSTER`] places
    /// kept for it), ranks them, probes them all, and returns those that answered first.
    ///
    /// [`MAX_PER_CLUSTER`]: crate::sightings::MAX_PER_CLUSTER
    pub async fn round(&self, own_cluster: Option<&str>, wait: Duration) -> Round {
        self.send(Command::Reserve(own_cluster.map(str::to_owned)));
        let deadline = Instant::now() + wait;
        let (mut ranked, heard) = loop {
            let heard = self.heard().await;
            let ranked = rank(heard.seen.clone(), own_cluster);
            if !ranked.is_empty()
                || Instant::now() >= deadline
                || self.shared.ended.load(Ordering::Relaxed)
            {
                break (ranked, heard);
            }
            tokio::time::sleep(POLL).await;
        };
        let unprobed = ranked.split_off(ranked.len().min(PROBE_BUDGET)).len();
        let endpoints: Vec<SocketAddr> = ranked.iter().map(|c| c.endpoint).collect();
        let answers = probe(&endpoints, PROBE_TIMEOUT).await;
        let mut round = Round {
            restarts: heard.restarts,
            refused: heard.refused,
            unprobed,
            ..Round::default()
        };
        for (candidate, answered) in ranked.into_iter().zip(answers) {
            self.send(Command::Probed(candidate.endpoint, answered));
            if answered {
                round.answered.push(candidate);
            } else {
                round.silent.push(candidate);
            }
        }
        round
    }

    /// What the browser heard, from its thread (an empty report once the thread has ended).
    async fn heard(&self) -> Heard {
        let (report, reported) = tokio::sync::oneshot::channel();
        self.send(Command::Report(report));
        reported.await.unwrap_or_default()
    }

    fn send(&self, command: Command) {
        let commands = self.commands.lock().unwrap_or_else(PoisonError::into_inner);
        // The thread only ends once the daemon is gone: nothing is left to tell then.
        let _ = commands.send(command);
    }
}

impl Drop for LanBrowser {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The browsing thread: takes in events as they come, applies what the rounds learnt, and
/// publishes what it heard, until told to stop or the daemon shuts down.
fn drain(mut browser: Browser, shared: &Shared, commands: &mpsc::Receiver<Command>) {
    while !shared.stop.load(Ordering::Relaxed) {
        if let Err(error) = browser.update(DRAIN_WAIT) {
            tracing::warn!(error = %error, "stopped browsing for the join service");
            shared.ended.store(true, Ordering::Relaxed);
            // Dropping the receiver answers every waiting report with an empty one.
            return;
        }
        while let Ok(command) = commands.try_recv() {
            match command {
                Command::Probed(endpoint, answered) => browser.probed(endpoint, answered),
                Command::AttemptFailed(endpoint) => browser.attempt_failed(endpoint),
                Command::Reserve(cluster_id) => browser.reserve_for(cluster_id),
                Command::Report(report) => {
                    let _ = report.send(Heard {
                        seen: browser.seen(),
                        restarts: browser.restarts(),
                        refused: browser.refused(),
                    });
                }
            }
        }
    }
}
