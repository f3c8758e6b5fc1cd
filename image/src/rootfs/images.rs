//! The tree made into images: the erofs file system (`mkfs.erofs`) and its dm-verity hash
//! tree (`veritysetup format`, then `veritysetup verify`), both deterministic.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hawser_disk_format::verity;
use sha2::{Digest, Sha256};

use super::tree::sha256_file;
use super::{
    BLOCK_SIZE, EROFS_FILE, ROOTHASH_FILE, RootfsError, VERITY_FILE, derived_uuid, find_tool,
    normalize_tree, root_hash_cmdline_arg, run_tool,
};
use crate::tool::io_error;

/// What [`image_tree`] made.
#[derive(Debug, Clone)]
pub struct TreeImages {
    pub erofs: PathBuf,
    pub verity: PathBuf,
    pub root_hash: [u8; 32],
    pub verity_salt: [u8; 32],
    pub data_blocks: u64,
    pub erofs_bytes: u64,
    pub verity_bytes: u64,
    /// sha256 over the normalised tree (see [`normalize_tree`]).
    pub tree_digest: [u8; 32],
    pub timings: Vec<(String, Duration)>,
}

/// Normalises `tree`, then makes `rootfs.erofs`, `rootfs.verity` and `rootfs.roothash` in
/// `out_dir` and checks the hash tree with `veritysetup verify`.
pub fn image_tree(
    tree: &Path,
    out_dir: &Path,
    epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<TreeImages, RootfsError> {
    let mkfs = find_tool("mkfs.erofs", "erofs-utils")?;
    let veritysetup = find_tool("veritysetup", "cryptsetup-bin")?;
    let mut timings = Vec::new();

    let t = Instant::now();
    progress(&format!("rootfs: normalising {}", tree.display()));
    let tree_digest = normalize_tree(tree, epoch)?;
    timings.push(("normalise tree".to_owned(), t.elapsed()));

    let t = Instant::now();
    let erofs = out_dir.join(EROFS_FILE);
    let uuid = derived_uuid("hawser rootfs erofs uuid v1", &tree_digest);
    progress(&format!("rootfs: mkfs.erofs -zlz4hc (UUID {uuid})"));
    remove_if_exists(&erofs)?;
    let mut cmd = Command::new(&mkfs);
    cmd.arg("--quiet")
        .arg("-zlz4hc")
        .arg(format!("-T{epoch}"))
        .arg(format!("-U{uuid}"))
        .arg(&erofs)
        .arg(tree);
    run_tool(
        cmd,
        "mkfs.erofs",
        "mkfs.erofs comes with erofs-utils: run scripts/setup-host",
    )?;
    let erofs_bytes = std::fs::metadata(&erofs)
        .map_err(io_error("stat", &erofs))?
        .len();
    if erofs_bytes % BLOCK_SIZE != 0 || erofs_bytes == 0 {
        return Err(RootfsError::UnalignedImage {
            path: erofs,
            bytes: erofs_bytes,
        });
    }
    let erofs_sha256 = sha256_file(&erofs)?;
    timings.push(("mkfs.erofs".to_owned(), t.elapsed()));

    let t = Instant::now();
    let verity = out_dir.join(VERITY_FILE);
    let salt: [u8; 32] = Sha256::new()
        .chain_update(b"hawser rootfs verity salt v1\0")
        .chain_update(erofs_sha256)
        .finalize()
        .into();
    let verity_uuid = derived_uuid("hawser rootfs verity uuid v1", &erofs_sha256);
    progress(&format!(
        "rootfs: veritysetup format ({}, {BLOCK_SIZE}/{BLOCK_SIZE})",
        verity::HASH_ALGORITHM
    ));
    remove_if_exists(&verity)?;
    let mut cmd = Command::new(&veritysetup);
    cmd.arg("format")
        .arg(format!("--salt={}", hex::encode(salt)))
        .arg(format!("--uuid={verity_uuid}"))
        .arg(format!("--hash={}", verity::HASH_ALGORITHM))
        .arg(format!("--data-block-size={BLOCK_SIZE}"))
        .arg(format!("--hash-block-size={BLOCK_SIZE}"))
        .arg(&erofs)
        .arg(&verity);
    let out = run_tool(
        cmd,
        "veritysetup format",
        "veritysetup comes with cryptsetup-bin: run scripts/setup-host",
    )?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let root_hash = parse_root_hash(&text)?;
    let data_blocks = parse_field(&text, "Data blocks")
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| RootfsError::ToolOutput {
            tool: "veritysetup format",
            what: "Data blocks line",
            output: text.clone(),
        })?;
    if data_blocks != erofs_bytes / BLOCK_SIZE {
        return Err(RootfsError::ToolOutput {
            tool: "veritysetup format",
            what: "data block count matching the erofs image",
            output: text,
        });
    }
    // veritysetup creates the hash file 0600; it is public data.
    std::fs::set_permissions(&verity, std::fs::Permissions::from_mode(0o644))
        .map_err(io_error("set permissions of", &verity))?;
    let verity_bytes = std::fs::metadata(&verity)
        .map_err(io_error("stat", &verity))?
        .len();
    timings.push(("veritysetup format".to_owned(), t.elapsed()));

    let t = Instant::now();
    progress(&format!(
        "rootfs: veritysetup verify (root hash {})",
        hex::encode(root_hash)
    ));
    verify_verity(&erofs, &verity, &root_hash)?;
    timings.push(("veritysetup verify".to_owned(), t.elapsed()));

    let roothash_file = out_dir.join(ROOTHASH_FILE);
    std::fs::write(&roothash_file, format!("{}\n", hex::encode(root_hash)))
        .map_err(io_error("write", &roothash_file))?;
    progress(&format!(
        "rootfs: {} ({} MiB), {} ({} KiB), {}",
        erofs.display(),
        erofs_bytes / (1 << 20),
        verity.display(),
        verity_bytes / 1024,
        root_hash_cmdline_arg(&root_hash)
    ));
    Ok(TreeImages {
        erofs,
        verity,
        root_hash,
        verity_salt: salt,
        data_blocks,
        erofs_bytes,
        verity_bytes,
        tree_digest,
        timings,
    })
}

/// `veritysetup verify`: recomputes the hash tree of `data` against `root_hash` (no
/// device-mapper needed).
pub fn verify_verity(data: &Path, hash: &Path, root_hash: &[u8; 32]) -> Result<(), RootfsError> {
    let veritysetup = find_tool("veritysetup", "cryptsetup-bin")?;
    let mut cmd = Command::new(veritysetup);
    cmd.arg("verify")
        .arg(data)
        .arg(hash)
        .arg(hex::encode(root_hash));
    run_tool(
        cmd,
        "veritysetup verify",
        "the hash tree does not match the image: rebuild both",
    )
    .map(|_| ())
}

fn parse_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == name).then(|| value.trim())
    })
}

fn parse_root_hash(text: &str) -> Result<[u8; 32], RootfsError> {
    parse_field(text, "Root hash")
        .and_then(|h| hex::decode(h).ok())
        .and_then(|h| <[u8; 32]>::try_from(h).ok())
        .ok_or_else(|| RootfsError::ToolOutput {
            tool: "veritysetup format",
            what: "Root hash line",
            output: text.to_owned(),
        })
}

fn remove_if_exists(path: &Path) -> Result<(), RootfsError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error("remove", path)(e).into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veritysetup_output_is_parsed() {
        let text = "VERITY header information for x\nUUID:            \tab\nData blocks:     \t27704\n\
                    Root hash:      \t9337a72ea0a5722b068c71d3bb0da7ab65fd95abc173fa8dab8df5df077d9a1b\n";
        assert_eq!(parse_field(text, "Data blocks"), Some("27704"));
        assert_eq!(
            hex::encode(parse_root_hash(text).unwrap()),
            "9337a72ea0a5722b068c71d3bb0da7ab65fd95abc173fa8dab8df5df077d9a1b"
        );
        assert!(parse_root_hash("Root hash: 12").is_err());
    }
}
