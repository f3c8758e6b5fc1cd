//! Child processes (QEMU, swtpm) that can never outlive the process that started them.
//!
//! Drop handlers kill children on the normal paths, including a panicking test. For the paths
//! where no destructor runs (SIGKILL of the test binary, `std::process::exit`, an abort),
//! every child is started with `PR_SET_PDEATHSIG = SIGKILL`.
//!
//! The kernel sends the parent-death signal when the *thread* that forked the child exits, not
//! the process. A VM started from a short-lived thread (a tokio blocking-pool thread, a helper
//! thread in a test) would be killed when that thread ends. So all children are forked by one
//! dedicated spawner thread that lives as long as the process.
//!
//! A child still starts in the network namespace of the thread that asked for it, not the
//! spawner's: a test that moved its thread into a private namespace (`unshare`) gets its swtpm
//! and QEMU there, even when the spawner thread was made earlier, in the host's namespace.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

struct SpawnRequest {
    command: Command,
    /// The requesting thread's network namespace (`None` without /proc).
    netns: Option<std::fs::File>,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// `/proc/thread-self/ns/net` of the calling thread.
fn thread_netns() -> Option<std::fs::File> {
    std::fs::File::open("/proc/thread-self/ns/net").ok()
}

/// Whether two namespace files name the same namespace.
fn same_namespace(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Makes `command`'s child enter `netns` before exec, if that is not the calling thread's
/// namespace (entering one's own would need CAP_SYS_ADMIN for nothing).
fn enter_netns_in_child(command: &mut Command, netns: &std::fs::File) {
    use std::os::fd::AsRawFd as _;
    if thread_netns().is_some_and(|own| same_namespace(&own, netns)) {
        return;
    }
    let fd = netns.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only setns, which is
    // async-signal-safe; `fd` stays open in the parent until the spawn has returned (the
    // request owns the file), so the child's copy of it is valid.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

static SPAWNER: Mutex<Option<mpsc::Sender<SpawnRequest>>> = Mutex::new(None);

fn spawner() -> io::Result<mpsc::Sender<SpawnRequest>> {
    let mut guard = SPAWNER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(sender) = guard.as_ref() {
        return Ok(sender.clone());
    }
    let (sender, receiver) = mpsc::channel::<SpawnRequest>();
    thread::Builder::new()
        .name("hawser-qemu-spawner".into())
        .spawn(move || {
            // The static keeps a sender alive, so this loop runs until the process exits.
            for mut request in receiver {
                if let Some(netns) = &request.netns {
                    enter_netns_in_child(&mut request.command, netns);
                }
                let result = request.command.spawn();
                // The requester may have given up; the child is then dropped here, and the
                // parent-death signal still ties it to this process.
                let _ = request.reply.send(result);
            }
        })?;
    *guard = Some(sender.clone());
    Ok(sender)
}

/// Spawns `command` so that the child is SIGKILLed when this process dies.
pub(crate) fn spawn_tied(mut command: Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec. It calls only prctl and getppid,
    // which are async-signal-safe, and builds io::Errors from raw OS codes, which do not
    // allocate.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then no signal would come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (reply, response) = mpsc::channel();
    spawner()?
        .send(SpawnRequest {
            command,
            netns: thread_netns(),
            reply,
        })
        .map_err(|_| io::Error::other("the process spawner thread is gone"))?;
    response
        .recv()
        .map_err(|_| io::Error::other("the process spawner thread is gone"))?
}

/// A running child that is reaped by exactly one owner, so its pid cannot be reused while we
/// may still signal it.
#[derive(Debug)]
pub(crate) struct Supervised {
    name: String,
    pid: u32,
    child: Mutex<Child>,
}

impl Supervised {
    pub(crate) fn new(name: impl Into<String>, child: Child) -> Self {
        Supervised {
            name: name.into(),
            pid: child.id(),
            child: Mutex::new(child),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status if the child has exited (reaping it), `None` while it runs.
    pub(crate) fn try_wait(&self) -> Option<ExitStatus> {
        let mut child = self
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match child.try_wait() {
            Ok(status) => status,
            Err(error) => {
                tracing::warn!(process = %self.name, pid = self.pid, %error, "waitpid failed");
                None
            }
        }
    }

    /// Sends `signal` unless the child has already been reaped.
    fn signal(&self, signal: Signal) -> bool {
        let mut child = self
            .child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Checking and signalling under the same lock: nobody can reap the child in between,
        // so the pid still names our child.
        if matches!(child.try_wait(), Ok(None)) {
            let pid = Pid::from_raw(self.pid as libc::pid_t);
            if let Err(error) = kill(pid, signal) {
                tracing::warn!(process = %self.name, pid = self.pid, %error, "kill failed");
            }
            true
        } else {
            false
        }
    }

    /// Polls until the child exits or `timeout` passes.
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> Option<ExitStatus> {
        // No representable end (e.g. Duration::MAX): wait without one.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if deadline.is_some_and(|end| Instant::now() >= end) {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; returns once the child is reaped.
    pub(crate) fn terminate(&self, grace: Duration) -> Option<ExitStatus> {
        if self.signal(Signal::SIGTERM) {
            tracing::debug!(process = %self.name, pid = self.pid, "sent SIGTERM");
        }
        if let Some(status) = self.wait_timeout(grace) {
            return Some(status);
        }
        if self.signal(Signal::SIGKILL) {
            tracing::warn!(process = %self.name, pid = self.pid, "did not exit on SIGTERM; sent SIGKILL");
        }
        let status = self.wait_timeout(Duration::from_secs(10));
        if status.is_none() {
            tracing::error!(process = %self.name, pid = self.pid, "still running after SIGKILL");
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test's private network namespace (the mesh's QEMU test) holds its swtpm and QEMU,
    /// even when the spawner thread was made earlier in the host's namespace.
    #[test]
    fn children_start_in_the_network_namespace_of_the_thread_that_asked() {
        // The spawner exists, in this process's (the host's) namespace.
        spawn_tied(Command::new("true")).unwrap().wait().unwrap();
        let host = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let (ours, childs) = thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("a network namespace (needs root)");
            let ours = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
            let mut command = Command::new("readlink");
            command
                .arg("/proc/self/ns/net")
                .stdout(std::process::Stdio::piped());
            let output = spawn_tied(command).unwrap().wait_with_output().unwrap();
            (ours, String::from_utf8(output.stdout).unwrap())
        })
        .join()
        .unwrap();
        assert_ne!(ours, host);
        assert_eq!(childs.trim(), ours.to_string_lossy());
        // And from the host's namespace, children stay there.
        let mut command = Command::new("readlink");
        command
            .arg("/proc/self/ns/net")
            .stdout(std::process::Stdio::piped());
        let output = spawn_tied(command).unwrap().wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8(output.stdout).unwrap().trim(),
            host.to_string_lossy()
        );
    }

    #[test]
    fn tied_child_from_a_finished_thread_keeps_running() {
        // The parent-death signal follows the forking thread: a child started from a thread
        // that has ended must still be alive, because the spawner thread forked it.
        let child = thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("30");
            spawn_tied(command)
        })
        .join()
        .expect("thread panicked")
        .expect("spawn sleep");
        let child = Supervised::new("sleep", child);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(
            child.try_wait(),
            None,
            "child died with its starting thread"
        );
        let status = child.terminate(Duration::from_secs(2)).expect("terminated");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGTERM)
        );
    }

    /// Helper for `tied_children_die_with_their_parent`, not a test of its own (hence ignored,
    /// so it never counts as a pass): run by it as a subprocess with
    /// HAWSER_PDEATHSIG_HELPER=1, starts a tied `sleep`, prints its pid and exits without
    /// running any destructor.
    #[test]
    #[ignore = "a helper process of tied_children_die_with_their_parent, which runs it"]
    fn pdeathsig_helper() {
        if std::env::var_os("HAWSER_PDEATHSIG_HELPER").is_none() {
            eprintln!(
                "pdeathsig_helper: nothing to do outside tied_children_die_with_their_parent"
            );
            return;
        }
        let mut command = Command::new("sleep");
        command.arg("60");
        let child = spawn_tied(command).expect("spawn sleep");
        println!("HELPER_CHILD_PID={}", child.id());
        std::process::exit(0);
    }

    #[test]
    fn tied_children_die_with_their_parent() {
        let output = Command::new(std::env::current_exe().expect("test binary path"))
            .args([
                "--exact",
                "process::tests::pdeathsig_helper",
                "--ignored",
                "--nocapture",
            ])
            .env("HAWSER_PDEATHSIG_HELPER", "1")
            .output()
            .expect("run helper");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let pid: i32 = stdout
            .lines()
            .find_map(|line| line.strip_prefix("HELPER_CHILD_PID="))
            .unwrap_or_else(|| panic!("helper printed no pid: {stdout}"))
            .trim()
            .parse()
            .expect("pid");
        // The orphan is killed at once and reaped by init (or a subreaper) soon after.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            let dead = match &state {
                None => true,
                Some(stat) => stat.contains(") Z ") || !stat.contains("(sleep)"),
            };
            if dead {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "tied child {pid} outlived its parent: {state:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}
