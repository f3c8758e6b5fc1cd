//! The bounds-checked reader every TPM structure is parsed with, and the error it reports:
//! structure, field and absolute byte offset of whatever was wrong.

use thiserror::Error;

/// A malformed TPM structure, located precisely enough to look at with a hex dump.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The input ended inside a field.
    #[error(
        "{structure}: field {field} at offset {offset} needs {needed} bytes but only {available} remain"
    )]
    Truncated {
        structure: &'static str,
        field: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },
    /// A field holds a value this structure (or this parser) does not allow.
    #[error("{structure}: field {field} at offset {offset} is {actual:#x}, expected {expected}")]
    Unexpected {
        structure: &'static str,
        field: &'static str,
        offset: usize,
        expected: &'static str,
        actual: u64,
    },
    /// A size prefix is larger than the TPM's maximum for that buffer type.
    #[error(
        "{structure}: field {field} at offset {offset} declares {size} bytes, more than the maximum {max}"
    )]
    TooLarge {
        structure: &'static str,
        field: &'static str,
        offset: usize,
        size: usize,
        max: usize,
    },
    /// Bytes follow the end of the structure (or of a sized inner structure).
    #[error(
        "{structure}: {count} unexpected bytes after the end of the structure at offset {offset}"
    )]
    TrailingBytes {
        structure: &'static str,
        offset: usize,
        count: usize,
    },
}

/// A bounds-checked big-endian reader over a byte slice that knows which structure it reads and
/// where in the outermost buffer it is, so errors carry absolute offsets.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the outermost input.
    base: usize,
    structure: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over the whole of `buf`, reporting errors against `structure`.
    pub fn new(buf: &'a [u8], structure: &'static str) -> Self {
        Self {
            buf,
            pos: 0,
            base: 0,
            structure,
        }
    }

    /// The absolute offset of the next byte to be read.
    pub fn offset(&self) -> usize {
        self.base + self.pos
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Reads `n` raw bytes.
    pub fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ParseError> {
        let available = self.remaining();
        if n > available {
            return Err(ParseError::Truncated {
                structure: self.structure,
                field,
                offset: self.offset(),
                needed: n,
                available,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], ParseError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N, field)?);
        Ok(out)
    }

    /// Reads a `u8`.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, ParseError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// Reads a big-endian `u16`.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, ParseError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    /// Reads a big-endian `u32`.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, ParseError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    /// Reads a big-endian `u64`.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, ParseError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// Reads a `u16` and checks it against one allowed value.
    pub fn expect_u16(
        &mut self,
        field: &'static str,
        value: u16,
        expected: &'static str,
    ) -> Result<(), ParseError> {
        let offset = self.offset();
        let actual = self.u16(field)?;
        if actual == value {
            Ok(())
        } else {
            Err(self.unexpected(field, offset, expected, actual.into()))
        }
    }

    /// Reads a `TPM2B_*`: a `u16` size, at most `max`, then that many bytes.
    pub fn tpm2b(&mut self, field: &'static str, max: usize) -> Result<&'a [u8], ParseError> {
        let offset = self.offset();
        let size = usize::from(self.u16(field)?);
        if size > max {
            return Err(ParseError::TooLarge {
                structure: self.structure,
                field,
                offset,
                size,
                max,
            });
        }
        self.bytes(size, field)
    }

    /// A reader over the next `n` bytes (a sized inner structure), advancing past them.
    pub(super) fn sub(&mut self, n: usize, field: &'static str) -> Result<Reader<'a>, ParseError> {
        let base = self.offset();
        let buf = self.bytes(n, field)?;
        Ok(Reader {
            buf,
            pos: 0,
            base,
            structure: self.structure,
        })
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), ParseError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(ParseError::TrailingBytes {
                structure: self.structure,
                offset: self.offset(),
                count,
            }),
        }
    }

    /// The error for a field whose value is not the one expected.
    pub fn unexpected(
        &self,
        field: &'static str,
        offset: usize,
        expected: &'static str,
        actual: u64,
    ) -> ParseError {
        ParseError::Unexpected {
            structure: self.structure,
            field,
            offset,
            expected,
            actual,
        }
    }
}
