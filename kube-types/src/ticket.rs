//! The join ticket: what a node needs for `kubeadm join`, defined once. The join service issues
//! it (`hawser-joind`, from `kubeadm token create` and its configuration), PID 1 receives it in
//! the join service's answer and renders kubeadm's `JoinConfiguration` from it. Its wire form
//! and the checks on the way in are `hawser_proto::ticket`'s (the only conversion).

use std::fmt;

use zeroize::Zeroizing;

use crate::{ApiServerEndpoint, BootstrapToken, CaCertHash};

/// The Kubernetes half of a join: where the API server is, the token to join with, the pins
/// of the cluster CA, the version the cluster runs and, for a control plane, the cluster's
/// shared certificates and keys. The token and the files are secret (zeroized on drop,
/// redacted in `Debug`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTicket {
    /// `host:port` of the API server.
    pub api_server_endpoint: ApiServerEndpoint,
    pub token: BootstrapToken,
    /// Pins of the cluster CA's public key.
    pub ca_cert_hashes: Vec<CaCertHash>,
    /// The Kubernetes version the cluster runs, as the join service was configured with it.
    pub kubernetes_version: String,
    /// A control-plane join: the cluster's shared certificates and keys (name relative to
    /// `/etc/kubernetes/pki`, content); `None` for a worker.
    pub control_plane_files: Option<Vec<ControlPlaneFile>>,
}

/// One of the cluster's shared control-plane files. The content is key material: zeroized on
/// drop and never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlPlaneFile {
    /// The file's name relative to `/etc/kubernetes/pki`.
    pub name: String,
    pub data: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for ControlPlaneFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ControlPlaneFile({}, <{} bytes>)",
            self.name,
            self.data.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_neither_the_token_nor_a_file() {
        let ticket = JoinTicket {
            api_server_endpoint: "10.0.0.1:6443".parse().unwrap(),
            token: "abcdef.0123456789abcdef".parse().unwrap(),
            ca_cert_hashes: vec![format!("sha256:{}", "ab".repeat(32)).parse().unwrap()],
            kubernetes_version: "v1.33.4".to_owned(),
            control_plane_files: Some(vec![ControlPlaneFile {
                name: "ca.key".to_owned(),
                data: Zeroizing::new(b"secret key material".to_vec()),
            }]),
        };
        let debug = format!("{ticket:?}");
        assert!(!debug.contains("0123456789abcdef"), "{debug}");
        assert!(!debug.contains("secret key material"), "{debug}");
        assert!(
            debug.contains("ControlPlaneFile(ca.key, <19 bytes>)"),
            "{debug}"
        );
    }
}
