//! hawser-init: the PID 1 of a hawser node, installed as `/init` in the measured initramfs.
//!
//! The sequence is in [`boot`]: API filesystems, logging to the console and the kernel log,
//! kernel modules, entropy from the TPM, configuration from the measured kernel command line
//! (and the few unmeasured fw_cfg keys allowed), PCR 11 ← `enter-initrd`; then the state disk,
//! prepared (probed, format or open planned), its key won in the race between the join client
//! and the init server ([`enrollment`]), checked against the disk, the node lock taken (PCR 15 ←
//! cluster ID) and the disk applied; a TPM quote in a one-line boot report; for images with a
//! rootfs, the pivot into it (dm-verity, PCR 11 ← `leave-initrd`, `switch_root`: [`rootfs`])
//! and the node's services, kubeadm and join service ([`kube`], [`supervisor`]). PID 1 then
//! reaps orphans and shuts down cleanly on SIGTERM, SIGINT, SIGPWR or the ACPI power button.
//!
//! Two rules shape the code:
//!
//! - **PID 1 never exits.** A panic or a return from `main` would be a kernel panic that hides
//!   its reason. Every failure becomes one `FATAL:` line and the reboot policy ([`fatal`]).
//! - **Decisions are testable without root.** Mounting, module loading, signalling and reboot go
//!   through the [`platform::syscalls::Syscalls`] trait (youki's lesson), configuration parsing
//!   is pure ([`config`]), so the plans — what is mounted and unmounted in which order, which
//!   modules are loaded in which order, what the configuration means — are unit-tested on the
//!   host. Only [`platform::syscalls::LinuxSyscalls`] and the TPM need the VM (or swtpm).
//!
//! ## Layers
//!
//! ```text
//! boot/          the script of phases over a Boot context (timer, warnings, TPM, registry,
//!                mount table, the node's services)
//! fatal, shutdown  the ways down: FATAL + reboot policy; stop processes, unmount, power off
//! ─────────────────────────────────────────────────────────────────────────────────────────
//! enrollment/    join client, init server, the race, the node lock (PCR 15)
//! disk/          the state disk: key sources, LUKS2 probe, lifecycle (prepare/verify/apply),
//!                its dm-crypt tables
//! rootfs/        locating and activating the dm-verity rootfs, the pivot plan, the pivot
//! kube/          Kubernetes after the pivot: services, kubeadm's intent and attempts, the
//!                one-time grants, the cluster's join service
//! supervisor/    services and one-shot jobs, restarts and retries
//! modules, config, attest     kernel modules, configuration, measurement and quote
//! ─────────────────────────────────────────────────────────────────────────────────────────
//! platform/      syscalls, mounts, block devices, device-mapper, random, entropy, fw_cfg,
//!                console, reaper, power button, net, poll, timings, error_chain
//! ```
//!
//! A module imports only modules beside or below it: [`platform`] imports no domain module,
//! and no two top-level modules import each other around a circle (a unit test, `layers.rs`,
//! checks both on every `cargo test`).
//!
//! `main.rs` only calls [`boot::run`].

pub mod attest;
pub mod attest_server;
pub mod boot;
pub mod config;
pub mod disk;
pub mod enrollment;
pub mod fatal;
pub mod kube;
mod layers;
pub mod mesh;
pub mod modules;
pub mod platform;
pub mod rootfs;
pub mod shutdown;
pub mod supervisor;

/// The phase timer at its old path (`init/tests/luks2_cryptsetup.rs` imports it from here).
pub use platform::timings;
