//! Stacked etcd, set up the way `kubeadm init` and `kubeadm join --control-plane` set it up.
//!
//! kubeadm runs an etcd member on every control-plane node as a static pod. The stand-in does
//! the same with Debian's real etcd (`etcd-server`, `/usr/bin/etcd`):
//!
//! - **certificates** from the etcd CA (`pki/etcd/ca.{crt,key}`, one of the files every control
//!   plane shares): `etcd/server` and `etcd/peer` (CN = node name, server + client usage, SANs
//!   `localhost`, the node name, the node IP, the loopback address and `serverCertSANs` /
//!   `peerCertSANs`), `etcd/healthcheck-client` (CN `kube-etcd-healthcheck-client`) and
//!   `apiserver-etcd-client` (CN `kube-apiserver-etcd-client`), both client-only. As kubeadm,
//!   a certificate whose two files exist is kept.
//! - **the static pod manifest** `manifests/etcd.yaml` with kubeadm's command line for etcd
//!   3.4, which the kubelet stand-in runs as a process ([`crate::static_pods`]).
//! - **joining**: a control-plane join asks an existing member (the API server endpoint's host,
//!   client port) over TLS with the apiserver-etcd-client certificate for the member list, adds
//!   this node with MemberAdd unless a member with its peer URL exists already (a retried join;
//!   if that member had run and this node has no etcd data, its disk was formatted again: the
//!   old member is removed and a new one added), writes `--initial-cluster` = every member plus
//!   this one, `--initial-cluster-state existing`, and, as kubeadm, waits for the new member to
//!   serve (the kubelet, already running or restarted until kubeadm has written its
//!   configuration, starts it from the manifest).
//!
//! What differs from kubeadm: the existing member is found from the join's API server endpoint,
//! not from the etcd pods' `kubeadm.kubernetes.io/etcd.advertise-client-urls` annotation (there
//! is no API server); and the member is added as a voting member, not as a learner promoted
//! later (kubeadm's `EtcdLearnerMode`).
//!
//! Ports are kubeadm's, 2379 (client), 2380 (peer) and 2381 (metrics, loopback). Tests run
//! several "nodes" on loopback addresses of one host, which all listen on 127.0.0.1 too: for
//! them [`PORTS_ENV`] gives each node IP its own ports.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use etcd_client::{Certificate, Identity, TlsOptions};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};

use crate::pki::{self, Ca, PkiError};
use crate::{StandinEnv, config};

mod join;

pub use join::{Joined, Membership, join_member, kubeadm_join};

/// kubeadm's etcd client port.
pub const CLIENT_PORT: u16 = 2379;
/// kubeadm's etcd peer port.
pub const PEER_PORT: u16 = 2380;
/// kubeadm's etcd metrics port (on loopback).
pub const METRICS_PORT: u16 = 2381;
/// The image kubeadm's manifest names. The kubelet stand-in pulls no image: it runs the
/// command from the node's own file system (Debian's etcd 3.4).
pub const ETCD_IMAGE: &str = "registry.k8s.io/etcd:3.5.21-0";
/// For tests only: `IP=client:peer:metrics[,IP=client:peer:metrics…]`, the etcd ports of the
/// nodes at those IPs (default 2379:2380:2381). Loopback "nodes" share 127.0.0.1, so each
/// needs its own ports.
pub const PORTS_ENV: &str = "HAWSER_STANDIN_ETCD_PORTS";

/// Why the stacked etcd could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The node's advertise address is empty or not an IP address.
    #[error(
        "{field} is {value:?}: the stand-in needs the node's IP address there for etcd (it does not detect one)"
    )]
    Address { field: &'static str, value: String },
    /// [`PORTS_ENV`] is set but malformed.
    #[error("{PORTS_ENV}={value:?} is not IP=client:peer:metrics[,…]: {reason}")]
    PortsEnv { value: String, reason: String },
    /// The etcd CA is not under the PKI directory (a control-plane join needs it in place).
    #[error("the etcd CA {path} is not in place")]
    NoEtcdCa { path: PathBuf },
    /// The etcd CA or a certificate could not be loaded, made or written.
    #[error("the etcd certificates could not be made")]
    Pki(#[source] PkiError),
    /// The join's API server endpoint is not host:port.
    #[error("the API server endpoint {endpoint:?} is not host:port")]
    Endpoint { endpoint: String },
    /// The runtime for the etcd client could not be made.
    #[error("cannot start the etcd client's runtime")]
    Runtime(#[source] std::io::Error),
    /// The existing member did not answer over TLS.
    #[error("cannot reach the existing etcd member at {endpoint}")]
    Connect {
        endpoint: String,
        #[source]
        source: etcd_client::Error,
    },
    /// The existing member could not be reached (the client connects lazily, on this first
    /// call) or did not list the cluster's members.
    #[error("cannot list the cluster's members at the etcd member at {endpoint}")]
    MemberList {
        endpoint: String,
        #[source]
        source: etcd_client::Error,
    },
    /// MemberAdd failed.
    #[error("the etcd member at {endpoint} did not add {peer_url} as a member")]
    MemberAdd {
        endpoint: String,
        peer_url: String,
        #[source]
        source: etcd_client::Error,
    },
    /// The member this node had before its etcd data was lost could not be removed (etcd
    /// needs a quorum of the other members for that).
    #[error("the etcd member at {endpoint} did not remove this node's old member {id:x}")]
    MemberRemove {
        endpoint: String,
        id: u64,
        #[source]
        source: etcd_client::Error,
    },
    /// The new member did not serve a quorum read in time (is the kubelet running it?).
    #[error(
        "this node's etcd member at {endpoint} did not serve within {seconds} s of its manifest being written: is the kubelet running it?"
    )]
    NotServing {
        endpoint: String,
        seconds: u64,
        #[source]
        source: etcd_client::Error,
    },
    /// A member in the list has no peer URL to put in `--initial-cluster`.
    #[error("etcd member {id:x} has no peer URL")]
    MemberWithoutPeer { id: u64 },
    /// The manifest could not be written.
    #[error("cannot write the etcd static pod manifest {path}")]
    Manifest {
        path: PathBuf,
        #[source]
        source: PkiError,
    },
}

/// The ports of one node's etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub client: u16,
    pub peer: u16,
    pub metrics: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Self {
            client: CLIENT_PORT,
            peer: PEER_PORT,
            metrics: METRICS_PORT,
        }
    }
}

/// Parses [`PORTS_ENV`]'s value.
pub fn parse_ports(value: &str) -> Result<BTreeMap<IpAddr, Ports>, EtcdError> {
    let bad = |reason: String| EtcdError::PortsEnv {
        value: value.to_owned(),
        reason,
    };
    let mut map = BTreeMap::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (ip, ports) = entry
            .split_once('=')
            .ok_or_else(|| bad(format!("{entry:?} has no '='")))?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| bad(format!("{ip:?} is not an IP address")))?;
        let numbers = ports
            .split(':')
            .map(|p| p.parse::<u16>().ok().filter(|p| *p != 0))
            .collect::<Option<Vec<u16>>>()
            .ok_or_else(|| bad(format!("{ports:?} are not three ports 1-65535")))?;
        let [client, peer, metrics] = numbers[..] else {
            return Err(bad(format!("{ports:?} are not three ports")));
        };
        map.insert(
            ip,
            Ports {
                client,
                peer,
                metrics,
            },
        );
    }
    Ok(map)
}

/// The ports of the node at `ip`: kubeadm's, unless [`PORTS_ENV`] names others.
pub fn ports_for(ip: IpAddr) -> Result<Ports, EtcdError> {
    match std::env::var(PORTS_ENV) {
        Ok(value) => Ok(parse_ports(&value)?.get(&ip).copied().unwrap_or_default()),
        Err(_) => Ok(Ports::default()),
    }
}

/// `scheme://ip:port`, IPv6 in brackets.
fn url(scheme: &str, ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
    }
}

/// The loopback address of `ip`'s family (kubeadm's etcd listens there too).
fn loopback_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::from([127, 0, 0, 1]),
        IpAddr::V6(_) => IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
    }
}

/// One etcd member of this node: its name, address and ports, and where its files go.
#[derive(Debug, Clone)]
pub struct LocalMember {
    /// The node name (etcd's `--name`, the server and peer certificates' CN).
    pub name: String,
    pub ip: IpAddr,
    pub ports: Ports,
    /// `<root>/etc/kubernetes/pki`.
    pub pki_dir: PathBuf,
    /// `<root>/var/lib/etcd` unless `etcd.local.dataDir` says otherwise.
    pub data_dir: PathBuf,
    /// `etcd.local.extraArgs` (init only: a join has no ClusterConfiguration here).
    pub extra_args: Vec<config::Arg>,
    pub server_cert_sans: Vec<String>,
    pub peer_cert_sans: Vec<String>,
}

impl LocalMember {
    /// The member for node `name` at `address` (a `localAPIEndpoint.advertiseAddress`, named
    /// `field` in errors), with `local`'s settings when the cluster configuration has them.
    pub fn new(
        env: &StandinEnv,
        name: &str,
        field: &'static str,
        address: &str,
        local: Option<&config::LocalEtcd>,
    ) -> Result<Self, EtcdError> {
        let ip: IpAddr = address.parse().map_err(|_| EtcdError::Address {
            field,
            value: address.to_owned(),
        })?;
        let data_dir = match local.map(|l| l.data_dir.as_str()) {
            Some(dir) if !dir.is_empty() => env.root.join(dir.trim_start_matches('/')),
            _ => env.root.join("var/lib/etcd"),
        };
        Ok(Self {
            name: name.to_owned(),
            ip,
            ports: ports_for(ip)?,
            pki_dir: env.root.join("etc/kubernetes/pki"),
            data_dir,
            extra_args: local.map(|l| l.extra_args.clone()).unwrap_or_default(),
            server_cert_sans: local
                .map(|l| l.server_cert_sans.clone())
                .unwrap_or_default(),
            peer_cert_sans: local.map(|l| l.peer_cert_sans.clone()).unwrap_or_default(),
        })
    }

    /// This member's peer URL (`--initial-advertise-peer-urls`).
    pub fn peer_url(&self) -> String {
        url("https", self.ip, self.ports.peer)
    }

    /// This member's client URL (`--advertise-client-urls`).
    pub fn client_url(&self) -> String {
        url("https", self.ip, self.ports.client)
    }

    fn pki(&self, rel: &str) -> PathBuf {
        self.pki_dir.join(rel)
    }

    /// etcd's command line, as in kubeadm's manifest (for etcd 3.4), `extraArgs` applied.
    pub fn command(&self, initial_cluster: &str, state: &str) -> Vec<String> {
        let loopback_client = url("https", loopback_of(self.ip), self.ports.client);
        let listen_client = if loopback_client == self.client_url() {
            loopback_client
        } else {
            format!("{loopback_client},{}", self.client_url())
        };
        let path = |rel: &str| self.pki(rel).display().to_string();
        let mut flags: BTreeMap<String, String> = [
            ("advertise-client-urls", self.client_url()),
            ("cert-file", path("etcd/server.crt")),
            ("client-cert-auth", "true".into()),
            ("data-dir", self.data_dir.display().to_string()),
            ("experimental-initial-corrupt-check", "true".into()),
            ("experimental-watch-progress-notify-interval", "5s".into()),
            ("initial-advertise-peer-urls", self.peer_url()),
            ("initial-cluster", initial_cluster.to_owned()),
            ("initial-cluster-state", state.to_owned()),
            ("key-file", path("etcd/server.key")),
            ("listen-client-urls", listen_client),
            (
                "listen-metrics-urls",
                url("http", loopback_of(self.ip), self.ports.metrics),
            ),
            ("listen-peer-urls", self.peer_url()),
            ("name", self.name.clone()),
            ("peer-cert-file", path("etcd/peer.crt")),
            ("peer-client-cert-auth", "true".into()),
            ("peer-key-file", path("etcd/peer.key")),
            ("peer-trusted-ca-file", path("etcd/ca.crt")),
            ("snapshot-count", "10000".into()),
            ("trusted-ca-file", path("etcd/ca.crt")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for arg in &self.extra_args {
            flags.insert(arg.name.clone(), arg.value.clone());
        }
        std::iter::once("etcd".to_owned())
            .chain(flags.into_iter().map(|(k, v)| format!("--{k}={v}")))
            .collect()
    }

    /// The static pod manifest kubeadm writes for this member.
    pub fn manifest(&self, initial_cluster: &str, state: &str) -> Value {
        let etcd_pki = self.pki("etcd").display().to_string();
        let data_dir = self.data_dir.display().to_string();
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "annotations": {
                    "kubeadm.kubernetes.io/etcd.advertise-client-urls": self.client_url(),
                    "hawser.dev/stand-in": "written by the kubeadm STAND-IN (not Kubernetes); the kubelet STAND-IN runs the command as a process from the node's file system, no image",
                },
                "labels": {"component": "etcd", "tier": "control-plane"},
                "name": "etcd",
                "namespace": "kube-system",
            },
            "spec": {
                "containers": [{
                    "command": self.command(initial_cluster, state),
                    "image": ETCD_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "name": "etcd",
                    "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}},
                    "volumeMounts": [
                        {"mountPath": data_dir, "name": "etcd-data"},
                        {"mountPath": etcd_pki, "name": "etcd-certs"},
                    ],
                }],
                "hostNetwork": true,
                "priority": 2_000_001_000,
                "priorityClassName": "system-node-critical",
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "volumes": [
                    {"hostPath": {"path": etcd_pki, "type": "DirectoryOrCreate"}, "name": "etcd-certs"},
                    {"hostPath": {"path": data_dir, "type": "DirectoryOrCreate"}, "name": "etcd-data"},
                ],
            },
        })
    }

    /// Writes `<root>/etc/kubernetes/manifests/etcd.yaml` (mode 0600, as kubeadm).
    fn write_manifest(
        &self,
        env: &StandinEnv,
        initial_cluster: &str,
        state: &str,
    ) -> Result<PathBuf, EtcdError> {
        let path = manifest_path(env);
        // Serializing a serde_json::Value to YAML cannot fail: it has only string keys.
        let yaml =
            serde_norway::to_string(&self.manifest(initial_cluster, state)).unwrap_or_default();
        pki::write_file(
            &path,
            format!(
                "# Written by the kubeadm STAND-IN (hawser-standin), not by Kubernetes.\n{yaml}"
            )
            .as_bytes(),
            0o600,
        )
        .map_err(|source| EtcdError::Manifest {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// The SANs of the server or peer certificate: kubeadm's defaults plus `extra`.
    fn alt_names(&self, extra: &[String]) -> Vec<SanType> {
        let mut names = vec![
            dns_san("localhost"),
            dns_san(&self.name),
            SanType::IpAddress(self.ip),
            SanType::IpAddress(IpAddr::from([127, 0, 0, 1])),
            SanType::IpAddress(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])),
        ];
        for san in extra {
            match san.parse::<IpAddr>() {
                Ok(ip) => names.push(SanType::IpAddress(ip)),
                Err(_) => names.push(dns_san(san)),
            }
        }
        names.dedup();
        names
    }

    /// Makes the certificates kubeadm makes from the etcd CA that are missing; returns the
    /// files written.
    fn create_certificates(&self) -> Result<Vec<PathBuf>, EtcdError> {
        let ca_cert = self.pki("etcd/ca.crt");
        if !ca_cert.is_file() || !self.pki("etcd/ca.key").is_file() {
            return Err(EtcdError::NoEtcdCa { path: ca_cert });
        }
        let (ca, _) = Ca::load_or_create(&self.pki("etcd")).map_err(EtcdError::Pki)?;
        let both = [
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let client = [ExtendedKeyUsagePurpose::ClientAuth];
        let server_sans = self.alt_names(&self.server_cert_sans);
        let peer_sans = self.alt_names(&self.peer_cert_sans);
        let leaves: [(&str, &str, &[ExtendedKeyUsagePurpose], Vec<SanType>); 4] = [
            ("etcd/server", self.name.as_str(), &both, server_sans),
            ("etcd/peer", self.name.as_str(), &both, peer_sans),
            (
                "etcd/healthcheck-client",
                "kube-etcd-healthcheck-client",
                &client,
                Vec::new(),
            ),
            (
                "apiserver-etcd-client",
                "kube-apiserver-etcd-client",
                &client,
                Vec::new(),
            ),
        ];
        let mut written = Vec::new();
        for (stem, common_name, usages, sans) in leaves {
            let cert = self.pki(&format!("{stem}.crt"));
            let key = self.pki(&format!("{stem}.key"));
            if cert.is_file() && key.is_file() {
                continue;
            }
            let mut params = CertificateParams::default();
            let mut dn = DistinguishedName::new();
            dn.push(DnType::CommonName, common_name);
            params.distinguished_name = dn;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = usages.to_vec();
            params.subject_alt_names = sans;
            pki::validity(&mut params, 365);
            let (cert_pem, key_pem) = ca
                .sign(&params, "an etcd certificate")
                .map_err(EtcdError::Pki)?;
            pki::write_file(&cert, cert_pem.as_bytes(), 0o644).map_err(EtcdError::Pki)?;
            pki::write_file(&key, key_pem.as_bytes(), 0o600).map_err(EtcdError::Pki)?;
            written.extend([cert, key]);
        }
        Ok(written)
    }

    /// TLS for the etcd client: the etcd CA and the apiserver-etcd-client certificate.
    fn client_tls(&self) -> Result<TlsOptions, EtcdError> {
        let read = |rel: &str| {
            let path = self.pki(rel);
            std::fs::read(&path).map_err(|source| {
                EtcdError::Pki(PkiError::Io {
                    action: "read",
                    path,
                    source,
                })
            })
        };
        Ok(TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read("etcd/ca.crt")?))
            .identity(Identity::from_pem(
                read("apiserver-etcd-client.crt")?,
                read("apiserver-etcd-client.key")?,
            )))
    }
}

/// `<root>/etc/kubernetes/manifests`, the kubelet's `staticPodPath` as kubeadm sets it.
pub fn manifests_dir(env: &StandinEnv) -> PathBuf {
    env.root.join("etc/kubernetes/manifests")
}

/// `<root>/etc/kubernetes/manifests/etcd.yaml`.
pub fn manifest_path(env: &StandinEnv) -> PathBuf {
    manifests_dir(env).join("etcd.yaml")
}

fn dns_san(name: &str) -> SanType {
    match name.try_into() {
        Ok(ia5) => SanType::DnsName(ia5),
        // Node names are DNS-1123 subdomains (checked before), so this is not reached; an
        // IP-literal fallback keeps the function total.
        Err(_) => SanType::IpAddress(IpAddr::from([127, 0, 0, 1])),
    }
}

/// `kubeadm init`'s etcd: certificates and a manifest for a new one-member cluster. Returns
/// the files written.
pub fn init_member(env: &StandinEnv, member: &LocalMember) -> Result<Vec<PathBuf>, EtcdError> {
    let mut written = member.create_certificates()?;
    let initial_cluster = format!("{}={}", member.name, member.peer_url());
    written.push(member.write_manifest(env, &initial_cluster, "new")?);
    Ok(written)
}

/// `kubeadm init`'s stacked etcd for `node` at `address`, as the cluster configuration says
/// (nothing for an external etcd). Returns what to say and the files written.
pub fn kubeadm_init(
    env: &StandinEnv,
    node: &str,
    address: &str,
    cluster: &config::ClusterConfiguration,
) -> Result<(String, Vec<PathBuf>), EtcdError> {
    if cluster.etcd.external.is_some() {
        return Ok((
            "etcd.external is set: no local etcd member is made".to_owned(),
            Vec::new(),
        ));
    }
    let member = LocalMember::new(
        env,
        node,
        "localAPIEndpoint.advertiseAddress",
        address,
        cluster.etcd.local.as_ref(),
    )?;
    let written = init_member(env, &member)?;
    Ok((
        format!(
            "stacked etcd: member {} at {} (a new cluster), run by the kubelet from {}",
            member.name,
            member.client_url(),
            manifest_path(env).display()
        ),
        written,
    ))
}

#[cfg(test)]
mod tests;
