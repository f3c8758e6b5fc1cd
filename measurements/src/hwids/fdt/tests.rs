//! Tests for the stub's devicetree reader on hand-built blobs (dtc's layout: header, empty
//! reservation map, structure block, strings block).

use super::*;

const STRINGS: &[u8] = b"#address-cells\0compatible\0model\0compatible-x\0";
const ADDRESS_CELLS: u32 = 0;
const COMPATIBLE: u32 = 15;
const MODEL: u32 = 26;
const COMPATIBLE_X: u32 = 32;
const BEGIN_NODE: u32 = 1;
const END_NODE: u32 = 2;
const PROP: u32 = 3;
const NOP: u32 = 4;
const END: u32 = 9;

/// Bytes as big-endian words, zero-padded to a multiple of 4.
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_be_bytes(w)
        })
        .collect()
}

fn prop(name_offset: u32, value: &[u8]) -> Vec<u32> {
    [vec![PROP, value.len() as u32, name_offset], words(value)].concat()
}

/// An FDT as dtc lays it out: header, empty reservation map, structure block, strings block.
fn dtb(structure: &[u32], strings: &[u8]) -> Vec<u8> {
    let struct_offset = 40 + 16;
    let strings_offset = struct_offset + 4 * structure.len();
    let total = strings_offset + strings.len();
    let header = [
        0xd00d_feed,
        total as u32,
        struct_offset as u32,
        strings_offset as u32,
        40,
        17,
        16,
        0,
        strings.len() as u32,
        4 * structure.len() as u32,
    ];
    let mut out: Vec<u8> = header.iter().flat_map(|w| w.to_be_bytes()).collect();
    out.extend_from_slice(&[0; 16]);
    out.extend(structure.iter().flat_map(|w| w.to_be_bytes()));
    out.extend_from_slice(strings);
    out
}

/// A board devicetree: root with #address-cells, compatible, model, a "cpus" child.
pub(crate) fn board(compatible: &[u8]) -> Vec<u8> {
    let structure = [
        vec![NOP, BEGIN_NODE, 0],
        prop(ADDRESS_CELLS, &2u32.to_be_bytes()),
        prop(COMPATIBLE_X, b"decoy\0"),
        prop(COMPATIBLE, compatible),
        prop(MODEL, b"Acme Board\0"),
        [
            vec![BEGIN_NODE],
            words(b"cpus\0"),
            vec![END_NODE, END_NODE, END],
        ]
        .concat(),
    ]
    .concat();
    dtb(&structure, STRINGS)
}

#[test]
fn only_the_first_compatible_string_matches() {
    let blob = board(b"acme,board\0acme,soc\0");
    assert_eq!(dtb_compatible_matches(&blob, "acme,board"), Ok(true));
    assert_eq!(dtb_compatible_matches(&blob, "acme,soc"), Ok(false));
    assert_eq!(dtb_compatible_matches(&blob, "acme,boar"), Ok(false));
    assert_eq!(dtb_compatible_matches(&blob, "ACME,board"), Ok(false));
    assert_eq!(dtb_compatible_matches(&blob, "decoy"), Ok(false));
    // Trailing bytes after totalsize (section padding) are ignored.
    let mut padded = blob.clone();
    padded.extend_from_slice(&[0; 100]);
    assert_eq!(dtb_compatible_matches(&padded, "acme,board"), Ok(true));
}

#[test]
fn a_compatible_only_in_a_child_node_is_not_reached() {
    let structure = [
        vec![BEGIN_NODE, 0],
        prop(MODEL, b"Acme\0"),
        [vec![BEGIN_NODE], words(b"soc\0")].concat(),
        prop(COMPATIBLE, b"acme,soc\0"),
        vec![END_NODE, END_NODE, END],
    ]
    .concat();
    assert_eq!(
        dtb_compatible_matches(&dtb(&structure, STRINGS), "acme,soc"),
        Err(DtbError::NamedNode { word: 7 })
    );
    let structure = [
        vec![BEGIN_NODE, 0],
        prop(MODEL, b"Acme\0"),
        vec![END_NODE, END],
    ]
    .concat();
    assert_eq!(
        dtb_compatible_matches(&dtb(&structure, STRINGS), "acme"),
        Err(DtbError::UnexpectedToken {
            token: END_NODE,
            word: 7
        })
    );
}

#[test]
fn header_checks_reject_bad_blobs() {
    let blob = board(b"acme,board\0");
    assert_eq!(
        dtb_compatible_matches(&blob[..39], "x"),
        Err(DtbError::TooShort { len: 39 })
    );
    let cut = &blob[..blob.len() - 1];
    assert_eq!(
        dtb_compatible_matches(cut, "acme,board"),
        Err(DtbError::TotalSizeTooLarge {
            total_size: blob.len() as u32,
            len: blob.len() - 1
        })
    );
    let mut bad = blob.clone();
    bad[0] = 0xde;
    let err = dtb_compatible_matches(&bad, "acme,board").unwrap_err();
    assert_eq!(err, DtbError::BadMagic { magic: 0xde0d_feed });
    assert!(err.to_string().contains("0xde0dfeed"), "{err}");
    // Strings block beyond totalsize.
    let mut bad = blob.clone();
    bad[32..36].copy_from_slice(&(STRINGS.len() as u32 + 1).to_be_bytes());
    assert!(matches!(
        dtb_compatible_matches(&bad, "acme,board"),
        Err(DtbError::StringsBlockOutside { .. })
    ));
    // Structure block not whole words.
    let mut bad = blob.clone();
    let size = u32::from_be_bytes(blob[36..40].try_into().unwrap());
    bad[36..40].copy_from_slice(&(size - 2).to_be_bytes());
    assert!(matches!(
        dtb_compatible_matches(&bad, "acme,board"),
        Err(DtbError::StructBlockMisplaced { .. })
    ));
}

/// The stub requires the structure block before the strings block; dtc's layout has it, a valid
/// FDT with the blocks swapped does not pass.
#[test]
fn strings_before_structure_is_refused() {
    let structure: Vec<u8> = [
        vec![BEGIN_NODE, 0],
        prop(COMPATIBLE, b"acme\0"),
        vec![END_NODE, END],
    ]
    .concat()
    .iter()
    .flat_map(|w| w.to_be_bytes())
    .collect();
    let strings_offset = 56u32;
    let struct_offset = strings_offset + STRINGS.len().next_multiple_of(4) as u32;
    let total = struct_offset + structure.len() as u32;
    let header = [
        0xd00d_feed,
        total,
        struct_offset,
        strings_offset,
        40,
        17,
        16,
        0,
        STRINGS.len() as u32,
        structure.len() as u32,
    ];
    let mut blob: Vec<u8> = header.iter().flat_map(|w| w.to_be_bytes()).collect();
    blob.extend_from_slice(&[0; 16]);
    blob.extend_from_slice(STRINGS);
    blob.resize(struct_offset as usize, 0);
    blob.extend_from_slice(&structure);
    assert!(matches!(
        dtb_compatible_matches(&blob, "acme"),
        Err(DtbError::StructBlockMisplaced { .. })
    ));
}

#[test]
fn a_compatible_value_must_end_in_nul() {
    let structure = [
        vec![BEGIN_NODE, 0],
        prop(COMPATIBLE, b"acme"),
        vec![END_NODE, END],
    ]
    .concat();
    assert_eq!(
        dtb_compatible_matches(&dtb(&structure, STRINGS), "acme"),
        Err(DtbError::BadCompatible { word: 2 })
    );
    let structure = [
        vec![BEGIN_NODE, 0],
        prop(COMPATIBLE, b""),
        vec![NOP, END_NODE, END],
    ]
    .concat();
    assert_eq!(
        dtb_compatible_matches(&dtb(&structure, STRINGS), ""),
        Err(DtbError::BadCompatible { word: 2 })
    );
}

/// The walk is bounded by `off_dt_struct + size_dt_struct` used as a word count, so a structure
/// block of NOPs runs on past its end, through the strings block, and past the section.
#[test]
fn a_walk_past_the_section_is_refused() {
    let blob = dtb(&[BEGIN_NODE, 0, NOP, NOP], b"");
    assert_eq!(
        dtb_compatible_matches(&blob, "acme"),
        Err(DtbError::ReadBeyondSection { word: 4, len: 72 })
    );
    // With zero padding after the blob the walk meets token 0 and stops as the stub would.
    let mut padded = blob.clone();
    padded.extend_from_slice(&[0; 8]);
    assert_eq!(
        dtb_compatible_matches(&padded, "acme"),
        Err(DtbError::UnexpectedToken { token: 0, word: 4 })
    );
}
