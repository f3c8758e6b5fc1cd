//! Tests of reference files: the JSON shape, round trips, refusals, and diffs that name the
//! changed section, package or command line.

use super::*;
use crate::test_fixtures::{tiny_kernel, tiny_uki};

fn uki(cmdline: &[u8], initrd: &[u8]) -> Vec<u8> {
    let kernel = tiny_kernel(b"kernel code");
    tiny_uki(&[
        (".osrel", b"ID=hawser\n"),
        (".cmdline", cmdline),
        (".linux", &kernel),
        (".initrd", initrd),
    ])
}

fn inputs(kernel_version: &str) -> ReferenceInputs {
    ReferenceInputs {
        image: "hawser-qemu".into(),
        image_version: "0.1.0".into(),
        platform: "test".into(),
        input_lock_digest: format!("lock-{kernel_version}"),
        inputs: vec![InputPackage {
            name: "linux-image-6.12".into(),
            version: kernel_version.into(),
            role: "kernel".into(),
            sha256: format!("sha-{kernel_version}"),
        }],
        initramfs: BTreeMap::from([("init".to_owned(), "aaaa".to_owned())]),
        firmware_pcrs: BTreeMap::from([(0, [7; 32]), (4, [9; 32])]),
        firmware_values_from: Some("a boot".into()),
        ..ReferenceInputs::default()
    }
}

fn node_inputs(bash_version: &str) -> ReferenceInputs {
    ReferenceInputs {
        rootfs_lock_digest: Some(format!("rootfs-lock-{bash_version}")),
        rootfs_packages: BTreeMap::from([
            ("bash".to_owned(), bash_version.to_owned()),
            ("libc6".to_owned(), "2.36-9+deb12u13".to_owned()),
        ]),
        ..inputs("1")
    }
}

#[test]
fn a_node_reference_records_its_rootfs_lock_and_a_uki_reference_does_not() {
    let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
    let node = ReferenceMeasurements::new(&p, node_inputs("5.2.15-2+b7"));
    let v: serde_json::Value = serde_json::from_str(&node.render()).expect("json");
    assert_eq!(v["metadata"]["rootfsLockDigest"], "rootfs-lock-5.2.15-2+b7");
    assert_eq!(v["metadata"]["rootfsPackages"]["bash"], "5.2.15-2+b7");
    assert_eq!(
        ReferenceMeasurements::parse(&node.render()).expect("parse"),
        node
    );
    let uki_only = ReferenceMeasurements::new(&p, inputs("1")).render();
    assert!(!uki_only.contains("rootfs"), "{uki_only}");
}

#[test]
fn a_changed_rootfs_package_is_named_with_both_versions() {
    let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
    let a = ReferenceMeasurements::new(&p, node_inputs("5.2.15-2+b7"));
    let b = ReferenceMeasurements::new(&p, node_inputs("5.2.15-2+b8"));
    let d = diff(&a, &b);
    assert!(!d.is_empty());
    assert_eq!(d.rootfs.len(), 1, "{d}");
    let text = d.to_string();
    assert!(
            text.contains("rootfs packages (rootfs.lock; reference → rebuild):\n    bash 5.2.15-2+b7 → 5.2.15-2+b8\n"),
            "{text}"
        );
    // The same versions with other files: the digest names the change.
    let mut c = node_inputs("5.2.15-2+b7");
    c.rootfs_lock_digest = Some("another".into());
    let d = diff(&a, &ReferenceMeasurements::new(&p, c));
    assert!(
        d.to_string()
            .contains("rootfs lock digest rootfs-lock-5.2.15-2+b7 → another"),
        "{d}"
    );
}

#[test]
fn json_shape_is_constellation_compatible_and_round_trips() {
    let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
    let r = ReferenceMeasurements::new(&p, inputs("1"));
    let text = r.render();
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["0"]["warnOnly"], true);
    assert_eq!(v["4"]["warnOnly"], false);
    assert_eq!(
        v["4"]["expected"],
        hex::encode(p.pcr(4, Phase::EnterInitrd)),
        "a firmware value never overrides a predicted PCR"
    );
    assert_eq!(
        v["11"]["expected"],
        hex::encode(p.pcr(11, Phase::EnterInitrd))
    );
    assert_eq!(
        v["measurementsAfterLeaveInitrd"]["11"]["expected"],
        hex::encode(p.pcr(11, Phase::LeaveInitrd))
    );
    assert_eq!(v["12"]["expected"], "0".repeat(64));
    assert_eq!(v["15"]["expected"], "0".repeat(64));
    assert_eq!(v["metadata"]["inputLockDigest"], "lock-1");
    assert_eq!(ReferenceMeasurements::parse(&text).expect("parse"), r);
    // The PCR keys come first, in numeric order.
    let first_keys: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  \""))
        .map(|l| l.trim().split('"').nth(1).expect("key"))
        .collect();
    assert_eq!(
        first_keys,
        [
            "0",
            "4",
            "9",
            "11",
            "12",
            "13",
            "15",
            "formatVersion",
            "measurementsAfterLeaveInitrd",
            "metadata"
        ]
    );
}

#[test]
fn identical_builds_have_an_empty_diff() {
    let p = Prediction::from_uki(&uki(b"console=ttyS0", b"i"), "t").expect("predict");
    let a = ReferenceMeasurements::new(&p, inputs("1"));
    let mut b = ReferenceMeasurements::new(&p, inputs("1"));
    // Firmware values are not compared.
    b.measurements.remove(&0);
    let d = diff(&a, &b);
    assert!(d.is_empty(), "{d}");
    assert_eq!(d.to_string(), "no differences\n");
}

#[test]
fn diff_names_the_changed_section_and_package() {
    let a = ReferenceMeasurements::new(
        &Prediction::from_uki(&uki(b"console=ttyS0", b"initrd-1"), "a").expect("a"),
        inputs("6.12.117-1"),
    );
    let mut new_inputs = inputs("6.12.118-1");
    new_inputs
        .initramfs
        .insert("init".to_owned(), "bbbb".to_owned());
    let b = ReferenceMeasurements::new(
        &Prediction::from_uki(&uki(b"console=ttyS0", b"initrd-2"), "b").expect("b"),
        new_inputs,
    );
    let d = diff(&a, &b);
    let pcrs: Vec<(u8, Option<&str>)> = d.pcrs.iter().map(|p| (p.pcr, p.phase)).collect();
    assert_eq!(
        pcrs,
        [(4, None), (9, None), (11, None), (11, Some("leave-initrd"))]
    );
    for p in &d.pcrs {
        assert_eq!(p.because_of, [".initrd"], "PCR {}", p.pcr);
    }
    let text = d.to_string();
    assert!(
            text.contains(
                "kernel package linux-image-6.12 changed from 6.12.117-1 (sha256 sha-6.12.117-1) to 6.12.118-1"
            ),
            "{text}"
        );
    assert!(
        text.contains("section .initrd changed from sha256"),
        "{text}"
    );
    assert!(text.contains("/init changed from aaaa to bbbb"), "{text}");
}

#[test]
fn a_changed_cmdline_is_named_without_input_changes() {
    let a = ReferenceMeasurements::new(
        &Prediction::from_uki(&uki(b"console=ttyS0 panic=30", b"i"), "a").expect("a"),
        inputs("1"),
    );
    let b = ReferenceMeasurements::new(
        &Prediction::from_uki(&uki(b"console=ttyS0 panic=31", b"i"), "b").expect("b"),
        inputs("1"),
    );
    let d = diff(&a, &b);
    assert!(
        d.pcrs
            .iter()
            .any(|p| p.pcr == 9 && p.because_of == [".cmdline"])
    );
    let text = d.to_string();
    assert!(
        text.contains("command line changed from console=ttyS0 panic=30 to console=ttyS0 panic=31"),
        "{text}"
    );
    assert!(text.contains("the input lock is unchanged"), "{text}");
}

#[test]
fn malformed_references_are_refused_with_reasons() {
    let err = ReferenceMeasurements::parse("{").unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let p = Prediction::from_uki(&uki(b"c", b"i"), "t").expect("predict");
    let mut r = ReferenceMeasurements::new(&p, inputs("1"));
    r.format_version = 7;
    let err = ReferenceMeasurements::parse(&r.render()).unwrap_err();
    assert!(err.to_string().contains("format version 7"), "{err}");
    let mut r = ReferenceMeasurements::new(&p, inputs("1"));
    r.measurements.get_mut(&9).expect("9").expected = "zz".into();
    let err = ReferenceMeasurements::parse(&r.render()).unwrap_err();
    assert!(err.to_string().contains("PCR 9"), "{err}");
}
