//! The workspace against its tier table: every member's `Cargo.toml` read and held against the
//! rules of `hawser_tiers::check`, and the table in `docs/architecture.md` compared with the
//! table in code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use hawser_tiers::{CRATES, Kind, check, manifest, markdown_table};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn every_dependency_keeps_the_tiers() {
    let members = manifest::read_workspace(&root()).unwrap();
    let violations = check(CRATES, &members);
    assert!(
        violations.is_empty(),
        "the workspace breaks its tier table (tiers/src/lib.rs):\n{}",
        violations
            .iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_check_sees_the_workspace() {
    // The reader finds dependencies both ways they are declared, or the test above proves
    // nothing.
    let members = manifest::read_workspace(&root()).unwrap();
    let deps = |dir: &str| {
        members
            .iter()
            .find(|m| m.dir == dir)
            .unwrap_or_else(|| panic!("{dir} is not a member"))
            .dependencies
            .clone()
    };
    // `hawser-pe.workspace = true`
    assert!(
        deps("measurements")
            .iter()
            .any(|d| d.dir == "pe" && d.kind == Kind::Normal)
    );
    // `hawser-proto = { path = "../proto", … }`
    assert!(
        deps("init")
            .iter()
            .any(|d| d.dir == "proto" && d.kind == Kind::Normal)
    );
    // A dev-dependency, allowed.
    assert!(
        deps("joinservice")
            .iter()
            .any(|d| d.dir == "init" && d.kind == Kind::Dev)
    );
}

#[test]
fn the_architecture_doc_shows_the_same_table() {
    let path = root().join("docs/architecture.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let table = markdown_table(CRATES);
    assert!(
        doc.contains(&table),
        "{} does not show the tier table of tiers/src/lib.rs; it should contain, as is:\n\n{table}",
        path.display()
    );
}
