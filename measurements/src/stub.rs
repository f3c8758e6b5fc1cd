//! What systemd-stub and the Linux EFI stub do with a UKI's sections before anything is
//! measured: the command line the kernel is handed (and measures into PCR 9) and the cpio in
//! which the stub passes `.osrel` to the kernel (measured into PCR 9 with the initrd). What
//! differs between versions (which sections PCR 11 covers, whether the cpio is appended) is in
//! [`crate::models`].
//!
//! Every rule here is from the source of systemd v257.13 and Linux 6.12, as written down in
//! `docs/research/systemd-stub-257-measurements.md` (the conversion and the cpio are the same in
//! every modelled version: `docs/research/systemd-stub-versions.md`), and each one is checked
//! against real OVMF + swtpm boots (`qemu-tests/tests/measurements.rs`, `stubs.rs`).

/// The command line systemd-stub hands the kernel for a `.cmdline` section, as the UTF-16LE
/// bytes of `LoadOptions` including the terminating NUL — exactly what the Linux EFI stub
/// measures into PCR 9 (event tag `0x8F3B22ED`, "LOADED_IMAGE::LoadOptions").
///
/// systemd 257: `pe_section_to_str16()` → `xstrn8_to_16()` (`src/boot/efi-string.c`) converts
/// the section's `VirtualSize` bytes from UTF-8, stopping at a NUL byte; invalid or truncated
/// sequences, surrogates and code points above U+FFFF are dropped (UCS-2), overlong forms are
/// accepted as decoded. Then `mangle_stub_cmdline()` (`src/boot/util.c`) skips leading
/// characters ≤ 0x20 or = 0x7F, turns each inner one into a space and cuts the trailing ones.
/// `linux_exec()` sets `LoadOptionsSize = strsize16()` = (characters + 1) × 2.
pub fn load_options_utf16(cmdline_section: &[u8]) -> Vec<u8> {
    let units = mangle_stub_cmdline(&utf8_to_ucs2(cmdline_section));
    let mut bytes = Vec::with_capacity((units.len() + 1) * 2);
    for unit in units.iter().chain(std::iter::once(&0)) {
        bytes.extend_from_slice(&unit.to_le_bytes());
    }
    bytes
}

/// The command line as the kernel will see it (for display): [`load_options_utf16`] decoded.
pub fn effective_cmdline(cmdline_section: &[u8]) -> String {
    String::from_utf16_lossy(&mangle_stub_cmdline(&utf8_to_ucs2(cmdline_section)))
}

/// systemd's `utf8_to_unichar()`: decodes one sequence at the start of `s` (`s` is non-empty);
/// returns (code point or `None` for invalid, bytes consumed).
fn utf8_to_unichar(s: &[u8]) -> (Option<u32>, usize) {
    let lead = s[0];
    let (len, mut value) = match lead {
        b if b & 0x80 == 0 => return (Some(u32::from(b)), 1),
        b if b & 0xe0 == 0xc0 => (2, u32::from(b & 0x1f)),
        b if b & 0xf0 == 0xe0 => (3, u32::from(b & 0x0f)),
        b if b & 0xf8 == 0xf0 => (4, u32::from(b & 0x07)),
        b if b & 0xfc == 0xf8 => (5, u32::from(b & 0x03)),
        b if b & 0xfe == 0xfc => (6, u32::from(b & 0x01)),
        _ => return (None, 1),
    };
    if len > s.len() {
        return (None, len);
    }
    for &b in &s[1..len] {
        if b & 0xc0 != 0x80 {
            return (None, len);
        }
        value = (value << 6) | u32::from(b & 0x3f);
    }
    (Some(value), len)
}

/// systemd's `xstrn8_to_16()` (`src/boot/efi-string.c`), truncated at the first NUL unit (which
/// is where every consumer of the result stops): invalid or truncated sequences, surrogates and
/// code points above U+FFFF are dropped, overlong forms accepted as decoded. The command line's
/// conversion, and the hardware-ID strings' ([`crate::hwids`]).
pub(crate) fn utf8_to_ucs2(mut s: &[u8]) -> Vec<u16> {
    let mut out = Vec::with_capacity(s.len());
    while !s.is_empty() && s[0] != 0 {
        let (c, used) = utf8_to_unichar(s);
        s = s.get(used..).unwrap_or(&[]);
        if let Some(c) = c
            && (c <= 0xd7ff || (0xe000..=0xffff).contains(&c))
        {
            // Checked above: c fits 16 bits.
            out.push(c as u16);
        }
    }
    if let Some(nul) = out.iter().position(|&u| u == 0) {
        out.truncate(nul);
    }
    out
}

fn shall_be_whitespace(c: u16) -> bool {
    c <= 0x20 || c == 0x7f
}

/// systemd's `mangle_stub_cmdline()`.
fn mangle_stub_cmdline(s: &[u16]) -> Vec<u16> {
    let start = s
        .iter()
        .position(|&c| !shall_be_whitespace(c))
        .unwrap_or(s.len());
    let mut out: Vec<u16> = s[start..]
        .iter()
        .map(|&c| if shall_be_whitespace(c) { 0x20 } else { c })
        .collect();
    let end = out.iter().rposition(|&c| c != 0x20).map_or(0, |i| i + 1);
    out.truncate(end);
    out
}

/// The newc cpio systemd-stub generates for a section it passes to the kernel as
/// `/.extra/<file>` (`pack_cpio_literal(…, ".extra", <file>, 0555, 0444, …)`, `src/boot/cpio.c`;
/// `.osrel` as `os-release`, `.pcrsig`, `.pcrpkey`, `.profile`): a directory `.extra` (mode
/// 040555), the file `.extra/<file>` (mode 0100444) with the section's bytes, and the trailer.
/// All numbers are 8 lowercase hex digits (the trailer is a literal with an uppercase `B`),
/// mtimes, uids and gids 0, inodes counted from 1, padding to 4 bytes relative to the cpio's
/// start.
pub fn extra_cpio(file: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 400);
    // pack_cpio_prefix(".extra", 0555): one directory entry (the path has no '/').
    cpio_header(&mut out, 1, 0o040555, 0, ".extra".len() + 1);
    out.extend_from_slice(b".extra\0");
    pad4(&mut out);
    // pack_cpio_one(<file>, …, ".extra", 0444).
    cpio_header(
        &mut out,
        2,
        0o100444,
        data.len(),
        ".extra".len() + file.len() + 2,
    );
    out.extend_from_slice(format!(".extra/{file}\0").as_bytes());
    pad4(&mut out);
    out.extend_from_slice(data);
    pad4(&mut out);
    // pack_cpio_trailer().
    out.extend_from_slice(b"070701");
    for word in [0u32, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0] {
        out.extend_from_slice(format!("{word:08x}").as_bytes());
    }
    out.extend_from_slice(b"0000000B");
    out.extend_from_slice(b"00000000");
    out.extend_from_slice(b"TRAILER!!!\0\0\0\0");
    out
}

/// [`extra_cpio`] of `.osrel`: `/.extra/os-release`.
pub fn osrel_cpio(osrel: &[u8]) -> Vec<u8> {
    extra_cpio("os-release", osrel)
}

fn cpio_header(out: &mut Vec<u8>, inode: u32, mode: u32, size: usize, namesize: usize) {
    out.extend_from_slice(b"070701");
    // The stub refuses files over 4 GiB (cpio's 32-bit size field); a section is smaller.
    let fields = [
        inode,
        mode,
        0,
        0,
        1,
        0,
        size as u32,
        0,
        0,
        0,
        0,
        namesize as u32,
        0,
    ];
    for word in fields {
        out.extend_from_slice(format!("{word:08x}").as_bytes());
    }
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16(s: &str) -> Vec<u8> {
        let mut v: Vec<u8> = s.encode_utf16().flat_map(u16::to_le_bytes).collect();
        v.extend_from_slice(&[0, 0]);
        v
    }

    #[test]
    fn plain_ascii_cmdline_is_utf16_with_nul() {
        assert_eq!(
            load_options_utf16(b"console=ttyS0 quiet"),
            utf16("console=ttyS0 quiet")
        );
        assert_eq!(
            effective_cmdline(b"console=ttyS0 quiet"),
            "console=ttyS0 quiet"
        );
    }

    #[test]
    fn whitespace_and_control_characters_are_mangled() {
        // Leading whitespace skipped, inner control characters (tab, newline, DEL) become
        // spaces one for one, trailing ones cut.
        assert_eq!(
            effective_cmdline(b"  \tconsole=ttyS0\tpanic=-1\n\x7fquiet \n\n"),
            "console=ttyS0 panic=-1  quiet"
        );
        assert_eq!(load_options_utf16(b" \n "), vec![0, 0]);
        assert_eq!(load_options_utf16(b""), vec![0, 0]);
    }

    #[test]
    fn conversion_stops_at_nul_and_drops_what_ucs2_cannot_hold() {
        assert_eq!(effective_cmdline(b"a=1\0b=2"), "a=1");
        // é (2 bytes) and € (3 bytes) survive; 😀 (U+1F600) is dropped; so are an invalid lead
        // byte, a truncated sequence and an encoded surrogate.
        assert_eq!(effective_cmdline("x=é€😀y".as_bytes()), "x=é€y");
        assert_eq!(effective_cmdline(b"a\xffb"), "ab");
        assert_eq!(effective_cmdline(b"a\xed\xa0\x80b"), "ab");
        // A lead byte whose continuation is missing eats the following byte (systemd skips the
        // whole announced length).
        assert_eq!(effective_cmdline(b"a\xc3bc"), "ac");
        assert_eq!(effective_cmdline(b"ab\xe2\x82"), "ab");
        // An overlong NUL ends the string like a NUL.
        assert_eq!(effective_cmdline(b"a\xc0\x80b"), "a");
    }

    #[test]
    fn osrel_cpio_layout_matches_systemd() {
        let osrel = b"ID=hawser\nNAME=\"hawser experiment\"\n"; // 35 bytes, as in the research boot
        let cpio = osrel_cpio(osrel);
        assert_eq!(cpio.len() % 4, 0);
        let dir = &cpio[..110];
        assert_eq!(&dir[..6], b"070701");
        assert_eq!(&dir[6..14], b"00000001");
        assert_eq!(&dir[14..22], b"0000416d");
        assert_eq!(&dir[94..102], b"00000007");
        assert_eq!(&cpio[110..120], b".extra\0\0\0\0");
        let file = &cpio[120..230];
        assert_eq!(&file[6..14], b"00000002");
        assert_eq!(&file[14..22], b"00008124");
        assert_eq!(&file[54..62], b"00000023");
        assert_eq!(&file[94..102], b"00000012");
        assert_eq!(&cpio[230..248], b".extra/os-release\0");
        // 230 + 18 = 248 is aligned; the data follows directly.
        assert_eq!(&cpio[248..283], osrel);
        assert_eq!(&cpio[283..284], b"\0");
        let trailer = &cpio[284..];
        assert_eq!(trailer.len(), 124);
        let expected = concat!(
            "070701",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000001",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "00000000",
            "0000000B",
            "00000000",
            "TRAILER!!!\0\0\0\0"
        );
        assert_eq!(trailer, expected.as_bytes());
    }
}
