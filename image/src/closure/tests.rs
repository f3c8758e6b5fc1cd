//! Tests of the library closure: against the host's own ls, dlopened sonames, missing names,
//! symlinks that escape their root, and files that are not dynamic ELF executables.

use super::*;
use std::os::unix::fs::symlink;

fn host_root() -> Vec<PathBuf> {
    vec![PathBuf::from("/")]
}

#[test]
fn merged_usr_and_relative_targets() {
    assert_eq!(
        merged_usr(Path::new("/lib64/ld-linux-x86-64.so.2")),
        Path::new("usr/lib64/ld-linux-x86-64.so.2")
    );
    assert_eq!(
        merged_usr(Path::new("/usr/lib/x/libc.so.6")),
        Path::new("usr/lib/x/libc.so.6")
    );
    assert_eq!(
        relative_target(
            "usr/lib64/ld-linux-x86-64.so.2",
            "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
        ),
        "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    );
    assert_eq!(relative_target("a/b", "a/c"), "c");
}

/// The host's /bin/ls against the host root "/" (allowed for tests only): the closure is
/// exactly what `ldd` would name, laid out flat in the library directory.
#[test]
fn host_ls_closure_matches_its_needed_entries() {
    let closure = resolve(Path::new("/bin/ls"), &host_root(), &[]).unwrap();
    let dests: Vec<&str> = closure.files.iter().map(|f| f.dest.as_str()).collect();
    assert!(
        dests.contains(&"usr/lib/x86_64-linux-gnu/libc.so.6"),
        "{dests:?}"
    );
    assert!(
        dests.contains(&"usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        "{dests:?}"
    );
    assert!(
        dests.iter().any(|d| d.contains("libselinux.so.1")),
        "{dests:?}"
    );
    // libc names the interpreter as DT_NEEDED; it must not be shipped twice.
    assert_eq!(
        dests.iter().filter(|d| d.contains("ld-linux")).count(),
        1,
        "{dests:?}"
    );
    let interp = closure
        .symlinks
        .iter()
        .find(|l| l.dest == "usr/lib64/ld-linux-x86-64.so.2")
        .expect("the PT_INTERP path is a symlink into the library directory");
    assert_eq!(
        interp.target,
        "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    );
    for file in &closure.files {
        assert!(
            file.dest.starts_with("usr/lib/x86_64-linux-gnu/"),
            "{file:?}"
        );
        assert!(file.source.is_file(), "{file:?}");
        assert!(!file.source.is_symlink(), "{file:?}");
    }
    // Exactly the closure: compare with what ldd resolves (ldd lists linux-vdso too).
    let ldd = std::process::Command::new("ldd")
        .arg("/bin/ls")
        .output()
        .unwrap();
    let ldd = String::from_utf8(ldd.stdout).unwrap();
    let expected = ldd
        .lines()
        .filter(|l| l.contains("=>") || l.contains("ld-linux"))
        .count();
    assert_eq!(
        closure.files.len(),
        expected,
        "ldd says:\n{ldd}\nwe say {dests:?}"
    );
}

#[test]
fn dlopened_sonames_bring_their_own_dependencies() {
    // libz has no dependency beyond libc; any host library the test machine has will do.
    let without = resolve(Path::new("/bin/ls"), &host_root(), &[]).unwrap();
    let with = resolve(Path::new("/bin/ls"), &host_root(), &["libz.so.1"]).unwrap();
    assert!(with.files.len() > without.files.len());
    assert!(
        with.symlinks
            .iter()
            .any(|l| l.dest == "usr/lib/x86_64-linux-gnu/libz.so.1"),
        "{:?}",
        with.symlinks
    );
}

/// A root that is missing a library fails with the soname and where it looked, and never
/// falls back to the host's copy.
#[test]
fn missing_soname_is_named_with_the_roots() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
    fs::create_dir_all(root.join("usr/lib64")).unwrap();
    let host_interp = fs::canonicalize("/lib64/ld-linux-x86-64.so.2").unwrap();
    fs::copy(
        &host_interp,
        root.join("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    symlink(
        "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("usr/lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    let err = resolve(Path::new("/bin/ls"), std::slice::from_ref(&root), &[]).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, ClosureError::MissingLibrary { .. }),
        "{message}"
    );
    assert!(message.contains("\"libselinux.so.1\""), "{message}");
    assert!(message.contains(&root.display().to_string()), "{message}");

    let empty = tempfile::tempdir().unwrap();
    let err = resolve(Path::new("/bin/ls"), &[empty.path().to_owned()], &[]).unwrap_err();
    assert!(
        matches!(err, ClosureError::MissingInterpreter { .. }),
        "{err}"
    );
}

#[test]
fn symlinks_are_resolved_inside_the_root_and_may_not_escape() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&lib).unwrap();
    fs::write(lib.join("libfoo.so.1.2.3"), b"x").unwrap();
    symlink("libfoo.so.1.2.3", lib.join("libfoo.so.1")).unwrap();
    // An absolute target is re-rooted, not taken from the host.
    symlink(
        "/usr/lib/x86_64-linux-gnu/libfoo.so.1",
        lib.join("libbar.so.0"),
    )
    .unwrap();
    symlink("../../../../etc/passwd", lib.join("libevil.so.0")).unwrap();
    symlink("libloop.so.0", lib.join("libloop.so.0")).unwrap();

    let found = resolve_in_root(root, Path::new("usr/lib/x86_64-linux-gnu/libbar.so.0"))
        .unwrap()
        .unwrap();
    assert_eq!(found.real, lib.join("libfoo.so.1.2.3"));
    assert_eq!(found.link_names, ["libbar.so.0", "libfoo.so.1"]);

    let err = resolve_in_root(root, Path::new("usr/lib/x86_64-linux-gnu/libevil.so.0"))
        .err()
        .unwrap();
    assert!(matches!(err, ClosureError::EscapesRoot { .. }), "{err}");
    let err = resolve_in_root(root, Path::new("usr/lib/x86_64-linux-gnu/libloop.so.0"))
        .err()
        .unwrap();
    assert!(matches!(err, ClosureError::SymlinkLoop { .. }), "{err}");
    assert!(
        resolve_in_root(root, Path::new("usr/lib/x86_64-linux-gnu/libnone.so"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn static_executables_and_non_elf_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("init.sh");
    fs::write(&script, b"#!/bin/sh\n").unwrap();
    let err = resolve(&script, &host_root(), &[]).unwrap_err();
    assert!(matches!(err, ClosureError::BadElf { .. }), "{err}");
    // A shared library has no PT_INTERP.
    let libz = fs::canonicalize("/lib/x86_64-linux-gnu/libz.so.1").unwrap();
    let err = resolve(&libz, &host_root(), &[]).unwrap_err();
    assert!(matches!(err, ClosureError::NotDynamic { .. }), "{err}");
}
