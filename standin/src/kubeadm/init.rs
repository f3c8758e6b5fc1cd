//! `kubeadm init`: the first control plane's CA, shared certificates, kubeconfigs, kubelet
//! files, stacked etcd member and API server manifest.

use serde_json::json;

use super::files::{write_admin_conf, write_api_server_manifest, write_kubelet_files};
use super::{
    CONFIG_COMPANIONS, KubeadmError, Output, config_arg, node_name, parse_flags, recorded_config,
    say_config, write_record,
};
use crate::config::{self, Phase};
use crate::pki::{self, Ca, Credentials};
use crate::{StandinEnv, etcd, record, validate};

pub(super) fn init(
    args: &[String],
    argv: &[String],
    env: &StandinEnv,
) -> Result<Output, KubeadmError> {
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
