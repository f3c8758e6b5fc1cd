//! The dm-verity side of the rootfs: the superblock `veritysetup format` writes, the hash tree's
//! geometry, a check of the tree's top block against the root hash, and the table line.
//!
//! The superblock is read from the (untrusted) verity partition; it is parsed strictly and only
//! the one layout hawser's image builder produces is accepted (version 1, sha256, 4096-byte data
//! and hash blocks, hash tree right after the superblock). Anything else is refused with the
//! field and the value, never adapted to.
//!
//! Before the table is loaded, the top block of the hash tree is hashed and compared with the
//! root hash from the measured command line. dm-verity would catch a mismatch too, but only at
//! the first read, as a verification failure — with `panic_on_corruption`, as a kernel panic
//! with no word about which disk or which hash. The check turns "wrong disk" or "stale verity
//! partition" into an error that names both hashes.
//!
//! ## Corruption handling
//!
//! The table carries `panic_on_corruption panic_on_error`. A verity failure must stop the node
//! at whatever read it happens, by whatever process: with the default (EIO to the reader) a
//! containerd or kubelet that reads a tampered block sees an I/O error and may carry on in an
//! unexpected state, and PID 1 never hears of it. `restart_on_corruption` reboots immediately
//! into the same corrupted disk — a reboot loop that hides the reason (the kernel documentation
//! warns that it "requires user space support to avoid restart loops"). A panic prints the
//! reason on the console and then follows the kernel's measured `panic=` setting (halt by
//! default, reboot after N seconds with `panic=N`), which is the same policy a hawser fatal
//! error follows. `panic_on_error` (Linux 6.12) extends this to I/O errors of the underlying
//! disk, which the host controls: otherwise a host could make chosen blocks fail to read (the
//! "write uncorrectable" trick that led to these options) and steer the node through error
//! paths. `check_at_most_once` is deliberately absent: the host could change a block after
//! its first verification.

use sha2::{Digest as _, Sha256};

use super::RootHash;
/// A `major:minor` block device number, as table lines name devices.
pub use crate::disk::dm::DevNum;

/// `"verity\0\0"`.
pub const SUPERBLOCK_SIGNATURE: &[u8; 8] = b"verity\0\0";
/// The on-disk superblock (cryptsetup's `struct verity_sb`).
pub const SUPERBLOCK_SIZE: usize = 512;
/// The only accepted data and hash block size.
pub const BLOCK_SIZE: u32 = 4096;
/// The only accepted hash algorithm.
pub const HASH_ALGORITHM: &str = "sha256";
/// The hash tree starts in the hash block after the superblock.
pub const HASH_START_BLOCK: u64 = 1;
/// The options hawser loads the table with (see the module documentation).
pub const TABLE_OPTIONS: [&str; 2] = ["panic_on_corruption", "panic_on_error"];
/// Longest salt the superblock can hold.
pub const MAX_SALT_LEN: usize = 256;

const DIGEST_LEN: u64 = 32;
const SECTOR: u64 = 512;

/// Why a verity superblock or hash tree is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerityError {
    #[error("no verity superblock (signature {found:?}, expected \"verity\\0\\0\")")]
    Signature { found: String },
    #[error("verity superblock field {field} is {actual}, expected {expected}")]
    Field {
        field: &'static str,
        actual: String,
        expected: String,
    },
    #[error(
        "verity hash tree root is {actual}, but the kernel command line's hawser.root_hash is \
         {expected}"
    )]
    RootHashMismatch { expected: String, actual: String },
}

/// The verity superblock's parameters, as hawser accepts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VeritySuperblock {
    /// The superblock's UUID (`veritysetup format --uuid`).
    pub uuid: [u8; 16],
    /// Data blocks of 4096 bytes covered by the tree.
    pub data_blocks: u64,
    pub salt: Vec<u8>,
}

fn field(field: &'static str, actual: impl std::fmt::Display, expected: &str) -> VerityError {
    VerityError::Field {
        field,
        actual: actual.to_string(),
        expected: expected.to_owned(),
    }
}

fn le_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(field)
}

impl VeritySuperblock {
    /// Parses the first [`SUPERBLOCK_SIZE`] bytes of the verity partition.
    pub fn parse(bytes: &[u8]) -> Result<VeritySuperblock, VerityError> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(field(
                "length",
                bytes.len(),
                &format!("{SUPERBLOCK_SIZE} bytes"),
            ));
        }
        let sb = &bytes[..SUPERBLOCK_SIZE];
        if &sb[0..8] != SUPERBLOCK_SIGNATURE {
            return Err(VerityError::Signature {
                found: String::from_utf8_lossy(&sb[0..8]).into_owned(),
            });
        }
        let version = le_u32(sb, 8);
        if version != 1 {
            return Err(field("version", version, "1"));
        }
        let hash_type = le_u32(sb, 12);
        if hash_type != 1 {
            return Err(field(
                "hash type",
                hash_type,
                "1 (the normal format; 0 is Chrome OS's)",
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&sb[16..32]);
        let algorithm = &sb[32..64];
        let name_len = algorithm.iter().position(|&b| b == 0).unwrap_or(32);
        if &algorithm[..name_len] != HASH_ALGORITHM.as_bytes()
            || algorithm[name_len..].iter().any(|&b| b != 0)
        {
            return Err(field(
                "hash algorithm",
                format_args!("{:?}", String::from_utf8_lossy(&algorithm[..name_len])),
                "\"sha256\"",
            ));
        }
        for (name, offset) in [("data block size", 64), ("hash block size", 68)] {
            let size = le_u32(sb, offset);
            if size != BLOCK_SIZE {
                return Err(field(name, size, "4096"));
            }
        }
        let mut blocks = [0u8; 8];
        blocks.copy_from_slice(&sb[72..80]);
        let data_blocks = u64::from_le_bytes(blocks);
        // One block would make the data block's own hash the root: no tree to check.
        if data_blocks < 2 {
            return Err(field("data blocks", data_blocks, "at least 2"));
        }
        let salt_len = usize::from(u16::from_le_bytes([sb[80], sb[81]]));
        if salt_len > MAX_SALT_LEN {
            return Err(field(
                "salt size",
                salt_len,
                &format!("at most {MAX_SALT_LEN}"),
            ));
        }
        let salt_area = &sb[88..88 + MAX_SALT_LEN];
        let padding_is_zero = sb[82..88].iter().all(|&b| b == 0)
            && salt_area[salt_len..].iter().all(|&b| b == 0)
            && sb[88 + MAX_SALT_LEN..].iter().all(|&b| b == 0);
        if !padding_is_zero {
            return Err(field("padding", "not zero", "zero"));
        }
        Ok(VeritySuperblock {
            uuid,
            data_blocks,
            salt: salt_area[..salt_len].to_vec(),
        })
    }

    /// Bytes of data the tree covers.
    pub fn data_bytes(&self) -> u64 {
        self.data_blocks * u64::from(BLOCK_SIZE)
    }

    /// The hash tree's shape for this many data blocks.
    pub fn geometry(&self) -> TreeGeometry {
        TreeGeometry::new(self.data_blocks)
    }

    /// The superblock UUID in text form.
    pub fn uuid_text(&self) -> String {
        super::gpt::Guid(self.uuid).to_string()
    }
}

/// The hash tree's levels, computed as the kernel does (`verity_ctr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeGeometry {
    /// Blocks per level, top level (the single block the root hash covers) first: the order
    /// the levels are stored in.
    pub level_blocks: Vec<u64>,
}

impl TreeGeometry {
    pub fn new(data_blocks: u64) -> TreeGeometry {
        let per_block = u64::from(BLOCK_SIZE) / DIGEST_LEN;
        let mut level_blocks = Vec::new();
        let mut blocks = data_blocks;
        loop {
            blocks = blocks.div_ceil(per_block);
            level_blocks.push(blocks);
            if blocks <= 1 {
                break;
            }
        }
        level_blocks.reverse();
        TreeGeometry { level_blocks }
    }

    /// Hash blocks in the tree.
    pub fn hash_blocks(&self) -> u64 {
        self.level_blocks.iter().sum()
    }

    /// Bytes the verity partition needs: superblock block plus tree.
    pub fn hash_device_bytes(&self) -> u64 {
        (HASH_START_BLOCK + self.hash_blocks()) * u64::from(BLOCK_SIZE)
    }

    /// Byte offset of the top block in the verity partition.
    pub fn top_block_offset(&self) -> u64 {
        HASH_START_BLOCK * u64::from(BLOCK_SIZE)
    }
}

/// The root hash of a tree whose top block is `top_block`: sha256(salt ‖ block) for the
/// version-1 format.
pub fn root_of(salt: &[u8], top_block: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(salt);
    hasher.update(top_block);
    hasher.finalize().into()
}

/// Checks the tree's top block against the measured root hash.
pub fn check_root(
    superblock: &VeritySuperblock,
    top_block: &[u8],
    expected: &RootHash,
) -> Result<(), VerityError> {
    let actual = root_of(&superblock.salt, top_block);
    if actual != *expected.as_bytes() {
        return Err(VerityError::RootHashMismatch {
            expected: expected.to_string(),
            actual: hex::encode(actual),
        });
    }
    Ok(())
}

/// The device-mapper table line (start, length in sectors, target, parameters).
pub fn table_line(
    superblock: &VeritySuperblock,
    data: DevNum,
    hash: DevNum,
    root_hash: &RootHash,
) -> (u64, u64, String, String) {
    let salt = if superblock.salt.is_empty() {
        "-".to_owned()
    } else {
        hex::encode(&superblock.salt)
    };
    let params = format!(
        "1 {data} {hash} {BLOCK_SIZE} {BLOCK_SIZE} {} {HASH_START_BLOCK} {HASH_ALGORITHM} \
         {root_hash} {salt} {} {}",
        superblock.data_blocks,
        TABLE_OPTIONS.len(),
        TABLE_OPTIONS.join(" ")
    );
    (
        0,
        superblock.data_bytes() / SECTOR,
        "verity".to_owned(),
        params,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superblock as `veritysetup format` writes it.
    fn superblock_bytes(data_blocks: u64, salt: &[u8]) -> Vec<u8> {
        let mut sb = vec![0u8; SUPERBLOCK_SIZE];
        sb[0..8].copy_from_slice(SUPERBLOCK_SIGNATURE);
        sb[8..12].copy_from_slice(&1u32.to_le_bytes());
        sb[12..16].copy_from_slice(&1u32.to_le_bytes());
        sb[16..32].copy_from_slice(&[0x11; 16]);
        sb[32..38].copy_from_slice(b"sha256");
        sb[64..68].copy_from_slice(&4096u32.to_le_bytes());
        sb[68..72].copy_from_slice(&4096u32.to_le_bytes());
        sb[72..80].copy_from_slice(&data_blocks.to_le_bytes());
        sb[80..82].copy_from_slice(&(salt.len() as u16).to_le_bytes());
        sb[88..88 + salt.len()].copy_from_slice(salt);
        sb
    }

    #[test]
    fn a_veritysetup_superblock_is_accepted() {
        let sb = VeritySuperblock::parse(&superblock_bytes(1000, &[0xab; 32])).unwrap();
        assert_eq!(sb.data_blocks, 1000);
        assert_eq!(sb.salt, [0xab; 32]);
        assert_eq!(sb.uuid_text(), "11111111-1111-1111-1111-111111111111");
    }

    #[test]
    fn other_layouts_are_refused_naming_the_field() {
        let good = superblock_bytes(1000, &[0xab; 32]);
        let cases: [(usize, &[u8], &str); 7] = [
            (
                8,
                &2u32.to_le_bytes(),
                "verity superblock field version is 2, expected 1",
            ),
            (12, &0u32.to_le_bytes(), "field hash type is 0"),
            (32, b"sha512", "field hash algorithm is \"sha512\""),
            (
                64,
                &512u32.to_le_bytes(),
                "field data block size is 512, expected 4096",
            ),
            (68, &1024u32.to_le_bytes(), "field hash block size is 1024"),
            (
                72,
                &1u64.to_le_bytes(),
                "field data blocks is 1, expected at least 2",
            ),
            (80, &300u16.to_le_bytes(), "field salt size is 300"),
        ];
        for (offset, bytes, message) in cases {
            let mut bad = good.clone();
            bad[offset..offset + bytes.len()].copy_from_slice(bytes);
            let err = VeritySuperblock::parse(&bad).unwrap_err().to_string();
            assert!(err.contains(message), "{err}");
        }
        let mut bad = good.clone();
        bad[300] = 1;
        assert!(
            VeritySuperblock::parse(&bad)
                .unwrap_err()
                .to_string()
                .contains("padding")
        );
        let err = VeritySuperblock::parse(&[0u8; 512]).unwrap_err();
        assert!(matches!(err, VerityError::Signature { .. }));
        assert!(VeritySuperblock::parse(&good[..511]).is_err());
    }

    #[test]
    fn tree_geometry_follows_the_kernel() {
        // 128 hashes per 4096-byte block.
        assert_eq!(TreeGeometry::new(2).level_blocks, [1]);
        assert_eq!(TreeGeometry::new(128).level_blocks, [1]);
        assert_eq!(TreeGeometry::new(129).level_blocks, [1, 2]);
        assert_eq!(TreeGeometry::new(128 * 128).level_blocks, [1, 128]);
        assert_eq!(TreeGeometry::new(128 * 128 + 1).level_blocks, [1, 2, 129]);
        let geometry = TreeGeometry::new(129);
        assert_eq!(geometry.hash_blocks(), 3);
        assert_eq!(geometry.hash_device_bytes(), 4 * 4096);
    }

    #[test]
    fn the_table_line_is_veritysetups_with_panic_options() {
        let sb = VeritySuperblock::parse(&superblock_bytes(1000, &[0xab; 4])).unwrap();
        let root = RootHash::parse(&"0f".repeat(32)).unwrap();
        let data = DevNum {
            major: 254,
            minor: 1,
        };
        let hash = DevNum {
            major: 254,
            minor: 2,
        };
        assert_eq!(
            table_line(&sb, data, hash, &root),
            (
                0,
                8000,
                "verity".to_owned(),
                format!(
                    "1 254:1 254:2 4096 4096 1000 1 sha256 {} abababab 2 panic_on_corruption \
                     panic_on_error",
                    "0f".repeat(32)
                )
            )
        );
        let unsalted = VeritySuperblock::parse(&superblock_bytes(1000, &[])).unwrap();
        assert!(
            table_line(&unsalted, data, hash, &root)
                .3
                .contains(" sha256 0f0f")
        );
        assert!(table_line(&unsalted, data, hash, &root).3.contains(" - 2 "));
    }

    #[test]
    fn a_root_mismatch_names_both_hashes() {
        let sb = VeritySuperblock::parse(&superblock_bytes(1000, &[1, 2, 3])).unwrap();
        let block = vec![7u8; 4096];
        let actual = root_of(&sb.salt, &block);
        check_root(&sb, &block, &RootHash(actual)).unwrap();
        let expected = RootHash([0xee; 32]);
        let err = check_root(&sb, &block, &expected).unwrap_err().to_string();
        assert!(err.contains(&"ee".repeat(32)), "{err}");
        assert!(err.contains(&hex::encode(actual)), "{err}");
    }
}
