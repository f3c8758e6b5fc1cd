//! One-shot jobs that run once per node lifetime: `kubeadm init` or `kubeadm join`.
//!
//! "Once" is remembered by a marker file on the state disk, written only after the job
//! succeeded, and made durable (file and directory fsynced, written under a temporary name and
//! renamed) before [`run_once`] returns: a power cut either leaves no marker (the job runs
//! again at the next boot) or a complete one.
//!
//! [`run_once`] itself does not retry: a failure is reported with the exit status and the
//! job's last lines of output, and no marker is written. `kubeadm init` and `kubeadm join` are
//! not idempotent (a failed run leaves certificates, static pod manifests, kubeconfigs and
//! possibly an etcd member behind, and a second run stops at its preflight checks), so the
//! node's kubeadm retry ([`crate::kube::attempts`], with [`super::retry`]) runs `kubeadm reset -f`
//! through [`run_job`] before each further attempt.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::output::{self, Redaction, Tail};
use super::{SERVICE_PATH, ServiceStop, terminate};
use crate::platform::reaper::{ChildRegistry, SupervisedChild};

/// How long a job past its [`OneShotJob::timeout`] gets between SIGTERM and SIGKILL.
pub const JOB_STOP_TIMEOUT: Duration = Duration::from_secs(3);

/// A program to run once per node lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneShotJob {
    /// Short name: the log prefix, e.g. `kubeadm`.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The whole environment (nothing is inherited from PID 1).
    pub env: Vec<(String, String)>,
    /// Exists once the job has succeeded (on the state disk).
    pub marker: PathBuf,
    /// The job is stopped (SIGTERM, then SIGKILL) after this long.
    pub timeout: Option<Duration>,
}

impl OneShotJob {
    /// A job with `PATH` as its environment and no timeout.
    pub fn new(name: &str, argv: &[&str], marker: impl Into<PathBuf>) -> Self {
        let (program, args) = argv.split_first().map_or(("", &[][..]), |(p, a)| (*p, a));
        OneShotJob {
            name: name.to_owned(),
            program: PathBuf::from(program),
            args: args.iter().map(|&a| a.to_owned()).collect(),
            env: vec![("PATH".to_owned(), SERVICE_PATH.to_owned())],
            marker: marker.into(),
            timeout: None,
        }
    }
}

/// What [`run_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneShotOutcome {
    /// The marker exists: the job succeeded on an earlier boot.
    AlreadyDone,
    /// The job ran now and succeeded; the marker is written.
    Succeeded { took: Duration },
}

/// Why a one-shot job did not succeed. The last lines of output are redacted like the log.
#[derive(Debug, thiserror::Error)]
pub enum OneShotError {
    /// Whether the job already ran cannot be told: its marker cannot be looked at (an I/O
    /// error on the state disk, a permission problem).
    #[error("cannot check {name}'s marker {}", marker.display())]
    MarkerRead {
        /// The job's name.
        name: String,
        /// The marker file.
        marker: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The program cannot be started (missing, not executable).
    #[error("cannot start {name} ({})", program.display())]
    Spawn {
        /// The job's name.
        name: String,
        /// The program that did not start.
        program: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The job ran and exited unsuccessfully. Its last lines of output are text, not a cause,
    /// so they are part of the message.
    #[error("{name} failed with {status}; last output: {}", join_tail(tail))]
    Failed {
        /// The job's name.
        name: String,
        /// How it exited.
        status: ExitStatus,
        /// Its last lines of output, redacted.
        tail: Vec<String>,
    },
    /// The job ran past its [`OneShotJob::timeout`] and was stopped.
    #[error(
        "{name} did not finish within {:.1} s and was stopped; last output: {}",
        timeout.as_secs_f64(), join_tail(tail)
    )]
    Timeout {
        /// The job's name.
        name: String,
        /// The time it had.
        timeout: Duration,
        /// Its last lines of output, redacted.
        tail: Vec<String>,
    },
    /// The job's exit status cannot be collected.
    #[error("cannot wait for {name}")]
    Wait {
        /// The job's name.
        name: String,
        #[source]
        source: io::Error,
    },
    /// The job succeeded but its marker cannot be written durably: it runs again at the next
    /// boot.
    #[error("{name} succeeded, but its marker {} cannot be written", marker.display())]
    MarkerWrite {
        /// The job's name.
        name: String,
        /// The marker file.
        marker: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn join_tail(tail: &[String]) -> String {
    if tail.is_empty() {
        "(none)".to_owned()
    } else {
        tail.join(" | ")
    }
}

/// Runs `job` unless its marker exists; writes the marker after success. Output is forwarded
/// to the log as `[name] …`, with bootstrap tokens and certificate keys redacted.
pub async fn run_once(
    registry: &ChildRegistry,
    job: &OneShotJob,
) -> Result<OneShotOutcome, OneShotError> {
    match std::fs::symlink_metadata(&job.marker) {
        Ok(_) => {
            info!(
                "{} already ran on this node (marker {}); not running it again",
                job.name,
                job.marker.display()
            );
            return Ok(OneShotOutcome::AlreadyDone);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(OneShotError::MarkerRead {
                name: job.name.clone(),
                marker: job.marker.clone(),
                source,
            });
        }
    }
    let took = run_job(registry, job, "once").await?;
    let marker_text = format!(
        "{} succeeded in {:.1} s (hawser {})\n",
        job.name,
        took.as_secs_f64(),
        env!("CARGO_PKG_VERSION")
    );
    write_marker(&job.marker, &marker_text).map_err(|source| OneShotError::MarkerWrite {
        name: job.name.clone(),
        marker: job.marker.clone(),
        source,
    })?;
    info!(
        "{} succeeded in {:.1} s; marker {} written",
        job.name,
        took.as_secs_f64(),
        job.marker.display()
    );
    Ok(OneShotOutcome::Succeeded { took })
}

/// Starts `job` through `registry`: its program, arguments and environment only, in `/`, no
/// standard input, standard output and error piped, in a process group of its own.
fn spawn_job(registry: &ChildRegistry, job: &OneShotJob) -> Result<SupervisedChild, OneShotError> {
    let mut command = tokio::process::Command::new(&job.program);
    command
        .args(&job.args)
        .env_clear()
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    registry
        .spawn(&mut command)
        .map_err(|source| OneShotError::Spawn {
            name: job.name.clone(),
            program: job.program.clone(),
            source,
        })
}

/// Runs `job` to its end without looking at or writing its marker (a clean-up such as
/// `kubeadm reset`, which runs whenever it is needed); returns how long it took. `how` is
/// logged with the command line (`once`, `to clean up`).
pub async fn run_job(
    registry: &ChildRegistry,
    job: &OneShotJob,
    how: &str,
) -> Result<Duration, OneShotError> {
    let started = Instant::now();
    let mut child = spawn_job(registry, job)?;
    info!(
        "running {} {how}: {}",
        job.name,
        output::redact(
            &format!("{} {}", job.program.display(), job.args.join(" ")),
            Redaction::TokensAndKeys
        )
    );
    let tail = Tail::default();
    let forwarders = output::forward_child_output(
        &mut child,
        &job.name,
        Redaction::TokensAndKeys,
        Some(tail.clone()),
    );

    let waited = match job.timeout {
        Some(limit) => tokio::time::timeout(limit, child.wait()).await.ok(),
        None => Some(child.wait().await),
    };
    let status = match waited {
        Some(status) => status.map_err(|source| OneShotError::Wait {
            name: job.name.clone(),
            source,
        })?,
        None => {
            let outcome = terminate(&mut child, &job.name, JOB_STOP_TIMEOUT).await;
            if outcome == ServiceStop::Stuck {
                warn!("{} did not exit after SIGKILL", job.name);
            }
            drain(forwarders).await;
            return Err(OneShotError::Timeout {
                name: job.name.clone(),
                timeout: job.timeout.unwrap_or_default(),
                tail: tail.lines(),
            });
        }
    };
    // The rest of the output (a child of the job could keep the pipes open: bounded).
    drain(forwarders).await;
    if !status.success() {
        return Err(OneShotError::Failed {
            name: job.name.clone(),
            status,
            tail: tail.lines(),
        });
    }
    Ok(started.elapsed())
}

/// Most standard output [`run_query`] keeps; the rest is read and dropped.
pub const MAX_QUERY_OUTPUT: usize = 1 << 20;

/// Runs `job` to its end, like [`run_job`], and returns its standard output as text (at most
/// [`MAX_QUERY_OUTPUT`] bytes), which is not logged: a query such as `ctr images ls -q`. Its
/// standard error is logged, and its last lines are in a failure's report.
pub async fn run_query(registry: &ChildRegistry, job: &OneShotJob) -> Result<String, OneShotError> {
    use tokio::io::AsyncReadExt as _;
    let mut child = spawn_job(registry, job)?;
    info!(
        "running {} to ask: {} {}",
        job.name,
        job.program.display(),
        job.args.join(" ")
    );
    let tail = Tail::default();
    let stdout = child.inner().stdout.take();
    let forwarders: Vec<_> = child
        .inner()
        .stderr
        .take()
        .map(|pipe| {
            tokio::spawn(output::forward(
                job.name.clone(),
                pipe,
                Redaction::TokensAndKeys,
                Some(tail.clone()),
            ))
        })
        .into_iter()
        .collect();
    let read = async move {
        let mut kept = Vec::new();
        if let Some(mut pipe) = stdout {
            let mut chunk = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
                let room = MAX_QUERY_OUTPUT.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
        kept
    };
    let both = async { tokio::join!(read, child.wait()) };
    let finished = match job.timeout {
        Some(limit) => tokio::time::timeout(limit, both).await.ok(),
        None => Some(both.await),
    };
    let Some((stdout, status)) = finished else {
        if terminate(&mut child, &job.name, JOB_STOP_TIMEOUT).await == ServiceStop::Stuck {
            warn!("{} did not exit after SIGKILL", job.name);
        }
        drain(forwarders).await;
        return Err(OneShotError::Timeout {
            name: job.name.clone(),
            timeout: job.timeout.unwrap_or_default(),
            tail: tail.lines(),
        });
    };
    let status = status.map_err(|source| OneShotError::Wait {
        name: job.name.clone(),
        source,
    })?;
    drain(forwarders).await;
    if !status.success() {
        return Err(OneShotError::Failed {
            name: job.name.clone(),
            status,
            tail: tail.lines(),
        });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

async fn drain(forwarders: Vec<tokio::task::JoinHandle<()>>) {
    for forwarder in forwarders {
        let _ = tokio::time::timeout(Duration::from_secs(1), forwarder).await;
    }
}

/// Writes `text` to `marker` durably (see [`crate::platform::fs::write_atomically`]).
fn write_marker(marker: &Path, text: &str) -> io::Result<()> {
    crate::platform::fs::write_atomically(marker, text.as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::tests::capture_logs;

    fn job(dir: &Path, script: &str) -> OneShotJob {
        OneShotJob::new(
            "job",
            &["/bin/sh", "-c", script],
            dir.join("state/hawser/job.done"),
        )
    }

    #[tokio::test]
    async fn a_job_runs_once_and_is_remembered_by_its_marker() {
        let (_logs, _guard) = capture_logs();
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let job = job(dir.path(), &format!("echo ran >> {}", runs.display()));
        let registry = ChildRegistry::new();
        let first = run_once(&registry, &job).await.unwrap();
        assert!(matches!(first, OneShotOutcome::Succeeded { .. }));
        assert!(
            std::fs::read_to_string(&job.marker)
                .unwrap()
                .starts_with("job succeeded in ")
        );
        assert!(!dir.path().join("state/hawser/job.done.tmp").exists());
        assert_eq!(
            run_once(&registry, &job).await.unwrap(),
            OneShotOutcome::AlreadyDone
        );
        assert_eq!(std::fs::read_to_string(&runs).unwrap(), "ran\n");
    }

    #[tokio::test]
    async fn a_failure_reports_status_and_last_lines_and_writes_no_marker() {
        let (logs, _guard) = capture_logs();
        let dir = tempfile::tempdir().unwrap();
        let job = job(
            dir.path(),
            "echo '[preflight] Running pre-flight checks'; \
             echo 'error execution phase preflight: port 6443 is in use' >&2; \
             echo 'kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef'; exit 7",
        );
        let err = run_once(&ChildRegistry::new(), &job).await.unwrap_err();
        let OneShotError::Failed { status, tail, .. } = &err else {
            panic!("unexpected {err:?}");
        };
        assert_eq!(status.code(), Some(7));
        assert!(tail.contains(&"error execution phase preflight: port 6443 is in use".to_owned()));
        assert!(tail.contains(&"kubeadm join 10.0.0.1:6443 --token abcdef.<redacted>".to_owned()));
        let message = err.to_string();
        assert!(
            message.starts_with("job failed with exit status: 7; last output: "),
            "{message}"
        );
        assert!(!message.contains("0123456789abcdef"), "{message}");
        assert!(!job.marker.exists());
        assert!(
            logs.contains("[job] [preflight] Running pre-flight checks"),
            "{:?}",
            logs.lines()
        );
        assert!(!logs.lines().iter().any(|l| l.contains("0123456789abcdef")));
    }

    #[tokio::test]
    async fn a_job_past_its_timeout_is_stopped() {
        let (_logs, _guard) = capture_logs();
        let dir = tempfile::tempdir().unwrap();
        let mut job = job(dir.path(), "echo waiting; exec sleep 60");
        job.timeout = Some(Duration::from_millis(300));
        let started = Instant::now();
        let err = run_once(&ChildRegistry::new(), &job).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            err.to_string(),
            "job did not finish within 0.3 s and was stopped; last output: waiting"
        );
        assert!(!job.marker.exists());
    }

    #[tokio::test]
    async fn a_query_returns_its_standard_output_and_a_failure_its_standard_error() {
        let (logs, _guard) = capture_logs();
        let dir = tempfile::tempdir().unwrap();
        let registry = ChildRegistry::new();
        let query = job(dir.path(), "echo one; echo two; echo 'a note' >&2");
        assert_eq!(run_query(&registry, &query).await.unwrap(), "one\ntwo\n");
        assert!(logs.contains("[job] a note"), "{:?}", logs.lines());
        assert!(!logs.lines().iter().any(|l| l.contains("[job] one")));
        assert!(!query.marker.exists(), "a query writes no marker");
        let failing = job(
            dir.path(),
            "echo listed; echo 'ctr: connection refused' >&2; exit 1",
        );
        let err = run_query(&registry, &failing).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "job failed with exit status: 1; last output: ctr: connection refused"
        );
        let mut slow = job(dir.path(), "exec sleep 60");
        slow.timeout = Some(Duration::from_millis(200));
        let err = run_query(&registry, &slow).await.unwrap_err();
        assert!(matches!(err, OneShotError::Timeout { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let (_logs, _guard) = capture_logs();
        let dir = tempfile::tempdir().unwrap();
        let job = OneShotJob::new(
            "kubeadm",
            &["/nonexistent/kubeadm", "init"],
            dir.path().join("m"),
        );
        let err = run_once(&ChildRegistry::new(), &job).await.unwrap_err();
        assert_eq!(
            crate::fatal::error_chain(&err),
            "cannot start kubeadm (/nonexistent/kubeadm): No such file or directory (os error 2)"
        );
    }
}
