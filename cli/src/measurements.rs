//! `hawser measurements …`: predict the PCRs of a UKI, write and check the committed reference
//! measurements, and explain a real boot's event log against a prediction.
//!
//! The arithmetic is in `hawser-measurements`; this module reads files, rebuilds the image
//! through `hawser_image::pipeline` for `check`, and turns results into exit codes: any
//! difference is a non-zero exit with a per-PCR diff, never a silent pass. For the node image,
//! a `rootfs.lock` whose packages differ from those the reference records fails the check
//! before anything is rebuilt, naming each package (reference → lock).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use hawser_attestation::report::BootReport;
use hawser_image::inputs::InputLock;
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_image::rootfs::lock::{self, RootfsLock};
use hawser_measurements::eventlog::{self, EventLog};
use hawser_measurements::explain::explain;
use hawser_measurements::predict::{Phase, Prediction};
use hawser_measurements::reference::{
    self, FIRMWARE_PCRS, InputPackage, ReferenceInputs, ReferenceMeasurements,
};

/// Where the committed reference for the QEMU image lives, relative to the workspace.
pub const QEMU_REFERENCE: &str = "measurements/qemu.json";
/// The reference measurements of the QEMU node image (UKI with the rootfs's root hash).
pub const QEMU_NODE_REFERENCE: &str = "measurements/qemu-node.json";

/// The boot phases a prediction covers: (phase, name in JSON, what it is).
const PHASES: [(Phase, &str, &str); 4] = [
    (
        Phase::Stub,
        "stub",
        "after systemd-stub, before PID 1 extends anything",
    ),
    (
        Phase::EnterInitrd,
        "enter-initrd",
        "PID 1 in the initramfs (the boot report's quote)",
    ),
    (
        Phase::LeaveInitrd,
        "leave-initrd",
        "PID 1 after the pivot into the rootfs",
    ),
    (
        Phase::LeaveInitrdControlPlane,
        "leave-initrd-control-plane",
        "PID 1 of a control plane after the pivot (control-plane, then leave-initrd)",
    ),
];

/// What the QEMU reference's firmware values come from.
const QEMU_PLATFORM: &str =
    "QEMU q35 (TCG), Debian 12 OVMF 4M (ovmf 2022.11), swtpm (tpm-crb), hawser-qemu ESP";

#[derive(Subcommand)]
pub enum MeasurementsCommand {
    /// Print the PCR values a boot of UKI produces (PCR 4, 9, 11 per phase, 12, 13, 15).
    Predict {
        /// The UKI (hawser.efi).
        uki: PathBuf,
        /// Print JSON: the Constellation-shaped `measurements` map and every predicted event.
        #[arg(long)]
        json: bool,
        /// Also list every predicted event.
        #[arg(long)]
        events: bool,
        /// The cluster ID (64 hex digits, as in the cluster file and `hawser init`'s output) of
        /// a node locked to a cluster: PCR 15 is then its node lock instead of zeros.
        #[arg(long, value_parser = parse_cluster_id)]
        cluster_id: Option<[u8; 32]>,
    },
    /// Write a reference measurement file for UKI: predicted PCRs, warn-only firmware PCRs
    /// from a boot report, and the metadata `check` needs to name what changed.
    Reference {
        /// The UKI; its build's manifest.json is read from the same directory if present.
        #[arg(long)]
        uki: PathBuf,
        /// A console log (or JSON file) with the boot report of a boot of this UKI: its firmware
        /// PCRs become the warn-only values, and its other PCRs must equal the prediction.
        #[arg(long)]
        boot_report: Option<PathBuf>,
        /// Output file [default: measurements/qemu.json in the workspace].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Rebuild the image from this workspace and compare its measurements with the committed
    /// reference; exits non-zero on any difference.
    Check {
        /// The reference [default: measurements/qemu.json in the workspace].
        #[arg(long)]
        reference: Option<PathBuf>,
        /// Where to build [default: <target>/measurements-check].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Use this init binary instead of compiling one (faster; only meaningful if it was
        /// compiled from this tree).
        #[arg(long)]
        init: Option<PathBuf>,
        /// Compare this already built UKI instead of rebuilding (its manifest.json next to it).
        #[arg(long, conflicts_with = "init")]
        uki: Option<PathBuf>,
        /// After printing the differences, rewrite the reference with the rebuild's values
        /// (firmware values kept). Exits zero.
        #[arg(long)]
        update: bool,
        /// Rebuild the node image (rootfs with mkosi, its root hash on the command line) and
        /// compare with measurements/qemu-node.json.
        #[arg(long, conflicts_with = "uki")]
        node: bool,
    },
    /// Write the measurements of a released image for people who verify it without hawser's
    /// source: one JSON document in Constellation's published-measurements shape plus a
    /// `hawser` object (every phase, PCR 15's rule, UKI and root hash, stub, kernel, every
    /// pinned input with its sha256). Deterministic bytes: sign them with `cosign sign-blob`.
    Publish {
        /// The reference to publish [default: measurements/qemu-node.json, the node image].
        #[arg(long)]
        reference: Option<PathBuf>,
        /// Output file [default: standard output].
        #[arg(long)]
        out: Option<PathBuf>,
        /// The release version [default: v<imageVersion> of the reference].
        #[arg(long)]
        version: Option<String>,
        /// The git ref (`-` for a release).
        #[arg(long, default_value = "-")]
        git_ref: String,
        /// The release stream.
        #[arg(long, default_value = "stable")]
        stream: String,
    },
    /// Compare a real boot's TCG event log with the prediction for UKI, event by event.
    Explain {
        /// The UKI that was (supposedly) booted.
        #[arg(long)]
        uki: PathBuf,
        /// The event log: binary (binary_bios_measurements) or a console log with a
        /// `HAWSER_EVENT_LOG <base64>` line.
        #[arg(long, required_unless_present = "console")]
        event_log: Option<PathBuf>,
        /// A console log with both the HAWSER_EVENT_LOG line and the boot report.
        #[arg(long)]
        console: Option<PathBuf>,
        /// The boot report (console log or JSON) whose quoted PCRs the log must replay to.
        #[arg(long)]
        boot_report: Option<PathBuf>,
        /// Line the boot up with this systemd-stub version's model (e.g. 257) although the UKI
        /// carries another stub or kernel, one `predict` refuses: the events that differ are
        /// named. The result is a diagnosis, not a prediction of the UKI.
        #[arg(long, value_name = "MAJOR")]
        assume_stub: Option<u32>,
    },
}

pub fn run(cmd: MeasurementsCommand) -> anyhow::Result<()> {
    match cmd {
        MeasurementsCommand::Predict {
            uki,
            json,
            events,
            cluster_id,
        } => predict(&uki, json, events, cluster_id.as_ref()),
        MeasurementsCommand::Reference {
            uki,
            boot_report,
            out,
        } => write_reference(&uki, boot_report.as_deref(), out),
        MeasurementsCommand::Check {
            reference,
            out,
            init,
            uki,
            update,
            node,
        } => check(reference, out, init, uki, update, node),
        MeasurementsCommand::Publish {
            reference,
            out,
            version,
            git_ref,
            stream,
        } => publish(reference, out, version, git_ref, stream),
        MeasurementsCommand::Explain {
            uki,
            event_log,
            console,
            boot_report,
            assume_stub,
        } => run_explain(&uki, event_log, console, boot_report, assume_stub),
    }
}

fn publish(
    reference: Option<PathBuf>,
    out: Option<PathBuf>,
    version: Option<String>,
    git_ref: String,
    stream: String,
) -> anyhow::Result<()> {
    let path = match reference {
        Some(path) => path,
        None => crate::image::workspace()?.join(QEMU_NODE_REFERENCE),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the reference {}", path.display()))?;
    let reference = ReferenceMeasurements::parse(&text)
        .with_context(|| format!("the reference {}", path.display()))?;
    let release = hawser_measurements::publish::Release {
        version: version.unwrap_or_else(|| format!("v{}", reference.metadata.image_version)),
        git_ref,
        stream,
    };
    let doc = hawser_measurements::publish::publish(&reference, &release);
    let mut bytes = serde_json::to_vec_pretty(&doc)?;
    bytes.push(b'\n');
    match out {
        Some(out) => {
            std::fs::write(&out, &bytes)
                .with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!(
                "published the measurements of {} {} ({}) to {} ({} bytes, sha256 {}); sign it with e.g. `cosign sign-blob {}`",
                reference.metadata.image,
                release.version,
                path.display(),
                out.display(),
                bytes.len(),
                hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
                out.display()
            );
        }
        None => {
            use std::io::Write as _;
            std::io::stdout().write_all(&bytes)?;
        }
    }
    Ok(())
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn predict_file(uki: &Path) -> anyhow::Result<Prediction> {
    let bytes = read(uki)?;
    Ok(Prediction::from_uki(&bytes, &uki.display().to_string())?)
}

/// A cluster ID as 64 hex digits.
fn parse_cluster_id(text: &str) -> Result<[u8; 32], String> {
    let bytes =
        hex::decode(text.trim()).map_err(|e| format!("a cluster ID is 64 hex digits ({e})"))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("a cluster ID is 32 bytes (64 hex digits), not {}", b.len()))
}

fn predict(
    uki: &Path,
    json: bool,
    events: bool,
    cluster_id: Option<&[u8; 32]>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let p = predict_file(uki)?;
    let elapsed = started.elapsed();
    if json {
        let phases: serde_json::Map<String, serde_json::Value> = PHASES
            .iter()
            .map(|&(phase, name, _)| {
                (
                    name.to_owned(),
                    p.expected_measurements_json_in_cluster(phase, cluster_id),
                )
            })
            .collect();
        let out = serde_json::json!({
            "measurements": p.expected_measurements_json_in_cluster(Phase::EnterInitrd, cluster_id),
            "measurementsAfterLeaveInitrd": {
                "11": {"expected": hex::encode(p.pcr(11, Phase::LeaveInitrd)), "warnOnly": false}
            },
            "measurementsPerPhase": phases,
            "clusterId": cluster_id.map(hex::encode),
            "pcr11AfterStub": hex::encode(p.pcr(11, Phase::Stub)),
            "prediction": p,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "UKI {} ({} bytes, sha256 {})",
        uki.display(),
        p.uki_size,
        hex::encode(p.uki_sha256)
    );
    println!("stub: {}; kernel: Linux {}", p.stub, p.kernel_release);
    println!("kernel command line: {}", p.cmdline);
    println!(
        "PCR  4  {}  OVMF: boot action, separator, UKI and kernel Authenticode",
        hex::encode(p.pcr(4, Phase::Stub))
    );
    println!(
        "PCR  9  {}  Linux EFI stub: command line, initrd ({} bytes)",
        hex::encode(p.pcr(9, Phase::Stub)),
        p.initrd_size
    );
    let pcrs = |phase| p.pcrs_in_cluster(phase, cluster_id);
    println!(
        "PCR 11  {}  after enter-initrd (what the boot report quotes)",
        hex::encode(pcrs(Phase::EnterInitrd)[&11])
    );
    println!(
        "        {}  after systemd-stub only",
        hex::encode(pcrs(Phase::Stub)[&11])
    );
    println!(
        "        {}  after leave-initrd (a worker in its rootfs)",
        hex::encode(pcrs(Phase::LeaveInitrd)[&11])
    );
    println!(
        "        {}  after control-plane, leave-initrd (a control plane in its rootfs)",
        hex::encode(pcrs(Phase::LeaveInitrdControlPlane)[&11])
    );
    for pcr in [12u8, 13] {
        println!(
            "PCR {pcr:>2}  {}",
            hex::encode(pcrs(Phase::LeaveInitrd)[&pcr])
        );
    }
    match cluster_id {
        Some(id) => println!(
            "PCR 15  {}  node locked to cluster {}",
            hex::encode(pcrs(Phase::LeaveInitrd)[&15]),
            hex::encode(id)
        ),
        None => println!(
            "PCR 15  {}  a fresh node (--cluster-id gives a locked node's)",
            hex::encode(pcrs(Phase::LeaveInitrd)[&15])
        ),
    }
    if events {
        println!("events:");
        for e in &p.events {
            println!(
                "  PCR {:>2}  {}  {}",
                e.pcr,
                hex::encode(e.digest),
                e.description
            );
        }
    }
    eprintln!("predicted in {:.0} ms", elapsed.as_secs_f64() * 1000.0);
    Ok(())
}

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

/// Reads a boot report from a console log (the marker line) or a JSON file, and verifies it
/// (its own nonce: the quote is internally consistent, not fresh).
fn boot_report(path: &Path) -> anyhow::Result<(BootReport, BTreeMap<u8, [u8; 32]>)> {
    let text = String::from_utf8_lossy(&read(path)?).into_owned();
    // The last line with the marker whose JSON parses: `hawser local up` also prints the marker
    // as a label in its timeline.
    let mut found = None;
    for line in text.lines().rev() {
        match BootReport::find_in_console(line) {
            Some(Ok(report)) => {
                found = Some(Ok(report));
                break;
            }
            Some(Err(e)) if found.is_none() => found = Some(Err(e)),
            _ => {}
        }
    }
    let report = match found {
        Some(r) => {
            r.with_context(|| format!("the boot report in {} is malformed", path.display()))?
        }
        None => serde_json::from_str(&text).with_context(|| {
            format!(
                "{} has no HAWSER_BOOT_REPORT line and is not a boot report in JSON",
                path.display()
            )
        })?,
    };
    let verified = report
        .verify(None)
        .with_context(|| format!("the boot report in {} does not verify", path.display()))?;
    Ok((report, verified.pcrs))
}

/// The boot manager the QEMU reference accepts in front of the UKI: systemd-boot from the
/// pinned `systemd-boot-efi` (the stub's package, so the same systemd), by its Authenticode
/// hash (`qemu-tests/tests/boot_paths.rs` boots it).
fn systemd_boot(lock: &InputLock) -> anyhow::Result<(String, [u8; 32])> {
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
    node: bool,
    firmware: BTreeMap<u8, [u8; 32]>,
    firmware_from: Option<String>,
) -> anyhow::Result<ReferenceInputs> {
    let lock = InputLock::load(&ws.join("inputs.lock"))?;
    let rootfs_lock = if node {
        Some(RootfsLock::load(&ws.join(lock::LOCK_FILE))?)
    } else {
        None
    };
    let boot_managers = vec![systemd_boot(&lock)?];
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

fn write_reference(
    uki: &Path,
    boot_report_path: Option<&Path>,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let ws = crate::image::workspace()?;
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
    let node = is_node_image(&prediction);
    let reference = ReferenceMeasurements::new(
        &prediction,
        reference_inputs(&ws, uki, node, firmware, from)?,
    );
    std::fs::write(&out, reference.render())
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

fn check(
    reference_path: Option<PathBuf>,
    out: Option<PathBuf>,
    init: Option<PathBuf>,
    uki: Option<PathBuf>,
    update: bool,
    node: bool,
) -> anyhow::Result<()> {
    let ws = crate::image::workspace()?;
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
        reference_inputs(&ws, &uki, is_node_image(&prediction), firmware, from)?,
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
fn rootfs_lock_drift(
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

fn run_explain(
    uki: &Path,
    event_log: Option<PathBuf>,
    console: Option<PathBuf>,
    boot_report_path: Option<PathBuf>,
    assume_stub: Option<u32>,
) -> anyhow::Result<()> {
    let prediction = match assume_stub {
        None => predict_file(uki)?,
        Some(major) => {
            let p = Prediction::from_uki_assuming(
                &read(uki)?,
                &uki.display().to_string(),
                Some(major),
            )?;
            println!(
                "ASSUMING systemd-stub {major}'s model for {} (it carries {}, Linux {}): a diagnosis, not a prediction of this UKI",
                uki.display(),
                p.stub,
                p.kernel_release
            );
            p
        }
    };
    let log_source = event_log
        .or_else(|| console.clone())
        .context("give --event-log or --console")?;
    let raw = read(&log_source)?;
    let log_bytes = if raw.starts_with(b"\0\0\0\0\x03\0\0\0") {
        raw
    } else {
        match eventlog::find_in_console(&String::from_utf8_lossy(&raw)) {
            Some(decoded) => decoded?,
            None => bail!(
                "{} is neither a binary event log nor a console log with a {}line; PID 1 prints it after the boot report",
                log_source.display(),
                hawser_pcr::EVENT_LOG_MARKER
            ),
        }
    };
    let log = EventLog::parse(&log_bytes)
        .with_context(|| format!("the event log from {}", log_source.display()))?;
    let report_path = boot_report_path.or(console);
    let (quoted, phases) = match &report_path {
        Some(path) => {
            let (report, pcrs) = boot_report(path)?;
            (Some(pcrs), report.phases_extended)
        }
        None => (None, Vec::new()),
    };
    let diagnosis = explain(&prediction, &log, quoted.as_ref(), &phases)?;
    println!(
        "prediction for {} vs the event log from {}{}",
        uki.display(),
        log_source.display(),
        report_path
            .as_ref()
            .map(|p| format!(" and the boot report in {}", p.display()))
            .unwrap_or_default()
    );
    print!("{diagnosis}");
    if !diagnosis.ok() {
        bail!(
            "the boot does not match the prediction for {} (see above)",
            uki.display()
        );
    }
    println!("the boot matches the prediction event for event");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_id_is_64_hex_digits() {
        let id = "2a96e44e656f8d24002810a9ebdd9a6f15b71d6139d9b77f4f829e9382fa12ab";
        assert_eq!(hex::encode(parse_cluster_id(id).unwrap()), id);
        assert!(parse_cluster_id(&id[..62]).unwrap_err().contains("not 31"));
        assert!(
            parse_cluster_id("xyz")
                .unwrap_err()
                .contains("64 hex digits")
        );
    }

    fn lock(bash: &str, sha256: &str) -> RootfsLock {
        let text = format!(
            "suite = \"bookworm\"\n\
             [[package]]\nname = \"bash\"\nversion = \"{bash}\"\nrole = \"rootfs\"\n\
             url = \"http://deb.debian.org/debian/pool/main/b/bash/bash.deb\"\nsize = 1\nsha256 = \"{sha256}\"\n\
             [[package]]\nname = \"libc6\"\nversion = \"2.36-9+deb12u13\"\nrole = \"rootfs\"\n\
             url = \"http://deb.debian.org/debian/pool/main/g/glibc/libc6.deb\"\nsize = 1\nsha256 = \"{sha256}\"\n"
        );
        RootfsLock::parse(&text, Path::new("rootfs.lock")).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_changed_package_in_the_rootfs_lock_is_named_with_both_versions() {
        let recorded = lock("5.2.15-2+b7", &"ab".repeat(32));
        let digest = recorded.digest();
        assert!(rootfs_lock_drift(&digest, &recorded.versions(), &recorded).is_empty());
        let drift = rootfs_lock_drift(
            &digest,
            &recorded.versions(),
            &lock("5.2.15-2+b8", &"ab".repeat(32)),
        );
        assert_eq!(drift, ["bash 5.2.15-2+b7 → 5.2.15-2+b8"]);
        let drift = rootfs_lock_drift(
            &digest,
            &recorded.versions(),
            &lock("5.2.15-2+b7", &"cd".repeat(32)),
        );
        assert_eq!(drift.len(), 1);
        assert!(
            drift[0].starts_with("the same versions, other files: rootfs lock digest"),
            "{drift:?}"
        );
    }
}
