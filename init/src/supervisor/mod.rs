//! PID 1 as the node's service supervisor: containerd and kubelet, kept running, and one-shot
//! jobs (`kubeadm init|join`) that run once per node lifetime.
//!
//! After the switch to the verified rootfs there is no systemd; hawser does its job for the
//! two long-running services of a Kubernetes node, with the settings their systemd units use:
//!
//! - **Start** in order (containerd, then kubelet), each in its own process group, with a
//!   clean environment, stdin from `/dev/null`, and stdout and stderr forwarded to the console
//!   log line by line as `[containerd] …` / `[kubelet] …` ([`output`]).
//! - **Restart always**, with exponential backoff ([`RestartPolicy`]): 1 s doubling up to 10 s
//!   (kubelet's unit restarts every 10 s), back to 1 s once a run lasted a stable minute. Each
//!   exit is logged with its status; a crash loop never ends PID 1. kubelet crash-loops until
//!   `kubeadm init|join` has written its configuration — that is how kubeadm expects it,
//!   since it cannot restart kubelet without systemd, and the backoff cap bounds the delay.
//! - **Stop** in reverse start order: SIGTERM to the service's main process, SIGKILL after its
//!   timeout. Like containerd's unit (`KillMode=process`), only the main process is signalled:
//!   container shims and containers are the shutdown's `kill(-1)` afterwards
//!   ([`crate::shutdown::stop_all_processes`]), so the shutdown sequence is
//!   `Supervisor::stop_all`, then `stop_all_processes`, then unmount.
//!
//! Every child is spawned through the [`ChildRegistry`], so the orphan reaper leaves their exit
//! statuses to the tasks that await them ([`crate::platform::reaper`]).

pub mod envfile;
pub mod oneshot;
pub mod output;
pub mod retry;

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot as reply};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use self::output::Redaction;
use crate::platform::reaper::{ChildRegistry, SupervisedChild};

pub use self::oneshot::{OneShotError, OneShotJob, OneShotOutcome, run_job, run_once};

/// `PATH` of every supervised program (the unit files' default).
pub const SERVICE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Open files allowed to containerd and kubelet: systemd's `LimitNOFILE=infinity`, which is
/// the kernel's `fs.nr_open` default.
pub const SERVICE_NOFILE: u64 = 1 << 20;
/// How long a service gets between SIGTERM and SIGKILL unless its [`ServiceSpec`] says
/// otherwise.
pub const DEFAULT_SERVICE_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a supervised process (service or one-shot job) gets to disappear after SIGKILL
/// before it is reported [`ServiceStop::Stuck`].
pub const SERVICE_SIGKILL_WAIT: Duration = Duration::from_secs(3);

/// When a service is started again after it exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Delay after the first exit.
    pub initial_delay: Duration,
    /// The delay doubles after each exit up to this.
    pub max_delay: Duration,
    /// A run at least this long resets the delay to `initial_delay`.
    pub stable_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            stable_after: Duration::from_secs(60),
        }
    }
}

/// The restart delays of one service under its [`RestartPolicy`]: a small state machine.
#[derive(Debug, Clone)]
pub struct RestartBackoff {
    policy: RestartPolicy,
    next: Duration,
}

impl RestartBackoff {
    pub fn new(policy: RestartPolicy) -> Self {
        RestartBackoff {
            policy,
            next: policy.initial_delay,
        }
    }

    /// The delay before the next start, after a run that lasted `ran_for`.
    pub fn after_exit(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.policy.stable_after {
            self.next = self.policy.initial_delay;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.policy.max_delay);
        delay
    }

    /// Forget past failures (an explicit restart).
    pub fn reset(&mut self) {
        self.next = self.policy.initial_delay;
    }
}

/// Arguments taken from a variable of an optional environment file at each start (systemd's
/// `EnvironmentFile=-<path>` with `$<variable>` in `ExecStart`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFileArgs {
    pub path: PathBuf,
    pub variable: String,
}

/// A long-running service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Short name: the log prefix.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Appended to `args` at every start, in order.
    pub args_from_env_files: Vec<EnvFileArgs>,
    /// The whole environment (nothing is inherited from PID 1).
    pub env: Vec<(String, String)>,
    pub restart: RestartPolicy,
    /// Between SIGTERM and SIGKILL.
    pub stop_timeout: Duration,
    /// RLIMIT_NOFILE (soft and hard) for the service.
    pub nofile_limit: Option<u64>,
    /// Written to `/proc/<pid>/oom_score_adj` right after the start.
    pub oom_score_adj: Option<i32>,
}

impl ServiceSpec {
    /// A service with the defaults: `PATH` only, default restart policy and stop timeout.
    pub fn new(name: &str, program: &str, args: &[&str]) -> Self {
        ServiceSpec {
            name: name.to_owned(),
            program: PathBuf::from(program),
            args: args.iter().map(|&a| a.to_owned()).collect(),
            args_from_env_files: Vec::new(),
            env: vec![("PATH".to_owned(), SERVICE_PATH.to_owned())],
            restart: RestartPolicy::default(),
            stop_timeout: DEFAULT_SERVICE_STOP_TIMEOUT,
            nofile_limit: None,
            oom_score_adj: None,
        }
    }

    /// The arguments for the next start (reads the environment files now).
    pub fn argv(&self) -> Vec<String> {
        let mut argv = self.args.clone();
        for source in &self.args_from_env_files {
            match envfile::args_from(&source.path, &source.variable) {
                Ok(args) => argv.extend(args),
                Err(e) => warn!(
                    "{}: cannot read {} for ${} ({e}); starting without those arguments",
                    self.name,
                    source.path.display(),
                    source.variable
                ),
            }
        }
        argv
    }

    fn command(&self, argv: &[String]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(argv)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(limit) = self.nofile_limit {
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: the closure runs in the forked child before exec and only calls
            // setrlimit(2), which is async-signal-safe, on a value copied into the closure.
            unsafe {
                command.pre_exec(move || {
                    // SAFETY: `rlimit` is a valid, initialized struct for the call's duration.
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        command
    }
}

/// containerd as its unit runs it (`OOMScoreAdjust=-999`, `LimitNOFILE=infinity`).
pub fn containerd() -> ServiceSpec {
    ServiceSpec {
        nofile_limit: Some(SERVICE_NOFILE),
        oom_score_adj: Some(-999),
        ..ServiceSpec::new("containerd", "/usr/bin/containerd", &[])
    }
}

/// kubelet as kubeadm's systemd drop-in (`10-kubeadm.conf`) runs it.
pub fn kubelet() -> ServiceSpec {
    ServiceSpec {
        args_from_env_files: vec![
            EnvFileArgs {
                path: PathBuf::from("/var/lib/kubelet/kubeadm-flags.env"),
                variable: "KUBELET_KUBEADM_ARGS".to_owned(),
            },
            EnvFileArgs {
                path: PathBuf::from("/etc/default/kubelet"),
                variable: "KUBELET_EXTRA_ARGS".to_owned(),
            },
        ],
        nofile_limit: Some(SERVICE_NOFILE),
        ..ServiceSpec::new(
            "kubelet",
            "/usr/bin/kubelet",
            &[
                "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--config=/var/lib/kubelet/config.yaml",
            ],
        )
    }
}

/// How a supervised process ended when it was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceStop {
    /// It was waiting to be restarted.
    NotRunning,
    /// It exited after SIGTERM.
    Terminated(ExitStatus),
    /// It needed SIGKILL.
    Killed(ExitStatus),
    /// It survived SIGKILL (stuck in the kernel) or could not be waited for.
    Stuck,
}

/// One stopped service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopReport {
    pub name: String,
    pub outcome: ServiceStop,
}

enum Control {
    Stop(reply::Sender<ServiceStop>),
    Restart,
}

struct Service {
    name: String,
    control: mpsc::Sender<Control>,
    task: JoinHandle<()>,
}

/// The supervised services, in start order.
pub struct Supervisor {
    registry: ChildRegistry,
    services: Vec<Service>,
    /// Background tasks that run jobs (kubeadm's retries): aborted before the services stop.
    jobs: Vec<JoinHandle<()>>,
}

impl Supervisor {
    pub fn new(registry: ChildRegistry) -> Self {
        Supervisor {
            registry,
            services: Vec::new(),
            jobs: Vec::new(),
        }
    }

    /// Starts `spec` and keeps it running. Must be called inside the runtime.
    pub fn start(&mut self, spec: ServiceSpec) {
        let (control, requests) = mpsc::channel(4);
        let name = spec.name.clone();
        let task = tokio::spawn(run_service(spec, self.registry.clone(), requests));
        self.services.push(Service {
            name,
            control,
            task,
        });
    }

    /// The names of the services, in start order.
    pub fn names(&self) -> Vec<String> {
        self.services.iter().map(|s| s.name.clone()).collect()
    }

    /// Stops service `name` (SIGTERM) and starts it again at once with a fresh backoff, as
    /// `systemctl restart` does. False if there is no such service.
    pub async fn restart(&self, name: &str) -> bool {
        match self.services.iter().find(|s| s.name == name) {
            Some(service) => service.control.send(Control::Restart).await.is_ok(),
            None => false,
        }
    }

    /// Keeps `task` (a job running in the background) until [`Supervisor::stop_all`], which
    /// aborts it first: a job waiting for its next attempt ends there, and a job's process
    /// still running is stopped by the shutdown's sweep of all processes.
    pub fn adopt(&mut self, task: JoinHandle<()>) {
        self.jobs.retain(|job| !job.is_finished());
        self.jobs.push(task);
    }

    /// Aborts the adopted jobs, then stops every service in reverse start order and waits for
    /// each.
    pub async fn stop_all(&mut self) -> Vec<StopReport> {
        for job in self.jobs.drain(..) {
            job.abort();
            let _ = job.await;
        }
        let mut reports = Vec::new();
        while let Some(service) = self.services.pop() {
            let (tell, told) = reply::channel();
            let outcome = match service.control.send(Control::Stop(tell)).await {
                Ok(()) => told.await.unwrap_or(ServiceStop::Stuck),
                Err(_) => ServiceStop::NotRunning,
            };
            let _ = service.task.await;
            reports.push(StopReport {
                name: service.name,
                outcome,
            });
        }
        reports
    }
}

/// A handle on the node's [`Supervisor`], shared by whoever starts services (the node, after
/// the pivot) and whoever stops them (the shutdown). Cloning it shares the supervisor; it is
/// empty until the node hands its services over.
#[derive(Clone, Default)]
pub struct SharedSupervisor(std::sync::Arc<tokio::sync::Mutex<Option<Supervisor>>>);

impl SharedSupervisor {
    /// Hands `services` over; gives them back if services were handed over already.
    pub async fn install(&self, services: Supervisor) -> Result<(), Supervisor> {
        let mut slot = self.0.lock().await;
        if slot.is_some() {
            return Err(services);
        }
        *slot = Some(services);
        Ok(())
    }

    /// Starts `spec` under the handed-over supervisor; false if none was handed over.
    pub async fn start(&self, spec: ServiceSpec) -> bool {
        match self.0.lock().await.as_mut() {
            Some(services) => {
                services.start(spec);
                true
            }
            None => false,
        }
    }

    /// [`Supervisor::adopt`]; false (and the task is aborted) if no services were handed over.
    pub async fn adopt(&self, task: JoinHandle<()>) -> bool {
        match self.0.lock().await.as_mut() {
            Some(services) => {
                services.adopt(task);
                true
            }
            None => {
                task.abort();
                false
            }
        }
    }

    /// [`Supervisor::stop_all`]; no reports if no services were handed over.
    pub async fn stop_all(&self) -> Vec<StopReport> {
        match self.0.lock().await.as_mut() {
            Some(services) => services.stop_all().await,
            None => Vec::new(),
        }
    }
}

/// Sends SIGTERM, waits `timeout`, then SIGKILL and waits [`SERVICE_SIGKILL_WAIT`].
async fn terminate(child: &mut SupervisedChild, name: &str, timeout: Duration) -> ServiceStop {
    let pid = child.id();
    let signal = |signal: Signal| {
        if let Some(pid) = pid {
            // The child is registered and not yet awaited, so its pid cannot have been reused.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
    };
    signal(Signal::SIGTERM);
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => return ServiceStop::Terminated(status),
        Ok(Err(e)) => {
            warn!("cannot wait for {name}: {e}");
            return ServiceStop::Stuck;
        }
        Err(_) => {}
    }
    warn!(
        "{name} still runs {:.1} s after SIGTERM; sending SIGKILL",
        timeout.as_secs_f64()
    );
    signal(Signal::SIGKILL);
    match tokio::time::timeout(SERVICE_SIGKILL_WAIT, child.wait()).await {
        Ok(Ok(status)) => ServiceStop::Killed(status),
        _ => ServiceStop::Stuck,
    }
}

fn describe_stop(name: &str, outcome: ServiceStop) {
    match outcome {
        ServiceStop::NotRunning => info!("{name} stopped (it was not running)"),
        ServiceStop::Terminated(status) => info!("{name} stopped ({status})"),
        ServiceStop::Killed(status) => warn!("{name} killed ({status})"),
        ServiceStop::Stuck => warn!("{name} did not exit after SIGKILL"),
    }
}

/// Spawns the service's process and its output forwarders.
fn start_once(spec: &ServiceSpec, registry: &ChildRegistry) -> std::io::Result<SupervisedChild> {
    let argv = spec.argv();
    let mut child = registry.spawn(&mut spec.command(&argv))?;
    let pid = child.id();
    if let (Some(pid), Some(adj)) = (pid, spec.oom_score_adj)
        && let Err(e) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), adj.to_string())
    {
        warn!("{}: cannot set oom_score_adj {adj}: {e}", spec.name);
    }
    output::forward_child_output(&mut child, &spec.name, Redaction::Tokens, None);
    info!(
        "started {} (pid {}): {}",
        spec.name,
        pid.map_or_else(|| "?".to_owned(), |p| p.to_string()),
        output::redact(
            &format!("{} {}", spec.program.display(), argv.join(" ")),
            Redaction::Tokens
        )
    );
    Ok(child)
}

/// One service's life: start, wait, restart after the backoff; ends on a stop request.
async fn run_service(
    spec: ServiceSpec,
    registry: ChildRegistry,
    mut requests: mpsc::Receiver<Control>,
) {
    let mut backoff = RestartBackoff::new(spec.restart);
    loop {
        let started = Instant::now();
        let delay = match start_once(&spec, &registry) {
            Ok(mut child) => {
                let request = tokio::select! {
                    status = child.wait() => Err(status),
                    request = requests.recv() => Ok(request),
                };
                match request {
                    Err(status) => {
                        let ran_for = started.elapsed();
                        let delay = backoff.after_exit(ran_for);
                        let status = status
                            .map(|s| s.to_string())
                            .unwrap_or_else(|e| format!("an unknown status ({e})"));
                        warn!(
                            "{} exited with {status} after {:.1} s; restarting in {:.1} s",
                            spec.name,
                            ran_for.as_secs_f64(),
                            delay.as_secs_f64()
                        );
                        delay
                    }
                    Ok(Some(Control::Restart)) => {
                        info!("restarting {} on request", spec.name);
                        let outcome = terminate(&mut child, &spec.name, spec.stop_timeout).await;
                        describe_stop(&spec.name, outcome);
                        backoff.reset();
                        continue;
                    }
                    Ok(Some(Control::Stop(reply))) => {
                        info!("stopping {}", spec.name);
                        let outcome = terminate(&mut child, &spec.name, spec.stop_timeout).await;
                        describe_stop(&spec.name, outcome);
                        let _ = reply.send(outcome);
                        return;
                    }
                    Ok(None) => {
                        // The supervisor is gone without a stop: stop anyway.
                        terminate(&mut child, &spec.name, spec.stop_timeout).await;
                        return;
                    }
                }
            }
            Err(e) => {
                let delay = backoff.after_exit(Duration::ZERO);
                warn!(
                    "cannot start {} ({}): {e}; retrying in {:.1} s",
                    spec.name,
                    spec.program.display(),
                    delay.as_secs_f64()
                );
                delay
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            request = requests.recv() => match request {
                Some(Control::Restart) => backoff.reset(),
                Some(Control::Stop(reply)) => {
                    describe_stop(&spec.name, ServiceStop::NotRunning);
                    let _ = reply.send(ServiceStop::NotRunning);
                    return;
                }
                None => return,
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
        let guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
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
}
