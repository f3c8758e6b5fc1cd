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

use std::fmt;

/// Why a UKI could not be assembled or read.
#[derive(Debug, thiserror::Error)]
pub enum UkiError {
    /// A structure extends past the end of the file.
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
    /// The file is not a PE image at all.
    #[error("the {image} is not a PE image: {reason}")]
    NotPe { image: Image, reason: String },
    /// The file is a PE image, but not PE32+.
    #[error(
        "the {image} is not a PE32+ image: its optional header magic is {magic:#06x}, not 0x020b"
    )]
    NotPe32Plus { image: Image, magic: u16 },
    /// The file is a PE image for another machine.
    #[error("the {image} is not an x86_64 image: its COFF machine is {machine:#06x}, not 0x8664")]
    WrongMachine { image: Image, machine: u16 },
    /// The headers contradict each other or the PE format.
    #[error("the {image} is malformed: {reason}")]
    Malformed { image: Image, reason: String },
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
    #[error("the {image}'s .sbat section is not UTF-8 text: {source}")]
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
    /// The image passed to [`read_uki_sections`].
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

// PE format constants (Microsoft PE/COFF specification, "PE Format").
const DOS_MAGIC: &[u8; 2] = b"MZ";
const DOS_E_LFANEW: usize = 0x3c;
const PE_SIGNATURE: &[u8; 4] = b"PE\0\0";
const COFF_HEADER_SIZE: usize = 20;
const SECTION_HEADER_SIZE: usize = 40;
const MACHINE_AMD64: u16 = 0x8664;
const OPTIONAL_MAGIC_PE32: u16 = 0x10b;
const OPTIONAL_MAGIC_PE32_PLUS: u16 = 0x20b;
/// Size of the PE32+ optional header without data directories.
const OPTIONAL_FIXED_SIZE_PE32_PLUS: usize = 112;
const DATA_DIRECTORY_SECURITY: usize = 4;
const IMAGE_FILE_LOCAL_SYMS_STRIPPED: u16 = 0x0008;
const DLL_CHARACTERISTICS_NX_COMPAT: u16 = 0x0100;
const SCN_CNT_CODE: u32 = 0x0000_0020;
const SCN_CNT_INITIALIZED_DATA: u32 = 0x0000_0040;
const SCN_MEM_READ: u32 = 0x4000_0000;
const COFF_SYMBOL_SIZE: usize = 18;

// Offsets within the COFF file header.
const COFF_MACHINE: usize = 0;
const COFF_NUMBER_OF_SECTIONS: usize = 2;
const COFF_POINTER_TO_SYMBOL_TABLE: usize = 8;
const COFF_NUMBER_OF_SYMBOLS: usize = 12;
const COFF_SIZE_OF_OPTIONAL_HEADER: usize = 16;
const COFF_CHARACTERISTICS: usize = 18;

// Offsets within the optional header (the same for PE32 and PE32+ up to DllCharacteristics).
const OPT_MAGIC: usize = 0;
const OPT_SIZE_OF_INITIALIZED_DATA: usize = 8;
const OPT_SECTION_ALIGNMENT: usize = 32;
const OPT_FILE_ALIGNMENT: usize = 36;
const OPT_SIZE_OF_IMAGE: usize = 56;
const OPT_SIZE_OF_HEADERS: usize = 60;
const OPT_CHECKSUM: usize = 64;
const OPT_DLL_CHARACTERISTICS: usize = 70;
const OPT_NUMBER_OF_RVA_AND_SIZES: usize = 108;
const OPT_DATA_DIRECTORIES: usize = 112;

// Offsets within a section header.
const SEC_VIRTUAL_SIZE: usize = 8;
const SEC_VIRTUAL_ADDRESS: usize = 12;
const SEC_SIZE_OF_RAW_DATA: usize = 16;
const SEC_POINTER_TO_RAW_DATA: usize = 20;
const SEC_CHARACTERISTICS: usize = 36;

/// ukify's `merge_sbat()` header line and its default UKI generation line (`STUB_SBAT`).
const SBAT_HEADER: &str =
    "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n";
const UKIFY_STUB_SBAT: &str = "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
uki,1,UKI,uki,1,https://uapi-group.org/specifications/specs/unified_kernel_image/\n";

/// Assembles a UKI from systemd-stub (`linuxx64.efi.stub`) and the payload sections, with the
/// layout of `ukify build` of systemd 257 (see the module documentation).
///
/// The stub must be an unsigned PE32+ x86_64 image with room in its header area for the new
/// section headers. The result is deterministic.
pub fn assemble_uki(stub: &[u8], sections: &UkiSections) -> Result<Vec<u8>, UkiError> {
    if sections.linux.is_empty() {
        return Err(UkiError::MissingKernel);
    }
    let headers = Headers::parse(stub, Image::Stub)?;
    let mut image = stub.to_vec();
    let stub_sections = headers.section_headers(&image)?;

    strip_symbol_table(&mut image, &headers)?;
    check_stub_sections(&image, &headers, &stub_sections)?;

    let size_of_headers = round_up(u64::from(headers.size_of_headers), headers.file_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| {
            headers.malformed("SizeOfHeaders overflows when rounded to FileAlignment")
        })?;
    put_u32(
        &mut image,
        headers.opt + OPT_SIZE_OF_HEADERS,
        size_of_headers,
    )?;

    if let Some((offset, size)) = headers.certificate_table(&image)? {
        return Err(UkiError::StubSigned { offset, size });
    }

    let sbat = merge_sbat(stub, &stub_sections, &sections.linux)?;
    let payload: [(&'static str, &[u8]); 6] = [
        (".osrel", &sections.osrel),
        (".cmdline", &sections.cmdline),
        (".uname", &sections.uname),
        (".linux", &sections.linux),
        (".initrd", &sections.initrd),
        (".sbat", sbat.as_bytes()),
    ];

    let mut table = stub_sections.clone();
    for (name, data) in payload {
        if data.is_empty() {
            continue;
        }
        if name == ".linux" && !linux_is_nx_compat(data) {
            let dll = headers.opt + OPT_DLL_CHARACTERISTICS;
            let value = read_u16(&image, dll, Image::Stub, "DllCharacteristics")?;
            put_u16(&mut image, dll, value & !DLL_CHARACTERISTICS_NX_COMPAT)?;
        }
        // ukify swaps the data of a section the stub already has (in practice `.sbat`).
        if let Some(existing) = stub_sections.iter().find(|s| s.name_str() == name) {
            replace_section_data(&mut image, &headers, existing, name, data)?;
            continue;
        }
        let header = append_section(&mut image, &headers, size_of_headers, &table, name, data)?;
        table.push(header);
    }

    let last = table
        .last()
        .ok_or_else(|| headers.malformed("the section table is empty"))?;
    let end = u64::from(last.virtual_address) + u64::from(last.virtual_size);
    let size_of_image = round_up(end, headers.section_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| UkiError::TooLarge {
            section: "image".to_owned(),
            len: usize::try_from(end).unwrap_or(usize::MAX),
        })?;
    put_u32(&mut image, headers.opt + OPT_SIZE_OF_IMAGE, size_of_image)?;

    let checksum = checksum_with_field_zeroed(&image, headers.opt + OPT_CHECKSUM);
    put_u32(&mut image, headers.opt + OPT_CHECKSUM, checksum)?;
    tracing::debug!(
        sections = table.len(),
        size = image.len(),
        size_of_image,
        checksum,
        "assembled UKI"
    );
    Ok(image)
}

/// Lists the sections of a PE32+ x86_64 image (a UKI, the stub, or a kernel) in section-table
/// order, each with its name, RVA, virtual size, file offset, flags and data.
///
/// Fails, without panicking, on anything that is not a well-formed PE32+ x86_64 image or whose
/// sections' data lie outside the file.
pub fn read_uki_sections(uki: &[u8]) -> Result<Vec<UkiSection>, UkiError> {
    let headers = Headers::parse(uki, Image::Uki)?;
    headers
        .section_headers(uki)?
        .into_iter()
        .map(|s| {
            let len = s.size_of_raw_data.min(s.virtual_size) as usize;
            let start = s.pointer_to_raw_data as usize;
            // A section without file data (uninitialized data) may point anywhere.
            let data = if len == 0 {
                Vec::new()
            } else {
                slice(uki, start, len, Image::Uki, "section data")?.to_vec()
            };
            Ok(UkiSection {
                name: s.name_str(),
                virtual_address: s.virtual_address,
                virtual_size: s.virtual_size,
                file_offset: s.pointer_to_raw_data,
                characteristics: s.characteristics,
                data,
            })
        })
        .collect()
}

/// The PE image checksum of `image` (`CheckSumMappedFile`): the 16-bit one's-complement-style
/// sum of the file's little-endian words with the `CheckSum` field counted as zero, plus the
/// file length. Fails if `image` is not a PE32+ x86_64 image.
pub fn pe_checksum(image: &[u8]) -> Result<u32, UkiError> {
    let headers = Headers::parse(image, Image::Uki)?;
    Ok(checksum_with_field_zeroed(
        image,
        headers.opt + OPT_CHECKSUM,
    ))
}

/// Where the headers of a validated PE32+ x86_64 image are.
#[derive(Debug)]
struct Headers {
    image: Image,
    /// File offset of the COFF file header.
    coff: usize,
    /// File offset of the optional header.
    opt: usize,
    size_of_optional_header: usize,
    section_table: usize,
    number_of_sections: usize,
    file_alignment: u32,
    section_alignment: u32,
    size_of_headers: u32,
}

impl Headers {
    fn parse(data: &[u8], image: Image) -> Result<Self, UkiError> {
        if data.get(..2) != Some(DOS_MAGIC.as_slice()) {
            return Err(UkiError::NotPe {
                image,
                reason: "there is no MZ signature at offset 0".to_owned(),
            });
        }
        let pe = read_u32(data, DOS_E_LFANEW, image, "DOS header's e_lfanew")? as usize;
        if slice(data, pe, 4, image, "PE signature")? != PE_SIGNATURE {
            return Err(UkiError::NotPe {
                image,
                reason: format!("there is no PE\\0\\0 signature at offset {pe:#x} (e_lfanew)"),
            });
        }
        let coff = pe + 4;
        slice(data, coff, COFF_HEADER_SIZE, image, "COFF file header")?;
        let machine = read_u16(data, coff + COFF_MACHINE, image, "COFF machine")?;
        let number_of_sections = usize::from(read_u16(
            data,
            coff + COFF_NUMBER_OF_SECTIONS,
            image,
            "NumberOfSections",
        )?);
        let size_of_optional_header = usize::from(read_u16(
            data,
            coff + COFF_SIZE_OF_OPTIONAL_HEADER,
            image,
            "SizeOfOptionalHeader",
        )?);
        let opt = coff + COFF_HEADER_SIZE;
        let magic = read_u16(data, opt + OPT_MAGIC, image, "optional header magic")?;
        if magic != OPTIONAL_MAGIC_PE32_PLUS {
            return Err(UkiError::NotPe32Plus { image, magic });
        }
        if machine != MACHINE_AMD64 {
            return Err(UkiError::WrongMachine { image, machine });
        }
        if size_of_optional_header < OPTIONAL_FIXED_SIZE_PE32_PLUS {
            return Err(UkiError::Malformed {
                image,
                reason: format!(
                    "SizeOfOptionalHeader is {size_of_optional_header:#x}, smaller than the {OPTIONAL_FIXED_SIZE_PE32_PLUS:#x} bytes of a PE32+ optional header"
                ),
            });
        }
        slice(data, opt, size_of_optional_header, image, "optional header")?;
        let section_alignment =
            read_u32(data, opt + OPT_SECTION_ALIGNMENT, image, "SectionAlignment")?;
        let file_alignment = read_u32(data, opt + OPT_FILE_ALIGNMENT, image, "FileAlignment")?;
        let size_of_headers = read_u32(data, opt + OPT_SIZE_OF_HEADERS, image, "SizeOfHeaders")?;
        for (what, value) in [
            ("FileAlignment", file_alignment),
            ("SectionAlignment", section_alignment),
        ] {
            if !value.is_power_of_two() {
                return Err(UkiError::Malformed {
                    image,
                    reason: format!("{what} is {value:#x}, not a power of two"),
                });
            }
        }
        let section_table = opt + size_of_optional_header;
        slice(
            data,
            section_table,
            number_of_sections * SECTION_HEADER_SIZE,
            image,
            "section table",
        )?;
        Ok(Headers {
            image,
            coff,
            opt,
            size_of_optional_header,
            section_table,
            number_of_sections,
            file_alignment,
            section_alignment,
            size_of_headers,
        })
    }

    fn malformed(&self, reason: impl Into<String>) -> UkiError {
        UkiError::Malformed {
            image: self.image,
            reason: reason.into(),
        }
    }

    fn section_headers(&self, data: &[u8]) -> Result<Vec<SectionHeader>, UkiError> {
        (0..self.number_of_sections)
            .map(|i| {
                let offset = self.section_table + i * SECTION_HEADER_SIZE;
                let raw = slice(
                    data,
                    offset,
                    SECTION_HEADER_SIZE,
                    self.image,
                    "section header",
                )?;
                let mut name = [0u8; 8];
                name.copy_from_slice(&raw[..8]);
                let field = |at: usize| read_u32(raw, at, self.image, "section header");
                Ok(SectionHeader {
                    offset,
                    name,
                    virtual_size: field(SEC_VIRTUAL_SIZE)?,
                    virtual_address: field(SEC_VIRTUAL_ADDRESS)?,
                    size_of_raw_data: field(SEC_SIZE_OF_RAW_DATA)?,
                    pointer_to_raw_data: field(SEC_POINTER_TO_RAW_DATA)?,
                    characteristics: field(SEC_CHARACTERISTICS)?,
                })
            })
            .collect()
    }

    /// The certificate table (data directory 4) as (file offset, size), if the image has one.
    fn certificate_table(&self, data: &[u8]) -> Result<Option<(u32, u32)>, UkiError> {
        let count = read_u32(
            data,
            self.opt + OPT_NUMBER_OF_RVA_AND_SIZES,
            self.image,
            "NumberOfRvaAndSizes",
        )? as usize;
        let entry = OPT_DATA_DIRECTORIES + DATA_DIRECTORY_SECURITY * 8;
        if count <= DATA_DIRECTORY_SECURITY || entry + 8 > self.size_of_optional_header {
            return Ok(None);
        }
        let offset = read_u32(
            data,
            self.opt + entry,
            self.image,
            "certificate table entry",
        )?;
        let size = read_u32(
            data,
            self.opt + entry + 4,
            self.image,
            "certificate table entry",
        )?;
        // ukify tests the address only (`security.VirtualAddress != 0`).
        Ok((offset != 0).then_some((offset, size)))
    }
}

#[derive(Debug, Clone)]
struct SectionHeader {
    /// File offset of this header in the section table.
    offset: usize,
    name: [u8; 8],
    virtual_size: u32,
    virtual_address: u32,
    size_of_raw_data: u32,
    pointer_to_raw_data: u32,
    characteristics: u32,
}

impl SectionHeader {
    fn name_str(&self) -> String {
        let end = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.name.len());
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// Drops a COFF symbol table (+ string table) that ends the file, as ukify does for old stubs.
fn strip_symbol_table(image: &mut Vec<u8>, headers: &Headers) -> Result<(), UkiError> {
    let symbol_table = read_u32(
        image,
        headers.coff + COFF_POINTER_TO_SYMBOL_TABLE,
        Image::Stub,
        "PointerToSymbolTable",
    )? as usize;
    if symbol_table == 0 {
        return Ok(());
    }
    let symbols = read_u32(
        image,
        headers.coff + COFF_NUMBER_OF_SYMBOLS,
        Image::Stub,
        "NumberOfSymbols",
    )? as usize;
    let mut size = symbols.saturating_mul(COFF_SYMBOL_SIZE);
    let string_table = symbol_table.saturating_add(size);
    if let Ok(strings) = read_u32(image, string_table, Image::Stub, "string table size") {
        size = size.saturating_add(strings as usize);
    }
    if symbol_table.saturating_add(size) != image.len() {
        return Ok(());
    }
    tracing::debug!(
        symbol_table,
        size,
        "stripping the stub's trailing COFF symbol table"
    );
    image.truncate(symbol_table);
    put_u32(image, headers.coff + COFF_POINTER_TO_SYMBOL_TABLE, 0)?;
    put_u32(image, headers.coff + COFF_NUMBER_OF_SYMBOLS, 0)?;
    let characteristics_at = headers.coff + COFF_CHARACTERISTICS;
    let characteristics = read_u16(
        image,
        characteristics_at,
        Image::Stub,
        "COFF characteristics",
    )?;
    put_u16(
        image,
        characteristics_at,
        characteristics | IMAGE_FILE_LOCAL_SYMS_STRIPPED,
    )
}

/// Checks what ukify's layout relies on: aligned section data inside the file, after the
/// (rounded) header area, and a section table that ends within it.
fn check_stub_sections(
    image: &[u8],
    headers: &Headers,
    sections: &[SectionHeader],
) -> Result<(), UkiError> {
    let alignment = headers.file_alignment;
    let rounded_headers =
        round_up(u64::from(headers.size_of_headers), alignment).unwrap_or(u64::MAX);
    let table_end = headers.section_table + sections.len() * SECTION_HEADER_SIZE;
    if table_end as u64 > rounded_headers {
        return Err(headers.malformed(format!(
            "the section table ends at {table_end:#x}, past SizeOfHeaders {:#x}",
            headers.size_of_headers
        )));
    }
    for s in sections.iter().filter(|s| s.size_of_raw_data > 0) {
        if s.pointer_to_raw_data % alignment != 0 || s.size_of_raw_data % alignment != 0 {
            return Err(UkiError::UnalignedStubSection {
                section: s.name_str(),
                pointer: s.pointer_to_raw_data,
                size: s.size_of_raw_data,
                alignment,
            });
        }
        slice(
            image,
            s.pointer_to_raw_data as usize,
            s.size_of_raw_data as usize,
            Image::Stub,
            "section data",
        )?;
        if u64::from(s.pointer_to_raw_data) < rounded_headers {
            return Err(headers.malformed(format!(
                "section {} starts at file offset {:#x}, inside the header area ending at {rounded_headers:#x}",
                s.name_str(),
                s.pointer_to_raw_data
            )));
        }
    }
    Ok(())
}

/// Appends `data` as a new section after the last one, as ukify's `pe_add_sections()` does.
fn append_section(
    image: &mut Vec<u8>,
    headers: &Headers,
    size_of_headers: u32,
    table: &[SectionHeader],
    name: &'static str,
    data: &[u8],
) -> Result<SectionHeader, UkiError> {
    let too_large = || UkiError::TooLarge {
        section: name.to_owned(),
        len: data.len(),
    };
    let header_offset = headers.section_table + table.len() * SECTION_HEADER_SIZE;
    let header_end = header_offset + SECTION_HEADER_SIZE;
    if header_end > size_of_headers as usize {
        return Err(UkiError::NoRoomForSectionHeader {
            section: name,
            header_end,
            size_of_headers,
        });
    }
    let last = table
        .last()
        .ok_or_else(|| headers.malformed("the section table is empty"))?;
    let virtual_size = u32::try_from(data.len()).map_err(|_| too_large())?;
    let file_alignment = headers.file_alignment;
    let pointer_to_raw_data = round_up(image.len() as u64, file_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(too_large)?;
    let size_of_raw_data = round_up(data.len() as u64, file_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(too_large)?;
    let previous_end = u64::from(last.virtual_address) + u64::from(last.virtual_size);
    let virtual_address = round_up(previous_end, headers.section_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(too_large)?;
    // The image must stay addressable with 32-bit RVAs and file offsets.
    if u64::from(virtual_address) + u64::from(virtual_size) > u64::from(u32::MAX)
        || u64::from(pointer_to_raw_data) + u64::from(size_of_raw_data) > u64::from(u32::MAX)
    {
        return Err(too_large());
    }
    let characteristics = if name == ".linux" {
        SCN_CNT_CODE | SCN_MEM_READ
    } else {
        SCN_CNT_INITIALIZED_DATA | SCN_MEM_READ
    };

    let mut name_bytes = [0u8; 8];
    name_bytes[..name.len()].copy_from_slice(name.as_bytes());
    let mut raw_header = [0u8; SECTION_HEADER_SIZE];
    raw_header[..8].copy_from_slice(&name_bytes);
    raw_header[SEC_VIRTUAL_SIZE..SEC_VIRTUAL_SIZE + 4].copy_from_slice(&virtual_size.to_le_bytes());
    raw_header[SEC_VIRTUAL_ADDRESS..SEC_VIRTUAL_ADDRESS + 4]
        .copy_from_slice(&virtual_address.to_le_bytes());
    raw_header[SEC_SIZE_OF_RAW_DATA..SEC_SIZE_OF_RAW_DATA + 4]
        .copy_from_slice(&size_of_raw_data.to_le_bytes());
    raw_header[SEC_POINTER_TO_RAW_DATA..SEC_POINTER_TO_RAW_DATA + 4]
        .copy_from_slice(&pointer_to_raw_data.to_le_bytes());
    raw_header[SEC_CHARACTERISTICS..SEC_CHARACTERISTICS + 4]
        .copy_from_slice(&characteristics.to_le_bytes());
    image
        .get_mut(header_offset..header_end)
        .ok_or_else(|| headers.malformed("SizeOfHeaders exceeds the file"))?
        .copy_from_slice(&raw_header);

    image.resize(pointer_to_raw_data as usize, 0);
    image.extend_from_slice(data);
    image.resize(pointer_to_raw_data as usize + size_of_raw_data as usize, 0);

    let count_at = headers.coff + COFF_NUMBER_OF_SECTIONS;
    let count =
        u16::try_from(table.len() + 1).map_err(|_| headers.malformed("too many sections"))?;
    put_u16(image, count_at, count)?;
    let initialized_at = headers.opt + OPT_SIZE_OF_INITIALIZED_DATA;
    let initialized = read_u32(image, initialized_at, Image::Stub, "SizeOfInitializedData")?
        .checked_add(virtual_size)
        .ok_or_else(too_large)?;
    put_u32(image, initialized_at, initialized)?;

    tracing::debug!(
        section = name,
        virtual_address,
        virtual_size,
        pointer_to_raw_data,
        size_of_raw_data,
        "added UKI section"
    );
    Ok(SectionHeader {
        offset: header_offset,
        name: name_bytes,
        virtual_size,
        virtual_address,
        size_of_raw_data,
        pointer_to_raw_data,
        characteristics,
    })
}

/// Overwrites an existing stub section with `data` (zero-padded to its `SizeOfRawData`) and sets
/// its `VirtualSize`, as ukify does for `.sbat`.
fn replace_section_data(
    image: &mut [u8],
    headers: &Headers,
    existing: &SectionHeader,
    name: &'static str,
    data: &[u8],
) -> Result<(), UkiError> {
    if data.len() > existing.size_of_raw_data as usize {
        return Err(UkiError::NoRoomInStubSection {
            section: name,
            needed: data.len(),
            available: existing.size_of_raw_data,
        });
    }
    let start = existing.pointer_to_raw_data as usize;
    let target = image
        .get_mut(start..start + existing.size_of_raw_data as usize)
        .ok_or_else(|| headers.malformed(format!("section {name} lies outside the file")))?;
    target.fill(0);
    target[..data.len()].copy_from_slice(data);
    // data.len() <= size_of_raw_data, a u32.
    put_u32(image, existing.offset + SEC_VIRTUAL_SIZE, data.len() as u32)?;
    tracing::debug!(
        section = name,
        size = data.len(),
        "replaced stub section data"
    );
    Ok(())
}

/// ukify's `merge_sbat([stub, linux], [STUB_SBAT])`: the SBAT header line, then every entry of
/// the stub's and the kernel's `.sbat` sections and ukify's `uki` line, then `\n\0`.
fn merge_sbat(
    stub: &[u8],
    stub_sections: &[SectionHeader],
    linux: &[u8],
) -> Result<String, UkiError> {
    let mut entries: Vec<String> = Vec::new();
    let mut take = |text: &str| {
        let lines = python_splitlines(text);
        match lines.split_first() {
            Some((first, rest)) if first.starts_with("sbat,") => {
                entries.extend(rest.iter().map(|l| (*l).to_owned()));
            }
            _ => tracing::warn!("ignoring an SBAT section that does not start with an sbat, line"),
        }
    };
    for s in stub_sections.iter().filter(|s| s.name_str() == ".sbat") {
        let raw = slice(
            stub,
            s.pointer_to_raw_data as usize,
            s.size_of_raw_data as usize,
            Image::Stub,
            ".sbat data",
        )?;
        let text = std::str::from_utf8(trim_trailing_nuls(raw)).map_err(|source| {
            UkiError::InvalidSbat {
                image: Image::Stub,
                source,
            }
        })?;
        take(text);
    }
    // The kernel's SBAT, if the kernel is a PE that has one (Debian's 6.12 has none). A kernel
    // that is not a PE has none either; ukify skips it the same way.
    if let Ok(kernel) = Headers::parse_any_machine(linux) {
        for s in kernel.section_headers(linux).unwrap_or_default() {
            if s.name_str() != ".sbat" {
                continue;
            }
            let Ok(raw) = slice(
                linux,
                s.pointer_to_raw_data as usize,
                s.size_of_raw_data as usize,
                Image::Stub,
                ".sbat data",
            ) else {
                continue;
            };
            if let Ok(text) = std::str::from_utf8(trim_trailing_nuls(raw)) {
                take(text);
            }
        }
    }
    take(UKIFY_STUB_SBAT);
    Ok(format!("{SBAT_HEADER}{}\n\0", entries.join("\n")))
}

impl Headers {
    /// Parses just enough of any PE image (PE32 or PE32+, any machine) to walk its sections; used
    /// for the kernel inside `.linux`.
    fn parse_any_machine(data: &[u8]) -> Result<Headers, UkiError> {
        let image = Image::Stub;
        if data.get(..2) != Some(DOS_MAGIC.as_slice()) {
            return Err(UkiError::NotPe {
                image,
                reason: "no MZ".to_owned(),
            });
        }
        let pe = read_u32(data, DOS_E_LFANEW, image, "e_lfanew")? as usize;
        if slice(data, pe, 4, image, "PE signature")? != PE_SIGNATURE {
            return Err(UkiError::NotPe {
                image,
                reason: "no PE signature".to_owned(),
            });
        }
        let coff = pe + 4;
        let number_of_sections = usize::from(read_u16(
            data,
            coff + COFF_NUMBER_OF_SECTIONS,
            image,
            "sections",
        )?);
        let size_of_optional_header = usize::from(read_u16(
            data,
            coff + COFF_SIZE_OF_OPTIONAL_HEADER,
            image,
            "optional header size",
        )?);
        let opt = coff + COFF_HEADER_SIZE;
        let magic = read_u16(data, opt + OPT_MAGIC, image, "magic")?;
        if magic != OPTIONAL_MAGIC_PE32 && magic != OPTIONAL_MAGIC_PE32_PLUS {
            return Err(UkiError::NotPe32Plus { image, magic });
        }
        Ok(Headers {
            image,
            coff,
            opt,
            size_of_optional_header,
            section_table: opt + size_of_optional_header,
            number_of_sections,
            file_alignment: 1,
            section_alignment: 1,
            size_of_headers: 0,
        })
    }
}

/// Whether `.linux` may keep the UKI's `NX_COMPAT`: true unless it is a PE without the flag.
fn linux_is_nx_compat(linux: &[u8]) -> bool {
    let Ok(kernel) = Headers::parse_any_machine(linux) else {
        tracing::warn!(".linux is not a PE image; a UKI built from it will not boot");
        return true;
    };
    match read_u16(
        linux,
        kernel.opt + OPT_DLL_CHARACTERISTICS,
        Image::Stub,
        "DllCharacteristics",
    ) {
        Ok(flags) => flags & DLL_CHARACTERISTICS_NX_COMPAT != 0,
        Err(_) => true,
    }
}

/// Python's `str.splitlines()` (without keepends): splits at `\n`, `\r`, `\r\n`, `\v`, `\f`,
/// `\x1c`–`\x1e`, U+0085, U+2028 and U+2029; a final line break adds no empty line.
fn python_splitlines(text: &str) -> Vec<&str> {
    let is_break = |c: char| {
        matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        )
    };
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !is_break(c) {
            continue;
        }
        lines.push(&text[start..i]);
        let mut end = i + c.len_utf8();
        if c == '\r'
            && let Some(&(j, '\n')) = chars.peek()
        {
            chars.next();
            end = j + 1;
        }
        start = end;
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

fn trim_trailing_nuls(data: &[u8]) -> &[u8] {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &data[..end]
}

/// The PE checksum with the 4 bytes at `field` counted as zero.
fn checksum_with_field_zeroed(image: &[u8], field: usize) -> u32 {
    let byte = |i: usize| {
        if (field..field.saturating_add(4)).contains(&i) {
            0
        } else {
            image.get(i).copied().unwrap_or(0)
        }
    };
    let mut sum: u64 = 0;
    for i in (0..image.len()).step_by(2) {
        sum += u64::from(u16::from_le_bytes([byte(i), byte(i + 1)]));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum = (sum & 0xffff) + (sum >> 16);
    // The PE checksum is defined modulo 2^32 (file length included).
    (sum as u32).wrapping_add(image.len() as u32)
}

/// `x` rounded up to a multiple of `alignment` (a power of two, or 1), `None` on overflow.
fn round_up(x: u64, alignment: u32) -> Option<u64> {
    let alignment = u64::from(alignment.max(1));
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

fn slice<'a>(
    data: &'a [u8],
    offset: usize,
    len: usize,
    image: Image,
    what: &'static str,
) -> Result<&'a [u8], UkiError> {
    let end = offset.checked_add(len).ok_or(UkiError::Truncated {
        image,
        what,
        offset,
        end: usize::MAX,
        len: data.len(),
    })?;
    data.get(offset..end).ok_or(UkiError::Truncated {
        image,
        what,
        offset,
        end,
        len: data.len(),
    })
}

fn read_u16(data: &[u8], offset: usize, image: Image, what: &'static str) -> Result<u16, UkiError> {
    let b = slice(data, offset, 2, image, what)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

fn read_u32(data: &[u8], offset: usize, image: Image, what: &'static str) -> Result<u32, UkiError> {
    let b = slice(data, offset, 4, image, what)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn put_u16(data: &mut [u8], offset: usize, value: u16) -> Result<(), UkiError> {
    put(data, offset, &value.to_le_bytes())
}

fn put_u32(data: &mut [u8], offset: usize, value: u32) -> Result<(), UkiError> {
    put(data, offset, &value.to_le_bytes())
}

fn put(data: &mut [u8], offset: usize, bytes: &[u8]) -> Result<(), UkiError> {
    let len = data.len();
    data.get_mut(offset..offset + bytes.len())
        .ok_or(UkiError::Truncated {
            image: Image::Stub,
            what: "header field",
            offset,
            end: offset + bytes.len(),
            len,
        })?
        .copy_from_slice(bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitlines_matches_python() {
        // Expected values from Python 3: 'a\nb\r\nc\rd\x0be\n'.splitlines() etc.
        assert_eq!(
            python_splitlines("a\nb\r\nc\rd\x0be\n"),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(python_splitlines("a\n\nb"), ["a", "", "b"]);
        assert_eq!(python_splitlines(""), Vec::<&str>::new());
        assert_eq!(python_splitlines("\n"), [""]);
        assert_eq!(python_splitlines("x\u{2028}y"), ["x", "y"]);
    }

    #[test]
    fn round_up_aligns_and_detects_overflow() {
        assert_eq!(round_up(0, 0x200), Some(0));
        assert_eq!(round_up(1, 0x200), Some(0x200));
        assert_eq!(round_up(0x200, 0x200), Some(0x200));
        assert_eq!(round_up(0x16801, 0x1000), Some(0x17000));
        assert_eq!(round_up(u64::MAX, 0x1000), None);
    }

    #[test]
    fn checksum_of_words_folds_carries_and_adds_length() {
        // Two words 0xffff + 0x0002 = 0x10001 -> folded 0x0002; plus length 4.
        assert_eq!(
            checksum_with_field_zeroed(&[0xff, 0xff, 0x02, 0x00], 100),
            2 + 4
        );
        // The field is skipped: only 0x0001 counts, plus length 6.
        assert_eq!(
            checksum_with_field_zeroed(&[1, 0, 0xaa, 0xbb, 0xcc, 0xdd], 2),
            1 + 6
        );
        // An odd trailing byte counts as a low byte.
        assert_eq!(checksum_with_field_zeroed(&[0, 0, 0, 0, 0, 0, 7], 0), 7 + 7);
    }
}
