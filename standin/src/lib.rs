//! hawser-standin: honest stand-ins for `kubeadm` and `kubelet`.
//!
//! Kubernetes' own packages (pkgs.k8s.io) cannot be reached from every build machine. When the
//! rootfs build cannot have them, it installs these two binaries instead — at /usr/bin/kubeadm
//! and /usr/bin/kubelet, next to a marker file /usr/share/hawser/STAND-IN saying what was
//! substituted and why — so that hawser's node logic (run `kubeadm init|join` once, supervise
//! the kubelet, issue join tokens) can be exercised end to end.
//!
//! They are stand-ins, never Kubernetes: every line they print says so
//! ("kubeadm STAND-IN (not Kubernetes)"), the CA they make is labelled as theirs, and the
//! kubeconfigs they write name a "standin" cluster. What they do check is real: kubeadm's
//! configuration is decoded strictly against the kubeadm v1beta4 API and validated as kubeadm
//! validates it ([`config`]), so a configuration hawser writes that real kubeadm would refuse
//! is refused here too, with the document, field and problem named.
//!
//! The stand-ins deliberately use none of hawser's crates, `hawser-kube-types` included, for
//! the bootstrap token, CA certificate hash, CIDR, DNS-name and endpoint checks that hawser
//! defines there: they stand in for upstream kubeadm and the kubelet, so they check with their
//! own code ([`validate`]), written from kubeadm's rules. That makes them a second opinion on
//! what hawser writes: a bug in hawser's shared types cannot make both sides agree on something
//! kubeadm would refuse. (The only hawser crate they touch is `hawser-joinservice`, as a
//! dev-dependency of the contract test that runs its token issuer against this kubeadm.)
//!
//! On a control-plane node they run a real etcd the way kubeadm does (stacked etcd): the
//! kubeadm stand-in makes its certificates, adds the member to the cluster and writes its static
//! pod manifest ([`etcd`]); the kubelet stand-in runs static pods' commands as processes
//! ([`static_pods`]).
//!
//! Every call is recorded as a JSON line under `<root>/var/log/hawser-standin/` ([`record`]).
//! `<root>` is `/`, or `$HAWSER_STANDIN_ROOT` so tests run without root.

pub mod config;
pub mod etcd;
pub mod kubeadm;
pub mod kubelet;
pub mod pki;
pub mod record;
pub mod static_pods;
pub mod validate;

use std::path::PathBuf;

/// An error and its causes, outermost first, joined by `": "` (each message describes its own
/// layer only). The stand-ins keep this copy rather than share hawser's.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// How the kubeadm stand-in labels its output.
pub const KUBEADM_LABEL: &str = "kubeadm STAND-IN (not Kubernetes)";
/// How the kubelet stand-in labels its output.
pub const KUBELET_LABEL: &str = "kubelet STAND-IN (not Kubernetes)";
/// The environment variable that moves the stand-ins' file system root.
pub const ROOT_ENV: &str = "HAWSER_STANDIN_ROOT";

/// Where the stand-ins read and write, and the node's hostname.
#[derive(Debug, Clone)]
pub struct StandinEnv {
    /// Prefix for /etc/kubernetes, /var/lib/kubelet and /var/log/hawser-standin.
    pub root: PathBuf,
    /// The kernel's hostname (kubeadm's default node name, lower-cased by the caller).
    pub hostname: String,
}

impl StandinEnv {
    /// `$HAWSER_STANDIN_ROOT` (default `/`) and the kernel's hostname.
    pub fn from_process() -> Self {
        let root = std::env::var_os(ROOT_ENV)
            .filter(|r| !r.is_empty())
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        Self { root, hostname }
    }
}

/// Prefixes every line of `text` with `label: `.
pub fn labelled(label: &str, text: &str) -> String {
    text.lines()
        .map(|l| format!("{label}: {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
