//! hawser-measurements: what the PCRs of a hawser node should contain, and why they do not.
//!
//! The verifier trusts expected PCR values, not the code that produced them; this crate is
//! where those values are computed, from the built artifacts alone, and where a real boot's
//! event log is held against them. It is pure computation over bytes (no TPM, no I/O), shared by
//! the image tooling that predicts measurements, the PID 1 that extends them and the verifier
//! that replays them.
//!
//! The sha256 extend operation and the systemd-compatible boot-phase words are the crate
//! `hawser-pcr`, which PID 1 and the verifiers link without this one.
//! - [`pe`], [`authenticode`]: the bounds-checked PE reader (crate `hawser-pe`, shared with the
//!   UKI builder) and the Authenticode hash firmware extends into PCR 4.
//! - [`models`]: which stub (`.sdmagic`) and kernel (`.linux`) a UKI carries, and what each
//!   modelled version measures; every other version is refused by name.
//! - [`stub`]: how systemd-stub converts the command line and passes `.osrel` to the kernel.
//! - [`hwids`]: which `.dtbauto` systemd-stub ≥ 257 picks (CHIDs, `.hwids`) with no firmware DT.
//! - [`predict`]: the predicted events and values of PCRs 4, 9, 11 (per boot phase), 12, 13, 15.
//! - [`eventlog`]: the firmware's TCG event log (crypto-agile), its replay, and the console
//!   line PID 1 prints it in.
//! - [`explain`]: a real boot's event log lined up with the prediction, event by event.
//! - [`publish`]: a released image's measurements for verifiers without hawser's source
//!   (Constellation's published shape plus a `hawser` object).
//! - [`reference`](mod@reference): reference measurement files (Constellation's JSON shape plus metadata) and
//!   the diff that names the input that changed.
//!
//! The rules and where they come from are in `docs/measurements.md` and
//! `docs/research/systemd-stub-257-measurements.md`.

pub mod authenticode;
pub mod eventlog;
pub mod explain;
pub mod hwids;
pub mod models;
pub mod predict;
pub mod publish;
pub mod reference;
pub mod stub;
#[cfg(test)]
pub(crate) mod test_fixtures;

/// The PE reader, re-exported under its old path (`hawser_measurements::pe`).
pub use hawser_pe as pe;

pub use predict::{PREDICTED_PCRS, Phase, PredictError, Prediction};

/// Serializes 32-byte digests as lowercase hex strings.
pub(crate) mod hex_serde {
    pub fn serialize<S: serde::Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }
}
