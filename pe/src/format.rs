//! Offsets, sizes and flag values of the PE/COFF format, for readers and writers alike
//! (Microsoft "PE Format"). Offsets are relative to the structure named by their prefix:
//! `COFF_*` to the COFF file header, `OPT_*` to the optional header, `SEC_*` to a section
//! header.

/// The DOS header's magic at offset 0.
pub const DOS_MAGIC: &[u8; 2] = b"MZ";
/// Offset of `e_lfanew`, the file offset of the PE signature.
pub const DOS_E_LFANEW: usize = 0x3c;
/// The PE signature at `e_lfanew`; the COFF file header follows it.
pub const PE_SIGNATURE: &[u8; 4] = b"PE\0\0";

/// Size of the COFF file header; the optional header follows it.
pub const COFF_HEADER_SIZE: usize = 20;
pub const COFF_MACHINE: usize = 0;
pub const COFF_NUMBER_OF_SECTIONS: usize = 2;
pub const COFF_POINTER_TO_SYMBOL_TABLE: usize = 8;
pub const COFF_NUMBER_OF_SYMBOLS: usize = 12;
pub const COFF_SIZE_OF_OPTIONAL_HEADER: usize = 16;
pub const COFF_CHARACTERISTICS: usize = 18;
/// Size of one COFF symbol table record.
pub const COFF_SYMBOL_SIZE: usize = 18;

/// COFF `Machine` of x86_64 images.
pub const MACHINE_AMD64: u16 = 0x8664;
/// COFF `Characteristics`: COFF symbol table entries for local symbols have been removed.
pub const IMAGE_FILE_LOCAL_SYMS_STRIPPED: u16 = 0x0008;

/// Optional header magic of a PE32 image.
pub const OPTIONAL_MAGIC_PE32: u16 = 0x10b;
/// Optional header magic of a PE32+ image.
pub const OPTIONAL_MAGIC_PE32_PLUS: u16 = 0x20b;

// Optional header fields at the same offset in PE32 and PE32+.
pub const OPT_MAGIC: usize = 0;
pub const OPT_SIZE_OF_INITIALIZED_DATA: usize = 8;
pub const OPT_SECTION_ALIGNMENT: usize = 32;
pub const OPT_FILE_ALIGNMENT: usize = 36;
pub const OPT_SIZE_OF_IMAGE: usize = 56;
pub const OPT_SIZE_OF_HEADERS: usize = 60;
pub const OPT_CHECKSUM: usize = 64;
pub const OPT_SUBSYSTEM: usize = 68;
pub const OPT_DLL_CHARACTERISTICS: usize = 70;
/// `NumberOfRvaAndSizes` of a PE32 optional header.
pub const OPT_NUMBER_OF_RVA_AND_SIZES_PE32: usize = 92;
/// The data directories of a PE32 optional header (its fixed part's size).
pub const OPT_DATA_DIRECTORIES_PE32: usize = 96;
/// `NumberOfRvaAndSizes` of a PE32+ optional header.
pub const OPT_NUMBER_OF_RVA_AND_SIZES_PE32_PLUS: usize = 108;
/// The data directories of a PE32+ optional header (its fixed part's size).
pub const OPT_DATA_DIRECTORIES_PE32_PLUS: usize = 112;
/// Size of one data directory entry (address, size).
pub const DATA_DIRECTORY_SIZE: usize = 8;
/// Index of the certificate table ("security directory") among the data directories.
pub const DATA_DIRECTORY_SECURITY: usize = 4;

/// `DllCharacteristics`: the image is compatible with data execution prevention.
pub const DLL_CHARACTERISTICS_NX_COMPAT: u16 = 0x0100;

/// Size of a section header.
pub const SECTION_HEADER_SIZE: usize = 40;
/// Length of the (NUL-padded) section name at the start of a section header.
pub const SECTION_NAME_SIZE: usize = 8;
pub const SEC_VIRTUAL_SIZE: usize = 8;
pub const SEC_VIRTUAL_ADDRESS: usize = 12;
pub const SEC_SIZE_OF_RAW_DATA: usize = 16;
pub const SEC_POINTER_TO_RAW_DATA: usize = 20;
pub const SEC_CHARACTERISTICS: usize = 36;

/// Section `Characteristics`: the section contains executable code.
pub const SCN_CNT_CODE: u32 = 0x0000_0020;
/// Section `Characteristics`: the section contains initialized data.
pub const SCN_CNT_INITIALIZED_DATA: u32 = 0x0000_0040;
/// Section `Characteristics`: the section can be read.
pub const SCN_MEM_READ: u32 = 0x4000_0000;
