//! `hawser-joind`: the join service. A node that booted a genuine image proves it over attested
//! TLS and receives the key to its state disk and what it needs to join the cluster.
//!
//! Core logic knows nothing of gRPC: the policy (expected measurements, reloaded when the file
//! changes), the control-plane approvals (AK names, reloaded likewise), the key service (HKDF from the master secret), bootstrap tokens (through a
//! pluggable issuer; the real one runs `kubeadm token create`), per-peer rate limits and the
//! audit trail are plain Rust here; the gRPC service is a thin adapter over [`JoinCore`].
//! The cluster state (joined disks bound to AKs, control-plane approvals) sits behind
//! [`store::ClusterStore`]: local files for a single join service, the control planes' etcd for
//! a join service on every control plane (docs/cluster-state.md).
//! The WireGuard mesh's registry lives there too: [`vpn`] holds the join service's side of the
//! mesh (settings, its own key, what tickets carry), [`vpnapi`] the peer API nodes poll,
//! [`member`] the join service's own tunnel (docs/mesh.md).
//!
//! Concurrency: validations never take a global lock. The policy is an `Arc` swapped on reload
//! and cloned per request; the rate limiter's lock is held for a map lookup only.

pub mod admin;
pub mod audit;
pub mod core;
pub mod member;
pub mod policy;
pub mod ratelimit;
pub mod reattest;
pub mod service;
pub mod startup;
pub mod tokens;
pub mod vpn;
pub mod vpnapi;

pub use crate::core::{JoinCore, JoinError, JoinGrant, RejoinTicket};
/// The cluster state and the control-plane approvals, in their own crate (`hawser peers` reads
/// them without this server); here under their old paths.
pub use hawser_cluster_store::{self as store, approvals};
