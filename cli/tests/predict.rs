//! `hawser measurements predict` as a real binary on a tiny two-profile UKI (systemd-stub 257's
//! `.sdmagic`, a kernel with a modelled release): the profile chosen by `--profile`, PCR 12 of a
//! profile ≠ 0, the other boot paths printed after the direct one in text and in JSON (PCR 4's
//! `alsoExpected`, `bootPaths`), and a profile the UKI lacks refused by name.
//! Run with `cargo test -p hawser-cli --test predict`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::Path;
use std::process::{Command, Output};

use hawser_pe::test_support::tiny_pe;

/// A tiny PE whose headers carry an x86 setup header naming a modelled kernel release.
fn tiny_kernel() -> Vec<u8> {
    let mut pe = tiny_pe(&[(".text", b"kernel code")]);
    pe[0x202..0x206].copy_from_slice(b"HdrS");
    pe[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
    let version = b"6.12.0-test (test@hawser) #1 SMP\0";
    pe[0x300..0x300 + version.len()].copy_from_slice(version);
    pe
}

fn two_profile_uki(dir: &Path) -> std::path::PathBuf {
    let kernel = tiny_kernel();
    let uki = tiny_pe(&[
        (
            ".sdmagic",
            b"#### LoaderInfo: systemd-stub 257.13-1~deb13u1 ####\0",
        ),
        (".osrel", b"ID=x\n"),
        (".cmdline", b"console=ttyS0"),
        (".linux", &kernel),
        (".initrd", b"INITRD"),
        (".profile", b"ID=main\n"),
        (".profile", b"ID=debug\n"),
        (".cmdline", b"console=ttyS0 loglevel=7"),
    ]);
    let path = dir.join("two.efi");
    std::fs::write(&path, uki).unwrap();
    path
}

fn predict(uki: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hawser"))
        .args(["measurements", "predict"])
        .arg(uki)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn predict_prints_the_chosen_profile_and_every_boot_path_the_reference_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let uki = two_profile_uki(dir.path());

    let out = predict(&uki, &["--profile", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("profile 1 of 2"), "{text}");
    assert!(
        text.contains("kernel command line: console=ttyS0 loglevel=7"),
        "{text}"
    );
    assert!(text.contains("systemd-stub: profile 1"), "{text}");
    assert!(
        text.contains("other boot paths the reference accepts"),
        "{text}"
    );
    assert!(text.contains("after 1 failed boot option:"), "{text}");
    assert!(text.contains("after 2 failed boot options:"), "{text}");

    let out = predict(&uki, &["--profile", "1", "--json"]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["prediction"]["profile"], 1);
    assert_eq!(json["prediction"]["profiles"], 2);
    assert_ne!(json["measurements"]["12"]["expected"], "0".repeat(64));
    let paths = json["bootPaths"].as_array().unwrap();
    let also = json["measurements"]["4"]["alsoExpected"]
        .as_array()
        .unwrap();
    assert!(paths.len() >= 2, "{paths:?}");
    assert_eq!(
        also,
        &paths.iter().map(|p| p["pcr4"].clone()).collect::<Vec<_>>()
    );
    assert_eq!(paths[0]["bootPath"]["kind"], "failedBootOptions");
    assert_ne!(
        paths[0]["pcr4"], json["measurements"]["4"]["expected"],
        "a failed boot option changes PCR 4"
    );
    // Where the pinned systemd-boot is cached its path changes PCR 12 too (its `@1`).
    if let Some(sd_boot) = paths
        .iter()
        .find(|p| p["bootPath"]["kind"] == "bootManager")
    {
        assert!(sd_boot["pcr12"].is_string(), "{sd_boot}");
    } else {
        assert!(json["bootPathsMissing"].is_string(), "{json}");
    }

    let out = predict(&uki, &["--profile", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("has no profile 2: it has 2"), "{err}");
}
