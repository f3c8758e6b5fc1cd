//! Unit tests of `hawser measurements`: cluster IDs on the command line, and the rootfs
//! lock's drift from a reference named package by package.

use hawser_image::rootfs::lock::RootfsLock;

use super::committed::rootfs_lock_drift;
use super::*;

#[test]
fn a_cluster_id_is_64_hex_digits() {
    let id = "2a96e44e656f8d24002810a9ebdd9a6f15b71d6139d9b77f4f829e9382fa12ab";
    assert_eq!(hex::encode(parse_cluster_id(id).unwrap()), id);
    assert!(parse_cluster_id(&id[..62]).unwrap_err().contains("not 31"));
    assert!(
        parse_cluster_id("xyz")
            .unwrap_err()
            .contains("64 hex digits")
    );
}

fn lock(bash: &str, sha256: &str) -> RootfsLock {
    let text = format!(
        "suite = \"bookworm\"\n\
         [[package]]\nname = \"bash\"\nversion = \"{bash}\"\nrole = \"rootfs\"\n\
         url = \"http://deb.debian.org/debian/pool/main/b/bash/bash.deb\"\nsize = 1\nsha256 = \"{sha256}\"\n\
         [[package]]\nname = \"libc6\"\nversion = \"2.36-9+deb12u13\"\nrole = \"rootfs\"\n\
         url = \"http://deb.debian.org/debian/pool/main/g/glibc/libc6.deb\"\nsize = 1\nsha256 = \"{sha256}\"\n"
    );
    RootfsLock::parse(&text, Path::new("rootfs.lock")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_changed_package_in_the_rootfs_lock_is_named_with_both_versions() {
    let recorded = lock("5.2.15-2+b7", &"ab".repeat(32));
    let digest = recorded.digest();
    assert!(rootfs_lock_drift(&digest, &recorded.versions(), &recorded).is_empty());
    let drift = rootfs_lock_drift(
        &digest,
        &recorded.versions(),
        &lock("5.2.15-2+b8", &"ab".repeat(32)),
    );
    assert_eq!(drift, ["bash 5.2.15-2+b7 → 5.2.15-2+b8"]);
    let drift = rootfs_lock_drift(
        &digest,
        &recorded.versions(),
        &lock("5.2.15-2+b7", &"cd".repeat(32)),
    );
    assert_eq!(drift.len(), 1);
    assert!(
        drift[0].starts_with("the same versions, other files: rootfs lock digest"),
        "{drift:?}"
    );
}

/// A published document's `list` as Constellation's shape has it, for a QEMU image.
fn published_qemu_doc() -> serde_json::Value {
    serde_json::json!({
        "version": "v0.1.0",
        "list": [{
            "csp": "QEMU",
            "attestationVariant": "qemu-vtpm",
            "measurements": {"4": {"expected": "aa", "warnOnly": false}},
        }],
        "hawser": {"cmdline": "console=ttyS0"},
    })
}

#[test]
fn a_platform_image_is_published_under_its_attestation_variants() {
    let entries = |cmdline: &str| {
        let mut doc = published_qemu_doc();
        publish_for_platform(&mut doc, cmdline).unwrap();
        assert_eq!(doc["hawser"], published_qemu_doc()["hawser"]);
        doc["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| {
                assert_eq!(
                    entry["measurements"],
                    published_qemu_doc()["list"][0]["measurements"]
                );
                (
                    entry["csp"].as_str().unwrap().to_owned(),
                    entry["attestationVariant"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let pair = |csp: &str, variant: &str| (csp.to_owned(), variant.to_owned());
    // The QEMU image's document is left exactly as hawser-measurements made it.
    let mut doc = published_qemu_doc();
    publish_for_platform(&mut doc, "console=ttyS0 quiet hawser.root_hash=ab").unwrap();
    assert_eq!(doc, published_qemu_doc());
    assert_eq!(
        entries("console=ttyS0 hawser.platform=gce hawser.root_hash=ab"),
        [pair("GCP", "gcp-sev-es")]
    );
    assert_eq!(
        entries("console=ttyS0 earlyprintk=ttyS0 hawser.platform=azure"),
        [pair("Azure", "azure-sev-snp"), pair("Azure", "azure-tdx")]
    );
    assert_eq!(entries("hawser.platform=aws"), [pair("AWS", "aws-sev-snp")]);
    assert_eq!(
        entries("hawser.platform=sev-snp"),
        [pair("QEMU", "qemu-sev-snp")]
    );
    assert_eq!(entries("hawser.platform=tdx"), [pair("QEMU", "qemu-tdx")]);
    let mut doc = published_qemu_doc();
    let err = publish_for_platform(&mut doc, "hawser.platform=mars").unwrap_err();
    assert!(err.to_string().contains("hawser.platform=mars"), "{err}");
}
