//! hawser's constants against a well-formed copy: the header is untrusted, so anything it says
//! that differs from what hawser writes is refused, and only the UUID, the key digest and the
//! "initialized" mark are read from it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::digest::{
    DIGEST_ITERATIONS, DIGEST_LEN, DIGEST_SALT_LEN, KeyDigest, MAX_DIGEST_ITERATIONS,
};
use crate::layout::{
    CIPHER, DATA_OFFSET, DiskState, HeaderSlot, Integrity, KEYSLOTS_SIZE, SECTOR_SIZE,
    STATE_INITIALIZED, STATE_TOKEN_TYPE, SUBSYSTEM,
};
use crate::metadata::{JsonDigest, SegmentIntegrity, StateToken, integrity_json};
use crate::parse::HeaderCopy;

/// Why a well-formed LUKS2 header is not one hawser opens.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The binary header names another owner: a LUKS2 volume hawser did not create.
    #[error(
        "the {slot} belongs to subsystem {found:?}, not {SUBSYSTEM:?}: another LUKS2 volume, not hawser's state disk"
    )]
    NotHawser {
        /// Which copy.
        slot: HeaderSlot,
        /// The subsystem it names.
        found: String,
    },
    /// The header describes something other than what hawser writes: another cipher, sector
    /// size, offset, integrity mode, digest kind, ... (a tampered header, or another tool's).
    #[error("the {slot} has {what} {found}, hawser only opens {expected}")]
    Mismatch {
        /// Which copy.
        slot: HeaderSlot,
        /// What differs, as a phrase ("data segment cipher").
        what: &'static str,
        /// What hawser writes.
        expected: String,
        /// What the header says.
        found: String,
    },
    /// The header declares mandatory requirements (reencryption in progress, ...): a reader
    /// that does not implement them must not touch the data.
    #[error("the {slot} requires LUKS2 features hawser does not implement: {requirements:?}")]
    Requirements {
        /// Which copy.
        slot: HeaderSlot,
        /// The `config.requirements.mandatory` list.
        requirements: Vec<String>,
    },
    /// A token of hawser's type is not the token hawser writes.
    #[error(
        "the {slot} has a malformed hawser token; hawser writes \
         {{\"type\":\"{STATE_TOKEN_TYPE}\",\"keyslots\":[],\"state\":\"{STATE_INITIALIZED}\"}} \
         and, once the node has locked, \"cluster_id\":\"<64 hex digits>\""
    )]
    StateToken {
        /// Which copy.
        slot: HeaderSlot,
        /// What the JSON parser found.
        #[source]
        source: serde_json::Error,
    },
}

/// A header hawser accepts: what the rest of hawser reads from the disk, and nothing more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header's UUID, lowercase: the identity under which the key is derived.
    pub uuid: String,
    /// The sequence number of the copy it was read from.
    pub seqid: u64,
    /// The measured mode, which the header was checked against.
    pub integrity: Integrity,
    /// The check of the volume key.
    pub digest: KeyDigest,
    /// Whether the filesystem exists (hawser's token).
    pub state: DiskState,
    /// The cluster the disk belongs to, if hawser's token records one (a disk initialized
    /// before hawser recorded it, or with a key that came from no cluster, has none).
    /// Unauthenticated, like the whole header: a fast, named refusal of another cluster's join
    /// service, not a proof (the key digest is that).
    pub cluster_id: Option<[u8; 32]>,
}

/// Checks a well-formed copy against what hawser writes. `integrity` is the measured mode:
/// a header describing another mode is refused, as is any other cipher, sector size, offset,
/// size, IV tweak, segment flag, digest kind or mandatory requirement.
pub fn validate(copy: &HeaderCopy, integrity: Integrity) -> Result<Header, PolicyError> {
    let slot = copy.slot;
    if copy.subsystem != SUBSYSTEM {
        return Err(PolicyError::NotHawser {
            slot,
            found: copy.subsystem.clone(),
        });
    }
    let mismatch = |what: &'static str, expected: String, found: String| PolicyError::Mismatch {
        slot,
        what,
        expected,
        found,
    };
    let metadata = &copy.metadata;
    if let Some(requirements) = &metadata.config.requirements
        && !requirements.mandatory.is_empty()
    {
        return Err(PolicyError::Requirements {
            slot,
            requirements: requirements.mandatory.clone(),
        });
    }

    let segment_ids: Vec<&String> = metadata.segments.keys().collect();
    if segment_ids != ["0"] {
        return Err(mismatch(
            "data segments",
            "exactly one, segment 0".into(),
            format!("{segment_ids:?}"),
        ));
    }
    let segment = &metadata.segments["0"];
    let checks: [(&'static str, bool, String, String); 6] = [
        (
            "data segment type",
            segment.kind == "crypt",
            "\"crypt\"".into(),
            format!("{:?}", segment.kind),
        ),
        (
            "data segment cipher",
            segment.encryption == CIPHER,
            format!("{CIPHER:?}"),
            format!("{:?}", segment.encryption),
        ),
        (
            "data segment sector size",
            segment.sector_size == SECTOR_SIZE,
            SECTOR_SIZE.to_string(),
            segment.sector_size.to_string(),
        ),
        (
            "data segment offset",
            segment.offset == DATA_OFFSET.to_string(),
            DATA_OFFSET.to_string(),
            segment.offset.clone(),
        ),
        (
            "data segment size",
            segment.size == "dynamic",
            "\"dynamic\" (the whole disk)".into(),
            format!("{:?}", segment.size),
        ),
        (
            "data segment IV tweak",
            segment.iv_tweak == "0",
            "0".into(),
            segment.iv_tweak.clone(),
        ),
    ];
    if let Some((what, _, expected, found)) = checks.into_iter().find(|(_, ok, _, _)| !ok) {
        return Err(mismatch(what, expected, found));
    }
    if let Some(flags) = &segment.flags
        && !flags.is_empty()
    {
        return Err(mismatch(
            "data segment flags",
            "none".into(),
            format!("{flags:?}"),
        ));
    }
    if metadata.config.keyslots_size != KEYSLOTS_SIZE.to_string() {
        return Err(mismatch(
            "a keyslots area of",
            format!("{KEYSLOTS_SIZE} bytes"),
            format!("{} bytes", metadata.config.keyslots_size),
        ));
    }
    let expected_integrity = integrity.json_type().map(integrity_json);
    if segment.integrity != expected_integrity {
        let describe = |i: &Option<SegmentIntegrity>| match i {
            None => "none".to_owned(),
            Some(i) => format!(
                "{:?} (journal encryption {:?}, journal integrity {:?})",
                i.kind, i.journal_encryption, i.journal_integrity
            ),
        };
        return Err(mismatch(
            "data integrity",
            format!(
                "{} (hawser.state_disk_integrity={})",
                describe(&expected_integrity),
                integrity.cmdline_name()
            ),
            describe(&segment.integrity),
        ));
    }

    let digest_ids: Vec<&String> = metadata.digests.keys().collect();
    if digest_ids.len() != 1 {
        return Err(mismatch(
            "key digests",
            "exactly one".into(),
            format!("{digest_ids:?}"),
        ));
    }
    let (_, digest) = metadata
        .digests
        .iter()
        .next()
        .ok_or_else(|| mismatch("key digests", "exactly one".into(), "none".into()))?;
    let digest =
        parse_digest(digest).map_err(|(what, expected, found)| mismatch(what, expected, found))?;

    let mut state = DiskState::Formatting;
    let mut cluster_id = None;
    for token in metadata.tokens.values() {
        if token.get("type").and_then(|t| t.as_str()) != Some(STATE_TOKEN_TYPE) {
            continue;
        }
        let token: StateToken = serde_json::from_value(token.clone())
            .map_err(|source| PolicyError::StateToken { slot, source })?;
        if token.state != STATE_INITIALIZED || state == DiskState::Initialized {
            return Err(mismatch(
                "a hawser token with state",
                format!("one token with {STATE_INITIALIZED:?}"),
                format!("{:?}", token.state),
            ));
        }
        state = DiskState::Initialized;
        if let Some(text) = &token.cluster_id {
            cluster_id = Some(parse_cluster_id(text).ok_or_else(|| {
                mismatch(
                    "the hawser token's cluster_id",
                    "64 lowercase hex digits".into(),
                    format!("{text:?}"),
                )
            })?);
        }
    }

    Ok(Header {
        uuid: copy.uuid.to_ascii_lowercase(),
        seqid: copy.seqid,
        integrity,
        digest,
        state,
        cluster_id,
    })
}

/// A cluster ID as hawser writes it: 64 lowercase hex digits.
fn parse_cluster_id(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    hex::decode(text).ok()?.try_into().ok()
}

/// What differs, what hawser writes, what the header says: a [`PolicyError::Mismatch`] without
/// its slot.
type Mismatch = (&'static str, String, String);

fn parse_digest(digest: &JsonDigest) -> Result<KeyDigest, Mismatch> {
    if digest.kind != "pbkdf2" {
        return Err((
            "key digest type",
            "\"pbkdf2\"".into(),
            format!("{:?}", digest.kind),
        ));
    }
    if digest.hash != "sha256" {
        return Err((
            "key digest hash",
            "\"sha256\"".into(),
            format!("{:?}", digest.hash),
        ));
    }
    if digest.segments != ["0"] {
        return Err((
            "key digest segments",
            "[\"0\"]".into(),
            format!("{:?}", digest.segments),
        ));
    }
    let iterations = u32::try_from(digest.iterations)
        .ok()
        .filter(|i| (DIGEST_ITERATIONS..=MAX_DIGEST_ITERATIONS).contains(i))
        .ok_or_else(|| {
            (
                "key digest iterations",
                format!("{DIGEST_ITERATIONS} to {MAX_DIGEST_ITERATIONS}"),
                digest.iterations.to_string(),
            )
        })?;
    let decode = |what: &'static str, text: &str, len: usize| -> Result<Vec<u8>, Mismatch> {
        BASE64
            .decode(text)
            .ok()
            .filter(|bytes| bytes.len() == len)
            .ok_or_else(|| (what, format!("{len} bytes of base64"), format!("{text:?}")))
    };
    let mut salt = [0u8; DIGEST_SALT_LEN];
    salt.copy_from_slice(&decode("key digest salt", &digest.salt, DIGEST_SALT_LEN)?);
    let mut value = [0u8; DIGEST_LEN];
    value.copy_from_slice(&decode("key digest value", &digest.digest, DIGEST_LEN)?);
    Ok(KeyDigest {
        salt,
        iterations,
        digest: value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary::{BinaryHeader, has_luks_magic, header_copy, is_hawser_binary_header};
    use crate::layout::{LABEL, SUBSYSTEM};
    use crate::metadata::json_area;
    use crate::select::{HeaderError, parse_headers};
    use crate::test_support::{UUID, both_copies, error_chain, new_header, refusal, tampered};

    #[test]
    fn another_cipher_is_refused_naming_it() {
        let message = refusal(|j| j["segments"]["0"]["encryption"] = "cipher_null-ecb".into());
        assert_eq!(
            message,
            "the primary header (offset 0) has data segment cipher \"cipher_null-ecb\", \
             hawser only opens \"aes-xts-plain64\""
        );
        let message = refusal(|j| j["segments"]["0"]["encryption"] = "aes-cbc-essiv:sha256".into());
        assert!(message.contains("aes-cbc-essiv"), "{message}");
    }

    /// Tamper row: LUKS2 segment offset. A data segment moved into the header and keyslot
    /// area (offset 0, or one sector before 16 MiB), with valid checksums in both copies: the
    /// header is refused naming the offset and the 16 MiB hawser maps, before any key is asked.
    #[test]
    fn tamper_luks2_segment_offset_is_refused_naming_it() {
        for offset in ["0", "16773120"] {
            let message = refusal(|j| j["segments"]["0"]["offset"] = offset.into());
            assert_eq!(
                message,
                format!(
                    "the primary header (offset 0) has data segment offset {offset}, \
                     hawser only opens 16777216"
                )
            );
        }
        assert_eq!(DATA_OFFSET, 16 << 20);
    }

    #[test]
    fn every_layout_change_is_refused() {
        type Edit = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|j| j["segments"]["0"]["sector_size"] = 512.into()),
                "sector size",
            ),
            (
                Box::new(|j| j["segments"]["0"]["offset"] = "32768".into()),
                "offset",
            ),
            (
                Box::new(|j| j["segments"]["0"]["size"] = "1048576".into()),
                "size",
            ),
            (
                Box::new(|j| j["segments"]["0"]["iv_tweak"] = "8".into()),
                "IV tweak",
            ),
            (
                Box::new(|j| j["segments"]["0"]["type"] = "linear".into()),
                "segment type",
            ),
            (
                Box::new(|j| j["segments"]["0"]["flags"] = serde_json::json!(["in-reencryption"])),
                "flags",
            ),
            (
                Box::new(|j| {
                    j["segments"]["0"]["integrity"] = serde_json::json!({
                        "type": "hmac(sha256)", "journal_encryption": "none",
                        "journal_integrity": "none"})
                }),
                "data integrity",
            ),
            (
                Box::new(|j| j["segments"]["1"] = j["segments"]["0"].clone()),
                "data segments",
            ),
            (
                Box::new(|j| {
                    j["config"]["requirements"] =
                        serde_json::json!({"mandatory": ["online-reencrypt-v2"]})
                }),
                "requires LUKS2 features",
            ),
            (
                Box::new(|j| j["digests"]["0"]["hash"] = "sha1".into()),
                "digest hash",
            ),
            (
                Box::new(|j| j["digests"]["0"]["type"] = "argon2".into()),
                "digest type",
            ),
            (
                Box::new(|j| j["digests"]["0"]["iterations"] = 4_000_000_000u64.into()),
                "iterations",
            ),
            (
                Box::new(|j| j["digests"]["0"]["iterations"] = 10.into()),
                "iterations",
            ),
            (
                Box::new(|j| j["digests"]["0"]["salt"] = "AAAA".into()),
                "salt",
            ),
            (
                Box::new(|j| j["digests"]["1"] = j["digests"]["0"].clone()),
                "key digests",
            ),
            (
                Box::new(|j| j["tokens"]["0"]["state"] = "formatting".into()),
                "hawser token",
            ),
            (
                Box::new(|j| j["tokens"]["0"]["note"] = "x".into()),
                "malformed hawser token",
            ),
            (
                Box::new(|j| j["config"]["keyslots_size"] = "0".into()),
                "keyslots area",
            ),
        ];
        for (edit, expected) in cases {
            let message = refusal(edit);
            assert!(
                message.contains(expected),
                "{expected:?} not in {message:?}"
            );
        }
    }

    #[test]
    fn unknown_fields_in_segments_digests_and_config_are_malformed() {
        for edit in [
            |j: &mut serde_json::Value| j["segments"]["0"]["cipher"] = "x".into(),
            |j: &mut serde_json::Value| j["digests"]["0"]["note"] = "x".into(),
            |j: &mut serde_json::Value| j["config"]["extra"] = "x".into(),
            |j: &mut serde_json::Value| j["extra"] = serde_json::json!({}),
        ] {
            let err = parse_headers(&tampered(edit), Integrity::None).unwrap_err();
            assert!(matches!(err, HeaderError::NoValidCopy { .. }), "{err}");
            let chain = error_chain(&err);
            assert!(chain.contains("unknown field"), "{chain}");
        }
    }

    #[test]
    fn a_malformed_cluster_id_is_refused() {
        for bad in [
            serde_json::json!("AB".repeat(32)),
            serde_json::json!("ab".repeat(31)),
            serde_json::json!("zz".repeat(32)),
            serde_json::json!(7),
        ] {
            let area = tampered(|j| j["tokens"]["0"]["cluster_id"] = bad.clone());
            let err = parse_headers(&area, Integrity::None).unwrap_err();
            let chain = error_chain(&err);
            assert!(
                chain.contains("cluster_id") || chain.contains("malformed hawser token"),
                "{bad}: {chain}"
            );
        }
        let area = tampered(|j| j["tokens"]["0"]["cluster_id"] = "0a".repeat(32).into());
        let header = parse_headers(&area, Integrity::None).unwrap().header;
        assert_eq!(header.cluster_id, Some([0x0a; 32]));
    }

    #[test]
    fn operator_keyslots_and_tokens_are_tolerated() {
        let area = tampered(|j| {
            j["keyslots"]["0"] = serde_json::json!({"type": "luks2", "key_size": 64});
            j["tokens"]["1"] = serde_json::json!({"type": "systemd-tpm2", "keyslots": ["0"]});
            j["digests"]["0"]["keyslots"] = serde_json::json!(["0"]);
        });
        let header = parse_headers(&area, Integrity::None).unwrap().header;
        assert_eq!(header.state, DiskState::Initialized);
    }

    #[test]
    fn the_measured_integrity_mode_must_match_the_disk() {
        let written = new_header(DiskState::Initialized, Integrity::HmacSha256, 1);
        let err = parse_headers(&both_copies(&written), Integrity::None).unwrap_err();
        assert!(
            err.to_string().contains("hawser.state_disk_integrity=none"),
            "{err}"
        );
        let written = new_header(DiskState::Initialized, Integrity::None, 1);
        let err = parse_headers(&both_copies(&written), Integrity::HmacSha256).unwrap_err();
        assert!(err.to_string().contains("hmac(sha256)"), "{err}");
    }

    #[test]
    fn a_header_of_another_owner_is_not_hawsers() {
        let written = new_header(DiskState::Initialized, Integrity::None, 1);
        let text = json_area(&written);
        let fields = |salt| BinaryHeader {
            seqid: 1,
            uuid: UUID,
            label: "",
            subsystem: "",
            salt,
        };
        let mut area = header_copy(HeaderSlot::Primary, &fields([1; 64]), &text);
        area.extend(header_copy(HeaderSlot::Secondary, &fields([2; 64]), &text));
        let err = parse_headers(&area, Integrity::None).unwrap_err();
        assert!(
            matches!(err, HeaderError::Policy(PolicyError::NotHawser { .. })),
            "{err}"
        );
        assert!(!is_hawser_binary_header(HeaderSlot::Primary, &area));
        assert!(has_luks_magic(&area));
        // The label is only for people: hawser's subsystem with any label is hawser's.
        let mut relabelled = header_copy(
            HeaderSlot::Primary,
            &BinaryHeader {
                label: "",
                subsystem: SUBSYSTEM,
                ..fields([1; 64])
            },
            &text,
        );
        relabelled.extend(header_copy(
            HeaderSlot::Secondary,
            &BinaryHeader {
                label: LABEL,
                subsystem: SUBSYSTEM,
                ..fields([2; 64])
            },
            &text,
        ));
        assert!(parse_headers(&relabelled, Integrity::None).is_ok());
    }
}
