//! The mounts of the new root and the switch into it, as a plan of steps run through
//! [`Syscalls`] (so the order is unit-tested on the host).
//!
//! ```text
//! mount     /dev/dm-N (erofs, ro)                       → /sysroot
//!           /run/hawser/state/var (bind)                → /sysroot/var
//!             (+ links var/run → ../run, var/lock → ../run/lock, if missing)
//!           overlay lower=/sysroot/etc, upper on /run   → /sysroot/etc
//!           /run/hawser/state/etc/kubernetes (bind)     → /sysroot/etc/kubernetes
//!           tmpfs                                       → /sysroot/tmp
//! measure   PCR 11 ← control-plane (a control plane only), leave-initrd (the caller's callback)
//! switch    open /; move /dev /proc /sys /run into /sysroot; chdir /sysroot;
//!           mount --move . /; chroot .; delete the initramfs; chdir /; make / rshared
//! ```
//!
//! **Node state** lives on the encrypted state disk, already mounted at
//! [`STATE_MOUNT_POINT`]: `/var` (kubelet, containerd, etcd under `/var/lib`) and
//! `/etc/kubernetes` (kubeadm's certificates and kubeconfigs) are bind mounts of directories
//! there, created on first use. The image's own `/var` is hidden by the bind: nothing in it is
//! needed at run time. Without a state disk ([`StateBacking::Ephemeral`]) `/var` is a tmpfs and
//! `/etc/kubernetes` lives in the `/etc` overlay: a node that forgets everything at reboot.
//!
//! **`/etc` is an overlay** of the image's `/etc` with a writable upper layer on the `/run`
//! tmpfs. Programs may write to `/etc` (CNI plugins install `/etc/cni/net.d`, tools update
//! `/etc/hosts`), and every boot starts again from exactly the image's `/etc`: an upper layer
//! on the state disk would let stale files shadow a newer image's after an upgrade, and a
//! tmpfs copy of `/etc` would cost a copy at every boot and lose nothing the overlay keeps
//! (ownership, modes, links). Persistent configuration belongs on the state disk explicitly,
//! as `/etc/kubernetes` is.
//!
//! **The switch** follows systemd's `switch_root`: the API filesystems are moved (not
//! remounted, so open files and the state disk mount under `/run` carry over), the new root is
//! moved onto `/` and the process chroots into it; the initramfs root is opened before the
//! move and emptied through that descriptor afterwards ([`delete_old_root`]), without crossing
//! mount points — not at once: the Kubernetes networking modules are loaded from it first, on
//! a thread of their own while containerd starts (`pivot.rs`). Deleting it only frees
//! memory, so a failure there is a warning. Last, `/` becomes `rshared` as under systemd:
//! kubelet and container runtimes rely on mount propagation.
//!
//! PCR 11 ← `leave-initrd` is extended after every mount of the new root succeeded and before
//! anything is moved: no code running after the switch can unseal what was sealed to the
//! initramfs phase, and a failure before it leaves the node in the initramfs, where the
//! fatal-error path still has its tools.
//!
//! **The role marker.** A control plane (a node that holds its cluster's master secret and
//! runs the cluster's join service after the switch: [`MeasuredRole::ControlPlane`]) extends
//! PCR 11 with `control-plane` immediately before `leave-initrd`. Inside one PCR's hash chain
//! the order is fixed: code in a worker's rootfs can extend PCR 11 only after `leave-initrd`,
//! so it can never produce a control plane's value, and a joining node that requires that
//! value of its join service refuses a worker's TPM (`enrollment::join_service_policy`). A
//! marker in another PCR would not do: root could extend it after the pivot.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;
use tracing::{info, warn};

use hawser_pcr::{PHASE_CONTROL_PLANE, PHASE_LEAVE_INITRD};

use crate::disk::STATE_MOUNT_POINT;
use crate::platform::syscalls::{MountSpec, OldRoot, OwnedMountSpec, RemovalSummary, Syscalls};

/// Where the new root is assembled.
pub const SYSROOT: &str = "/sysroot";
/// The upper and work directories of the `/etc` overlay (on the `/run` tmpfs, which moves
/// into the new root with everything under it).
pub const ETC_OVERLAY_DIR: &str = "/run/hawser/etc-overlay";
/// The API filesystems moved into the new root, in this order.
pub const MOVED_MOUNTS: [&str; 4] = ["/dev", "/proc", "/sys", "/run"];

const NOSUID_NODEV: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);

/// API filesystems the new root needs and the initramfs did not: pseudo-terminals, POSIX
/// shared memory, and the cgroup v2 hierarchy (kubelet and containerd refuse to run without
/// it). Mounted after [`switch_root`], through PID 1's mount table so that they are unmounted
/// at shutdown: `mounts.lock().mount_all(&sys, &NEW_ROOT_API_MOUNTS)` (`pivot.rs`).
pub const NEW_ROOT_API_MOUNTS: [MountSpec; 3] = [
    MountSpec {
        source: "devpts",
        target: "/dev/pts",
        fstype: "devpts",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NOEXEC),
        data: Some("mode=0620,gid=5,ptmxmode=0666"),
    },
    MountSpec {
        source: "tmpfs",
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: Some("mode=1777"),
    },
    MountSpec {
        source: "cgroup2",
        target: "/sys/fs/cgroup",
        fstype: "cgroup2",
        flags: NOSUID_NODEV.union(MsFlags::MS_NOEXEC),
        data: Some("nsdelegate,memory_recursiveprot"),
    },
];

/// What the node is in its cluster, as PCR 11 records it at the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MeasuredRole {
    /// No marker: PCR 11 gets `leave-initrd` alone.
    #[default]
    Worker,
    /// The node holds its cluster's master secret and runs the cluster's join service:
    /// `control-plane`, then `leave-initrd`.
    ControlPlane,
}

/// Where the node's writable state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBacking {
    /// The encrypted state disk, mounted at [`STATE_MOUNT_POINT`].
    Disk,
    /// No state disk: tmpfs, gone at reboot.
    Ephemeral,
}

/// One step of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create a directory (and its parents) if missing. On the read-only image this only
    /// checks that a mount point exists (creating one fails with EROFS).
    CreateDir(PathBuf),
    Mount(OwnedMountSpec),
    /// Create a symbolic link `link` → `target` unless `link` exists.
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
    /// PCR 11 ← this phase word (`control-plane`, `leave-initrd`), through the caller's
    /// callback.
    MeasurePhase(&'static str),
    /// Open the initramfs root for deletion after the switch.
    OpenOldRoot(PathBuf),
    ChangeDir(PathBuf),
    ChangeRoot(PathBuf),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::CreateDir(path) => write!(f, "create directory {}", path.display()),
            Step::Mount(spec) => describe_mount(spec, f),
            Step::Symlink { target, link } => {
                write!(f, "link {} to {}", link.display(), target.display())
            }
            Step::MeasurePhase(word) => write!(f, "measure {word} into PCR 11"),
            Step::OpenOldRoot(path) => write!(f, "open the initramfs root {}", path.display()),
            Step::ChangeDir(path) => write!(f, "chdir to {}", path.display()),
            Step::ChangeRoot(path) => write!(f, "chroot to {}", path.display()),
        }
    }
}

fn describe_mount(spec: &OwnedMountSpec, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let source = spec.source.as_deref().unwrap_or("none");
    let target = spec.target.display();
    if spec.flags.contains(MsFlags::MS_MOVE) {
        write!(f, "move mount {source} to {target}")
    } else if spec.flags.contains(MsFlags::MS_BIND) {
        write!(f, "bind-mount {source} on {target}")
    } else if spec.flags.contains(MsFlags::MS_SHARED) {
        write!(f, "make {target} and the mounts below it shared")
    } else {
        let fstype = spec.fstype.as_deref().unwrap_or("none");
        let ro = if spec.flags.contains(MsFlags::MS_RDONLY) {
            " read-only"
        } else {
            ""
        };
        write!(f, "mount {fstype} {source} on {target}{ro}")
    }
}

/// A step that failed; the switch stops there.
#[derive(Debug, thiserror::Error)]
pub enum SwitchRootError {
    /// A mount, move, chdir or chroot of the switch failed.
    #[error("cannot switch to the verified rootfs: {step} failed")]
    Step {
        step: String,
        #[source]
        source: io::Error,
    },
    /// The TPM refused a phase extension of PCR 11 (`control-plane`, `leave-initrd`); nothing
    /// was moved.
    #[error("cannot switch to the verified rootfs: measuring {phase} into PCR 11 failed")]
    Measure {
        phase: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What the switch came to.
#[derive(Debug)]
pub struct SwitchOutcome {
    /// The initramfs, still open and not yet deleted: the Kubernetes networking modules are
    /// loaded from it after the switch, then [`delete_old_root`] frees it.
    pub old_root: Option<OldRoot>,
    /// Things worth a warning line (and the boot report).
    pub warnings: Vec<String>,
}

/// The new root's mounts and the switch into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootfsPlan {
    /// The verified rootfs device (`/dev/dm-N`).
    pub root_device: PathBuf,
    pub state: StateBacking,
    /// Whether PCR 11 gets the control-plane marker before `leave-initrd`.
    pub role: MeasuredRole,
}

fn sysroot(path: &str) -> PathBuf {
    Path::new(SYSROOT).join(path.trim_start_matches('/'))
}

fn state(path: &str) -> PathBuf {
    Path::new(STATE_MOUNT_POINT).join(path)
}

fn mount(source: &str, target: PathBuf, fstype: &str, flags: MsFlags, data: Option<&str>) -> Step {
    Step::Mount(OwnedMountSpec {
        source: Some(source.to_owned()),
        target,
        fstype: Some(fstype.to_owned()),
        flags,
        data: data.map(str::to_owned),
    })
}

fn bind(source: PathBuf, target: PathBuf) -> Step {
    Step::Mount(OwnedMountSpec {
        source: Some(source.display().to_string()),
        target,
        fstype: None,
        flags: MsFlags::MS_BIND,
        data: None,
    })
}

fn move_mount(source: &str, target: PathBuf) -> Step {
    Step::Mount(OwnedMountSpec {
        source: Some(source.to_owned()),
        target,
        fstype: None,
        flags: MsFlags::MS_MOVE,
        data: None,
    })
}

impl RootfsPlan {
    pub fn new(root_device: impl Into<PathBuf>, state: StateBacking) -> Self {
        RootfsPlan {
            root_device: root_device.into(),
            state,
            role: MeasuredRole::Worker,
        }
    }

    /// The plan of a node with this role (a worker's unless told otherwise).
    pub fn measured_role(mut self, role: MeasuredRole) -> Self {
        self.role = role;
        self
    }

    /// The phase words PCR 11 gets at the switch, in order.
    pub fn measured_phases(&self) -> &'static [&'static str] {
        match self.role {
            MeasuredRole::Worker => &[PHASE_LEAVE_INITRD],
            MeasuredRole::ControlPlane => &[PHASE_CONTROL_PLANE, PHASE_LEAVE_INITRD],
        }
    }

    /// The mounts of the new root, under [`SYSROOT`].
    pub fn mount_steps(&self) -> Vec<Step> {
        let mut steps = vec![
            Step::CreateDir(PathBuf::from(SYSROOT)),
            mount(
                &self.root_device.display().to_string(),
                PathBuf::from(SYSROOT),
                "erofs",
                MsFlags::MS_RDONLY | MsFlags::MS_NODEV,
                None,
            ),
        ];
        match self.state {
            StateBacking::Disk => steps.extend([
                Step::CreateDir(state("var")),
                Step::CreateDir(state("etc/kubernetes")),
                Step::CreateDir(sysroot("/var")),
                bind(state("var"), sysroot("/var")),
            ]),
            StateBacking::Ephemeral => steps.extend([
                Step::CreateDir(sysroot("/var")),
                mount(
                    "tmpfs",
                    sysroot("/var"),
                    "tmpfs",
                    NOSUID_NODEV,
                    Some("mode=0755"),
                ),
            ]),
        }
        // Debian's compatibility links, which systemd-tmpfiles would create: many tools still
        // name /var/run/... (containerd's socket, CNI plugins).
        for (link, target) in [("/var/run", "../run"), ("/var/lock", "../run/lock")] {
            steps.push(Step::Symlink {
                target: PathBuf::from(target),
                link: sysroot(link),
            });
        }
        let upper = Path::new(ETC_OVERLAY_DIR).join("upper");
        let work = Path::new(ETC_OVERLAY_DIR).join("work");
        let overlay = format!(
            "lowerdir={},upperdir={},workdir={}",
            sysroot("/etc").display(),
            upper.display(),
            work.display()
        );
        steps.extend([
            Step::CreateDir(upper),
            Step::CreateDir(work),
            Step::CreateDir(sysroot("/etc")),
            mount(
                "overlay",
                sysroot("/etc"),
                "overlay",
                NOSUID_NODEV,
                Some(&overlay),
            ),
        ]);
        if self.state == StateBacking::Disk {
            steps.extend([
                // In the overlay's upper layer: the image need not have the directory.
                Step::CreateDir(sysroot("/etc/kubernetes")),
                bind(state("etc/kubernetes"), sysroot("/etc/kubernetes")),
            ]);
        }
        steps.extend([
            Step::CreateDir(sysroot("/tmp")),
            mount(
                "tmpfs",
                sysroot("/tmp"),
                "tmpfs",
                NOSUID_NODEV,
                Some("mode=1777"),
            ),
        ]);
        steps
    }

    /// The new root's mounts as they are after the switch (`/sysroot` stripped), in mount
    /// order and without the root itself (it stays until the power goes off): what the
    /// shutdown unmounts before the state disk under them. Leaks the paths once per boot
    /// (the mount table lives as long as PID 1).
    pub fn mounts_after_switch(&self) -> Vec<MountSpec> {
        let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
        self.mount_steps()
            .into_iter()
            .filter_map(|step| match step {
                Step::Mount(spec) => {
                    let target = spec.target.strip_prefix(SYSROOT).ok()?;
                    if target.as_os_str().is_empty() {
                        return None;
                    }
                    Some(MountSpec {
                        source: leak(spec.source.unwrap_or_default()),
                        target: leak(format!("/{}", target.display())),
                        fstype: match spec.fstype {
                            Some(fstype) => leak(fstype),
                            None => "bind",
                        },
                        flags: spec.flags,
                        data: None,
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// The measurements and the switch.
    pub fn switch_steps(&self) -> Vec<Step> {
        let mut steps: Vec<Step> = self
            .measured_phases()
            .iter()
            .map(|&word| Step::MeasurePhase(word))
            .collect();
        steps.push(Step::OpenOldRoot(PathBuf::from("/")));
        for api in MOVED_MOUNTS {
            steps.push(Step::CreateDir(sysroot(api)));
            steps.push(move_mount(api, sysroot(api)));
        }
        steps.extend([
            Step::ChangeDir(PathBuf::from(SYSROOT)),
            move_mount(".", PathBuf::from("/")),
            Step::ChangeRoot(PathBuf::from(".")),
            Step::ChangeDir(PathBuf::from("/")),
            Step::Mount(OwnedMountSpec {
                source: None,
                target: PathBuf::from("/"),
                fstype: None,
                flags: MsFlags::MS_SHARED | MsFlags::MS_REC,
                data: None,
            }),
        ]);
        steps
    }

    /// Every step, in order.
    pub fn steps(&self) -> Vec<Step> {
        let mut steps = self.mount_steps();
        steps.extend(self.switch_steps());
        steps
    }

    /// The mounts made by the plan that shutdown should detach, with their paths in the new
    /// root, in mount order (the API filesystems moved from the initramfs keep their paths and
    /// are already in the shutdown mount table).
    pub fn shutdown_mounts(&self) -> &'static [MountSpec] {
        const OVERLAY: &str = "lowerdir=/etc,upperdir=/run/hawser/etc-overlay/upper,\
                               workdir=/run/hawser/etc-overlay/work";
        const DISK: [MountSpec; 4] = [
            MountSpec {
                source: "/run/hawser/state/var",
                target: "/var",
                fstype: "none",
                flags: MsFlags::MS_BIND,
                data: None,
            },
            MountSpec {
                source: "overlay",
                target: "/etc",
                fstype: "overlay",
                flags: NOSUID_NODEV,
                data: Some(OVERLAY),
            },
            MountSpec {
                source: "/run/hawser/state/etc/kubernetes",
                target: "/etc/kubernetes",
                fstype: "none",
                flags: MsFlags::MS_BIND,
                data: None,
            },
            MountSpec {
                source: "tmpfs",
                target: "/tmp",
                fstype: "tmpfs",
                flags: NOSUID_NODEV,
                data: Some("mode=1777"),
            },
        ];
        const EPHEMERAL: [MountSpec; 3] = [
            MountSpec {
                source: "tmpfs",
                target: "/var",
                fstype: "tmpfs",
                flags: NOSUID_NODEV,
                data: Some("mode=0755"),
            },
            DISK[1],
            DISK[3],
        ];
        match self.state {
            StateBacking::Disk => &DISK,
            StateBacking::Ephemeral => &EPHEMERAL,
        }
    }
}

/// Runs the plan: the new root's mounts, the PCR 11 measurements (`measure_phase`, called with
/// each phase word in order, which the caller backs with the TPM), then the switch. Blocking;
/// call it from a blocking thread. Stops at the first failing step; after the measurements a
/// failure leaves a half-switched machine, which only the fatal-error path (reboot) can end.
pub fn switch_root(
    sys: &dyn Syscalls,
    plan: &RootfsPlan,
    measure_phase: &mut dyn FnMut(
        &'static str,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
) -> Result<SwitchOutcome, SwitchRootError> {
    let mut outcome = SwitchOutcome {
        old_root: None,
        warnings: Vec::new(),
    };
    for step in plan.steps() {
        let failed = |source| SwitchRootError::Step {
            step: step.to_string(),
            source,
        };
        match &step {
            Step::CreateDir(path) => sys.create_dir_all(path).map_err(failed)?,
            Step::Mount(spec) => sys.mount_owned(spec).map_err(failed)?,
            Step::Symlink { target, link } => sys.symlink(target, link).map_err(failed)?,
            Step::MeasurePhase(phase) => {
                measure_phase(phase).map_err(|source| SwitchRootError::Measure { phase, source })?
            }
            Step::OpenOldRoot(path) => {
                outcome.old_root = Some(sys.open_old_root(path).map_err(failed)?)
            }
            Step::ChangeDir(path) => sys.chdir(path).map_err(failed)?,
            Step::ChangeRoot(path) => sys.chroot(path).map_err(failed)?,
        }
    }
    info!(
        "switched to the verified rootfs {}",
        plan.root_device.display()
    );
    Ok(outcome)
}

/// Deletes the initramfs's contents ([`SwitchOutcome::old_root`]) once nothing needs them. A
/// failure only costs memory: it is a warning (returned, and logged).
pub fn delete_old_root(
    sys: &dyn Syscalls,
    old_root: OldRoot,
) -> (Option<RemovalSummary>, Vec<String>) {
    let mut warnings = Vec::new();
    let removed = match sys.remove_old_root(old_root) {
        Ok(summary) => {
            if let Some(failure) = &summary.first_failure {
                warnings.push(format!(
                    "{} initramfs entries could not be deleted (first: {failure}); their memory \
                     stays in use",
                    summary.failed
                ));
            }
            info!("deleted {} initramfs entries", summary.removed);
            Some(summary)
        }
        Err(e) => {
            warnings.push(format!(
                "cannot delete the initramfs contents ({e}); its memory stays in use"
            ));
            None
        }
    };
    for warning in &warnings {
        warn!("{warning}");
    }
    (removed, warnings)
}

#[cfg(test)]
mod tests;
