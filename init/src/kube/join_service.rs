//! The cluster's join service on every control-plane node.
//!
//! Every control plane runs `hawser-joind` under PID 1's supervisor, so that nodes can join
//! and rejoin while any one control plane is down (they are given every control plane's join
//! endpoint and ask them in turn). What it needs:
//!
//! - the cluster's **master secret** and measurement salt: the first control plane gets them
//!   from the admin's `hawser init`; every later control plane from an attested, approved
//!   control-plane join (the join service sends them only to AKs the admin approved, and the
//!   node checks they derive the disk key and measurement secret it was sent). They rest on the
//!   node's encrypted state disk ([`CLUSTER_DIR`], 0600), kept there before the disk is marked
//!   initialized ([`secret_files`], `crate::kube::grants`), so the service restarts on every
//!   boot (a rejoin, or `hawser recover`) without anyone sending them again;
//! - the Kubernetes version joining nodes install (kept with the secrets);
//! - what a fresh node of this image measures, read at `enter-initrd`, and the provider CA the
//!   image carries ([`JoinServiceInputs`], read before the pivot frees the initramfs).
//!
//! A worker keeps no master secret and runs no join service.

use std::path::{Path, PathBuf};

use hawser_kube_types::KubernetesVersion;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::enrollment::race::ClusterSecrets;
use crate::kube::kubeadm::{ADMIN_KUBECONFIG, KUBEADM, PKI_DIR};
use crate::platform::error_chain;
use crate::supervisor::{self, SharedSupervisor};

/// Where PID 1 puts `hawser-joind`'s inputs for this boot (tmpfs).
pub const JOIND_DIR: &str = "/run/hawser/joind";
/// The port of the in-cluster join service.
pub const JOIND_PORT: u16 = 7000;
/// The port of its admin API (`hawser release`, `hawser node revoke`: docs/lifecycle.md).
pub const JOIND_ADMIN_PORT: u16 = 7001;
/// The in-cluster join service's state directory (registry of joined disks), on the state disk.
pub const JOIND_STATE_DIR: &str = "/var/lib/hawser-joind";
/// The AK names `hawser init --approve-control-plane` approved; the admin adds later ones to
/// the same file (until the cluster keeps them in its own store).
pub const JOIND_APPROVALS: &str = "/var/lib/hawser-joind/control-plane-approvals";
/// Where a control plane keeps the cluster's master secret, measurement salt and Kubernetes
/// version: on the encrypted state disk, directory 0700, files 0600.
pub const CLUSTER_DIR: &str = "/var/lib/hawser/cluster";

const MASTER_SECRET_FILE: &str = "master-secret.json";
const SALT_FILE: &str = "measurement-salt";
const VERSION_FILE: &str = "kubernetes-version";

/// What the image says about the join service it runs: read before the pivot.
#[derive(Debug, Clone)]
pub struct JoinServiceInputs {
    /// `hawser-joind`'s expected measurements (JSON): a fresh node of this same image.
    pub joiner_measurements: serde_json::Value,
    /// The provider CA the image carries (`hawser image build --provider-ca`).
    pub provider_ca_pem: String,
    /// The mDNS instance name the join service advertises itself under on the LAN
    /// (`hawser.join_discovery=mdns`), or `None` for no advert.
    pub advertise_as: Option<String>,
    /// This node's state disk (its LUKS2 UUID), which the service binds to this node's AK in
    /// the cluster store: the first control plane, made by `hawser init` rather than a join,
    /// then rejoins through any other control plane's join service.
    pub own_disk: String,
    /// The node's place in the WireGuard mesh and where its tunnel listens on the underlay:
    /// the join service shares the node's tunnel (`hawser-joind --vpn-node-tunnel`), serving
    /// the peer API on the node's VPN address and handing out addresses of its prefix.
    pub mesh: Option<(crate::mesh::Mesh, std::net::SocketAddr)>,
}

/// A control plane's join service: the cluster's secrets, and what it hands out.
pub struct InClusterJoinService<'a> {
    pub secrets: &'a ClusterSecrets,
    pub kubernetes_version: &'a KubernetesVersion,
    pub inputs: &'a JoinServiceInputs,
}

/// Why the cluster's secrets on the state disk cannot be kept or read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterSecretsError {
    /// The master secret cannot be encoded as the JSON its file holds.
    #[error("cannot encode the cluster's master secret")]
    Encode(#[source] serde_json::Error),
    /// The master secret cannot be written or read (its own message names the file).
    #[error("the cluster's master secret on the state disk")]
    MasterSecret(#[source] hawser_keys::KeyError),
    /// A file under [`CLUSTER_DIR`] exists but cannot be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kept Kubernetes version is not one.
    #[error("{path} does not hold a Kubernetes version")]
    Version {
        path: PathBuf,
        #[source]
        source: hawser_kube_types::KubernetesVersionError,
    },
}

/// A file of the cluster's secrets as a control plane keeps it: where (after the pivot), what,
/// and its mode.
pub struct SecretFile {
    pub path: PathBuf,
    pub bytes: Zeroizing<Vec<u8>>,
    pub mode: u32,
}

/// The files a control plane keeps on its state disk for the cluster's join service: the
/// master secret, the measurement salt and the Kubernetes version under [`CLUSTER_DIR`] (0600),
/// and with the admin's approvals from `hawser init` (the first control plane),
/// [`JOIND_APPROVALS`]. The first boot keeps them before it marks the disk initialized
/// (`crate::kube::grants`), so every later boot finds them ([`load`]).
pub fn secret_files(
    secrets: &ClusterSecrets,
    kubernetes_version: &KubernetesVersion,
    control_plane_approvals: Option<&[String]>,
) -> Result<Vec<SecretFile>, ClusterSecretsError> {
    let master = serde_json::to_vec_pretty(&secrets.master).map_err(ClusterSecretsError::Encode)?;
    let dir = Path::new(CLUSTER_DIR);
    let private = |name: &str, bytes: Vec<u8>| SecretFile {
        path: dir.join(name),
        bytes: Zeroizing::new(bytes),
        mode: 0o600,
    };
    let mut files = vec![
        private(MASTER_SECRET_FILE, master),
        private(SALT_FILE, secrets.measurement_salt.clone()),
        private(VERSION_FILE, format!("{kubernetes_version}\n").into_bytes()),
    ];
    if let Some(names) = control_plane_approvals {
        files.push(SecretFile {
            path: PathBuf::from(JOIND_APPROVALS),
            bytes: Zeroizing::new(approvals_file(names).into_bytes()),
            mode: 0o644,
        });
    }
    Ok(files)
}

/// Whether `dir` holds a kept master secret: a control plane's state disk does, a worker's
/// never. Only a sign of the node's role (the secret is not read, let alone checked against
/// PCR 15, as the measured role of `boot::pivot_role` is), for what is harmless either way.
pub fn keeps_secrets(dir: &Path) -> bool {
    dir.join(MASTER_SECRET_FILE).exists()
}

/// The cluster's secrets and Kubernetes version kept under `dir`, or `None` when this node
/// keeps none (a worker, or a control plane from before hawser kept them).
pub fn load(
    dir: &Path,
) -> Result<Option<(ClusterSecrets, KubernetesVersion)>, ClusterSecretsError> {
    let master_path = dir.join(MASTER_SECRET_FILE);
    if !master_path.exists() {
        return Ok(None);
    }
    let master = hawser_keys::MasterSecret::read_file(&master_path)
        .map_err(ClusterSecretsError::MasterSecret)?;
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| ClusterSecretsError::Read { path, source })
    };
    let measurement_salt = read(SALT_FILE)?;
    let version_path = dir.join(VERSION_FILE);
    let version_text = read(VERSION_FILE)?;
    let kubernetes_version = String::from_utf8_lossy(&version_text)
        .trim()
        .parse::<KubernetesVersion>()
        .map_err(|source| ClusterSecretsError::Version {
            path: version_path,
            source,
        })?;
    Ok(Some((
        ClusterSecrets {
            master,
            measurement_salt,
        },
        kubernetes_version,
    )))
}

/// The approvals file's text: a header and one AK name a line.
fn approvals_file(ak_names: &[String]) -> String {
    let mut text = String::from(
        "# AK TPM names that may join this cluster as control planes (hawser init \
         --approve-control-plane);\n# one a line, reloaded by hawser-joind when it changes\n",
    );
    for name in ak_names {
        text.push_str(name);
        text.push('\n');
    }
    text
}

impl InClusterJoinService<'_> {
    /// Writes the inputs under [`JOIND_DIR`] and returns the service to supervise.
    fn prepare(&self) -> std::io::Result<supervisor::ServiceSpec> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir = Path::new(JOIND_DIR);
        let _ = std::fs::remove_dir_all(dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let secret = dir.join("master-secret.json");
        self.secrets
            .master
            .write_new_file(&secret)
            .map_err(std::io::Error::other)?;
        let salt = dir.join("measurement-salt");
        std::fs::write(&salt, &self.secrets.measurement_salt)?;
        let measurements = dir.join("measurements.json");
        std::fs::write(&measurements, self.inputs.joiner_measurements.to_string())?;
        let provider_ca = dir.join("provider-ca.pem");
        std::fs::write(&provider_ca, &self.inputs.provider_ca_pem)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(JOIND_STATE_DIR)?;
        // The admin's list from `hawser init` is kept with the secrets ([`secret_files`]);
        // later control planes start with none, and a missing file approves nobody.
        if !Path::new(JOIND_APPROVALS).exists() {
            std::fs::write(JOIND_APPROVALS, approvals_file(&[]))?;
        }
        let listen = format!("0.0.0.0:{JOIND_PORT}");
        let path = |p: &Path| p.display().to_string();
        let args = [
            "--listen".to_owned(),
            listen,
            "--admin-listen".to_owned(),
            format!("0.0.0.0:{JOIND_ADMIN_PORT}"),
            "--measurements".to_owned(),
            path(&measurements),
            "--master-secret".to_owned(),
            path(&secret),
            "--measurement-salt-file".to_owned(),
            path(&salt),
            "--provider-ca".to_owned(),
            path(&provider_ca),
            "--kubeadm".to_owned(),
            KUBEADM.to_owned(),
            "--kubeconfig".to_owned(),
            ADMIN_KUBECONFIG.to_owned(),
            "--state-dir".to_owned(),
            JOIND_STATE_DIR.to_owned(),
            "--control-plane-approvals".to_owned(),
            JOIND_APPROVALS.to_owned(),
            "--pki-dir".to_owned(),
            PKI_DIR.to_owned(),
            "--kubernetes-version".to_owned(),
            self.kubernetes_version.to_string(),
            "--attest-with-tpm".to_owned(),
            "device:/dev/tpmrm0".to_owned(),
        ];
        let mut args = args.to_vec();
        args.extend(["--own-disk".to_owned(), self.inputs.own_disk.clone()]);
        if let Some(instance) = &self.inputs.advertise_as {
            args.extend(["--mdns-instance".to_owned(), instance.clone()]);
        }
        if let Some((mesh, endpoint)) = &self.inputs.mesh {
            args.extend(mesh_args(mesh, *endpoint));
        }
        args.extend(stacked_etcd_args(
            Path::new(PKI_DIR),
            Path::new(ETCD_MANIFEST),
        ));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(supervisor::ServiceSpec::new(
            "hawser-joind",
            "/usr/bin/hawser-joind",
            &args,
        ))
    }

    /// Starts `hawser-joind` under the supervisor: nodes join through it (and, with
    /// `hawser.join_service_trust=attested`, verify that it runs this same image).
    pub async fn start(&self, services: &SharedSupervisor) {
        match self.prepare() {
            Ok(service) => {
                if services.start(service).await {
                    info!(
                        "started the cluster's join service on port {JOIND_PORT} (attested with \
                         this node's TPM); control-plane approvals in {JOIND_APPROVALS}"
                    );
                }
            }
            // The master secret's write error wraps its own cause: print the whole chain.
            Err(e) => warn!(
                "the cluster's join service is not started: cannot write its inputs under \
                 {JOIND_DIR}: {}",
                error_chain(&e)
            ),
        }
    }
}

/// `hawser-joind`'s mesh flags on a node whose PID 1 runs the tunnel: the service is the
/// node's member of the mesh (`--own-disk`'s entry in the registry, as a coordinator), serves
/// the peer API on the node's VPN address, and starts no tunnel of its own.
fn mesh_args(mesh: &crate::mesh::Mesh, endpoint: std::net::SocketAddr) -> Vec<String> {
    vec![
        "--vpn-prefix".to_owned(),
        mesh.prefix.to_string(),
        "--vpn-node-tunnel".to_owned(),
        "--vpn-address".to_owned(),
        mesh.node_ip.to_string(),
        "--vpn-public-key".to_owned(),
        mesh.public_key.to_string(),
        "--vpn-endpoint".to_owned(),
        endpoint.to_string(),
        "--vpn-name".to_owned(),
        mesh.name.clone(),
        "--vpn-mtu".to_owned(),
        mesh.mtu.to_string(),
        "--vpn-api-port".to_owned(),
        mesh.api_port.to_string(),
    ]
}

/// The static pod manifest of the control plane's etcd, as kubeadm writes it (stacked etcd).
pub const ETCD_MANIFEST: &str = "/etc/kubernetes/manifests/etcd.yaml";
/// The client URL of the control plane's own etcd member (stacked etcd listens on loopback).
pub const ETCD_LOCAL_ENDPOINT: &str = "https://127.0.0.1:2379";

/// `hawser-joind`'s etcd flags on a control plane that runs kubeadm's stacked etcd: its own
/// member over TLS with the API server's etcd client certificate (the cluster state lives
/// there, shared by every control plane's join service). Nothing when the node runs no etcd
/// (the service then keeps its state in files under [`JOIND_STATE_DIR`]).
fn stacked_etcd_args(pki_dir: &Path, manifest: &Path) -> Vec<String> {
    let ca = pki_dir.join("etcd/ca.crt");
    let cert = pki_dir.join("apiserver-etcd-client.crt");
    let key = pki_dir.join("apiserver-etcd-client.key");
    if !manifest.exists() || ![&ca, &cert, &key].iter().all(|p| p.exists()) {
        return Vec::new();
    }
    let path = |p: &Path| p.display().to_string();
    vec![
        "--etcd-endpoints".to_owned(),
        ETCD_LOCAL_ENDPOINT.to_owned(),
        "--etcd-ca".to_owned(),
        path(&ca),
        "--etcd-cert".to_owned(),
        path(&cert),
        "--etcd-key".to_owned(),
        path(&key),
    ]
}

/// Once kubeadm succeeded (on this boot or an earlier one): a control plane starts the
/// cluster's join service from the secrets kept on its state disk; a worker has none.
pub async fn start_on_control_plane(
    inputs: Option<&JoinServiceInputs>,
    services: &SharedSupervisor,
) {
    let (secrets, version) = match load(Path::new(CLUSTER_DIR)) {
        Ok(Some(kept)) => kept,
        Ok(None) => return,
        Err(e) => {
            warn!(
                "{}; the cluster's join service is not started on this control plane",
                error_chain(&e)
            );
            return;
        }
    };
    let Some(inputs) = inputs else {
        warn!("{NO_PROVIDER_CA}");
        return;
    };
    InClusterJoinService {
        secrets: &secrets,
        kubernetes_version: &version,
        inputs,
    }
    .start(services)
    .await;
}

const NO_PROVIDER_CA: &str = "the cluster's join service is not started: this image carries no \
     provider CA to verify joining nodes with (hawser image build --provider-ca); nodes can join \
     only through a join service elsewhere";

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn secrets() -> ClusterSecrets {
        ClusterSecrets {
            master: hawser_keys::MasterSecret::new(vec![7; 32], vec![8; 32]).unwrap(),
            measurement_salt: b"salt".to_vec(),
        }
    }

    /// Writes the kept files of the cluster's secrets as a first boot does, [`CLUSTER_DIR`]'s
    /// under `cluster`; returns the approvals' text.
    fn persist(
        cluster: &Path,
        secrets: &ClusterSecrets,
        version: &KubernetesVersion,
        approvals: Option<&[String]>,
    ) -> Option<String> {
        let mut approvals_text = None;
        for file in secret_files(secrets, version, approvals).unwrap() {
            match file.path.strip_prefix(CLUSTER_DIR) {
                Ok(name) => crate::platform::fs::write_atomically(
                    &cluster.join(name),
                    &file.bytes,
                    file.mode,
                )
                .unwrap(),
                Err(_) => {
                    assert_eq!(file.path, Path::new(JOIND_APPROVALS));
                    assert_eq!(file.mode, 0o644);
                    approvals_text = Some(String::from_utf8(file.bytes.to_vec()).unwrap());
                }
            }
        }
        approvals_text
    }

    #[test]
    fn kept_secrets_come_back_and_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = dir.path().join("cluster");
        assert!(load(&cluster).unwrap().is_none(), "a worker keeps nothing");
        let version: KubernetesVersion = "v1.33.4".parse().unwrap();
        assert_eq!(persist(&cluster, &secrets(), &version, None), None);
        // Again, over the first set, with the admin's approvals (`hawser init`).
        let approvals = persist(&cluster, &secrets(), &version, Some(&["000b11".into()]));
        assert!(approvals.unwrap().ends_with("\n000b11\n"));

        let (kept, kept_version) = load(&cluster).unwrap().unwrap();
        assert_eq!(kept.master.key_bytes(), &[7; 32]);
        assert_eq!(kept.master.salt_bytes(), &[8; 32]);
        assert_eq!(kept.measurement_salt, b"salt");
        assert_eq!(kept_version, version);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for name in [MASTER_SECRET_FILE, SALT_FILE, VERSION_FILE] {
            assert_eq!(mode(&cluster.join(name)), 0o600, "{name}");
        }
        let names: Vec<String> = std::fs::read_dir(&cluster)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "no staged files left: {names:?}");
    }

    #[test]
    fn the_join_service_uses_stacked_etcd_only_where_kubeadm_runs_it() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let manifest = dir.path().join("manifests/etcd.yaml");
        assert!(stacked_etcd_args(&pki, &manifest).is_empty(), "a worker");
        std::fs::create_dir_all(pki.join("etcd")).unwrap();
        for name in [
            "etcd/ca.crt",
            "apiserver-etcd-client.crt",
            "apiserver-etcd-client.key",
        ] {
            std::fs::write(pki.join(name), "pem").unwrap();
        }
        assert!(
            stacked_etcd_args(&pki, &manifest).is_empty(),
            "certificates but no etcd member on this node"
        );
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        std::fs::write(&manifest, "kind: Pod").unwrap();
        let args = stacked_etcd_args(&pki, &manifest);
        assert_eq!(
            args,
            [
                "--etcd-endpoints".to_owned(),
                ETCD_LOCAL_ENDPOINT.to_owned(),
                "--etcd-ca".to_owned(),
                pki.join("etcd/ca.crt").display().to_string(),
                "--etcd-cert".to_owned(),
                pki.join("apiserver-etcd-client.crt").display().to_string(),
                "--etcd-key".to_owned(),
                pki.join("apiserver-etcd-client.key").display().to_string(),
            ]
        );
    }

    #[test]
    fn a_damaged_kept_set_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = dir.path().join("cluster");
        persist(&cluster, &secrets(), &"v1.33.4".parse().unwrap(), None);
        std::fs::write(cluster.join(VERSION_FILE), "latest\n").unwrap();
        let err = load(&cluster).unwrap_err();
        assert!(
            err.to_string()
                .contains("kubernetes-version does not hold a Kubernetes version"),
            "{err}"
        );
        std::fs::remove_file(cluster.join(SALT_FILE)).unwrap();
        let err = load(&cluster).unwrap_err();
        assert!(err.to_string().contains("measurement-salt"), "{err}");
        std::fs::write(cluster.join(MASTER_SECRET_FILE), "{").unwrap();
        let err = error_chain(&load(&cluster).unwrap_err());
        assert!(err.contains("master-secret.json"), "{err}");
        assert!(!err.contains("BwcH"), "no key material in the error: {err}");
    }
}
