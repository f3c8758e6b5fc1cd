//! `hawser init` and `hawser recover`: the admin's side of the init protocol.
//!
//! Both verify the node before anything secret leaves this machine: an aTLS handshake whose
//! quote must match the expected measurements and whose AK must chain to the provider CA. A
//! refusal for measurements prints every PCR that differs, expected against actual.
//!
//! `init` writes the new master secret (0600, never over an existing file) and the cluster file
//! (name, cluster ID, measurement salt — what `recover` needs besides the secret) *before* it
//! sends them, so a crash after the node accepted can never lose the cluster's only root
//! secret. The node's log lines stream to the terminal; on success the node's cluster ID must
//! equal the one computed here, and a second attestation must show PCR 15 locked to it.
//!
//! Both send the **init secret** (`--init-secret FILE`, 32 random bytes in hex, written by
//! whoever created the node and gave its platform the secret's SHA-256): the node refuses any
//! request without it. Like the master secret, it is only sent after the node was verified, is
//! zeroized after use and never printed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hawser_attestation::atls::{AtlsClient, AtlsError, Identity, PeerPolicy, Refusal};
use hawser_attestation::measurements::{ExpectedMeasurements, ExpectedPcr};
use hawser_attestation::validator::{AkTrust, EvidenceError, ValidatedEvidence, Validator};
use hawser_keys::MasterSecret;
use hawser_proto::init::init_service_client::InitServiceClient;
use hawser_proto::init::{InitRequest, InitResponse, RecoverRequest, init_response};
use serde::{Deserialize, Serialize};

use hawser_keys::MEASUREMENT_SALT_LEN;
use hawser_pcr::{PCR_CLUSTER_ID, PCR_KERNEL_BOOT, cluster_lock_pcr, pcr11_after_pivot};

/// Length of the init secret.
pub const INIT_SECRET_LEN: usize = 32;
/// Default name of the init secret file.
pub const INIT_SECRET_FILE: &str = "hawser-init-secret";

/// Generates an init secret, writes it to `path` (hex, 0600, never over an existing file) and
/// returns the SHA-256 the node's image must carry on its measured command line
/// (`hawser.init_secret_hash`).
pub fn write_new_init_secret(path: &Path) -> anyhow::Result<[u8; 32]> {
    use sha2::Digest as _;
    let secret = zeroize::Zeroizing::new(hawser_keys::random_bytes(INIT_SECRET_LEN)?);
    let text = zeroize::Zeroizing::new(format!("{}\n", hex::encode(secret.as_slice())));
    write_new_file(path, text.as_bytes(), 0o600)?;
    Ok(sha2::Sha256::digest(secret.as_slice()).into())
}

/// Reads the init secret file `path` (hex, as [`write_new_init_secret`] writes it).
pub fn read_init_secret(path: &Path) -> anyhow::Result<zeroize::Zeroizing<Vec<u8>>> {
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading the init secret {} (written by whoever created the node, e.g. `hawser \
             local up --init`; pass it with --init-secret FILE)",
            path.display()
        )
    })?);
    let mut secret = zeroize::Zeroizing::new(vec![0u8; INIT_SECRET_LEN]);
    let trimmed = text.trim_ascii();
    if trimmed.len() != 2 * INIT_SECRET_LEN || hex::decode_to_slice(trimmed, &mut secret).is_err() {
        bail!(
            "{} is not an init secret ({INIT_SECRET_LEN} bytes as {} hex digits); pass the file \
             the node's creator wrote with --init-secret FILE",
            path.display(),
            2 * INIT_SECRET_LEN
        );
    }
    Ok(secret)
}

/// The SHA-256 of the init secret in `path`: what the node's platform is given.
pub fn init_secret_hash(path: &Path) -> anyhow::Result<[u8; 32]> {
    use sha2::Digest as _;
    Ok(sha2::Sha256::digest(read_init_secret(path)?.as_slice()).into())
}

/// Bound on one aTLS handshake (a TPM quote under TCG takes a fraction of a second).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// What `recover` needs besides the master secret; written by `init`. Nothing in it is secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    pub cluster_name: String,
    /// Hex.
    pub cluster_id: String,
    /// Hex, [`MEASUREMENT_SALT_LEN`] bytes.
    pub measurement_salt: String,
    /// The version `hawser init` asked for; empty: the node image's (`hawser.kubernetes` on
    /// its command line), the only one it installs.
    pub kubernetes_version: String,
    /// The node `hawser init` initialized (`host:port`).
    pub init_node: String,
}

impl ClusterFile {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the cluster file {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a hawser cluster file", path.display()))
    }

    fn write_new(&self, path: &Path) -> anyhow::Result<()> {
        write_new_file(path, serde_json::to_string_pretty(self)?.as_bytes(), 0o644)
    }

    pub fn salt(&self) -> anyhow::Result<Vec<u8>> {
        let salt = hex::decode(&self.measurement_salt)
            .context("the cluster file's measurement_salt is not hex")?;
        if salt.len() != MEASUREMENT_SALT_LEN {
            bail!(
                "the cluster file's measurement_salt is {} bytes, expected {MEASUREMENT_SALT_LEN}",
                salt.len()
            );
        }
        Ok(salt)
    }
}

/// Writes `bytes` to a file that must not exist yet, with `mode`.
fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                anyhow::anyhow!("{} exists; refusing to overwrite it", path.display())
            }
            _ => anyhow::Error::new(e).context(format!("creating {}", path.display())),
        })?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(())
}

/// How to recognise the node: its expected measurements and the root of its AK certificate.
pub struct NodeTrust {
    pub measurements: ExpectedMeasurements,
    pub ak_trust: AkTrust,
}

impl NodeTrust {
    pub fn load(measurements: &Path, provider_ca: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(measurements)
            .with_context(|| format!("reading the measurements {}", measurements.display()))?;
        let platform = hawser_platforms::profile::Platform::from_measurements(&text)
            .with_context(|| format!("the measurements {}", measurements.display()))?;
        let measurements = ExpectedMeasurements::from_json_file(measurements)?;
        let pem = std::fs::read_to_string(provider_ca)
            .with_context(|| format!("reading the provider CA {}", provider_ca.display()))?;
        let ak_trust = hawser_platforms::verifier::ak_trust(platform, &pem).with_context(|| {
            format!(
                "the {platform} trust from the provider CA {}",
                provider_ca.display()
            )
        })?;
        Ok(NodeTrust {
            measurements,
            ak_trust,
        })
    }

    /// The same trust for a node that has left the initramfs: PCR 11 extended with
    /// `control-plane` and `leave-initrd` (a control plane: the node `hawser init` made), or
    /// with `leave-initrd` alone (a worker, which `hawser recover` may meet); its other PCRs
    /// stay as they were.
    fn after_pivot(&self) -> NodeTrust {
        let mut measurements = self.measurements.clone();
        if let Some(pcr11) = measurements.get(PCR_KERNEL_BOOT).cloned() {
            measurements
                .insert(
                    PCR_KERNEL_BOOT,
                    ExpectedPcr {
                        expected: pcr11_after_pivot(&pcr11.expected, true),
                        warn_only: pcr11.warn_only,
                    },
                )
                .also_accept(PCR_KERNEL_BOOT, pcr11_after_pivot(&pcr11.expected, false));
        }
        NodeTrust {
            measurements,
            ak_trust: self.ak_trust.clone(),
        }
    }

    /// A client that requires the node to match these measurements, with PCR 15 pinned to
    /// `pcr15` (zero for a fresh node) when given.
    fn client(&self, pcr15: Option<[u8; 32]>) -> anyhow::Result<AtlsClient> {
        let mut measurements = self.measurements.clone();
        if let Some(expected) = pcr15 {
            measurements.insert(
                PCR_CLUSTER_ID,
                ExpectedPcr {
                    expected,
                    warn_only: false,
                },
            );
        }
        let validator = Validator::new(measurements, self.ak_trust.clone())?;
        Ok(AtlsClient::new(
            Identity::Unattested,
            PeerPolicy::Verify(Arc::new(validator)),
        )
        .handshake_timeout(HANDSHAKE_TIMEOUT))
    }
}

/// Attests the node at `node` with `client`; a refusal becomes an error listing what differs.
async fn attest(node: &str, client: &AtlsClient) -> anyhow::Result<ValidatedEvidence> {
    let tcp = tokio::net::TcpStream::connect(node)
        .await
        .with_context(|| {
            format!("cannot connect to the node at {node} (is it booted and waiting?)")
        })?;
    let _ = tcp.set_nodelay(true);
    match client.connect(tcp).await {
        Ok(stream) => stream
            .peer_attestation()
            .evidence()
            .cloned()
            .context("the node was not asked to attest"),
        Err(AtlsError::PeerRefused {
            reason: Refusal::Evidence(evidence),
            ..
        }) => match *evidence {
            EvidenceError::Measurements(mismatch) => {
                let mut text = format!(
                    "the node at {node} does not run the expected image; {} PCR(s) differ:",
                    mismatch.mismatches.len()
                );
                for m in &mismatch.mismatches {
                    text.push_str(&format!(
                        "\n  PCR {:>2}  expected {}\n          actual   {}",
                        m.pcr,
                        hex::encode(m.expected),
                        m.actual
                            .map(hex::encode)
                            .unwrap_or_else(|| "(not quoted)".to_owned())
                    ));
                }
                text.push_str("\nnothing was sent to the node");
                bail!(text)
            }
            other => bail!(
                "the node at {node} failed attestation: {}; nothing was sent",
                hawser_attestation::error_chain(&other)
            ),
        },
        Err(e) => Err(anyhow::Error::new(e).context(format!("attesting the node at {node}"))),
    }
}

/// A gRPC client for the node's init service over a verified aTLS connection.
async fn init_client(
    node: &str,
    client: &AtlsClient,
) -> anyhow::Result<InitServiceClient<tonic::transport::Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{node}"))
        .with_context(|| format!("{node} is not a host:port"))?
        .connect_timeout(HANDSHAKE_TIMEOUT)
        .connect_with_connector(client.connector())
        .await
        .with_context(|| format!("connecting to the init service at {node}"))?;
    Ok(InitServiceClient::new(channel))
}

/// Streams the node's answer: log lines to `log`, then the success or failure. The caller
/// keeps the stream open while it confirms the lock: the node stops listening once it ends.
async fn follow(
    stream: &mut tonic::Streaming<InitResponse>,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<hawser_proto::init::InitSuccess> {
    while let Some(message) = stream.message().await.context("the node's stream broke")? {
        match message.kind {
            Some(init_response::Kind::LogLine(line)) => log(&line),
            Some(init_response::Kind::Success(success)) => return Ok(success),
            Some(init_response::Kind::Failure(failure)) => {
                bail!("the node reports failure: {}", failure.reason)
            }
            None => {}
        }
    }
    bail!("the node closed the stream without a result (see its console)")
}

/// The options of `hawser init`.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub node: String,
    pub measurements: PathBuf,
    pub provider_ca: PathBuf,
    pub master_secret: PathBuf,
    pub cluster_file: PathBuf,
    pub kubeconfig: PathBuf,
    pub cluster_name: String,
    /// The Kubernetes version to install; `None`: the node image's (the request leaves it
    /// empty, and the node installs the version its image carries).
    pub kubernetes_version: Option<hawser_kube_types::KubernetesVersion>,
    pub service_cidr: String,
    pub api_server_cert_sans: Vec<String>,
    /// kubeadm's `controlPlaneEndpoint` (`host[:port]`); `None`: the first node's address.
    pub control_plane_endpoint: Option<hawser_kube_types::Endpoint>,
    /// The init secret file (see the module docs).
    pub init_secret: PathBuf,
    /// TPM names of the AKs the cluster's join service approves as control planes.
    pub control_plane_approvals: Vec<Vec<u8>>,
    /// The cluster's WireGuard mesh prefix; `None`: no mesh.
    pub vpn_prefix: Option<hawser_mesh::Ipv4Net>,
}

/// `hawser init`'s mesh prefix unless told otherwise: a /24, whose last octets choose each
/// node's pod range (`hawser_mesh::pods`).
pub const DEFAULT_VPN_PREFIX: &str = "10.99.0.0/24";

/// The status of a refused request, for the admin: the node's reason, and what to do about a
/// refused init secret.
fn refused(rpc: &str, status: &tonic::Status, init_secret: &Path) -> anyhow::Error {
    let hint = if status.code() == tonic::Code::PermissionDenied {
        format!(
            "\n{} is not the init secret this node was created with: pass the right file with \
             --init-secret (nothing else was changed on the node)",
            init_secret.display()
        )
    } else {
        String::new()
    };
    anyhow::anyhow!(
        "the node refused {rpc} ({:?}): {}{hint}",
        status.code(),
        status.message()
    )
}

/// What `init` and `recover` established.
#[derive(Debug, Clone)]
pub struct Established {
    pub cluster_id: [u8; 32],
    pub pcr15: [u8; 32],
    pub kubeconfig_written: bool,
    /// The PCRs of the node's verified quote after it locked itself to the cluster.
    pub quoted: std::collections::BTreeMap<u8, [u8; 32]>,
    /// Whether that quote came from the node in its rootfs (PCR 11 with `leave-initrd`), not
    /// from its initramfs.
    pub quoted_after_pivot: bool,
}

/// `hawser init`: see the module docs. `say` gets the CLI's own progress lines, `log` the
/// node's.
pub async fn init(
    opts: &InitOptions,
    say: &mut dyn FnMut(&str),
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Established> {
    if let Some(version) = &opts.kubernetes_version {
        // Refused here, before the node is touched (the node refuses it too).
        hawser_kube_types::KubeadmApi::for_version(version)?;
    }
    for path in [&opts.master_secret, &opts.cluster_file, &opts.kubeconfig] {
        if path.exists() {
            bail!(
                "{} exists; refusing to overwrite it (move it away, or use `hawser recover` for an existing cluster)",
                path.display()
            );
        }
    }
    let init_secret = read_init_secret(&opts.init_secret)?;
    let trust = NodeTrust::load(&opts.measurements, &opts.provider_ca)?;
    let fresh = trust.client(Some([0; 32]))?;
    say(&format!(
        "verifying the node at {} against {} …",
        opts.node,
        opts.measurements.display()
    ));
    let evidence = attest(&opts.node, &fresh).await?;
    say(&describe_evidence(&evidence));

    let master = MasterSecret::generate()?;
    let salt = hawser_keys::random_bytes(MEASUREMENT_SALT_LEN)?;
    let cluster_id = hawser_keys::cluster_id(master.measurement_secret().as_slice(), &salt);
    master.write_new_file(&opts.master_secret)?;
    say(&format!(
        "wrote the new master secret to {} (0600): keep it safe, it is the only way to recover \
         this cluster",
        opts.master_secret.display()
    ));
    ClusterFile {
        cluster_name: opts.cluster_name.clone(),
        cluster_id: hex::encode(cluster_id),
        measurement_salt: hex::encode(&salt),
        kubernetes_version: requested_version(opts),
        init_node: opts.node.clone(),
    }
    .write_new(&opts.cluster_file)?;

    // The generated request type does not zeroize; it lives only until it is sent.
    let request = InitRequest {
        master_secret: master.key_bytes().to_vec(),
        master_secret_salt: master.salt_bytes().to_vec(),
        measurement_salt: salt,
        cluster_name: opts.cluster_name.clone(),
        kubernetes_version: requested_version(opts),
        service_cidr: opts.service_cidr.clone(),
        api_server_cert_sans: opts.api_server_cert_sans.clone(),
        init_secret: init_secret.to_vec(),
        control_plane_approvals: opts.control_plane_approvals.clone(),
        control_plane_endpoint: opts
            .control_plane_endpoint
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        vpn_prefix: opts
            .vpn_prefix
            .map(|prefix| prefix.to_string())
            .unwrap_or_default(),
    };
    drop(init_secret);
    say("sending Init; the node's log follows");
    let mut stream = init_client(&opts.node, &fresh)
        .await?
        .init(request)
        .await
        .map_err(|s| refused("Init", &s, &opts.init_secret))?
        .into_inner();
    let success = follow(&mut stream, log).await?;
    // The node answers Init after `kubeadm init`, so after its pivot.
    let established = confirm(
        &opts.node,
        &trust,
        &success,
        cluster_id,
        Answers::AfterPivot,
        say,
    )
    .await?;
    drop(stream);
    let kubeconfig_written = !success.kubeconfig.is_empty();
    if kubeconfig_written {
        write_new_file(&opts.kubeconfig, &success.kubeconfig, 0o600)?;
        say(&format!(
            "wrote the admin kubeconfig to {}",
            opts.kubeconfig.display()
        ));
    } else {
        say("the node runs no Kubernetes (an image without a rootfs): no kubeconfig");
    }
    Ok(Established {
        kubeconfig_written,
        ..established
    })
}

/// The Init request's `kubernetes_version`: the one asked for, or empty for the image's.
fn requested_version(opts: &InitOptions) -> String {
    opts.kubernetes_version
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// The options of `hawser recover`.
#[derive(Debug, Clone)]
pub struct RecoverOptions {
    pub node: String,
    pub measurements: PathBuf,
    pub provider_ca: PathBuf,
    pub master_secret: PathBuf,
    pub cluster_file: PathBuf,
    /// The init secret file (see the module docs).
    pub init_secret: PathBuf,
}

/// `hawser recover`: a node of an existing cluster reopens its state disk with a key derived
/// from the master secret, when no join service is left to ask.
pub async fn recover(
    opts: &RecoverOptions,
    say: &mut dyn FnMut(&str),
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Established> {
    let master = MasterSecret::read_file(&opts.master_secret)?;
    let cluster = ClusterFile::read(&opts.cluster_file)?;
    let salt = cluster.salt()?;
    let cluster_id = hawser_keys::cluster_id(master.measurement_secret().as_slice(), &salt);
    if hex::encode(cluster_id) != cluster.cluster_id {
        bail!(
            "{} does not belong to the cluster in {} (cluster ID {} vs {}): wrong master secret?",
            opts.master_secret.display(),
            opts.cluster_file.display(),
            hex::encode(cluster_id),
            cluster.cluster_id
        );
    }
    let init_secret = read_init_secret(&opts.init_secret)?;
    let trust = NodeTrust::load(&opts.measurements, &opts.provider_ca)?;
    let fresh = trust.client(Some([0; 32]))?;
    say(&format!("verifying the node at {} …", opts.node));
    let evidence = attest(&opts.node, &fresh).await?;
    say(&describe_evidence(&evidence));
    say(&format!(
        "sending Recover for cluster {:?}; the node's log follows",
        cluster.cluster_name
    ));
    let mut stream = init_client(&opts.node, &fresh)
        .await?
        .recover(RecoverRequest {
            init_secret: init_secret.to_vec(),
            master_secret: master.key_bytes().to_vec(),
            master_secret_salt: master.salt_bytes().to_vec(),
            measurement_salt: salt,
        })
        .await
        .map_err(|s| refused("Recover", &s, &opts.init_secret))?
        .into_inner();
    drop(init_secret);
    let success = follow(&mut stream, log).await?;
    // The node answers Recover from its initramfs (kubeadm does not run again).
    let established = confirm(
        &opts.node,
        &trust,
        &success,
        cluster_id,
        Answers::InInitrd,
        say,
    )
    .await;
    drop(stream);
    established
}

/// Checks the node's answer: its cluster ID is ours, and a fresh attestation shows PCR 15
/// locked to it.
/// Where the node most likely is when it answers the re-attestation after the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answers {
    InInitrd,
    AfterPivot,
}

async fn confirm(
    node: &str,
    trust: &NodeTrust,
    success: &hawser_proto::init::InitSuccess,
    cluster_id: [u8; 32],
    answers: Answers,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Established> {
    if success.cluster_id != cluster_id {
        bail!(
            "the node reports cluster ID {}, but the master secret and salt give {}",
            hex::encode(&success.cluster_id),
            hex::encode(cluster_id)
        );
    }
    let pcr15 = cluster_lock_pcr(&cluster_id);
    // A node with a rootfs that ran `kubeadm init` answers after its pivot (PCR 11 then also
    // holds `leave-initrd`); one without a rootfs, or a recovered one, from its initramfs.
    // Asking the likely case first spares a refused handshake (and a warning on both sides).
    let (likely, other) = match answers {
        Answers::InInitrd => (
            trust.client(Some(pcr15))?,
            trust.after_pivot().client(Some(pcr15))?,
        ),
        Answers::AfterPivot => (
            trust.after_pivot().client(Some(pcr15))?,
            trust.client(Some(pcr15))?,
        ),
    };
    let likely_after_pivot = matches!(answers, Answers::AfterPivot);
    let (evidence, after_pivot) = match attest(node, &likely).await {
        Ok(evidence) => (evidence, likely_after_pivot),
        Err(first) => match attest(node, &other).await {
            Ok(evidence) => (evidence, !likely_after_pivot),
            Err(_) => return Err(first).context("re-attesting the node after the node lock"),
        },
    };
    say(&format!(
        "node locked to cluster {}: a fresh quote shows PCR 15 = {}",
        hex::encode(cluster_id),
        hex::encode(pcr15)
    ));
    Ok(Established {
        cluster_id,
        pcr15,
        kubeconfig_written: false,
        quoted: evidence.pcrs,
        quoted_after_pivot: after_pivot,
    })
}

fn describe_evidence(evidence: &ValidatedEvidence) -> String {
    let mut text = format!(
        "node attested: AK certified as {:?}, measurements match",
        evidence.ak_certificate_subject
    );
    for warning in &evidence.warnings {
        text.push_str(&format!("\n  warning: {warning}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_secret_file_is_private_never_overwritten_and_read_back_with_its_hash() {
        use sha2::Digest as _;
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("hawser-init-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(INIT_SECRET_FILE);
        let hash = write_new_init_secret(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let secret = read_init_secret(&path).unwrap();
        assert_eq!(secret.len(), INIT_SECRET_LEN);
        assert_eq!(
            <[u8; 32]>::from(sha2::Sha256::digest(secret.as_slice())),
            hash
        );
        let again = write_new_init_secret(&path).unwrap_err();
        assert!(
            format!("{again:#}").contains("refusing to overwrite"),
            "{again:#}"
        );

        let missing = read_init_secret(&dir.join("nope")).unwrap_err();
        assert!(
            format!("{missing:#}").contains("--init-secret FILE"),
            "{missing:#}"
        );
        let short = dir.join("short");
        std::fs::write(&short, "abcd\n").unwrap();
        let err = format!("{:#}", read_init_secret(&short).unwrap_err());
        assert!(
            err.contains("is not an init secret") && err.contains("short"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn init_refuses_a_version_without_a_kubeadm_writer_before_any_connection() {
        let dir = tempfile::tempdir().unwrap();
        let opts = InitOptions {
            // Nothing listens there: the refusal must come first.
            node: "127.0.0.1:1".into(),
            measurements: dir.path().join("measurements.json"),
            provider_ca: dir.path().join("ca.pem"),
            master_secret: dir.path().join("master-secret.json"),
            cluster_file: dir.path().join("cluster.json"),
            kubeconfig: dir.path().join("admin.conf"),
            cluster_name: "demo".into(),
            kubernetes_version: Some("v1.25.0".parse().unwrap()),
            service_cidr: "10.96.0.0/12".into(),
            api_server_cert_sans: Vec::new(),
            control_plane_endpoint: None,
            init_secret: dir.path().join("init-secret"),
            control_plane_approvals: Vec::new(),
            vpn_prefix: None,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = runtime
            .block_on(init(&opts, &mut |_| {}, &mut |_| {}))
            .unwrap_err();
        assert!(
            format!("{err:#}")
                .starts_with("hawser writes no kubeadm configuration for Kubernetes v1.25.0"),
            "{err:#}"
        );
        assert!(!opts.master_secret.exists(), "nothing is written");
        // No version: the node image's; the request leaves it empty.
        let image = InitOptions {
            kubernetes_version: None,
            ..opts.clone()
        };
        assert_eq!(requested_version(&image), "");
        assert_eq!(
            requested_version(&InitOptions {
                kubernetes_version: Some("v1.20.2".parse().unwrap()),
                ..opts
            }),
            "v1.20.2"
        );
    }
}
