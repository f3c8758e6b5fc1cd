//! The library half of the `hawser` CLI: what the binary's subcommands and the end-to-end tests
//! share.
//!
//! - [`cluster`]: `hawser init` / `hawser recover`, the admin's side of the init protocol.
//! - [`lan`]: the LAN between local VMs (a hub of QEMU `dgram` netdevs), where mDNS finds the
//!   join service.
//! - [`localhost`]: the host side of a local cluster (provider CA, master secret, join service,
//!   the guest's network), used by `hawser local up` and the QEMU tests.
//! - [`local_cluster`]: a local cluster's layout, its nodes' state read off their consoles
//!   (`hawser local status`), and the console filter of `hawser local up`.
//! - [`peers`]: `hawser peers`, the WireGuard mesh as the join service's store shows it.

pub mod cluster;
pub mod lan;
pub mod local_cluster;
pub mod localhost;
pub mod peers;
