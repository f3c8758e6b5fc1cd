//! `hawser local ARGS…` hands over to the `hawser-local` binary: the one beside `hawser` first,
//! then one on PATH, with the arguments, the exit code and `--log` passed through; without
//! one, an error that says how to build it. Run with `cargo test -p hawser-cli --test local`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A copy of the `hawser` binary alone in a new directory (so that no `hawser-local` of the
/// target directory is beside it).
fn lone_hawser(dir: &Path) -> PathBuf {
    let hawser = dir.join("hawser");
    std::fs::copy(env!("CARGO_BIN_EXE_hawser"), &hawser).unwrap();
    hawser
}

/// A stand-in `hawser-local` in `dir` that prints its name, arguments and `HAWSER_LOG`, and
/// exits with 7.
fn stand_in(dir: &Path, name: &str) {
    let path = dir.join("hawser-local");
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho \"{name} $* log=$HAWSER_LOG\"\nexit 7\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run(hawser: &Path, path: &Path, args: &[&str]) -> Output {
    Command::new(hawser)
        .args(args)
        .env("PATH", path)
        .env_remove("HAWSER_LOG")
        .output()
        .unwrap()
}

/// One test at a time: each writes executables and runs them, and a binary just written is
/// "busy" (ETXTBSY) while a child that another test thread forks at that moment still holds the
/// writer's descriptor, until that child's own exec.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn hawser_local_runs_the_binary_beside_it_with_every_argument_and_its_exit_code() {
    let _serial = serial();
    let bin = tempfile::tempdir().unwrap();
    let on_path = tempfile::tempdir().unwrap();
    let hawser = lone_hawser(bin.path());
    stand_in(bin.path(), "beside");
    stand_in(on_path.path(), "on-path");

    let output = run(
        &hawser,
        on_path.path(),
        &["--log", "debug", "local", "up", "--nodes", "3", "--help"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout, "beside up --nodes 3 --help log=debug\n");
    assert_eq!(
        output.status.code(),
        Some(7),
        "the exit code passes through"
    );

    // Not beside it: the one on PATH.
    std::fs::remove_file(bin.path().join("hawser-local")).unwrap();
    let output = run(&hawser, on_path.path(), &["local", "--help"]);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "on-path --help log=\n",
        "no --log given: none passed on"
    );
    assert_eq!(output.status.code(), Some(7));
}

#[test]
fn hawser_local_without_the_binary_says_how_to_build_it() {
    let _serial = serial();
    let bin = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let hawser = lone_hawser(bin.path());
    let output = run(&hawser, empty.path(), &["local", "status"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cargo build -p hawser-local") && stderr.contains("scripts/local-up"),
        "{stderr}"
    );
}

#[test]
fn hawser_help_still_lists_local() {
    let _serial = serial();
    let output = Command::new(env!("CARGO_BIN_EXE_hawser"))
        .arg("--help")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("local ") && l.contains("QEMU")),
        "{stdout}"
    );
}
