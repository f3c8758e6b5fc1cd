//! hawser-platforms: confidential-computing platforms' own evidence, what a cloud or a CPU
//! signs about a guest, verified offline against the vendor's pinned root at an explicit time.
//!
//! hawser's validator ([`hawser_attestation::validator`]) verifies a TPM quote by an AK that
//! chains to a provider CA. On a confidential VM the hardware adds a report of its own that
//! binds the guest's launch measurement (and, on Azure, the vTPM's AK) to the CPU vendor's
//! keys. This crate verifies those reports, and a cloud vTPM's own AK certificates; `docs/platforms.md` says per platform what is verified, what
//! is trusted, and what cannot be checked offline (freshness beyond a nonce, revocation).
//!
//! - [`azure`]: Azure confidential VMs: the HCL report ties the vTPM's AK to an SNP report or a
//!   TD quote; the AK's quote and certificate.
//! - [`gce`]: Google Compute Engine's vTPM: an RSA AK certified by Google, its quote.
//! - [`snp`]: AMD SEV-SNP attestation reports, VCEK or VLEK → ASK/ASVK → ARK.
//! - [`tdx`]: Intel TDX quotes with Intel's DCAP collateral (dcap-qvl), and a TD policy.
//! - [`profile`]: the platform profiles a cluster's measurements file selects, what each node
//!   reads, and one `verify` over them all.
//! - [`node`]: the node side, reading a platform's evidence from the vTPM's NV indices or
//!   configfs-tsm.
//! - [`verifier`]: the platforms' verifiers as hawser's validator's hook
//!   ([`hawser_attestation::platform`]), and [`verifier::ak_trust`], the trust a cluster's
//!   measurements file selects; [`verifier_cloud`]: the Azure, bare SEV-SNP and bare TDX
//!   verifiers of that hook, each at a configurable verification time.
//! - [`chain`]: the certificate walk every platform shares; [`tpm_rsa`]: RSA AKs and their
//!   quote signatures (cloud vTPMs' AKs are RSA).

pub mod azure;
pub mod chain;
pub mod gce;
pub mod node;
pub mod profile;
pub mod snp;
pub mod tdx;
pub mod tpm_rsa;
pub mod verifier;
pub mod verifier_cloud;

pub use chain::{ChainError, VerificationTime};
