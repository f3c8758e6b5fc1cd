//! Kernel-module dependency resolution, shared by the image builder and PID 1.
//!
//! The image builder ships only the modules PID 1 loads, plus their dependencies; PID 1 loads
//! them in dependency order with `finit_module`. Both sides read the same `modules.dep` (the
//! kernel package's, or the subset the builder writes into the initramfs), so the two cannot
//! disagree about what "the modules PID 1 needs" means.
//!
//! There is no `modprobe` in the initramfs: a module the kernel would auto-load on demand
//! (`request_module`) must be listed in [`BOOT_MODULES`] or be built in.

use std::collections::{BTreeMap, BTreeSet};

/// Modules PID 1 loads at bring-up, by name. Built-in ones are skipped at load time.
///
/// - `virtio_*`: the QEMU and cloud block, net and entropy devices;
/// - `qemu_fw_cfg`: unmeasured per-boot configuration from the VMM;
/// - `dm_mod`, `dm_crypt`, `dm_verity`, `dm_integrity`: the state disk and the rootfs;
/// - `xts`, `aesni_intel`, `authenc`: the ciphers dm-crypt asks the crypto API for (it would
///   `request_module` them, and there is no modprobe): `xts(aes)` for aes-xts-plain64 (AES-NI,
///   which every confidential-computing CPU has; `aes_generic` is built in), `authenc` for
///   `authenc(hmac(sha256),xts(aes))` with dm-integrity (`hmac` and `sha256` are built in);
/// - `tun`, `wireguard`: the node mesh;
/// - `erofs`, `overlay`: the immutable rootfs and its writable overlays;
/// - `button`, `evdev`: the ACPI power button, read by PID 1 for orderly power-off.
pub const BOOT_MODULES: &[&str] = &[
    "virtio_blk",
    "virtio_net",
    "virtio_rng",
    "qemu_fw_cfg",
    "dm_mod",
    "dm_crypt",
    "dm_verity",
    "dm_integrity",
    "xts",
    "aesni_intel",
    "authenc",
    "tun",
    "erofs",
    "overlay",
    // The ACPI power button as an input device: PID 1 reads KEY_POWER from it, so that
    // `system_powerdown` and cloud "stop" requests shut the node down in order.
    "button",
    "evdev",
];

/// Modules a Kubernetes node needs after the pivot, loaded by PID 1 just before it (the
/// initramfs, which carries them, is freed by the switch, and the rootfs has no modules):
/// - `br_netfilter` (with `bridge`): bridged pod traffic through iptables, and its sysctl
///   `net.bridge.bridge-nf-call-iptables` that kubeadm's preflight checks;
/// - `veth`, `vxlan`: pod network interfaces and the overlay of the common CNI plugins;
/// - `nf_conntrack`, `nf_nat`, `nf_tables`, `nft_compat`, `nft_chain_nat`, `ip_tables`,
///   `iptable_filter`, `iptable_nat` and the `xt_*` matches and targets kube-proxy's rules
///   use (Debian's `iptables` is the nf_tables flavour, which loads `nft_compat` for `xt_*`);
/// - `ip_set`: network policies of CNI plugins such as Calico.
pub const KUBERNETES_MODULES: &[&str] = &[
    "br_netfilter",
    "veth",
    "vxlan",
    "nf_conntrack",
    "nf_nat",
    "nf_tables",
    "nft_compat",
    "nft_chain_nat",
    "ip_tables",
    "iptable_filter",
    "iptable_nat",
    "xt_conntrack",
    "xt_MASQUERADE",
    "xt_addrtype",
    "xt_comment",
    "xt_mark",
    "xt_nat",
    "ipt_REJECT",
    "ip_set",
];

/// Why a module set could not be resolved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KmodError {
    /// A line of modules.dep has no `:` separator.
    #[error("modules.dep line {line}: expected `path: deps...`, found {text:?}")]
    Malformed { line: usize, text: String },
    /// A requested or depended-on module is neither in modules.dep nor built in.
    #[error("kernel module {name:?} is neither in modules.dep nor built into the kernel")]
    UnknownModule { name: String },
    /// modules.dep lists a dependency cycle (the kernel's depmod never writes one).
    #[error("kernel module dependency cycle through {name:?}")]
    Cycle { name: String },
    /// A file of the modules directory could not be read.
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    /// A module file is not a kernel module we can read.
    #[error("{path} is not a readable kernel module: {reason}")]
    BadModule { path: String, reason: String },
}

/// Normalizes a module name or path the way the kernel does: directory and `.ko[.xz|.zst|.gz]`
/// stripped, `-` replaced by `_`. `"kernel/drivers/md/dm-crypt.ko.xz"` → `"dm_crypt"`.
pub fn normalize_name(s: &str) -> String {
    let file = s.rsplit('/').next().unwrap_or(s);
    let stem = file.find(".ko").map_or(file, |i| &file[..i]);
    stem.replace('-', "_")
}

/// A parsed `modules.dep` (and optionally `modules.builtin`).
#[derive(Debug, Clone, Default)]
pub struct ModuleIndex {
    /// Module name → (its path relative to the modules directory, its dependencies' paths).
    modules: BTreeMap<String, (String, Vec<String>)>,
    builtin: BTreeSet<String>,
}

impl ModuleIndex {
    /// Parses `modules.dep` text (`path: dep-path dep-path ...` per line) and, if given, the
    /// `modules.builtin` list (one path per line).
    pub fn parse(modules_dep: &str, modules_builtin: Option<&str>) -> Result<Self, KmodError> {
        let mut modules = BTreeMap::new();
        for (i, line) in modules_dep.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (path, deps) = line.split_once(':').ok_or_else(|| KmodError::Malformed {
                line: i + 1,
                text: line.to_owned(),
            })?;
            let path = path.trim().to_owned();
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            modules.insert(normalize_name(&path), (path, deps));
        }
        let builtin = modules_builtin
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(normalize_name)
            .collect();
        Ok(Self { modules, builtin })
    }

    /// An index from already-resolved entries: (module path, dependency paths).
    #[cfg(feature = "scan")]
    fn from_entries(
        entries: impl IntoIterator<Item = (String, Vec<String>)>,
        builtin: BTreeSet<String>,
    ) -> Self {
        let modules = entries
            .into_iter()
            .map(|(path, deps)| (normalize_name(&path), (path, deps)))
            .collect();
        Self { modules, builtin }
    }

    /// Whether `name` is compiled into the kernel (nothing to load).
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&normalize_name(name))
    }

    /// Relative paths of every module needed for `names`, dependencies first, each once.
    /// Built-in modules are skipped; an unknown name is [`KmodError::UnknownModule`].
    pub fn load_order(&self, names: &[&str]) -> Result<Vec<String>, KmodError> {
        let mut order = Vec::new();
        let mut done = BTreeSet::new();
        for name in names {
            self.visit(
                &normalize_name(name),
                &mut done,
                &mut BTreeSet::new(),
                &mut order,
            )?;
        }
        Ok(order)
    }

    /// Depth-first: dependencies are pushed before the module that needs them.
    fn visit(
        &self,
        name: &str,
        done: &mut BTreeSet<String>,
        in_progress: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<(), KmodError> {
        if done.contains(name) {
            return Ok(());
        }
        let Some((path, deps)) = self.modules.get(name) else {
            if self.builtin.contains(name) {
                return Ok(());
            }
            return Err(KmodError::UnknownModule {
                name: name.to_owned(),
            });
        };
        if !in_progress.insert(name.to_owned()) {
            return Err(KmodError::Cycle {
                name: name.to_owned(),
            });
        }
        for dep in deps {
            self.visit(&normalize_name(dep), done, in_progress, order)?;
        }
        in_progress.remove(name);
        done.insert(name.to_owned());
        order.push(path.clone());
        Ok(())
    }

    /// A `modules.dep` restricted to `paths`, in the order given, for shipping a subset.
    pub fn render_subset(&self, paths: &[String]) -> String {
        let mut out = String::new();
        for path in paths {
            let name = normalize_name(path);
            let deps = self
                .modules
                .get(&name)
                .map(|(_, deps)| deps.join(" "))
                .unwrap_or_default();
            out.push_str(path);
            out.push(':');
            if !deps.is_empty() {
                out.push(' ');
                out.push_str(&deps);
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(feature = "scan")]
mod scan;

#[cfg(test)]
mod tests {
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
        assert_eq!(
            idx.load_order(&["wireguard"]),
            Err(KmodError::UnknownModule {
                name: "wireguard".into()
            })
        );
    }

    #[test]
    fn malformed_lines_and_cycles_are_errors() {
        assert_eq!(
            ModuleIndex::parse("a.ko\n", None).unwrap_err(),
            KmodError::Malformed {
                line: 1,
                text: "a.ko".into()
            }
        );
        let idx = ModuleIndex::parse("a.ko: b.ko\nb.ko: a.ko\n", None).unwrap();
        assert!(matches!(
            idx.load_order(&["a"]),
            Err(KmodError::Cycle { .. })
        ));
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
}
