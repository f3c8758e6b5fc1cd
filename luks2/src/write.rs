//! New header copies, and the repair of one copy from the other.

use crate::binary::{BinaryHeader, header_copy};
use crate::layout::{
    HEADER_SALT_LEN, HeaderSlot, JSON_AREA_LEN, LABEL, STATE_TOKEN_TYPE, SUBSYSTEM,
};
use crate::metadata::json_area;
use crate::new_header::NewHeader;
use crate::parse::HeaderCopy;

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

/// Why a copy recording the cluster ID cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The copy has no hawser token: the disk is not initialized, so there is nothing to add the
    /// cluster ID to (a format writes it with the "initialized" mark).
    #[error("the {slot} has no hawser token to record the cluster ID in")]
    NoStateToken {
        /// Which copy.
        slot: HeaderSlot,
    },
    /// The JSON area of the source copy does not re-encode (it parsed when it was read).
    #[error("the {slot}'s JSON area cannot be re-encoded")]
    Json {
        /// Which copy.
        slot: HeaderSlot,
        #[source]
        source: serde_json::Error,
    },
    /// With the cluster ID the JSON text no longer fits the JSON area.
    #[error(
        "the {slot}'s JSON text would be {len} bytes with the cluster ID, more than the \
         {JSON_AREA_LEN}-byte JSON area holds"
    )]
    TooLong {
        /// Which copy.
        slot: HeaderSlot,
        /// The JSON text's length, without its terminating NUL.
        len: usize,
    },
}

/// A copy of `source` whose hawser token records `cluster_id`, to be written to `slot` at
/// `seqid` (higher than both copies on the disk, so that it wins). Everything else in the JSON
/// area — an operator's keyslots, foreign tokens, what cryptsetup added — is kept as it is.
pub fn copy_recording_cluster_id(
    source: &HeaderCopy,
    slot: HeaderSlot,
    seqid: u64,
    cluster_id: &[u8; 32],
    salt: [u8; HEADER_SALT_LEN],
) -> Result<Vec<u8>, RecordError> {
    let from = source.slot;
    let json_err = |source| RecordError::Json { slot: from, source };
    let end = source
        .json_area
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(source.json_area.len());
    let mut json: serde_json::Value =
        serde_json::from_slice(&source.json_area[..end]).map_err(json_err)?;
    let token = json
        .get_mut("tokens")
        .and_then(serde_json::Value::as_object_mut)
        .and_then(|tokens| {
            tokens.values_mut().find(|token| {
                token.get("type").and_then(serde_json::Value::as_str) == Some(STATE_TOKEN_TYPE)
            })
        })
        .and_then(serde_json::Value::as_object_mut)
        .ok_or(RecordError::NoStateToken { slot: from })?;
    token.insert(
        "cluster_id".to_owned(),
        serde_json::Value::String(hex::encode(cluster_id)),
    );
    let mut text = serde_json::to_vec(&json).map_err(json_err)?;
    if text.len() >= JSON_AREA_LEN {
        return Err(RecordError::TooLong {
            slot: from,
            len: text.len(),
        });
    }
    text.resize(JSON_AREA_LEN, 0);
    Ok(header_copy(
        slot,
        &BinaryHeader {
            seqid,
            uuid: &source.uuid,
            label: &source.label,
            subsystem: &source.subsystem,
            salt,
        },
        &text,
    ))
}

/// Formats a UUID (version 4, RFC 9562 variant) from 16 random bytes, lowercase.
pub fn uuid_from_random(bytes: [u8; 16]) -> String {
    hawser_disk_format::Guid::version_4(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{DiskState, Integrity};
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

    #[test]
    fn the_cluster_id_round_trips_in_hawsers_token() {
        let mut written = new_header(DiskState::Initialized, Integrity::None, 4);
        written.cluster_id = Some([0x5e; 32]);
        let copy = new_header_copy(HeaderSlot::Primary, &written, [1; 64]);
        let parsed = parse_copy(HeaderSlot::Primary, &copy).unwrap();
        let header = crate::validate(&parsed, Integrity::None).unwrap();
        assert_eq!(header.cluster_id, Some([0x5e; 32]));
        assert_eq!(header.state, DiskState::Initialized);
        // As written: the token's field, 64 lowercase hex digits.
        let end = parsed.json_area.iter().position(|&b| b == 0).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&parsed.json_area[..end]).unwrap();
        assert_eq!(
            json["tokens"]["0"],
            serde_json::json!({"type": "hawser", "keyslots": [], "state": "initialized",
                               "cluster_id": "5e".repeat(32)})
        );
        // Without a cluster ID the token is what hawser always wrote.
        written.cluster_id = None;
        let copy = new_header_copy(HeaderSlot::Primary, &written, [1; 64]);
        let parsed = parse_copy(HeaderSlot::Primary, &copy).unwrap();
        assert_eq!(
            crate::validate(&parsed, Integrity::None)
                .unwrap()
                .cluster_id,
            None
        );
        // A formatting header has no token, so no cluster ID either.
        let mut formatting = new_header(DiskState::Formatting, Integrity::None, 3);
        formatting.cluster_id = Some([0x5e; 32]);
        let copy = new_header_copy(HeaderSlot::Primary, &formatting, [1; 64]);
        let header = crate::validate(
            &parse_copy(HeaderSlot::Primary, &copy).unwrap(),
            Integrity::None,
        )
        .unwrap();
        assert_eq!(
            (header.state, header.cluster_id),
            (DiskState::Formatting, None)
        );
    }

    #[test]
    fn recording_the_cluster_id_keeps_everything_else_in_the_json_area() {
        use crate::test_support::tampered;
        // A header an operator added a keyslot and a foreign token to.
        let area = tampered(|j| {
            j["keyslots"]["0"] = serde_json::json!({"type": "luks2", "key_size": 64});
            j["tokens"]["1"] = serde_json::json!({"type": "systemd-tpm2", "keyslots": ["0"]});
            j["digests"]["0"]["keyslots"] = serde_json::json!(["0"]);
        });
        let source = parse_copy(HeaderSlot::Primary, &area[..crate::HEADER_SIZE]).unwrap();
        let recorded = copy_recording_cluster_id(
            &source,
            HeaderSlot::Secondary,
            source.seqid + 1,
            &[0x7a; 32],
            [4; 64],
        )
        .unwrap();
        let copy = parse_copy(HeaderSlot::Secondary, &recorded).unwrap();
        assert_eq!(copy.seqid, source.seqid + 1);
        assert_eq!(copy.uuid, source.uuid);
        let header = crate::validate(&copy, Integrity::None).unwrap();
        assert_eq!(header.cluster_id, Some([0x7a; 32]));
        let text = |c: &HeaderCopy| {
            let end = c.json_area.iter().position(|&b| b == 0).unwrap();
            serde_json::from_slice::<serde_json::Value>(&c.json_area[..end]).unwrap()
        };
        let (mut before, after) = (text(&source), text(&copy));
        before["tokens"]["0"]["cluster_id"] = "7a".repeat(32).into();
        assert_eq!(after, before, "only the cluster ID was added");

        // A header that is not initialized has no token to record it in.
        let formatting = new_header(DiskState::Formatting, Integrity::None, 1);
        let source = parse_copy(
            HeaderSlot::Primary,
            &new_header_copy(HeaderSlot::Primary, &formatting, [1; 64]),
        )
        .unwrap();
        assert!(matches!(
            copy_recording_cluster_id(&source, HeaderSlot::Secondary, 2, &[0; 32], [4; 64]),
            Err(RecordError::NoStateToken {
                slot: HeaderSlot::Primary
            })
        ));
    }
}
