//! Reproducible cargo builds of the binaries that go into the image: PID 1 (built by
//! [`crate::pipeline`]) and the rootfs's `hawser-joind` and stand-ins (built by
//! [`crate::rootfs`]), with the `image` profile, `SOURCE_DATE_EPOCH` and every build-host path
//! remapped. A leaf module: both builders use it, neither is used by it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo target directory of image builds: `explicit`, else `$CARGO_TARGET_DIR`, else
/// `<workspace>/target`.
pub fn image_target_dir(workspace: &Path, explicit: Option<&Path>) -> PathBuf {
    explicit
        .map(Path::to_owned)
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .unwrap_or_else(|| workspace.join("target"))
}

/// The packages of every binary that goes into an image — PID 1, `hawser-joind`, the
/// kubeadm/kubelet stand-ins — and of the `hawser` CLI that builds it and the `hawser-local`
/// simulator that boots it (`hawser local`). They are always compiled together, in one cargo
/// invocation: cargo unifies the dependencies' features across the packages it builds at once,
/// so building PID 1 alone and the rest afterwards compiled the shared dependencies twice (and
/// a PID 1 built alone differs from one built with the others). With the CLI and the simulator
/// in the set, `scripts/build-image-binaries` (the quick start's build) compiles everything
/// once, puts `hawser-local` beside `hawser` where `hawser local` finds it, and the CLI's own
/// image build finds it fresh.
pub const IMAGE_PACKAGES: [&str; 5] = [
    "hawser-init",
    "hawser-joinservice",
    "hawser-standin",
    "hawser-cli",
    "hawser-local",
];

/// The command [`image_cargo_build`] runs, for error messages.
pub fn image_cargo_command() -> String {
    let packages: Vec<String> = IMAGE_PACKAGES.iter().map(|p| format!("-p {p}")).collect();
    format!(
        "cargo build --locked --profile image {}",
        packages.join(" ")
    )
}

/// `cargo build --locked --profile image -p …` of [`IMAGE_PACKAGES`]: `SOURCE_DATE_EPOCH` set,
/// and the cargo home and target directory remapped so no build-host path ends up in a binary.
/// The workspace's own sources need no remapping: cargo runs rustc in the workspace root and
/// names them relative to it (`init/src/main.rs`). Nor may the flags name the workspace: they
/// are part of every crate's fingerprint, so a clone in another directory sharing the target
/// would recompile every dependency (7.4 min against 5.1 with them kept, docs/testing.md). The
/// suite's reproducibility stage builds in another directory and compares the bytes. The
/// binaries land in `<target_dir>/image/`.
pub fn image_cargo_build(workspace: &Path, target_dir: &Path, epoch: u64) -> Command {
    let cargo_home = std::env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"),
        PathBuf::from,
    );
    let absolute = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let rustflags = [
        (absolute(&cargo_home), "/cargo"),
        (absolute(target_dir), "/target"),
    ]
    .iter()
    .map(|(from, to)| format!("--remap-path-prefix={}={to}", from.display()))
    .collect::<Vec<_>>()
    .join("\x1f");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // When this runs under `cargo test` or `cargo run`, cargo has set the running crate's own
    // variables (CARGO_MANIFEST_DIR = the test's crate, ...). Some build scripts rerun when one
    // of them changes (ring's watches CARGO_MANIFEST_DIR), so an image build from the image
    // tests, then from the CLI, then from the QEMU tests recompiled ring and everything above it
    // each time (5 to 9 minutes in CI). Every caller gets the environment of a plain shell.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_running_crates_variable) {
            cmd.env_remove(&name);
        }
    }
    cmd.current_dir(workspace)
        .args(["build", "--locked", "--profile", "image"])
        .args(IMAGE_PACKAGES.iter().flat_map(|package| ["-p", package]))
        .arg("--target-dir")
        .arg(target_dir)
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        .env_remove("RUSTFLAGS");
    cmd
}

/// Whether `name` is one of the variables cargo sets for the crate it runs (a test, a
/// `cargo run` binary, a build script), not a setting of the user's.
fn is_running_crates_variable(name: &str) -> bool {
    const PREFIXES: [&str; 4] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_BIN_",
        "CARGO_CRATE_",
    ];
    const NAMES: [&str; 4] = [
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix)) || NAMES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test runs under `cargo test`, with CARGO_MANIFEST_DIR and CARGO_PKG_NAME set for
    /// it: the image build must not see them, or the build from here and the one from the CLI
    /// dirty each other's dependencies.
    #[test]
    fn the_image_build_does_not_inherit_the_running_crates_variables() {
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let cmd = image_cargo_build(Path::new("/nonexistent"), Path::new("/t"), 1);
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(key, _)| key.to_string_lossy().into_owned())
            .collect();
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
        ] {
            assert!(
                removed.iter().any(|r| r == name),
                "{name} not removed: {removed:?}"
            );
        }
        assert!(!is_running_crates_variable("CARGO_HOME"));
        assert!(!is_running_crates_variable("CARGO_TARGET_DIR"));
        assert!(!is_running_crates_variable("CARGO_INCREMENTAL"));
        assert!(!is_running_crates_variable("CARGO_NET_OFFLINE"));
    }

    /// `scripts/build-image-binaries` (the quick start's one compile) must run the very cargo
    /// command the image builder runs, or the builder compiles everything a second time.
    #[test]
    fn the_quick_start_build_is_the_image_builders_build() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .canonicalize()
            .unwrap();
        let target_dir = image_target_dir(&workspace, None);
        let lock = crate::inputs::InputLock::load(&workspace.join("inputs.lock")).unwrap();
        let cmd = image_cargo_build(&workspace, &target_dir, lock.source_date_epoch);
        let script = std::process::Command::new("bash")
            .arg(workspace.join("scripts/build-image-binaries"))
            .arg("--print-env")
            .env_remove("SOURCE_DATE_EPOCH")
            .output()
            .unwrap();
        assert!(script.status.success(), "{script:?}");
        let printed = String::from_utf8(script.stdout).unwrap();

        let env = |name: &str| -> String {
            cmd.get_envs()
                .find(|(key, _)| *key == name)
                .and_then(|(_, value)| value)
                .unwrap()
                .to_string_lossy()
                .replace('\x1f', " ")
        };
        let args: Vec<String> = cmd
            .get_args()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        let expected = format!(
            "SOURCE_DATE_EPOCH={}\nCARGO_ENCODED_RUSTFLAGS={}\ncargo {}\n",
            env("SOURCE_DATE_EPOCH"),
            env("CARGO_ENCODED_RUSTFLAGS"),
            args.join(" ")
        );
        assert_eq!(printed, expected);
    }
}
