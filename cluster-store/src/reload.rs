//! What a check for a changed file did: the measurements policy (`hawser-joind`) and the
//! control-plane approvals ([`crate::approvals`]) are both files kept in step without a
//! restart, and report a reload the same way.

/// What a reload check did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The file has the content already in force.
    Unchanged,
    /// A new policy is in force.
    Reloaded { digest: String },
    /// The new content is invalid; the old policy stays.
    Rejected { reason: String },
    /// The file is gone: the old measurements policy stays (the control-plane approvals, which
    /// share this type, approve nobody instead).
    Missing,
}
