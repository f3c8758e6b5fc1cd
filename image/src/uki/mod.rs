//! Unified Kernel Image (UKI) assembly: systemd-stub + `.osrel` `.cmdline` `.uname` `.linux`
//! `.initrd`, laid out exactly as `ukify build` of systemd 257 lays them out.
//!
//! # Why not just run ukify
//!
//! The UKI is what firmware measures into PCR 4 (Authenticode hash of the whole PE) and what
//! systemd-stub measures into PCR 11 (each section's name and contents), so a verifier can only
//! predict those PCRs if the image is a pure function of its inputs. ukify needs Python, pefile
//! and (for some inputs) objcopy of whatever version the build host has; this module is a few
//! hundred lines of dependency-free PE editing whose output is byte-identical to ukify 257's for
//! the same inputs, apart from the PE `CheckSum` field (see below).
//!
//! # What ukify 257 does, and what this module does
//!
//! Source: `src/ukify/ukify.py` of systemd v257.13, the version Debian trixie ships as
//! 257.13-1~deb13u1 (read from Debian's source package, which carries no patches to it):
//! `make_uki()`'s section list
//! (<https://github.com/systemd/systemd/blob/v257.13/src/ukify/ukify.py#L1205-L1226>),
//! `pe_add_sections()` (<https://github.com/systemd/systemd/blob/v257.13/src/ukify/ukify.py#L865-L1009>),
//! `merge_sbat()` and `STUB_SBAT`
//! (<https://github.com/systemd/systemd/blob/v257.13/src/ukify/ukify.py#L1012-L1121>).
//!
//! 1. **Order.** Sections are appended in `make_uki()`'s fixed order `.osrel`, `.cmdline`, `.dtb`,
//!    `.dtbauto`, `.hwids`, `.uname`, `.splash`, `.pcrpkey`, `.linux`, `.initrd`, `.ucode`, then
//!    `.sbat`; a section whose content is an empty string is left out (`if content:`). hawser
//!    uses the subset `.osrel`, `.cmdline`, `.uname`, `.linux`, `.initrd`; an empty `Vec` is left
//!    out the same way, except `.linux`, which the stub requires (`find_sections()` in
//!    `src/boot/stub.c` fails with "Image lacks .linux section").
//! 2. **Header room.** `SizeOfHeaders` is rounded up to `FileAlignment` (the space before the
//!    first section's file-aligned data is unused), never grown further; each new 40-byte section
//!    header goes right after the last one and must end within `SizeOfHeaders`, otherwise ukify
//!    fails with "Not enough header space" and so does [`assemble_uki`]
//!    ([`UkiError::NoRoomForSectionHeader`]). Debian's stub has `SizeOfHeaders` 0x600 and its 6
//!    headers end at 0x238: room for 24 more, hawser adds 5.
//! 3. **File layout.** New data starts at the end of the file rounded up to `FileAlignment`;
//!    `SizeOfRawData` is the data length rounded up to `FileAlignment`, zero-padded;
//!    `VirtualSize` is the exact data length (so the stub, which reads `VirtualSize` bytes,
//!    sees exactly the input).
//! 4. **Memory layout.** `VirtualAddress` = (previous section's `VirtualAddress` +
//!    `VirtualSize`) rounded up to `SectionAlignment`, in section-table order; `SizeOfImage` =
//!    the last section's end rounded up to `SectionAlignment`.
//! 5. **Flags.** `.linux` gets `IMAGE_SCN_CNT_CODE | IMAGE_SCN_MEM_READ` (0x4000_0020), all
//!    others `IMAGE_SCN_CNT_INITIALIZED_DATA | IMAGE_SCN_MEM_READ` (0x4000_0040). If `.linux` is
//!    a PE without `NX_COMPAT`, the UKI's `NX_COMPAT` is cleared too (ukify: both must agree, or
//!    firmware that enforces the flag will fail to boot the kernel). `NumberOfSections` is incremented and
//!    `SizeOfInitializedData` grows by each new section's `VirtualSize` (`.linux` included);
//!    `SizeOfCode` is left alone.
//! 6. **SBAT.** ukify replaces the stub's `.sbat` section in place with the merge of the stub's
//!    and the kernel's SBAT lines plus ukify's default `uki,1,UKI,…` line (`merge_sbat()`,
//!    `STUB_SBAT`), failing if it does not fit in the section's `SizeOfRawData`. This changes
//!    the `.sbat` contents the stub measures into PCR 11, so hawser does the same.
//! 7. **Refusals.** A signed stub (certificate table present) is refused, as ukify does: the
//!    signature could not cover the new sections. A COFF symbol table at the end of the file is
//!    stripped as ukify does (old stubs). ukify would also re-align stubs whose sections' file
//!    offsets or sizes are not multiples of `FileAlignment` (old stubs that were stripped);
//!    this module refuses them instead ([`UkiError::UnalignedStubSection`]): Debian's 257 stub
//!    is aligned, and a silent re-layout would only hide a wrong input.
//!
//! **The one difference:** ukify writes `CheckSum = 0`; this module writes the PE checksum
//! (the `IMAGHLP` `CheckSumMappedFile` algorithm, see [`pe_checksum`]). UEFI firmware ignores the
//! field, and the Authenticode hash that OVMF extends into PCR 4 skips it, so no measurement
//! differs; tests compare against ukify with that field zeroed.
//!
//! # What systemd-stub checks
//!
//! `src/boot/pe.c` (`pe_locate_sections_internal()`,
//! <https://github.com/systemd/systemd/blob/v257.13/src/boot/pe.c#L198-L282>): the stub finds
//! sections by their (≤ 8-byte) name, the first match wins, and it uses `VirtualAddress`/`VirtualSize` of the
//! image as loaded by the firmware, so every section must lie within `SizeOfImage` (which the
//! firmware's loader enforces) and names longer than 8 bytes cannot be used. There is no
//! ordering requirement; `.linux` only has to exist. What the stub measures from these sections
//! is in `docs/research/systemd-stub-257-measurements.md`.
//!
//! Everything is deterministic: the output is a function of the stub and section bytes only
//! (the stub's `TimeDateStamp` is kept as is).
//!
//! # Where the code is
//!
//! PE headers are read by `hawser-pe`, the reader the PCR predictor uses too; this module adds
//! what the UKI needs on top (PE32+, x86_64, power-of-two alignments). `assemble` edits the
//! stub into a UKI (writing fields at `hawser_pe::format`'s offsets), `sbat` is ukify's SBAT
//! merge and `checksum` the PE checksum.

use std::fmt;

use hawser_pe::format::{MACHINE_AMD64, OPTIONAL_MAGIC_PE32_PLUS};
use hawser_pe::{PeError, PeImage};

mod assemble;
mod checksum;
mod sbat;

pub use assemble::assemble_uki;

/// Why a UKI could not be assembled or read.
#[derive(Debug, thiserror::Error)]
pub enum UkiError {
    /// The stub or UKI is not a PE image, or its headers are truncated or contradict each other
    /// (the reader's error says which structure).
    #[error("the {image} is not a well-formed PE image")]
    Pe {
        image: Image,
        #[source]
        source: PeError,
    },
    /// The file is a PE image, but not PE32+.
    #[error(
        "the {image} is not a PE32+ image: its optional header magic is {magic:#06x}, not 0x020b"
    )]
    NotPe32Plus { image: Image, magic: u16 },
    /// The file is a PE image for another machine.
    #[error("the {image} is not an x86_64 image: its COFF machine is {machine:#06x}, not 0x8664")]
    WrongMachine { image: Image, machine: u16 },
    /// The headers break a rule the UKI layout relies on (alignments, sections outside the
    /// header area, an empty section table).
    #[error("the {image} is malformed: {reason}")]
    Malformed { image: Image, reason: String },
    /// A header field or section to be edited lies beyond the end of the image being edited
    /// (a stub whose trailing symbol table, which is stripped, starts inside its headers or
    /// sections).
    #[error(
        "the {image} is truncated: the {what} needs bytes {offset:#x}..{end:#x} but the file has {len:#x} bytes"
    )]
    Truncated {
        image: Image,
        what: &'static str,
        offset: usize,
        end: usize,
        len: usize,
    },
    /// A stub section's file offset or size is not a multiple of `FileAlignment`.
    #[error(
        "the stub's section {section} is not file-aligned (PointerToRawData {pointer:#x}, SizeOfRawData {size:#x}, FileAlignment {alignment:#x}); ukify would re-lay it out, hawser refuses such a stub"
    )]
    UnalignedStubSection {
        section: String,
        pointer: u32,
        size: u32,
        alignment: u32,
    },
    /// The stub is Authenticode-signed.
    #[error(
        "the stub is signed (certificate table at file offset {offset:#x}, {size:#x} bytes): a signature cannot cover the sections added to it, so an unsigned stub is required (as with ukify)"
    )]
    StubSigned { offset: u32, size: u32 },
    /// The header area has no room for another section header.
    #[error(
        "no room for the {section} section header: it would end at {header_end:#x}, past SizeOfHeaders {size_of_headers:#x}"
    )]
    NoRoomForSectionHeader {
        section: &'static str,
        header_end: usize,
        size_of_headers: u32,
    },
    /// The kernel section is empty.
    #[error("the .linux section is empty: systemd-stub refuses a UKI without a kernel")]
    MissingKernel,
    /// A section or the whole image would exceed the 32-bit PE limits.
    #[error(
        "the {section} section ({len} bytes) does not fit the 32-bit sizes and addresses of a PE image"
    )]
    TooLarge { section: String, len: usize },
    /// A replacement for an existing stub section is larger than that section's file space.
    #[error(
        "the merged {section} section is {needed} bytes but the stub's {section} has room for {available} bytes"
    )]
    NoRoomInStubSection {
        section: &'static str,
        needed: usize,
        available: u32,
    },
    /// An SBAT section is not UTF-8 text.
    #[error("the {image}'s .sbat section is not UTF-8 text")]
    InvalidSbat {
        image: Image,
        #[source]
        source: std::str::Utf8Error,
    },
}

/// Which input an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    /// The systemd-stub passed to [`assemble_uki`].
    Stub,
    /// The image passed to [`read_uki_sections`] or [`pe_checksum`], or the one
    /// [`assemble_uki`] made, read back.
    Uki,
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Image::Stub => "stub",
            Image::Uki => "UKI",
        })
    }
}

/// The payload sections hawser puts into the UKI. Bytes are used verbatim (no NUL or newline is
/// added); an empty `Vec` leaves the section out, as ukify does for an empty string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UkiSections {
    /// os-release(5) text, passed by the stub to the kernel as `/.extra/os-release` in an extra
    /// initrd (which the Linux EFI stub measures into PCR 9 together with `.initrd`).
    pub osrel: Vec<u8>,
    /// The kernel command line (UTF-8; the stub turns control characters into spaces and trims).
    pub cmdline: Vec<u8>,
    /// `uname -r` of the kernel.
    pub uname: Vec<u8>,
    /// The kernel's EFI-stub PE image (vmlinuz).
    pub linux: Vec<u8>,
    /// The initramfs.
    pub initrd: Vec<u8>,
}

/// One section of a PE image, as [`read_uki_sections`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UkiSection {
    /// The section name with trailing NULs removed (e.g. `.linux`).
    pub name: String,
    /// `VirtualAddress`: the section's offset from the image base once loaded (an RVA).
    pub virtual_address: u32,
    /// `VirtualSize`: how many bytes the loaded section has; systemd-stub measures this many.
    pub virtual_size: u32,
    /// `PointerToRawData`: where the section's data is in the file.
    pub file_offset: u32,
    /// `Characteristics` flags (`IMAGE_SCN_*`).
    pub characteristics: u32,
    /// The section's data in the file: `min(SizeOfRawData, VirtualSize)` bytes, which is what
    /// the loader copies; the rest of the loaded section up to `virtual_size` is zero.
    pub data: Vec<u8>,
}

impl UkiSection {
    /// The section as it is in memory once loaded, `virtual_size` bytes: `data` followed by
    /// zeros. This is what systemd-stub hashes into PCR 11.
    pub fn loaded_data(&self) -> Vec<u8> {
        let mut loaded = self.data.clone();
        // `virtual_size` is a u32, so this fits in usize on every target hawser supports.
        loaded.resize(self.virtual_size as usize, 0);
        loaded
    }
}

/// Lists the sections of a PE32+ x86_64 image (a UKI, the stub, or a kernel) in section-table
/// order, each with its name, RVA, virtual size, file offset, flags and data.
///
/// Fails, without panicking, on anything that is not a well-formed PE32+ x86_64 image or whose
/// sections' data lie outside the file.
pub fn read_uki_sections(uki: &[u8]) -> Result<Vec<UkiSection>, UkiError> {
    let pe = parse_pe32_plus_x64(uki, Image::Uki)?;
    Ok(pe
        .sections
        .iter()
        .map(|s| UkiSection {
            name: s.name.clone(),
            virtual_address: s.virtual_address,
            virtual_size: s.virtual_size,
            file_offset: s.pointer_to_raw_data,
            characteristics: s.characteristics,
            data: pe.file_data(s).to_vec(),
        })
        .collect())
}

/// The PE image checksum of `image` (`CheckSumMappedFile`): the 16-bit one's-complement-style
/// sum of the file's little-endian words with the `CheckSum` field counted as zero, plus the
/// file length. Fails if `image` is not a PE32+ x86_64 image.
pub fn pe_checksum(image: &[u8]) -> Result<u32, UkiError> {
    let pe = parse_pe32_plus_x64(image, Image::Uki)?;
    Ok(checksum::checksum_with_field_zeroed(
        image,
        pe.checksum_offset,
    ))
}

/// Reads `data` with the shared PE reader and checks what every UKI path here relies on: PE32+,
/// x86_64, and power-of-two `FileAlignment` and `SectionAlignment`.
fn parse_pe32_plus_x64(data: &[u8], image: Image) -> Result<PeImage<'_>, UkiError> {
    let pe =
        PeImage::parse(data, image.to_string()).map_err(|source| UkiError::Pe { image, source })?;
    if pe.magic != OPTIONAL_MAGIC_PE32_PLUS {
        return Err(UkiError::NotPe32Plus {
            image,
            magic: pe.magic,
        });
    }
    if pe.machine != MACHINE_AMD64 {
        return Err(UkiError::WrongMachine {
            image,
            machine: pe.machine,
        });
    }
    for (what, value) in [
        ("FileAlignment", pe.file_alignment),
        ("SectionAlignment", pe.section_alignment),
    ] {
        if !value.is_power_of_two() {
            return Err(UkiError::Malformed {
                image,
                reason: format!("{what} is {value:#x}, not a power of two"),
            });
        }
    }
    Ok(pe)
}
