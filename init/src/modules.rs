//! Kernel module loading: `modules.dep` order, `finit_module(2)`, compressed modules.
//!
//! There is no udev and no modprobe in the initramfs: PID 1 loads a fixed table of modules
//! ([`hawser_kmod::BOOT_MODULE_TABLE`]), dependencies first, from `/usr/lib/modules/<release>/`.
//! The image builder ships exactly the closure of that table, so a module that cannot be found
//! or loaded is an image defect and fatal. A module that is already loaded (EEXIST) is fine.
//!
//! One failure is not a defect: the kernel refusing a module with ENODEV because the machine
//! lacks the CPU feature or device the module's init checks for (`aesni_intel` on QEMU's
//! default `qemu64` CPU). [`judge`] decides from the table's classification
//! ([`hawser_kmod::Need`]) what that means: an optional module is skipped with a warning naming
//! what is lost and why, and so is anything that depends on it; a required one is fatal,
//! naming what the boot path needs it for and what the VM lacks.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hawser_kmod::{KernelModule, KmodError, ModuleIndex, PlannedModule};

use crate::platform::syscalls::Syscalls;

/// Where the running kernel's modules live (merged /usr: /lib is a symlink to /usr/lib).
pub fn modules_dir(kernel_release: &str) -> PathBuf {
    Path::new("/usr/lib/modules").join(kernel_release)
}

/// A module that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The initramfs's module index is unreadable.
    #[error("cannot read {path}")]
    ReadIndex {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The modules to load are not all in the index.
    #[error("cannot resolve the kernel modules to load from {path}")]
    Resolve {
        path: PathBuf,
        #[source]
        source: KmodError,
    },
    /// A module file the index names is not in the initramfs.
    #[error("kernel module {module} is missing: {path} does not exist")]
    Missing { module: String, path: PathBuf },
    /// The kernel refuses a module the boot path cannot do without, for a CPU feature or
    /// device this machine lacks (ENODEV).
    #[error("the kernel module {module} is required for {purpose}; {}", lacking(.hardware))]
    Unsupported {
        module: String,
        purpose: String,
        hardware: Option<&'static str>,
        #[source]
        source: io::Error,
    },
    /// A module the boot path cannot do without depends on a module that was skipped.
    #[error(
        "the kernel module {module} is required for {purpose}, but the module it depends on, \
         {dependency}, is not loaded"
    )]
    DependencySkipped {
        module: String,
        purpose: String,
        dependency: String,
    },
    /// A thread loading modules panicked.
    #[error("a thread loading kernel modules panicked")]
    Poisoned,
    /// The kernel refuses a module for another reason than missing hardware: the image's
    /// module does not fit this kernel, or is damaged.
    #[error("cannot load kernel module {module} (for {purpose}) from {path}")]
    Load {
        module: String,
        purpose: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The end of [`ModuleError::Unsupported`]'s message.
fn lacking(hardware: &Option<&'static str>) -> String {
    match hardware {
        Some(hardware) => format!("the VM lacks {hardware}"),
        None => "the kernel refuses it on this machine".to_owned(),
    }
}

/// What happened to one module file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleOutcome {
    Loaded,
    AlreadyLoaded,
    /// Not loaded; the boot goes on without it.
    Skipped(SkippedModule),
}

/// An optional module the boot goes on without. Its `Display` is the warning: the module, why
/// it is not loaded, and what the machine loses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedModule {
    pub module: String,
    pub cause: SkipCause,
    /// What the machine loses, from the table ([`PlannedModule::without`]).
    pub without: String,
}

/// Why a module was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipCause {
    /// The kernel refused it (ENODEV); `hardware` is what its init checks for, if the table
    /// says.
    NoDevice { hardware: Option<&'static str> },
    /// A module it depends on was skipped.
    Dependency { dependency: String },
}

impl fmt::Display for SkippedModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel module {} is not loaded: ", self.module)?;
        match &self.cause {
            SkipCause::NoDevice {
                hardware: Some(hardware),
            } => write!(f, "the VM lacks {hardware}")?,
            SkipCause::NoDevice { hardware: None } => {
                f.write_str("the kernel refuses it on this machine (no such device)")?
            }
            SkipCause::Dependency { dependency } => {
                write!(f, "it depends on {dependency}, which is not loaded")?
            }
        }
        write!(f, "; {}", self.without)
    }
}

/// What loading a table came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadSummary {
    /// Module files loaded now or already loaded.
    pub loaded: usize,
    /// Optional modules left out, in load order.
    pub skipped: Vec<SkippedModule>,
}

impl fmt::Display for LoadSummary {
    /// "loaded 25 kernel modules; skipped aesni_intel".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loaded {} kernel modules", self.loaded)?;
        if !self.skipped.is_empty() {
            let names: Vec<&str> = self.skipped.iter().map(|s| s.module.as_str()).collect();
            write!(f, "; skipped {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// Reads `modules.dep` (and `modules.builtin` if present) from `dir`.
pub fn read_index(dir: &Path) -> Result<ModuleIndex, ModuleError> {
    let dep_path = dir.join("modules.dep");
    let dep = std::fs::read_to_string(&dep_path).map_err(|source| ModuleError::ReadIndex {
        path: dep_path.clone(),
        source,
    })?;
    let builtin_path = dir.join("modules.builtin");
    let builtin = match std::fs::read_to_string(&builtin_path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(ModuleError::ReadIndex {
                path: builtin_path,
                source,
            });
        }
    };
    ModuleIndex::parse(&dep, builtin.as_deref()).map_err(|source| ModuleError::Resolve {
        path: dep_path,
        source,
    })
}

/// The module files to load for `table`, dependencies first, each with what needs it.
pub fn plan<'t>(
    index: &ModuleIndex,
    dir: &Path,
    table: &'t [KernelModule],
) -> Result<Vec<PlannedModule<'t>>, ModuleError> {
    index
        .load_plan(table)
        .map_err(|source| ModuleError::Resolve {
            path: dir.join("modules.dep"),
            source,
        })
}

/// Whether the kernel must decompress this file (`.ko.xz`, `.ko.zst`, `.ko.gz`).
pub fn is_compressed(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    !name.ends_with(".ko")
}

/// Where the running kernel's modules are in the initramfs.
pub fn running_modules_dir() -> PathBuf {
    let release = nix::sys::utsname::uname()
        .map(|uts| uts.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    modules_dir(&release)
}

/// Loads `table` and its dependencies from the initramfs's modules of the running kernel, one
/// at a time. Blocking.
pub fn load_table(sys: &dyn Syscalls, table: &[KernelModule]) -> Result<LoadSummary, ModuleError> {
    load_table_in(sys, &running_modules_dir(), table, 1)
}

/// Loads `table` and its dependencies from the modules directory `dir`, with `threads` loads
/// in flight at once (a module starts once every module it depends on is done): with more
/// than one vCPU the kernel checks signatures and runs module inits in parallel. Blocking.
pub fn load_table_in(
    sys: &dyn Syscalls,
    dir: &Path,
    table: &[KernelModule],
    threads: usize,
) -> Result<LoadSummary, ModuleError> {
    let index = read_index(dir)?;
    let plan = plan(&index, dir, table)?;
    Ok(summarize(load_concurrently(sys, dir, &plan, threads)?))
}

/// The threads for [`load_table_in`]: one per CPU, at most 4.
pub fn load_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// [`load_all`] with up to `threads` loads at once, dependencies first. The outcomes come back
/// in plan order; the first fatal failure stops new loads and is returned.
pub fn load_concurrently(
    sys: &dyn Syscalls,
    dir: &Path,
    plan: &[PlannedModule<'_>],
    threads: usize,
) -> Result<Vec<(String, ModuleOutcome)>, ModuleError> {
    if threads <= 1 || plan.len() <= 1 {
        return load_all(sys, dir, plan);
    }
    struct State {
        started: Vec<bool>,
        outcomes: Vec<Option<ModuleOutcome>>,
        failed: Option<ModuleError>,
    }
    let in_plan: BTreeSet<&str> = plan.iter().map(|p| p.name.as_str()).collect();
    let state = std::sync::Mutex::new(State {
        started: vec![false; plan.len()],
        outcomes: vec![None; plan.len()],
        failed: None,
    });
    let changed = std::sync::Condvar::new();
    let outcome_of = |state: &State, name: &str| -> Option<Option<ModuleOutcome>> {
        let index = plan.iter().position(|p| p.name == name)?;
        Some(state.outcomes[index].clone())
    };
    let worker = || {
        let Ok(mut guard) = state.lock() else { return };
        loop {
            if guard.failed.is_some() || guard.started.iter().all(|s| *s) {
                return;
            }
            // The first module not started whose dependencies are all done.
            let ready = (0..plan.len()).find(|&i| {
                !guard.started[i]
                    && plan[i].dependencies.iter().all(|dep| {
                        !in_plan.contains(dep.as_str())
                            || matches!(outcome_of(&guard, dep), Some(Some(_)))
                    })
            });
            let Some(i) = ready else {
                guard = match changed.wait(guard) {
                    Ok(guard) => guard,
                    Err(_) => return,
                };
                continue;
            };
            guard.started[i] = true;
            let planned = &plan[i];
            let skipped_dependency = planned
                .dependencies
                .iter()
                .find(|dep| {
                    matches!(
                        outcome_of(&guard, dep),
                        Some(Some(ModuleOutcome::Skipped(_)))
                    )
                })
                .cloned();
            drop(guard);
            let path = dir.join(&planned.path);
            let result = match skipped_dependency {
                Some(dependency) => judge_skipped_dependency(planned, &dependency),
                None => load_once(sys, planned, &path),
            };
            guard = match state.lock() {
                Ok(guard) => guard,
                Err(_) => return,
            };
            match result {
                Ok(outcome) => {
                    if let ModuleOutcome::Skipped(skip) = &outcome {
                        tracing::warn!("{skip}");
                    } else {
                        tracing::debug!(module = %planned.name, ?outcome, "kernel module");
                    }
                    guard.outcomes[i] = Some(outcome);
                }
                Err(e) => {
                    guard.failed.get_or_insert(e);
                }
            }
            changed.notify_all();
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..threads.min(plan.len()) {
            scope.spawn(worker);
        }
    });
    let state = state.into_inner().map_err(|_| ModuleError::Poisoned)?;
    if let Some(e) = state.failed {
        return Err(e);
    }
    Ok(plan
        .iter()
        .zip(state.outcomes)
        .filter_map(|(planned, outcome)| Some((planned.name.clone(), outcome?)))
        .collect())
}

/// How long each `finit_module(2)` took since the last [`take_load_times`], in load order:
/// the kernel's signature check, relocation and the module's init, for the boot log.
static LOAD_TIMES: Mutex<Vec<(String, Duration)>> = Mutex::new(Vec::new());

/// Loads `planned` from `path` unless the kernel already has it live: a module two stages
/// need (`dm_mod`, under dm-crypt and dm-verity) is loaded by the first, and a second
/// `finit_module(2)` would cost its whole signature check (85 ms under TCG) before EEXIST.
fn load_once(
    sys: &dyn Syscalls,
    planned: &PlannedModule<'_>,
    path: &Path,
) -> Result<ModuleOutcome, ModuleError> {
    if sys.module_live(&planned.name) {
        return Ok(ModuleOutcome::AlreadyLoaded);
    }
    judge(planned, path, timed_load(sys, &planned.name, path))
}

/// [`Syscalls::load_module`], timed into [`LOAD_TIMES`].
fn timed_load(sys: &dyn Syscalls, name: &str, path: &Path) -> io::Result<()> {
    let start = Instant::now();
    let result = sys.load_module(path, is_compressed(path));
    if let Ok(mut times) = LOAD_TIMES.lock() {
        times.push((name.to_owned(), start.elapsed()));
    }
    result
}

/// The load times recorded since the last call, slowest first.
pub fn take_load_times() -> Vec<(String, Duration)> {
    let mut times = LOAD_TIMES
        .lock()
        .map(|mut times| std::mem::take(&mut *times))
        .unwrap_or_default();
    times.sort_by_key(|t| std::cmp::Reverse(t.1));
    times
}

/// "dm_crypt 41.2, erofs 30.1, …" (ms), slowest first.
pub fn describe_load_times(times: &[(String, Duration)]) -> String {
    let parts: Vec<String> = times
        .iter()
        .map(|(name, took)| format!("{name} {:.1}", took.as_secs_f64() * 1e3))
        .collect();
    parts.join(", ")
}

/// Counts what [`load_all`] loaded and collects what it skipped.
pub fn summarize(outcomes: Vec<(String, ModuleOutcome)>) -> LoadSummary {
    let mut summary = LoadSummary::default();
    for (_, outcome) in outcomes {
        match outcome {
            ModuleOutcome::Loaded | ModuleOutcome::AlreadyLoaded => summary.loaded += 1,
            ModuleOutcome::Skipped(skipped) => summary.skipped.push(skipped),
        }
    }
    summary
}

/// Loads the files of `plan` (relative to `dir`) in order; stops at the first fatal failure.
/// A module whose dependency was skipped is not tried (the kernel would refuse its unresolved
/// symbols): [`judge_skipped_dependency`] decides. Each skip is logged as a warning.
pub fn load_all(
    sys: &dyn Syscalls,
    dir: &Path,
    plan: &[PlannedModule<'_>],
) -> Result<Vec<(String, ModuleOutcome)>, ModuleError> {
    let mut outcomes = Vec::with_capacity(plan.len());
    let mut skipped = BTreeSet::new();
    for planned in plan {
        let path = dir.join(&planned.path);
        let skipped_dependency = planned
            .dependencies
            .iter()
            .find(|dependency| skipped.contains(*dependency));
        let outcome = match skipped_dependency {
            Some(dependency) => judge_skipped_dependency(planned, dependency)?,
            None => load_once(sys, planned, &path)?,
        };
        if let ModuleOutcome::Skipped(skip) = &outcome {
            tracing::warn!("{skip}");
            skipped.insert(planned.name.clone());
        } else {
            tracing::debug!(module = %planned.name, ?outcome, "kernel module");
        }
        outcomes.push((planned.name.clone(), outcome));
    }
    Ok(outcomes)
}

/// What the kernel's answer to loading `planned` (from `path`) means for the boot: ENODEV
/// skips a module only optional modules need, and is fatal for one the boot path requires;
/// EEXIST is fine; anything else is fatal.
pub fn judge(
    planned: &PlannedModule<'_>,
    path: &Path,
    result: io::Result<()>,
) -> Result<ModuleOutcome, ModuleError> {
    let error = match result {
        Ok(()) => return Ok(ModuleOutcome::Loaded),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            return Ok(ModuleOutcome::AlreadyLoaded);
        }
        Err(e) => e,
    };
    if error.kind() == io::ErrorKind::NotFound {
        return Err(ModuleError::Missing {
            module: planned.name.clone(),
            path: path.to_owned(),
        });
    }
    if error.raw_os_error() != Some(libc::ENODEV) {
        return Err(ModuleError::Load {
            module: planned.name.clone(),
            purpose: planned.purpose(),
            path: path.to_owned(),
            source: error,
        });
    }
    match planned.required_for() {
        Some(purpose) => Err(ModuleError::Unsupported {
            module: planned.name.clone(),
            purpose,
            hardware: planned.hardware(),
            source: error,
        }),
        None => Ok(ModuleOutcome::Skipped(SkippedModule {
            module: planned.name.clone(),
            cause: SkipCause::NoDevice {
                hardware: planned.hardware(),
            },
            without: planned.without(),
        })),
    }
}

/// `planned` depends on `dependency`, which was skipped: skipped too when only optional
/// modules need it. A required module cannot get here through [`load_all`] (its dependencies
/// are required too, and fail first), but a plan built otherwise is refused, not trusted.
pub fn judge_skipped_dependency(
    planned: &PlannedModule<'_>,
    dependency: &str,
) -> Result<ModuleOutcome, ModuleError> {
    match planned.required_for() {
        Some(purpose) => Err(ModuleError::DependencySkipped {
            module: planned.name.clone(),
            purpose,
            dependency: dependency.to_owned(),
        }),
        None => Ok(ModuleOutcome::Skipped(SkippedModule {
            module: planned.name.clone(),
            cause: SkipCause::Dependency {
                dependency: dependency.to_owned(),
            },
            without: planned.without(),
        })),
    }
}

#[cfg(test)]
mod tests;
