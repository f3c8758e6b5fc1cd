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

use anyhow::{Context as _, bail};
use clap::Subcommand;
use hawser_attestation::report::BootReport;
use hawser_cli::image_build::published_variants;
use hawser_image::platform::ImagePlatform;
use hawser_measurements::eventlog::{self, EventLog};
use hawser_measurements::explain::explain;
use hawser_measurements::predict::{Phase, PredictOptions, Prediction};
use hawser_measurements::reference::ReferenceMeasurements;

mod committed;
mod predict;
use committed::{check, write_reference};
use predict::predict;

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
        /// The profile of a multi-profile UKI (systemd-stub 257 on) the boot entry selects with
        /// `@N`; 0, the default, is what a boot without `@N` starts.
        #[arg(long, default_value_t = 0, value_name = "N")]
        profile: u32,
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
        /// The profile the boot started (its entry's `@N`), as for `predict --profile`.
        #[arg(long, default_value_t = 0, value_name = "N")]
        profile: u32,
    },
}

pub fn run(cmd: MeasurementsCommand) -> anyhow::Result<()> {
    match cmd {
        MeasurementsCommand::Predict {
            uki,
            json,
            events,
            cluster_id,
            profile,
        } => predict(&uki, json, events, cluster_id.as_ref(), profile),
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
            profile,
        } => run_explain(
            &uki,
            event_log,
            console,
            boot_report,
            PredictOptions {
                assume_stub,
                profile,
            },
        ),
    }
}

/// Makes `doc`'s `list` the entries of the platform the image's measured command line names
/// (`hawser.platform=`, which `hawser image build --platform` writes): the same measurements
/// under each of its attestation variants. A QEMU image's document is left as it is.
fn publish_for_platform(doc: &mut serde_json::Value, cmdline: &str) -> anyhow::Result<()> {
    let platform = ImagePlatform::of_cmdline(cmdline).with_context(|| {
        format!(
            "the reference's command line names a platform hawser builds no image for: {cmdline}"
        )
    })?;
    if platform == ImagePlatform::Qemu {
        return Ok(());
    }
    let measurements = doc["list"][0]["measurements"].clone();
    doc["list"] = published_variants(platform)
        .into_iter()
        .map(|variant| {
            serde_json::json!({
                "csp": variant.csp,
                "attestationVariant": variant.attestation_variant,
                "measurements": measurements,
            })
        })
        .collect();
    Ok(())
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
        None => hawser_cli::image_build::workspace()?.join(QEMU_NODE_REFERENCE),
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
    let mut doc = hawser_measurements::publish::publish(&reference, &release);
    publish_for_platform(&mut doc, &reference.metadata.cmdline)?;
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

fn run_explain(
    uki: &Path,
    event_log: Option<PathBuf>,
    console: Option<PathBuf>,
    boot_report_path: Option<PathBuf>,
    options: PredictOptions,
) -> anyhow::Result<()> {
    let p = Prediction::from_uki_with(&read(uki)?, &uki.display().to_string(), options)?;
    let prediction = match options.assume_stub {
        None => p,
        Some(major) => {
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
mod tests;
