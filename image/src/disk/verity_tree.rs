//! The check that the dm-verity tree, the root file system and the root hash fit together,
//! before the disk (whose PARTUUIDs derive from the root hash) is written.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use hawser_disk_format::verity::{self, VeritySuperblock};

use super::DiskError;

/// The dm-verity root hash of the tree in `verity` (sha256, format 1, with superblock, as
/// `veritysetup format` writes it) over `rootfs`.
///
/// Reads the superblock and the tree's top block only; it checks that the tree covers exactly
/// `rootfs`, not every block (`veritysetup verify` does that).
pub fn verity_root_hash(rootfs: &Path, verity: &Path) -> Result<[u8; 32], DiskError> {
    let refuse = |reason: String| DiskError::Verity {
        verity: verity.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
        reason,
    };
    let read_error = |role: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| DiskError::Input { role, path, source }
    };
    let tree = File::open(verity).map_err(read_error("dm-verity hash tree", verity))?;
    let mut superblock = [0u8; verity::SUPERBLOCK_SIZE];
    tree.read_exact_at(&mut superblock, 0)
        .map_err(read_error("dm-verity hash tree", verity))?;
    let superblock =
        VeritySuperblock::parse(&superblock).map_err(|source| DiskError::VeritySuperblock {
            verity: verity.to_path_buf(),
            source,
        })?;
    if superblock.hash_type != verity::HASH_TYPE || superblock.algorithm != verity::HASH_ALGORITHM {
        return Err(refuse(format!(
            "it is hash type {} with {:?}; hawser uses type {} with {}",
            superblock.hash_type,
            superblock.algorithm,
            verity::HASH_TYPE,
            verity::HASH_ALGORITHM
        )));
    }
    let data_block_size = u64::from(superblock.data_block_size);
    let rootfs_bytes = std::fs::metadata(rootfs)
        .map_err(read_error("root file system image", rootfs))?
        .len();
    let covered = superblock.data_blocks.checked_mul(data_block_size);
    if superblock.data_blocks == 0 || covered != Some(rootfs_bytes) {
        return Err(refuse(format!(
            "the tree covers {} blocks of {data_block_size} bytes, but the root file system is {rootfs_bytes} bytes",
            superblock.data_blocks
        )));
    }

    // With one data block there is no tree: the root hash is that block's hash. Otherwise the
    // top level (one block) is stored first, in the hash block after the superblock.
    let geometry = superblock.geometry();
    let hash_block_size = u64::from(superblock.hash_block_size);
    let (top_block, source, offset, block_size) = if superblock.data_blocks == 1 {
        (
            File::open(rootfs).map_err(read_error("root file system image", rootfs))?,
            rootfs,
            0,
            data_block_size,
        )
    } else {
        (tree, verity, geometry.top_block_offset(), hash_block_size)
    };
    let block_len = usize::try_from(block_size).map_err(|_| refuse("block too large".into()))?;
    let mut block = vec![0u8; block_len];
    top_block
        .read_exact_at(&mut block, offset)
        .map_err(|error| DiskError::TopHashBlock {
            path: source.to_path_buf(),
            offset,
            source: error,
        })?;
    Ok(verity::root_hash_of(&superblock.salt, &block))
}
