//! The layers of `init/src`, checked: the platform layer imports no domain module, nothing
//! imports the boot script, no two top-level modules import each other, directly or around a
//! circle, and two seams of the boot chain hold: the state disk (`disk`) never names the node's
//! membership (`enrollment`, `kube`, `mesh`: it is given a key, nothing else), and the pivot
//! (`rootfs`) never names Kubernetes (`kube`) or the join (`enrollment`).
//!
//! ```text
//! boot ─ the script of phases over a Boot context                       (top)
//! fatal, shutdown ─ the ways down                                       (below boot)
//! enrollment, disk, rootfs, kube, mesh, supervisor, modules, config, attest  (domain)
//! platform ─ syscalls, block devices, device-mapper, random, console, … (bottom)
//! ```
//!
//! The check reads the sources (non-test code only: everything before a file's first
//! `#[cfg(test)]`, and no `tests.rs`) and collects the first path segment after each `crate::`.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The top-level modules each top-level module's non-test code names through `crate::`.
    fn imports() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in files {
            let relative = file.strip_prefix(&src).unwrap();
            let first = relative.components().next().unwrap();
            let module = first.as_os_str().to_str().unwrap().trim_end_matches(".rs");
            if ["lib", "main", "layers"].contains(&module) {
                continue;
            }
            if file.file_name().is_some_and(|name| name == "tests.rs") {
                continue; // a module's unit tests, in their own file
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let targets = graph.entry(module.to_owned()).or_default();
            for line in code.lines() {
                let line = line.split("//").next().unwrap();
                for (i, _) in line.match_indices("crate::") {
                    let rest = &line[i + "crate::".len()..];
                    let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                        // `use crate::{a, b::c}`: the group's first segments.
                        group
                            .split(',')
                            .map(|part| part.trim().split("::").next().unwrap_or(""))
                            .collect()
                    } else {
                        vec![
                            rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                                .next()
                                .unwrap(),
                        ]
                    };
                    for name in names {
                        let name = name.trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
                        if !name.is_empty() && name != module && name != "self" {
                            targets.insert(name.to_owned());
                        }
                    }
                }
            }
        }
        graph
    }

    #[test]
    fn the_platform_layer_imports_no_domain_module() {
        let graph = imports();
        assert_eq!(
            graph["platform"],
            BTreeSet::new(),
            "platform/ must import only platform/"
        );
    }

    #[test]
    fn nothing_imports_the_boot_script() {
        let graph = imports();
        let importers: Vec<&String> = graph
            .iter()
            .filter(|(_, targets)| targets.contains("boot"))
            .map(|(module, _)| module)
            .collect();
        assert!(importers.is_empty(), "boot/ is the top: {importers:?}");
    }

    #[test]
    fn the_state_disk_is_given_a_key_and_never_names_the_membership() {
        let graph = imports();
        for membership in ["enrollment", "kube", "mesh"] {
            assert!(
                !graph["disk"].contains(membership),
                "disk/ imports {membership}: {:?}",
                graph["disk"]
            );
        }
    }

    #[test]
    fn the_pivot_never_names_kubernetes_or_the_join() {
        let graph = imports();
        for domain in ["kube", "enrollment"] {
            assert!(
                !graph["rootfs"].contains(domain),
                "rootfs/ imports {domain}: {:?}",
                graph["rootfs"]
            );
        }
    }

    #[test]
    fn no_top_level_modules_import_each_other_in_a_circle() {
        // The workspace's circle search (`tiers/tests/modules.rs` runs it on every module
        // directory), on this graph of PID 1's top-level modules.
        let circle = hawser_tiers::modules::find_circle(&imports());
        assert_eq!(circle, None, "an import circle between top-level modules");
    }

    #[test]
    fn the_check_sees_imports() {
        let graph = imports();
        assert!(graph["boot"].contains("platform"), "{graph:?}");
        assert!(graph["disk"].contains("platform"), "{graph:?}");
        assert!(graph["kube"].contains("enrollment"), "{graph:?}");
        assert!(graph["rootfs"].contains("modules"), "{graph:?}");
    }
}
