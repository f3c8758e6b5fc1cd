//! Volume keys: where the state disk's key comes from, and how it stays out of logs and memory.
//!
//! The key is the LUKS2 *volume* key (no keyslot, no passphrase): 64 bytes for aes-xts-plain64,
//! 96 with HMAC-SHA256 integrity (XTS key, then HMAC key, the order dm-crypt's `authenc` keys
//! take). In the product it is the data key the join service derives for the disk's LUKS2 UUID
//! ([`crate::enrollment::race::Enrollment`], or the admin's `hawser init`); the development source reads it from fw_cfg, which
//! the host controls — see [`KeySourceKind`].
//!
//! [`VolumeKey`] zeroizes its bytes when dropped and its `Debug` shows only the length.

use std::fmt;

use zeroize::Zeroizing;

/// Key material, wiped on drop, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeKey(Zeroizing<Vec<u8>>);

impl VolumeKey {
    pub fn new(bytes: Zeroizing<Vec<u8>>) -> Self {
        VolumeKey(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VolumeKey(<redacted, {} bytes>)", self.0.len())
    }
}

/// Where PID 1 gets the state disk's key: the measured `hawser.state_disk_key_source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeySourceKind {
    /// No state disk handling at all (the default: an image without `hawser.state_disk_key_source`).
    #[default]
    None,
    /// DEVELOPMENT ONLY: the hex key in fw_cfg `opt/hawser/state_disk_key`. The host chooses
    /// and knows it, so the disk is encrypted against nobody; PID 1 warns on every boot, and
    /// the choice is on the measured command line, so a verifier sees it.
    FwCfgInsecureDev,
    /// The product: the data key from the join service over aTLS ([`crate::enrollment`]).
    JoinService,
}

impl KeySourceKind {
    /// The value on the kernel command line.
    pub fn cmdline_name(self) -> &'static str {
        match self {
            KeySourceKind::None => "none",
            KeySourceKind::FwCfgInsecureDev => "fw_cfg-insecure-dev",
            KeySourceKind::JoinService => "join-service",
        }
    }

    /// Parses a command line value.
    pub fn from_cmdline(value: &str) -> Option<Self> {
        [
            KeySourceKind::None,
            KeySourceKind::FwCfgInsecureDev,
            KeySourceKind::JoinService,
        ]
        .into_iter()
        .find(|kind| kind.cmdline_name() == value)
    }
}

/// Why no key could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The development source is configured and fw_cfg has no key.
    #[error(
        "hawser.state_disk_key_source=fw_cfg-insecure-dev, but fw_cfg has no opt/hawser/state_disk_key"
    )]
    MissingFwCfgKey,
    /// The key has the wrong length for the measured integrity mode.
    #[error(
        "the key from {source_name} has {found} bytes; the state disk needs {expected} ({mode})"
    )]
    Length {
        source_name: &'static str,
        found: usize,
        expected: usize,
        mode: &'static str,
    },
    /// The join-service source is configured but no race was set up.
    #[error("the join service gave no key: no join client was started")]
    NoEnrollment,
}

/// What the disk code is about to do with the key: format a new disk (a node joining for the
/// first time) or open an initialized one (a node rejoining after a reboot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskStatus {
    New,
    Initialized,
}

/// Gives the volume key of a disk, identified by its LUKS2 UUID.
pub trait KeySource {
    /// The key for the disk with this (lowercase) LUKS2 UUID, exactly `len` bytes.
    fn volume_key(
        &self,
        luks_uuid: &str,
        len: usize,
        status: DiskStatus,
    ) -> Result<VolumeKey, KeyError>;
}

/// One key for every disk: the fw_cfg development source.
#[derive(Debug, Clone)]
pub struct FixedKey {
    key: VolumeKey,
    source_name: &'static str,
}

impl FixedKey {
    pub fn new(key: VolumeKey, source_name: &'static str) -> Self {
        FixedKey { key, source_name }
    }
}

impl KeySource for FixedKey {
    fn volume_key(
        &self,
        _luks_uuid: &str,
        len: usize,
        _status: DiskStatus,
    ) -> Result<VolumeKey, KeyError> {
        if self.key.len() != len {
            return Err(KeyError::Length {
                source_name: self.source_name,
                found: self.key.len(),
                expected: len,
                mode: if len == hawser_luks2::XTS_KEY_LEN {
                    "aes-xts-plain64, 512-bit key"
                } else {
                    "aes-xts-plain64 with HMAC-SHA256 integrity: 512-bit XTS key + 256-bit HMAC key"
                },
            });
        }
        Ok(self.key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_key_bytes() {
        let key = VolumeKey::new(Zeroizing::new(vec![0xab; 64]));
        let text = format!("{key:?} {:?}", FixedKey::new(key.clone(), "fw_cfg"));
        assert!(
            !text.contains("171") && !text.to_lowercase().contains("ab,"),
            "{text}"
        );
        assert!(text.contains("<redacted, 64 bytes>"), "{text}");
    }

    #[test]
    fn a_fixed_key_of_the_wrong_length_is_refused_with_both_lengths() {
        let source = FixedKey::new(VolumeKey::new(Zeroizing::new(vec![1; 32])), "fw_cfg");
        let err = source.volume_key("x", 64, DiskStatus::New).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the key from fw_cfg has 32 bytes; the state disk needs 64 (aes-xts-plain64, 512-bit key)"
        );
        assert_eq!(
            source
                .volume_key("x", 32, DiskStatus::Initialized)
                .unwrap()
                .len(),
            32
        );
    }

    #[test]
    fn key_source_names_round_trip() {
        for kind in [
            KeySourceKind::None,
            KeySourceKind::FwCfgInsecureDev,
            KeySourceKind::JoinService,
        ] {
            assert_eq!(KeySourceKind::from_cmdline(kind.cmdline_name()), Some(kind));
        }
        assert_eq!(KeySourceKind::from_cmdline("fw_cfg"), None);
    }
}
