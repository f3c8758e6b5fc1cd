//! Tiny UKIs for unit tests: a PE whose `.sdmagic` names a modelled stub and whose `.linux` is a
//! PE carrying an x86 setup header with a modelled kernel release.

use hawser_pe::test_support::tiny_pe;

/// The `.sdmagic` of hawser's own stub.
pub const SDMAGIC_257: &[u8] = b"#### LoaderInfo: systemd-stub 257.13-1~deb13u1 ####\0";

/// The release [`tiny_kernel`] carries.
pub const KERNEL_RELEASE: &str = "6.12.0-test";

/// A tiny PE with `code` in `.text` and, in its headers' free space, an x86 setup header
/// (`HdrS` at 0x202) whose `kernel_version` points at [`KERNEL_RELEASE`].
pub fn tiny_kernel(code: &[u8]) -> Vec<u8> {
    let mut pe = tiny_pe(&[(".text", code)]);
    pe[0x202..0x206].copy_from_slice(b"HdrS");
    pe[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
    let version = format!("{KERNEL_RELEASE} (test@hawser) #1 SMP\0");
    pe[0x300..0x300 + version.len()].copy_from_slice(version.as_bytes());
    pe
}

/// [`tiny_pe`] with a leading `.sdmagic` section naming systemd-stub 257.
pub fn tiny_uki(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let mut all: Vec<(&str, &[u8])> = vec![(".sdmagic", SDMAGIC_257)];
    all.extend_from_slice(sections);
    tiny_pe(&all)
}
