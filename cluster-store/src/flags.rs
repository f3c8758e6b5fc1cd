//! The etcd flags `hawser-joind` and `hawser peers` share.

use std::path::PathBuf;
use std::time::Duration;

use super::{EtcdConfig, StoreError};

/// Where the cluster state is, when it is in the control planes' etcd.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdFlags {
    /// etcd client URLs, comma-separated (kubeadm's stacked etcd: `https://127.0.0.1:2379`).
    /// With them the cluster state (joined disks, control-plane approvals, the mesh) is the
    /// control planes' etcd, shared by the join services of every control plane
    /// (docs/cluster-state.md); without them, local files.
    #[arg(long, value_delimiter = ',', requires_all = ["etcd_ca", "etcd_cert", "etcd_key"])]
    pub etcd_endpoints: Vec<String>,
    /// The etcd CA (kubeadm: /etc/kubernetes/pki/etcd/ca.crt).
    #[arg(long)]
    pub etcd_ca: Option<PathBuf>,
    /// The etcd client certificate (kubeadm: /etc/kubernetes/pki/apiserver-etcd-client.crt).
    #[arg(long)]
    pub etcd_cert: Option<PathBuf>,
    /// The etcd client key (kubeadm: /etc/kubernetes/pki/apiserver-etcd-client.key).
    #[arg(long)]
    pub etcd_key: Option<PathBuf>,
    /// Deadline of every etcd call, in seconds.
    #[arg(long, default_value_t = 5)]
    pub etcd_timeout_secs: u64,
}

impl EtcdFlags {
    /// The etcd client configuration (its TLS files read), or `None` without endpoints.
    pub fn config(&self) -> Result<Option<EtcdConfig>, StoreError> {
        if self.etcd_endpoints.is_empty() {
            return Ok(None);
        }
        let (Some(ca), Some(cert), Some(key)) = (&self.etcd_ca, &self.etcd_cert, &self.etcd_key)
        else {
            return Err(StoreError::IncompleteEtcdFlags);
        };
        EtcdConfig::from_files(
            self.etcd_endpoints.clone(),
            ca,
            cert,
            key,
            Duration::from_secs(self.etcd_timeout_secs.max(1)),
        )
        .map(Some)
    }
}
