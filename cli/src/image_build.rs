//! What `hawser image` and the local-cluster simulator (`hawser-local`) share about building
//! the node image from this source tree: where the tree is, and the one-line timeline a build
//! prints.

use std::path::PathBuf;

use hawser_image::pipeline;

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
