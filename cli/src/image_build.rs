//! What `hawser image` and the local-cluster simulator (`hawser-local`) share about building
//! the node image from this source tree: where the tree is, and the one-line timeline a build
//! prints; the `--platform` of `hawser image build`, and what a platform's measurements are
//! published as.

use std::path::PathBuf;

use hawser_image::pipeline;
use hawser_image::platform::ImagePlatform;
use hawser_platforms::profile::Platform;

/// The workspace this CLI was built from, or the current directory's git top level.
pub fn workspace() -> anyhow::Result<PathBuf> {
    let here = std::env::current_dir()?;
    for dir in here.ancestors() {
        if dir.join("inputs.lock").is_file() && dir.join("init/Cargo.toml").is_file() {
            return Ok(dir.to_owned());
        }
    }
    anyhow::bail!(
        "run hawser from inside the hawser source tree (no inputs.lock and init/ found above {})",
        here.display()
    )
}

/// One line: each step of the build and how long it took.
pub fn print_timeline(timeline: &pipeline::PipelineTimeline) {
    let steps: Vec<String> = timeline
        .steps
        .iter()
        .map(|(name, d)| format!("{name} {:.1}s", d.as_secs_f64()))
        .collect();
    println!("timeline: {}", steps.join(", "));
}

/// `--kubernetes` of `hawser image build`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeKubernetes {
    /// Built from Debian's source package pinned in kubernetes.lock.
    Source,
    /// Upstream's release binaries pinned in kubernetes.lock.
    Release,
    /// hawser's stand-ins for kubeadm and kubelet: not Kubernetes.
    StandIn,
}

impl From<NodeKubernetes> for hawser_kube_types::KubernetesOrigin {
    fn from(from: NodeKubernetes) -> hawser_kube_types::KubernetesOrigin {
        match from {
            NodeKubernetes::Source => hawser_kube_types::KubernetesOrigin::Source,
            NodeKubernetes::Release => hawser_kube_types::KubernetesOrigin::Release,
            NodeKubernetes::StandIn => hawser_kube_types::KubernetesOrigin::StandIn,
        }
    }
}

/// `--platform` of `hawser image build`: where the image runs (docs/platform-images.md).
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum NodePlatform {
    /// QEMU with swtpm and OVMF (the local cluster): the raw disk, the image as it always was.
    Qemu,
    /// Google Compute Engine Confidential VMs: disk.raw in a GNU tar, gzip'd (hawser-gce.tar.gz).
    Gce,
    /// Azure confidential VMs, SEV-SNP and TDX: a fixed VHD (hawser-azure.vhd).
    Azure,
    /// AWS with NitroTPM: the raw disk, imported as a snapshot; register the AMI with
    /// `--boot-mode uefi --tpm-support v2.0`.
    Aws,
    /// A bare AMD SEV-SNP guest: the raw disk.
    SevSnp,
    /// A bare Intel TDX guest: the raw disk.
    Tdx,
}

impl From<NodePlatform> for ImagePlatform {
    fn from(from: NodePlatform) -> ImagePlatform {
        match from {
            NodePlatform::Qemu => ImagePlatform::Qemu,
            NodePlatform::Gce => ImagePlatform::Gce,
            NodePlatform::Azure => ImagePlatform::Azure,
            NodePlatform::Aws => ImagePlatform::Aws,
            NodePlatform::SevSnp => ImagePlatform::SevSnp,
            NodePlatform::Tdx => ImagePlatform::Tdx,
        }
    }
}

/// One entry of a published measurements file's `list`: Constellation's `csp` and
/// `attestationVariant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishedVariant {
    pub csp: &'static str,
    pub attestation_variant: &'static str,
}

/// Constellation's (and hawser-platforms') name of AWS's SEV-SNP evidence; hawser-platforms
/// verifies it with its `sev-snp` profile and has no AWS profile of its own.
pub const AWS_SEV_SNP_VARIANT: &str = "aws-sev-snp";

/// The `list` entries a published measurements file carries for an image of `platform`, the
/// measurements being the same in each: one per attestation variant the image's nodes present.
/// An Azure image boots as an SNP or a TDX confidential VM, so it is published for both
/// (`azure-sev-snp`, `azure-tdx`) in one file.
pub fn published_variants(platform: ImagePlatform) -> Vec<PublishedVariant> {
    let variant = |csp, profile: Platform| PublishedVariant {
        csp,
        attestation_variant: profile.attestation_variant(),
    };
    match platform {
        ImagePlatform::Qemu => vec![variant("QEMU", Platform::Qemu)],
        ImagePlatform::Gce => vec![variant("GCP", Platform::Gce)],
        ImagePlatform::Azure => vec![
            variant("Azure", Platform::AzureSnp),
            variant("Azure", Platform::AzureTdx),
        ],
        ImagePlatform::Aws => vec![PublishedVariant {
            csp: "AWS",
            attestation_variant: AWS_SEV_SNP_VARIANT,
        }],
        ImagePlatform::SevSnp => vec![variant("QEMU", Platform::SevSnp)],
        ImagePlatform::Tdx => vec![variant("QEMU", Platform::Tdx)],
    }
}

/// What `hawser image build` prints after a node image for `platform`: the file to upload and
/// the commands that make it an image there.
pub fn print_next_steps(platform: ImagePlatform, upload: &std::path::Path) {
    let name = upload.file_name().map_or_else(
        || upload.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    println!("{platform} image: {}", upload.display());
    for line in platform.next_steps(&name).lines() {
        println!("  {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_platform_option_is_an_image_platform_of_the_same_name() {
        use clap::ValueEnum as _;
        let options: Vec<String> = NodePlatform::value_variants()
            .iter()
            .map(|option| option.to_possible_value().unwrap().get_name().to_owned())
            .collect();
        let platforms: Vec<&str> = ImagePlatform::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(options, platforms);
        for option in NodePlatform::value_variants() {
            let name = option.to_possible_value().unwrap().get_name().to_owned();
            assert_eq!(ImagePlatform::from(*option).name(), name);
        }
    }

    #[test]
    fn each_platform_is_published_under_the_variants_hawser_platforms_verifies() {
        let variants = |platform| -> Vec<&str> {
            published_variants(platform)
                .iter()
                .map(|v| v.attestation_variant)
                .collect()
        };
        assert_eq!(variants(ImagePlatform::Qemu), ["qemu-vtpm"]);
        assert_eq!(variants(ImagePlatform::Gce), ["gcp-sev-es"]);
        assert_eq!(
            variants(ImagePlatform::Azure),
            ["azure-sev-snp", "azure-tdx"]
        );
        assert_eq!(variants(ImagePlatform::Aws), ["aws-sev-snp"]);
        assert_eq!(variants(ImagePlatform::SevSnp), ["qemu-sev-snp"]);
        assert_eq!(variants(ImagePlatform::Tdx), ["qemu-tdx"]);
        // Every variant selects a profile, and the image's own name where it is one.
        for platform in ImagePlatform::ALL {
            for published in published_variants(platform) {
                let profile = Platform::from_name(published.attestation_variant).unwrap();
                if let Ok(named) = Platform::from_name(platform.name()) {
                    assert_eq!(profile, named, "{platform}");
                }
            }
        }
        assert_eq!(
            Platform::from_name(AWS_SEV_SNP_VARIANT).unwrap(),
            Platform::SevSnp
        );
    }
}
