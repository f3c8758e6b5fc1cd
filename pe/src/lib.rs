//! hawser-pe: the one reader of PE/COFF images in hawser, bounds-checked.
//!
//! Two crates need the same facts about a PE file. The image builder (`hawser-image`'s `uki`)
//! edits systemd-stub into a UKI and reads UKIs back; the PCR predictor (`hawser-measurements`)
//! computes the Authenticode hash firmware extends into PCR 4 (header size, `CheckSum` and
//! certificate-table fields, every section's file range) and systemd-stub's PCR 11 measurements
//! (each section's name, `VirtualSize` and data). Both parse the same headers, so the format is
//! defined once, here: [`PeImage::parse`] reads the DOS header, the COFF file header, the
//! optional header (PE32 or PE32+), its data directories and the section table, checks every
//! offset, and fails with a [`PeError`] that says which structure lies where, never a panic.
//! What each consumer does with the result stays in that consumer: the Authenticode byte ranges
//! in `hawser-measurements`, the ukify-compatible writing in `hawser-image` (which writes the
//! fields at the offsets in [`format`](mod@format)).
//!
//! The UKI and the kernel inside its `.linux` section are untrusted input to the predictor (a
//! file given on the command line), so the reader also refuses what a firmware loader refuses:
//! a section beyond `SizeOfImage`, section data outside the file, an implausibly large image.
//!
//! Format reference: Microsoft "PE Format" (PE/COFF specification), sections "MS-DOS Stub",
//! "Signature", "COFF File Header", "Optional Header", "Section Table".

pub mod format;
mod image;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use image::{Loaded, PeImage, SectionHeader};

/// Optional header magic of a PE32 image.
pub const MAGIC_PE32: u16 = format::OPTIONAL_MAGIC_PE32;
/// Optional header magic of a PE32+ image.
pub const MAGIC_PE32_PLUS: u16 = format::OPTIONAL_MAGIC_PE32_PLUS;

/// The largest `SizeOfImage` accepted: 1 GiB, far beyond any bootable UKI (the firmware must
/// allocate that much memory to load it). Bounds what a hostile file can make a reader hash.
pub const MAX_SIZE_OF_IMAGE: u32 = 1 << 30;

/// Why a file is not a usable PE image. `image` is the caller's label for the file (e.g.
/// `UKI out/hawser.efi`); the variants carry no other error, so none has a source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeError {
    /// The file does not start like a PE image at all: no `MZ`, no `PE\0\0` signature where
    /// `e_lfanew` points, or an optional header magic that is neither PE32 nor PE32+.
    #[error("the {image} is not a PE image: {reason}")]
    NotPe { image: String, reason: String },
    /// A structure extends past the end of the file.
    #[error(
        "the {image} is truncated: {what} needs bytes {offset:#x}..{end:#x} but the file has only {len:#x} bytes"
    )]
    Truncated {
        image: String,
        what: String,
        offset: u64,
        end: u64,
        len: usize,
    },
    /// The headers contradict each other or the PE format, or what a consumer computes from
    /// them (an Authenticode range) does not fit the file.
    #[error("the {image} is malformed: {reason}")]
    Malformed { image: String, reason: String },
}
