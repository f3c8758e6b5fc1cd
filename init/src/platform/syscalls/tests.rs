//! The Linux syscalls' tests: the old root emptied without following links or leaving its
//! filesystem, and the recording implementation's order of pivot calls.

use super::*;
use std::os::unix::fs::symlink;

/// A scratch directory on tmpfs, as the initramfs root is.
fn tmpfs_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("/dev/shm is a tmpfs on Linux hosts")
}

#[test]
fn the_old_root_is_emptied_without_following_links() {
    let root = tmpfs_dir();
    let outside = tmpfs_dir();
    let precious = outside.path().join("precious");
    std::fs::write(&precious, b"keep me").unwrap();
    std::fs::create_dir_all(root.path().join("usr/lib/x86_64-linux-gnu")).unwrap();
    std::fs::write(root.path().join("init"), b"\x7fELF").unwrap();
    std::fs::write(root.path().join("usr/lib/x86_64-linux-gnu/libc.so.6"), b"x").unwrap();
    symlink("usr/lib", root.path().join("lib")).unwrap();
    symlink(outside.path(), root.path().join("escape")).unwrap();
    symlink(&precious, root.path().join("usr/precious-link")).unwrap();

    let old_root = LinuxSyscalls.open_old_root(root.path()).unwrap();
    let summary = LinuxSyscalls.remove_old_root(old_root).unwrap();

    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    // init, usr, usr/lib, usr/lib/x86_64-linux-gnu, libc.so.6, lib, escape, precious-link
    assert_eq!(summary.removed, 8, "{summary:?}");
    assert_eq!(summary.failed, 0, "{summary:?}");
}

#[test]
fn entries_on_another_filesystem_are_left_alone() {
    let root = tmpfs_dir();
    std::fs::create_dir(root.path().join("sysroot")).unwrap();
    std::fs::write(root.path().join("sysroot/file"), b"x").unwrap();
    let fd = nix::fcntl::open(
        root.path(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    // Seen from a device number that is not the entries' own, every entry is "another
    // filesystem": this is how mount points (whose root has the mounted device) are seen.
    let mut summary = RemovalSummary::default();
    remove_tree_contents(fd.as_fd(), u64::MAX, &mut summary);
    assert_eq!(summary.other_filesystems, 1);
    assert_eq!(summary.removed, 0);
    assert!(root.path().join("sysroot/file").exists());
}

#[test]
fn a_root_on_a_disk_filesystem_is_refused() {
    // The source tree is on a disk filesystem (ext4, overlay, …), never on tmpfs.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fs_type = nix::sys::statfs::statfs(dir).unwrap().filesystem_type().0 as i64;
    assert!(
        fs_type != TMPFS_MAGIC && fs_type != RAMFS_MAGIC,
        "{fs_type:#x}"
    );
    let err = LinuxSyscalls.open_old_root(dir).unwrap_err();
    assert!(
        err.to_string().contains("is not on ramfs or tmpfs"),
        "{err}"
    );
}

#[test]
fn an_existing_link_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("run");
    LinuxSyscalls.symlink(Path::new("../run"), &link).unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("../run"));
    LinuxSyscalls
        .symlink(Path::new("/elsewhere"), &link)
        .unwrap();
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("../run"));
    // Anything else that fails still fails.
    let missing_parent = dir.path().join("no/such/dir/link");
    assert!(
        LinuxSyscalls
            .symlink(Path::new("x"), &missing_parent)
            .is_err()
    );
}

#[test]
fn recording_keeps_the_pivot_calls_in_order() {
    let sys = RecordingSyscalls::new();
    let old_root = sys.open_old_root(Path::new("/")).unwrap();
    sys.chdir(Path::new("/sysroot")).unwrap();
    sys.chroot(Path::new(".")).unwrap();
    sys.remove_old_root(old_root).unwrap();
    assert_eq!(
        sys.calls(),
        [
            Call::OpenOldRoot("/".into()),
            Call::ChangeDir("/sysroot".into()),
            Call::ChangeRoot(".".into()),
            Call::RemoveOldRoot,
        ]
    );
    // A detached old root cannot be removed for real.
    assert!(LinuxSyscalls.remove_old_root(OldRoot::detached()).is_err());
}
