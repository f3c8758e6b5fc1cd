//! Both copies together: which one holds the header, and whether the other needs a repair.

use std::error::Error;
use std::fmt::Write as _;

use crate::copy_error::CopyError;
use crate::layout::{HEADER_SIZE, HEADERS_LEN, HeaderSlot, Integrity};
use crate::parse::{HeaderCopy, parse_copy};
use crate::policy::{Header, PolicyError, validate};

/// Why the two copies together do not give a header hawser opens.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// Neither copy is a LUKS2 header hawser can read: no LUKS2 header at all, or both copies
    /// damaged. The chain continues with the primary copy's reason; the secondary's is in
    /// `secondary`, for callers that report both.
    #[error("no valid LUKS2 header")]
    NoValidCopy {
        /// Why the primary copy is not readable.
        #[source]
        primary: CopyError,
        /// Why the secondary copy is not readable.
        secondary: CopyError,
    },
    /// A readable copy is not one hawser opens. Every readable copy is checked: a tampered
    /// copy is refused even if the other is fine.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Both copies are readable and claim the same sequence number, but differ: one of them
    /// was modified.
    #[error(
        "the two header copies disagree at the same sequence number {seqid} (a modified header)"
    )]
    Inconsistent {
        /// The sequence number both claim.
        seqid: u64,
    },
}

/// The header to use, and what to do about the other copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// What hawser reads from the disk.
    pub header: Header,
    /// The copy the header was read from.
    pub source: HeaderCopy,
    /// The other copy is missing, damaged or older: rewrite it from `source` once the key has
    /// been verified (cryptsetup repairs it the same way). The text says why, for the log.
    pub repair: Option<(HeaderSlot, String)>,
}

/// Reads both copies from the first [`HEADERS_LEN`] bytes of a disk and picks the header,
/// cryptsetup-style: the valid copy with the higher sequence number (primary on a tie). Every
/// valid copy must pass [`validate`]: a tampered copy is refused even if the other is fine.
pub fn parse_headers(area: &[u8], integrity: Integrity) -> Result<Selected, HeaderError> {
    let read = |slot: HeaderSlot, range: std::ops::Range<usize>| {
        area.get(range).map_or_else(
            || {
                Err(CopyError::Length {
                    slot,
                    len: area.len().saturating_sub(slot.offset() as usize),
                })
            },
            |bytes| parse_copy(slot, bytes),
        )
    };
    let primary = read(HeaderSlot::Primary, 0..HEADER_SIZE);
    let secondary = read(HeaderSlot::Secondary, HEADER_SIZE..HEADERS_LEN);
    match (primary, secondary) {
        (Err(primary), Err(secondary)) => Err(HeaderError::NoValidCopy { primary, secondary }),
        (Ok(one), Err(broken)) | (Err(broken), Ok(one)) => {
            let header = validate(&one, integrity)?;
            Ok(Selected {
                header,
                repair: Some((one.slot.other(), error_chain(&broken))),
                source: one,
            })
        }
        (Ok(primary), Ok(secondary)) => {
            let primary_header = validate(&primary, integrity)?;
            let secondary_header = validate(&secondary, integrity)?;
            if primary.seqid == secondary.seqid {
                if primary.json_area != secondary.json_area
                    || primary.uuid != secondary.uuid
                    || primary.subsystem != secondary.subsystem
                {
                    return Err(HeaderError::Inconsistent {
                        seqid: primary.seqid,
                    });
                }
                return Ok(Selected {
                    header: primary_header,
                    source: primary,
                    repair: None,
                });
            }
            let (header, newer, older) = if primary.seqid > secondary.seqid {
                (primary_header, primary, secondary)
            } else {
                (secondary_header, secondary, primary)
            };
            let reason = format!(
                "the {} has sequence number {}, older than {}",
                older.slot, older.seqid, newer.seqid
            );
            Ok(Selected {
                header,
                repair: Some((older.slot, reason)),
                source: newer,
            })
        }
    }
}

/// An error and its causes as one line ("outer: inner: innermost"): the repair reason is a
/// line of the boot log. init and attestation have the same few lines: a format crate depends
/// on no other hawser crate, and [`Selected`] stays `Clone + Eq` by keeping its reason as text.
pub(crate) fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::{OFF_CSUM, checksum};
    use crate::layout::{BINARY_HEADER_LEN, CIPHER, DATA_OFFSET, DiskState, LABEL, SECTOR_SIZE};
    use crate::test_support::{UUID, both_copies, key, new_header};
    use crate::write::{new_header_copy, repaired_copy};

    #[test]
    fn a_written_header_reads_back_with_what_was_written() {
        for integrity in [Integrity::None, Integrity::HmacSha256] {
            for state in [DiskState::Formatting, DiskState::Initialized] {
                let written = new_header(state, integrity, 7);
                let selected = parse_headers(&both_copies(&written), integrity).unwrap();
                assert_eq!(selected.repair, None);
                assert_eq!(selected.source.slot, HeaderSlot::Primary);
                assert_eq!(selected.source.label, LABEL);
                let header = selected.header;
                assert_eq!(header.uuid, UUID);
                assert_eq!(header.seqid, 7);
                assert_eq!(header.state, state);
                assert_eq!(header.integrity, integrity);
                assert_eq!(header.digest, written.digest);
                assert!(header.digest.matches(&key(integrity.key_len())));
            }
        }
    }

    #[test]
    fn a_torn_copy_is_repaired_from_the_other() {
        let written = new_header(DiskState::Initialized, Integrity::None, 3);
        let mut area = both_copies(&written);
        area[BINARY_HEADER_LEN + 100] ^= 0xff; // inside the primary JSON area
        let selected = parse_headers(&area, Integrity::None).unwrap();
        assert_eq!(selected.source.slot, HeaderSlot::Secondary);
        let (slot, reason) = selected.repair.clone().unwrap();
        assert_eq!(slot, HeaderSlot::Primary);
        assert!(reason.contains("wrong checksum"), "{reason}");
        let repaired = repaired_copy(&selected.source, [5; 64]);
        area[..HEADER_SIZE].copy_from_slice(&repaired);
        let again = parse_headers(&area, Integrity::None).unwrap();
        assert_eq!(again.repair, None);
        assert_eq!(again.header, selected.header);
    }

    #[test]
    fn the_repair_reason_carries_the_whole_cause() {
        let written = new_header(DiskState::Initialized, Integrity::None, 3);
        let mut area = both_copies(&written);
        area[HEADER_SIZE + BINARY_HEADER_LEN + 1] = b'[';
        let sum = checksum(&area[HEADER_SIZE..]);
        area[HEADER_SIZE + OFF_CSUM..HEADER_SIZE + OFF_CSUM + 32].copy_from_slice(&sum);
        let (slot, reason) = parse_headers(&area, Integrity::None)
            .unwrap()
            .repair
            .unwrap();
        assert_eq!(slot, HeaderSlot::Secondary);
        assert!(
            reason
                .starts_with("the JSON area of the secondary header (offset 16384) is malformed: "),
            "{reason}"
        );
        assert!(
            reason.ends_with("key must be a string at line 1 column 2"),
            "{reason}"
        );
    }

    #[test]
    fn the_newer_copy_wins_and_the_older_is_repaired() {
        let old = new_header(DiskState::Formatting, Integrity::None, 4);
        let new = new_header(DiskState::Initialized, Integrity::None, 5);
        let mut area = new_header_copy(HeaderSlot::Primary, &old, [1; 64]);
        area.extend(new_header_copy(HeaderSlot::Secondary, &new, [2; 64]));
        let selected = parse_headers(&area, Integrity::None).unwrap();
        assert_eq!(selected.header.state, DiskState::Initialized);
        assert_eq!(selected.header.seqid, 5);
        assert_eq!(selected.repair.unwrap().0, HeaderSlot::Primary);
    }

    #[test]
    fn copies_that_disagree_at_one_seqid_are_refused() {
        let a = new_header(DiskState::Formatting, Integrity::None, 4);
        let b = new_header(DiskState::Initialized, Integrity::None, 4);
        let mut area = new_header_copy(HeaderSlot::Primary, &a, [1; 64]);
        area.extend(new_header_copy(HeaderSlot::Secondary, &b, [2; 64]));
        assert!(matches!(
            parse_headers(&area, Integrity::None).unwrap_err(),
            HeaderError::Inconsistent { seqid: 4 }
        ));
    }

    #[test]
    fn a_disk_shorter_than_the_headers_has_no_valid_copy() {
        let written = new_header(DiskState::Initialized, Integrity::None, 1);
        let area = both_copies(&written);
        let selected = parse_headers(&area[..HEADER_SIZE + 10], Integrity::None).unwrap();
        assert_eq!(
            selected.repair.unwrap().1,
            "the secondary header (offset 16384) has 10 bytes; a header copy has 16384"
        );
        let err = parse_headers(&area[..10], Integrity::None).unwrap_err();
        let HeaderError::NoValidCopy { primary, secondary } = err else {
            panic!("{err}");
        };
        assert!(matches!(primary, CopyError::Length { len: 10, .. }));
        assert!(matches!(secondary, CopyError::Length { len: 0, .. }));
    }

    /// A deterministic stand-in for the fuzz target (init/fuzz) in every `cargo test`: random
    /// edits of the JSON text with the checksums recomputed never panic the parser, and
    /// whatever it still accepts maps the data exactly as hawser does.
    #[test]
    fn mutated_headers_never_panic_and_never_pass_with_other_parameters() {
        let base = both_copies(&new_header(DiskState::Initialized, Integrity::None, 3));
        let text_len = base[BINARY_HEADER_LEN..]
            .iter()
            .position(|&b| b == 0)
            .unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as usize
        };
        let mut accepted = 0;
        for _ in 0..4000 {
            let mut area = base.clone();
            for _ in 0..next() % 4 + 1 {
                let at = BINARY_HEADER_LEN + next() % (text_len + 8);
                let bytes = b"{}[]\",:0123456789azAZ\0 ";
                let byte = bytes[next() % bytes.len()];
                area[at] = byte;
                area[HEADER_SIZE + at] = byte;
            }
            for copy in area.chunks_mut(HEADER_SIZE) {
                let sum = checksum(copy);
                copy[OFF_CSUM..OFF_CSUM + 32].copy_from_slice(&sum);
            }
            if let Ok(selected) = parse_headers(&area, Integrity::None) {
                accepted += 1;
                let segment = &selected.source.metadata.segments["0"];
                assert_eq!(segment.encryption, CIPHER);
                assert_eq!(segment.sector_size, SECTOR_SIZE);
                assert_eq!(segment.offset, DATA_OFFSET.to_string());
                assert_eq!(segment.integrity, None);
            }
        }
        // Edits inside base64 strings or the UUID's digits can survive; most must not.
        assert!(accepted < 2000, "{accepted} of 4000 mutations accepted");
    }
}
