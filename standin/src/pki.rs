//! The stand-in's certificates and kubeconfigs: what hawser reads after `kubeadm init`.
//!
//! The CA is a real self-signed CA (ECDSA P-256, made with rcgen) whose subject says it is the
//! stand-in's, so a certificate made here can never be mistaken for a cluster's. Client
//! certificates are signed by it. Kubeconfig cluster, user and context names all contain
//! "standin". An existing CA is reused, as `kubeadm init` reuses one it finds.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The CA's common name.
pub const CA_COMMON_NAME: &str = "hawser kubeadm stand-in CA";
/// The kubeconfig cluster name.
pub const CLUSTER_NAME: &str = "hawser-standin";
/// First line of every kubeconfig the stand-in writes.
pub const KUBECONFIG_HEADER: &str = "# Written by the kubeadm STAND-IN (hawser-standin), not by Kubernetes: no API server backs it.\n";

/// Why a certificate or kubeconfig could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file or directory of the PKI could not be read, written or created.
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// rcgen could not make a key or certificate.
    #[error("generating {what} failed")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// ca.crt and ca.key exist but one of them does not load.
    #[error("the existing CA in {path} cannot be used: {file} does not load")]
    ExistingCa {
        path: PathBuf,
        /// `ca.crt` or `ca.key`.
        file: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// The kubeconfig is YAML but lacks what a cluster entry needs.
    #[error("the kubeconfig {path} is not usable: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    /// The kubeconfig is not YAML.
    #[error("the kubeconfig {path} is not usable: it is not YAML")]
    KubeconfigYaml {
        path: PathBuf,
        #[source]
        source: serde_norway::Error,
    },
    /// The kubeconfig's certificate-authority-data is not base64.
    #[error("the kubeconfig {path} is not usable: certificate-authority-data is not base64")]
    KubeconfigBase64 {
        path: PathBuf,
        #[source]
        source: base64::DecodeError,
    },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + use<> {
    let path = path.to_owned();
    move |source| PkiError::Io {
        action,
        path,
        source,
    }
}

fn gen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

/// The cluster CA: its PEM certificate and the issuer that signs with its key.
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of Debug output.
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// Sets a validity of `days` from an hour ago (clock skew between nodes).
pub fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

impl Ca {
    /// Loads `ca.crt` + `ca.key` from `pki_dir` if both exist, else makes and writes a new CA.
    /// Returns the CA and whether it was newly made.
    pub fn load_or_create(pki_dir: &Path) -> Result<(Self, bool), PkiError> {
        let cert_path = pki_dir.join("ca.crt");
        let key_path = pki_dir.join("ca.key");
        if cert_path.exists() && key_path.exists() {
            let cert_pem = std::fs::read_to_string(&cert_path).map_err(io("read", &cert_path))?;
            let key_pem = std::fs::read_to_string(&key_path).map_err(io("read", &key_path))?;
            let existing = |file: &'static str| {
                let path = cert_path.clone();
                move |source| PkiError::ExistingCa { path, file, source }
            };
            let key = KeyPair::from_pem(&key_pem).map_err(existing("ca.key"))?;
            let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(existing("ca.crt"))?;
            return Ok((
                Self {
                    cert_pem,
                    key_pem,
                    issuer,
                },
                false,
            ));
        }
        let ca = Self::generate()?;
        std::fs::create_dir_all(pki_dir).map_err(io("create directory", pki_dir))?;
        write_file(&cert_path, ca.cert_pem.as_bytes(), 0o644)?;
        write_file(&key_path, ca.key_pem.as_bytes(), 0o600)?;
        Ok((ca, true))
    }

    /// A new self-signed CA, valid for ten years as kubeadm's is.
    pub fn generate() -> Result<Self, PkiError> {
        let key = KeyPair::generate().map_err(gen_err("the CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, CA_COMMON_NAME);
        dn.push(DnType::OrganizationName, "hawser-standin (not Kubernetes)");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyCertSign,
        ];
        validity(&mut params, 3650);
        let cert = params
            .self_signed(&key)
            .map_err(gen_err("the CA certificate"))?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A client certificate (PEM cert, PEM key) for `common_name` in `organization`.
    pub fn client_cert(
        &self,
        common_name: &str,
        organization: Option<&str>,
    ) -> Result<(String, String), PkiError> {
        let key = KeyPair::generate().map_err(gen_err("a client key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        if let Some(o) = organization {
            dn.push(DnType::OrganizationName, o);
        }
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params, 365);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(gen_err("a client certificate"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A leaf certificate for `params` (a fresh key, the CA's validity rules applied by the
    /// caller) signed by this CA: (PEM cert, PEM key). `what` names it in errors.
    pub fn sign(
        &self,
        params: &CertificateParams,
        what: &'static str,
    ) -> Result<(String, String), PkiError> {
        let key = KeyPair::generate().map_err(gen_err(what))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(gen_err(what))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// kubeadm's `--discovery-token-ca-cert-hash` for this CA.
    pub fn cert_hash(&self) -> Result<String, String> {
        ca_cert_hash(&self.cert_pem)
    }
}

/// The key material every control-plane node shares besides the cluster CA, relative to
/// `/etc/kubernetes/pki`: what `kubeadm init` creates and `kubeadm join --control-plane`
/// needs in place (or from `--upload-certs`).
pub const SHARED_CONTROL_PLANE_FILES: &[&str] = &[
    "sa.key",
    "sa.pub",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
];

/// Makes the shared control-plane key material that is missing under `pki_dir` (the service
/// account key pair, the front-proxy CA and the etcd CA — each a fresh key, self-signed where a
/// certificate); returns the files written.
pub fn create_shared_control_plane_files(pki_dir: &Path) -> Result<Vec<PathBuf>, PkiError> {
    let mut written = Vec::new();
    let sa_key = pki_dir.join("sa.key");
    if !sa_key.exists() {
        let key = KeyPair::generate().map_err(gen_err("the service account key"))?;
        write_file(&sa_key, key.serialize_pem().as_bytes(), 0o600)?;
        let sa_pub = pki_dir.join("sa.pub");
        write_file(&sa_pub, key.public_key_pem().as_bytes(), 0o644)?;
        written.extend([sa_key, sa_pub]);
    }
    for stem in ["front-proxy-ca", "etcd/ca"] {
        let cert = pki_dir.join(format!("{stem}.crt"));
        let key = pki_dir.join(format!("{stem}.key"));
        if cert.exists() && key.exists() {
            continue;
        }
        let ca = Ca::generate()?;
        write_file(&cert, ca.cert_pem.as_bytes(), 0o644)?;
        write_file(&key, ca.key_pem.as_bytes(), 0o600)?;
        written.extend([cert, key]);
    }
    Ok(written)
}

/// `sha256:<hex>` of a PEM certificate's SubjectPublicKeyInfo, as kubeadm pins CAs.
pub fn ca_cert_hash(cert_pem: &str) -> Result<String, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let spki = cert.tbs_certificate.subject_pki.raw;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(spki))))
}

/// `https://host:port`, with IPv6 hosts in brackets.
pub fn server_url(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// How a kubeconfig user authenticates.
pub enum Credentials<'a> {
    /// A client certificate and key (PEM).
    ClientCert { cert_pem: &'a str, key_pem: &'a str },
    /// A bearer token (a bootstrap token, as in bootstrap-kubelet.conf).
    Token(&'a str),
}

/// A kubeconfig for `user` against `server`, with the CA when there is one.
pub fn kubeconfig(
    server: &str,
    ca_pem: Option<&str>,
    user: &str,
    credentials: Credentials<'_>,
) -> Value {
    let mut cluster = json!({ "server": server });
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] = json!(BASE64.encode(ca));
    }
    let user_entry = match credentials {
        Credentials::ClientCert { cert_pem, key_pem } => json!({
            "client-certificate-data": BASE64.encode(cert_pem),
            "client-key-data": BASE64.encode(key_pem),
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let context = format!("{user}@{CLUSTER_NAME}");
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": CLUSTER_NAME, "cluster": cluster }],
        "contexts": [{ "name": context, "context": { "cluster": CLUSTER_NAME, "user": user } }],
        "current-context": context,
        "users": [{ "name": user, "user": user_entry }],
        "preferences": {},
    })
}

/// Writes a kubeconfig as YAML with the stand-in header, mode 0600 (it holds a key or token).
pub fn write_kubeconfig(path: &Path, config: &Value) -> Result<(), PkiError> {
    // Serializing a serde_json::Value to YAML cannot fail: it has only string keys.
    let yaml = serde_norway::to_string(config).unwrap_or_default();
    write_file(path, format!("{KUBECONFIG_HEADER}{yaml}").as_bytes(), 0o600)
}

/// What `kubeadm token create` needs from a kubeconfig: the server and the CA.
#[derive(Debug, Clone)]
pub struct ClusterInfo {
    pub server: String,
    pub ca_pem: Option<String>,
}

/// Reads the current context's cluster from a kubeconfig (YAML or JSON).
pub fn read_cluster_info(path: &Path) -> Result<ClusterInfo, PkiError> {
    let text = std::fs::read_to_string(path).map_err(io("open", path))?;
    let bad = |reason: String| PkiError::Kubeconfig {
        path: path.to_owned(),
        reason,
    };
    let config: Value =
        serde_norway::from_str(&text).map_err(|source| PkiError::KubeconfigYaml {
            path: path.to_owned(),
            source,
        })?;
    let clusters = config["clusters"]
        .as_array()
        .ok_or_else(|| bad("it has no clusters".into()))?;
    let current = config["current-context"].as_str();
    let cluster_name = current.and_then(|ctx| {
        config["contexts"]
            .as_array()?
            .iter()
            .find(|c| c["name"].as_str() == Some(ctx))?["context"]["cluster"]
            .as_str()
    });
    let cluster = match cluster_name {
        Some(name) => clusters.iter().find(|c| c["name"].as_str() == Some(name)),
        None if clusters.len() == 1 => clusters.first(),
        None => None,
    }
    .ok_or_else(|| bad("no cluster for its current-context".into()))?;
    let server = cluster["cluster"]["server"]
        .as_str()
        .ok_or_else(|| bad("its cluster has no server".into()))?
        .to_owned();
    let ca_pem =
        match cluster["cluster"]["certificate-authority-data"].as_str() {
            Some(data) => {
                let bytes = BASE64
                    .decode(data)
                    .map_err(|source| PkiError::KubeconfigBase64 {
                        path: path.to_owned(),
                        source,
                    })?;
                Some(String::from_utf8(bytes).map_err(|_| {
                    bad("certificate-authority-data is not a PEM certificate".into())
                })?)
            }
            None => None,
        };
    Ok(ClusterInfo { server, ca_pem })
}

/// `host:port` of an `https://host:port[/path]` server URL.
pub fn endpoint_of(server: &str) -> Option<&str> {
    let rest = server.strip_prefix("https://")?;
    let end = rest.find('/').unwrap_or(rest.len());
    let endpoint = &rest[..end];
    crate::validate::split_host_port(endpoint).ok()?;
    Some(endpoint)
}

/// Writes `bytes` to `path` (creating parents) with `mode`, replacing what was there.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("create directory", parent))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io("create", path))?;
    // An existing file keeps its old mode through open(): set it.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io("set permissions of", path))?;
    file.write_all(bytes).map_err(io("write", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_labelled_and_its_hash_is_the_spki_pin() {
        let ca = Ca::generate().unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        assert!(cert.subject().to_string().contains(CA_COMMON_NAME));
        assert!(cert.is_ca());
        let hash = ca.cert_hash().unwrap();
        assert!(crate::validate::is_ca_cert_hash(&hash), "{hash}");
        // The pin is over the SPKI, not the certificate: a second CA has another one.
        assert_ne!(hash, Ca::generate().unwrap().cert_hash().unwrap());
    }

    #[test]
    fn client_certificates_are_signed_by_the_ca() {
        let ca = Ca::generate().unwrap();
        let (cert_pem, _) = ca.client_cert("kubernetes-admin", None).unwrap();
        let (_, ca_der) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).unwrap();
        let ca_cert = ca_der.parse_x509().unwrap();
        let (_, der) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).unwrap();
        let cert = der.parse_x509().unwrap();
        assert_eq!(cert.issuer(), ca_cert.subject());
        cert.verify_signature(Some(ca_cert.public_key()))
            .expect("signed by the stand-in CA");
    }

    #[test]
    fn endpoints_of_server_urls() {
        assert_eq!(endpoint_of("https://10.0.0.1:6443"), Some("10.0.0.1:6443"));
        assert_eq!(
            endpoint_of("https://[fd00::1]:6443/"),
            Some("[fd00::1]:6443")
        );
        assert_eq!(endpoint_of("http://10.0.0.1:6443"), None);
        assert_eq!(endpoint_of("https://10.0.0.1"), None);
        assert_eq!(server_url("fd00::1", 6443), "https://[fd00::1]:6443");
    }
}
