//! `hawser image …`: lock and fetch the inputs, build the image, show what is in it.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Subcommand, ValueEnum};
use hawser_image::inputs::{self, InputLock};
use hawser_image::kubernetes::{self, KubernetesLock};
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_image::profile::ImageProfile;
use hawser_image::rootfs::{self, lock::RootfsLock};

use hawser_cli::image_build::{
    NodeKubernetes, NodePlatform, print_next_steps, print_timeline, workspace,
};
use hawser_image::platform::ImagePlatform;

#[derive(Subcommand)]
pub enum ImageCommand {
    /// Build the node image from the locked inputs: the verified rootfs (mkosi → erofs +
    /// dm-verity), the UKI (hawser.efi) with the root hash on its measured command line, and
    /// the GPT disk image (hawser-disk.raw) holding both.
    Build {
        /// Output directory.
        #[arg(long, default_value = "out")]
        out: PathBuf,
        /// Use this init binary instead of compiling one.
        #[arg(long)]
        init: Option<PathBuf>,
        /// Replace the measured kernel command line (a production image adds
        /// `hawser.state_disk_integrity=hmac-sha256` to it).
        #[arg(long, default_value = pipeline::DEFAULT_CMDLINE)]
        cmdline: String,
        /// A development image: the state disk is AES-XTS only (confidentiality without
        /// integrity: the host can change sectors undetected) and its first boot skips the
        /// integrity wipe. Without it the image is for production: the state disk has
        /// hmac-sha256 integrity (docs/security.md).
        #[arg(long)]
        development: bool,
        /// Cargo target directory for the init binary.
        #[arg(long)]
        target_dir: Option<PathBuf>,
        /// PEM of the CA(s) certifying attestation keys: PID 1 verifies an attesting join
        /// service (`hawser.join_service_trust=attested`) with it. Changes PCRs 4, 9 and 11.
        #[arg(long)]
        provider_ca: Option<PathBuf>,
        /// Only the UKI and initramfs, without rootfs and disk image (PID 1 then stops after
        /// the state disk: the image of the boot-phase tests).
        #[arg(long)]
        uki_only: bool,
        /// Where the node's Kubernetes comes from: built from the source pinned in
        /// kubernetes.lock (cached; 10–13 min cold), upstream's release binaries pinned there,
        /// or hawser's stand-ins (NOT Kubernetes: for tests that need a fast boot).
        #[arg(long, value_enum, default_value_t = NodeKubernetes::Source)]
        kubernetes: NodeKubernetes,
        /// Where the image runs: adds the platform's console and `hawser.platform=` to the
        /// measured command line (not for qemu), its NIC, disk and attestation drivers to the
        /// initramfs, and writes the file the cloud imports next to the raw disk
        /// (docs/platform-images.md).
        #[arg(long, value_enum, default_value_t = NodePlatform::Qemu)]
        platform: NodePlatform,
    },
    /// Download, verify and unpack the inputs named in inputs.lock, and download and verify
    /// the rootfs packages named in rootfs.lock.
    Fetch,
    /// Re-resolve the inputs against the Debian archive and rewrite inputs.lock, and re-pin the
    /// rootfs (one mkosi build from the live archive; its packages' files) into rootfs.lock.
    /// Either changes the image and its measurements.
    Lock {
        /// Re-pin only this lock.
        #[arg(long, value_enum)]
        only: Option<LockFile>,
    },
    /// Fetch the Kubernetes input pinned in kubernetes.lock (Debian's source and Go toolchain)
    /// and build its binaries reproducibly, each cached by (lock digest, name); prints each
    /// binary's path and sha256 (docs/kubernetes.md). A cold build of all six takes 10–13 min
    /// on 2 cores; a cached run under a second. `--from release` takes upstream's release
    /// binaries pinned in the same lock instead (needs dl.k8s.io), into the same layout.
    Kubernetes {
        /// Where the binaries come from: built from the pinned source, or upstream's release
        /// tarball pinned by sha512.
        #[arg(long, value_enum, default_value = "source")]
        from: KubernetesFrom,
        /// Build only these, comma-separated (kubeadm, kubelet, kube-apiserver,
        /// kube-controller-manager, kube-scheduler, kube-proxy); default all.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Also copy the binaries into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// `--from` of `hawser image kubernetes`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubernetesFrom {
    /// Build from Debian's source package and Go toolchain ([[source]], [[toolchain]]).
    Source,
    /// Upstream's release binaries ([[release]]), downloaded from the release site.
    Release,
}

impl From<KubernetesFrom> for kubernetes::Origin {
    fn from(from: KubernetesFrom) -> Self {
        match from {
            KubernetesFrom::Source => kubernetes::Origin::Source,
            KubernetesFrom::Release => kubernetes::Origin::Release,
        }
    }
}

/// One of the two lock files.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LockFile {
    /// inputs.lock: the UKI's kernel, stub and libraries.
    Inputs,
    /// rootfs.lock: every Debian package of the node's rootfs.
    Rootfs,
}

pub fn run(cmd: ImageCommand) -> anyhow::Result<()> {
    let ws = workspace()?;
    let lock_path = ws.join("inputs.lock");
    match cmd {
        ImageCommand::Build {
            out,
            init,
            cmdline,
            development,
            target_dir,
            provider_ca,
            uki_only,
            kubernetes,
            platform,
        } => {
            let platform = ImagePlatform::from(platform);
            let profile = if development {
                ImageProfile::Development
            } else {
                ImageProfile::Production
            };
            let cmdline = platform.cmdline(&profile.cmdline(&cmdline)?);
            eprintln!("{profile:?} image for {platform}, measured command line: {cmdline}");
            let opts = PipelineOptions {
                init_binary: init,
                cmdline,
                target_dir,
                provider_ca,
                kubernetes: kubernetes.into(),
                platform,
                ..PipelineOptions::new(&ws, &out)
            };
            if uki_only {
                let (output, timeline) = pipeline::build_image(&opts)?;
                println!("{output}");
                print_timeline(&timeline);
                if platform != ImagePlatform::Qemu {
                    eprintln!("no {platform} upload file: --uki-only builds no disk image");
                }
            } else {
                let (node, timeline) =
                    pipeline::build_node_image(&opts, &mut |line| eprintln!("{line}"))?;
                println!("{node}");
                print_timeline(&timeline);
                if let Some(upload) = &node.upload {
                    print_next_steps(platform, &upload.path);
                }
            }
        }
        ImageCommand::Fetch => {
            let lock = InputLock::load(&lock_path)?;
            let fetched = inputs::fetch(&lock, &inputs::cache_dir())?;
            println!(
                "inputs ready in {} (kernel {}, lock {})",
                inputs::cache_dir().display(),
                fetched.kernel_release,
                &fetched.lock_digest[..16]
            );
            let rootfs_lock = rootfs::load_rootfs_lock(&ws)?;
            rootfs::repo::fetch_locked_debs(&rootfs_lock, &inputs::cache_dir(), &mut |line| {
                eprintln!("{line}");
            })?;
        }
        ImageCommand::Kubernetes { from, only, out } => {
            build_kubernetes(&ws, &lock_path, from.into(), &only, out.as_deref())?;
        }
        ImageCommand::Lock { only } => {
            if only != Some(LockFile::Rootfs) {
                lock_inputs(&lock_path)?;
            }
            if only != Some(LockFile::Inputs) {
                lock_rootfs(&ws, &lock_path)?;
            }
        }
    }
    Ok(())
}

/// `hawser image kubernetes`: fetch + build or read out of the release (cached), then one line
/// per binary.
fn build_kubernetes(
    ws: &Path,
    inputs_lock: &Path,
    origin: kubernetes::Origin,
    only: &[String],
    out: Option<&Path>,
) -> anyhow::Result<()> {
    let binaries = if only.is_empty() {
        kubernetes::Binary::ALL.to_vec()
    } else {
        only.iter()
            .map(|name| {
                kubernetes::Binary::from_name(name).with_context(|| {
                    format!(
                        "--only {name}: not a binary of the Kubernetes tree (one of {})",
                        kubernetes::Binary::ALL.map(|b| b.name()).join(", ")
                    )
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let lock = KubernetesLock::load(&ws.join(kubernetes::LOCK_FILE))?;
    let epoch = InputLock::load(inputs_lock)?.source_date_epoch;
    eprintln!(
        "Kubernetes {}, {}, from {} ({} digest {})",
        lock.version,
        hawser_kube_types::KubernetesOrigin::from(origin),
        kubernetes::LOCK_FILE,
        origin.name(),
        &lock.digest_for(origin)[..16]
    );
    let (_, report) =
        kubernetes::fetch_and_build(&lock, &inputs::cache_dir(), epoch, &binaries, origin)?;
    if let Some(out) = out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    }
    for built in &report.binaries {
        let path = match out {
            Some(out) => {
                let to = out.join(built.binary.name());
                std::fs::copy(&built.path, &to).with_context(|| {
                    format!("copying {} to {}", built.path.display(), to.display())
                })?;
                to
            }
            None => built.path.clone(),
        };
        println!(
            "{}  {}{}",
            built.sha256,
            path.display(),
            if built.cached { "  (cached)" } else { "" }
        );
    }
    let steps: Vec<String> = report
        .timeline
        .iter()
        .map(|(name, d)| format!("{name} {:.1}s", d.as_secs_f64()))
        .collect();
    println!("timeline: {}", steps.join(", "));
    Ok(())
}

/// Re-resolves inputs.lock and prints each package's change.
fn lock_inputs(lock_path: &Path) -> anyhow::Result<()> {
    let old = InputLock::load(lock_path).ok();
    let lock = inputs::resolve_lock(&inputs::cache_dir())?;
    std::fs::write(lock_path, lock.render())
        .with_context(|| format!("writing {}", lock_path.display()))?;
    for p in &lock.packages {
        let before = old.as_ref().and_then(|o| {
            o.packages
                .iter()
                .find(|q| q.role == p.role && q.name == p.name)
        });
        let change = match before {
            Some(b) if b.sha256 == p.sha256 => "unchanged".to_owned(),
            Some(b) => format!("was {}", b.version),
            None => "new".to_owned(),
        };
        println!("{:<40} {:<24} {change}", p.name, p.version);
    }
    println!(
        "wrote {} (digest {})",
        lock_path.display(),
        &lock.digest()[..16]
    );
    Ok(())
}

/// Re-pins rootfs.lock and prints what changed (old → new).
fn lock_rootfs(ws: &Path, inputs_lock: &Path) -> anyhow::Result<()> {
    let path = ws.join(rootfs::lock::LOCK_FILE);
    let old = RootfsLock::load(&path).ok();
    let epoch = InputLock::load(inputs_lock)?.source_date_epoch;
    let lock = rootfs::lock_rootfs(ws, &inputs::cache_dir(), epoch, &mut |line| {
        eprintln!("{line}");
    })?;
    std::fs::write(&path, lock.render()).with_context(|| format!("writing {}", path.display()))?;
    let before = old.as_ref().map(RootfsLock::versions).unwrap_or_default();
    let changes = rootfs::lock::package_drift(&before, &lock.versions());
    for change in &changes {
        println!("  {change}");
    }
    let unchanged_files = old.as_ref().map_or(0, |o| {
        lock.packages
            .iter()
            .filter(|p| o.packages.iter().any(|q| q == *p))
            .count()
    });
    println!(
        "wrote {} (digest {}): {} packages, {} changed, {unchanged_files} unchanged{}",
        path.display(),
        &lock.digest()[..16],
        lock.packages.len(),
        changes.len(),
        if old.as_ref().is_some_and(|o| o.digest() != lock.digest()) || old.is_none() {
            "; the node image and its measurements change: run `hawser measurements check --node --update`"
        } else {
            ""
        }
    );
    Ok(())
}
