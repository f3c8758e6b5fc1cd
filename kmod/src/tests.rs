//! Tests of module resolution: names, dependency order, built-ins, malformed input, the tables
//! and the needs a load plan carries.

use std::collections::BTreeSet;

use super::*;

const DEP: &str = "\
kernel/drivers/md/dm-crypt.ko.xz: kernel/drivers/md/dm-mod.ko.xz kernel/lib/crypto/libaes.ko.xz
kernel/drivers/md/dm-mod.ko.xz:
kernel/lib/crypto/libaes.ko.xz:
kernel/drivers/md/dm-verity.ko.xz: kernel/drivers/md/dm-bufio.ko.xz kernel/drivers/md/dm-mod.ko.xz
kernel/drivers/md/dm-bufio.ko.xz:
kernel/drivers/block/virtio_blk.ko.xz:
";
const BUILTIN: &str = "kernel/drivers/virtio/virtio.ko\nkernel/drivers/char/tpm/tpm_crb.ko\n";

#[test]
fn normalizes_names_and_paths() {
    assert_eq!(
        normalize_name("kernel/drivers/md/dm-crypt.ko.xz"),
        "dm_crypt"
    );
    assert_eq!(normalize_name("dm-crypt"), "dm_crypt");
    assert_eq!(normalize_name("virtio_blk.ko"), "virtio_blk");
    assert_eq!(normalize_name("tun.ko.zst"), "tun");
}

#[test]
fn dependencies_come_first_and_once() {
    let idx = ModuleIndex::parse(DEP, Some(BUILTIN)).unwrap();
    let order = idx.load_order(&["dm_crypt", "dm-verity"]).unwrap();
    assert_eq!(
        order,
        [
            "kernel/drivers/md/dm-mod.ko.xz",
            "kernel/lib/crypto/libaes.ko.xz",
            "kernel/drivers/md/dm-crypt.ko.xz",
            "kernel/drivers/md/dm-bufio.ko.xz",
            "kernel/drivers/md/dm-verity.ko.xz",
        ]
    );
}

#[test]
fn builtin_modules_are_skipped_and_unknown_ones_named() {
    let idx = ModuleIndex::parse(DEP, Some(BUILTIN)).unwrap();
    assert!(idx.is_builtin("tpm-crb"));
    assert_eq!(
        idx.load_order(&["virtio", "tpm_crb"]).unwrap(),
        Vec::<String>::new()
    );
    assert!(matches!(
        idx.load_order(&["wireguard"]),
        Err(KmodError::UnknownModule { name }) if name == "wireguard"
    ));
}

#[test]
fn malformed_lines_and_cycles_are_errors() {
    assert!(matches!(
        ModuleIndex::parse("a.ko\n", None).unwrap_err(),
        KmodError::Malformed { line: 1, text } if text == "a.ko"
    ));
    let idx = ModuleIndex::parse("a.ko: b.ko\nb.ko: a.ko\n", None).unwrap();
    assert!(matches!(
        idx.load_order(&["a"]),
        Err(KmodError::Cycle { .. })
    ));
}

#[test]
fn module_tables_are_well_formed_and_name_lists_follow_them() {
    for (table, names) in [
        (BOOT_MODULE_TABLE, BOOT_MODULES),
        (KUBERNETES_MODULE_TABLE, KUBERNETES_MODULES),
    ] {
        let from_table: Vec<&str> = table.iter().map(|module| module.name).collect();
        assert_eq!(from_table, names);
        let unique: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(
            unique.len(),
            names.len(),
            "a module is listed twice: {names:?}"
        );
        for module in table {
            assert_eq!(normalize_name(module.name), module.name);
            assert!(!module.purpose.is_empty(), "{} has no purpose", module.name);
            if let Need::Optional { without } = module.need {
                assert!(
                    !without.is_empty(),
                    "{} says nothing of its loss",
                    module.name
                );
            }
        }
    }
}

#[test]
fn the_after_pivot_list_follows_the_table() {
    let after_pivot: Vec<&str> = BOOT_MODULE_TABLE
        .iter()
        .filter(|module| module.stage == crate::Stage::AfterPivot)
        .map(|module| module.name)
        .collect();
    assert_eq!(after_pivot, crate::AFTER_PIVOT_MODULES);
    // Whatever loads after the pivot, or only on demand, is something the boot path can do
    // without until then.
    for module in BOOT_MODULE_TABLE {
        if module.stage == crate::Stage::AfterPivot {
            assert!(
                matches!(module.need, Need::Optional { .. }),
                "{}",
                module.name
            );
        }
        if module.stage == crate::Stage::OnDemand {
            assert_eq!(module.used_for, Use::Mesh, "{}", module.name);
        }
    }
}

#[test]
fn only_what_has_a_fallback_is_optional_at_boot() {
    let need = |name: &str| {
        BOOT_MODULE_TABLE
            .iter()
            .find(|module| module.name == name)
            .unwrap_or_else(|| panic!("{name} is not in BOOT_MODULE_TABLE"))
    };
    // QEMU's default CPU model lacks AES-NI; dm-crypt then runs xts over aes_generic.
    let aesni = need("aesni_intel");
    assert!(matches!(aesni.need, Need::Optional { without } if without.contains("generic AES")));
    let hardware = aesni.hardware.unwrap();
    assert!(
        hardware.contains("AES-NI") && hardware.contains("-cpu max"),
        "{hardware}"
    );
    // ... so the fallback itself, and everything that holds the state disk and the rootfs,
    // cannot be skipped.
    for required in [
        "xts",
        "dm_mod",
        "dm_crypt",
        "dm_verity",
        "dm_integrity",
        "authenc",
        "erofs",
        "overlay",
        "virtio_blk",
        "virtio_net",
        "tun",
    ] {
        assert_eq!(need(required).need, Need::Required, "{required}");
    }
    assert!(
        KUBERNETES_MODULE_TABLE
            .iter()
            .all(|module| module.need == Need::Required && module.hardware.is_none())
    );
}

const FAST: KernelModule =
    KernelModule::optional("fast_aes", "fast AES", "slow AES").checks_for("a fast CPU");
const CRYPT: KernelModule = KernelModule::required("dm_crypt", "the state disk");
const BUTTON: KernelModule = KernelModule::optional("button", "the button", "no button");
/// simd: used by the optional fast_aes only; dm-mod: by the required dm-crypt and by
/// fast_aes; libinput: by the optional button only.
const PLAN_DEP: &str = "\
kernel/fast_aes.ko: kernel/simd.ko kernel/dm-mod.ko
kernel/simd.ko:
kernel/dm-mod.ko:
kernel/dm-crypt.ko: kernel/dm-mod.ko
kernel/button.ko: kernel/libinput.ko
kernel/libinput.ko:
";

#[test]
fn a_dependency_is_as_needed_as_its_neediest_user() {
    let idx = ModuleIndex::parse(PLAN_DEP, None).unwrap();
    let plan = idx.load_plan(&[FAST, CRYPT, BUTTON]).unwrap();
    let paths: Vec<&str> = plan.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        idx.load_order(&["fast_aes", "dm_crypt", "button"]).unwrap()
    );
    let get = |name: &str| plan.iter().find(|p| p.name == name).unwrap();

    assert_eq!(get("fast_aes").required_for(), None);
    assert_eq!(get("fast_aes").without(), "slow AES");
    assert_eq!(get("fast_aes").hardware(), Some("a fast CPU"));
    assert_eq!(get("fast_aes").dependencies, ["simd", "dm_mod"]);

    assert_eq!(get("simd").required_for(), None);
    assert_eq!(get("simd").without(), "without fast_aes: slow AES");
    assert_eq!(
        get("simd").hardware(),
        None,
        "fast_aes's hardware is not simd's"
    );
    assert_eq!(get("simd").purpose(), "fast AES (through fast_aes)");
    assert_eq!(get("dm_mod").purpose(), "the state disk (through dm_crypt)");

    // Also wanted by the optional fast_aes, but the required dm_crypt decides.
    assert_eq!(
        get("dm_mod").required_for().as_deref(),
        Some("the state disk (through dm_crypt)")
    );
    assert_eq!(
        get("dm_crypt").required_for().as_deref(),
        Some("the state disk")
    );

    assert_eq!(get("libinput").without(), "without button: no button");
    assert_eq!(get("button").without(), "no button");
}

#[test]
fn subset_round_trips_through_parse() {
    let idx = ModuleIndex::parse(DEP, Some(BUILTIN)).unwrap();
    let order = idx.load_order(&["dm_crypt"]).unwrap();
    let subset = idx.render_subset(&order);
    let again = ModuleIndex::parse(&subset, None).unwrap();
    assert_eq!(again.load_order(&["dm_crypt"]).unwrap(), order);
    assert!(
        again.load_order(&["dm_verity"]).is_err(),
        "subset must not contain unrequested modules"
    );
}

#[test]
fn every_platform_table_is_well_formed_and_adds_to_the_boot_table() {
    let names: Vec<&str> = PLATFORM_MODULE_TABLES
        .iter()
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(names, ["qemu", "gce", "azure", "aws", "sev-snp", "tdx"]);
    for (platform, table) in PLATFORM_MODULE_TABLES {
        let unique: BTreeSet<&str> = table.iter().map(|module| module.name).collect();
        assert_eq!(unique.len(), table.len(), "{platform} lists a module twice");
        for module in *table {
            assert_eq!(normalize_name(module.name), module.name, "{platform}");
            assert!(!module.purpose.is_empty(), "{platform}: {}", module.name);
            assert_eq!(module.used_for, Use::Always, "{platform}: {}", module.name);
            assert!(
                !BOOT_MODULES.contains(&module.name),
                "{platform}: {} is in the boot table already",
                module.name
            );
            if let Need::Optional { without } = module.need {
                assert!(!without.is_empty(), "{platform}: {}", module.name);
            }
        }
    }
}

#[test]
fn platforms_are_looked_up_by_their_command_line_name() {
    let names = |platform: &str| -> Vec<&str> {
        platform_modules(platform)
            .unwrap_or_else(|| panic!("{platform} has no table"))
            .iter()
            .map(|module| module.name)
            .collect()
    };
    assert_eq!(names("qemu"), Vec::<&str>::new());
    assert_eq!(names("gce"), ["nvme", "virtio_scsi", "sd_mod", "gve"]);
    assert_eq!(names("aws"), ["nvme", "ena", "sev_guest", "tsm"]);
    assert_eq!(names("sev-snp"), ["sev_guest", "tsm"]);
    assert_eq!(names("tdx"), ["tdx_guest", "tsm"]);
    let azure = names("azure");
    for needed in ["hv_vmbus", "hv_storvsc", "hv_netvsc", "sd_mod"] {
        assert!(azure.contains(&needed), "{needed}: {azure:?}");
    }
    // hawser-platforms' two Azure profiles boot the one Azure image.
    assert_eq!(names("azure-snp"), azure);
    assert_eq!(names("azure-tdx"), azure);
    assert!(platform_modules("openstack").is_none());
}

#[test]
fn only_modules_whose_init_checks_the_machine_say_what_for() {
    let checking: Vec<(&str, &str)> = PLATFORM_MODULE_TABLES
        .iter()
        .flat_map(|(platform, table)| {
            table
                .iter()
                .filter(|module| module.hardware.is_some())
                .map(move |module| (*platform, module.name))
        })
        .collect();
    assert_eq!(
        checking,
        [
            ("azure", "hv_vmbus"),
            ("aws", "sev_guest"),
            ("sev-snp", "sev_guest"),
            ("tdx", "tdx_guest")
        ]
    );
    // On AWS the SNP report is a bonus (instances without AmdSevSnp=enabled boot too); on a
    // bare SEV-SNP or TDX guest it is the evidence, and a machine without it is refused.
    let need = |platform: &str, name: &str| {
        platform_modules(platform)
            .unwrap()
            .iter()
            .find(|module| module.name == name)
            .unwrap()
            .need
    };
    assert!(matches!(need("aws", "sev_guest"), Need::Optional { .. }));
    assert_eq!(need("sev-snp", "sev_guest"), Need::Required);
    assert_eq!(need("tdx", "tdx_guest"), Need::Required);
    assert_eq!(need("azure", "hv_vmbus"), Need::Required);
}
