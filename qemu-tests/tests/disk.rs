//! The encrypted state disk in the guest: PID 1 formats a blank disk, opens it on the next boot,
//! and refuses — naming the disk, writing nothing — every disk it must not touch.
//!
//! The image is built once and booted with QEMU's direct kernel boot (no firmware: the state
//! disk does not depend on it, and it saves ~15 s per boot). The state disk's key comes from
//! the development key source (`hawser.state_disk_key_source=fw_cfg-insecure-dev`): the key is
//! passed in fw_cfg, so the host side of each test knows it and can check the disk with
//! cryptsetup. The raw disks are files in the target directory.
//!
//! `#[ignore]`d like the other boot tests: `cargo test -p hawser-qemu --test disk -- --ignored
//! --test-threads=1`. `benchmark_open_and_throughput_against_cryptsetup` additionally runs
//! cryptsetup *inside* the guest (a throwaway initramfs made from the host's cryptsetup,
//! busybox and kmod; see docs/state-disk.md) and prints the numbers the documentation quotes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hawser_attestation::report::{BOOT_REPORT_MARKER, BootReport};
use hawser_harness::{Disk, TpmConfig, Vm, VmConfig};
use hawser_image::build::BuildOutput;
use hawser_image::test_support::require_tool;
use sha2::{Digest, Sha256};

mod common;
use common::build_image;
use common::toolbox::{Toolbox, kernel_modules_dir};

fn scratch(name: &str) -> PathBuf {
    common::fresh_scratch("e2e-disk", name)
}

const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
const SERIAL: &str = "hawser-state";
const DISK_MIB: u64 = 256;
/// The plaintext the marker file on the state filesystem always contains.
const MARKER_TEXT: &[u8] = b"\"formatted_by\":\"hawser ";

fn image() -> &'static BuildOutput {
    static IMAGE: OnceLock<BuildOutput> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(&scratch("image"), None))
}

fn volume_key(len: usize, seed: u8) -> Vec<u8> {
    let mut key = Vec::new();
    let mut block = Sha256::digest([seed]).to_vec();
    while key.len() < len {
        key.extend_from_slice(&block);
        block = Sha256::digest(&block).to_vec();
    }
    key.truncate(len);
    key
}

fn sparse_disk(path: &Path, mib: u64) {
    std::fs::File::create(path)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
}

fn sha256_file(path: &Path) -> String {
    let mut file = std::fs::File::open(path).unwrap();
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).unwrap();
    hex::encode(hasher.finalize())
}

fn contains(path: &Path, needle: &[u8]) -> bool {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    bytes.windows(needle.len()).any(|w| w == needle)
}

fn cryptsetup(args: &[&str]) -> (bool, String) {
    let out = Command::new(require_tool("cryptsetup", "cryptsetup-bin"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cryptsetup: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One boot of the image with the state disk configuration on the command line.
struct Boot<'a> {
    name: &'a str,
    disks: Vec<Disk>,
    key: Option<Vec<u8>>,
    cmdline: String,
    tpm_state: Option<PathBuf>,
}

impl<'a> Boot<'a> {
    fn new(name: &'a str, disk: &Path, key: &[u8]) -> Self {
        Boot {
            name,
            disks: vec![Disk {
                path: disk.to_owned(),
                serial: SERIAL.into(),
                read_only: false,
            }],
            key: Some(key.to_vec()),
            cmdline: format!(
                "console=ttyS0 quiet hawser.reboot_delay=0 hawser.state_disk=serial:{SERIAL} \
                 hawser.state_disk_key_source=fw_cfg-insecure-dev"
            ),
            tpm_state: None,
        }
    }

    fn cmdline(mut self, extra: &str) -> Self {
        self.cmdline.push(' ');
        self.cmdline.push_str(extra);
        self
    }

    fn start(self) -> Vm {
        let image = image();
        let mut config = VmConfig::direct_kernel(
            &image.kernel.path,
            Some(image.initrd.path.clone()),
            self.cmdline,
        )
        .name(self.name)
        .tpm(TpmConfig {
            state_dir: self.tpm_state,
            ..TpmConfig::default()
        });
        config.disks = self.disks;
        if let Some(key) = self.key {
            config = config.fw_cfg_string("state_disk_key", hex::encode(key));
        }
        Vm::start(config).expect("start VM")
    }
}

/// Waits for the boot report and returns it with the state disk line.
fn wait_for_state_disk(vm: &Vm, expected: &str) -> (String, BootReport) {
    let line = vm
        .wait_for_line(expected, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("no {expected:?}: {e}"));
    let report = vm
        .wait_for_marker("boot report", BOOT_REPORT_MARKER, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("no boot report: {e}"));
    let report = BootReport::find_in_console(&report)
        .expect("marker")
        .expect("valid report JSON");
    (line, report)
}

fn power_off(vm: &Vm) {
    vm.wait_for_line("boot complete", Duration::from_secs(60))
        .expect("PID 1 reaches idle");
    vm.powerdown().expect("ACPI power button");
    let status = vm
        .wait_for_exit(Duration::from_secs(60))
        .expect("QEMU exits after power-off");
    assert!(status.success(), "QEMU exit status {status}");
}

/// Waits for the FATAL line, checks that it names the disk and `reason`, and stops the VM.
fn expect_fatal(vm: &Vm, reason: &str) -> String {
    let line = vm
        .wait_for_line("FATAL", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("no FATAL line (expected {reason:?}): {e}"));
    assert!(line.contains(reason), "{reason:?} not in {line}");
    vm.kill();
    let console = vm.console_lines().join("\n");
    assert!(
        !console.contains("Kernel panic"),
        "kernel panic:\n{console}"
    );
    line
}

fn timings(report: &BootReport) -> String {
    report
        .timings
        .iter()
        .filter(|t| t.name.starts_with("state-disk"))
        .map(|t| format!("{} {:.1} ms", t.name, t.duration_ms))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rewrites the data segment cipher in both header copies and recomputes their checksums, as
/// anyone controlling the disk can (the LUKS2 header is not authenticated). Independent of
/// hawser's own LUKS2 code on purpose.
fn tamper_cipher(image: &Path, cipher: &str) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut area = vec![0u8; 2 * 16384];
    file.read_exact_at(&mut area, 0).unwrap();
    for copy in area.chunks_mut(16384) {
        let json_area = &copy[4096..];
        let end = json_area.iter().position(|&b| b == 0).unwrap();
        let mut json: serde_json::Value = serde_json::from_slice(&json_area[..end]).unwrap();
        json["segments"]["0"]["encryption"] = cipher.into();
        let text = serde_json::to_vec(&json).unwrap();
        copy[4096..].fill(0);
        copy[4096..4096 + text.len()].copy_from_slice(&text);
        copy[448..512].fill(0);
        let sum = Sha256::digest(&*copy);
        copy[448..480].copy_from_slice(&sum);
    }
    file.write_all_at(&area, 0).unwrap();
}

/// The lifecycle across boots of one node (same TPM state, same disk):
/// 1. a blank disk is formatted, gets ext4 and the marker file, the node powers off cleanly;
///    the host's cryptsetup accepts the header and the key, and the raw disk holds no
///    plaintext of the marker;
/// 2. the next boot opens it (no mkfs) and finds the marker: boot 2 of this disk;
/// 3. a boot with another key is refused through the LUKS2 digest, and the disk is untouched;
/// 4. a header rewritten to cipher_null (which cryptsetup itself would accept) is refused with
///    the cipher named, and the disk is untouched.
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn state_disk_is_formatted_once_then_opened_and_tampering_is_refused() {
    let dir = scratch("lifecycle");
    let disk = dir.join("state.img");
    sparse_disk(&disk, DISK_MIB);
    let tpm_state = dir.join("tpm");
    std::fs::create_dir_all(&tpm_state).unwrap();
    let key = volume_key(64, 1);

    // 1. First boot: format.
    let mut first = Boot::new("disk-first", &disk, &key);
    first.tpm_state = Some(tpm_state.clone());
    let vm = first.start();
    let warning = vm
        .wait_for_line("INSECURE", BOOT_TIMEOUT)
        .expect("the development key source is warned about");
    assert!(warning.contains("fw_cfg-insecure-dev"), "{warning}");
    let (line, report) = wait_for_state_disk(&vm, "boot 1 of this disk");
    assert!(line.contains("formatted LUKS2 volume"), "{line}");
    assert!(line.contains("the disk was blank"), "{line}");
    assert!(
        report.warnings.iter().any(|w| w.contains("INSECURE")),
        "the boot report carries the warning: {:?}",
        report.warnings
    );
    eprintln!("first boot: {}", timings(&report));
    power_off(&vm);
    drop(vm);
    let uuid = line
        .split("LUKS2 volume ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("UUID in the line")
        .to_owned();

    let disk_str = disk.to_string_lossy().into_owned();
    let (ok, dump) = cryptsetup(&["luksDump", &disk_str]);
    assert!(ok, "cryptsetup luksDump refuses hawser's header:\n{dump}");
    assert!(
        dump.contains(&uuid) && dump.contains("cipher: aes-xts-plain64"),
        "{dump}"
    );
    let key_file = dir.join("volume.key");
    std::fs::write(&key_file, &key).unwrap();
    let (ok, out) = cryptsetup(&[
        "open",
        "--test-passphrase",
        "--key-size",
        "512",
        "--volume-key-file",
        &key_file.to_string_lossy(),
        &disk_str,
    ]);
    assert!(ok, "cryptsetup does not accept the volume key: {out}");
    assert!(
        !contains(&disk, MARKER_TEXT),
        "the raw disk contains the marker file's plaintext"
    );
    assert!(
        !contains(&disk, b"lost+found"),
        "the raw disk contains ext4 directory plaintext"
    );

    // 2. Second boot of the same node: open.
    let mut second = Boot::new("disk-second", &disk, &key);
    second.tpm_state = Some(tpm_state.clone());
    let vm = second.start();
    let (line, report) = wait_for_state_disk(&vm, "boot 2 of this disk");
    assert!(
        line.contains(&format!("opened LUKS2 volume {uuid}")),
        "{line}"
    );
    let console = vm.console_lines().join("\n");
    assert!(!console.contains("formatting the state disk"), "{console}");
    eprintln!("second boot (open): {}", timings(&report));
    power_off(&vm);
    drop(vm);

    // 3. Wrong key: refused, disk untouched.
    let before = sha256_file(&disk);
    let vm = Boot::new("disk-wrong-key", &disk, &volume_key(64, 2)).start();
    expect_fatal(
        &vm,
        &format!("the key does not open LUKS2 volume {uuid}: its digest does not match"),
    );
    drop(vm);
    assert_eq!(sha256_file(&disk), before, "a wrong key changed the disk");

    // 4. Tampered header: cipher_null with valid checksums.
    tamper_cipher(&disk, "cipher_null-ecb");
    let (ok, dump) = cryptsetup(&["luksDump", &disk_str]);
    assert!(
        ok && dump.contains("cipher: cipher_null-ecb"),
        "cryptsetup itself accepts the tampered header (CVE-2025-59054):\n{dump}"
    );
    let before = sha256_file(&disk);
    let vm = Boot::new("disk-tampered", &disk, &key).start();
    let line = expect_fatal(&vm, "data segment cipher \"cipher_null-ecb\"");
    assert!(
        line.contains("/dev/vd") && line.contains(SERIAL),
        "names the disk: {line}"
    );
    drop(vm);
    assert_eq!(
        sha256_file(&disk),
        before,
        "a refused header changed the disk"
    );
}

/// A power cut during the first format: QEMU is killed while PID 1 wipes a disk for
/// dm-integrity (seconds under TCG, so the cut reliably lands inside the format, after the
/// "formatting" header and before the "initialized" mark). The header is hawser's and not
/// initialized, and the next boot formats the disk again instead of opening or refusing it.
/// (Cuts at every sector of the header writes are unit-tested in `lifecycle`.)
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn a_power_cut_during_the_first_format_leaves_the_disk_to_be_formatted_again() {
    let dir = scratch("power-cut");
    let disk = dir.join("state.img");
    sparse_disk(&disk, 128);
    let key = volume_key(96, 3);
    let integrity = "hawser.state_disk_integrity=hmac-sha256";

    let vm = Boot::new("disk-cut", &disk, &key)
        .cmdline(integrity)
        .start();
    vm.wait_for_line("formatting the state disk", BOOT_TIMEOUT)
        .expect("PID 1 starts formatting");
    std::thread::sleep(Duration::from_secs(2));
    vm.kill();
    let console = vm.console_lines().join("\n");
    assert!(
        !console.contains("boot 1 of this disk"),
        "the format finished before the cut; the test proves nothing:\n{console}"
    );
    drop(vm);
    let (ok, dump) = cryptsetup(&["luksDump", &disk.to_string_lossy()]);
    assert!(ok, "the cut left no valid header:\n{dump}");
    assert!(
        dump.contains("Subsystem:     \thawser") && !dump.contains("0: hawser"),
        "expected hawser's header without the initialized token:\n{dump}"
    );

    let vm = Boot::new("disk-after-cut", &disk, &key)
        .cmdline(integrity)
        .start();
    let (line, _) = wait_for_state_disk(&vm, "boot 1 of this disk");
    assert!(
        line.contains("the disk was formatted by hawser but never initialized"),
        "{line}"
    );
    power_off(&vm);
}

/// Disks hawser must not touch, each a fatal error naming the disk, each left byte-identical:
/// another filesystem, another LUKS volume, a disk too small, a read-only disk; and a missing
/// disk names the serial and the disks present.
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn disks_that_are_not_hawsers_are_refused_and_left_untouched() {
    let dir = scratch("bad-input");
    let key = volume_key(64, 4);

    let ext4 = dir.join("ext4.img");
    sparse_disk(&ext4, 128);
    let status = Command::new(require_tool("mkfs.ext4", "e2fsprogs"))
        .args(["-q", "-F"])
        .arg(&ext4)
        .status()
        .expect("run mkfs.ext4");
    assert!(status.success());

    let luks = dir.join("luks.img");
    sparse_disk(&luks, 128);
    let key_file = dir.join("other.key");
    std::fs::write(&key_file, volume_key(64, 5)).unwrap();
    let pass = dir.join("pass");
    std::fs::write(&pass, "passphrase").unwrap();
    let (ok, out) = cryptsetup(&[
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--volume-key-file",
        &key_file.to_string_lossy(),
        "--key-file",
        &pass.to_string_lossy(),
        &luks.to_string_lossy(),
    ]);
    assert!(ok, "{out}");

    let small = dir.join("small.img");
    sparse_disk(&small, 32);
    let blank = dir.join("blank.img");
    sparse_disk(&blank, 128);

    let cases: [(&str, &Path, bool, &str); 4] = [
        (
            "disk-ext4",
            &ext4,
            false,
            "holds an ext2/ext3/ext4 filesystem",
        ),
        (
            "disk-luks",
            &luks,
            false,
            "holds a LUKS2 volume that hawser did not create",
        ),
        (
            "disk-small",
            &small,
            false,
            "has 33554432 bytes; the state disk needs at least",
        ),
        ("disk-ro", &blank, true, "is read-only"),
    ];
    for (name, path, read_only, reason) in cases {
        let before = sha256_file(path);
        let mut boot = Boot::new(name, path, &key);
        boot.disks[0].read_only = read_only;
        let vm = boot.start();
        let line = expect_fatal(&vm, reason);
        assert!(
            line.contains(&format!("(serial \"{SERIAL}\")")),
            "the error names the disk: {line}"
        );
        drop(vm);
        assert_eq!(sha256_file(path), before, "{name}: the disk changed");
    }

    let mut boot = Boot::new("disk-missing", &blank, &key);
    boot.disks[0].serial = "some-other-disk".into();
    let vm = boot.start();
    expect_fatal(
        &vm,
        "no state disk with serial \"hawser-state\" appeared within 10 s; disks present: vda (serial \"some-other-disk\")",
    );
}

/// dm-integrity (HMAC-SHA256, a measured option): the first boot wipes the disk so every
/// sector has a valid tag, the second boot opens it; the boot reports give the wipe's cost.
#[test]
#[ignore = "boots QEMU; run by scripts/test"]
fn integrity_mode_formats_wipes_and_reopens() {
    let dir = scratch("integrity");
    let disk = dir.join("state.img");
    sparse_disk(&disk, 128);
    let key = volume_key(96, 6);
    let integrity = "hawser.state_disk_integrity=hmac-sha256";

    let vm = Boot::new("disk-integrity-1", &disk, &key)
        .cmdline(integrity)
        .start();
    let (line, report) = wait_for_state_disk(&vm, "boot 1 of this disk");
    assert!(line.contains("hmac-sha256 integrity"), "{line}");
    assert!(line.contains("wiped"), "{line}");
    let wipe = report
        .timings
        .iter()
        .find(|t| t.name == "state-disk-wipe")
        .expect("a wipe timing");
    let wiped_mib: f64 = line
        .split("wiped ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|mib| mib.parse().ok())
        .expect("the wiped size in the line");
    eprintln!(
        "integrity first boot: {} (wipe: {wiped_mib} MiB at {:.1} MiB/s)",
        timings(&report),
        wiped_mib / (wipe.duration_ms / 1000.0)
    );
    power_off(&vm);
    drop(vm);

    let (ok, dump) = cryptsetup(&["luksDump", &disk.to_string_lossy()]);
    assert!(ok && dump.contains("integrity: hmac(sha256)"), "{dump}");
    assert!(!contains(&disk, MARKER_TEXT));

    let vm = Boot::new("disk-integrity-2", &disk, &key)
        .cmdline(integrity)
        .start();
    let (line, report) = wait_for_state_disk(&vm, "boot 2 of this disk");
    assert!(line.contains("opened LUKS2 volume"), "{line}");
    eprintln!("integrity second boot (open): {}", timings(&report));
    power_off(&vm);
    drop(vm);

    // The measured mode must match the disk: without the option, the disk is refused.
    let vm = Boot::new("disk-integrity-3", &disk, &key).start();
    expect_fatal(&vm, "has data integrity \"hmac(sha256)\"");
}

/// The throwaway benchmark initramfs ([`common::toolbox`]): hawser's initramfs (for the kernel
/// modules) followed by the host's cryptsetup, coreutils `dd`/`date` and a static busybox, the
/// image's modules, and `/bench-init`, started with `rdinit=/bench-init`. Never part of the
/// product image.
fn bench_initrd(dir: &Path, script: &str) -> PathBuf {
    let image = image();
    let mut toolbox = Toolbox::new();
    toolbox
        .program("/usr/sbin/cryptsetup", "cryptsetup-bin")
        .program("/usr/bin/dd", "coreutils")
        .program("/usr/bin/date", "coreutils")
        .modules(&kernel_modules_dir(&image.kernel_release), &image.modules);
    toolbox.write(
        &image.initrd.path,
        "bench-init",
        script,
        &dir.join("bench-initrd"),
    )
}

const BENCH_SCRIPT: &str = r#"
$B mkdir -p /run/cryptsetup /mnt
disk() { for d in /sys/block/vd*; do [ "$($B cat $d/serial 2>/dev/null)" = "$1" ] && echo /dev/${d##*/}; done; }
while [ -z "$(disk raw)" ]; do $B sleep 0.1; done
PLAIN=$(disk plain); INTEG=$(disk integ); RAW=$(disk raw)
ms() { echo $(( $(/usr/bin/date +%s%N) / 1000000 )); }
timed() { label=$1; shift; t0=$(ms); "$@" > /run/out 2>&1; rc=$?; t1=$(ms); echo "BENCH $label ms=$((t1 - t0)) rc=$rc"; $B sed 's/^/BENCH   /' /run/out; }
rw() { # label device
  /usr/bin/dd if=/dev/zero of=$2 bs=1M count=64 oflag=direct 2>&1 | $B grep copied | $B sed "s/^/BENCH $1 write: /"
  /usr/bin/dd if=$2 of=/dev/null bs=1M count=64 iflag=direct 2>&1 | $B grep copied | $B sed "s/^/BENCH $1 read: /"
}
CS=/usr/sbin/cryptsetup
echo -n bench-passphrase > /run/pass

# Compatibility: cryptsetup opens hawser's disks with the volume key and reads hawser's files.
timed open-volume-key $CS open --key-size 512 --volume-key-file /bench/plain.key $PLAIN compat
$CS status compat | $B sed 's/^/BENCH status /'
$B mount -t ext4 -o ro /dev/mapper/compat /mnt && echo "BENCH marker $($B cat /mnt/hawser/state-disk.json)"
$B umount /mnt; $CS close compat
timed open-integrity $CS open --key-size 768 --volume-key-file /bench/integ.key $INTEG integ
$CS status integ | $B sed 's/^/BENCH integ-status /'
$B mount -t ext4 -o ro /dev/mapper/integ /mnt && echo "BENCH integ-marker $($B cat /mnt/hawser/state-disk.json)"
$B umount /mnt

# A default LUKS2 keyslot (argon2id, benchmarked here, in the guest) and its unlock time.
timed add-argon2id-keyslot $CS luksAddKey --key-size 512 --volume-key-file /bench/plain.key $PLAIN /run/pass
$CS luksDump $PLAIN | $B grep -E 'PBKDF|Time cost|Memory|Threads' | $B sed 's/^/BENCH keyslot /'
timed open-argon2id $CS open --key-file /run/pass $PLAIN bench
$CS close bench
timed open-volume-key-again $CS open --key-size 512 --volume-key-file /bench/plain.key $PLAIN bench

# Throughput, 64 MiB with O_DIRECT: raw disk, dm-crypt, dm-crypt on dm-integrity.
rw raw $RAW
rw dm-crypt /dev/mapper/bench
rw dm-crypt+integrity /dev/mapper/integ
echo BENCH-DONE
$B sync
$B poweroff -f
"#;

/// Numbers for docs/state-disk.md: hawser's open time (from its boot report) against
/// `cryptsetup open` with a default argon2id keyslot on the same disk, in the same guest; and
/// dd throughput of the raw disk, the dm-crypt mapping and dm-crypt on dm-integrity. Also shows
/// that cryptsetup opens both kinds of hawser disk with the volume key and reads hawser's
/// marker file. Prints `BENCH` lines; run explicitly:
/// `cargo test -p hawser-qemu --test disk -- --ignored --nocapture benchmark`.
#[test]
#[ignore = "benchmark: boots QEMU three times; run explicitly"]
fn benchmark_open_and_throughput_against_cryptsetup() {
    let dir = scratch("bench");
    let plain = dir.join("plain.img");
    sparse_disk(&plain, DISK_MIB);
    let integ = dir.join("integ.img");
    sparse_disk(&integ, 160);
    let raw = dir.join("raw.img");
    sparse_disk(&raw, DISK_MIB);
    let plain_key = volume_key(64, 7);
    let integ_key = volume_key(96, 8);

    let mut hawser_open = Vec::new();
    let mut uuids = Vec::new();
    for (disk, key, extra) in [
        (&plain, &plain_key, ""),
        (
            &integ,
            &integ_key,
            "hawser.state_disk_integrity=hmac-sha256",
        ),
    ] {
        for boot in 1..=2 {
            let vm = Boot::new("disk-bench", disk, key).cmdline(extra).start();
            let (line, report) = wait_for_state_disk(&vm, &format!("boot {boot} of this disk"));
            eprintln!("BENCH hawser {extra} boot {boot}: {}", timings(&report));
            if boot == 2 {
                hawser_open.push(timings(&report));
                uuids.push(
                    line.split("LUKS2 volume ")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .unwrap()
                        .to_owned(),
                );
            }
            power_off(&vm);
        }
    }

    let initrd = bench_initrd(&dir, BENCH_SCRIPT);
    let image = image();
    // The keys travel in the bench initramfs: it is a throwaway test artifact.
    let mut archive = hawser_image::cpio::CpioArchive::new();
    archive
        .add_file("bench/plain.key", 0o600, plain_key.clone())
        .unwrap();
    archive
        .add_file("bench/integ.key", 0o600, integ_key.clone())
        .unwrap();
    let mut bytes = std::fs::read(&initrd).unwrap();
    bytes.resize(bytes.len().next_multiple_of(512), 0);
    bytes.extend(archive.to_bytes(0).unwrap());
    std::fs::write(&initrd, bytes).unwrap();

    let mut config = VmConfig::direct_kernel(
        &image.kernel.path,
        Some(initrd),
        "console=ttyS0 quiet rdinit=/bench-init",
    )
    .name("disk-bench-cryptsetup");
    for (path, serial) in [(&plain, "plain"), (&integ, "integ"), (&raw, "raw")] {
        config = config.disk(path, serial);
    }
    let vm = Vm::start(config).expect("start the benchmark VM");
    vm.wait_for_line("BENCH-DONE", Duration::from_secs(900))
        .expect("the benchmark finishes");
    let console = vm.console_lines();
    let bench: Vec<&String> = console.iter().filter(|l| l.contains("BENCH")).collect();
    for line in &bench {
        eprintln!("{line}");
    }
    eprintln!("BENCH hawser open (plain): {}", hawser_open[0]);
    eprintln!("BENCH hawser open (integrity): {}", hawser_open[1]);
    let text = console.join("\n");
    assert!(
        text.contains("BENCH open-volume-key ms=") && text.contains("rc=0"),
        "cryptsetup could not open hawser's disk:\n{text}"
    );
    let marker = bench
        .iter()
        .find(|l| l.contains("BENCH marker"))
        .expect("marker read");
    assert!(marker.contains(&uuids[0]), "{marker}");
    let marker = bench
        .iter()
        .find(|l| l.contains("BENCH integ-marker"))
        .expect("integrity marker read");
    assert!(marker.contains(&uuids[1]), "{marker}");
}

/// The first-boot cost of integrity, side by side on the same disk size as the node tests and
/// `hawser local up` (256 MiB) in one run: a plain (AES-XTS) and an `hmac-sha256` first boot,
/// each from VM start to the boot report, with hawser's own `state-disk-*` phases from the boot
/// report (the wipe is `state-disk-wipe`). The numbers behind the production/development choice
/// in docs/benchmarks.md and docs/security.md. Prints `BENCH` lines; run explicitly:
/// `cargo test -p hawser-qemu --test disk -- --ignored --nocapture benchmark_first_boot`.
#[test]
#[ignore = "benchmark: boots QEMU twice; run explicitly"]
fn benchmark_first_boot_with_and_without_integrity() {
    let dir = scratch("bench-first-boot");
    image();
    let mut rows = Vec::new();
    for (mode, key_len, extra) in [
        ("aes-xts (development)", 64, ""),
        (
            "hmac-sha256 (production)",
            96,
            "hawser.state_disk_integrity=hmac-sha256",
        ),
    ] {
        let disk = dir.join(format!("state-{key_len}.img"));
        sparse_disk(&disk, DISK_MIB);
        let started = std::time::Instant::now();
        let vm = Boot::new("disk-first-boot", &disk, &volume_key(key_len, 9))
            .cmdline(extra)
            .start();
        let (line, report) = wait_for_state_disk(&vm, "boot 1 of this disk");
        let total = started.elapsed();
        let state_disk_ms: f64 = report
            .timings
            .iter()
            .filter(|t| t.name.starts_with("state-disk"))
            .map(|t| t.duration_ms)
            .sum();
        let row = format!(
            "BENCH first boot, {DISK_MIB} MiB disk, {mode}: VM start to boot report {:.1} s, \
             state disk {:.1} s ({})",
            total.as_secs_f64(),
            state_disk_ms / 1000.0,
            timings(&report)
        );
        eprintln!("{row}\nBENCH   {line}");
        rows.push(row);
        power_off(&vm);
    }
    for row in &rows {
        eprintln!("{row}");
    }
}
