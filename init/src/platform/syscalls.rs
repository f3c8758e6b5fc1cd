//! The thin layer between PID 1's bring-up logic and the kernel.
//!
//! Everything that changes global machine state — mounting, loading a kernel module, signalling
//! every process, syncing, rebooting, switching to a new root and deleting the initramfs — goes
//! through the [`Syscalls`] trait. [`LinuxSyscalls`]
//! makes the real calls; [`RecordingSyscalls`] records them (and can be told to fail some), so
//! the decisions about *what* to mount, load and unmount, and in which order, are unit-tested on
//! a host without root or a VM. This is youki's `Syscall` trait lesson.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::kmod::ModuleInitFlags;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::reboot::RebootMode;
use nix::sys::signal::Signal;
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

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

/// A mount(2) call whose strings are only known at run time (a device-mapper node, a path on
/// the state disk), or that only moves, binds or changes propagation (no source or type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedMountSpec {
    pub source: Option<String>,
    pub target: PathBuf,
    pub fstype: Option<String>,
    pub flags: MsFlags,
    pub data: Option<String>,
}

impl From<&MountSpec> for OwnedMountSpec {
    fn from(spec: &MountSpec) -> Self {
        OwnedMountSpec {
            source: Some(spec.source.to_owned()),
            target: PathBuf::from(spec.target),
            fstype: Some(spec.fstype.to_owned()),
            flags: spec.flags,
            data: spec.data.map(str::to_owned),
        }
    }
}

/// `statfs` magic numbers of the filesystems an initramfs can be unpacked into.
const RAMFS_MAGIC: i64 = 0x8584_58f6;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The initramfs root directory, held open across the switch to the new root so that its
/// contents can still be deleted when no path leads to it any more (systemd's way; busybox
/// deletes before the switch, which leaves a half-deleted initramfs if the switch then fails).
#[derive(Debug)]
pub struct OldRoot {
    /// `None` for [`RecordingSyscalls`], which opens nothing.
    fd: Option<OwnedFd>,
    /// The device of the old root: removal never crosses onto another filesystem.
    dev: u64,
}

impl OldRoot {
    /// An old root that refers to no directory (for test implementations of [`Syscalls`]).
    pub fn detached() -> Self {
        OldRoot { fd: None, dev: 0 }
    }

    /// A path to the old root that works after the switch, when no path from `/` leads to it:
    /// `/proc/self/fd/<fd>` (a magic link to the directory itself). `None` if detached.
    pub fn path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.fd
            .as_ref()
            .map(|fd| PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())))
    }
}

/// What deleting the initramfs contents came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemovalSummary {
    /// Files, links and directories deleted.
    pub removed: u64,
    /// Entries left alone because they belong to another filesystem (mount points).
    pub other_filesystems: u64,
    /// Entries that could not be deleted.
    pub failed: u64,
    /// The first failure, for the log.
    pub first_failure: Option<String>,
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
    /// Whether the module `name` (normalized, `dm_mod`) is loaded and initialised (its
    /// `/sys/module/NAME/initstate` reads `live`): loading it again would only cost the
    /// kernel's signature check before its EEXIST. A module still initialising (`coming`) is
    /// not live: a module that needs it must wait, which `finit_module(2)` does.
    fn module_live(&self, name: &str) -> bool;
    /// kill(-1, signal): every process except PID 1 itself (and kernel threads).
    fn kill_all(&self, signal: Signal) -> io::Result<()>;
    /// sync(2).
    fn sync(&self);
    /// Removes the device-mapper device `name` (a closed dm-crypt mapping no longer holds its
    /// key in the kernel).
    fn remove_dm_device(&self, name: &'static str) -> io::Result<()>;
    /// reboot(2) with `RB_DISABLE_CAD`: Ctrl-Alt-Del becomes SIGINT to PID 1 instead of an
    /// immediate reboot.
    fn disable_ctrl_alt_del(&self) -> io::Result<()>;
    /// reboot(2). Returns only if the call failed (or, for [`RecordingSyscalls`], always).
    fn reboot(&self, action: PowerAction) -> io::Result<()>;
    /// symlink(2) creating `link` pointing to `target`; an existing `link` is left as it is
    /// (first-use setup that must not undo an operator's change).
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()>;
    /// mount(2) with run-time strings; also bind (`MS_BIND`), move (`MS_MOVE`) and propagation
    /// changes (`MS_SHARED | MS_REC`), which take no filesystem type.
    fn mount_owned(&self, spec: &OwnedMountSpec) -> io::Result<()>;
    /// chdir(2).
    fn chdir(&self, path: &Path) -> io::Result<()>;
    /// chroot(2).
    fn chroot(&self, path: &Path) -> io::Result<()>;
    /// Opens the directory `path` (the initramfs root, `/`) for [`Syscalls::remove_old_root`],
    /// refusing unless it is on ramfs or tmpfs: deleting everything on a real disk by mistake
    /// is the failure this guards against (busybox's `switch_root` has the same check).
    fn open_old_root(&self, path: &Path) -> io::Result<OldRoot>;
    /// Deletes everything below `old_root` that is on its filesystem, without crossing mount
    /// points or following symbolic links, and keeps going past entries that cannot be deleted.
    fn remove_old_root(&self, old_root: OldRoot) -> io::Result<RemovalSummary>;
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

    fn module_live(&self, name: &str) -> bool {
        let initstate = Path::new("/sys/module").join(name).join("initstate");
        std::fs::read(initstate).is_ok_and(|state| state.trim_ascii() == b"live")
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

    fn remove_dm_device(&self, name: &'static str) -> io::Result<()> {
        super::dm::remove(name).map_err(io::Error::other)
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

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        match std::os::unix::fs::symlink(target, link) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }

    fn mount_owned(&self, spec: &OwnedMountSpec) -> io::Result<()> {
        nix::mount::mount(
            spec.source.as_deref(),
            &spec.target,
            spec.fstype.as_deref(),
            spec.flags,
            spec.data.as_deref(),
        )
        .map_err(io::Error::from)
    }

    fn chdir(&self, path: &Path) -> io::Result<()> {
        nix::unistd::chdir(path).map_err(io::Error::from)
    }

    fn chroot(&self, path: &Path) -> io::Result<()> {
        nix::unistd::chroot(path).map_err(io::Error::from)
    }

    fn open_old_root(&self, path: &Path) -> io::Result<OldRoot> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let fs_type = nix::sys::statfs::fstatfs(&fd)?.filesystem_type().0 as i64;
        if fs_type != RAMFS_MAGIC && fs_type != TMPFS_MAGIC {
            return Err(io::Error::other(format!(
                "{} is not on ramfs or tmpfs (filesystem type {fs_type:#x}); refusing to delete \
                 its contents",
                path.display()
            )));
        }
        let dev = nix::sys::stat::fstat(&fd)?.st_dev;
        Ok(OldRoot { fd: Some(fd), dev })
    }

    fn remove_old_root(&self, old_root: OldRoot) -> io::Result<RemovalSummary> {
        let fd = old_root.fd.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the old root was not opened by LinuxSyscalls",
            )
        })?;
        let mut summary = RemovalSummary::default();
        remove_tree_contents(fd.as_fd(), old_root.dev, &mut summary);
        Ok(summary)
    }
}

fn note_failure(summary: &mut RemovalSummary, what: &CStr, error: impl std::fmt::Display) {
    summary.failed += 1;
    if summary.first_failure.is_none() {
        summary.first_failure = Some(format!("{}: {error}", what.to_string_lossy()));
    }
}

/// Deletes the contents of `dir` that are on device `dev` (depth first).
fn remove_tree_contents(dir: BorrowedFd<'_>, dev: u64, summary: &mut RemovalSummary) {
    let names = match list_dir(dir) {
        Ok(names) => names,
        Err(e) => return note_failure(summary, c"(directory listing)", e),
    };
    for name in names {
        let stat = match nix::sys::stat::fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            Ok(stat) => stat,
            Err(e) => {
                note_failure(summary, &name, e);
                continue;
            }
        };
        if stat.st_dev != dev {
            summary.other_filesystems += 1;
            continue;
        }
        let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir {
            match nix::fcntl::openat(
                dir,
                name.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => remove_tree_contents(sub.as_fd(), dev, summary),
                Err(e) => {
                    note_failure(summary, &name, e);
                    continue;
                }
            }
        }
        let flag = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        match nix::unistd::unlinkat(dir, name.as_c_str(), flag) {
            Ok(()) => summary.removed += 1,
            Err(e) => note_failure(summary, &name, e),
        }
    }
}

/// The names in directory `dir`, without `.` and `..`.
fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    // closedir closes the descriptor fdopendir was given: hand it a duplicate, rewound (a
    // duplicate shares the file offset).
    let fd = nix::unistd::dup(dir)?.into_raw_fd();
    // SAFETY: `fd` is an open directory descriptor owned by nobody else; on success the stream
    // owns it.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let error = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `fd` is still ours, and closed exactly once.
        unsafe { libc::close(fd) };
        return Err(error);
    }
    // SAFETY: `stream` is a valid directory stream until closedir below.
    unsafe { libc::rewinddir(stream) };
    let mut names = Vec::new();
    let result = loop {
        Errno::clear();
        // SAFETY: `stream` is a valid directory stream until closedir below.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break match Errno::last_raw() {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            };
        }
        // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated; the name is
        // copied before the next readdir or closedir invalidates it.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: `stream` is valid and closed exactly once; it closes `fd`.
    unsafe { libc::closedir(stream) };
    result.map(|()| names)
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
    RemoveDmDevice(&'static str),
    DisableCtrlAltDel,
    Reboot(PowerAction),
    MountOwned(OwnedMountSpec),
    Symlink { target: PathBuf, link: PathBuf },
    ChangeDir(PathBuf),
    ChangeRoot(PathBuf),
    OpenOldRoot(PathBuf),
    RemoveOldRoot,
}

/// Records every call instead of making it; calls can be made to fail with an errno.
///
/// Used by the unit tests of the bring-up and shutdown plans (and usable by other crates' tests).
#[derive(Debug, Default)]
pub struct RecordingSyscalls {
    calls: Mutex<Vec<Call>>,
    failures: Mutex<Vec<(Call, Errno)>>,
    /// The modules a recorded `load_module` loaded (normalized names), for `module_live`.
    live: Mutex<std::collections::BTreeSet<String>>,
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
        })?;
        let name = hawser_kmod::normalize_name(&path.to_string_lossy());
        lock(&self.live).insert(name);
        Ok(())
    }

    fn module_live(&self, name: &str) -> bool {
        lock(&self.live).contains(name)
    }

    fn kill_all(&self, signal: Signal) -> io::Result<()> {
        self.record(Call::KillAll(signal))
    }

    fn sync(&self) {
        // Sync cannot fail; a configured failure is ignored.
        let _ = self.record(Call::Sync);
    }

    fn remove_dm_device(&self, name: &'static str) -> io::Result<()> {
        self.record(Call::RemoveDmDevice(name))
    }

    fn disable_ctrl_alt_del(&self) -> io::Result<()> {
        self.record(Call::DisableCtrlAltDel)
    }

    fn reboot(&self, action: PowerAction) -> io::Result<()> {
        self.record(Call::Reboot(action))
    }

    fn mount_owned(&self, spec: &OwnedMountSpec) -> io::Result<()> {
        self.record(Call::MountOwned(spec.clone()))
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        self.record(Call::Symlink {
            target: target.to_owned(),
            link: link.to_owned(),
        })
    }

    fn chdir(&self, path: &Path) -> io::Result<()> {
        self.record(Call::ChangeDir(path.to_owned()))
    }

    fn chroot(&self, path: &Path) -> io::Result<()> {
        self.record(Call::ChangeRoot(path.to_owned()))
    }

    fn open_old_root(&self, path: &Path) -> io::Result<OldRoot> {
        self.record(Call::OpenOldRoot(path.to_owned()))
            .map(|()| OldRoot::detached())
    }

    fn remove_old_root(&self, _old_root: OldRoot) -> io::Result<RemovalSummary> {
        self.record(Call::RemoveOldRoot)
            .map(|()| RemovalSummary::default())
    }
}

#[cfg(test)]
mod tests;
