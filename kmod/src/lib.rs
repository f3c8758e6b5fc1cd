//! Kernel-module dependency resolution, shared by the image builder and PID 1.
//!
//! The image builder ships only the modules PID 1 loads, plus their dependencies; PID 1 loads
//! them in dependency order with `finit_module`. Both sides read the same `modules.dep` (the
//! kernel package's, or the subset the builder writes into the initramfs), so the two cannot
//! disagree about what "the modules PID 1 needs" means.
//!
//! There is no `modprobe` in the initramfs: a module the kernel would auto-load on demand
//! (`request_module`) must be listed in [`BOOT_MODULE_TABLE`] or be built in. A cloud's own
//! devices (its NIC, its disk controller, its confidential-computing report) are in that
//! platform's table, [`platform_modules`], chosen by `hawser.platform=` on the measured command
//! line.
//!
//! Each listed module says why PID 1 loads it and whether the boot can go on without it
//! ([`Need`]): a module that drives a CPU feature or device the machine may lack, where the
//! kernel has a fallback or the boot loses only a convenience, is [`Need::Optional`]; the
//! kernel refusing it with ENODEV ("no such device") is then a warning, not a reboot loop.
//! [`ModuleIndex::load_plan`] carries that classification to every file it loads, dependencies
//! included, so PID 1 decides from data and not from module names.

mod index;
mod platform_table;
mod table;

pub use index::{KmodError, ModuleIndex, PlannedModule, normalize_name};
pub use platform_table::{PLATFORM_MODULE_TABLES, platform_modules};
pub use table::{
    AFTER_PIVOT_MODULES, BOOT_MODULE_TABLE, BOOT_MODULES, KUBERNETES_MODULE_TABLE,
    KUBERNETES_MODULES, rootfs_modules,
};

/// Whether the boot can go on when the kernel refuses a module for a CPU feature or device
/// this machine lacks (ENODEV).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The boot path cannot do without the module: any failure to load it is fatal.
    Required,
    /// The kernel has a fallback, or only a convenience is lost: when the kernel refuses the
    /// module with ENODEV, PID 1 warns and goes on. Any other failure (a corrupt or mismatched
    /// module) is an image defect and stays fatal.
    Optional {
        /// What the machine loses, or what takes over, without the module.
        without: &'static str,
    },
}

/// When PID 1 loads a module of [`BOOT_MODULE_TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before the rest of the bring-up (none today: every module of the table can wait).
    Early,
    /// First on a thread of its own while PID 1 opens the TPM, seeds entropy and measures
    /// (mostly waiting on the TPM); awaited before fw_cfg is read and the network configured
    /// (fw_cfg, virtio-rng, the NIC).
    Network,
    /// On the same thread after the [`Stage::Network`] ones, while PID 1 goes on to the
    /// network and the join service; awaited before the state disk, the first thing that needs
    /// these (the disks, device-mapper, dm-crypt's cipher, and the power button, watched from
    /// then on).
    Background,
    /// On the same thread after the [`Stage::Background`] ones, while PID 1 opens the state
    /// disk (mostly waiting on the join service); awaited after it, before the mesh and the
    /// rootfs that need these (dm-verity, erofs, overlay).
    AfterStateDisk,
    /// Only when the node uses what it is for ([`Use`]), right before: `tun`, once the join
    /// ticket or the state disk gives the node a place in a WireGuard mesh. A node without a
    /// mesh never loads it.
    OnDemand,
    /// With a rootfs (`hawser.root_hash`), after the pivot, from the verified rootfs, which
    /// carries them too ([`AFTER_PIVOT_MODULES`]): the power button's `button` and `evdev`,
    /// which nothing before the pivot needs unless the bring-up waits (for the join service,
    /// for `hawser init` or `recover`; PID 1 then loads them from the initramfs after a grace
    /// period). Without a rootfs, with the [`Stage::Background`] ones.
    AfterPivot,
}

/// What a module of [`BOOT_MODULE_TABLE`] is for, so a node whose command line does not ask
/// for that does not load it (each module costs its signature check and init at every boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Every boot.
    Always,
    /// `hawser.state_disk_integrity=hmac-sha256`: dm-integrity and dm-crypt's `authenc`.
    Integrity,
    /// `hawser.root_hash=`: the verified rootfs (dm-verity, erofs, the `/etc` overlay).
    Rootfs,
    /// A WireGuard mesh, which only the join (or the state disk, at a rejoin) says the node
    /// has: loaded [`Stage::OnDemand`], before the tunnel starts.
    Mesh,
}

/// A module PID 1 loads, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelModule {
    /// The module's name as the kernel spells it (`_`, never `-`).
    pub name: &'static str,
    /// What hawser uses it for; completes "the kernel module … is required for …".
    pub purpose: &'static str,
    /// Whether the boot can go on without it.
    pub need: Need,
    /// What the module's init checks the machine for (refusing with ENODEV without it), and how
    /// a QEMU VM gets it; completes "the VM lacks …". `None` for modules whose init checks for
    /// nothing: drivers that register and wait for their devices, filesystems, crypto templates.
    pub hardware: Option<&'static str>,
    /// When it is loaded.
    pub stage: Stage,
    /// Which configuration needs it.
    pub used_for: Use,
}

impl KernelModule {
    /// A module the boot path cannot do without.
    pub const fn required(name: &'static str, purpose: &'static str) -> Self {
        Self {
            name,
            purpose,
            need: Need::Required,
            hardware: None,
            stage: Stage::Early,
            used_for: Use::Always,
        }
    }

    /// A module the boot can go on without, losing `without`.
    pub const fn optional(
        name: &'static str,
        purpose: &'static str,
        without: &'static str,
    ) -> Self {
        Self {
            name,
            purpose,
            need: Need::Optional { without },
            hardware: None,
            stage: Stage::Early,
            used_for: Use::Always,
        }
    }

    /// Loaded in the background, before the state disk ([`Stage::Background`]).
    pub const fn in_background(mut self) -> Self {
        self.stage = Stage::Background;
        self
    }

    /// Loaded in the background while the state disk opens ([`Stage::AfterStateDisk`]).
    pub const fn after_state_disk(mut self) -> Self {
        self.stage = Stage::AfterStateDisk;
        self
    }

    /// Loaded in the background first, before the network ([`Stage::Network`]).
    pub const fn before_network(mut self) -> Self {
        self.stage = Stage::Network;
        self
    }

    /// Loaded after the pivot when there is one ([`Stage::AfterPivot`]).
    pub const fn after_pivot(mut self) -> Self {
        self.stage = Stage::AfterPivot;
        self
    }

    /// Loaded only when the node starts using `used_for` ([`Stage::OnDemand`]).
    pub const fn on_demand(mut self, used_for: Use) -> Self {
        self.stage = Stage::OnDemand;
        self.used_for = used_for;
        self
    }

    /// Loaded only when the configuration asks for `used_for`.
    pub const fn only_for(mut self, used_for: Use) -> Self {
        self.used_for = used_for;
        self
    }

    /// The module's init refuses (ENODEV) a machine without `hardware`.
    pub const fn checks_for(mut self, hardware: &'static str) -> Self {
        self.hardware = Some(hardware);
        self
    }
}

#[cfg(feature = "scan")]
mod scan;
#[cfg(feature = "scan")]
pub use scan::{decompressed_path, read_module};

#[cfg(test)]
mod tests;
