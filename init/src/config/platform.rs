//! `hawser.platform`: which platform the image was built for.

/// `hawser.platform`: a platform profile of hawser-platforms, or a cloud whose profile the
/// node finds out itself (`azure`: SNP or TDX, from the HCL report) or that has none yet
/// (`aws`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodePlatform {
    /// A profile by name (`qemu`, `gce`, `azure-snp`, `azure-tdx`, `sev-snp`, `tdx`).
    Profile(hawser_platforms::profile::Platform),
    /// An Azure confidential VM, SNP or TDX.
    Azure,
    /// AWS (NitroTPM): no profile verifies its evidence yet.
    Aws,
    /// QEMU with swtpm and hawser's provider CA.
    #[default]
    Qemu,
}

impl NodePlatform {
    /// Parses a `hawser.platform` value.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "azure" => Some(NodePlatform::Azure),
            "aws" => Some(NodePlatform::Aws),
            name => match hawser_platforms::profile::Platform::from_name(name).ok()? {
                hawser_platforms::profile::Platform::Qemu => Some(NodePlatform::Qemu),
                profile => Some(NodePlatform::Profile(profile)),
            },
        }
    }

    /// Where the node's unmeasured settings come from besides fw_cfg: the cloud's instance
    /// metadata service (`None` on QEMU and the bare CPUs).
    pub fn metadata_source(self) -> Option<crate::platform::metadata::MetadataSource> {
        use crate::platform::metadata::MetadataSource;
        use hawser_platforms::profile::Platform;
        match self {
            NodePlatform::Profile(Platform::Gce) => Some(MetadataSource::Gce),
            NodePlatform::Azure
            | NodePlatform::Profile(Platform::AzureSnp | Platform::AzureTdx) => {
                Some(MetadataSource::Azure)
            }
            NodePlatform::Aws => Some(MetadataSource::Aws),
            NodePlatform::Qemu | NodePlatform::Profile(_) => None,
        }
    }

    /// The profile whose evidence this node presents, where the name alone says it.
    pub fn profile(self) -> Option<hawser_platforms::profile::Platform> {
        match self {
            NodePlatform::Qemu => Some(hawser_platforms::profile::Platform::Qemu),
            NodePlatform::Profile(profile) => Some(profile),
            NodePlatform::Azure | NodePlatform::Aws => None,
        }
    }
}

impl std::fmt::Display for NodePlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodePlatform::Qemu => f.write_str("qemu"),
            NodePlatform::Profile(profile) => write!(f, "{profile}"),
            NodePlatform::Azure => f.write_str("azure"),
            NodePlatform::Aws => f.write_str("aws"),
        }
    }
}
