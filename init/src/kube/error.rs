//! Why kubeadm did not make this node a Kubernetes node ([`KubeadmRunError`]): what the
//! intent's rendering (`grants.rs`) and the attempts (`attempts.rs`) both return.

use super::{ADMIN_KUBECONFIG, KUBEADM_CONFIG, PKI_DIR, kubeadm};
use crate::supervisor;

/// Why kubeadm did not make this node a Kubernetes node. The node stays up either way.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmRunError {
    /// The values for the kubeadm configuration are not valid (a node name or address kubeadm
    /// would refuse).
    #[error("cannot write the kubeadm configuration")]
    Config(#[source] kubeadm::KubeadmConfigError),
    /// The control-plane join's shared certificates and keys cannot be written to
    /// [`PKI_DIR`].
    #[error("cannot write the control-plane files to {PKI_DIR}")]
    ControlPlaneFiles(#[source] std::io::Error),
    /// The configuration file [`KUBEADM_CONFIG`] cannot be written.
    #[error("cannot write {KUBEADM_CONFIG}")]
    WriteConfig(#[source] std::io::Error),
    /// `kubeadm init` or `kubeadm join` did not succeed.
    #[error("kubeadm {verb} failed (attempt {attempt})")]
    Run {
        /// `init` or `join`.
        verb: &'static str,
        /// The attempt's number in this node's life.
        attempt: u32,
        #[source]
        source: supervisor::OneShotError,
    },
    /// `kubeadm init` succeeded, but the admin kubeconfig ([`ADMIN_KUBECONFIG`]) for
    /// `hawser init` cannot be read.
    #[error("kubeadm init succeeded but {ADMIN_KUBECONFIG} is unreadable")]
    AdminKubeconfig(#[source] std::io::Error),
}
