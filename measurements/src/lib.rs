//! hawser-measurements: what the PCRs of a hawser node should contain.
//!
//! The verifier trusts expected PCR values, not the code that produced them; this crate is
//! where those values are computed. It is pure arithmetic over bytes (no TPM, no I/O), shared
//! by the image builder that predicts measurements, the PID 1 that extends them and the
//! verifier that replays them.
//!
//! - [`pcr`]: the sha256 extend operation and the systemd-compatible boot-phase words.

pub mod pcr;

pub use pcr::{
    PCR_KERNEL_BOOT, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, extend_sha256, phase_digest,
};
