//! New header copies, and the repair of one copy from the other.

use crate::binary::{BinaryHeader, header_copy};
use crate::digest::KeyDigest;
use crate::layout::{DiskState, HEADER_SALT_LEN, HeaderSlot, Integrity, LABEL, SUBSYSTEM};
use crate::metadata::json_area;
use crate::parse::HeaderCopy;

/// What a new header says.
#[derive(Debug, Clone)]
pub struct NewHeader {
    /// Lowercase UUID ([`uuid_from_random`]).
    pub uuid: String,
    /// The measured mode the data segment is mapped with.
    pub integrity: Integrity,
    /// The check of the volume key.
    pub digest: KeyDigest,
    /// [`DiskState::Initialized`] writes hawser's token.
    pub state: DiskState,
    /// The sequence number: higher than that of any copy on the disk, so that this one wins.
    pub seqid: u64,
}

/// A new header's copy, as hawser writes it.
pub fn new_header_copy(
    slot: HeaderSlot,
    header: &NewHeader,
    salt: [u8; HEADER_SALT_LEN],
) -> Vec<u8> {
    header_copy(
        slot,
        &BinaryHeader {
            seqid: header.seqid,
            uuid: &header.uuid,
            label: LABEL,
            subsystem: SUBSYSTEM,
            salt,
        },
        &json_area(header),
    )
}

/// The other copy of `source` (same sequence number and JSON, its own salt): the repair of a
/// damaged or stale copy.
pub fn repaired_copy(source: &HeaderCopy, salt: [u8; HEADER_SALT_LEN]) -> Vec<u8> {
    header_copy(
        source.slot.other(),
        &BinaryHeader {
            seqid: source.seqid,
            uuid: &source.uuid,
            label: &source.label,
            subsystem: &source.subsystem,
            salt,
        },
        &source.json_area,
    )
}

/// Formats a UUID (version 4, RFC 9562 variant) from 16 random bytes, lowercase.
pub fn uuid_from_random(bytes: [u8; 16]) -> String {
    hawser_disk_format::Guid::version_4(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_copy;
    use crate::test_support::new_header;

    #[test]
    fn a_repaired_copy_is_the_other_slot_with_the_same_header() {
        let written = new_header(DiskState::Initialized, Integrity::HmacSha256, 9);
        let primary = new_header_copy(HeaderSlot::Primary, &written, [1; 64]);
        let source = parse_copy(HeaderSlot::Primary, &primary).unwrap();
        let repaired = parse_copy(HeaderSlot::Secondary, &repaired_copy(&source, [2; 64])).unwrap();
        assert_eq!(repaired.slot, HeaderSlot::Secondary);
        assert_eq!(repaired.seqid, 9);
        assert_eq!(repaired.uuid, source.uuid);
        assert_eq!(repaired.json_area, source.json_area);
        assert_eq!(
            repaired_copy(&source, [2; 64]),
            new_header_copy(HeaderSlot::Secondary, &written, [2; 64])
        );
    }
}
