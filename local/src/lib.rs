//! `hawser-local`, the local-cluster simulator (`hawser local …` runs it): a cluster of QEMU
//! nodes with software TPMs on this machine, with the cloud's and the admin's parts played on
//! loopback. A program of its own so that the admin CLI (`hawser`) links neither the QEMU
//! harness nor the join service's server.
//!
//! - [`command`]: the subcommands (`up`, `status`, `down`, `stop|start|restart NODE`); `up`
//!   of one node is `single.rs`, of a cluster `cluster.rs` (created, formed, served) with its
//!   steps in `cluster/`.
//! - [`options`]: what every `up` shares: its options, where local clusters live, waiting on
//!   a console marker.
//! - [`localhost`]: the host side of a local cluster (provider CA, master secret, join service,
//!   the guest's network), used by `hawser local up` and the QEMU tests.
//! - [`local_cluster`]: a local cluster's layout, its nodes' state read off their consoles
//!   (`hawser local status`), and the console filter of `hawser local up`.
//! - [`kubectl`]: Kubernetes' view of a local cluster from the host (the API server forwarded
//!   to the loopback, a kubeconfig for it, Debian's kubectl).
//! - [`lan`]: the LAN between local VMs (a hub of QEMU `dgram` netdevs), where mDNS finds the
//!   join service.

mod cluster;
pub mod command;
pub mod kubectl;
pub mod lan;
pub mod local_cluster;
pub mod localhost;
pub mod options;
mod single;
