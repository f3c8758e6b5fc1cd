//! The [`Boot`] context: what the phases of the bring-up share — the phase timer, the warnings
//! for the boot report, the child registry, the shutdown-request channel, the mount table, the
//! node's services and, once opened, the TPM. One method times a phase, one keeps a warning.
//! The mount table and the services are handles: the shutdown holds clones of them, since it
//! also runs while a phase holds the context.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hawser_attestation::tpm::Tpm;
use tokio::sync::mpsc;
use tracing::warn;

use super::{BootError, ShutdownRequest};
use crate::platform::mounts::SharedMountTable;
use crate::platform::reaper::ChildRegistry;
use crate::platform::timings::PhaseTimer;
use crate::supervisor::SharedSupervisor;

/// The warnings of the bring-up, for the boot report: each is logged once when kept.
#[derive(Debug, Default)]
pub struct Warnings(Vec<String>);

impl Warnings {
    /// Logs `warning` and keeps it for the boot report.
    pub fn warn(&mut self, warning: impl Into<String>) {
        let warning = warning.into();
        warn!("{warning}");
        self.0.push(warning);
    }
}

/// The bring-up's shared state, owned by the bring-up task.
pub struct Boot {
    timer: PhaseTimer,
    warnings: Vec<String>,
    registry: ChildRegistry,
    requests: mpsc::Sender<ShutdownRequest>,
    mounts: SharedMountTable,
    services: SharedSupervisor,
    tpm: Option<Arc<Tpm>>,
    /// The background module loads until awaited.
    background_modules: BackgroundModules,
    /// Whether the power buttons are watched (once per boot: from the initramfs while the
    /// bring-up waits, or after the pivot).
    power_button: Arc<AtomicBool>,
    /// With a rootfs: loads the power button's modules from the initramfs if the bring-up is
    /// still waiting after a grace period; aborted at the pivot.
    early_power_button: Option<tokio::task::JoinHandle<()>>,
}

/// One group of module loads on the background thread: its start and end (ms since /init)
/// and result.
pub type TimedLoad = (
    f64,
    f64,
    Result<crate::modules::LoadSummary, crate::modules::ModuleError>,
);

/// The module loads running on a thread of their own, one stage after the other: the NIC's
/// ([`hawser_kmod::Stage::Network`]), the state disk's ([`hawser_kmod::Stage::Background`]),
/// each reported on its channel when done, then the mesh's and the rootfs's
/// ([`hawser_kmod::Stage::AfterStateDisk`]), the thread's result.
pub struct BackgroundModules {
    pub network: Option<tokio::sync::oneshot::Receiver<TimedLoad>>,
    pub state_disk: Option<tokio::sync::oneshot::Receiver<TimedLoad>>,
    pub after_state_disk: Option<tokio::task::JoinHandle<TimedLoad>>,
}

impl Boot {
    /// The context at the start of the runtime: the timer started first thing in /init, and the
    /// warnings kept before the runtime existed.
    pub fn new(
        timer: PhaseTimer,
        warnings: Warnings,
        registry: ChildRegistry,
        requests: mpsc::Sender<ShutdownRequest>,
        mounts: SharedMountTable,
    ) -> Self {
        Boot {
            timer,
            warnings: warnings.0,
            registry,
            requests,
            mounts,
            services: SharedSupervisor::default(),
            tpm: None,
            background_modules: BackgroundModules {
                network: None,
                state_disk: None,
                after_state_disk: None,
            },
            power_button: Arc::default(),
            early_power_button: None,
        }
    }

    /// Whether the power buttons are watched.
    pub fn power_button(&self) -> &Arc<AtomicBool> {
        &self.power_button
    }

    /// Keeps the task that loads the power button's modules if the bring-up waits.
    pub fn keep_early_power_button(&mut self, task: tokio::task::JoinHandle<()>) {
        self.early_power_button = Some(task);
    }

    /// The task of [`Self::keep_early_power_button`], once.
    pub fn take_early_power_button(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        self.early_power_button.take()
    }

    /// Where the background module loads are kept until awaited.
    pub fn background_modules(&mut self) -> &mut BackgroundModules {
        &mut self.background_modules
    }

    /// Logs `warning` and keeps it for the boot report.
    pub fn warn(&mut self, warning: impl Into<String>) {
        let warning = warning.into();
        warn!("{warning}");
        self.warnings.push(warning);
    }

    /// Keeps warnings that were logged already (by the module loader, the config parser).
    pub fn keep_warnings(&mut self, warnings: impl IntoIterator<Item = String>) {
        self.warnings.extend(warnings);
    }

    /// The warnings so far (for the boot report).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Runs `work` as phase `name`.
    pub fn time<T>(&mut self, name: &str, work: impl FnOnce() -> T) -> T {
        self.timer.time(name, work)
    }

    /// Awaits `work` as phase `name`.
    pub async fn time_async<T>(&mut self, name: &str, work: impl Future<Output = T>) -> T {
        let start = self.timer.elapsed_ms();
        let output = work.await;
        self.timer.record(name, start);
        output
    }

    /// Runs blocking `work` (TPM, disk) off the event loop as phase `name`.
    pub async fn time_blocking<T: Send + 'static>(
        &mut self,
        name: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, BootError> {
        let start = self.timer.elapsed_ms();
        let output = blocking(work).await?;
        self.timer.record(name, start);
        Ok(output)
    }

    /// Runs blocking `work` that records its own phases off the event loop, lending it the
    /// timer.
    pub async fn with_timer_blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut PhaseTimer) -> T + Send + 'static,
    ) -> Result<T, BootError> {
        let mut timer = std::mem::take(&mut self.timer);
        let (timer, output) = blocking(move || {
            let output = work(&mut timer);
            (timer, output)
        })
        .await?;
        self.timer = timer;
        Ok(output)
    }

    /// The timer (for the boot report and the last log line).
    pub fn timer(&self) -> &PhaseTimer {
        &self.timer
    }

    /// The timer, to record a phase that ran elsewhere.
    pub fn timer_mut(&mut self) -> &mut PhaseTimer {
        &mut self.timer
    }

    /// The registry of children PID 1 waits for itself (mke2fs, the node's services).
    pub fn registry(&self) -> &ChildRegistry {
        &self.registry
    }

    /// Where shutdown requests go (the power button watchers).
    pub fn requests(&self) -> &mpsc::Sender<ShutdownRequest> {
        &self.requests
    }

    /// PID 1's mount table (what the shutdown unmounts).
    pub fn mounts(&self) -> &SharedMountTable {
        &self.mounts
    }

    /// The node's services, once started after the pivot (what the shutdown stops first).
    pub fn services(&self) -> &SharedSupervisor {
        &self.services
    }

    /// Keeps the opened TPM for the later phases.
    pub fn set_tpm(&mut self, tpm: Tpm) {
        self.tpm = Some(Arc::new(tpm));
    }

    /// The TPM; an error if a phase asks before it was opened (a mistake in the sequence).
    pub fn tpm(&self) -> Result<Arc<Tpm>, BootError> {
        self.tpm.clone().ok_or(BootError::TpmNotOpen)
    }
}

/// Runs blocking work off the event loop.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BootError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(BootError::Task)
}
