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
