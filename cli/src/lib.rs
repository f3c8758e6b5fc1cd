//! The library half of the `hawser` CLI: what the binary's subcommands, the local-cluster
//! simulator (`hawser-local`) and the end-to-end tests share.
//!
//! - [`cluster`]: `hawser init` / `hawser recover`, the admin's side of the init protocol.
//! - [`image_build`]: the source tree an image is built from, and a build's timeline line.
//! - [`lifecycle`]: releases, revocations and `hawser verify`, over the join services' admin API
//!   and the nodes' attestation port.
//! - [`local`]: `hawser local …`, handed to the `hawser-local` binary.
//! - [`peers`]: `hawser peers`, the WireGuard mesh as the join service's store shows it.

pub mod cluster;
pub mod image_build;
pub mod lifecycle;
pub mod local;
pub mod peers;
