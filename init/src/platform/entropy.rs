//! Seeding the kernel's random pool from the TPM's random number generator.
//!
//! A freshly booted VM may have too little entropy for the kernel's CRNG: the first blocking
//! `getrandom()` then waits (≈ 1 s measured under QEMU TCG). The Debian cloud kernel has no
//! `CONFIG_HW_RANDOM_TPM`, so PID 1 feeds TPM2_GetRandom output in itself with the
//! `RNDADDENTROPY` ioctl, crediting it as full entropy (the TPM is the root of trust anyway);
//! under QEMU, virtio-rng feeds the pool as well once its module is loaded.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;

/// `RNDADDENTROPY` = `_IOW('R', 0x03, int[2])` from `<linux/random.h>`.
const RNDADDENTROPY: libc::Ioctl =
    nix::request_code_write!(b'R', 0x03, std::mem::size_of::<[libc::c_int; 2]>());

/// Adding entropy failed.
#[derive(Debug, thiserror::Error)]
pub enum EntropyError {
    /// /dev/urandom cannot be opened for writing.
    #[error("cannot open /dev/urandom to add entropy")]
    Open(#[source] io::Error),
    /// The kernel refused RNDADDENTROPY (PID 1 lacks CAP_SYS_ADMIN?).
    #[error("the RNDADDENTROPY ioctl on /dev/urandom failed")]
    Ioctl(#[source] io::Error),
}

/// The `struct rand_pool_info` argument of `RNDADDENTROPY` for `bytes`, credited with 8 bits of
/// entropy per byte: two native-endian ints (entropy bits, buffer size) and the bytes.
pub fn rand_pool_info(bytes: &[u8]) -> Vec<u8> {
    let mut info = Vec::with_capacity(8 + bytes.len());
    let bits = (bytes.len() * 8) as libc::c_int;
    info.extend_from_slice(&bits.to_ne_bytes());
    info.extend_from_slice(&(bytes.len() as libc::c_int).to_ne_bytes());
    info.extend_from_slice(bytes);
    // The kernel reads the buffer as __u32 words; pad to a whole word (padding is not credited).
    info.resize(info.len().next_multiple_of(4), 0);
    info
}

/// Mixes `bytes` into the kernel's pool and credits them as entropy. Needs CAP_SYS_ADMIN.
pub fn add_entropy(bytes: &[u8]) -> Result<(), EntropyError> {
    let urandom = OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(EntropyError::Open)?;
    let info = rand_pool_info(bytes);
    // SAFETY: `info` is a valid `struct rand_pool_info` (two ints, then `buf_size` bytes) that
    // outlives the call; the kernel only reads from it.
    let rc = unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) };
    if rc < 0 {
        return Err(EntropyError::Ioctl(io::Error::last_os_error()));
    }
    Ok(())
}

pub use super::random::crng_ready;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rand_pool_info_layout() {
        let info = rand_pool_info(&[1, 2, 3, 4, 5]);
        assert_eq!(&info[0..4], &40i32.to_ne_bytes());
        assert_eq!(&info[4..8], &5i32.to_ne_bytes());
        assert_eq!(&info[8..13], &[1, 2, 3, 4, 5]);
        assert_eq!(info.len(), 16);
    }

    #[test]
    fn ioctl_number_matches_the_kernel_header() {
        // The value of RNDADDENTROPY in x86-64 <linux/random.h> as compiled (strace shows it).
        assert_eq!(RNDADDENTROPY, 0x4008_5203);
    }
}
