//! `hawser local …`: the local-cluster simulator is a program of its own, `hawser-local` (crate
//! `local/`), so that the admin CLI links neither the QEMU harness nor the join service's
//! server. `hawser local ARGS…` runs `hawser-local ARGS…` the way git runs an external
//! subcommand: found beside the running `hawser` first (cargo and `scripts/build-image-binaries`
//! put both in one directory), then on `PATH`, and *exec*'d, so that it becomes this process:
//! its exit code is `hawser`'s, and Ctrl-C and `hawser local down`'s SIGTERM reach it directly.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The simulator's binary.
pub const LOCAL_BINARY: &str = "hawser-local";

/// Why `hawser local` cannot hand over to `hawser-local`.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Neither beside `hawser` nor on `PATH`.
    #[error(
        "`hawser local` runs the local-cluster simulator `{LOCAL_BINARY}`, which is neither \
         beside this `hawser` ({beside}) nor on PATH: build it with `cargo build -p \
         hawser-local` (into the same target directory as `hawser`), run it directly with \
         `cargo run -p hawser-local -- ARGS`, or start a local cluster with \
         `scripts/local-up`, which builds both"
    )]
    NotFound {
        /// Where it was looked for first.
        beside: String,
    },
    /// It was found but could not be executed.
    #[error("cannot run {path}")]
    Exec {
        /// The binary.
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Where `hawser-local` is: beside `hawser_exe` (the running `hawser`), else the first match on
/// `path` (a `PATH` value); `None` if neither has it.
pub fn find_local_binary(hawser_exe: Option<&Path>, path: Option<&OsStr>) -> Option<PathBuf> {
    let beside = hawser_exe
        .and_then(Path::parent)
        .map(|dir| dir.join(LOCAL_BINARY));
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(LOCAL_BINARY));
    beside.into_iter().chain(on_path).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Replaces this process with `hawser-local args…`; `log` (a `--log` filter given to `hawser`
/// on its command line) is passed on as `HAWSER_LOG`. Returns only on failure.
pub fn exec(args: &[OsString], log: Option<&str>) -> LocalError {
    use std::os::unix::process::CommandExt as _;
    let hawser_exe = std::env::current_exe().ok();
    let Some(binary) =
        find_local_binary(hawser_exe.as_deref(), std::env::var_os("PATH").as_deref())
    else {
        let beside = hawser_exe
            .as_deref()
            .and_then(Path::parent)
            .map_or_else(|| "unknown".to_owned(), |d| d.display().to_string());
        return LocalError::NotFound { beside };
    };
    tracing::debug!(binary = %binary.display(), "handing `hawser local` to hawser-local");
    let mut command = std::process::Command::new(&binary);
    command.args(args);
    if let Some(log) = log {
        command.env("HAWSER_LOG", log);
    }
    let source = command.exec();
    LocalError::Exec {
        path: binary.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executable(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(LOCAL_BINARY);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn the_binary_beside_hawser_comes_before_path() {
        let beside = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        let local_beside = executable(beside.path());
        let local_on_path = executable(on_path.path());
        let path =
            std::env::join_paths(["/nonexistent", on_path.path().to_str().unwrap()]).unwrap();
        let hawser = beside.path().join("hawser");
        assert_eq!(
            find_local_binary(Some(&hawser), Some(&path)),
            Some(local_beside)
        );
        let elsewhere = tempfile::tempdir().unwrap();
        assert_eq!(
            find_local_binary(Some(&elsewhere.path().join("hawser")), Some(&path)),
            Some(local_on_path),
            "not beside hawser: the first on PATH"
        );
    }

    #[test]
    fn a_missing_or_non_executable_binary_is_not_found() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let hawser = dir.path().join("hawser");
        assert_eq!(find_local_binary(Some(&hawser), None), None);
        let plain = dir.path().join(LOCAL_BINARY);
        std::fs::write(&plain, "not a program").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            find_local_binary(Some(&hawser), Some(dir.path().as_os_str())),
            None
        );
    }
}
