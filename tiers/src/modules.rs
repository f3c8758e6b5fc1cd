//! No import circles between the modules of one directory, in any crate: the check
//! `init/src/layers.rs` makes for PID 1's top-level modules, for every module directory of the
//! workspace (a crate's `src/`, and every `src/…/x/` of a module `x`).
//!
//! The check reads non-test code only (everything before a file's first `#[cfg(test)]`, and no
//! `tests.rs` or `*_tests.rs`) and, for each sibling module `x` of a directory, collects which
//! siblings its files name: through `crate::<dir>::y`, through `super::y` (`super::super::y`
//! one level further down), or through an item the directory's own module re-exports with
//! `pub use y::…` (so `use crate::NewHeader` counts as an import of the module defining it).
//! Comments are ignored; macros' `$crate::` paths are not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name → the sibling modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// One module directory's sources: the directory's own module file (`lib.rs`, `main.rs`,
/// `mod.rs` or `../x.rs`) and, per child module, its files with their depth below the
/// directory (0 for `x.rs` and `x/mod.rs`, 1 for `x/y.rs`, …).
#[derive(Debug, Default, Clone)]
pub struct ModuleDir {
    /// The directory's path inside its crate, as `crate::` paths spell it (`""` for `src/`,
    /// `"disk"` for `src/disk/`, `"a::b"` for `src/a/b/`).
    pub path: String,
    /// The non-test code of the directory's own module file.
    pub parent: String,
    /// Child module → (depth, non-test code) of each of its files.
    pub children: BTreeMap<String, Vec<(usize, String)>>,
}

/// The part of a source file the check reads: before its first `#[cfg(test)]`, comments
/// removed.
pub fn non_test_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers a `use` tree or path continuation starting at `rest` names first:
/// `a::b` gives `a`, `{a, b::c}` gives `a` and `b`.
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim()
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    if let Some(group) = rest.strip_prefix('{') {
        let group = group.split('}').next().unwrap_or("");
        group
            .split(',')
            .map(ident)
            .filter(|s| !s.is_empty())
            .collect()
    } else {
        let first = ident(rest);
        if first.is_empty() {
            vec![]
        } else {
            vec![first]
        }
    }
}

/// The names after each occurrence of `prefix` in `code` that starts a path (not preceded by
/// an identifier character or `$`).
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
            continue;
        }
        names.extend(first_segments(&code[at + prefix.len()..]));
    }
    names
}

/// Which child module each item the directory's module re-exports (`pub use x::…;`,
/// `pub(crate) use x::…;`) comes from.
fn reexports(parent: &str, children: &BTreeSet<&str>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for statement in parent.split(';') {
        let statement = statement.trim();
        let Some(at) = statement.find("use ") else {
            continue;
        };
        if !statement[..at].trim_start().starts_with("pub") {
            continue;
        }
        let tree = statement[at + "use ".len()..].trim();
        let tree = tree.strip_prefix("self::").unwrap_or(tree);
        let module = tree
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or("");
        if !children.contains(module) {
            continue;
        }
        let rest = &tree[module.len()..];
        for word in rest.split(|c: char| !c.is_alphanumeric() && c != '_') {
            if !word.is_empty() && word != "self" && word != "as" {
                map.insert(word.to_owned(), module.to_owned());
            }
        }
    }
    map
}

/// The import graph between the child modules of one directory.
pub fn graph(dir: &ModuleDir) -> Graph {
    let children: BTreeSet<&str> = dir.children.keys().map(String::as_str).collect();
    let reexported = reexports(&dir.parent, &children);
    let crate_prefix = if dir.path.is_empty() {
        "crate::".to_owned()
    } else {
        format!("crate::{}::", dir.path)
    };
    let mut graph = Graph::new();
    for (module, files) in &dir.children {
        let targets = graph.entry(module.clone()).or_default();
        for (depth, code) in files {
            let mut names = names_after(code, &crate_prefix);
            names.extend(names_after(code, &"super::".repeat(depth + 1)));
            for name in names {
                let target = if children.contains(name.as_str()) {
                    Some(name)
                } else {
                    reexported.get(&name).cloned()
                };
                if let Some(target) = target.filter(|t| t != module) {
                    targets.insert(target);
                }
            }
        }
    }
    graph
}

/// A circle in `graph` (its modules, the first repeated at the end), if there is one.
pub fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

fn is_test_name(name: &str) -> bool {
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// Every module directory under a crate's `src` (the directory itself first).
pub fn read_crate(src: &Path) -> std::io::Result<Vec<ModuleDir>> {
    let mut dirs = Vec::new();
    let parent = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| src.join(name))
        .find(|path| path.exists());
    read_dir(src, "", parent.as_deref(), &mut dirs)?;
    Ok(dirs)
}

fn read_code(path: &Path) -> std::io::Result<String> {
    Ok(non_test_code(&std::fs::read_to_string(path)?))
}

fn read_dir(
    dir: &Path,
    path: &str,
    parent_file: Option<&Path>,
    out: &mut Vec<ModuleDir>,
) -> std::io::Result<()> {
    let mut module = ModuleDir {
        path: path.to_owned(),
        parent: match parent_file {
            Some(file) => read_code(file)?,
            None => String::new(),
        },
        children: BTreeMap::new(),
    };
    let mut subdirs = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            if name == "bin" && path.is_empty() {
                continue; // separate binaries, each a crate of its own
            }
            let mut files = Vec::new();
            collect(&entry.path(), 0, &mut files)?;
            module
                .children
                .entry(name.clone())
                .or_default()
                .extend(files);
            subdirs.push(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            // The directory's own module file, or a module's unit tests.
            if ["lib", "main", "mod"].contains(&stem) || is_test_name(&name) {
                continue;
            }
            let code = read_code(&entry.path())?;
            module
                .children
                .entry(stem.to_owned())
                .or_default()
                .push((0, code));
        }
    }
    out.push(module);
    for name in subdirs {
        let sub = dir.join(&name);
        let parent = [sub.join("mod.rs"), dir.join(format!("{name}.rs"))]
            .into_iter()
            .find(|p| p.exists());
        let sub_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}::{name}")
        };
        read_dir(&sub, &sub_path, parent.as_deref(), out)?;
    }
    Ok(())
}

/// The non-test files under a child module's directory with their depth (`mod.rs` at the
/// directory's own depth).
fn collect(dir: &Path, depth: usize, out: &mut Vec<(usize, String)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            collect(&entry.path(), depth + 1, out)?;
        } else if name.ends_with(".rs") && !is_test_name(&name) {
            let file_depth = if name == "mod.rs" { depth } else { depth + 1 };
            out.push((file_depth, read_code(&entry.path())?));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
