//! `kubeadm token create`: a bootstrap token (given or fresh from the kernel's CSPRNG),
//! registered with no API server, optionally printed as a join command with the CA pin.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{KubeadmError, Output, io_err, parse_flags, write_record};
use crate::{KUBEADM_LABEL, StandinEnv, pki, record, validate};

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

pub(super) fn token_create(
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
