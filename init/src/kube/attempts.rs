//! kubeadm's attempts: what this boot has to do (a new intent, what an earlier boot left, or
//! nothing), one attempt (`kubeadm reset -f` before a retry, a control-plane join's shared
//! files put back, the configuration written, kubeadm run once, the status saved and printed)
//! and why an attempt failed. [`super::run`] retries them with backoff until one succeeds.

use std::path::Path;

use tracing::{info, warn};

use super::error::KubeadmRunError;
use super::intent::{KUBEADM_INTENT, KUBEADM_STATUS, KubeadmIntent, KubeadmState, KubeadmStatus};
use super::{
    KUBEADM, KUBEADM_CONFIG, KUBEADM_MARKER, NodeIdentity, PKI_DIR, Role, grants, kubeadm,
};
use crate::fatal::error_chain;
use crate::platform::reaper::ChildRegistry;
use crate::supervisor::retry::KUBEADM_RETRY;
use crate::supervisor::{self, OneShotJob, OneShotOutcome};
use hawser_kube_types::ControlPlaneFile;

/// What kubeadm has to do on this boot.
pub(super) enum KubeadmWork {
    /// Nothing: kubeadm succeeded on an earlier boot, or there is nothing it could run.
    Nothing,
    /// No configuration can be rendered (the reason, for the admin's `hawser init`).
    Unrunnable(String),
    /// Run `intent` (boxed: it is large); `status` counts the attempts of earlier boots.
    Run {
        intent: Box<KubeadmIntent>,
        status: KubeadmStatus,
    },
}

/// What an earlier boot left for kubeadm (a rejoining or recovered node): nothing if the
/// marker is there, else the kept intent with its attempts so far. `on_disk` maps an absolute
/// path to the state disk's file.
fn earlier_boot_work(on_disk: &dyn Fn(&str) -> std::path::PathBuf) -> KubeadmWork {
    let marker = on_disk(KUBEADM_MARKER);
    match std::fs::symlink_metadata(&marker) {
        Ok(_) => {
            info!("this node joined on an earlier boot: kubeadm does not run again");
            return KubeadmWork::Nothing;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!("cannot check kubeadm's marker {KUBEADM_MARKER} ({e}); kubeadm does not run");
            return KubeadmWork::Nothing;
        }
    }
    match KubeadmIntent::load(&on_disk(KUBEADM_INTENT)) {
        Ok(Some(intent)) => {
            let status = match KubeadmStatus::load(&on_disk(KUBEADM_STATUS)) {
                Ok(Some(status)) => status,
                Ok(None) => KubeadmStatus::new(intent.verb),
                Err(e) => {
                    warn!("{}; counting attempts from 0", error_chain(&e));
                    KubeadmStatus::new(intent.verb)
                }
            };
            info!(
                "kubeadm {} did not finish on an earlier boot ({} attempt(s), no marker \
                 {KUBEADM_MARKER}): running it again from {KUBEADM_INTENT}",
                intent.verb.as_str(),
                status.attempts
            );
            KubeadmWork::Run {
                intent: Box::new(intent),
                status,
            }
        }
        Ok(None) => {
            warn!(
                "neither kubeadm's marker {KUBEADM_MARKER} nor its intent {KUBEADM_INTENT} \
                 is on the state disk: kubeadm has nothing to run; services only"
            );
            KubeadmWork::Nothing
        }
        Err(e) => {
            warn!(
                "{}: kubeadm cannot run again; services only",
                error_chain(&e)
            );
            KubeadmWork::Nothing
        }
    }
}

/// What kubeadm does on this boot: a new intent (init, join), or what an earlier boot left
/// (rejoin, recover). Never fails: a broken intent is logged, and the node runs its services.
pub(super) fn kubeadm_work(role: &Role, identity: &NodeIdentity, root: &Path) -> KubeadmWork {
    let on_disk = |path: &str| root.join(path.trim_start_matches('/'));
    let Some(grant) = role.kubeadm_grant() else {
        return earlier_boot_work(&on_disk);
    };
    // The rendering this boot kept on the state disk before its "initialized" mark (`grants`),
    // so from here a power cut leaves the intent or the marker.
    match grants::render_intent(grant, identity) {
        Ok(intent) => {
            let status = KubeadmStatus::new(intent.verb);
            KubeadmWork::Run {
                intent: Box::new(intent),
                status,
            }
        }
        Err(e) => {
            warn!("{}; the node stays up without Kubernetes", error_chain(&e));
            KubeadmWork::Unrunnable(error_chain(&e))
        }
    }
}

/// One attempt, number `attempt` of this node's life: `kubeadm reset -f` first unless it is
/// the first, the control-plane files put (back) in place, the configuration written, kubeadm
/// run once. The status is saved before (a power cut counts the attempt) and after, and
/// printed on the console after.
pub(super) async fn attempt_kubeadm(
    registry: &ChildRegistry,
    intent: &KubeadmIntent,
    attempt: u32,
    status: &tokio::sync::Mutex<KubeadmStatus>,
) -> Result<(), KubeadmRunError> {
    let mut status = status.lock().await;
    status.attempts = attempt;
    status.state = KubeadmState::Pending;
    if let Err(e) = status.save(Path::new(KUBEADM_STATUS)) {
        warn!("{}", error_chain(&e));
    }
    let outcome = run_kubeadm(registry, intent, attempt).await;
    match &outcome {
        Ok(()) => {
            status.state = KubeadmState::Done;
            status.last_error = None;
        }
        Err(e) => {
            let delay = KUBEADM_RETRY.delay_after(attempt);
            warn!(
                "{}; the node stays up without Kubernetes; attempt {} in {} s",
                error_chain(e),
                attempt.saturating_add(1),
                delay.as_secs()
            );
            status.last_error = Some(error_chain(e));
        }
    }
    if let Err(e) = status.save(Path::new(KUBEADM_STATUS)) {
        warn!("{}", error_chain(&e));
    }
    crate::platform::console::emit_raw_console_line(&status.console_line());
    outcome
}

async fn run_kubeadm(
    registry: &ChildRegistry,
    intent: &KubeadmIntent,
    attempt: u32,
) -> Result<(), KubeadmRunError> {
    let verb = intent.verb.as_str();
    if attempt > 1 {
        // What a half-run kubeadm left (certificates, kubeconfigs, manifests) stops the next
        // run at its preflight checks: clean up as an operator would.
        let reset = OneShotJob::new("kubeadm", &[KUBEADM, "reset", "-f"], KUBEADM_MARKER);
        match supervisor::run_job(registry, &reset, "to clean up before the retry").await {
            Ok(took) => info!("kubeadm reset -f done in {:.1} s", took.as_secs_f64()),
            Err(e) => warn!(
                "{}; trying kubeadm {verb} anyway (its preflight checks say what is left)",
                error_chain(&e)
            ),
        }
    }
    // A control-plane join without `--upload-certs`: the cluster's shared certificates must be
    // in place before kubeadm runs (it refuses otherwise), and `kubeadm reset` removed them.
    if !intent.control_plane_files.is_empty() {
        write_control_plane_files(Path::new(PKI_DIR), &intent.control_plane_files)
            .map_err(KubeadmRunError::ControlPlaneFiles)?;
        info!(
            "control-plane join: wrote the cluster's {} shared certificate and key files to \
             {PKI_DIR}",
            intent.control_plane_files.len()
        );
    }
    // The image's control-plane images (after the pivot, on every boot: never kept).
    let config = match &intent.images {
        Some(images) => {
            kubeadm::with_images(&intent.config, images).map_err(KubeadmRunError::Config)?
        }
        None => intent.config.clone(),
    };
    kubeadm::write_config(Path::new(KUBEADM_CONFIG), &config)
        .map_err(KubeadmRunError::WriteConfig)?;
    let args = kubeadm_args(intent);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = OneShotJob::new("kubeadm", &args, KUBEADM_MARKER);
    match supervisor::run_once(registry, &job).await {
        Ok(OneShotOutcome::Succeeded { took }) => {
            info!("kubeadm {verb} succeeded in {:.1} s", took.as_secs_f64());
            Ok(())
        }
        Ok(OneShotOutcome::AlreadyDone) => Ok(()),
        Err(source) => Err(KubeadmRunError::Run {
            verb,
            attempt,
            source,
        }),
    }
}

/// `kubeadm init|join --config`, with what the configuration's API cannot say (kubeadm 1.20:
/// `--skip-phases=preflight`, and with the image's images `addon/coredns` and
/// `addon/kube-proxy`), read from the
/// configuration itself and the image, so an intent an earlier boot kept runs the same way.
pub(super) fn kubeadm_args(intent: &KubeadmIntent) -> Vec<String> {
    let mut args: Vec<String> = [KUBEADM, intent.verb.as_str(), "--config", KUBEADM_CONFIG]
        .map(str::to_owned)
        .into();
    if let Some(api) = intent.config.api() {
        args.extend(kubeadm::command_flags(
            api,
            intent.verb,
            intent.images.as_ref(),
        ));
    }
    args
}

/// Writes the join service's control-plane files under `pki_dir`: keys 0600, certificates
/// and public keys 0644, as kubeadm writes them. A name that is absolute or climbs out of
/// `pki_dir` is refused (the service is attested, but a path is still input).
fn write_control_plane_files(pki_dir: &Path, files: &[ControlPlaneFile]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    for file in files {
        let relative = Path::new(&file.name);
        let plain = relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if file.name.is_empty() || !plain {
            return Err(std::io::Error::other(format!(
                "refusing the control-plane file name {:?}",
                file.name
            )));
        }
        let path = pki_dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mode = if file.name.ends_with(".key") {
            0o600
        } else {
            0o644
        };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&path)?;
        out.write_all(&file.data)?;
        out.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
