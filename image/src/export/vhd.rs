//! Azure's disk format: a fixed VHD, the raw disk followed by a 512-byte footer.
//!
//! The footer is Microsoft's "Virtual Hard Disk Image Format Specification" (version 1.0,
//! October 2006, <https://www.microsoft.com/en-us/download/details.aspx?id=23850>), "Hard Disk
//! Footer Format"; every field is big-endian:
//!
//! ```text
//! offset size field                 hawser writes
//!    0     8  cookie                "conectix"
//!    8     4  features              0x00000002 (the reserved bit the spec requires set)
//!   12     4  file format version   0x00010000
//!   16     8  data offset           0xFFFFFFFFFFFFFFFF (a fixed disk has no dynamic header)
//!   24     4  time stamp            SOURCE_DATE_EPOCH in seconds since 2000-01-01 00:00 UTC
//!   28     4  creator application  "win " (see below)
//!   32     4  creator version       0x00010000
//!   36     4  creator host OS       "Wi2k"
//!   40     8  original size         the virtual size
//!   48     8  current size          the virtual size
//!   56     4  disk geometry         cylinders (2), heads (1), sectors per track (1): spec appendix
//!   60     4  disk type             2 (fixed)
//!   64     4  checksum              one's complement of the sum of the footer's bytes, this field as 0
//!   68    16  unique id             from sha256 of the disk's content (RFC 4122 version and variant bits)
//!   84     1  saved state           0
//!   85   427  reserved              0
//! ```
//!
//! The virtual size is the raw disk rounded up to a whole MiB: Azure refuses other sizes (its
//! upload takes "N × MiB + 512 bytes", `Add-AzVhd`,
//! <https://learn.microsoft.com/powershell/module/az.compute/add-azvhd>). The CHS geometry
//! rarely multiplies out to that size, so readers must take the current size as the size:
//! Hyper-V does, and QEMU does for the creator applications it knows to mean that (`win `,
//! `qem2`, `d2v `, `CTXS`, `tap`; block/vpc.c), but for any other it takes the smaller CHS size.
//! hawser therefore writes Hyper-V's `win `, the hypervisor the image is for, and makes no other
//! claim (creator version 1.0).
//!
//! The data is copied as it is, and runs of zeros are skipped (left as holes), so the VHD is as
//! sparse on the build host as the raw disk.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{
    ExportError, ExportedDisk, MIB, Progress, check_read, finish, open_disk, partial_path, round_up,
};
use crate::platform::DiskFormat;
use crate::tool::io_error;

/// The file an Azure image build writes next to the raw disk.
pub const VHD_FILE: &str = "hawser-azure.vhd";

/// The footer's size.
pub const FOOTER_LEN: usize = 512;
/// The footer's first bytes.
pub const COOKIE: &[u8; 8] = b"conectix";
/// The virtual size of an Azure disk is a multiple of this.
pub const ALIGNMENT: u64 = MIB;
/// The disk type of a fixed VHD.
pub const DISK_TYPE_FIXED: u32 = 2;
/// 2000-01-01T00:00:00Z, the VHD time stamps' epoch, in Unix seconds.
pub const VHD_EPOCH: u64 = 946_684_800;

const FEATURES_RESERVED: u32 = 0x0000_0002;
const FILE_FORMAT_VERSION: u32 = 0x0001_0000;
const FIXED_DATA_OFFSET: u64 = u64::MAX;
const CREATOR_APPLICATION: &[u8; 4] = b"win ";
const CREATOR_VERSION: u32 = 0x0001_0000;
const CREATOR_HOST_OS: &[u8; 4] = b"Wi2k";
const CHECKSUM_AT: usize = 64;

/// A disk's CHS geometry as the footer stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub cylinders: u16,
    pub heads: u8,
    pub sectors_per_track: u8,
}

impl Geometry {
    /// The sectors the geometry addresses.
    pub fn sectors(self) -> u64 {
        u64::from(self.cylinders) * u64::from(self.heads) * u64::from(self.sectors_per_track)
    }
}

/// The geometry of a disk of `total_sectors` 512-byte sectors: the algorithm of the
/// specification's appendix "CHS Calculation", capped at 65535 × 16 × 255 sectors.
pub fn geometry(total_sectors: u64) -> Geometry {
    let total = total_sectors.min(65535 * 16 * 255);
    let (sectors_per_track, heads, cylinder_times_heads) = if total >= 65535 * 16 * 63 {
        (255, 16, total / 255)
    } else {
        let mut sectors_per_track = 17;
        let mut cylinder_times_heads = total / sectors_per_track;
        let mut heads = cylinder_times_heads.div_ceil(1024).max(4);
        if cylinder_times_heads >= heads * 1024 || heads > 16 {
            sectors_per_track = 31;
            heads = 16;
            cylinder_times_heads = total / sectors_per_track;
        }
        if cylinder_times_heads >= heads * 1024 {
            sectors_per_track = 63;
            heads = 16;
            cylinder_times_heads = total / sectors_per_track;
        }
        (sectors_per_track, heads, cylinder_times_heads)
    };
    // Each bound holds by construction: heads ≤ 16, sectors ≤ 255, cylinders ≤ 65535.
    Geometry {
        cylinders: u16::try_from(cylinder_times_heads / heads).unwrap_or(u16::MAX),
        heads: u8::try_from(heads).unwrap_or(16),
        sectors_per_track: u8::try_from(sectors_per_track).unwrap_or(255),
    }
}

/// The footer fields hawser sets; the rest are the constants of the table above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    /// Seconds since 2000-01-01 00:00 UTC.
    pub timestamp: u32,
    pub original_size: u64,
    pub current_size: u64,
    pub geometry: Geometry,
    pub disk_type: u32,
    pub unique_id: [u8; 16],
}

/// Why 512 bytes are not a VHD footer.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FooterError {
    /// Fewer than 512 bytes.
    #[error("a VHD footer is 512 bytes, not {0}")]
    Length(usize),
    /// The cookie is not `conectix`.
    #[error("no VHD footer: the cookie is {0:?}, not \"conectix\"")]
    Cookie(String),
    /// The stored checksum is not the footer's.
    #[error("the VHD footer's checksum is {stored:#010x}, its bytes sum to {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

impl Footer {
    /// The footer of a fixed disk of `size` bytes (a multiple of 512) made at
    /// `source_date_epoch`.
    pub fn fixed(
        size: u64,
        source_date_epoch: u64,
        unique_id: [u8; 16],
    ) -> Result<Footer, ExportError> {
        let timestamp =
            u32::try_from(source_date_epoch.saturating_sub(VHD_EPOCH)).map_err(|_| {
                ExportError::VhdTimestamp {
                    epoch: source_date_epoch,
                }
            })?;
        Ok(Footer {
            timestamp,
            original_size: size,
            current_size: size,
            geometry: geometry(size / 512),
            disk_type: DISK_TYPE_FIXED,
            unique_id,
        })
    }

    /// The 512 bytes, checksum included.
    pub fn to_bytes(&self) -> [u8; FOOTER_LEN] {
        let mut out = [0u8; FOOTER_LEN];
        out[0..8].copy_from_slice(COOKIE);
        out[8..12].copy_from_slice(&FEATURES_RESERVED.to_be_bytes());
        out[12..16].copy_from_slice(&FILE_FORMAT_VERSION.to_be_bytes());
        out[16..24].copy_from_slice(&FIXED_DATA_OFFSET.to_be_bytes());
        out[24..28].copy_from_slice(&self.timestamp.to_be_bytes());
        out[28..32].copy_from_slice(CREATOR_APPLICATION);
        out[32..36].copy_from_slice(&CREATOR_VERSION.to_be_bytes());
        out[36..40].copy_from_slice(CREATOR_HOST_OS);
        out[40..48].copy_from_slice(&self.original_size.to_be_bytes());
        out[48..56].copy_from_slice(&self.current_size.to_be_bytes());
        out[56..58].copy_from_slice(&self.geometry.cylinders.to_be_bytes());
        out[58] = self.geometry.heads;
        out[59] = self.geometry.sectors_per_track;
        out[60..64].copy_from_slice(&self.disk_type.to_be_bytes());
        out[68..84].copy_from_slice(&self.unique_id);
        let sum = checksum(&out);
        out[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&sum.to_be_bytes());
        out
    }

    /// Reads a footer back, checking its cookie and checksum.
    pub fn parse(bytes: &[u8]) -> Result<Footer, FooterError> {
        let bytes: &[u8; FOOTER_LEN] = bytes
            .try_into()
            .map_err(|_| FooterError::Length(bytes.len()))?;
        if &bytes[0..8] != COOKIE {
            return Err(FooterError::Cookie(
                String::from_utf8_lossy(&bytes[0..8]).into_owned(),
            ));
        }
        let be32 = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let be64 = |at: usize| (u64::from(be32(at)) << 32) | u64::from(be32(at + 4));
        let stored = be32(CHECKSUM_AT);
        let computed = checksum(bytes);
        if stored != computed {
            return Err(FooterError::Checksum { stored, computed });
        }
        let mut unique_id = [0u8; 16];
        unique_id.copy_from_slice(&bytes[68..84]);
        Ok(Footer {
            timestamp: be32(24),
            original_size: be64(40),
            current_size: be64(48),
            geometry: Geometry {
                cylinders: u16::from_be_bytes([bytes[56], bytes[57]]),
                heads: bytes[58],
                sectors_per_track: bytes[59],
            },
            disk_type: be32(60),
            unique_id,
        })
    }
}

/// The footer checksum: the one's complement of the sum of all its bytes but the checksum
/// field's.
pub fn checksum(footer: &[u8; FOOTER_LEN]) -> u32 {
    let sum = footer
        .iter()
        .enumerate()
        .filter(|(at, _)| !(CHECKSUM_AT..CHECKSUM_AT + 4).contains(at))
        .fold(0u32, |sum, (_, byte)| sum.wrapping_add(u32::from(*byte)));
    !sum
}

/// A VHD unique ID for a disk whose content has this sha256: the digest's first 16 bytes with
/// the version 4 and variant bits of RFC 4122 set.
pub fn unique_id(content_sha256: &[u8; 32]) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(&content_sha256[..16]);
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// Writes the raw disk `raw` as a fixed VHD at `out`: the disk, zeros up to the next whole
/// MiB, the footer.
pub fn write_fixed_vhd(
    raw: &Path,
    out: &Path,
    source_date_epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<ExportedDisk, ExportError> {
    let (disk, raw_bytes) = open_disk(raw)?;
    let virtual_size = round_up(raw_bytes, ALIGNMENT);
    // Checked before the long copy.
    Footer::fixed(virtual_size, source_date_epoch, [0; 16])?;
    let partial = partial_path(out);
    let written = write_vhd_file(
        disk,
        raw,
        raw_bytes,
        virtual_size,
        source_date_epoch,
        &partial,
        progress,
    )
    .inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    finish(&partial, out)?;
    Ok(ExportedDisk {
        format: DiskFormat::FixedVhd,
        path: out.to_path_buf(),
        bytes: virtual_size + FOOTER_LEN as u64,
        disk_bytes: virtual_size,
        sha256: written,
    })
}

/// The copy, the padding and the footer; returns the sha256 of the whole file.
fn write_vhd_file(
    disk: File,
    raw: &Path,
    raw_bytes: u64,
    virtual_size: u64,
    source_date_epoch: u64,
    partial: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<String, ExportError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(partial)
        .map_err(io_error("create", partial))?;
    let mut reader = Progress::new(disk.take(raw_bytes), raw_bytes, "azure: VHD of", progress);
    let mut content = Sha256::new().chain_update(b"hawser vhd unique id\0");
    let mut whole = Sha256::new();
    let mut chunk = vec![0u8; MIB as usize];
    loop {
        let n = read_chunk(&mut reader, &mut chunk).map_err(io_error("read", raw))?;
        if n == 0 {
            break;
        }
        let data = &chunk[..n];
        content.update(data);
        whole.update(data);
        if data.iter().all(|&byte| byte == 0) {
            file.seek(SeekFrom::Current(n as i64))
                .map_err(io_error("write", partial))?;
        } else {
            file.write_all(data).map_err(io_error("write", partial))?;
        }
    }
    check_read(raw, reader.read(), raw_bytes)?;
    let padding = vec![0u8; (virtual_size - raw_bytes) as usize];
    content.update(&padding);
    whole.update(&padding);
    let content: [u8; 32] = content.finalize().into();
    let footer = Footer::fixed(virtual_size, source_date_epoch, unique_id(&content))?.to_bytes();
    whole.update(footer);
    file.set_len(virtual_size)
        .map_err(io_error("write", partial))?;
    file.seek(SeekFrom::Start(virtual_size))
        .map_err(io_error("write", partial))?;
    file.write_all(&footer)
        .map_err(io_error("write", partial))?;
    file.sync_all().map_err(io_error("write", partial))?;
    Ok(hex::encode(whole.finalize()))
}

/// Fills `chunk` as far as the reader goes; returns how much it holds (0 at the end).
fn read_chunk(reader: &mut impl Read, chunk: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < chunk.len() {
        match reader.read(&mut chunk[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod footer_tests {
    use super::*;

    const EPOCH: u64 = 1_795_305_600; // inputs.lock's

    #[test]
    fn geometry_follows_the_specification_appendix() {
        // 3 MiB: 6144 sectors → 17 sectors/track, 4 heads, 90 cylinders.
        assert_eq!(
            geometry(6144),
            Geometry {
                cylinders: 90,
                heads: 4,
                sectors_per_track: 17
            }
        );
        // 1 GiB: past 17 × 16 × 1024 and 31 × 16 × 1024 sectors → 63 sectors/track.
        let gib = geometry(2 * 1024 * 1024);
        assert_eq!((gib.heads, gib.sectors_per_track), (16, 63));
        assert_eq!(u64::from(gib.cylinders), 2_097_152 / 63 / 16);
        // From 65535 × 16 × 63 sectors on: 255 sectors/track, and the cap.
        assert_eq!(
            geometry(65535 * 16 * 63),
            Geometry {
                cylinders: 16191,
                heads: 16,
                sectors_per_track: 255
            }
        );
        let max = geometry(u64::MAX / 512);
        assert_eq!(max.sectors(), 65535 * 16 * 255);
        for sectors in [2048, 6144, 40_960, 1 << 20, 1 << 24, 1 << 30] {
            assert!(geometry(sectors).sectors() <= sectors, "{sectors}");
        }
    }

    #[test]
    fn footer_fields_and_checksum_are_where_the_specification_puts_them() {
        let id = unique_id(&[0xab; 32]);
        let footer = Footer::fixed(4 * MIB, EPOCH, id).unwrap();
        let bytes = footer.to_bytes();
        assert_eq!(&bytes[0..8], b"conectix");
        assert_eq!(bytes[8..12], [0, 0, 0, 2]);
        assert_eq!(bytes[12..16], [0, 1, 0, 0]);
        assert_eq!(bytes[16..24], [0xff; 8]);
        assert_eq!(
            u32::from_be_bytes(bytes[24..28].try_into().unwrap()),
            (EPOCH - 946_684_800) as u32
        );
        assert_eq!(&bytes[28..32], b"win ");
        assert_eq!(
            u64::from_be_bytes(bytes[40..48].try_into().unwrap()),
            4 * MIB
        );
        assert_eq!(
            u64::from_be_bytes(bytes[48..56].try_into().unwrap()),
            4 * MIB
        );
        assert_eq!(
            u32::from_be_bytes(bytes[60..64].try_into().unwrap()),
            DISK_TYPE_FIXED
        );
        assert_eq!(bytes[68..84], id);
        assert!(
            bytes[84..].iter().all(|&b| b == 0),
            "saved state and reserved are zero"
        );
        // One's complement of the byte sum without the checksum field.
        let sum: u32 = bytes
            .iter()
            .enumerate()
            .filter(|(at, _)| !(64..68).contains(at))
            .map(|(_, &b)| u32::from(b))
            .sum();
        assert_eq!(u32::from_be_bytes(bytes[64..68].try_into().unwrap()), !sum);
        assert_eq!(Footer::parse(&bytes).unwrap(), footer);
    }

    #[test]
    fn a_damaged_footer_is_refused() {
        let mut bytes = Footer::fixed(MIB, EPOCH, [1; 16]).unwrap().to_bytes();
        bytes[50] ^= 1;
        assert!(matches!(
            Footer::parse(&bytes),
            Err(FooterError::Checksum { .. })
        ));
        bytes[0] = b'C';
        assert!(matches!(Footer::parse(&bytes), Err(FooterError::Cookie(_))));
        assert_eq!(Footer::parse(&bytes[..100]), Err(FooterError::Length(100)));
    }

    #[test]
    fn time_stamps_count_from_2000_and_end_in_2136() {
        assert_eq!(Footer::fixed(MIB, 0, [0; 16]).unwrap().timestamp, 0);
        assert_eq!(
            Footer::fixed(MIB, VHD_EPOCH + 1, [0; 16])
                .unwrap()
                .timestamp,
            1
        );
        let last = VHD_EPOCH + u64::from(u32::MAX);
        assert_eq!(
            Footer::fixed(MIB, last, [0; 16]).unwrap().timestamp,
            u32::MAX
        );
        assert!(matches!(
            Footer::fixed(MIB, last + 1, [0; 16]),
            Err(ExportError::VhdTimestamp { .. })
        ));
    }

    #[test]
    fn unique_ids_are_rfc_4122_version_4() {
        let id = unique_id(&[0xff; 32]);
        assert_eq!(id[6] >> 4, 4);
        assert_eq!(id[8] >> 6, 0b10);
        assert_ne!(unique_id(&[1; 32]), unique_id(&[2; 32]));
    }
}
