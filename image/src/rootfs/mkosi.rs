//! mkosi, which builds the Debian tree from the locked packages only.

use std::collections::{BTreeMap, VecDeque};
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{RootfsError, TOOL_PATH, TREE_DIR, find_tool};
use crate::tool::{self, ToolError, io_error};

fn read_manifest(manifest: &Path) -> Result<(String, serde_json::Value), RootfsError> {
    let text = std::fs::read_to_string(manifest).map_err(io_error("read", manifest))?;
    let json = serde_json::from_str(&text).map_err(|source| RootfsError::Manifest {
        path: manifest.to_owned(),
        source,
    })?;
    Ok((text, json))
}

/// Package name → version of every package in mkosi's JSON manifest.
pub fn manifest_packages(manifest: &Path) -> Result<BTreeMap<String, String>, RootfsError> {
    let (text, json) = read_manifest(manifest)?;
    let packages = json["packages"]
        .as_array()
        .ok_or_else(|| RootfsError::ToolOutput {
            tool: "mkosi",
            what: "package list in its manifest",
            output: tool::tail(&text, 10),
        })?;
    Ok(packages
        .iter()
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_owned(),
                p["version"].as_str()?.to_owned(),
            ))
        })
        .collect())
}

/// Strips ANSI colour sequences.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What usually makes mkosi fail.
const MKOSI_HINT: &str = "mkosi needs root (or user namespaces) and its dependencies from \
                          bookworm-backports (run scripts/setup-host); `hawser image lock` also needs \
                          deb.debian.org. If apt could not find a package, rootfs.lock lacks it: re-pin \
                          with `hawser image lock --only rootfs`";

/// One mkosi build of the tree.
pub(super) struct MkosiRun<'a> {
    /// Holds `mkosi.conf` and `mkosi.pkgmngr/`.
    pub workspace: &'a Path,
    /// Where the tree and mkosi's manifest go.
    pub out_dir: &'a Path,
    /// hawser's cache: mkosi's package cache and scratch space go under it.
    pub cache_dir: &'a Path,
    pub source_date_epoch: u64,
    /// A local repository to install from (`--local-mirror`), or `None`: the live archive.
    pub local_mirror: Option<&'a Path>,
    /// Package manager trees applied after the workspace's `mkosi.pkgmngr/`, in order (a file
    /// of a later tree replaces the same file of an earlier one).
    pub package_manager_trees: Vec<PathBuf>,
}

/// Runs mkosi, streaming its phases to `progress`; returns the tree.
pub(super) fn run_mkosi(
    run: &MkosiRun<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, RootfsError> {
    let mkosi = find_tool("mkosi", "mkosi (bookworm-backports)")?;
    let package_cache = run.cache_dir.join("mkosi");
    std::fs::create_dir_all(&package_cache)
        .map_err(io_error("create directory", &package_cache))?;
    // mkosi's scratch space: never inside the source tree (mkosi refuses that, and an output
    // directory under `target/` is), and off tmpfs (the tree is hundreds of MiB).
    let scratch = run.cache_dir.join("mkosi-workspace");
    std::fs::create_dir_all(&scratch).map_err(io_error("create directory", &scratch))?;
    let mut cmd = Command::new(&mkosi);
    cmd.current_dir(run.workspace)
        .arg("--directory")
        .arg(run.workspace)
        .arg("--force")
        .arg(format!("--source-date-epoch={}", run.source_date_epoch))
        .arg(format!("--output-dir={}", run.out_dir.display()))
        .arg(format!("--workspace-dir={}", scratch.display()))
        .arg(format!("--package-cache-dir={}", package_cache.display()));
    if let Some(mirror) = run.local_mirror {
        cmd.arg(format!("--local-mirror=file://{}", mirror.display()));
    }
    for tree in &run.package_manager_trees {
        cmd.arg(format!("--package-manager-tree={}", tree.display()));
    }
    cmd.arg("build")
        .env("PATH", TOOL_PATH)
        .env("PYTHONUNBUFFERED", "1")
        .env("SOURCE_DATE_EPOCH", run.source_date_epoch.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    progress(&format!(
        "rootfs: mkosi build (Debian {}, package cache {})",
        match run.local_mirror {
            Some(mirror) => format!("packages from {}", mirror.display()),
            None => "packages from the live archive".to_owned(),
        },
        package_cache.display()
    ));
    tracing::info!(workspace = %run.workspace.display(), "running mkosi");
    let spawn_error = |source| RootfsError::Step {
        step: "mkosi build",
        hint: MKOSI_HINT,
        source: ToolError::Spawn {
            tool: "mkosi".into(),
            source,
        },
    };
    let mut child = cmd.spawn().map_err(spawn_error)?;

    // Both streams into one channel, read on this thread (progress is not Send).
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let mut readers = Vec::new();
    let streams: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ];
    for stream in streams.into_iter().flatten() {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);

    const HEARTBEAT: Duration = Duration::from_secs(10);
    let mut recent: VecDeque<String> = VecDeque::with_capacity(40);
    let mut last_said = Instant::now();
    let mut packages = 0usize;
    loop {
        match rx.recv_timeout(HEARTBEAT) {
            Ok(line) => {
                let line = plain(&line);
                if line.starts_with("Unpacking ") {
                    packages += 1;
                }
                let trimmed = line.trim();
                if let Some(phase) = trimmed.strip_prefix('‣') {
                    progress(&format!("rootfs: mkosi: {}", phase.trim()));
                    last_said = Instant::now();
                } else if last_said.elapsed() >= HEARTBEAT && !trimmed.is_empty() {
                    progress(&format!(
                        "rootfs: mkosi: … {trimmed} ({packages} packages unpacked)"
                    ));
                    last_said = Instant::now();
                }
                if recent.len() == 40 {
                    recent.pop_front();
                }
                recent.push_back(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                progress("rootfs: mkosi: … still working");
                last_said = Instant::now();
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = child.wait().map_err(spawn_error)?;
    if !status.success() {
        return Err(RootfsError::Step {
            step: "mkosi build",
            hint: MKOSI_HINT,
            source: ToolError::Failed {
                command: format!("mkosi (in {})", run.workspace.display()),
                status,
                output_tail: Vec::from(recent).join("\n"),
            },
        });
    }
    let tree = run.out_dir.join(TREE_DIR);
    if !tree.join("usr").is_dir() {
        return Err(RootfsError::NoTree { path: tree });
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_sequences_are_stripped() {
        assert_eq!(plain("\u{1b}[1m‣ Installing\u{1b}[0m"), "‣ Installing");
    }
}
