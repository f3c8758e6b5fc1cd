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

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot as reply};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use self::output::Redaction;
use crate::platform::reaper::{ChildRegistry, SupervisedChild};

pub use self::oneshot::{OneShotError, OneShotJob, OneShotOutcome, run_job, run_once, run_query};

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
    /// A file the service cannot run without (the kubelet's configuration, which kubeadm
    /// writes): until it exists the service waits, unstarted, instead of failing and
    /// restarting, as systemd's `ConditionPathExists=` with a path unit would.
    pub start_after: Option<PathBuf>,
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
            start_after: None,
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
/// The kubelet's configuration, written by kubeadm (`init` or `join`, phase `kubelet-start`).
pub const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";

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
        // Started without it, the kubelet exits at once with a fatal error and a dump of every
        // goroutine, every 10 s until kubeadm wrote it (minutes under emulation).
        start_after: Some(PathBuf::from(KUBELET_CONFIG)),
        ..ServiceSpec::new(
            "kubelet",
            "/usr/bin/kubelet",
            &[
                "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--config=/var/lib/kubelet/config.yaml", // KUBELET_CONFIG
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
    if let Some(path) = &spec.start_after
        && !wait_for_start_condition(&spec.name, path, &mut requests).await
    {
        return;
    }
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

/// How often a service waiting for its [`ServiceSpec::start_after`] file looks for it.
const START_CONDITION_POLL: Duration = Duration::from_millis(500);

/// Waits until `path` exists; `false` if the service was stopped meanwhile (then answered).
async fn wait_for_start_condition(
    name: &str,
    path: &Path,
    requests: &mut mpsc::Receiver<Control>,
) -> bool {
    if path.exists() {
        return true;
    }
    info!("{name} waits for {} before it starts", path.display());
    let waiting = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(START_CONDITION_POLL) => {
                if path.exists() {
                    info!(
                        "{} is there after {:.1} s: starting {name}",
                        path.display(),
                        waiting.elapsed().as_secs_f64()
                    );
                    return true;
                }
            }
            request = requests.recv() => match request {
                // Nothing runs to restart: it starts once the file is there.
                Some(Control::Restart) => {}
                Some(Control::Stop(reply)) => {
                    describe_stop(name, ServiceStop::NotRunning);
                    let _ = reply.send(ServiceStop::NotRunning);
                    return false;
                }
                None => return false,
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
