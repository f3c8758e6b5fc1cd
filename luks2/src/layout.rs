//! What hawser writes, as constants: the header's size and place, the data segment's
//! parameters, the two header slots, the integrity modes and the lifecycle states the header
//! records. The dm-crypt table is built from these, never from the header.

use std::fmt;

/// Size of one header copy (binary header + JSON area): cryptsetup's default and hawser's only.
pub const HEADER_SIZE: usize = 16 * 1024;
/// The binary header at the start of each copy.
pub const BINARY_HEADER_LEN: usize = 4096;
/// The JSON area following each binary header.
pub const JSON_AREA_LEN: usize = HEADER_SIZE - BINARY_HEADER_LEN;
/// Both copies: the bytes [`parse_headers`](crate::parse_headers) reads from the start of the
/// disk.
pub const HEADERS_LEN: usize = 2 * HEADER_SIZE;
/// Where the secondary copy starts.
pub const SECONDARY_OFFSET: u64 = HEADER_SIZE as u64;
/// The data segment's offset: 16 MiB, cryptsetup's default for a 16 KiB header.
pub const DATA_OFFSET: u64 = 16 * 1024 * 1024;
/// The keyslots area between the two copies and the data: empty, but kept at cryptsetup's
/// default size so that an operator can add a recovery keyslot.
pub const KEYSLOTS_SIZE: u64 = DATA_OFFSET - HEADERS_LEN as u64;
/// The data segment's cipher, as dm-crypt and cryptsetup spell it.
pub const CIPHER: &str = "aes-xts-plain64";
/// Bytes of an AES-256-XTS key (two AES-256 keys).
pub const XTS_KEY_LEN: usize = 64;
/// Bytes of the HMAC-SHA256 key appended to the XTS key in integrity mode.
pub const HMAC_KEY_LEN: usize = 32;
/// The encryption sector size of the data segment.
pub const SECTOR_SIZE: u32 = 4096;
/// The owner written into the binary header's `subsystem` field: a disk whose header says
/// anything else is not hawser's.
pub const SUBSYSTEM: &str = "hawser";
/// The label written into the binary header (for people reading `cryptsetup luksDump`).
pub const LABEL: &str = "hawser-state";
/// The checksum algorithm of the binary header.
pub const CHECKSUM_ALG: &str = "sha256";
/// Bytes of the per-copy salt in the binary header.
pub const HEADER_SALT_LEN: usize = 64;
/// The type of hawser's LUKS2 token.
pub const STATE_TOKEN_TYPE: &str = "hawser";
/// The value of the token's `state` field once the filesystem exists.
pub const STATE_INITIALIZED: &str = "initialized";

const MAGIC_PRIMARY: &[u8; 6] = b"LUKS\xba\xbe";
const MAGIC_SECONDARY: &[u8; 6] = b"SKUL\xba\xbe";

/// Which of the two header copies: where it lives and which magic it starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderSlot {
    /// The copy at offset 0, with the magic `LUKS\xba\xbe` (the one `isLuks` looks for).
    Primary,
    /// The copy at [`SECONDARY_OFFSET`], with the magic `SKUL\xba\xbe`.
    Secondary,
}

impl HeaderSlot {
    /// Byte offset of this copy on the disk.
    pub fn offset(self) -> u64 {
        match self {
            HeaderSlot::Primary => 0,
            HeaderSlot::Secondary => SECONDARY_OFFSET,
        }
    }

    /// The other copy.
    pub fn other(self) -> HeaderSlot {
        match self {
            HeaderSlot::Primary => HeaderSlot::Secondary,
            HeaderSlot::Secondary => HeaderSlot::Primary,
        }
    }

    /// The magic this copy's binary header starts with.
    pub(crate) fn magic(self) -> &'static [u8; 6] {
        match self {
            HeaderSlot::Primary => MAGIC_PRIMARY,
            HeaderSlot::Secondary => MAGIC_SECONDARY,
        }
    }
}

impl fmt::Display for HeaderSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderSlot::Primary => f.write_str("primary header (offset 0)"),
            HeaderSlot::Secondary => write!(f, "secondary header (offset {SECONDARY_OFFSET})"),
        }
    }
}

/// Authenticated encryption of the data segment: a measured choice, never the header's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Integrity {
    /// dm-crypt alone: confidentiality, no detection of modified sectors.
    #[default]
    None,
    /// dm-integrity under dm-crypt with `authenc(hmac(sha256),xts(aes))`, as cryptsetup's
    /// `--integrity hmac-sha256` (and Constellation) does: every 4 KiB sector carries a 32-byte
    /// tag, so a modified sector reads as an I/O error instead of as garbage.
    HmacSha256,
}

impl Integrity {
    /// The bytes of volume key this mode needs: the XTS key, plus the HMAC key with integrity.
    pub fn key_len(self) -> usize {
        match self {
            Integrity::None => XTS_KEY_LEN,
            Integrity::HmacSha256 => XTS_KEY_LEN + HMAC_KEY_LEN,
        }
    }

    /// The segment's `integrity.type` in the LUKS2 JSON.
    pub fn json_type(self) -> Option<&'static str> {
        match self {
            Integrity::None => None,
            Integrity::HmacSha256 => Some("hmac(sha256)"),
        }
    }

    /// The name of the mode on the kernel command line.
    pub fn cmdline_name(self) -> &'static str {
        match self {
            Integrity::None => "none",
            Integrity::HmacSha256 => "hmac-sha256",
        }
    }
}

/// Where hawser's disk is in its lifecycle, as the header records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskState {
    /// Formatted, but the filesystem may not exist yet: may be formatted again.
    Formatting,
    /// The filesystem exists: only ever opened, never formatted again.
    Initialized,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lengths_follow_the_mode() {
        assert_eq!(Integrity::None.key_len(), 64);
        assert_eq!(Integrity::HmacSha256.key_len(), 96);
    }

    #[test]
    fn the_slots_are_where_cryptsetup_looks() {
        assert_eq!(HeaderSlot::Primary.offset(), 0);
        assert_eq!(HeaderSlot::Secondary.offset(), 16384);
        assert_eq!(HeaderSlot::Primary.other(), HeaderSlot::Secondary);
        assert_eq!(HeaderSlot::Secondary.other(), HeaderSlot::Primary);
        assert_eq!(
            HeaderSlot::Secondary.to_string(),
            "secondary header (offset 16384)"
        );
    }
}
