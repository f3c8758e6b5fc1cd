//! PID 1's configuration: measured kernel command line keys and unmeasured fw_cfg keys.
//!
//! The kernel command line is part of the measured UKI, so `hawser.*` keys there are trusted:
//! an unknown key is worth a warning (a typo should be visible), a malformed value is fatal
//! (booting with a setting the operator did not ask for is worse than not booting).
//!
//! QEMU's fw_cfg is not measured: the host can put anything there. Only the keys in
//! [`FW_CFG_ALLOWED_KEYS`] are read from it, and each must be something an attacker gains
//! nothing from choosing — the quote nonce, which a verifier checks against the nonce it sent —
//! or something the *measured* command line explicitly opted into: the state disk key is used
//! only with `hawser.state_disk_key_source=fw_cfg-insecure-dev`, a development setting that is
//! visible in PCR measurements and warned about on every boot (see [`crate::disk`]).
//!
//! Everything here is pure: the callers read `/proc/cmdline` and sysfs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hawser_kube_types::{KubeadmApi, KubernetesVersion, NoKubeadmWriter};
use hawser_luks2::Integrity;
use tracing::level_filters::LevelFilter;
use zeroize::Zeroizing;

use crate::disk::StateDiskConfig;
use crate::disk::key::{KeySourceKind, VolumeKey};
use crate::enrollment::{JoinEndpoints, JoinServiceTrust};
use crate::platform::block::DiskSelector;
use crate::platform::net::NetConfig;

/// The prefix of the kernel command line keys hawser reads.
pub const CMDLINE_PREFIX: &str = "hawser.";
/// Reboot delay when `hawser.reboot_delay` is not given.
pub const DEFAULT_REBOOT_DELAY: Duration = Duration::from_secs(30);
/// TPM device when `hawser.tpm` is not given (the kernel's resource-managed TPM node).
pub const DEFAULT_TPM_DEVICE: &str = "/dev/tpmrm0";
/// The fw_cfg keys (under `opt/hawser/`) hawser accepts from the unmeasured host.
pub const FW_CFG_ALLOWED_KEYS: &[&str] = &[
    "quote_nonce",
    "state_disk_key",
    "join_endpoint",
    "role",
    "vpn_endpoint",
    "lan_net",
];
/// Longest accepted quote nonce: a TPM2B_DATA holds at most 64 bytes of qualifying data.
pub const MAX_NONCE_LEN: usize = 64;
/// Longest accepted state disk key: XTS and HMAC keys (see [`Integrity::key_len`]).
pub const MAX_STATE_DISK_KEY_LEN: usize = 96;

/// A configuration value hawser cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A `hawser.*` key on the measured kernel command line has a value hawser cannot use:
    /// fatal, since booting with a setting the operator did not ask for is worse.
    #[error("kernel command line key {key} has malformed value {value:?}: {reason}")]
    MalformedCmdline {
        /// The key, with its `hawser.` prefix.
        key: String,
        /// The value as given (empty for a key without `=`).
        value: String,
        /// What was expected instead.
        reason: &'static str,
    },
    /// `hawser.kubernetes` names a Kubernetes version hawser writes no kubeadm configuration
    /// for: the image cannot be made a node (a mistake of whoever built it).
    #[error(
        "kernel command line key hawser.kubernetes={version}: this image's Kubernetes cannot be \
         configured by this hawser"
    )]
    KubernetesWithoutWriter {
        /// The version as given.
        version: String,
        #[source]
        source: NoKubeadmWriter,
    },
    /// An allowed fw_cfg key (`opt/hawser/<key>`) has a value hawser cannot use.
    #[error("fw_cfg key opt/hawser/{key} has malformed value {value:?}: {reason}")]
    MalformedFwCfg {
        /// The key, without the `opt/hawser/` prefix.
        key: String,
        /// The value as given; for the state disk key a placeholder, never key material.
        value: String,
        /// What was expected instead.
        reason: &'static str,
    },
}

/// What PID 1 does after a fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootPolicy {
    /// Reboot after this delay (time to read the console).
    RebootAfter(Duration),
    /// `hawser.reboot_delay=0`: stay halted forever, for debugging.
    HaltForever,
}

impl Default for RebootPolicy {
    fn default() -> Self {
        RebootPolicy::RebootAfter(DEFAULT_REBOOT_DELAY)
    }
}

/// The measured configuration from the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdlineConfig {
    pub reboot_policy: RebootPolicy,
    pub log_level: LevelFilter,
    /// Absolute path of the TPM character device, e.g. `/dev/tpmrm0`.
    pub tpm_device: PathBuf,
    /// The encrypted state disk (`hawser.state_disk*`).
    pub state_disk: StateDiskConfig,
    /// `hawser.net`: a static IPv4 address for the first NIC (none by default).
    pub net: Option<NetConfig>,
    /// `hawser.join_service_trust`: how the node authenticates the join service.
    pub join_service_trust: JoinServiceTrust,
    /// `hawser.join_endpoint`: the join services, tried in turn (fw_cfg may give them when
    /// this is absent).
    pub join_endpoint: Option<JoinEndpoints>,
    /// `hawser.join_discovery`: how a node with no join endpoint finds the join service.
    pub join_discovery: JoinDiscovery,
    /// `hawser.root_hash`: the dm-verity root hash of the rootfs to pivot into; `None` keeps
    /// the node in the initramfs (an image without a rootfs).
    pub root_hash: Option<crate::rootfs::RootHash>,
    /// `hawser.init_secret_hash`: SHA-256 of the admin's init secret; wins over fw_cfg's.
    pub init_secret_hash: Option<[u8; 32]>,
    /// `hawser.kubernetes`: the Kubernetes version the image's rootfs carries (written by the
    /// image builder), known before the rootfs is mounted: the default of `hawser init` and the
    /// only version this node installs or joins. `None` on images without a rootfs.
    pub kubernetes: Option<KubernetesVersion>,
    /// `hawser.platform` (`hawser image build --platform`; `qemu` when absent).
    pub platform: NodePlatform,
    /// Things worth a warning line (unknown keys, repeated keys).
    pub warnings: Vec<String>,
}

impl Default for CmdlineConfig {
    fn default() -> Self {
        CmdlineConfig {
            reboot_policy: RebootPolicy::default(),
            log_level: LevelFilter::INFO,
            tpm_device: PathBuf::from(DEFAULT_TPM_DEVICE),
            state_disk: StateDiskConfig::default(),
            net: None,
            join_service_trust: JoinServiceTrust::default(),
            join_endpoint: None,
            join_discovery: JoinDiscovery::None,
            root_hash: None,
            init_secret_hash: None,
            kubernetes: None,
            platform: NodePlatform::Qemu,
            warnings: Vec::new(),
        }
    }
}

/// Splits a kernel command line into `(parameter, value)` pairs with the kernel's own rules
/// (`lib/cmdline.c: next_arg`): parameters are separated by whitespace outside double quotes;
/// a value starting with `"` has that quote and a trailing `"` removed, and so does a parameter
/// that starts with `"` (`"a=b c"`). Quotes elsewhere are kept; there are no escapes.
pub fn split_kernel_cmdline(cmdline: &str) -> Vec<(String, Option<String>)> {
    let mut args = Vec::new();
    let mut rest = cmdline.trim_start();
    while !rest.is_empty() {
        let (quoted, body) = match rest.strip_prefix('"') {
            Some(body) => (true, body),
            None => (false, rest),
        };
        let mut in_quote = quoted;
        let mut end = body.len();
        for (i, c) in body.char_indices() {
            if c.is_ascii_whitespace() && !in_quote {
                end = i;
                break;
            }
            if c == '"' {
                in_quote = !in_quote;
            }
        }
        let token = &body[..end];
        rest = body[end..].trim_start();
        // The kernel removes at most one trailing quote: the value's closing quote if the value
        // was quoted, otherwise the parameter's closing quote if the parameter was.
        match token.split_once('=') {
            None => {
                let param = match quoted {
                    true => token.strip_suffix('"').unwrap_or(token),
                    false => token,
                };
                args.push((param.to_owned(), None));
            }
            Some((param, value)) => {
                let value = match value.strip_prefix('"') {
                    Some(inner) => inner.strip_suffix('"').unwrap_or(inner),
                    None if quoted => value.strip_suffix('"').unwrap_or(value),
                    None => value,
                };
                args.push((param.to_owned(), Some(value.to_owned())));
            }
        }
    }
    args
}

/// The `hawser.*` keys of the kernel command line with their raw values (the last occurrence
/// wins, as for most kernel parameters), plus a warning for each key given more than once.
fn hawser_keys(cmdline: &str) -> (BTreeMap<String, Option<String>>, Vec<String>) {
    let mut keys = BTreeMap::new();
    let mut warnings = Vec::new();
    for (param, value) in split_kernel_cmdline(cmdline) {
        let Some(key) = param.strip_prefix(CMDLINE_PREFIX) else {
            continue;
        };
        if keys.insert(key.to_owned(), value).is_some() {
            warnings.push(format!(
                "kernel command line key {param} is given more than once; the last value is used"
            ));
        }
    }
    (keys, warnings)
}

fn malformed(key: &str, value: Option<&str>, reason: &'static str) -> ConfigError {
    ConfigError::MalformedCmdline {
        key: format!("{CMDLINE_PREFIX}{key}"),
        value: value.unwrap_or_default().to_owned(),
        reason,
    }
}

fn parse_reboot_delay(value: Option<&str>) -> Result<RebootPolicy, ConfigError> {
    const KEY: &str = "reboot_delay";
    let text = value.ok_or_else(|| malformed(KEY, value, "expected whole seconds"))?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(KEY, value, "expected whole seconds"));
    }
    let seconds: u32 = text
        .parse()
        .map_err(|_| malformed(KEY, value, "more seconds than fit in 32 bits"))?;
    Ok(match seconds {
        0 => RebootPolicy::HaltForever,
        s => RebootPolicy::RebootAfter(Duration::from_secs(u64::from(s))),
    })
}

fn parse_log_level(value: Option<&str>) -> Result<LevelFilter, ConfigError> {
    const REASON: &str = "expected one of error, warn, info, debug, trace";
    match value {
        Some("error") => Ok(LevelFilter::ERROR),
        Some("warn") => Ok(LevelFilter::WARN),
        Some("info") => Ok(LevelFilter::INFO),
        Some("debug") => Ok(LevelFilter::DEBUG),
        Some("trace") => Ok(LevelFilter::TRACE),
        _ => Err(malformed("log", value, REASON)),
    }
}

fn parse_tpm_device(value: Option<&str>) -> Result<PathBuf, ConfigError> {
    const REASON: &str = "expected a device path under /dev/, such as /dev/tpmrm0";
    let text = value.ok_or_else(|| malformed("tpm", value, REASON))?;
    let name = text
        .strip_prefix("/dev/")
        .ok_or_else(|| malformed("tpm", value, REASON))?;
    let valid = !name.is_empty()
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.".contains(&b));
    if !valid {
        return Err(malformed("tpm", value, REASON));
    }
    Ok(PathBuf::from(text))
}

fn parse_state_disk(value: Option<&str>) -> Result<DiskSelector, ConfigError> {
    const REASON: &str =
        "expected serial:<serial> (1 to 64 ASCII letters, digits, '-', '_' or '.')";
    value
        .and_then(DiskSelector::parse)
        .ok_or_else(|| malformed("state_disk", value, REASON))
}

fn parse_key_source(value: Option<&str>) -> Result<KeySourceKind, ConfigError> {
    const REASON: &str = "expected one of none, fw_cfg-insecure-dev, join-service";
    value
        .and_then(KeySourceKind::from_cmdline)
        .ok_or_else(|| malformed("state_disk_key_source", value, REASON))
}

fn parse_net(value: Option<&str>) -> Result<Option<NetConfig>, ConfigError> {
    if value == Some("none") {
        return Ok(None);
    }
    value.and_then(NetConfig::parse).map(Some).ok_or_else(|| {
        malformed(
            "net",
            value,
            "expected none or <IPv4 address>/<prefix length>[,<IPv4 gateway>]",
        )
    })
}

fn parse_integrity(value: Option<&str>) -> Result<Integrity, ConfigError> {
    match value {
        Some("none") => Ok(Integrity::None),
        Some("hmac-sha256") => Ok(Integrity::HmacSha256),
        _ => Err(malformed(
            "state_disk_integrity",
            value,
            "expected none or hmac-sha256",
        )),
    }
}

/// `hawser.kubernetes`: a Kubernetes version hawser writes a kubeadm configuration for.
fn parse_kubernetes(value: Option<&str>) -> Result<KubernetesVersion, ConfigError> {
    let version: KubernetesVersion = value.unwrap_or_default().parse().map_err(|_| {
        malformed(
            "kubernetes",
            value,
            "expected a Kubernetes version v<major>.<minor>.<patch>[-<pre-release>], e.g. v1.20.2",
        )
    })?;
    KubeadmApi::for_version(&version).map_err(|source| ConfigError::KubernetesWithoutWriter {
        version: version.to_string(),
        source,
    })?;
    Ok(version)
}

/// A disk without a key source, or a key source without a disk, is a configuration mistake:
/// refusing to boot beats silently ignoring (or guessing) the disk.
fn check_state_disk(
    config: &StateDiskConfig,
    keys: &BTreeMap<String, Option<String>>,
) -> Result<(), ConfigError> {
    let raw = |key: &str| keys.get(key).cloned().flatten();
    match (config.key_source, &config.disk) {
        (KeySourceKind::None, Some(_)) => Err(malformed(
            "state_disk",
            raw("state_disk").as_deref(),
            "a state disk needs hawser.state_disk_key_source (fw_cfg-insecure-dev or join-service)",
        )),
        (KeySourceKind::FwCfgInsecureDev | KeySourceKind::JoinService, None) => Err(malformed(
            "state_disk_key_source",
            raw("state_disk_key_source").as_deref(),
            "a key source needs hawser.state_disk=serial:<serial>",
        )),
        _ => Ok(()),
    }
}

/// The reboot policy of a kernel command line, falling back to the default when
/// `hawser.reboot_delay` is absent or malformed. Used to decide what to do after a fatal
/// configuration error (including a malformed `hawser.reboot_delay` itself).
pub fn reboot_policy_or_default(cmdline: &str) -> RebootPolicy {
    match hawser_keys(cmdline).0.get("reboot_delay") {
        Some(value) => parse_reboot_delay(value.as_deref()).unwrap_or_default(),
        None => RebootPolicy::default(),
    }
}

/// Parses the `hawser.*` keys of a kernel command line (the contents of `/proc/cmdline`).
pub fn parse_kernel_cmdline(cmdline: &str) -> Result<CmdlineConfig, ConfigError> {
    let (keys, mut warnings) = hawser_keys(cmdline);
    let mut config = CmdlineConfig::default();
    for (key, value) in &keys {
        let value = value.as_deref();
        match key.as_str() {
            "reboot_delay" => config.reboot_policy = parse_reboot_delay(value)?,
            "log" => config.log_level = parse_log_level(value)?,
            "tpm" => config.tpm_device = parse_tpm_device(value)?,
            "state_disk" => config.state_disk.disk = Some(parse_state_disk(value)?),
            "state_disk_key_source" => config.state_disk.key_source = parse_key_source(value)?,
            "state_disk_integrity" => config.state_disk.integrity = parse_integrity(value)?,
            "net" => config.net = parse_net(value)?,
            "join_service_trust" => {
                config.join_service_trust = value
                    .and_then(JoinServiceTrust::from_cmdline)
                    .ok_or_else(|| malformed(key, value, "expected attested or insecure-dev"))?;
            }
            "root_hash" => {
                config.root_hash = Some(
                    crate::rootfs::parse_root_hash(value.unwrap_or_default())
                        .map_err(|e| malformed(key, value, e.reason()))?,
                );
            }
            "init_secret_hash" => {
                config.init_secret_hash = Some(
                    parse_init_secret_hash(value.unwrap_or_default().as_bytes())
                        .ok_or_else(|| malformed(key, value, INIT_SECRET_HASH_FORMAT))?,
                );
            }
            "join_endpoint" => {
                config.join_endpoint = Some(
                    value
                        .and_then(JoinEndpoints::parse)
                        .ok_or_else(|| malformed(key, value, JoinEndpoints::SYNTAX))?,
                );
            }
            "kubernetes" => config.kubernetes = Some(parse_kubernetes(value)?),
            "platform" => {
                config.platform = value.and_then(NodePlatform::parse).ok_or_else(|| {
                    malformed(
                        key,
                        value,
                        "expected qemu, gce, azure, azure-snp, azure-tdx, aws, sev-snp or tdx",
                    )
                })?;
            }
            "join_discovery" => {
                config.join_discovery = match value {
                    Some("none") => JoinDiscovery::None,
                    Some("mdns") => JoinDiscovery::Mdns,
                    _ => return Err(malformed(key, value, "expected none or mdns")),
                };
            }
            _ => warnings.push(format!(
                "unknown kernel command line key {CMDLINE_PREFIX}{key} is ignored"
            )),
        }
    }
    check_state_disk(&config.state_disk, &keys)?;
    config.warnings = warnings;
    Ok(config)
}

/// `hawser.join_discovery`: how a node that is given no join endpoint finds the join service.
/// Measured, because it decides what the node listens to; safe, because whatever it finds is
/// attested before the node trusts it (and pinned to the node's cluster after the first join).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JoinDiscovery {
    /// Only configured endpoints (the default).
    #[default]
    None,
    /// Browse for `_hawser-join._tcp` adverts on the LAN (mDNS).
    Mdns,
}

/// The configuration accepted from fw_cfg.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FwCfgConfig {
    /// Qualifying data for the boot quote, chosen by whoever starts the VM (a test harness).
    pub quote_nonce: Option<Vec<u8>>,
    /// The development state disk key (see [`KeySourceKind::FwCfgInsecureDev`]).
    pub state_disk_key: Option<VolumeKey>,
    /// The join services' addresses, tried in turn (unmeasured: the node trusts them only
    /// through aTLS).
    pub join_endpoint: Option<JoinEndpoints>,
    /// `role`: `control-plane` asks the join service for a control-plane join (the cluster's
    /// shared certificates); `worker` (the default) for a worker join. Unmeasured, like a
    /// cloud's instance metadata: the join service decides what an attested node of this
    /// image gets.
    pub control_plane: bool,
    /// `vpn_endpoint`: where the node's WireGuard tunnel is reached on the underlay network
    /// (`ip:port`), when that is not the node's own address (behind NAT, as QEMU's user network
    /// is). Unmeasured: a wrong endpoint only makes the tunnel unreachable, since WireGuard
    /// authenticates every peer by its key.
    pub vpn_endpoint: Option<std::net::SocketAddr>,
    /// `lan_net`: the address (`<IPv4>/<prefix>`) of the node's second NIC, on a LAN between
    /// the nodes (where mDNS finds the join service). Unmeasured, like a cloud's DHCP: the host
    /// owns the network anyway, and every peer on it is attested or authenticated by its key.
    pub lan_net: Option<crate::platform::net::NetConfig>,
    /// Keys present but not allowed, each worth a warning.
    pub warnings: Vec<String>,
}

/// Parses fw_cfg entries (`key` below `opt/hawser/`, raw contents). Keys outside
/// [`FW_CFG_ALLOWED_KEYS`] are ignored with a warning.
pub fn parse_fw_cfg(entries: &BTreeMap<String, Vec<u8>>) -> Result<FwCfgConfig, ConfigError> {
    let mut config = FwCfgConfig::default();
    for (key, raw) in entries {
        if key == "init_secret_hash" {
            config
                .warnings
                .push(INIT_SECRET_HASH_FROM_FW_CFG.to_owned());
            continue;
        }
        if !FW_CFG_ALLOWED_KEYS.contains(&key.as_str()) {
            config.warnings.push(format!(
                "fw_cfg key opt/hawser/{key} is not on the allowlist and is ignored"
            ));
            continue;
        }
        match key.as_str() {
            "state_disk_key" => config.state_disk_key = Some(parse_state_disk_key(raw)?),
            "join_endpoint" => {
                let text = String::from_utf8_lossy(raw);
                let endpoint = JoinEndpoints::parse(text.trim_ascii()).ok_or_else(|| {
                    ConfigError::MalformedFwCfg {
                        key: key.clone(),
                        value: text.clone().into_owned(),
                        reason: JoinEndpoints::SYNTAX,
                    }
                })?;
                config.join_endpoint = Some(endpoint);
            }
            "lan_net" => {
                let text = String::from_utf8_lossy(raw);
                let net = crate::platform::net::NetConfig::parse(text.trim_ascii())
                    .filter(|net| net.gateway.is_none())
                    .ok_or_else(|| ConfigError::MalformedFwCfg {
                        key: key.clone(),
                        value: text.chars().take(80).collect(),
                        reason: "expected <IPv4 address>/<prefix length> (no gateway)",
                    })?;
                config.lan_net = Some(net);
            }
            "vpn_endpoint" => {
                let text = String::from_utf8_lossy(raw);
                let endpoint =
                    text.trim_ascii()
                        .parse()
                        .map_err(|_| ConfigError::MalformedFwCfg {
                            key: key.clone(),
                            value: text.clone().into_owned(),
                            reason: "expected ip:port",
                        })?;
                config.vpn_endpoint = Some(endpoint);
            }
            "role" => {
                let text = String::from_utf8_lossy(raw);
                config.control_plane = match text.trim_ascii() {
                    "control-plane" => true,
                    "worker" => false,
                    _ => {
                        return Err(ConfigError::MalformedFwCfg {
                            key: key.clone(),
                            value: text.into_owned(),
                            reason: "expected control-plane or worker",
                        });
                    }
                };
            }
            _ => config.quote_nonce = Some(parse_nonce(key, raw)?),
        }
    }
    Ok(config)
}

/// Why fw_cfg's `init_secret_hash` is refused: whoever chose it could `hawser init` this node
/// into a cluster of their own, so only the measured command line may name the admin.
pub const INIT_SECRET_HASH_FROM_FW_CFG: &str = "fw_cfg opt/hawser/init_secret_hash is refused \
     and ignored: the init secret hash is taken only from the measured command line \
     (hawser.init_secret_hash=), since whoever sets an unmeasured one could `hawser init` this \
     node into a cluster of their own";

const INIT_SECRET_HASH_FORMAT: &str = "expected 64 hex digits (SHA-256 of the init secret)";

/// A SHA-256 in hex (surrounding whitespace ignored).
fn parse_init_secret_hash(raw: &[u8]) -> Option<[u8; 32]> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(raw.trim_ascii(), &mut hash).ok()?;
    Some(hash)
}

/// Hex key material. The error never repeats the value: it may be (most of) a key.
fn parse_state_disk_key(raw: &[u8]) -> Result<VolumeKey, ConfigError> {
    let malformed = |reason| ConfigError::MalformedFwCfg {
        key: "state_disk_key".to_owned(),
        value: "(not shown: key material)".to_owned(),
        reason,
    };
    let text = std::str::from_utf8(raw)
        .map_err(|_| malformed("expected hex digits"))?
        .trim_ascii();
    let mut key = Zeroizing::new(vec![0u8; text.len() / 2]);
    if text.len() % 2 != 0 || hex::decode_to_slice(text, &mut key).is_err() {
        return Err(malformed("expected an even number of hex digits"));
    }
    if key.is_empty() || key.len() > MAX_STATE_DISK_KEY_LEN {
        return Err(malformed("expected 64 or 96 bytes"));
    }
    Ok(VolumeKey::new(key))
}

fn parse_nonce(key: &str, raw: &[u8]) -> Result<Vec<u8>, ConfigError> {
    let malformed = |reason| ConfigError::MalformedFwCfg {
        key: key.to_owned(),
        value: String::from_utf8_lossy(raw).into_owned(),
        reason,
    };
    let text = std::str::from_utf8(raw)
        .map_err(|_| malformed("expected hex digits"))?
        .trim_ascii();
    let nonce =
        hex::decode(text).map_err(|_| malformed("expected an even number of hex digits"))?;
    if nonce.is_empty() || nonce.len() > MAX_NONCE_LEN {
        return Err(malformed("expected 1 to 64 bytes"));
    }
    Ok(nonce)
}

mod platform;
pub use platform::NodePlatform;
#[cfg(test)]
mod tests;
