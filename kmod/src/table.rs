//! The tables of modules PID 1 loads: at bring-up ([`BOOT_MODULE_TABLE`], with each module's
//! purpose, need, stage and use) and after the pivot for Kubernetes
//! ([`KUBERNETES_MODULE_TABLE`]), and their name lists for the image builder.

use crate::{KernelModule, Use};

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
    .on_demand(Use::Mesh),
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
    .after_pivot(),
    KernelModule::optional(
        "evdev",
        "the input device PID 1 reads the power button through",
        WITHOUT_POWER_BUTTON,
    )
    .after_pivot(),
];

/// The modules of [`BOOT_MODULE_TABLE`] loaded after the pivot ([`crate::Stage::AfterPivot`]):
/// the rootfs carries them too, next to [`KUBERNETES_MODULES`]. The initramfs keeps them, for
/// images without a rootfs and for a bring-up that waits.
pub const AFTER_PIVOT_MODULES: &[&str] = &["button", "evdev"];

/// The modules the rootfs carries for PID 1 to load after the pivot: [`KUBERNETES_MODULES`]
/// and [`AFTER_PIVOT_MODULES`].
pub fn rootfs_modules() -> Vec<&'static str> {
    KUBERNETES_MODULES
        .iter()
        .chain(AFTER_PIVOT_MODULES)
        .copied()
        .collect()
}

/// Modules a Kubernetes node needs after the pivot, loaded by PID 1 right after it from the
/// rootfs, which carries them (the image builder writes them under `/usr/lib/modules`); the
/// initramfs carries only [`BOOT_MODULE_TABLE`] and a platform's.
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
