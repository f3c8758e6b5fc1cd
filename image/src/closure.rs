//! The shared-library closure of the init binary, resolved in unpacked Debian package trees.
//!
//! PID 1 is compiled on the build host but runs against trixie's libraries (same sonames, newer
//! versions), so its libraries are looked up in the pinned, unpacked trixie packages ("roots"),
//! never on the host: a soname that no root provides is an error, not a fallback. What the
//! dynamic loader needs at boot is exactly this:
//!
//! - the interpreter named by `PT_INTERP` (`/lib64/ld-linux-x86-64.so.2`), at that path;
//! - every `DT_NEEDED` soname, recursively, plus sonames the program `dlopen`s, found by the loader's default search since the initramfs has no
//!   `/etc/ld.so.cache`.
//!
//! Layout in the initramfs: every library file sits in `usr/lib/x86_64-linux-gnu` (the first
//! default search directory on Debian; `lib/…` reaches it through the merged-/usr symlink) under
//! its real file name, each soname that differs is a symlink to it (as Debian ships them), and
//! the interpreter path is a symlink into that directory, as in trixie's libc6. Symlinks inside
//! the roots are followed with the root as `/`: an absolute target is re-rooted, and a target
//! that climbs out of the root is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

use object::elf::EM_X86_64;

mod elf;

pub use elf::ElfError;
use elf::{ElfDeps, elf_machine, parse_elf};

/// Where every library goes in the initramfs.
pub const LIBRARY_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// Directories searched in each root, in order. `lib/…` and `lib64` cover roots that are not
/// merged-/usr (a real file system root); in Debian package trees they are usually absent.
const SEARCH_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "lib/x86_64-linux-gnu",
    "usr/lib64",
    "lib64",
    "usr/lib",
    "lib",
];

/// How many symlinks one lookup may follow (the kernel's limit is 40).
const MAX_SYMLINKS: usize = 40;

/// Why the closure could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ClosureError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file is not an ELF object this loader can use.
    #[error("{path} is not a usable ELF object")]
    BadElf {
        path: PathBuf,
        #[source]
        source: ElfError,
    },
    /// A statically linked executable has no closure to ship; refuse so the caller notices.
    #[error("{path} has no PT_INTERP: it is not a dynamically linked executable")]
    NotDynamic { path: PathBuf },
    /// No root provides a soname.
    #[error(
        "shared library {soname:?} (needed by {needed_by}) is in none of the library roots; searched {searched}"
    )]
    MissingLibrary {
        soname: String,
        needed_by: String,
        searched: String,
    },
    /// The interpreter is in no root.
    #[error(
        "the ELF interpreter {interpreter:?} of {path} is in none of the library roots; searched {searched}"
    )]
    MissingInterpreter {
        interpreter: String,
        path: PathBuf,
        searched: String,
    },
    /// A symlink inside a root points outside it.
    #[error("symlink {link} points to {target:?}, outside its root {root}")]
    EscapesRoot {
        link: PathBuf,
        target: PathBuf,
        root: PathBuf,
    },
    /// Too many symlinks (a loop).
    #[error("too many levels of symlinks resolving {path} in {root}")]
    SymlinkLoop { path: String, root: PathBuf },
    /// Two different files would land at the same path in the initramfs.
    #[error("{dest} would be both {first} and {second}")]
    Collision {
        dest: String,
        first: String,
        second: String,
    },
    /// A name that cannot be a file name in the library directory.
    #[error("{what} {name:?} is not a plain file name")]
    BadName { what: &'static str, name: String },
}

/// A file to copy into the initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosureFile {
    /// Path in the initramfs, relative ("usr/lib/x86_64-linux-gnu/libc.so.6").
    pub dest: String,
    /// The real file in one of the roots.
    pub source: PathBuf,
}

/// A symlink to create in the initramfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosureSymlink {
    /// Path in the initramfs, relative.
    pub dest: String,
    /// The link target as written into the archive.
    pub target: String,
}

/// The resolved closure: real files and the symlinks (sonames, interpreter path) pointing at
/// them, each sorted by destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LibraryClosure {
    pub files: Vec<ClosureFile>,
    pub symlinks: Vec<ClosureSymlink>,
}

/// A path looked up in a root: the real file, and the names passed through on the way.
struct Resolved {
    real: PathBuf,
    /// File names of the symlinks followed, in order (first = the name looked up).
    link_names: Vec<String>,
}

/// Resolves the closure of `executable` in `roots` (searched in order, first match wins),
/// including `dlopened` sonames and their own dependencies.
pub fn resolve(
    executable: &Path,
    roots: &[PathBuf],
    dlopened: &[&str],
) -> Result<LibraryClosure, ClosureError> {
    let exe = read_elf(executable)?;
    let interpreter = exe
        .interpreter
        .clone()
        .ok_or_else(|| ClosureError::NotDynamic {
            path: executable.to_owned(),
        })?;
    let mut builder = Builder::default();

    // The interpreter: the kernel opens it by its absolute path.
    let interp_rel = merged_usr(Path::new(&interpreter));
    let interp = roots
        .iter()
        .find_map(|root| resolve_in_root(root, &interp_rel).transpose())
        .transpose()?
        .ok_or_else(|| ClosureError::MissingInterpreter {
            interpreter: interpreter.clone(),
            path: executable.to_owned(),
            searched: describe_roots(roots),
        })?;
    let interp_elf = read_elf(&interp.real)?;
    let interp_real_name = file_name(&interp.real)?;
    builder.add_file(&interp_real_name, &interp.real)?;
    let interp_dest = interp_rel.to_string_lossy().into_owned();
    let interp_in_lib_dir = Path::new(&interp_dest).parent() == Some(Path::new(LIBRARY_DIR));
    if !(interp_in_lib_dir && interp_dest.ends_with(&format!("/{interp_real_name}"))) {
        let target = relative_target(&interp_dest, &format!("{LIBRARY_DIR}/{interp_real_name}"));
        builder.add_symlink_at(interp_dest.clone(), target)?;
    }
    // libc names the interpreter by its soname; it is already loaded under that name.
    let mut provided: BTreeSet<String> = BTreeSet::new();
    if let Some(soname) = &interp_elf.soname {
        provided.insert(soname.clone());
    }

    let mut pending: Vec<(String, String)> = exe
        .needed
        .iter()
        .map(|n| (n.clone(), executable.display().to_string()))
        .collect();
    pending.extend(
        dlopened
            .iter()
            .map(|n| ((*n).to_owned(), "dlopen".to_owned())),
    );
    pending.reverse();
    while let Some((soname, needed_by)) = pending.pop() {
        if !provided.insert(soname.clone()) {
            continue;
        }
        if soname.contains('/') || soname.is_empty() {
            return Err(ClosureError::BadName {
                what: "DT_NEEDED soname",
                name: soname,
            });
        }
        let found = find_library(roots, &soname)?.ok_or_else(|| ClosureError::MissingLibrary {
            soname: soname.clone(),
            needed_by: needed_by.clone(),
            searched: describe_search(roots),
        })?;
        let real_name = file_name(&found.real)?;
        builder.add_file(&real_name, &found.real)?;
        // Chain of names: soname -> ... -> real name, flattened into the library directory.
        let mut names = found.link_names.clone();
        names.push(real_name.clone());
        for pair in names.windows(2) {
            if pair[0] != pair[1] {
                builder.add_symlink_at(format!("{LIBRARY_DIR}/{}", pair[0]), pair[1].clone())?;
            }
        }
        let lib = read_elf(&found.real)?;
        let mut deps: Vec<(String, String)> = lib
            .needed
            .into_iter()
            .map(|n| (n, soname.clone()))
            .collect();
        deps.reverse();
        pending.extend(deps);
    }
    Ok(builder.finish())
}

/// Finds `soname` in the search directories of the roots, skipping files that are not x86-64
/// ELF64 objects (as the loader does with, say, an i386 library in a shared directory).
fn find_library(roots: &[PathBuf], soname: &str) -> Result<Option<Resolved>, ClosureError> {
    for root in roots {
        for dir in SEARCH_DIRS {
            let Some(found) = resolve_in_root(root, &Path::new(dir).join(soname))? else {
                continue;
            };
            let data = read(&found.real)?;
            if elf_machine(&data).ok() == Some(EM_X86_64) {
                return Ok(Some(found));
            }
        }
    }
    Ok(None)
}

/// Looks `rel` up in `root` as if `root` were `/`, following symlinks. `None` if absent.
fn resolve_in_root(root: &Path, rel: &Path) -> Result<Option<Resolved>, ClosureError> {
    let mut link_names = Vec::new();
    // Components still to walk, and the real directory reached so far (relative to the root).
    let mut todo: Vec<String> = components(rel);
    todo.reverse();
    let mut current: Vec<String> = Vec::new();
    let mut followed = 0;
    while let Some(component) = todo.pop() {
        match component.as_str() {
            "." => continue,
            ".." => {
                if current.pop().is_none() {
                    return Err(ClosureError::EscapesRoot {
                        link: root.join(rel),
                        target: PathBuf::from(".."),
                        root: root.to_owned(),
                    });
                }
                continue;
            }
            _ => {}
        }
        let mut path = root.to_path_buf();
        path.extend(&current);
        path.push(&component);
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(None),
            Err(source) => return Err(ClosureError::Read { path, source }),
        };
        if meta.file_type().is_symlink() {
            followed += 1;
            if followed > MAX_SYMLINKS {
                return Err(ClosureError::SymlinkLoop {
                    path: rel.display().to_string(),
                    root: root.to_owned(),
                });
            }
            let target = fs::read_link(&path).map_err(|source| ClosureError::Read {
                path: path.clone(),
                source,
            })?;
            if todo.is_empty() {
                // A symlink in the final position: one hop of the name chain.
                link_names.push(component.clone());
            }
            let mut target_parts = components(&target);
            if target.is_absolute() {
                current.clear();
            }
            // Check that `..` in the target does not climb above the root.
            let mut depth = current.len() as isize;
            for part in &target_parts {
                match part.as_str() {
                    ".." => depth -= 1,
                    "." => {}
                    _ => depth += 1,
                }
                if depth < 0 {
                    return Err(ClosureError::EscapesRoot {
                        link: path,
                        target,
                        root: root.to_owned(),
                    });
                }
            }
            target_parts.reverse();
            todo.extend(target_parts);
        } else if todo.is_empty() {
            if !meta.is_file() {
                return Ok(None);
            }
            return Ok(Some(Resolved {
                real: path,
                link_names,
            }));
        } else if meta.is_dir() {
            current.push(component);
        } else {
            return Ok(None);
        }
    }
    Ok(None)
}

/// The relative symlink target that makes `link` (a path relative to the image root) point at
/// `target` (also relative to the root): "usr/lib64/ld.so" -> "usr/lib/x/ld.so" gives
/// "../lib/x/ld.so".
pub fn relative_target(link: &str, target: &str) -> String {
    let link_dir: Vec<&str> = link.split('/').collect::<Vec<_>>();
    let link_dir = &link_dir[..link_dir.len().saturating_sub(1)];
    let target_parts: Vec<&str> = target.split('/').collect();
    let common = link_dir
        .iter()
        .zip(&target_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut parts: Vec<&str> = vec![".."; link_dir.len() - common];
    parts.extend(&target_parts[common..]);
    parts.join("/")
}

/// Normal components of a path as strings ("/lib64/x" -> ["lib64", "x"]), keeping `..`.
fn components(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".to_owned()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// An absolute path as it lives in a merged-/usr tree, relative: "/lib64/x" -> "usr/lib64/x".
pub fn merged_usr(path: &Path) -> PathBuf {
    let parts = components(path);
    let mut out = PathBuf::new();
    if let Some(first) = parts.first()
        && matches!(first.as_str(), "lib" | "lib64" | "bin" | "sbin")
    {
        out.push("usr");
    }
    out.extend(parts);
    out
}

fn file_name(path: &Path) -> Result<String, ClosureError> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| ClosureError::BadName {
            what: "library file",
            name: path.display().to_string(),
        })
}

fn read(path: &Path) -> Result<Vec<u8>, ClosureError> {
    fs::read(path).map_err(|source| ClosureError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads interpreter, needed sonames and own soname of an x86-64 ELF file.
fn read_elf(path: &Path) -> Result<ElfDeps, ClosureError> {
    let data = read(path)?;
    parse_elf(&data).map_err(|source| ClosureError::BadElf {
        path: path.to_owned(),
        source,
    })
}

fn describe_roots(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return "no roots (none given)".to_owned();
    }
    roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_search(roots: &[PathBuf]) -> String {
    format!("{} in {}", SEARCH_DIRS.join(", "), describe_roots(roots))
}

/// Collects files and symlinks by destination, refusing two different things at one path.
#[derive(Default)]
struct Builder {
    files: BTreeMap<String, PathBuf>,
    symlinks: BTreeMap<String, String>,
}

impl Builder {
    fn add_file(&mut self, real_name: &str, source: &Path) -> Result<(), ClosureError> {
        let dest = format!("{LIBRARY_DIR}/{real_name}");
        if let Some(target) = self.symlinks.get(&dest) {
            return Err(ClosureError::Collision {
                dest,
                first: format!("a symlink to {target}"),
                second: source.display().to_string(),
            });
        }
        if let Some(existing) = self.files.get(&dest)
            && existing != source
            && read(existing)? != read(source)?
        {
            return Err(ClosureError::Collision {
                dest,
                first: existing.display().to_string(),
                second: source.display().to_string(),
            });
        }
        self.files.entry(dest).or_insert_with(|| source.to_owned());
        Ok(())
    }

    fn add_symlink_at(&mut self, dest: String, target: String) -> Result<(), ClosureError> {
        if let Some(existing) = self.files.get(&dest) {
            return Err(ClosureError::Collision {
                dest,
                first: existing.display().to_string(),
                second: format!("a symlink to {target}"),
            });
        }
        match self.symlinks.get(&dest) {
            Some(existing) if *existing != target => Err(ClosureError::Collision {
                dest,
                first: format!("a symlink to {existing}"),
                second: format!("a symlink to {target}"),
            }),
            _ => {
                self.symlinks.insert(dest, target);
                Ok(())
            }
        }
    }

    fn finish(self) -> LibraryClosure {
        LibraryClosure {
            files: self
                .files
                .into_iter()
                .map(|(dest, source)| ClosureFile { dest, source })
                .collect(),
            symlinks: self
                .symlinks
                .into_iter()
                .map(|(dest, target)| ClosureSymlink { dest, target })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
