//! hawser-disk-format: the one definition of the on-disk formats hawser writes and reads.
//!
//! The image builder (`hawser-image`) writes the boot disk; PID 1 (`hawser-init`) reads it back
//! on the node, where the disk is untrusted input. Both sides take the formats from here, so
//! what the builder writes and what PID 1 accepts cannot drift apart:
//!
//! ```text
//!   image: veritysetup format ─► root hash ─► root_partuuids ─► GPT (gptman) ─► disk.raw
//!                                   │ (measured kernel command line)
//!   init:  hawser.root_hash ──► root_partuuids ─► gpt::parse_header/parse_entries
//!                                             ─► VeritySuperblock::parse_hawser ─► dm-verity
//! ```
//!
//! - [`guid`]: [`Guid`], canonical (text) byte order, GPT's mixed-endian form, text parsing;
//! - [`gpt`]: the partition types hawser uses, the header and entry layout, PID 1's strict
//!   reader, and the rule linking the two partitions to the root hash ([`gpt::root_partuuids`]);
//! - [`verity`]: the dm-verity superblock `veritysetup format` writes (cryptsetup's
//!   `struct verity_sb`), the parameters hawser uses, the hash tree's shape and the root hash
//!   computation.
//!
//! Everything here is pure: bytes in, values out. No I/O, no syscalls, no async runtime, so the
//! parsers are unit-tested and fuzzable on the host, and the builder and PID 1 share them as
//! they are. Reading devices, writing files and running tools stay with the callers.
//!
//! The GPT itself is written by the `gptman` crate in the image builder: hawser has no GPT
//! encoder of its own to share. The image builder's tests read a table it wrote back with
//! [`gpt::parse_header`] and [`gpt::parse_entries`], so the writer's output is proven to be
//! what PID 1 accepts.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod gpt;
pub mod guid;
pub mod verity;

pub use guid::Guid;

/// Paths in the verified rootfs that PID 1 relies on, which the image builder puts there.
pub mod rootfs {
    /// Byte-identical copies of PID 1's ELF files from the initramfs (`init` and its library
    /// closure, at their initramfs paths below this directory, e.g.
    /// `usr/lib/hawser/initramfs/usr/lib/x86_64-linux-gnu/libc.so.6`). After the pivot PID 1
    /// maps its code from these instead of the deleted initramfs files, so the initramfs's
    /// memory is freed (docs/rootfs.md, "PID 1's memory after the pivot").
    pub const PID1_COPIES: &str = "usr/lib/hawser/initramfs";
}
