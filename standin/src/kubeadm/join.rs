//! `kubeadm join`: discovery (a TCP connect to the API server endpoint, retried until its
//! timeout), the kubelet's kubeconfig, and on a control plane admin.conf and the etcd member.

use serde_json::json;

use super::files::{write_admin_conf, write_kubelet_files};
use super::{
    CONFIG_COMPANIONS, KubeadmError, Output, config_arg, io_err, node_name, parse_flags,
    recorded_config, say_config, write_record,
};
use crate::config::{self, Phase};
use crate::pki::{self, Ca, Credentials};
use crate::{KUBEADM_LABEL, StandinEnv, etcd, record, validate};

pub(super) fn join(
    args: &[String],
    argv: &[String],
    env: &StandinEnv,
) -> Result<Output, KubeadmError> {
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
