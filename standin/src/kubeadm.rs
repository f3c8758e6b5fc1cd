//! The `kubeadm` stand-in's commands: `init`, `join`, `reset`, `token create`, `version`.
//!
//! Each validates what real kubeadm validates, records the call, writes the files hawser reads
//! after the real command (CA, admin.conf, kubelet.conf, the kubelet's config and flags, the
//! API server's static pod manifest) and says on every line that it is a stand-in. It starts
//! no API server (the kubelet stand-in listens on its port in its place) and speaks no
//! Kubernetes API: a token it "creates" is registered nowhere. Of the control plane it sets up
//! the stacked etcd ([`crate::etcd`]), which the kubelet stand-in runs.
//!
//! What it does that can fail as real kubeadm fails: `join`'s discovery reaches the API server
//! endpoint (`discovery.bootstrapToken.apiServerEndpoint`) — a TCP connect, retried until
//! kubeadm's discovery timeout (`timeouts.discovery`, default 5 min), printed when it starts
//! waiting — and fails naming the endpoint when nothing answers. `reset -f` removes what
//! `init` and `join` wrote, as real kubeadm's reset removes its files before a new attempt.
//!
//! One file per command (`init`, `join`, `reset`, `token`); the files `init` and `join` both
//! write are in `files`. This file holds what they share: the errors, the output, the flags and
//! the record of each call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::{self, ConfigError, KubeadmConfig};
use crate::etcd::EtcdError;
use crate::pki::PkiError;
use crate::{KUBEADM_LABEL, StandinEnv, record, validate};

mod files;
mod init;
mod join;
mod reset;
mod token;

pub use files::API_SERVER_MANIFEST;
pub use join::DEFAULT_DISCOVERY_TIMEOUT;

/// The CRI socket kubeadm defaults to on a containerd node.
pub const DEFAULT_CRI_SOCKET: &str = "unix:///var/run/containerd/containerd.sock";

/// Why a kubeadm stand-in command failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmError {
    /// The command line is wrong (exit 64).
    #[error(
        "{0}\nusage: kubeadm init --config FILE | kubeadm join --config FILE | kubeadm reset -f | kubeadm token create [TOKEN] [--kubeconfig FILE] [--ttl DURATION] [--print-join-command] | kubeadm version"
    )]
    Usage(String),
    /// The configuration file cannot be read or is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A certificate or kubeconfig could not be made or read.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// The stacked etcd member could not be set up.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The configuration is valid but names something the stand-in refuses.
    #[error("{0}")]
    Refused(String),
    /// `join`'s discovery reached nothing at the API server endpoint within its timeout.
    #[error(
        "discovery: could not reach the API server endpoint {endpoint} within {} s",
        timeout.as_secs()
    )]
    Discovery {
        /// `discovery.bootstrapToken.apiServerEndpoint`.
        endpoint: String,
        /// How long discovery tried.
        timeout: std::time::Duration,
        #[source]
        source: std::io::Error,
    },
    /// A file the command reads or writes failed.
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl KubeadmError {
    /// The process exit code: 64 (EX_USAGE) for usage errors, 1 otherwise, as kubeadm.
    pub fn exit_code(&self) -> i32 {
        match self {
            KubeadmError::Usage(_) => 64,
            _ => 1,
        }
    }
}

/// What a successful command prints.
#[derive(Debug, Default, Clone)]
pub struct Output {
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

impl Output {
    fn say(&mut self, line: impl AsRef<str>) {
        self.stdout
            .push(format!("{KUBEADM_LABEL}: {}", line.as_ref()));
    }

    /// The closing lines of `init` and `join`: each file written, and where the call is
    /// recorded.
    fn wrote(mut self, written: &[PathBuf], record: &Path) -> Self {
        for p in written {
            self.say(format!("wrote {}", p.display()));
        }
        self.say(format!("recorded the call in {}", record.display()));
        self
    }
}

/// Runs `kubeadm <args>` (without the program name).
pub fn run(args: &[String], env: &StandinEnv) -> Result<Output, KubeadmError> {
    match args.first().map(String::as_str) {
        Some("init") => init::init(&args[1..], args, env),
        Some("join") => join::join(&args[1..], args, env),
        Some("reset") => reset::reset(&args[1..], args, env),
        Some("token") if args.get(1).map(String::as_str) == Some("create") => {
            token::token_create(&args[2..], args, env)
        }
        Some("token") => Err(KubeadmError::Usage(
            "the stand-in implements only `kubeadm token create`".into(),
        )),
        Some("version") => {
            if args.len() > 1 {
                return Err(KubeadmError::Usage(format!(
                    "`kubeadm version` takes no arguments here, got {:?}",
                    &args[1..]
                )));
            }
            let mut out = Output::default();
            out.say(format!(
                "hawser-standin {}, checking kubeadm {} configurations; it runs no Kubernetes component",
                env!("CARGO_PKG_VERSION"),
                config::KUBEADM_API_VERSION
            ));
            Ok(out)
        }
        Some("-h" | "--help" | "help") | None => Err(KubeadmError::Usage(
            "kubeadm STAND-IN: a subcommand is required".into(),
        )),
        Some(other) => Err(KubeadmError::Usage(format!(
            "unknown command {other:?} (the stand-in implements init, join, reset, token create, version)"
        ))),
    }
}

/// Parsed flags: name -> values, plus positional arguments.
struct Flags {
    values: BTreeMap<&'static str, Vec<String>>,
    positional: Vec<String>,
}

impl Flags {
    fn one(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }
}

/// `--name value` / `--name=value` for flags in `with_value`, bare `--name` for `switches`.
fn parse_flags(
    args: &[String],
    with_value: &[&'static str],
    switches: &[&'static str],
) -> Result<Flags, KubeadmError> {
    let mut flags = Flags {
        values: BTreeMap::new(),
        positional: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(stripped) = arg.strip_prefix("--") else {
            flags.positional.push(arg.clone());
            continue;
        };
        let (name, inline) = match stripped.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (stripped, None),
        };
        if let Some(known) = with_value.iter().find(|f| **f == name) {
            let value = match inline {
                Some(v) => v,
                None => {
                    let v = args.get(i).cloned().ok_or_else(|| {
                        KubeadmError::Usage(format!("flag --{name} needs a value"))
                    })?;
                    i += 1;
                    v
                }
            };
            flags.values.entry(known).or_default().push(value);
        } else if let Some(known) = switches.iter().find(|f| **f == name) {
            let on = match inline.as_deref() {
                None | Some("true") => true,
                Some("false") => false,
                Some(other) => {
                    return Err(KubeadmError::Usage(format!(
                        "flag --{name} is a switch; {other:?} is not true or false"
                    )));
                }
            };
            if on {
                flags.values.entry(known).or_default();
            }
        } else {
            return Err(KubeadmError::Usage(format!("unknown flag: --{name}")));
        }
    }
    Ok(flags)
}

/// Flags kubeadm allows next to `--config` on init and join.
const CONFIG_COMPANIONS: &[&str] = &["config", "skip-phases", "ignore-preflight-errors", "v"];

fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> KubeadmError + use<> {
    let path = path.to_owned();
    move |source| KubeadmError::Io {
        action,
        path,
        source,
    }
}

/// The node name kubeadm uses: the configured one, else the lower-cased hostname.
fn node_name(configured: &str, env: &StandinEnv) -> Result<String, KubeadmError> {
    if !configured.is_empty() {
        return Ok(configured.to_owned());
    }
    let host = env.hostname.to_lowercase();
    if validate::is_dns1123_subdomain(&host) {
        Ok(host)
    } else {
        Err(KubeadmError::Refused(format!(
            "nodeRegistration.name is unset and the hostname {host:?} is not a DNS-1123 \
             subdomain: set nodeRegistration.name"
        )))
    }
}

fn config_arg(flags: &Flags, command: &str) -> Result<PathBuf, KubeadmError> {
    if let Some(p) = flags.positional.first() {
        return Err(KubeadmError::Usage(format!(
            "`kubeadm {command}` with --config takes no arguments, got {p:?}"
        )));
    }
    flags.one("config").map(PathBuf::from).ok_or_else(|| {
        KubeadmError::Usage(format!(
            "the stand-in needs `kubeadm {command} --config FILE` (hawser always passes one)"
        ))
    })
}

/// The record's view of a configuration: every document, secrets redacted.
fn recorded_config(config: &KubeadmConfig) -> Value {
    Value::Array(
        config
            .documents
            .iter()
            .map(|d| {
                let mut body = record::redact(&d.body);
                if let Value::Object(map) = &mut body {
                    map.insert("apiVersion".into(), json!(d.api_version));
                    map.insert("kind".into(), json!(d.kind));
                }
                body
            })
            .collect(),
    )
}

/// What the stand-in prints of the configuration it received: one line of compact JSON
/// (secrets redacted) after [`CONFIG_RECEIVED`], for whoever watches the node's console.
fn say_config(out: &mut Output, config: &KubeadmConfig) {
    out.say(format!("{CONFIG_RECEIVED}{}", recorded_config(config)));
}

/// The prefix of the line [`say_config`] prints.
pub const CONFIG_RECEIVED: &str = "configuration received (secrets redacted): ";

fn write_record(env: &StandinEnv, entry: &Value) -> Result<PathBuf, KubeadmError> {
    let path = record::record_path(&env.root, "kubeadm");
    record::append(&env.root, "kubeadm", entry).map_err(io_err("append to", &path))
}
