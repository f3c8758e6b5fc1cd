//! The platform layer: everything PID 1 asks of the kernel, and nothing about what a hawser
//! node is. No module here imports a domain module (`disk`, `rootfs`, `enrollment`, `kube`,
//! `supervisor`, `boot`, …); `crate::layers`' test checks it on every `cargo test`.
//!
//! - [`syscalls`]: the [`syscalls::Syscalls`] trait (mount, pivot, modules, signals, reboot)
//!   with the Linux implementation and a recording one for host tests.
//! - [`mounts`]: the API file systems and the table of what PID 1 mounted (unmounted in
//!   reverse at shutdown).
//! - [`block`]: block devices in sysfs, found by serial. [`dm`]: device-mapper ioctls and
//!   `logon` keys.
//! - [`random`]: getrandom(2). [`entropy`]: seeding the kernel pool (RNDADDENTROPY).
//! - [`fw_cfg`]: QEMU's fw_cfg files. [`console`]: the console, `/dev/kmsg`, tracing.
//! - [`reaper`]: reaping orphans, and the registry of children PID 1 waits for itself.
//! - [`power_button`]: the ACPI power button's input device. [`net`]: link-up and an address.
//! - [`dhcp`]: a DHCPv4 client for the first NIC on clouds (address, routes incl. option 121,
//!   MTU). [`metadata`]: the cloud's instance metadata service (GCE, Azure, AWS IMDSv2) as a
//!   source of hawser keys beside fw_cfg, for the same allow-list.
//! - [`poll`]: the one wait-until-it-is-there helper. [`timings`]: the phase timer.
//! - [`rlimit`]: PID 1's open-file limit, raised at startup (and why to which values).
//! - [`rebase`]: after the pivot, PID 1's own mappings moved from the deleted initramfs onto
//!   their byte-identical copies in the rootfs (`mmap`/`mremap` in place, other threads
//!   parked), which frees the initramfs.
//! - [`error`]: [`error_chain`], an error and its causes on one line. [`fs`]: the durable
//!   replace of a file (temporary, fsync, rename, directory fsync).
//!
//! ## Which crate for which call
//!
//! - **nix** wherever it covers the call safely (mount, umount, pivot_root, reboot, signals,
//!   kill, waitpid, finit_module, uname, sethostname, terminal and file-descriptor calls): it
//!   is what init already uses, with typed flags and `Errno`.
//! - **rustix** (today only a transitive dependency, through tempfile; not one of the
//!   workspace's) for what nix lacks and rustix wraps safely — the new mount API
//!   (`fsopen`/`fsmount`/`move_mount`), typed ioctl helpers — when such a call is added: add it
//!   to the workspace then, rather than writing that call against libc.
//! - **raw libc** where nix has no wrapper and the call is one of a few already written
//!   (getrandom, add_key/keyctl, RNDADDENTROPY, the interface ioctls of [`net`], dup2 of the
//!   console, malloc_trim, and [`rebase`]'s mmap/mremap/prctl/futex/tgkill), each in an `unsafe` block with a `// SAFETY:` comment saying why its
//!   pointers and lengths are valid.
//! - **devicemapper** (the crate) for device-mapper ioctls, in [`dm`] only.
//!
//! Working calls are not switched between crates for their own sake.

pub mod block;
pub mod console;
pub mod dhcp;
pub mod dm;
pub mod entropy;
pub mod error;
pub mod fs;
pub mod fw_cfg;
pub mod metadata;
pub mod mounts;
pub mod net;
pub mod poll;
pub mod power_button;
pub mod random;
pub mod reaper;
pub mod rebase;
pub mod rlimit;
pub mod syscalls;
pub mod timings;

pub use error::error_chain;
