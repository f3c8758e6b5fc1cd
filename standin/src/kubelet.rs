//! The `kubelet` stand-in: checks the flags the kubeadm systemd drop-in passes, records its
//! start, then runs the static pods of its configuration's `staticPodPath` as processes
//! ([`crate::static_pods`]: kubeadm's etcd on a control-plane node) until SIGTERM. It runs no
//! other pods: there is no API server to get them from.
//!
//! On a control plane (the kubeadm stand-in's `init` wrote the API server's static pod
//! manifest), where a real kubelet would run the kube-apiserver pod, it opens the API server's
//! port instead ([`api_server_port`]): a TCP listener that accepts and closes connections and
//! speaks no Kubernetes API, so that other nodes' `kubeadm join` discovery reaches this control
//! plane (and fails, as for real, while it is down).
//!
//! The checks are the ones that make a real kubelet exit at start-up — a missing config file,
//! no kubeconfig to reach an API server with, a container runtime socket that is not there — so
//! hawser's supervisor (restart with backoff) sees the same failures it would see for real.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{KUBELET_LABEL, StandinEnv, config, record};

/// Why the stand-in kubelet refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The command line is wrong.
    #[error("{0}")]
    Usage(String),
    /// A file a flag names is not what the kubelet needs.
    #[error("{flag} {path}: {problem}")]
    File {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
    /// A file a flag names cannot be read.
    #[error("{flag} {path}: cannot be read")]
    FileRead {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kubelet configuration file is not YAML.
    #[error("{flag} {path}: not YAML")]
    FileYaml {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: serde_norway::Error,
    },
    /// Neither kubeconfig exists.
    #[error(
        "neither --kubeconfig ({kubeconfig}) nor --bootstrap-kubeconfig ({bootstrap}) exists: the kubelet has no way to reach an API server"
    )]
    NoKubeconfig {
        kubeconfig: String,
        bootstrap: String,
    },
    /// kubeadm-flags.env exists but cannot be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The start could not be written to the record.
    #[error("cannot record the start in {path}")]
    Record {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A checked start: what the stand-in will say and has recorded.
#[derive(Debug, Clone)]
pub struct Start {
    pub node: String,
    pub config: PathBuf,
    /// The kubeconfig in use: --kubeconfig if it exists, else --bootstrap-kubeconfig.
    pub kubeconfig: PathBuf,
    pub flags: BTreeMap<String, String>,
    pub record: PathBuf,
    /// The configuration's `staticPodPath`, if it sets one.
    pub static_pod_path: Option<PathBuf>,
}

impl Start {
    /// The line printed once the kubelet stand-in idles.
    pub fn banner(&self) -> String {
        let pods = match &self.static_pod_path {
            Some(dir) => format!(
                "runs the static pods in {} as processes (no containers), no others",
                dir.display()
            ),
            None => "no staticPodPath: runs no pods".to_owned(),
        };
        format!(
            "{KUBELET_LABEL}: started for node {} with config {} and kubeconfig {}; \
             {pods}; waiting for SIGTERM",
            self.node,
            self.config.display(),
            self.kubeconfig.display()
        )
    }
}

/// Flags taking a value that may come as a separate argument.
const VALUE_FLAGS: &[&str] = &[
    "config",
    "kubeconfig",
    "bootstrap-kubeconfig",
    "container-runtime-endpoint",
    "hostname-override",
    "node-ip",
    "cert-dir",
    "pod-infra-container-image",
    "v",
];

/// Parses `--name=value` / `--name value` (for [`VALUE_FLAGS`]); later flags win, as in Go's
/// flag package.
fn parse_flags(
    args: &[String],
    flags: &mut BTreeMap<String, String>,
    source: &str,
) -> Result<(), KubeletError> {
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(stripped) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(KubeletError::Usage(format!(
                "unexpected argument {arg:?} in {source}: the kubelet takes only flags"
            )));
        };
        match stripped.split_once('=') {
            Some((name, value)) => {
                flags.insert(name.to_owned(), value.to_owned());
            }
            None if VALUE_FLAGS.contains(&stripped) => {
                let value = args.get(i).ok_or_else(|| {
                    KubeletError::Usage(format!("flag --{stripped} in {source} needs a value"))
                })?;
                i += 1;
                flags.insert(stripped.to_owned(), value.clone());
            }
            None => {
                flags.insert(stripped.to_owned(), "true".to_owned());
            }
        }
    }
    Ok(())
}

/// The `KUBELET_KUBEADM_ARGS` of kubeadm-flags.env, split into arguments.
fn kubeadm_flags_env(path: &Path) -> Result<Option<Vec<String>>, KubeletError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(KubeletError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let args = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("KUBELET_KUBEADM_ARGS="))
        .flat_map(|v| {
            v.trim_matches('"')
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(Some(args))
}

fn existing_file(flag: &'static str, path: &str) -> Result<PathBuf, KubeletError> {
    let path = PathBuf::from(path);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => Ok(path),
        Ok(_) => Err(KubeletError::File {
            flag,
            path,
            problem: "is not a regular file".into(),
        }),
        Err(source) => Err(KubeletError::FileRead { flag, path, source }),
    }
}

/// Checks the kubelet configuration file as the kubelet loads it; returns its `staticPodPath`.
fn check_kubelet_config(path: &Path) -> Result<Option<PathBuf>, KubeletError> {
    let bad = |problem: String| KubeletError::File {
        flag: "--config",
        path: path.to_owned(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|source| KubeletError::FileRead {
        flag: "--config",
        path: path.to_owned(),
        source,
    })?;
    let doc: Value = serde_norway::from_str(&text).map_err(|source| KubeletError::FileYaml {
        flag: "--config",
        path: path.to_owned(),
        source,
    })?;
    match (doc["apiVersion"].as_str(), doc["kind"].as_str()) {
        (Some(config::KUBELET_API_VERSION), Some("KubeletConfiguration")) => {
            match &doc["staticPodPath"] {
                Value::Null => Ok(None),
                Value::String(dir) if Path::new(dir).is_absolute() => Ok(Some(PathBuf::from(dir))),
                other => Err(bad(format!(
                    "staticPodPath {other} is not an absolute path"
                ))),
            }
        }
        (a, k) => Err(bad(format!(
            "is {}/{}, not {}/KubeletConfiguration",
            a.unwrap_or("<no apiVersion>"),
            k.unwrap_or("<no kind>"),
            config::KUBELET_API_VERSION
        ))),
    }
}

/// Checks the command line (plus kubeadm-flags.env under the stand-in root) and records the
/// start. `args` excludes the program name.
pub fn prepare(args: &[String], env: &StandinEnv) -> Result<Start, KubeletError> {
    let mut flags = BTreeMap::new();
    parse_flags(args, &mut flags, "the command line")?;
    // The kubeadm drop-in puts $KUBELET_KUBEADM_ARGS after the config flags: they win.
    let env_file = env.root.join("var/lib/kubelet/kubeadm-flags.env");
    let env_args = kubeadm_flags_env(&env_file)?;
    if let Some(extra) = &env_args {
        parse_flags(extra, &mut flags, &env_file.display().to_string())?;
    }

    let config = flags.get("config").ok_or_else(|| {
        KubeletError::Usage(
            "--config is required (kubeadm's drop-in passes --config=/var/lib/kubelet/config.yaml)"
                .into(),
        )
    })?;
    let config = existing_file("--config", config)?;
    let static_pod_path = check_kubelet_config(&config)?;

    let kubeconfig = flags.get("kubeconfig").cloned();
    let bootstrap = flags.get("bootstrap-kubeconfig").cloned();
    let exists = |p: &Option<String>| p.as_ref().is_some_and(|p| Path::new(p).is_file());
    let kubeconfig = if exists(&kubeconfig) {
        PathBuf::from(kubeconfig.unwrap_or_default())
    } else if exists(&bootstrap) {
        PathBuf::from(bootstrap.unwrap_or_default())
    } else {
        return Err(KubeletError::NoKubeconfig {
            kubeconfig: kubeconfig.unwrap_or_else(|| "not given".into()),
            bootstrap: bootstrap.unwrap_or_else(|| "not given".into()),
        });
    };

    if let Some(endpoint) = flags.get("container-runtime-endpoint") {
        let socket = endpoint
            .strip_prefix("unix://")
            .ok_or_else(|| KubeletError::File {
                flag: "--container-runtime-endpoint",
                path: PathBuf::from(endpoint),
                problem: "is not a unix:// URL".into(),
            })?;
        if !Path::new(socket).exists() {
            return Err(KubeletError::File {
                flag: "--container-runtime-endpoint",
                path: PathBuf::from(socket),
                problem: "does not exist: is the container runtime (containerd) running?".into(),
            });
        }
    }

    let node = flags
        .get("hostname-override")
        .cloned()
        .unwrap_or_else(|| env.hostname.to_lowercase());
    let record_path = record::record_path(&env.root, "kubelet");
    record::append(
        &env.root,
        "kubelet",
        &json!({
            "time": record::unix_time(),
            "event": "start",
            "pid": std::process::id(),
            "argv": record::redact_argv(args),
            "kubeadm_flags_env": env_args.map(|_| env_file),
            "flags": flags,
            "node": node,
        }),
    )
    .map_err(|source| KubeletError::Record {
        path: record_path.clone(),
        source,
    })?;
    Ok(Start {
        node,
        config,
        kubeconfig,
        flags,
        record: record_path,
        static_pod_path,
    })
}

/// Records the stop (best effort: the process is exiting either way).
pub fn record_stop(env: &StandinEnv, signal: &str) {
    let _ = record::append(
        &env.root,
        "kubelet",
        &json!({
            "time": record::unix_time(),
            "event": "stop",
            "pid": std::process::id(),
            "signal": signal,
        }),
    );
}

/// The port of the API server whose static pod manifest the kubeadm stand-in wrote
/// (`--secure-port=` in its command); `None` on a node without one (a worker, before `init`).
pub fn api_server_port(env: &StandinEnv) -> Option<u16> {
    let path = env.root.join(crate::kubeadm::API_SERVER_MANIFEST);
    let text = std::fs::read_to_string(path).ok()?;
    let manifest: Value = serde_norway::from_str(&text).ok()?;
    manifest["spec"]["containers"][0]["command"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|arg| arg.strip_prefix("--secure-port="))
        .and_then(|port| port.parse().ok())
}
