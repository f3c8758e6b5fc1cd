//! Key derivation for hawser, compatible with Constellation's.
//!
//! Everything secret in a cluster is derived from one master secret that only the admin (in a
//! 0600 file) and the join service hold. HKDF-SHA256 throughout, with info strings prefixed
//! `key-` as Constellation's `crypto.DeriveKey` callers do:
//!
//! | what | secret | salt | info | length |
//! |---|---|---|---|---|
//! | data key for `id` | master key | master salt | `key-<id>` | as needed |
//! | state-disk key | master key | master salt | `key-<lowercase LUKS2 UUID>` | 64 (AES-XTS-512) or 96 (and HMAC-SHA256 integrity) |
//! | measurement secret | master key | master salt | `key-measurementSecret` | 32 |
//! | cluster ID | measurement secret | measurement salt | `key-clusterID` | 32 |
//!
//! The cluster ID is what PID 1 extends into PCR 15 when it takes the node lock; it is public,
//! the measurement secret is not. Derivations are pure functions, pinned by the test vectors
//! below (RFC 5869 and Constellation's `internal/crypto/testvector`).

use std::path::Path;

use hkdf::Hkdf;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Length of a generated master secret and of its salt.
pub const MASTER_SECRET_LEN: usize = 32;
/// The shortest master secret a user may bring.
pub const MASTER_SECRET_MIN_LEN: usize = 16;
/// AES-XTS with two 256-bit keys: the state-disk key of a disk without integrity.
pub const STATE_DISK_KEY_LEN: usize = 64;
/// AES-XTS-512 then an HMAC-SHA256 key for dm-integrity: the state-disk key of a production disk.
pub const STATE_DISK_INTEGRITY_KEY_LEN: usize = 96;

/// How long a state disk's key is: what its dm-crypt mapping (and dm-integrity, if any) needs.
/// The node's measured `hawser.state_disk_integrity` decides it. HKDF-Expand's output is a prefix
/// stream, so the 96-byte key's first 64 bytes are the 64-byte key: a disk made without
/// integrity keeps its key whichever length a deriver computed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StateDiskKeyLength {
    /// [`STATE_DISK_KEY_LEN`] bytes: AES-XTS-512 only (development images, and every disk
    /// whose node did not say).
    #[default]
    Xts,
    /// [`STATE_DISK_INTEGRITY_KEY_LEN`] bytes: AES-XTS-512 and HMAC-SHA256 (production images).
    XtsHmacSha256,
}

impl StateDiskKeyLength {
    /// The key's length in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            StateDiskKeyLength::Xts => STATE_DISK_KEY_LEN,
            StateDiskKeyLength::XtsHmacSha256 => STATE_DISK_INTEGRITY_KEY_LEN,
        }
    }

    /// The length a node asks for; 0 is a node that does not say (before key lengths were
    /// asked): [`StateDiskKeyLength::Xts`]. Any other length is refused by name.
    pub fn from_requested(bytes: usize) -> Result<Self, KeyError> {
        match bytes {
            0 | STATE_DISK_KEY_LEN => Ok(StateDiskKeyLength::Xts),
            STATE_DISK_INTEGRITY_KEY_LEN => Ok(StateDiskKeyLength::XtsHmacSha256),
            other => Err(KeyError::DiskKeyLength(other)),
        }
    }
}
/// The prefix of every HKDF info string.
pub const INFO_PREFIX: &str = "key-";
/// Length of a cluster's measurement salt (the cluster ID's HKDF salt).
pub const MEASUREMENT_SALT_LEN: usize = 32;

/// Why a key could not be derived or a master secret not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// HKDF cannot produce more than 255 × 32 bytes.
    #[error("cannot derive {0} bytes with HKDF-SHA256 (at most 8160)")]
    TooLong(usize),
    /// A master secret shorter than [`MASTER_SECRET_MIN_LEN`].
    #[error("the master secret is {0} bytes; at least {MASTER_SECRET_MIN_LEN} are required")]
    MasterSecretTooShort(usize),
    /// A state-disk key length no state disk uses.
    #[error(
        "no state disk takes a {0}-byte key ({STATE_DISK_KEY_LEN}: AES-XTS-512; \
         {STATE_DISK_INTEGRITY_KEY_LEN}: AES-XTS-512 with HMAC-SHA256 integrity)"
    )]
    DiskKeyLength(usize),
    /// A disk UUID that is not a canonical UUID.
    #[error("{0:?} is not a UUID (expected 8-4-4-4-12 hex digits)")]
    BadUuid(String),
    /// The master secret file exists; it is never overwritten.
    #[error("{0} already exists; refusing to overwrite a master secret (move it away first)")]
    Exists(String),
    /// The master secret file is not JSON of the expected shape.
    #[error("{path} is not a master secret file")]
    Malformed {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// The master secret file (or the random source) cannot be read or written.
    #[error("cannot {action} {path}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// HKDF-SHA256(secret, salt, info) → `length` bytes.
pub fn derive_key(
    secret: &[u8],
    salt: &[u8],
    info: &[u8],
    length: usize,
) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    let mut out = Zeroizing::new(vec![0u8; length]);
    Hkdf::<Sha256>::new(Some(salt), secret)
        .expand(info, &mut out)
        .map_err(|_| KeyError::TooLong(length))?;
    Ok(out)
}

fn derive_32(secret: &[u8], salt: &[u8], info: &str) -> Zeroizing<[u8; 32]> {
    let mut out = Zeroizing::new([0u8; 32]);
    // 32 bytes is always within HKDF-SHA256's limit.
    let _ = Hkdf::<Sha256>::new(Some(salt), secret).expand(info.as_bytes(), out.as_mut());
    out
}

/// The cluster's root secret: key and salt. Debug output never shows them.
#[derive(Clone, Serialize, Deserialize, Zeroize, ZeroizeOnDrop)]
pub struct MasterSecret {
    #[serde(with = "b64")]
    key: Vec<u8>,
    #[serde(with = "b64")]
    salt: Vec<u8>,
}

impl std::fmt::Debug for MasterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterSecret")
            .field("key", &"<redacted>")
            .field("salt", &"<redacted>")
            .finish()
    }
}

impl MasterSecret {
    /// A master secret from its parts; refuses keys shorter than [`MASTER_SECRET_MIN_LEN`].
    pub fn new(key: Vec<u8>, salt: Vec<u8>) -> Result<Self, KeyError> {
        if key.len() < MASTER_SECRET_MIN_LEN {
            return Err(KeyError::MasterSecretTooShort(key.len()));
        }
        Ok(Self { key, salt })
    }

    /// A fresh master secret from the OS's CSPRNG.
    pub fn generate() -> Result<Self, KeyError> {
        let mut key = vec![0u8; MASTER_SECRET_LEN];
        let mut salt = vec![0u8; MASTER_SECRET_LEN];
        getrandom(&mut key)?;
        getrandom(&mut salt)?;
        Self::new(key, salt)
    }

    /// The secret's key bytes, for handing it to a node over an attested channel (`hawser
    /// init`). Never log them.
    pub fn key_bytes(&self) -> &[u8] {
        &self.key
    }

    /// The secret's salt bytes (as secret as the key).
    pub fn salt_bytes(&self) -> &[u8] {
        &self.salt
    }

    /// The data key for `id`: HKDF(key, salt, `key-<id>`).
    pub fn data_key(&self, id: &str, length: usize) -> Result<Zeroizing<Vec<u8>>, KeyError> {
        derive_key(
            &self.key,
            &self.salt,
            format!("{INFO_PREFIX}{id}").as_bytes(),
            length,
        )
    }

    /// The state-disk key of the disk whose LUKS2 UUID is `disk_uuid` (any case), `length` long.
    pub fn state_disk_key(
        &self,
        disk_uuid: &str,
        length: StateDiskKeyLength,
    ) -> Result<Zeroizing<Vec<u8>>, KeyError> {
        self.data_key(&canonical_uuid(disk_uuid)?, length.bytes())
    }

    /// The admin's credential on the join services' admin API: only the holder of the master
    /// secret can make it. Sent only to a join service that attested as a control plane of the
    /// cluster (which holds the master secret anyway).
    pub fn admin_token(&self) -> Zeroizing<[u8; 32]> {
        derive_32(&self.key, &self.salt, "key-adminToken")
    }

    /// The secret the cluster ID is derived from.
    pub fn measurement_secret(&self) -> Zeroizing<[u8; 32]> {
        derive_32(&self.key, &self.salt, "key-measurementSecret")
    }

    /// Writes the secret as JSON (`{"key": b64, "salt": b64}`) to a new 0600 file; an existing
    /// file is never overwritten.
    pub fn write_new_file(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let io = |source| KeyError::Io {
            action: "write",
            path: path.display().to_string(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => KeyError::Exists(path.display().to_string()),
                _ => io(e),
            })?;
        let json = Zeroizing::new(serde_json::to_vec_pretty(self).unwrap_or_default());
        file.write_all(&json).map_err(io)?;
        file.sync_all().map_err(io)
    }

    /// Reads a master secret file written by [`MasterSecret::write_new_file`].
    pub fn read_file(path: &Path) -> Result<Self, KeyError> {
        let text = Zeroizing::new(std::fs::read(path).map_err(|source| KeyError::Io {
            action: "read",
            path: path.display().to_string(),
            source,
        })?);
        let secret: Self = serde_json::from_slice(&text).map_err(|source| KeyError::Malformed {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(secret.key.clone(), secret.salt.clone())
    }
}

/// The cluster ID: HKDF(measurement secret, measurement salt, `key-clusterID`). Public.
pub fn cluster_id(measurement_secret: &[u8], measurement_salt: &[u8]) -> [u8; 32] {
    *derive_32(measurement_secret, measurement_salt, "key-clusterID")
}

/// A short, non-secret name for a key, for logs and the CLI: the first 8 bytes of
/// SHA-256("hawser key fingerprint" || key), in hex. Never log a key itself.
pub fn fingerprint(key: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"hawser key fingerprint")
        .chain_update(key)
        .finalize();
    hex::encode(&digest[..8])
}

/// Lowercase 8-4-4-4-12 form of a UUID, or an error naming it.
pub fn canonical_uuid(uuid: &str) -> Result<String, KeyError> {
    let lower = uuid.to_ascii_lowercase();
    let groups: Vec<&str> = lower.split('-').collect();
    let shape_ok = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
    if shape_ok {
        Ok(lower)
    } else {
        Err(KeyError::BadUuid(uuid.to_owned()))
    }
}

/// `len` bytes from the operating system's CSPRNG (salts, nonces).
pub fn random_bytes(len: usize) -> Result<Vec<u8>, KeyError> {
    let mut bytes = vec![0u8; len];
    getrandom(&mut bytes)?;
    Ok(bytes)
}

fn getrandom(buf: &mut [u8]) -> Result<(), KeyError> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|source| KeyError::Io {
            action: "read",
            path: "/dev/urandom".into(),
            source,
        })
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = zeroize::Zeroizing::new(String::deserialize(d)?);
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    #[test]
    fn rfc5869_vectors() {
        // A.1
        let okm = derive_key(
            &[0x0b; 22],
            &h("000102030405060708090a0b0c"),
            &h("f0f1f2f3f4f5f6f7f8f9"),
            42,
        )
        .unwrap();
        assert_eq!(
            hex::encode(&*okm),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
        );
        // A.3: empty salt and info.
        let okm = derive_key(&[0x0b; 22], &[], &[], 42).unwrap();
        assert_eq!(
            hex::encode(&*okm),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
        );
        assert!(matches!(
            derive_key(b"k", b"s", b"i", 8161),
            Err(KeyError::TooLong(8161))
        ));
    }

    #[test]
    fn constellation_data_key_vectors() {
        let zero = MasterSecret::new(vec![0; 32], vec![0; 32]).unwrap();
        assert_eq!(
            hex::encode(
                &*zero
                    .data_key("00000000-0000-0000-0000-000000000000", 32)
                    .unwrap()
            ),
            "2b5c829f691bfd4232f8aac464bccc07e605c7c8e82cbca09837e86d0b6d0665"
        );
        let ff = MasterSecret::new(vec![0xff; 32], vec![0xff; 32]).unwrap();
        assert_eq!(
            hex::encode(
                &*ff.data_key("ffffffff-ffff-ffff-ffff-ffffffffffff", 32)
                    .unwrap()
            ),
            "1484aa39d3415e906e07940ff215d8b1eee705d3027dba93306af4abff4f70be"
        );
    }

    #[test]
    fn constellation_cluster_id_and_measurement_secret_vectors() {
        let secret: Vec<u8> = (0x00..0x20).collect();
        let salt: Vec<u8> = (0x20..0x40).collect();
        assert_eq!(
            hex::encode(cluster_id(&secret, &salt)),
            "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6"
        );
        let master = MasterSecret::new((0x40..0x60).collect(), (0x60..0x80).collect()).unwrap();
        assert_eq!(
            hex::encode(*master.measurement_secret()),
            "4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213"
        );
    }

    #[test]
    fn state_disk_key_is_the_64_byte_data_key_of_the_lowercase_uuid() {
        let master = MasterSecret::new(vec![7; 32], vec![9; 32]).unwrap();
        let upper = master
            .state_disk_key(
                "0A1B2C3D-0000-4000-8000-00000000ABCD",
                StateDiskKeyLength::Xts,
            )
            .unwrap();
        let lower = master
            .state_disk_key(
                "0a1b2c3d-0000-4000-8000-00000000abcd",
                StateDiskKeyLength::Xts,
            )
            .unwrap();
        assert_eq!(upper.len(), 64);
        assert_eq!(*upper, *lower);
        let data = master
            .data_key("0a1b2c3d-0000-4000-8000-00000000abcd", 64)
            .unwrap();
        assert_eq!(&upper[..], &data[..]);
        // The first 32 bytes equal the 32-byte derivation: HKDF output is a prefix stream.
        let short = master
            .data_key("0a1b2c3d-0000-4000-8000-00000000abcd", 32)
            .unwrap();
        assert_eq!(&upper[..32], &short[..]);
        assert!(matches!(
            master.state_disk_key("not-a-uuid", StateDiskKeyLength::Xts),
            Err(KeyError::BadUuid(_))
        ));
        assert!(matches!(
            master.state_disk_key(
                "0a1b2c3d-0000-4000-8000-00000000abcz",
                StateDiskKeyLength::XtsHmacSha256
            ),
            Err(KeyError::BadUuid(_))
        ));
    }

    #[test]
    fn an_integrity_disks_key_is_96_bytes_and_begins_with_the_xts_key() {
        let master = MasterSecret::new(vec![7; 32], vec![9; 32]).unwrap();
        let uuid = "0a1b2c3d-0000-4000-8000-00000000abcd";
        let xts = master
            .state_disk_key(uuid, StateDiskKeyLength::Xts)
            .unwrap();
        let integrity = master
            .state_disk_key(uuid, StateDiskKeyLength::XtsHmacSha256)
            .unwrap();
        assert_eq!(integrity.len(), 96);
        // Every disk made before lengths were asked keeps its key.
        assert_eq!(&integrity[..64], &xts[..]);
        assert_eq!(&integrity[..], &master.data_key(uuid, 96).unwrap()[..]);
        assert_eq!(
            StateDiskKeyLength::from_requested(0).unwrap(),
            StateDiskKeyLength::Xts
        );
        assert_eq!(
            StateDiskKeyLength::from_requested(96).unwrap(),
            StateDiskKeyLength::XtsHmacSha256
        );
        for bad in [1, 32, 63, 65, 128, 8160] {
            let err = StateDiskKeyLength::from_requested(bad).unwrap_err();
            assert!(
                err.to_string().contains(&format!("{bad}-byte key")),
                "{err}"
            );
        }
    }

    #[test]
    fn master_secret_file_is_0600_never_overwritten_and_never_debug_printed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master-secret.json");
        let secret = MasterSecret::generate().unwrap();
        secret.write_new_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = MasterSecret::read_file(&path).unwrap();
        assert_eq!(*again.measurement_secret(), *secret.measurement_secret());
        let err = MasterSecret::generate()
            .unwrap()
            .write_new_file(&path)
            .unwrap_err();
        assert!(matches!(err, KeyError::Exists(_)), "{err}");
        assert_eq!(
            *MasterSecret::read_file(&path).unwrap().measurement_secret(),
            *secret.measurement_secret()
        );
        let debug = format!("{secret:?}");
        assert!(debug.contains("redacted"));
        assert!(!debug.contains(&base64::engine::general_purpose::STANDARD.encode(&secret.key)));
        std::fs::write(&path, b"{\"key\": 1}").unwrap();
        assert!(matches!(
            MasterSecret::read_file(&path),
            Err(KeyError::Malformed { .. })
        ));
        assert!(matches!(
            MasterSecret::new(vec![1; 15], vec![]),
            Err(KeyError::MasterSecretTooShort(15))
        ));
    }

    #[test]
    fn fingerprints_identify_without_revealing() {
        let a = fingerprint(&[1; 64]);
        assert_eq!(a.len(), 16);
        assert_ne!(a, fingerprint(&[2; 64]));
        assert_eq!(a, fingerprint(&[1; 64]));
    }
}
