//! The writing half of the UKI module: systemd-stub edited into a UKI as ukify 257's
//! `pe_add_sections()` edits it (rules 1–7 of the module documentation).

use hawser_pe::format::{
    COFF_CHARACTERISTICS, COFF_NUMBER_OF_SECTIONS, COFF_NUMBER_OF_SYMBOLS,
    COFF_POINTER_TO_SYMBOL_TABLE, COFF_SYMBOL_SIZE, DLL_CHARACTERISTICS_NX_COMPAT,
    IMAGE_FILE_LOCAL_SYMS_STRIPPED, OPT_DLL_CHARACTERISTICS, OPT_SIZE_OF_HEADERS,
    OPT_SIZE_OF_IMAGE, OPT_SIZE_OF_INITIALIZED_DATA, SCN_CNT_CODE, SCN_CNT_INITIALIZED_DATA,
    SCN_MEM_READ, SEC_CHARACTERISTICS, SEC_POINTER_TO_RAW_DATA, SEC_SIZE_OF_RAW_DATA,
    SEC_VIRTUAL_ADDRESS, SEC_VIRTUAL_SIZE, SECTION_HEADER_SIZE, SECTION_NAME_SIZE,
};
use hawser_pe::{PeImage, SectionHeader};

use super::checksum::checksum_with_field_zeroed;
use super::sbat::merge_sbat;
use super::{Image, UkiError, UkiSections, parse_pe32_plus_x64};

/// Assembles a UKI from systemd-stub (`linuxx64.efi.stub`) and the payload sections, with the
/// layout of `ukify build` of systemd 257 (see the module documentation).
///
/// The stub must be an unsigned PE32+ x86_64 image with room in its header area for the new
/// section headers. The result is deterministic, and it reads back with
/// [`super::read_uki_sections`] (checked before it is returned).
pub fn assemble_uki(stub: &[u8], sections: &UkiSections) -> Result<Vec<u8>, UkiError> {
    if sections.linux.is_empty() {
        return Err(UkiError::MissingKernel);
    }
    let headers = parse_pe32_plus_x64(stub, Image::Stub)?;
    let opt = headers.optional_header_offset;
    let mut image = stub.to_vec();
    let stub_sections = &headers.sections;

    strip_symbol_table(&mut image, &headers)?;
    check_stub_sections(&headers, image.len())?;

    let size_of_headers = round_up(u64::from(headers.size_of_headers), headers.file_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| malformed("SizeOfHeaders overflows when rounded to FileAlignment"))?;
    put_u32(&mut image, opt + OPT_SIZE_OF_HEADERS, size_of_headers)?;

    // ukify tests the address only (`security.VirtualAddress != 0`).
    if headers.security_directory_offset.is_some() && headers.security_directory.0 != 0 {
        let (offset, size) = headers.security_directory;
        return Err(UkiError::StubSigned { offset, size });
    }

    let sbat = merge_sbat(&headers, &sections.linux)?;
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
            let dll = opt + OPT_DLL_CHARACTERISTICS;
            let value = read_u16(&image, dll, "DllCharacteristics")?;
            put_u16(&mut image, dll, value & !DLL_CHARACTERISTICS_NX_COMPAT)?;
        }
        // ukify swaps the data of a section the stub already has (in practice `.sbat`).
        if let Some(existing) = stub_sections.iter().find(|s| s.name == name) {
            replace_section_data(&mut image, existing, name, data)?;
            continue;
        }
        let header = append_section(&mut image, &headers, size_of_headers, &table, name, data)?;
        table.push(header);
    }

    let last = table
        .last()
        .ok_or_else(|| malformed("the section table is empty"))?;
    let end = u64::from(last.virtual_address) + u64::from(last.virtual_size);
    let size_of_image = round_up(end, headers.section_alignment)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| UkiError::TooLarge {
            section: "image".to_owned(),
            len: usize::try_from(end).unwrap_or(usize::MAX),
        })?;
    put_u32(&mut image, opt + OPT_SIZE_OF_IMAGE, size_of_image)?;

    let checksum = checksum_with_field_zeroed(&image, headers.checksum_offset);
    put_u32(&mut image, headers.checksum_offset, checksum)?;
    // What is handed out must read back (the predictor reads it with the same reader): this
    // refuses, say, a stub whose sections are not in address order, where a stub section could
    // end beyond the new SizeOfImage.
    parse_pe32_plus_x64(&image, Image::Uki)?;
    tracing::debug!(
        sections = table.len(),
        size = image.len(),
        size_of_image,
        checksum,
        "assembled UKI"
    );
    Ok(image)
}

fn malformed(reason: impl Into<String>) -> UkiError {
    UkiError::Malformed {
        image: Image::Stub,
        reason: reason.into(),
    }
}

/// Drops a COFF symbol table (+ string table) that ends the file, as ukify does for old stubs.
fn strip_symbol_table(image: &mut Vec<u8>, headers: &PeImage<'_>) -> Result<(), UkiError> {
    let symbol_table = headers.pointer_to_symbol_table as usize;
    if symbol_table == 0 {
        return Ok(());
    }
    let mut size = (headers.number_of_symbols as usize).saturating_mul(COFF_SYMBOL_SIZE);
    let string_table = symbol_table.saturating_add(size);
    if let Ok(strings) = read_u32(image, string_table, "string table size") {
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
    let coff = headers.coff_header_offset;
    put_u32(image, coff + COFF_POINTER_TO_SYMBOL_TABLE, 0)?;
    put_u32(image, coff + COFF_NUMBER_OF_SYMBOLS, 0)?;
    let characteristics_at = coff + COFF_CHARACTERISTICS;
    let characteristics = read_u16(image, characteristics_at, "COFF characteristics")?;
    put_u16(
        image,
        characteristics_at,
        characteristics | IMAGE_FILE_LOCAL_SYMS_STRIPPED,
    )
}

/// Checks what ukify's layout relies on beyond what the reader checked (a section table that
/// ends within `SizeOfHeaders`): aligned section data, after the (rounded) header area and
/// inside the `file_len` bytes left after [`strip_symbol_table`].
fn check_stub_sections(headers: &PeImage<'_>, file_len: usize) -> Result<(), UkiError> {
    let alignment = headers.file_alignment;
    let rounded_headers =
        round_up(u64::from(headers.size_of_headers), alignment).unwrap_or(u64::MAX);
    for s in headers.sections.iter().filter(|s| s.size_of_raw_data > 0) {
        if s.pointer_to_raw_data % alignment != 0 || s.size_of_raw_data % alignment != 0 {
            return Err(UkiError::UnalignedStubSection {
                section: s.name.clone(),
                pointer: s.pointer_to_raw_data,
                size: s.size_of_raw_data,
                alignment,
            });
        }
        let end = s.pointer_to_raw_data as usize + s.size_of_raw_data as usize;
        if end > file_len {
            return Err(UkiError::Truncated {
                image: Image::Stub,
                what: "section data",
                offset: s.pointer_to_raw_data as usize,
                end,
                len: file_len,
            });
        }
        if u64::from(s.pointer_to_raw_data) < rounded_headers {
            return Err(malformed(format!(
                "section {} starts at file offset {:#x}, inside the header area ending at {rounded_headers:#x}",
                s.name, s.pointer_to_raw_data
            )));
        }
    }
    Ok(())
}

/// Appends `data` as a new section after the last one, as ukify's `pe_add_sections()` does.
fn append_section(
    image: &mut Vec<u8>,
    headers: &PeImage<'_>,
    size_of_headers: u32,
    table: &[SectionHeader],
    name: &'static str,
    data: &[u8],
) -> Result<SectionHeader, UkiError> {
    let too_large = || UkiError::TooLarge {
        section: name.to_owned(),
        len: data.len(),
    };
    let header_offset = headers.section_table_offset + table.len() * SECTION_HEADER_SIZE;
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
        .ok_or_else(|| malformed("the section table is empty"))?;
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

    let mut raw_header = [0u8; SECTION_HEADER_SIZE];
    raw_header[..name.len().min(SECTION_NAME_SIZE)]
        .copy_from_slice(&name.as_bytes()[..name.len().min(SECTION_NAME_SIZE)]);
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
        .ok_or_else(|| malformed("SizeOfHeaders exceeds the file"))?
        .copy_from_slice(&raw_header);

    image.resize(pointer_to_raw_data as usize, 0);
    image.extend_from_slice(data);
    image.resize(pointer_to_raw_data as usize + size_of_raw_data as usize, 0);

    let count_at = headers.coff_header_offset + COFF_NUMBER_OF_SECTIONS;
    let count = u16::try_from(table.len() + 1).map_err(|_| malformed("too many sections"))?;
    put_u16(image, count_at, count)?;
    let initialized_at = headers.optional_header_offset + OPT_SIZE_OF_INITIALIZED_DATA;
    let initialized = read_u32(image, initialized_at, "SizeOfInitializedData")?
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
        name: name.to_owned(),
        header_offset,
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
        .ok_or_else(|| malformed(format!("section {name} lies outside the file")))?;
    target.fill(0);
    target[..data.len()].copy_from_slice(data);
    // data.len() <= size_of_raw_data, a u32.
    put_u32(
        image,
        existing.header_offset + SEC_VIRTUAL_SIZE,
        data.len() as u32,
    )?;
    tracing::debug!(
        section = name,
        size = data.len(),
        "replaced stub section data"
    );
    Ok(())
}

/// Whether `.linux` may keep the UKI's `NX_COMPAT`: true unless it is a PE without the flag.
fn linux_is_nx_compat(linux: &[u8]) -> bool {
    match PeImage::parse(linux, "kernel") {
        Ok(kernel) => kernel.dll_characteristics & DLL_CHARACTERISTICS_NX_COMPAT != 0,
        Err(_) => {
            tracing::warn!(".linux is not a PE image; a UKI built from it will not boot");
            true
        }
    }
}

/// `x` rounded up to a multiple of `alignment` (a power of two, or 1), `None` on overflow.
fn round_up(x: u64, alignment: u32) -> Option<u64> {
    let alignment = u64::from(alignment.max(1));
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

/// The `what` field of the image being edited, or [`UkiError::Truncated`].
fn field<'d>(
    data: &'d [u8],
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'d [u8], UkiError> {
    let truncated = |end| UkiError::Truncated {
        image: Image::Stub,
        what,
        offset,
        end,
        len: data.len(),
    };
    let end = offset
        .checked_add(len)
        .ok_or_else(|| truncated(usize::MAX))?;
    data.get(offset..end).ok_or_else(|| truncated(end))
}

fn read_u16(data: &[u8], offset: usize, what: &'static str) -> Result<u16, UkiError> {
    let b = field(data, offset, 2, what)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

fn read_u32(data: &[u8], offset: usize, what: &'static str) -> Result<u32, UkiError> {
    let b = field(data, offset, 4, what)?;
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
    fn round_up_aligns_and_detects_overflow() {
        assert_eq!(round_up(0, 0x200), Some(0));
        assert_eq!(round_up(1, 0x200), Some(0x200));
        assert_eq!(round_up(0x200, 0x200), Some(0x200));
        assert_eq!(round_up(0x16801, 0x1000), Some(0x17000));
        assert_eq!(round_up(u64::MAX, 0x1000), None);
    }
}
