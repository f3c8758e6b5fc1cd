//! The GUID partition table: the partition types hawser uses, the rule that names the rootfs
//! partitions after the root hash, and a strict reader of the primary table.
//!
//! The layout (UEFI 2.10, 5.3), all integers little-endian, GUIDs in GPT's mixed-endian form:
//!
//! ```text
//!   header (LBA 1)    0 signature "EFI PART"   8 revision 0x00010000   12 header size (92)
//!                    16 header CRC32 (over header size bytes, this field zero)   20 reserved
//!                    24 current LBA   32 backup LBA   40 first usable LBA   48 last usable LBA
//!                    56 disk GUID   72 entry array LBA   80 number of entries   84 entry size
//!                    88 entry array CRC32
//!   entry (128 B)     0 type GUID   16 unique GUID (PARTUUID)   32 first LBA   40 last LBA
//!                    48 attributes   56 name, 36 UTF-16LE code units
//! ```
//!
//! ## The reader
//!
//! On the node the partition table is untrusted input (the host writes the disk). PID 1 reads
//! it only to find which partitions to hand to dm-verity; everything that matters is then
//! checked against the measured root hash. So the reader is small and refuses what it does not
//! expect rather than repairing it: only the primary header is read (a damaged primary table is
//! a damaged image, not something to work around with the backup), both CRCs must match, and
//! every used entry must lie inside the usable area.
//!
//! [`parse_header`] and [`parse_entries`] are pure (bytes in, values out) so that they can be
//! fuzzed; the caller reads the blocks.
//!
//! ## The writer
//!
//! The image builder writes the table with the `gptman` crate from the constants here; its tests
//! read the result back with this reader.

use std::fmt;

use crate::guid::Guid;

/// `"EFI PART"`.
pub const SIGNATURE: &[u8; 8] = b"EFI PART";
/// GPT revision 1.0.
pub const REVISION: u32 = 0x0001_0000;
/// The size of the header fields of revision 1.0.
pub const HEADER_SIZE: usize = 92;
/// The size of a partition entry's fields (and the entry size every partitioning tool writes).
pub const ENTRY_SIZE: usize = 128;
/// A partition name is at most this many UTF-16 code units (72 bytes at offset 56).
pub const NAME_UNITS: usize = 36;
/// More entries than any partitioning tool writes (128 is the usual number).
pub const MAX_ENTRIES: u32 = 4096;
/// Largest accepted size of one partition entry (128 is the usual size).
pub const MAX_ENTRY_SIZE: u32 = 4096;

/// The EFI System Partition type, C12A7328-F81F-11D2-BA4B-00A0C93EC93B.
pub const ESP_TYPE: Guid = Guid::from_u128(0xC12A_7328_F81F_11D2_BA4B_00A0_C93E_C93B);
/// The Discoverable Partitions Specification's type of an x86-64 root file system ("Root
/// Partition (x86-64)"), 4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709: hawser's rootfs data partition.
pub const ROOT_X86_64_TYPE: Guid = Guid::from_u128(0x4F68_BCE3_E8CD_4DB1_96E7_FBCA_F984_B709);
/// The Discoverable Partitions Specification's type of the dm-verity tree of an x86-64 root file
/// system ("Root Verity Partition (x86-64)"), 2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5.
pub const ROOT_X86_64_VERITY_TYPE: Guid =
    Guid::from_u128(0x2C73_57ED_EBD2_46D9_AEC1_23D4_37EC_2BF5);

/// The PARTUUIDs `(root, verity)` of the rootfs data partition and its dm-verity partition for
/// a dm-verity root hash: its first and its second half, each read as a GUID in text order.
///
/// This is systemd-repart's convention (Discoverable Partitions): the UUID whose canonical text
/// is the hex of `root_hash[0..16]`, resp. `root_hash[16..32]`. The image builder names the
/// partitions so; PID 1 looks for them so, with the root hash from the measured kernel command
/// line. The table itself needs no trust: partitions that do not carry the measured hash's
/// halves are not used, and a tree that does not verify against it is refused.
pub fn root_partuuids(root_hash: &[u8; 32]) -> (Guid, Guid) {
    let mut root = [0u8; 16];
    let mut verity = [0u8; 16];
    root.copy_from_slice(&root_hash[..16]);
    verity.copy_from_slice(&root_hash[16..]);
    (Guid::from_bytes(root), Guid::from_bytes(verity))
}

/// Why bytes are not a partition table this reader accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GptError {
    /// The block at LBA 1 is not a GPT header (or is shorter than one).
    #[error("no GPT signature at LBA 1")]
    NoSignature,
    /// A header field has a value this reader does not accept.
    #[error("GPT header field {field} is {actual}, expected {expected}")]
    Field {
        field: &'static str,
        actual: String,
        expected: String,
    },
    /// The header's bytes do not match its CRC.
    #[error("GPT header CRC32 is {stored:#010x}, but the header's bytes give {computed:#010x}")]
    HeaderCrc { stored: u32, computed: u32 },
    /// The partition entry array's bytes do not match the CRC in the header.
    #[error(
        "GPT partition entry array CRC32 is {stored:#010x}, but the entries' bytes give \
         {computed:#010x}"
    )]
    EntriesCrc { stored: u32, computed: u32 },
    /// The caller passed an entry array of another length than the header describes.
    #[error("GPT partition entry array is {actual} bytes, expected {expected}")]
    EntriesLength { actual: usize, expected: usize },
    /// A used entry lies (partly) outside the usable area, or ends before it starts.
    #[error(
        "GPT partition {number} spans LBA {first_lba}..={last_lba}, outside the usable area \
         {first_usable}..={last_usable}"
    )]
    EntryOutOfRange {
        number: u32,
        first_lba: u64,
        last_lba: u64,
        first_usable: u64,
        last_usable: u64,
    },
    /// Two used entries carry the same unique GUID (PARTUUID).
    #[error("GPT partitions {first} and {second} have the same unique GUID {guid}")]
    DuplicateGuid { first: u32, second: u32, guid: Guid },
}

/// The fields of a primary GPT header that locating partitions needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptHeader {
    /// The first logical block a partition may use.
    pub first_usable_lba: u64,
    /// The last logical block a partition may use (inclusive).
    pub last_usable_lba: u64,
    pub disk_guid: Guid,
    /// Where the partition entry array starts.
    pub partition_entry_lba: u64,
    pub num_entries: u32,
    /// Bytes per entry: a power of two from [`ENTRY_SIZE`] to [`MAX_ENTRY_SIZE`].
    pub entry_size: u32,
    pub entries_crc32: u32,
}

impl GptHeader {
    /// Bytes of the partition entry array.
    pub fn entries_len(&self) -> usize {
        self.num_entries as usize * self.entry_size as usize
    }
}

/// One used partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptPartition {
    /// 1-based position in the entry array: the kernel's partition number (`vda<number>`).
    pub number: u32,
    pub type_guid: Guid,
    /// The PARTUUID.
    pub unique_guid: Guid,
    pub first_lba: u64,
    /// Inclusive.
    pub last_lba: u64,
}

impl GptPartition {
    /// Length in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.last_lba - self.first_lba + 1
    }
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(field)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(field)
}

fn guid_at(bytes: &[u8], offset: usize) -> Guid {
    let mut field = [0u8; 16];
    field.copy_from_slice(&bytes[offset..offset + 16]);
    Guid::from_gpt_bytes(field)
}

fn field_error(field: &'static str, actual: impl fmt::Display, expected: &str) -> GptError {
    GptError::Field {
        field,
        actual: actual.to_string(),
        expected: expected.to_owned(),
    }
}

/// Parses the primary GPT header from the logical block at LBA 1 (`block`, 512 or 4096 bytes).
pub fn parse_header(block: &[u8]) -> Result<GptHeader, GptError> {
    if block.len() < HEADER_SIZE || &block[0..8] != SIGNATURE {
        return Err(GptError::NoSignature);
    }
    let revision = u32_at(block, 8);
    if revision != REVISION {
        return Err(field_error(
            "revision",
            format_args!("{revision:#010x}"),
            "0x00010000",
        ));
    }
    let header_size = u32_at(block, 12) as usize;
    if header_size < HEADER_SIZE || header_size > block.len() {
        return Err(field_error(
            "header size",
            header_size,
            &format!("{HEADER_SIZE} to {} bytes", block.len()),
        ));
    }
    let stored = u32_at(block, 16);
    let mut header = block[..header_size].to_vec();
    header[16..20].fill(0);
    let computed = crc32(&header);
    if stored != computed {
        return Err(GptError::HeaderCrc { stored, computed });
    }
    if u32_at(block, 20) != 0 {
        return Err(field_error("reserved", u32_at(block, 20), "0"));
    }
    let my_lba = u64_at(block, 24);
    if my_lba != 1 {
        return Err(field_error("current LBA", my_lba, "1 (the primary header)"));
    }
    let first_usable_lba = u64_at(block, 40);
    let last_usable_lba = u64_at(block, 48);
    if first_usable_lba > last_usable_lba {
        return Err(field_error(
            "first usable LBA",
            first_usable_lba,
            &format!("at most the last usable LBA {last_usable_lba}"),
        ));
    }
    let partition_entry_lba = u64_at(block, 72);
    if partition_entry_lba < 2 || partition_entry_lba >= first_usable_lba {
        return Err(field_error(
            "partition entry LBA",
            partition_entry_lba,
            &format!("2 to {}", first_usable_lba.saturating_sub(1)),
        ));
    }
    let num_entries = u32_at(block, 80);
    if num_entries == 0 || num_entries > MAX_ENTRIES {
        return Err(field_error(
            "number of partition entries",
            num_entries,
            &format!("1 to {MAX_ENTRIES}"),
        ));
    }
    let entry_size = u32_at(block, 84);
    if entry_size < ENTRY_SIZE as u32
        || entry_size > MAX_ENTRY_SIZE
        || !entry_size.is_power_of_two()
    {
        return Err(field_error(
            "partition entry size",
            entry_size,
            &format!("a power of two from {ENTRY_SIZE} to {MAX_ENTRY_SIZE}"),
        ));
    }
    Ok(GptHeader {
        first_usable_lba,
        last_usable_lba,
        disk_guid: guid_at(block, 56),
        partition_entry_lba,
        num_entries,
        entry_size,
        entries_crc32: u32_at(block, 88),
    })
}

/// Parses the partition entry array `entries` (exactly [`GptHeader::entries_len`] bytes) and
/// returns the used entries.
pub fn parse_entries(header: &GptHeader, entries: &[u8]) -> Result<Vec<GptPartition>, GptError> {
    if entries.len() != header.entries_len() {
        return Err(GptError::EntriesLength {
            actual: entries.len(),
            expected: header.entries_len(),
        });
    }
    let computed = crc32(entries);
    if computed != header.entries_crc32 {
        return Err(GptError::EntriesCrc {
            stored: header.entries_crc32,
            computed,
        });
    }
    let mut partitions: Vec<GptPartition> = Vec::new();
    for (index, entry) in entries.chunks_exact(header.entry_size as usize).enumerate() {
        let type_guid = guid_at(entry, 0);
        if type_guid.is_nil() {
            continue;
        }
        // `index` < MAX_ENTRIES, so the number fits.
        let number = index as u32 + 1;
        let partition = GptPartition {
            number,
            type_guid,
            unique_guid: guid_at(entry, 16),
            first_lba: u64_at(entry, 32),
            last_lba: u64_at(entry, 40),
        };
        if partition.first_lba > partition.last_lba
            || partition.first_lba < header.first_usable_lba
            || partition.last_lba > header.last_usable_lba
        {
            return Err(GptError::EntryOutOfRange {
                number,
                first_lba: partition.first_lba,
                last_lba: partition.last_lba,
                first_usable: header.first_usable_lba,
                last_usable: header.last_usable_lba,
            });
        }
        if let Some(other) = partitions
            .iter()
            .find(|p| p.unique_guid == partition.unique_guid)
        {
            return Err(GptError::DuplicateGuid {
                first: other.number,
                second: number,
                guid: partition.unique_guid,
            });
        }
        partitions.push(partition);
    }
    Ok(partitions)
}

/// CRC-32 (IEEE 802.3, reflected, as GPT uses it).
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with one used entry, as a partitioning tool writes it (512-byte blocks).
    fn table(entries: &[(u32, Guid, Guid, u64, u64)]) -> (Vec<u8>, Vec<u8>) {
        let num_entries = 128u32;
        let mut array = vec![0u8; num_entries as usize * 128];
        for &(number, type_guid, unique_guid, first, last) in entries {
            let entry = &mut array[(number as usize - 1) * 128..number as usize * 128];
            entry[0..16].copy_from_slice(&type_guid.to_gpt_bytes());
            entry[16..32].copy_from_slice(&unique_guid.to_gpt_bytes());
            entry[32..40].copy_from_slice(&first.to_le_bytes());
            entry[40..48].copy_from_slice(&last.to_le_bytes());
        }
        let mut header = vec![0u8; 512];
        header[0..8].copy_from_slice(SIGNATURE);
        header[8..12].copy_from_slice(&REVISION.to_le_bytes());
        header[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
        header[24..32].copy_from_slice(&1u64.to_le_bytes());
        header[32..40].copy_from_slice(&9999u64.to_le_bytes());
        header[40..48].copy_from_slice(&34u64.to_le_bytes());
        header[48..56].copy_from_slice(&9966u64.to_le_bytes());
        header[72..80].copy_from_slice(&2u64.to_le_bytes());
        header[80..84].copy_from_slice(&num_entries.to_le_bytes());
        header[84..88].copy_from_slice(&128u32.to_le_bytes());
        header[88..92].copy_from_slice(&crc32(&array).to_le_bytes());
        let crc = crc32(&header[..HEADER_SIZE]);
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        (header, array)
    }

    fn guid(text: &str) -> Guid {
        text.parse().unwrap()
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn a_valid_table_yields_its_used_entries_with_kernel_numbers() {
        let type_guid = guid("4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709");
        let unique = guid("00112233-4455-6677-8899-aabbccddeeff");
        let (header, array) = table(&[(3, type_guid, unique, 2048, 4095)]);
        let parsed = parse_header(&header).unwrap();
        assert_eq!(parsed.partition_entry_lba, 2);
        let partitions = parse_entries(&parsed, &array).unwrap();
        assert_eq!(
            partitions,
            [GptPartition {
                number: 3,
                type_guid,
                unique_guid: unique,
                first_lba: 2048,
                last_lba: 4095
            }]
        );
        assert_eq!(partitions[0].blocks(), 2048);
    }

    fn resealed(mut header: Vec<u8>, edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
        edit(&mut header);
        header[16..20].fill(0);
        let crc = crc32(&header[..HEADER_SIZE]);
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        header
    }

    #[test]
    fn malformed_headers_are_refused_with_the_field() {
        let (header, _) = table(&[]);
        assert_eq!(parse_header(&header[..91]), Err(GptError::NoSignature));
        assert_eq!(parse_header(&[0u8; 512]), Err(GptError::NoSignature));

        let mut corrupt = header.clone();
        corrupt[40] ^= 1;
        assert!(matches!(
            parse_header(&corrupt),
            Err(GptError::HeaderCrc { .. })
        ));

        let cases: [(usize, &[u8], &str); 6] = [
            (8, &[0, 0, 2, 0], "revision"),
            (12, &[0x10, 0x02, 0, 0], "header size"),
            (24, &[2, 0, 0, 0, 0, 0, 0, 0], "current LBA"),
            (72, &[1, 0, 0, 0, 0, 0, 0, 0], "partition entry LBA"),
            (80, &[0, 0, 0, 0], "number of partition entries"),
            (84, &[0xc0, 0, 0, 0], "partition entry size"),
        ];
        for (offset, bytes, field) in cases {
            let bad = resealed(header.clone(), |h| {
                h[offset..offset + bytes.len()].copy_from_slice(bytes)
            });
            let err = parse_header(&bad).unwrap_err();
            assert!(
                matches!(&err, GptError::Field { field: f, .. } if *f == field),
                "{field}: {err}"
            );
        }
    }

    #[test]
    fn entry_arrays_are_checked() {
        let type_guid = guid("4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709");
        let a = guid("00112233-4455-6677-8899-aabbccddeeff");
        let (header, mut array) = table(&[(1, type_guid, a, 2048, 4095)]);
        let parsed = parse_header(&header).unwrap();
        assert!(matches!(
            parse_entries(&parsed, &array[..128]),
            Err(GptError::EntriesLength { .. })
        ));
        array[200] ^= 1;
        assert!(matches!(
            parse_entries(&parsed, &array),
            Err(GptError::EntriesCrc { .. })
        ));

        let (header, array) = table(&[(1, type_guid, a, 2048, 10_000)]);
        let err = parse_entries(&parse_header(&header).unwrap(), &array).unwrap_err();
        assert_eq!(
            err.to_string(),
            "GPT partition 1 spans LBA 2048..=10000, outside the usable area 34..=9966"
        );

        let (header, array) =
            table(&[(1, type_guid, a, 2048, 4095), (2, type_guid, a, 4096, 5000)]);
        let err = parse_entries(&parse_header(&header).unwrap(), &array).unwrap_err();
        assert!(matches!(
            err,
            GptError::DuplicateGuid {
                first: 1,
                second: 2,
                ..
            }
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap stand-in for a fuzzer: every truncation and many corruptions of a valid table.
        let type_guid = guid("4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709");
        let a = guid("00112233-4455-6677-8899-aabbccddeeff");
        let (header, array) = table(&[(1, type_guid, a, 2048, 4095)]);
        for len in 0..header.len() {
            let _ = parse_header(&header[..len]);
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut bad = header.clone();
            bad[(state % HEADER_SIZE as u64) as usize] = (state >> 32) as u8;
            if let Ok(parsed) = parse_header(&bad) {
                let _ = parse_entries(&parsed, &array);
            }
        }
    }

    #[test]
    fn partition_types_are_the_discoverable_partitions_specifications() {
        assert_eq!(
            ROOT_X86_64_TYPE.to_string(),
            "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"
        );
        assert_eq!(
            ROOT_X86_64_VERITY_TYPE.to_string(),
            "2c7357ed-ebd2-46d9-aec1-23d437ec2bf5"
        );
    }

    #[test]
    fn root_partuuids_are_the_root_hash_halves_in_text_order() {
        let root_hash: [u8; 32] = std::array::from_fn(|i| i as u8);
        let (root, verity) = root_partuuids(&root_hash);
        assert_eq!(root.to_string(), "00010203-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(verity.to_string(), "10111213-1415-1617-1819-1a1b1c1d1e1f");
    }
}
