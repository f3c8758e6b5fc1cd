//! The committed reference measurements: written from a prediction with the inputs that made
//! it (`hawser measurements write-reference`), and checked against a fresh build of the image
//! (`hawser measurements check`), the node image's `rootfs.lock` compared package by package
//! before anything is rebuilt.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use hawser_image::inputs::InputLock;
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_image::rootfs::lock::{self, RootfsLock};
use hawser_measurements::predict::{Phase, Prediction};
use hawser_measurements::reference::{
    self, FIRMWARE_PCRS, InputPackage, ReferenceInputs, ReferenceMeasurements,
};

use super::{QEMU_NODE_REFERENCE, QEMU_PLATFORM, QEMU_REFERENCE, boot_report, predict_file, read};

/// The image's locked packages as reference metadata (tools are not part of the image).
fn lock_inputs(lock: &InputLock) -> Vec<InputPackage> {
    lock.image_packages()
        .map(|p| InputPackage {
            name: p.name.clone(),
            version: p.version.clone(),
            role: serde_json::to_value(p.role)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            sha256: p.sha256.clone(),
        })
        .collect()
}

/// Initramfs entries from the build's manifest.json next to the UKI (empty if there is none).
fn manifest_entries(uki: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let path = uki
        .parent()
        .unwrap_or(Path::new("."))
        .join(hawser_image::build::MANIFEST_FILE);
    if !path.is_file() {
        tracing::warn!(
            "no {} next to the UKI: the reference will not list initramfs files",
            path.display()
        );
        return Ok(BTreeMap::new());
    }
    let manifest: serde_json::Value = serde_json::from_slice(&read(&path)?)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    let mut out = BTreeMap::new();
    for e in manifest["initramfs"]["entries"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(p) = e["path"].as_str() else {
            continue;
        };
        let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        let kind = field("kind");
        let value = match kind.as_str() {
            "regular file" => format!("sha256 {} mode {}", field("sha256"), field("mode")),
            "symlink" => format!("symlink to {}", field("target")),
            "character device" => format!("{kind} {} mode {}", field("device"), field("mode")),
            _ => format!("{kind} mode {}", field("mode")),
        };
        out.insert(p.to_owned(), value);
    }
    Ok(out)
}

/// The boot manager the QEMU reference accepts in front of the UKI: systemd-boot from the
/// pinned `systemd-boot-efi` (the stub's package, so the same systemd), by its Authenticode
/// hash (`qemu-tests/tests/boot_paths.rs` boots it).
pub(super) fn systemd_boot(lock: &InputLock) -> anyhow::Result<(String, [u8; 32])> {
    let cache = hawser_image::inputs::cache_dir();
    let fetched = hawser_image::inputs::cached(lock, &cache)
        .context("the pinned inputs are not in the cache: run `hawser image fetch`")?;
    let path = fetched
        .stub
        .parent()
        .context("the stub has no directory")?
        .join("systemd-bootx64.efi");
    let bytes = read(&path)?;
    let pe = hawser_measurements::pe::PeImage::parse(&bytes, path.display().to_string())?;
    let version = lock
        .by_role(hawser_image::inputs::Role::Stub)
        .next()
        .map(|p| p.version.clone())
        .unwrap_or_default();
    Ok((
        format!("systemd-boot {version}"),
        hawser_measurements::authenticode::authenticode_sha256(&pe)?,
    ))
}

/// Whether a UKI is a node image's: its command line pins a rootfs.
fn is_node_image(prediction: &Prediction) -> bool {
    prediction.cmdline.contains("hawser.root_hash=")
}

fn reference_inputs(
    ws: &Path,
    uki: &Path,
    prediction: &Prediction,
    firmware: BTreeMap<u8, [u8; 32]>,
    firmware_from: Option<String>,
) -> anyhow::Result<ReferenceInputs> {
    let node = is_node_image(prediction);
    let lock = InputLock::load(&ws.join("inputs.lock"))?;
    let rootfs_lock = if node {
        Some(RootfsLock::load(&ws.join(lock::LOCK_FILE))?)
    } else {
        None
    };
    let boot_managers = vec![systemd_boot(&lock)?];
    // The references are of images built from this workspace's defaults: Kubernetes from the
    // pinned source, whose version the node image's command line carries.
    let kubernetes_lock_digest = if node {
        let k8s = hawser_image::kubernetes::KubernetesLock::load(
            &ws.join(hawser_image::kubernetes::LOCK_FILE),
        )?;
        let pin = format!("hawser.kubernetes={}", k8s.version);
        let carries = prediction.cmdline.split_whitespace().any(|arg| arg == pin);
        carries.then(|| k8s.digest())
    } else {
        None
    };
    Ok(ReferenceInputs {
        boot_managers,
        image: "hawser-qemu".to_owned(),
        image_version: env!("CARGO_PKG_VERSION").to_owned(),
        platform: QEMU_PLATFORM.to_owned(),
        input_lock_digest: lock.digest(),
        inputs: lock_inputs(&lock),
        rootfs_lock_digest: rootfs_lock.as_ref().map(RootfsLock::digest),
        rootfs_packages: rootfs_lock
            .as_ref()
            .map(RootfsLock::versions)
            .unwrap_or_default(),
        kubernetes_lock_digest,
        initramfs: manifest_entries(uki)?,
        firmware_pcrs: firmware,
        firmware_values_from: firmware_from,
    })
}

fn load_reference(path: &Path) -> anyhow::Result<ReferenceMeasurements> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read the reference {} (write one with `hawser measurements reference`)",
            path.display()
        )
    })?;
    ReferenceMeasurements::parse(&text).with_context(|| format!("in {}", path.display()))
}

/// Firmware PCR values recorded in an existing reference.
fn firmware_of(r: &ReferenceMeasurements) -> (BTreeMap<u8, [u8; 32]>, Option<String>) {
    let values = r
        .measurements
        .iter()
        .filter(|(pcr, _)| FIRMWARE_PCRS.contains(pcr))
        .filter_map(|(&pcr, m)| {
            let v: [u8; 32] = hex::decode(&m.expected).ok()?.try_into().ok()?;
            Some((pcr, v))
        })
        .collect();
    (values, r.metadata.firmware_values_from.clone())
}

pub(super) fn write_reference(
    uki: &Path,
    boot_report_path: Option<&Path>,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let ws = hawser_cli::image_build::workspace()?;
    let out = out.unwrap_or_else(|| ws.join(QEMU_REFERENCE));
    let prediction = predict_file(uki)?;
    let (firmware, from) = match boot_report_path {
        Some(path) => {
            let (report, pcrs) = boot_report(path)?;
            // The report must be a boot of this very UKI.
            let mut wrong = Vec::new();
            for (pcr, predicted) in prediction.pcrs(Phase::EnterInitrd) {
                if pcrs.get(&pcr) != Some(&predicted) {
                    wrong.push(format!(
                        "PCR {pcr}: quoted {}, predicted {}",
                        pcrs.get(&pcr)
                            .map_or("(not quoted)".to_owned(), hex::encode),
                        hex::encode(predicted)
                    ));
                }
            }
            if !wrong.is_empty() {
                bail!(
                    "the boot report in {} is not from a boot of {} (or the prediction is wrong; run `hawser measurements explain`):\n  {}",
                    path.display(),
                    uki.display(),
                    wrong.join("\n  ")
                );
            }
            let firmware = pcrs
                .into_iter()
                .filter(|(pcr, _)| FIRMWARE_PCRS.contains(pcr))
                .collect();
            let from = format!(
                "verified boot report of hawser {} on {QEMU_PLATFORM} (kernel {})",
                report.hawser_version, report.kernel_release
            );
            (firmware, Some(from))
        }
        None => match load_reference(&out) {
            Ok(old) => {
                eprintln!(
                    "no --boot-report: keeping the firmware values of {}",
                    out.display()
                );
                firmware_of(&old)
            }
            Err(e) => {
                eprintln!(
                    "no --boot-report and no usable previous reference ({e:#}): no firmware values recorded"
                );
                (BTreeMap::new(), None)
            }
        },
    };
    let reference = ReferenceMeasurements::new(
        &prediction,
        reference_inputs(&ws, uki, &prediction, firmware, from)?,
    );
    std::fs::write(&out, reference.render())
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

pub(super) fn check(
    reference_path: Option<PathBuf>,
    out: Option<PathBuf>,
    init: Option<PathBuf>,
    uki: Option<PathBuf>,
    update: bool,
    node: bool,
) -> anyhow::Result<()> {
    let ws = hawser_cli::image_build::workspace()?;
    let default_reference = if node {
        QEMU_NODE_REFERENCE
    } else {
        QEMU_REFERENCE
    };
    let reference_path = reference_path.unwrap_or_else(|| ws.join(default_reference));
    let reference = load_reference(&reference_path)?;
    if node && !update {
        // Before minutes of building: a rootfs from other packages cannot have the reference's
        // root hash, whatever hawser's sources do.
        let rootfs_lock = RootfsLock::load(&ws.join(lock::LOCK_FILE))?;
        check_rootfs_lock(&reference, &reference_path, &rootfs_lock)?;
    }
    let uki = match uki {
        Some(uki) => uki,
        None => {
            let out = out.unwrap_or_else(|| {
                std::env::var_os("CARGO_TARGET_DIR")
                    .map_or_else(|| ws.join("target"), PathBuf::from)
                    .join(if node {
                        "measurements-check-node"
                    } else {
                        "measurements-check"
                    })
            });
            eprintln!(
                "rebuilding the image from {} into {} …",
                ws.display(),
                out.display()
            );
            let opts = PipelineOptions {
                init_binary: init,
                ..PipelineOptions::new(&ws, &out)
            };
            if node {
                let (node, _) = pipeline::build_node_image(&opts, &mut |line| eprintln!("{line}"))?;
                node.image.uki.path
            } else {
                let (output, _) = pipeline::build_image(&opts)?;
                output.uki.path
            }
        }
    };
    let prediction = predict_file(&uki)?;
    let (firmware, from) = firmware_of(&reference);
    let current = ReferenceMeasurements::new(
        &prediction,
        reference_inputs(&ws, &uki, &prediction, firmware, from)?,
    );
    let diff = reference::diff(&reference, &current);
    let locks = |r: &ReferenceMeasurements| {
        let mut text = format!("input lock {}", short(&r.metadata.input_lock_digest));
        if let Some(digest) = &r.metadata.rootfs_lock_digest {
            text.push_str(&format!(", rootfs lock {}", short(digest)));
        }
        text
    };
    println!(
        "reference {} (hawser {}, {})",
        reference_path.display(),
        reference.metadata.image_version,
        locks(&reference)
    );
    println!(
        "rebuild   {} (hawser {}, {})",
        uki.display(),
        current.metadata.image_version,
        locks(&current)
    );
    if diff.is_empty() {
        println!("identical: UKI sha256 {}", current.metadata.uki.sha256);
        for (phase, map) in [
            ("", &current.measurements),
            (
                " after leave-initrd",
                &current.measurements_after_leave_initrd,
            ),
        ] {
            for (pcr, m) in map.iter().filter(|(p, _)| !FIRMWARE_PCRS.contains(p)) {
                println!("  PCR {pcr:>2}{phase}  {}", m.expected);
            }
        }
        println!(
            "  (firmware PCRs {} are warn-only reference values from a boot, not rebuilt)",
            FIRMWARE_PCRS.map(|p| p.to_string()).join(", ")
        );
        return Ok(());
    }
    print!("{diff}");
    if update {
        std::fs::write(&reference_path, current.render())
            .with_context(|| format!("cannot write {}", reference_path.display()))?;
        println!(
            "updated {} (review and commit it; firmware values kept)",
            reference_path.display()
        );
        return Ok(());
    }
    bail!(
        "the rebuilt image's measurements differ from {} (see above); if the change is intended, run `hawser measurements check{} --update`",
        reference_path.display(),
        if node { " --node" } else { "" }
    )
}

/// Fails when `lock` pins other rootfs packages than the node reference records, naming each
/// (reference → lock).
fn check_rootfs_lock(
    reference: &ReferenceMeasurements,
    reference_path: &Path,
    lock: &RootfsLock,
) -> anyhow::Result<()> {
    let Some(recorded_digest) = &reference.metadata.rootfs_lock_digest else {
        bail!(
            "{} records no rootfs lock (it predates rootfs.lock): publish measurements of the \
             pinned rootfs with `hawser measurements check --node --update`",
            reference_path.display()
        );
    };
    let drift = rootfs_lock_drift(recorded_digest, &reference.metadata.rootfs_packages, lock);
    if drift.is_empty() {
        return Ok(());
    }
    println!(
        "{} pins other packages than the rootfs of {} (reference → {}):",
        lock::LOCK_FILE,
        reference_path.display(),
        lock::LOCK_FILE
    );
    for line in &drift {
        println!("  {line}");
    }
    bail!(
        "the node image built from {} cannot reproduce the root hash of {} (nor PCRs 4, 9 and 11, \
         whose command line carries it); if the re-pin is intended (`hawser image lock`), publish \
         new measurements with `hawser measurements check --node --update`",
        lock::LOCK_FILE,
        reference_path.display()
    )
}

/// How `lock` differs from the rootfs lock a reference records (its digest and name →
/// version): a line per changed package, `name old → new`, or one for the digest if only the
/// files differ; empty for the same lock.
pub(super) fn rootfs_lock_drift(
    recorded_digest: &str,
    recorded: &BTreeMap<String, String>,
    lock: &RootfsLock,
) -> Vec<String> {
    let digest = lock.digest();
    if recorded_digest == digest {
        return Vec::new();
    }
    let changes: Vec<String> = lock::package_drift(recorded, &lock.versions())
        .iter()
        .map(ToString::to_string)
        .collect();
    if changes.is_empty() {
        vec![format!(
            "the same versions, other files: rootfs lock digest {} → {}",
            short(recorded_digest),
            short(&digest)
        )]
    } else {
        changes
    }
}

fn short(digest: &str) -> &str {
    digest.get(..16).unwrap_or(digest)
}
