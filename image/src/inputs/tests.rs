//! Tests of the input lock: apt output parsing, round trips, the committed lock, and refused
//! downloads.

use super::*;

const LINE: &str = "'http://deb.debian.org/debian-security/pool/updates/main/o/openssl/libssl3t64_3.5.7-1%7edeb13u3_amd64.deb' \
    libssl3t64_3.5.7-1~deb13u3_amd64.deb 2458176 \
    SHA256:ff16bc048bcd7d1b256094450b79c77947d8e76fe2a24bd99b91021d591fa074";

#[test]
fn parses_apt_print_uris() {
    let p = parse_print_uris(LINE, "libssl3t64", Role::Library).unwrap();
    assert_eq!(p.version, "3.5.7-1~deb13u3");
    assert_eq!(p.size, 2458176);
    assert!(p.url.ends_with("libssl3t64_3.5.7-1%7edeb13u3_amd64.deb"));
    assert_eq!(p.sha256.len(), 64);
    assert!(
        parse_print_uris(LINE, "libssl3", Role::Library).is_none(),
        "name must match the file"
    );
    assert!(parse_print_uris("'u' f.deb x SHA256:00", "f", Role::Library).is_none());
}

#[test]
fn lock_round_trips_and_rejects_bad_digests() {
    let lock = InputLock {
        suite: SUITE.into(),
        source_date_epoch: 1_767_225_600,
        packages: vec![parse_print_uris(LINE, "libssl3t64", Role::Library).unwrap()],
    };
    let text = lock.render();
    assert_eq!(InputLock::parse(&text).unwrap(), lock);
    assert_eq!(lock.digest(), InputLock::parse(&text).unwrap().digest());
    let broken = text.replace("ff16bc04", "zz16bc04");
    assert!(
        InputLock::parse(&broken)
            .unwrap_err()
            .to_string()
            .contains("malformed sha256")
    );
}

#[test]
fn committed_lock_covers_every_role() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
    let lock = InputLock::load(&path).unwrap();
    for role in [Role::Kernel, Role::Stub, Role::Library, Role::Tool] {
        assert!(lock.by_role(role).next().is_some(), "{role:?} missing");
    }
    assert_eq!(lock.by_role(Role::Library).count(), WANTED.len() - 3);
    let stub = lock.by_role(Role::Stub).next().unwrap();
    let ukify = lock.by_role(Role::Tool).next().unwrap();
    assert_eq!(
        (ukify.name.as_str(), &ukify.version),
        ("systemd-ukify", &stub.version),
        "ukify must come from the same systemd as the stub it is compared on"
    );
}

#[test]
fn tools_are_outside_the_image_digest() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
    let lock = InputLock::load(&path).unwrap();
    let mut image_only = lock.clone();
    image_only.packages.retain(|p| p.role != Role::Tool);
    assert_eq!(lock.digest(), image_only.digest());
    let mut other_tool = lock.clone();
    other_tool
        .packages
        .iter_mut()
        .filter(|p| p.role == Role::Tool)
        .for_each(|p| p.version.push_str("+other"));
    assert_eq!(lock.digest(), other_tool.digest());
    let mut other_kernel = lock.clone();
    other_kernel.packages[0].version.push_str("+other");
    assert_ne!(lock.digest(), other_kernel.digest(), "image packages count");
}

#[test]
fn a_corrupted_download_is_refused_and_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let deb = dir.path().join("x.deb");
    let src = dir.path().join("src.deb");
    std::fs::write(&src, b"not the locked bytes").unwrap();
    let pkg = LockedPackage {
        name: "x".into(),
        version: "1".into(),
        role: Role::Library,
        url: format!("file://{}", src.display()),
        size: 20,
        sha256: "00".repeat(32),
    };
    let err = download_verified(&pkg, &deb).unwrap_err();
    assert!(matches!(err, InputError::Checksum { .. }), "{err}");
    assert!(!deb.exists() && !deb.with_extension("deb.partial").exists());
}

#[test]
fn a_sha512_pin_is_checked_and_a_tarball_is_kept_under_its_own_name() {
    use sha2::{Digest, Sha512};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("upstream.tar.gz");
    std::fs::write(&src, b"the pinned bytes").unwrap();
    let url = format!("file://{}", src.display());
    let good = hex::encode(Sha512::digest(b"the pinned bytes"));
    let path = dir.path().join("cache/k.tar.gz");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = |pin| PinnedFile {
        name: "k.tar.gz",
        version: "v1",
        url: &url,
        pin,
    };

    let wrong = "ab".repeat(64);
    let err = download_pinned(&file(Pin::Sha512(&wrong)), &path).unwrap_err();
    match &err {
        InputError::Checksum {
            name,
            algorithm,
            expected,
            actual,
            ..
        } => {
            assert_eq!(
                (name.as_str(), *algorithm, expected, actual),
                ("k.tar.gz", "sha512", &wrong, &good)
            );
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("sha512"), "{err}");
    let partial = dir.path().join("cache/k.tar.gz.partial");
    assert!(!path.exists() && !partial.exists());

    download_pinned(&file(Pin::Sha512(&good)), &path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"the pinned bytes");
    // Kept: a second call with the source gone does not download.
    std::fs::remove_file(&src).unwrap();
    download_pinned(&file(Pin::Sha512(&good)), &path).unwrap();
}
