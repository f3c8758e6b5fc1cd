//! Tests of the sections each stub version uses and what it makes of them: microcode and the
//! `/.extra` cpios in the initrd (PCR 9), profiles (PCRs 9, 11, 12), `.dtbauto` picked by
//! hardware IDs, and 252's prefix lookup. Every value recomputed by hand from the raw bytes.

use sha2::{Digest, Sha256};

use crate::hwids::{self, QEMU_REFERENCE_SMBIOS, chid_uuid, chids, test_board_dtb};
use crate::predict::{BootPath, Phase, PredictError, PredictOptions, Prediction};
use crate::stub::extra_cpio;
use crate::test_fixtures::{tiny_kernel, tiny_uki};
use hawser_pcr::extend_sha256;
use hawser_pe::test_support::tiny_pe;

const SDMAGIC_252: &[u8] = b"#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####\0";
const SDMAGIC_255: &[u8] = b"#### LoaderInfo: systemd-stub 255.4-1ubuntu8 ####\0";

fn sha(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn pad4(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    v.resize(data.len().div_ceil(4) * 4, 0);
    v
}

/// The digest of the initrd the prediction says the kernel measures.
fn initrd_digest(p: &Prediction) -> [u8; 32] {
    p.events
        .iter()
        .find(|e| e.key == "tag:0x8f3b22ec")
        .expect("the initrd event")
        .digest
}

/// PCR 11's events from the stub as (name, contents digest) pairs.
fn pcr11_sections(p: &Prediction) -> Vec<(String, [u8; 32])> {
    let stub: Vec<_> = p
        .events
        .iter()
        .filter(|e| e.pcr == 11 && e.phase.is_none())
        .collect();
    stub.chunks(2)
        .map(|pair| {
            let name = pair[0]
                .key
                .trim_start_matches("ipl:")
                .trim_end_matches("#1");
            (name.to_owned(), pair[1].digest)
        })
        .collect()
}

fn predict(uki: &[u8], profile: u32) -> Result<Prediction, PredictError> {
    Prediction::from_uki_with(
        uki,
        "x.efi",
        PredictOptions {
            assume_stub: None,
            profile,
        },
    )
}

#[test]
fn stub_257_prepends_microcode_and_appends_pcrsig_pcrpkey_and_osrel_cpios() {
    let kernel = tiny_kernel(b"k");
    let uki = tiny_uki(&[
        (".osrel", b"ID=x\n"),
        (".cmdline", b"console=ttyS0"),
        (".pcrpkey", b"-----BEGIN PUBLIC KEY-----\n"),
        (".linux", &kernel),
        (".initrd", b"INITRD"),
        (".ucode", b"UCODE"),
        (".pcrsig", b"{\"sha256\":[]}"),
    ]);
    let p = predict(&uki, 0).unwrap();
    let expected = [
        pad4(b"UCODE"),
        pad4(b"INITRD"),
        extra_cpio("tpm2-pcr-signature.json", b"{\"sha256\":[]}"),
        extra_cpio("tpm2-pcr-public-key.pem", b"-----BEGIN PUBLIC KEY-----\n"),
        extra_cpio("os-release", b"ID=x\n"),
    ]
    .concat();
    assert_eq!(initrd_digest(&p), sha(&expected));
    assert_eq!(p.initrd_size, expected.len() as u64);
    // PCR 11 measures .ucode and .pcrpkey in the enum's order, never .pcrsig.
    let names: Vec<String> = pcr11_sections(&p).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            ".linux", ".osrel", ".cmdline", ".initrd", ".ucode", ".pcrpkey"
        ]
    );
    assert!(p.ignored_sections.is_empty());
}

#[test]
fn stubs_before_257_ignore_microcode_and_take_the_last_section_by_prefix() {
    let kernel = tiny_kernel(b"k");
    let uki = tiny_pe(&[
        (".sdmagic", SDMAGIC_252),
        (".cmdline", b"console=ttyS0"),
        (".dtb", b"first devicetree"),
        (".linux", &kernel),
        (".initrd", b"INITRD"),
        (".ucode", b"UCODE"),
        (".pcrsig", b"SIG"),
        (".pcrpkey", b"KEY"),
        (".dtbauto", b"a later devicetree"),
    ]);
    let p = predict(&uki, 0).unwrap();
    // .initrd, then the two cpios: no microcode, no os-release.
    let expected = [
        pad4(b"INITRD"),
        extra_cpio("tpm2-pcr-signature.json", b"SIG"),
        extra_cpio("tpm2-pcr-public-key.pem", b"KEY"),
    ]
    .concat();
    assert_eq!(initrd_digest(&p), sha(&expected));
    assert_eq!(p.ignored_sections, [".ucode"]);
    // `.dtbauto` starts with `.dtb` and comes later: 252 measures it as its .dtb.
    let dtb = pcr11_sections(&p)
        .into_iter()
        .find(|(n, _)| n == ".dtb")
        .unwrap();
    assert_eq!(dtb.1, sha(b"a later devicetree"));
    // Without cpios the initrd is passed as it is.
    let plain = tiny_pe(&[
        (".sdmagic", SDMAGIC_252),
        (".cmdline", b"c"),
        (".linux", &kernel),
        (".initrd", b"INITRD"),
    ]);
    assert_eq!(initrd_digest(&predict(&plain, 0).unwrap()), sha(b"INITRD"));
}

/// A two-profile UKI as ukify joins one: shared sections, `.profile` of profile 0 (no
/// sections of its own), `.profile` of profile 1 with its own `.cmdline`.
fn two_profiles() -> Vec<u8> {
    let kernel = tiny_kernel(b"k");
    tiny_uki(&[
        (".osrel", b"ID=x\n"),
        (".cmdline", b"console=ttyS0"),
        (".linux", &kernel),
        (".initrd", b"INITRD"),
        (".profile", b"ID=main\n"),
        (".profile", b"ID=debug\n"),
        (".cmdline", b"console=ttyS0 loglevel=7"),
    ])
}

#[test]
fn a_profile_overrides_the_base_sections_and_is_measured_with_them() {
    let uki = two_profiles();
    let zero = predict(&uki, 0).unwrap();
    let one = predict(&uki, 1).unwrap();
    assert_eq!((zero.profiles, one.profiles), (2, 2));
    assert_eq!(zero.cmdline, "console=ttyS0");
    assert_eq!(one.cmdline, "console=ttyS0 loglevel=7");
    let profile_of = |p: &Prediction| {
        pcr11_sections(p)
            .into_iter()
            .find(|(n, _)| n == ".profile")
            .unwrap()
            .1
    };
    assert_eq!(profile_of(&zero), sha(b"ID=main\n"));
    assert_eq!(profile_of(&one), sha(b"ID=debug\n"));
    // The chosen profile's .profile is also handed over as /.extra/profile, after os-release.
    let expected = [
        pad4(b"INITRD"),
        extra_cpio("os-release", b"ID=x\n"),
        extra_cpio("profile", b"ID=debug\n"),
    ]
    .concat();
    assert_eq!(initrd_digest(&one), sha(&expected));
    // Profile 0 measures nothing into PCR 12; profile 1 its number, UTF-16 with NUL.
    assert_eq!(zero.pcr(12, Phase::Stub), [0; 32]);
    let tag = sha(&[b'1', 0, 0, 0]);
    assert_eq!(one.pcr(12, Phase::Stub), extend_sha256(&[0; 32], &tag));
    // From systemd-boot's entry `@1` comes first, measured by systemd-boot.
    let sd_boot = one.on_path(&BootPath::BootManager {
        name: "systemd-boot".into(),
        authenticode: [7; 32],
    });
    let options = sha(&[b'@', 0, b'1', 0, 0, 0]);
    assert_eq!(
        sd_boot.pcr(12, Phase::Stub),
        extend_sha256(&extend_sha256(&[0; 32], &options), &tag)
    );
    assert_eq!(sd_boot.pcr(4, Phase::Stub), one.pcr4_on(&sd_boot_path()));
    // Profile 0 from systemd-boot passes no options.
    assert_eq!(zero.on_path(&sd_boot_path()).pcr(12, Phase::Stub), [0; 32]);
}

fn sd_boot_path() -> BootPath {
    BootPath::BootManager {
        name: "systemd-boot".into(),
        authenticode: [7; 32],
    }
}

#[test]
fn a_profile_the_uki_or_the_stub_lacks_is_refused_by_name() {
    let err = predict(&two_profiles(), 2).unwrap_err().to_string();
    assert!(
        err.starts_with("the UKI x.efi has no profile 2: it has 2 (numbered from 0)"),
        "{err}"
    );
    let kernel = tiny_kernel(b"k");
    let single = tiny_uki(&[(".cmdline", b"c"), (".linux", &kernel), (".initrd", b"i")]);
    assert_eq!(predict(&single, 0).unwrap().profiles, 1);
    assert!(
        predict(&single, 1)
            .unwrap_err()
            .to_string()
            .contains("has no profile 1: it has 1")
    );
    let old = tiny_pe(&[
        (".sdmagic", SDMAGIC_255),
        (".cmdline", b"c"),
        (".linux", &kernel),
        (".initrd", b"i"),
    ]);
    let err = predict(&old, 1).unwrap_err().to_string();
    assert!(
        err.contains("systemd-stub 255.4-1ubuntu8, which has no profiles"),
        "{err}"
    );
}

/// A `.hwids` section naming `devices` (CHID, compatible), as ukify packs one.
fn hwids_section(devices: &[([u8; 16], &str)]) -> Vec<u8> {
    let texts: Vec<String> = devices.iter().map(|(c, _)| chid_uuid(c)).collect();
    let files: Vec<(&str, &str, Vec<&str>)> = devices
        .iter()
        .zip(&texts)
        .map(|((_, compatible), text)| (*compatible, *compatible, vec![text.as_str()]))
        .collect();
    let files: Vec<hwids::tests::HwidFile<'_>> = files
        .iter()
        .map(|(n, c, h)| (*n, *c, h.as_slice()))
        .collect();
    hwids::tests::ukify_hwids(&files)
}

#[test]
fn dtbauto_is_the_devicetree_of_the_most_specific_device_of_the_platform() {
    let machine = chids(&QEMU_REFERENCE_SMBIOS);
    let kernel = tiny_kernel(b"k");
    let broad = test_board_dtb(b"test,qemu\0");
    let exact = test_board_dtb(b"test,qemu-exact\0");
    let other = test_board_dtb(b"test,other\0");
    let hwids = hwids_section(&[
        ([0x5a; 16], "test,other"),
        (machine[9].unwrap(), "test,qemu"),
        (machine[3].unwrap(), "test,qemu-exact"),
    ]);
    let uki = tiny_uki(&[
        (".cmdline", b"c"),
        (".dtbauto", &other),
        (".dtbauto", &broad),
        (".dtbauto", &exact),
        (".hwids", &hwids),
        (".linux", &kernel),
        (".initrd", b"i"),
    ]);
    let p = predict(&uki, 0).unwrap();
    let measured = pcr11_sections(&p);
    let dtbauto = measured.iter().find(|(n, _)| n == ".dtbauto").unwrap();
    assert_eq!(dtbauto.1, sha(&exact), "CHID 3 outranks CHID 9");
    assert!(
        measured
            .iter()
            .any(|(n, d)| n == ".hwids" && *d == sha(&hwids))
    );
    assert!(
        p.dtbauto
            .as_deref()
            .unwrap()
            .contains("\"test,qemu-exact\"")
    );
    // No device of this platform: no .dtbauto at all, .hwids still measured.
    let elsewhere = hwids_section(&[([0x5a; 16], "test,other")]);
    let uki = tiny_uki(&[
        (".cmdline", b"c"),
        (".dtbauto", &other),
        (".hwids", &elsewhere),
        (".linux", &kernel),
        (".initrd", b"i"),
    ]);
    let p = predict(&uki, 0).unwrap();
    let names: Vec<String> = pcr11_sections(&p).into_iter().map(|(n, _)| n).collect();
    assert!(!names.contains(&".dtbauto".to_owned()), "{names:?}");
    assert!(names.contains(&".hwids".to_owned()));
    assert!(p.dtbauto.unwrap().contains("no .dtbauto is used"));
}

#[test]
fn a_section_a_modelled_stub_acts_on_in_an_unmodelled_way_is_refused_by_name() {
    let kernel = tiny_kernel(b"k");
    let uki = tiny_uki(&[
        (".cmdline", b"c"),
        (".linux", &kernel),
        (".initrd", b"i"),
        (".efifw", b"firmware"),
    ]);
    // 257 does not know .efifw: it is ignored, and said so.
    assert_eq!(predict(&uki, 0).unwrap().ignored_sections, [".efifw"]);
    // 262's model knows the stub loads it, and refuses.
    let err = Prediction::from_uki_assuming(&uki, "x.efi", Some(262))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("the UKI x.efi has a .efifw section, whose measurements hawser's predictor does not model"),
        "{err}"
    );
}
