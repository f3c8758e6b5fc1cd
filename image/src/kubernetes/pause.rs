//! The pause binary of the sandbox image, built static from the Kubernetes tree's
//! `build/pause/linux/pause.c` with the host's gcc.
//!
//! Upstream builds it in its kube-cross container with the flags of `build/pause/Makefile`
//! (`-Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV)`, then `strip`); hawser uses the same
//! flags with Debian's gcc and static glibc (`libc6-dev`), plus what makes the output
//! independent of the build directory: the source is compiled as `pause.c` in a scratch
//! directory mapped to `.`, and no build ID. The one input not pinned by a lock is the host's
//! gcc: the cache key is the sha256 of (pause.c, the flags, `gcc --version`'s first line), so a
//! gcc upgrade rebuilds it, and the image records that key's binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::KubernetesError;
use crate::tool::{ToolError, io_error, run_tool};

/// `TAG` of the tree's `build/pause/Makefile` (Kubernetes 1.20); `-DVERSION` is
/// `v<TAG>-<Kubernetes version>`, what `pause -v` prints, as upstream's `v$(TAG)-$(REV)`.
pub const PAUSE_MAKEFILE_TAG: &str = "3.4";

/// The Makefile's `CFLAGS` but `-DVERSION`, and no build ID. The compile also maps its scratch
/// directory to `.` (`-ffile-prefix-map`), a flag outside the cache key since it names that
/// directory.
pub const PAUSE_CFLAGS: &[&str] = &["-Os", "-Wall", "-Werror", "-static", "-Wl,--build-id=none"];

/// Where the static C library must be (Debian `libc6-dev`).
const STATIC_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.a";

/// A pause binary in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseBinary {
    /// `<cache>/kubernetes-pause/<key>/pause`
    pub path: PathBuf,
    /// sha256 of (pause.c, flags, gcc version line): the cache key.
    pub key: String,
    /// Taken from the cache, not compiled now.
    pub cached: bool,
}

/// The compiler command line's flags for `kubernetes_version` (`v1.20.2`).
pub fn pause_flags(kubernetes_version: &str) -> Vec<String> {
    let mut flags: Vec<String> = PAUSE_CFLAGS.iter().map(|f| (*f).to_owned()).collect();
    flags.push(format!(
        "-DVERSION=v{PAUSE_MAKEFILE_TAG}-{kubernetes_version}"
    ));
    flags
}

/// Builds `source` (`pause.c`) static, or takes it from `<cache>/kubernetes-pause/<key>/`.
pub fn build_pause(
    source: &Path,
    kubernetes_version: &str,
    cache: &Path,
) -> Result<PauseBinary, KubernetesError> {
    let gcc = find("gcc", "gcc")?;
    let strip = find("strip", "binutils")?;
    if !Path::new(STATIC_LIBC).is_file() {
        return Err(KubernetesError::Tool {
            step: "linking pause statically".into(),
            package: "libc6-dev",
            source: ToolError::Missing {
                tool: "libc.a",
                package: "libc6-dev",
                searched: STATIC_LIBC.into(),
            },
        });
    }
    let code = std::fs::read(source).map_err(io_error("read", source))?;
    let version = run_tool(Command::new(&gcc).arg("--version").env("LC_ALL", "C"))
        .map_err(tool("gcc --version", "gcc"))?;
    let version = String::from_utf8_lossy(&version.stdout);
    let version_line = version.lines().next().unwrap_or_default();
    let flags = pause_flags(kubernetes_version);
    let key = cache_key(&code, &flags, version_line);

    let dir = cache.join("kubernetes-pause").join(&key);
    let path = dir.join("pause");
    if path.is_file() {
        return Ok(PauseBinary {
            path,
            key,
            cached: true,
        });
    }
    let scratch = dir.with_extension("building");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(io_error("create directory", &scratch))?;
    let copy = scratch.join("pause.c");
    std::fs::write(&copy, &code).map_err(io_error("write", &copy))?;
    run_tool(
        Command::new(&gcc)
            .args(&flags)
            .arg(format!("-ffile-prefix-map={}=.", scratch.display()))
            .args(["-o", "pause", "pause.c"])
            .current_dir(&scratch)
            .env("LC_ALL", "C"),
    )
    .map_err(tool("compiling pause.c", "gcc"))?;
    run_tool(Command::new(&strip).arg("pause").current_dir(&scratch))
        .map_err(tool("stripping pause", "binutils"))?;
    std::fs::remove_file(&copy).map_err(io_error("remove", &copy))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&scratch, &dir).map_err(io_error("rename the pause build to", &dir))?;
    Ok(PauseBinary {
        path,
        key,
        cached: false,
    })
}

/// sha256 over the source, the flags and gcc's version line, each length-prefixed.
fn cache_key(code: &[u8], flags: &[String], gcc_version: &str) -> String {
    let mut hasher = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    part(code);
    part(flags.join(" ").as_bytes());
    part(gcc_version.as_bytes());
    hex::encode(hasher.finalize())
}

fn find(name: &'static str, package: &'static str) -> Result<PathBuf, KubernetesError> {
    crate::locate_tool(name).ok_or_else(|| KubernetesError::Tool {
        step: format!("building pause ({name})"),
        package,
        source: ToolError::Missing {
            tool: name,
            package,
            searched: "PATH, /usr/sbin or /sbin".into(),
        },
    })
}

fn tool(step: &str, package: &'static str) -> impl FnOnce(ToolError) -> KubernetesError {
    let step = step.to_owned();
    move |source| KubernetesError::Tool {
        step,
        package,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAUSE_C: &str = r#"#include <stdio.h>
#define STRINGIFY(x) #x
#define VERSION_STRING(x) STRINGIFY(x)
int main(void) { printf("pause.c %s\n", VERSION_STRING(VERSION)); return 0; }
"#;

    #[test]
    fn the_key_changes_with_source_flags_and_compiler() {
        let flags = pause_flags("v1.20.2");
        assert!(flags.contains(&"-DVERSION=v3.4-v1.20.2".to_owned()));
        let key = cache_key(b"a", &flags, "gcc 12");
        assert_ne!(key, cache_key(b"b", &flags, "gcc 12"));
        assert_ne!(key, cache_key(b"a", &pause_flags("v1.20.3"), "gcc 12"));
        assert_ne!(key, cache_key(b"a", &flags, "gcc 13"));
    }

    #[test]
    fn two_builds_in_two_places_give_the_same_static_binary_and_the_second_is_cached() {
        if crate::test_support::find_tool("gcc", "gcc").is_none() {
            return;
        }
        let work = tempfile::tempdir().unwrap();
        let source = work.path().join("pause.c");
        std::fs::write(&source, PAUSE_C).unwrap();
        let first = build_pause(&source, "v1.20.2", &work.path().join("a")).unwrap();
        let second = build_pause(&source, "v1.20.2", &work.path().join("b")).unwrap();
        assert!(!first.cached && !second.cached);
        let bytes = std::fs::read(&first.path).unwrap();
        assert!(
            bytes == std::fs::read(&second.path).unwrap(),
            "not reproducible"
        );
        let path_text = work.path().to_string_lossy();
        let haystack = String::from_utf8_lossy(&bytes);
        assert!(
            !haystack.contains(path_text.as_ref()),
            "the build path is in the binary"
        );
        // Static: no interpreter.
        let closure = crate::closure::resolve(&first.path, &[], &[]);
        assert!(
            matches!(
                closure,
                Err(crate::closure::ClosureError::NotDynamic { .. })
            ),
            "{closure:?}"
        );
        let out = Command::new(&first.path).output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "pause.c v3.4-v1.20.2\n"
        );
        let again = build_pause(&source, "v1.20.2", &work.path().join("a")).unwrap();
        assert!(again.cached);
        assert_eq!(again.path, first.path);
    }
}
