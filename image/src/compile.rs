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

/// `cargo build --locked --profile image -p <package>` for a binary that goes into the image:
/// `SOURCE_DATE_EPOCH` set, and the workspace, cargo home and target directory remapped so
/// no build-host path ends up in the binary.
pub fn image_cargo_build(
    workspace: &Path,
    target_dir: &Path,
    package: &str,
    epoch: u64,
) -> Command {
    let cargo_home = std::env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"),
        PathBuf::from,
    );
    let absolute = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let rustflags = [
        (absolute(workspace), "/hawser"),
        (absolute(&cargo_home), "/cargo"),
        (absolute(target_dir), "/target"),
    ]
    .iter()
    .map(|(from, to)| format!("--remap-path-prefix={}={to}", from.display()))
    .collect::<Vec<_>>()
    .join("\x1f");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--locked", "--profile", "image", "-p", package])
        .arg("--target-dir")
        .arg(target_dir)
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        .env_remove("RUSTFLAGS");
    cmd
}
