//! No import circles between the modules of one directory, in any crate of the workspace
//! (`hawser_tiers::modules`): `init/src/layers.rs`'s rule for PID 1's top-level modules, for
//! every module directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hawser_tiers::{manifest, modules};

#[test]
fn no_modules_of_one_directory_import_each_other_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut circles = Vec::new();
    let mut seen = 0;
    for member in manifest::read_workspace(root).unwrap() {
        let src = root.join(&member.dir).join("src");
        if !src.is_dir() {
            continue;
        }
        for dir in modules::read_crate(&src).unwrap() {
            seen += 1;
            if let Some(circle) = modules::find_circle(&modules::graph(&dir)) {
                let at = if dir.path.is_empty() {
                    format!("{}/src", member.dir)
                } else {
                    format!("{}/src/{}", member.dir, dir.path.replace("::", "/"))
                };
                circles.push(format!("  {at}: {}", circle.join(" → ")));
            }
        }
    }
    assert!(seen > 20, "the walk found only {seen} module directories");
    assert!(
        circles.is_empty(),
        "modules importing each other around a circle (move the shared item into a module \
         both import):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_check_sees_the_luks2_and_disk_image_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let luks2 = modules::read_crate(&root.join("luks2/src")).unwrap();
    let graph = modules::graph(&luks2[0]);
    assert!(graph["parse"].contains("copy_error"), "{graph:?}");
    assert!(graph["binary"].contains("copy_error"), "{graph:?}");
    let image = modules::read_crate(&root.join("image/src")).unwrap();
    let disk = image.iter().find(|d| d.path == "disk").unwrap();
    let graph = modules::graph(disk);
    assert!(graph["gpt"].contains("fat"), "{graph:?}");
    assert!(graph["fat"].contains("plan"), "{graph:?}");
}
