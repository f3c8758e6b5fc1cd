//! The size rules for the workspace's Rust files, and the walk that finds them.
//!
//! - No non-test file in `init/` over [`INIT_LIMIT`] lines (PID 1's modules stay small enough
//!   to read whole).
//! - No non-test file anywhere over [`HARD_LIMIT`] lines.
//! - A non-test file over [`REASON_LIMIT`] lines says why in its first line: a `//!` line
//!   containing [`REASON_MARK`] and the reason, e.g.
//!   `//! The TPM, long because each command is one method of one ESAPI context.`
//!
//! Test files are exempt: files under a `tests/`, `benches/`, `examples/` or `fuzz/`
//! directory, and unit-test files named `tests.rs` or `*_tests.rs`.

use std::fmt;
use std::path::Path;

/// The most lines a non-test file in `init/` has.
pub const INIT_LIMIT: usize = 600;
/// The most lines a non-test file has.
pub const HARD_LIMIT: usize = 800;
/// Over this many lines a non-test file says why in its first line.
pub const REASON_LIMIT: usize = 700;
/// What the first line of a long file contains, followed by the reason.
pub const REASON_MARK: &str = "long because ";

/// A Rust source file of the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Its path from the workspace root, with `/` separators.
    pub path: String,
    /// Its lines.
    pub lines: usize,
    /// Its first line.
    pub first_line: String,
}

/// Whether `path` (from the workspace root) is a test file the size rules leave alone.
pub fn is_test_file(path: &str) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    let name = parts.pop().unwrap_or("");
    name == "tests.rs"
        || name.ends_with("_tests.rs")
        || parts
            .iter()
            .any(|dir| ["tests", "benches", "examples", "fuzz"].contains(dir))
}

/// Whether a first line gives the reason a long file is long.
pub fn gives_reason(first_line: &str) -> bool {
    first_line.starts_with("//!")
        && first_line
            .find(REASON_MARK)
            .is_some_and(|at| first_line[at + REASON_MARK.len()..].trim().len() >= 3)
}

/// A file that breaks a size rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeViolation {
    /// The file, from the workspace root.
    pub path: String,
    /// Its lines.
    pub lines: usize,
    /// The rule, in words.
    pub rule: &'static str,
}

impl fmt::Display for SizeViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} lines): {}", self.path, self.lines, self.rule)
    }
}

/// Every file of `files` that breaks a size rule (one violation per file: the strictest).
pub fn check(files: &[SourceFile]) -> Vec<SizeViolation> {
    let mut violations = Vec::new();
    for file in files {
        if is_test_file(&file.path) {
            continue;
        }
        let rule = if file.path.starts_with("init/") && file.lines > INIT_LIMIT {
            Some("no non-test file in init/ over 600 lines")
        } else if file.lines > HARD_LIMIT {
            Some("no non-test file over 800 lines")
        } else if file.lines > REASON_LIMIT && !gives_reason(&file.first_line) {
            Some("over 700 lines, the first line says why: `//! … long because <reason>`")
        } else {
            None
        };
        if let Some(rule) = rule {
            violations.push(SizeViolation {
                path: file.path.clone(),
                lines: file.lines,
                rule,
            });
        }
    }
    violations
}

/// The `.rs` files under each of `dirs` (relative to `root`), skipping `target` and hidden
/// directories, sorted by path.
pub fn read_sources(root: &Path, dirs: &[String]) -> std::io::Result<Vec<SourceFile>> {
    let mut files = Vec::new();
    for dir in dirs {
        walk(root, Path::new(dir), &mut files)?;
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

fn walk(root: &Path, relative: &Path, out: &mut Vec<SourceFile>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(root.join(relative))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = relative.join(&name);
        if entry.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(root, &path, out)?;
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(root.join(&path))?;
            out.push(SourceFile {
                path: path.to_string_lossy().replace('\\', "/"),
                lines: text.lines().count(),
                first_line: text.lines().next().unwrap_or("").to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, lines: usize, first_line: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            lines,
            first_line: first_line.into(),
        }
    }

    #[test]
    fn test_files_are_told_apart() {
        assert!(is_test_file("init/tests/tpm.rs"));
        assert!(is_test_file("joinservice/benches/joind.rs"));
        assert!(is_test_file("measurements/examples/fixture_uki.rs"));
        assert!(is_test_file("luks2/fuzz/fuzz_targets/parse.rs"));
        assert!(is_test_file("init/src/rootfs/plan/tests.rs"));
        assert!(is_test_file("image/src/disk/gpt_tests.rs"));
        assert!(!is_test_file("init/src/config.rs"));
        assert!(!is_test_file("luks2/src/test_support.rs"));
        assert!(!is_test_file("qemu-tests/src/lib.rs"));
    }

    #[test]
    fn each_limit_is_enforced_and_test_files_are_exempt() {
        let files = [
            file("init/src/node.rs", 601, "//! long because of many things"),
            file("init/src/ok.rs", 600, "//! ok"),
            file(
                "cli/src/big.rs",
                801,
                "//! long because it is one big table",
            ),
            file("cli/src/long.rs", 701, "//! A long file without a reason."),
            file(
                "cli/src/explained.rs",
                750,
                "//! The TPM, long because one type has them all.",
            ),
            file("cli/src/fine.rs", 700, "//! fine"),
            file("cli/tests/huge.rs", 5000, "//! a test"),
            file("init/src/disk/tests.rs", 2000, "//! unit tests"),
        ];
        let found: Vec<(String, usize)> = check(&files)
            .into_iter()
            .map(|v| (v.path, v.lines))
            .collect();
        assert_eq!(
            found,
            vec![
                ("init/src/node.rs".into(), 601),
                ("cli/src/big.rs".into(), 801),
                ("cli/src/long.rs".into(), 701),
            ]
        );
    }

    #[test]
    fn a_reason_is_a_doc_line_with_the_mark_and_some_words() {
        assert!(gives_reason(
            "//! The TPM, long because each command is one method of one ESAPI context."
        ));
        assert!(!gives_reason(
            "// The TPM, long because each command is one method."
        ));
        assert!(!gives_reason("//! The TPM, long because "));
        assert!(!gives_reason("//! The TPM and its commands."));
    }

    #[test]
    fn the_message_names_the_file_its_count_and_the_rule() {
        let violations = check(&[file("init/src/config.rs", 928, "//! PID 1's configuration")]);
        assert_eq!(
            violations[0].to_string(),
            "init/src/config.rs (928 lines): no non-test file in init/ over 600 lines"
        );
    }
}
