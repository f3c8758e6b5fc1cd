//! The encrypted state disk: a LUKS2-compatible disk, formatted and opened by PID 1 itself,
//! mapped with the kernel's dm-crypt through device-mapper ioctls.
//!
//! A node's state (etcd, kubelet, containers) lives on a disk the host must not read or
//! silently alter. PID 1 finds it by serial ([`device`]), reads its header strictly
//! ([`luks2`], [`probe`]), formats a blank disk once or opens an initialized one with the key
//! ([`lifecycle`]), maps it with parameters that are hawser's constants, never the header's
//! ([`dm`]), and mounts the ext4 filesystem at [`STATE_MOUNT_POINT`]. An operator holding the
//! key can always open the disk with `cryptsetup open --volume-key-file` (see
//! `docs/state-disk.md`).
//!
//! The measured configuration (`hawser.state_disk*` on the kernel command line, see
//! [`StateDiskConfig`]) says which disk, where its key comes from ([`key::KeySourceKind`]) and
//! whether to add dm-integrity. With the default key source `none` PID 1 leaves disks alone.
//!
//! Only [`bring_up`] and [`LinuxPlatform`] touch the machine; the rest is tested on the host.

pub mod dm;
pub mod key;
pub mod lifecycle;
pub mod luks2;
pub mod probe;

use std::fs::OpenOptions;
use std::io::{self, Seek as _, SeekFrom};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::mount::MsFlags;
use tokio::io::AsyncReadExt as _;
use tracing::{info, warn};

use self::dm::DmError;
use self::key::{FixedKey, KeyError, KeySource, KeySourceKind, VolumeKey};
use self::lifecycle::{Action, LifecycleError, Options, Platform};
use self::luks2::Integrity;
use crate::platform::block::{self as device, BlockDevice, DiskSelector, Lookup, SysfsError};
use crate::platform::poll::{self, Poll};
use crate::platform::reaper::ChildRegistry;
use crate::platform::syscalls::{LinuxSyscalls, MountSpec};
use crate::platform::timings::PhaseTimer;

/// Where the state filesystem is mounted (ext4, no mount flags: what later runs from it —
/// containerd, kubelet — decides its own).
pub const STATE_MOUNT_POINT: &str = "/run/hawser/state";
/// How long to wait for the disk to appear (virtio-blk probes asynchronously).
pub const DISK_WAIT: Duration = Duration::from_secs(10);
/// The mkfs in the initramfs (e2fsprogs' mke2fs).
pub const MKFS: &str = "/usr/sbin/mke2fs";
/// The ext4 label of the state filesystem.
pub const FS_LABEL: &str = "hawser-state";
/// How often sysfs is looked at while waiting for the disk.
const DISK_POLL: Duration = Duration::from_millis(20);
/// Bytes per write when wiping for dm-integrity.
const WIPE_CHUNK: usize = 4 * 1024 * 1024;

/// The measured state disk configuration (`hawser.state_disk`, `hawser.state_disk_key_source`,
/// `hawser.state_disk_integrity`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StateDiskConfig {
    pub key_source: KeySourceKind,
    /// Required unless the key source is `none`.
    pub disk: Option<DiskSelector>,
    pub integrity: Integrity,
}

/// Why the state disk is not up. Each message names the disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "no state disk with {selector} appeared within {} s; disks present: {present}",
        waited.as_secs()
    )]
    NotFound {
        selector: DiskSelector,
        waited: Duration,
        present: String,
    },
    #[error(
        "more than one disk has {selector} ({disks}); refusing to guess which is the state disk"
    )]
    Ambiguous {
        selector: DiskSelector,
        disks: String,
    },
    #[error(
        "hawser.state_disk_key_source={} needs hawser.state_disk=serial:<serial>",
        key_source.cmdline_name()
    )]
    NoDiskConfigured { key_source: KeySourceKind },
    #[error("cannot list the disks")]
    Sysfs(#[source] SysfsError),
    #[error("state disk {device} is read-only; hawser must be able to write to it")]
    ReadOnly { device: String },
    #[error("cannot open state disk {device}")]
    Open {
        device: String,
        #[source]
        source: io::Error,
    },
    #[error("state disk")]
    Key(#[source] KeyError),
    #[error("state disk {device}")]
    Lifecycle {
        device: String,
        #[source]
        source: LifecycleError,
    },
    #[error("the state disk task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// The warning logged on every boot with the development key source.
pub const INSECURE_KEY_WARNING: &str = "INSECURE: hawser.state_disk_key_source=fw_cfg-insecure-dev: \
     the state disk key comes from fw_cfg, which the host chooses and reads; the disk is not \
     protected from the host. For development only.";

/// Brings the state disk up as `config` says, or does nothing when the key source is `none`.
/// `fw_cfg_key` is fw_cfg's `opt/hawser/state_disk_key`, used only by the development source.
/// Appends warnings for the boot report to `warnings`; returns `timer` with the disk's phases.
pub async fn bring_up(
    config: &StateDiskConfig,
    fw_cfg_key: Option<VolumeKey>,
    join_keys: Option<Arc<dyn KeySource + Send + Sync>>,
    registry: &ChildRegistry,
    mut timer: PhaseTimer,
    warnings: &mut Vec<String>,
) -> Result<PhaseTimer, DiskError> {
    let mut warn_and_keep = |warning: String| {
        warn!("{warning}");
        warnings.push(warning);
    };
    if fw_cfg_key.is_some() && config.key_source != KeySourceKind::FwCfgInsecureDev {
        warn_and_keep(format!(
            "fw_cfg opt/hawser/state_disk_key is ignored: hawser.state_disk_key_source is {}",
            config.key_source.cmdline_name()
        ));
    }
    let keys: Arc<dyn KeySource + Send + Sync> = match config.key_source {
        KeySourceKind::None => {
            info!("no state disk (hawser.state_disk_key_source=none)");
            return Ok(timer);
        }
        KeySourceKind::JoinService => join_keys.ok_or(DiskError::Key(KeyError::JoinService {
            reason: "no join client was started".to_owned(),
        }))?,
        KeySourceKind::FwCfgInsecureDev => {
            warn_and_keep(INSECURE_KEY_WARNING.to_owned());
            let key = fw_cfg_key.ok_or(DiskError::Key(KeyError::MissingFwCfgKey))?;
            Arc::new(FixedKey::new(key, "fw_cfg opt/hawser/state_disk_key"))
        }
    };
    // The configuration parser already refuses a key source without a disk.
    let Some(selector) = config.disk.clone() else {
        return Err(DiskError::NoDiskConfigured {
            key_source: config.key_source,
        });
    };

    let start = timer.elapsed_ms();
    let disk = wait_for_disk(&selector, DISK_WAIT).await?;
    timer.record("state-disk-find", start);
    if disk.read_only {
        return Err(DiskError::ReadOnly {
            device: disk.to_string(),
        });
    }

    let platform = LinuxPlatform {
        disk: disk.clone(),
        registry: registry.clone(),
        runtime: tokio::runtime::Handle::current(),
    };
    let integrity = config.integrity;
    let (timer, result) = tokio::task::spawn_blocking(move || {
        let mut timer = timer;
        let result = run_blocking(&disk, integrity, keys.as_ref(), &platform, &mut timer);
        (timer, result)
    })
    .await
    .map_err(DiskError::Task)?;
    let (device, outcome) = result?;
    for warning in outcome.warnings {
        warn_and_keep(format!("state disk {device}: {warning}"));
    }
    let integrity = match integrity {
        Integrity::None => "no integrity".to_owned(),
        mode => format!("{} integrity", mode.cmdline_name()),
    };
    match outcome.action {
        Action::Formatted { was } => info!(
            "state disk {device}: formatted LUKS2 volume {} (the disk was {was}; \
             aes-xts-plain64, {integrity}{}), created ext4 on {}, mounted at {STATE_MOUNT_POINT}; \
             boot {} of this disk",
            outcome.uuid,
            outcome
                .wiped
                .map(|bytes| format!(", wiped {} MiB", bytes >> 20))
                .unwrap_or_default(),
            outcome.mapped.display(),
            outcome.boots
        ),
        Action::Opened => info!(
            "state disk {device}: opened LUKS2 volume {} ({integrity}) as {}, mounted at \
             {STATE_MOUNT_POINT}; boot {} of this disk",
            outcome.uuid,
            outcome.mapped.display(),
            outcome.boots
        ),
    }
    Ok(timer)
}

fn run_blocking(
    disk: &BlockDevice,
    integrity: Integrity,
    keys: &dyn KeySource,
    platform: &LinuxPlatform,
    timer: &mut PhaseTimer,
) -> Result<(String, lifecycle::Outcome), DiskError> {
    let device = disk.to_string();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(disk.path())
        .map_err(|source| DiskError::Open {
            device: device.clone(),
            source,
        })?;
    let options = Options {
        integrity,
        mount_point: Path::new(STATE_MOUNT_POINT),
        formatted_by: concat!("hawser ", env!("CARGO_PKG_VERSION")),
    };
    let outcome = lifecycle::run(&file, &options, keys, platform, timer).map_err(|source| {
        DiskError::Lifecycle {
            device: device.clone(),
            source,
        }
    })?;
    Ok((device, outcome))
}

/// Polls sysfs until the disk appears (or `limit` passes).
pub async fn wait_for_disk(
    selector: &DiskSelector,
    limit: Duration,
) -> Result<BlockDevice, DiskError> {
    poll::wait_until(limit, DISK_POLL, || {
        let disks = match device::list_disks(Path::new("/sys/block")) {
            Ok(disks) => disks,
            Err(e) => return Poll::Failed(DiskError::Sysfs(e)),
        };
        match device::find(disks, selector) {
            Lookup::Found(disk) => Poll::Ready(disk),
            Lookup::Ambiguous(disks) => Poll::Failed(DiskError::Ambiguous {
                selector: selector.clone(),
                disks: device::describe_disks(&disks),
            }),
            Lookup::Missing(present) => Poll::Pending(DiskError::NotFound {
                selector: selector.clone(),
                waited: limit,
                present: device::describe_disks(&present),
            }),
        }
    })
    .await
}

/// The real [`Platform`]: device-mapper, mke2fs (through the child registry, so the reaper
/// leaves its exit status alone), mount(2) into PID 1's mount table (so shutdown unmounts it),
/// getrandom(2).
pub struct LinuxPlatform {
    pub disk: BlockDevice,
    pub registry: ChildRegistry,
    /// The PID 1 runtime, for spawning mke2fs from the blocking thread.
    pub runtime: tokio::runtime::Handle,
}

impl Platform for LinuxPlatform {
    fn map(
        &self,
        luks_uuid: &str,
        integrity: Integrity,
        key: &VolumeKey,
    ) -> Result<PathBuf, DmError> {
        let mapped = dm::map(self.disk.devnum, self.disk.size, luks_uuid, integrity, key)?;
        // Closed at shutdown after the state file system is unmounted, crypt before integrity.
        let mut table = crate::shutdown::mount_table();
        if integrity == Integrity::HmacSha256 {
            table.record_device(dm::DM_INTEGRITY_NAME);
        }
        table.record_device(dm::DM_NAME);
        Ok(mapped.path)
    }

    fn unmap(&self) {
        for name in [dm::DM_NAME, dm::DM_INTEGRITY_NAME] {
            let _ = dm::remove(name);
            crate::shutdown::mount_table().forget_device(name);
        }
    }

    fn wipe(&self, mapped: &Path) -> io::Result<u64> {
        let mut file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(mapped)?;
        let size = file.seek(SeekFrom::End(0))?;
        let zeros = vec![0u8; WIPE_CHUNK];
        let mut offset = 0u64;
        let mut reported = 0;
        while offset < size {
            let n = (size - offset).min(WIPE_CHUNK as u64) as usize;
            file.write_all_at(&zeros[..n], offset)?;
            offset += n as u64;
            // A large disk takes minutes: say how far it is, every 10 % (synced, so that the
            // number is what is on the disk, not what is in the page cache).
            let percent = offset * 100 / size;
            if percent >= reported + 10 {
                file.sync_data()?;
                reported = percent - percent % 10;
                info!(
                    "wiping {} for dm-integrity: {reported} % of {} MiB",
                    mapped.display(),
                    size >> 20
                );
            }
        }
        file.sync_data()?;
        Ok(size)
    }

    fn mkfs(&self, mapped: &Path) -> Result<(), String> {
        let mut command = tokio::process::Command::new(MKFS);
        command
            .args(["-t", "ext4", "-q", "-F", "-b", "4096", "-L", FS_LABEL])
            .args(["-E", "nodiscard"])
            .arg(mapped)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        self.runtime.block_on(async {
            let mut child = self
                .registry
                .spawn(&mut command)
                .map_err(|e| format!("cannot run {MKFS}: {e}"))?;
            let stdout = child.inner().stdout.take();
            let stderr = child.inner().stderr.take();
            let (out, err) = tokio::join!(read_all(stdout), read_all(stderr));
            let status = child
                .wait()
                .await
                .map_err(|e| format!("cannot wait for {MKFS}: {e}"))?;
            if status.success() {
                return Ok(());
            }
            let output = format!(
                "{}{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
            Err(format!("{MKFS} exited with {status}: {}", output.trim()))
        })
    }

    fn mount(&self, mapped: &Path, target: &Path) -> io::Result<()> {
        // MountSpec holds 'static strings (the mount table outlives every caller); this runs
        // once per boot.
        let leak = |p: &Path| -> &'static str {
            Box::leak(p.to_string_lossy().into_owned().into_boxed_str())
        };
        report_clean_state(mapped);
        let spec = MountSpec {
            source: leak(mapped),
            target: leak(target),
            fstype: "ext4",
            flags: MsFlags::empty(),
            data: None,
        };
        crate::shutdown::mount_table()
            .mount(&LinuxSyscalls, &spec)
            .map_err(|e| e.source)
    }

    fn random(&self, buf: &mut [u8]) -> io::Result<()> {
        fill_random(buf)
    }
}

/// `s_feature_incompat` of the ext4 superblock (1024 bytes into the device) and its
/// `RECOVER` bit: set while the file system is mounted, cleared by a clean unmount.
const EXT4_INCOMPAT_OFFSET: u64 = 1024 + 0x60;
const EXT4_INCOMPAT_RECOVER: u32 = 0x0004;

/// Says whether the state file system was cleanly unmounted at the last shutdown (read from its
/// superblock before mounting; the mount itself replays the journal if it was not).
fn report_clean_state(mapped: &Path) {
    let mut bytes = [0u8; 4];
    let read =
        std::fs::File::open(mapped).and_then(|f| f.read_exact_at(&mut bytes, EXT4_INCOMPAT_OFFSET));
    match read {
        Ok(()) if u32::from_le_bytes(bytes) & EXT4_INCOMPAT_RECOVER == 0 => {
            info!("state file system: clean (nothing in its journal to replay)")
        }
        Ok(()) => warn!(
            "state file system: NOT cleanly unmounted at the last shutdown (power loss or \
             crash): ext4 replays its journal"
        ),
        Err(e) => warn!("cannot read the state file system's superblock: {e}"),
    }
}

async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes).await;
    }
    bytes
}

/// The kernel's CSPRNG at its old path (`init/tests/luks2_cryptsetup.rs` imports it from here).
pub use crate::platform::random::fill as fill_random;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wiping_zeroes_the_whole_device() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let size = 2 * WIPE_CHUNK + 4096;
        std::fs::write(file.path(), vec![0xa5u8; size]).unwrap();
        let platform = LinuxPlatform {
            disk: BlockDevice {
                name: "test".into(),
                serial: None,
                devnum: dm::DevNum { major: 0, minor: 0 },
                size: size as u64,
                read_only: false,
            },
            registry: ChildRegistry::new(),
            runtime: tokio::runtime::Handle::current(),
        };
        assert_eq!(platform.wipe(file.path()).unwrap(), size as u64);
        let bytes = std::fs::read(file.path()).unwrap();
        assert_eq!(bytes.len(), size);
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[tokio::test]
    async fn the_none_key_source_touches_nothing() {
        let mut warnings = Vec::new();
        let config = StateDiskConfig::default();
        bring_up(
            &config,
            None,
            None,
            &ChildRegistry::new(),
            PhaseTimer::start(),
            &mut warnings,
        )
        .await
        .unwrap();
        assert!(warnings.is_empty());
    }

    #[tokio::test]
    async fn a_fw_cfg_key_without_the_dev_source_is_ignored_with_a_warning() {
        let mut warnings = Vec::new();
        let key = VolumeKey::new(zeroize::Zeroizing::new(vec![1; 64]));
        bring_up(
            &StateDiskConfig::default(),
            Some(key),
            None,
            &ChildRegistry::new(),
            PhaseTimer::start(),
            &mut warnings,
        )
        .await
        .unwrap();
        assert_eq!(
            warnings,
            ["fw_cfg opt/hawser/state_disk_key is ignored: hawser.state_disk_key_source is none"]
        );
    }

    #[tokio::test]
    async fn the_join_service_source_without_a_client_is_a_clear_error() {
        let config = StateDiskConfig {
            key_source: KeySourceKind::JoinService,
            disk: DiskSelector::parse("serial:x"),
            integrity: Integrity::None,
        };
        let err = bring_up(
            &config,
            None,
            None,
            &ChildRegistry::new(),
            PhaseTimer::start(),
            &mut Vec::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            crate::platform::error_chain(&err),
            "state disk: the join service gave no key: no join client was started"
        );
    }

    #[tokio::test]
    async fn the_dev_source_warns_and_needs_its_fw_cfg_key() {
        let config = StateDiskConfig {
            key_source: KeySourceKind::FwCfgInsecureDev,
            disk: DiskSelector::parse("serial:x"),
            integrity: Integrity::None,
        };
        let mut warnings = Vec::new();
        let err = bring_up(
            &config,
            None,
            None,
            &ChildRegistry::new(),
            PhaseTimer::start(),
            &mut warnings,
        )
        .await
        .unwrap_err();
        assert_eq!(warnings, [INSECURE_KEY_WARNING]);
        assert!(
            crate::platform::error_chain(&err).contains("fw_cfg has no opt/hawser/state_disk_key"),
            "{err}"
        );
    }
}
