//! Unit tests of the module-circle check: what counts as an import, and circles found.

use super::*;

fn dir(path: &str, parent: &str, children: &[(&str, usize, &str)]) -> ModuleDir {
    let mut out = ModuleDir {
        path: path.into(),
        parent: non_test_code(parent),
        children: BTreeMap::new(),
    };
    for (name, depth, code) in children {
        out.children
            .entry((*name).to_owned())
            .or_default()
            .push((*depth, non_test_code(code)));
    }
    out
}

fn edges(graph: &Graph, module: &str) -> Vec<String> {
    graph[module].iter().cloned().collect()
}

#[test]
fn the_old_luks2_circle_is_found() {
    // parse.rs defined CopyError; binary.rs and metadata.rs returned it.
    let luks2 = dir(
        "",
        "mod binary;\nmod metadata;\nmod parse;\npub use parse::{CopyError, HeaderCopy};",
        &[
            ("binary", 0, "use crate::parse::CopyError;"),
            ("metadata", 0, "use crate::parse::CopyError;"),
            (
                "parse",
                0,
                "use crate::binary::{be_u16, c_string};\nuse crate::metadata::Metadata;",
            ),
        ],
    );
    let graph = graph(&luks2);
    assert_eq!(edges(&graph, "parse"), ["binary", "metadata"]);
    let circle = find_circle(&graph).unwrap();
    assert_eq!(circle.first(), circle.last());
    assert!(circle.contains(&"parse".to_owned()), "{circle:?}");
}

#[test]
fn an_import_through_a_reexport_counts() {
    // metadata.rs named `crate::NewHeader`, which lib.rs re-exported from write.rs.
    let luks2 = dir(
        "",
        "mod metadata;\nmod write;\npub use write::{\n    NewHeader, new_header_copy,\n};",
        &[
            ("metadata", 0, "use crate::{HeaderSlot, NewHeader};"),
            ("write", 0, "use crate::metadata::json_area;"),
        ],
    );
    let graph = graph(&luks2);
    assert_eq!(edges(&graph, "metadata"), ["write"]);
    assert_eq!(
        find_circle(&graph),
        Some(vec!["metadata".into(), "write".into(), "metadata".into()])
    );
}

#[test]
fn the_old_image_disk_circle_is_found_through_super() {
    let disk = dir(
        "disk",
        "mod fat;\nmod gpt;\npub use gpt::build_gpt_disk;",
        &[
            (
                "fat",
                0,
                "use super::gpt::Planned;\nuse super::{DiskError, MIB};",
            ),
            ("gpt", 0, "use super::fat::{fat_partition_bytes, make_fat};"),
        ],
    );
    let graph = graph(&disk);
    assert_eq!(edges(&graph, "fat"), ["gpt"]);
    assert!(find_circle(&graph).is_some());
}

#[test]
fn a_shared_module_below_both_breaks_the_circle() {
    let disk = dir(
        "disk",
        "mod fat;\nmod gpt;\nmod plan;",
        &[
            ("fat", 0, "use super::plan::Planned;"),
            (
                "gpt",
                0,
                "use super::fat::make_fat;\nuse crate::disk::plan::Planned;",
            ),
            ("plan", 0, "use super::PartitionSpec;"),
        ],
    );
    let graph = graph(&disk);
    assert_eq!(edges(&graph, "gpt"), ["fat", "plan"]);
    assert_eq!(find_circle(&graph), None);
}

#[test]
fn deeper_files_reach_siblings_one_super_further_up() {
    let root = dir(
        "",
        "",
        &[
            (
                "boot",
                1,
                "use super::phases::x;\nuse super::super::disk::Plan;",
            ),
            ("disk", 0, "use crate::platform::dm;"),
            ("platform", 0, ""),
        ],
    );
    let graph = graph(&root);
    // `super::phases` from boot/phases.rs's sibling is inside boot: not an edge.
    assert_eq!(edges(&graph, "boot"), ["disk"]);
    assert_eq!(edges(&graph, "disk"), ["platform"]);
}

#[test]
fn comments_tests_and_macro_paths_are_not_imports() {
    let root = dir(
        "",
        "",
        &[
            (
                "a",
                0,
                "// see crate::b::thing\nmacro_rules! m { () => { $crate::b::f() } }\n\
                 /// [`crate::b`]\nfn f() {}\n#[cfg(test)]\nmod tests { use crate::b::g; }",
            ),
            ("b", 0, "use crate::a::f;"),
        ],
    );
    let graph = graph(&root);
    assert!(graph["a"].is_empty(), "{graph:?}");
    assert_eq!(find_circle(&graph), None);
}
