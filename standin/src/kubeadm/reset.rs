//! `kubeadm reset -f`: removes what `init` and `join` wrote, as real kubeadm's reset does
//! before a new attempt.

use serde_json::json;

use super::{KubeadmError, Output, io_err, parse_flags, write_record};
use crate::{StandinEnv, record};

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

pub(super) fn reset(
    args: &[String],
    argv: &[String],
    env: &StandinEnv,
) -> Result<Output, KubeadmError> {
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
