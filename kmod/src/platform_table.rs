//! The modules each cloud's (or bare confidential VM's) devices need beyond
//! [`crate::BOOT_MODULE_TABLE`], by the platform name on the measured command line
//! (`hawser.platform=<name>`, written by `hawser image build --platform`).
//!
//! What is built into trixie's `linux-image-6.12.117+deb13-cloud-amd64` and what is a module
//! was read from that package's `modules.builtin` and `modules.order`, and each module's
//! dependencies from its `.modinfo` (`depends=`). Built in, so never shipped: `nvme` and
//! `nvme_core` (GCE's and AWS's disks, Azure's on sizes with NVMe), the TPM drivers, the AMD SEV
//! and Intel TDX guest cores. Modules, shipped in the initramfs with their dependencies:
//!
//! | platform | modules (dependencies pulled in) |
//! |---|---|
//! | `qemu` | none beyond the boot table |
//! | `gce` | `gve`, `virtio_scsi` (`scsi_mod`, `scsi_common`), `sd_mod` |
//! | `azure` | `hv_vmbus`, `hv_storvsc` (`scsi_transport_fc`, `scsi_mod`, `scsi_common`), `sd_mod`, `hv_netvsc`, `hv_utils`, `pci_hyperv` (`pci_hyperv_intf`) |
//! | `aws` | `ena`, `sev_guest` and `tsm` (`configfs`) |
//! | `sev-snp` | `sev_guest`, `tsm` (`configfs`) |
//! | `tdx` | `tdx_guest`, `tsm` (`configfs`) |
//!
//! `virtio_net`, which GCE's virtio NIC needs, is in the boot table already. Like the boot
//! table, a platform's table lists built-in modules too where the platform relies on them
//! (`nvme`): the image builder and PID 1 skip what `modules.builtin` names, and a kernel that
//! makes them modules later gets them shipped without a change here.
//!
//! Only three of these check the machine at init (ENODEV without it): `hv_vmbus` (Hyper-V),
//! `sev_guest` (an SNP guest's `sev-guest` platform device) and `tdx_guest` (a TDX guest). The
//! NIC and disk drivers register and wait for their devices.

use crate::KernelModule;

/// The names `hawser.platform=` takes, each with its modules; [`platform_modules`] looks
/// them up. `azure` is one image for Azure's SEV-SNP and TDX confidential VMs (the same
/// paravisor devices on both); the attestation profiles `azure-snp` and `azure-tdx` of
/// hawser-platforms both name it.
pub const PLATFORM_MODULE_TABLES: &[(&str, &[KernelModule])] = &[
    ("qemu", &[]),
    ("gce", GCE),
    ("azure", AZURE),
    ("aws", AWS),
    ("sev-snp", SEV_SNP),
    ("tdx", TDX),
];

/// The modules a platform needs beyond [`crate::BOOT_MODULE_TABLE`], by its name on the
/// measured command line (`hawser.platform=<name>`; `azure-snp` and `azure-tdx`, the
/// hawser-platforms profile names, are `azure`). `Some(&[])` for `qemu`, whose devices the boot
/// table covers; `None` for a name no image is built for.
pub fn platform_modules(name: &str) -> Option<&'static [KernelModule]> {
    let name = match name {
        "azure-snp" | "azure-tdx" => "azure",
        other => other,
    };
    PLATFORM_MODULE_TABLES
        .iter()
        .find(|(platform, _)| *platform == name)
        .map(|(_, modules)| *modules)
}

/// What `tsm` is for, shared by the platforms whose CPU report hawser reads itself.
const TSM: KernelModule = KernelModule::required(
    "tsm",
    "configfs-tsm (/sys/kernel/config/tsm/report), the interface the CPU's attestation report \
     is read through (pulls in configfs, which PID 1 mounts at /sys/kernel/config)",
)
.before_network();

const NVME: &str = "the NVMe disks (the boot disk and the state disk; built into trixie's cloud \
    kernel)";

/// Google Compute Engine: the boot disk is NVMe or SCSI (virtio-scsi) by machine type and
/// image, the NIC is gVNIC or virtio-net (`virtio_net` is in the boot table).
const GCE: &[KernelModule] = &[
    KernelModule::required("nvme", NVME).in_background(),
    KernelModule::required(
        "virtio_scsi",
        "GCE's virtio-scsi disk controller (machine types and images without NVMe)",
    )
    .in_background(),
    KernelModule::required("sd_mod", "SCSI disks (the disks behind virtio-scsi)").in_background(),
    KernelModule::required(
        "gve",
        "Google's gVNIC (the NIC of images with the GVNIC guest OS feature; required on C3 \
         and later machine series)",
    )
    .before_network(),
];

/// Azure confidential VMs (SEV-SNP and TDX alike): Hyper-V's VMBus behind the paravisor, its
/// synthetic SCSI disks and NIC, the integration services, and virtual PCI.
const AZURE: &[KernelModule] = &[
    KernelModule::required(
        "hv_vmbus",
        "Hyper-V's VMBus, the bus of Azure's synthetic devices",
    )
    .checks_for("Hyper-V (an Azure VM): VMBus's init refuses a machine that is not one")
    .before_network(),
    KernelModule::required(
        "hv_netvsc",
        "Azure's synthetic NIC (netvsc; the join service, Kubernetes)",
    )
    .before_network(),
    KernelModule::required(
        "hv_storvsc",
        "Azure's synthetic SCSI disks (storvsc: the OS disk, the state disk)",
    )
    .in_background(),
    KernelModule::required("sd_mod", "SCSI disks (the disks behind storvsc)").in_background(),
    KernelModule::required(
        "nvme",
        "NVMe disks on Azure sizes that present them (built into trixie's cloud kernel)",
    )
    .in_background(),
    KernelModule::optional(
        "pci_hyperv",
        "Hyper-V's virtual PCI bus (NVMe disks and accelerated-networking NICs on sizes that \
         have them)",
        "no virtual PCI devices: only the synthetic storvsc disks and netvsc NIC are seen",
    )
    .in_background(),
    KernelModule::optional(
        "hv_utils",
        "Hyper-V's integration services: the host's shutdown request, heartbeat and time sync",
        "Azure's stop is a power-off without the guest's orderly shutdown, and the host sees \
         no heartbeat",
    )
    .in_background(),
];

/// AWS (Nitro): NVMe EBS disks (built in), the ENA NIC, and on instances launched with
/// `--cpu-options AmdSevSnp=enabled` the SNP report.
const AWS: &[KernelModule] = &[
    KernelModule::required("nvme", NVME).in_background(),
    KernelModule::required(
        "ena",
        "the Elastic Network Adapter (the NIC of Nitro instances)",
    )
    .before_network(),
    KernelModule::optional(
        "sev_guest",
        "the SEV-SNP guest's attestation report (/dev/sev-guest, configfs-tsm's sev_guest \
         provider)",
        "no SNP report: the instance was launched without AmdSevSnp=enabled",
    )
    .checks_for(
        "an AMD SEV-SNP guest (an M6a, C6a or R6a instance launched with --cpu-options \
         AmdSevSnp=enabled)",
    )
    .before_network(),
    TSM,
];

/// A bare SEV-SNP guest (QEMU or another VMM): virtio devices (boot table), the SNP report.
const SEV_SNP: &[KernelModule] = &[
    KernelModule::required(
        "sev_guest",
        "the SEV-SNP guest's attestation report (/dev/sev-guest, configfs-tsm's sev_guest \
         provider)",
    )
    .checks_for("an AMD SEV-SNP guest (QEMU: -object sev-snp-guest on an SNP host)")
    .before_network(),
    TSM,
];

/// A bare TDX guest: virtio devices (boot table), the TD quote.
const TDX: &[KernelModule] = &[
    KernelModule::required(
        "tdx_guest",
        "the TDX guest's TDREPORT and quote (/dev/tdx_guest, configfs-tsm's tdx_guest \
         provider)",
    )
    .checks_for("an Intel TDX guest (QEMU: -object tdx-guest on a TDX host)")
    .before_network(),
    TSM,
];
