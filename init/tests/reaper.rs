//! The reaper against real processes: it must reap re-parented orphans without stealing the
//! exit status of a child that `tokio::process` awaits.
//!
//! The test binary makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so orphans of
//! its descendants are re-parented to it as they would be to PID 1. It is one test in its own
//! binary: the reaper acts on every child of the process.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::time::Duration;

use hawser_init::platform::reaper::{ChildRegistry, has_living_children, reap_orphans};
use nix::sys::wait::WaitStatus;

fn zombie_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    hawser_init::platform::reaper::parse_stat_state_and_ppid(&stat).map(|(state, _)| state)
}

#[tokio::test(flavor = "current_thread")]
async fn reaps_orphans_but_leaves_awaited_children_to_tokio() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument and touches no memory.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "prctl(PR_SET_CHILD_SUBREAPER)");

    let registry = ChildRegistry::new();

    // A supervised child that exits with 7 and is only awaited after the reaper has run.
    let mut supervised = registry
        .spawn(tokio::process::Command::new("sh").args(["-c", "exit 7"]))
        .unwrap();
    let supervised_pid = supervised.id().unwrap() as i32;

    // An orphan: a background sleeper whose parent shell exits at once; the sleeper is
    // re-parented to this process and exits with 3 shortly after. The shell prints its pid.
    let mut launcher = registry
        .spawn(
            tokio::process::Command::new("sh")
                .args(["-c", "(sleep 0.3; exit 3) & echo $!"])
                .stdout(std::process::Stdio::piped()),
        )
        .unwrap();
    let mut stdout = launcher.inner().stdout.take().unwrap();
    let mut pid_text = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut pid_text)
        .await
        .unwrap();
    let orphan_pid: i32 = pid_text.trim().parse().unwrap();
    assert!(launcher.wait().await.unwrap().success());

    // Both have exited and are zombies; the supervised one, spawned first, is the one
    // waitid(P_ALL) peeks at, so the reaper must find the orphan through /proc.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(zombie_state(supervised_pid), Some('Z'));
    assert_eq!(zombie_state(orphan_pid), Some('Z'));

    let reaped = reap_orphans(&registry);
    assert_eq!(
        reaped.iter().map(|r| (r.pid, r.status)).collect::<Vec<_>>(),
        [(
            orphan_pid,
            WaitStatus::Exited(nix::unistd::Pid::from_raw(orphan_pid), 3)
        )]
    );
    assert_eq!(zombie_state(orphan_pid), None, "the orphan is reaped");
    assert_eq!(
        zombie_state(supervised_pid),
        Some('Z'),
        "the supervised child is left alone"
    );

    // tokio still gets the supervised child's status (a waitpid(-1) reaper would cause ECHILD).
    let status = supervised.wait().await.unwrap();
    assert_eq!(status.code(), Some(7));
    assert!(!registry.contains(supervised_pid));

    // With the supervised child collected, the next run finds nothing, and nothing is alive.
    assert!(reap_orphans(&registry).is_empty());
    assert!(!has_living_children());
}
