//! Where an image is to run (`hawser image build --platform`): what that changes in the measured
//! image (the command line, the kernel modules in the initramfs) and which file the cloud takes.
//!
//! | platform | added to the measured command line | extra modules | upload file |
//! |---|---|---|---|
//! | `qemu` | nothing (the default image, unchanged) | none | `hawser-disk.raw` |
//! | `gce` | `hawser.platform=gce` | [`hawser_kmod::platform_modules`]`("gce")` | `hawser-gce.tar.gz` (`disk.raw` in a GNU tar, gzip) |
//! | `azure` | `earlyprintk=ttyS0 hawser.platform=azure` | `("azure")` | `hawser-azure.vhd` (fixed VHD) |
//! | `aws` | `nvme_core.io_timeout=4294967295 hawser.platform=aws` | `("aws")` | `hawser-disk.raw` (imported as a RAW snapshot) |
//! | `sev-snp` | `hawser.platform=sev-snp` | `("sev-snp")` | `hawser-disk.raw` |
//! | `tdx` | `hawser.platform=tdx` | `("tdx")` | `hawser-disk.raw` |
//!
//! Every cloud platform also gets `console=ttyS0` unless the command line already names that
//! console: serial port 1 is where GCE, Azure and AWS show a VM's console. The `qemu` image's
//! command line, initramfs and disk are byte for byte what they were before platforms existed,
//! so its published measurements stay valid. Why each setting: docs/platform-images.md.

use std::fmt;

use hawser_kmod::KernelModule;

/// The platform an image is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ImagePlatform {
    /// QEMU with swtpm and OVMF: hawser's reference platform (and the local cluster).
    #[default]
    Qemu,
    /// Google Compute Engine Confidential VMs (SEV, SEV-SNP, TDX), attested by the vTPM.
    Gce,
    /// Azure confidential VMs, SEV-SNP and TDX: one image for both.
    Azure,
    /// AWS Nitro instances with NitroTPM (and SEV-SNP where launched with it).
    Aws,
    /// A bare SEV-SNP guest of another VMM (QEMU on an SNP host).
    SevSnp,
    /// A bare TDX guest of another VMM (QEMU on a TDX host).
    Tdx,
}

/// The argument that names the platform to PID 1, which loads its modules from it.
pub const PLATFORM_ARG: &str = "hawser.platform";

/// The console every cloud shows: the first serial port.
pub const CLOUD_CONSOLE: &str = "console=ttyS0";

/// The file a cloud imports, as written next to the raw disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFormat {
    /// The raw GPT disk itself ([`crate::pipeline::DISK_FILE`]).
    Raw,
    /// `disk.raw` in a GNU tar, gzip-compressed: GCE's image import ([`crate::export::gce`]).
    GceTarGz,
    /// A fixed VHD whose virtual size is a whole number of MiB: Azure ([`crate::export::vhd`]).
    FixedVhd,
}

impl ImagePlatform {
    /// Every platform, in the order the docs list them.
    pub const ALL: [ImagePlatform; 6] = [
        ImagePlatform::Qemu,
        ImagePlatform::Gce,
        ImagePlatform::Azure,
        ImagePlatform::Aws,
        ImagePlatform::SevSnp,
        ImagePlatform::Tdx,
    ];

    /// The name `--platform` and `hawser.platform=` use; the key of
    /// [`hawser_kmod::PLATFORM_MODULE_TABLES`]. `gce`, `sev-snp` and `tdx` are also
    /// hawser-platforms' profile names; that crate's `azure-snp` and `azure-tdx` profiles both
    /// verify the `azure` image, and it has no AWS profile of its own (an AWS SNP instance's
    /// report is its `sev-snp` profile's evidence).
    pub fn name(self) -> &'static str {
        match self {
            ImagePlatform::Qemu => "qemu",
            ImagePlatform::Gce => "gce",
            ImagePlatform::Azure => "azure",
            ImagePlatform::Aws => "aws",
            ImagePlatform::SevSnp => "sev-snp",
            ImagePlatform::Tdx => "tdx",
        }
    }

    /// The platform of a name, as [`Self::name`] spells it.
    pub fn from_name(name: &str) -> Option<ImagePlatform> {
        Self::ALL
            .into_iter()
            .find(|platform| platform.name() == name)
    }

    /// The platform a measured command line names (`hawser.platform=`); `qemu` when it names
    /// none, as the default image's does. `None` for a name no image is built for.
    pub fn of_cmdline(cmdline: &str) -> Option<ImagePlatform> {
        let prefix = format!("{PLATFORM_ARG}=");
        match cmdline
            .split_whitespace()
            .filter_map(|arg| arg.strip_prefix(prefix.as_str()))
            .next_back()
        {
            Some(name) => Self::from_name(name),
            None => Some(ImagePlatform::Qemu),
        }
    }

    /// Kernel arguments the platform's documentation asks for, besides the console: Azure's
    /// early serial output, and AWS's recommended NVMe timeout for EBS volumes (the 30 s
    /// default fails I/O that EBS merely delays).
    fn recommended_args(self) -> &'static [&'static str] {
        match self {
            ImagePlatform::Azure => &["earlyprintk=ttyS0"],
            ImagePlatform::Aws => &["nvme_core.io_timeout=4294967295"],
            _ => &[],
        }
    }

    /// Whether the platform is a cloud whose console is the first serial port.
    fn is_cloud(self) -> bool {
        matches!(
            self,
            ImagePlatform::Gce | ImagePlatform::Azure | ImagePlatform::Aws
        )
    }

    /// A `hawser.platform=` value of `cmdline` that is not this platform's name: a command line
    /// that names another platform than the image is built for.
    pub fn other_platform_named(self, cmdline: &str) -> Option<&str> {
        let prefix = format!("{PLATFORM_ARG}=");
        cmdline
            .split_whitespace()
            .filter_map(|arg| arg.strip_prefix(prefix.as_str()))
            .find(|name| *name != self.name())
    }

    /// The measured command line of this platform's image, from the one the user chose: for
    /// `qemu` exactly `base`; for the others `base`, then `console=ttyS0` on a cloud whose
    /// line lacks it, the platform's recommended arguments and `hawser.platform=<name>`, each
    /// unless already there (so a line made by this function is its own result).
    pub fn cmdline(self, base: &str) -> String {
        if self == ImagePlatform::Qemu {
            return base.to_owned();
        }
        let has = |arg: &str| base.split_whitespace().any(|word| word == arg);
        let mut args: Vec<String> = base.split_whitespace().map(str::to_owned).collect();
        if self.is_cloud() && !has(CLOUD_CONSOLE) {
            args.push(CLOUD_CONSOLE.to_owned());
        }
        for arg in self.recommended_args() {
            if !has(arg) {
                args.push((*arg).to_owned());
            }
        }
        let own = format!("{PLATFORM_ARG}={}", self.name());
        if !has(&own) {
            args.push(own);
        }
        args.join(" ")
    }

    /// The kernel modules this platform adds to the initramfs (their dependencies come along).
    pub fn kernel_modules(self) -> &'static [KernelModule] {
        hawser_kmod::platform_modules(self.name()).unwrap_or_default()
    }

    /// The names of [`Self::kernel_modules`], for the initramfs spec.
    pub fn kernel_module_names(self) -> Vec<&'static str> {
        self.kernel_modules()
            .iter()
            .map(|module| module.name)
            .collect()
    }

    /// The file this platform imports.
    pub fn disk_format(self) -> DiskFormat {
        match self {
            ImagePlatform::Gce => DiskFormat::GceTarGz,
            ImagePlatform::Azure => DiskFormat::FixedVhd,
            _ => DiskFormat::Raw,
        }
    }

    /// What to do with the built image on this platform, in a few lines (the whole of it is
    /// in docs/platform-images.md). `upload` is the file to upload.
    pub fn next_steps(self, upload: &str) -> String {
        match self {
            ImagePlatform::Qemu => format!(
                "boot {upload} with OVMF and swtpm (docs/qemu.md), or `scripts/local-up --image DIR`"
            ),
            ImagePlatform::Gce => format!(
                "gcloud storage cp {upload} gs://BUCKET/\n\
                 gcloud compute images create IMAGE --source-uri=gs://BUCKET/{upload} \
                 --guest-os-features=UEFI_COMPATIBLE,SEV_CAPABLE,SEV_SNP_CAPABLE,TDX_CAPABLE,GVNIC\n\
                 (Shielded VM: vTPM on, Secure Boot off; docs/platform-images.md#gce)"
            ),
            ImagePlatform::Azure => format!(
                "azcopy copy {upload} 'https://ACCOUNT.blob.core.windows.net/CONTAINER/{upload}?SAS' \
                 --blob-type PageBlob\n\
                 then an Azure Compute Gallery image (Hyper-V generation V2, security type \
                 ConfidentialVMSupported) from that blob, and VMs with --security-type \
                 ConfidentialVM --enable-vtpm true --enable-secure-boot false \
                 (docs/platform-images.md#azure)"
            ),
            ImagePlatform::Aws => format!(
                "aws s3 cp {upload} s3://BUCKET/\n\
                 aws ec2 import-snapshot --disk-container Format=RAW,UserBucket={{S3Bucket=BUCKET,S3Key={upload}}}\n\
                 aws ec2 register-image --name NAME --architecture x86_64 --virtualization-type hvm \
                 --ena-support --root-device-name /dev/xvda \
                 --block-device-mappings DeviceName=/dev/xvda,Ebs={{SnapshotId=SNAPSHOT}} \
                 --boot-mode uefi --tpm-support v2.0\n\
                 (the AMI MUST be registered with --boot-mode uefi --tpm-support v2.0: NitroTPM \
                 holds the measurements; docs/platform-images.md#aws)"
            ),
            ImagePlatform::SevSnp | ImagePlatform::Tdx => format!(
                "boot {upload} as a confidential guest of your VMM with UEFI firmware and a \
                 TPM (docs/platform-images.md#bare-sev-snp-and-tdx-guests)"
            ),
        }
    }
}

impl fmt::Display for ImagePlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::DEFAULT_CMDLINE;

    #[test]
    fn the_qemu_command_line_is_left_exactly_as_it_was() {
        assert_eq!(ImagePlatform::default(), ImagePlatform::Qemu);
        assert_eq!(
            ImagePlatform::Qemu.cmdline(DEFAULT_CMDLINE),
            DEFAULT_CMDLINE
        );
        // Not even whitespace is normalised: these bytes are measured.
        assert_eq!(ImagePlatform::Qemu.cmdline("a  b "), "a  b ");
        assert!(ImagePlatform::Qemu.kernel_modules().is_empty());
        assert_eq!(ImagePlatform::Qemu.disk_format(), DiskFormat::Raw);
    }

    #[test]
    fn each_platform_adds_its_console_arguments_and_name() {
        let line = |platform: ImagePlatform| platform.cmdline(DEFAULT_CMDLINE);
        assert_eq!(
            line(ImagePlatform::Gce),
            format!("{DEFAULT_CMDLINE} hawser.platform=gce")
        );
        assert_eq!(
            line(ImagePlatform::Azure),
            format!("{DEFAULT_CMDLINE} earlyprintk=ttyS0 hawser.platform=azure")
        );
        assert_eq!(
            line(ImagePlatform::Aws),
            format!("{DEFAULT_CMDLINE} nvme_core.io_timeout=4294967295 hawser.platform=aws")
        );
        assert_eq!(
            line(ImagePlatform::SevSnp),
            format!("{DEFAULT_CMDLINE} hawser.platform=sev-snp")
        );
        assert_eq!(
            line(ImagePlatform::Tdx),
            format!("{DEFAULT_CMDLINE} hawser.platform=tdx")
        );
        // A cloud's console is added to a line without it; a bare guest's line is the user's.
        assert_eq!(
            ImagePlatform::Gce.cmdline("quiet"),
            "quiet console=ttyS0 hawser.platform=gce"
        );
        assert_eq!(
            ImagePlatform::Tdx.cmdline("quiet"),
            "quiet hawser.platform=tdx"
        );
        // Applied twice (the node image adds its root hash in between), nothing is repeated.
        for platform in ImagePlatform::ALL {
            let once = format!("{} hawser.root_hash=ab", platform.cmdline(DEFAULT_CMDLINE));
            assert_eq!(platform.cmdline(&once), once, "{platform}");
        }
    }

    #[test]
    fn a_command_line_naming_another_platform_is_noticed() {
        let gce = ImagePlatform::Gce.cmdline(DEFAULT_CMDLINE);
        assert_eq!(ImagePlatform::Gce.other_platform_named(&gce), None);
        assert_eq!(ImagePlatform::Azure.other_platform_named(&gce), Some("gce"));
        assert_eq!(ImagePlatform::Qemu.other_platform_named(&gce), Some("gce"));
        assert_eq!(
            ImagePlatform::Qemu.other_platform_named(DEFAULT_CMDLINE),
            None
        );
    }

    #[test]
    fn the_command_line_names_the_platform_back() {
        for platform in ImagePlatform::ALL {
            let line = platform.cmdline(DEFAULT_CMDLINE);
            assert_eq!(ImagePlatform::of_cmdline(&line), Some(platform), "{line}");
            assert_eq!(ImagePlatform::from_name(platform.name()), Some(platform));
            assert_eq!(platform.to_string(), platform.name());
        }
        assert_eq!(ImagePlatform::of_cmdline("hawser.platform=mars"), None);
    }

    #[test]
    fn every_platform_has_a_module_table_and_a_disk_format() {
        for platform in ImagePlatform::ALL {
            assert!(
                hawser_kmod::platform_modules(platform.name()).is_some(),
                "{platform} has no module table in hawser-kmod"
            );
        }
        assert_eq!(ImagePlatform::Gce.disk_format(), DiskFormat::GceTarGz);
        assert_eq!(ImagePlatform::Azure.disk_format(), DiskFormat::FixedVhd);
        assert_eq!(ImagePlatform::Aws.disk_format(), DiskFormat::Raw);
        assert!(ImagePlatform::Gce.kernel_module_names().contains(&"gve"));
        assert!(ImagePlatform::Aws.kernel_module_names().contains(&"ena"));
        assert!(
            ImagePlatform::Aws
                .next_steps("hawser-disk.raw")
                .contains("--boot-mode uefi --tpm-support v2.0")
        );
    }
}
