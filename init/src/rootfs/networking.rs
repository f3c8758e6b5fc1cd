//! Kubernetes networking, prepared after the switch: the kernel modules kube-proxy and CNI
//! plugins need live in the verified rootfs (`/usr/lib/modules/<release>`, written by the image
//! builder; the initramfs carries only PID 1's own), so a thread loads them from the new root
//! and sets the sysctls kubeadm's preflight checks, while containerd starts
//! ([`super::pivot`]).

use std::path::Path;

use crate::platform::syscalls::LinuxSyscalls;

/// The sysctls kubeadm's preflight requires and kube-proxy and CNI plugins rely on (systemd's
/// `sysctl.d` would set them on a general-purpose distribution).
pub const KUBERNETES_SYSCTLS: [(&str, &str); 3] = [
    ("net.ipv4.ip_forward", "1"),
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
];

/// Why Kubernetes networking could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum NetworkingError {
    /// A kernel module Kubernetes networking needs cannot be loaded (its own message says
    /// which).
    #[error(transparent)]
    Modules(#[from] crate::modules::ModuleError),
    /// A sysctl of [`KUBERNETES_SYSCTLS`] cannot be written.
    #[error("cannot set {key}={value}")]
    Sysctl {
        /// The sysctl, e.g. `net.ipv4.ip_forward`.
        key: &'static str,
        /// The value it should have.
        value: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Loads [`hawser_kmod::KUBERNETES_MODULE_TABLE`] from the root at `root` (the rootfs, `/`
/// after the switch; several at once with more than one CPU) and sets [`KUBERNETES_SYSCTLS`];
/// returns how many modules are loaded.
pub(super) fn prepare_kubernetes_networking(root: &Path) -> Result<usize, NetworkingError> {
    let dir = root.join(
        crate::modules::running_modules_dir()
            .strip_prefix("/")
            .unwrap_or(Path::new("")),
    );
    let loaded = crate::modules::load_table_in(
        &LinuxSyscalls,
        &dir,
        hawser_kmod::KUBERNETES_MODULE_TABLE,
        crate::modules::load_threads(),
    )?
    .loaded;
    for (key, value) in KUBERNETES_SYSCTLS {
        let path = Path::new("/proc/sys").join(key.replace('.', "/"));
        std::fs::write(&path, value).map_err(|source| NetworkingError::Sysctl {
            key,
            value,
            source,
        })?;
    }
    Ok(loaded)
}
