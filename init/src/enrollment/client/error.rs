//! Why one join attempt got no secrets. Every variant costs an attempt, never the boot: the
//! client logs the reason ([`crate::platform::error_chain`]) and asks again (the next endpoint,
//! or the same after the backoff). The messages name the problem and never show key material.

use hawser_proto::ticket::TicketError;

use crate::mesh::MeshSetupError;

/// Why one join attempt got no secrets.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The policy the join service must satisfy cannot be built (the image's provider CA, or
    /// the disk's cluster).
    #[error("cannot check the join service")]
    Policy(#[source] hawser_attestation::validator::ValidatorError),
    /// The endpoint does not form a URI.
    #[error("bad endpoint")]
    Endpoint(#[source] tonic::transport::Error),
    /// No aTLS connection: the join service is down, unreachable, or failed the handshake.
    #[error(transparent)]
    Connect(tonic::transport::Error),
    /// The join service answered with a gRPC error (its refusal names the PCRs that differ).
    #[error("refused ({code:?}): {message}")]
    Refused { code: tonic::Code, message: String },
    /// The join ticket's Kubernetes values are unusable.
    #[error(transparent)]
    Ticket(#[from] TicketError),
    /// The ticket's place in the mesh is malformed.
    #[error(transparent)]
    Mesh(#[from] MeshSetupError),
    /// The key has the wrong length for this node's integrity mode.
    #[error(
        "the join service sent a {sent}-byte state disk key; this node's disk needs {needed} \
         (hawser.state_disk_integrity): a join service that predates integrity disks?"
    )]
    KeyLength { sent: usize, needed: usize },
    /// A control plane's master secret was refused ([`MasterSecretError`]).
    #[error(transparent)]
    MasterSecret(#[from] MasterSecretError),
}

impl From<tonic::Status> for AttemptError {
    fn from(status: tonic::Status) -> Self {
        AttemptError::Refused {
            code: status.code(),
            message: status.message().to_owned(),
        }
    }
}

/// Why a control plane does not take the master secret it was sent: it is unusable, or it is
/// not the secret the rest of the answer comes from.
#[derive(Debug, thiserror::Error)]
pub enum MasterSecretError {
    /// The master secret or its salt has the wrong length.
    #[error("the join service sent an unusable master secret")]
    Unusable(#[source] hawser_keys::KeyError),
    /// The disk's UUID is not canonical, so no key can be derived for it.
    #[error("the disk UUID {uuid:?}")]
    DiskUuid {
        uuid: String,
        #[source]
        source: hawser_keys::KeyError,
    },
    /// The disk key sent has a length no integrity mode uses.
    #[error("the join service sent an unusable disk key")]
    DiskKey(#[source] hawser_keys::KeyError),
    /// The disk key cannot be derived from the master secret.
    #[error("cannot derive the disk key from the master secret sent")]
    Derive(#[source] hawser_keys::KeyError),
    /// The master secret derives another disk key or measurement secret than the ones sent.
    #[error(
        "the join service sent a master secret that does not derive the disk key and \
         measurement secret it sent"
    )]
    Inconsistent,
}
