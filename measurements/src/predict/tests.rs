//! Tests of the PCR prediction on tiny UKIs: every event recomputed by hand from the raw bytes,
//! boot paths, and refusals by name.

use super::*;
use crate::stub::osrel_cpio;
use crate::test_fixtures::{SDMAGIC_257, tiny_kernel, tiny_uki as tiny_pe_uki};
use hawser_pe::test_support::tiny_pe;

fn sha(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// The keys of systemd-stub's PCR 11 events, in order.
fn stub_pcr11_keys(p: &Prediction) -> Vec<&str> {
    p.events
        .iter()
        .filter(|e| e.pcr == 11 && e.phase.is_none())
        .map(|e| e.key.as_str())
        .collect()
}

/// A UKI-shaped PE whose .linux is itself a (tiny) PE.
fn tiny_uki(cmdline: &[u8], initrd: &[u8]) -> Vec<u8> {
    let kernel = tiny_kernel(b"kernel code");
    tiny_pe_uki(&[
        (".text", b"stub code"),
        (".osrel", b"ID=hawser\n"),
        (".cmdline", cmdline),
        (".uname", b"6.12.0"),
        (".linux", &kernel),
        (".initrd", initrd),
        (".sbat", b"sbat,1\n"),
    ])
}

#[test]
fn pcr11_is_name_then_contents_in_stub_order() {
    let uki = tiny_uki(b"console=ttyS0", b"INITRD");
    let p = Prediction::from_uki(&uki, "t").expect("predict");
    assert_eq!(
        stub_pcr11_keys(&p),
        [
            "ipl:.linux#1",
            "ipl:.linux#2",
            "ipl:.osrel#1",
            "ipl:.osrel#2",
            "ipl:.cmdline#1",
            "ipl:.cmdline#2",
            "ipl:.initrd#1",
            "ipl:.initrd#2",
            "ipl:.uname#1",
            "ipl:.uname#2",
            "ipl:.sbat#1",
            "ipl:.sbat#2",
        ]
    );
    // Recompute PCR 11 by hand from the raw bytes.
    let kernel = tiny_kernel(b"kernel code");
    let mut v = [0u8; 32];
    for (name, data) in [
        (".linux", kernel.as_slice()),
        (".osrel", b"ID=hawser\n"),
        (".cmdline", b"console=ttyS0"),
        (".initrd", b"INITRD"),
        (".uname", b"6.12.0"),
        (".sbat", b"sbat,1\n"),
    ] {
        v = extend_sha256(&v, &sha(format!("{name}\0").as_bytes()));
        v = extend_sha256(&v, &sha(data));
    }
    assert_eq!(p.pcr(11, Phase::Stub), v);
    let enter = extend_sha256(&v, &phase_digest("enter-initrd"));
    assert_eq!(p.pcr(11, Phase::EnterInitrd), enter);
    assert_eq!(
        p.pcr(11, Phase::LeaveInitrd),
        extend_sha256(&enter, &phase_digest("leave-initrd"))
    );
    let marked = extend_sha256(&enter, &phase_digest("control-plane"));
    assert_eq!(
        p.pcr(11, Phase::LeaveInitrdControlPlane),
        extend_sha256(&marked, &phase_digest("leave-initrd"))
    );
    assert_eq!(
        p.pcr(11, Phase::LeaveInitrdControlPlane),
        hawser_pcr::pcr11_after_pivot(&enter, true)
    );
    // The marker is PCR 11's alone, and a worker's phases never include it.
    for pcr in [4, 9, 12, 13, 15] {
        assert_eq!(
            p.pcr(pcr, Phase::LeaveInitrdControlPlane),
            p.pcr(pcr, Phase::LeaveInitrd)
        );
    }
    assert_eq!(p.pcr(11, Phase::EnterInitrd), enter);
}

#[test]
fn pcr9_is_utf16_cmdline_then_padded_initrd_and_osrel_cpio() {
    let uki = tiny_uki(b"console=ttyS0\n", b"12345");
    let p = Prediction::from_uki(&uki, "t").expect("predict");
    let cmd: Vec<u8> = "console=ttyS0\0"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let mut initrd = b"12345\0\0\0".to_vec();
    initrd.extend_from_slice(&osrel_cpio(b"ID=hawser\n"));
    let expected = extend_sha256(&extend_sha256(&[0; 32], &sha(&cmd)), &sha(&initrd));
    assert_eq!(p.pcr(9, Phase::Stub), expected);
    assert_eq!(p.initrd_size, initrd.len() as u64);
    assert_eq!(p.cmdline, "console=ttyS0");
}

#[test]
fn pcr4_is_ovmf_prefix_then_both_authenticode_hashes() {
    let uki = tiny_uki(b"c", b"i");
    let p = Prediction::from_uki(&uki, "t").expect("predict");
    let pcr4: Vec<[u8; 32]> = p
        .events
        .iter()
        .filter(|e| e.pcr == 4)
        .map(|e| e.digest)
        .collect();
    assert_eq!(pcr4.len(), 4);
    // sha256("Calling EFI Application from Boot Option") and sha256(00000000), computed
    // with coreutils: printf … | sha256sum.
    assert_eq!(
        hex::encode(pcr4[0]),
        "3d6772b4f84ed47595d72a2c4c5ffd15f5bb72c7507fe26f2aaee2c69d5633ba"
    );
    assert_eq!(
        hex::encode(pcr4[1]),
        "df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119"
    );
    assert_eq!(pcr4[2], p.uki_authenticode);
    assert_eq!(pcr4[3], p.kernel_authenticode);
    assert_ne!(p.uki_authenticode, p.kernel_authenticode);
}

#[test]
fn other_pcrs_are_zero_and_predictions_follow_every_byte() {
    let a = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRD"), "a").expect("a");
    for pcr in [12, 13, 15] {
        assert_eq!(a.pcr(pcr, Phase::LeaveInitrd), [0; 32]);
    }
    let b = Prediction::from_uki(&tiny_uki(b"console=ttyS1", b"INITRD"), "b").expect("b");
    let c = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRE"), "c").expect("c");
    for pcr in [4, 9, 11] {
        assert_ne!(
            a.pcr(pcr, Phase::EnterInitrd),
            b.pcr(pcr, Phase::EnterInitrd)
        );
        assert_ne!(
            a.pcr(pcr, Phase::EnterInitrd),
            c.pcr(pcr, Phase::EnterInitrd)
        );
    }
    // Deterministic.
    let again = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRD"), "a").expect("a");
    assert_eq!(a.pcrs(Phase::EnterInitrd), again.pcrs(Phase::EnterInitrd));
}

#[test]
fn missing_and_unmodelled_sections_are_named() {
    let kernel = tiny_kernel(b"k");
    let no_initrd = tiny_pe(&[(".cmdline", b"c"), (".linux", &kernel)]);
    let err = Prediction::from_uki(&no_initrd, "x.efi").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the UKI x.efi has no .initrd section (its sections: .cmdline .linux)"),
        "{err}"
    );
    let no_linux = tiny_pe(&[(".cmdline", b"c"), (".initrd", b"i")]);
    let err = Prediction::from_uki(&no_linux, "x.efi").unwrap_err();
    assert!(
        err.to_string().contains("x.efi has no .linux section"),
        "{err}"
    );
    let bad_kernel = tiny_pe_uki(&[
        (".cmdline", b"c"),
        (".linux", b"not a PE"),
        (".initrd", b"i"),
    ]);
    let err = Prediction::from_uki(&bad_kernel, "x.efi").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the kernel in the .linux section of x.efi is not a PE image"),
        "{err}"
    );
}

#[test]
fn the_stub_version_selects_pcr11_sections_and_the_osrel_cpio() {
    let kernel = tiny_kernel(b"kernel code");
    let with_stub = |magic: &[u8]| {
        tiny_pe(&[
            (".sdmagic", magic),
            (".osrel", b"ID=hawser\n"),
            (".cmdline", b"console=ttyS0"),
            (".uname", b"6.12.0"),
            (".linux", &kernel),
            (".initrd", b"INITRD"),
            (".sbat", b"sbat,1\n"),
        ])
    };
    let old = Prediction::from_uki(
        &with_stub(b"#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####\0"),
        "252.efi",
    )
    .expect("systemd-stub 252 is modelled");
    assert_eq!(old.stub.version, "252.39-1~deb12u2");
    assert_eq!(old.kernel_release, crate::test_fixtures::KERNEL_RELEASE);
    // 252 knows neither .uname nor .sbat.
    assert_eq!(
        stub_pcr11_keys(&old),
        [
            "ipl:.linux#1",
            "ipl:.linux#2",
            "ipl:.osrel#1",
            "ipl:.osrel#2",
            "ipl:.cmdline#1",
            "ipl:.cmdline#2",
            "ipl:.initrd#1",
            "ipl:.initrd#2"
        ]
    );
    // Before 257 the kernel gets .initrd as it is: no padding, no os-release cpio.
    assert_eq!(old.initrd_size, 6);
    let initrd_event = old
        .events
        .iter()
        .find(|e| e.key.ends_with("0x8f3b22ec"))
        .unwrap();
    assert_eq!(initrd_event.digest, sha(b"INITRD"));

    let new = Prediction::from_uki(&with_stub(SDMAGIC_257), "257.efi").expect("257");
    assert!(new.initrd_size > 8, "257 appends the os-release cpio");
    assert_ne!(new.pcr(11, Phase::Stub), old.pcr(11, Phase::Stub));
}

#[test]
fn unknown_stubs_and_kernels_are_refused_by_name() {
    let refusal = |uki: &[u8]| Prediction::from_uki(uki, "x.efi").unwrap_err().to_string();
    let kernel = tiny_kernel(b"k");
    let no_magic = tiny_pe(&[(".cmdline", b"c"), (".linux", &kernel), (".initrd", b"i")]);
    let err = refusal(&no_magic);
    assert!(
        err.starts_with(
            "the UKI x.efi does not say which stub it has (it has no .sdmagic section)"
        ),
        "{err}"
    );
    let old = tiny_pe(&[
        (
            ".sdmagic",
            b"#### LoaderInfo: systemd-stub 249.11-0ubuntu3 ####\0",
        ),
        (".cmdline", b"c"),
        (".linux", &kernel),
        (".initrd", b"i"),
    ]);
    let err = refusal(&old);
    assert!(
        err.starts_with("systemd-stub 249.11-0ubuntu3 in the UKI x.efi is not modelled"),
        "{err}"
    );
    let with_kernel =
        |kernel: &[u8]| tiny_pe_uki(&[(".cmdline", b"c"), (".linux", kernel), (".initrd", b"i")]);
    let mut other_kernel = tiny_kernel(b"k");
    other_kernel[0x300..0x302].copy_from_slice(b"5.");
    let err = refusal(&with_kernel(&other_kernel));
    assert!(
        err.starts_with("Linux 5.12.0-test in the UKI x.efi is not modelled"),
        "{err}"
    );
    let err = refusal(&with_kernel(&tiny_pe(&[(".text", b"k")])));
    assert!(
        err.contains("has no readable version (no \"HdrS\" setup header"),
        "{err}"
    );
}

#[test]
fn boot_paths_insert_their_firmware_events_before_the_uki() {
    let p = Prediction::from_uki(&tiny_uki(b"console=ttyS0", b"INITRD"), "t").unwrap();
    assert_eq!(p.pcr4_on(&BootPath::Direct), p.pcr(4, Phase::Stub));
    let keys = |path| {
        p.pcr4_events(&path)
            .into_iter()
            .map(|e| e.key)
            .collect::<Vec<_>>()
    };
    let calling = format!("action:{OVMF_CALLING_EFI_APPLICATION}");
    let returning = format!("action:{OVMF_RETURNING_FROM_EFI_APPLICATION}");
    assert_eq!(
        keys(BootPath::FailedBootOptions { count: 2 }),
        [
            calling.clone(),
            "separator".into(),
            format!("{returning}#1"),
            format!("{calling}#2"),
            format!("{returning}#2"),
            format!("{calling}#3"),
            "app#1".into(),
            "app#2".into()
        ]
    );
    // Recomputed by hand: the direct value's events with one retry inserted.
    let mut v = [0u8; 32];
    for digest in [
        sha(OVMF_CALLING_EFI_APPLICATION.as_bytes()),
        sha(&[0u8; 4]),
        sha(OVMF_RETURNING_FROM_EFI_APPLICATION.as_bytes()),
        sha(OVMF_CALLING_EFI_APPLICATION.as_bytes()),
        p.uki_authenticode,
        p.kernel_authenticode,
    ] {
        v = extend_sha256(&v, &digest);
    }
    assert_eq!(p.pcr4_on(&BootPath::FailedBootOptions { count: 1 }), v);
    let manager = BootPath::BootManager {
        name: "systemd-boot".into(),
        authenticode: [7; 32],
    };
    assert_eq!(
        keys(manager.clone()),
        [
            calling.clone(),
            "separator".into(),
            "app#1".into(),
            "app#2".into(),
            "app#3".into()
        ],
        "numbered as a firmware log counts them: the boot manager is the first application"
    );
    let other = BootPath::BootManager {
        name: "systemd-boot".into(),
        authenticode: [8; 32],
    };
    assert_ne!(
        p.pcr4_on(&manager),
        p.pcr4_on(&other),
        "another application, another value"
    );
}

#[test]
fn truncated_or_corrupted_ukis_are_errors_never_panics() {
    let uki = tiny_uki(b"console=ttyS0", b"INITRD");
    for len in 0..uki.len() {
        assert!(
            Prediction::from_uki(&uki[..len], "t").is_err(),
            "a {len}-byte prefix predicted"
        );
    }
    // Every single-byte corruption of the headers either predicts or fails cleanly.
    for at in 0..hawser_pe::test_support::TINY_HEADERS {
        for value in [0x00, 0x7f, 0xff] {
            let mut bad = uki.clone();
            bad[at] = value;
            let _ = Prediction::from_uki(&bad, "t");
        }
    }
}
