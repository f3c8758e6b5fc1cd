//! The state disk's tests: the wipe, and which key source is chosen (or refused) for which
//! configuration.

use super::*;

#[tokio::test]
async fn wiping_zeroes_the_whole_device() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let size = 2 * WIPE_CHUNK + 4096;
    std::fs::write(file.path(), vec![0xa5u8; size]).unwrap();
    let platform = LinuxPlatform {
        disk: BlockDevice {
            name: "test".into(),
            serial: None,
            devnum: dm::DevNum { major: 0, minor: 0 },
            size: size as u64,
            read_only: false,
        },
        registry: ChildRegistry::new(),
        mounts: SharedMountTable::default(),
        runtime: tokio::runtime::Handle::current(),
    };
    assert_eq!(platform.wipe(file.path()).unwrap(), size as u64);
    let bytes = std::fs::read(file.path()).unwrap();
    assert_eq!(bytes.len(), size);
    assert!(bytes.iter().all(|&b| b == 0));
}

/// [`choose_key`] with no race, collecting the warnings.
fn choose(
    config: &StateDiskConfig,
    fw_cfg_key: Option<VolumeKey>,
    warnings: &mut Vec<String>,
) -> Result<KeyChoice<()>, DiskError> {
    choose_key(config, fw_cfg_key, None, |warning| warnings.push(warning))
}

#[test]
fn the_none_key_source_touches_nothing() {
    let mut warnings = Vec::new();
    let choice = choose(&StateDiskConfig::default(), None, &mut warnings).unwrap();
    assert!(matches!(choice, KeyChoice::None));
    assert!(warnings.is_empty());
}

#[test]
fn a_fw_cfg_key_without_the_dev_source_is_ignored_with_a_warning() {
    let mut warnings = Vec::new();
    let key = VolumeKey::new(zeroize::Zeroizing::new(vec![1; 64]));
    let choice = choose(&StateDiskConfig::default(), Some(key), &mut warnings).unwrap();
    assert!(matches!(choice, KeyChoice::None));
    assert_eq!(
        warnings,
        ["fw_cfg opt/hawser/state_disk_key is ignored: hawser.state_disk_key_source is none"]
    );
}

#[test]
fn the_join_service_source_without_a_client_is_a_clear_error() {
    let config = StateDiskConfig {
        key_source: KeySourceKind::JoinService,
        disk: DiskSelector::parse("serial:x"),
        integrity: Integrity::None,
    };
    let err = choose(&config, None, &mut Vec::new()).unwrap_err();
    assert_eq!(
        crate::platform::error_chain(&err),
        "state disk: the join service gave no key: no join client was started"
    );
    let choice = choose_key(&config, None, Some("race"), |_| {}).unwrap();
    assert!(matches!(choice, KeyChoice::Cluster("race")));
}

#[test]
fn the_dev_source_warns_and_needs_its_fw_cfg_key() {
    let config = StateDiskConfig {
        key_source: KeySourceKind::FwCfgInsecureDev,
        disk: DiskSelector::parse("serial:x"),
        integrity: Integrity::None,
    };
    let mut warnings = Vec::new();
    let err = choose(&config, None, &mut warnings).unwrap_err();
    assert_eq!(warnings, [INSECURE_KEY_WARNING]);
    assert!(
        crate::platform::error_chain(&err).contains("fw_cfg has no opt/hawser/state_disk_key"),
        "{err}"
    );
}
