//! UKI assembly checked from the outside: binutils' `objdump` reads the result, the layout is
//! recomputed from ukify 257's rules (see `hawser_image::uki`'s module docs), and the bytes are
//! compared with the output of ukify 257 itself: the pinned `systemd-ukify` input of the same
//! systemd as the stub, run with the host's `/usr/bin/python3` (`HAWSER_UKIFY=/path/to/ukify`
//! runs another one instead).
//!
//! Tests that need the pinned trixie inputs (systemd-stub 257, the 6.12 kernel, ukify 257) look
//! for them in the input cache (`$HAWSER_CACHE/inputs`, default `~/.cache/hawser/inputs`, filled
//! by `hawser image fetch`); they say so and return when the inputs are absent, and
//! `HAWSER_REQUIRE_INPUTS=1` turns that into a failure (`hawser_image::test_support`). The
//! synthetic-stub tests always run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_image::test_support;
use hawser_image::uki::{
    Image, UkiError, UkiSections, assemble_uki, pe_checksum, read_uki_sections,
};
use hawser_pe::PeError;

// ---------------------------------------------------------------------------------------------
// Inputs

fn find_input(package_prefix: &str, relative: &str) -> Option<PathBuf> {
    let inputs = hawser_image::inputs::cache_dir().join("inputs");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&inputs)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(package_prefix))
        })
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| d.join(relative))
        .find(|p| p.is_file())
}

fn require(what: &str, path: Option<PathBuf>) -> Option<Vec<u8>> {
    match path {
        Some(p) => {
            Some(std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())))
        }
        None => {
            test_support::missing_input(what);
            None
        }
    }
}

fn real_stub() -> Option<Vec<u8>> {
    require(
        "systemd-stub (systemd-boot-efi)",
        find_input(
            "systemd-boot-efi_",
            "usr/lib/systemd/boot/efi/linuxx64.efi.stub",
        ),
    )
}

fn real_kernel() -> Option<(Vec<u8>, String)> {
    let inputs = hawser_image::inputs::cache_dir().join("inputs");
    let found = std::fs::read_dir(inputs).ok().and_then(|rd| {
        let mut kernels: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path().join("boot")))
            .filter_map(|boot| std::fs::read_dir(boot).ok())
            .flat_map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("vmlinuz-"))
            })
            .collect();
        kernels.sort();
        kernels.into_iter().next()
    });
    let path = found.clone();
    let bytes = require("the trixie kernel (linux-image-*)", found)?;
    let release = path?
        .file_name()?
        .to_str()?
        .trim_start_matches("vmlinuz-")
        .to_owned();
    Some((bytes, release))
}

fn small_sections() -> UkiSections {
    UkiSections {
        osrel: b"ID=hawser\nNAME=\"hawser\"\nVERSION_ID=0.1\n".to_vec(),
        cmdline: b"console=ttyS0 hawser.log=debug".to_vec(),
        uname: b"6.12.117+deb13-cloud-amd64".to_vec(),
        // Not a PE: assembly must still lay it out (ukify does, with a warning).
        linux: (0..5000u32).map(|i| (i * 7 % 251) as u8).collect(),
        initrd: (0..3001u32).map(|i| (i * 13 % 253) as u8).collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Reading PE headers independently of the code under test: objdump, and a few raw fields.

#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjdumpSection {
    name: String,
    size: u64,
    vma: u64,
    file_offset: u64,
}

fn objdump(args: &[&str], bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("image.efi");
    std::fs::write(&path, bytes).expect("write image");
    let out = Command::new(test_support::require_tool("objdump", "binutils"))
        .args(args)
        .arg(&path)
        .output()
        .expect("objdump (binutils) must be installed");
    assert!(
        out.status.success(),
        "objdump {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("objdump prints UTF-8")
}

fn objdump_sections(bytes: &[u8]) -> Vec<ObjdumpSection> {
    let text = objdump(&["-h"], bytes);
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // "  6 .osrel  00000018  000000014dfab000  000000014dfab000  00016800  2**2"
            if f.len() != 7 || f[0].parse::<u32>().is_err() {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s, 16).expect("objdump hex field");
            Some(ObjdumpSection {
                name: f[1].to_owned(),
                size: hex(f[2]),
                vma: hex(f[3]),
                file_offset: hex(f[5]),
            })
        })
        .collect()
}

/// A field of `objdump -x`'s optional-header dump, e.g. "SizeOfImage".
fn objdump_field(bytes: &[u8], field: &str) -> u64 {
    let text = objdump(&["-x"], bytes);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(field))
        .unwrap_or_else(|| panic!("objdump -x prints no {field}"));
    let value = line.split_whitespace().nth(1).expect("a value");
    u64::from_str_radix(value, 16).unwrap_or_else(|_| panic!("{field} is not hex: {value}"))
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
/// File offset of the optional header.
fn opt_offset(b: &[u8]) -> usize {
    u32_at(b, 0x3c) as usize + 24
}
fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

// ---------------------------------------------------------------------------------------------
// A synthetic PE32+ x86_64 stub, so that layout and error paths are tested without the inputs.

struct SyntheticSection {
    name: &'static str,
    virtual_address: u32,
    data: Vec<u8>,
}

/// Builds a PE32+ x86_64 EFI application: e_lfanew 0x80, 16 data directories, FileAlignment
/// 0x200, SectionAlignment 0x1000, the given SizeOfHeaders, sections laid out back to back.
fn synthetic_stub(size_of_headers: u32, sections: &[SyntheticSection]) -> Vec<u8> {
    let pe = 0x80usize;
    let opt = pe + 24;
    let table = opt + 240;
    let mut b = vec![0u8; size_of_headers as usize];
    b[0..2].copy_from_slice(b"MZ");
    b[0x3c..0x40].copy_from_slice(&(pe as u32).to_le_bytes());
    b[pe..pe + 4].copy_from_slice(b"PE\0\0");
    b[pe + 4..pe + 6].copy_from_slice(&0x8664u16.to_le_bytes());
    b[pe + 6..pe + 8].copy_from_slice(&(sections.len() as u16).to_le_bytes());
    b[pe + 20..pe + 22].copy_from_slice(&240u16.to_le_bytes());
    b[pe + 22..pe + 24].copy_from_slice(&0x0206u16.to_le_bytes());
    b[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes());
    b[opt + 8..opt + 12].copy_from_slice(&0x1000u32.to_le_bytes()); // SizeOfInitializedData
    b[opt + 16..opt + 20].copy_from_slice(&0x1000u32.to_le_bytes()); // AddressOfEntryPoint
    b[opt + 24..opt + 32].copy_from_slice(&0x1_4000_0000u64.to_le_bytes()); // ImageBase
    b[opt + 32..opt + 36].copy_from_slice(&0x1000u32.to_le_bytes());
    b[opt + 36..opt + 40].copy_from_slice(&0x200u32.to_le_bytes());
    b[opt + 60..opt + 64].copy_from_slice(&size_of_headers.to_le_bytes());
    b[opt + 68..opt + 70].copy_from_slice(&10u16.to_le_bytes()); // EFI application
    b[opt + 70..opt + 72].copy_from_slice(&0x0160u16.to_le_bytes()); // NX_COMPAT etc.
    b[opt + 108..opt + 112].copy_from_slice(&16u32.to_le_bytes());
    let mut end_va = 0;
    for (i, s) in sections.iter().enumerate() {
        let raw_size = round_up(s.data.len() as u64, 0x200) as u32;
        let pointer = b.len() as u32;
        let h = table + i * 40;
        b[h..h + s.name.len()].copy_from_slice(s.name.as_bytes());
        b[h + 8..h + 12].copy_from_slice(&(s.data.len() as u32).to_le_bytes());
        b[h + 12..h + 16].copy_from_slice(&s.virtual_address.to_le_bytes());
        b[h + 16..h + 20].copy_from_slice(&raw_size.to_le_bytes());
        b[h + 20..h + 24].copy_from_slice(&pointer.to_le_bytes());
        b[h + 36..h + 40].copy_from_slice(&0x4000_0040u32.to_le_bytes());
        b.extend_from_slice(&s.data);
        b.resize(pointer as usize + raw_size as usize, 0);
        end_va = s.virtual_address + s.data.len() as u32;
    }
    let size_of_image = round_up(u64::from(end_va), 0x1000) as u32;
    b[opt + 56..opt + 60].copy_from_slice(&size_of_image.to_le_bytes());
    b
}

const STUB_SBAT: &str = "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
systemd-stub,1,The systemd Developers,systemd,257,https://systemd.io/\n";

fn default_synthetic_stub() -> Vec<u8> {
    synthetic_stub(
        0x400,
        &[
            SyntheticSection {
                name: ".text",
                virtual_address: 0x1000,
                data: vec![0xc3; 0x30],
            },
            SyntheticSection {
                name: ".sbat",
                virtual_address: 0x2000,
                data: STUB_SBAT.as_bytes().to_vec(),
            },
        ],
    )
}

/// The ukify 257 layout rules, recomputed from the stub's objdump view: each appended section
/// at the next SectionAlignment boundary after the previous one's end, its data at the file's
/// end rounded to FileAlignment.
fn expected_layout(stub: &[u8], sections: &UkiSections) -> Vec<ObjdumpSection> {
    let section_alignment = objdump_field(stub, "SectionAlignment");
    let file_alignment = objdump_field(stub, "FileAlignment");
    let stub_sections = objdump_sections(stub);
    let last = stub_sections.last().expect("the stub has sections");
    let mut next_vma = round_up(last.vma + last.size, section_alignment);
    let mut file_end = stub.len() as u64;
    let mut out = stub_sections.clone();
    for (name, data) in [
        (".osrel", &sections.osrel),
        (".cmdline", &sections.cmdline),
        (".uname", &sections.uname),
        (".linux", &sections.linux),
        (".initrd", &sections.initrd),
    ] {
        if data.is_empty() {
            continue;
        }
        let file_offset = round_up(file_end, file_alignment);
        out.push(ObjdumpSection {
            name: name.to_owned(),
            size: data.len() as u64,
            vma: next_vma,
            file_offset,
        });
        file_end = file_offset + round_up(data.len() as u64, file_alignment);
        next_vma = round_up(next_vma + data.len() as u64, section_alignment);
    }
    out
}

/// The merged SBAT ukify writes for a stub SBAT and a kernel without one.
fn expected_sbat(stub_sbat: &str) -> Vec<u8> {
    let mut lines: Vec<&str> = stub_sbat.trim_end_matches('\0').lines().skip(1).collect();
    lines.push("uki,1,UKI,uki,1,https://uapi-group.org/specifications/specs/unified_kernel_image/");
    format!(
        "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n{}\n\0",
        lines.join("\n")
    )
    .into_bytes()
}

fn check_against_objdump(stub: &[u8], sections: &UkiSections, uki: &[u8]) {
    let got = objdump_sections(uki);
    let mut want = expected_layout(stub, sections);
    // .sbat keeps its place and file offset; only its size changes (ukify swaps its data).
    let sbat = read_uki_sections(uki)
        .unwrap()
        .into_iter()
        .find(|s| s.name == ".sbat")
        .expect("the UKI keeps the stub's .sbat");
    for w in want.iter_mut().filter(|w| w.name == ".sbat") {
        w.size = u64::from(sbat.virtual_size);
    }
    assert_eq!(
        got, want,
        "objdump -h of the UKI differs from ukify's layout rules"
    );

    let last = want.last().unwrap();
    let image_base = objdump_field(uki, "ImageBase");
    let section_alignment = objdump_field(uki, "SectionAlignment");
    assert_eq!(
        objdump_field(uki, "SizeOfImage"),
        round_up(last.vma - image_base + last.size, section_alignment),
        "SizeOfImage must end at the last section, aligned"
    );
    let added: u64 = [
        &sections.osrel,
        &sections.cmdline,
        &sections.uname,
        &sections.linux,
        &sections.initrd,
    ]
    .iter()
    .map(|d| d.len() as u64)
    .sum();
    assert_eq!(
        objdump_field(uki, "SizeOfInitializedData"),
        objdump_field(stub, "SizeOfInitializedData") + added,
        "SizeOfInitializedData grows by the added sections' sizes (ukify)"
    );
    assert_eq!(
        objdump_field(uki, "SizeOfCode"),
        objdump_field(stub, "SizeOfCode")
    );
    assert_eq!(
        objdump_field(uki, "CheckSum"),
        u64::from(pe_checksum(uki).unwrap()),
        "the CheckSum field holds the PE checksum"
    );

    // read_uki_sections round-trips: same names, addresses, sizes, and the exact input bytes.
    let read = read_uki_sections(uki).expect("read back the UKI");
    assert_eq!(read.len(), got.len());
    for (r, o) in read.iter().zip(&got) {
        assert_eq!(r.name, o.name);
        assert_eq!(
            u64::from(r.virtual_address) + image_base,
            o.vma,
            "{}",
            r.name
        );
        assert_eq!(u64::from(r.virtual_size), o.size, "{}", r.name);
        assert_eq!(u64::from(r.file_offset), o.file_offset, "{}", r.name);
    }
    let by_name = |n: &str| read.iter().find(|s| s.name == n).map(|s| s.data.clone());
    assert_eq!(by_name(".osrel").unwrap_or_default(), sections.osrel);
    assert_eq!(by_name(".cmdline").unwrap_or_default(), sections.cmdline);
    assert_eq!(by_name(".uname").unwrap_or_default(), sections.uname);
    assert_eq!(by_name(".linux").unwrap_or_default(), sections.linux);
    assert_eq!(by_name(".initrd").unwrap_or_default(), sections.initrd);
    for s in &read {
        let want = match s.name.as_str() {
            ".linux" => 0x4000_0020,
            ".osrel" | ".cmdline" | ".uname" | ".initrd" => 0x4000_0040,
            _ => continue,
        };
        assert_eq!(s.characteristics, want, "{} flags", s.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Tests with the real systemd-stub 257

#[test]
fn real_stub_layout_matches_objdump_and_ukify_rules() {
    let Some(stub) = real_stub() else { return };
    let sections = small_sections();
    let uki = assemble_uki(&stub, &sections).expect("assemble with the real stub");
    check_against_objdump(&stub, &sections, &uki);

    // The stub's .sbat becomes ukify's merge: the stub's entries plus the `uki` generation line.
    let stub_sbat = read_uki_sections(&stub)
        .unwrap()
        .into_iter()
        .find(|s| s.name == ".sbat")
        .unwrap();
    let uki_sbat = read_uki_sections(&uki)
        .unwrap()
        .into_iter()
        .find(|s| s.name == ".sbat")
        .unwrap();
    assert_eq!(
        uki_sbat.data,
        expected_sbat(std::str::from_utf8(&stub_sbat.data).unwrap())
    );
    assert_eq!(uki_sbat.virtual_address, stub_sbat.virtual_address);

    // The stub's own sections and code are untouched.
    for (a, b) in read_uki_sections(&stub)
        .unwrap()
        .iter()
        .zip(read_uki_sections(&uki).unwrap())
    {
        if a.name != ".sbat" {
            assert_eq!(a, &b, "stub section {} changed", a.name);
        }
    }
}

#[test]
fn real_stub_with_real_kernel_keeps_nx_compat_and_sections_fit() {
    let Some(stub) = real_stub() else { return };
    let Some((kernel, release)) = real_kernel() else {
        return;
    };
    let sections = UkiSections {
        linux: kernel,
        uname: release.into_bytes(),
        ..small_sections()
    };
    let uki = assemble_uki(&stub, &sections).unwrap();
    check_against_objdump(&stub, &sections, &uki);
    // Debian's kernel is NX_COMPAT, so the UKI keeps the stub's DllCharacteristics (0x160).
    assert_eq!(
        objdump_field(&uki, "DllCharacteristics"),
        objdump_field(&stub, "DllCharacteristics")
    );
}

#[test]
fn assembly_is_deterministic() {
    let Some(stub) = real_stub() else { return };
    let a = assemble_uki(&stub, &small_sections()).unwrap();
    let b = assemble_uki(&stub, &small_sections()).unwrap();
    assert_eq!(a, b);
    let mut other = small_sections();
    other.cmdline = b"console=ttyS0 hawser.log=info".to_vec();
    assert_ne!(
        assemble_uki(&stub, &other).unwrap(),
        a,
        "the cmdline must reach the image"
    );
}

#[test]
fn pe_checksum_matches_the_debian_kernels_checksum_field() {
    // An independent check of the checksum algorithm: Debian's signed vmlinuz carries a
    // correct CheckSum written by its own toolchain.
    let Some((kernel, _)) = real_kernel() else {
        return;
    };
    let field = u32_at(&kernel, opt_offset(&kernel) + 64);
    assert_ne!(field, 0);
    assert_eq!(pe_checksum(&kernel).unwrap(), field);
}

/// The command that runs ukify: `HAWSER_UKIFY` as it is, else the pinned ukify 257 from the
/// input cache under Debian's `/usr/bin/python3` (a `python3` found first on PATH, such as a
/// pyenv one, lacks the pefile and zstandard modules that python3-pefile and python3-zstandard
/// give Debian's).
fn ukify() -> Option<Command> {
    if let Some(p) = std::env::var_os("HAWSER_UKIFY") {
        return Some(Command::new(p));
    }
    let script = find_input("systemd-ukify_", hawser_image::inputs::UKIFY);
    if script.is_some() && !Path::new("/usr/bin/python3").is_file() {
        test_support::missing(
            "/usr/bin/python3 (ukify runs on it)",
            &test_support::install("python3 python3-pefile python3-zstandard"),
        );
        return None;
    }
    require("ukify 257 (systemd-ukify)", script.clone())?;
    let mut command = Command::new("/usr/bin/python3");
    command.arg(script?);
    Some(command)
}

fn run_ukify(mut ukify: Command, stub: &[u8], sections: &UkiSections) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, data: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    let stub_path = file("stub.efi", stub);
    let linux = file("vmlinuz", &sections.linux);
    let initrd = file("initrd", &sections.initrd);
    let cmdline = file("cmdline", &sections.cmdline);
    let osrel = file("os-release", &sections.osrel);
    let out = dir.path().join("uki.efi");
    let status = ukify
        .arg("build")
        .arg("--stub")
        .arg(&stub_path)
        .arg("--linux")
        .arg(&linux)
        .arg("--initrd")
        .arg(&initrd)
        .arg(format!("--cmdline=@{}", cmdline.display()))
        .arg(format!("--os-release=@{}", osrel.display()))
        .arg(format!(
            "--uname={}",
            std::str::from_utf8(&sections.uname).unwrap()
        ))
        .arg("--output")
        .arg(&out)
        .output()
        .expect("run ukify");
    assert!(
        status.status.success(),
        "ukify failed (a missing Python module? python3-pefile and python3-zstandard): {}",
        String::from_utf8_lossy(&status.stderr)
    );
    std::fs::read(out).unwrap()
}

#[test]
fn same_bytes_as_ukify_except_checksum() {
    let Some(stub) = real_stub() else { return };
    let mut cases = vec![small_sections()];
    if let Some((kernel, release)) = real_kernel() {
        cases.push(UkiSections {
            linux: kernel,
            uname: release.into_bytes(),
            ..small_sections()
        });
    }
    for sections in cases {
        let Some(ukify) = ukify() else { return };
        let ours = assemble_uki(&stub, &sections).unwrap();
        let mut theirs = run_ukify(ukify, &stub, &sections);
        let checksum = opt_offset(&ours) + 64;
        assert_eq!(u32_at(&theirs, checksum), 0, "ukify 257 writes CheckSum 0");
        theirs[checksum..checksum + 4].copy_from_slice(&ours[checksum..checksum + 4]);
        assert_eq!(ours.len(), theirs.len(), "UKI sizes differ from ukify's");
        if let Some(i) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            panic!("first byte differing from ukify's UKI at offset {i:#x}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests with the synthetic stub (always run)

#[test]
fn synthetic_stub_layout_matches_objdump_and_ukify_rules() {
    let stub = default_synthetic_stub();
    let sections = small_sections();
    let uki = assemble_uki(&stub, &sections).unwrap();
    check_against_objdump(&stub, &sections, &uki);
    let sbat = read_uki_sections(&uki)
        .unwrap()
        .into_iter()
        .find(|s| s.name == ".sbat")
        .unwrap();
    assert_eq!(sbat.data, expected_sbat(STUB_SBAT));
    assert_eq!(
        sbat.loaded_data(),
        sbat.data,
        "VirtualSize is the merged text's exact length"
    );
    // Hand-computed for this stub: .sbat ends below 0x3000, so .osrel is at RVA 0x3000 and the
    // 0x800-byte file (0x400 headers + two 0x200 sections) puts its data at 0x800.
    let osrel = read_uki_sections(&uki)
        .unwrap()
        .into_iter()
        .find(|s| s.name == ".osrel")
        .unwrap();
    assert_eq!((osrel.virtual_address, osrel.file_offset), (0x3000, 0x800));
}

#[test]
fn empty_optional_sections_are_left_out() {
    let stub = default_synthetic_stub();
    let sections = UkiSections {
        osrel: Vec::new(),
        cmdline: Vec::new(),
        uname: Vec::new(),
        initrd: Vec::new(),
        ..small_sections()
    };
    let uki = assemble_uki(&stub, &sections).unwrap();
    let names: Vec<String> = read_uki_sections(&uki)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [".text", ".sbat", ".linux"]);
    check_against_objdump(&stub, &sections, &uki);
}

#[test]
fn non_nx_kernel_clears_nx_compat_like_ukify() {
    let stub = default_synthetic_stub();
    // A kernel PE whose DllCharacteristics lack NX_COMPAT (0x100).
    let mut kernel = synthetic_stub(
        0x400,
        &[SyntheticSection {
            name: ".text",
            virtual_address: 0x1000,
            data: vec![0x90; 0x40],
        }],
    );
    let dll = opt_offset(&kernel) + 70;
    kernel[dll..dll + 2].copy_from_slice(&0x0060u16.to_le_bytes());
    let sections = UkiSections {
        linux: kernel.clone(),
        ..small_sections()
    };
    let uki = assemble_uki(&stub, &sections).unwrap();
    assert_eq!(u16_at(&uki, opt_offset(&uki) + 70), 0x0060);
    // With NX_COMPAT in the kernel, the stub's flags stay.
    kernel[dll..dll + 2].copy_from_slice(&0x0160u16.to_le_bytes());
    let uki = assemble_uki(
        &stub,
        &UkiSections {
            linux: kernel,
            ..small_sections()
        },
    )
    .unwrap();
    assert_eq!(u16_at(&uki, opt_offset(&uki) + 70), 0x0160);
}

#[test]
fn kernel_sbat_entries_are_merged_after_the_stubs() {
    let stub = default_synthetic_stub();
    let kernel_sbat = "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
linux,1,The Linux Developers,linux,6.12,https://linux.org\n";
    let kernel = synthetic_stub(
        0x400,
        &[SyntheticSection {
            name: ".sbat",
            virtual_address: 0x1000,
            data: kernel_sbat.as_bytes().to_vec(),
        }],
    );
    let uki = assemble_uki(
        &stub,
        &UkiSections {
            linux: kernel,
            ..small_sections()
        },
    )
    .unwrap();
    let sbat = read_uki_sections(&uki)
        .unwrap()
        .into_iter()
        .find(|s| s.name == ".sbat")
        .unwrap();
    assert_eq!(
        String::from_utf8(sbat.data).unwrap(),
        "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
systemd-stub,1,The systemd Developers,systemd,257,https://systemd.io/\n\
linux,1,The Linux Developers,linux,6.12,https://linux.org\n\
uki,1,UKI,uki,1,https://uapi-group.org/specifications/specs/unified_kernel_image/\n\0"
    );
}

#[test]
fn stub_without_sbat_gets_a_new_sbat_section_last() {
    let stub = synthetic_stub(
        0x400,
        &[SyntheticSection {
            name: ".text",
            virtual_address: 0x1000,
            data: vec![0xc3; 0x30],
        }],
    );
    let uki = assemble_uki(&stub, &small_sections()).unwrap();
    let read = read_uki_sections(&uki).unwrap();
    let names: Vec<&str> = read.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            ".text", ".osrel", ".cmdline", ".uname", ".linux", ".initrd", ".sbat"
        ]
    );
    let sbat = read.last().unwrap();
    assert_eq!(
        sbat.data,
        b"sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
uki,1,UKI,uki,1,https://uapi-group.org/specifications/specs/unified_kernel_image/\n\0"
    );
    assert_eq!(sbat.characteristics, 0x4000_0040);
}

// ---------------------------------------------------------------------------------------------
// Bad inputs: errors, never panics

#[test]
fn not_a_pe_is_refused() {
    for bad in [&b""[..], b"M", b"MZ", b"\x7fELF\x02\x01\x01", &[0u8; 4096]] {
        let err = assemble_uki(bad, &small_sections()).unwrap_err();
        assert!(
            matches!(
                err,
                UkiError::Pe {
                    source: PeError::NotPe { .. } | PeError::Truncated { .. },
                    ..
                }
            ),
            "{bad:?}: {}",
            test_support::error_chain(&err)
        );
        assert!(read_uki_sections(bad).is_err());
    }
    // MZ with e_lfanew pointing at garbage.
    let mut b = default_synthetic_stub();
    b[0x80..0x84].copy_from_slice(b"NE\0\0");
    let err = assemble_uki(&b, &small_sections()).unwrap_err();
    assert!(
        matches!(
            err,
            UkiError::Pe {
                image: Image::Stub,
                source: PeError::NotPe { .. },
            }
        ),
        "{err}"
    );
    assert!(
        test_support::error_chain(&err).contains("0x80"),
        "{}",
        test_support::error_chain(&err)
    );
}

#[test]
fn pe32_and_foreign_machines_are_refused() {
    let mut pe32 = default_synthetic_stub();
    let opt = opt_offset(&pe32);
    pe32[opt..opt + 2].copy_from_slice(&0x10bu16.to_le_bytes());
    let err = assemble_uki(&pe32, &small_sections()).unwrap_err();
    assert!(
        matches!(err, UkiError::NotPe32Plus { magic: 0x10b, .. }),
        "{err}"
    );

    let mut arm = default_synthetic_stub();
    arm[0x84..0x86].copy_from_slice(&0xaa64u16.to_le_bytes());
    let err = assemble_uki(&arm, &small_sections()).unwrap_err();
    assert!(
        matches!(
            err,
            UkiError::WrongMachine {
                machine: 0xaa64,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("0xaa64"), "{err}");
}

#[test]
fn signed_stub_is_refused() {
    let mut signed = default_synthetic_stub();
    let dir = opt_offset(&signed) + 112 + 4 * 8;
    signed[dir..dir + 4].copy_from_slice(&0x600u32.to_le_bytes());
    signed[dir + 4..dir + 8].copy_from_slice(&0x100u32.to_le_bytes());
    let err = assemble_uki(&signed, &small_sections()).unwrap_err();
    assert!(
        matches!(
            err,
            UkiError::StubSigned {
                offset: 0x600,
                size: 0x100
            }
        ),
        "{err}"
    );
}

#[test]
fn no_room_for_section_headers_is_refused() {
    // SizeOfHeaders 0x200: the table at 0x188 holds the 2 stub headers (to 0x1d8) and one more.
    let stub = synthetic_stub(
        0x200,
        &[
            SyntheticSection {
                name: ".text",
                virtual_address: 0x1000,
                data: vec![0xc3; 0x30],
            },
            SyntheticSection {
                name: ".sbat",
                virtual_address: 0x2000,
                data: STUB_SBAT.as_bytes().to_vec(),
            },
        ],
    );
    let err = assemble_uki(&stub, &small_sections()).unwrap_err();
    match err {
        UkiError::NoRoomForSectionHeader {
            section,
            header_end,
            size_of_headers,
        } => {
            assert_eq!(
                (section, header_end, size_of_headers),
                (".cmdline", 0x228, 0x200)
            );
        }
        other => panic!("expected NoRoomForSectionHeader, got {other}"),
    }
    // With only .linux to add, the one free slot is enough.
    let only_linux = UkiSections {
        linux: vec![1; 10],
        ..UkiSections::default()
    };
    let uki = assemble_uki(&stub, &only_linux).unwrap();
    assert_eq!(read_uki_sections(&uki).unwrap().len(), 3);
}

#[test]
fn empty_kernel_is_refused() {
    let err = assemble_uki(&default_synthetic_stub(), &UkiSections::default()).unwrap_err();
    assert!(matches!(err, UkiError::MissingKernel), "{err}");
}

#[test]
fn unaligned_or_overlapping_stub_sections_are_refused() {
    let mut stub = default_synthetic_stub();
    // .text's PointerToRawData 0x400 -> 0x410.
    let h = opt_offset(&stub) + 240;
    stub[h + 20..h + 24].copy_from_slice(&0x410u32.to_le_bytes());
    let err = assemble_uki(&stub, &small_sections()).unwrap_err();
    assert!(
        matches!(err, UkiError::UnalignedStubSection { pointer: 0x410, .. }),
        "{err}"
    );

    let mut stub = default_synthetic_stub();
    stub[h + 20..h + 24].copy_from_slice(&0x200u32.to_le_bytes()); // inside the headers
    let err = assemble_uki(&stub, &small_sections()).unwrap_err();
    assert!(matches!(err, UkiError::Malformed { .. }), "{err}");

    let mut stub = default_synthetic_stub();
    let alignment = opt_offset(&stub) + 36;
    stub[alignment..alignment + 4].copy_from_slice(&0u32.to_le_bytes());
    let err = assemble_uki(&stub, &small_sections()).unwrap_err();
    assert!(matches!(err, UkiError::Malformed { .. }), "{err}");
}

#[test]
fn sbat_too_large_for_the_stub_section_is_refused() {
    // A .sbat of 0x1f0 bytes leaves no room for the `uki` line within its 0x200 raw bytes.
    let mut sbat = STUB_SBAT.to_owned();
    while sbat.len() < 0x1f0 {
        sbat.push_str("x,1,x,x,1,x\n");
    }
    let stub = synthetic_stub(
        0x400,
        &[SyntheticSection {
            name: ".sbat",
            virtual_address: 0x1000,
            data: sbat.into_bytes(),
        }],
    );
    let err = assemble_uki(&stub, &small_sections()).unwrap_err();
    assert!(
        matches!(
            err,
            UkiError::NoRoomInStubSection {
                section: ".sbat",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn every_truncation_of_the_stub_is_an_error() {
    let stub = default_synthetic_stub();
    for len in 0..stub.len() {
        assert!(
            assemble_uki(&stub[..len], &small_sections()).is_err(),
            "a stub truncated to {len} bytes was accepted"
        );
    }
    let uki = assemble_uki(&stub, &small_sections()).unwrap();
    let full = read_uki_sections(&uki).unwrap();
    let last = full.last().unwrap();
    // Every cut inside the headers or inside any section's data fails to read.
    let needed = last.file_offset as usize + last.data.len();
    for len in (0..needed).step_by(7) {
        assert!(
            read_uki_sections(&uki[..len]).is_err(),
            "a UKI truncated to {len} bytes was read"
        );
    }
}

#[test]
fn real_stub_truncations_are_errors() {
    let Some(stub) = real_stub() else { return };
    for len in (0..stub.len()).step_by(97) {
        let err = assemble_uki(&stub[..len], &small_sections());
        assert!(err.is_err(), "a stub truncated to {len} bytes was accepted");
    }
}

#[test]
fn corrupted_headers_never_panic() {
    // Deterministic xorshift mutations of the header area: any outcome but a panic is fine, and
    // whatever is accepted must read back.
    let stub = default_synthetic_stub();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut b = stub.clone();
        for _ in 0..(next() % 4 + 1) {
            let at = (next() % 0x400) as usize;
            b[at] = next() as u8;
        }
        if let Ok(uki) = assemble_uki(&b, &small_sections()) {
            read_uki_sections(&uki).expect("an assembled UKI reads back");
        }
        let _ = read_uki_sections(&b);
        let _ = pe_checksum(&b);
    }
}
