//! hawser-kube-types: the Kubernetes and kubeadm values hawser produces and checks, defined once.
//!
//! A join ticket carries kubeadm values from the join service to a node, and PID 1 writes them
//! into the kubeadm configuration after the pivot:
//!
//! ```text
//!   hawser-joind: `kubeadm token create --print-join-command`
//!       ─► ApiServerEndpoint, BootstrapToken, CaCertHash ─► join ticket (gRPC, aTLS)
//!   hawser-init:  join ticket ─► the same types ─► JoinConfiguration ─► `kubeadm join`
//!   hawser-init:  `hawser init` request ─► ServiceCidr, KubernetesVersion
//!                     ─► ClusterConfiguration ─► `kubeadm init`
//! ```
//!
//! - [`BootstrapToken`]: `[a-z0-9]{6}.[a-z0-9]{16}`, a public token ID and a secret that is
//!   zeroized on drop and redacted in `Debug`;
//! - [`CaCertHash`]: `sha256:<64 hex>`, the pin of the cluster CA's SubjectPublicKeyInfo;
//! - [`Cidr`] and [`ServiceCidr`]: `<network>/<prefix>` with no host bits set, and the API
//!   server's size limit on the Service range;
//! - [`DnsSubdomain`]: an RFC 1123 subdomain, as Kubernetes names nodes;
//! - [`Endpoint`] and [`ApiServerEndpoint`]: `host[:port]` and `host:port`, IPv6 in brackets,
//!   as kubeadm parses them;
//! - [`KubernetesVersion`]: `v<major>.<minor>.<patch>[-<pre-release>]` without leading zeros,
//!   the subset of kubeadm's `kubernetesVersion` a node installs without resolving labels;
//! - [`KubeadmApi`]: the kubeadm configuration API hawser writes for a Kubernetes version
//!   (`v1beta2` for 1.20, `v1beta4` for 1.31 and later), or [`NoKubeadmWriter`] naming it;
//! - [`ImageKubernetes`]: what a node image says about its Kubernetes (origin, version, the
//!   control-plane images), `/usr/share/hawser/kubernetes.json`, written by the image builder
//!   and read by PID 1;
//! - [`JoinTicket`]: the values above as the join service hands them to a joining node (with a
//!   control plane's shared certificates), the one definition of the ticket.
//!
//! Each type parses its text form (`FromStr`, one error type each) and prints its canonical form
//! (`Display`; the token only through [`BootstrapToken::expose_secret`]). A value that parsed is
//! valid, so code holding one need not check it again. The errors say what is wrong but never
//! repeat the input: a token is a secret, and for the other values the caller, which knows the
//! field, names it and its value.
//!
//! Everything here is pure (the image description is JSON text in, JSON text out): no I/O, no async runtime, no random number generator (a new token
//! is made from random bytes the caller passes in). `standin/`, hawser's stand-in for kubeadm,
//! deliberately does not use this crate: it checks what hawser writes with kubeadm's rules in
//! its own code, a second opinion that a shared bug here could not silence.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod ca_cert_hash;
pub mod cidr;
pub mod dns;
pub mod endpoint;
pub mod image_kubernetes;
pub mod kubeadm_api;
pub mod ticket;
pub mod token;
pub mod version;

pub use ca_cert_hash::{CaCertHash, CaCertHashError};
pub use cidr::{Cidr, CidrError, ServiceCidr, ServiceCidrError};
pub use dns::{DnsSubdomain, DnsSubdomainError};
pub use endpoint::{ApiServerEndpoint, Endpoint, EndpointError, Host};
pub use image_kubernetes::{
    CONTROL_PLANE_ARCHIVE, IMAGE_KUBERNETES_PATH, ImageArchive, ImageKubernetes,
    ImageKubernetesError, ImageRef, ImageSet, KUBERNETES_IMAGES, KubernetesOrigin, NODE_ARCHIVE,
    NODE_KUBERNETES_IMAGES,
};
pub use kubeadm_api::{KUBEADM_WRITERS, KubeadmApi, NoKubeadmWriter};
pub use ticket::{ControlPlaneFile, JoinTicket};
pub use token::{BootstrapToken, BootstrapTokenError};
pub use version::{KubernetesVersion, KubernetesVersionError, VersionNumber};
