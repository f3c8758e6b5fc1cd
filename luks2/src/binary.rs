//! The binary header at the start of each copy (cryptsetup's `struct luks2_hdr_disk`): magic,
//! version, sizes, the NUL-terminated text fields, the per-copy salt and the sha256 checksum
//! over the whole copy.

use sha2::{Digest as _, Sha256};

use crate::copy_error::CopyError;
use crate::layout::{
    BINARY_HEADER_LEN, CHECKSUM_ALG, HEADER_SALT_LEN, HEADER_SIZE, HeaderSlot, JSON_AREA_LEN,
    SUBSYSTEM,
};

// Field offsets of the binary header (`struct luks2_hdr_disk`, big-endian integers).
pub(crate) const OFF_VERSION: usize = 6;
pub(crate) const OFF_HDR_SIZE: usize = 8;
pub(crate) const OFF_SEQID: usize = 16;
pub(crate) const OFF_LABEL: usize = 24;
pub(crate) const OFF_CHECKSUM_ALG: usize = 72;
pub(crate) const OFF_SALT: usize = 104;
pub(crate) const OFF_UUID: usize = 168;
pub(crate) const OFF_SUBSYSTEM: usize = 208;
pub(crate) const OFF_HDR_OFFSET: usize = 256;
pub(crate) const OFF_CSUM: usize = 448;
pub(crate) const LABEL_LEN: usize = 48;
pub(crate) const CHECKSUM_ALG_LEN: usize = 32;
pub(crate) const UUID_LEN: usize = 40;
const CSUM_LEN: usize = 64;
/// The part of the checksum field a sha256 fills (the rest stays zero).
const SHA256_LEN: usize = 32;

pub(crate) fn be_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

pub(crate) fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(raw)
}

/// A NUL-terminated string field. The field must hold a NUL (cryptsetup terminates the last
/// byte) and be UTF-8; bytes after the NUL are ignored, as cryptsetup does.
pub(crate) fn c_string(
    slot: HeaderSlot,
    field: &'static str,
    bytes: &[u8],
    at: usize,
    len: usize,
) -> Result<String, CopyError> {
    let raw = &bytes[at..at + len];
    let end = raw
        .iter()
        .position(|&b| b == 0)
        .ok_or(CopyError::FieldNotTerminated { slot, field })?;
    std::str::from_utf8(&raw[..end])
        .map(str::to_owned)
        .map_err(|source| CopyError::FieldNotUtf8 {
            slot,
            field,
            source,
        })
}

/// Writes `text` NUL-terminated into a fixed field (truncated to leave the final NUL).
fn put_c_string(bytes: &mut [u8], at: usize, len: usize, text: &str) {
    let n = text.len().min(len - 1);
    bytes[at..at + n].copy_from_slice(&text.as_bytes()[..n]);
}

/// sha256 over the copy with its checksum field zeroed (binary header + JSON area).
pub(crate) fn checksum(bytes: &[u8]) -> [u8; SHA256_LEN] {
    let mut hasher = Sha256::new();
    hasher.update(&bytes[..OFF_CSUM]);
    hasher.update([0u8; CSUM_LEN]);
    hasher.update(&bytes[OFF_CSUM + CSUM_LEN..]);
    hasher.finalize().into()
}

/// Whether the checksum stored in `bytes` (one whole copy) is [`checksum`] of it.
pub(crate) fn checksum_matches(bytes: &[u8]) -> bool {
    checksum(bytes) == bytes[OFF_CSUM..OFF_CSUM + SHA256_LEN]
}

/// Recomputes and stores the checksum of `bytes` (one whole copy).
pub(crate) fn seal(bytes: &mut [u8]) {
    let sum = checksum(bytes);
    bytes[OFF_CSUM..OFF_CSUM + SHA256_LEN].copy_from_slice(&sum);
}

/// Whether `bytes` (at least the first 512 bytes of a copy) start with a LUKS2 binary header
/// that names hawser as its owner — checksum or not. A format that was cut short leaves this
/// behind: the binary header's first sector is written, and synced, before its JSON area.
pub fn is_hawser_binary_header(slot: HeaderSlot, bytes: &[u8]) -> bool {
    bytes.len() >= 512
        && &bytes[..6] == slot.magic()
        && be_u16(bytes, OFF_VERSION) == 2
        && c_string(slot, "subsystem", bytes, OFF_SUBSYSTEM, LABEL_LEN)
            .is_ok_and(|subsystem| subsystem == SUBSYSTEM)
}

/// Whether `bytes` start with any LUKS header (version 1 or 2, primary magic).
pub fn has_luks_magic(bytes: &[u8]) -> bool {
    bytes.len() >= 6 && &bytes[..6] == HeaderSlot::Primary.magic()
}

/// Fields of the binary header.
#[derive(Debug, Clone)]
pub struct BinaryHeader<'a> {
    /// The sequence number: the copy with the higher one is the newer header.
    pub seqid: u64,
    /// The header's UUID, as it is to be written.
    pub uuid: &'a str,
    /// The label (`cryptsetup luksDump` shows it).
    pub label: &'a str,
    /// The owner: [`SUBSYSTEM`] for hawser's disk.
    pub subsystem: &'a str,
    /// Unique per copy (cryptsetup regenerates it for each).
    pub salt: [u8; HEADER_SALT_LEN],
}

/// One complete copy: binary header with its checksum over itself and `json_area`.
pub fn header_copy(slot: HeaderSlot, fields: &BinaryHeader<'_>, json_area: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; HEADER_SIZE];
    bytes[..6].copy_from_slice(slot.magic());
    bytes[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&2u16.to_be_bytes());
    bytes[OFF_HDR_SIZE..OFF_HDR_SIZE + 8].copy_from_slice(&(HEADER_SIZE as u64).to_be_bytes());
    bytes[OFF_SEQID..OFF_SEQID + 8].copy_from_slice(&fields.seqid.to_be_bytes());
    put_c_string(&mut bytes, OFF_LABEL, LABEL_LEN, fields.label);
    put_c_string(&mut bytes, OFF_CHECKSUM_ALG, CHECKSUM_ALG_LEN, CHECKSUM_ALG);
    bytes[OFF_SALT..OFF_SALT + HEADER_SALT_LEN].copy_from_slice(&fields.salt);
    put_c_string(&mut bytes, OFF_UUID, UUID_LEN, fields.uuid);
    put_c_string(&mut bytes, OFF_SUBSYSTEM, LABEL_LEN, fields.subsystem);
    bytes[OFF_HDR_OFFSET..OFF_HDR_OFFSET + 8].copy_from_slice(&slot.offset().to_be_bytes());
    let area_len = json_area.len().min(JSON_AREA_LEN);
    bytes[BINARY_HEADER_LEN..BINARY_HEADER_LEN + area_len].copy_from_slice(&json_area[..area_len]);
    seal(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{DiskState, Integrity};
    use crate::parse::parse_copy;
    use crate::test_support::new_header;
    use crate::write::new_header_copy;

    #[test]
    fn ownership_survives_a_torn_json_area() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let mut copy = new_header_copy(HeaderSlot::Primary, &written, [1; 64]);
        copy[BINARY_HEADER_LEN..].fill(0);
        assert!(parse_copy(HeaderSlot::Primary, &copy).is_err());
        assert!(is_hawser_binary_header(HeaderSlot::Primary, &copy));
        assert!(!is_hawser_binary_header(HeaderSlot::Secondary, &copy));
        assert!(!is_hawser_binary_header(HeaderSlot::Primary, &[0u8; 4096]));
    }

    #[test]
    fn the_checksum_covers_the_copy_except_itself() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let mut copy = new_header_copy(HeaderSlot::Secondary, &written, [2; 64]);
        assert!(checksum_matches(&copy));
        copy[HEADER_SIZE - 1] ^= 1;
        assert!(!checksum_matches(&copy));
        seal(&mut copy);
        assert!(checksum_matches(&copy));
    }
}
