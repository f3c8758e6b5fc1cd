//! Which kubeadm configuration API hawser writes for a Kubernetes version, chosen once.
//!
//! kubeadm reads only some of its configuration APIs, and which ones depends on its release:
//!
//! | Kubernetes | kubeadm reads | hawser writes |
//! |---|---|---|
//! | 1.20 | `v1beta1` (deprecated), `v1beta2` | [`KubeadmApi::V1beta2`] |
//! | 1.21 – 1.30 | `v1beta2` to 1.25, `v1beta3` from 1.22 | nothing: refused |
//! | 1.31 and later 1.x | `v1beta3` (deprecated), `v1beta4` | [`KubeadmApi::V1beta4`] |
//!
//! 1.20 is the release hawser builds from Debian bookworm's source (the newest the package
//! registries carry); 1.31 and later are what upstream's release binaries give. hawser writes a
//! version only when a real kubeadm of that release has accepted what it writes (the real-kubeadm
//! test in `init/tests/`), so the releases between are refused by name rather than guessed.

use std::fmt;

use crate::KubernetesVersion;

/// A kubeadm configuration API hawser can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KubeadmApi {
    /// `kubeadm.k8s.io/v1beta2`, for Kubernetes 1.20: string maps for `extraArgs` and
    /// `kubeletExtraArgs`, `apiServer.timeoutForControlPlane`, no `skipPhases`.
    V1beta2,
    /// `kubeadm.k8s.io/v1beta4`, for Kubernetes 1.31 and later: `{name, value}` lists for
    /// `extraArgs` and `kubeletExtraArgs`, a `timeouts` block, `skipPhases`.
    V1beta4,
}

/// The Kubernetes releases hawser writes a kubeadm configuration for, as the error says it.
pub const KUBEADM_WRITERS: &str = "v1.20.x (kubeadm.k8s.io/v1beta2) and v1.31.0 or later 1.x \
                                   (kubeadm.k8s.io/v1beta4)";

/// A Kubernetes version hawser has no kubeadm configuration writer for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "hawser writes no kubeadm configuration for Kubernetes {version}: it writes for \
     {KUBEADM_WRITERS}"
)]
pub struct NoKubeadmWriter {
    /// The version asked for.
    pub version: KubernetesVersion,
}

impl KubeadmApi {
    /// The API hawser writes for `version`, or why none.
    pub fn for_version(version: &KubernetesVersion) -> Result<KubeadmApi, NoKubeadmWriter> {
        match (version.major(), version.minor()) {
            (1, 20) => Ok(KubeadmApi::V1beta2),
            (1, minor) if minor >= 31 => Ok(KubeadmApi::V1beta4),
            _ => Err(NoKubeadmWriter {
                version: version.clone(),
            }),
        }
    }

    /// The documents' `apiVersion`, e.g. `kubeadm.k8s.io/v1beta4`.
    pub fn api_version(self) -> &'static str {
        match self {
            KubeadmApi::V1beta2 => "kubeadm.k8s.io/v1beta2",
            KubeadmApi::V1beta4 => "kubeadm.k8s.io/v1beta4",
        }
    }

    /// The API whose `apiVersion` is `text`; `None` for any other.
    pub fn from_api_version(text: &str) -> Option<KubeadmApi> {
        [KubeadmApi::V1beta2, KubeadmApi::V1beta4]
            .into_iter()
            .find(|api| api.api_version() == text)
    }
}

impl fmt::Display for KubeadmApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api_version())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(text: &str) -> Result<KubeadmApi, NoKubeadmWriter> {
        KubeadmApi::for_version(&text.parse().unwrap())
    }

    #[test]
    fn versions_map_to_the_api_their_kubeadm_reads() {
        for (version, expected) in [
            ("v1.20.2", KubeadmApi::V1beta2),
            ("v1.20.0", KubeadmApi::V1beta2),
            ("v1.20.15", KubeadmApi::V1beta2),
            ("v1.31.0", KubeadmApi::V1beta4),
            ("v1.31.0-rc.1", KubeadmApi::V1beta4),
            ("v1.33.4", KubeadmApi::V1beta4),
            ("v1.40.0", KubeadmApi::V1beta4),
        ] {
            assert_eq!(api(version), Ok(expected), "{version}");
        }
    }

    #[test]
    fn other_versions_are_refused_by_name_saying_what_hawser_writes() {
        for version in [
            "v1.19.16", "v1.21.0", "v1.25.3", "v1.30.9", "v2.0.0", "v0.20.0",
        ] {
            let err = api(version).unwrap_err();
            assert_eq!(err.version.as_str(), version);
            let message = err.to_string();
            assert!(message.contains(version), "{message}");
            assert!(
                message.contains("v1.20.x (kubeadm.k8s.io/v1beta2)"),
                "{message}"
            );
            assert!(message.contains("v1.31.0 or later 1.x"), "{message}");
        }
    }

    #[test]
    fn api_versions_round_trip() {
        for api in [KubeadmApi::V1beta2, KubeadmApi::V1beta4] {
            assert_eq!(KubeadmApi::from_api_version(api.api_version()), Some(api));
            assert_eq!(api.to_string(), api.api_version());
        }
        assert_eq!(KubeadmApi::from_api_version("kubeadm.k8s.io/v1beta3"), None);
    }
}
