//! The size rules over every Rust file of the workspace's members (`hawser_tiers::sizes`): no
//! non-test file in `init/` over 600 lines, none over 800, and one over 700 says why in its
//! first line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hawser_tiers::{manifest, sizes};

#[test]
fn every_source_file_keeps_the_size_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let members = manifest::read_workspace(root).unwrap();
    let dirs: Vec<String> = members.into_iter().map(|m| m.dir).collect();
    let files = sizes::read_sources(root, &dirs).unwrap();
    assert!(
        files.iter().any(|f| f.path == "init/src/main.rs"),
        "the walk found no init/src/main.rs"
    );
    let violations = sizes::check(&files);
    assert!(
        violations.is_empty(),
        "{} files break the size rules (docs/architecture.md, \"File size\"):\n{}",
        violations.len(),
        violations
            .iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
