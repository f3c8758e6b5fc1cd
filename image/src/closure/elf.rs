//! The little the closure reads from an ELF file: its machine, `PT_INTERP`, and the `DT_NEEDED`
//! and `DT_SONAME` strings of its dynamic section.

use object::elf::{DT_NEEDED, DT_SONAME, EM_X86_64, PT_INTERP};
use object::read::elf::{Dyn, FileHeader, ProgramHeader};

/// What is wrong with an ELF file the closure reads.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The ELF structures could not be read (not a 64-bit ELF file, or truncated).
    #[error("its ELF structures cannot be read")]
    Object(#[from] object::read::Error),
    /// An ELF file for another machine.
    #[error("machine {machine} is not x86-64")]
    NotX86_64 { machine: u16 },
    /// A string the loader uses is not UTF-8.
    #[error("{what} is not UTF-8")]
    NotUtf8 { what: &'static str },
}

/// The parts of an ELF object the loader reads.
pub(super) struct ElfDeps {
    pub interpreter: Option<String>,
    pub needed: Vec<String>,
    pub soname: Option<String>,
}

/// `e_machine` of a little-endian ELF64 file.
pub(super) fn elf_machine(data: &[u8]) -> Result<u16, ElfError> {
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data)?;
    let endian = header.endian()?;
    Ok(header.e_machine(endian))
}

/// Interpreter, needed sonames and own soname of an x86-64 ELF file's bytes.
pub(super) fn parse_elf(data: &[u8]) -> Result<ElfDeps, ElfError> {
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data)?;
    let endian = header.endian()?;
    if header.e_machine(endian) != EM_X86_64 {
        return Err(ElfError::NotX86_64 {
            machine: header.e_machine(endian),
        });
    }
    let mut interpreter = None;
    for segment in header.program_headers(endian, data)? {
        if segment.p_type(endian) == PT_INTERP {
            let bytes = segment.interpreter(endian, data)?.unwrap_or_default();
            interpreter = Some(
                std::str::from_utf8(bytes)
                    .map_err(|_| ElfError::NotUtf8 { what: "PT_INTERP" })?
                    .to_owned(),
            );
        }
    }
    let sections = header.sections(endian, data)?;
    let mut needed = Vec::new();
    let mut soname = None;
    if let Some((entries, strtab_index)) = sections.dynamic(endian, data)? {
        let strings = sections.strings(endian, data, strtab_index)?;
        for entry in entries {
            let tag = entry.tag32(endian);
            if tag != Some(DT_NEEDED) && tag != Some(DT_SONAME) {
                continue;
            }
            let value = entry.string(endian, strings)?;
            let value = std::str::from_utf8(value)
                .map_err(|_| ElfError::NotUtf8 {
                    what: "a dynamic string",
                })?
                .to_owned();
            if tag == Some(DT_NEEDED) {
                needed.push(value);
            } else {
                soname = Some(value);
            }
        }
    }
    Ok(ElfDeps {
        interpreter,
        needed,
        soname,
    })
}
