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

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(cmdline: &str) -> Vec<(String, Option<String>)> {
        split_kernel_cmdline(cmdline)
    }

    fn p(param: &str, value: Option<&str>) -> (String, Option<String>) {
        (param.to_owned(), value.map(str::to_owned))
    }

    #[test]
    fn splits_like_the_kernel() {
        assert_eq!(
            pairs("console=ttyS0 quiet  ro\n"),
            [p("console", Some("ttyS0")), p("quiet", None), p("ro", None)]
        );
        // A quoted value keeps its spaces and loses its quotes.
        assert_eq!(pairs(r#"a="b c" d"#), [p("a", Some("b c")), p("d", None)]);
        // A quoted parameter loses both quotes.
        assert_eq!(pairs(r#""a=b c" d"#), [p("a", Some("b c")), p("d", None)]);
        // Quotes in the middle are kept, and still protect spaces.
        assert_eq!(pairs(r#"a=b"c d""#), [p("a", Some(r#"b"c d""#))]);
        // Empty value and the init separator.
        assert_eq!(pairs("a= --"), [p("a", Some("")), p("--", None)]);
        // Only the first '=' splits.
        assert_eq!(pairs("root=PARTUUID=x"), [p("root", Some("PARTUUID=x"))]);
        assert_eq!(pairs("   "), []);
    }

    #[test]
    fn unclosed_quote_runs_to_the_end() {
        assert_eq!(pairs(r#"a="b c"#), [p("a", Some("b c"))]);
    }

    #[test]
    fn defaults_without_hawser_keys() {
        let config = parse_kernel_cmdline("console=ttyS0 quiet").unwrap();
        assert_eq!(config, CmdlineConfig::default());
        assert_eq!(
            config.reboot_policy,
            RebootPolicy::RebootAfter(Duration::from_secs(30))
        );
        assert_eq!(config.tpm_device, PathBuf::from("/dev/tpmrm0"));
        assert_eq!(config.log_level, LevelFilter::INFO);
    }

    #[test]
    fn reads_all_known_keys() {
        let config = parse_kernel_cmdline(
            "console=ttyS0 hawser.reboot_delay=5 hawser.log=debug hawser.tpm=/dev/tpm0",
        )
        .unwrap();
        assert_eq!(
            config.reboot_policy,
            RebootPolicy::RebootAfter(Duration::from_secs(5))
        );
        assert_eq!(config.log_level, LevelFilter::DEBUG);
        assert_eq!(config.tpm_device, PathBuf::from("/dev/tpm0"));
        assert!(config.warnings.is_empty());
    }

    #[test]
    fn state_disk_keys_are_read_and_checked_together() {
        let config = parse_kernel_cmdline(
            "hawser.state_disk=serial:hawser-state hawser.state_disk_key_source=fw_cfg-insecure-dev \
             hawser.state_disk_integrity=hmac-sha256",
        )
        .unwrap();
        assert_eq!(
            config.state_disk,
            StateDiskConfig {
                key_source: KeySourceKind::FwCfgInsecureDev,
                disk: Some(DiskSelector::Serial("hawser-state".into())),
                integrity: Integrity::HmacSha256,
            }
        );
        assert!(config.warnings.is_empty());
        assert_eq!(
            parse_kernel_cmdline("console=ttyS0").unwrap().state_disk,
            StateDiskConfig::default()
        );
        for (cmdline, key, reason) in [
            (
                "hawser.state_disk=serial:x",
                "hawser.state_disk",
                "needs hawser.state_disk_key_source",
            ),
            (
                "hawser.state_disk_key_source=join-service",
                "hawser.state_disk_key_source",
                "needs hawser.state_disk=serial",
            ),
            (
                "hawser.state_disk=/dev/vdb",
                "hawser.state_disk",
                "expected serial:",
            ),
            (
                "hawser.state_disk_key_source=tpm",
                "hawser.state_disk_key_source",
                "expected one of",
            ),
            (
                "hawser.state_disk_integrity=aead",
                "hawser.state_disk_integrity",
                "expected none",
            ),
        ] {
            let err = parse_kernel_cmdline(cmdline).unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains(reason),
                "{cmdline}: {err}"
            );
        }
    }

    #[test]
    fn the_init_secret_hash_comes_from_the_measured_cmdline_only() {
        let hash = "ab".repeat(32);
        let config = parse_kernel_cmdline(&format!("hawser.init_secret_hash={hash}")).unwrap();
        assert_eq!(config.init_secret_hash, Some([0xab; 32]));
        for bad in ["ab", "zz".repeat(32).as_str(), ""] {
            let err = parse_kernel_cmdline(&format!("hawser.init_secret_hash={bad}")).unwrap_err();
            assert!(err.to_string().contains("64 hex digits"), "{err}");
        }
        // The host's fw_cfg cannot name the admin: refused by name, whatever its value.
        for value in [format!("{hash}\n"), "not hex".to_owned()] {
            let config = parse_fw_cfg(&fw(&[("init_secret_hash", value.as_bytes())])).unwrap();
            assert_eq!(config.warnings, [INIT_SECRET_HASH_FROM_FW_CFG]);
            assert_eq!(
                config,
                FwCfgConfig {
                    warnings: vec![INIT_SECRET_HASH_FROM_FW_CFG.to_owned()],
                    ..FwCfgConfig::default()
                }
            );
        }
        assert!(!FW_CFG_ALLOWED_KEYS.contains(&"init_secret_hash"));
    }

    #[test]
    fn the_fw_cfg_state_disk_key_is_hex_and_never_echoed() {
        let hex_key = "a5".repeat(64);
        let config = parse_fw_cfg(&fw(&[(
            "state_disk_key",
            format!("{hex_key}\n").as_bytes(),
        )]))
        .unwrap();
        assert_eq!(config.state_disk_key.unwrap().as_bytes(), [0xa5; 64]);
        for raw in ["a5".repeat(97), "a5x".into(), "a5a".into(), String::new()] {
            let err = parse_fw_cfg(&fw(&[("state_disk_key", raw.as_bytes())])).unwrap_err();
            let message = err.to_string();
            assert!(message.contains("not shown: key material"), "{message}");
            assert!(raw.is_empty() || !message.contains(&raw), "{message}");
        }
    }

    #[test]
    fn zero_delay_halts() {
        let config = parse_kernel_cmdline("hawser.reboot_delay=0").unwrap();
        assert_eq!(config.reboot_policy, RebootPolicy::HaltForever);
    }

    #[test]
    fn quoted_values_are_unquoted() {
        let config = parse_kernel_cmdline(r#"hawser.log="warn""#).unwrap();
        assert_eq!(config.log_level, LevelFilter::WARN);
    }

    #[test]
    fn unknown_and_repeated_keys_warn() {
        let config =
            parse_kernel_cmdline("hawser.colour=blue hawser.log=warn hawser.log=error").unwrap();
        assert_eq!(config.log_level, LevelFilter::ERROR);
        assert_eq!(
            config.warnings,
            [
                "kernel command line key hawser.log is given more than once; the last value is used",
                "unknown kernel command line key hawser.colour is ignored",
            ]
        );
    }

    #[test]
    fn malformed_values_are_errors_naming_key_and_value() {
        for (cmdline, key, value) in [
            ("hawser.reboot_delay=soon", "hawser.reboot_delay", "soon"),
            ("hawser.reboot_delay=-1", "hawser.reboot_delay", "-1"),
            ("hawser.reboot_delay=", "hawser.reboot_delay", ""),
            ("hawser.reboot_delay", "hawser.reboot_delay", ""),
            (
                "hawser.reboot_delay=99999999999",
                "hawser.reboot_delay",
                "99999999999",
            ),
            ("hawser.log=loud", "hawser.log", "loud"),
            ("hawser.log=INFO", "hawser.log", "INFO"),
            ("hawser.tpm=tpmrm0", "hawser.tpm", "tpmrm0"),
            (
                "hawser.tpm=/dev/../etc/shadow",
                "hawser.tpm",
                "/dev/../etc/shadow",
            ),
            ("hawser.tpm=/dev/", "hawser.tpm", "/dev/"),
        ] {
            let err = parse_kernel_cmdline(cmdline).unwrap_err();
            let ConfigError::MalformedCmdline {
                key: k, value: v, ..
            } = &err
            else {
                panic!("{cmdline}: unexpected {err:?}");
            };
            assert_eq!((k.as_str(), v.as_str()), (key, value), "{cmdline}");
            let message = err.to_string();
            assert!(
                message.contains(key) && message.contains(&format!("{value:?}")),
                "{message}"
            );
        }
    }

    #[test]
    fn reboot_policy_survives_other_malformed_keys_and_defaults_when_itself_malformed() {
        assert_eq!(
            reboot_policy_or_default("hawser.reboot_delay=7 hawser.log=loud"),
            RebootPolicy::RebootAfter(Duration::from_secs(7))
        );
        assert_eq!(
            reboot_policy_or_default("hawser.reboot_delay=soon"),
            RebootPolicy::default()
        );
        assert_eq!(
            reboot_policy_or_default("hawser.reboot_delay=0"),
            RebootPolicy::HaltForever
        );
    }

    #[test]
    fn join_keys_are_read_and_malformed_ones_refused() {
        let config = parse_kernel_cmdline(
            "hawser.net=10.0.2.15/24,10.0.2.2 hawser.join_service_trust=insecure-dev \
             hawser.join_endpoint=10.0.2.100:7000",
        )
        .unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        let net = config.net.unwrap();
        assert_eq!(net.address.to_string(), "10.0.2.15");
        assert_eq!(net.prefix_len, 24);
        assert_eq!(
            net.gateway.map(|g| g.to_string()).as_deref(),
            Some("10.0.2.2")
        );
        assert_eq!(config.join_service_trust, JoinServiceTrust::InsecureDev);
        assert_eq!(config.join_endpoint.unwrap().to_string(), "10.0.2.100:7000");
        let hash = "ab".repeat(32);
        let config = parse_kernel_cmdline(&format!("hawser.root_hash={hash}")).unwrap();
        assert_eq!(config.root_hash.unwrap().as_bytes(), &[0xab; 32]);

        let defaults = parse_kernel_cmdline("").unwrap();
        assert_eq!(defaults.join_service_trust, JoinServiceTrust::Attested);
        assert_eq!(defaults.net, None);

        for (cmdline, key) in [
            ("hawser.net=10.0.2.15", "hawser.net"),
            ("hawser.net=10.0.2.15/33", "hawser.net"),
            ("hawser.join_service_trust=yes", "hawser.join_service_trust"),
            ("hawser.join_endpoint=10.0.2.100", "hawser.join_endpoint"),
            ("hawser.join_endpoint=:7000", "hawser.join_endpoint"),
            ("hawser.root_hash=abc", "hawser.root_hash"),
            ("hawser.root_hash", "hawser.root_hash"),
        ] {
            let err = parse_kernel_cmdline(cmdline).unwrap_err().to_string();
            assert!(err.contains(key), "{cmdline}: {err}");
        }
    }

    #[test]
    fn fw_cfg_role_is_control_plane_or_worker() {
        assert!(
            parse_fw_cfg(&fw(&[("role", b"control-plane\n")]))
                .unwrap()
                .control_plane
        );
        assert!(
            !parse_fw_cfg(&fw(&[("role", b"worker")]))
                .unwrap()
                .control_plane
        );
        assert!(!parse_fw_cfg(&fw(&[])).unwrap().control_plane);
        let err = parse_fw_cfg(&fw(&[("role", b"master")])).unwrap_err();
        assert!(
            err.to_string().contains("expected control-plane or worker"),
            "{err}"
        );
    }

    #[test]
    fn join_discovery_and_the_lan_address_are_parsed() {
        let config = parse_kernel_cmdline("hawser.join_discovery=mdns").unwrap();
        assert_eq!(config.join_discovery, JoinDiscovery::Mdns);
        assert_eq!(
            parse_kernel_cmdline("").unwrap().join_discovery,
            JoinDiscovery::None
        );
        let err = parse_kernel_cmdline("hawser.join_discovery=dns").unwrap_err();
        assert!(err.to_string().contains("expected none or mdns"), "{err}");
        let lan = parse_fw_cfg(&fw(&[("lan_net", b"192.168.76.12/24\n")]))
            .unwrap()
            .lan_net
            .unwrap();
        assert_eq!(lan.address, std::net::Ipv4Addr::new(192, 168, 76, 12));
        assert_eq!(lan.prefix_len, 24);
        for bad in [
            &b"192.168.76.12"[..],
            b"192.168.76.12/24,192.168.76.1",
            b"x/24",
        ] {
            let err = parse_fw_cfg(&fw(&[("lan_net", bad)])).unwrap_err();
            assert!(err.to_string().contains("opt/hawser/lan_net"), "{err}");
        }
    }

    #[test]
    fn fw_cfg_join_endpoint_is_parsed() {
        let config = parse_fw_cfg(&fw(&[("join_endpoint", b"10.0.2.100:7000\n")])).unwrap();
        assert_eq!(config.join_endpoint.unwrap().to_string(), "10.0.2.100:7000");
        assert!(parse_fw_cfg(&fw(&[("join_endpoint", b"nope")])).is_err());
    }

    #[test]
    fn fw_cfg_vpn_endpoint_is_ip_and_port() {
        let config = parse_fw_cfg(&fw(&[("vpn_endpoint", b"10.0.2.2:51900\n")])).unwrap();
        assert_eq!(config.vpn_endpoint.unwrap().to_string(), "10.0.2.2:51900");
        let error = parse_fw_cfg(&fw(&[("vpn_endpoint", b"10.0.2.2")])).unwrap_err();
        assert!(error.to_string().contains("ip:port"), "{error}");
    }

    fn fw(entries: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
            .collect()
    }

    #[test]
    fn fw_cfg_nonce_is_hex_with_optional_newline() {
        let config = parse_fw_cfg(&fw(&[("quote_nonce", b"00ff10\n")])).unwrap();
        assert_eq!(config.quote_nonce, Some(vec![0x00, 0xff, 0x10]));
        assert!(config.warnings.is_empty());
        assert_eq!(parse_fw_cfg(&fw(&[])).unwrap(), FwCfgConfig::default());
    }

    #[test]
    fn fw_cfg_keys_outside_the_allowlist_are_ignored_with_a_warning() {
        let config = parse_fw_cfg(&fw(&[("reboot_delay", b"0"), ("quote_nonce", b"ab")])).unwrap();
        assert_eq!(config.quote_nonce, Some(vec![0xab]));
        assert_eq!(
            config.warnings,
            ["fw_cfg key opt/hawser/reboot_delay is not on the allowlist and is ignored"]
        );
    }

    #[test]
    fn fw_cfg_malformed_nonces_are_errors() {
        let long = "ab".repeat(MAX_NONCE_LEN + 1);
        for raw in [&b"xyz"[..], b"abc", b"", b"\xff\xfe", long.as_bytes()] {
            let err = parse_fw_cfg(&fw(&[("quote_nonce", raw)])).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("fw_cfg key opt/hawser/quote_nonce has malformed value"),
                "{err}"
            );
        }
        let max = "cd".repeat(MAX_NONCE_LEN);
        let config = parse_fw_cfg(&fw(&[("quote_nonce", max.as_bytes())])).unwrap();
        assert_eq!(config.quote_nonce.map(|n| n.len()), Some(MAX_NONCE_LEN));
    }
}
