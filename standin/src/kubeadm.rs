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

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::config::{self, ConfigError, KubeadmConfig, Phase};
use crate::etcd::{self, EtcdError};
use crate::pki::{self, Ca, Credentials, PkiError};
use crate::{KUBEADM_LABEL, StandinEnv, record, validate};

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
        Some("init") => init(&args[1..], args, env),
        Some("join") => join(&args[1..], args, env),
        Some("reset") => reset(&args[1..], args, env),
        Some("token") if args.get(1).map(String::as_str) == Some("create") => {
            token_create(&args[2..], args, env)
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

/// /var/lib/kubelet/config.yaml and kubeadm-flags.env, as kubeadm writes them for the kubelet.
fn write_kubelet_files(
    env: &StandinEnv,
    kubelet_config: Option<&Value>,
    registration: &config::NodeRegistrationOptions,
    written: &mut Vec<PathBuf>,
) -> Result<(), KubeadmError> {
    let mut document = kubelet_config.cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut document {
        map.insert("apiVersion".into(), json!(config::KUBELET_API_VERSION));
        map.insert("kind".into(), json!("KubeletConfiguration"));
        // kubeadm's default: the kubelet runs the control plane's static pods from there.
        map.entry("staticPodPath")
            .or_insert_with(|| json!(etcd::manifests_dir(env)));
    }
    let yaml = serde_norway::to_string(&document).unwrap_or_default();
    let config_path = env.root.join("var/lib/kubelet/config.yaml");
    pki::write_file(
        &config_path,
        format!("# Written by the kubeadm STAND-IN (hawser-standin).\n{yaml}").as_bytes(),
        0o644,
    )?;
    written.push(config_path);

    let socket = if registration.cri_socket.is_empty() {
        DEFAULT_CRI_SOCKET
    } else {
        &registration.cri_socket
    };
    let mut args = vec![format!("--container-runtime-endpoint={socket}")];
    args.extend(
        registration
            .kubelet_extra_args
            .iter()
            .map(|a| format!("--{}={}", a.name, a.value)),
    );
    let flags_path = env.root.join("var/lib/kubelet/kubeadm-flags.env");
    pki::write_file(
        &flags_path,
        format!("KUBELET_KUBEADM_ARGS=\"{}\"\n", args.join(" ")).as_bytes(),
        0o644,
    )?;
    written.push(flags_path);
    Ok(())
}

fn init(args: &[String], argv: &[String], env: &StandinEnv) -> Result<Output, KubeadmError> {
    let flags = parse_flags(args, CONFIG_COMPANIONS, &["dry-run"])?;
    let path = config_arg(&flags, "init")?;
    let config = config::load(&path, Phase::Init)?;
    let Some(init) = config.init.as_ref() else {
        // parse() refuses an init configuration without InitConfiguration.
        return Err(KubeadmError::Refused("no InitConfiguration".into()));
    };
    let cluster = config.cluster.clone().unwrap_or_default();
    let node = node_name(&init.node_registration.name, env)?;
    let address = init.local_api_endpoint.advertise_address.clone();
    let port = init.local_api_endpoint.port();
    let local_server = pki::server_url(&address, port);
    // admin.conf points at the cluster endpoint when there is one, as kubeadm's does.
    let cluster_server = match cluster.control_plane_endpoint.as_str() {
        "" => local_server.clone(),
        endpoint => match validate::split_host_port(endpoint) {
            Ok((host, p)) => pki::server_url(host, p),
            Err(_) => pki::server_url(endpoint, port),
        },
    };
    let dry_run = init.dry_run || flags.has("dry-run");
    let version = match cluster.kubernetes_version.as_str() {
        "" => "(default)".to_owned(),
        v => v.to_owned(),
    };

    let mut out = Output::default();
    out.say(format!(
        "would run init for node {node}: API server {local_server}, Kubernetes {version}; \
         no API server is started"
    ));
    let mut written = Vec::new();
    let mut ca_hash = None;
    if dry_run {
        out.say("dry run: no files written");
    } else {
        let kube_dir = env.root.join("etc/kubernetes");
        let (ca, created) = Ca::load_or_create(&kube_dir.join("pki"))?;
        written.push(kube_dir.join("pki/ca.crt"));
        if created {
            written.push(kube_dir.join("pki/ca.key"));
        }
        written.extend(pki::create_shared_control_plane_files(
            &kube_dir.join("pki"),
        )?);
        written.push(write_admin_conf(&kube_dir, &ca, &cluster_server)?);
        let (kubelet_cert, kubelet_key) =
            ca.client_cert(&format!("system:node:{node}"), Some("system:nodes"))?;
        let kubelet = pki::kubeconfig(
            &local_server,
            Some(&ca.cert_pem),
            &format!("kubelet-{node}-standin"),
            Credentials::ClientCert {
                cert_pem: &kubelet_cert,
                key_pem: &kubelet_key,
            },
        );
        pki::write_kubeconfig(&kube_dir.join("kubelet.conf"), &kubelet)?;
        written.push(kube_dir.join("kubelet.conf"));
        write_kubelet_files(
            env,
            config.kubelet.as_ref(),
            &init.node_registration,
            &mut written,
        )?;
        let (said, files) = etcd::kubeadm_init(env, &node, &address, &cluster)?;
        out.say(said);
        written.extend(files);
        written.push(write_api_server_manifest(env, &address, port)?);
        let hash = ca.cert_hash().map_err(KubeadmError::Refused)?;
        out.say(format!(
            "stand-in CA {} ({}), pin {hash}",
            kube_dir.join("pki/ca.crt").display(),
            if created { "new" } else { "reused" }
        ));
        ca_hash = Some(hash);
    }
    for t in &init.bootstrap_tokens {
        out.say(format!(
            "would create bootstrap token {} (registered with no API server)",
            record::redact_token(&t.token)
        ));
    }
    say_config(&mut out, &config);
    let record_path = write_record(
        env,
        &json!({
            "time": record::unix_time(),
            "subcommand": "init",
            "argv": record::redact_argv(argv),
            "config_file": path,
            "node": node,
            "api_server": local_server,
            "cluster_server": cluster_server,
            "dry_run": dry_run,
            "ca_cert_hash": ca_hash,
            "config": recorded_config(&config),
            "written": written,
        }),
    )?;
    Ok(out.wrote(&written, &record_path))
}

fn join(args: &[String], argv: &[String], env: &StandinEnv) -> Result<Output, KubeadmError> {
    let flags = parse_flags(args, CONFIG_COMPANIONS, &["dry-run"])?;
    let path = config_arg(&flags, "join")?;
    let config = config::load(&path, Phase::Join)?;
    let Some(join) = config.join.as_ref() else {
        return Err(KubeadmError::Refused("no JoinConfiguration".into()));
    };
    let node = node_name(&join.node_registration.name, env)?;
    let Some(discovery) = join.discovery.bootstrap_token.as_ref() else {
        return Err(KubeadmError::Refused("no bootstrap-token discovery".into()));
    };
    let role = if join.control_plane.is_some() {
        "control-plane node"
    } else {
        "worker"
    };
    let server = format!("https://{}", discovery.api_server_endpoint);
    let dry_run = join.dry_run || flags.has("dry-run");

    let mut out = Output::default();
    out.say(format!(
        "would run join for node {node} as a {role} via API server {server}; \
         discovery reaches the endpoint over TCP only, and no kubelet TLS bootstrap happens"
    ));
    let mut written = Vec::new();
    if let Some(control_plane) = &join.control_plane {
        // Without a certificate key (`--upload-certs`), kubeadm needs the cluster's shared
        // certificates and keys in place before it joins a control-plane node.
        if control_plane.certificate_key.is_empty() {
            let pki_dir = env.root.join("etc/kubernetes/pki");
            let missing: Vec<&str> = ["ca.crt", "ca.key"]
                .iter()
                .chain(pki::SHARED_CONTROL_PLANE_FILES)
                .copied()
                .filter(|name| !pki_dir.join(name).is_file())
                .collect();
            if !missing.is_empty() {
                return Err(KubeadmError::Refused(format!(
                    "a control-plane join without certificateKey needs the shared certificates \
                     in {}: missing {}",
                    pki_dir.display(),
                    missing.join(", ")
                )));
            }
            let ca = std::fs::read_to_string(pki_dir.join("ca.crt"))
                .map_err(io_err("read", &pki_dir.join("ca.crt")))?;
            let pin = pki::ca_cert_hash(&ca).map_err(KubeadmError::Refused)?;
            out.say(format!(
                "control-plane join: the shared certificates are in {} (cluster CA {pin})",
                pki_dir.display()
            ));
        }
    }
    if dry_run {
        out.say("dry run: no discovery, no files written");
    } else {
        let timeout = match join.timeouts.as_ref().and_then(|t| t.discovery.as_deref()) {
            Some(text) => validate::parse_go_duration(text).ok_or_else(|| {
                KubeadmError::Refused(format!("timeouts.discovery {text:?} is not a duration"))
            })?,
            None => DEFAULT_DISCOVERY_TIMEOUT,
        };
        discover(&discovery.api_server_endpoint, timeout)?;
        out.say(format!(
            "discovery: reached the API server endpoint {} (TCP only: no cluster-info is \
             fetched, the CA pin is not checked against a server)",
            discovery.api_server_endpoint
        ));
        let token = if join.discovery.tls_bootstrap_token.is_empty() {
            &discovery.token
        } else {
            &join.discovery.tls_bootstrap_token
        };
        let kubelet = pki::kubeconfig(
            &server,
            None,
            &format!("kubelet-{node}-standin"),
            Credentials::Token(token),
        );
        let path = env.root.join("etc/kubernetes/kubelet.conf");
        pki::write_kubeconfig(&path, &kubelet)?;
        written.push(path);
        if join.control_plane.is_some() {
            // As kubeadm's control-plane join: an admin kubeconfig from the cluster CA (its key
            // is among the shared files checked above).
            let kube_dir = env.root.join("etc/kubernetes");
            let (ca, _) = Ca::load_or_create(&kube_dir.join("pki"))?;
            written.push(write_admin_conf(&kube_dir, &ca, &server)?);
        }
        write_kubelet_files(env, None, &join.node_registration, &mut written)?;
        if let Some(control_plane) = &join.control_plane {
            let (said, files) =
                etcd::kubeadm_join(env, &node, control_plane, &discovery.api_server_endpoint)?;
            out.say(said);
            written.extend(files);
        }
    }
    say_config(&mut out, &config);
    let record_path = write_record(
        env,
        &json!({
            "time": record::unix_time(),
            "subcommand": "join",
            "argv": record::redact_argv(argv),
            "config_file": path,
            "node": node,
            "role": role,
            "api_server": server,
            "dry_run": dry_run,
            "config": recorded_config(&config),
            "written": written,
        }),
    )?;
    Ok(out.wrote(&written, &record_path))
}

/// Writes `admin.conf` under `kube_dir` (a client certificate of the cluster CA for
/// `kubernetes-admin` in `kubeadm:cluster-admins`, pointing at `server`), as `kubeadm init`
/// and a control-plane `kubeadm join` do; returns its path.
fn write_admin_conf(kube_dir: &Path, ca: &Ca, server: &str) -> Result<PathBuf, KubeadmError> {
    let (admin_cert, admin_key) =
        ca.client_cert("kubernetes-admin", Some("kubeadm:cluster-admins"))?;
    let admin = pki::kubeconfig(
        server,
        Some(&ca.cert_pem),
        "kubernetes-admin-standin",
        Credentials::ClientCert {
            cert_pem: &admin_cert,
            key_pem: &admin_key,
        },
    );
    let path = kube_dir.join("admin.conf");
    pki::write_kubeconfig(&path, &admin)?;
    Ok(path)
}

/// kubeadm's default discovery timeout (`timeouts.discovery` in v1beta4).
pub const DEFAULT_DISCOVERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
/// How long one connect to the API server endpoint may take.
const DISCOVERY_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// The pause between two connects.
const DISCOVERY_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Reaches `endpoint` (`host:port`) over TCP, retried until `timeout`. Prints (at once, not at
/// the end as the command's other lines) when it starts waiting and every 30 s.
fn discover(endpoint: &str, timeout: std::time::Duration) -> Result<(), KubeadmError> {
    use std::net::{TcpStream, ToSocketAddrs as _};
    use std::time::Instant;
    let started = Instant::now();
    let mut said = None::<Instant>;
    loop {
        let attempt = endpoint.to_socket_addrs().and_then(|mut addrs| {
            let addr = addrs.next().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, "no address for the endpoint")
            })?;
            let left = timeout.saturating_sub(started.elapsed());
            TcpStream::connect_timeout(
                &addr,
                left.clamp(
                    std::time::Duration::from_millis(100),
                    DISCOVERY_CONNECT_TIMEOUT,
                ),
            )
        });
        let error = match attempt {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if started.elapsed() >= timeout {
            return Err(KubeadmError::Discovery {
                endpoint: endpoint.to_owned(),
                timeout,
                source: error,
            });
        }
        if said.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(30)) {
            eprintln!(
                "{KUBEADM_LABEL}: discovery: waiting for the API server endpoint {endpoint} \
                 ({error}); retrying for up to {} s",
                timeout.as_secs()
            );
            said = Some(Instant::now());
        }
        std::thread::sleep(DISCOVERY_RETRY.min(timeout.saturating_sub(started.elapsed())));
    }
}

/// The API server's static pod manifest, as kubeadm writes it for the kubelet. The stand-in
/// kubelet runs no pod: it opens the port the manifest names (see `kubelet`), so that other
/// nodes' discovery reaches this control plane.
pub const API_SERVER_MANIFEST: &str = "etc/kubernetes/manifests/kube-apiserver.yaml";

fn write_api_server_manifest(
    env: &StandinEnv,
    address: &str,
    port: u16,
) -> Result<PathBuf, KubeadmError> {
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-apiserver", "namespace": "kube-system"},
        "spec": {"hostNetwork": true, "containers": [{
            "name": "kube-apiserver",
            "image": "registry.k8s.io/kube-apiserver (not pulled: stand-in)",
            "command": [
                "kube-apiserver",
                format!("--advertise-address={address}"),
                format!("--secure-port={port}"),
            ],
        }]},
    });
    let yaml = serde_norway::to_string(&manifest).unwrap_or_default();
    let path = env.root.join(API_SERVER_MANIFEST);
    pki::write_file(
        &path,
        format!("# Written by the kubeadm STAND-IN (hawser-standin).\n{yaml}").as_bytes(),
        0o600,
    )?;
    Ok(path)
}

/// What `reset` removes under the root: what `init` and `join` write (and real kubeadm's
/// reset removes).
const RESET_PATHS: &[&str] = &[
    "etc/kubernetes/admin.conf",
    "etc/kubernetes/super-admin.conf",
    "etc/kubernetes/kubelet.conf",
    "etc/kubernetes/bootstrap-kubelet.conf",
    "etc/kubernetes/controller-manager.conf",
    "etc/kubernetes/scheduler.conf",
    "etc/kubernetes/pki",
    "etc/kubernetes/manifests",
    "var/lib/kubelet/config.yaml",
    "var/lib/kubelet/kubeadm-flags.env",
    "var/lib/etcd",
];

fn reset(args: &[String], argv: &[String], env: &StandinEnv) -> Result<Output, KubeadmError> {
    // `-f` is the short form of `--force`; the flag parser knows long flags only.
    let long: Vec<String> = args
        .iter()
        .map(|a| {
            if a == "-f" {
                "--force".to_owned()
            } else {
                a.clone()
            }
        })
        .collect();
    let flags = parse_flags(&long, &["cri-socket", "kubeconfig", "v"], &["force"])?;
    if let Some(p) = flags.positional.first() {
        return Err(KubeadmError::Usage(format!(
            "`kubeadm reset` takes no arguments, got {p:?}"
        )));
    }
    if !flags.has("force") {
        return Err(KubeadmError::Refused(
            "reset asks for confirmation without --force (-f); the stand-in does not prompt".into(),
        ));
    }
    let mut out = Output::default();
    let mut removed = Vec::new();
    for relative in RESET_PATHS {
        let path = env.root.join(relative);
        let result = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => Err(e),
        };
        result.map_err(io_err("remove", &path))?;
        out.say(format!("removed {}", path.display()));
        removed.push(path);
    }
    if removed.is_empty() {
        out.say("nothing to remove: no files of init or join");
    }
    let record_path = write_record(
        env,
        &json!({
            "time": record::unix_time(),
            "subcommand": "reset",
            "argv": record::redact_argv(argv),
            "removed": removed,
        }),
    )?;
    out.say(format!("recorded the call in {}", record_path.display()));
    Ok(out)
}

/// A fresh bootstrap token from the kernel's CSPRNG.
fn random_token() -> Result<String, KubeadmError> {
    const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let urandom = Path::new("/dev/urandom");
    let mut file = std::fs::File::open(urandom).map_err(io_err("open", urandom))?;
    let mut chars = Vec::with_capacity(22);
    let mut buf = [0u8; 64];
    while chars.len() < 22 {
        file.read_exact(&mut buf).map_err(io_err("read", urandom))?;
        // Rejection sampling: 252 = 7 * 36 keeps the alphabet uniform.
        chars.extend(
            buf.iter()
                .filter(|b| **b < 252)
                .map(|b| ALPHABET[usize::from(*b % 36)]),
        );
    }
    chars.truncate(22);
    chars.insert(6, b'.');
    Ok(String::from_utf8_lossy(&chars).into_owned())
}

fn token_create(
    args: &[String],
    argv: &[String],
    env: &StandinEnv,
) -> Result<Output, KubeadmError> {
    let flags = parse_flags(
        args,
        &[
            "kubeconfig",
            "ttl",
            "description",
            "groups",
            "usages",
            "certificate-key",
            "config",
            "v",
        ],
        &["print-join-command"],
    )?;
    if flags.positional.len() > 1 {
        return Err(KubeadmError::Usage(format!(
            "`kubeadm token create` takes at most one token, got {}",
            flags.positional.len()
        )));
    }
    let ttl = flags.one("ttl").unwrap_or("24h0m0s");
    if validate::parse_go_duration(ttl).is_none() {
        return Err(KubeadmError::Usage(format!(
            "invalid argument {ttl:?} for \"--ttl\" flag: not a duration such as 24h0m0s"
        )));
    }
    let token = match flags.positional.first() {
        Some(t) if validate::is_bootstrap_token(t) => t.clone(),
        Some(_) => {
            return Err(KubeadmError::Refused(
                "the token does not match [a-z0-9]{6}.[a-z0-9]{16}".into(),
            ));
        }
        None => random_token()?,
    };
    let kubeconfig = flags
        .one("kubeconfig")
        .map_or_else(|| env.root.join("etc/kubernetes/admin.conf"), PathBuf::from);
    let info = pki::read_cluster_info(&kubeconfig)?;
    let endpoint = pki::endpoint_of(&info.server).ok_or_else(|| {
        KubeadmError::Refused(format!(
            "the server {:?} in {} is not https://host:port",
            info.server,
            kubeconfig.display()
        ))
    })?;
    let mut out = Output::default();
    let print_join = flags.has("print-join-command");
    let ca_hash = if print_join {
        let ca = info.ca_pem.as_deref().ok_or_else(|| {
            KubeadmError::Refused(format!(
                "{} has no certificate-authority-data: cannot compute the CA pin",
                kubeconfig.display()
            ))
        })?;
        let hash = pki::ca_cert_hash(ca).map_err(|why| {
            KubeadmError::Refused(format!(
                "the CA in {} is unusable: {why}",
                kubeconfig.display()
            ))
        })?;
        // The join command stays one parseable line; the label rides along as a shell comment.
        out.stdout.push(format!(
            "kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {hash} \
             # {KUBEADM_LABEL}: this token is registered with no API server"
        ));
        Some(hash)
    } else {
        out.stdout.push(token.clone());
        None
    };
    out.stderr.push(format!(
        "{KUBEADM_LABEL}: created token {} (ttl {ttl}) for {endpoint}; it is registered with no API server",
        record::redact_token(&token)
    ));
    write_record(
        env,
        &json!({
            "time": record::unix_time(),
            "subcommand": "token create",
            "argv": record::redact_argv(argv),
            "kubeconfig": kubeconfig,
            "ttl": ttl,
            "token": record::redact_token(&token),
            "api_server_endpoint": endpoint,
            "ca_cert_hash": ca_hash,
        }),
    )?;
    Ok(out)
}
