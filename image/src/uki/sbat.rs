//! ukify's SBAT merge: the `.sbat` section a UKI carries is the stub's and the kernel's SBAT
//! lines plus ukify's own `uki` line (`merge_sbat()` and `STUB_SBAT` in ukify 257).

use hawser_pe::{PeImage, SectionHeader};

use super::{Image, UkiError};

/// ukify's `merge_sbat()` header line and its default UKI generation line (`STUB_SBAT`).
const SBAT_HEADER: &str =
    "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n";
const UKIFY_STUB_SBAT: &str = "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
uki,1,UKI,uki,1,https://uapi-group.org/specifications/specs/unified_kernel_image/\n";

/// ukify's `merge_sbat([stub, linux], [STUB_SBAT])`: the SBAT header line, then every entry of
/// the stub's and the kernel's `.sbat` sections and ukify's `uki` line, then `\n\0`.
pub(super) fn merge_sbat(stub: &PeImage<'_>, linux: &[u8]) -> Result<String, UkiError> {
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
    for s in sbat_sections(stub) {
        let text = std::str::from_utf8(trim_trailing_nuls(stub.raw_data(s))).map_err(|source| {
            UkiError::InvalidSbat {
                image: Image::Stub,
                source,
            }
        })?;
        take(text);
    }
    // The kernel's SBAT, if the kernel is a PE that has one (Debian's 6.12 has none). A kernel
    // that is not a PE has none either; ukify skips it the same way.
    if let Ok(kernel) = PeImage::parse(linux, "kernel") {
        for s in sbat_sections(&kernel) {
            if let Ok(text) = std::str::from_utf8(trim_trailing_nuls(kernel.raw_data(s))) {
                take(text);
            }
        }
    }
    take(UKIFY_STUB_SBAT);
    Ok(format!("{SBAT_HEADER}{}\n\0", entries.join("\n")))
}

fn sbat_sections<'p>(pe: &'p PeImage<'_>) -> impl Iterator<Item = &'p SectionHeader> {
    pe.sections.iter().filter(|s| s.name == ".sbat")
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
}
