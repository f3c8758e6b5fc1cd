//! `hawser measurements predict`: the PCRs a boot of a UKI produces, on the direct boot path
//! and on every other path a reference accepts (failed boot options, the pinned systemd-boot),
//! for the profile the boot entry selects.

use std::path::Path;
use std::time::Instant;

use hawser_image::inputs::InputLock;
use hawser_measurements::predict::{BootPath, Phase, PredictOptions, Prediction};
use hawser_measurements::reference::allowed_boot_paths;

use super::committed::systemd_boot;
use super::{PHASES, read};

/// One boot path besides the direct one, and the PCRs it changes.
struct OtherPath {
    path: BootPath,
    pcr4: [u8; 32],
    /// PCR 12 when it differs from the direct path's (a profile started by systemd-boot).
    pcr12: Option<[u8; 32]>,
}

/// The other boot paths the QEMU reference accepts, and why systemd-boot's is missing if it is.
fn other_paths(p: &Prediction) -> (Vec<OtherPath>, Option<String>) {
    let (managers, missing) = match pinned_systemd_boot() {
        Ok(m) => (vec![m], None),
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    };
    let direct12 = p.pcr(12, Phase::Stub);
    let paths = allowed_boot_paths(&managers)
        .into_iter()
        .map(|path| {
            let on = p.on_path(&path);
            let pcr12 = on.pcr(12, Phase::Stub);
            OtherPath {
                pcr4: on.pcr(4, Phase::Stub),
                pcr12: (pcr12 != direct12).then_some(pcr12),
                path,
            }
        })
        .collect();
    (paths, missing)
}

/// systemd-boot from this workspace's pinned inputs, by its Authenticode hash.
fn pinned_systemd_boot() -> anyhow::Result<(String, [u8; 32])> {
    let ws = hawser_cli::image_build::workspace()?;
    systemd_boot(&InputLock::load(&ws.join("inputs.lock"))?)
}

pub(super) fn predict(
    uki: &Path,
    json: bool,
    events: bool,
    cluster_id: Option<&[u8; 32]>,
    profile: u32,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let p = Prediction::from_uki_with(
        &read(uki)?,
        &uki.display().to_string(),
        PredictOptions {
            assume_stub: None,
            profile,
        },
    )?;
    let (others, systemd_boot_missing) = other_paths(&p);
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
        let mut measurements =
            p.expected_measurements_json_in_cluster(Phase::EnterInitrd, cluster_id);
        measurements["4"]["alsoExpected"] = others
            .iter()
            .map(|o| hex::encode(o.pcr4))
            .collect::<Vec<_>>()
            .into();
        let boot_paths: Vec<serde_json::Value> = others
            .iter()
            .map(|o| {
                let mut v = serde_json::json!({
                    "path": o.path.to_string(),
                    "bootPath": o.path,
                    "pcr4": hex::encode(o.pcr4),
                });
                if let Some(pcr12) = o.pcr12 {
                    v["pcr12"] = hex::encode(pcr12).into();
                }
                v
            })
            .collect();
        let out = serde_json::json!({
            "measurements": measurements,
            "measurementsAfterLeaveInitrd": {
                "11": {"expected": hex::encode(p.pcr(11, Phase::LeaveInitrd)), "warnOnly": false}
            },
            "measurementsPerPhase": phases,
            "clusterId": cluster_id.map(hex::encode),
            "pcr11AfterStub": hex::encode(p.pcr(11, Phase::Stub)),
            "bootPaths": boot_paths,
            "bootPathsMissing": systemd_boot_missing,
            "prediction": p,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_text(uki, &p, cluster_id);
    print_other_paths(&p, &others, systemd_boot_missing.as_deref());
    if events {
        println!("events (the direct boot path):");
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

fn print_text(uki: &Path, p: &Prediction, cluster_id: Option<&[u8; 32]>) {
    println!(
        "UKI {} ({} bytes, sha256 {})",
        uki.display(),
        p.uki_size,
        hex::encode(p.uki_sha256)
    );
    println!("stub: {}; kernel: Linux {}", p.stub, p.kernel_release);
    if p.profiles > 1 || p.profile > 0 {
        println!(
            "profile {} of {} (the boot entry passes @{}; profile 0 without it)",
            p.profile, p.profiles, p.profile
        );
    }
    if !p.ignored_sections.is_empty() {
        println!(
            "sections {} ignores (a newer stub acts on them; in no PCR but 4): {}",
            p.stub,
            p.ignored_sections.join(" ")
        );
    }
    if let Some(why) = &p.dtbauto {
        println!(".dtbauto: {why}");
    }
    println!("kernel command line: {}", p.cmdline);
    if p.profile > 0 {
        println!(
            "the direct boot path: the UKI is the firmware's first boot option, its optional data @{0} (efibootmgr --unicode '@{0}')",
            p.profile
        );
    } else {
        println!("the direct boot path: the UKI is the firmware's first boot option");
    }
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
    println!(
        "PCR 12  {}{}",
        hex::encode(pcrs(Phase::LeaveInitrd)[&12]),
        if p.profile > 0 {
            format!("  systemd-stub: profile {}", p.profile)
        } else {
            String::new()
        }
    );
    println!("PCR 13  {}", hex::encode(pcrs(Phase::LeaveInitrd)[&13]));
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
}

fn print_other_paths(p: &Prediction, others: &[OtherPath], systemd_boot_missing: Option<&str>) {
    println!(
        "other boot paths the reference accepts (alsoExpected; every PCR not listed as on the direct path):"
    );
    for o in others {
        println!("  {}:", o.path);
        println!("    PCR  4  {}", hex::encode(o.pcr4));
        if let Some(pcr12) = o.pcr12 {
            println!(
                "    PCR 12  {}  its load options @{}, then the stub's profile",
                hex::encode(pcr12),
                p.profile
            );
        }
    }
    if let Some(why) = systemd_boot_missing {
        println!(
            "  (the pinned systemd-boot's path is not listed: {why}; run `hawser image fetch` in a hawser checkout)"
        );
    }
}
