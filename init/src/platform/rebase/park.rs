//! Step 3 of the rebase: every other thread of PID 1 parked while mappings move. A real-time
//! signal nothing else uses runs a handler that waits on a futex (touching only atomics, errno
//! and the futex syscall); dropping [`Parked`] releases them.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::RebaseError;

/// Threads inside [`park`].
static PARKED: AtomicUsize = AtomicUsize::new(0);
/// 0 while threads must stay parked.
static RELEASED: AtomicU32 = AtomicU32::new(1);
/// How long to wait for every thread to park.
const PARK_TIMEOUT: Duration = Duration::from_secs(2);

/// The signal that parks a thread: a real-time signal glibc does not use itself.
fn park_signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

extern "C" fn park(_: libc::c_int) {
    // SAFETY: errno is thread-local; it is restored so that the interrupted code sees its own.
    let errno = unsafe { *libc::__errno_location() };
    PARKED.fetch_add(1, Ordering::SeqCst);
    while RELEASED.load(Ordering::SeqCst) == 0 {
        // SAFETY: futex wait on a static word while it is 0; async-signal-safe.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                RELEASED.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0u32,
                std::ptr::null::<libc::timespec>(),
            )
        };
    }
    PARKED.fetch_sub(1, Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Every other thread parked; dropping releases them.
pub(super) struct Parked {
    pub(super) count: usize,
}

impl Drop for Parked {
    fn drop(&mut self) {
        release();
    }
}

fn release() {
    RELEASED.store(1, Ordering::SeqCst);
    // SAFETY: futex wake of every waiter on the static word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            RELEASED.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

pub(super) fn park_other_threads() -> Result<Parked, RebaseError> {
    let failed = |what: String| RebaseError::Park(what);
    // SAFETY: installs a handler (an `extern "C"` function that only touches atomics, errno and
    // the futex syscall) for a real-time signal nothing else in PID 1 uses.
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = park as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(park_signal(), &action, std::ptr::null_mut())
    };
    if installed != 0 {
        return Err(failed(format!("sigaction: {}", io::Error::last_os_error())));
    }
    let own = nix::unistd::gettid().as_raw();
    let pid = std::process::id() as libc::pid_t;
    let tids: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")
        .map_err(|e| failed(format!("/proc/self/task: {e}")))?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|tid| *tid != own)
        .collect();
    let started = Instant::now();
    while PARKED.load(Ordering::SeqCst) != 0 {
        if started.elapsed() > PARK_TIMEOUT {
            return Err(failed("threads of an earlier park are still parked".into()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    RELEASED.store(0, Ordering::SeqCst);
    let mut count = 0;
    for tid in tids {
        // SAFETY: tgkill with integer arguments.
        let sent = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, park_signal()) };
        if sent == 0 {
            count += 1;
        } else if io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
            let error = io::Error::last_os_error();
            release();
            return Err(failed(format!("tgkill of thread {tid}: {error}")));
        }
    }
    let parked = Parked { count };
    while PARKED.load(Ordering::SeqCst) < count {
        if started.elapsed() > PARK_TIMEOUT {
            return Err(failed(format!(
                "{} of {count} threads parked within {PARK_TIMEOUT:?}",
                PARKED.load(Ordering::SeqCst)
            )));
        }
        std::hint::spin_loop();
        std::thread::yield_now();
    }
    Ok(parked)
}
