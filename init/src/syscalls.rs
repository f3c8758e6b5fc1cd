//! The thin layer between PID 1's bring-up logic and the kernel.
//!
//! Everything that changes global machine state — mounting, loading a kernel module, signalling
//! every process, syncing, rebooting — goes through the [`Syscalls`] trait. [`LinuxSyscalls`]
//! makes the real calls; [`RecordingSyscalls`] records them (and can be told to fail some), so
//! the decisions about *what* to mount, load and unmount, and in which order, are unit-tested on
//! a host without root or a VM. This is youki's `Syscall` trait lesson.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::kmod::ModuleInitFlags;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::reboot::RebootMode;
use nix::sys::signal::Signal;

/// `MODULE_INIT_COMPRESSED_FILE` from `<linux/module.h>`: the kernel decompresses the module
/// itself (needs `CONFIG_MODULE_DECOMPRESS`). nix does not name this flag.
pub const MODULE_INIT_COMPRESSED_FILE: libc::c_uint = 4;

/// One filesystem mount, as passed to mount(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountSpec {
    pub source: &'static str,
    pub target: &'static str,
    pub fstype: &'static str,
    pub flags: MsFlags,
    pub data: Option<&'static str>,
}

/// What the machine does at the end of a shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    PowerOff,
    Reboot,
}

impl PowerAction {
    fn reboot_mode(self) -> RebootMode {
        match self {
            PowerAction::PowerOff => RebootMode::RB_POWER_OFF,
            PowerAction::Reboot => RebootMode::RB_AUTOBOOT,
        }
    }
}

/// The kernel calls PID 1 makes to change machine state.
pub trait Syscalls: Send + Sync {
    /// Creates `path` and its parents if missing (the mount point of a mount).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// mount(2).
    fn mount(&self, spec: &MountSpec) -> io::Result<()>;
    /// umount2(2).
    fn unmount(&self, target: &Path, flags: MntFlags) -> io::Result<()>;
    /// Opens `path` and calls finit_module(2) on it; `compressed` asks the kernel to decompress.
    fn load_module(&self, path: &Path, compressed: bool) -> io::Result<()>;
    /// kill(-1, signal): every process except PID 1 itself (and kernel threads).
    fn kill_all(&self, signal: Signal) -> io::Result<()>;
    /// sync(2).
    fn sync(&self);
    /// reboot(2) with `RB_DISABLE_CAD`: Ctrl-Alt-Del becomes SIGINT to PID 1 instead of an
    /// immediate reboot.
    fn disable_ctrl_alt_del(&self) -> io::Result<()>;
    /// reboot(2). Returns only if the call failed (or, for [`RecordingSyscalls`], always).
    fn reboot(&self, action: PowerAction) -> io::Result<()>;
}

/// The real Linux implementation.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSyscalls;

impl Syscalls for LinuxSyscalls {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn mount(&self, spec: &MountSpec) -> io::Result<()> {
        nix::mount::mount(
            Some(spec.source),
            spec.target,
            Some(spec.fstype),
            spec.flags,
            spec.data,
        )
        .map_err(io::Error::from)
    }

    fn unmount(&self, target: &Path, flags: MntFlags) -> io::Result<()> {
        nix::mount::umount2(target, flags).map_err(io::Error::from)
    }

    fn load_module(&self, path: &Path, compressed: bool) -> io::Result<()> {
        let file = File::open(path)?;
        let flags = if compressed {
            ModuleInitFlags::from_bits_retain(MODULE_INIT_COMPRESSED_FILE)
        } else {
            ModuleInitFlags::empty()
        };
        nix::kmod::finit_module(&file, c"", flags).map_err(io::Error::from)
    }

    fn kill_all(&self, signal: Signal) -> io::Result<()> {
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(-1), signal) {
            // ESRCH: there is no other process to signal.
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(errno) => Err(errno.into()),
        }
    }

    fn sync(&self) {
        nix::unistd::sync();
    }

    fn disable_ctrl_alt_del(&self) -> io::Result<()> {
        nix::sys::reboot::set_cad_enabled(false).map_err(io::Error::from)
    }

    fn reboot(&self, action: PowerAction) -> io::Result<()> {
        match nix::sys::reboot::reboot(action.reboot_mode()) {
            Ok(never) => match never {},
            Err(errno) => Err(errno.into()),
        }
    }
}

/// One call seen by [`RecordingSyscalls`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    CreateDirAll(PathBuf),
    Mount(MountSpec),
    Unmount(PathBuf, MntFlags),
    LoadModule { path: PathBuf, compressed: bool },
    KillAll(Signal),
    Sync,
    DisableCtrlAltDel,
    Reboot(PowerAction),
}

/// Records every call instead of making it; calls can be made to fail with an errno.
///
/// Used by the unit tests of the bring-up and shutdown plans (and usable by other crates' tests).
#[derive(Debug, Default)]
pub struct RecordingSyscalls {
    calls: Mutex<Vec<Call>>,
    failures: Mutex<Vec<(Call, Errno)>>,
}

impl RecordingSyscalls {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every later call equal to `call` fail with `errno`.
    pub fn fail(&self, call: Call, errno: Errno) {
        lock(&self.failures).push((call, errno));
    }

    /// The calls made so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    fn record(&self, call: Call) -> io::Result<()> {
        let failure = lock(&self.failures)
            .iter()
            .find(|(failing, _)| *failing == call)
            .map(|(_, errno)| *errno);
        lock(&self.calls).push(call);
        match failure {
            Some(errno) => Err(errno.into()),
            None => Ok(()),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Syscalls for RecordingSyscalls {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.record(Call::CreateDirAll(path.to_owned()))
    }

    fn mount(&self, spec: &MountSpec) -> io::Result<()> {
        self.record(Call::Mount(*spec))
    }

    fn unmount(&self, target: &Path, flags: MntFlags) -> io::Result<()> {
        self.record(Call::Unmount(target.to_owned(), flags))
    }

    fn load_module(&self, path: &Path, compressed: bool) -> io::Result<()> {
        self.record(Call::LoadModule {
            path: path.to_owned(),
            compressed,
        })
    }

    fn kill_all(&self, signal: Signal) -> io::Result<()> {
        self.record(Call::KillAll(signal))
    }

    fn sync(&self) {
        // Sync cannot fail; a configured failure is ignored.
        let _ = self.record(Call::Sync);
    }

    fn disable_ctrl_alt_del(&self) -> io::Result<()> {
        self.record(Call::DisableCtrlAltDel)
    }

    fn reboot(&self, action: PowerAction) -> io::Result<()> {
        self.record(Call::Reboot(action))
    }
}
