//! Kernel-module dependency resolution, shared by the image builder and PID 1.
//!
//! The image builder ships only the modules PID 1 loads, plus their dependencies; PID 1 loads
//! them in dependency order with `finit_module`. Both sides read the same `modules.dep` (the
//! kernel package's, or the subset the builder writes into the initramfs), so the two cannot
//! disagree about what "the modules PID 1 needs" means.
//!
//! There is no `modprobe` in the initramfs: a module the kernel would auto-load on demand
//! (`request_module`) must be listed in [`BOOT_MODULE_TABLE`] or be built in.
//!
//! Each listed module says why PID 1 loads it and whether the boot can go on without it
//! ([`Need`]): a module that drives a CPU feature or device the machine may lack, where the
//! kernel has a fallback or the boot loses only a convenience, is [`Need::Optional`]; the
//! kernel refusing it with ENODEV ("no such device") is then a warning, not a reboot loop.
//! [`ModuleIndex::load_plan`] carries that classification to every file it loads, dependencies
//! included, so PID 1 decides from data and not from module names.

use std::collections::{BTreeMap, BTreeSet};

/// Whether the boot can go on when the kernel refuses a module for a CPU feature or device
/// this machine lacks (ENODEV).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The boot path cannot do without the module: any failure to load it is fatal.
    Required,
    /// The kernel has a fallback, or only a convenience is lost: when the kernel refuses the
    /// module with ENODEV, PID 1 warns and goes on. Any other failure (a corrupt or mismatched
    /// module) is an image defect and stays fatal.
    Optional {
        /// What the machine loses, or what takes over, without the module.
        without: &'static str,
    },
}

/// When PID 1 loads a module of [`BOOT_MODULE_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before the rest of the bring-up (none today: every module of the table can wait).
    Early,
    /// First on a thread of its own while PID 1 opens the TPM, seeds entropy and measures
    /// (mostly waiting on the TPM); awaited before fw_cfg is read and the network configured
    /// (fw_cfg, virtio-rng, the NIC).
    Network,
    /// On the same thread after the [`Stage::Network`] ones, while PID 1 goes on to the
    /// network and the join service; awaited before the state disk, the first thing that needs
    /// these (the disks, device-mapper, dm-crypt's cipher, and the power button, watched from
    /// then on).
    Background,
    /// On the same thread after the [`Stage::Background`] ones, while PID 1 opens the state
    /// disk (mostly waiting on the join service); awaited after it, before the mesh and the
    /// rootfs that need these (tun, dm-verity, erofs, overlay).
    AfterStateDisk,
}

/// What a module of [`BOOT_MODULE_TABLE`] is for, so a node whose command line does not ask
/// for that does not load it (each module costs its signature check and init at every boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Every boot.
    Always,
    /// `hawser.state_disk_integrity=hmac-sha256`: dm-integrity and dm-crypt's `authenc`.
    Integrity,
    /// `hawser.root_hash=`: the verified rootfs (dm-verity, erofs, the `/etc` overlay).
    Rootfs,
}

/// A module PID 1 loads, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelModule {
    /// The module's name as the kernel spells it (`_`, never `-`).
    pub name: &'static str,
    /// What hawser uses it for; completes "the kernel module … is required for …".
    pub purpose: &'static str,
    /// Whether the boot can go on without it.
    pub need: Need,
    /// What the module's init checks the machine for (refusing with ENODEV without it), and how
    /// a QEMU VM gets it; completes "the VM lacks …". `None` for modules whose init checks for
    /// nothing: drivers that register and wait for their devices, filesystems, crypto templates.
    pub hardware: Option<&'static str>,
    /// When it is loaded.
    pub stage: Stage,
    /// Which configuration needs it.
    pub used_for: Use,
}

impl KernelModule {
    /// A module the boot path cannot do without.
    pub const fn required(name: &'static str, purpose: &'static str) -> Self {
        Self {
            name,
            purpose,
            need: Need::Required,
            hardware: None,
            stage: Stage::Early,
            used_for: Use::Always,
        }
    }

    /// A module the boot can go on without, losing `without`.
    pub const fn optional(
        name: &'static str,
        purpose: &'static str,
        without: &'static str,
    ) -> Self {
        Self {
            name,
            purpose,
            need: Need::Optional { without },
            hardware: None,
            stage: Stage::Early,
            used_for: Use::Always,
        }
    }

    /// Loaded in the background, before the state disk ([`Stage::Background`]).
    pub const fn in_background(mut self) -> Self {
        self.stage = Stage::Background;
        self
    }

    /// Loaded in the background while the state disk opens ([`Stage::AfterStateDisk`]).
    pub const fn after_state_disk(mut self) -> Self {
        self.stage = Stage::AfterStateDisk;
        self
    }

    /// Loaded in the background first, before the network ([`Stage::Network`]).
    pub const fn before_network(mut self) -> Self {
        self.stage = Stage::Network;
        self
    }

    /// Loaded only when the configuration asks for `used_for`.
    pub const fn only_for(mut self, used_for: Use) -> Self {
        self.used_for = used_for;
        self
    }

    /// The module's init refuses (ENODEV) a machine without `hardware`.
    pub const fn checks_for(mut self, hardware: &'static str) -> Self {
        self.hardware = Some(hardware);
        self
    }
}

/// The power button's loss, shared by `button` and `evdev`.
const WITHOUT_POWER_BUTTON: &str = "power-button requests (QEMU's system_powerdown, a cloud's \
    stop) are ignored; SIGTERM, SIGINT and SIGPWR still shut the node down in order";

/// Modules PID 1 loads at bring-up. Built-in ones are skipped at load time.
///
/// Only `aesni_intel` checks the CPU: its init returns ENODEV without AES-NI. Every
/// confidential-computing CPU has AES-NI, QEMU's default `qemu64` model does not; dm-crypt's
/// `xts(aes)` is then the `xts` template over the built-in `aes_generic`, which is why `xts`
/// is required. `hmac`, `sha256_generic`, `ecb` and
/// `aes_generic` are built into the trixie cloud kernel. The virtio drivers, `qemu_fw_cfg` and
/// `button` register and wait for their devices: a VM without the device loads them fine, and
/// the code that needs the device says what is missing.
pub const BOOT_MODULE_TABLE: &[KernelModule] = &[
    KernelModule::required(
        "virtio_blk",
        "the virtio disks (the boot disk with the rootfs, the state disk)",
    )
    .in_background(),
    KernelModule::required(
        "virtio_net",
        "the virtio NIC (hawser.net: the join service, Kubernetes)",
    )
    .before_network(),
    KernelModule::optional(
        "virtio_rng",
        "the VMM's entropy source (virtio-rng) for the first getrandom()",
        "the kernel's random pool is seeded from the TPM alone (TPM2_GetRandom), and the kernel \
         may wait for entropy until then",
    )
    .before_network(),
    KernelModule::optional(
        "qemu_fw_cfg",
        "QEMU's fw_cfg, the unmeasured per-boot settings (quote nonce, join endpoint, role)",
        "no per-boot settings from the VMM: PID 1 quotes with a nonce of its own, takes the \
         join endpoint from the kernel command line only and joins as a worker",
    )
    .before_network(),
    KernelModule::required(
        "dm_mod",
        "device-mapper (the encrypted state disk, the verified rootfs)",
    )
    .in_background(),
    KernelModule::required("dm_crypt", "the state disk's encryption (dm-crypt)").in_background(),
    KernelModule::required("dm_verity", "the rootfs's verification (dm-verity)")
        .after_state_disk()
        .only_for(Use::Rootfs),
    KernelModule::required(
        "dm_integrity",
        "the state disk's integrity mode (hawser.state_disk_integrity=hmac-sha256)",
    )
    .in_background()
    .only_for(Use::Integrity),
    KernelModule::required(
        "xts",
        "dm-crypt's aes-xts-plain64 wherever AES-NI is absent (the xts template over aes_generic; \
         the kernel would request_module it, and there is no modprobe)",
    )
    .in_background(),
    KernelModule::optional(
        "aesni_intel",
        "AES-NI for dm-crypt's aes-xts-plain64",
        "dm-crypt uses the generic AES implementation (aes_generic through xts): the same \
         cipher, slower than AES-NI",
    )
    .checks_for(
        "AES-NI in its CPU (QEMU's default qemu64 model has none: give QEMU -cpu max under TCG \
         or -cpu host under KVM)",
    )
    .in_background(),
    KernelModule::required(
        "authenc",
        "the state disk's integrity mode (dm-crypt's authenc(hmac(sha256),xts(aes)))",
    )
    .in_background()
    .only_for(Use::Integrity),
    KernelModule::required(
        "tun",
        "/dev/net/tun for the WireGuard mesh (boringtun runs in PID 1 on a tun interface)",
    )
    .after_state_disk(),
    KernelModule::required("erofs", "the immutable rootfs (erofs)")
        .after_state_disk()
        .only_for(Use::Rootfs),
    KernelModule::required("overlay", "the rootfs's writable /etc overlay")
        .after_state_disk()
        .only_for(Use::Rootfs),
    // The ACPI power button as an input device: PID 1 reads KEY_POWER from it, so that
    // `system_powerdown` and cloud "stop" requests shut the node down in order.
    KernelModule::optional(
        "button",
        "the ACPI power button (orderly shutdown on system_powerdown)",
        WITHOUT_POWER_BUTTON,
    )
    .in_background(),
    KernelModule::optional(
        "evdev",
        "the input device PID 1 reads the power button through",
        WITHOUT_POWER_BUTTON,
    )
    .in_background(),
];

/// Modules a Kubernetes node needs after the pivot, loaded by PID 1 just before it (the
/// initramfs, which carries them, is freed by the switch, and the rootfs has no modules).
/// "Required" here means required for the pod network: PID 1 reports a failure and the node
/// stays up without it. None of these checks for hardware.
pub const KUBERNETES_MODULE_TABLE: &[KernelModule] = &[
    KernelModule::required(
        "br_netfilter",
        "bridged pod traffic through iptables (net.bridge.bridge-nf-call-iptables, which \
         kubeadm's preflight checks)",
    ),
    KernelModule::required("veth", "pod network interfaces (veth pairs)"),
    KernelModule::required(
        "vxlan",
        "the overlay network of the common CNI plugins (VXLAN)",
    ),
    KernelModule::required(
        "nf_conntrack",
        "kube-proxy's Services (connection tracking)",
    ),
    KernelModule::required("nf_nat", "kube-proxy's Services and pod egress (NAT)"),
    KernelModule::required("nf_tables", "Debian's iptables, the nf_tables flavour"),
    KernelModule::required(
        "nft_compat",
        "kube-proxy's xt_* matches and targets under nf_tables iptables",
    ),
    KernelModule::required("nft_chain_nat", "nat chains under nf_tables iptables"),
    KernelModule::required("ip_tables", "kube-proxy's iptables rules"),
    KernelModule::required("iptable_filter", "kube-proxy's filter table"),
    KernelModule::required("iptable_nat", "kube-proxy's nat table"),
    KernelModule::required("xt_conntrack", "kube-proxy's rules (conntrack match)"),
    KernelModule::required("xt_MASQUERADE", "kube-proxy's rules (MASQUERADE target)"),
    KernelModule::required("xt_addrtype", "kube-proxy's rules (addrtype match)"),
    KernelModule::required("xt_comment", "kube-proxy's rules (comment match)"),
    KernelModule::required("xt_mark", "kube-proxy's rules (mark match and target)"),
    KernelModule::required("xt_nat", "kube-proxy's rules (DNAT and SNAT targets)"),
    KernelModule::required("ipt_REJECT", "kube-proxy's rules (REJECT target)"),
    KernelModule::required(
        "ip_set",
        "network policies of CNI plugins such as Calico (ipset)",
    ),
];

/// The names of [`BOOT_MODULE_TABLE`], in its order.
pub const BOOT_MODULES: &[&str] = &names::<{ BOOT_MODULE_TABLE.len() }>(BOOT_MODULE_TABLE);

/// The names of [`KUBERNETES_MODULE_TABLE`], in its order.
pub const KUBERNETES_MODULES: &[&str] =
    &names::<{ KUBERNETES_MODULE_TABLE.len() }>(KUBERNETES_MODULE_TABLE);

/// The names of a table, for the lists the image builder resolves.
const fn names<const N: usize>(table: &[KernelModule]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = table[i].name;
        i += 1;
    }
    out
}

/// One module file of a [`ModuleIndex::load_plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedModule<'t> {
    /// Its name, e.g. `dm_crypt`.
    pub name: String,
    /// Its path relative to the modules directory.
    pub path: String,
    /// The modules that must be loaded before it (as modules.dep lists them).
    pub dependencies: Vec<String>,
    /// The table entries it is loaded for: its own first, if it has one, then those of the
    /// modules that depend on it.
    pub wanted_by: Vec<&'t KernelModule>,
}

impl PlannedModule<'_> {
    /// The first required entry that needs this file: then the boot cannot do without it.
    /// `None` if only optional modules need it.
    pub fn required_by(&self) -> Option<&KernelModule> {
        self.wanted_by
            .iter()
            .copied()
            .find(|entry| entry.need == Need::Required)
    }

    /// What the boot path needs this file for: the purpose of the first required entry,
    /// naming that module when the file is only its dependency. `None` if it is optional.
    pub fn required_for(&self) -> Option<String> {
        self.required_by().map(|entry| self.purpose_of(entry))
    }

    /// What this file is loaded for: [`Self::required_for`], else the purpose of the first
    /// (optional) entry that needs it.
    pub fn purpose(&self) -> String {
        self.required_by()
            .or(self.wanted_by.first().copied())
            .map(|entry| self.purpose_of(entry))
            .unwrap_or_else(|| "(no module of the table needs it)".to_owned())
    }

    /// What the machine loses without this file: the `without` of every optional entry that
    /// needs it (for a required file, nothing is listed: it is never left out).
    pub fn without(&self) -> String {
        let mut lost: Vec<String> = Vec::new();
        for entry in &self.wanted_by {
            if let Need::Optional { without } = entry.need {
                let text = if normalize_name(entry.name) == self.name {
                    without.to_owned()
                } else {
                    format!("without {}: {without}", entry.name)
                };
                if !lost.contains(&text) {
                    lost.push(text);
                }
            }
        }
        lost.join("; ")
    }

    /// What the module's own init checks the machine for ([`KernelModule::hardware`]);
    /// `None` for a dependency without a table entry of its own.
    pub fn hardware(&self) -> Option<&'static str> {
        self.wanted_by
            .first()
            .filter(|entry| normalize_name(entry.name) == self.name)
            .and_then(|entry| entry.hardware)
    }

    fn purpose_of(&self, entry: &KernelModule) -> String {
        if normalize_name(entry.name) == self.name {
            entry.purpose.to_owned()
        } else {
            format!("{} (through {})", entry.purpose, entry.name)
        }
    }
}

/// Why a module set could not be resolved.
#[derive(Debug, thiserror::Error)]
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
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A module file's xz compression does not decompress.
    #[error("{path} is not a readable kernel module: xz")]
    Xz {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A module file (after decompression) is not an ELF object, or its `.modinfo` is unreadable.
    #[cfg(feature = "scan")]
    #[error("{path} is not a readable kernel module: {part}")]
    Elf {
        path: String,
        /// `ELF` or `.modinfo`.
        part: &'static str,
        #[source]
        source: object::read::Error,
    },
    /// A module file is an ELF object but not a kernel module.
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

    /// The files to load for `table`, dependencies first, each once, with the entries of
    /// `table` that need each file (a dependency is as needed as the neediest module that
    /// pulls it in). Built-in modules are skipped; an unknown name is
    /// [`KmodError::UnknownModule`].
    pub fn load_plan<'t>(
        &self,
        table: &'t [KernelModule],
    ) -> Result<Vec<PlannedModule<'t>>, KmodError> {
        let names: Vec<&str> = table.iter().map(|module| module.name).collect();
        let mut plan: Vec<PlannedModule<'t>> = self
            .load_order(&names)?
            .into_iter()
            .map(|path| {
                let name = normalize_name(&path);
                let dependencies = self
                    .modules
                    .get(&name)
                    .map(|(_, deps)| deps.iter().map(|dep| normalize_name(dep)).collect())
                    .unwrap_or_default();
                PlannedModule {
                    name,
                    path,
                    dependencies,
                    wanted_by: Vec::new(),
                }
            })
            .collect();
        for entry in table {
            let own_name = normalize_name(entry.name);
            for path in self.load_order(&[entry.name])? {
                if let Some(planned) = plan.iter_mut().find(|planned| planned.path == path) {
                    // The module's own entry first: its `hardware` explains its own ENODEV.
                    if planned.name == own_name {
                        planned.wanted_by.insert(0, entry);
                    } else {
                        planned.wanted_by.push(entry);
                    }
                }
            }
        }
        Ok(plan)
    }

    /// A `modules.dep` restricted to `paths`, in the order given, for shipping a subset.
    pub fn render_subset(&self, paths: &[String]) -> String {
        self.render_subset_as(paths, |path| path)
    }

    /// [`Self::render_subset`] with every path (module and dependency) written as `rename`
    /// gives it: the initramfs ships `.ko.xz` modules decompressed, under `.ko` names.
    pub fn render_subset_as(&self, paths: &[String], rename: impl Fn(&str) -> &str) -> String {
        let mut out = String::new();
        for path in paths {
            let name = normalize_name(path);
            let deps = self
                .modules
                .get(&name)
                .map(|(_, deps)| deps.iter().map(|d| rename(d)).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            out.push_str(rename(path));
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
#[cfg(feature = "scan")]
pub use scan::{decompressed_path, read_module};

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
    fn only_what_has_a_fallback_is_optional_at_boot() {
        let need = |name: &str| {
            BOOT_MODULE_TABLE
                .iter()
                .find(|module| module.name == name)
                .unwrap_or_else(|| panic!("{name} is not in BOOT_MODULE_TABLE"))
        };
        // QEMU's default CPU model lacks AES-NI; dm-crypt then runs xts over aes_generic.
        let aesni = need("aesni_intel");
        assert!(
            matches!(aesni.need, Need::Optional { without } if without.contains("generic AES"))
        );
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
}
