//! The lifecycle on an in-memory disk with a recording platform: every path, every power cut.

use std::cell::RefCell;

use zeroize::Zeroizing;

use super::testing::{Call, MemDisk, Recorder};
use super::*;
use crate::disk::key::FixedKey;

fn key(byte: u8, integrity: Integrity) -> FixedKey {
    FixedKey::new(
        VolumeKey::new(Zeroizing::new(vec![byte; integrity.key_len()])),
        "test",
    )
}

fn run_on(
    disk: &MemDisk,
    platform: &Recorder,
    mount: &Path,
    keys: &FixedKey,
    integrity: Integrity,
) -> Result<Outcome, LifecycleError> {
    run_for_cluster(disk, platform, mount, keys, integrity, None)
}

/// [`run_on`] for a node that locked into `cluster_id`.
fn run_for_cluster(
    disk: &MemDisk,
    platform: &Recorder,
    mount: &Path,
    keys: &FixedKey,
    integrity: Integrity,
    cluster_id: Option<[u8; 32]>,
) -> Result<Outcome, LifecycleError> {
    let options = Options {
        integrity,
        mount_point: mount,
        formatted_by: "hawser test",
        cluster_id,
        first_boot: &[],
    };
    run(disk, &options, keys, platform, &mut PhaseTimer::start())
}

/// The header an initialized disk is opened with.
fn header(disk: &MemDisk) -> luks2::Header {
    match state(disk) {
        Contents::Hawser(selected) => selected.header,
        other => panic!("not hawser's: {other:?}"),
    }
}

fn state(disk: &MemDisk) -> Contents {
    probe::probe(disk, Integrity::None).unwrap()
}

#[test]
fn a_blank_disk_is_formatted_then_only_ever_opened() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let platform = Recorder::default();
    let first = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    assert_eq!(first.action, Action::Formatted { was: "blank" });
    assert_eq!(first.boots, 1);
    assert_eq!(
        platform.calls(),
        [
            Call::Map(first.uuid.clone(), Integrity::None),
            Call::Mkfs,
            Call::Mount
        ]
    );
    let Contents::Hawser(selected) = state(&disk) else {
        panic!("not hawser's")
    };
    assert_eq!(selected.header.state, DiskState::Initialized);
    assert_eq!(selected.header.uuid, first.uuid);
    assert_eq!(selected.header.seqid, 2);
    let marker = read_marker(&mount.path().join(MARKER_FILE))
        .unwrap()
        .unwrap();
    assert_eq!(marker.luks_uuid, first.uuid);
    assert_eq!(marker.formatted_by, "hawser test");

    for boot in 2..=3 {
        let platform = Recorder::default();
        let before = disk.bytes();
        let again = run_on(
            &disk,
            &platform,
            mount.path(),
            &key(1, Integrity::None),
            Integrity::None,
        )
        .unwrap();
        assert_eq!(again.action, Action::Opened);
        assert_eq!(again.uuid, first.uuid);
        assert_eq!(again.boots, boot);
        assert!(again.warnings.is_empty(), "{:?}", again.warnings);
        // No mkfs, and not a byte of the disk changed.
        assert_eq!(
            platform.calls(),
            [Call::Map(first.uuid.clone(), Integrity::None), Call::Mount]
        );
        assert!(disk.bytes() == before, "opening wrote to the disk");
    }
}

#[test]
fn the_key_is_checked_against_the_disk_before_anything_is_applied() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    run_on(
        &disk,
        &Recorder::default(),
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    let options = Options {
        integrity: Integrity::None,
        mount_point: mount.path(),
        formatted_by: "hawser test",
        cluster_id: None,
        first_boot: &[],
    };
    let platform = Recorder::default();
    let mut timer = PhaseTimer::start();
    let plan = prepare(&disk, &options, &platform, &mut timer).unwrap();
    assert_eq!(plan.status(), DiskStatus::Initialized);
    let wrong = VolumeKey::new(Zeroizing::new(vec![2; 64]));
    let err = verify(&plan, wrong, &options, &mut timer).unwrap_err();
    assert!(matches!(err, LifecycleError::WrongKey { .. }), "{err}");
    let short = VolumeKey::new(Zeroizing::new(vec![1; 32]));
    let err = verify(&plan, short, &options, &mut timer).unwrap_err();
    assert!(
        matches!(
            err,
            LifecycleError::KeyLength {
                found: 32,
                expected: 64
            }
        ),
        "{err}"
    );
    // Checking wrote, mapped and mounted nothing; the right key then opens the disk.
    assert!(platform.calls().is_empty());
    let right = VolumeKey::new(Zeroizing::new(vec![1; 64]));
    let verified = verify(&plan, right, &options, &mut timer).unwrap();
    let outcome = apply(&disk, plan, verified, &options, &platform, &mut timer).unwrap();
    assert_eq!(outcome.action, Action::Opened);
    let names: Vec<&str> = timer.phases().iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "state-disk-probe",
            "state-disk-verify",
            "state-disk-verify",
            "state-disk-map",
            "state-disk-mount"
        ]
    );
}

#[test]
fn a_wrong_key_is_refused_and_nothing_is_written_or_mapped() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let formatted = run_on(
        &disk,
        &Recorder::default(),
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    let before = disk.bytes();
    let platform = Recorder::default();
    let err = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(2, Integrity::None),
        Integrity::None,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the key does not open LUKS2 volume {}: its digest does not match; nothing was written",
            formatted.uuid
        )
    );
    assert!(platform.calls().is_empty());
    assert!(disk.bytes() == before);
}

#[test]
fn a_failed_mkfs_leaves_the_disk_to_be_formatted_again() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let platform = Recorder {
        fail_mkfs: true,
        ..Recorder::default()
    };
    let err = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap_err();
    assert!(matches!(err, LifecycleError::Mkfs { .. }), "{err}");
    assert_eq!(platform.calls().last(), Some(&Call::Unmap));
    let Contents::Hawser(selected) = state(&disk) else {
        panic!("not hawser's")
    };
    assert_eq!(selected.header.state, DiskState::Formatting);
    let first_uuid = selected.header.uuid.clone();

    // Next boot: formatted again, under a new UUID, and initialized this time.
    let platform = Recorder {
        counter: RefCell::new(100),
        ..Recorder::default()
    };
    let outcome = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    assert_eq!(
        outcome.action,
        Action::Formatted {
            was: "formatted by hawser but never initialized"
        }
    );
    assert_ne!(outcome.uuid, first_uuid);
    let Contents::Hawser(selected) = state(&disk) else {
        panic!("not hawser's")
    };
    assert_eq!(selected.header.state, DiskState::Initialized);
    assert_eq!(selected.header.seqid, 3);
}

#[test]
fn a_power_cut_at_any_header_write_never_strands_the_disk() {
    // Cut the first format after every possible number of written sectors: the next boot
    // must format (never refuse) and end initialized.
    let full = 2 * luks2::HEADER_SIZE;
    for budget in (0..full).step_by(512 * 7).chain([full - 512]) {
        let disk = MemDisk::new();
        *disk.budget.borrow_mut() = Some(budget);
        let mount = tempfile::tempdir().unwrap();
        let _ = run_on(
            &disk,
            &Recorder::default(),
            mount.path(),
            &key(1, Integrity::None),
            Integrity::None,
        );
        *disk.budget.borrow_mut() = None;
        let outcome = run_on(
            &disk,
            &Recorder::default(),
            mount.path(),
            &key(1, Integrity::None),
            Integrity::None,
        )
        .unwrap_or_else(|e| panic!("cut after {budget} bytes: {e}"));
        assert!(
            matches!(outcome.action, Action::Formatted { .. }),
            "{budget}"
        );
        let Contents::Hawser(selected) = state(&disk) else {
            panic!("not hawser's after {budget}")
        };
        assert_eq!(selected.header.state, DiskState::Initialized);
    }
}

#[test]
fn a_power_cut_while_marking_initialized_keeps_a_consistent_header() {
    // Format fully except that the final "initialized" write is cut part-way.
    let formatting_writes = 2 * luks2::HEADER_SIZE;
    for extra in [
        0,
        512,
        4096,
        8192,
        luks2::HEADER_SIZE,
        luks2::HEADER_SIZE + 4096,
    ] {
        let disk = MemDisk::new();
        *disk.budget.borrow_mut() = Some(formatting_writes + extra);
        let mount = tempfile::tempdir().unwrap();
        let _ = run_on(
            &disk,
            &Recorder::default(),
            mount.path(),
            &key(1, Integrity::None),
            Integrity::None,
        );
        *disk.budget.borrow_mut() = None;
        let Contents::Hawser(selected) = state(&disk) else {
            panic!("no valid header after cutting {extra} bytes into the mark")
        };
        // Either still formatting (formatted again next boot) or initialized (opened).
        let platform = Recorder::default();
        let outcome = run_on(
            &disk,
            &platform,
            mount.path(),
            &key(1, Integrity::None),
            Integrity::None,
        )
        .unwrap();
        match selected.header.state {
            DiskState::Formatting => {
                assert!(matches!(outcome.action, Action::Formatted { .. }))
            }
            DiskState::Initialized => {
                assert_eq!(outcome.action, Action::Opened);
                assert!(!platform.calls().contains(&Call::Mkfs));
            }
        }
    }
}

#[test]
fn a_stale_copy_is_repaired_after_the_key_is_verified() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    run_on(
        &disk,
        &Recorder::default(),
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    // Damage the secondary copy's JSON area.
    disk.data.borrow_mut()[luks2::HEADER_SIZE + 6000] ^= 0x55;
    let outcome = run_on(
        &disk,
        &Recorder::default(),
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    assert_eq!(outcome.action, Action::Opened);
    assert!(
        outcome.warnings[0].contains("repaired the secondary header"),
        "{:?}",
        outcome.warnings
    );
    let Contents::Hawser(selected) = state(&disk) else {
        panic!()
    };
    assert_eq!(selected.repair, None);
}

#[test]
fn a_mount_failure_on_an_initialized_disk_never_formats() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    run_on(
        &disk,
        &Recorder::default(),
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap();
    let before = disk.bytes();
    let platform = Recorder {
        fail_mount: true,
        ..Recorder::default()
    };
    let err = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(1, Integrity::None),
        Integrity::None,
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("cannot mount /dev/dm-0"),
        "{err}"
    );
    assert!(!platform.calls().contains(&Call::Mkfs));
    assert!(disk.bytes() == before);
}

#[test]
fn integrity_mode_wipes_before_mkfs_and_needs_the_longer_key() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let platform = Recorder::default();
    let err = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(1, Integrity::None),
        Integrity::HmacSha256,
    )
    .unwrap_err();
    assert!(err.to_string().contains("needs 96"), "{err}");
    assert_eq!(
        state(&disk),
        Contents::Blank,
        "nothing written without a key"
    );
    let outcome = run_on(
        &disk,
        &platform,
        mount.path(),
        &key(1, Integrity::HmacSha256),
        Integrity::HmacSha256,
    )
    .unwrap();
    assert_eq!(outcome.wiped, Some(4096));
    assert_eq!(
        platform.calls(),
        [
            Call::Map(outcome.uuid.clone(), Integrity::HmacSha256),
            Call::Wipe,
            Call::Mkfs,
            Call::Mount
        ]
    );
}

#[test]
fn the_cluster_id_is_recorded_with_the_initialized_mark() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let keys = key(1, Integrity::None);
    let platform = Recorder::default();
    run_for_cluster(
        &disk,
        &platform,
        mount.path(),
        &keys,
        Integrity::None,
        Some([0xa1; 32]),
    )
    .unwrap();
    let formatted = header(&disk);
    assert_eq!(formatted.state, DiskState::Initialized);
    assert_eq!(formatted.cluster_id, Some([0xa1; 32]));
    let options = Options {
        integrity: Integrity::None,
        mount_point: mount.path(),
        formatted_by: "hawser test",
        cluster_id: None,
        first_boot: &[],
    };
    let plan = prepare(&disk, &options, &platform, &mut PhaseTimer::start()).unwrap();
    assert_eq!(plan.recorded_cluster_id(), Some([0xa1; 32]));

    // Opened by the same cluster: nothing to write, same header.
    let before = disk.bytes();
    run_for_cluster(
        &disk,
        &platform,
        mount.path(),
        &keys,
        Integrity::None,
        Some([0xa1; 32]),
    )
    .unwrap();
    assert!(disk.bytes()[..luks2::HEADERS_LEN] == before[..luks2::HEADERS_LEN]);

    // The development key source (no cluster) neither records nor checks one.
    let blank = MemDisk::new();
    run_on(&blank, &platform, mount.path(), &keys, Integrity::None).unwrap();
    assert_eq!(header(&blank).cluster_id, None);
}

#[test]
fn a_disk_without_a_cluster_id_records_it_at_its_next_lock() {
    // Initialized before hawser recorded cluster IDs.
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let keys = key(1, Integrity::None);
    run_on(
        &disk,
        &Recorder::default(),
        mount.path(),
        &keys,
        Integrity::None,
    )
    .unwrap();
    let old = header(&disk);
    assert_eq!(old.cluster_id, None);

    let opened = run_for_cluster(
        &disk,
        &Recorder::default(),
        mount.path(),
        &keys,
        Integrity::None,
        Some([0xb2; 32]),
    )
    .unwrap();
    assert_eq!(opened.action, Action::Opened);
    let recorded = header(&disk);
    assert_eq!(recorded.cluster_id, Some([0xb2; 32]));
    assert_eq!(recorded.uuid, old.uuid);
    assert_eq!(recorded.seqid, old.seqid + 1);
    assert!(recorded.digest.matches(&[1; 64]), "same key digest");
    // Both copies were rewritten: nothing left to repair.
    let Contents::Hawser(selected) = state(&disk) else {
        panic!("not hawser's")
    };
    assert!(selected.repair.is_none(), "{:?}", selected.repair);

    // A cut at any point of the recording leaves a disk that opens, with or without the ID.
    for budget in (0..=2 * luks2::HEADER_SIZE).step_by(3584) {
        let disk = MemDisk::new();
        run_on(
            &disk,
            &Recorder::default(),
            mount.path(),
            &keys,
            Integrity::None,
        )
        .unwrap();
        *disk.budget.borrow_mut() = Some(budget);
        let _ = run_for_cluster(
            &disk,
            &Recorder::default(),
            mount.path(),
            &keys,
            Integrity::None,
            Some([0xb2; 32]),
        );
        *disk.budget.borrow_mut() = None;
        let after = header(&disk);
        assert_eq!(
            after.state,
            DiskState::Initialized,
            "cut after {budget} bytes"
        );
        assert!(matches!(after.cluster_id, None | Some([0xb2, ..])));
        let reopened = run_for_cluster(
            &disk,
            &Recorder::default(),
            mount.path(),
            &keys,
            Integrity::None,
            Some([0xb2; 32]),
        )
        .unwrap();
        assert_eq!(reopened.action, Action::Opened, "cut after {budget} bytes");
        assert_eq!(header(&disk).cluster_id, Some([0xb2; 32]));
    }
}

#[test]
fn a_disk_of_another_cluster_is_refused_before_anything_is_written_or_mapped() {
    let disk = MemDisk::new();
    let mount = tempfile::tempdir().unwrap();
    let keys = key(1, Integrity::None);
    let formatted = run_for_cluster(
        &disk,
        &Recorder::default(),
        mount.path(),
        &keys,
        Integrity::None,
        Some([0xa1; 32]),
    )
    .unwrap();
    let before = disk.bytes();
    let platform = Recorder::default();
    let err = run_for_cluster(
        &disk,
        &platform,
        mount.path(),
        &keys,
        Integrity::None,
        Some([0xc3; 32]),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "LUKS2 volume {} belongs to cluster {}, but the node locked into cluster {}; \
             nothing was written",
            formatted.uuid,
            "a1".repeat(32),
            "c3".repeat(32)
        )
    );
    assert!(platform.calls().is_empty());
    assert!(disk.bytes() == before);
}
