//! The state disk phase, as three steps with the race for the key in the middle:
//!
//! 1. **prepare** (blocking): find the disk, probe it, decide format or open
//!    ([`disk::prepare`]) — a typed plan that names the LUKS2 UUID the key is for;
//! 2. **race** (async): the join client against the init server ([`Enrollment::race`]) — the
//!    key comes back by value, as a [`KeyGrant`], apart from the node's membership (the
//!    ticket or the admin's call, the mesh grant, the cluster's secrets:
//!    [`Membership`](crate::enrollment::race::Membership)), which only the phases after the
//!    disk use; with the development source, fw_cfg's key;
//! 3. **apply** (blocking): check the key against the disk's LUKS2 digest
//!    ([`disk::Prepared::verify`]), only then take the node lock (PCR 15 ← cluster ID,
//!    [`KeyGrant::take_lock`]), then format or open, map and mount ([`disk::Prepared::apply`]);
//!    a format keeps the node's one-time grants (WireGuard key, kubeadm's intent, a control
//!    plane's secrets: [`grants`]) on the new filesystem before it marks the disk
//!    initialized, so no power cut leaves an initialized disk without them.
//!
//! The disk's own step ([`Boot::apply_state_disk`]) takes the [`VerifiedKey`] and nothing
//! else: the membership passes it by, as the one-time files a new disk keeps.
//!
//! A key that does not open the disk is refused before the node lock: the node never marks
//! itself as a cluster's for a disk it cannot open. When that key came from the admin
//! (`hawser recover` with another cluster's master secret), the admin's call is refused with
//! the reason and the race runs again: the node neither locks nor reboots.

use std::path::Path;
use std::sync::Arc;

use super::BootError;
use super::context::Boot;
use crate::config::{CmdlineConfig, FwCfgConfig, JoinDiscovery};
use crate::disk::key::{DiskStatus, KeySource as _, VolumeKey};
use crate::disk::lifecycle::VerifiedKey;
use crate::disk::{self, DiskError, KeyChoice, LinuxPlatform, StateDiskConfig};
use crate::enrollment::client::{JoinClient, JoinSource};
use crate::enrollment::discover::LanDiscovery;
use crate::enrollment::init_secret::InitSecretHash;
use crate::enrollment::init_server::INIT_PORT;
use crate::enrollment::lock::NodeLock;
use crate::enrollment::race::{Enrollment, EnrollmentError, KeyGrant, Locked, Outcome, Won};
use crate::enrollment::{
    INSECURE_TRUST_WARNING, JoinServiceTrust, PROVIDER_CA_PATH, join_service_policy,
};
use crate::kube::grants;
use crate::platform::error_chain;

impl Boot {
    /// The race's contestants, when the state disk key comes from the cluster: the join
    /// client (if an endpoint is configured) and the init server (`hawser init`/`recover`).
    pub(super) async fn enrollment(
        &mut self,
        config: &CmdlineConfig,
        fw_cfg: &mut FwCfgConfig,
        mesh_key: hawser_mesh::PublicKey,
    ) -> Result<Option<Enrollment>, BootError> {
        if config.state_disk.key_source != crate::disk::key::KeySourceKind::JoinService {
            return Ok(None);
        }
        let tpm = self.tpm()?;
        let issuer = {
            let tpm = Arc::clone(&tpm);
            Arc::new(
                self.time_blocking("attestation-key", move || crate::attest::issuer(tpm))
                    .await?
                    .map_err(BootError::Issuer)?,
            )
        };
        // `hawser verify` reaches the node from now on, before its pivot too.
        let joining = crate::attest_server::Claims {
            role: "joining",
            hawser_version: env!("CARGO_PKG_VERSION"),
            ..Default::default()
        };
        if let Err(e) = crate::attest_server::serve(Arc::clone(&issuer), joining).await {
            tracing::warn!(
                "no attestation for `hawser verify` before the pivot: cannot listen on port {}: {e}",
                crate::attest_server::ATTEST_PORT
            );
        }
        let configured = config.join_endpoint.clone().or(fw_cfg.join_endpoint.take());
        let source = match (configured, config.join_discovery) {
            (Some(endpoints), _) => Some(JoinSource::Configured(endpoints)),
            (None, JoinDiscovery::Mdns) => Some(JoinSource::Discovered(Arc::new(
                LanDiscovery::start().map_err(BootError::Discovery)?,
            ))),
            (None, JoinDiscovery::None) => None,
        };
        let join = match source {
            Some(endpoint) => {
                let trust = config.join_service_trust;
                if trust == JoinServiceTrust::InsecureDev {
                    self.keep_warnings([INSECURE_TRUST_WARNING.to_owned()]);
                }
                let policy = super::context::blocking(move || {
                    join_service_policy(trust, &tpm, Path::new(PROVIDER_CA_PATH))
                })
                .await??;
                // Where peers reach this node's tunnel: fw_cfg's endpoint (behind NAT), else
                // the node's own address: on the LAN between the nodes if it has one (behind
                // QEMU's NAT every node's first NIC has the same address), else `hawser.net`'s.
                let lan = fw_cfg.lan_net.as_ref().map(|lan| lan.address);
                let mesh_endpoint = fw_cfg.vpn_endpoint.or_else(|| {
                    super::after_disk::underlay_ip(lan, config).map(|ip| {
                        std::net::SocketAddr::from((ip, hawser_mesh::DEFAULT_LISTEN_PORT))
                    })
                });
                Some(
                    JoinClient::new(endpoint, policy, Arc::clone(&issuer))
                        .control_plane(fw_cfg.control_plane)
                        .mesh(mesh_key, mesh_endpoint),
                )
            }
            None => None,
        };
        Ok(Some(
            Enrollment::new(join, INIT_PORT, init_secret_hash(config), issuer)
                .image_kubernetes(config.kubernetes.clone()),
        ))
    }

    /// Brings the state disk up (prepare → race → apply); the lock and the membership when
    /// the key came from the cluster.
    pub(super) async fn state_disk(
        &mut self,
        config: &StateDiskConfig,
        fw_cfg_key: Option<VolumeKey>,
        enrollment: Option<Enrollment>,
        first_boot: &grants::FirstBoot<'_>,
    ) -> Result<Option<Outcome>, BootError> {
        let choice = disk::choose_key(config, fw_cfg_key, enrollment, |w| self.warn(w))?;
        if let KeyChoice::None = choice {
            return Ok(None);
        }
        // 1. prepare
        let device = self
            .time_async("state-disk-find", disk::find(config))
            .await?;
        let platform = Arc::new(LinuxPlatform {
            disk: device.clone(),
            registry: self.registry().clone(),
            mounts: self.mounts().clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        let integrity = config.integrity;
        let prepared = {
            let platform = Arc::clone(&platform);
            self.with_timer_blocking(move |timer| {
                disk::prepare(&device, integrity, platform.as_ref(), timer)
            })
            .await??
        };
        // 2. race (or the development key)
        let enrollment = match choice {
            KeyChoice::None => return Ok(None),
            KeyChoice::Fixed(fixed) => {
                let (uuid, len, status) = (
                    prepared.luks_uuid().to_owned(),
                    prepared.key_len(),
                    prepared.status(),
                );
                let key = self
                    .time("state-disk-key", || fixed.volume_key(&uuid, len, status))
                    .map_err(|e| DiskError::Lifecycle {
                        device: prepared.device().to_owned(),
                        source: e.into(),
                    })?;
                // 3. apply
                let (prepared, verified) = self
                    .with_timer_blocking(move |timer| {
                        let verified = prepared.verify(key, timer);
                        (prepared, verified)
                    })
                    .await?;
                self.apply_state_disk(prepared, verified?, platform)
                    .await??;
                return Ok(None);
            }
            KeyChoice::Cluster(enrollment) => {
                enrollment.disk_cluster(prepared.recorded_cluster_id())
            }
        };
        let mut enrollment = enrollment;
        let (won, prepared, key) = self.race(&mut enrollment, prepared).await?;
        let Won {
            key: grant,
            mut membership,
        } = won;
        // A ticket for another Kubernetes than the image's: refused before the lock, so the
        // node stays fresh and nothing is formatted.
        if let Err(e) =
            grants::check_ticket_version(membership.kubeadm.as_ref(), first_boot.image_kubernetes)
        {
            membership.fail(&error_chain(&e));
            return Err(BootError::Ticket(e));
        }
        // 3. apply: the key was checked against the disk; now the lock, then the disk.
        let locked = match self.lock(grant, enrollment.node_lock()).await? {
            Ok(locked) => locked,
            Err(e) => {
                membership.fail(&error_chain(&e));
                return Err(BootError::StateDiskKey {
                    device: prepared.device().to_owned(),
                    source: Box::new(e),
                });
            }
        };
        let prepared = prepared.for_cluster(locked.cluster_id);
        if let Err(e) = first_node_mesh(&mut membership, &locked.summary.disk_uuid, first_boot) {
            membership.fail(&error_chain(&e));
            return Err(BootError::Mesh(e));
        }
        let prepared = match prepared.status() {
            DiskStatus::New => {
                let granted =
                    grants::Granted::of(&membership, &locked.summary.disk_uuid, first_boot.rootfs);
                match grants::first_boot_files(&granted, first_boot) {
                    Ok(kept) => prepared.keeping(kept),
                    Err(e) => {
                        membership.fail(&format!("the join's grants: {}", error_chain(&e)));
                        return Err(e.into());
                    }
                }
            }
            DiskStatus::Initialized => prepared,
        };
        match self.apply_state_disk(prepared, key, platform).await? {
            Ok(()) => Ok(Some(Outcome { locked, membership })),
            Err(e) => {
                // The admin whose request won learns why the node cannot go on.
                membership.fail(&format!("the state disk: {}", error_chain(&e)));
                Err(e.into())
            }
        }
    }

    /// Races for the key until one opens the disk: an admin's key that does not is refused
    /// and the race runs again; the join service's ends the boot. The winner, with the disk
    /// and the key checked against it.
    async fn race(
        &mut self,
        enrollment: &mut Enrollment,
        prepared: disk::Prepared,
    ) -> Result<(Won, disk::Prepared, VerifiedKey), BootError> {
        let (uuid, len, status) = (
            prepared.luks_uuid().to_owned(),
            prepared.key_len(),
            prepared.status(),
        );
        let mut prepared = prepared;
        loop {
            let won = self
                .time_async("state-disk-key", enrollment.race(&uuid, len, status))
                .await
                .map_err(|source| BootError::StateDiskKey {
                    device: prepared.device().to_owned(),
                    source: Box::new(source),
                })?;
            let key = won.key.key();
            let verified = self
                .with_timer_blocking(move |timer| {
                    let verified = prepared.verify(key, timer);
                    (prepared, verified)
                })
                .await?;
            match verified {
                (verified_disk, Ok(key)) => return Ok((won, verified_disk, key)),
                (refused_disk, Err(e)) if won.key.from_admin() => {
                    refuse_admin(won, &e);
                    prepared = refused_disk;
                }
                (_, Err(e)) => return Err(fail_admin(won, e)),
            }
        }
    }

    /// The disk's part of the phase, once the key is checked (and, for the cluster's key, the
    /// node locked): format or open, map, mount. It takes the key and nothing of the node's
    /// membership.
    async fn apply_state_disk(
        &mut self,
        prepared: disk::Prepared,
        key: VerifiedKey,
        platform: Arc<LinuxPlatform>,
    ) -> Result<Result<(), DiskError>, BootError> {
        let applied = self
            .with_timer_blocking(move |timer| prepared.apply(key, platform.as_ref(), timer))
            .await?;
        Ok(applied.map(|warnings| {
            for warning in warnings {
                self.warn(warning);
            }
        }))
    }

    /// Takes the node lock for the race's winner (PCR 15 ← cluster ID).
    async fn lock(
        &mut self,
        grant: KeyGrant,
        lock: Arc<NodeLock>,
    ) -> Result<Result<Locked, EnrollmentError>, BootError> {
        let tpm = self.tpm()?;
        super::context::blocking(move || grant.take_lock(&lock, &tpm)).await
    }
}

/// The admin's init secret hash: from the measured command line only (fw_cfg's is refused
/// when fw_cfg is parsed, by name).
fn init_secret_hash(config: &CmdlineConfig) -> Option<InitSecretHash> {
    config.init_secret_hash.map(InitSecretHash::from_bytes)
}

/// An admin's key that does not open the disk (`hawser recover` with another cluster's master
/// secret): the admin learns why, the node is not locked, and the race goes on.
fn refuse_admin(won: Won, error: &DiskError) {
    let reason = format!(
        "{} refused: the master secret does not give this node's state disk key (the disk \
         belongs to another cluster, or the master secret is wrong); the node is not locked and \
         waits for the right one: {}",
        won.key.rpc(),
        error_chain(error)
    );
    tracing::warn!("{reason}");
    won.membership.fail(&reason);
}

/// A key that does not open the disk: the winning admin learns why, and the boot stops.
fn fail_admin(won: Won, error: DiskError) -> BootError {
    won.membership
        .fail(&format!("the state disk: {}", error_chain(&error)));
    error.into()
}

/// The mesh place of the cluster's first node: `hawser init` with a mesh prefix grants the
/// prefix's first host address to this node (no join service hands out addresses yet); the
/// key generated before the race is the node's, kept with the other grants.
fn first_node_mesh(
    membership: &mut crate::enrollment::race::Membership,
    disk_uuid: &str,
    first_boot: &grants::FirstBoot<'_>,
) -> Result<(), crate::mesh::MeshSetupError> {
    let Some((crate::enrollment::init_server::GrantKind::Init(spec), _)) = &membership.admin else {
        return Ok(());
    };
    let (None, Some(prefix)) = (&membership.mesh, spec.mesh_prefix) else {
        return Ok(());
    };
    let endpoint = first_boot
        .underlay_ip
        .map(|ip| std::net::SocketAddr::from((ip, hawser_mesh::DEFAULT_LISTEN_PORT)));
    let grant = crate::mesh::MeshGrant::first_node(
        prefix,
        &crate::enrollment::client::node_name(disk_uuid),
        first_boot.mesh_key.public_key(),
        endpoint,
    )?;
    tracing::info!(
        "the cluster's first node takes {} in the mesh {prefix}",
        grant.node_ip
    );
    membership.mesh = Some(grant);
    Ok(())
}
