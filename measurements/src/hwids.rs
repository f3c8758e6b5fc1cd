//! Which `.dtbauto` section systemd-stub ≥ 257 installs as the devicetree on a machine whose
//! firmware provides none: the machine's CHIDs from SMBIOS, the `.hwids` table that maps CHIDs
//! to a devicetree `compatible`, and the first `.dtbauto` whose root `compatible` equals it.
//!
//! A UKI may carry several `.dtbauto` sections (ukify `--devicetree-auto`) and one `.hwids`
//! section (ukify `--hwids DIR`, one JSON file per device: `name`, `compatible`, `hwids`). The
//! stub installs at most one of them, so predicting what a boot loads, and PCR 11 with it, needs
//! the stub's choice reproduced, quirks included. Every rule is from systemd 257.13:
//!
//! 1. `pe_locate_sections()` (`src/boot/pe.c`) consults `.hwids` only when
//!    `firmware_devicetree_exists()` (`src/boot/devicetree.c`) finds no devicetree configuration
//!    table — the case modelled here (x86 OVMF has none). It takes the first `.hwids` of the same
//!    section range it searches for `.dtbauto` (the base sections before the first `.profile`, or
//!    one profile's sections) and hands `chid_match()` its in-memory bytes (`VirtualSize`).
//! 2. `chid_match()` (`src/boot/chid.c`) computes the machine's CHIDs — [`chids`]: SMBIOS type 1
//!    manufacturer, product name, SKU and family and type 2 manufacturer and product
//!    (`smbios_raw_info_populate()`, `src/boot/smbios.c`), cleaned by
//!    `smbios_to_hashable_string()`, hashed by `get_chid()` with the masks of `chid_calculate()`
//!    (`src/fundamental/chid-fundamental.c`).
//! 3. It counts the section's 28-byte `Device` entries (`src/boot/chid.h`) — [`parse_hwids`] —
//!    and looks the CHIDs up by priority { 3, 6, 8, 10, 4, 5, 7, 9, 11 }, each against every entry
//!    in section order — [`matched_device`]. A bad section or no match selects nothing.
//! 4. `pe_locate_sections_internal()` walks the section table in order; `pe_use_this_dtb()` keeps
//!    a `.dtbauto` when `devicetree_match_by_compatible()` finds the matched entry's `compatible`
//!    (`device_get_compatible()`) equal to the blob's first compatible string —
//!    [`dtb_compatible_matches`]. The first such section wins; a bad blob is logged and skipped —
//!    [`select_dtbauto`]. `install_embedded_devicetree()` (`src/boot/stub.c`) then prefers the
//!    selected `.dtbauto` over a plain `.dtb`.
//!
//! systemd 256 and older have neither section (257's NEWS introduces them); versions after
//! 257.13 are not checked against this. The devicetree blob is read by hand, not with the `fdt`
//! crate: the stub's reader is not a conforming FDT parser (it stops at any named node or
//! `END_NODE`, bounds its walk by a byte count used as a word count, and takes the first
//! `compatible` it meets), and reproducing it means reading the words the way it does; see
//! [`dtb_compatible_matches`].
//!
//! The reference platform's SMBIOS, and so its CHIDs, is [`QEMU_REFERENCE_SMBIOS`].

mod fdt;

pub use fdt::{DtbError, dtb_compatible_matches};

use sha1::{Digest, Sha1};

#[cfg(test)]
pub(crate) mod tests;
/// A board devicetree with a root `compatible`, for other modules' tests.
#[cfg(test)]
pub(crate) use fdt::tests::board as test_board_dtb;

/// A CHID as the `.hwids` section stores it: the 16 bytes of an `EFI_GUID` in memory order
/// (the first three fields little-endian, Python's `uuid.UUID.bytes_le`).
pub type Chid = [u8; 16];

/// The number of CHID kinds systemd 257 knows (`CHID_TYPES_MAX`), indexed like fwupd's
/// `HardwareID-0` … `HardwareID-14`.
pub const CHID_TYPES_MAX: usize = 15;

/// The CHID kinds `chid_match()` looks up, most specific first; kinds 0–2, 12–14 are never used.
pub const CHID_PRIORITY: [usize; 9] = [3, 6, 8, 10, 4, 5, 7, 9, 11];

/// The SMBIOS strings systemd-stub reads, as raw bytes (`None`: the table or the string is
/// absent, which hashes like an empty string).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmbiosFields<'a> {
    /// Type 1 (System Information) Manufacturer.
    pub manufacturer: Option<&'a [u8]>,
    /// Type 1 Product Name.
    pub product_name: Option<&'a [u8]>,
    /// Type 1 SKU Number.
    pub product_sku: Option<&'a [u8]>,
    /// Type 1 Family.
    pub family: Option<&'a [u8]>,
    /// Type 2 (Baseboard Information) Manufacturer.
    pub baseboard_manufacturer: Option<&'a [u8]>,
    /// Type 2 Product.
    pub baseboard_product: Option<&'a [u8]>,
}

/// The SMBIOS of hawser's reference platform (`-machine q35`, QEMU 10.0, OVMF edk2-stable202211,
/// no `-smbios` options), as systemd-stub reads it:
///
/// - type 1 manufacturer "QEMU" and product "Standard PC (Q35 + ICH9, 2009)": QEMU's
///   `smbios_set_defaults("QEMU", mc->desc, mc->name)` (`hw/i386/fw_cfg.c`) with the q35
///   machine's description (`hw/i386/pc_q35.c`); SKU and family are unset, so
///   `smbios_build_type_1_table()` (`hw/smbios/smbios.c`) writes string index 0 (absent).
/// - no type 2: `smbios_build_type_2_table()` builds it as optional
///   (`SMBIOS_BUILD_TABLE_PRE(2, T2_BASE, false)`), i.e. only when `-smbios type=2,…` is given.
/// - OVMF adds nothing but a type 0 when QEMU sent none (`InstallAllStructures()`,
///   `OvmfPkg/SmbiosPlatformDxe/SmbiosPlatformDxe.c`); it passes QEMU's tables through.
///
/// Checked on 2026-11-30 by dumping the guest memory of QEMU 10.0.2 (Debian) with OVMF
/// 2022.11-6+deb12u2 at the UEFI shell: one SMBIOS 2.8 entry point, tables of types 1, 3, 4, 16,
/// 17, 19, 32, 0, 127 and type 1 strings "QEMU", "Standard PC (Q35 + ICH9, 2009)",
/// "pc-q35-10.0" with SKU and family indexes 0.
pub const QEMU_REFERENCE_SMBIOS: SmbiosFields<'static> = SmbiosFields {
    manufacturer: Some(b"QEMU"),
    product_name: Some(b"Standard PC (Q35 + ICH9, 2009)"),
    product_sku: None,
    family: None,
    baseboard_manufacturer: None,
    baseboard_product: None,
};

/// `ChidSmbiosFields` (`src/fundamental/chid-fundamental.h`): the order fields are hashed in.
const MANUFACTURER: usize = 0;
const FAMILY: usize = 1;
const PRODUCT_NAME: usize = 2;
const PRODUCT_SKU: usize = 3;
const BASEBOARD_MANUFACTURER: usize = 4;
const BASEBOARD_PRODUCT: usize = 5;
const SMBIOS_FIELDS: usize = 6;

const fn mask(fields: &[usize]) -> u32 {
    let mut mask = 0;
    let mut i = 0;
    while i < fields.len() {
        mask |= 1 << fields[i];
        i += 1;
    }
    mask
}

/// `chid_smbios_table` (`src/fundamental/chid-fundamental.c`); 0: not computed.
const CHID_SMBIOS_TABLE: [u32; CHID_TYPES_MAX] = {
    let mut table = [0; CHID_TYPES_MAX];
    table[3] = mask(&[
        MANUFACTURER,
        FAMILY,
        PRODUCT_NAME,
        PRODUCT_SKU,
        BASEBOARD_MANUFACTURER,
        BASEBOARD_PRODUCT,
    ]);
    table[4] = mask(&[MANUFACTURER, FAMILY, PRODUCT_NAME, PRODUCT_SKU]);
    table[5] = mask(&[MANUFACTURER, FAMILY, PRODUCT_NAME]);
    table[6] = mask(&[
        MANUFACTURER,
        PRODUCT_SKU,
        BASEBOARD_MANUFACTURER,
        BASEBOARD_PRODUCT,
    ]);
    table[7] = mask(&[MANUFACTURER, PRODUCT_SKU]);
    table[8] = mask(&[
        MANUFACTURER,
        PRODUCT_NAME,
        BASEBOARD_MANUFACTURER,
        BASEBOARD_PRODUCT,
    ]);
    table[9] = mask(&[MANUFACTURER, PRODUCT_NAME]);
    table[10] = mask(&[
        MANUFACTURER,
        FAMILY,
        BASEBOARD_MANUFACTURER,
        BASEBOARD_PRODUCT,
    ]);
    table[11] = mask(&[MANUFACTURER, FAMILY]);
    table[13] = mask(&[MANUFACTURER, BASEBOARD_MANUFACTURER, BASEBOARD_PRODUCT]);
    table
};

/// fwupd's CHID namespace 70ffd812-4c7f-4c7d-0000-000000000000 as `get_chid()` hashes it: the
/// `EFI_GUID {0x12d8ff70, 0x7f4c, 0x7d4c}` in memory, i.e. the UUID's big-endian bytes.
const CHID_NAMESPACE: [u8; 16] = [
    0x70, 0xff, 0xd8, 0x12, 0x4c, 0x7f, 0x4c, 0x7d, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// The CHIDs systemd-stub 257 computes for a machine (`chid_calculate()`), indexed by kind;
/// `None` for the kinds it leaves zeroed (0, 1, 2, 12, 14).
///
/// Each field is first cleaned (`smbios_to_hashable_string()`): the C string ends at its first
/// NUL; leading spaces are skipped, *then* leading `'0'`s (`" 007"` → `"7"`, but `"0 7"` →
/// `" 7"`, `"000"` → `""`); trailing spaces (only `' '`) are cut; the rest is converted to UCS-2
/// by `xstrn8_to_16()` (invalid UTF-8, surrogates and code points above U+FFFF dropped, overlong
/// forms accepted, an overlong NUL ends the string). An absent field is an empty string.
///
/// Each CHID is then (`get_chid()`) SHA-1 over fwupd's namespace
/// 70ffd812-4c7f-4c7d-0000-000000000000 (its big-endian bytes) and the UTF-16LE of the kind's
/// fields in enum order (manufacturer, family, product name, SKU, baseboard manufacturer,
/// baseboard product), every field with enum index > 0 preceded by `&` — also a first selected
/// one (never visible: every mask includes the manufacturer) and also an empty one. The first 16
/// digest bytes become an `EFI_GUID` with `Data1`–`Data3` byte-swapped to little-endian, version
/// 5 and the RFC 4122 variant: a version-5 UUID in `bytes_le` order.
pub fn chids(fields: &SmbiosFields<'_>) -> [Option<Chid>; CHID_TYPES_MAX] {
    let hashable = [
        fields.manufacturer,
        fields.family,
        fields.product_name,
        fields.product_sku,
        fields.baseboard_manufacturer,
        fields.baseboard_product,
    ]
    .map(hashable_string);
    std::array::from_fn(|kind| {
        let mask = CHID_SMBIOS_TABLE[kind];
        (mask != 0).then(|| chid_for_mask(&hashable, mask))
    })
}

/// The canonical text form of a CHID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase), as
/// fwupd prints it and ukify's JSON files list it.
pub fn chid_uuid(chid: &Chid) -> String {
    let mut be = *chid;
    be[0..4].reverse();
    be[4..6].reverse();
    be[6..8].reverse();
    let hex = hex::encode(be);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `get_chid()`: SHA-1 over the namespace, then per selected field (`mask` bit = enum index) an
/// `&` (UTF-16LE, 2 bytes) if its index is > 0 and its UTF-16LE units without terminator; the
/// first 16 bytes of the digest are read as an `EFI_GUID`, `Data1`–`Data3` byte-swapped to
/// little-endian, then the version (5, top nibble of `Data3`) and variant (`10`, top bits of
/// `Data4[0]`) are set.
fn chid_for_mask(fields: &[Vec<u16>; SMBIOS_FIELDS], mask: u32) -> Chid {
    let mut sha1 = Sha1::new();
    sha1.update(CHID_NAMESPACE);
    for (index, field) in fields.iter().enumerate() {
        if (mask >> index) & 1 == 0 {
            continue;
        }
        if index > 0 {
            sha1.update(b"&\0");
        }
        for unit in field {
            sha1.update(unit.to_le_bytes());
        }
    }
    let digest = sha1.finalize();
    let mut chid = [0; 16];
    chid.copy_from_slice(&digest[..16]);
    chid[0..4].reverse();
    chid[4..6].reverse();
    chid[6..8].reverse();
    // Data3 is little-endian in memory: its top nibble is the high nibble of byte 7.
    chid[7] = (chid[7] & 0x0f) | 0x50;
    chid[8] = (chid[8] & 0x3f) | 0x80;
    chid
}

/// `smbios_to_hashable_string()`: the C string ends at the first NUL; leading spaces are skipped,
/// *then* leading `'0'`s (so `" 007"` → `"7"` but `"0 7"` → `" 7"`, and `"000"` → `""`), then
/// trailing spaces are cut (only `' '`, not tabs); the rest goes through `xstrn8_to_16()`.
fn hashable_string(raw: Option<&[u8]>) -> Vec<u16> {
    let Some(raw) = raw else {
        return Vec::new();
    };
    let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
    let spaces = raw.iter().take_while(|&&b| b == b' ').count();
    let raw = &raw[spaces..];
    let zeros = raw.iter().take_while(|&&b| b == b'0').count();
    let raw = &raw[zeros..];
    let kept = raw
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(0, |last| last + 1);
    crate::stub::utf8_to_ucs2(&raw[..kept])
}

/// `sizeof(Device)` (`src/boot/chid.h`): descriptor u32, CHID, name and compatible offsets u32.
pub const DEVICE_SIZE: usize = 28;
/// `DEVICE_DESCRIPTOR_DEVICETREE`: type 1 in the top 4 bits, the entry size in the other 28.
pub const DEVICE_DESCRIPTOR_DEVICETREE: u32 = (1 << 28) | DEVICE_SIZE as u32;
/// `DEVICE_DESCRIPTOR_EOL`.
const DEVICE_DESCRIPTOR_EOL: u32 = 0;

/// One entry of a `.hwids` section: a CHID bound to a devicetree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HwidDevice {
    /// The CHID in `EFI_GUID` memory order.
    pub chid: Chid,
    /// The human-readable device name (`name_offset`; `None` when 0). The stub never reads it.
    pub name: Option<String>,
    /// The devicetree `compatible` this CHID selects (`compatible_offset`; `None` when 0, and
    /// then the entry can match but selects no `.dtbauto`).
    pub compatible: Option<String>,
}

/// Why a `.hwids` section cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HwidsError {
    /// An entry before the end marker is not a devicetree entry: `chid_match()` returns
    /// `EFI_UNSUPPORTED` and the stub selects no `.dtbauto` at all.
    #[error(
        ".hwids entry {index} has descriptor {descriptor:#010x} (type {kind}, size {size}), not the devicetree descriptor 0x1000001c; systemd-stub 257 rejects the whole section"
    )]
    UnsupportedDescriptor {
        index: usize,
        descriptor: u32,
        kind: u32,
        size: u32,
    },
    /// A string offset points outside the section. The stub would read whatever memory is
    /// there (and only for the matched entry); this model refuses instead of guessing.
    #[error(
        ".hwids entry {index}: its {field} string offset {offset} is outside the {len}-byte section"
    )]
    StringOutsideSection {
        index: usize,
        field: &'static str,
        offset: u32,
        len: usize,
    },
    /// A string runs to the end of the section without a NUL (same as above: the stub would read
    /// on past the section).
    #[error(
        ".hwids entry {index}: its {field} string at offset {offset} has no NUL before the section ends"
    )]
    UnterminatedString {
        index: usize,
        field: &'static str,
        offset: u32,
    },
    /// A string is not UTF-8. The stub compares bytes and would cope; ukify always writes UTF-8,
    /// so such a section was not built by ukify and this model refuses it.
    #[error(".hwids entry {index}: its {field} string at offset {offset} is not UTF-8")]
    StringNotUtf8 {
        index: usize,
        field: &'static str,
        offset: u32,
    },
}

/// The entries of a `.hwids` section (its in-memory bytes, `VirtualSize` long), counted as
/// `chid_match()` counts them: entry `n` is read only while `(n + 1) × 28 < len` (strictly: an
/// entry that ends exactly at the section's end is not read), the count stops at the
/// end-of-list descriptor 0, and any other descriptor than [`DEVICE_DESCRIPTOR_DEVICETREE`] is
/// an error. Bytes after the end marker (ukify's string table) are only read through offsets.
/// An empty list (the stub's `EFI_NOT_FOUND`) is `Ok` and matches nothing.
///
/// Strings are NUL-terminated at their offset from the section's start (`device_get_name()`,
/// `device_get_compatible()`); offset 0 means absent. Unlike the stub, which never looks at
/// strings of entries that do not match, this refuses a section with any unreadable string (see
/// [`HwidsError`]); ukify never writes one.
pub fn parse_hwids(section: &[u8]) -> Result<Vec<HwidDevice>, HwidsError> {
    let mut devices = Vec::new();
    let mut index = 0;
    while (index + 1) * DEVICE_SIZE < section.len() {
        let entry = &section[index * DEVICE_SIZE..(index + 1) * DEVICE_SIZE];
        let descriptor = le32(entry, 0);
        if descriptor == DEVICE_DESCRIPTOR_EOL {
            break;
        }
        if descriptor != DEVICE_DESCRIPTOR_DEVICETREE {
            return Err(HwidsError::UnsupportedDescriptor {
                index,
                descriptor,
                kind: descriptor >> 28,
                size: descriptor & 0x0fff_ffff,
            });
        }
        let mut chid = [0; 16];
        chid.copy_from_slice(&entry[4..20]);
        devices.push(HwidDevice {
            chid,
            name: section_string(section, index, "name", le32(entry, 20))?,
            compatible: section_string(section, index, "compatible", le32(entry, 24))?,
        });
        index += 1;
    }
    Ok(devices)
}

fn le32(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}

fn section_string(
    section: &[u8],
    index: usize,
    field: &'static str,
    offset: u32,
) -> Result<Option<String>, HwidsError> {
    if offset == 0 {
        return Ok(None);
    }
    let tail = usize::try_from(offset)
        .ok()
        .and_then(|start| section.get(start..))
        .filter(|tail| !tail.is_empty())
        .ok_or(HwidsError::StringOutsideSection {
            index,
            field,
            offset,
            len: section.len(),
        })?;
    let nul = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or(HwidsError::UnterminatedString {
            index,
            field,
            offset,
        })?;
    let text = std::str::from_utf8(&tail[..nul]).map_err(|_| HwidsError::StringNotUtf8 {
        index,
        field,
        offset,
    })?;
    Ok(Some(text.to_owned()))
}

/// The entry `chid_match()` returns: for each kind in [`CHID_PRIORITY`] (outer loop), the first
/// entry in section order whose CHID equals the machine's CHID of that kind (inner loop). So a
/// more specific kind wins over an earlier entry, and among entries with the same CHID the first
/// wins. A `None` in `machine` matches nothing ([`chids`] computes every kind looked up here).
pub fn matched_device<'d>(
    devices: &'d [HwidDevice],
    machine: &[Option<Chid>; CHID_TYPES_MAX],
) -> Option<&'d HwidDevice> {
    CHID_PRIORITY.iter().find_map(|&kind| {
        let chid = machine[kind]?;
        devices.iter().find(|device| device.chid == chid)
    })
}

/// The `.dtbauto` the stub selects, with no firmware devicetree: the first candidate whose root
/// `compatible` (first string) equals the matched entry's ([`dtb_compatible_matches`]); a blob
/// it cannot read is skipped (`pe_use_this_dtb()` logs "Found bad DT blob" and goes on). With no
/// matched entry, or one without a `compatible`, nothing is selected.
///
/// `candidates` are the `.dtbauto` sections of one range in section-table order, each as (any
/// caller-chosen id, e.g. the section index; its in-memory bytes, `VirtualSize` long, zero-filled
/// past `SizeOfRawData`); `device` is the [`matched_device`] of the `.hwids` in the same range.
/// The model assumes each section starts 4-byte aligned in memory, as the stub requires of a
/// blob (`alignof(FdtHeader)`); PE section alignment guarantees it.
pub fn select_dtbauto<'a>(
    candidates: impl IntoIterator<Item = (usize, &'a [u8])>,
    device: Option<&HwidDevice>,
) -> Option<usize> {
    let compatible = device?.compatible.as_deref()?;
    candidates
        .into_iter()
        .find(|(_, dtb)| dtb_compatible_matches(dtb, compatible) == Ok(true))
        .map(|(id, _)| id)
}
