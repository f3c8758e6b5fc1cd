//! The LUKS2 on-disk header, as hawser writes it and as strictly as hawser reads it. Pure: no I/O.
//!
//! hawser writes a standard LUKS2 header (the format of cryptsetup 2.x, see the LUKS2 on-disk
//! format specification) so that an operator holding the volume key can always open the disk
//! with `cryptsetup open --volume-key-file`. What hawser writes:
//!
//! ```text
//! 0 KiB      primary binary header (4 KiB) + JSON area (12 KiB)     hdr_size = 16 KiB
//! 16 KiB     secondary binary header + JSON area (a second copy)
//! 32 KiB     keyslots area, empty: room for an operator's recovery keyslot (luksAddKey)
//! 16 MiB     data segment: aes-xts-plain64, 512-bit key, 4096-byte sectors, to the end
//! ```
//!
//! There is no keyslot: the volume key comes from the join service (today, in development, from
//! fw_cfg), so there is no passphrase and no KDF on the boot path. The only thing on disk that
//! depends on the key is the LUKS2 *digest*: PBKDF2-SHA256 over the volume key with a 32-byte
//! salt, exactly as cryptsetup's `pbkdf2` digest handler computes it. It lets hawser (and
//! cryptsetup) tell a wrong key from a right one before anything is mapped.
//!
//! The header is not authenticated: whoever controls the disk can rewrite it and recompute its
//! checksums (CVE-2025-59054: a host that rewrites the data segment to `cipher_null` reads
//! everything a confidential VM writes). So hawser never takes cipher, sector size, data offset
//! or integrity mode from the header: they are constants here (and the integrity mode is a
//! measured kernel command line option), the dm-crypt table is built from these constants, and
//! a header that says anything else is refused ([`validate`]). The header is read only for its
//! UUID (the key's identity), its digest, and hawser's own "initialized" mark.
//!
//! The "initialized" mark is a LUKS2 token of type `hawser` with `"state": "initialized"`,
//! written only after the filesystem exists (see `lifecycle`). cryptsetup keeps unknown tokens
//! when it rewrites a header, so an operator's `luksAddKey` does not reset it.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Size of one header copy (binary header + JSON area): cryptsetup's default and hawser's only.
pub const HEADER_SIZE: usize = 16 * 1024;
/// The binary header at the start of each copy.
pub const BINARY_HEADER_LEN: usize = 4096;
/// The JSON area following each binary header.
pub const JSON_AREA_LEN: usize = HEADER_SIZE - BINARY_HEADER_LEN;
/// Both copies: the bytes [`parse_headers`] reads from the start of the disk.
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
/// PBKDF2 iterations of the digest hawser writes: cryptsetup's minimum. The volume key is 512
/// random bits, so stretching it buys nothing; see the module documentation.
pub const DIGEST_ITERATIONS: u32 = 1000;
/// The most digest iterations hawser computes. cryptsetup benchmarks its digest to ~125 ms on
/// the formatting machine (a few 100 000 iterations); a header asking for more is refused
/// rather than allowed to stall the boot.
pub const MAX_DIGEST_ITERATIONS: u32 = 4_000_000;
/// Bytes of the digest salt (cryptsetup's `LUKS_SALTSIZE`).
pub const DIGEST_SALT_LEN: usize = 32;
/// Bytes of a PBKDF2-SHA256 digest.
pub const DIGEST_LEN: usize = 32;
/// Bytes of the per-copy salt in the binary header.
pub const HEADER_SALT_LEN: usize = 64;
/// The type of hawser's LUKS2 token.
pub const STATE_TOKEN_TYPE: &str = "hawser";
/// The value of the token's `state` field once the filesystem exists.
pub const STATE_INITIALIZED: &str = "initialized";

const MAGIC_PRIMARY: &[u8; 6] = b"LUKS\xba\xbe";
const MAGIC_SECONDARY: &[u8; 6] = b"SKUL\xba\xbe";

// Field offsets of the binary header (`struct luks2_hdr_disk`, big-endian integers).
const OFF_VERSION: usize = 6;
const OFF_HDR_SIZE: usize = 8;
const OFF_SEQID: usize = 16;
const OFF_LABEL: usize = 24;
const OFF_CHECKSUM_ALG: usize = 72;
const OFF_SALT: usize = 104;
const OFF_UUID: usize = 168;
const OFF_SUBSYSTEM: usize = 208;
const OFF_HDR_OFFSET: usize = 256;
const OFF_CSUM: usize = 448;
const LABEL_LEN: usize = 48;
const CHECKSUM_ALG_LEN: usize = 32;
const UUID_LEN: usize = 40;
const CSUM_LEN: usize = 64;

/// Which of the two header copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    Primary,
    Secondary,
}

impl Copy {
    /// Byte offset of this copy on the disk.
    pub fn offset(self) -> u64 {
        match self {
            Copy::Primary => 0,
            Copy::Secondary => SECONDARY_OFFSET,
        }
    }

    /// The other copy.
    pub fn other(self) -> Copy {
        match self {
            Copy::Primary => Copy::Secondary,
            Copy::Secondary => Copy::Primary,
        }
    }

    fn magic(self) -> &'static [u8; 6] {
        match self {
            Copy::Primary => MAGIC_PRIMARY,
            Copy::Secondary => MAGIC_SECONDARY,
        }
    }
}

impl fmt::Display for Copy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Copy::Primary => f.write_str("primary header (offset 0)"),
            Copy::Secondary => write!(f, "secondary header (offset {SECONDARY_OFFSET})"),
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

/// The key check stored in the header: PBKDF2-SHA256(volume key, salt, iterations).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyDigest {
    pub salt: [u8; DIGEST_SALT_LEN],
    pub iterations: u32,
    pub digest: [u8; DIGEST_LEN],
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not a secret, but a verifier of one: nothing a log needs.
        f.debug_struct("KeyDigest")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl KeyDigest {
    /// The digest of `key` with `salt`, as cryptsetup computes it.
    pub fn compute(key: &[u8], salt: [u8; DIGEST_SALT_LEN], iterations: u32) -> KeyDigest {
        KeyDigest {
            salt,
            iterations,
            digest: pbkdf2_sha256(key, &salt, iterations),
        }
    }

    /// Whether `key` is the volume key this digest was made from (constant-time comparison).
    pub fn matches(&self, key: &[u8]) -> bool {
        let actual = pbkdf2_sha256(key, &self.salt, self.iterations);
        actual
            .iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

fn pbkdf2_sha256(key: &[u8], salt: &[u8], iterations: u32) -> [u8; DIGEST_LEN] {
    let mut out = [0u8; DIGEST_LEN];
    pbkdf2::pbkdf2_hmac::<Sha256>(key, salt, iterations, &mut out);
    out
}

/// Why one header copy is not a LUKS2 header hawser can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    #[error("the {copy} has no LUKS2 magic")]
    NoMagic { copy: Copy },
    #[error("the {copy} is LUKS version {version}; hawser reads LUKS2 only")]
    Version { copy: Copy, version: u16 },
    #[error(
        "the {copy} declares a header size of {size} bytes; hawser writes and reads only {HEADER_SIZE}"
    )]
    HeaderSize { copy: Copy, size: u64 },
    #[error("the {copy} says it lives at offset {declared}")]
    Offset { copy: Copy, declared: u64 },
    #[error("the {copy} uses checksum algorithm {found:?}; hawser accepts only {CHECKSUM_ALG}")]
    ChecksumAlgorithm { copy: Copy, found: String },
    #[error("the {copy} has a wrong checksum (torn write or modified header)")]
    Checksum { copy: Copy },
    #[error("the {copy} has a malformed {field}: {reason}")]
    Field {
        copy: Copy,
        field: &'static str,
        reason: String,
    },
    #[error("the JSON area of the {copy} is malformed: {reason}")]
    Json { copy: Copy, reason: String },
}

/// Why a well-formed LUKS2 header is not one hawser opens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "the {copy} belongs to subsystem {found:?}, not {SUBSYSTEM:?}: another LUKS2 volume, not hawser's state disk"
    )]
    NotHawser { copy: Copy, found: String },
    #[error("the {copy} has {what} {found}, hawser only opens {expected}")]
    Mismatch {
        copy: Copy,
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("the {copy} requires LUKS2 features hawser does not implement: {requirements:?}")]
    Requirements {
        copy: Copy,
        requirements: Vec<String>,
    },
}

/// One header copy that passed the format checks (magic, sizes, checksum, JSON shape).
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderCopy {
    pub copy: Copy,
    pub seqid: u64,
    pub label: String,
    pub subsystem: String,
    /// As written (cryptsetup writes it lowercase).
    pub uuid: String,
    /// The JSON area, byte for byte (for repairing the other copy).
    pub json_area: Vec<u8>,
    metadata: Metadata,
}

impl fmt::Debug for HeaderCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeaderCopy")
            .field("copy", &self.copy)
            .field("seqid", &self.seqid)
            .field("label", &self.label)
            .field("subsystem", &self.subsystem)
            .field("uuid", &self.uuid)
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

/// A header hawser accepts: what the rest of hawser reads from the disk, and nothing more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header's UUID, lowercase: the identity under which the key is derived.
    pub uuid: String,
    pub seqid: u64,
    pub integrity: Integrity,
    pub digest: KeyDigest,
    pub state: DiskState,
}

// The JSON metadata. Fields hawser does not write are refused where they could change how the
// data is read (segments, digests, config); keyslots and foreign tokens (an operator's
// recovery keyslot and its tokens) are carried along but never used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    keyslots: BTreeMap<String, serde_json::Value>,
    tokens: BTreeMap<String, serde_json::Value>,
    segments: BTreeMap<String, Segment>,
    digests: BTreeMap<String, JsonDigest>,
    config: Config,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Segment {
    #[serde(rename = "type")]
    kind: String,
    offset: String,
    size: String,
    iv_tweak: String,
    encryption: String,
    sector_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    integrity: Option<SegmentIntegrity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flags: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SegmentIntegrity {
    #[serde(rename = "type")]
    kind: String,
    journal_encryption: String,
    journal_integrity: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDigest {
    #[serde(rename = "type")]
    kind: String,
    keyslots: Vec<String>,
    segments: Vec<String>,
    hash: String,
    iterations: u64,
    salt: String,
    digest: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    json_size: String,
    keyslots_size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requirements: Option<Requirements>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Requirements {
    #[serde(default)]
    mandatory: Vec<String>,
}

/// hawser's token: `{"type":"hawser","keyslots":[],"state":"initialized"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateToken {
    #[serde(rename = "type")]
    kind: String,
    keyslots: Vec<String>,
    state: String,
}

fn be_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(raw)
}

/// A NUL-terminated string field. The field must hold a NUL (cryptsetup terminates the last
/// byte) and be UTF-8; bytes after the NUL are ignored, as cryptsetup does.
fn c_string(
    copy: Copy,
    field: &'static str,
    bytes: &[u8],
    at: usize,
    len: usize,
) -> Result<String, CopyError> {
    let raw = &bytes[at..at + len];
    let end = raw.iter().position(|&b| b == 0).ok_or(CopyError::Field {
        copy,
        field,
        reason: "not NUL-terminated".into(),
    })?;
    String::from_utf8(raw[..end].to_vec()).map_err(|_| CopyError::Field {
        copy,
        field,
        reason: "not UTF-8".into(),
    })
}

/// Whether `bytes` (at least the first 512 bytes of a copy) start with a LUKS2 binary header
/// that names hawser as its owner — checksum or not. A format that was cut short leaves this
/// behind: the binary header's first sector is written, and synced, before its JSON area.
pub fn is_hawser_binary_header(copy: Copy, bytes: &[u8]) -> bool {
    bytes.len() >= 512
        && &bytes[..6] == copy.magic()
        && be_u16(bytes, OFF_VERSION) == 2
        && c_string(copy, "subsystem", bytes, OFF_SUBSYSTEM, LABEL_LEN).as_deref() == Ok(SUBSYSTEM)
}

/// Whether `bytes` start with any LUKS header (version 1 or 2, primary magic).
pub fn has_luks_magic(bytes: &[u8]) -> bool {
    bytes.len() >= 6 && &bytes[..6] == MAGIC_PRIMARY
}

/// Parses one copy (exactly [`HEADER_SIZE`] bytes read at `copy.offset()`): magic, version,
/// header size, offset, checksum, and the JSON area's shape. Says nothing about whether hawser
/// accepts what the header describes: that is [`validate`].
pub fn parse_copy(copy: Copy, bytes: &[u8]) -> Result<HeaderCopy, CopyError> {
    if bytes.len() != HEADER_SIZE {
        return Err(CopyError::Field {
            copy,
            field: "length",
            reason: format!("{} bytes given, {HEADER_SIZE} expected", bytes.len()),
        });
    }
    if &bytes[..6] != copy.magic() {
        return Err(CopyError::NoMagic { copy });
    }
    let version = be_u16(bytes, OFF_VERSION);
    if version != 2 {
        return Err(CopyError::Version { copy, version });
    }
    let size = be_u64(bytes, OFF_HDR_SIZE);
    if size != HEADER_SIZE as u64 {
        return Err(CopyError::HeaderSize { copy, size });
    }
    let declared = be_u64(bytes, OFF_HDR_OFFSET);
    if declared != copy.offset() {
        return Err(CopyError::Offset { copy, declared });
    }
    let alg = c_string(
        copy,
        "checksum algorithm",
        bytes,
        OFF_CHECKSUM_ALG,
        CHECKSUM_ALG_LEN,
    )?;
    if alg != CHECKSUM_ALG {
        return Err(CopyError::ChecksumAlgorithm { copy, found: alg });
    }
    if checksum(bytes) != bytes[OFF_CSUM..OFF_CSUM + 32] {
        return Err(CopyError::Checksum { copy });
    }
    let label = c_string(copy, "label", bytes, OFF_LABEL, LABEL_LEN)?;
    let subsystem = c_string(copy, "subsystem", bytes, OFF_SUBSYSTEM, LABEL_LEN)?;
    let uuid = c_string(copy, "UUID", bytes, OFF_UUID, UUID_LEN)?;
    if !is_uuid(&uuid) {
        return Err(CopyError::Field {
            copy,
            field: "UUID",
            reason: format!("{uuid:?} is not a UUID"),
        });
    }
    let json_area = &bytes[BINARY_HEADER_LEN..];
    let metadata = parse_json_area(copy, json_area)?;
    Ok(HeaderCopy {
        copy,
        seqid: be_u64(bytes, OFF_SEQID),
        label,
        subsystem,
        uuid,
        json_area: json_area.to_vec(),
        metadata,
    })
}

/// sha256 over the copy with its checksum field zeroed (binary header + JSON area).
fn checksum(bytes: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(&bytes[..OFF_CSUM]);
    hasher.update([0u8; CSUM_LEN]);
    hasher.update(&bytes[OFF_CSUM + CSUM_LEN..]);
    hasher.finalize().into()
}

/// cryptsetup's rules for the JSON area: it starts with `{`, the JSON text ends at the first
/// NUL, and every byte after it is NUL (so at least one NUL exists).
fn parse_json_area(copy: Copy, area: &[u8]) -> Result<Metadata, CopyError> {
    let json_error = |reason: String| CopyError::Json { copy, reason };
    if area.first() != Some(&b'{') {
        return Err(json_error("it does not start with '{'".into()));
    }
    let end = area
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| json_error("the JSON text is not NUL-terminated".into()))?;
    if let Some(at) = area[end..].iter().position(|&b| b != 0) {
        return Err(json_error(format!(
            "non-zero byte after the JSON text at offset {}",
            end + at
        )));
    }
    let metadata: Metadata =
        serde_json::from_slice(&area[..end]).map_err(|e| json_error(e.to_string()))?;
    if metadata.config.json_size != JSON_AREA_LEN.to_string() {
        return Err(json_error(format!(
            "config.json_size is {:?}, the binary header says {JSON_AREA_LEN}",
            metadata.config.json_size
        )));
    }
    for (section, keys) in [
        ("keyslots", metadata.keyslots.keys().collect::<Vec<_>>()),
        ("tokens", metadata.tokens.keys().collect()),
        ("segments", metadata.segments.keys().collect()),
        ("digests", metadata.digests.keys().collect()),
    ] {
        if let Some(key) = keys.iter().find(|key| !is_decimal(key)) {
            return Err(json_error(format!(
                "{section} has a non-numeric key {key:?}"
            )));
        }
    }
    Ok(metadata)
}

fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit())
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with hex digits of either case.
pub fn is_uuid(text: &str) -> bool {
    text.parse::<hawser_disk_format::Guid>().is_ok()
}

/// Checks a well-formed copy against what hawser writes. `integrity` is the measured mode:
/// a header describing another mode is refused, as is any other cipher, sector size, offset,
/// size, IV tweak, segment flag, digest kind or mandatory requirement.
pub fn validate(copy: &HeaderCopy, integrity: Integrity) -> Result<Header, PolicyError> {
    let which = copy.copy;
    if copy.subsystem != SUBSYSTEM {
        return Err(PolicyError::NotHawser {
            copy: which,
            found: copy.subsystem.clone(),
        });
    }
    let mismatch = |what: &'static str, expected: String, found: String| PolicyError::Mismatch {
        copy: which,
        what,
        expected,
        found,
    };
    let metadata = &copy.metadata;
    if let Some(requirements) = &metadata.config.requirements
        && !requirements.mandatory.is_empty()
    {
        return Err(PolicyError::Requirements {
            copy: which,
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
    for token in metadata.tokens.values() {
        if token.get("type").and_then(|t| t.as_str()) != Some(STATE_TOKEN_TYPE) {
            continue;
        }
        let token: StateToken = serde_json::from_value(token.clone()).map_err(|e| {
            mismatch(
                "a malformed hawser token",
                format!("{{\"type\":\"{STATE_TOKEN_TYPE}\",\"keyslots\":[],\"state\":\"{STATE_INITIALIZED}\"}}"),
                e.to_string(),
            )
        })?;
        if token.state != STATE_INITIALIZED || state == DiskState::Initialized {
            return Err(mismatch(
                "a hawser token with state",
                format!("one token with {STATE_INITIALIZED:?}"),
                format!("{:?}", token.state),
            ));
        }
        state = DiskState::Initialized;
    }

    Ok(Header {
        uuid: copy.uuid.to_ascii_lowercase(),
        seqid: copy.seqid,
        integrity,
        digest,
        state,
    })
}

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

fn integrity_json(kind: &str) -> SegmentIntegrity {
    SegmentIntegrity {
        kind: kind.to_owned(),
        journal_encryption: "none".into(),
        journal_integrity: "none".into(),
    }
}

/// Why the two copies together do not give a header hawser opens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("no valid LUKS2 header: {primary}; {secondary}")]
    NoValidCopy {
        primary: CopyError,
        secondary: CopyError,
    },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(
        "the two header copies disagree at the same sequence number {seqid} (a modified header)"
    )]
    Inconsistent { seqid: u64 },
}

/// The header to use, and what to do about the other copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    pub header: Header,
    /// The copy the header was read from.
    pub source: HeaderCopy,
    /// The other copy is missing, damaged or older: rewrite it from `source` once the key has
    /// been verified (cryptsetup repairs it the same way).
    pub repair: Option<(Copy, String)>,
}

/// Reads both copies from the first [`HEADERS_LEN`] bytes of a disk and picks the header,
/// cryptsetup-style: the valid copy with the higher sequence number (primary on a tie). Every
/// valid copy must pass [`validate`]: a tampered copy is refused even if the other is fine.
pub fn parse_headers(area: &[u8], integrity: Integrity) -> Result<Selected, HeaderError> {
    let primary = area.get(..HEADER_SIZE).map_or_else(
        || {
            Err(CopyError::Field {
                copy: Copy::Primary,
                field: "length",
                reason: "the disk is shorter than one header".into(),
            })
        },
        |bytes| parse_copy(Copy::Primary, bytes),
    );
    let secondary = area.get(HEADER_SIZE..HEADERS_LEN).map_or_else(
        || {
            Err(CopyError::Field {
                copy: Copy::Secondary,
                field: "length",
                reason: "the disk is shorter than two headers".into(),
            })
        },
        |bytes| parse_copy(Copy::Secondary, bytes),
    );
    match (primary, secondary) {
        (Err(primary), Err(secondary)) => Err(HeaderError::NoValidCopy { primary, secondary }),
        (Ok(one), Err(broken)) | (Err(broken), Ok(one)) => {
            let header = validate(&one, integrity)?;
            Ok(Selected {
                header,
                repair: Some((one.copy.other(), broken.to_string())),
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
                older.copy, older.seqid, newer.seqid
            );
            Ok(Selected {
                header,
                repair: Some((older.copy, reason)),
                source: newer,
            })
        }
    }
}

/// What a new header says.
#[derive(Debug, Clone)]
pub struct NewHeader {
    /// Lowercase UUID.
    pub uuid: String,
    pub integrity: Integrity,
    pub digest: KeyDigest,
    pub state: DiskState,
    pub seqid: u64,
}

/// The JSON area of a header hawser writes, NUL-padded to [`JSON_AREA_LEN`].
pub fn json_area(header: &NewHeader) -> Vec<u8> {
    let mut tokens = BTreeMap::new();
    if header.state == DiskState::Initialized {
        let token = StateToken {
            kind: STATE_TOKEN_TYPE.into(),
            keyslots: Vec::new(),
            state: STATE_INITIALIZED.into(),
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

/// Fields of the binary header.
#[derive(Debug, Clone)]
pub struct BinaryHeader<'a> {
    pub seqid: u64,
    pub uuid: &'a str,
    pub label: &'a str,
    pub subsystem: &'a str,
    /// Unique per copy (cryptsetup regenerates it for each).
    pub salt: [u8; HEADER_SALT_LEN],
}

/// One complete copy: binary header with its checksum over itself and `json_area`.
pub fn header_copy(copy: Copy, fields: &BinaryHeader<'_>, json_area: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; HEADER_SIZE];
    bytes[..6].copy_from_slice(copy.magic());
    bytes[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&2u16.to_be_bytes());
    bytes[OFF_HDR_SIZE..OFF_HDR_SIZE + 8].copy_from_slice(&(HEADER_SIZE as u64).to_be_bytes());
    bytes[OFF_SEQID..OFF_SEQID + 8].copy_from_slice(&fields.seqid.to_be_bytes());
    put_c_string(&mut bytes, OFF_LABEL, LABEL_LEN, fields.label);
    put_c_string(&mut bytes, OFF_CHECKSUM_ALG, CHECKSUM_ALG_LEN, CHECKSUM_ALG);
    bytes[OFF_SALT..OFF_SALT + HEADER_SALT_LEN].copy_from_slice(&fields.salt);
    put_c_string(&mut bytes, OFF_UUID, UUID_LEN, fields.uuid);
    put_c_string(&mut bytes, OFF_SUBSYSTEM, LABEL_LEN, fields.subsystem);
    bytes[OFF_HDR_OFFSET..OFF_HDR_OFFSET + 8].copy_from_slice(&copy.offset().to_be_bytes());
    let area_len = json_area.len().min(JSON_AREA_LEN);
    bytes[BINARY_HEADER_LEN..BINARY_HEADER_LEN + area_len].copy_from_slice(&json_area[..area_len]);
    let sum = checksum(&bytes);
    bytes[OFF_CSUM..OFF_CSUM + 32].copy_from_slice(&sum);
    bytes
}

/// Writes `text` NUL-terminated into a fixed field (truncated to leave the final NUL).
fn put_c_string(bytes: &mut [u8], at: usize, len: usize, text: &str) {
    let n = text.len().min(len - 1);
    bytes[at..at + n].copy_from_slice(&text.as_bytes()[..n]);
}

/// A new header's copy, as hawser writes it.
pub fn new_header_copy(copy: Copy, header: &NewHeader, salt: [u8; HEADER_SALT_LEN]) -> Vec<u8> {
    header_copy(
        copy,
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
        source.copy.other(),
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

    pub(crate) const UUID: &str = "0f8a41cf-4c2e-4e76-9a3b-5d1e2f3a4b5c";

    pub(crate) fn key(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn new_header(state: DiskState, integrity: Integrity, seqid: u64) -> NewHeader {
        NewHeader {
            uuid: UUID.into(),
            integrity,
            digest: KeyDigest::compute(&key(integrity.key_len()), [9; 32], DIGEST_ITERATIONS),
            state,
            seqid,
        }
    }

    pub(crate) fn both_copies(header: &NewHeader) -> Vec<u8> {
        let mut area = new_header_copy(Copy::Primary, header, [1; 64]);
        area.extend(new_header_copy(Copy::Secondary, header, [2; 64]));
        area
    }

    #[test]
    fn a_written_header_reads_back_with_what_was_written() {
        for integrity in [Integrity::None, Integrity::HmacSha256] {
            for state in [DiskState::Formatting, DiskState::Initialized] {
                let written = new_header(state, integrity, 7);
                let selected = parse_headers(&both_copies(&written), integrity).unwrap();
                assert_eq!(selected.repair, None);
                assert_eq!(selected.source.copy, Copy::Primary);
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
    fn the_digest_is_pbkdf2_sha256_of_the_key() {
        // RFC 7914 section 11 test vector for PBKDF2-HMAC-SHA256 (P="passwd", S="salt", c=1),
        // first 32 bytes.
        let mut salt = [0u8; 32];
        salt[..4].copy_from_slice(b"salt");
        let expected = "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc";
        assert_eq!(hex::encode(pbkdf2_sha256(b"passwd", b"salt", 1)), expected);
        let digest = KeyDigest::compute(&key(64), [3; 32], 1000);
        assert!(digest.matches(&key(64)));
        let mut wrong = key(64);
        wrong[63] ^= 1;
        assert!(!digest.matches(&wrong));
        assert_eq!(format!("{digest:?}"), "KeyDigest { iterations: 1000, .. }");
    }

    #[test]
    fn a_torn_copy_is_repaired_from_the_other() {
        let written = new_header(DiskState::Initialized, Integrity::None, 3);
        let mut area = both_copies(&written);
        area[BINARY_HEADER_LEN + 100] ^= 0xff; // inside the primary JSON area
        let selected = parse_headers(&area, Integrity::None).unwrap();
        assert_eq!(selected.source.copy, Copy::Secondary);
        let (copy, reason) = selected.repair.clone().unwrap();
        assert_eq!(copy, Copy::Primary);
        assert!(reason.contains("wrong checksum"), "{reason}");
        let repaired = repaired_copy(&selected.source, [5; 64]);
        area[..HEADER_SIZE].copy_from_slice(&repaired);
        let again = parse_headers(&area, Integrity::None).unwrap();
        assert_eq!(again.repair, None);
        assert_eq!(again.header, selected.header);
    }

    #[test]
    fn the_newer_copy_wins_and_the_older_is_repaired() {
        let old = new_header(DiskState::Formatting, Integrity::None, 4);
        let new = new_header(DiskState::Initialized, Integrity::None, 5);
        let mut area = new_header_copy(Copy::Primary, &old, [1; 64]);
        area.extend(new_header_copy(Copy::Secondary, &new, [2; 64]));
        let selected = parse_headers(&area, Integrity::None).unwrap();
        assert_eq!(selected.header.state, DiskState::Initialized);
        assert_eq!(selected.header.seqid, 5);
        assert_eq!(selected.repair.unwrap().0, Copy::Primary);
    }

    #[test]
    fn copies_that_disagree_at_one_seqid_are_refused() {
        let a = new_header(DiskState::Formatting, Integrity::None, 4);
        let b = new_header(DiskState::Initialized, Integrity::None, 4);
        let mut area = new_header_copy(Copy::Primary, &a, [1; 64]);
        area.extend(new_header_copy(Copy::Secondary, &b, [2; 64]));
        assert_eq!(
            parse_headers(&area, Integrity::None).unwrap_err(),
            HeaderError::Inconsistent { seqid: 4 }
        );
    }

    /// Rewrites the JSON of both copies (keeping valid checksums: the header is not
    /// authenticated, so an attacker can do exactly this).
    fn tampered(edit: impl Fn(&mut serde_json::Value)) -> Vec<u8> {
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
        let mut both = header_copy(Copy::Primary, &fields([1; 64]), &text);
        both.extend(header_copy(Copy::Secondary, &fields([2; 64]), &text));
        both
    }

    fn refusal(edit: impl Fn(&mut serde_json::Value)) -> String {
        parse_headers(&tampered(edit), Integrity::None)
            .unwrap_err()
            .to_string()
    }

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
            assert!(err.to_string().contains("unknown field"), "{err}");
        }
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
        let mut area = header_copy(Copy::Primary, &fields([1; 64]), &text);
        area.extend(header_copy(Copy::Secondary, &fields([2; 64]), &text));
        let err = parse_headers(&area, Integrity::None).unwrap_err();
        assert!(
            matches!(err, HeaderError::Policy(PolicyError::NotHawser { .. })),
            "{err}"
        );
        assert!(!is_hawser_binary_header(Copy::Primary, &area));
        assert!(has_luks_magic(&area));
    }

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
            assert!(err.to_string().contains(expected), "{expected:?}: {err}");
        }
    }

    #[test]
    fn json_area_rules_follow_cryptsetup() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let good = new_header_copy(Copy::Primary, &written, [1; 64]);
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
            parse_copy(Copy::Primary, &header_copy(Copy::Primary, &fields, &area))
                .unwrap_err()
                .to_string()
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
    }

    #[test]
    fn ownership_survives_a_torn_json_area() {
        let written = new_header(DiskState::Formatting, Integrity::None, 1);
        let mut copy = new_header_copy(Copy::Primary, &written, [1; 64]);
        copy[BINARY_HEADER_LEN..].fill(0);
        assert!(parse_copy(Copy::Primary, &copy).is_err());
        assert!(is_hawser_binary_header(Copy::Primary, &copy));
        assert!(!is_hawser_binary_header(Copy::Secondary, &copy));
        assert!(!is_hawser_binary_header(Copy::Primary, &[0u8; 4096]));
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

    #[test]
    fn key_lengths_follow_the_mode() {
        assert_eq!(Integrity::None.key_len(), 64);
        assert_eq!(Integrity::HmacSha256.key_len(), 96);
    }
}
