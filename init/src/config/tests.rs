//! The configuration's tests: the kernel's command-line splitting, defaults, every known key,
//! the keys checked together, and what fw_cfg may and may not set.

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
fn the_image_kubernetes_version_is_read_and_one_without_a_kubeadm_writer_refused() {
    assert_eq!(parse_kernel_cmdline("quiet").unwrap().kubernetes, None);
    for version in ["v1.20.2", "v1.33.4"] {
        let config = parse_kernel_cmdline(&format!("hawser.kubernetes={version}")).unwrap();
        assert_eq!(config.kubernetes.unwrap().as_str(), version);
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }
    let err = parse_kernel_cmdline("hawser.kubernetes=v1.25.0").unwrap_err();
    assert!(
        matches!(err, ConfigError::KubernetesWithoutWriter { .. }),
        "{err:?}"
    );
    let chain = crate::platform::error_chain(&err);
    assert!(
        chain.starts_with("kernel command line key hawser.kubernetes=v1.25.0: ")
            && chain.contains("hawser writes no kubeadm configuration for Kubernetes v1.25.0"),
        "{chain}"
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
        ("hawser.kubernetes=1.20.2", "hawser.kubernetes", "1.20.2"),
        ("hawser.kubernetes=stable", "hawser.kubernetes", "stable"),
        ("hawser.kubernetes", "hawser.kubernetes", ""),
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
