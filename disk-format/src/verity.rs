//! The dm-verity hash device: the superblock `veritysetup format` writes, the hash tree's shape,
//! and the root hash.
//!
//! The superblock is cryptsetup's `struct verity_sb`, 512 bytes at the start of the hash device,
//! integers little-endian:
//!
//! ```text
//!     0 signature "verity\0\0"   8 version (1)   12 hash type (1; 0 is Chrome OS's)
//!    16 UUID (text byte order)   32 hash algorithm, NUL-padded (32 bytes)
//!    64 data block size   68 hash block size   72 data blocks (u64)   80 salt size (u16)
//!    82 padding (6)   88 salt (256, zero after the salt)   344 padding (168)
//! ```
//!
//! The hash tree follows in the next hash block ([`HASH_START_BLOCK`]), its levels top first,
//! as the kernel lays them out (`verity_ctr`); the root hash is sha256(salt ‖ top block)
//! ([`root_hash_of`]) for hash type 1.
//!
//! There are two levels of acceptance:
//! - [`VeritySuperblock::parse`]: a version-1 superblock as cryptsetup writes it (signature,
//!   version, block sizes, salt size, zero padding). The image builder uses it to compute the
//!   root hash of a tree it is handed.
//! - [`VeritySuperblock::parse_hawser`]: in addition, the one format hawser's image builder
//!   produces ([`BLOCK_SIZE`], [`HASH_ALGORITHM`], hash type 1, a tree of at least two data
//!   blocks). PID 1 reads the superblock from the untrusted verity partition with it: anything
//!   else is refused with the field and the value, never adapted to.

use sha2::{Digest as _, Sha256};

use crate::guid::Guid;

/// `"verity\0\0"`.
pub const SUPERBLOCK_SIGNATURE: &[u8; 8] = b"verity\0\0";
/// The on-disk superblock (cryptsetup's `struct verity_sb`).
pub const SUPERBLOCK_SIZE: usize = 512;
/// The superblock version cryptsetup writes.
pub const SUPERBLOCK_VERSION: u32 = 1;
/// The hash format of current kernels (type 0 is Chrome OS's, which hashes salt last).
pub const HASH_TYPE: u32 = 1;
/// Longest salt the superblock can hold.
pub const MAX_SALT_LEN: usize = 256;
/// Smallest block size a superblock may give: a sector.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Largest block size a superblock may give: bounds what a reader allocates for one block.
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// hawser's data and hash block size (also the erofs block size of the rootfs).
pub const BLOCK_SIZE: u32 = 4096;
/// hawser's hash algorithm.
pub const HASH_ALGORITHM: &str = "sha256";
/// The hash tree starts in the hash block after the superblock.
pub const HASH_START_BLOCK: u64 = 1;

/// Bytes of a [`HASH_ALGORITHM`] digest.
const DIGEST_LEN: u64 = 32;
/// The most data blocks of [`BLOCK_SIZE`] whose byte count fits a `u64`.
const MAX_DATA_BLOCKS: u64 = u64::MAX / BLOCK_SIZE as u64;

/// Why bytes are not a verity superblock this crate accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    /// The bytes do not start with the verity signature: not a hash device, or a tree made
    /// without a superblock.
    #[error(
        "no verity superblock (signature {found:?}, expected \"verity\\0\\0\"; was the tree \
         made with --no-superblock?)"
    )]
    Signature { found: String },
    /// A field has a value that is not accepted.
    #[error("verity superblock field {field} is {actual}, expected {expected}")]
    Field {
        field: &'static str,
        actual: String,
        expected: String,
    },
}

/// A verity superblock's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VeritySuperblock {
    /// [`HASH_TYPE`] for the kernel's current format.
    pub hash_type: u32,
    /// The superblock's UUID (`veritysetup format --uuid`).
    pub uuid: Guid,
    /// The hash algorithm's kernel name, e.g. `sha256`.
    pub algorithm: String,
    /// Bytes per data block.
    pub data_block_size: u32,
    /// Bytes per hash block.
    pub hash_block_size: u32,
    /// Data blocks covered by the tree.
    pub data_blocks: u64,
    pub salt: Vec<u8>,
}

fn field(field: &'static str, actual: impl std::fmt::Display, expected: &str) -> SuperblockError {
    SuperblockError::Field {
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
    /// Parses the first [`SUPERBLOCK_SIZE`] bytes of a hash device: any version-1 superblock
    /// with block sizes that are powers of two from [`MIN_BLOCK_SIZE`] to [`MAX_BLOCK_SIZE`].
    pub fn parse(bytes: &[u8]) -> Result<VeritySuperblock, SuperblockError> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(field(
                "length",
                bytes.len(),
                &format!("{SUPERBLOCK_SIZE} bytes"),
            ));
        }
        let sb = &bytes[..SUPERBLOCK_SIZE];
        if &sb[0..8] != SUPERBLOCK_SIGNATURE {
            return Err(SuperblockError::Signature {
                found: String::from_utf8_lossy(&sb[0..8]).into_owned(),
            });
        }
        let version = le_u32(sb, 8);
        if version != SUPERBLOCK_VERSION {
            return Err(field("version", version, "1"));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&sb[16..32]);
        let algorithm_area = &sb[32..64];
        let name_len = algorithm_area
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(algorithm_area.len());
        let algorithm = String::from_utf8_lossy(&algorithm_area[..name_len]).into_owned();
        if algorithm_area[name_len..].iter().any(|&b| b != 0) {
            return Err(field(
                "hash algorithm",
                format_args!("{algorithm:?} followed by non-zero bytes"),
                "a NUL-padded name",
            ));
        }
        let mut block_sizes = [0u32; 2];
        for (size, (name, offset)) in block_sizes
            .iter_mut()
            .zip([("data block size", 64), ("hash block size", 68)])
        {
            *size = le_u32(sb, offset);
            if !size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(size) {
                return Err(field(
                    name,
                    *size,
                    &format!("a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}"),
                ));
            }
        }
        let [data_block_size, hash_block_size] = block_sizes;
        let mut blocks = [0u8; 8];
        blocks.copy_from_slice(&sb[72..80]);
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
            hash_type: le_u32(sb, 12),
            uuid: Guid::from_bytes(uuid),
            algorithm,
            data_block_size,
            hash_block_size,
            data_blocks: u64::from_le_bytes(blocks),
            salt: salt_area[..salt_len].to_vec(),
        })
    }

    /// Parses a superblock as PID 1 accepts it: [`parse`](Self::parse), and then only hawser's
    /// format (hash type 1, sha256, 4096-byte data and hash blocks, at least two data blocks).
    pub fn parse_hawser(bytes: &[u8]) -> Result<VeritySuperblock, SuperblockError> {
        let superblock = VeritySuperblock::parse(bytes)?;
        if superblock.hash_type != HASH_TYPE {
            return Err(field(
                "hash type",
                superblock.hash_type,
                "1 (the normal format; 0 is Chrome OS's)",
            ));
        }
        if superblock.algorithm != HASH_ALGORITHM {
            return Err(field(
                "hash algorithm",
                format_args!("{:?}", superblock.algorithm),
                "\"sha256\"",
            ));
        }
        for (name, size) in [
            ("data block size", superblock.data_block_size),
            ("hash block size", superblock.hash_block_size),
        ] {
            if size != BLOCK_SIZE {
                return Err(field(name, size, "4096"));
            }
        }
        // One block would make the data block's own hash the root: no tree to check.
        if !(2..=MAX_DATA_BLOCKS).contains(&superblock.data_blocks) {
            return Err(field(
                "data blocks",
                superblock.data_blocks,
                &format!("at least 2 (and at most {MAX_DATA_BLOCKS})"),
            ));
        }
        Ok(superblock)
    }

    /// Bytes of data the tree covers (saturating: [`parse_hawser`](Self::parse_hawser) refuses
    /// superblocks where it would overflow).
    pub fn data_bytes(&self) -> u64 {
        self.data_blocks
            .saturating_mul(u64::from(self.data_block_size))
    }

    /// The hash tree's shape (for a sha256 tree).
    pub fn geometry(&self) -> TreeGeometry {
        TreeGeometry::new(self.data_blocks, self.hash_block_size)
    }
}

/// The hash tree's levels, computed as the kernel does (`verity_ctr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeGeometry {
    /// Blocks per level, top level (the single block the root hash covers) first: the order
    /// the levels are stored in.
    pub level_blocks: Vec<u64>,
    /// Bytes per hash block.
    pub hash_block_size: u32,
}

impl TreeGeometry {
    /// The tree of sha256 hashes over `data_blocks` in blocks of `hash_block_size` bytes (at
    /// least [`MIN_BLOCK_SIZE`], as [`VeritySuperblock::parse`] ensures).
    fn new(data_blocks: u64, hash_block_size: u32) -> TreeGeometry {
        let per_block = (u64::from(hash_block_size) / DIGEST_LEN).max(2);
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
        TreeGeometry {
            level_blocks,
            hash_block_size,
        }
    }

    /// Hash blocks in the tree.
    pub fn hash_blocks(&self) -> u64 {
        self.level_blocks.iter().sum()
    }

    /// Bytes the hash device needs: superblock block plus tree.
    pub fn hash_device_bytes(&self) -> u64 {
        (HASH_START_BLOCK + self.hash_blocks()) * u64::from(self.hash_block_size)
    }

    /// Byte offset of the top block in the hash device.
    pub fn top_block_offset(&self) -> u64 {
        HASH_START_BLOCK * u64::from(self.hash_block_size)
    }
}

/// The root hash of a tree whose top block is `top_block` (or of a single data block):
/// sha256(salt ‖ block), hash type 1.
pub fn root_hash_of(salt: &[u8], top_block: &[u8]) -> [u8; 32] {
    Sha256::new()
        .chain_update(salt)
        .chain_update(top_block)
        .finalize()
        .into()
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
        let sb = VeritySuperblock::parse_hawser(&superblock_bytes(1000, &[0xab; 32])).unwrap();
        assert_eq!(sb.data_blocks, 1000);
        assert_eq!(sb.salt, [0xab; 32]);
        assert_eq!(sb.uuid.to_string(), "11111111-1111-1111-1111-111111111111");
        assert_eq!(sb.data_bytes(), 1000 * 4096);
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
            let err = VeritySuperblock::parse_hawser(&bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{err}");
        }
        let mut bad = good.clone();
        bad[300] = 1;
        assert!(
            VeritySuperblock::parse_hawser(&bad)
                .unwrap_err()
                .to_string()
                .contains("padding")
        );
        let err = VeritySuperblock::parse_hawser(&[0u8; 512]).unwrap_err();
        assert!(matches!(err, SuperblockError::Signature { .. }));
        assert!(VeritySuperblock::parse_hawser(&good[..511]).is_err());
    }

    #[test]
    fn any_veritysetup_layout_parses_but_only_hawsers_is_accepted_by_pid_1() {
        // `veritysetup format --data-block-size=512 --hash-block-size=1024` of one block.
        let mut other = superblock_bytes(1, &[]);
        other[64..68].copy_from_slice(&512u32.to_le_bytes());
        other[68..72].copy_from_slice(&1024u32.to_le_bytes());
        let sb = VeritySuperblock::parse(&other).unwrap();
        assert_eq!(
            (sb.data_block_size, sb.hash_block_size, sb.data_blocks),
            (512, 1024, 1)
        );
        assert_eq!(sb.geometry().top_block_offset(), 1024);
        assert!(VeritySuperblock::parse_hawser(&other).is_err());

        let cases: [(usize, &[u8], &str); 3] = [
            (
                64,
                &3000u32.to_le_bytes(),
                "field data block size is 3000, expected a power of two from 512 to 1048576",
            ),
            (68, &256u32.to_le_bytes(), "field hash block size is 256"),
            (
                38,
                b"\0x",
                "field hash algorithm is \"sha256\" followed by non-zero bytes",
            ),
        ];
        let good = superblock_bytes(1000, &[]);
        for (offset, bytes, message) in cases {
            let mut bad = good.clone();
            bad[offset..offset + bytes.len()].copy_from_slice(bytes);
            let err = VeritySuperblock::parse(&bad).unwrap_err().to_string();
            assert!(err.contains(message), "{err}");
        }
    }

    #[test]
    fn a_data_size_beyond_u64_is_refused() {
        let err = VeritySuperblock::parse_hawser(&superblock_bytes(u64::MAX / 4096 + 1, &[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("field data blocks is 4503599627370496"),
            "{err}"
        );
        let largest =
            VeritySuperblock::parse_hawser(&superblock_bytes(u64::MAX / 4096, &[])).unwrap();
        assert_eq!(largest.data_bytes(), u64::MAX / 4096 * 4096);
    }

    #[test]
    fn tree_geometry_follows_the_kernel() {
        // 128 hashes per 4096-byte block.
        let tree = |data_blocks| TreeGeometry::new(data_blocks, BLOCK_SIZE);
        assert_eq!(tree(2).level_blocks, [1]);
        assert_eq!(tree(128).level_blocks, [1]);
        assert_eq!(tree(129).level_blocks, [1, 2]);
        assert_eq!(tree(128 * 128).level_blocks, [1, 128]);
        assert_eq!(tree(128 * 128 + 1).level_blocks, [1, 2, 129]);
        let geometry = tree(129);
        assert_eq!(geometry.hash_blocks(), 3);
        assert_eq!(geometry.hash_device_bytes(), 4 * 4096);
        assert_eq!(geometry.top_block_offset(), 4096);
    }

    #[test]
    fn the_root_hash_is_sha256_of_salt_and_top_block() {
        // sha256("abc"), split between salt and block.
        assert_eq!(
            hex::encode(root_hash_of(b"a", b"bc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
