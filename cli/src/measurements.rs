//! `hawser measurements …`: predict the PCRs of a UKI, write and check the committed reference
//! measurements, and explain a real boot's event log against a prediction.
//!
//! The arithmetic is in `hawser-measurements`; this module reads files, rebuilds the image
//! through `hawser_image::pipeline` for `check`, and turns results into exit codes: any
//! difference is a non-zero exit with a per-PCR diff, never a silent pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use hawser_attestation::report::BootReport;
use hawser_image::inputs::InputLock;
use hawser_image::pipeline::{self, PipelineOptions};
use hawser_image::rootfs;
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
    },
}

pub fn run(cmd: MeasurementsCommand) -> anyhow::Result<()> {
    match cmd {
        MeasurementsCommand::Predict { uki, json, events } => predict(&uki, json, events),
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
        MeasurementsCommand::Explain {
            uki,
            event_log,
            console,
            boot_report,
        } => run_explain(&uki, event_log, console, boot_report),
    }
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn predict_file(uki: &Path) -> anyhow::Result<Prediction> {
    let bytes = read(uki)?;
    Ok(Prediction::from_uki(&bytes, &uki.display().to_string())?)
}

fn predict(uki: &Path, json: bool, events: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let p = predict_file(uki)?;
    let elapsed = started.elapsed();
    if json {
        let out = serde_json::json!({
            "measurements": p.expected_measurements_json(Phase::EnterInitrd),
            "measurementsAfterLeaveInitrd": {
                "11": {"expected": hex::encode(p.pcr(11, Phase::LeaveInitrd)), "warnOnly": false}
            },
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
    println!(
        "PCR 11  {}  after enter-initrd (what the boot report quotes)",
        hex::encode(p.pcr(11, Phase::EnterInitrd))
    );
    println!(
        "        {}  after systemd-stub only",
        hex::encode(p.pcr(11, Phase::Stub))
    );
    println!(
        "        {}  after leave-initrd",
        hex::encode(p.pcr(11, Phase::LeaveInitrd))
    );
    for pcr in [12u8, 13, 15] {
        println!(
            "PCR {pcr:>2}  {}",
            hex::encode(p.pcr(pcr, Phase::LeaveInitrd))
        );
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

fn reference_inputs(
    ws: &Path,
    uki: &Path,
    firmware: BTreeMap<u8, [u8; 32]>,
    firmware_from: Option<String>,
) -> anyhow::Result<ReferenceInputs> {
    let lock = InputLock::load(&ws.join("inputs.lock"))?;
    Ok(ReferenceInputs {
        image: "hawser-qemu".to_owned(),
        image_version: env!("CARGO_PKG_VERSION").to_owned(),
        platform: QEMU_PLATFORM.to_owned(),
        input_lock_digest: lock.digest(),
        inputs: lock_inputs(&lock),
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
    let reference =
        ReferenceMeasurements::new(&prediction, reference_inputs(&ws, uki, firmware, from)?);
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
    // The node image's package versions (mkosi's manifest), when it was rebuilt here.
    let mut rootfs_manifest = None;
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
                rootfs_manifest = Some(out.join(format!("{}.manifest", rootfs::TREE_DIR)));
                node.image.uki.path
            } else {
                let (output, _) = pipeline::build_image(&opts)?;
                output.uki.path
            }
        }
    };
    let prediction = predict_file(&uki)?;
    let (firmware, from) = firmware_of(&reference);
    let current =
        ReferenceMeasurements::new(&prediction, reference_inputs(&ws, &uki, firmware, from)?);
    let diff = reference::diff(&reference, &current);
    println!(
        "reference {} (hawser {}, input lock {})",
        reference_path.display(),
        reference.metadata.image_version,
        short(&reference.metadata.input_lock_digest)
    );
    println!(
        "rebuild   {} (hawser {}, input lock {})",
        uki.display(),
        current.metadata.image_version,
        short(&current.metadata.input_lock_digest)
    );
    let packages_path = reference_path.with_extension("packages.json");
    let write_packages = || -> anyhow::Result<()> {
        if let Some(manifest) = &rootfs_manifest {
            let packages = rootfs_packages(manifest)?;
            std::fs::write(
                &packages_path,
                serde_json::to_string_pretty(&packages)? + "\n",
            )
            .with_context(|| format!("cannot write {}", packages_path.display()))?;
            println!(
                "updated {} (the rootfs's Debian packages)",
                packages_path.display()
            );
        }
        Ok(())
    };
    if diff.is_empty() {
        if update {
            write_packages()?;
        }
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
        write_packages()?;
        return Ok(());
    }
    // The rootfs comes from the Debian archive, which moves (security updates): a rebuild
    // from a newer archive cannot reproduce the reference's root hash, whatever hawser did.
    if let Some(manifest) = &rootfs_manifest {
        let now = rootfs_packages(manifest)?;
        let then: BTreeMap<String, String> = std::fs::read_to_string(&packages_path)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        if !then.is_empty() && then != now {
            println!(
                "WARNING: the rootfs's Debian packages differ from those of the reference \
                 ({}):",
                packages_path.display()
            );
            for (name, version) in &now {
                match then.get(name) {
                    Some(old) if old == version => {}
                    Some(old) => println!("  {name} {old} → {version}"),
                    None => println!("  {name} {version} (new)"),
                }
            }
            for name in then.keys().filter(|n| !now.contains_key(*n)) {
                println!("  {name} (gone)");
            }
            println!(
                "The Debian archive has moved since the reference was made, so its root hash \
                 (and PCRs 9, 11, 12) cannot be reproduced from today's archive; this alone \
                 does not implicate hawser's sources. Publish new measurements with \
                 `hawser measurements check --node --update`."
            );
            return Ok(());
        }
    }
    bail!(
        "the rebuilt image's measurements differ from {} (see above); if the change is intended, run `hawser measurements check --update`",
        reference_path.display()
    )
}

/// Package name → version from mkosi's JSON manifest of the rootfs.
fn rootfs_packages(manifest: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("cannot read the rootfs manifest {}", manifest.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", manifest.display()))?;
    Ok(json["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_owned(),
                p["version"].as_str()?.to_owned(),
            ))
        })
        .collect())
}

fn short(digest: &str) -> &str {
    digest.get(..16).unwrap_or(digest)
}

fn run_explain(
    uki: &Path,
    event_log: Option<PathBuf>,
    console: Option<PathBuf>,
    boot_report_path: Option<PathBuf>,
) -> anyhow::Result<()> {
    let prediction = predict_file(uki)?;
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
                eventlog::EVENT_LOG_MARKER
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
