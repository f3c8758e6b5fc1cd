//! Unit tests of `platform/rebase.rs`: smaps parsing, the move plan, the copies, and the thread
//! park.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::*;

const SMAPS: &str = "\
55d0c0a00000-55d0c0a40000 r--p 00000000 00:02 17                         /init (deleted)
Size:                256 kB
Anonymous:             0 kB
55d0c0a40000-55d0c0e00000 r-xp 00040000 00:02 17                         /init (deleted)
Anonymous:             0 kB
55d0c0e00000-55d0c0e20000 r--p 00400000 00:02 17                         /init (deleted)
Anonymous:            64 kB
55d0c0e20000-55d0c0e21000 rw-p 00420000 00:02 17                         /init (deleted)
Anonymous:             4 kB
55d0c0e21000-55d0c0e30000 rw-p 00000000 00:00 0 
Anonymous:            60 kB
7f0000000000-7f0000001000 ---p 00010000 00:02 21                         /usr/lib/x86_64-linux-gnu/libtss2-mu.so.0.0.1 (deleted)
Anonymous:             0 kB
7f0000100000-7f0000200000 r-xp 00000000 fe:00 1234                       /usr/bin/containerd-shim
Anonymous:             0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Anonymous:           132 kB
";

#[test]
fn smaps_headers_and_anonymous_pages_are_parsed() {
    let mappings = parse_smaps(SMAPS).unwrap();
    assert_eq!(mappings.len(), 8);
    let text = &mappings[1];
    assert_eq!((text.start, text.end), (0x55d0c0a40000, 0x55d0c0e00000));
    assert!(text.read && text.exec && !text.write && !text.shared);
    assert_eq!(text.offset, 0x40000);
    assert_eq!(text.dev, (0, 2));
    assert_eq!(text.inode, 17);
    assert_eq!(text.path.as_deref(), Some("/init"));
    assert_eq!(mappings[2].anonymous_kb, 64);
    assert_eq!(mappings[4].path, None);
    assert_eq!(mappings[6].dev, (0xfe, 0));
    assert_eq!(mappings[7].path.as_deref(), Some("[stack]"));
}

#[test]
fn a_malformed_line_is_named() {
    let err = parse_smaps("55d0c0a00000-55d0c0a40000 r--p zz 00:02 17 /init\n").unwrap_err();
    assert!(
        matches!(err, RebaseError::Malformed { line: 1, .. }),
        "{err}"
    );
}

#[test]
fn only_initramfs_files_move_code_from_the_copy_written_pages_as_copies() {
    let mappings = parse_smaps(SMAPS).unwrap();
    let (files, moves) = plan(&mappings, (0, 2)).unwrap();
    assert_eq!(
        files,
        ["/init", "/usr/lib/x86_64-linux-gnu/libtss2-mu.so.0.0.1"]
    );
    let kinds: Vec<(usize, &str)> = moves
        .iter()
        .map(|one| match one {
            Move::FromCopy { mapping, .. } => (mapping.start, "copy"),
            Move::Anonymous { mapping } => (mapping.start, "anonymous"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (0x55d0c0a00000, "copy"),
            (0x55d0c0a40000, "copy"),
            // RELRO: read-only now, but relocated (written) pages.
            (0x55d0c0e00000, "anonymous"),
            (0x55d0c0e20000, "anonymous"),
            // ld.so's gap between segments: no access, from the copy.
            (0x7f0000000000, "copy"),
        ]
    );
    assert!(matches!(moves[4], Move::FromCopy { copy: 1, .. }));
}

#[test]
fn a_shared_mapping_of_an_initramfs_file_stops_the_plan() {
    let smaps = "7f0000000000-7f0000001000 rw-s 00000000 00:02 30 /run/x (deleted)\n";
    let err = plan(&parse_smaps(smaps).unwrap(), (0, 2)).unwrap_err();
    assert!(matches!(err, RebaseError::Shared { .. }), "{err}");
}

/// A private mapping of a temporary file, as PID 1's code is one of the initramfs.
fn mapped_file(bytes: &[u8], prot: libc::c_int) -> (tempfile::NamedTempFile, Mapping) {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(bytes).unwrap();
    file.flush().unwrap();
    // SAFETY: a fresh private mapping of the whole file.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes.len(),
            prot,
            libc::MAP_PRIVATE,
            file.as_file().as_raw_fd(),
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED);
    let start = at as usize;
    let mapping = read_smaps()
        .unwrap()
        .into_iter()
        .find(|m| m.start == start)
        .unwrap();
    (file, mapping)
}

fn backing_inode(start: usize) -> u64 {
    read_smaps()
        .unwrap()
        .into_iter()
        .find(|m| m.start == start)
        .unwrap()
        .inode
}

#[test]
fn a_mapping_moves_onto_an_identical_file_keeping_its_bytes() {
    let bytes: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
    let (_old, mapping) = mapped_file(&bytes, libc::PROT_READ);
    let mut copy = tempfile::NamedTempFile::new().unwrap();
    copy.write_all(&bytes).unwrap();
    let copy_inode = copy.as_file().metadata().unwrap().ino();
    assert!(same_bytes(&File::open(_old.path()).unwrap(), copy.as_file()).unwrap());

    from_copy(&mapping, copy.as_file()).unwrap();

    assert_eq!(backing_inode(mapping.start), copy_inode);
    // SAFETY: the mapping is still `bytes.len()` readable bytes.
    let now = unsafe { std::slice::from_raw_parts(mapping.start as *const u8, bytes.len()) };
    assert_eq!(now, bytes.as_slice());
}

#[test]
fn a_written_mapping_becomes_an_anonymous_copy_of_its_current_bytes() {
    let bytes = vec![7u8; 2 * 4096];
    let (_old, mapping) = mapped_file(&bytes, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: a writable mapping of 2 pages.
    unsafe { *((mapping.start + 4100) as *mut u8) = 42 };

    anonymous_copy(&mapping).unwrap();

    assert_eq!(backing_inode(mapping.start), 0);
    // SAFETY: still 2 readable pages.
    let now = unsafe { std::slice::from_raw_parts(mapping.start as *const u8, bytes.len()) };
    assert_eq!(now[4100], 42);
    assert_eq!(now[0], 7);
    assert_eq!(now[8191], 7);
}

#[test]
fn different_files_are_told_apart() {
    let mut a = tempfile::NamedTempFile::new().unwrap();
    let mut b = tempfile::NamedTempFile::new().unwrap();
    a.write_all(&vec![1u8; 70_000]).unwrap();
    let mut other = vec![1u8; 70_000];
    other[69_999] = 2;
    b.write_all(&other).unwrap();
    assert!(!same_bytes(a.as_file(), b.as_file()).unwrap());
    let mut c = tempfile::NamedTempFile::new().unwrap();
    c.write_all(&vec![1u8; 69_999]).unwrap();
    assert!(!same_bytes(a.as_file(), c.as_file()).unwrap());
}

#[test]
fn parked_threads_make_no_progress_until_released() {
    let counter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU32::new(0));
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (counter, stop) = (Arc::clone(&counter), Arc::clone(&stop));
            std::thread::spawn(move || {
                while stop.load(Ordering::SeqCst) == 0 {
                    counter.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(50));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    let parked = park_other_threads().unwrap();
    assert!(parked.count >= 3, "{} threads parked", parked.count);
    let before = counter.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        counter.load(Ordering::SeqCst),
        before,
        "a parked thread ran"
    );
    drop(parked);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        counter.load(Ordering::SeqCst) > before,
        "no thread ran after the release"
    );
    stop.store(1, Ordering::SeqCst);
    for worker in workers {
        worker.join().unwrap();
    }
}
