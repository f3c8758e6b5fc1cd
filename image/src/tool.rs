//! What the builder's modules share for the host: finding a tool, running it, and the I/O
//! error that names the file. One error type each, which the module errors carry as a
//! `#[source]` (or wrap transparently, for [`IoError`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

/// How many of a failed tool's last output lines an error keeps.
const OUTPUT_TAIL_LINES: usize = 20;

/// Why a host tool could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The tool is not installed where the builder looks for it.
    #[error(
        "`{tool}` was not found in {searched}; install the Debian package `{package}` (scripts/setup-host installs every tool the build needs)"
    )]
    Missing {
        tool: &'static str,
        package: &'static str,
        /// Where it was looked for, e.g. `PATH, /usr/sbin or /sbin`.
        searched: String,
    },
    /// The tool could not be started or waited for.
    #[error("could not run `{tool}`")]
    Spawn {
        tool: String,
        #[source]
        source: io::Error,
    },
    /// The tool ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}); its last output:\n{output_tail}")]
    Failed {
        /// The command line, program and arguments.
        command: String,
        status: ExitStatus,
        /// The last lines of its stdout and stderr, or where its output went instead.
        output_tail: String,
    },
}

/// A file or directory could not be read, written or listed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}", path.display())]
pub struct IoError {
    /// What was being done: "read", "write", "create directory", "rename the image to", …
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// An [`IoError`] on `path` while doing `action`, for `map_err`.
pub(crate) fn io_error(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> IoError + use<> {
    let path = path.to_path_buf();
    move |source| IoError {
        action,
        path,
        source,
    }
}

/// Finds a host tool in the `:`-separated `dirs` only (the rootfs build pins its tools' `PATH`).
pub(crate) fn find_tool_in(
    dirs: &str,
    tool: &'static str,
    package: &'static str,
) -> Result<PathBuf, ToolError> {
    dirs.split(':')
        .map(|dir| Path::new(dir).join(tool))
        .find(|p| p.is_file())
        .ok_or_else(|| ToolError::Missing {
            tool,
            package,
            searched: dirs.to_owned(),
        })
}

/// Runs a short tool to completion with no stdin, capturing its output; a failure carries the
/// command line, the exit status and the last lines of its output.
pub(crate) fn run_tool(command: &mut Command) -> Result<Output, ToolError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ToolError::Spawn {
            tool: command.get_program().to_string_lossy().into_owned(),
            source,
        })?;
    if output.status.success() {
        return Ok(output);
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Err(ToolError::Failed {
        command: command_line(command),
        status: output.status,
        output_tail: tail(text.trim(), OUTPUT_TAIL_LINES),
    })
}

/// `program arg…`, for messages.
pub(crate) fn command_line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(err: &dyn std::error::Error) -> String {
        let mut text = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            text = format!("{text}: {cause}");
            source = cause.source();
        }
        text
    }

    #[test]
    fn a_failing_tool_reports_its_command_status_and_last_output() {
        let mut command = Command::new("sh");
        command.args(["-c", "seq 1 30; echo oops >&2; exit 3"]);
        let err = run_tool(&mut command).unwrap_err();
        let ToolError::Failed {
            command,
            status,
            output_tail,
        } = &err
        else {
            panic!("expected Failed, got {err}");
        };
        assert_eq!(command, "sh -c seq 1 30; echo oops >&2; exit 3");
        assert_eq!(status.code(), Some(3));
        let lines: Vec<&str> = output_tail.lines().collect();
        assert_eq!(lines.len(), OUTPUT_TAIL_LINES);
        assert_eq!(lines.first(), Some(&"12"));
        assert_eq!(lines.last(), Some(&"oops"));
    }

    #[test]
    fn missing_and_unstartable_tools_are_named() {
        let err = find_tool_in("/nonexistent", "no-such-tool", "no-such-package").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("`no-such-tool`") && text.contains("`no-such-package`"),
            "{text}"
        );
        let err = run_tool(&mut Command::new("/nonexistent/tool")).unwrap_err();
        assert!(matches!(err, ToolError::Spawn { .. }), "{err}");
        // The cause travels as the source, once.
        let text = chain(&err);
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
    }

    #[test]
    fn io_errors_name_action_and_path_and_carry_the_cause() {
        let err = std::fs::read("/nonexistent/file")
            .map_err(io_error("read", Path::new("/nonexistent/file")));
        let err = err.unwrap_err();
        assert_eq!(err.to_string(), "cannot read /nonexistent/file");
        assert!(chain(&err).ends_with("No such file or directory (os error 2)"));
    }
}
