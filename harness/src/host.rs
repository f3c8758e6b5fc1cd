//! Host tools and firmware the harness needs, and which Debian package provides each.

use std::path::{Path, PathBuf};

use crate::QemuError;

/// The QEMU system emulator for x86-64 guests.
pub const QEMU_BINARY: &str = "qemu-system-x86_64";
/// The software TPM.
pub const SWTPM_BINARY: &str = "swtpm";
/// Debian's 4 MiB OVMF build without Secure Boot (no SMM needed, works under TCG).
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// The pristine variable store matching [`OVMF_CODE`]; each VM boots a copy.
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// The Debian package that provides `binary`, for error messages.
pub fn debian_package_for(binary: &str) -> &'static str {
    match Path::new(binary).file_name().and_then(|name| name.to_str()) {
        Some(QEMU_BINARY) => "qemu-system-x86",
        Some(SWTPM_BINARY) => "swtpm",
        Some("swtpm_setup") => "swtpm-tools",
        Some("mkfs.vfat") => "dosfstools",
        Some("mcopy" | "mmd" | "mdir") => "mtools",
        Some(name) if name.starts_with("tpm2_") => "tpm2-tools",
        _ => "(unknown)",
    }
}

/// Resolves `binary` the way `execvp` would: a path with a `/` is taken as is, a bare name is
/// looked up in `PATH`.
pub fn find_binary(binary: &Path) -> Result<PathBuf, QemuError> {
    let missing = || QemuError::HostToolMissing {
        binary: binary.display().to_string(),
        package: debian_package_for(&binary.to_string_lossy()),
    };
    if binary.components().count() > 1 {
        return if is_executable(binary) {
            Ok(binary.to_path_buf())
        } else {
            Err(missing())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(missing)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Checks that a firmware file exists.
pub(crate) fn require_firmware(path: &Path) -> Result<(), QemuError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(QemuError::FirmwareMissing {
            path: path.to_path_buf(),
            package: "ovmf",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_the_debian_package() {
        let error = find_binary(Path::new("qemu-system-x86_64-not-installed")).unwrap_err();
        assert!(matches!(error, QemuError::HostToolMissing { .. }));
        let error = find_binary(Path::new("/nonexistent/swtpm")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "`/nonexistent/swtpm` was not found in PATH; run scripts/setup-host (it installs the \
             Debian package `swtpm`)"
        );
        assert_eq!(debian_package_for("qemu-system-x86_64"), "qemu-system-x86");
        assert_eq!(debian_package_for("/usr/bin/mcopy"), "mtools");
    }

    #[test]
    fn finds_binaries_in_path() {
        let sh = find_binary(Path::new("sh")).expect("sh is in PATH");
        assert!(sh.is_absolute(), "{sh:?}");
    }
}
