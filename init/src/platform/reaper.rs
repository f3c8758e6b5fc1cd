//! Zombie reaping that does not steal exit statuses from `tokio::process`.
//!
//! As PID 1, hawser inherits every orphaned process and must reap it. A `waitpid(-1)` loop
//! would also reap the children hawser spawned itself and awaits through `tokio::process`;
//! their `wait()` would then fail with ECHILD. So children hawser spawns are registered in a
//! [`ChildRegistry`] (at spawn, under its lock), and the reaper:
//!
//! 1. peeks at one waitable child with `waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT)`, which
//!    leaves it a zombie;
//! 2. reaps it with `waitpid(pid)` if it is not registered, and peeks again;
//! 3. if it is registered (tokio reaps it), the peek would keep returning it, so the reaper
//!    looks for other zombie children in `/proc` and reaps the unregistered ones by pid.
//!
//! Registered children leave the registry when their `wait()` returns, or, for a child dropped
//! without waiting, when a background task has awaited it.

use std::collections::HashSet;
use std::io;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

/// The pids of children whose exit status belongs to an awaiting `tokio::process::Child`.
#[derive(Debug, Clone, Default)]
pub struct ChildRegistry {
    pids: Arc<Mutex<HashSet<i32>>>,
}

impl ChildRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<i32>> {
        self.pids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `pid` is a registered child.
    pub fn contains(&self, pid: i32) -> bool {
        self.lock().contains(&pid)
    }

    /// Spawns `command` and registers the child before the reaper can see it exit.
    pub fn spawn(&self, command: &mut tokio::process::Command) -> io::Result<SupervisedChild> {
        let mut pids = self.lock();
        let child = command.spawn()?;
        // A child without a pid has already been reaped by tokio: nothing to protect.
        let pid = child.id().map(|pid| pid as i32);
        if let Some(pid) = pid {
            pids.insert(pid);
        }
        Ok(SupervisedChild {
            child: Some(child),
            pid,
            registry: self.clone(),
        })
    }

    fn release(&self, pid: Option<i32>) {
        if let Some(pid) = pid {
            self.lock().remove(&pid);
        }
    }
}

/// A child spawned through a [`ChildRegistry`]: the reaper leaves it to its owner.
#[derive(Debug)]
pub struct SupervisedChild {
    // Always Some until drop.
    child: Option<tokio::process::Child>,
    pid: Option<i32>,
    registry: ChildRegistry,
}

impl SupervisedChild {
    pub fn id(&self) -> Option<u32> {
        self.pid.map(|pid| pid as u32)
    }

    /// The child itself (its pipes, `start_kill`, …).
    pub fn inner(&mut self) -> &mut tokio::process::Child {
        // `child` is only taken in Drop.
        self.child
            .as_mut()
            .unwrap_or_else(|| unreachable!("child taken before drop"))
    }

    /// Waits for the child to exit and unregisters it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.inner().wait().await;
        if status.is_ok() {
            self.registry.release(self.pid.take());
        }
        status
    }
}

impl Drop for SupervisedChild {
    fn drop(&mut self) {
        let (Some(mut child), Some(pid)) = (self.child.take(), self.pid) else {
            return;
        };
        // The pid stays registered until the child's status is collected, so that neither the
        // reaper steals it nor a recycled pid is mistaken for it.
        let registry = self.registry.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = child.wait().await;
                    registry.release(Some(pid));
                });
            }
            // Without a runtime tokio's orphan queue reaps it; the pid stays registered.
            Err(_) => drop(child),
        }
    }
}

/// One reaped orphan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub pid: i32,
    pub status: WaitStatus,
}

/// Reaps every zombie child that is not registered. Never blocks.
pub fn reap_orphans(registry: &ChildRegistry) -> Vec<Reaped> {
    let mut reaped = Vec::new();
    loop {
        let peek = waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        );
        let pid = match peek {
            Ok(status) => match status.pid() {
                Some(pid) => pid.as_raw(),
                // StillAlive: children exist, none has exited.
                None => break,
            },
            Err(Errno::EINTR) => continue,
            // ECHILD: no children at all.
            Err(_) => break,
        };
        // Holding the lock keeps a concurrent spawn from registering a recycled pid between
        // the check and the reap.
        let registered = registry.lock();
        if registered.contains(&pid) {
            reap_unregistered_zombies(&registered, &mut reaped);
            break;
        }
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(status) => reaped.push(Reaped { pid, status }),
        }
    }
    reaped
}

fn reap_unregistered_zombies(registered: &HashSet<i32>, reaped: &mut Vec<Reaped>) {
    let me = nix::unistd::getpid().as_raw();
    for pid in zombie_children(me) {
        if registered.contains(&pid) {
            continue;
        }
        if let Ok(status) = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG))
            && status != WaitStatus::StillAlive
        {
            reaped.push(Reaped { pid, status });
        }
    }
}

/// The pids of zombie processes whose parent is `parent`.
fn zombie_children(parent: i32) -> Vec<i32> {
    children_of(parent)
        .into_iter()
        .filter(|(_, state)| *state == 'Z')
        .map(|(pid, _)| pid)
        .collect()
}

/// `(pid, state)` of every process whose parent is `parent`, from `/proc/<pid>/stat`.
fn children_of(parent: i32) -> Vec<(i32, char)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (state, ppid) = parse_stat_state_and_ppid(&stat)?;
            (ppid == parent).then_some((pid, state))
        })
        .collect()
}

/// Whether this process has a child that is not a zombie.
pub fn has_living_children() -> bool {
    let me = nix::unistd::getpid().as_raw();
    children_of(me).iter().any(|(_, state)| *state != 'Z')
}

/// Reaps every exited child, registered or not. Only for the way down when no runtime runs
/// (panic, fatal error): nobody is left to await them.
pub fn reap_all() {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return,
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

/// State and parent pid from a `/proc/<pid>/stat` line. The command name is in parentheses and
/// may itself contain spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_state_and_ppid(stat: &str) -> Option<(char, i32)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Reaps orphans whenever SIGCHLD arrives; logs each one. Runs forever.
pub async fn run(registry: ChildRegistry) -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigchld = signal(SignalKind::child())?;
    loop {
        for orphan in reap_orphans(&registry) {
            tracing::debug!(pid = orphan.pid, status = ?orphan.status, "reaped orphan");
        }
        sigchld.recv().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        assert_eq!(
            parse_stat_state_and_ppid("42 (sleep) Z 1 42 42 0 -1"),
            Some(('Z', 1))
        );
        assert_eq!(
            parse_stat_state_and_ppid("42 (a) b) (c) S 17 42 42 0 -1"),
            Some(('S', 17))
        );
        assert_eq!(parse_stat_state_and_ppid("42 (x"), None);
        assert_eq!(parse_stat_state_and_ppid("42 (x) R"), None);
    }
}
