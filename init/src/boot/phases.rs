//! The phases before the state disk: configuration, kernel modules, fw_cfg, network, the TPM,
//! entropy, the nonce and the `enter-initrd` measurement. Each is one method of [`Boot`].

use std::path::Path;

use hawser_attestation::tpm::Tpm;
use hawser_kmod::{KernelModule, Stage, Use};
use hawser_pcr::{PCR_KERNEL_BOOT, PHASE_ENTER_INITRD};
use tracing::info;

use super::context::{Boot, TimedLoad, blocking};
use super::{BootError, ENTROPY_BYTES, GENERATED_NONCE_BYTES, LINUX, ShutdownRequest, TPM_WAIT};
use crate::attest::{self, Measurement, NonceSource, TpmStepError, step as tpm_step};
use crate::config::{self, CmdlineConfig, FwCfgConfig, RebootPolicy};
use crate::fatal;
use crate::modules;
use crate::platform::{console, entropy, fw_cfg, net, poll, power_button};

impl Boot {
    /// The measured configuration from the kernel command line; sets the reboot policy and
    /// the log level.
    pub(super) fn read_config(&mut self) -> Result<CmdlineConfig, BootError> {
        let config = self.time("cmdline", || {
            let cmdline =
                std::fs::read_to_string("/proc/cmdline").map_err(BootError::ReadCmdline)?;
            config::parse_kernel_cmdline(&cmdline).map_err(|e| {
                fatal::set_reboot_policy(config::reboot_policy_or_default(&cmdline));
                BootError::Config(e)
            })
        })?;
        fatal::set_reboot_policy(config.reboot_policy);
        console::set_level(config.log_level);
        if let Some(profile) = config.platform.profile() {
            crate::attest::set_platform(profile);
        }
        if config.platform != config::NodePlatform::Qemu {
            info!("platform: {} (hawser.platform)", config.platform);
        }
        if config.reboot_policy == RebootPolicy::HaltForever {
            info!("hawser.reboot_delay=0: a fatal error halts the machine forever");
        }
        for warning in &config.warnings {
            self.warn(warning.clone());
        }
        Ok(config)
    }

    /// Kernel modules the configuration needs: the early ones now
    /// ([`hawser_kmod::Stage::Early`], none today); on a thread of their own, several at once
    /// with more than one CPU, first fw_cfg's, virtio-rng's and the NIC's
    /// ([`Self::await_network_modules`]), then the state disk's
    /// ([`Self::await_state_disk_modules`]), then the mesh's and the rootfs's
    /// ([`Self::await_late_modules`]), while the TPM, the network, the join and the state disk
    /// work. An optional module the machine cannot use was logged as a warning; the boot report
    /// lists it too.
    pub(super) async fn load_modules(&mut self, config: &CmdlineConfig) -> Result<(), BootError> {
        // The platform's drivers (its disks and NICs, configfs-tsm) after the boot table's: the
        // image ships them for `hawser.platform` (hawser_kmod::platform_modules).
        let platform = hawser_kmod::platform_modules(&config.platform.to_string()).unwrap_or(&[]);
        let wanted: Vec<KernelModule> = hawser_kmod::BOOT_MODULE_TABLE
            .iter()
            .chain(platform)
            .filter(|module| needed(module, config))
            .copied()
            .collect();
        // Without a rootfs there is no pivot: the power button's modules load before the
        // state disk.
        let no_pivot = config.root_hash.is_none();
        let stage = |stage: Stage| -> Vec<KernelModule> {
            wanted
                .iter()
                .filter(|m| {
                    m.stage == stage
                        || (no_pivot && stage == Stage::Background && m.stage == Stage::AfterPivot)
                })
                .copied()
                .collect()
        };
        let (early, network, state_disk, late) = (
            stage(Stage::Early),
            stage(Stage::Network),
            stage(Stage::Background),
            stage(Stage::AfterStateDisk),
        );
        let clock = self.timer().clone();
        let (network_done, network_loaded) = tokio::sync::oneshot::channel();
        let (state_disk_done, state_disk_loaded) = tokio::sync::oneshot::channel();
        let modules = self.background_modules();
        modules.network = Some(network_loaded);
        modules.state_disk = Some(state_disk_loaded);
        modules.after_state_disk = Some(tokio::task::spawn_blocking(move || {
            let dir = modules::running_modules_dir();
            let threads = modules::load_threads();
            let load = |table: &[KernelModule]| {
                let start = clock.elapsed_ms();
                let result = modules::load_table_in(&LINUX, &dir, table, threads);
                (start, clock.elapsed_ms(), result)
            };
            let _ = network_done.send(load(&network));
            let _ = state_disk_done.send(load(&state_disk));
            load(&late)
        }));
        if early.is_empty() {
            return Ok(());
        }
        let kernel_modules = self
            .time_blocking("modules", move || modules::load_table(&LINUX, &early))
            .await??;
        info!("{kernel_modules} (early)");
        self.keep_warnings(kernel_modules.skipped.iter().map(ToString::to_string));
        Ok(())
    }

    /// Waits for fw_cfg's, virtio-rng's and the NIC's modules; phase `modules-network`.
    pub(super) async fn await_network_modules(&mut self) -> Result<(), BootError> {
        let Some(loads) = self.background_modules().network.take() else {
            return Ok(());
        };
        let waited_from = self.timer().elapsed_ms();
        let loaded = loads
            .await
            .map_err(|_| BootError::Modules(modules::ModuleError::Poisoned))?;
        self.background_loaded("modules-network", "the network", waited_from, loaded)
    }

    /// Waits for the state disk's modules (the disks, device-mapper, dm-crypt's cipher, the
    /// power button); phase `modules-background`. A fatal module error surfaces here.
    pub(super) async fn await_state_disk_modules(&mut self) -> Result<(), BootError> {
        self.await_network_modules().await?;
        let Some(loads) = self.background_modules().state_disk.take() else {
            return Ok(());
        };
        let waited_from = self.timer().elapsed_ms();
        let loaded = loads
            .await
            .map_err(|_| BootError::Modules(modules::ModuleError::Poisoned))?;
        self.background_loaded("modules-background", "the state disk", waited_from, loaded)
    }

    /// Waits for the rest, loaded while the state disk opened (dm-verity, erofs, overlay);
    /// phase `modules-after-state-disk`.
    pub(super) async fn await_late_modules(&mut self) -> Result<(), BootError> {
        self.await_state_disk_modules().await?;
        let Some(loads) = self.background_modules().after_state_disk.take() else {
            return Ok(());
        };
        let waited_from = self.timer().elapsed_ms();
        let loaded = loads.await.map_err(BootError::Task)?;
        self.background_loaded(
            "modules-after-state-disk",
            "the mesh and the rootfs",
            waited_from,
            loaded,
        )
    }

    fn background_loaded(
        &mut self,
        phase: &str,
        before: &str,
        waited_from: f64,
        (start, end, result): TimedLoad,
    ) -> Result<(), BootError> {
        self.timer_mut().record_span(phase, start, end);
        let kernel_modules = result?;
        info!(
            "{kernel_modules} (in the background for {before}, {} at once; waited {:.1} ms for \
             them)",
            modules::load_threads(),
            (end - waited_from).max(0.0)
        );
        log_load_times();
        self.keep_warnings(kernel_modules.skipped.iter().map(ToString::to_string));
        Ok(())
    }

    /// The [`Stage::OnDemand`] modules for `used`, now (blocking on a thread; phase
    /// `modules-<phase>`): `tun` before the mesh's tunnel.
    pub(super) async fn load_on_demand(&mut self, used: Use, phase: &str) -> Result<(), BootError> {
        let table: Vec<KernelModule> = hawser_kmod::BOOT_MODULE_TABLE
            .iter()
            .filter(|m| m.stage == Stage::OnDemand && m.used_for == used)
            .copied()
            .collect();
        if table.is_empty() {
            return Ok(());
        }
        let kernel_modules = self
            .time_blocking(&format!("modules-{phase}"), move || {
                modules::load_table(&LINUX, &table)
            })
            .await??;
        info!("{kernel_modules} (for the {phase}, on demand)");
        log_load_times();
        self.keep_warnings(kernel_modules.skipped.iter().map(ToString::to_string));
        Ok(())
    }

    /// Turns presses of the ACPI power button into shutdown requests: now, without a rootfs
    /// (its modules loaded before the state disk); with one, after the pivot
    /// ([`Self::watch_power_buttons_after_pivot`]), or from the initramfs if the bring-up is
    /// still waiting [`POWER_BUTTON_GRACE`] from now.
    pub(super) fn watch_power_buttons(&mut self, config: &CmdlineConfig) {
        if config.root_hash.is_some() {
            let (watched, requests) = (self.power_button().clone(), self.requests().clone());
            let early = tokio::spawn(async move {
                tokio::time::sleep(POWER_BUTTON_GRACE).await;
                load_and_watch_power_buttons(
                    modules::running_modules_dir(),
                    watched,
                    requests,
                    "the bring-up is still waiting",
                )
                .await;
            });
            self.keep_early_power_button(early);
            return;
        }
        if watch_buttons(self.power_button(), self.requests()) == Some(0) {
            self.warn(NO_POWER_BUTTON);
        }
    }

    /// After the pivot: the power button's modules from the rootfs (or nothing, if the
    /// initramfs's were loaded while the bring-up waited), then the buttons are watched.
    pub(super) fn watch_power_buttons_after_pivot(&mut self) -> tokio::task::JoinHandle<()> {
        if let Some(early) = self.take_early_power_button() {
            early.abort();
        }
        let (watched, requests) = (self.power_button().clone(), self.requests().clone());
        tokio::spawn(load_and_watch_power_buttons(
            // The new root's: the rootfs carries them.
            modules::running_modules_dir(),
            watched,
            requests,
            "after the pivot, from the rootfs",
        ))
    }

    /// The unmeasured configuration from fw_cfg.
    pub(super) fn read_fw_cfg(&mut self) -> Result<FwCfgConfig, BootError> {
        let parsed = self.time("fw-cfg", || {
            let mut entries = fw_cfg::read_entries(Path::new(fw_cfg::FW_CFG_HAWSER_DIR))?;
            let parsed = config::parse_fw_cfg(&entries);
            // The raw entries may hold key material (the development state disk key).
            entries.values_mut().for_each(zeroize::Zeroize::zeroize);
            Ok::<_, BootError>(parsed?)
        })?;
        for warning in &parsed.warnings {
            self.warn(warning.clone());
        }
        Ok(parsed)
    }

    /// The network, when `hawser.net` asks for it.
    pub(super) async fn bring_up_net(&mut self, config: &CmdlineConfig) -> Result<(), BootError> {
        let Some(net) = &config.net else {
            return Ok(());
        };
        let nic = self.time_async("net", net::bring_up(net)).await?;
        info!(
            "network: {nic} is {}/{}{}",
            net.address,
            net.prefix_len,
            net.gateway.map(|g| format!(" via {g}")).unwrap_or_default()
        );
        Ok(())
    }

    /// The LAN between the nodes, when the platform gives the second NIC an address (fw_cfg
    /// `lan_net`).
    pub(super) async fn bring_up_lan(&mut self, fw_cfg: &FwCfgConfig) -> Result<(), BootError> {
        let Some(lan) = &fw_cfg.lan_net else {
            return Ok(());
        };
        let nic = self.time_async("lan", net::bring_up_lan(lan)).await?;
        info!("LAN: {nic} is {}/{}", lan.address, lan.prefix_len);
        Ok(())
    }

    /// Waits for the TPM's device node and opens it.
    pub(super) async fn open_tpm(&mut self, device: &Path) -> Result<(), BootError> {
        self.time_async("tpm-wait", wait_for_device(device, TPM_WAIT))
            .await?;
        let tcti = format!("device:{}", device.display());
        let tpm = self
            .time_blocking("tpm-open", move || Tpm::open(&tcti))
            .await?
            .map_err(tpm_step("open the TPM"))?;
        self.set_tpm(tpm);
        Ok(())
    }

    /// Seeds the kernel pool from the TPM, before anything (TLS keys, nonces) calls a blocking
    /// getrandom.
    pub(super) async fn seed_entropy(&mut self) -> Result<(), BootError> {
        let crng_was_ready = entropy::crng_ready();
        let tpm = self.tpm()?;
        let seeded = self
            .time_blocking("entropy", move || {
                let seed = tpm
                    .get_random(ENTROPY_BYTES)
                    .map_err(tpm_step("get random bytes from the TPM"))?;
                Ok::<_, TpmStepError>(entropy::add_entropy(&seed))
            })
            .await??;
        if let Err(e) = seeded {
            self.warn(format!(
                "cannot seed the kernel's random pool: {}",
                crate::platform::error_chain(&e)
            ));
        }
        info!(
            "seeded the kernel random pool with {ENTROPY_BYTES} bytes from the TPM (CRNG was {}ready before)",
            if crng_was_ready { "" } else { "not " }
        );
        Ok(())
    }

    /// The quote's nonce: fw_cfg's, or one from the TPM.
    pub(super) async fn nonce(
        &mut self,
        from_fw_cfg: Option<Vec<u8>>,
    ) -> Result<(Vec<u8>, NonceSource), BootError> {
        if let Some(nonce) = from_fw_cfg {
            return Ok((nonce, NonceSource::FwCfg));
        }
        let tpm = self.tpm()?;
        let nonce = blocking(move || tpm.get_random(GENERATED_NONCE_BYTES))
            .await?
            .map_err(tpm_step("get a nonce from the TPM"))?;
        Ok((nonce, NonceSource::Generated))
    }

    /// PCR 11 ← `enter-initrd`, and the PCRs after it.
    pub(super) async fn measure(&mut self) -> Result<Measurement, BootError> {
        let tpm = self.tpm()?;
        let measurement = self
            .time_blocking("measure", move || attest::measure_enter_initrd(&tpm))
            .await??;
        info!("measured phase {PHASE_ENTER_INITRD} into PCR {PCR_KERNEL_BOOT}");
        Ok(measurement)
    }
}

/// How long a bring-up with a rootfs may wait (for the join service, for `hawser init` or
/// `recover`) after the state disk's modules before PID 1 loads the power button's from the
/// initramfs, so that a node waiting for a person still stops in order on a press. A boot
/// that does not wait pivots long before and loads them from the rootfs, after the pivot.
pub const POWER_BUTTON_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The warning when no power button can be watched.
const NO_POWER_BUTTON: &str =
    "no ACPI power button input device found; power-button shutdown requests are ignored";

/// Watches every ACPI power button and returns how many; `None` if `watched` says that was
/// done already.
fn watch_buttons(
    watched: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    requests: &tokio::sync::mpsc::Sender<ShutdownRequest>,
) -> Option<usize> {
    if watched.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    let buttons = power_button::find_power_buttons(Path::new("/sys"), Path::new("/dev"));
    for button in &buttons {
        let (button, requests) = (button.clone(), requests.clone());
        tokio::spawn(async move {
            match power_button::wait_for_press(&button).await {
                Ok(()) => {
                    let _ = requests.send(ShutdownRequest::PowerButton).await;
                }
                Err(e) => {
                    tracing::warn!("stopped watching power button {}: {e}", button.display())
                }
            }
        });
    }
    if !buttons.is_empty() {
        info!("watching {} ACPI power button(s)", buttons.len());
    }
    Some(buttons.len())
}

/// Loads the [`Stage::AfterPivot`] modules (the power button's) from `dir` on a thread, then
/// watches the buttons; `when` says why now, for the log. Once per boot (`watched`).
async fn load_and_watch_power_buttons(
    dir: std::path::PathBuf,
    watched: std::sync::Arc<std::sync::atomic::AtomicBool>,
    requests: tokio::sync::mpsc::Sender<ShutdownRequest>,
    when: &'static str,
) {
    if watched.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let table: Vec<KernelModule> = hawser_kmod::BOOT_MODULE_TABLE
        .iter()
        .filter(|m| m.stage == Stage::AfterPivot)
        .copied()
        .collect();
    let loaded =
        tokio::task::spawn_blocking(move || modules::load_table_in(&LINUX, &dir, &table, 1)).await;
    match loaded {
        Ok(Ok(summary)) => info!("{summary} for the power button ({when})"),
        Ok(Err(e)) => {
            tracing::warn!(
                "power-button shutdown requests are ignored: {}",
                crate::platform::error_chain(&e)
            );
            return;
        }
        Err(e) => {
            tracing::warn!("power-button shutdown requests are ignored: {e}");
            return;
        }
    }
    if watch_buttons(&watched, &requests) == Some(0) {
        tracing::warn!("{NO_POWER_BUTTON}");
    }
}

/// Waits until `path` exists (devtmpfs creates TPM nodes when the driver probes).
pub async fn wait_for_device(path: &Path, limit: std::time::Duration) -> Result<(), BootError> {
    if poll::wait_for_path(path, limit, std::time::Duration::from_millis(10)).await {
        return Ok(());
    }
    Err(BootError::NoTpm {
        path: path.to_owned(),
        waited: limit,
    })
}

/// Whether `config` needs `module` ([`hawser_kmod::Use`]).
fn needed(module: &KernelModule, config: &CmdlineConfig) -> bool {
    match module.used_for {
        Use::Always => true,
        Use::Integrity => config.state_disk.integrity != hawser_luks2::Integrity::None,
        Use::Rootfs => config.root_hash.is_some(),
        // Loaded on demand (Stage::OnDemand), when the join or the state disk says so.
        Use::Mesh => false,
    }
}

/// Logs the `finit_module` times recorded since the last call, slowest first (none: nothing).
fn log_load_times() {
    let times = modules::take_load_times();
    if !times.is_empty() {
        info!(
            "kernel module load times (ms, slowest first): {}",
            modules::describe_load_times(&times)
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_missing_tpm_is_reported_with_its_path_after_the_wait() {
        let err = wait_for_device(Path::new("/dev/tpm-does-not-exist"), TPM_WAIT)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no TPM device: /dev/tpm-does-not-exist did not appear within 5 s"
        );
    }

    #[tokio::test]
    async fn an_existing_device_is_found_at_once() {
        let file = tempfile::NamedTempFile::new().unwrap();
        wait_for_device(file.path(), Duration::ZERO).await.unwrap();
    }
}
