//! The image build: initramfs, UKI and the files next to them, from already-fetched inputs.
//!
//! Outputs in `out_dir`:
//! - `hawser.efi`: the UKI (systemd-stub + `.osrel` `.cmdline` `.uname` `.linux` `.initrd`);
//! - `initrd.cpio.zst`, `vmlinuz`, `cmdline`: the same initramfs, kernel and command line, for
//!   direct-kernel test boots (`qemu -kernel -initrd -append`) that skip the firmware;
//! - `manifest.json`: every initramfs entry with size and sha256, the UKI section sizes and
//!   digests, and the sha256 of each output, so two builds can be compared file by file.
//!
//! Outputs are written to a temporary name and renamed, so a failed build never leaves a
//! half-written artifact under the final name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::ImageError;
use crate::initramfs::{self, InitramfsSpec, ManifestEntry};
use crate::uki::{self, UkiSections};

/// File names of the outputs.
pub const UKI_FILE: &str = "hawser.efi";
pub const INITRD_FILE: &str = "initrd.cpio.zst";
pub const KERNEL_FILE: &str = "vmlinuz";
pub const CMDLINE_FILE: &str = "cmdline";
pub const MANIFEST_FILE: &str = "manifest.json";

/// The x86 boot protocol's limit on the command line (`COMMAND_LINE_SIZE`, with its NUL).
const MAX_CMDLINE: usize = 2047;

/// Everything the build reads. Paths point into the unpacked input cache.
#[derive(Debug, Clone)]
pub struct BuildInputs {
    /// PID 1 (`target/image/hawser-init`).
    pub init_binary: PathBuf,
    /// The kernel's bzImage (`boot/vmlinuz-<kver>`).
    pub kernel_image: PathBuf,
    /// `uname -r` of that kernel.
    pub kernel_release: String,
    /// `usr/lib/modules/<kver>` of the kernel package.
    pub modules_dir: PathBuf,
    /// Unpacked library packages, searched in order.
    pub lib_roots: Vec<PathBuf>,
    /// systemd-stub (`linuxx64.efi.stub`).
    pub stub: PathBuf,
    /// The measured kernel command line.
    pub cmdline: String,
    /// The `.osrel` section (os-release format).
    pub os_release: String,
    /// Timestamp of every initramfs entry.
    pub source_date_epoch: u64,
    /// PEM of the attestation-key CA(s) PID 1 trusts an attesting join service under
    /// (installed at [`initramfs::PROVIDER_CA_PATH`]); `None` for images that carry none.
    pub provider_ca_pem: Option<String>,
}

/// One written file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Artifact {
    pub path: PathBuf,
    pub size: u64,
    pub sha256: String,
}

impl Artifact {
    fn of(path: PathBuf, data: &[u8]) -> Self {
        Self {
            path,
            size: data.len() as u64,
            sha256: sha256_hex(data),
        }
    }
}

/// What [`build`] wrote.
#[derive(Debug, Clone)]
pub struct BuildOutput {
    pub uki: Artifact,
    pub initrd: Artifact,
    pub kernel: Artifact,
    pub cmdline: Artifact,
    pub manifest: PathBuf,
    /// Size of the initramfs before compression.
    pub initramfs_uncompressed_size: u64,
    /// Number of entries in the initramfs.
    pub initramfs_entries: usize,
    /// Kernel modules shipped, in load order (paths relative to the modules directory).
    pub modules: Vec<String>,
    /// `uname -r` of the kernel in the image.
    pub kernel_release: String,
}

impl std::fmt::Display for BuildOutput {
    /// The build summary `hawser image build` prints.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |n: u64| n as f64 / (1024.0 * 1024.0);
        writeln!(f, "kernel   {}", self.kernel_release)?;
        writeln!(
            f,
            "initrd   {:>7.2} MiB zstd ({:.2} MiB, {} entries, {} modules)  {}",
            mib(self.initrd.size),
            mib(self.initramfs_uncompressed_size),
            self.initramfs_entries,
            self.modules.len(),
            self.initrd.path.display()
        )?;
        writeln!(
            f,
            "UKI      {:>7.2} MiB  {}",
            mib(self.uki.size),
            self.uki.path.display()
        )?;
        writeln!(f, "sha256   {}  hawser.efi", self.uki.sha256)?;
        write!(f, "manifest {}", self.manifest.display())
    }
}

/// Size and digest of a section's content.
#[derive(Debug, Clone, Serialize)]
struct SectionSummary {
    size: u64,
    sha256: String,
}

#[derive(Debug, Serialize)]
struct Manifest<'a> {
    manifest_version: u32,
    hawser_image_version: &'a str,
    kernel_release: &'a str,
    source_date_epoch: u64,
    cmdline: &'a str,
    outputs: BTreeMap<&'static str, OutputSummary>,
    uki_sections: BTreeMap<&'static str, SectionSummary>,
    initramfs: InitramfsSummary<'a>,
}

#[derive(Debug, Serialize)]
struct OutputSummary {
    size: u64,
    sha256: String,
}

#[derive(Debug, Serialize)]
struct InitramfsSummary<'a> {
    compression: String,
    uncompressed_size: u64,
    compressed_size: u64,
    modules: &'a [String],
    entries: &'a [ManifestEntry],
}

/// The `.osrel` content for a hawser image of `version`.
pub fn default_os_release(version: &str) -> String {
    format!("ID=hawser\nNAME=\"hawser\"\nVERSION_ID={version}\nPRETTY_NAME=\"hawser {version}\"\n")
}

/// Builds the image from `inputs` into `out_dir` (created if missing).
pub fn build(inputs: &BuildInputs, out_dir: &Path) -> Result<BuildOutput, ImageError> {
    build_with_modules(inputs, &[], out_dir)
}

/// [`build`], with `platform_modules` (a platform's, [`crate::platform::ImagePlatform`]) and
/// their dependencies in the initramfs besides PID 1's own; a name PID 1 loads anyway is not
/// added twice. With none, the initramfs is [`build`]'s, byte for byte.
pub fn build_with_modules(
    inputs: &BuildInputs,
    platform_modules: &[&str],
    out_dir: &Path,
) -> Result<BuildOutput, ImageError> {
    check_inputs(inputs)?;
    std::fs::create_dir_all(out_dir).map_err(ImageError::io("create directory", out_dir))?;

    tracing::info!(release = %inputs.kernel_release, "building the initramfs");
    let spec = initramfs_spec(inputs, platform_modules);
    let initrd = initramfs::build_initramfs(&spec)?;
    tracing::info!(
        entries = initrd.manifest.len(),
        uncompressed = initrd.uncompressed_size,
        compressed = initrd.compressed.len(),
        modules = initrd.modules.len(),
        "initramfs built"
    );

    let linux = std::fs::read(&inputs.kernel_image)
        .map_err(ImageError::io("read", &inputs.kernel_image))?;
    check_kernel_release(&inputs.kernel_image, &linux, &inputs.kernel_release)?;
    let stub = std::fs::read(&inputs.stub).map_err(ImageError::io("read", &inputs.stub))?;

    let sections = UkiSections {
        osrel: inputs.os_release.as_bytes().to_vec(),
        cmdline: inputs.cmdline.as_bytes().to_vec(),
        uname: inputs.kernel_release.as_bytes().to_vec(),
        linux,
        initrd: initrd.compressed.clone(),
    };
    tracing::info!(stub = %inputs.stub.display(), "assembling the UKI");
    let uki_bytes = uki::assemble_uki(&stub, &sections)?;

    let uki = write_output(out_dir, UKI_FILE, &uki_bytes)?;
    let initrd_artifact = write_output(out_dir, INITRD_FILE, &initrd.compressed)?;
    let kernel = write_output(out_dir, KERNEL_FILE, &sections.linux)?;
    let cmdline = write_output(out_dir, CMDLINE_FILE, inputs.cmdline.as_bytes())?;

    let summary = |data: &[u8]| SectionSummary {
        size: data.len() as u64,
        sha256: sha256_hex(data),
    };
    let output_summary = |a: &Artifact| OutputSummary {
        size: a.size,
        sha256: a.sha256.clone(),
    };
    let manifest = Manifest {
        manifest_version: 1,
        hawser_image_version: env!("CARGO_PKG_VERSION"),
        kernel_release: &inputs.kernel_release,
        source_date_epoch: inputs.source_date_epoch,
        cmdline: &inputs.cmdline,
        outputs: BTreeMap::from([
            (UKI_FILE, output_summary(&uki)),
            (INITRD_FILE, output_summary(&initrd_artifact)),
            (KERNEL_FILE, output_summary(&kernel)),
            (CMDLINE_FILE, output_summary(&cmdline)),
        ]),
        uki_sections: BTreeMap::from([
            (".osrel", summary(&sections.osrel)),
            (".cmdline", summary(&sections.cmdline)),
            (".uname", summary(&sections.uname)),
            (".linux", summary(&sections.linux)),
            (".initrd", summary(&sections.initrd)),
        ]),
        initramfs: InitramfsSummary {
            compression: format!("zstd-{}", initramfs::ZSTD_LEVEL),
            uncompressed_size: initrd.uncompressed_size,
            compressed_size: initrd.compressed.len() as u64,
            modules: &initrd.modules,
            entries: &initrd.manifest,
        },
    };
    let mut manifest_json = serde_json::to_vec_pretty(&manifest).map_err(ImageError::Manifest)?;
    manifest_json.push(b'\n');
    let manifest_path = write_output(out_dir, MANIFEST_FILE, &manifest_json)?.path;
    tracing::info!(
        uki = %uki.path.display(),
        size = uki.size,
        sha256 = %uki.sha256,
        "image written"
    );

    Ok(BuildOutput {
        uki,
        initrd: initrd_artifact,
        kernel,
        cmdline,
        manifest: manifest_path,
        initramfs_uncompressed_size: initrd.uncompressed_size,
        initramfs_entries: initrd.manifest.len(),
        modules: initrd.modules,
        kernel_release: inputs.kernel_release.clone(),
    })
}

/// What the initramfs of [`build_with_modules`] holds: PID 1's spec, the platform's modules
/// after PID 1's own (a name already there is not repeated), the provider CA.
pub fn initramfs_spec(inputs: &BuildInputs, platform_modules: &[&str]) -> InitramfsSpec {
    let mut spec = InitramfsSpec::for_hawser(
        &inputs.init_binary,
        &inputs.lib_roots,
        &inputs.modules_dir,
        &inputs.kernel_release,
        inputs.source_date_epoch,
    );
    for module in platform_modules {
        if !spec.modules.iter().any(|name| name == module) {
            spec.modules.push((*module).to_owned());
        }
    }
    if let Some(pem) = &inputs.provider_ca_pem {
        spec.files.push((
            initramfs::PROVIDER_CA_PATH.to_owned(),
            pem.as_bytes().to_vec(),
        ));
    }
    spec
}

/// Refuses inputs that would build an image that cannot boot as measured.
fn check_inputs(inputs: &BuildInputs) -> Result<(), ImageError> {
    if inputs.cmdline.len() > MAX_CMDLINE {
        return Err(ImageError::InvalidInput(format!(
            "the kernel command line is {} bytes; the kernel keeps only {MAX_CMDLINE}",
            inputs.cmdline.len()
        )));
    }
    if inputs.cmdline.contains(['\0', '\n']) {
        return Err(ImageError::InvalidInput(
            "the kernel command line contains a NUL or newline character".into(),
        ));
    }
    let release_ok = !inputs.kernel_release.is_empty()
        && !inputs
            .kernel_release
            .contains(|c: char| c == '/' || c.is_whitespace() || c.is_control());
    if !release_ok {
        return Err(ImageError::InvalidInput(format!(
            "kernel release {:?} is not a valid `uname -r`",
            inputs.kernel_release
        )));
    }
    let modules_release = inputs.modules_dir.file_name().and_then(|n| n.to_str());
    if modules_release != Some(inputs.kernel_release.as_str()) {
        return Err(ImageError::InvalidInput(format!(
            "modules directory {} is not for kernel release {}",
            inputs.modules_dir.display(),
            inputs.kernel_release
        )));
    }
    Ok(())
}

/// Checks the release string a bzImage carries (boot protocol `kernel_version`) against the
/// expected release, so a kernel cannot be paired with another kernel's modules.
fn check_kernel_release(path: &Path, image: &[u8], release: &str) -> Result<(), ImageError> {
    let found = bzimage_release(image).ok_or_else(|| {
        ImageError::InvalidInput(format!(
            "{} is not an x86 bzImage with a kernel version string",
            path.display()
        ))
    })?;
    if found != release {
        return Err(ImageError::InvalidInput(format!(
            "{} is kernel release {found}, but the build is for {release}",
            path.display()
        )));
    }
    Ok(())
}

/// The first word of a bzImage's version string: boot protocol header "HdrS" at 0x202, the
/// version string's offset (minus 0x200) at 0x20e.
pub fn bzimage_release(image: &[u8]) -> Option<&str> {
    if image.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let pointer = u16::from_le_bytes(image.get(0x20e..0x210)?.try_into().ok()?);
    let start = usize::from(pointer) + 0x200;
    let tail = image.get(start..)?;
    let end = tail.iter().position(|&b| b == 0 || b == b' ')?;
    std::str::from_utf8(&tail[..end]).ok()
}

/// Writes `data` to `out_dir/name` through a temporary file and a rename.
fn write_output(out_dir: &Path, name: &str, data: &[u8]) -> Result<Artifact, ImageError> {
    let path = out_dir.join(name);
    let tmp = out_dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, data).map_err(ImageError::io("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(ImageError::io("rename into place", &path))?;
    tracing::info!(path = %path.display(), size = data.len(), "wrote {name}");
    Ok(Artifact::of(path, data))
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> BuildInputs {
        BuildInputs {
            init_binary: "/nonexistent/init".into(),
            kernel_image: "/nonexistent/vmlinuz".into(),
            kernel_release: "6.12.117+deb13-cloud-amd64".into(),
            modules_dir: "/cache/usr/lib/modules/6.12.117+deb13-cloud-amd64".into(),
            lib_roots: vec![],
            stub: "/nonexistent/stub".into(),
            cmdline: "console=ttyS0".into(),
            os_release: default_os_release("0.1.0"),
            source_date_epoch: 0,
            provider_ca_pem: None,
        }
    }

    /// The trixie kernel and libraries of the input cache (`hawser image fetch`), with the
    /// host's `true` as PID 1 (what the initramfs ships besides PID 1 does not depend on it);
    /// `None` after saying why the test is skipped (a failure with `HAWSER_REQUIRE_INPUTS=1`).
    fn cached_inputs() -> Option<BuildInputs> {
        let lock_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../inputs.lock");
        let lock = crate::inputs::InputLock::load(&lock_path).unwrap();
        let fetched = crate::inputs::cached(&lock, &crate::inputs::cache_dir())
            .inspect_err(|error| {
                crate::test_support::missing_input(&format!(
                    "the pinned kernel and libraries ({error})"
                ));
            })
            .ok()?;
        Some(BuildInputs {
            init_binary: crate::locate_tool("true").unwrap(),
            kernel_image: fetched.kernel_image,
            kernel_release: fetched.kernel_release,
            modules_dir: fetched.modules_dir,
            lib_roots: fetched.lib_roots,
            stub: fetched.stub,
            cmdline: crate::pipeline::DEFAULT_CMDLINE.into(),
            os_release: default_os_release("0.1.0"),
            source_date_epoch: lock.source_date_epoch,
            provider_ca_pem: None,
        })
    }

    /// The module names of shipped files, in load order.
    fn names(files: &[String]) -> Vec<String> {
        files
            .iter()
            .map(|file| hawser_kmod::normalize_name(file))
            .collect()
    }

    #[test]
    fn the_qemu_image_is_unchanged_and_each_platform_ships_its_modules() {
        use crate::platform::ImagePlatform;
        let Some(inputs) = cached_inputs() else {
            return;
        };
        // The QEMU image's initramfs through the platform path is PID 1's own, byte for byte
        // (and its command line is the same: platform::tests).
        let qemu = ImagePlatform::Qemu;
        assert_eq!(qemu.cmdline(&inputs.cmdline), inputs.cmdline);
        let own = InitramfsSpec::for_hawser(
            &inputs.init_binary,
            &inputs.lib_roots,
            &inputs.modules_dir,
            &inputs.kernel_release,
            inputs.source_date_epoch,
        );
        let (own_archive, _, base) = initramfs::assemble(&own).unwrap();
        let (qemu_archive, _, qemu_modules) =
            initramfs::assemble(&initramfs_spec(&inputs, &qemu.kernel_module_names())).unwrap();
        assert_eq!(qemu_modules, base);
        assert!(
            qemu_archive.to_bytes(inputs.source_date_epoch).unwrap()
                == own_archive.to_bytes(inputs.source_date_epoch).unwrap()
        );

        // Every other platform ships PID 1's modules, then its own with their dependencies
        // (nvme is built into trixie's cloud kernel: no file).
        for (platform, extra) in [
            (
                ImagePlatform::Gce,
                &["scsi_common", "scsi_mod", "virtio_scsi", "sd_mod", "gve"][..],
            ),
            (
                ImagePlatform::Azure,
                &[
                    "hv_vmbus",
                    "hv_netvsc",
                    "scsi_common",
                    "scsi_mod",
                    "scsi_transport_fc",
                    "hv_storvsc",
                    "sd_mod",
                    "pci_hyperv_intf",
                    "pci_hyperv",
                    "hv_utils",
                ],
            ),
            (ImagePlatform::Aws, &["ena", "configfs", "tsm", "sev_guest"]),
            (ImagePlatform::SevSnp, &["configfs", "tsm", "sev_guest"]),
            (ImagePlatform::Tdx, &["configfs", "tsm", "tdx_guest"]),
        ] {
            let spec = initramfs_spec(&inputs, &platform.kernel_module_names());
            let (_, _, shipped) = initramfs::assemble(&spec).unwrap();
            let shipped = names(&shipped);
            let (own, added) = shipped.split_at(base.len());
            assert_eq!(own, names(&base), "{platform}");
            assert_eq!(added, extra, "{platform}");
        }
    }

    #[test]
    fn os_release_names_hawser_and_version() {
        let text = default_os_release("0.1.0");
        let fields: BTreeMap<&str, &str> =
            text.lines().map(|l| l.split_once('=').unwrap()).collect();
        assert_eq!(fields["ID"], "hawser");
        assert_eq!(fields["NAME"], "\"hawser\"");
        assert_eq!(fields["VERSION_ID"], "0.1.0");
        assert_eq!(fields["PRETTY_NAME"], "\"hawser 0.1.0\"");
    }

    #[test]
    fn inconsistent_inputs_are_refused_before_any_work() {
        assert!(check_inputs(&inputs()).is_ok());
        let mut long = inputs();
        long.cmdline = "x".repeat(3000);
        assert!(
            check_inputs(&long)
                .unwrap_err()
                .to_string()
                .contains("3000 bytes")
        );
        let mut newline = inputs();
        newline.cmdline = "a\nb".into();
        assert!(check_inputs(&newline).is_err());
        let mut other = inputs();
        other.kernel_release = "6.1.0-28-cloud-amd64".into();
        let err = check_inputs(&other).unwrap_err().to_string();
        assert!(
            err.contains("not for kernel release 6.1.0-28-cloud-amd64"),
            "{err}"
        );
    }

    #[test]
    fn bzimage_release_reads_the_boot_header() {
        let mut image = vec![0u8; 0x400];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        let version = b"6.12.117+deb13-cloud-amd64 (debian-kernel@lists.debian.org) #1\0";
        image[0x300..0x300 + version.len()].copy_from_slice(version);
        assert_eq!(bzimage_release(&image), Some("6.12.117+deb13-cloud-amd64"));
        let err = check_kernel_release(Path::new("vmlinuz"), &image, "6.1.0").unwrap_err();
        assert!(
            err.to_string()
                .contains("is kernel release 6.12.117+deb13-cloud-amd64")
        );
        image[0x202] = b'X';
        assert_eq!(bzimage_release(&image), None);
    }
}
