//! The kernel's CSPRNG (getrandom(2)): the one place PID 1 asks it for bytes.
//!
//! getrandom(2) through libc: nix has no wrapper for it and rustix is not a dependency of
//! init; each call has its SAFETY comment.

use std::io;

/// Fills `buf` from getrandom(2), blocking until the CRNG is initialized (which the TPM
/// seeding at bring-up has done by the time anything needs a key, a UUID or a salt).
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom(2) writes at most `rest.len()` bytes into `rest`, which is valid
        // and exclusively borrowed for the call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += n as usize;
    }
    Ok(())
}

/// Fills `buf` only if the CRNG can give all of it without blocking; `false` otherwise.
pub fn try_fill_nonblocking(buf: &mut [u8]) -> bool {
    // SAFETY: getrandom(2) writes at most `buf.len()` bytes into the live, exclusively
    // borrowed buffer.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), libc::GRND_NONBLOCK) };
    usize::try_from(n) == Ok(buf.len())
}

/// Whether the kernel's CRNG is initialized (a non-blocking getrandom succeeds).
pub fn crng_ready() -> bool {
    try_fill_nonblocking(&mut [0u8; 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_fill_the_buffer() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        fill(&mut a).unwrap();
        fill(&mut b).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0u8; 64]);
    }

    #[test]
    fn a_ready_crng_fills_without_blocking() {
        assert!(crng_ready());
        let mut bytes = [0u8; 32];
        assert!(try_fill_nonblocking(&mut bytes));
        assert_ne!(bytes, [0u8; 32]);
    }
}
