//! For hawser's tests, not for builds: the one place that decides what a test does when a host
//! tool or an image input is missing. The project's rule is that no test skips silently:
//!
//! - with `HAWSER_REQUIRE_INPUTS` set (`scripts/test` sets it to 1 after `scripts/setup-host` and
//!   `hawser image fetch`), a missing tool or input fails the test, naming what to install or run;
//! - without it (a developer's ad-hoc `cargo test`), the test may skip that part, and says so on
//!   stderr: which test, what is missing, how to get it.
//!
//! The test suites of hawser-image, hawser-measurements and hawser-qemu use it (each already
//! depends on this crate). hawser-kmod's unit tests sit below this crate and keep a copy of the
//! same rule (`kmod/src/scan.rs`); the swtpm suites find tpm2-tools with the harness's
//! `hawser_harness::find_binary`, whose error names the package too.

use std::io::Write as _;
use std::path::PathBuf;

/// The environment variable that turns every skip into a failure.
pub const REQUIRE_INPUTS: &str = "HAWSER_REQUIRE_INPUTS";

/// How to get the image inputs into the cache.
pub const FETCH_INPUTS: &str = "run `hawser image fetch`";

/// Whether missing tools and inputs fail tests: `HAWSER_REQUIRE_INPUTS` is set to anything but
/// empty or `0`.
pub fn inputs_required() -> bool {
    std::env::var_os(REQUIRE_INPUTS).is_some_and(|value| !value.is_empty() && value != "0")
}

/// The remedy for a missing host tool: its Debian package.
pub fn install(package: &str) -> String {
    format!("install the Debian package {package} (scripts/setup-host installs it)")
}

/// `what` is missing and `remedy` gets it: fails the running test when inputs are required,
/// otherwise prints (even under libtest's output capture) that the test, or the part of it the
/// caller leaves out, is skipped. The caller returns or leaves the part out after this.
#[track_caller]
pub fn missing(what: &str, remedy: &str) {
    skip_or_fail(&format!("{what} is missing: {remedy}"));
}

/// An image input (`what`, e.g. "the trixie kernel (linux-image-*)") is not in the input cache:
/// as [`missing`], with `hawser image fetch` as the remedy.
#[track_caller]
pub fn missing_input(what: &str) {
    skip_or_fail(&format!(
        "{what} is missing from the input cache: {FETCH_INPUTS}"
    ));
}

#[track_caller]
fn skip_or_fail(message: &str) {
    assert!(
        !inputs_required(),
        "{message} ({REQUIRE_INPUTS} is set: nothing may be skipped)"
    );
    let thread = std::thread::current();
    let test = thread
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("test");
    // Straight to stderr, not `eprintln!`: libtest captures the macros' output of a passing test,
    // and a skip must be seen without `--nocapture`.
    let _ = writeln!(
        std::io::stderr(),
        "{test}: SKIPPED: {message} ({REQUIRE_INPUTS}=1 makes this a failure)"
    );
}

/// The host tool `tool` from the Debian package `package`, found in `PATH` or the sbin
/// directories (an unprivileged user's `PATH` often lacks them); `None` after [`missing`]
/// when it is not installed.
#[track_caller]
pub fn find_tool(tool: &str, package: &str) -> Option<PathBuf> {
    let found = crate::locate_tool(tool);
    if found.is_none() {
        missing(&format!("`{tool}`"), &install(package));
    }
    found
}

/// Like [`find_tool`], for tests that cannot do without the tool: a missing tool fails the test
/// whether or not inputs are required.
#[track_caller]
pub fn require_tool(tool: &str, package: &str) -> PathBuf {
    crate::locate_tool(tool).unwrap_or_else(|| panic!("`{tool}` is missing: {}", install(package)))
}

/// An error and its causes joined with `": "`, as a chain printer (`{:#}` of anyhow) shows
/// them: what a test asserts on when the text it looks for is in a cause.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_installed_tools_and_names_the_package_of_missing_ones() {
        assert!(require_tool("sh", "dash").is_absolute());
        let panic = std::panic::catch_unwind(|| require_tool("hawser-no-such-tool", "hawser-pkg"))
            .expect_err("a missing tool fails");
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert_eq!(
            message,
            "`hawser-no-such-tool` is missing: install the Debian package hawser-pkg \
             (scripts/setup-host installs it)"
        );
    }
}
