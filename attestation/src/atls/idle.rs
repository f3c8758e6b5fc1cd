//! The idle timeout of accepted aTLS connections: each connection's calls in progress
//! ([`ConnectionActivity`], counted by `CallTracking` in `net.rs`) and its idle timer
//! ([`IdleWatch`], polled from the stream's reads in `handshake.rs`). In a module of its own so
//! that `net.rs` and `handshake.rs` do not import each other for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The calls in progress on one connection, and since when it has had none.
#[derive(Debug)]
pub(super) struct ConnectionActivity {
    state: Mutex<ActivityState>,
}

#[derive(Debug)]
struct ActivityState {
    calls: usize,
    idle_since: tokio::time::Instant,
    /// The connection's reader, woken when its last call ends (its idle timer starts then).
    reader: Option<Waker>,
}

impl ConnectionActivity {
    fn new() -> Self {
        Self {
            state: Mutex::new(ActivityState {
                calls: 0,
                idle_since: tokio::time::Instant::now(),
                reader: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn begin_call(self: &Arc<Self>) -> CallInProgress {
        self.state().calls += 1;
        CallInProgress(Arc::clone(self))
    }
}

/// One call in progress; dropped when its response has been sent (or abandoned).
#[derive(Debug)]
pub(super) struct CallInProgress(Arc<ConnectionActivity>);

impl Drop for CallInProgress {
    fn drop(&mut self) {
        let reader = {
            let mut state = self.0.state();
            state.calls = state.calls.saturating_sub(1);
            if state.calls > 0 {
                return;
            }
            state.idle_since = tokio::time::Instant::now();
            state.reader.take()
        };
        if let Some(reader) = reader {
            reader.wake();
        }
    }
}

/// The idle timer of one accepted connection (polled from its reads).
pub(crate) struct IdleWatch {
    pub(super) activity: Arc<ConnectionActivity>,
    timeout: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl IdleWatch {
    pub(super) fn new(timeout: Duration) -> Self {
        let activity = Arc::new(ConnectionActivity::new());
        let deadline = activity.state().idle_since + timeout;
        Self {
            activity,
            timeout,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    /// Ready with the error that ends the connection once it has been idle for the timeout.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let deadline = {
            let mut state = self.activity.state();
            if state.calls > 0 {
                if !state
                    .reader
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    state.reader = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            state.idle_since + self.timeout
        };
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                tracing::debug!(timeout = ?self.timeout, "closing a connection idle for its timeout");
                Poll::Ready(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no call for {:?}: idle connection closed", self.timeout),
                ))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
