//! The JSON area: the LUKS2 metadata as serde types, cryptsetup's rules for the area, and the
//! metadata hawser writes.
//!
//! Fields hawser does not write are refused where they could change how the data is read
//! (segments, digests, config: `deny_unknown_fields`); keyslots and foreign tokens (an
//! operator's recovery keyslot and its tokens) are carried along but never used.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use crate::copy_error::CopyError;
use crate::layout::{
    CIPHER, DATA_OFFSET, DiskState, HeaderSlot, JSON_AREA_LEN, KEYSLOTS_SIZE, SECTOR_SIZE,
    STATE_INITIALIZED, STATE_TOKEN_TYPE,
};
use crate::new_header::NewHeader;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Metadata {
    pub(crate) keyslots: BTreeMap<String, serde_json::Value>,
    pub(crate) tokens: BTreeMap<String, serde_json::Value>,
    pub(crate) segments: BTreeMap<String, Segment>,
    pub(crate) digests: BTreeMap<String, JsonDigest>,
    pub(crate) config: Config,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Segment {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) offset: String,
    pub(crate) size: String,
    pub(crate) iv_tweak: String,
    pub(crate) encryption: String,
    pub(crate) sector_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) integrity: Option<SegmentIntegrity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) flags: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SegmentIntegrity {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) journal_encryption: String,
    pub(crate) journal_integrity: String,
}

/// The segment integrity hawser writes for an integrity type (no journal: dm-crypt's
/// authenticated mode needs none).
pub(crate) fn integrity_json(kind: &str) -> SegmentIntegrity {
    SegmentIntegrity {
        kind: kind.to_owned(),
        journal_encryption: "none".into(),
        journal_integrity: "none".into(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JsonDigest {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) keyslots: Vec<String>,
    pub(crate) segments: Vec<String>,
    pub(crate) hash: String,
    pub(crate) iterations: u64,
    pub(crate) salt: String,
    pub(crate) digest: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) json_size: String,
    pub(crate) keyslots_size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) flags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) requirements: Option<Requirements>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Requirements {
    #[serde(default)]
    pub(crate) mandatory: Vec<String>,
}

/// hawser's token: `{"type":"hawser","keyslots":[],"state":"initialized"}`, and once the node
/// has taken its first lock `"cluster_id":"<64 hex digits>"` (the cluster the disk belongs to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateToken {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) keyslots: Vec<String>,
    pub(crate) state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cluster_id: Option<String>,
}

/// cryptsetup's rules for the JSON area: it starts with `{`, the JSON text ends at the first
/// NUL, and every byte after it is NUL (so at least one NUL exists).
pub(crate) fn parse_json_area(slot: HeaderSlot, area: &[u8]) -> Result<Metadata, CopyError> {
    if area.first() != Some(&b'{') {
        return Err(CopyError::JsonStart { slot });
    }
    let end = area
        .iter()
        .position(|&b| b == 0)
        .ok_or(CopyError::JsonNotTerminated { slot })?;
    if let Some(at) = area[end..].iter().position(|&b| b != 0) {
        return Err(CopyError::JsonTrailingBytes { slot, at: end + at });
    }
    let metadata: Metadata =
        serde_json::from_slice(&area[..end]).map_err(|source| CopyError::Json { slot, source })?;
    if metadata.config.json_size != JSON_AREA_LEN.to_string() {
        return Err(CopyError::JsonSize {
            slot,
            found: metadata.config.json_size,
        });
    }
    for (section, keys) in [
        ("keyslots", metadata.keyslots.keys().collect::<Vec<_>>()),
        ("tokens", metadata.tokens.keys().collect()),
        ("segments", metadata.segments.keys().collect()),
        ("digests", metadata.digests.keys().collect()),
    ] {
        if let Some(key) = keys.iter().find(|key| !is_decimal(key)) {
            return Err(CopyError::NonNumericKey {
                slot,
                section,
                key: (*key).clone(),
            });
        }
    }
    Ok(metadata)
}

fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit())
}

/// The JSON area of a header hawser writes, NUL-padded to [`JSON_AREA_LEN`].
pub fn json_area(header: &NewHeader) -> Vec<u8> {
    let mut tokens = BTreeMap::new();
    if header.state == DiskState::Initialized {
        let token = StateToken {
            kind: STATE_TOKEN_TYPE.into(),
            keyslots: Vec::new(),
            state: STATE_INITIALIZED.into(),
            cluster_id: header.cluster_id.map(hex::encode),
        };
        // Serializing a struct of strings cannot fail.
        tokens.insert(
            "0".to_owned(),
            serde_json::to_value(token).unwrap_or_default(),
        );
    }
    let metadata = Metadata {
        keyslots: BTreeMap::new(),
        tokens,
        segments: BTreeMap::from([(
            "0".to_owned(),
            Segment {
                kind: "crypt".into(),
                offset: DATA_OFFSET.to_string(),
                size: "dynamic".into(),
                iv_tweak: "0".into(),
                encryption: CIPHER.into(),
                sector_size: SECTOR_SIZE,
                integrity: header.integrity.json_type().map(integrity_json),
                flags: None,
            },
        )]),
        digests: BTreeMap::from([(
            "0".to_owned(),
            JsonDigest {
                kind: "pbkdf2".into(),
                keyslots: Vec::new(),
                segments: vec!["0".into()],
                hash: "sha256".into(),
                iterations: u64::from(header.digest.iterations),
                salt: BASE64.encode(header.digest.salt),
                digest: BASE64.encode(header.digest.digest),
            },
        )]),
        config: Config {
            json_size: JSON_AREA_LEN.to_string(),
            keyslots_size: KEYSLOTS_SIZE.to_string(),
            flags: None,
            requirements: None,
        },
    };
    // Serializing these plain structs cannot fail; the text is far below the area's size
    // (about 600 bytes), which the tests check.
    let mut area = serde_json::to_vec(&metadata).unwrap_or_default();
    area.resize(JSON_AREA_LEN, 0);
    area
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::{BinaryHeader, header_copy};
    use crate::layout::{BINARY_HEADER_LEN, Integrity, LABEL, SUBSYSTEM};
    use crate::parse::parse_copy;
    use crate::test_support::{UUID, error_chain, new_header};
    use crate::write::new_header_copy;

    #[test]
    fn the_json_is_what_cryptsetup_writes() {
        let area = json_area(&new_header(DiskState::Initialized, Integrity::None, 1));
        let end = area.iter().position(|&b| b == 0).unwrap();
        assert!(end < 1024, "JSON text of {end} bytes");
        let json: serde_json::Value = serde_json::from_slice(&area[..end]).unwrap();
        assert_eq!(
            json["segments"]["0"],
            serde_json::json!({
                "type": "crypt", "offset": "16777216", "size": "dynamic", "iv_tweak": "0",
                "encryption": "aes-xts-plain64", "sector_size": 4096
            })
        );
        assert_eq!(
            json["config"],
            serde_json::json!({"json_size": "12288", "keyslots_size": "16744448"})
        );
        assert_eq!(json["digests"]["0"]["type"], "pbkdf2");
        assert_eq!(json["digests"]["0"]["iterations"], 1000);
        assert_eq!(
            json["tokens"]["0"],
            serde_json::json!({"type": "hawser", "keyslots": [], "state": "initialized"})
        );
        assert_eq!(json["keyslots"], serde_json::json!({}));
    }

    #[test]
    fn json_area_rules_follow_cryptsetup() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let good = new_header_copy(HeaderSlot::Primary, &written, [1; 64]);
        let refit = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut area = good[BINARY_HEADER_LEN..].to_vec();
            edit(&mut area);
            let fields = BinaryHeader {
                seqid: 1,
                uuid: UUID,
                label: LABEL,
                subsystem: SUBSYSTEM,
                salt: [1; 64],
            };
            let err = parse_copy(
                HeaderSlot::Primary,
                &header_copy(HeaderSlot::Primary, &fields, &area),
            )
            .unwrap_err();
            error_chain(&err)
        };
        assert!(refit(&|a| a.insert(0, b' ')).contains("does not start"));
        assert!(refit(&|a| a[JSON_AREA_LEN - 1] = b'x').contains("non-zero byte"));
        assert!(refit(&|a| a.fill(b'{')).contains("not NUL-terminated"));
        assert!(
            refit(&|a| {
                let text = br#"{"keyslots":{"x":{}},"tokens":{},"segments":{},"digests":{},"config":{"json_size":"12288","keyslots_size":"0"}}"#;
                a.fill(0);
                a[..text.len()].copy_from_slice(text);
            })
            .contains("non-numeric key")
        );
        assert!(
            refit(&|a| {
                let text = br#"{"keyslots":{},"tokens":{},"segments":{},"digests":{},"config":{"json_size":"4096","keyslots_size":"0"}}"#;
                a.fill(0);
                a[..text.len()].copy_from_slice(text);
            })
            .contains("json_size")
        );
        // The JSON parser's finding follows as the cause.
        assert_eq!(
            refit(&|a| a[1] = b'['),
            "the JSON area of the primary header (offset 0) is malformed: \
             key must be a string at line 1 column 2"
        );
    }
}
