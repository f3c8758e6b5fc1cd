//! PID 1's open-file limit, raised on purpose at startup.
//!
//! The kernel starts PID 1 with `RLIMIT_NOFILE` 1024 (soft) / 4096 (hard), and every process
//! it starts inherits that. PID 1 serves aTLS to anyone on the network (the init server, the
//! join service on a control plane) and holds the mesh's sockets, the console, pipes to its
//! children: at 1024 a flood of connections ends in `EMFILE`, and the next `open` of a disk
//! or a pipe to `kubeadm` fails with it. The listeners bound what unauthenticated clients can
//! hold (see `hawser_attestation::atls::limits`); the limit is raised so that those bounds,
//! not the file table, decide.
//!
//! The values:
//! - soft [`NOFILE_SOFT`] = 65536: far above what PID 1 holds under its listeners' bounds
//!   (hundreds), with room for containerd's and kubelet's own sockets; select(2)-based
//!   programs (fd < 1024) are not among PID 1's children.
//! - hard [`NOFILE_HARD`] = 524288: systemd's default hard limit for services since v240, the
//!   value containerd and kubelet are run with on systemd hosts; both are Go programs, and Go
//!   raises its soft limit to the hard one at startup. It stays under the kernel's default
//!   `fs.nr_open` (1048576), above which `setrlimit` fails.
//!
//! A higher limit that is already in place is kept. Without `CAP_SYS_RESOURCE` (PID 1 has it;
//! a test process in a container may not) the hard limit stays and the soft one is raised to
//! it. A failure is a warning, not a reason to stop booting.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// PID 1's soft limit on open files (see the module docs for why).
pub const NOFILE_SOFT: u64 = 65_536;
/// PID 1's hard limit on open files (see the module docs for why).
pub const NOFILE_HARD: u64 = 524_288;

/// The (soft, hard) limit to set, given the current one: at least ours, never lower.
pub fn raised_nofile(current_soft: u64, current_hard: u64) -> (u64, u64) {
    let hard = current_hard.max(NOFILE_HARD);
    let soft = current_soft.max(NOFILE_SOFT).min(hard);
    (soft, hard)
}

/// Why the file limit stays where it was.
#[derive(Debug, thiserror::Error)]
pub enum RlimitError {
    /// getrlimit/setrlimit(RLIMIT_NOFILE) failed.
    #[error("cannot {doing} RLIMIT_NOFILE")]
    Nofile {
        doing: &'static str,
        #[source]
        source: nix::Error,
    },
}

/// Raises this process's `RLIMIT_NOFILE` to [`raised_nofile`] (or, not allowed to raise the
/// hard limit, the soft one up to it); returns the (soft, hard) set.
pub fn raise_nofile() -> Result<(u64, u64), RlimitError> {
    let (soft, hard) =
        getrlimit(Resource::RLIMIT_NOFILE).map_err(|source| RlimitError::Nofile {
            doing: "read",
            source,
        })?;
    let (mut new_soft, mut new_hard) = raised_nofile(soft, hard);
    if (new_soft, new_hard) == (soft, hard) {
        return Ok((soft, hard));
    }
    if let Err(nix::Error::EPERM) = setrlimit(Resource::RLIMIT_NOFILE, new_soft, new_hard) {
        (new_soft, new_hard) = (new_soft.min(hard), hard);
        setrlimit(Resource::RLIMIT_NOFILE, new_soft, new_hard).map_err(|source| {
            RlimitError::Nofile {
                doing: "raise",
                source,
            }
        })?;
    }
    let set = getrlimit(Resource::RLIMIT_NOFILE).map_err(|source| RlimitError::Nofile {
        doing: "read back",
        source,
    })?;
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_default_is_raised_and_a_higher_limit_kept() {
        // What the kernel gives PID 1.
        assert_eq!(raised_nofile(1024, 4096), (NOFILE_SOFT, NOFILE_HARD));
        // Already higher (a container runtime's, or nr_open-sized): kept.
        assert_eq!(raised_nofile(1 << 20, 1 << 20), (1 << 20, 1 << 20));
        assert_eq!(raised_nofile(1024, 1 << 20), (NOFILE_SOFT, 1 << 20));
    }

    /// The real call, on the test process, from the kernel's soft default: afterwards the soft
    /// limit is ours, or the hard limit where raising that is not allowed (no
    /// CAP_SYS_RESOURCE, as in some containers).
    #[test]
    fn raising_sets_the_process_limit() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, 1024.min(hard), hard).unwrap();
        let (set_soft, set_hard) = raise_nofile().unwrap();
        assert!(set_hard >= hard, "the hard limit was lowered");
        assert_eq!(set_soft, NOFILE_SOFT.min(set_hard), "hard limit {set_hard}");
        assert!(set_soft > 1024);
        // Other tests in this process get their limit back (the soft one; a raised hard one
        // stays, which they do not mind).
        setrlimit(Resource::RLIMIT_NOFILE, soft.max(set_soft), set_hard).unwrap();
    }
}
