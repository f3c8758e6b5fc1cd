//! The module loader's tests: dependencies first and once, errors naming the module and its
//! purpose, skipped modules, and concurrent loads in plan order.

use super::*;
use crate::fatal::error_chain;
use crate::platform::syscalls::{Call, RecordingSyscalls};
use hawser_kmod::{BOOT_MODULE_TABLE, Need};
use nix::errno::Errno;

const DEP: &str = "\
kernel/drivers/md/dm-crypt.ko.xz: kernel/drivers/md/dm-mod.ko.xz
kernel/drivers/md/dm-mod.ko.xz:
kernel/drivers/firmware/qemu_fw_cfg.ko.xz:
kernel/drivers/block/virtio_blk.ko:
";
const BUILTIN: &str = "kernel/drivers/virtio/virtio.ko\n";

/// The boot modules' part of the trixie cloud kernel's modules.dep (6.12.117, dependencies
/// from each module's .modinfo, transitive as depmod writes them).
const TRIXIE_BOOT_DEP: &str = "\
kernel/drivers/block/virtio_blk.ko.xz:
kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko.xz kernel/net/core/failover.ko.xz
kernel/drivers/net/net_failover.ko.xz: kernel/net/core/failover.ko.xz
kernel/net/core/failover.ko.xz:
kernel/drivers/char/hw_random/virtio-rng.ko.xz:
kernel/drivers/firmware/qemu_fw_cfg.ko.xz:
kernel/drivers/md/dm-mod.ko.xz:
kernel/drivers/md/dm-crypt.ko.xz: kernel/drivers/md/dm-mod.ko.xz
kernel/drivers/md/dm-verity.ko.xz: kernel/drivers/md/dm-bufio.ko.xz kernel/drivers/md/dm-mod.ko.xz kernel/lib/reed_solomon/reed_solomon.ko.xz
kernel/drivers/md/dm-bufio.ko.xz: kernel/drivers/md/dm-mod.ko.xz
kernel/lib/reed_solomon/reed_solomon.ko.xz:
kernel/drivers/md/dm-integrity.ko.xz: kernel/drivers/md/dm-bufio.ko.xz kernel/drivers/md/dm-mod.ko.xz kernel/crypto/async_tx/async_xor.ko.xz kernel/crypto/async_tx/async_tx.ko.xz kernel/crypto/xor.ko.xz
kernel/crypto/async_tx/async_xor.ko.xz: kernel/crypto/async_tx/async_tx.ko.xz kernel/crypto/xor.ko.xz
kernel/crypto/async_tx/async_tx.ko.xz:
kernel/crypto/xor.ko.xz:
kernel/crypto/xts.ko.xz:
kernel/arch/x86/crypto/aesni-intel.ko.xz: kernel/crypto/crypto_simd.ko.xz kernel/crypto/cryptd.ko.xz kernel/lib/crypto/gf128mul.ko.xz
kernel/crypto/crypto_simd.ko.xz: kernel/crypto/cryptd.ko.xz
kernel/crypto/cryptd.ko.xz:
kernel/lib/crypto/gf128mul.ko.xz:
kernel/crypto/authenc.ko.xz:
kernel/drivers/net/tun.ko.xz:
kernel/fs/erofs/erofs.ko.xz: kernel/lib/libcrc32c.ko.xz
kernel/lib/libcrc32c.ko.xz:
kernel/fs/overlayfs/overlay.ko.xz:
kernel/drivers/acpi/button.ko.xz:
kernel/drivers/input/evdev.ko.xz:
";

/// An optional accelerator `fast_aes` over a helper `simd` only it uses, and a required
/// `dm_crypt`; `simd_user` is optional and needs `fast_aes`.
const CHAIN_DEP: &str = "\
kernel/simd.ko:
kernel/fast_aes.ko: kernel/simd.ko
kernel/simd_user.ko: kernel/fast_aes.ko kernel/simd.ko
kernel/dm-crypt.ko:
";
const FAST_AES: KernelModule =
    KernelModule::optional("fast_aes", "fast AES for dm-crypt", "dm-crypt is slower")
        .checks_for("a fast CPU (give QEMU -cpu fast)");
const SIMD_USER: KernelModule =
    KernelModule::optional("simd_user", "fast hashing", "hashing is slower");
const DM_CRYPT: KernelModule = KernelModule::required("dm_crypt", "the state disk's encryption");

fn dir() -> PathBuf {
    PathBuf::from("/usr/lib/modules/6.12.0-test")
}

fn required(name: &'static str) -> KernelModule {
    KernelModule::required(name, "the test")
}

fn loaded(sys: &RecordingSyscalls) -> Vec<(String, bool)> {
    sys.calls()
        .into_iter()
        .map(|call| match call {
            Call::LoadModule { path, compressed } => {
                (path.to_string_lossy().into_owned(), compressed)
            }
            other => panic!("unexpected call {other:?}"),
        })
        .collect()
}

fn fail(sys: &RecordingSyscalls, relative: &str, errno: Errno) {
    let path = dir().join(relative);
    sys.fail(
        Call::LoadModule {
            compressed: is_compressed(&path),
            path,
        },
        errno,
    );
}

fn skipped(outcomes: &[(String, ModuleOutcome)]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|(_, outcome)| match outcome {
            ModuleOutcome::Skipped(skip) => Some(skip.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn loads_dependencies_first_each_once_with_the_compressed_flag() {
    let index = ModuleIndex::parse(DEP, Some(BUILTIN)).unwrap();
    let table = [
        required("dm_crypt"),
        required("dm_mod"),
        required("virtio_blk"),
        required("virtio"),
    ];
    let plan = plan(&index, &dir(), &table).unwrap();
    let sys = RecordingSyscalls::new();
    let outcomes = load_all(&sys, &dir(), &plan).unwrap();
    assert_eq!(
        loaded(&sys),
        [
            (
                "/usr/lib/modules/6.12.0-test/kernel/drivers/md/dm-mod.ko.xz".into(),
                true
            ),
            (
                "/usr/lib/modules/6.12.0-test/kernel/drivers/md/dm-crypt.ko.xz".into(),
                true
            ),
            (
                "/usr/lib/modules/6.12.0-test/kernel/drivers/block/virtio_blk.ko".into(),
                false
            ),
        ]
    );
    let names: Vec<_> = outcomes.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["dm_mod", "dm_crypt", "virtio_blk"]);
}

#[test]
fn already_loaded_is_fine() {
    let index = ModuleIndex::parse(DEP, None).unwrap();
    let table = [required("dm_crypt")];
    let plan = plan(&index, &dir(), &table).unwrap();
    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/drivers/md/dm-mod.ko.xz", Errno::EEXIST);
    let outcomes = load_all(&sys, &dir(), &plan).unwrap();
    assert_eq!(
        outcomes,
        [
            ("dm_mod".to_owned(), ModuleOutcome::AlreadyLoaded),
            ("dm_crypt".to_owned(), ModuleOutcome::Loaded)
        ]
    );
}

/// Two stages that share a dependency (dm-crypt's and dm-verity's `dm_mod`): the second
/// finds it live and does not call `finit_module(2)` on it again, one thread or several.
#[test]
fn a_module_an_earlier_stage_loaded_is_not_loaded_again() {
    let index = ModuleIndex::parse(TRIXIE_BOOT_DEP, None).unwrap();
    let crypt = [required("dm_crypt")];
    let verity = [required("dm_verity")];
    for threads in [1, 2] {
        let sys = RecordingSyscalls::new();
        let first = plan(&index, &dir(), &crypt).unwrap();
        load_concurrently(&sys, &dir(), &first, threads).unwrap();
        let second = plan(&index, &dir(), &verity).unwrap();
        let outcomes = load_concurrently(&sys, &dir(), &second, threads).unwrap();
        assert!(
            outcomes.contains(&("dm_mod".to_owned(), ModuleOutcome::AlreadyLoaded)),
            "{outcomes:?}"
        );
        let mut files: Vec<_> = loaded(&sys).into_iter().map(|(path, _)| path).collect();
        let calls = files.len();
        files.sort();
        files.dedup();
        assert_eq!(
            calls,
            files.len(),
            "a file loaded twice ({threads} threads)"
        );
        assert_eq!(
            calls, 5,
            "dm_mod, dm_crypt, reed_solomon, dm_bufio, dm_verity"
        );
    }
}

#[test]
fn a_missing_module_file_is_an_error_naming_the_module() {
    let index = ModuleIndex::parse(DEP, None).unwrap();
    let table = [required("qemu_fw_cfg"), required("virtio_blk")];
    let plan = plan(&index, &dir(), &table).unwrap();
    let sys = RecordingSyscalls::new();
    fail(
        &sys,
        "kernel/drivers/firmware/qemu_fw_cfg.ko.xz",
        Errno::ENOENT,
    );
    let err = load_all(&sys, &dir(), &plan).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel module qemu_fw_cfg is missing: \
         /usr/lib/modules/6.12.0-test/kernel/drivers/firmware/qemu_fw_cfg.ko.xz does not exist"
    );
    // Nothing after the failure is attempted.
    assert_eq!(loaded(&sys).len(), 1);
}

#[test]
fn a_failing_module_is_an_error_naming_it_and_its_purpose() {
    let index = ModuleIndex::parse(DEP, None).unwrap();
    let table = [required("virtio_blk")];
    let plan = plan(&index, &dir(), &table).unwrap();
    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/drivers/block/virtio_blk.ko", Errno::ENOEXEC);
    let err = load_all(&sys, &dir(), &plan).unwrap_err();
    assert_eq!(
        error_chain(&err),
        "cannot load kernel module virtio_blk (for the test) from \
         /usr/lib/modules/6.12.0-test/kernel/drivers/block/virtio_blk.ko: \
         Exec format error (os error 8)"
    );
}

#[test]
fn a_module_unknown_to_modules_dep_is_an_error_naming_it() {
    let index = ModuleIndex::parse(DEP, None).unwrap();
    let err = plan(&index, &dir(), &[required("wireguard")]).unwrap_err();
    let chain = error_chain(&err);
    assert!(chain.contains("wireguard"), "{chain}");
}

/// errno × classification, for a module with a table entry of its own.
#[test]
fn the_kernels_answer_and_the_table_decide_together() {
    let index = ModuleIndex::parse(CHAIN_DEP, None).unwrap();
    let table = [FAST_AES, DM_CRYPT];
    let plan = plan(&index, &dir(), &table).unwrap();
    let get = |name: &str| plan.iter().find(|p| p.name == name).unwrap();
    let path = Path::new("/m.ko");
    let errno = |errno: Errno| Err(io::Error::from(errno));
    let kind = |outcome: Result<ModuleOutcome, ModuleError>| match outcome {
        Ok(ModuleOutcome::Loaded) => "loaded",
        Ok(ModuleOutcome::AlreadyLoaded) => "already loaded",
        Ok(ModuleOutcome::Skipped(_)) => "skipped",
        Err(ModuleError::Unsupported { .. }) => "fatal: unsupported",
        Err(ModuleError::Missing { .. }) => "fatal: missing",
        Err(ModuleError::Load { .. }) => "fatal: load",
        Err(other) => panic!("unexpected {other}"),
    };
    for (module, result, expected) in [
        ("fast_aes", Ok(()), "loaded"),
        ("fast_aes", errno(Errno::EEXIST), "already loaded"),
        ("fast_aes", errno(Errno::ENODEV), "skipped"),
        // Only ENODEV means "this machine lacks it"; anything else is a broken image.
        ("fast_aes", errno(Errno::ENOEXEC), "fatal: load"),
        ("fast_aes", errno(Errno::EINVAL), "fatal: load"),
        ("fast_aes", errno(Errno::ENOENT), "fatal: missing"),
        ("dm_crypt", Ok(()), "loaded"),
        ("dm_crypt", errno(Errno::ENODEV), "fatal: unsupported"),
        ("dm_crypt", errno(Errno::ENOEXEC), "fatal: load"),
        // simd has no entry: only the optional fast_aes needs it.
        ("simd", errno(Errno::ENODEV), "skipped"),
    ] {
        assert_eq!(
            kind(judge(get(module), path, result)),
            expected,
            "{module} {expected}"
        );
    }
}

#[test]
fn a_cpu_without_aes_ni_skips_aesni_intel_with_a_warning_and_boots() {
    let index = ModuleIndex::parse(TRIXIE_BOOT_DEP, None).unwrap();
    let plan = plan(&index, &dir(), BOOT_MODULE_TABLE).unwrap();
    let sys = RecordingSyscalls::new();
    // What aesni_intel's init returns on QEMU's default qemu64 CPU.
    fail(
        &sys,
        "kernel/arch/x86/crypto/aesni-intel.ko.xz",
        Errno::ENODEV,
    );
    let outcomes = load_all(&sys, &dir(), &plan).unwrap();
    assert_eq!(
        skipped(&outcomes),
        [
            "kernel module aesni_intel is not loaded: the VM lacks AES-NI in its CPU \
             (QEMU's default qemu64 model has none: give QEMU -cpu max under TCG or -cpu \
             host under KVM); dm-crypt uses the generic AES implementation (aes_generic \
             through xts): the same cipher, slower than AES-NI"
        ]
    );
    // Everything else, the xts fallback included, was loaded: every file was tried once.
    assert_eq!(loaded(&sys).len(), plan.len());
    for (name, outcome) in &outcomes {
        if name != "aesni_intel" {
            assert_eq!(*outcome, ModuleOutcome::Loaded, "{name}");
        }
    }
    assert!(outcomes.iter().any(|(name, _)| name == "xts"));
    // The console line, and the boot report's warnings (each skip's warning text).
    let summary = summarize(outcomes);
    assert_eq!(
        summary.to_string(),
        format!(
            "loaded {} kernel modules; skipped aesni_intel",
            plan.len() - 1
        )
    );
    assert_eq!(summary.skipped[0].module, "aesni_intel");
}

#[test]
fn a_required_module_the_kernel_refuses_is_fatal_naming_what_the_boot_needs_it_for() {
    let index = ModuleIndex::parse(TRIXIE_BOOT_DEP, None).unwrap();
    let plan = plan(&index, &dir(), BOOT_MODULE_TABLE).unwrap();
    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/drivers/md/dm-crypt.ko.xz", Errno::ENODEV);
    let err = load_all(&sys, &dir(), &plan).unwrap_err();
    assert_eq!(
        error_chain(&err),
        "the kernel module dm_crypt is required for the state disk's encryption (dm-crypt); \
         the kernel refuses it on this machine: No such device (os error 19)"
    );
    // A dependency of a required module is required: a helper of dm_verity's too.
    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/drivers/md/dm-bufio.ko.xz", Errno::ENODEV);
    let err = load_all(&sys, &dir(), &plan).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the kernel module dm_bufio is required for the rootfs's verification (dm-verity) \
         (through dm_verity); the kernel refuses it on this machine"
    );
    // A required module whose init checks for hardware says what the VM lacks.
    let table = [REQUIRED_FAST];
    let plan = plan_for(&table);
    let fast = plan.iter().find(|p| p.name == "fast_aes").unwrap();
    let err = judge(fast, Path::new("/m.ko"), Err(Errno::ENODEV.into())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the kernel module fast_aes is required for fast AES for dm-crypt; the VM lacks a \
         fast CPU (give QEMU -cpu fast)"
    );
}

const REQUIRED_FAST: KernelModule = KernelModule {
    need: Need::Required,
    ..FAST_AES
};

fn plan_for(table: &[KernelModule]) -> Vec<PlannedModule<'_>> {
    let index = ModuleIndex::parse(CHAIN_DEP, None).unwrap();
    plan(&index, &dir(), table).unwrap()
}

#[test]
fn modules_needing_a_skipped_module_are_skipped_without_being_tried() {
    let table = [SIMD_USER, FAST_AES, DM_CRYPT];
    let plan = plan_for(&table);
    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/simd.ko", Errno::ENODEV);
    let outcomes = load_all(&sys, &dir(), &plan).unwrap();
    assert_eq!(
        skipped(&outcomes),
        [
            "kernel module simd is not loaded: the kernel refuses it on this machine (no \
             such device); without simd_user: hashing is slower; without fast_aes: dm-crypt \
             is slower",
            "kernel module fast_aes is not loaded: it depends on simd, which is not loaded; \
             dm-crypt is slower; without simd_user: hashing is slower",
            "kernel module simd_user is not loaded: it depends on fast_aes, which is not \
             loaded; hashing is slower",
        ]
    );
    // The kernel would refuse their unresolved symbols (ENOENT, read as "missing"): they
    // are not tried at all. The required dm_crypt still loads.
    assert_eq!(
        loaded(&sys),
        [
            (
                "/usr/lib/modules/6.12.0-test/kernel/simd.ko".to_owned(),
                false
            ),
            (
                "/usr/lib/modules/6.12.0-test/kernel/dm-crypt.ko".to_owned(),
                false
            ),
        ]
    );
}

#[test]
fn concurrent_loads_keep_dependencies_first_and_outcomes_in_plan_order() {
    let index = ModuleIndex::parse(DEP, Some(BUILTIN)).unwrap();
    let table = [
        required("dm_crypt"),
        required("virtio_blk"),
        required("qemu_fw_cfg"),
    ];
    let plan = plan(&index, &dir(), &table).unwrap();
    for threads in [1, 2, 4] {
        let sys = RecordingSyscalls::new();
        let outcomes = load_concurrently(&sys, &dir(), &plan, threads).unwrap();
        let names: Vec<_> = outcomes.iter().map(|(name, _)| name.as_str()).collect();
        let in_plan: Vec<_> = plan.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, in_plan, "{threads} threads");
        let order: Vec<String> = loaded(&sys).into_iter().map(|(path, _)| path).collect();
        assert_eq!(
            order.len(),
            plan.len(),
            "each module once with {threads} threads"
        );
        for planned in &plan {
            let at = |name: &str| order.iter().position(|p| normalize(p) == name);
            for dependency in &planned.dependencies {
                if let Some(dep_at) = at(dependency) {
                    assert!(dep_at < at(&planned.name).unwrap(), "{dependency} first");
                }
            }
        }
    }
}

#[test]
fn concurrent_loads_skip_behind_a_skipped_module_and_stop_at_a_fatal_one() {
    let table = [SIMD_USER, FAST_AES, DM_CRYPT];
    let plan = plan_for(&table);
    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/simd.ko", Errno::ENODEV);
    let outcomes = load_concurrently(&sys, &dir(), &plan, 2).unwrap();
    assert_eq!(skipped(&outcomes).len(), 3, "{outcomes:?}");

    let sys = RecordingSyscalls::new();
    fail(&sys, "kernel/dm-crypt.ko", Errno::EINVAL);
    let err = load_concurrently(&sys, &dir(), &plan, 2).unwrap_err();
    assert!(err.to_string().contains("dm_crypt"), "{err}");
}

fn normalize(path: &str) -> String {
    hawser_kmod::normalize_name(path)
}

#[test]
fn a_required_module_behind_a_skipped_dependency_is_fatal() {
    let table = [REQUIRED_FAST];
    let plan = plan_for(&table);
    let fast = plan.iter().find(|p| p.name == "fast_aes").unwrap();
    let err = judge_skipped_dependency(fast, "simd").unwrap_err();
    assert_eq!(
        err.to_string(),
        "the kernel module fast_aes is required for fast AES for dm-crypt, but the module it \
         depends on, simd, is not loaded"
    );
}

#[test]
fn boot_modules_cover_what_pid1_relies_on() {
    // fw_cfg (quote nonce), virtio-rng (entropy), and the power button as an input device.
    for needed in ["qemu_fw_cfg", "virtio_rng", "button", "evdev"] {
        assert!(
            hawser_kmod::BOOT_MODULES.contains(&needed),
            "hawser_kmod::BOOT_MODULES lacks {needed}"
        );
    }
}
