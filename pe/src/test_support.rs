//! A minimal PE32+ image for unit tests, here and in the crates that read PEs through this one
//! (feature `test-support`).

use crate::MAGIC_PE32_PLUS;

/// Size of [`tiny_pe`]'s headers.
pub const TINY_HEADERS: usize = 0x400;

/// A minimal PE32+ image: headers of [`TINY_HEADERS`] bytes, then the given sections' data,
/// each file-aligned to 0x200. Returns the file.
pub fn tiny_pe(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let mut f = vec![0u8; TINY_HEADERS];
    f[..2].copy_from_slice(b"MZ");
    f[0x3c..0x40].copy_from_slice(&0x80u32.to_le_bytes());
    f[0x80..0x84].copy_from_slice(b"PE\0\0");
    let coff = 0x84;
    f[coff..coff + 2].copy_from_slice(&0x8664u16.to_le_bytes());
    f[coff + 2..coff + 4].copy_from_slice(&(sections.len() as u16).to_le_bytes());
    let opt_size: u16 = 112 + 16 * 8;
    f[coff + 16..coff + 18].copy_from_slice(&opt_size.to_le_bytes());
    let opt = coff + 20;
    f[opt..opt + 2].copy_from_slice(&MAGIC_PE32_PLUS.to_le_bytes());
    f[opt + 32..opt + 36].copy_from_slice(&0x1000u32.to_le_bytes());
    f[opt + 36..opt + 40].copy_from_slice(&0x200u32.to_le_bytes());
    f[opt + 60..opt + 64].copy_from_slice(&(TINY_HEADERS as u32).to_le_bytes());
    f[opt + 64..opt + 68].copy_from_slice(&0xdeadbeefu32.to_le_bytes());
    f[opt + 68..opt + 70].copy_from_slice(&10u16.to_le_bytes());
    f[opt + 108..opt + 112].copy_from_slice(&16u32.to_le_bytes());
    let table = opt + usize::from(opt_size);
    let mut va = 0x1000u32;
    for (i, (name, data)) in sections.iter().enumerate() {
        let pointer = f.len() as u32;
        let raw = data.len().div_ceil(0x200) * 0x200;
        f.extend_from_slice(data);
        f.resize(pointer as usize + raw, 0);
        let h = table + i * 40;
        f[h..h + name.len()].copy_from_slice(name.as_bytes());
        f[h + 8..h + 12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        f[h + 12..h + 16].copy_from_slice(&va.to_le_bytes());
        f[h + 16..h + 20].copy_from_slice(&(raw as u32).to_le_bytes());
        f[h + 20..h + 24].copy_from_slice(&pointer.to_le_bytes());
        f[h + 36..h + 40].copy_from_slice(&0x4000_0040u32.to_le_bytes());
        va += (data.len() as u32).div_ceil(0x1000).max(1) * 0x1000;
    }
    f[opt + 56..opt + 60].copy_from_slice(&va.to_le_bytes());
    f
}
