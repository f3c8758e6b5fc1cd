//! `hawser local upgrade --image DIR`: the cluster rolled onto a new node image, as an admin
//! would do it with `hawser release` and a reboot of each node (docs/lifecycle.md):
//!
//! 1. the new image's release is added through node-1's attested admin API (its measurements
//!    predicted from the new UKI), so the join services accept its nodes;
//! 2. the **control planes** boot the new image one at a time, each recovered by the admin
//!    (`hawser recover` against the new release: a node of the new image trusts only a join
//!    service of its own image, so the control planes go first, as Kubernetes' version-skew
//!    policy wants too) and verified, keeping the others (etcd's quorum) up;
//! 3. the **workers** boot the new image one at a time and rejoin through a control plane of
//!    it, with their own disks;
//! 4. every node answers `hawser verify` naming the new release; then the old release is
//!    retired, and (`--check-retired`) a worker booted from the old image is refused by name
//!    before it boots the new one again.
//!
//! A node that does not come back stops the rollout with its reason; the old release stays
//! accepted, so the nodes not yet upgraded keep rejoining.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, bail};
use hawser_attestation::validator::AkTrust;
use hawser_cli::cluster::ClusterFile;
use hawser_cli::lifecycle::{self, AdminTarget, NodeVerdict};
use hawser_joinservice::store::releases::Release;
use hawser_keys::MasterSecret;

use super::form::{recover_control_plane, start_node_from};
use super::node::{check_reports, power_off, wait_for, wait_for_kubeadm};
use super::{BootImage, Formation, Node, PROVIDER_CA, UpOptions, WAITING_FOR_ADMIN};
use crate::local_cluster::Role;

/// What `hawser local upgrade` asks.
#[derive(Debug, Clone)]
pub struct UpgradeRequest {
    /// The new image's directory (`hawser image build --out`).
    pub image_dir: std::path::PathBuf,
    /// The new release's name; default `image-<digest>`.
    pub name: Option<String>,
    /// Boot a worker from the retired image once, and require its refusal by name.
    pub check_retired: bool,
}

struct Admin<'a> {
    f: &'a Formation<'a>,
    master: MasterSecret,
    cluster_id: [u8; 32],
    provider_ca: String,
    runtime: tokio::runtime::Runtime,
}

impl<'a> Admin<'a> {
    /// The admin of the local cluster: its master secret, cluster ID and provider CA.
    fn new(f: &'a Formation<'a>) -> anyhow::Result<Self> {
        Ok(Admin {
            f,
            master: MasterSecret::read_file(&f.admin.master_secret())?,
            cluster_id: hex::decode(ClusterFile::read(&f.admin.cluster_file())?.cluster_id)
                .ok()
                .and_then(|id| id.try_into().ok())
                .context("the cluster file's cluster ID is not 32 bytes of hex")?,
            provider_ca: std::fs::read_to_string(f.dir.join(PROVIDER_CA))?,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    /// The admin API of the first running control plane, trusted to run one of `trusted`.
    fn target(
        &self,
        nodes: &Mutex<Vec<Arc<Node>>>,
        trusted: &[&BootImage],
    ) -> anyhow::Result<AdminTarget> {
        let running = nodes.lock().map(|n| n.clone()).unwrap_or_default();
        let i = self
            .f
            .layout
            .nodes
            .iter()
            .position(|spec| {
                spec.role == Role::ControlPlane
                    && running
                        .iter()
                        .any(|n| n.spec.name == spec.name && n.vm.exit_status().is_none())
            })
            .context("no control plane runs: the admin API is out of reach")?;
        let trusted = trusted
            .iter()
            .map(|image| release_of(image))
            .collect::<anyhow::Result<Vec<_>>>()?;
        AdminTarget::new(
            &format!("127.0.0.1:{}", self.f.ports[i].admin),
            trusted,
            self.cluster_id,
            &self.provider_ca,
            &self.master,
        )
    }

    fn verify(&self, i: usize, releases: &[Release]) -> anyhow::Result<NodeVerdict> {
        let trust = AkTrust::from_pem(&self.provider_ca)?;
        Ok(self.runtime.block_on(lifecycle::verify_node(
            &format!("127.0.0.1:{}", self.f.ports[i].attest),
            releases,
            &self.cluster_id,
            &trust,
        )))
    }
}

fn release_of(image: &BootImage) -> anyhow::Result<Release> {
    let text = std::fs::read_to_string(&image.measurements)
        .with_context(|| format!("reading {}", image.measurements.display()))?;
    Ok(Release::from_measurements_text(
        &image.release,
        &text,
        "admin",
        0,
    )?)
}

/// Rolls the running cluster onto the image of `request` (see the module docs).
pub(super) fn upgrade(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    request: &UpgradeRequest,
) -> anyhow::Result<()> {
    let old = f.image();
    let releases_dir = f.dir.join("releases");
    std::fs::create_dir_all(&releases_dir)?;
    let staged = releases_dir.join("next.json");
    let mut new = BootImage::open(&request.image_dir, &staged, request.name.as_deref())?;
    let measurements = releases_dir.join(format!("{}.json", new.release));
    std::fs::rename(&staged, &measurements)?;
    new.measurements = measurements;
    let (old_release, new_release) = (release_of(&old)?, release_of(&new)?);
    if old_release.digest == new_release.digest {
        bail!(
            "{} is the image the cluster runs already (release {})",
            request.image_dir.display(),
            old.release
        );
    }
    let uki = request.image_dir.join(hawser_image::build::UKI_FILE);
    if crate::localhost::state_disk_key_length(&uki)? != f.key_length {
        bail!(
            "the new image's state disks use another key length (integrity mode) than the \
             cluster's: its disks could not be opened"
        );
    }
    let admin = Admin::new(f)?;
    let target = admin.target(nodes, &[&old])?;
    let text = std::fs::read_to_string(&new.measurements)?;
    let (added, _) = admin
        .runtime
        .block_on(target.add_release(&new.release, &text))?;
    f.events.say(format!(
        "release {} added (digest {}…) through the attested admin API: the join services \
         accept both {} and {}",
        added.name,
        &added.digest[..16],
        old.release,
        new.release
    ));
    match f.image.write() {
        Ok(mut image) => *image = new.clone(),
        Err(poisoned) => *poisoned.into_inner() = new.clone(),
    }

    // Control planes first, then workers; one at a time.
    let order: Vec<usize> = (0..f.layout.nodes.len())
        .filter(|&i| f.layout.nodes[i].role == Role::ControlPlane)
        .chain((0..f.layout.nodes.len()).filter(|&i| f.layout.nodes[i].role == Role::Worker))
        .collect();
    let accepted = [old_release.clone(), new_release.clone()];
    let mut booted_at = std::collections::BTreeMap::new();
    for (step, &i) in order.iter().enumerate() {
        let name = f.layout.nodes[i].name.clone();
        f.events.say(format!(
            "upgrade {}/{}: {name} reboots into release {}",
            step + 1,
            order.len(),
            new.release
        ));
        booted_at.insert(name.clone(), unix_now());
        let result = reboot(opts, stop, f, nodes, &admin, i, &new)
            .and_then(|()| expect_release(&admin, i, &accepted, &new.release));
        if let Err(e) = result {
            bail!(
                "the upgrade stopped at {name}: {e:#}; release {} stays accepted, the nodes not \
                 upgraded keep rejoining on it",
                old.release
            );
        }
    }

    let target = admin.target(nodes, &[&new])?;
    for release in admin.runtime.block_on(target.list_releases())? {
        if release.name != new.release && !release.is_retired() {
            admin
                .runtime
                .block_on(target.retire_release(&release.name))?;
            f.events.say(format!(
                "release {} retired: its nodes are refused by name",
                release.name
            ));
        }
    }
    let mut retired_old = old_release;
    retired_old.retired_unix = Some(1);
    let now = [retired_old, new_release];
    if request.check_retired {
        // Its quotes on the retired release never count as the new one's.
        let before = unix_now();
        let last = check_retired(opts, stop, f, nodes, &admin, &old, &new, &now)?;
        booted_at.insert(last, before);
    }
    let verdicts = order
        .iter()
        .map(|&i| admin.verify(i, &now))
        .collect::<anyhow::Result<Vec<_>>>()?;
    eprint!("{}", lifecycle::verdict_table(&verdicts));
    if let Some(failed) = verdicts
        .iter()
        .find(|v| !v.ok || v.release.as_deref() != Some(new.release.as_str()))
    {
        bail!(
            "after the upgrade {} does not verify on release {}: {}",
            failed.address,
            new.release,
            failed.reason.as_deref().unwrap_or("another release")
        );
    }
    f.events.say(format!(
        "the cluster runs release {} on every node; `hawser verify` passed",
        new.release
    ));
    wait_reattested(stop, f, nodes, &admin, &new.release, booted_at)
}

/// Waits (up to 3 minutes) until every node has re-attested on its own since it booted
/// `release` (its join service's record of a good quote on release `release`, made at its
/// polls of the mesh), and says when each did.
fn wait_reattested(
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    admin: &Admin<'_>,
    release: &str,
    booted_at: std::collections::BTreeMap<String, u64>,
) -> anyhow::Result<()> {
    let target = admin.target(nodes, &[&f.image()])?;
    let running = nodes.lock().map(|n| n.clone()).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let listed = admin.runtime.block_on(target.list_nodes())?;
        let mut done = Vec::new();
        let mut waiting = Vec::new();
        for node in &running {
            let ip = crate::local_cluster::observe(&node.vm.console_lines()).vpn_ip;
            let entry = listed
                .iter()
                .find(|n| ip.is_some() && n["vpnIp"].as_str() == ip.as_deref());
            let attested = entry.and_then(|n| {
                let at = n["attested"]["unixTime"].as_u64()?;
                let as_what = n["attested"]["release"].as_str()?.to_owned();
                Some((at, as_what))
            });
            let since = booted_at.get(&node.spec.name).copied().unwrap_or(0);
            match attested {
                Some((at, as_what))
                    if at >= since && as_what.starts_with(&format!("{release} ")) =>
                {
                    done.push(format!("{} as {as_what}", node.spec.name));
                }
                _ => waiting.push(node.spec.name.clone()),
            }
        }
        if waiting.is_empty() {
            f.events.say(format!(
                "every node re-attested on its own since it booted release {release}: {}",
                done.join(", ")
            ));
            return Ok(());
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) || std::time::Instant::now() > deadline {
            bail!(
                "no re-attestation on release {release} within 3 minutes of {}",
                waiting.join(", ")
            );
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Powers node `i` off and boots it from `image`: a control plane recovered by the admin, a
/// worker rejoining; verified as on `local up` (reports, cluster lock, kubeadm).
fn reboot(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    admin: &Admin<'_>,
    i: usize,
    image: &BootImage,
) -> anyhow::Result<()> {
    let name = &f.layout.nodes[i].name;
    let current = nodes
        .lock()
        .ok()
        .and_then(|n| n.iter().find(|n| &n.spec.name == name).cloned());
    if let Some(node) = current.filter(|n| n.vm.exit_status().is_none()) {
        power_off(&node, f.events);
    }
    let (node, nonce) = start_node_from(opts, f, i, nodes, image)?;
    if node.spec.role == Role::ControlPlane {
        wait_for(&node, WAITING_FOR_ADMIN, stop, "waiting for the admin")?;
        f.events.say(format!(
            "{name}: `hawser recover` against release {}",
            image.release
        ));
        recover_control_plane(f, i, &node, &admin.runtime)?;
    }
    check_reports(
        &node,
        &nonce,
        &admin.master,
        f.key_length,
        &admin.cluster_id,
        stop,
        f.events,
    )?;
    wait_for_kubeadm(&node, stop)?;
    Ok(())
}

/// Node `i` answers `hawser verify` on release `release`.
fn expect_release(
    admin: &Admin<'_>,
    i: usize,
    accepted: &[Release],
    release: &str,
) -> anyhow::Result<()> {
    let verdict = admin.verify(i, accepted)?;
    if !verdict.ok {
        bail!(
            "it does not verify: {}",
            verdict.reason.as_deref().unwrap_or("?")
        );
    }
    if verdict.release.as_deref() != Some(release) {
        bail!(
            "it verifies on release {:?}, not {release}",
            verdict.release
        );
    }
    admin.f.events.say(format!(
        "{}: verified on release {release} ({}, PCR 15 ok)",
        admin.f.layout.nodes[i].name,
        verdict.phase.as_deref().unwrap_or("?")
    ));
    Ok(())
}

/// Boots the last worker from the retired image: it cannot rejoin (no join service of the
/// cluster runs its image, and the join services refuse its release by name), and `hawser
/// verify` names it as the retired release while it waits in its initramfs; then it boots the
/// current image again.
#[allow(clippy::too_many_arguments)]
fn check_retired(
    opts: &UpOptions,
    stop: &AtomicBool,
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    admin: &Admin<'_>,
    old: &BootImage,
    new: &BootImage,
    releases: &[Release],
) -> anyhow::Result<String> {
    let Some(i) = f.layout.nodes.iter().rposition(|n| n.role == Role::Worker) else {
        bail!("--check-retired needs a worker");
    };
    let name = f.layout.nodes[i].name.clone();
    if let Some(node) = nodes
        .lock()
        .ok()
        .and_then(|n| n.iter().find(|n| n.spec.name == name).cloned())
    {
        power_off(&node, f.events);
    }
    f.events.say(format!(
        "{name} boots the retired release {} once: its rejoin must be refused by name",
        old.release
    ));
    let (node, _) = start_node_from(opts, f, i, nodes, old)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let verdict = loop {
        let verdict = admin.verify(i, releases)?;
        if verdict
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("which is retired"))
        {
            break verdict;
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) || node.vm.exit_status().is_some() {
            bail!("{name} on the retired release stopped before it was verified");
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "{name} on the retired release was not named retired within 5 minutes: {}",
                verdict.reason.as_deref().unwrap_or("it verified")
            );
        }
        std::thread::sleep(std::time::Duration::from_secs(3));
    };
    f.events.say(format!(
        "{name} on the retired release is refused: `hawser verify` says {}",
        verdict.reason.as_deref().unwrap_or_default()
    ));
    power_off(&node, f.events);
    reboot(opts, stop, f, nodes, admin, i, new)?;
    expect_release(admin, i, releases, &new.release)?;
    Ok(name)
}

/// `hawser local revoke <node>`: the admin revokes the node through node-1's attested admin
/// API (by its mesh address), then waits until every other running node's tunnel has dropped
/// it (their next poll of the mesh: `… 1 removed`), and says how long that took.
pub(super) fn revoke(
    f: &Formation<'_>,
    nodes: &Mutex<Vec<Arc<Node>>>,
    name: &str,
    reason: &str,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let running = nodes.lock().map(|n| n.clone()).unwrap_or_default();
    let node = running
        .iter()
        .find(|n| n.spec.name == name)
        .with_context(|| format!("no node {name} has run in this cluster"))?;
    let vpn_ip = crate::local_cluster::observe(&node.vm.console_lines())
        .vpn_ip
        .with_context(|| format!("{name} has no address in the mesh to revoke it by"))?;
    let others: Vec<Arc<Node>> = running
        .iter()
        .filter(|n| n.spec.name != name && n.vm.exit_status().is_none())
        .cloned()
        .collect();
    let removals = |n: &Node| {
        n.vm.console_lines()
            .iter()
            .filter(|l| l.contains("mesh: registry version") && !l.contains(", 0 removed"))
            .count()
    };
    let before: Vec<usize> = others.iter().map(|n| removals(n)).collect();
    let admin = Admin::new(f)?;
    let started = std::time::Instant::now();
    let target = admin.target(nodes, &[&f.image()])?;
    let (revocation, removed) = admin.runtime.block_on(target.revoke(&vpn_ip, reason))?;
    f.events.say(format!(
        "{name} ({vpn_ip}, AK {}…) revoked: its joins and rejoins are refused{}",
        &revocation.ak_name[..16.min(revocation.ak_name.len())],
        if removed {
            ", its mesh membership removed"
        } else {
            ""
        }
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for (other, before) in others.iter().zip(before) {
        while removals(other) <= before {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                bail!(
                    "stopped while waiting for {} to drop {name}",
                    other.spec.name
                );
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "{}'s tunnel did not drop the revoked {name} within 2 minutes",
                    other.spec.name
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
    f.events.say(format!(
        "{name} is cut off: {} dropped it from their tunnels {:.1}s after the revocation",
        others
            .iter()
            .map(|n| n.spec.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
