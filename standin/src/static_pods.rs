//! The kubelet stand-in's static pods: each manifest's one container's `command` + `args` run
//! as a child process (no container, no image, no volumes, no probes).
//!
//! As the kubelet does for its `staticPodPath`: every file in the directory that does not start
//! with `.` is a pod manifest (YAML or JSON); a new manifest is started, a changed one is
//! stopped and started again, a removed one is stopped; a process that exits is restarted with
//! the kubelet's crash-loop backoff (at once, then 10 s doubling to 5 min, reset after 10 min of
//! running); SIGTERM to the kubelet stops every pod (SIGTERM, then SIGKILL after the pod's
//! `terminationGracePeriodSeconds`, default 30). The directory is read every
//! [`RESCAN`] (the kubelet watches it with inotify and relists every 20 s).
//!
//! A manifest the stand-in cannot run as a process — not a Pod, several containers, init
//! containers, a container without `command` (only its image knows the entrypoint) — is refused
//! with the reason, once per content, and the others go on.
//!
//! Each process gets an empty signal mask (the kubelet stand-in blocks SIGTERM for itself), its
//! own process group, and SIGTERM when the kubelet stand-in dies (`PR_SET_PDEATHSIG`): unlike a
//! container, a process cannot outlive the kubelet to be adopted by the next one. Its output
//! goes to `<root>/var/log/pods/<namespace>_<pod>/<container>/<restarts>.log`, where the
//! kubelet keeps container logs.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tracing::{info, warn};

/// What every line about a static pod starts with.
pub const POD_LABEL: &str =
    "kubelet STAND-IN (not Kubernetes), running a static pod's command as a process (no container)";
/// How often the manifest directory is read and the processes checked.
pub const RESCAN: Duration = Duration::from_millis(500);
/// The kubelet's first crash-loop backoff.
const BACKOFF_START: Duration = Duration::from_secs(10);
/// The kubelet's longest crash-loop backoff.
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Running this long resets the backoff, as the kubelet's (2 × the maximum).
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// The default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// The PATH a container gets by default.
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a manifest cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file cannot be read.
    #[error("cannot read the manifest")]
    Read(#[source] std::io::Error),
    /// The file is neither YAML nor JSON.
    #[error("the manifest is not YAML")]
    Yaml(#[source] serde_norway::Error),
    /// The document is not a v1 Pod.
    #[error("it is {0}, not a v1 Pod")]
    NotAPod(String),
    /// `metadata.name` is missing.
    #[error("it has no metadata.name")]
    NoName,
    /// Not exactly one container.
    #[error(
        "it has {0} containers: the stand-in runs a pod of exactly one container, as one process"
    )]
    Containers(usize),
    /// Init containers cannot be run.
    #[error("it has initContainers, which the stand-in does not run")]
    InitContainers,
    /// The container has no command: its entrypoint is in its image.
    #[error(
        "container {container:?} has no command: its entrypoint is in the image {image:?}, which the stand-in cannot run without a container runtime"
    )]
    NoCommand { container: String, image: String },
    /// A field has the wrong type.
    #[error("{field} is not {expected}")]
    Field {
        field: String,
        expected: &'static str,
    },
}

/// A static pod the stand-in can run: one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPod {
    /// `<namespace>/<name>-<node>`, the mirror pod's name as the kubelet gives it.
    pub full_name: String,
    pub namespace: String,
    /// `<name>-<node>`.
    pub pod_name: String,
    pub container: String,
    pub image: String,
    /// `command[0]`, looked up in the container's default PATH.
    pub program: String,
    /// The rest of `command`, then `args`.
    pub args: Vec<String>,
    /// `env` entries with a `value`.
    pub env: Vec<(String, String)>,
    pub grace: Duration,
}

fn strings(value: &Value, field: &str) -> Result<Vec<String>, ManifestError> {
    let bad = || ManifestError::Field {
        field: field.to_owned(),
        expected: "a list of strings",
    };
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

/// Reads one manifest as the kubelet decodes a static pod, keeping what a process needs.
pub fn parse_manifest(text: &str, node: &str) -> Result<StaticPod, ManifestError> {
    let doc: Value = serde_norway::from_str(text).map_err(ManifestError::Yaml)?;
    match (doc["apiVersion"].as_str(), doc["kind"].as_str()) {
        (Some("v1"), Some("Pod")) => {}
        (a, k) => {
            return Err(ManifestError::NotAPod(format!(
                "{}/{}",
                a.unwrap_or("<no apiVersion>"),
                k.unwrap_or("<no kind>")
            )));
        }
    }
    let name = doc["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or(ManifestError::NoName)?;
    let namespace = doc["metadata"]["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let spec = &doc["spec"];
    if spec["initContainers"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(ManifestError::InitContainers);
    }
    let containers = spec["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let [container] = containers else {
        return Err(ManifestError::Containers(containers.len()));
    };
    let container_name = container["name"].as_str().unwrap_or_default().to_owned();
    let image = container["image"].as_str().unwrap_or_default().to_owned();
    let mut command = strings(&container["command"], "command")?;
    if command.is_empty() {
        return Err(ManifestError::NoCommand {
            container: container_name,
            image,
        });
    }
    let program = command.remove(0);
    command.extend(strings(&container["args"], "args")?);
    let env = container["env"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let grace = spec["terminationGracePeriodSeconds"]
        .as_u64()
        .map_or(DEFAULT_GRACE, Duration::from_secs);
    let pod_name = format!("{name}-{node}");
    Ok(StaticPod {
        full_name: format!("{namespace}/{pod_name}"),
        namespace: namespace.to_owned(),
        pod_name,
        container: container_name,
        image,
        program,
        args: command,
        env,
        grace,
    })
}

/// One manifest's running (or waiting) process.
struct Running {
    pod: StaticPod,
    digest: [u8; 32],
    child: Option<Child>,
    started: Instant,
    restarts: u32,
    /// When the next start is due, while the process is not running.
    next_start: Option<Instant>,
    backoff: Duration,
}

/// The static pods of one kubelet stand-in.
pub struct StaticPods {
    dir: PathBuf,
    node: String,
    log_dir: PathBuf,
    pods: BTreeMap<PathBuf, Running>,
    /// Manifests refused, by content, so each refusal is said once.
    refused: BTreeMap<PathBuf, [u8; 32]>,
}

fn say(pod: &str, event: impl std::fmt::Display) {
    info!("{POD_LABEL}: {pod}: {event}");
}

fn exit_text(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

impl StaticPods {
    /// The pods of `dir` (the kubelet's `staticPodPath`) on node `node`; process output under
    /// `<root>/var/log/pods`.
    pub fn new(dir: PathBuf, node: &str, root: &Path) -> Self {
        Self {
            dir,
            node: node.to_owned(),
            log_dir: root.join("var/log/pods"),
            pods: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    /// Runs the pods until `stop` delivers (or its sender is gone), then stops them all.
    pub fn run(&mut self, stop: &Receiver<()>) {
        info!(
            "{POD_LABEL}: watching {} for static pod manifests",
            self.dir.display()
        );
        loop {
            self.sync();
            self.supervise();
            match stop.recv_timeout(RESCAN) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.stop_all();
    }

    /// Reads the manifests: starts new ones, restarts changed ones, stops removed ones.
    fn sync(&mut self) {
        let mut seen = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                let hidden = entry.file_name().to_string_lossy().starts_with('.');
                if hidden || !path.is_file() {
                    continue;
                }
                match std::fs::read(&path) {
                    Ok(bytes) => {
                        seen.insert(path, bytes);
                    }
                    Err(e) => warn!(
                        "{POD_LABEL}: {}: {}",
                        path.display(),
                        crate::error_chain(&ManifestError::Read(e))
                    ),
                }
            }
        }
        let gone: Vec<PathBuf> = self
            .pods
            .keys()
            .filter(|p| !seen.contains_key(*p))
            .cloned()
            .collect();
        for path in gone {
            if let Some(running) = self.pods.remove(&path) {
                stop_pods(vec![running], "its manifest was removed");
            }
        }
        self.refused.retain(|p, _| seen.contains_key(p));
        for (path, bytes) in seen {
            let digest: [u8; 32] = Sha256::digest(&bytes).into();
            if self.pods.get(&path).is_some_and(|r| r.digest == digest)
                || self.refused.get(&path) == Some(&digest)
            {
                continue;
            }
            if let Some(old) = self.pods.remove(&path) {
                stop_pods(vec![old], "its manifest changed");
            }
            // The API server has no binary here: the kubelet stand-in listens on its port in
            // its place (see `kubelet::api_server_port`).
            if path.file_name() == Path::new(crate::kubeadm::API_SERVER_MANIFEST).file_name() {
                say(
                    "kube-system/kube-apiserver",
                    format_args!(
                        "from {}: not run (no kube-apiserver here); the kubelet stand-in listens \
                         on its port instead and serves no Kubernetes API",
                        path.display()
                    ),
                );
                self.refused.insert(path, digest);
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            match parse_manifest(&text, &self.node) {
                Ok(pod) => {
                    say(
                        &pod.full_name,
                        format_args!(
                            "from {}; image {:?} not pulled: runs {:?} from the node's file system",
                            path.display(),
                            pod.image,
                            pod.program
                        ),
                    );
                    self.pods.insert(
                        path,
                        Running {
                            pod,
                            digest,
                            child: None,
                            started: Instant::now(),
                            restarts: 0,
                            next_start: Some(Instant::now()),
                            backoff: Duration::ZERO,
                        },
                    );
                }
                Err(e) => {
                    warn!(
                        "{POD_LABEL}: refusing the manifest {}: {}; the other pods go on",
                        path.display(),
                        crate::error_chain(&e)
                    );
                    self.refused.insert(path, digest);
                }
            }
        }
    }

    /// Reaps exited processes and starts the ones whose time has come.
    fn supervise(&mut self) {
        let now = Instant::now();
        for running in self.pods.values_mut() {
            if let Some(child) = &mut running.child {
                match child.try_wait() {
                    Ok(None) => continue,
                    Ok(Some(status)) => {
                        if running.started.elapsed() >= BACKOFF_RESET {
                            running.backoff = Duration::ZERO;
                        }
                        say(
                            &running.pod.full_name,
                            format_args!(
                                "pid {} {}; restarting in {} s",
                                child.id(),
                                exit_text(status),
                                running.backoff.as_secs()
                            ),
                        );
                        running.child = None;
                        running.next_start = Some(now + running.backoff);
                        running.backoff = if running.backoff.is_zero() {
                            BACKOFF_START
                        } else {
                            (running.backoff * 2).min(BACKOFF_MAX)
                        };
                        running.restarts += 1;
                    }
                    Err(e) => {
                        warn!(
                            "{POD_LABEL}: {}: cannot check pid {}: {e}",
                            running.pod.full_name,
                            child.id()
                        );
                        continue;
                    }
                }
            }
            if running.next_start.is_some_and(|due| due <= now) {
                running.next_start = None;
                start(&self.log_dir, running);
            }
        }
    }
}

/// `<log_dir>/<namespace>_<pod>/<container>/<restarts>.log`.
fn log_path(log_dir: &Path, running: &Running) -> PathBuf {
    let pod = &running.pod;
    log_dir
        .join(format!("{}_{}", pod.namespace, pod.pod_name))
        .join(&pod.container)
        .join(format!("{}.log", running.restarts))
}

/// Starts `running`'s process, its output appended to its log file.
fn start(log_dir: &Path, running: &mut Running) {
    let pod = &running.pod;
    let log = log_path(log_dir, running);
    let output = log
        .parent()
        .map(std::fs::create_dir_all)
        .unwrap_or(Ok(()))
        .and_then(|()| File::options().create(true).append(true).open(&log));
    let (stdout, stderr) = match output.and_then(|f| Ok((f.try_clone()?, f))) {
        Ok((out, err)) => (Stdio::from(out), Stdio::from(err)),
        Err(e) => {
            warn!(
                "{POD_LABEL}: {}: cannot open {} for its output ({e}); discarding it",
                pod.full_name,
                log.display()
            );
            (Stdio::null(), Stdio::null())
        }
    };
    let mut command = Command::new(&pod.program);
    command
        .args(&pod.args)
        .env_clear()
        .env("PATH", CONTAINER_PATH)
        .envs(pod.env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    // SAFETY: runs in the forked child before exec; it only makes two system calls
    // (rt_sigprocmask, prctl), both async-signal-safe, and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::sys::signal::SigSet::all()
                .thread_unblock()
                .map_err(std::io::Error::from)?;
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)
        });
    }
    match command.spawn() {
        Ok(child) => {
            say(
                &pod.full_name,
                format_args!(
                    "started pid {} (restart {}): {} {}; output in {}",
                    child.id(),
                    running.restarts,
                    pod.program,
                    pod.args.join(" "),
                    log.display()
                ),
            );
            running.started = Instant::now();
            running.child = Some(child);
        }
        Err(e) => {
            let delay = running.backoff.max(BACKOFF_START);
            warn!(
                "{POD_LABEL}: {}: cannot start {:?}: {e}; trying again in {} s",
                pod.full_name,
                pod.program,
                delay.as_secs()
            );
            running.next_start = Some(Instant::now() + delay);
            running.backoff = (delay * 2).min(BACKOFF_MAX);
            running.restarts += 1;
        }
    }
}

impl StaticPods {
    /// Stops every pod (SIGTERM, then SIGKILL after its grace period).
    pub fn stop_all(&mut self) {
        let all = std::mem::take(&mut self.pods).into_values().collect();
        stop_pods(all, "the kubelet stand-in is stopping");
    }
}

/// SIGTERM to each running process, then waits for each until its grace period, then SIGKILL.
fn stop_pods(pods: Vec<Running>, why: &str) {
    let now = Instant::now();
    let mut waiting = Vec::new();
    for mut running in pods {
        let Some(child) = running.child.take() else {
            say(
                &running.pod.full_name,
                format_args!("removed ({why}); it was not running"),
            );
            continue;
        };
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        say(
            &running.pod.full_name,
            format_args!("stopping pid {pid} ({why}): SIGTERM"),
        );
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = now + running.pod.grace;
        waiting.push((running.pod, child, deadline));
    }
    for (pod, mut child, deadline) in waiting {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    say(
                        &pod.full_name,
                        format_args!("pid {} {}", child.id(), exit_text(status)),
                    );
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    say(
                        &pod.full_name,
                        format_args!(
                            "pid {} still running after its grace period: SIGKILL",
                            child.id()
                        ),
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_of_one_container_with_a_command_is_a_process() {
        let pod = parse_manifest(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd, namespace: kube-system}\n\
             spec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: etcd\n    image: registry.k8s.io/etcd:3.5\n    \
             command: [etcd, --name=a]\n    args: [--x=1]\n    env: [{name: A, value: b}, {name: C, valueFrom: {}}]\n",
            "cp-1",
        )
        .unwrap();
        assert_eq!(pod.full_name, "kube-system/etcd-cp-1");
        assert_eq!(pod.program, "etcd");
        assert_eq!(pod.args, ["--name=a", "--x=1"]);
        assert_eq!(pod.env, [("A".to_owned(), "b".to_owned())]);
        assert_eq!(pod.grace, Duration::from_secs(5));
    }

    #[test]
    fn what_a_process_cannot_be_is_refused_with_the_reason() {
        let cases = [
            (
                "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n",
                "not a v1 Pod",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: [{name: a, command: [x]}]}\n",
                "no metadata.name",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a, image: nginx}]}\n",
                "no command: its entrypoint is in the image \"nginx\"",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a, command: [x]}, {name: b, command: [y]}]}\n",
                "2 containers",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n",
                "0 containers",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {initContainers: [{name: i}], containers: [{name: a, command: [x]}]}\n",
                "initContainers",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a, command: x}]}\n",
                "command is not a list of strings",
            ),
            (": : :", "not YAML"),
        ];
        for (text, expected) in cases {
            let err = crate::error_chain(&parse_manifest(text, "n").unwrap_err());
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
