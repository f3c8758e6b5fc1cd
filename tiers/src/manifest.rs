//! Reading the workspace's manifests: the root `Cargo.toml`'s members and path dependencies,
//! and each member's package name and dependencies on other members, as [`Member`]s.
//!
//! A dependency is a member's when it resolves to a member's directory: `x.workspace = true`
//! through the root's `[workspace.dependencies]` (by its key, as cargo resolves it), or
//! `path = "../x"` relative to the member. Registry crates are left out. `[dependencies]`,
//! `[build-dependencies]`, `[dev-dependencies]` and their `[target.'cfg(…)'.…]` forms are all
//! read; optional dependencies count as normal ones.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use crate::{Dependency, Kind, Member};

/// Why the manifests could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A manifest could not be read from the disk.
    #[error("cannot read {path}")]
    Read {
        /// The manifest.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: std::io::Error,
    },
    /// A manifest is not TOML.
    #[error("{path} is not valid TOML")]
    Parse {
        /// The manifest.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: toml::de::Error,
    },
    /// A manifest lacks something every hawser manifest has, or has it in another shape.
    #[error("{path}: {what}")]
    Shape {
        /// The manifest.
        path: PathBuf,
        /// What is missing or malformed.
        what: String,
    },
}

fn read_toml(path: &Path) -> Result<toml::Table, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse::<toml::Table>()
        .map_err(|source| ManifestError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

/// `path` joined to `base` and reduced lexically (`a/../b` is `b`), with `/` separators.
fn normalize(base: &str, path: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for component in Path::new(base).join(path).components() {
        match component {
            Component::ParentDir => {
                parts.pop();
            }
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    parts.join("/")
}

/// The workspace under `root`: its members, in the order the root `Cargo.toml` lists them.
pub fn read_workspace(root: &Path) -> Result<Vec<Member>, ManifestError> {
    let root_path = root.join("Cargo.toml");
    let shape = |what: &str| ManifestError::Shape {
        path: root_path.clone(),
        what: what.to_owned(),
    };
    let manifest = read_toml(&root_path)?;
    let workspace = manifest
        .get("workspace")
        .and_then(|w| w.as_table())
        .ok_or_else(|| shape("no [workspace] table"))?;
    let members: Vec<String> = workspace
        .get("members")
        .and_then(|m| m.as_array())
        .ok_or_else(|| shape("no workspace.members list"))?
        .iter()
        .map(|m| m.as_str().map(|dir| normalize("", dir)))
        .collect::<Option<_>>()
        .ok_or_else(|| shape("a workspace member is not a string"))?;
    if members.iter().any(|m| m.contains('*')) {
        return Err(shape("a glob in workspace.members (list each member)"));
    }
    // Workspace dependencies by key, as the directory their path points at.
    let mut inherited = BTreeMap::new();
    if let Some(deps) = workspace.get("dependencies").and_then(|d| d.as_table()) {
        for (key, spec) in deps {
            if let Some(path) = spec.get("path").and_then(|p| p.as_str()) {
                inherited.insert(key.clone(), normalize("", path));
            }
        }
    }
    members
        .iter()
        .map(|dir| read_member(root, dir, &inherited))
        .collect()
}

fn read_member(
    root: &Path,
    dir: &str,
    inherited: &BTreeMap<String, String>,
) -> Result<Member, ManifestError> {
    let path = root.join(dir).join("Cargo.toml");
    let manifest = read_toml(&path)?;
    let package = manifest
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .ok_or_else(|| ManifestError::Shape {
            path: path.clone(),
            what: "no package.name".into(),
        })?
        .to_owned();
    let mut tables: Vec<&toml::Table> = vec![&manifest];
    if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
        tables.extend(targets.values().filter_map(|t| t.as_table()));
    }
    let mut dependencies = Vec::new();
    for table in tables {
        for (section, kind) in [
            ("dependencies", Kind::Normal),
            ("build-dependencies", Kind::Build),
            ("dev-dependencies", Kind::Dev),
        ] {
            let Some(deps) = table.get(section).and_then(|d| d.as_table()) else {
                continue;
            };
            for (key, spec) in deps {
                let target = if let Some(local) = spec.get("path").and_then(|p| p.as_str()) {
                    Some(normalize(dir, local))
                } else if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true) {
                    inherited.get(key).cloned()
                } else {
                    None
                };
                if let Some(target) = target {
                    dependencies.push(Dependency { dir: target, kind });
                }
            }
        }
    }
    dependencies.sort();
    dependencies.dedup();
    Ok(Member {
        dir: dir.to_owned(),
        package,
        dependencies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_reduced_to_the_member_directory() {
        assert_eq!(normalize("cli", "../qemu-tests"), "qemu-tests");
        assert_eq!(normalize("mesh-device", "."), "mesh-device");
        assert_eq!(normalize("", "./pcr/"), "pcr");
        assert_eq!(normalize("a/b", "../../c"), "c");
    }

    #[test]
    fn workspace_and_path_dependencies_are_found_and_registry_ones_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(
            root.join("Cargo.toml"),
            r#"
[workspace]
members = ["low", "high"]
[workspace.dependencies]
hawser-low = { path = "low" }
serde = "1"
"#,
        )
        .unwrap();
        std::fs::create_dir_all(root.join("low")).unwrap();
        std::fs::create_dir_all(root.join("high")).unwrap();
        std::fs::write(
            root.join("low/Cargo.toml"),
            "[package]\nname = \"hawser-low\"\n[dependencies]\nserde.workspace = true\n",
        )
        .unwrap();
        std::fs::write(
            root.join("high/Cargo.toml"),
            r#"
[package]
name = "hawser-high"
[dependencies]
hawser-low = { workspace = true, features = ["x"] }
serde.workspace = true
[build-dependencies]
renamed = { package = "hawser-low", path = "../low" }
[target.'cfg(unix)'.dev-dependencies]
hawser-high = { path = "." }
"#,
        )
        .unwrap();
        let members = read_workspace(root).unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(members[0].package, "hawser-low");
        assert_eq!(members[0].dependencies, vec![]);
        assert_eq!(members[1].dir, "high");
        assert_eq!(
            members[1].dependencies,
            vec![
                Dependency {
                    dir: "high".into(),
                    kind: Kind::Dev
                },
                Dependency {
                    dir: "low".into(),
                    kind: Kind::Normal
                },
                Dependency {
                    dir: "low".into(),
                    kind: Kind::Build
                },
            ]
        );
    }

    #[test]
    fn a_broken_manifest_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(
            root.join("Cargo.toml"),
            "[workspace]\nmembers = [\"gone\"]\n",
        )
        .unwrap();
        let error = read_workspace(root).unwrap_err();
        assert!(error.to_string().contains("gone/Cargo.toml"), "{error}");
        std::fs::write(root.join("Cargo.toml"), "[package]\n").unwrap();
        let error = read_workspace(root).unwrap_err();
        assert!(
            error.to_string().contains("no [workspace] table"),
            "{error}"
        );
    }
}
