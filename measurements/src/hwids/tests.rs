//! Tests for `.dtbauto` selection: systemd's own CHID vector, the stub's string quirks, `.hwids`
//! sections packed the way ukify packs them, the match priority and the pick among blobs (built
//! by the devicetree reader's tests).

use super::fdt::tests::board;
use super::*;

/// A CHID from its canonical text (ukify: `uuid.UUID(text).bytes_le`).
fn chid(text: &str) -> Chid {
    let be = hex::decode(text.replace('-', "")).unwrap();
    let mut chid: Chid = be.try_into().unwrap();
    chid[0..4].reverse();
    chid[4..6].reverse();
    chid[6..8].reverse();
    chid
}

/// One ukify `--hwids` JSON file: name, compatible, hwids.
pub(crate) type HwidFile<'a> = (&'a str, &'a str, &'a [&'a str]);

/// ukify 257's `parse_hwid_dir()` over files given in its order (sorted paths): one entry per
/// CHID of each (name, compatible) pair in first-seen order, CHIDs sorted as UUIDs, an all-zero
/// end entry, then the sorted, deduplicated strings with offsets from the section start.
pub(crate) fn ukify_hwids(files: &[HwidFile<'_>]) -> Vec<u8> {
    let mut devices: Vec<((&str, &str), Vec<String>)> = Vec::new();
    let mut strings = std::collections::BTreeSet::new();
    for &(name, compatible, hwids) in files {
        strings.extend([name, compatible]);
        let hwids = hwids.iter().map(|h| h.to_lowercase());
        match devices
            .iter_mut()
            .find(|(key, _)| *key == (name, compatible))
        {
            Some((_, known)) => known.extend(hwids),
            None => devices.push(((name, compatible), hwids.collect())),
        }
    }
    for (_, hwids) in &mut devices {
        hwids.sort();
        hwids.dedup();
    }
    let entries = 1 + devices.iter().map(|(_, h)| h.len()).sum::<usize>();
    let mut offsets = std::collections::BTreeMap::new();
    let mut blob = Vec::new();
    for s in strings {
        offsets.insert(s, (entries * DEVICE_SIZE + blob.len()) as u32);
        blob.extend_from_slice(s.as_bytes());
        blob.push(0);
    }
    let mut out = Vec::new();
    for ((name, compatible), hwids) in &devices {
        for hwid in hwids {
            out.extend_from_slice(&DEVICE_DESCRIPTOR_DEVICETREE.to_le_bytes());
            out.extend_from_slice(&chid(hwid));
            out.extend_from_slice(&offsets[name].to_le_bytes());
            out.extend_from_slice(&offsets[compatible].to_le_bytes());
        }
    }
    out.extend_from_slice(&[0; DEVICE_SIZE]);
    out.extend_from_slice(&blob);
    out
}

fn device(chid: Chid, compatible: &str) -> HwidDevice {
    HwidDevice {
        chid,
        name: Some(format!("board {compatible}")),
        compatible: Some(compatible.to_owned()),
    }
}

fn entry(descriptor: u32, chid: Chid, name_offset: u32, compatible_offset: u32) -> Vec<u8> {
    let mut out = descriptor.to_le_bytes().to_vec();
    out.extend_from_slice(&chid);
    out.extend_from_slice(&name_offset.to_le_bytes());
    out.extend_from_slice(&compatible_offset.to_le_bytes());
    out
}

/// `smbios_to_hashable_string()` of six fields in enum order.
fn hashed(values: [&str; 6]) -> [Vec<u16>; 6] {
    values.map(|v| hashable_string(Some(v.as_bytes())))
}

fn hashable(raw: &[u8]) -> String {
    String::from_utf16(&hashable_string(Some(raw))).unwrap()
}

// ---- CHIDs ----

/// systemd 257.13 `src/test/test-chid.c`: fields of an MSI board and the CHIDs `chid_calculate()`
/// must give (checked there against `fwupdtool hwids`); all-zero kinds are the uncomputed ones.
#[test]
fn chids_match_systemd_test_vector() {
    let fields = SmbiosFields {
        manufacturer: Some(b"Micro-Star International Co., Ltd."),
        product_name: Some(b"MS-7D70"),
        product_sku: Some(b"To be filled by O.E.M."),
        family: Some(b"To be filled by O.E.M."),
        baseboard_product: Some(b"MPG X670E CARBON WIFI (MS-7D70)"),
        baseboard_manufacturer: Some(b"Micro-Star International Co., Ltd."),
    };
    let expected = [
        None,
        None,
        None,
        Some("01e09b32-de05-56ca-b9d1-9486ad5f381d"),
        Some("cad87a11-1813-507b-9aab-9a5f457b649c"),
        Some("377c823d-60d1-55b0-9678-76cd2af9d086"),
        Some("28ac9cf2-5bde-59f7-aebe-4b3d008090fe"),
        Some("e821e0e2-e11a-5e94-bf5d-ffe53c5e5048"),
        Some("1c092f1d-dc7b-564f-8a3d-128d7292fab8"),
        Some("c12c1f4a-332d-5d72-aa36-7a3d413b479a"),
        Some("28ac9cf2-5bde-59f7-aebe-4b3d008090fe"),
        Some("e821e0e2-e11a-5e94-bf5d-ffe53c5e5048"),
        None,
        Some("b2e58e8b-fb10-5cd0-8fb0-5bd931f1871a"),
        None,
    ];
    assert_eq!(chids(&fields), expected.map(|c| c.map(chid)));
    // The test's EFI_GUID initializer {0x01e09b32, 0xde05, 0x56ca, {0xb9, …}} in memory.
    assert_eq!(
        hex::encode(chids(&fields)[3].unwrap()),
        "329be00105deca56b9d19486ad5f381d"
    );
}

/// The same board's fwupd HardwareID-14 (manufacturer only, listed in test-chid.c's comment but
/// not computed by systemd): one field, no `&`.
#[test]
fn single_field_chid_matches_fwupd() {
    let fields = hashed(["Micro-Star International Co., Ltd.", "", "", "", "", ""]);
    assert_eq!(
        chid_uuid(&chid_for_mask(&fields, 1 << MANUFACTURER)),
        "50af5797-a2f2-58b1-9a1a-453bcbb2e025"
    );
}

/// The reference platform's CHIDs. Computed by an independent Python transcription of
/// `get_chid()` (hashlib.sha1 over the namespace and "&".join(fields) in UTF-16LE) that
/// reproduces the vector above; a real boot is still to confirm them. With SKU, family and the
/// baseboard absent, kinds 6 and 10 (and 7 and 11) hash the same text ("QEMU&&&", "QEMU&").
#[test]
fn qemu_q35_chids() {
    let qemu = chids(&QEMU_REFERENCE_SMBIOS);
    let expected = [
        (3, "8098632c-0cbe-509e-a6ad-24798181e46f"),
        (4, "b4f6379a-04cf-5ac1-98dc-5cab78ad3b69"),
        (5, "0005a67e-b5cb-59d5-b9fd-be410637d24e"),
        (6, "ce02aba8-ca49-5577-875e-d04508a9aa24"),
        (7, "7f5dbe14-cfc8-595a-95fd-0fda870d7b52"),
        (8, "1329a2de-f9e0-5b6f-85d0-6aa31a413abb"),
        (9, "817fca52-ae83-52f5-8642-9497f79d49d0"),
        (10, "ce02aba8-ca49-5577-875e-d04508a9aa24"),
        (11, "7f5dbe14-cfc8-595a-95fd-0fda870d7b52"),
        (13, "919f707c-b287-5191-a986-af9c048b9358"),
    ];
    for (kind, text) in expected {
        assert_eq!(
            qemu[kind].map(|c| chid_uuid(&c)).as_deref(),
            Some(text),
            "kind {kind}"
        );
    }
    assert_eq!(qemu.iter().flatten().count(), expected.len());
}

#[test]
fn every_chid_is_a_version_5_rfc4122_uuid() {
    for c in chids(&QEMU_REFERENCE_SMBIOS).iter().flatten() {
        let text = chid_uuid(c);
        assert_eq!(&text[14..15], "5", "{text}");
        assert!("89ab".contains(&text[19..20]), "{text}");
    }
}

#[test]
fn hashable_strings_strip_spaces_then_zeros_then_trailing_spaces() {
    assert_eq!(hashable(b"  007 Board  "), "7 Board");
    // Zeros are stripped after spaces, once: a space after them stays.
    assert_eq!(hashable(b"0 7"), " 7");
    assert_eq!(hashable(b"000"), "");
    // Only ' ' is whitespace here.
    assert_eq!(hashable(b"\tQEMU\t"), "\tQEMU\t");
    // Inner zeros and a trailing zero stay.
    assert_eq!(hashable(b"X100"), "X100");
}

#[test]
fn hashable_strings_follow_the_stubs_utf8_conversion() {
    // The C string ends at NUL.
    assert_eq!(hashable(b"ab\0cd"), "ab");
    // Invalid bytes and code points above U+FFFF are dropped; U+00E9 is kept.
    assert_eq!(hashable(b"a\xffb\xf0\x9f\x98\x80c\xc3\xa9"), "abcé");
    // An overlong NUL decodes to U+0000 and ends the string there.
    assert_eq!(hashable(b"ab\xc0\x80cd"), "ab");
}

#[test]
fn absent_empty_and_zero_fields_hash_alike() {
    let mut fields = QEMU_REFERENCE_SMBIOS;
    fields.product_sku = Some(b"");
    assert_eq!(chids(&fields), chids(&QEMU_REFERENCE_SMBIOS));
    fields.product_sku = Some(b" 000  ");
    assert_eq!(chids(&fields), chids(&QEMU_REFERENCE_SMBIOS));
    fields.product_sku = Some(b"1");
    assert_ne!(chids(&fields)[7], chids(&QEMU_REFERENCE_SMBIOS)[7]);
    // The SKU is not in kind 9 (manufacturer + product name).
    assert_eq!(chids(&fields)[9], chids(&QEMU_REFERENCE_SMBIOS)[9]);
}

/// `get_chid()` prefixes every selected field with index > 0 with "&", even a first one: a mask
/// of the family alone hashes "&QEMU", not "QEMU". No table mask shows it (all include the
/// manufacturer), so this pins the rule on the private function.
#[test]
fn ampersand_precedes_every_field_after_the_first_index() {
    let as_manufacturer = hashed(["QEMU", "", "", "", "", ""]);
    let as_family = hashed(["", "QEMU", "", "", "", ""]);
    assert_ne!(
        chid_for_mask(&as_family, 1 << FAMILY),
        chid_for_mask(&as_manufacturer, 1 << MANUFACTURER)
    );
    // "QEMU" + "&" + "" equals the manufacturer-and-family mask with an empty family.
    assert_eq!(
        chid_for_mask(&as_manufacturer, (1 << MANUFACTURER) | (1 << FAMILY)),
        chids(&QEMU_REFERENCE_SMBIOS)[11].unwrap()
    );
}

// ---- .hwids ----

const EXAMPLE_CHIDS: [&str; 2] = [
    "5dc05bf4-01f6-4089-b464-a08c47ea9295",
    "3e3f8f3c-2003-46f2-811c-85554f7d5952",
];

/// systemd's `man/ukify_hwid.json.example`, packed as ukify packs it, reads back entry by entry.
#[test]
fn parses_a_section_packed_like_ukify() {
    let section = ukify_hwids(&[(
        "Example Laptop 16 Gen 7",
        "example,laptop-16-g7",
        &EXAMPLE_CHIDS,
    )]);
    // Two entries, the end entry, then "Example Laptop 16 Gen 7\0example,laptop-16-g7\0".
    assert_eq!(section.len(), 3 * DEVICE_SIZE + 24 + 21);
    assert_eq!(&section[..4], &[0x1c, 0, 0, 0x10]);
    assert_eq!(&section[20..28], &[84, 0, 0, 0, 108, 0, 0, 0]);
    let devices = parse_hwids(&section).unwrap();
    let expected = |c| HwidDevice {
        chid: chid(c),
        name: Some("Example Laptop 16 Gen 7".into()),
        compatible: Some("example,laptop-16-g7".into()),
    };
    // ukify sorts a device's CHIDs.
    assert_eq!(
        devices,
        vec![expected(EXAMPLE_CHIDS[1]), expected(EXAMPLE_CHIDS[0])]
    );
}

/// Three files (sorted paths a, b, c): two name the same device.
const MERGED_FILES: &[HwidFile<'static>] = &[
    (
        "Board B",
        "vendor,b",
        &["00000000-0000-5000-8000-000000000002"],
    ),
    (
        "Board A",
        "vendor,a",
        &["00000000-0000-5000-8000-000000000001"],
    ),
    (
        "Board B",
        "vendor,b",
        &["00000000-0000-5000-8000-000000000001"],
    ),
];

/// What ukify 257.13's own `parse_hwid_dir()` returned (run with `pefile` stubbed out) for the
/// example file and for [`MERGED_FILES`]: the transcription packs the same bytes.
#[test]
fn the_packer_reproduces_ukify_output() {
    let example = concat!(
        "1c0000103c8f3f3e0320f246811c85554f7d5952540000006c0000001c000010f45bc05df6018940",
        "b464a08c47ea9295540000006c000000000000000000000000000000000000000000000000000000",
        "000000004578616d706c65204c6170746f702031362047656e2037006578616d706c652c6c617074",
        "6f702d31362d673700",
    );
    let files: &[HwidFile<'_>] = &[(
        "Example Laptop 16 Gen 7",
        "example,laptop-16-g7",
        &EXAMPLE_CHIDS,
    )];
    assert_eq!(hex::encode(ukify_hwids(files)), example);
    let merged = concat!(
        "1c0000100000000000000050800000000000000178000000890000001c0000100000000000000050",
        "800000000000000278000000890000001c0000100000000000000050800000000000000170000000",
        "8000000000000000000000000000000000000000000000000000000000000000426f617264204100",
        "426f61726420420076656e646f722c610076656e646f722c6200",
    );
    assert_eq!(hex::encode(ukify_hwids(MERGED_FILES)), merged);
}

#[test]
fn ukify_merges_files_of_one_device_and_shares_strings() {
    let section = ukify_hwids(MERGED_FILES);
    let devices = parse_hwids(&section).unwrap();
    let found: Vec<_> = devices
        .iter()
        .map(|d| (chid_uuid(&d.chid), d.compatible.as_deref().unwrap()))
        .collect();
    assert_eq!(
        found,
        [
            (
                "00000000-0000-5000-8000-000000000001".to_owned(),
                "vendor,b"
            ),
            (
                "00000000-0000-5000-8000-000000000002".to_owned(),
                "vendor,b"
            ),
            (
                "00000000-0000-5000-8000-000000000001".to_owned(),
                "vendor,a"
            ),
        ]
    );
}

/// `(n + 1) × 28 < len`: an entry ending exactly at the section's end is not read.
#[test]
fn an_entry_ending_at_the_section_end_is_not_counted() {
    let c = chid(EXAMPLE_CHIDS[0]);
    let two = [
        entry(DEVICE_DESCRIPTOR_DEVICETREE, c, 0, 0),
        entry(DEVICE_DESCRIPTOR_DEVICETREE, c, 0, 0),
    ]
    .concat();
    assert_eq!(parse_hwids(&two).unwrap().len(), 1);
    assert_eq!(parse_hwids(&two[..DEVICE_SIZE]).unwrap(), []);
    let mut longer = two.clone();
    longer.push(0);
    assert_eq!(parse_hwids(&longer).unwrap().len(), 2);
    assert_eq!(parse_hwids(&[]).unwrap(), []);
}

#[test]
fn the_end_entry_stops_the_count_and_hides_what_follows() {
    let c = chid(EXAMPLE_CHIDS[0]);
    let section = [
        entry(DEVICE_DESCRIPTOR_DEVICETREE, c, 0, 0),
        vec![0; DEVICE_SIZE],
        entry(0x2000_001c, c, 0, 0),
        vec![0; 4],
    ]
    .concat();
    let devices = parse_hwids(&section).unwrap();
    assert_eq!(
        devices,
        [HwidDevice {
            chid: c,
            name: None,
            compatible: None
        }]
    );
}

#[test]
fn another_descriptor_rejects_the_section() {
    let c = chid(EXAMPLE_CHIDS[0]);
    let section = [
        entry(DEVICE_DESCRIPTOR_DEVICETREE, c, 0, 0),
        entry(0x2000_001c, c, 0, 0),
        vec![0; DEVICE_SIZE + 1],
    ]
    .concat();
    let err = parse_hwids(&section).unwrap_err();
    assert_eq!(
        err,
        HwidsError::UnsupportedDescriptor {
            index: 1,
            descriptor: 0x2000_001c,
            kind: 2,
            size: 28
        }
    );
    assert!(
        err.to_string()
            .contains("descriptor 0x2000001c (type 2, size 28)"),
        "{err}"
    );
    // A devicetree type with the wrong size is another descriptor too.
    let section = [entry(0x1000_0020, c, 0, 0), vec![0; 1]].concat();
    assert!(matches!(
        parse_hwids(&section),
        Err(HwidsError::UnsupportedDescriptor { size: 32, .. })
    ));
}

#[test]
fn unreadable_strings_are_refused() {
    let c = chid(EXAMPLE_CHIDS[0]);
    let with = |compatible_offset: u32, tail: &[u8]| {
        [
            entry(DEVICE_DESCRIPTOR_DEVICETREE, c, 0, compatible_offset),
            vec![0; DEVICE_SIZE],
            tail.to_vec(),
        ]
        .concat()
    };
    let err = parse_hwids(&with(1000, b"x\0")).unwrap_err();
    assert_eq!(
        err,
        HwidsError::StringOutsideSection {
            index: 0,
            field: "compatible",
            offset: 1000,
            len: 58
        }
    );
    assert!(
        err.to_string()
            .contains("compatible string offset 1000 is outside the 58-byte section"),
        "{err}"
    );
    assert_eq!(
        parse_hwids(&with(58, b"x\0")).unwrap_err(),
        HwidsError::StringOutsideSection {
            index: 0,
            field: "compatible",
            offset: 58,
            len: 58
        }
    );
    assert_eq!(
        parse_hwids(&with(56, b"ab")).unwrap_err(),
        HwidsError::UnterminatedString {
            index: 0,
            field: "compatible",
            offset: 56
        }
    );
    assert_eq!(
        parse_hwids(&with(56, b"\xff\0")).unwrap_err(),
        HwidsError::StringNotUtf8 {
            index: 0,
            field: "compatible",
            offset: 56
        }
    );
    // An offset into the entries is allowed (the stub reads bytes at it); offset 0 is absent.
    let devices = parse_hwids(&with(56, b"ab\0")).unwrap();
    assert_eq!(devices[0].compatible.as_deref(), Some("ab"));
    assert_eq!(devices[0].name, None);
}

// ---- matching ----

#[test]
fn priority_beats_section_order() {
    let qemu = chids(&QEMU_REFERENCE_SMBIOS);
    let by_name = device(qemu[9].unwrap(), "by-manufacturer-and-product");
    let by_all = device(qemu[3].unwrap(), "by-everything");
    let other = device(chid(EXAMPLE_CHIDS[0]), "other");
    let devices = [other.clone(), by_name.clone(), by_all.clone()];
    assert_eq!(matched_device(&devices, &qemu), Some(&by_all));
    assert_eq!(matched_device(&devices[..2], &qemu), Some(&by_name));
    assert_eq!(matched_device(&devices[..1], &qemu), None);
}

#[test]
fn kinds_outside_the_priority_list_never_match() {
    let qemu = chids(&QEMU_REFERENCE_SMBIOS);
    let devices = [
        device(qemu[13].unwrap(), "kind-13"),
        device([0; 16], "zero"),
    ];
    assert_eq!(matched_device(&devices, &qemu), None);
}

#[test]
fn the_first_entry_wins_among_equal_chids() {
    let qemu = chids(&QEMU_REFERENCE_SMBIOS);
    let first = device(qemu[5].unwrap(), "first");
    let devices = [first.clone(), device(qemu[5].unwrap(), "second")];
    assert_eq!(matched_device(&devices, &qemu), Some(&first));
}

// ---- selection ----

#[test]
fn selects_the_first_matching_dtbauto_and_skips_bad_blobs() {
    let qemu = chids(&QEMU_REFERENCE_SMBIOS);
    let by_name = chid_uuid(&qemu[9].unwrap());
    let hwids = ukify_hwids(&[
        ("Other", "vendor,other", &[EXAMPLE_CHIDS[0]]),
        ("QEMU q35", "qemu,q35", &[by_name.as_str()]),
    ]);
    let devices = parse_hwids(&hwids).unwrap();
    let device = matched_device(&devices, &qemu);
    assert_eq!(device.and_then(|d| d.name.as_deref()), Some("QEMU q35"));

    let mut broken = board(b"qemu,q35\0");
    broken[0] = 0;
    let other = board(b"vendor,other\0");
    let ours = board(b"qemu,q35\0");
    let candidates = [
        (2, broken.as_slice()),
        (3, other.as_slice()),
        (5, ours.as_slice()),
        (6, ours.as_slice()),
    ];
    assert_eq!(select_dtbauto(candidates, device), Some(5));
    assert_eq!(
        select_dtbauto(candidates[..2].iter().copied(), device),
        None
    );
    assert_eq!(select_dtbauto(candidates, None), None);
    let without_compatible = HwidDevice {
        compatible: None,
        ..device.unwrap().clone()
    };
    assert_eq!(select_dtbauto(candidates, Some(&without_compatible)), None);
}

#[test]
fn chid_text_round_trips() {
    for text in EXAMPLE_CHIDS {
        assert_eq!(chid_uuid(&chid(text)), text);
    }
}
