//! The phases after the state disk: what the node does with Kubernetes (its role), the quote
//! and the one-line boot report, the firmware event log, and for images with a rootfs the
//! pivot and the node's services.

use std::sync::Arc;

use hawser_attestation::report::EVENT_LOG_MARKER;
use tracing::{info, warn};

use super::BootError;
use super::context::Boot;
use crate::attest::step as tpm_step;
use crate::attest::{self, Attestation, Measurement, NonceSource, ReportContext, TpmStepError};
use crate::config::CmdlineConfig;
use crate::enrollment::PROVIDER_CA_PATH;
use crate::enrollment::init_server::{GrantKind, Progress};
use crate::enrollment::race::Outcome;
use crate::kube;
use crate::kube::join_service::JoinServiceInputs;
use crate::platform::{console, error_chain};

/// Where the kernel exposes the firmware's TCG event log (securityfs, mounted at bring-up).
const EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// What the race decided (the lock and the membership, the mesh grant taken already), turned
/// into the node's Kubernetes role and name, and what a control plane needs for the cluster's
/// join service; prints the join summary line.
pub(super) fn role(
    config: &CmdlineConfig,
    outcome: Option<Outcome>,
    measurement: &Measurement,
) -> (kube::Role, Option<String>, kube::ControlPlane) {
    let Some(Outcome { locked, membership }) = outcome else {
        return (kube::Role::Rejoin, None, kube::ControlPlane::default());
    };
    match locked.summary.to_console_line() {
        Ok(line) => console::emit_raw_console_line(&line),
        Err(e) => warn!("cannot encode the join summary: {e}"),
    }
    let node_name = crate::enrollment::client::node_name(&locked.summary.disk_uuid);
    let control_plane = kube::ControlPlane {
        // The image's provider CA is in the initramfs, which the pivot frees: read now.
        inputs: config
            .root_hash
            .and(std::fs::read_to_string(PROVIDER_CA_PATH).ok())
            .map(|pem| JoinServiceInputs {
                // Read at `enter-initrd`, before the lock: what a fresh node of this image
                // measures.
                joiner_measurements: crate::enrollment::fresh_node_measurements_json(
                    &measurement.pcrs,
                ),
                provider_ca_pem: pem,
                // `hawser.join_discovery=mdns`: this image's nodes look for the join service on
                // the LAN, so its control planes advertise theirs there, under the node name.
                advertise_as: (config.join_discovery == crate::config::JoinDiscovery::Mdns)
                    .then(|| node_name.clone()),
                own_disk: locked.summary.disk_uuid.clone(),
                mesh: None,
            }),
    };
    // As `kube::grants::Granted::of` read it before the disk was marked initialized.
    let role = match (membership.admin, membership.kubeadm) {
        (Some((GrantKind::Init(spec), progress)), _) if config.root_hash.is_some() => {
            kube::Role::Init {
                spec,
                cluster_id: locked.cluster_id,
                progress,
            }
        }
        (Some((kind, progress)), _) => {
            report_to_admin(&kind, progress, locked.cluster_id);
            kube::Role::Rejoin
        }
        (None, Some(ticket)) => kube::Role::Join(ticket),
        (None, None) => kube::Role::Rejoin,
    };
    (role, Some(node_name), control_plane)
}

/// Ends the admin's `hawser init` / `hawser recover` call. Kubernetes starts after the pivot
/// into the rootfs; an image without a rootfs has no Kubernetes, so no kubeconfig to return.
fn report_to_admin(kind: &GrantKind, progress: Progress, cluster_id: [u8; 32]) {
    match kind {
        GrantKind::Init(spec) => info!(
            "cluster {:?} ({}) initialized on this node: the state disk is ready; this image has \
             no rootfs, so Kubernetes is not started and there is no kubeconfig",
            spec.cluster_name,
            hex::encode(cluster_id)
        ),
        GrantKind::Recover => info!(
            "node recovered into cluster {}: the state disk is open",
            hex::encode(cluster_id)
        ),
    }
    progress.succeed(cluster_id, Vec::new());
}

impl Boot {
    /// The node's place in the WireGuard mesh: the join ticket's (or `hawser init`'s), else the
    /// one the state disk keeps (a control plane recovered by the admin); its key (kept on the
    /// state disk by the boot that formatted it), the tunnel with the ticket's peers, and the
    /// task that keeps them current. A control plane (its disk keeps the cluster's secrets)
    /// polls its own join service first.
    pub(super) async fn mesh(
        &mut self,
        grant: Option<crate::mesh::MeshGrant>,
    ) -> Result<Option<crate::mesh::Mesh>, BootError> {
        let state = std::path::Path::new(crate::disk::STATE_MOUNT_POINT);
        let grant = match grant {
            Some(grant) => grant,
            None => match crate::mesh::kept_grant(state)? {
                Some(kept) => {
                    info!(
                        "no ticket this boot: the node takes its kept place in the mesh, {} in {}",
                        kept.node_ip, kept.prefix
                    );
                    kept
                }
                None => return Ok(None),
            },
        };
        // Only a node with a mesh needs /dev/net/tun.
        self.load_on_demand(hawser_kmod::Use::Mesh, "mesh").await?;
        let key = crate::mesh::node_key(state, &grant)?;
        let serves_peer_api =
            crate::kube::join_service::keeps_secrets(&super::pivot_role::kept_secrets_dir());
        let mesh = self
            .time_async(
                "mesh",
                crate::mesh::start(
                    grant,
                    key,
                    hawser_mesh::DEFAULT_LISTEN_PORT,
                    serves_peer_api,
                    state.to_owned(),
                    self.tpm().ok(),
                ),
            )
            .await?;
        Ok(Some(mesh))
    }

    /// The quote and the boot report line. The quote comes after the state disk: the node
    /// lock may have extended PCR 15, and the report's PCR values must be the quoted ones.
    pub(super) async fn report(
        &mut self,
        (nonce, nonce_source): (Vec<u8>, NonceSource),
        measurement: Measurement,
        config: &CmdlineConfig,
        kernel_release: &str,
    ) -> Result<(), BootError> {
        let tpm = self.tpm()?;
        let quoted_nonce = nonce.clone();
        let (measurement, quote) = self
            .time_blocking("attest", move || -> Result<_, TpmStepError> {
                let mut measurement = measurement;
                measurement.pcrs = tpm
                    .read_pcrs_sha256(attest::REPORTED_PCRS)
                    .map_err(tpm_step("read the sha256 PCR bank"))?;
                let quote = attest::quote_boot(&tpm, &quoted_nonce)?;
                Ok((measurement, quote))
            })
            .await??;
        let attestation = Attestation {
            nonce,
            nonce_source,
            measurement,
            quote,
        };
        // What an earlier boot's kubeadm left pending, for whoever reads the report.
        if let Some(warning) =
            kube::intent::boot_report_warning(std::path::Path::new(crate::disk::STATE_MOUNT_POINT))
        {
            self.warn(warning);
        }
        let warnings = self.take_warnings();
        let report = attestation.into_report(ReportContext {
            kernel_release,
            tpm_device: &config.tpm_device.display().to_string(),
            timer: self.timer(),
            warnings,
        });
        let line = report.to_console_line().map_err(BootError::Report)?;
        console::emit_raw_console_line(&line);
        info!(
            "boot report printed ({} bytes); bring-up took {:.1} ms",
            line.len(),
            self.timer().elapsed_ms()
        );
        Ok(())
    }

    /// Answers `hawser verify` from now on ([`crate::attest_server`]), with the claims of the
    /// pivoted node: the server the initramfs started keeps its AK (no second one is made on
    /// the boot path); a node that started none (node-1 before `hawser init`) starts it now. A
    /// node without a provider-certified AK (or whose port is taken) says so and boots on:
    /// verification is the admin's check, not a step of the boot.
    async fn serve_attestation(
        &mut self,
        node_name: Option<String>,
        measured: crate::rootfs::MeasuredRole,
    ) {
        let claims = crate::attest_server::Claims {
            node_name,
            role: match measured {
                crate::rootfs::MeasuredRole::ControlPlane => "control-plane",
                crate::rootfs::MeasuredRole::Worker => "worker",
            },
            hawser_version: env!("CARGO_PKG_VERSION"),
        };
        // Started in the initramfs with its AK: only the claims change.
        if crate::attest_server::set_claims(&claims) {
            return;
        }
        let Ok(tpm) = self.tpm() else {
            return;
        };
        let issuer = tokio::task::spawn_blocking(move || crate::attest::issuer(tpm)).await;
        let issuer = match issuer {
            Ok(Ok(issuer)) => Arc::new(issuer),
            Ok(Err(e)) => {
                warn!(
                    "no attestation for `hawser verify`: cannot load the platform-certified AK: {}",
                    error_chain(&e)
                );
                return;
            }
            Err(e) => {
                warn!("no attestation for `hawser verify`: {e}");
                return;
            }
        };
        if let Err(e) = crate::attest_server::serve(issuer, claims).await {
            warn!(
                "no attestation for `hawser verify`: cannot listen on port {}: {e}",
                crate::attest_server::ATTEST_PORT
            );
        }
    }

    /// For images with a rootfs: the pivot, then the node's services and kubeadm.
    pub(super) async fn run_node(
        &mut self,
        config: &CmdlineConfig,
        role: kube::Role,
        node_name: Option<String>,
        control_plane: kube::ControlPlane,
        node_ip: Option<std::net::Ipv4Addr>,
    ) -> Result<(), BootError> {
        let Some(root_hash) = config.root_hash else {
            return Ok(());
        };
        let state_disk = config.state_disk.disk.is_some();
        let clock = self.timer().clone();
        // A control plane's PCR 11 gets its marker before leave-initrd (`pivot_role`).
        let measured = self.pivot_role(state_disk).await;
        let pivoted = crate::rootfs::pivot(
            root_hash,
            self.tpm()?,
            state_disk,
            measured,
            self.mounts(),
            &clock,
        )
        .await;
        let networking = match pivoted {
            Ok(pivoted) => pivoted.networking,
            Err(e) => {
                if let kube::Role::Init { progress, .. } = role {
                    progress.fail(&format!("the pivot into the rootfs: {}", error_chain(&e)));
                }
                return Err(BootError::Pivot(e));
            }
        };
        let power_button = self.watch_power_buttons_after_pivot();
        self.serve_attestation(node_name.clone(), measured).await;
        // What the verified rootfs says about its Kubernetes must be what the command line
        // said before the disk (the init server's and the join's checks used that).
        let image = match kube::image::read(std::path::Path::new("/"), config.kubernetes.as_ref()) {
            Ok(image) => image,
            Err(e) => {
                if let kube::Role::Init { progress, .. } = role {
                    progress.fail(&error_chain(&e));
                }
                return Err(BootError::ImageKubernetes(e));
            }
        };
        if let Some(image) = &image {
            kube::image::report(image);
        }
        let identity = match (node_ip, node_name) {
            (Some(ip), Some(name)) => Some(kube::NodeIdentity {
                name,
                ip: std::net::IpAddr::V4(ip),
            }),
            _ => None,
        };
        match identity {
            Some(identity) => {
                let (registry, services) = (self.registry().clone(), self.services().clone());
                let runtime = kube::Runtime {
                    registry: &registry,
                    services: &services,
                    image: image.as_ref(),
                    timer: self.timer_mut(),
                };
                kube::run(role, identity, control_plane, runtime, networking)
                    .await
                    .map_err(BootError::Images)?;
            }
            None => {
                let reason = "no node identity for Kubernetes (needs hawser.net and a cluster \
                              key source): containerd, kubelet and kubeadm are not started";
                warn!("{reason}");
                if let kube::Role::Init { progress, .. } = role {
                    progress.fail(reason);
                }
            }
        }
        // Long done in practice: "boot complete" promises a watched power button.
        if let Err(e) = power_button.await {
            warn!("power-button shutdown requests are ignored: {e}");
        }
        Ok(())
    }
}

/// The node's Kubernetes node IP (the kubelet's certificate, the API server's and etcd's
/// advertised addresses), where the other nodes reach it: in a mesh its VPN address; else its
/// address on the LAN between the nodes (fw_cfg `lan_net`); else its `hawser.net` one. Never
/// the first NIC's when a LAN exists: behind a NAT (QEMU's user network) every node has the
/// same address there.
pub(super) fn node_ip(
    mesh: Option<&crate::mesh::Mesh>,
    lan: Option<std::net::Ipv4Addr>,
    config: &CmdlineConfig,
) -> Option<std::net::Ipv4Addr> {
    mesh.map(|mesh| mesh.node_ip).or(underlay_ip(lan, config))
}

/// [`node_ip`] without a mesh (`kube::grants` renders kubeadm's intent with it before the
/// mesh starts, and with the mesh grant's address when there is one).
pub(super) fn underlay_ip(
    lan: Option<std::net::Ipv4Addr>,
    config: &CmdlineConfig,
) -> Option<std::net::Ipv4Addr> {
    lan.or(config.net.map(|net| net.address))
}

/// Prints the firmware's TCG event log as one console line, so a host can explain PCR values
/// that differ from the prediction. Unmeasured diagnostics: nothing trusts it without replaying
/// it against the quoted PCRs. A direct-kernel boot has no firmware and no log.
pub(super) fn emit_event_log() {
    use base64::Engine as _;
    match std::fs::read(EVENT_LOG) {
        Ok(log) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(&log);
            console::emit_raw_console_line(&format!("{EVENT_LOG_MARKER}{encoded}"));
            info!("firmware event log printed ({} bytes)", log.len());
        }
        Err(e) => info!("no firmware event log at {EVENT_LOG} ({e}); not a UEFI boot"),
    }
}

/// The running kernel's release (`uname -r`), for the boot report.
pub(super) fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|uts| uts.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}
