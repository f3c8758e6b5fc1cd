//! Running a job again until it succeeded: capped exponential backoff, forever.
//!
//! What kubeadm needs between attempts (a `kubeadm reset`, the control-plane files put back)
//! is the caller's attempt; this module only decides *when* the next attempt runs. The clock
//! is passed in (a `sleep` function), so the loop is tested without waiting. The loop has no
//! stop condition of its own: it ends with success, or when its task is dropped — the
//! shutdown aborts it ([`super::SharedSupervisor::adopt`]).

use std::future::Future;
use std::time::Duration;

/// The delays between attempts: `initial` after the first failure, doubled after each further
/// one, never more than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBackoff {
    /// The delay after the first failure.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

/// kubeadm's: 10 s, 20 s, 40 s, … 5 min, 5 min, ….
pub const KUBEADM_RETRY: RetryBackoff = RetryBackoff {
    initial: Duration::from_secs(10),
    max: Duration::from_secs(300),
};

impl RetryBackoff {
    /// The delay after failed attempt number `attempt` (1-based).
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }
}

/// Runs `attempt(n)` for n = `first`, `first + 1`, … until one succeeds; after each failure
/// calls `failed(n, &error, delay)` and then `sleep(delay)`. Returns the success's value and
/// its attempt number.
pub async fn until_success<T, E, A, AF, S, SF, F>(
    backoff: RetryBackoff,
    first: u32,
    mut attempt: A,
    mut sleep: S,
    mut failed: F,
) -> (T, u32)
where
    A: FnMut(u32) -> AF,
    AF: Future<Output = Result<T, E>>,
    S: FnMut(Duration) -> SF,
    SF: Future<Output = ()>,
    F: FnMut(u32, &E, Duration),
{
    let mut number = first.max(1);
    loop {
        match attempt(number).await {
            Ok(value) => return (value, number),
            Err(error) => {
                let delay = backoff.delay_after(number);
                failed(number, &error, delay);
                sleep(delay).await;
                number = number.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::reaper::ChildRegistry;
    use crate::supervisor::tests::capture_logs;
    use crate::supervisor::{OneShotJob, OneShotOutcome, run_once};
    use std::cell::RefCell;

    #[test]
    fn the_delay_doubles_from_ten_seconds_and_stops_at_five_minutes() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| KUBEADM_RETRY.delay_after(n).as_secs())
            .collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(KUBEADM_RETRY.delay_after(u32::MAX), KUBEADM_RETRY.max);
    }

    #[tokio::test]
    async fn a_job_failing_twice_then_succeeding_runs_three_times_and_writes_its_marker_last() {
        let (_logs, _guard) = capture_logs();
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        // Fails while it has run fewer than three times (a counter file), as a kubeadm whose
        // API server comes up only later.
        let script = format!(
            "echo run >> {runs}; test $(wc -l < {runs}) -ge 3 || {{ echo 'discovery failed' >&2; exit 1; }}",
            runs = runs.display()
        );
        let job = OneShotJob::new(
            "job",
            &["/bin/sh", "-c", &script],
            dir.path().join("job.done"),
        );
        let registry = ChildRegistry::new();
        let slept = RefCell::new(Vec::new());
        let failures = RefCell::new(Vec::new());
        let ((outcome, marker_before_success), attempts) = until_success(
            KUBEADM_RETRY,
            1,
            |_| {
                let marker_before = job.marker.exists();
                let registry = &registry;
                let job = &job;
                async move {
                    let outcome = run_once(registry, job).await?;
                    Ok::<_, crate::supervisor::OneShotError>((outcome, marker_before))
                }
            },
            |delay| {
                slept.borrow_mut().push(delay);
                async {}
            },
            |n, error, _| {
                failures
                    .borrow_mut()
                    .push((n, error.to_string(), job.marker.exists()))
            },
        )
        .await;
        assert_eq!(attempts, 3);
        assert!(matches!(outcome, OneShotOutcome::Succeeded { .. }));
        assert!(
            !marker_before_success,
            "the marker existed before the success"
        );
        assert!(job.marker.exists());
        assert_eq!(
            *slept.borrow(),
            [Duration::from_secs(10), Duration::from_secs(20)]
        );
        let failures = failures.borrow();
        assert_eq!(failures.len(), 2);
        for (i, (n, message, marker)) in failures.iter().enumerate() {
            assert_eq!(*n, i as u32 + 1);
            assert!(message.contains("discovery failed"), "{message}");
            assert!(!marker, "a marker after failed attempt {n}");
        }
        assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\nrun\nrun\n");
    }

    #[tokio::test]
    async fn numbering_continues_from_an_earlier_boots_attempts() {
        let slept = RefCell::new(Vec::new());
        let (value, attempts) = until_success(
            KUBEADM_RETRY,
            4,
            |n| async move { if n < 6 { Err(n) } else { Ok("done") } },
            |delay| {
                slept.borrow_mut().push(delay.as_secs());
                async {}
            },
            |_, _: &u32, _| {},
        )
        .await;
        assert_eq!((value, attempts), ("done", 6));
        assert_eq!(*slept.borrow(), [80, 160]);
    }
}
