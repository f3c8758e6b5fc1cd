//! What is on a disk before hawser touches it: blank, hawser's, a format cut short, or someone
//! else's data.
//!
//! hawser overwrites only two kinds of disk: a blank one, and its own that never reached
//! "initialized". Anything else — a filesystem, a partition table, another LUKS volume, data it
//! cannot name — is refused with what was found. "Blank" means zeros wherever common formats
//! keep their signatures: the first 4 MiB (partition tables, superblocks of filesystems that
//! start at 0, 1 or 2 MiB, btrfs at 64 KiB, ISO 9660 at 32 KiB), the first MiB of hawser's data
//! segment, and the last MiB (GPT backup header, md 0.90/1.0 and ZFS labels live at the end).
//!
//! A format cut short is recognizable because hawser writes each header copy's binary header —
//! whose first sector carries the magic and the `hawser` subsystem — and syncs it before the
//! JSON area; so a disk whose only non-zero bytes are in hawser's two header copies, with at
//! least one hawser binary header and no valid copy, is a first format that lost power.
//! A hawser header with no valid copy on a disk that *does* hold data is damage (or an attack),
//! never a reason to format.

use std::io;

use hawser_luks2::{self as luks2, HeaderError, HeaderSlot, Integrity, PolicyError, Selected};

use crate::platform::error_chain;

/// The smallest disk hawser formats: the 16 MiB LUKS2 metadata plus room for a filesystem.
pub const MIN_DISK_SIZE: u64 = 64 * 1024 * 1024;
/// Scanned for zeros / signatures from the start of the disk.
pub const HEAD_SCAN: u64 = 4 * 1024 * 1024;
/// Scanned from the start of the data segment and before the end of the disk.
pub const REGION_SCAN: u64 = 1024 * 1024;

/// Positioned reads and writes on a disk (a block device in the guest, a file in tests).
pub trait BlockIo {
    /// Size in bytes.
    fn size(&self) -> u64;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
}

impl BlockIo for std::fs::File {
    fn size(&self) -> u64 {
        use std::io::{Seek, SeekFrom};
        // A block device's metadata length is 0; seeking to the end gives its size.
        let mut file = self;
        file.seek(SeekFrom::End(0)).unwrap_or(0)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }
}

/// What the disk holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// Zeros where any format would have left a signature.
    Blank,
    /// A header hawser wrote and accepts.
    Hawser(Box<Selected>),
    /// hawser's first format lost power before one header copy was complete.
    InterruptedFormat { copies: String },
}

/// Why the disk is not one hawser formats or opens.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The disk is smaller than the LUKS2 header area plus one data sector.
    #[error("it has {size} bytes; the state disk needs at least {MIN_DISK_SIZE}")]
    TooSmall { size: u64 },
    /// The disk holds something else (a file system, another LUKS volume, data).
    #[error(
        "it holds {what}; hawser formats only a blank disk or its own never-initialized state disk"
    )]
    Foreign { what: String },
    /// The LUKS2 header is well-formed but not one hawser opens (cipher, sizes, integrity).
    #[error("its LUKS2 header is not one hawser opens")]
    Refused(#[source] HeaderError),
    /// Both header copies are damaged and the data area is not blank.
    #[error(
        "hawser's LUKS2 header is damaged ({copies}) but the disk holds data at byte {data_at}; \
         refusing to format it"
    )]
    Damaged { copies: String, data_at: u64 },
    /// A read of the header area failed.
    #[error("cannot read {len} bytes at offset {offset}")]
    Read {
        offset: u64,
        len: usize,
        #[source]
        source: io::Error,
    },
}

fn read(disk: &dyn BlockIo, offset: u64, len: u64) -> Result<Vec<u8>, ProbeError> {
    let len = len.min(disk.size().saturating_sub(offset)) as usize;
    let mut buf = vec![0u8; len];
    disk.read_exact_at(&mut buf, offset)
        .map_err(|source| ProbeError::Read {
            offset,
            len,
            source,
        })?;
    Ok(buf)
}

/// The first non-zero byte's offset within `bytes`.
fn first_non_zero(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b != 0)
}

/// Looks at `disk` and says what it holds, checking hawser's header against `integrity`.
pub fn probe(disk: &dyn BlockIo, integrity: Integrity) -> Result<Contents, ProbeError> {
    let size = disk.size();
    if size < MIN_DISK_SIZE {
        return Err(ProbeError::TooSmall { size });
    }
    let head = read(disk, 0, HEAD_SCAN)?;
    let copies = match luks2::parse_headers(&head[..luks2::HEADERS_LEN], integrity) {
        Ok(selected) => return Ok(Contents::Hawser(Box::new(selected))),
        Err(HeaderError::Policy(PolicyError::NotHawser { found, .. })) => {
            return Err(ProbeError::Foreign {
                what: format!("a LUKS2 volume that hawser did not create (subsystem {found:?})"),
            });
        }
        Err(HeaderError::NoValidCopy { primary, secondary }) => {
            format!("{}; {}", error_chain(&primary), error_chain(&secondary))
        }
        Err(refused) => return Err(ProbeError::Refused(refused)),
    };
    let owned = luks2::is_hawser_binary_header(HeaderSlot::Primary, &head)
        || luks2::is_hawser_binary_header(HeaderSlot::Secondary, &head[luks2::HEADER_SIZE..]);

    // Where data would be: outside hawser's header copies if they are hawser's, else anywhere.
    let skip = if owned { luks2::HEADERS_LEN } else { 0 };
    let mut data_at = first_non_zero(&head[skip..]).map(|at| (skip + at) as u64);
    if data_at.is_none() {
        data_at = non_zero_in(disk, luks2::DATA_OFFSET, REGION_SCAN)?;
    }
    if data_at.is_none() {
        data_at = non_zero_in(disk, size - REGION_SCAN, REGION_SCAN)?;
    }
    match (owned, data_at) {
        (true, None) => Ok(Contents::InterruptedFormat { copies }),
        (true, Some(data_at)) => Err(ProbeError::Damaged { copies, data_at }),
        (false, None) => Ok(Contents::Blank),
        (false, Some(at)) => Err(ProbeError::Foreign {
            what: identify(&head).map_or_else(
                || format!("data hawser does not recognize (first non-zero byte at offset {at})"),
                str::to_owned,
            ),
        }),
    }
}

fn non_zero_in(disk: &dyn BlockIo, offset: u64, len: u64) -> Result<Option<u64>, ProbeError> {
    let bytes = read(disk, offset, len)?;
    Ok(first_non_zero(&bytes).map(|at| offset + at as u64))
}

fn at(bytes: &[u8], offset: usize, magic: &[u8]) -> bool {
    bytes.get(offset..offset + magic.len()) == Some(magic)
}

/// Names the format whose signature `head` (the first bytes of a disk) carries, if known.
pub fn identify(head: &[u8]) -> Option<&'static str> {
    let signatures: [(usize, &[u8], &'static str); 14] = [
        (0, b"LUKS\xba\xbe\x00\x01", "a LUKS1 volume"),
        (
            0,
            b"LUKS\xba\xbe\x00\x02",
            "a LUKS2 volume that hawser cannot read",
        ),
        (
            luks2::HEADER_SIZE,
            b"SKUL\xba\xbe",
            "a LUKS2 volume that hawser cannot read",
        ),
        (
            512,
            hawser_disk_format::gpt::SIGNATURE,
            "a GPT partition table",
        ),
        (512, b"LABELONE", "an LVM2 physical volume"),
        (0, b"XFSB", "an XFS filesystem"),
        (65536 + 64, b"_BHRfS_M", "a btrfs filesystem"),
        (1024, &[0xe2, 0xe1, 0xf5, 0xe0], "an EROFS filesystem"),
        (0, b"hsqs", "a squashfs filesystem"),
        (4086, b"SWAPSPACE2", "a swap area"),
        (32769, b"CD001", "an ISO 9660 filesystem"),
        (0, &[0xfc, 0x4e, 0x2b, 0xa9], "a Linux RAID (md 1.1) member"),
        (
            4096,
            &[0xfc, 0x4e, 0x2b, 0xa9],
            "a Linux RAID (md 1.2) member",
        ),
        (1080, &[0x53, 0xef], "an ext2/ext3/ext4 filesystem"),
    ];
    signatures
        .iter()
        .find(|(offset, magic, _)| at(head, *offset, magic))
        .map(|(_, _, name)| *name)
        .or_else(|| at(head, 510, &[0x55, 0xaa]).then_some("an MBR partition table or boot sector"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_luks2::{DiskState, KeyDigest, NewHeader};
    use std::cell::RefCell;

    /// An in-memory disk.
    pub(crate) struct MemDisk(pub RefCell<Vec<u8>>);

    impl MemDisk {
        pub(crate) fn zeroed(size: u64) -> Self {
            MemDisk(RefCell::new(vec![0; size as usize]))
        }
    }

    impl BlockIo for MemDisk {
        fn size(&self) -> u64 {
            self.0.borrow().len() as u64
        }
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let data = self.0.borrow();
            let start = offset as usize;
            let src = data
                .get(start..start + buf.len())
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        }
        fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            let start = offset as usize;
            self.0.borrow_mut()[start..start + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
    }

    fn header(state: DiskState) -> Vec<u8> {
        let header = NewHeader {
            uuid: "0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c".into(),
            integrity: Integrity::None,
            digest: KeyDigest::compute(&[7; 64], [1; 32], 1000),
            state,
            seqid: 1,
            cluster_id: None,
        };
        let mut bytes = luks2::new_header_copy(HeaderSlot::Primary, &header, [3; 64]);
        bytes.extend(luks2::new_header_copy(
            HeaderSlot::Secondary,
            &header,
            [4; 64],
        ));
        bytes
    }

    const SIZE: u64 = MIN_DISK_SIZE;

    #[test]
    fn zeros_are_blank() {
        assert_eq!(
            probe(&MemDisk::zeroed(SIZE), Integrity::None).unwrap(),
            Contents::Blank
        );
    }

    #[test]
    fn a_small_disk_is_refused_with_its_size() {
        let err = probe(&MemDisk::zeroed(SIZE - 512), Integrity::None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it has 67108352 bytes; the state disk needs at least 67108864"
        );
    }

    #[test]
    fn hawsers_header_is_read() {
        let disk = MemDisk::zeroed(SIZE);
        disk.write_all_at(&header(DiskState::Initialized), 0)
            .unwrap();
        // Data in the segment does not matter once the header is valid.
        disk.write_all_at(&[1; 16], luks2::DATA_OFFSET).unwrap();
        let Contents::Hawser(selected) = probe(&disk, Integrity::None).unwrap() else {
            panic!("not hawser's")
        };
        assert_eq!(selected.header.state, DiskState::Initialized);
    }

    #[test]
    fn data_anywhere_scanned_is_foreign() {
        for offset in [0, 100_000, HEAD_SCAN - 1, luks2::DATA_OFFSET + 5, SIZE - 1] {
            let disk = MemDisk::zeroed(SIZE);
            disk.write_all_at(&[0x42], offset).unwrap();
            let err = probe(&disk, Integrity::None).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "it holds data hawser does not recognize (first non-zero byte at offset {offset}); \
                     hawser formats only a blank disk or its own never-initialized state disk"
                )
            );
        }
    }

    #[test]
    fn an_interrupted_first_format_is_recognized() {
        // Only the primary binary header's first sector made it to the disk.
        let disk = MemDisk::zeroed(SIZE);
        disk.write_all_at(&header(DiskState::Formatting)[..512], 0)
            .unwrap();
        let contents = probe(&disk, Integrity::None).unwrap();
        assert!(
            matches!(&contents, Contents::InterruptedFormat { copies } if copies.contains("wrong checksum")),
            "{contents:?}"
        );
        // Or the secondary's binary header and the first bytes of its JSON area.
        let disk = MemDisk::zeroed(SIZE);
        let bytes = header(DiskState::Formatting);
        disk.write_all_at(
            &bytes[luks2::HEADER_SIZE..luks2::HEADER_SIZE + 4200],
            luks2::SECONDARY_OFFSET,
        )
        .unwrap();
        let contents = probe(&disk, Integrity::None).unwrap();
        assert!(
            matches!(contents, Contents::InterruptedFormat { .. }),
            "{contents:?}"
        );
    }

    #[test]
    fn a_damaged_hawser_header_on_a_disk_with_data_is_not_formatted() {
        let disk = MemDisk::zeroed(SIZE);
        let mut bytes = header(DiskState::Initialized);
        bytes[5000] ^= 1;
        bytes[luks2::HEADER_SIZE + 5000] ^= 1;
        disk.write_all_at(&bytes, 0).unwrap();
        disk.write_all_at(&[9; 4096], luks2::DATA_OFFSET).unwrap();
        let err = probe(&disk, Integrity::None).unwrap_err();
        assert!(
            matches!(err, ProbeError::Damaged { data_at, .. } if data_at == luks2::DATA_OFFSET),
            "{err}"
        );
    }

    #[test]
    fn a_tampered_header_is_refused_not_formatted() {
        let disk = MemDisk::zeroed(SIZE);
        disk.write_all_at(&header(DiskState::Initialized), 0)
            .unwrap();
        let err = probe(&disk, Integrity::HmacSha256).unwrap_err();
        assert!(matches!(err, ProbeError::Refused(_)), "{err}");
        // The reason is the cause, printed once by the chain, not part of the message.
        assert_eq!(err.to_string(), "its LUKS2 header is not one hawser opens");
        assert_eq!(
            error_chain(&err),
            "its LUKS2 header is not one hawser opens: the primary header (offset 0) has data \
             integrity none, hawser only opens \"hmac(sha256)\" (journal encryption \"none\", \
             journal integrity \"none\") (hawser.state_disk_integrity=hmac-sha256)"
        );
    }

    #[test]
    fn known_signatures_are_named() {
        let mut head = vec![0u8; 70_000];
        head[1080] = 0x53;
        head[1081] = 0xef;
        assert_eq!(identify(&head), Some("an ext2/ext3/ext4 filesystem"));
        let mut head = vec![0u8; 70_000];
        head[510] = 0x55;
        head[511] = 0xaa;
        assert_eq!(
            identify(&head),
            Some("an MBR partition table or boot sector")
        );
        head[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(identify(&head), Some("a GPT partition table"));
        let mut head = vec![0u8; 70_000];
        head[..8].copy_from_slice(b"LUKS\xba\xbe\x00\x01");
        assert_eq!(identify(&head), Some("a LUKS1 volume"));
        assert_eq!(identify(&[0u8; 70_000]), None);
    }
}
