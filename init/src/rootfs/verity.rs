//! The dm-verity side of the rootfs: a check of the hash tree's top block against the measured
//! root hash, and the table line.
//!
//! The superblock is read from the (untrusted) verity partition and parsed strictly by
//! [`VeritySuperblock::parse_hawser`] (the format is the image builder's, in
//! [`hawser_disk_format::verity`]): only the one layout hawser's image builder produces is
//! accepted (version 1, sha256, 4096-byte data and hash blocks, hash tree right after the
//! superblock). Anything else is refused with the field and the value, never adapted to.
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

use hawser_disk_format::verity::{
    BLOCK_SIZE, HASH_ALGORITHM, HASH_START_BLOCK, SuperblockError, VeritySuperblock, root_hash_of,
};

use super::RootHash;
/// A `major:minor` block device number, as table lines name devices.
pub use crate::platform::dm::DevNum;

/// The options hawser loads the table with (see the module documentation).
pub const TABLE_OPTIONS: [&str; 2] = ["panic_on_corruption", "panic_on_error"];

const SECTOR: u64 = 512;

/// Why a verity superblock or hash tree is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerityError {
    /// The superblock is not hawser's format.
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    /// The hash tree is not the one the measured root hash describes (another image's, or
    /// stale).
    #[error(
        "verity hash tree root is {actual}, but the kernel command line's hawser.root_hash is \
         {expected}"
    )]
    RootHashMismatch { expected: String, actual: String },
}

/// Checks the tree's top block against the measured root hash.
pub fn check_root(
    superblock: &VeritySuperblock,
    top_block: &[u8],
    expected: &RootHash,
) -> Result<(), VerityError> {
    let actual = root_hash_of(&superblock.salt, top_block);
    if actual != *expected.as_bytes() {
        return Err(VerityError::RootHashMismatch {
            expected: expected.to_string(),
            actual: hex::encode(actual),
        });
    }
    Ok(())
}

/// The device-mapper table line (start, length in sectors, target, parameters) of a superblock
/// [`VeritySuperblock::parse_hawser`] accepted.
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

    /// The superblock `veritysetup format` writes for the image builder, as parsed.
    fn superblock(data_blocks: u64, salt: &[u8]) -> VeritySuperblock {
        VeritySuperblock {
            hash_type: 1,
            uuid: hawser_disk_format::Guid::from_bytes([0x11; 16]),
            algorithm: "sha256".to_owned(),
            data_block_size: 4096,
            hash_block_size: 4096,
            data_blocks,
            salt: salt.to_vec(),
        }
    }

    #[test]
    fn the_table_line_is_veritysetups_with_panic_options() {
        let sb = superblock(1000, &[0xab; 4]);
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
        let unsalted = superblock(1000, &[]);
        assert!(
            table_line(&unsalted, data, hash, &root)
                .3
                .contains(" sha256 0f0f")
        );
        assert!(table_line(&unsalted, data, hash, &root).3.contains(" - 2 "));
    }

    #[test]
    fn a_root_mismatch_names_both_hashes() {
        let sb = superblock(1000, &[1, 2, 3]);
        let block = vec![7u8; 4096];
        let actual = root_hash_of(&sb.salt, &block);
        check_root(&sb, &block, &RootHash(actual)).unwrap();
        let expected = RootHash([0xee; 32]);
        let err = check_root(&sb, &block, &expected).unwrap_err().to_string();
        assert!(err.contains(&"ee".repeat(32)), "{err}");
        assert!(err.contains(&hex::encode(actual)), "{err}");
    }
}
