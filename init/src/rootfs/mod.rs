//! The immutable rootfs: find it, verify it with dm-verity, mount it, and make it `/`.
//!
//! The initramfs carries only what bring-up needs; containerd, kubelet and kubeadm live in a
//! Debian rootfs image (erofs) on the boot disk, protected by dm-verity. The trust anchor is
//! the root hash on the measured kernel command line (`hawser.root_hash=<64 lowercase hex>`,
//! PCR 11/12): nothing read from the disk is trusted before it has been checked against it.
//!
//! ```text
//! hawser.root_hash ─► GPT of each disk (untrusted: only to locate)      [locate]
//!                     data partition   PARTUUID = root_hash[0..16]
//!                     verity partition PARTUUID = root_hash[16..32]
//!                  ─► verity superblock, strict; top hash block vs root  [locate, verity]
//!                  ─► dm-verity table (panic_on_corruption panic_on_error) [activate]
//!                  ─► erofs ro at /sysroot, state binds, /etc overlay    [plan]
//!                  ─► PCR 11 ← [control-plane,] leave-initrd (the caller's TPM step)
//!                  ─► move /dev /proc /sys /run; mount --move /sysroot /;
//!                     chroot .; delete the initramfs; chdir /
//! ```
//!
//! [`pivot::pivot`] runs these steps for the boot; after the switch, [`networking`] loads
//! Kubernetes networking's modules from the kept-open initramfs before it is deleted.
//!
//! The formats (GPT, the verity superblock, the root hash → PARTUUID rule) are the image
//! builder's, from [`hawser_disk_format`]; this module reads devices and decides.
//!
//! An image without a rootfs has no `hawser.root_hash`; the node then stays in the initramfs
//! as before.
//!
//! ## PID 1 stays
//!
//! hawser does not exec anything after the switch: the same process, with the same tokio
//! runtime, TPM context and open files, carries on as PID 1 in the new root (see
//! [`crate::supervisor`]). The binary and the shared libraries it has mapped stay mapped after
//! the initramfs files are deleted. Anything loaded *later* is looked up in the new root,
//! which has different files: glibc's NSS modules (dlopened by `getaddrinfo` for names, by
//! `getpwnam`) come from the rootfs afterwards: use numeric addresses, or make sure the rootfs
//! has a matching glibc. Helper programs from the initramfs (`mke2fs`) are gone after the
//! switch.

pub mod activate;
pub mod locate;
pub mod networking;
pub mod pivot;
pub mod plan;
pub mod verity;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use hawser_disk_format::Guid;
use hawser_disk_format::gpt::root_partuuids;
use tracing::info;

use self::activate::VerityDevice;
use self::locate::{PartitionLookup, VerityTarget};
use self::verity::VerityError;
use crate::platform::block::SysfsError;
use crate::platform::dm::DmError;

pub use self::pivot::{PivotError, Pivoted, pivot};
pub use self::plan::{
    MeasuredRole, NEW_ROOT_API_MOUNTS, RootfsPlan, StateBacking, SwitchOutcome, SwitchRootError,
    switch_root,
};

/// How long to wait for the boot disk's partitions (virtio-blk probes asynchronously).
pub const PARTITION_WAIT: Duration = Duration::from_secs(10);

/// The measured dm-verity root hash of the rootfs image (sha256).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RootHash(pub [u8; 32]);

/// Why a `hawser.root_hash` value is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RootHashError {
    /// The value is not 64 characters long.
    #[error("expected 64 lowercase hex digits (a sha256 dm-verity root hash)")]
    Length,
    /// The value has a character outside 0-9 and a-f.
    #[error("expected only lowercase hex digits 0-9 and a-f")]
    NotLowercaseHex,
}

impl RootHashError {
    /// The reason as a static string (for [`crate::config::ConfigError`]).
    pub fn reason(self) -> &'static str {
        match self {
            RootHashError::Length => {
                "expected 64 lowercase hex digits (a sha256 dm-verity root hash)"
            }
            RootHashError::NotLowercaseHex => "expected only lowercase hex digits 0-9 and a-f",
        }
    }
}

impl RootHash {
    /// Parses the value of `hawser.root_hash`: exactly 64 lowercase hex digits. Uppercase is
    /// refused so that one image has exactly one command line (and one PCR value).
    pub fn parse(text: &str) -> Result<RootHash, RootHashError> {
        if text.len() != 64 {
            return Err(RootHashError::Length);
        }
        if !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(RootHashError::NotLowercaseHex);
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| RootHashError::NotLowercaseHex)?;
        Ok(RootHash(bytes))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// PARTUUID of the data partition, as the image builder assigns it
    /// ([`root_partuuids`]: the first half of the root hash).
    pub fn data_partition_uuid(&self) -> Guid {
        root_partuuids(&self.0).0
    }

    /// PARTUUID of the verity partition ([`root_partuuids`]: the second half of the root hash).
    pub fn verity_partition_uuid(&self) -> Guid {
        root_partuuids(&self.0).1
    }
}

impl fmt::Display for RootHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for RootHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RootHash({self})")
    }
}

/// Parses `hawser.root_hash` (for the configuration parser).
pub fn parse_root_hash(value: &str) -> Result<RootHash, RootHashError> {
    RootHash::parse(value)
}

/// Why the verified rootfs cannot be opened. Each message names the device and what differed.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// /sys/block cannot be listed.
    #[error("cannot list the disks")]
    Sysfs(#[source] SysfsError),
    /// A read of a partition (the partition table, the verity superblock) failed.
    #[error("cannot read {len} bytes at offset {offset} of {}", device.display())]
    Read {
        device: PathBuf,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    /// No disk with both partitions of the measured root hash appeared in time.
    #[error(
        "no disk has the rootfs partitions for hawser.root_hash={root_hash} (data partition \
         PARTUUID {data_uuid}, verity partition PARTUUID {verity_uuid}) after {} s; disks: \
         {scanned}",
        waited.as_secs()
    )]
    NotFound {
        root_hash: RootHash,
        data_uuid: Guid,
        verity_uuid: Guid,
        waited: Duration,
        scanned: String,
    },
    /// Several disks carry the root hash's partitions (a second, attacker-supplied copy?).
    #[error("more than one disk has the rootfs partitions ({disks}); refusing to guess")]
    Ambiguous { disks: String },
    /// The kernel's idea of a partition differs from the partition table read now.
    #[error(
        "partition {partition}: the kernel's {field} is {kernel} sectors, but the partition \
         table read now says {table}"
    )]
    PartitionMismatch {
        partition: String,
        field: &'static str,
        kernel: u64,
        table: u64,
    },
    /// The verity partition's superblock is malformed or not the one hawser writes.
    #[error("verity partition {}", device.display())]
    Verity {
        device: PathBuf,
        #[source]
        source: VerityError,
    },
    /// A partition is smaller than its verity superblock says.
    #[error(
        "{} is {size} bytes, too small for the {needed} bytes the verity superblock describes",
        device.display()
    )]
    TooSmall {
        device: PathBuf,
        size: u64,
        needed: u64,
    },
    /// The dm-verity mapping cannot be created.
    #[error("cannot map the verified rootfs")]
    Dm(#[source] DmError),
    /// The blocking task that opens the rootfs panicked or was cancelled.
    #[error("the rootfs task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Finds the rootfs partitions, checks the verity superblock and hash tree top against
/// `root_hash`, and maps the dm-verity device. Polls for the partitions up to `wait`.
/// Device-mapper needs the guest kernel: on a host this fails at [`activate::activate`].
pub async fn open_verity_root(
    root_hash: RootHash,
    wait: Duration,
) -> Result<VerityDevice, RootfsError> {
    let deadline = tokio::time::Instant::now() + wait;
    let partitions = loop {
        let lookup = tokio::task::spawn_blocking(move || {
            locate::find_verity_partitions(
                std::path::Path::new(locate::SYS_BLOCK),
                std::path::Path::new(locate::DEV_DIR),
                &root_hash,
            )
        })
        .await
        .map_err(RootfsError::Task)??;
        match lookup {
            PartitionLookup::Found(partitions) => break partitions,
            PartitionLookup::Missing { scanned } if tokio::time::Instant::now() >= deadline => {
                return Err(RootfsError::NotFound {
                    root_hash,
                    data_uuid: root_hash.data_partition_uuid(),
                    verity_uuid: root_hash.verity_partition_uuid(),
                    waited: wait,
                    scanned: locate::describe_scanned(&scanned),
                });
            }
            PartitionLookup::Missing { .. } => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let device = tokio::task::spawn_blocking(move || -> Result<VerityDevice, RootfsError> {
        let target: VerityTarget = locate::check_verity(
            partitions,
            std::path::Path::new(locate::DEV_DIR),
            &root_hash,
        )?;
        activate::activate(&target, &root_hash)
    })
    .await
    .map_err(RootfsError::Task)??;
    info!(
        "rootfs: dm-verity {} over data {} and hash tree {} ({} MiB, root hash {root_hash})",
        device.path.display(),
        device.data_partition,
        device.hash_partition,
        device.data_bytes >> 20
    );
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_hashes_are_64_lowercase_hex_digits() {
        let text = "3f".repeat(32);
        let hash = parse_root_hash(&text).unwrap();
        assert_eq!(hash.to_string(), text);
        assert_eq!(hash.as_bytes(), &[0x3f; 32]);
        assert_eq!(
            parse_root_hash(&"3F".repeat(32)),
            Err(RootHashError::NotLowercaseHex)
        );
        assert_eq!(
            parse_root_hash(&"3f".repeat(31)),
            Err(RootHashError::Length)
        );
        assert_eq!(parse_root_hash(""), Err(RootHashError::Length));
        assert_eq!(
            parse_root_hash(&format!("{}zz", "3f".repeat(31))),
            Err(RootHashError::NotLowercaseHex)
        );
        assert_eq!(
            RootHashError::Length.reason(),
            RootHashError::Length.to_string()
        );
        assert_eq!(
            RootHashError::NotLowercaseHex.reason(),
            RootHashError::NotLowercaseHex.to_string()
        );
    }

    #[test]
    fn partition_uuids_are_the_halves_of_the_root_hash_as_text() {
        let hash =
            parse_root_hash("00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210")
                .unwrap();
        assert_eq!(
            hash.data_partition_uuid().to_string(),
            "00112233-4455-6677-8899-aabbccddeeff"
        );
        assert_eq!(
            hash.verity_partition_uuid().to_string(),
            "01234567-89ab-cdef-fedc-ba9876543210"
        );
    }
}
