//! The rootfs image: erofs + dm-verity from a directory tree, deterministic.
//!
//! The synthetic-tree tests need mkfs.erofs and veritysetup; the full build also needs mkosi
//! (bookworm-backports), dump.erofs, root and the Debian mirror. A missing tool skips a test,
//! saying which and what to install, unless `HAWSER_REQUIRE_INPUTS=1` (CI sets it after
//! scripts/setup-host), which makes it a failure (`hawser_image::test_support`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use hawser_disk_format::verity::VeritySuperblock;
use hawser_image::inputs::InputLock;
use hawser_image::rootfs::{
    self, RootfsKubernetes, RootfsOptions, STANDIN_MARKER, TOOL_PATH, TreeImages,
};
use hawser_image::test_support;
use hawser_kube_types::{IMAGE_KUBERNETES_PATH, ImageKubernetes, KubernetesOrigin};

const EPOCH: u64 = 1_767_225_600;

/// The tools of the synthetic-tree tests (and their Debian packages).
const TREE_TOOLS: &[(&str, &str)] = &[
    ("mkfs.erofs", "erofs-utils"),
    ("veritysetup", "cryptsetup-bin"),
];
/// What the full build needs on top (mkosi 24 is in bookworm-backports).
const BUILD_TOOLS: &[(&str, &str)] = &[
    ("mkosi", "mkosi from bookworm-backports"),
    ("dump.erofs", "erofs-utils"),
];

/// Whether all `tools` are installed; when one is not, the test skips or, with
/// `HAWSER_REQUIRE_INPUTS=1`, fails, naming its Debian package.
fn have(tools: &[(&str, &str)]) -> bool {
    // Every tool is looked up (no short circuit): a skip names all the missing ones.
    let found: Vec<bool> = tools
        .iter()
        .map(|(tool, package)| test_support::find_tool(tool, package).is_some())
        .collect();
    found.into_iter().all(|found| found)
}

/// A small tree: nested directories, modes, a symlink, a hard link, an empty directory.
/// `reverse` creates everything in the opposite order (different inode numbers and directory
/// order on disk), and `mtime` stamps every file, to show neither reaches the image.
fn synthetic_tree(root: &Path, reverse: bool, mtime: std::time::SystemTime) {
    let mut files: Vec<(&str, Vec<u8>, u32)> = vec![
        ("etc/hostname", b"node\n".to_vec(), 0o644),
        ("etc/shadow", b"root:*:1::::::\n".to_vec(), 0o600),
        (
            "usr/bin/tool",
            (0..200_000u32).map(|i| (i * 7919 % 251) as u8).collect(),
            0o755,
        ),
        ("usr/share/doc/README", b"hello\n".repeat(1000), 0o644),
    ];
    if reverse {
        files.reverse();
    }
    for (rel, data, mode) in &files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, data).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    std::fs::create_dir_all(root.join("var/empty")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    std::fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool-again")).unwrap();
    for (rel, _, _) in &files {
        std::fs::File::open(root.join(rel))
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }
}

fn image(tree: &Path, out: &Path) -> TreeImages {
    std::fs::create_dir_all(out).unwrap();
    let mut lines = Vec::new();
    let images = rootfs::image_tree(tree, out, EPOCH, &mut |l| lines.push(l.to_owned()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        lines.iter().any(|l| l.contains("veritysetup verify")),
        "{lines:#?}"
    );
    images
}

#[test]
fn the_same_tree_in_another_place_and_order_gives_identical_images() {
    if !have(TREE_TOOLS) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a_tree = dir.path().join("a/tree");
    let b_tree = dir.path().join("elsewhere/b/tree");
    synthetic_tree(&a_tree, false, std::time::SystemTime::now());
    synthetic_tree(
        &b_tree,
        true,
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000),
    );
    let a = image(&a_tree, &dir.path().join("a/out"));
    let b = image(&b_tree, &dir.path().join("b/out"));

    assert_eq!(a.tree_digest, b.tree_digest);
    assert_eq!(hex::encode(a.root_hash), hex::encode(b.root_hash));
    assert_eq!(a.verity_salt, b.verity_salt);
    assert_eq!(
        std::fs::read(&a.erofs).unwrap(),
        std::fs::read(&b.erofs).unwrap()
    );
    assert_eq!(
        std::fs::read(&a.verity).unwrap(),
        std::fs::read(&b.verity).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/out/rootfs.roothash")).unwrap(),
        format!("{}\n", hex::encode(a.root_hash))
    );
    // mtimes above the epoch were clamped in the tree itself.
    let mtime = std::fs::metadata(a_tree.join("etc/hostname"))
        .unwrap()
        .mtime();
    assert_eq!(u64::try_from(mtime).unwrap(), EPOCH);
}

#[test]
fn the_verity_superblock_is_what_the_initramfs_expects() {
    if !have(TREE_TOOLS) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    synthetic_tree(&tree, false, std::time::SystemTime::now());
    let images = image(&tree, &dir.path().join("out"));
    // PID 1's own strict parser (version 1 only, hawser's format only); `veritysetup verify`,
    // run by `image`, is the independent check against what the kernel expects.
    let superblock = std::fs::read(&images.verity).unwrap();
    let sb = VeritySuperblock::parse_hawser(&superblock).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sb.hash_type, 1, "hash type 1 (the kernel's current format)");
    assert_eq!(sb.algorithm, "sha256");
    assert_eq!(sb.data_block_size, 4096);
    assert_eq!(sb.hash_block_size, 4096);
    assert_eq!(sb.data_blocks, images.data_blocks);
    assert_eq!(images.data_blocks * 4096, images.erofs_bytes);
    assert_eq!(sb.salt, images.verity_salt);
    assert!(!sb.uuid.is_nil());
    assert_eq!(
        std::fs::metadata(&images.verity).unwrap().len(),
        images.verity_bytes
    );
    // The erofs superblock (at 1024) has the magic, and the verity file is world-readable.
    let erofs = std::fs::read(&images.erofs).unwrap();
    assert_eq!(&erofs[1024..1028], &0xE0F5_E1E2u32.to_le_bytes());
    assert_eq!(
        std::fs::metadata(&images.verity)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
}

#[test]
fn any_change_to_the_tree_changes_the_root_hash_and_breaks_verification() {
    if !have(TREE_TOOLS) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    synthetic_tree(&tree, false, std::time::SystemTime::now());
    let before = image(&tree, &dir.path().join("before"));

    // One mode bit.
    std::fs::set_permissions(
        tree.join("etc/hostname"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let after = image(&tree, &dir.path().join("after"));
    assert_ne!(before.root_hash, after.root_hash);
    assert_ne!(before.verity_salt, after.verity_salt);

    // One flipped byte in the image: veritysetup verify refuses it.
    let mut erofs = std::fs::read(&before.erofs).unwrap();
    let middle = erofs.len() / 2;
    erofs[middle] ^= 1;
    std::fs::write(&before.erofs, &erofs).unwrap();
    let err = rootfs::verify_verity(&before.erofs, &before.verity, &before.root_hash)
        .expect_err("a corrupted image must fail verification")
        .to_string();
    assert!(err.contains("veritysetup verify failed"), "{err}");
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn sha256_hex(path: &Path) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

fn dump_erofs_has(image: &Path, path: &str) -> bool {
    Command::new("dump.erofs")
        .env("PATH", TOOL_PATH)
        .arg(format!("--path={path}"))
        .arg(image)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Two full builds (mkosi, stand-ins, erofs, verity) into different directories: byte-identical.
#[test]
fn the_full_rootfs_build_is_reproducible() {
    if !have(&[TREE_TOOLS, BUILD_TOOLS].concat()) {
        return;
    }
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        test_support::missing(
            "root (mkosi builds the rootfs as root)",
            "run this test as root",
        );
        return;
    }
    let workspace = workspace();
    let lock = InputLock::load(&workspace.join("inputs.lock")).unwrap();
    let standin_bin_dir = rootfs::compile_rootfs_binaries(&workspace, None, lock.source_date_epoch)
        .unwrap_or_else(|e| panic!("{e}"));
    let fetched = hawser_image::inputs::fetch(&lock, &hawser_image::inputs::cache_dir()).unwrap();
    let pid1_files = hawser_image::initramfs::pid1_elf_files(
        &standin_bin_dir.join("hawser-init"),
        &fetched.lib_roots,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let kernel_modules = hawser_image::initramfs::module_files(
        &fetched.modules_dir,
        &fetched.kernel_release,
        hawser_kmod::KUBERNETES_MODULES,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let scratch = tempfile::tempdir().unwrap();
    let build = |name: &str| {
        let opts = RootfsOptions {
            workspace: workspace.clone(),
            out_dir: scratch.path().join(name).join("out"),
            cache_dir: hawser_image::inputs::cache_dir(),
            source_date_epoch: lock.source_date_epoch,
            standin_bin_dir: standin_bin_dir.clone(),
            // The stand-ins: this test is about the rootfs's bytes; the image with real
            // Kubernetes is built (twice, in two clones) by scripts/check-reproducible-node.
            kubernetes: RootfsKubernetes::StandIn,
            pid1_files: pid1_files.clone(),
            kernel_modules: kernel_modules.files.clone(),
        };
        let mut lines = Vec::new();
        let rootfs = rootfs::build_rootfs(&opts, &mut |l| {
            println!("{l}");
            lines.push(l.to_owned());
        })
        .unwrap_or_else(|e| panic!("{e}"));
        (rootfs, lines)
    };
    let (a, a_lines) = build("a");

    // What a node needs is in the image.
    for path in [
        "/usr/bin/containerd",
        "/usr/sbin/runc",
        "/usr/sbin/iptables",
        "/usr/sbin/conntrack",
    ] {
        assert!(dump_erofs_has(&a.erofs, path), "{path} is not in the image");
    }
    // Kubernetes' kernel modules, which PID 1 loads from here after the pivot.
    for path in kernel_modules.files.iter().map(|(p, _)| format!("/{p}")) {
        assert!(
            dump_erofs_has(&a.erofs, &path),
            "{path} is not in the image"
        );
    }
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.erofs.with_file_name(rootfs::SUMMARY_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["root_hash"], hex::encode(a.root_hash));
    assert_eq!(a.kubernetes.origin, KubernetesOrigin::StandIn);
    assert_eq!(summary["kubernetes"]["origin"], "stand-in");
    assert!(
        a_lines
            .iter()
            .any(|l| l.contains("--kubernetes stand-in") && l.contains("STAND-INS")),
        "the stand-in build did not say so: {a_lines:#?}"
    );
    for path in [
        "/usr/bin/kubeadm",
        "/usr/bin/kubelet",
        &format!("/{STANDIN_MARKER}"),
        &format!("/{IMAGE_KUBERNETES_PATH}"),
    ] {
        assert!(dump_erofs_has(&a.erofs, path), "{path} is not in the image");
    }
    let marker = std::fs::read_to_string(a.tree.join(STANDIN_MARKER)).unwrap();
    assert!(marker.contains("NOT Kubernetes"), "{marker}");
    let described = std::fs::read_to_string(a.tree.join(IMAGE_KUBERNETES_PATH)).unwrap();
    assert_eq!(
        ImageKubernetes::from_json(&described).unwrap(),
        a.kubernetes
    );
    // The installed kubeadm is the stand-in and says so.
    let version = Command::new(a.tree.join("usr/bin/kubeadm"))
        .arg("version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).contains("STAND-IN (not Kubernetes)"));
    // Only the images are compared: drop a's 200 MiB tree before building b (disk space).
    std::fs::remove_dir_all(&a.tree).unwrap();
    let (b, _) = build("b");

    for (step, took) in a.timings.iter().chain(&b.timings) {
        println!("timing: {step}: {:.1} s", took.as_secs_f64());
    }
    println!(
        "sizes: erofs {} bytes ({} blocks), verity {} bytes, root hash {}",
        a.erofs_bytes,
        a.data_blocks,
        a.verity_bytes,
        hex::encode(a.root_hash)
    );

    assert_eq!(hex::encode(a.root_hash), hex::encode(b.root_hash));
    assert_eq!(a.verity_salt, b.verity_salt);
    assert_eq!(sha256_hex(&a.erofs), sha256_hex(&b.erofs));
    assert_eq!(sha256_hex(&a.verity), sha256_hex(&b.verity));
    assert_eq!(a.kubernetes, b.kubernetes);
}
