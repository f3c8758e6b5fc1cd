//! Resolving modules straight from a kernel package's modules directory.
//!
//! Debian's `linux-image-*` packages ship `modules.order` and `modules.builtin` but no
//! `modules.dep`: `depmod` writes it at install time, and the image is never installed. Each
//! module's dependencies are in its own `.modinfo` section (`depends=a,b`), which is what depmod
//! reads too, so the closure of the modules PID 1 needs is computed from those, reading only the
//! modules in the closure.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use object::{Object, ObjectSection};

use crate::{KmodError, ModuleIndex, normalize_name};

impl ModuleIndex {
    /// Builds the index of exactly the modules needed for `names` (and their dependencies) from
    /// a kernel modules directory such as `usr/lib/modules/6.12.117+deb13-cloud-amd64`.
    pub fn scan_modules_dir(dir: &Path, names: &[&str]) -> Result<Self, KmodError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| KmodError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        let builtin: BTreeSet<String> = read("modules.builtin")?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(normalize_name)
            .collect();
        // modules.order names `foo.ko`; the package ships `foo.ko.xz` (or plain `.ko`).
        let mut by_name = BTreeMap::new();
        for line in read("modules.order")?.lines().map(str::trim) {
            if line.is_empty() {
                continue;
            }
            let on_disk = [format!("{line}.xz"), line.to_owned()]
                .into_iter()
                .find(|p| dir.join(p).is_file());
            if let Some(path) = on_disk {
                by_name.insert(normalize_name(line), path);
            }
        }

        let mut entries: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        let mut pending: Vec<String> = names.iter().map(|n| normalize_name(n)).collect();
        while let Some(name) = pending.pop() {
            if entries.contains_key(&name) || builtin.contains(&name) {
                continue;
            }
            let path = by_name
                .get(&name)
                .ok_or_else(|| KmodError::UnknownModule { name: name.clone() })?;
            let depends = modinfo_depends(&dir.join(path))?;
            let mut dep_paths = Vec::new();
            for dep in depends {
                let dep = normalize_name(&dep);
                if builtin.contains(&dep) {
                    continue;
                }
                let dep_path = by_name
                    .get(&dep)
                    .ok_or_else(|| KmodError::UnknownModule { name: dep.clone() })?;
                dep_paths.push(dep_path.clone());
                pending.push(dep);
            }
            entries.insert(name, (path.clone(), dep_paths));
        }
        Ok(Self::from_entries(entries.into_values(), builtin))
    }
}

/// A module file's ELF bytes: `.ko` as it is, `.ko.xz` decompressed.
pub fn read_module(path: &Path) -> Result<Vec<u8>, KmodError> {
    let raw = std::fs::read(path).map_err(|source| KmodError::Read {
        path: path.display().to_string(),
        source,
    })?;
    if path.extension().is_none_or(|e| e != "xz") {
        return Ok(raw);
    }
    let mut out = Vec::new();
    xz2::read::XzDecoder::new(raw.as_slice())
        .read_to_end(&mut out)
        .map_err(|source| KmodError::Xz {
            path: path.display().to_string(),
            source,
        })?;
    Ok(out)
}

/// The plain module's path for a compressed one: `kernel/fs/erofs/erofs.ko.xz` →
/// `kernel/fs/erofs/erofs.ko`; a `.ko` path is returned as it is.
pub fn decompressed_path(path: &str) -> &str {
    path.strip_suffix(".xz").unwrap_or(path)
}

/// The `depends=` list of a module file (`.ko` or `.ko.xz`).
pub fn modinfo_depends(path: &Path) -> Result<Vec<String>, KmodError> {
    let bad = |reason: String| KmodError::BadModule {
        path: path.display().to_string(),
        reason,
    };
    let elf = read_module(path)?;
    let elf_error = |part: &'static str| {
        move |source| KmodError::Elf {
            path: path.display().to_string(),
            part,
            source,
        }
    };
    let file = object::File::parse(elf.as_slice()).map_err(elf_error("ELF"))?;
    let section = file
        .section_by_name(".modinfo")
        .ok_or_else(|| bad("no .modinfo section".into()))?;
    let data = section.data().map_err(elf_error(".modinfo"))?;
    Ok(data
        .split(|b| *b == 0)
        .filter_map(|field| field.strip_prefix(b"depends="))
        .flat_map(|deps| {
            String::from_utf8_lossy(deps)
                .split(',')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|d| !d.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trixie cloud kernel from the input cache (fetched by `hawser image fetch`).
    fn cached_kernel_modules() -> Option<std::path::PathBuf> {
        let cache = std::env::var_os("HAWSER_CACHE")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/hawser")))?;
        let inputs = std::fs::read_dir(cache.join("inputs")).ok()?;
        for entry in inputs.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("linux-image-")
            {
                let modules = entry.path().join("usr/lib/modules");
                return std::fs::read_dir(modules)
                    .ok()?
                    .flatten()
                    .next()
                    .map(|e| e.path());
            }
        }
        None
    }

    /// The cached kernel's modules; without them the test is skipped, saying so, unless the suite
    /// demands every input (`HAWSER_REQUIRE_INPUTS`, as CI sets it), where a missing cache fails
    /// the test. The rule is `hawser_image::test_support`'s; this crate sits below hawser-image,
    /// so its unit tests keep this copy of it.
    fn kernel_modules_or_skip() -> Option<std::path::PathBuf> {
        let dir = cached_kernel_modules();
        if dir.is_none() {
            let message = "the trixie kernel (linux-image-*) is missing from the input cache: \
                           run `hawser image fetch`";
            let required = std::env::var_os("HAWSER_REQUIRE_INPUTS")
                .is_some_and(|value| !value.is_empty() && value != "0");
            assert!(
                !required,
                "{message} (HAWSER_REQUIRE_INPUTS is set: nothing may be skipped)"
            );
            // Not `eprintln!`, which libtest captures: the skip is seen without `--nocapture`.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("SKIPPED: {message} (HAWSER_REQUIRE_INPUTS=1 makes this a failure)\n")
                    .as_bytes(),
            );
        }
        dir
    }

    #[test]
    fn real_kernel_boot_modules_resolve_with_dependencies_first() {
        let Some(dir) = kernel_modules_or_skip() else {
            return;
        };
        let idx = ModuleIndex::scan_modules_dir(&dir, crate::BOOT_MODULES).unwrap();
        let order = idx.load_order(crate::BOOT_MODULES).unwrap();
        let pos = |suffix: &str| {
            order
                .iter()
                .position(|p| p.ends_with(suffix))
                .unwrap_or_else(|| panic!("{suffix} not in {order:?}"))
        };
        assert!(pos("/dm-mod.ko.xz") < pos("/dm-crypt.ko.xz"));
        assert!(pos("/dm-bufio.ko.xz") < pos("/dm-verity.ko.xz"));
        // Rendering and re-parsing gives the same order, which is what PID 1 does at boot.
        let reparsed = ModuleIndex::parse(&idx.render_subset(&order), None).unwrap();
        assert_eq!(reparsed.load_order(crate::BOOT_MODULES).unwrap(), order);
    }

    #[test]
    fn unknown_module_in_real_kernel_is_named() {
        let Some(dir) = kernel_modules_or_skip() else {
            return;
        };
        assert!(matches!(
            ModuleIndex::scan_modules_dir(&dir, &["no_such_module"]).unwrap_err(),
            KmodError::UnknownModule { name } if name == "no_such_module"
        ));
    }
}
