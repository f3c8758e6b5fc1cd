//! [`PeImage`]: a parsed PE image borrowing the file's bytes, its section table and the loaded
//! view of a section.

use std::fmt;

use crate::format::*;
use crate::{MAGIC_PE32, MAGIC_PE32_PLUS, MAX_SIZE_OF_IMAGE, PeError};

/// One entry of the section table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionHeader {
    /// The name with trailing NULs removed (lossy UTF-8; section names are ASCII in practice).
    pub name: String,
    /// File offset of this header in the section table (where a writer edits it).
    pub header_offset: usize,
    /// `VirtualSize`: the size of the section once loaded.
    pub virtual_size: u32,
    /// `VirtualAddress`: the section's RVA.
    pub virtual_address: u32,
    /// `SizeOfRawData`: the size of the section's data in the file.
    pub size_of_raw_data: u32,
    /// `PointerToRawData`: the file offset of the section's data.
    pub pointer_to_raw_data: u32,
    /// `Characteristics` (`IMAGE_SCN_*`).
    pub characteristics: u32,
}

/// A parsed PE image borrowing the file's bytes.
#[derive(Debug, Clone)]
pub struct PeImage<'a> {
    data: &'a [u8],
    label: String,
    /// Optional header magic: [`MAGIC_PE32`] or [`MAGIC_PE32_PLUS`].
    pub magic: u16,
    /// COFF `Machine`.
    pub machine: u16,
    /// COFF `Characteristics` (`IMAGE_FILE_*`).
    pub characteristics: u16,
    /// COFF `PointerToSymbolTable` (0: none).
    pub pointer_to_symbol_table: u32,
    /// COFF `NumberOfSymbols`.
    pub number_of_symbols: u32,
    /// File offset of the COFF file header (right after the `PE\0\0` signature).
    pub coff_header_offset: usize,
    /// File offset of the optional header (right after the COFF file header).
    pub optional_header_offset: usize,
    /// COFF `SizeOfOptionalHeader`.
    pub size_of_optional_header: usize,
    /// File offset of the section table (right after the optional header).
    pub section_table_offset: usize,
    /// Optional header `SizeOfInitializedData`.
    pub size_of_initialized_data: u32,
    /// Optional header `SectionAlignment` (not checked to be a power of two).
    pub section_alignment: u32,
    /// Optional header `FileAlignment` (not checked to be a power of two).
    pub file_alignment: u32,
    /// Optional header `Subsystem` (10 = EFI application).
    pub subsystem: u16,
    /// Optional header `DllCharacteristics` (`IMAGE_DLLCHARACTERISTICS_*`).
    pub dll_characteristics: u16,
    /// File offset of the optional header's `CheckSum` field.
    pub checksum_offset: usize,
    /// `NumberOfRvaAndSizes`.
    pub number_of_rva_and_sizes: u32,
    /// File offset of the certificate-table data directory entry, if the optional header has
    /// one (`NumberOfRvaAndSizes > 4`).
    pub security_directory_offset: Option<usize>,
    /// The certificate table's (file offset, size) from that entry; (0, 0) if absent.
    pub security_directory: (u32, u32),
    /// `SizeOfHeaders`.
    pub size_of_headers: u32,
    /// `SizeOfImage`: the size of the image once loaded.
    pub size_of_image: u32,
    /// The section table, in table order.
    pub sections: Vec<SectionHeader>,
}

impl<'a> PeImage<'a> {
    /// Parses `data`; `label` names the file in errors (e.g. `UKI out/hawser.efi`).
    ///
    /// Accepts PE32 and PE32+ of any machine. Checks that every header lies within the file,
    /// that `SizeOfHeaders` does and covers the section table, that `SizeOfImage` is at most
    /// [`MAX_SIZE_OF_IMAGE`], and that every section lies within `SizeOfImage` and its file
    /// data within the file.
    pub fn parse(data: &'a [u8], label: impl Into<String>) -> Result<Self, PeError> {
        let label = label.into();
        let r = Reader {
            data,
            label: &label,
        };
        if data.len() < 2 || &data[..2] != DOS_MAGIC {
            return Err(PeError::NotPe {
                image: label.clone(),
                reason: if data.is_empty() {
                    "the file is empty".to_owned()
                } else {
                    "there is no MZ signature at offset 0".to_owned()
                },
            });
        }
        let pe = r.u32(DOS_E_LFANEW, "the DOS header's e_lfanew field")? as usize;
        if r.bytes(pe, 4, "the PE signature")? != PE_SIGNATURE {
            return Err(PeError::NotPe {
                image: label.clone(),
                reason: format!("there is no PE\\0\\0 signature at offset {pe:#x} (e_lfanew)"),
            });
        }
        let coff = pe + 4;
        r.bytes(coff, COFF_HEADER_SIZE, "the COFF file header")?;
        let coff_u16 = |at: usize| r.u16(coff + at, "the COFF header");
        let coff_u32 = |at: usize| r.u32(coff + at, "the COFF header");
        let machine = coff_u16(COFF_MACHINE)?;
        let number_of_sections = usize::from(coff_u16(COFF_NUMBER_OF_SECTIONS)?);
        let pointer_to_symbol_table = coff_u32(COFF_POINTER_TO_SYMBOL_TABLE)?;
        let number_of_symbols = coff_u32(COFF_NUMBER_OF_SYMBOLS)?;
        let size_of_optional_header = usize::from(coff_u16(COFF_SIZE_OF_OPTIONAL_HEADER)?);
        let characteristics = coff_u16(COFF_CHARACTERISTICS)?;
        let opt = coff + COFF_HEADER_SIZE;
        r.bytes(opt, size_of_optional_header, "the optional header")?;
        let magic = r.u16(opt + OPT_MAGIC, "the optional header")?;
        let (rva_count_at, directories_at) = match magic {
            MAGIC_PE32 => (OPT_NUMBER_OF_RVA_AND_SIZES_PE32, OPT_DATA_DIRECTORIES_PE32),
            MAGIC_PE32_PLUS => (
                OPT_NUMBER_OF_RVA_AND_SIZES_PE32_PLUS,
                OPT_DATA_DIRECTORIES_PE32_PLUS,
            ),
            other => {
                return Err(PeError::NotPe {
                    image: label.clone(),
                    reason: format!(
                        "its optional header magic is {other:#06x}, neither PE32 (0x010b) nor PE32+ (0x020b)"
                    ),
                });
            }
        };
        if size_of_optional_header < directories_at {
            return Err(PeError::Malformed {
                image: label.clone(),
                reason: format!(
                    "SizeOfOptionalHeader is {size_of_optional_header:#x}, too small for the {directories_at:#x} fixed bytes of its optional header"
                ),
            });
        }
        let opt_u16 = |at: usize| r.u16(opt + at, "the optional header");
        let opt_u32 = |at: usize| r.u32(opt + at, "the optional header");
        let size_of_headers = opt_u32(OPT_SIZE_OF_HEADERS)?;
        let size_of_image = opt_u32(OPT_SIZE_OF_IMAGE)?;
        if size_of_image > MAX_SIZE_OF_IMAGE {
            return Err(PeError::Malformed {
                image: label.clone(),
                reason: format!(
                    "SizeOfImage is {size_of_image:#x}, more than the {MAX_SIZE_OF_IMAGE:#x} bytes any bootable image needs"
                ),
            });
        }
        let size_of_initialized_data = opt_u32(OPT_SIZE_OF_INITIALIZED_DATA)?;
        let section_alignment = opt_u32(OPT_SECTION_ALIGNMENT)?;
        let file_alignment = opt_u32(OPT_FILE_ALIGNMENT)?;
        let subsystem = opt_u16(OPT_SUBSYSTEM)?;
        let dll_characteristics = opt_u16(OPT_DLL_CHARACTERISTICS)?;
        let number_of_rva_and_sizes = opt_u32(rva_count_at)?;
        let directories_fit = (size_of_optional_header - directories_at) / DATA_DIRECTORY_SIZE;
        if (number_of_rva_and_sizes as usize) > directories_fit {
            return Err(PeError::Malformed {
                image: label.clone(),
                reason: format!(
                    "NumberOfRvaAndSizes is {number_of_rva_and_sizes} but SizeOfOptionalHeader {size_of_optional_header:#x} has room for {directories_fit} data directories"
                ),
            });
        }
        let (security_directory_offset, security_directory) =
            if number_of_rva_and_sizes as usize > DATA_DIRECTORY_SECURITY {
                let at = opt + directories_at + DATA_DIRECTORY_SECURITY * DATA_DIRECTORY_SIZE;
                let entry = (
                    r.u32(at, "the certificate table entry")?,
                    r.u32(at + 4, "the certificate table entry")?,
                );
                (Some(at), entry)
            } else {
                (None, (0, 0))
            };

        let table = opt + size_of_optional_header;
        let table_len = number_of_sections * SECTION_HEADER_SIZE;
        r.bytes(table, table_len, "the section table")?;
        if (size_of_headers as usize) < table + table_len {
            return Err(PeError::Malformed {
                image: label.clone(),
                reason: format!(
                    "SizeOfHeaders {size_of_headers:#x} ends before the section table does ({:#x})",
                    table + table_len
                ),
            });
        }
        r.bytes(0, size_of_headers as usize, "SizeOfHeaders")?;

        let mut sections = Vec::with_capacity(number_of_sections);
        for i in 0..number_of_sections {
            let at = table + i * SECTION_HEADER_SIZE;
            let raw = r.bytes(at, SECTION_HEADER_SIZE, "a section header")?;
            let end = raw[..SECTION_NAME_SIZE]
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(SECTION_NAME_SIZE);
            let name = String::from_utf8_lossy(&raw[..end]).into_owned();
            let field = |o: usize| u32::from_le_bytes([raw[o], raw[o + 1], raw[o + 2], raw[o + 3]]);
            let section = SectionHeader {
                name,
                header_offset: at,
                virtual_size: field(SEC_VIRTUAL_SIZE),
                virtual_address: field(SEC_VIRTUAL_ADDRESS),
                size_of_raw_data: field(SEC_SIZE_OF_RAW_DATA),
                pointer_to_raw_data: field(SEC_POINTER_TO_RAW_DATA),
                characteristics: field(SEC_CHARACTERISTICS),
            };
            // What a loader (EDK II's PeCoffLoaderLoadImage) enforces: the section lies within
            // the loaded image.
            let end = u64::from(section.virtual_address) + u64::from(section.virtual_size);
            if end > u64::from(size_of_image) {
                return Err(PeError::Malformed {
                    image: label.clone(),
                    reason: format!(
                        "section {:?} ends at RVA {end:#x}, beyond SizeOfImage {size_of_image:#x}",
                        section.name
                    ),
                });
            }
            if section.size_of_raw_data > 0 {
                r.bytes(
                    section.pointer_to_raw_data as usize,
                    section.size_of_raw_data as usize,
                    &format!("the data of section {:?}", section.name),
                )?;
            }
            sections.push(section);
        }
        Ok(PeImage {
            data,
            magic,
            machine,
            characteristics,
            pointer_to_symbol_table,
            number_of_symbols,
            coff_header_offset: coff,
            optional_header_offset: opt,
            size_of_optional_header,
            section_table_offset: table,
            size_of_initialized_data,
            section_alignment,
            file_alignment,
            subsystem,
            dll_characteristics,
            checksum_offset: opt + OPT_CHECKSUM,
            number_of_rva_and_sizes,
            security_directory_offset,
            security_directory,
            size_of_headers,
            size_of_image,
            sections,
            label,
        })
    }

    /// The whole file.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The name used for this image in errors.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The first section called `name`: systemd-stub's lookup (`pe_locate_sections()`: the
    /// first match wins).
    pub fn section(&self, name: &str) -> Option<&SectionHeader> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// A section's data as the loader copies it from the file: `min(SizeOfRawData,
    /// VirtualSize)` bytes. The loaded section continues with zeros up to `VirtualSize`.
    pub fn file_data(&self, section: &SectionHeader) -> &'a [u8] {
        let len = section.size_of_raw_data.min(section.virtual_size) as usize;
        self.file_bytes(section.pointer_to_raw_data, len)
    }

    /// A section's whole file space: `SizeOfRawData` bytes from `PointerToRawData`, padding
    /// included (what the Authenticode hash covers and what a writer may fill).
    pub fn raw_data(&self, section: &SectionHeader) -> &'a [u8] {
        self.file_bytes(
            section.pointer_to_raw_data,
            section.size_of_raw_data as usize,
        )
    }

    fn file_bytes(&self, pointer: u32, len: usize) -> &'a [u8] {
        let start = pointer as usize;
        // `parse` checked that pointer..pointer+SizeOfRawData is inside the file for every
        // section of this image, and callers ask for at most that; a zero-length section may
        // point anywhere.
        self.data.get(start..start + len).unwrap_or(&[])
    }

    /// A section as loaded: its file data followed by zeros up to `VirtualSize` bytes.
    pub fn loaded(&self, section: &SectionHeader) -> Loaded<'a> {
        let data = self.file_data(section);
        Loaded {
            data,
            zeros: (section.virtual_size as usize).saturating_sub(data.len()),
        }
    }

    /// A [`PeError::Malformed`] about this image, for a consumer's own checks.
    pub fn malformed(&self, reason: impl Into<String>) -> PeError {
        PeError::Malformed {
            image: self.label.clone(),
            reason: reason.into(),
        }
    }
}

/// The contents of a loaded section without copying it: file bytes, then `zeros` zero bytes.
#[derive(Debug, Clone, Copy)]
pub struct Loaded<'a> {
    /// The bytes from the file.
    pub data: &'a [u8],
    /// How many zero bytes follow them in memory.
    pub zeros: usize,
}

impl Loaded<'_> {
    /// Total length in memory (`VirtualSize`).
    pub fn len(&self) -> usize {
        self.data.len() + self.zeros
    }

    /// Whether the loaded section is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Feeds the loaded bytes to `update` (in a few chunks, without allocating the whole).
    pub fn feed(&self, mut update: impl FnMut(&[u8])) {
        update(self.data);
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = self.zeros;
        while left > 0 {
            let n = left.min(ZEROS.len());
            update(&ZEROS[..n]);
            left -= n;
        }
    }

    /// The loaded bytes, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        self.feed(|b| v.extend_from_slice(b));
        v
    }
}

struct Reader<'a> {
    data: &'a [u8],
    label: &'a str,
}

impl<'a> Reader<'a> {
    fn bytes(&self, offset: usize, len: usize, what: &str) -> Result<&'a [u8], PeError> {
        let end = offset.checked_add(len);
        end.and_then(|end| self.data.get(offset..end))
            .ok_or_else(|| PeError::Truncated {
                image: self.label.to_owned(),
                what: what.to_owned(),
                offset: offset as u64,
                end: end.map_or(u64::MAX, |e| e as u64),
                len: self.data.len(),
            })
    }

    fn u16(&self, offset: usize, what: &str) -> Result<u16, PeError> {
        let b = self.bytes(offset, 2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, offset: usize, what: &str) -> Result<u32, PeError> {
        let b = self.bytes(offset, 4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl fmt::Display for SectionHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (VirtualSize {:#x}, SizeOfRawData {:#x} at {:#x})",
            self.name, self.virtual_size, self.size_of_raw_data, self.pointer_to_raw_data
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAGIC_PE32_PLUS;
    use crate::test_support::{TINY_HEADERS, tiny_pe};

    #[test]
    fn parses_sections_and_directories() {
        let pe = tiny_pe(&[(".osrel", b"ID=x\n"), (".linux", &[7u8; 0x300])]);
        let image = PeImage::parse(&pe, "test image").expect("valid");
        assert_eq!(image.magic, MAGIC_PE32_PLUS);
        assert_eq!(image.subsystem, 10);
        assert_eq!(image.size_of_headers, TINY_HEADERS as u32);
        assert_eq!(image.number_of_rva_and_sizes, 16);
        assert_eq!(image.security_directory, (0, 0));
        let names: Vec<&str> = image.sections.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, [".osrel", ".linux"]);
        let osrel = image.section(".osrel").expect("present");
        assert_eq!(image.file_data(osrel), b"ID=x\n");
        assert_eq!(image.loaded(osrel).to_vec(), b"ID=x\n");
        assert!(image.section(".initrd").is_none());
    }

    #[test]
    fn header_offsets_and_fields_a_writer_needs() {
        let pe = tiny_pe(&[(".osrel", b"ID=x\n"), (".linux", &[7u8; 0x300])]);
        let image = PeImage::parse(&pe, "test image").expect("valid");
        assert_eq!(image.machine, crate::format::MACHINE_AMD64);
        assert_eq!(image.coff_header_offset, 0x84);
        assert_eq!(image.optional_header_offset, 0x84 + 20);
        assert_eq!(image.size_of_optional_header, 112 + 16 * 8);
        assert_eq!(image.section_table_offset, 0x84 + 20 + 112 + 16 * 8);
        assert_eq!(image.checksum_offset, image.optional_header_offset + 64);
        assert_eq!(
            image.security_directory_offset,
            Some(image.optional_header_offset + 112 + 4 * 8)
        );
        assert_eq!(
            (image.file_alignment, image.section_alignment),
            (0x200, 0x1000)
        );
        let offsets: Vec<usize> = image.sections.iter().map(|s| s.header_offset).collect();
        assert_eq!(
            offsets,
            [image.section_table_offset, image.section_table_offset + 40]
        );
        // The whole file space of a section, padding included, versus what the loader copies.
        let linux = image.section(".linux").expect("present");
        assert_eq!(image.raw_data(linux).len(), 0x400);
        assert_eq!(image.file_data(linux), &[7u8; 0x300][..]);
    }

    #[test]
    fn loaded_section_is_zero_filled_to_virtual_size() {
        let mut pe = tiny_pe(&[(".data", b"abc")]);
        let image = PeImage::parse(&pe, "t").expect("valid");
        let header_at = image.checksum_offset - 64 + 112 + 16 * 8;
        // VirtualSize 8 > data 3 bytes (SizeOfRawData is 0x200, the file has zeros after "abc",
        // so make the raw size 3 to see the loader's zero fill rather than file padding).
        pe[header_at + 8..header_at + 12].copy_from_slice(&8u32.to_le_bytes()); // within SizeOfImage
        pe[header_at + 16..header_at + 20].copy_from_slice(&3u32.to_le_bytes());
        let image = PeImage::parse(&pe, "t").expect("valid");
        let s = image.section(".data").expect("present");
        assert_eq!(image.file_data(s), b"abc");
        let loaded = image.loaded(s);
        assert_eq!(loaded.len(), 8);
        assert_eq!(loaded.to_vec(), b"abc\0\0\0\0\0");
    }

    #[test]
    fn rejects_what_is_not_a_pe() {
        let err = PeImage::parse(b"", "UKI x.efi").unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = PeImage::parse(b"\x7fELF\x02\x01\x01", "UKI x.efi").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the UKI x.efi is not a PE image: there is no MZ signature"),
            "{err}"
        );
        let mut pe = tiny_pe(&[]);
        pe[0x80] = b'X';
        let err = PeImage::parse(&pe, "UKI").unwrap_err();
        assert!(
            err.to_string()
                .contains("no PE\\0\\0 signature at offset 0x80"),
            "{err}"
        );
        let mut pe = tiny_pe(&[]);
        pe[0x98..0x9a].copy_from_slice(&0x107u16.to_le_bytes());
        let err = PeImage::parse(&pe, "UKI").unwrap_err();
        assert!(err.to_string().contains("magic is 0x0107"), "{err}");
    }

    #[test]
    fn truncation_anywhere_is_an_error_naming_the_structure() {
        let pe = tiny_pe(&[(".linux", &[1u8; 0x400])]);
        // Every prefix of the file either parses (no: the section data ends at the file end)
        // or fails cleanly; none panics.
        for len in 0..pe.len() {
            assert!(
                PeImage::parse(&pe[..len], "UKI").is_err(),
                "a {len}-byte prefix parsed"
            );
        }
        let err = PeImage::parse(&pe[..pe.len() - 1], "UKI").unwrap_err();
        assert!(
            matches!(&err, PeError::Truncated { what, .. } if what.contains(".linux")),
            "{err}"
        );
        assert!(err.to_string().starts_with("the UKI is truncated"), "{err}");
        let err = PeImage::parse(&pe[..0x60], "UKI").unwrap_err();
        assert!(err.to_string().contains("PE signature"), "{err}");
    }

    #[test]
    fn bogus_offsets_do_not_overflow() {
        let mut pe = tiny_pe(&[(".linux", b"k")]);
        pe[0x3c..0x40].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            PeImage::parse(&pe, "UKI"),
            Err(PeError::Truncated { .. })
        ));
        let mut pe = tiny_pe(&[(".linux", b"k")]);
        let table = 0x84 + 20 + 112 + 128;
        pe[table + 20..table + 24].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = PeImage::parse(&pe, "UKI").unwrap_err();
        assert!(err.to_string().contains("section \".linux\""), "{err}");
    }

    #[test]
    fn sections_beyond_size_of_image_and_huge_images_are_refused() {
        let mut pe = tiny_pe(&[(".linux", b"k")]);
        let opt = 0x84 + 20;
        let table = opt + 112 + 128;
        pe[table + 8..table + 12].copy_from_slice(&0x10_0000u32.to_le_bytes());
        let err = PeImage::parse(&pe, "UKI").unwrap_err();
        assert!(err.to_string().contains("beyond SizeOfImage"), "{err}");
        let mut pe = tiny_pe(&[(".linux", b"k")]);
        pe[opt + 56..opt + 60].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = PeImage::parse(&pe, "UKI").unwrap_err();
        assert!(
            err.to_string().contains("SizeOfImage is 0xffffffff"),
            "{err}"
        );
    }
}
