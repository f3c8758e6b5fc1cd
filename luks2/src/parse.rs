//! One header copy, as bytes from the disk: the format checks every LUKS2 reader makes (magic,
//! version, sizes, offset, checksum, the JSON area's shape). Whether hawser accepts what the
//! copy describes is [`validate`](crate::validate)'s question.

use std::fmt;

use crate::binary::{
    CHECKSUM_ALG_LEN, LABEL_LEN, OFF_CHECKSUM_ALG, OFF_HDR_OFFSET, OFF_HDR_SIZE, OFF_LABEL,
    OFF_SEQID, OFF_SUBSYSTEM, OFF_UUID, OFF_VERSION, UUID_LEN, be_u16, be_u64, c_string,
    checksum_matches,
};
use crate::copy_error::CopyError;
use crate::layout::{BINARY_HEADER_LEN, CHECKSUM_ALG, HEADER_SIZE, HeaderSlot};
use crate::metadata::{Metadata, parse_json_area};

/// One header copy that passed the format checks (magic, sizes, checksum, JSON shape).
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderCopy {
    /// Where the copy was read from.
    pub slot: HeaderSlot,
    /// The sequence number: the newer of two copies has the higher one.
    pub seqid: u64,
    /// The label.
    pub label: String,
    /// The owner ([`SUBSYSTEM`](crate::SUBSYSTEM) for hawser's disk).
    pub subsystem: String,
    /// As written (cryptsetup writes it lowercase).
    pub uuid: String,
    /// The JSON area, byte for byte (for repairing the other copy).
    pub json_area: Vec<u8>,
    pub(crate) metadata: Metadata,
}

impl fmt::Debug for HeaderCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderCopy")
            .field("slot", &self.slot)
            .field("seqid", &self.seqid)
            .field("label", &self.label)
            .field("subsystem", &self.subsystem)
            .field("uuid", &self.uuid)
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

/// Parses one copy (exactly [`HEADER_SIZE`] bytes read at `slot.offset()`): magic, version,
/// header size, offset, checksum, and the JSON area's shape. Says nothing about whether hawser
/// accepts what the header describes: that is [`validate`](crate::validate).
pub fn parse_copy(slot: HeaderSlot, bytes: &[u8]) -> Result<HeaderCopy, CopyError> {
    if bytes.len() != HEADER_SIZE {
        return Err(CopyError::Length {
            slot,
            len: bytes.len(),
        });
    }
    if &bytes[..6] != slot.magic() {
        return Err(CopyError::NoMagic { slot });
    }
    let version = be_u16(bytes, OFF_VERSION);
    if version != 2 {
        return Err(CopyError::Version { slot, version });
    }
    let size = be_u64(bytes, OFF_HDR_SIZE);
    if size != HEADER_SIZE as u64 {
        return Err(CopyError::HeaderSize { slot, size });
    }
    let declared = be_u64(bytes, OFF_HDR_OFFSET);
    if declared != slot.offset() {
        return Err(CopyError::Offset { slot, declared });
    }
    let alg = c_string(
        slot,
        "checksum algorithm",
        bytes,
        OFF_CHECKSUM_ALG,
        CHECKSUM_ALG_LEN,
    )?;
    if alg != CHECKSUM_ALG {
        return Err(CopyError::ChecksumAlgorithm { slot, found: alg });
    }
    if !checksum_matches(bytes) {
        return Err(CopyError::Checksum { slot });
    }
    let label = c_string(slot, "label", bytes, OFF_LABEL, LABEL_LEN)?;
    let subsystem = c_string(slot, "subsystem", bytes, OFF_SUBSYSTEM, LABEL_LEN)?;
    let uuid = c_string(slot, "UUID", bytes, OFF_UUID, UUID_LEN)?;
    if let Err(source) = uuid.parse::<hawser_disk_format::Guid>() {
        return Err(CopyError::Uuid { slot, source });
    }
    let json_area = &bytes[BINARY_HEADER_LEN..];
    let metadata = parse_json_area(slot, json_area)?;
    Ok(HeaderCopy {
        slot,
        seqid: be_u64(bytes, OFF_SEQID),
        label,
        subsystem,
        uuid,
        json_area: json_area.to_vec(),
        metadata,
    })
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with hex digits of either case.
pub fn is_uuid(text: &str) -> bool {
    text.parse::<hawser_disk_format::Guid>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::{OFF_CSUM, OFF_SALT};
    use crate::layout::{DiskState, Integrity};
    use crate::select::parse_headers;
    use crate::test_support::{both_copies, error_chain, new_header};
    use crate::write::uuid_from_random;

    #[test]
    fn binary_header_damage_is_named() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let good = both_copies(&written);
        let cases: Vec<(usize, u8, &str)> = vec![
            (0, b'X', "no LUKS2 magic"),
            (OFF_VERSION + 1, 1, "LUKS version 1"),
            (OFF_HDR_SIZE + 6, 0x80, "header size of 32768 bytes"),
            (OFF_HDR_OFFSET + 7, 1, "lives at offset 1"),
            (OFF_CHECKSUM_ALG, b'x', "checksum algorithm \"xha256\""),
            (OFF_SALT, 0, "wrong checksum"),
            (OFF_CSUM, 0, "wrong checksum"),
        ];
        for (offset, value, expected) in cases {
            let mut area = good.clone();
            area[offset] = value;
            area[HEADER_SIZE + offset] = value;
            let err = parse_headers(&area, Integrity::None).unwrap_err();
            let chain = error_chain(&err);
            assert!(chain.contains(expected), "{expected:?}: {chain}");
        }
    }

    #[test]
    fn text_fields_must_be_terminated_utf8_and_a_uuid() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let good = both_copies(&written)[..HEADER_SIZE].to_vec();
        let reparse = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut copy = good.clone();
            edit(&mut copy);
            crate::binary::seal(&mut copy);
            error_chain(&parse_copy(HeaderSlot::Primary, &copy).unwrap_err())
        };
        assert_eq!(
            reparse(&|c| c[OFF_LABEL..OFF_LABEL + LABEL_LEN].fill(b'a')),
            "the primary header (offset 0) has a malformed label: not NUL-terminated"
        );
        assert!(
            reparse(&|c| c[OFF_SUBSYSTEM] = 0xff).starts_with(
                "the primary header (offset 0) has a malformed subsystem: not UTF-8: "
            )
        );
        assert!(
            reparse(&|c| c[OFF_UUID] = b'g')
                .starts_with("the primary header (offset 0) has a malformed UUID: \"gf8a41cf-")
        );
        assert_eq!(
            error_chain(&parse_copy(HeaderSlot::Secondary, &good[..100]).unwrap_err()),
            "the secondary header (offset 16384) has 100 bytes; a header copy has 16384"
        );
    }

    #[test]
    fn uuids_are_version_4_and_lowercase() {
        let uuid = uuid_from_random([0xff; 16]);
        assert_eq!(uuid, "ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert!(is_uuid(&uuid));
        assert!(is_uuid("0F8A41CF-4C2E-4E76-9A3B-5D1E2F3A4B5C"));
        assert!(!is_uuid("0f8a41cf4c2e4e769a3b5d1e2f3a4b5c"));
        assert!(!is_uuid("0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5g"));
    }
}
