//! Headers and edits the unit tests share.

use crate::binary::{BinaryHeader, header_copy};
use crate::digest::{DIGEST_ITERATIONS, KeyDigest};
use crate::layout::{DiskState, HeaderSlot, Integrity, JSON_AREA_LEN, LABEL, SUBSYSTEM};
use crate::metadata::json_area;
use crate::new_header::NewHeader;
pub(crate) use crate::select::error_chain;
use crate::select::parse_headers;
use crate::write::new_header_copy;

pub(crate) const UUID: &str = "0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c";

/// A deterministic volume key.
pub(crate) fn key(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

pub(crate) fn new_header(state: DiskState, integrity: Integrity, seqid: u64) -> NewHeader {
    NewHeader {
        uuid: UUID.into(),
        integrity,
        digest: KeyDigest::compute(&key(integrity.key_len()), [9; 32], DIGEST_ITERATIONS),
        state,
        seqid,
        cluster_id: None,
    }
}

/// Both copies of `header`, as the first [`HEADERS_LEN`](crate::HEADERS_LEN) bytes of a disk.
pub(crate) fn both_copies(header: &NewHeader) -> Vec<u8> {
    let mut area = new_header_copy(HeaderSlot::Primary, header, [1; 64]);
    area.extend(new_header_copy(HeaderSlot::Secondary, header, [2; 64]));
    area
}

/// Rewrites the JSON of both copies (keeping valid checksums: the header is not
/// authenticated, so an attacker can do exactly this).
pub(crate) fn tampered(edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
    let written = new_header(DiskState::Initialized, Integrity::None, 2);
    let area = json_area(&written);
    let end = area.iter().position(|&b| b == 0).unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&area[..end]).unwrap();
    edit(&mut json);
    let mut text = serde_json::to_vec(&json).unwrap();
    text.resize(JSON_AREA_LEN, 0);
    let fields = |salt| BinaryHeader {
        seqid: 2,
        uuid: UUID,
        label: LABEL,
        subsystem: SUBSYSTEM,
        salt,
    };
    let mut both = header_copy(HeaderSlot::Primary, &fields([1; 64]), &text);
    both.extend(header_copy(HeaderSlot::Secondary, &fields([2; 64]), &text));
    both
}

/// The message refusing a header whose JSON `edit` changed.
pub(crate) fn refusal(edit: impl Fn(&mut serde_json::Value)) -> String {
    parse_headers(&tampered(edit), Integrity::None)
        .unwrap_err()
        .to_string()
}
