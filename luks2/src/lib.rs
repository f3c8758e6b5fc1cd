//! hawser-luks2: the LUKS2 header of hawser's state disk, as hawser writes it and as strictly as
//! hawser reads it. Pure: bytes in, values out, no I/O.
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
//! salt, exactly as cryptsetup's `pbkdf2` digest handler computes it ([`KeyDigest`]). It lets
//! hawser (and cryptsetup) tell a wrong key from a right one before anything is mapped.
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
//! written only after the filesystem exists (PID 1's disk lifecycle). cryptsetup keeps unknown
//! tokens when it rewrites a header, so an operator's `luksAddKey` does not reset it. The token
//! also records the cluster the disk belongs to (`"cluster_id"`, 64 hex digits: PCR 15's input),
//! written with the mark or, on a disk initialized without it, by [`copy_recording_cluster_id`]
//! at the node's next lock. Like the whole header it is unauthenticated: it lets PID 1 refuse a
//! join service of another cluster early and by name; the key digest is the proof.
//!
//! Reading, from the first [`HEADERS_LEN`] bytes of a disk to the [`Header`] hawser uses:
//!
//! ```text
//!   parse_headers ─┬─► parse_copy(Primary)   ─► validate ─┐
//!                  └─► parse_copy(Secondary) ─► validate ─┴─► the newer copy wins: Selected
//!                      magic, sizes, checksum,   hawser's       (the header, the copy it came
//!                      JSON shape: HeaderCopy    constants       from, the copy to repair)
//! ```
//!
//! Each step has its error: [`CopyError`] (a copy is not a LUKS2 header hawser can read),
//! [`PolicyError`] (it is, but describes something hawser does not write), [`HeaderError`]
//! (what the two copies together amount to).
//!
//! Writing: [`new_header_copy`] (a fresh header, for each [`HeaderSlot`]) and [`repaired_copy`]
//! (the other copy of a header read back). The callers own the disk: PID 1 writes the bytes
//! to the state disk in a crash-safe order, and a host-side recovery tool may read them from
//! an image; neither the order nor the device is this crate's business.
//!
//! The source files follow that path: `layout.rs` (the constants, [`HeaderSlot`],
//! [`Integrity`], [`DiskState`]), `copy_error.rs` ([`CopyError`], which the next three share),
//! `binary.rs` (the binary header: magic, fields, checksum), `metadata.rs` (the JSON area: serde
//! types and cryptsetup's rules for the area), `digest.rs` ([`KeyDigest`]), `parse.rs` (one
//! copy), `policy.rs` (hawser's constants against the header), `select.rs` (both copies),
//! `new_header.rs` ([`NewHeader`]) and `write.rs` (new and repaired copies). No two of them
//! import each other, directly or around a circle (`hawser-tiers` checks it).

mod binary;
mod copy_error;
mod digest;
mod layout;
mod metadata;
mod new_header;
mod parse;
mod policy;
mod select;
#[cfg(test)]
mod test_support;
mod write;

pub use binary::{BinaryHeader, has_luks_magic, header_copy, is_hawser_binary_header};
pub use copy_error::CopyError;
pub use digest::{
    DIGEST_ITERATIONS, DIGEST_LEN, DIGEST_SALT_LEN, KeyDigest, MAX_DIGEST_ITERATIONS,
};
pub use layout::{
    BINARY_HEADER_LEN, CHECKSUM_ALG, CIPHER, DATA_OFFSET, DiskState, HEADER_SALT_LEN, HEADER_SIZE,
    HEADERS_LEN, HMAC_KEY_LEN, HeaderSlot, Integrity, JSON_AREA_LEN, KEYSLOTS_SIZE, LABEL,
    SECONDARY_OFFSET, SECTOR_SIZE, STATE_INITIALIZED, STATE_TOKEN_TYPE, SUBSYSTEM, XTS_KEY_LEN,
};
pub use metadata::json_area;
pub use new_header::NewHeader;
pub use parse::{HeaderCopy, is_uuid, parse_copy};
pub use policy::{Header, PolicyError, validate};
pub use select::{HeaderError, Selected, parse_headers};
pub use write::{
    RecordError, copy_recording_cluster_id, new_header_copy, repaired_copy, uuid_from_random,
};
