//! The whole image build, as `hawser image build` and the end-to-end tests run it: fetch the
//! locked inputs, compile PID 1 reproducibly, assemble initramfs and UKI ([`build_image`]);
//! for a node image also the verified rootfs, its root hash on the UKI's measured command line,
//! and the GPT disk image holding all three ([`build_node_image`]), and, for a cloud, the file
//! that cloud imports ([`crate::export`]). The platform ([`PipelineOptions::platform`]) adds its
//! arguments to the measured command line and its kernel modules to the initramfs; the default,
//! `qemu`, adds nothing.
//!
//! Reproducibility of the init binary: it is compiled with the `image` profile (one codegen
//! unit, fat LTO, stripped), the cargo home and the target directory are remapped
//! (`--remap-path-prefix`) and the workspace's sources reach rustc relative to it, so two
//! checkouts in different directories produce the same bytes. `SOURCE_DATE_EPOCH` defaults to the
//! epoch pinned in `inputs.lock`, never to the wall clock or the commit time (either would change
//! the measurements of an unchanged image).

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::build::{self, BuildInputs, BuildOutput};
use crate::compile::{image_cargo_build, image_target_dir};
use crate::disk::{self, DiskImage, DiskLayout};
use crate::export::{self, ExportedDisk};
use crate::inputs::{self, InputLock};
use crate::kubernetes::{self as k8s, Binary, KubernetesLock};
use crate::platform::ImagePlatform;
use crate::rootfs::{self, Rootfs, RootfsKubernetes, RootfsOptions};
pub use hawser_kube_types::KubernetesOrigin;

/// What to build, and from where.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// The hawser workspace (holds `inputs.lock` and the `init/` crate).
    pub workspace: PathBuf,
    /// Where the artifacts go.
    pub out_dir: PathBuf,
    /// Cargo target directory for the init binary; `None` = `$CARGO_TARGET_DIR` or `<workspace>/target`.
    pub target_dir: Option<PathBuf>,
    /// A prebuilt init binary instead of compiling one.
    pub init_binary: Option<PathBuf>,
    /// The measured kernel command line.
    pub cmdline: String,
    /// `None` = `$SOURCE_DATE_EPOCH`, else the epoch pinned in `inputs.lock`.
    pub source_date_epoch: Option<u64>,
    /// A PEM file of the CA(s) that certify attestation keys, for PID 1 to verify an attesting
    /// join service with; `None` = the image carries none (the default image).
    pub provider_ca: Option<PathBuf>,
    /// A node image's Kubernetes: built from the source pinned in `kubernetes.lock` (the
    /// default), upstream's release binaries pinned there, or hawser's stand-ins (tests).
    pub kubernetes: KubernetesOrigin,
    /// Where the image runs: its arguments go on the measured command line
    /// ([`ImagePlatform::cmdline`]), its modules into the initramfs, and a node image gets the
    /// file the platform imports next to the raw disk. `qemu` (the default) changes nothing.
    pub platform: ImagePlatform,
}

/// The kernel command line of the QEMU image: serial console, quiet kernel, and PID 1's
/// defaults spelled out so they are visible in the measurements.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 quiet panic=30 hawser.reboot_delay=30";

impl PipelineOptions {
    /// Defaults for building from `workspace` into `out_dir`.
    pub fn new(workspace: &Path, out_dir: &Path) -> Self {
        Self {
            workspace: workspace.to_owned(),
            out_dir: out_dir.to_owned(),
            target_dir: None,
            init_binary: None,
            cmdline: DEFAULT_CMDLINE.to_owned(),
            source_date_epoch: None,
            provider_ca: None,
            kubernetes: KubernetesOrigin::Source,
            platform: ImagePlatform::Qemu,
        }
    }
}

/// Why the pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The inputs could not be locked, fetched or unpacked.
    #[error(transparent)]
    Inputs(#[from] inputs::InputError),
    /// The initramfs or UKI could not be built.
    #[error(transparent)]
    Build(#[from] crate::ImageError),
    /// Compiling PID 1 failed; cargo's own output says why.
    #[error("compiling the init binary failed: `{command}` exited with {status}")]
    Compile { command: String, status: String },
    /// cargo could not be started.
    #[error("cannot run cargo")]
    Cargo(#[source] std::io::Error),
    /// The provider CA file given for the image could not be read.
    #[error("cannot read the provider CA {path}")]
    ProviderCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The rootfs could not be built.
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
    /// The disk image could not be built.
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    /// Kubernetes could not be fetched or built.
    #[error(transparent)]
    Kubernetes(Box<k8s::KubernetesError>),
    /// The file the platform imports could not be written.
    #[error("writing the {platform} image file failed")]
    Export {
        platform: ImagePlatform,
        #[source]
        source: export::ExportError,
    },
}

impl From<k8s::KubernetesError> for PipelineError {
    fn from(error: k8s::KubernetesError) -> Self {
        PipelineError::Kubernetes(Box::new(error))
    }
}

/// Timings of one pipeline run, for the summary line.
#[derive(Debug, Clone, Default)]
pub struct PipelineTimeline {
    pub steps: Vec<(&'static str, std::time::Duration)>,
}

/// Runs the whole build; returns the builder's output and the timeline.
pub fn build_image(
    opts: &PipelineOptions,
) -> Result<(BuildOutput, PipelineTimeline), PipelineError> {
    check_platform(opts)?;
    let mut timeline = PipelineTimeline::default();
    let t = Instant::now();
    let (lock, epoch) = lock_and_epoch(opts)?;
    let fetched = inputs::fetch(&lock, &inputs::cache_dir())?;
    timeline.steps.push(("fetch inputs", t.elapsed()));

    let t = Instant::now();
    let init_binary = match &opts.init_binary {
        Some(path) => path.clone(),
        None => compile_init(opts, epoch)?,
    };
    timeline.steps.push(("compile init", t.elapsed()));

    let provider_ca_pem = match &opts.provider_ca {
        Some(path) => Some(read_provider_ca(path)?),
        None => None,
    };
    let t = Instant::now();
    let output = build::build_with_modules(
        &BuildInputs {
            init_binary,
            kernel_image: fetched.kernel_image,
            kernel_release: fetched.kernel_release,
            modules_dir: fetched.modules_dir,
            lib_roots: fetched.lib_roots,
            stub: fetched.stub,
            cmdline: opts.platform.cmdline(&opts.cmdline),
            os_release: build::default_os_release(env!("CARGO_PKG_VERSION")),
            source_date_epoch: epoch,
            provider_ca_pem,
        },
        &opts.platform.kernel_module_names(),
        &opts.out_dir,
    )?;
    timeline.steps.push(("assemble image", t.elapsed()));
    Ok((output, timeline))
}

/// Refuses a command line that names another platform than the one the image is built for:
/// its modules and file would not be that platform's.
fn check_platform(opts: &PipelineOptions) -> Result<(), PipelineError> {
    match opts.platform.other_platform_named(&opts.cmdline) {
        None => Ok(()),
        Some(named) => Err(PipelineError::Build(crate::ImageError::InvalidInput(
            format!(
                "the command line says hawser.platform={named}, but the image is built for {}: \
             choose the platform with --platform, not on the command line",
                opts.platform
            ),
        ))),
    }
}

/// The input lock and the build's `SOURCE_DATE_EPOCH`: the option, else the environment, else
/// the epoch pinned in the lock.
fn lock_and_epoch(opts: &PipelineOptions) -> Result<(InputLock, u64), PipelineError> {
    let lock = InputLock::load(&opts.workspace.join("inputs.lock"))?;
    let epoch = opts
        .source_date_epoch
        .or_else(|| std::env::var("SOURCE_DATE_EPOCH").ok()?.parse().ok())
        .unwrap_or(lock.source_date_epoch);
    Ok((lock, epoch))
}

/// The disk image in the output directory of a node image build.
pub const DISK_FILE: &str = "hawser-disk.raw";

/// A node image: the UKI (with `hawser.root_hash=` on its command line), the rootfs it
/// verifies, and the GPT disk image holding both.
#[derive(Debug)]
pub struct NodeImage {
    pub image: BuildOutput,
    pub rootfs: Rootfs,
    pub disk: DiskImage,
    /// What the image's platform imports; `None` for `qemu`, which boots the raw disk.
    pub upload: Option<ExportedDisk>,
}

impl std::fmt::Display for NodeImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |n: u64| n as f64 / (1024.0 * 1024.0);
        writeln!(f, "{}", self.image)?;
        writeln!(
            f,
            "rootfs   {:>7.2} MiB erofs + {:.2} MiB dm-verity  {}",
            mib(self.rootfs.erofs_bytes),
            mib(self.rootfs.verity_bytes),
            self.rootfs.erofs.display()
        )?;
        writeln!(f, "roothash {}", hex::encode(self.rootfs.root_hash))?;
        let k = &self.rootfs.kubernetes;
        match &k.images {
            Some(images) => writeln!(
                f,
                "k8s      Kubernetes {} ({}), {} images: {} for every node in {}, {} for control \
                 planes in {}",
                k.version,
                k.origin,
                images.images.len(),
                images.node.images.len(),
                images.node.path,
                images.control_plane.images.len(),
                images.control_plane.path
            )?,
            None => writeln!(
                f,
                "k8s      STAND-INS for kubeadm and kubelet, NOT Kubernetes (--kubernetes stand-in)"
            )?,
        }
        write!(
            f,
            "disk     {:>7.2} MiB GPT (ESP, root, verity)  {}",
            mib(self.disk.bytes),
            self.disk.path.display()
        )?;
        match &self.upload {
            Some(upload) => write!(f, "\n{upload}"),
            None => Ok(()),
        }
    }
}

/// Builds a node image: the rootfs first (its root hash goes on the measured command line,
/// so PCR 11 covers the whole operating system), then the UKI with `opts.cmdline` plus
/// `hawser.root_hash=…`, then the disk image [`DISK_FILE`] from both, and for a platform other
/// than `qemu` the file it imports ([`export::export_disk`]). `progress` gets a line per step
/// of the rootfs build (mkosi takes minutes on a cold cache) and of the export.
pub fn build_node_image(
    opts: &PipelineOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<(NodeImage, PipelineTimeline), PipelineError> {
    check_platform(opts)?;
    let (lock, epoch) = lock_and_epoch(opts)?;
    let mut timeline = PipelineTimeline::default();
    let t = Instant::now();
    // Every binary of the image in one cargo invocation; PID 1's goes into the initramfs and,
    // as a copy with its libraries, into the rootfs.
    let bin_dir =
        rootfs::compile_rootfs_binaries(&opts.workspace, opts.target_dir.as_deref(), epoch)?;
    timeline.steps.push(("compile", t.elapsed()));
    let init_binary = opts
        .init_binary
        .clone()
        .unwrap_or_else(|| bin_dir.join("hawser-init"));
    let fetched = inputs::fetch(&lock, &inputs::cache_dir())?;
    let pid1_files = crate::initramfs::pid1_elf_files(&init_binary, &fetched.lib_roots)?;
    let kernel_modules = crate::initramfs::module_files(
        &fetched.modules_dir,
        &fetched.kernel_release,
        &hawser_kmod::rootfs_modules(),
    )?
    .files;
    let t = Instant::now();
    let kubernetes = node_kubernetes(opts, epoch, progress)?;
    timeline.steps.push(("kubernetes", t.elapsed()));
    let t = Instant::now();
    let rootfs = rootfs::build_rootfs(
        &RootfsOptions {
            workspace: opts.workspace.clone(),
            out_dir: opts.out_dir.clone(),
            cache_dir: inputs::cache_dir(),
            source_date_epoch: epoch,
            standin_bin_dir: bin_dir,
            kubernetes,
            pid1_files,
            kernel_modules,
        },
        progress,
    )?;
    timeline.steps.push(("rootfs", t.elapsed()));

    let uki_opts = PipelineOptions {
        cmdline: format!(
            "{} {} {}",
            opts.platform.cmdline(&opts.cmdline),
            rootfs::root_hash_cmdline_arg(&rootfs.root_hash),
            rootfs::kubernetes_cmdline_arg(&rootfs.kubernetes.version)
        ),
        source_date_epoch: Some(epoch),
        init_binary: Some(init_binary),
        ..opts.clone()
    };
    progress(&format!("UKI: command line {}", uki_opts.cmdline));
    let (image, uki_timeline) = build_image(&uki_opts)?;
    timeline.steps.extend(uki_timeline.steps);

    let t = Instant::now();
    let disk = disk::build_disk_image(
        &DiskLayout {
            uki: &image.uki.path,
            rootfs: &rootfs.erofs,
            verity: &rootfs.verity,
            root_hash: rootfs.root_hash,
            source_date_epoch: epoch,
        },
        &opts.out_dir.join(DISK_FILE),
    )?;
    timeline.steps.push(("disk image", t.elapsed()));
    let upload = match opts.platform {
        ImagePlatform::Qemu => None,
        platform => {
            let t = Instant::now();
            progress(&format!(
                "{platform}: writing the file {platform} imports from {}",
                disk.path.display()
            ));
            let upload = export::export_disk(platform, &disk.path, &opts.out_dir, epoch, progress)
                .map_err(|source| PipelineError::Export { platform, source })?;
            timeline.steps.push(("platform file", t.elapsed()));
            Some(upload)
        }
    };
    Ok((
        NodeImage {
            image,
            rootfs,
            disk,
            upload,
        },
        timeline,
    ))
}

/// The node image's Kubernetes: the stand-ins, or the binaries of `kubernetes.lock` (fetched
/// and built, or taken from the cache).
fn node_kubernetes(
    opts: &PipelineOptions,
    epoch: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<RootfsKubernetes, PipelineError> {
    if opts.kubernetes == KubernetesOrigin::StandIn {
        return Ok(RootfsKubernetes::StandIn);
    }
    let lock = KubernetesLock::load(&opts.workspace.join(k8s::LOCK_FILE))?;
    progress(&format!(
        "kubernetes: {} ({}) from {}, cached by its digest {}",
        lock.version,
        opts.kubernetes,
        k8s::LOCK_FILE,
        &lock.digest()[..16]
    ));
    let origin = match opts.kubernetes {
        KubernetesOrigin::Release => k8s::Origin::Release,
        _ => k8s::Origin::Source,
    };
    let cache = inputs::cache_dir();
    let (unpacked, report) = k8s::fetch_and_build(&lock, &cache, epoch, &Binary::ALL, origin)?;
    for (step, took) in &report.timeline {
        progress(&format!("kubernetes: {step} {:.1}s", took.as_secs_f64()));
    }
    // The pause container is built from the source tree (upstream's release tarball has no
    // pause): a release image unpacks the locked source for that one file.
    let unpacked = match unpacked {
        Some(unpacked) => unpacked,
        None => k8s::fetch(&lock, &cache)?,
    };
    // The tools image's busybox: a pinned .deb, unpacked in the input cache.
    let busybox =
        lock.tool(k8s::images::TOOLS_PACKAGE)
            .ok_or(k8s::KubernetesError::NoToolsPackage {
                package: k8s::images::TOOLS_PACKAGE,
            })?;
    let busybox_root = inputs::fetch_package(busybox, &cache, "busybox-static for the tools image")
        .map_err(k8s::KubernetesError::from)?;
    Ok(RootfsKubernetes::Real {
        origin: opts.kubernetes,
        version: lock.version.clone(),
        bin_dir: k8s::origin_dir(&cache, &lock, origin).join("bin"),
        pause_source: unpacked.source.join("build/pause/linux/pause.c"),
        busybox_root,
        busybox_version: busybox.version.clone(),
    })
}

/// Reads a provider CA PEM file, refusing one without a certificate.
fn read_provider_ca(path: &Path) -> Result<String, PipelineError> {
    let text = std::fs::read_to_string(path).map_err(|source| PipelineError::ProviderCa {
        path: path.to_path_buf(),
        source,
    })?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(PipelineError::Build(crate::ImageError::InvalidInput(
            format!(
                "the provider CA {} holds no PEM certificate",
                path.display()
            ),
        )));
    }
    Ok(text)
}

/// Compiles the image's binaries ([`crate::compile::IMAGE_PACKAGES`], one invocation) with the
/// `image` profile and remapped paths; returns PID 1's binary.
fn compile_init(opts: &PipelineOptions, epoch: u64) -> Result<PathBuf, PipelineError> {
    let target_dir = image_target_dir(&opts.workspace, opts.target_dir.as_deref());
    let mut cmd = image_cargo_build(&opts.workspace, &target_dir, epoch);
    let command = crate::compile::image_cargo_command();
    tracing::info!("compiling the image's binaries ({command})");
    let status = cmd.status().map_err(PipelineError::Cargo)?;
    if !status.success() {
        return Err(PipelineError::Compile {
            command,
            status: status.to_string(),
        });
    }
    Ok(target_dir.join("image/hawser-init"))
}
