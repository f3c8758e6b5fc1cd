//! The init server's validation, pure: an `Init` or `Recover` request becomes a [`Grant`]
//! (the master secret, the measurement salt, a new cluster's spec) or a [`RequestError`]
//! naming the field. The secret's bytes are taken out of the request and wiped there.

use std::net::IpAddr;

use hawser_keys::MasterSecret;
use hawser_kube_types::{
    DnsSubdomain, Endpoint, KubeadmApi, KubernetesVersion, KubernetesVersionError, NoKubeadmWriter,
    ServiceCidrError,
};
use hawser_proto::init::{InitRequest, RecoverRequest};
use zeroize::Zeroize as _;

use super::{ClusterSpec, GrantKind, MAX_CONTROL_PLANE_APPROVALS, MEASUREMENT_SALT_LEN};

/// Why a request is refused (→ `InvalidArgument`).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The master secret is too short.
    #[error("invalid master secret")]
    MasterSecret(#[source] hawser_keys::KeyError),
    /// The measurement salt has the wrong length.
    #[error("measurement_salt must be {MEASUREMENT_SALT_LEN} bytes, got {0}")]
    MeasurementSalt(usize),
    /// The cluster name is not a DNS label.
    #[error("cluster_name {0:?} is not a DNS label (1-63 of a-z, 0-9, '-', not at either end)")]
    ClusterName(String),
    /// The Kubernetes version is not a release version kubeadm installs without resolving a
    /// label (`v1.33.4`, `v1.34.0-rc.1`).
    #[error("kubernetes_version {value:?} is not a Kubernetes version to install (e.g. v1.33.4)")]
    KubernetesVersion {
        /// The version as the request spelled it.
        value: String,
        /// Why it is not one.
        #[source]
        source: KubernetesVersionError,
    },
    /// The request leaves the version to the image, and the image names none (no
    /// `hawser.kubernetes` on its command line: an image without a rootfs).
    #[error(
        "kubernetes_version is empty (the image's), but this image names no Kubernetes version \
         (no hawser.kubernetes on its command line): give one with --kubernetes-version"
    )]
    NoImageVersion,
    /// The request asks for another version than the image carries: the image's kubeadm and
    /// kubelet install only their own.
    #[error(
        "this image carries Kubernetes {image} (hawser.kubernetes on its command line); it \
         cannot install {requested}: omit --kubernetes-version or build an image of that version"
    )]
    NotTheImageVersion {
        /// The image's version.
        image: KubernetesVersion,
        /// The version the request asked for.
        requested: KubernetesVersion,
    },
    /// hawser writes no kubeadm configuration for the version.
    #[error("kubernetes_version {version} cannot be installed")]
    NoKubeadmWriter {
        /// The version the request asked for.
        version: KubernetesVersion,
        #[source]
        source: NoKubeadmWriter,
    },
    /// The Service range is not a CIDR, or is larger than the API server allows.
    #[error("service_cidr {value:?} is not a usable Service range (e.g. 10.96.0.0/12)")]
    ServiceCidr {
        /// The range as the request spelled it.
        value: String,
        /// Why it is not usable.
        #[source]
        source: ServiceCidrError,
    },
    /// The control-plane endpoint is not `host[:port]`.
    #[error("control_plane_endpoint {value:?} is not host[:port]")]
    ControlPlaneEndpoint {
        /// The endpoint as the request spelled it.
        value: String,
        #[source]
        source: hawser_kube_types::EndpointError,
    },
    /// The mesh prefix is not an IPv4 network the mesh can use.
    #[error(
        "vpn_prefix {value:?} is not a usable WireGuard mesh prefix: give an IPv4 network \
         address with a length of 24 to 30, e.g. 10.99.0.0/24 ({reason})"
    )]
    VpnPrefix {
        /// The prefix as the request spelled it.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An extra API server certificate name is neither an IP address nor a DNS name.
    #[error("api_server_cert_sans entry {0:?} is neither an IP address nor a DNS name")]
    CertSan(String),
    /// A control-plane approval is not a TPM name of a SHA-1/256/384/512 key (a 2-byte
    /// algorithm identifier and a digest of its length).
    #[error(
        "control_plane_approvals entry {index} ({hex}) is not an AK's TPM name (000b followed \
         by a SHA-256 digest, as `hawser-joind` prints it)"
    )]
    ControlPlaneApproval {
        /// 0-based position in the request.
        index: usize,
        /// The entry in hex, cut to 80 characters.
        hex: String,
    },
    /// More approvals than [`MAX_CONTROL_PLANE_APPROVALS`].
    #[error(
        "control_plane_approvals has {0} entries; at most {MAX_CONTROL_PLANE_APPROVALS} are \
         accepted (approve more later in the join service's approvals file)"
    )]
    TooManyApprovals(usize),
}

/// Checks each approval is a TPM name; returns them as lowercase hex, the approvals file's form.
fn validate_approvals(approvals: &[Vec<u8>]) -> Result<Vec<String>, RequestError> {
    if approvals.len() > MAX_CONTROL_PLANE_APPROVALS {
        return Err(RequestError::TooManyApprovals(approvals.len()));
    }
    approvals
        .iter()
        .enumerate()
        .map(|(index, name)| {
            let digest_len = match name.get(..2) {
                Some([0x00, 0x04]) => 20,
                Some([0x00, 0x0b]) => 32,
                Some([0x00, 0x0c]) => 48,
                Some([0x00, 0x0d]) => 64,
                _ => 0,
            };
            if digest_len != 0 && name.len() == 2 + digest_len {
                Ok(hex::encode(name))
            } else {
                Err(RequestError::ControlPlaneApproval {
                    index,
                    hex: hex::encode(name).chars().take(80).collect(),
                })
            }
        })
        .collect()
}

/// The Kubernetes version an Init request installs: the image's when the request leaves it
/// empty; else the request's, which must be the image's (when the image names one) and one
/// hawser writes a kubeadm configuration for. Checked before the node is locked or its disk
/// formatted.
pub fn init_kubernetes_version(
    requested: &str,
    image: Option<&KubernetesVersion>,
) -> Result<KubernetesVersion, RequestError> {
    let version = match (requested, image) {
        ("", Some(image)) => return Ok(image.clone()),
        ("", None) => return Err(RequestError::NoImageVersion),
        (text, _) => {
            text.parse::<KubernetesVersion>()
                .map_err(|source| RequestError::KubernetesVersion {
                    value: text.to_owned(),
                    source,
                })?
        }
    };
    if let Some(image) = image
        && *image != version
    {
        return Err(RequestError::NotTheImageVersion {
            image: image.clone(),
            requested: version,
        });
    }
    KubeadmApi::for_version(&version).map_err(|source| RequestError::NoKubeadmWriter {
        version: version.clone(),
        source,
    })?;
    Ok(version)
}

/// Validates an Init request, taking (and wiping from the request) its secrets. `image` is the
/// image's Kubernetes version (`hawser.kubernetes`), if it names one.
pub fn validate_init(
    request: &mut InitRequest,
    image: Option<&KubernetesVersion>,
) -> Result<(GrantKind, MasterSecret, Vec<u8>), RequestError> {
    let master = take_master(&mut request.master_secret, &mut request.master_secret_salt);
    let salt = std::mem::take(&mut request.measurement_salt);
    let master = master?;
    check_salt(&salt)?;
    if !is_dns_label(&request.cluster_name) {
        return Err(RequestError::ClusterName(request.cluster_name.clone()));
    }
    let kubernetes_version = init_kubernetes_version(&request.kubernetes_version, image)?;
    let service_cidr =
        request
            .service_cidr
            .parse()
            .map_err(|source| RequestError::ServiceCidr {
                value: request.service_cidr.clone(),
                source,
            })?;
    if let Some(bad) = request
        .api_server_cert_sans
        .iter()
        .find(|san| san.parse::<IpAddr>().is_err() && !is_dns_name(san))
    {
        return Err(RequestError::CertSan(bad.clone()));
    }
    let control_plane_endpoint =
        match request.control_plane_endpoint.as_str() {
            "" => None,
            text => Some(text.parse::<Endpoint>().map_err(|source| {
                RequestError::ControlPlaneEndpoint {
                    value: text.to_owned(),
                    source,
                }
            })?),
        };
    let control_plane_approvals = validate_approvals(&request.control_plane_approvals)?;
    let mesh_prefix = validate_vpn_prefix(&request.vpn_prefix)?;
    let spec = ClusterSpec {
        cluster_name: request.cluster_name.clone(),
        kubernetes_version,
        service_cidr,
        api_server_cert_sans: request.api_server_cert_sans.clone(),
        control_plane_endpoint,
        control_plane_approvals,
        mesh_prefix,
    };
    Ok((GrantKind::Init(spec), master, salt))
}

/// The mesh prefix of an Init request: `None` for none (empty).
fn validate_vpn_prefix(text: &str) -> Result<Option<hawser_mesh::Ipv4Net>, RequestError> {
    if text.is_empty() {
        return Ok(None);
    }
    let refuse = |reason: String| RequestError::VpnPrefix {
        value: text.chars().take(64).collect(),
        reason,
    };
    let prefix: hawser_mesh::Ipv4Net = text.parse().map_err(|e| refuse(format!("{e}")))?;
    if prefix.trunc() != prefix {
        return Err(refuse(format!(
            "host bits set; the network is {}",
            prefix.trunc()
        )));
    }
    hawser_mesh::Registry::new(prefix).map_err(|e| refuse(e.to_string()))?;
    hawser_mesh::pods::check_cluster_prefix(prefix).map_err(|e| refuse(e.to_string()))?;
    Ok(Some(prefix))
}

/// Validates a Recover request, taking (and wiping from the request) its secrets.
pub fn validate_recover(
    request: &mut RecoverRequest,
) -> Result<(GrantKind, MasterSecret, Vec<u8>), RequestError> {
    let master = take_master(&mut request.master_secret, &mut request.master_secret_salt);
    let salt = std::mem::take(&mut request.measurement_salt);
    let master = master?;
    check_salt(&salt)?;
    Ok((GrantKind::Recover, master, salt))
}

fn take_master(key: &mut Vec<u8>, salt: &mut Vec<u8>) -> Result<MasterSecret, RequestError> {
    let result = MasterSecret::new(key.clone(), salt.clone()).map_err(RequestError::MasterSecret);
    key.zeroize();
    salt.zeroize();
    result
}

fn check_salt(salt: &[u8]) -> Result<(), RequestError> {
    if salt.len() == MEASUREMENT_SALT_LEN {
        Ok(())
    } else {
        Err(RequestError::MeasurementSalt(salt.len()))
    }
}

fn is_dns_label(s: &str) -> bool {
    s.parse::<DnsSubdomain>().is_ok_and(|name| name.is_label())
}

fn is_dns_name(s: &str) -> bool {
    s.parse::<DnsSubdomain>().is_ok()
}
