//! The image builder on the real trixie inputs from the input cache (`hawser image fetch`).
//!
//! Skipped, with the reason printed, when the cache is absent; with `HAWSER_REQUIRE_INPUTS=1`
//! an absent cache is a failure instead (CI sets it after fetching), and so is not being root
//! for the chroot run of the initramfs's /init (`hawser_image::test_support`).
//!
//! The init binary is a small C program built here that links what PID 1 links (libc and
//! libgcc_s, as a Rust binary does): it runs inside a chroot of the extracted initramfs, so
//! the test shows the shipped closure is complete and that it is the trixie one, not the host's.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_image::build::{self, BuildInputs};
use hawser_image::initramfs::{self, InitramfsSpec};
use hawser_image::test_support;
use hawser_kmod::{BOOT_MODULES, KUBERNETES_MODULES, ModuleIndex};

/// Paths in the unpacked input cache.
struct CachedInputs {
    kernel_image: PathBuf,
    kernel_release: String,
    modules_dir: PathBuf,
    lib_roots: Vec<PathBuf>,
    stub: PathBuf,
}

/// The unpacked packages `inputs.lock` pins (never another version left in the cache, nor
/// another distribution's package); `Err` says what is missing.
fn find_inputs() -> Result<CachedInputs, String> {
    let lock_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
    let lock = hawser_image::inputs::InputLock::load(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    let fetched = hawser_image::inputs::cached(&lock, &hawser_image::inputs::cache_dir())
        .map_err(|e| e.to_string())?;
    Ok(CachedInputs {
        kernel_image: fetched.kernel_image,
        kernel_release: fetched.kernel_release,
        modules_dir: fetched.modules_dir,
        lib_roots: fetched.lib_roots,
        stub: fetched.stub,
    })
}

/// The cached inputs, or `None` after printing why the test is skipped (a failure with
/// `HAWSER_REQUIRE_INPUTS=1`).
fn inputs_or_skip() -> Option<CachedInputs> {
    find_inputs()
        .inspect_err(|reason| {
            test_support::missing(
                &format!("an image input ({reason})"),
                test_support::FETCH_INPUTS,
            );
        })
        .ok()
}

/// A host-built stand-in for PID 1 with PID 1's library needs: libc and libgcc_s (a Rust
/// binary's unwinder). Prints a marker and exits 0 on success.
fn build_stand_in(dir: &Path) -> PathBuf {
    let source = dir.join("stand_in.c");
    std::fs::write(
        &source,
        r#"
#include <stdio.h>
#include <unwind.h>
int main(void) {
    /* Keep libgcc_s's DT_NEEDED referenced. */
    volatile void *refs[] = { (void *)_Unwind_Backtrace };
    (void)refs;
    printf("stand-in init ok\n");
    return 0;
}
"#,
    )
    .unwrap();
    let binary = dir.join("stand-in-init");
    let status = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .args(["-Wl,--no-as-needed", "-lgcc_s"])
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run cc ({e}): {}",
                test_support::install("build-essential")
            )
        });
    assert!(
        status.success(),
        "compiling the stand-in init failed (the compiler: {})",
        test_support::install("build-essential")
    );
    binary
}

/// Extracts a compressed initramfs with the host's zstd and GNU cpio, as a person would.
fn extract(compressed: &Path, into: &Path) -> String {
    std::fs::create_dir_all(into).unwrap();
    test_support::require_tool("zstd", "zstd");
    test_support::require_tool("cpio", "cpio");
    let output = Command::new("sh")
        .arg("-c")
        .arg("zstd -dc \"$1\" | cpio -idv --no-absolute-filenames 2>&1")
        .arg("sh")
        .arg(compressed)
        .current_dir(into)
        .output()
        .unwrap();
    assert!(output.status.success(), "extraction failed: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn initramfs_from_real_inputs_is_complete_and_deterministic() {
    let Some(inputs) = inputs_or_skip() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let init = build_stand_in(work.path());
    let spec = InitramfsSpec::for_hawser(
        &init,
        &inputs.lib_roots,
        &inputs.modules_dir,
        &inputs.kernel_release,
        1_767_225_600,
    );
    let first = initramfs::build_initramfs(&spec).unwrap();
    let second = initramfs::build_initramfs(&spec).unwrap();
    assert!(
        first.compressed == second.compressed,
        "two builds of the same initramfs differ"
    );
    eprintln!(
        "initramfs (stand-in init): {} entries, {} bytes uncompressed, {} bytes zstd-{}; \
         {} modules",
        first.manifest.len(),
        first.uncompressed_size,
        first.compressed.len(),
        initramfs::ZSTD_LEVEL,
        first.modules.len()
    );

    let archive = work.path().join("initrd.cpio.zst");
    std::fs::write(&archive, &first.compressed).unwrap();
    let root = work.path().join("root");
    let listing = extract(&archive, &root);
    for expected in [
        "init",
        "usr/lib64/ld-linux-x86-64.so.2",
        "usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "dev/console",
    ] {
        assert!(
            listing.lines().any(|l| l == expected),
            "{expected} missing from:\n{listing}"
        );
    }
    // No TPM software stack: the issuer speaks TPM 2.0 itself.
    assert!(
        !listing
            .lines()
            .any(|l| l.contains("libtss2") || l.contains("libcrypto")),
        "{listing}"
    );
    for link in ["lib", "lib64", "bin", "sbin"] {
        assert_eq!(
            std::fs::read_link(root.join(link)).unwrap(),
            Path::new("usr").join(link)
        );
    }

    // Libraries are trixie's, byte for byte, not the host's.
    let libc_root = inputs
        .lib_roots
        .iter()
        .find(|r| r.to_string_lossy().contains("libc6_"))
        .unwrap();
    assert_eq!(
        std::fs::read(root.join("usr/lib/x86_64-linux-gnu/libc.so.6")).unwrap(),
        std::fs::read(libc_root.join("usr/lib/x86_64-linux-gnu/libc.so.6")).unwrap()
    );

    // The shipped loader resolves every library of /init inside the tree.
    let loader = root.join("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    let libdir = root.join("usr/lib/x86_64-linux-gnu");
    let list = Command::new(&loader)
        .arg("--inhibit-cache")
        .arg("--library-path")
        .arg(&libdir)
        .arg("--list")
        .arg(root.join("init"))
        .env_clear()
        .output()
        .unwrap();
    let list_text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "ld.so --list failed: {list:?}");
    for line in list_text.lines().filter(|l| l.contains("=>")) {
        assert!(
            line.contains(&*libdir.to_string_lossy()),
            "resolved outside the initramfs: {line}\n{list_text}"
        );
    }

    // As root, run /init inside the extracted tree: the kernel's view of it.
    if is_root() {
        let chroot = test_support::require_tool("chroot", "coreutils");
        let run = Command::new(chroot)
            .arg(&root)
            .arg("/init")
            .env_clear()
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success() && stdout.contains("stand-in init ok"),
            "the stand-in init failed in a chroot of the initramfs: {run:?}"
        );
        eprintln!("chroot run of /init: {}", stdout.trim());
    } else {
        test_support::missing(
            "root (for the run of /init in a chroot of the initramfs)",
            "run this test as root",
        );
    }

    // Modules: the shipped modules.dep resolves every boot module to a shipped file, and the
    // files are the package's.
    let modules_base = root.join("usr/lib/modules").join(&inputs.kernel_release);
    let dep = std::fs::read_to_string(modules_base.join("modules.dep")).unwrap();
    let builtin = std::fs::read_to_string(modules_base.join("modules.builtin")).unwrap();
    let index = ModuleIndex::parse(&dep, Some(&builtin)).unwrap();
    let order = index.load_order(BOOT_MODULES).unwrap();
    assert_eq!(order, first.modules);
    // Kubernetes' modules are not in the initramfs: the rootfs carries them
    // (`initramfs::module_files`, tests/rootfs.rs), and PID 1 loads them from there.
    assert!(
        index.load_order(KUBERNETES_MODULES).is_err(),
        "the initramfs resolves Kubernetes' modules: {:?}",
        index.load_order(KUBERNETES_MODULES)
    );
    let for_rootfs = hawser_image::initramfs::module_files(
        &inputs.modules_dir,
        &inputs.kernel_release,
        KUBERNETES_MODULES,
    )
    .unwrap();
    assert!(
        for_rootfs
            .order
            .iter()
            .any(|p| p.ends_with("/br_netfilter.ko"))
    );
    assert!(
        order.iter().any(|p| p.ends_with("/dm-crypt.ko")),
        "{order:?}"
    );
    // Shipped decompressed: the package's .ko.xz, xz-decoded, byte for byte.
    for module in &order {
        let packaged = inputs.modules_dir.join(format!("{module}.xz"));
        assert_eq!(
            std::fs::read(modules_base.join(module)).unwrap(),
            hawser_kmod::read_module(&packaged).unwrap(),
            "{module}"
        );
    }
    assert_eq!(listing.lines().filter(|l| l.ends_with(".ko.xz")).count(), 0);
    let shipped_ko = listing.lines().filter(|l| l.ends_with(".ko")).count();
    assert_eq!(
        shipped_ko,
        order.len(),
        "exactly the needed modules are shipped"
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}

#[test]
fn missing_library_in_roots_names_soname() {
    let Some(inputs) = inputs_or_skip() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let init = build_stand_in(work.path());
    let roots: Vec<PathBuf> = inputs
        .lib_roots
        .iter()
        .filter(|r| !r.to_string_lossy().contains("libgcc-s1"))
        .cloned()
        .collect();
    let spec = InitramfsSpec::for_hawser(
        &init,
        &roots,
        &inputs.modules_dir,
        &inputs.kernel_release,
        0,
    );
    let err = test_support::error_chain(&initramfs::build_initramfs(&spec).unwrap_err());
    assert!(err.contains("\"libgcc_s.so.1\""), "{err}");
}

/// The whole build: outputs exist, the manifest matches them, and a rebuild is identical.
#[test]
fn full_build_from_real_inputs() {
    let Some(inputs) = inputs_or_skip() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let init = std::env::var_os("HAWSER_INIT_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| build_stand_in(work.path()));
    let build_inputs = BuildInputs {
        init_binary: init,
        kernel_image: inputs.kernel_image.clone(),
        kernel_release: inputs.kernel_release.clone(),
        modules_dir: inputs.modules_dir.clone(),
        lib_roots: inputs.lib_roots.clone(),
        stub: inputs.stub.clone(),
        cmdline: "console=ttyS0 quiet".into(),
        os_release: build::default_os_release("0.1.0"),
        source_date_epoch: 1_767_225_600,
        provider_ca_pem: None,
    };
    let out_a = work.path().join("a");
    let out_b = work.path().join("b");
    let a = build::build(&build_inputs, &out_a).unwrap();
    let b = build::build(&build_inputs, &out_b).unwrap();
    for name in [
        "hawser.efi",
        "initrd.cpio.zst",
        "vmlinuz",
        "cmdline",
        "manifest.json",
    ] {
        assert_eq!(
            std::fs::read(out_a.join(name)).unwrap(),
            std::fs::read(out_b.join(name)).unwrap(),
            "{name} differs between two builds"
        );
    }
    assert_eq!(
        std::fs::read(out_a.join("vmlinuz")).unwrap(),
        std::fs::read(&inputs.kernel_image).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(out_a.join("cmdline")).unwrap(),
        "console=ttyS0 quiet"
    );

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&a.manifest).unwrap()).unwrap();
    assert_eq!(manifest["outputs"]["hawser.efi"]["sha256"], a.uki.sha256);
    assert_eq!(
        manifest["outputs"]["initrd.cpio.zst"]["size"],
        a.initrd.size
    );
    assert_eq!(manifest["uki_sections"][".initrd"]["size"], a.initrd.size);
    assert_eq!(manifest["kernel_release"], inputs.kernel_release.as_str());
    let entries = manifest["initramfs"]["entries"].as_array().unwrap();
    assert_eq!(entries.len(), a.initramfs_entries);
    let init_entry = entries.iter().find(|e| e["path"] == "init").unwrap();
    assert_eq!(
        init_entry["size"],
        std::fs::metadata(&build_inputs.init_binary).unwrap().len()
    );
    assert_eq!(a.uki.sha256, b.uki.sha256);
    eprintln!(
        "full build: UKI {} bytes, initrd {} bytes ({} uncompressed), {} modules",
        a.uki.size,
        a.initrd.size,
        a.initramfs_uncompressed_size,
        a.modules.len()
    );
}
