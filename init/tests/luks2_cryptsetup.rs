//! hawser's LUKS2 header against the reference implementation, cryptsetup, on the host.
//!
//! The host kernel has no device-mapper, so nothing here maps a disk (that is tested in the
//! QEMU guest, `qemu-tests/tests/disk.rs`). What runs without device-mapper proves the format:
//!
//! - cryptsetup accepts hawser's header (`isLuks`, `luksDump`) and reads the same layout;
//! - cryptsetup verifies hawser's key digest: `open --test-passphrase --volume-key-file`
//!   checks a volume key against the header's digest without mapping anything, and refuses a
//!   wrong key;
//! - hawser reads headers cryptsetup wrote (`luksFormat --volume-key-file`), including after an
//!   operator adds a recovery keyslot, and refuses cryptsetup headers with other parameters;
//! - the lifecycle, run on an image file, leaves a header cryptsetup reads as initialized;
//! - the cluster ID in hawser's token survives cryptsetup's rewrites (`luksAddKey`), and
//!   recording it later keeps an operator's keyslot usable.
//!
//! Needs `cryptsetup` (Debian package cryptsetup-bin, installed by `scripts/setup-host`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hawser_init::disk::dm::DmError;
use hawser_init::disk::key::{FixedKey, VolumeKey};
use hawser_init::disk::lifecycle::{self, Action, MkfsError, Options, Platform};
use hawser_init::disk::probe::{self, Contents, ProbeError};
use hawser_init::platform::error_chain;
use hawser_init::timings::PhaseTimer;
use hawser_luks2::{self as luks2, DiskState, HeaderSlot, Integrity, KeyDigest, NewHeader};
use zeroize::Zeroizing;

const DISK_SIZE: u64 = 64 * 1024 * 1024;
const UUID: &str = "6a3c2d1e-9b8f-4e7d-a6c5-b4a392817060";

fn cryptsetup(args: &[&str]) -> Output {
    Command::new("cryptsetup")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run cryptsetup ({e}): install cryptsetup-bin (scripts/setup-host)")
        })
}

fn ok(args: &[&str]) -> String {
    let out = cryptsetup(args);
    assert!(
        out.status.success(),
        "cryptsetup {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn str(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    /// A sparse disk image.
    fn disk(&self, name: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::File::create(&path)
            .unwrap()
            .set_len(DISK_SIZE)
            .unwrap();
        path
    }

    fn file(&self, name: &str, bytes: &[u8]) -> String {
        std::fs::write(self.path(name), bytes).unwrap();
        self.str(name)
    }
}

fn key(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn write_hawser_header(disk: &Path, integrity: Integrity, state: DiskState, volume_key: &[u8]) {
    let header = NewHeader {
        uuid: UUID.into(),
        integrity,
        digest: KeyDigest::compute(volume_key, [0x11; 32], luks2::DIGEST_ITERATIONS),
        state,
        seqid: 1,
        cluster_id: None,
    };
    let mut bytes = luks2::new_header_copy(HeaderSlot::Primary, &header, [0x22; 64]);
    bytes.extend(luks2::new_header_copy(
        HeaderSlot::Secondary,
        &header,
        [0x33; 64],
    ));
    let file = std::fs::OpenOptions::new().write(true).open(disk).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
}

fn read_headers(disk: &Path, integrity: Integrity) -> Result<luks2::Selected, luks2::HeaderError> {
    let bytes = std::fs::read(disk).unwrap();
    luks2::parse_headers(&bytes[..luks2::HEADERS_LEN], integrity)
}

#[test]
fn cryptsetup_accepts_hawsers_header_and_reads_its_layout() {
    let scratch = Scratch::new();
    let disk = scratch.disk("disk.img");
    let disk_str = disk.to_string_lossy();
    write_hawser_header(&disk, Integrity::None, DiskState::Initialized, &key(64, 1));

    ok(&["isLuks", "--type", "luks2", &disk_str]);
    let dump = ok(&["luksDump", &disk_str]);
    for expected in [
        "Version:       \t2",
        &format!("UUID:          \t{UUID}"),
        "Label:         \thawser-state",
        "Subsystem:     \thawser",
        "offset: 16777216 [bytes]",
        "length: (whole device)",
        "cipher: aes-xts-plain64",
        "sector: 4096 [bytes]",
        "0: hawser",
        "Iterations: 1000",
    ] {
        assert!(
            dump.contains(expected),
            "{expected:?} not in luksDump:\n{dump}"
        );
    }
    assert!(
        dump.contains("Keyslots:\nTokens:"),
        "no keyslot expected:\n{dump}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&ok(&["luksDump", "--dump-json-metadata", &disk_str])).unwrap();
    assert_eq!(json["segments"]["0"]["encryption"], "aes-xts-plain64");
    assert_eq!(json["tokens"]["0"]["state"], "initialized");
    assert_eq!(json["config"]["keyslots_size"], "16744448");
}

#[test]
fn cryptsetup_verifies_hawsers_key_digest_and_refuses_a_wrong_key() {
    for (integrity, bits) in [(Integrity::None, "512"), (Integrity::HmacSha256, "768")] {
        let scratch = Scratch::new();
        let disk = scratch.disk("disk.img");
        let disk_str = disk.to_string_lossy();
        let volume_key = key(integrity.key_len(), 7);
        write_hawser_header(&disk, integrity, DiskState::Initialized, &volume_key);
        if integrity != Integrity::None {
            let dump = ok(&["luksDump", &disk_str]);
            assert!(dump.contains("integrity: hmac(sha256)"), "{dump}");
        }
        let right = scratch.file("right.key", &volume_key);
        ok(&[
            "open",
            "--test-passphrase",
            "--key-size",
            bits,
            "--volume-key-file",
            &right,
            &disk_str,
        ]);
        let wrong = scratch.file("wrong.key", &key(integrity.key_len(), 8));
        let out = cryptsetup(&[
            "open",
            "--test-passphrase",
            "--key-size",
            bits,
            "--volume-key-file",
            &wrong,
            &disk_str,
        ]);
        assert!(!out.status.success(), "cryptsetup accepted a wrong key");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Volume key does not match the volume"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn luks_format(scratch: &Scratch, disk: &Path, volume_key: &[u8], extra: &[&str]) {
    let vk = scratch.file("format.key", volume_key);
    let passphrase = scratch.file("format.pass", b"operator passphrase");
    let disk = disk.to_string_lossy();
    let mut args = vec![
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--key-size",
        "512",
        "--sector-size",
        "4096",
        "--volume-key-file",
        &vk,
        "--key-file",
        &passphrase,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
    ];
    args.extend_from_slice(extra);
    args.push(&disk);
    ok(&args);
}

#[test]
fn hawser_reads_a_header_cryptsetup_wrote_with_hawsers_parameters() {
    let scratch = Scratch::new();
    let disk = scratch.disk("disk.img");
    let disk_str = disk.to_string_lossy().into_owned();
    let volume_key = key(64, 3);
    luks_format(
        &scratch,
        &disk,
        &volume_key,
        &[
            "--cipher",
            "aes-xts-plain64",
            "--subsystem",
            "hawser",
            "--label",
            "hawser-state",
        ],
    );
    // Not yet marked: hawser sees its own never-initialized disk.
    let selected = read_headers(&disk, Integrity::None).unwrap();
    assert_eq!(selected.header.state, DiskState::Formatting);

    let token = scratch.file(
        "token.json",
        br#"{"type":"hawser","keyslots":[],"state":"initialized"}"#,
    );
    ok(&["token", "import", "--json-file", &token, &disk_str]);
    let selected = read_headers(&disk, Integrity::None).unwrap();
    let header = selected.header;
    assert_eq!(header.state, DiskState::Initialized);
    assert!(header.digest.matches(&volume_key));
    assert!(!header.digest.matches(&key(64, 4)));
    assert_eq!(header.uuid, ok(&["luksUUID", &disk_str]).trim());
    // cryptsetup benchmarks its digest's iterations; hawser recomputed it with that count.
    let dump = ok(&["luksDump", "--dump-json-metadata", &disk_str]);
    let json: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let iterations = json["digests"]["0"]["iterations"].as_u64().unwrap();
    assert_eq!(u64::from(header.digest.iterations), iterations);
}

#[test]
fn an_operators_recovery_keyslot_keeps_the_disk_hawsers() {
    let scratch = Scratch::new();
    let disk = scratch.disk("disk.img");
    let disk_str = disk.to_string_lossy().into_owned();
    let volume_key = key(64, 5);
    write_hawser_header(&disk, Integrity::None, DiskState::Initialized, &volume_key);
    let vk = scratch.file("vk", &volume_key);
    let passphrase = scratch.file("pass", b"recovery passphrase");
    ok(&[
        "luksAddKey",
        "-q",
        "--key-size",
        "512",
        "--volume-key-file",
        &vk,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        &disk_str,
        &passphrase,
    ]);
    // The operator can now recover the volume key with the passphrase...
    ok(&[
        "open",
        "--test-passphrase",
        "--key-file",
        &passphrase,
        &disk_str,
    ]);
    let dumped = ok(&[
        "luksDump",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        &passphrase,
        &disk_str,
    ]);
    let hex_key = hex::encode(&volume_key);
    let flat: String = dumped.split_whitespace().collect();
    assert!(flat.contains(&hex_key), "volume key not in:\n{dumped}");
    // ...and hawser still opens it as its initialized disk (token kept, keyslot ignored).
    let selected = read_headers(&disk, Integrity::None).unwrap();
    assert_eq!(selected.header.state, DiskState::Initialized);
    assert_eq!(selected.header.uuid, UUID);
    assert!(selected.header.digest.matches(&volume_key));
}

#[test]
fn cryptsetup_headers_with_other_parameters_are_refused() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--cipher", "aes-xts-essiv:sha256", "--subsystem", "hawser"],
            "data segment cipher \"aes-xts-essiv:sha256\", hawser only opens \"aes-xts-plain64\"",
        ),
        (
            &[
                "--cipher",
                "aes-xts-plain64",
                "--subsystem",
                "hawser",
                "--offset",
                "65536",
            ],
            "data segment offset 33554432, hawser only opens 16777216",
        ),
        (
            &["--cipher", "aes-xts-plain64"],
            "a LUKS2 volume that hawser did not create (subsystem \"\")",
        ),
    ];
    for (extra, expected) in cases {
        let scratch = Scratch::new();
        let disk = scratch.disk("disk.img");
        luks_format(&scratch, &disk, &key(64, 6), extra);
        let file = std::fs::File::open(&disk).unwrap();
        let err = probe::probe(&file, Integrity::None).unwrap_err();
        assert!(
            matches!(err, ProbeError::Refused(_) | ProbeError::Foreign { .. }),
            "{err}"
        );
        let chain = error_chain(&err);
        assert!(chain.contains(expected), "{expected:?} not in {chain}");
    }
}

/// The lifecycle on an image file, with a platform that maps nothing (the mapping is tested in
/// the guest): what it leaves on the disk is a header cryptsetup reads and keys it verifies.
struct NoDeviceMapper {
    mount: PathBuf,
}

impl Platform for NoDeviceMapper {
    fn map(&self, _: &str, _: Integrity, _: &VolumeKey) -> Result<PathBuf, DmError> {
        Ok(PathBuf::from("/dev/null"))
    }
    fn unmap(&self) {}
    fn wipe(&self, _: &Path) -> io::Result<u64> {
        Ok(0)
    }
    fn mkfs(&self, _: &Path) -> Result<(), MkfsError> {
        Ok(())
    }
    fn mount(&self, _: &Path, target: &Path) -> io::Result<()> {
        assert_eq!(target, self.mount);
        Ok(())
    }
    fn random(&self, buf: &mut [u8]) -> io::Result<()> {
        hawser_init::disk::fill_random(buf)
    }
}

#[test]
fn the_lifecycle_on_an_image_file_leaves_a_header_cryptsetup_opens() {
    let scratch = Scratch::new();
    let disk_path = scratch.disk("disk.img");
    let volume_key = key(64, 9);
    let keys = FixedKey::new(VolumeKey::new(Zeroizing::new(volume_key.clone())), "test");
    let mount = scratch.path("mnt");
    let platform = NoDeviceMapper {
        mount: mount.clone(),
    };
    let options = Options {
        integrity: Integrity::None,
        mount_point: &mount,
        formatted_by: "hawser test",
        cluster_id: None,
        first_boot: &[],
    };
    let disk = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk_path)
        .unwrap();
    let first =
        lifecycle::run(&disk, &options, &keys, &platform, &mut PhaseTimer::start()).unwrap();
    assert!(matches!(first.action, Action::Formatted { .. }));
    let second =
        lifecycle::run(&disk, &options, &keys, &platform, &mut PhaseTimer::start()).unwrap();
    assert_eq!(second.action, Action::Opened);
    assert_eq!(second.boots, 2);

    let disk_str = disk_path.to_string_lossy();
    let dump = ok(&["luksDump", "--dump-json-metadata", &disk_str]);
    let json: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(json["tokens"]["0"]["state"], "initialized");
    let vk = scratch.file("vk", &volume_key);
    ok(&[
        "open",
        "--test-passphrase",
        "--key-size",
        "512",
        "--volume-key-file",
        &vk,
        &disk_str,
    ]);
    let uuid = ok(&["luksUUID", &disk_str]);
    assert_eq!(uuid.trim(), first.uuid);
    assert!(matches!(
        probe::probe(&disk, Integrity::None).unwrap(),
        Contents::Hawser(_)
    ));
}

#[test]
fn the_cluster_id_in_hawsers_token_survives_cryptsetup_and_keeps_an_operators_keyslot() {
    let scratch = Scratch::new();
    let disk = scratch.disk("disk.img");
    let disk_str = disk.to_string_lossy().into_owned();
    let volume_key = key(64, 7);
    // A disk initialized before hawser recorded cluster IDs, with an operator's keyslot.
    write_hawser_header(&disk, Integrity::None, DiskState::Initialized, &volume_key);
    let vk = scratch.file("vk", &volume_key);
    let passphrase = scratch.file("pass", b"recovery passphrase");
    ok(&[
        "luksAddKey",
        "-q",
        "--key-size",
        "512",
        "--volume-key-file",
        &vk,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        &disk_str,
        &passphrase,
    ]);
    // hawser records the cluster ID as PID 1 does at the next lock: both copies, seqid + 1.
    let selected = read_headers(&disk, Integrity::None).unwrap();
    assert_eq!(selected.header.cluster_id, None);
    let seqid = selected.header.seqid + 1;
    let first = selected.source.slot.other();
    let file = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    for (slot, salt) in [(first, [0x44; 64]), (first.other(), [0x55; 64])] {
        let copy =
            luks2::copy_recording_cluster_id(&selected.source, slot, seqid, &[0xc1; 32], salt)
                .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &copy, slot.offset()).unwrap();
    }
    drop(file);

    // cryptsetup reads the token and still opens the operator's keyslot.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["luksDump", "--dump-json-metadata", &disk_str])).unwrap();
    assert_eq!(json["tokens"]["0"]["type"], "hawser");
    assert_eq!(json["tokens"]["0"]["cluster_id"], "c1".repeat(32));
    ok(&[
        "open",
        "--test-passphrase",
        "--key-file",
        &passphrase,
        &disk_str,
    ]);

    // Another cryptsetup rewrite (a second keyslot) keeps the token and its cluster ID.
    let second = scratch.file("pass2", b"second passphrase");
    ok(&[
        "luksAddKey",
        "-q",
        "--key-file",
        &passphrase,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        &disk_str,
        &second,
    ]);
    let selected = read_headers(&disk, Integrity::None).unwrap();
    assert_eq!(selected.header.cluster_id, Some([0xc1; 32]));
    assert_eq!(selected.header.state, DiskState::Initialized);
    assert!(selected.header.digest.matches(&volume_key));
}
