//! The supervisor's tests: restart backoff, the kubelet's flags, output forwarding, stop order
//! and timeouts, the shared supervisor's handover.

use super::*;
use std::os::unix::process::ExitStatusExt as _;
use std::sync::{Arc, Mutex};
use tracing_subscriber::layer::SubscriberExt as _;

/// Collects the messages of tracing events on this thread (the tests' current-thread
/// runtime runs every task here).
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<String>>>);

impl Logs {
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub(crate) fn contains(&self, text: &str) -> bool {
        self.lines().iter().any(|line| line.contains(text))
    }
}

struct Visitor<'a>(&'a mut String);

impl tracing::field::Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            use std::fmt::Write as _;
            let _ = write!(self.0, "{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logs {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut message = String::new();
        event.record(&mut Visitor(&mut message));
        self.0.lock().unwrap().push(message);
    }
}

/// Every test that runs supervised programs captures logs, so that no thread without a
/// subscriber caches the forwarding callsites as uninteresting for the others.
pub(crate) fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
    // Callsites first hit on a thread without a subscriber may have cached "never".
    tracing::callsite::rebuild_interest_cache();
    (logs, guard)
}

fn sh(name: &str, script: &str) -> ServiceSpec {
    ServiceSpec::new(name, "/bin/sh", &["-c", script])
}

fn fast(policy_ms: (u64, u64, u64)) -> RestartPolicy {
    RestartPolicy {
        initial_delay: Duration::from_millis(policy_ms.0),
        max_delay: Duration::from_millis(policy_ms.1),
        stable_after: Duration::from_millis(policy_ms.2),
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn backoff_doubles_to_the_cap_and_resets_after_a_stable_run() {
    let mut backoff = RestartBackoff::new(RestartPolicy::default());
    let quick = Duration::from_millis(100);
    let delays: Vec<u64> = (0..6)
        .map(|_| backoff.after_exit(quick).as_secs())
        .collect();
    assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
    assert_eq!(
        backoff.after_exit(Duration::from_secs(60)),
        Duration::from_secs(1)
    );
    assert_eq!(backoff.after_exit(quick), Duration::from_secs(2));
    backoff.reset();
    assert_eq!(backoff.after_exit(quick), Duration::from_secs(1));
}

#[test]
fn kubelet_runs_as_kubeadms_drop_in_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = kubelet();
    assert_eq!(spec.program, PathBuf::from("/usr/bin/kubelet"));
    spec.args_from_env_files[0].path = dir.path().join("kubeadm-flags.env");
    spec.args_from_env_files[1].path = dir.path().join("kubelet");
    // Before kubeadm ran: only the drop-in's own flags.
    assert_eq!(
        spec.argv(),
        [
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--config=/var/lib/kubelet/config.yaml"
        ]
    );
    std::fs::write(
        dir.path().join("kubeadm-flags.env"),
        "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.2.15 --pod-infra-container-image=pause\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("kubelet"), "KUBELET_EXTRA_ARGS=--v=4\n").unwrap();
    assert_eq!(
        spec.argv()[3..],
        [
            "--node-ip=10.0.2.15",
            "--pod-infra-container-image=pause",
            "--v=4"
        ]
    );
    assert_eq!(containerd().oom_score_adj, Some(-999));
    // It starts once kubeadm wrote its configuration, not before.
    assert_eq!(
        spec.start_after.as_deref(),
        Some(std::path::Path::new("/var/lib/kubelet/config.yaml"))
    );
    assert_eq!(containerd().start_after, None);
}

#[tokio::test]
async fn a_crashing_service_is_restarted_with_growing_delays_and_its_status_logged() {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut spec = sh(
        "crasher",
        &format!("date +%s.%N >> {}; exit 3", starts.display()),
    );
    spec.restart = fast((50, 200, 10_000));
    let mut supervisor = Supervisor::new(ChildRegistry::new());
    supervisor.start(spec);
    let count = || {
        std::fs::read_to_string(&starts)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    wait_until("six starts", || count() >= 6).await;
    let reports = supervisor.stop_all().await;
    assert_eq!(reports.len(), 1);

    let times: Vec<f64> = std::fs::read_to_string(&starts)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // 50, 100, 200, 200, 200 ms at least (the cap holds), never a second.
    for (gap, min) in gaps.iter().zip([0.05, 0.1, 0.2, 0.2, 0.2]) {
        assert!(*gap >= min && *gap < min + 1.0, "gaps {gaps:?}");
    }
    assert!(
        logs.contains("crasher exited with exit status: 3 after"),
        "{:?}",
        logs.lines()
    );
    assert!(logs.contains("restarting in 0.1 s"), "{:?}", logs.lines());
}

#[tokio::test]
async fn output_is_forwarded_line_by_line_with_the_service_prefix() {
    let (logs, _guard) = capture_logs();
    let mut supervisor = Supervisor::new(ChildRegistry::new());
    supervisor.start(sh(
        "talker",
        "echo 'hello from stdout'; echo 'oops on stderr' >&2; printf 'no newline'; \
         echo ' --token abcdef.0123456789abcdef'; exec sleep 60",
    ));
    wait_until("the output", || logs.contains("[talker] oops on stderr")).await;
    wait_until("the token line", || logs.contains("--token")).await;
    supervisor.stop_all().await;
    let lines = logs.lines();
    assert!(
        lines.contains(&"[talker] hello from stdout".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"[talker] no newline --token abcdef.<redacted>".to_owned()),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("0123456789abcdef")));
}

#[tokio::test]
async fn services_stop_in_reverse_order_with_sigkill_after_the_timeout() {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let ready = |n: &str| dir.path().join(n);
    let mut first = sh(
        "first",
        &format!(
            "trap 'exit 0' TERM; touch {}; while :; do sleep 0.05; done",
            ready("first").display()
        ),
    );
    first.stop_timeout = Duration::from_secs(5);
    // Ignores SIGTERM (an ignored signal stays ignored across exec).
    let mut second = sh(
        "second",
        &format!(
            "trap '' TERM; touch {}; exec sleep 60",
            ready("second").display()
        ),
    );
    second.stop_timeout = Duration::from_millis(300);
    let mut supervisor = Supervisor::new(ChildRegistry::new());
    supervisor.start(first);
    supervisor.start(second);
    assert_eq!(supervisor.names(), ["first", "second"]);
    wait_until("both started", || {
        ready("first").exists() && ready("second").exists()
    })
    .await;

    let started = Instant::now();
    let reports = supervisor.stop_all().await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(reports[0].name, "second");
    assert_eq!(
        reports[0].outcome,
        ServiceStop::Killed(ExitStatus::from_raw(libc::SIGKILL))
    );
    assert_eq!(reports[1].name, "first");
    assert!(
        matches!(reports[1].outcome, ServiceStop::Terminated(status) if status.success()),
        "{reports:?}"
    );
    assert!(logs.contains("second still runs 0.3 s after SIGTERM; sending SIGKILL"));
}

#[tokio::test]
async fn the_shared_supervisor_stops_what_any_handle_started_once_handed_over() {
    let quiet = |name: &str| sh(name, "trap 'exit 0' TERM; while :; do sleep 0.05; done");
    let node = SharedSupervisor::default();
    let shutdown = node.clone();
    // Before the node hands its services over there is nothing to start into or stop.
    assert!(!node.start(quiet("early")).await);
    assert!(shutdown.stop_all().await.is_empty());

    let mut services = Supervisor::new(ChildRegistry::new());
    services.start(quiet("first"));
    assert!(node.install(services).await.is_ok());
    let again = Supervisor::new(ChildRegistry::new());
    assert!(node.install(again).await.is_err(), "handed over twice");
    assert!(node.start(quiet("second")).await);

    let reports = shutdown.stop_all().await;
    let names: Vec<&str> = reports.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["second", "first"]);
    assert!(shutdown.stop_all().await.is_empty());
}

#[tokio::test]
async fn a_missing_program_is_retried_and_an_explicit_restart_is_immediate() {
    let (logs, _guard) = capture_logs();
    let mut missing = ServiceSpec::new("ghost", "/nonexistent/ghostd", &[]);
    missing.restart = fast((20, 40, 10_000));
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut steady = sh(
        "steady",
        &format!("echo x >> {}; exec sleep 60", starts.display()),
    );
    steady.stop_timeout = Duration::from_secs(5);
    let mut supervisor = Supervisor::new(ChildRegistry::new());
    supervisor.start(missing);
    supervisor.start(steady);
    let count = || {
        std::fs::read_to_string(&starts)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    wait_until("the first start", || count() == 1).await;
    assert!(supervisor.restart("steady").await);
    assert!(!supervisor.restart("nobody").await);
    wait_until("the restart", || count() == 2).await;
    wait_until("ghost retries", || {
        logs.lines()
            .iter()
            .filter(|l| l.starts_with("cannot start ghost (/nonexistent/ghostd)"))
            .count()
            >= 3
    })
    .await;
    let reports = supervisor.stop_all().await;
    assert_eq!(reports[1].name, "ghost");
    assert_eq!(reports[1].outcome, ServiceStop::NotRunning);
    assert!(logs.contains("restarting steady on request"));
}

#[tokio::test]
async fn a_service_waits_unstarted_for_its_start_condition_and_stops_while_waiting() {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    let ran = dir.path().join("ran");
    let mut waiting = sh("waiter", &format!("touch {}; exec sleep 60", ran.display()));
    waiting.start_after = Some(config.clone());
    let mut supervisor = Supervisor::new(ChildRegistry::new());
    supervisor.start(waiting);
    wait_until("the wait is said", || {
        logs.contains(&format!(
            "waiter waits for {} before it starts",
            config.display()
        ))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!ran.exists(), "started before its condition held");
    std::fs::write(&config, "kind: KubeletConfiguration\n").unwrap();
    wait_until("the start", || ran.exists()).await;
    assert!(
        !logs.lines().iter().any(|l| l.contains("exited")),
        "{:?}",
        logs.lines()
    );
    supervisor.stop_all().await;

    // Stopped before the file ever appears: nothing ran, and the stop is answered.
    let never = dir.path().join("never.yaml");
    let mut waiting = sh("never", &format!("touch {}.ran", never.display()));
    waiting.start_after = Some(never.clone());
    let mut supervisor = Supervisor::new(ChildRegistry::new());
    supervisor.start(waiting);
    wait_until("the second wait", || logs.contains("never waits for")).await;
    let reports = supervisor.stop_all().await;
    assert_eq!(reports[0].outcome, ServiceStop::NotRunning);
    assert!(!dir.path().join("never.yaml.ran").exists());
}
