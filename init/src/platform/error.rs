//! Printing an error with its causes: a leaf every layer uses (the `FATAL:` line, warnings,
//! gRPC statuses), so it imports nothing of the crate.

use std::error::Error;
use std::fmt::Write as _;

/// An error and its sources as one line: "outer: inner: innermost".
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("no TPM device at /dev/tpmrm0")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chains_read_as_one_line() {
        let error = Outer(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            error_chain(&error),
            "no TPM device at /dev/tpmrm0: No such file or directory (os error 2)"
        );
    }
}
