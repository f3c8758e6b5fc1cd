//! systemd-stub 257's reading of a `.dtbauto` blob: `devicetree_match_by_compatible()` and
//! `devicetree_get_compatible()` (`src/boot/devicetree.c`), word by word.
//!
//! Hand-written rather than the `fdt` crate because the stub's reader is not a conforming FDT
//! parser and a conforming one would disagree with it on real inputs: it never checks the
//! version, requires the structure block to end before the strings block starts, fails on the
//! first named node or `END_NODE`, returns the first property named `compatible` (the root's,
//! since a root's properties precede its subnodes), and bounds its walk by
//! `off_dt_struct + size_dt_struct` — a byte count — used as a count of words.

/// `FdtHeader` is ten big-endian u32s.
const HEADER_SIZE: usize = 40;
const FDT_MAGIC: u32 = 0xd00d_feed;
const FDT_BEGIN_NODE: u32 = 1;
const FDT_PROP: u32 = 3;
const FDT_NOP: u32 = 4;

/// Why systemd-stub 257 cannot read a devicetree blob's `compatible`: its
/// `devicetree_match_by_compatible()` returns `EFI_INVALID_PARAMETER` and the blob is skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DtbError {
    /// The section is shorter than the FDT header.
    #[error("the devicetree blob has {len} bytes, fewer than the 40 of an FDT header")]
    TooShort { len: usize },
    /// The header's `totalsize` is larger than the section.
    #[error("the FDT header's totalsize {total_size} exceeds the section's {len} bytes")]
    TotalSizeTooLarge { total_size: u32, len: usize },
    /// The blob does not start with the FDT magic.
    #[error("the devicetree blob starts with {magic:#010x}, not the FDT magic 0xd00dfeed")]
    BadMagic { magic: u32 },
    /// The strings block does not fit in `totalsize`.
    #[error(
        "the FDT strings block ({offset} + {size} bytes) does not fit in totalsize {total_size}"
    )]
    StringsBlockOutside {
        offset: u32,
        size: u32,
        total_size: u32,
    },
    /// The structure block is not word-aligned, not whole words, or does not end before the
    /// strings block.
    #[error(
        "the FDT structure block ({offset} + {size} bytes) is not whole aligned words ending before the strings block at {strings_offset}"
    )]
    StructBlockMisplaced {
        offset: u32,
        size: u32,
        strings_offset: u32,
    },
    /// A node begins in the structure block's last word.
    #[error("the node at structure word {word} begins in the structure block's last word")]
    TruncatedNode { word: usize },
    /// A node with a name comes before any `compatible`.
    #[error(
        "the node at structure word {word} has a name; systemd-stub 257 stops at any node but the root before finding compatible"
    )]
    NamedNode { word: usize },
    /// A property's header does not leave a word for its value inside the structure block.
    #[error("the property at structure word {word} does not fit in the structure block")]
    TruncatedProperty { word: usize },
    /// The first `compatible` is empty, not NUL-terminated, or runs past the structure block.
    #[error(
        "the compatible property at structure word {word} is empty, runs past the structure block or does not end in NUL"
    )]
    BadCompatible { word: usize },
    /// A token other than `BEGIN_NODE`, `PROP` or `NOP` comes before any `compatible`.
    #[error(
        "token {token:#x} at structure word {word} comes before any compatible property (systemd-stub 257 accepts only BEGIN_NODE, PROP and NOP there)"
    )]
    UnexpectedToken { token: u32, word: usize },
    /// The walk ended (at word `off_dt_struct + size_dt_struct`) without a `compatible`.
    #[error("no compatible property within the first {end} structure words")]
    NoCompatible { end: u32 },
    /// The walk would read beyond the section. The stub reads whatever memory follows; this
    /// model refuses instead of guessing.
    #[error(
        "structure word {word} lies beyond the {len}-byte section; systemd-stub 257 would read the memory after it"
    )]
    ReadBeyondSection { word: usize, len: usize },
}

/// `devicetree_match_by_compatible()`: `Ok(true)` when the blob's first `compatible` string
/// equals `compatible` byte for byte (`streq8()`: case-sensitive, whole string; the other
/// strings of the list are ignored), `Ok(false)` when it differs (`EFI_NOT_FOUND`), an error
/// when the stub finds the blob bad.
///
/// Checks, in the stub's order: at least 40 bytes and `totalsize` ≤ the section; the magic;
/// `off_dt_strings + size_dt_strings` ≤ `totalsize` (u32, no overflow); `off_dt_struct` a
/// multiple of 4; `size_dt_struct` a multiple of 4 and `off_dt_struct + size_dt_struct` ≤
/// `off_dt_strings`. Then the structure block is walked from word 0 while the word index is
/// below `off_dt_struct + size_dt_struct`:
/// - `BEGIN_NODE`: fails in the block's last word or unless the next word is 0 (an empty name,
///   i.e. only the root node passes);
/// - `NOP`: skipped;
/// - `PROP`: fails unless three more words fit in the block; a property whose name (in the
///   strings block, with `name_off + 10 < size_dt_strings`) is exactly `compatible` ends the
///   walk: its value must be non-empty, inside the block and end in NUL, and its first string is
///   the answer; any other property is skipped by its padded length (unchecked);
/// - anything else (`END_NODE`, `END`, garbage): fails.
pub fn dtb_compatible_matches(dtb: &[u8], compatible: &str) -> Result<bool, DtbError> {
    if dtb.len() < HEADER_SIZE {
        return Err(DtbError::TooShort { len: dtb.len() });
    }
    let total_size = be32(dtb, 4).unwrap_or_default();
    if dtb.len() < total_size as usize {
        return Err(DtbError::TotalSizeTooLarge {
            total_size,
            len: dtb.len(),
        });
    }
    Ok(first_compatible(dtb)? == compatible.as_bytes())
}

/// `devicetree_get_compatible()`, given that `dtb` holds the header and `totalsize` bytes.
fn first_compatible(dtb: &[u8]) -> Result<&[u8], DtbError> {
    let header = |field: usize| be32(dtb, field * 4).unwrap_or_default();
    let magic = header(0);
    if magic != FDT_MAGIC {
        return Err(DtbError::BadMagic { magic });
    }
    let total_size = header(1);
    let struct_offset = header(2);
    let strings_offset = header(3);
    let strings_size = header(8);
    let struct_size = header(9);

    let strings_end = strings_offset
        .checked_add(strings_size)
        .filter(|&end| end <= total_size)
        .ok_or(DtbError::StringsBlockOutside {
            offset: strings_offset,
            size: strings_size,
            total_size,
        })?;
    // `end` is a byte offset; the stub compares its word index against it.
    let end = Some(struct_offset)
        .filter(|offset| offset % 4 == 0 && struct_size % 4 == 0)
        .and_then(|offset| offset.checked_add(struct_size))
        .filter(|&end| end <= strings_offset)
        .ok_or(DtbError::StructBlockMisplaced {
            offset: struct_offset,
            size: struct_size,
            strings_offset,
        })?;
    // In bounds: strings_end ≤ totalsize ≤ dtb.len().
    let strings = &dtb[strings_offset as usize..strings_end as usize];
    let struct_start = struct_offset as usize;
    let size_words = (struct_size / 4) as usize;
    let word = |i: usize| {
        i.checked_mul(4)
            .and_then(|bytes| bytes.checked_add(struct_start))
            .and_then(|offset| be32(dtb, offset))
            .ok_or(DtbError::ReadBeyondSection {
                word: i,
                len: dtb.len(),
            })
    };

    let mut i = 0;
    while i < end as usize {
        match word(i)? {
            FDT_BEGIN_NODE => {
                if i >= size_words {
                    return Err(DtbError::TruncatedNode { word: i });
                }
                i += 1;
                if word(i)? != 0 {
                    return Err(DtbError::NamedNode { word: i - 1 });
                }
            }
            FDT_NOP => {}
            FDT_PROP => {
                let prop = i;
                if i + 3 >= size_words {
                    return Err(DtbError::TruncatedProperty { word: prop });
                }
                let len = word(i + 1)? as usize;
                let name_offset = word(i + 2)? as usize;
                i += 2;
                let len_words = len.div_ceil(4);
                if is_named_compatible(strings, name_offset) {
                    i += 1;
                    if len == 0 || i.saturating_add(len_words) > size_words {
                        return Err(DtbError::BadCompatible { word: prop });
                    }
                    // In bounds: the value's words lie inside the structure block.
                    let value = &dtb[struct_start + 4 * i..struct_start + 4 * i + len];
                    let Some((&0, _)) = value.split_last() else {
                        return Err(DtbError::BadCompatible { word: prop });
                    };
                    return Ok(value.split(|&b| b == 0).next().unwrap_or_default());
                }
                i = i.saturating_add(len_words);
            }
            token => return Err(DtbError::UnexpectedToken { token, word: i }),
        }
        i += 1;
    }
    Err(DtbError::NoCompatible { end })
}

/// The stub's name test: `name_off + strlen("compatible") < size_dt_strings` and the string at
/// `name_off` equals "compatible", i.e. the 11 bytes there are `compatible\0`.
fn is_named_compatible(strings: &[u8], name_offset: usize) -> bool {
    name_offset
        .checked_add(b"compatible".len())
        .is_some_and(|last| last < strings.len())
        && strings.get(name_offset..name_offset + 11) == Some(b"compatible\0".as_slice())
}

fn be32(bytes: &[u8], offset: usize) -> Option<u32> {
    let word = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_be_bytes([word[0], word[1], word[2], word[3]]))
}

#[cfg(test)]
pub(super) mod tests;
