//! The host side of a local hawser cluster: what a cloud and an admin provide, on loopback.
//!
//! - a *provider CA* that certifies each VM's attestation key before boot (as GCP's and Azure's
//!   vTPMs come with AK certificates), written to `provider-ca.pem`;
//! - the cluster's *master secret* (a 0600 file) and *measurement salt*;
//! - *expected measurements* predicted from the UKI that is booted;
//! - `hawser-joind`, in this process, on 127.0.0.1;
//! - the guest's network: QEMU user networking with `restrict=on` (the guest reaches nothing but
//!   what is forwarded), `10.0.2.100:7000` in the guest forwarded to the join service, and the
//!   node's init port forwarded to a host port for `hawser init`.
//!
//! `hawser local up` and the end-to-end tests share this module, so the tests exercise exactly
//! what users run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hawser_harness::ProviderCa;
use hawser_image::profile;
use hawser_joinservice::core::{JoinCore, JoinCoreConfig};
use hawser_joinservice::member;
use hawser_joinservice::policy::PolicyStore;
use hawser_joinservice::service::{self, RunningService, ServiceConfig};
use hawser_joinservice::tokens::{BootstrapTokenIssuer, JoinCredentials, TokenError};
use hawser_joinservice::vpn::JoinServiceAddress;
use hawser_keys::{MasterSecret, StateDiskKeyLength};
use hawser_kube_types::CaCertHash;
use hawser_measurements::predict::{Phase, Prediction};

/// The join service's address as the guest sees it (QEMU `guestfwd`).
pub const GUEST_JOIN_ENDPOINT: &str = "10.0.2.100:7000";
/// The guest's static address and gateway on QEMU's user network.
pub const GUEST_NET: &str = "10.0.2.15/24,10.0.2.2";
/// The state disk's virtio serial in local nodes.
pub const STATE_DISK_SERIAL: &str = "hawser-state";
/// The node's init server port (PID 1's `INIT_PORT`).
pub const NODE_INIT_PORT: u16 = 9000;
/// The Kubernetes version the host's in-process join service hands out in join tickets: the
/// stand-in image's (its kubeadm stand-in checks the v1beta4 configuration of this version).
/// A node refuses a ticket for another version than its image's, by name: a local cluster of a
/// real-Kubernetes image gives its version with [`LocalCluster::set_kubernetes_version`].
/// `hawser init` of a local cluster names none: the node installs its image's.
pub const JOIN_SERVICE_KUBERNETES_VERSION: &str =
    hawser_image::rootfs::kubernetes::STANDIN_KUBERNETES_VERSION;

/// The measured command-line additions of a local development node: static network, state
/// disk keyed by the cluster, and — with a join service — its endpoint and the *insecure*
/// trust in it (the host's join service cannot attest; visible in PCR 9/11/12).
pub fn node_cmdline(base: &str, join_service: bool) -> String {
    let mut cmdline = format!(
        "{base} hawser.net={GUEST_NET} hawser.state_disk=serial:{STATE_DISK_SERIAL} \
         hawser.state_disk_key_source=join-service"
    );
    if join_service {
        cmdline.push_str(&format!(
            " hawser.join_endpoint={GUEST_JOIN_ENDPOINT} hawser.join_service_trust=insecure-dev"
        ));
    }
    cmdline
}

/// Where a local cluster whose measurements select another platform profile than `qemu` (an
/// emulated cloud's) keeps that platform's roots and intermediates (PEM), which its join
/// service trusts in the provider CA's place.
pub const PLATFORM_ROOTS_FILE: &str = "platform-roots.pem";

/// The port of the cluster's join service on its first control-plane node (PID 1's
/// `JOIND_PORT`).
pub const NODE_JOIND_PORT: u16 = 7000;
/// A control plane's join-service admin API (releases, revocations) in the guest.
pub const NODE_ADMIN_PORT: u16 = 7001;
/// Every node's attestation port (`hawser verify`) in the guest.
pub const NODE_ATTEST_PORT: u16 = 9443;

/// The API server endpoint a local cluster's host-side join service hands out (there is no
/// control plane on the host: see [`NoControlPlaneTokens`]).
pub const GUEST_API_SERVER_ENDPOINT: &str = "10.0.2.100:6443";

/// A stand-in for a local cluster's API server on the host's loopback, for `hawser local up`'s
/// joining node: it accepts TCP connections and closes them (no Kubernetes API), so the
/// stand-in kubeadm's join discovery, which reaches [`GUEST_API_SERVER_ENDPOINT`] as real
/// kubeadm's does, finds a control plane there. Returns the port; the listener lives as long
/// as the process.
pub fn api_server_stand_in() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .context("opening the API server stand-in on the host's loopback")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            drop(connection);
        }
    });
    Ok(port)
}

/// QEMU arguments for the node's NIC: restricted user networking, the join service (if any)
/// forwarded from [`GUEST_JOIN_ENDPOINT`] to `join_port` on the host's loopback, and each
/// `(host port, guest port)` of `published` forwarded from `127.0.0.1:<host port>` to the node
/// (its init port [`NODE_INIT_PORT`], its join service [`NODE_JOIND_PORT`]).
pub fn user_net_args(join_port: Option<u16>, published: &[(u16, u16)]) -> Vec<String> {
    user_net_args_with_api_server(join_port, None, published)
}

/// [`user_net_args`], and [`GUEST_API_SERVER_ENDPOINT`] forwarded to `api_server_port` on the
/// host's loopback (a test's stand-in for the control plane, which the stand-in kubeadm's join
/// discovery must reach). Without it, nothing answers there: restricted networking drops the
/// connection.
pub fn user_net_args_with_api_server(
    join_port: Option<u16>,
    api_server_port: Option<u16>,
    published: &[(u16, u16)],
) -> Vec<String> {
    let mut netdev = "user,id=n0,restrict=on".to_owned();
    for (endpoint, port) in [
        (GUEST_JOIN_ENDPOINT, join_port),
        (GUEST_API_SERVER_ENDPOINT, api_server_port),
    ] {
        let Some(port) = port else { continue };
        let (host, guest_port) = endpoint.split_once(':').unwrap_or((endpoint, "7000"));
        // A `tcp:` chardev connects once, at QEMU start (and fails if the service is down);
        // `cmd:` runs a relay per guest connection (bash's /dev/tcp: these hosts have no
        // netcat), so the service may come up after the node booted.
        netdev.push_str(&format!(
            ",guestfwd=tcp:{host}:{guest_port}-cmd:bash -c \
             'exec 3<>/dev/tcp/127.0.0.1/{port} || exit 1; cat <&3 & cat >&3; kill %1'"
        ));
    }
    let guest = GUEST_NET.split('/').next().unwrap_or("10.0.2.15");
    for (host_port, guest_port) in published {
        netdev.push_str(&format!(
            ",hostfwd=tcp:127.0.0.1:{host_port}-{guest}:{guest_port}"
        ));
    }
    vec![
        "-netdev".to_owned(),
        netdev,
        "-device".to_owned(),
        "virtio-net-pci,netdev=n0".to_owned(),
    ]
}

/// A mesh node's network, for a VM that runs in a network namespace of its own (a test's, with
/// nothing but loopback): [`user_net_args`]'s join service forwarding, the node's WireGuard
/// port published as UDP on the namespace's `127.0.0.1:wireguard_port`, and *unrestricted*,
/// so that the guest reaches the other nodes' published ports and the join service's tunnel at
/// 10.0.2.2 (the namespace's loopback). Never for a VM in the host's own namespace: there the
/// guest would reach whatever the host reaches.
pub fn user_net_args_in_namespace(join_port: u16, wireguard_port: u16) -> Vec<String> {
    let mut args = user_net_args(Some(join_port), &[]);
    let guest = GUEST_NET.split('/').next().unwrap_or("10.0.2.15");
    if let Some(netdev) = args.get_mut(1) {
        *netdev = netdev.replacen("restrict=on", "restrict=off", 1);
        netdev.push_str(&format!(
            ",hostfwd=udp:127.0.0.1:{wireguard_port}-{guest}:{}",
            hawser_mesh::DEFAULT_LISTEN_PORT
        ));
    }
    args
}

/// Writes the expected measurements predicted for `uki` (after `enter-initrd`, PCR 15 zero:
/// a fresh node) to `out`.
pub fn write_expected_measurements(uki: &Path, out: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(uki).with_context(|| format!("reading {}", uki.display()))?;
    let prediction = Prediction::from_uki(&bytes, &uki.display().to_string())?;
    let mut json = prediction.expected_measurements_json(Phase::EnterInitrd);
    // An image built for a platform profile (`hawser image build --platform`): its nodes
    // present that profile's evidence, and the join service must judge it so.
    if let Some(platform) = hawser_platforms::profile::Platform::of_cmdline(&prediction.cmdline)
        .filter(|p| *p != hawser_platforms::profile::Platform::Qemu)
    {
        json[hawser_platforms::profile::VARIANT_KEY] = platform.attestation_variant().into();
    }
    std::fs::write(out, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", out.display()))
}

/// The state-disk key length a node booted from `uki` asks for: 96 bytes when its measured
/// command line turns on `hmac-sha256` integrity (a production image), else 64.
pub fn state_disk_key_length(uki: &Path) -> anyhow::Result<StateDiskKeyLength> {
    let bytes = std::fs::read(uki).with_context(|| format!("reading {}", uki.display()))?;
    let prediction = Prediction::from_uki(&bytes, &uki.display().to_string())?;
    Ok(key_length_of_cmdline(&prediction.cmdline))
}

/// The Kubernetes version a node booted from `uki` carries: `hawser.kubernetes` on its
/// measured command line (the last value, as PID 1 reads it); `None` for an image without one.
pub fn image_kubernetes_version(
    uki: &Path,
) -> anyhow::Result<Option<hawser_kube_types::KubernetesVersion>> {
    let bytes = std::fs::read(uki).with_context(|| format!("reading {}", uki.display()))?;
    let prediction = Prediction::from_uki(&bytes, &uki.display().to_string())?;
    kubernetes_of_cmdline(&prediction.cmdline)
}

/// Whether a node booted from `uki` runs real Kubernetes: its command line names a version
/// other than the stand-ins' ([`JOIN_SERVICE_KUBERNETES_VERSION`], the one the stand-ins check).
/// An image given with `--image` says so only this way.
pub fn image_runs_real_kubernetes(uki: &Path) -> anyhow::Result<bool> {
    Ok(is_real(image_kubernetes_version(uki)?.as_ref()))
}

/// Whether the version on an image's command line is real Kubernetes (not the stand-ins').
fn is_real(version: Option<&hawser_kube_types::KubernetesVersion>) -> bool {
    version.is_some_and(|version| version.as_str() != JOIN_SERVICE_KUBERNETES_VERSION)
}

/// [`image_kubernetes_version`] of a command line.
fn kubernetes_of_cmdline(
    cmdline: &str,
) -> anyhow::Result<Option<hawser_kube_types::KubernetesVersion>> {
    cmdline
        .split_ascii_whitespace()
        .filter_map(|word| word.strip_prefix("hawser.kubernetes="))
        .next_back()
        .map(|text| {
            text.parse()
                .with_context(|| format!("hawser.kubernetes={text} on the image's command line"))
        })
        .transpose()
}

/// [`state_disk_key_length`] of a command line (PID 1 takes the last value of a key).
fn key_length_of_cmdline(cmdline: &str) -> StateDiskKeyLength {
    let prefix = format!("{}=", profile::INTEGRITY_KEY);
    let integrity = cmdline
        .split_ascii_whitespace()
        .filter_map(|word| word.strip_prefix(&prefix))
        .next_back();
    if integrity == Some(profile::PRODUCTION_INTEGRITY) {
        StateDiskKeyLength::XtsHmacSha256
    } else {
        StateDiskKeyLength::Xts
    }
}

/// There is no Kubernetes control plane on the host of a local cluster (kubeadm comes with the
/// node's rootfs): join tickets carry this well-formed placeholder, which no API server accepts.
/// Named for what it is wherever it appears.
#[derive(Debug, Clone)]
pub struct NoControlPlaneTokens(JoinCredentials);

impl NoControlPlaneTokens {
    pub fn new() -> anyhow::Result<Self> {
        Self::at(GUEST_API_SERVER_ENDPOINT)
    }

    /// Tokens naming `api_server_endpoint` (e.g. an address inside the mesh).
    pub fn at(api_server_endpoint: &str) -> anyhow::Result<Self> {
        Ok(NoControlPlaneTokens(JoinCredentials {
            api_server_endpoint: api_server_endpoint.parse()?,
            bootstrap_token: "nocpln.0000000000000000".parse()?,
            discovery_ca_cert_hashes: vec![CaCertHash::from_sha256([0; 32])],
        }))
    }
}

impl BootstrapTokenIssuer for NoControlPlaneTokens {
    fn issue(&self, _ttl: Duration) -> Result<JoinCredentials, TokenError> {
        Ok(self.0.clone())
    }
}

/// The host-side join service's place in a local cluster's WireGuard mesh.
#[derive(Debug, Clone)]
pub struct LocalMesh {
    /// The mesh prefix.
    pub prefix: hawser_mesh::Ipv4Net,
    /// Where nodes reach the join service's tunnel (as the guests see it).
    pub endpoint: SocketAddr,
    /// The tunnel's UDP port.
    pub listen_port: u16,
    /// The peer API's port inside the mesh.
    pub api_port: u16,
    /// The tunnel's interface.
    pub interface: String,
}

/// A local cluster's host-side state, in one directory.
pub struct LocalCluster {
    pub dir: PathBuf,
    pub provider: ProviderCa,
    master: MasterSecret,
    measurement_salt: Vec<u8>,
    /// What the in-process join service hands out ([`JOIN_SERVICE_KUBERNETES_VERSION`] unless
    /// set).
    kubernetes_version: String,
}

impl LocalCluster {
    /// A new cluster in `dir` (emptied first): provider CA, master secret, measurement salt.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let provider = ProviderCa::generate("hawser local provider")?;
        std::fs::write(dir.join("provider-ca.pem"), provider.certificate_pem())?;
        let master = MasterSecret::generate()?;
        master.write_new_file(&dir.join("master-secret.json"))?;
        let measurement_salt = hawser_keys::random_bytes(hawser_keys::MEASUREMENT_SALT_LEN)?;
        std::fs::write(dir.join("measurement-salt"), &measurement_salt)?;
        Ok(LocalCluster {
            dir: dir.to_owned(),
            provider,
            master,
            measurement_salt,
            kubernetes_version: JOIN_SERVICE_KUBERNETES_VERSION.to_owned(),
        })
    }

    /// The Kubernetes version the in-process join service hands out: the nodes' image's
    /// (see [`image_kubernetes_version`]), which is the only one they install.
    pub fn set_kubernetes_version(&mut self, version: &hawser_kube_types::KubernetesVersion) {
        self.kubernetes_version = version.to_string();
    }

    pub fn provider_ca_path(&self) -> PathBuf {
        self.dir.join("provider-ca.pem")
    }

    pub fn master_secret(&self) -> &MasterSecret {
        &self.master
    }

    /// The cluster ID a node of this cluster extends into PCR 15.
    pub fn cluster_id(&self) -> [u8; 32] {
        hawser_keys::cluster_id(
            self.master.measurement_secret().as_slice(),
            &self.measurement_salt,
        )
    }

    /// Starts `hawser-joind` on `listen` (loopback), verifying nodes against the expected
    /// measurements in `measurements` (reloaded when the file changes).
    pub async fn start_join_service(
        &self,
        listen: SocketAddr,
        measurements: &Path,
    ) -> anyhow::Result<RunningService> {
        self.start_join_service_with(listen, measurements, NoControlPlaneTokens::new()?, None)
            .await
    }

    /// [`LocalCluster::start_join_service`] with `tokens` (a [`NoControlPlaneTokens`]: there is
    /// no control plane on the host), and with `mesh` the join service's
    /// WireGuard mesh: its tunnel (in this process's network namespace: a test's own, never
    /// the host's) and the peer API inside it, for as long as the process runs.
    pub async fn start_join_service_with(
        &self,
        listen: SocketAddr,
        measurements: &Path,
        tokens: impl BootstrapTokenIssuer + 'static,
        mesh: Option<LocalMesh>,
    ) -> anyhow::Result<RunningService> {
        let policy = Arc::new(PolicyStore::load(measurements)?);
        let core = JoinCore::new(
            policy,
            Arc::new(tokens),
            JoinCoreConfig {
                master_secret: self.master.clone(),
                measurement_salt: self.measurement_salt.clone(),
                kubernetes_version: self.kubernetes_version.clone(),
                token_ttl: Duration::from_secs(600),
                pki_dir: None,
                registry_file: self.dir.join("joined-disks"),
            },
        )?;
        let core = match mesh {
            None => Arc::new(core),
            Some(mesh) => {
                let options = member::MeshOptions {
                    prefix: mesh.prefix,
                    endpoint: mesh.endpoint,
                    mtu: 0,
                    api_port: mesh.api_port,
                    key_file: self.dir.join("vpn.key"),
                    name: "local".to_owned(),
                    address: JoinServiceAddress::Reserved,
                    interface: mesh.interface,
                    listen_port: mesh.listen_port,
                };
                let (core, membership) =
                    tokio::task::spawn_blocking(move || member::admit(core, &options)).await??;
                let core = Arc::new(core);
                member::start(Arc::clone(&core), membership, std::future::pending()).await?;
                core
            }
        };
        // The platform profile the measurements select: QEMU's nodes are certified by this
        // cluster's provider CA; another profile's (an emulated cloud's) by the roots kept in
        // PLATFORM_ROOTS_FILE.
        let platform = hawser_platforms::profile::Platform::from_measurements(
            &std::fs::read_to_string(measurements)?,
        )?;
        let trust = match platform {
            hawser_platforms::profile::Platform::Qemu => self.provider.certificate_pem(),
            other => {
                let path = self.dir.join(PLATFORM_ROOTS_FILE);
                std::fs::read_to_string(&path).map_err(|e| {
                    anyhow::anyhow!(
                        "the measurements select the {other} profile, whose roots belong in {}: {e}",
                        path.display()
                    )
                })?
            }
        };
        let mut config = ServiceConfig::new(listen, core, trust);
        config.platform = platform;
        Ok(service::spawn(config).await?)
    }

    /// Creates a TPM state directory for a node, its AK certified by the provider; returns the
    /// AK's TPM name (what `hawser init --approve-control-plane` takes).
    pub fn provision_tpm(&self, tpm_dir: &Path) -> anyhow::Result<Vec<u8>> {
        std::fs::create_dir_all(tpm_dir)?;
        Ok(self.provider.provision_state_dir(tpm_dir)?.ak_name)
    }
}

/// A free TCP port on the loopback interface (race-prone by nature; good enough for a local VM).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The LUKS2 UUID in a state disk image's primary binary header (offset 168, 40 bytes,
/// NUL-padded), or `None` if the image holds no LUKS2 header.
pub fn luks_uuid(disk: &Path) -> Option<String> {
    use std::os::unix::fs::FileExt as _;
    let file = std::fs::File::open(disk).ok()?;
    let mut magic = [0u8; 6];
    file.read_exact_at(&mut magic, 0).ok()?;
    if &magic != b"LUKS\xba\xbe" {
        return None;
    }
    let mut buf = [0u8; 40];
    file.read_exact_at(&mut buf, 168).ok()?;
    Some(
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_production_command_line_asks_for_the_96_byte_key() {
        let production = hawser_image::profile::ImageProfile::Production
            .cmdline(hawser_image::pipeline::DEFAULT_CMDLINE)
            .unwrap();
        assert_eq!(
            key_length_of_cmdline(&production),
            StateDiskKeyLength::XtsHmacSha256
        );
        assert_eq!(
            key_length_of_cmdline(hawser_image::pipeline::DEFAULT_CMDLINE),
            StateDiskKeyLength::Xts
        );
        // The last value counts, as in PID 1.
        assert_eq!(
            key_length_of_cmdline(&format!("{production} hawser.state_disk_integrity=none")),
            StateDiskKeyLength::Xts
        );
    }

    #[test]
    fn an_image_of_the_stand_ins_or_of_no_version_is_not_real_kubernetes() {
        let version = |cmdline: &str| kubernetes_of_cmdline(cmdline).unwrap();
        assert!(is_real(version("quiet hawser.kubernetes=v1.20.2").as_ref()));
        let standin = format!("quiet hawser.kubernetes={JOIN_SERVICE_KUBERNETES_VERSION}");
        assert!(!is_real(version(&standin).as_ref()));
        assert!(!is_real(version("quiet").as_ref()));
    }

    #[test]
    fn the_images_kubernetes_version_is_read_from_its_command_line() {
        assert_eq!(kubernetes_of_cmdline("console=ttyS0 quiet").unwrap(), None);
        let version = kubernetes_of_cmdline(
            "quiet hawser.kubernetes=v1.33.4 hawser.root_hash=00 hawser.kubernetes=v1.20.2",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            version.as_str(),
            "v1.20.2",
            "the last value counts, as in PID 1"
        );
        let err = kubernetes_of_cmdline("hawser.kubernetes=1.20").unwrap_err();
        assert!(
            format!("{err:#}").starts_with("hawser.kubernetes=1.20 on the image's command line"),
            "{err:#}"
        );
    }

    #[test]
    fn the_placeholder_credentials_are_well_formed_and_say_what_they_are() {
        let credentials = NoControlPlaneTokens::new()
            .unwrap()
            .issue(Duration::from_secs(60))
            .unwrap();
        // The node's kubeadm configuration shows the token's ID, which names the placeholder.
        assert_eq!(credentials.bootstrap_token.id(), "nocpln");
        assert_eq!(credentials.api_server_endpoint.port(), 6443);
        assert_eq!(
            credentials.discovery_ca_cert_hashes[0].to_string(),
            format!("sha256:{}", "00".repeat(32))
        );
    }
}
