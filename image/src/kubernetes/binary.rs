//! The six binaries of the Kubernetes tree, by name: what the build makes, what the lock's
//! `[[release]]` entries provide, and what the image carries. Its own module so that the lock
//! and the build can both name them without importing each other.

/// The binaries the tree builds, in build order (cheapest first after kubeadm and kubelet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Binary {
    Kubeadm,
    Kubelet,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    KubeProxy,
}

impl Binary {
    pub const ALL: [Binary; 6] = [
        Binary::Kubeadm,
        Binary::Kubelet,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
        Binary::KubeProxy,
    ];

    /// The binary's name, also its `cmd/` directory.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Kubeadm => "kubeadm",
            Binary::Kubelet => "kubelet",
            Binary::KubeApiserver => "kube-apiserver",
            Binary::KubeControllerManager => "kube-controller-manager",
            Binary::KubeScheduler => "kube-scheduler",
            Binary::KubeProxy => "kube-proxy",
        }
    }

    /// The binary called `name`, if the tree builds one.
    pub fn from_name(name: &str) -> Option<Binary> {
        Binary::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Whether it links `k8s.io/kubernetes/pkg/generated/openapi` (only the API server does).
    pub fn needs_openapi(self) -> bool {
        self == Binary::KubeApiserver
    }
}
