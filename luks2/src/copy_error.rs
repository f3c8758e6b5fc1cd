//! Why one header copy is not a LUKS2 header hawser can read: the error of the format checks
//! that `binary.rs` (the binary header's fields), `metadata.rs` (the JSON area) and `parse.rs`
//! (one whole copy) make. In a module of its own so that those three import it from below
//! instead of from each other.

use hawser_disk_format::guid::ParseGuidError;

use crate::layout::{CHECKSUM_ALG, HEADER_SIZE, HeaderSlot, JSON_AREA_LEN};

/// Why one header copy is not a LUKS2 header hawser can read.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Fewer bytes than one copy were given: the disk ends inside the header.
    #[error("the {slot} has {len} bytes; a header copy has {HEADER_SIZE}")]
    Length {
        /// Which copy.
        slot: HeaderSlot,
        /// The bytes there were.
        len: usize,
    },
    /// The copy does not start with its slot's magic: not LUKS, never written, or overwritten.
    #[error("the {slot} has no LUKS2 magic")]
    NoMagic {
        /// Which copy.
        slot: HeaderSlot,
    },
    /// A LUKS header of another version (LUKS1, or a future one).
    #[error("the {slot} is LUKS version {version}; hawser reads LUKS2 only")]
    Version {
        /// Which copy.
        slot: HeaderSlot,
        /// The version the binary header declares.
        version: u16,
    },
    /// The binary header declares a header size other than the 16 KiB hawser writes.
    #[error(
        "the {slot} declares a header size of {size} bytes; hawser writes and reads only {HEADER_SIZE}"
    )]
    HeaderSize {
        /// Which copy.
        slot: HeaderSlot,
        /// The declared size.
        size: u64,
    },
    /// The binary header declares an offset other than the slot it was read from.
    #[error("the {slot} says it lives at offset {declared}")]
    Offset {
        /// Which copy.
        slot: HeaderSlot,
        /// The declared offset.
        declared: u64,
    },
    /// The checksum algorithm is not sha256.
    #[error("the {slot} uses checksum algorithm {found:?}; hawser accepts only {CHECKSUM_ALG}")]
    ChecksumAlgorithm {
        /// Which copy.
        slot: HeaderSlot,
        /// The declared algorithm.
        found: String,
    },
    /// The stored checksum is not the checksum of the copy: a write was torn, or someone
    /// changed the header without recomputing it.
    #[error("the {slot} has a wrong checksum (torn write or modified header)")]
    Checksum {
        /// Which copy.
        slot: HeaderSlot,
    },
    /// A fixed-size text field of the binary header has no terminating NUL.
    #[error("the {slot} has a malformed {field}: not NUL-terminated")]
    FieldNotTerminated {
        /// Which copy.
        slot: HeaderSlot,
        /// The field (label, subsystem, UUID, checksum algorithm).
        field: &'static str,
    },
    /// A text field of the binary header is not UTF-8.
    #[error("the {slot} has a malformed {field}: not UTF-8")]
    FieldNotUtf8 {
        /// Which copy.
        slot: HeaderSlot,
        /// The field (label, subsystem, UUID, checksum algorithm).
        field: &'static str,
        /// Where the text stops being UTF-8.
        #[source]
        source: std::str::Utf8Error,
    },
    /// The UUID field does not hold a UUID.
    #[error("the {slot} has a malformed UUID")]
    Uuid {
        /// Which copy.
        slot: HeaderSlot,
        /// What is wrong with the text.
        #[source]
        source: ParseGuidError,
    },
    /// The JSON area does not start with `{` (cryptsetup's first check).
    #[error("the JSON area of the {slot} is malformed: it does not start with '{{'")]
    JsonStart {
        /// Which copy.
        slot: HeaderSlot,
    },
    /// The JSON area has no NUL after the JSON text.
    #[error("the JSON area of the {slot} is malformed: the JSON text is not NUL-terminated")]
    JsonNotTerminated {
        /// Which copy.
        slot: HeaderSlot,
    },
    /// Something follows the JSON text's terminating NUL (cryptsetup requires zeros).
    #[error(
        "the JSON area of the {slot} is malformed: non-zero byte after the JSON text at offset {at}"
    )]
    JsonTrailingBytes {
        /// Which copy.
        slot: HeaderSlot,
        /// The first non-zero byte's offset in the JSON area.
        at: usize,
    },
    /// The JSON text is not LUKS2 metadata hawser reads: a syntax error, a missing field, or
    /// an unknown field where one could change how the data is read.
    #[error("the JSON area of the {slot} is malformed")]
    Json {
        /// Which copy.
        slot: HeaderSlot,
        /// What the JSON parser found.
        #[source]
        source: serde_json::Error,
    },
    /// `config.json_size` disagrees with the JSON area's size in the binary header.
    #[error(
        "the JSON area of the {slot} is malformed: config.json_size is {found:?}, the binary header says {JSON_AREA_LEN}"
    )]
    JsonSize {
        /// Which copy.
        slot: HeaderSlot,
        /// The value of `config.json_size`.
        found: String,
    },
    /// A keyslot, token, segment or digest has an identifier that is not a decimal number.
    #[error("the JSON area of the {slot} is malformed: {section} has a non-numeric key {key:?}")]
    NonNumericKey {
        /// Which copy.
        slot: HeaderSlot,
        /// The JSON section (`keyslots`, `tokens`, `segments`, `digests`).
        section: &'static str,
        /// The identifier.
        key: String,
    },
}
