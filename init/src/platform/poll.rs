//! The one polling helper: ask until there is an answer or the time is up.
//!
//! Without udev, PID 1 learns that a device node or a disk has appeared only by looking again
//! (devtmpfs and sysfs have no cheap notification for it in an initramfs). Every such wait —
//! the TPM node, the state disk, `/dev/dm-N`, the containerd socket — goes through here, so
//! each has one deadline rule: `check` runs at least once, and once more after the deadline
//! has passed before giving up.

use std::time::Duration;

/// Calls `check` every `interval` until it gives `Some`, or `limit` has passed; blocks the
/// thread.
pub fn wait_until_blocking<T>(
    limit: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(interval);
    }
}

/// What one look of [`wait_until`] found.
pub enum Poll<T, E> {
    /// Done: return this.
    Ready(T),
    /// Done: give up with this error at once.
    Failed(E),
    /// Not yet; at the deadline, give up with this error.
    Pending(E),
}

/// Calls `check` every `interval` (on tokio's clock, so paused-time tests run instantly) until
/// it is ready or has failed, or `limit` has passed; then the last pending error.
pub async fn wait_until<T, E>(
    limit: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Poll<T, E>,
) -> Result<T, E> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match check() {
            Poll::Ready(found) => return Ok(found),
            Poll::Failed(error) => return Err(error),
            Poll::Pending(error) if tokio::time::Instant::now() >= deadline => return Err(error),
            Poll::Pending(_) => tokio::time::sleep(interval).await,
        }
    }
}

/// [`wait_until`] for a path to exist (`false` when it did not within `limit`).
pub async fn wait_for_path(path: &std::path::Path, limit: Duration, interval: Duration) -> bool {
    wait_until(limit, interval, || {
        if path.exists() {
            Poll::Ready(())
        } else {
            Poll::Pending(())
        }
    })
    .await
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_waits_look_once_more_at_the_deadline() {
        let mut looks = 0;
        let found = wait_until_blocking(Duration::ZERO, Duration::ZERO, || {
            looks += 1;
            None::<()>
        });
        assert_eq!((found, looks), (None, 1));
        let found = wait_until_blocking(Duration::from_secs(1), Duration::ZERO, || {
            looks += 1;
            (looks == 3).then_some(looks)
        });
        assert_eq!(found, Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn async_waits_end_with_the_last_pending_error_or_a_failure_at_once() {
        let mut looks = 0;
        let result: Result<(), u32> =
            wait_until(Duration::from_secs(5), Duration::from_secs(1), || {
                looks += 1;
                Poll::Pending(looks)
            })
            .await;
        assert_eq!(result, Err(6));
        let result: Result<(), &str> =
            wait_until(Duration::from_secs(5), Duration::from_secs(1), || {
                Poll::Failed("no")
            })
            .await;
        assert_eq!(result, Err("no"));
    }

    #[tokio::test]
    async fn an_existing_path_is_found_at_once() {
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(wait_for_path(file.path(), Duration::ZERO, Duration::ZERO).await);
        assert!(
            !wait_for_path(
                std::path::Path::new("/nonexistent/x"),
                Duration::ZERO,
                Duration::ZERO
            )
            .await
        );
    }
}
