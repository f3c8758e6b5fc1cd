//! `modules.dep` parsed ([`ModuleIndex`]): dependency order, the load plan that carries each
//! table entry's need to the files it pulls in ([`PlannedModule`]), and subsets to ship.

use std::collections::{BTreeMap, BTreeSet};

use crate::{KernelModule, Need};

/// One module file of a [`ModuleIndex::load_plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedModule<'t> {
    /// Its name, e.g. `dm_crypt`.
    pub name: String,
    /// Its path relative to the modules directory.
    pub path: String,
    /// The modules that must be loaded before it (as modules.dep lists them).
    pub dependencies: Vec<String>,
    /// The table entries it is loaded for: its own first, if it has one, then those of the
    /// modules that depend on it.
    pub wanted_by: Vec<&'t KernelModule>,
}

impl PlannedModule<'_> {
    /// The first required entry that needs this file: then the boot cannot do without it.
    /// `None` if only optional modules need it.
    pub fn required_by(&self) -> Option<&KernelModule> {
        self.wanted_by
            .iter()
            .copied()
            .find(|entry| entry.need == Need::Required)
    }

    /// What the boot path needs this file for: the purpose of the first required entry,
    /// naming that module when the file is only its dependency. `None` if it is optional.
    pub fn required_for(&self) -> Option<String> {
        self.required_by().map(|entry| self.purpose_of(entry))
    }

    /// What this file is loaded for: [`Self::required_for`], else the purpose of the first
    /// (optional) entry that needs it.
    pub fn purpose(&self) -> String {
        self.required_by()
            .or(self.wanted_by.first().copied())
            .map(|entry| self.purpose_of(entry))
            .unwrap_or_else(|| "(no module of the table needs it)".to_owned())
    }

    /// What the machine loses without this file: the `without` of every optional entry that
    /// needs it (for a required file, nothing is listed: it is never left out).
    pub fn without(&self) -> String {
        let mut lost: Vec<String> = Vec::new();
        for entry in &self.wanted_by {
            if let Need::Optional { without } = entry.need {
                let text = if normalize_name(entry.name) == self.name {
                    without.to_owned()
                } else {
                    format!("without {}: {without}", entry.name)
                };
                if !lost.contains(&text) {
                    lost.push(text);
                }
            }
        }
        lost.join("; ")
    }

    /// What the module's own init checks the machine for ([`KernelModule::hardware`]);
    /// `None` for a dependency without a table entry of its own.
    pub fn hardware(&self) -> Option<&'static str> {
        self.wanted_by
            .first()
            .filter(|entry| normalize_name(entry.name) == self.name)
            .and_then(|entry| entry.hardware)
    }

    fn purpose_of(&self, entry: &KernelModule) -> String {
        if normalize_name(entry.name) == self.name {
            entry.purpose.to_owned()
        } else {
            format!("{} (through {})", entry.purpose, entry.name)
        }
    }
}

/// Why a module set could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    /// A line of modules.dep has no `:` separator.
    #[error("modules.dep line {line}: expected `path: deps...`, found {text:?}")]
    Malformed { line: usize, text: String },
    /// A requested or depended-on module is neither in modules.dep nor built in.
    #[error("kernel module {name:?} is neither in modules.dep nor built into the kernel")]
    UnknownModule { name: String },
    /// modules.dep lists a dependency cycle (the kernel's depmod never writes one).
    #[error("kernel module dependency cycle through {name:?}")]
    Cycle { name: String },
    /// A file of the modules directory could not be read.
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A module file's xz compression does not decompress.
    #[error("{path} is not a readable kernel module: xz")]
    Xz {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A module file (after decompression) is not an ELF object, or its `.modinfo` is unreadable.
    #[cfg(feature = "scan")]
    #[error("{path} is not a readable kernel module: {part}")]
    Elf {
        path: String,
        /// `ELF` or `.modinfo`.
        part: &'static str,
        #[source]
        source: object::read::Error,
    },
    /// A module file is an ELF object but not a kernel module.
    #[error("{path} is not a readable kernel module: {reason}")]
    BadModule { path: String, reason: String },
}

/// Normalizes a module name or path the way the kernel does: directory and `.ko[.xz|.zst|.gz]`
/// stripped, `-` replaced by `_`. `"kernel/drivers/md/dm-crypt.ko.xz"` → `"dm_crypt"`.
pub fn normalize_name(s: &str) -> String {
    let file = s.rsplit('/').next().unwrap_or(s);
    let stem = file.find(".ko").map_or(file, |i| &file[..i]);
    stem.replace('-', "_")
}

/// A parsed `modules.dep` (and optionally `modules.builtin`).
#[derive(Debug, Clone, Default)]
pub struct ModuleIndex {
    /// Module name → (its path relative to the modules directory, its dependencies' paths).
    modules: BTreeMap<String, (String, Vec<String>)>,
    builtin: BTreeSet<String>,
}

impl ModuleIndex {
    /// Parses `modules.dep` text (`path: dep-path dep-path ...` per line) and, if given, the
    /// `modules.builtin` list (one path per line).
    pub fn parse(modules_dep: &str, modules_builtin: Option<&str>) -> Result<Self, KmodError> {
        let mut modules = BTreeMap::new();
        for (i, line) in modules_dep.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (path, deps) = line.split_once(':').ok_or_else(|| KmodError::Malformed {
                line: i + 1,
                text: line.to_owned(),
            })?;
            let path = path.trim().to_owned();
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            modules.insert(normalize_name(&path), (path, deps));
        }
        let builtin = modules_builtin
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(normalize_name)
            .collect();
        Ok(Self { modules, builtin })
    }

    /// An index from already-resolved entries: (module path, dependency paths).
    #[cfg(feature = "scan")]
    pub(crate) fn from_entries(
        entries: impl IntoIterator<Item = (String, Vec<String>)>,
        builtin: BTreeSet<String>,
    ) -> Self {
        let modules = entries
            .into_iter()
            .map(|(path, deps)| (normalize_name(&path), (path, deps)))
            .collect();
        Self { modules, builtin }
    }

    /// Whether `name` is compiled into the kernel (nothing to load).
    pub fn is_builtin(&self, name: &str) -> bool {
        self.builtin.contains(&normalize_name(name))
    }

    /// Relative paths of every module needed for `names`, dependencies first, each once.
    /// Built-in modules are skipped; an unknown name is [`KmodError::UnknownModule`].
    pub fn load_order(&self, names: &[&str]) -> Result<Vec<String>, KmodError> {
        let mut order = Vec::new();
        let mut done = BTreeSet::new();
        for name in names {
            self.visit(
                &normalize_name(name),
                &mut done,
                &mut BTreeSet::new(),
                &mut order,
            )?;
        }
        Ok(order)
    }

    /// Depth-first: dependencies are pushed before the module that needs them.
    fn visit(
        &self,
        name: &str,
        done: &mut BTreeSet<String>,
        in_progress: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> Result<(), KmodError> {
        if done.contains(name) {
            return Ok(());
        }
        let Some((path, deps)) = self.modules.get(name) else {
            if self.builtin.contains(name) {
                return Ok(());
            }
            return Err(KmodError::UnknownModule {
                name: name.to_owned(),
            });
        };
        if !in_progress.insert(name.to_owned()) {
            return Err(KmodError::Cycle {
                name: name.to_owned(),
            });
        }
        for dep in deps {
            self.visit(&normalize_name(dep), done, in_progress, order)?;
        }
        in_progress.remove(name);
        done.insert(name.to_owned());
        order.push(path.clone());
        Ok(())
    }

    /// The files to load for `table`, dependencies first, each once, with the entries of
    /// `table` that need each file (a dependency is as needed as the neediest module that
    /// pulls it in). Built-in modules are skipped; an unknown name is
    /// [`KmodError::UnknownModule`].
    pub fn load_plan<'t>(
        &self,
        table: &'t [KernelModule],
    ) -> Result<Vec<PlannedModule<'t>>, KmodError> {
        let names: Vec<&str> = table.iter().map(|module| module.name).collect();
        let mut plan: Vec<PlannedModule<'t>> = self
            .load_order(&names)?
            .into_iter()
            .map(|path| {
                let name = normalize_name(&path);
                let dependencies = self
                    .modules
                    .get(&name)
                    .map(|(_, deps)| deps.iter().map(|dep| normalize_name(dep)).collect())
                    .unwrap_or_default();
                PlannedModule {
                    name,
                    path,
                    dependencies,
                    wanted_by: Vec::new(),
                }
            })
            .collect();
        for entry in table {
            let own_name = normalize_name(entry.name);
            for path in self.load_order(&[entry.name])? {
                if let Some(planned) = plan.iter_mut().find(|planned| planned.path == path) {
                    // The module's own entry first: its `hardware` explains its own ENODEV.
                    if planned.name == own_name {
                        planned.wanted_by.insert(0, entry);
                    } else {
                        planned.wanted_by.push(entry);
                    }
                }
            }
        }
        Ok(plan)
    }

    /// A `modules.dep` restricted to `paths`, in the order given, for shipping a subset.
    pub fn render_subset(&self, paths: &[String]) -> String {
        self.render_subset_as(paths, |path| path)
    }

    /// [`Self::render_subset`] with every path (module and dependency) written as `rename`
    /// gives it: the initramfs ships `.ko.xz` modules decompressed, under `.ko` names.
    pub fn render_subset_as(&self, paths: &[String], rename: impl Fn(&str) -> &str) -> String {
        let mut out = String::new();
        for path in paths {
            let name = normalize_name(path);
            let deps = self
                .modules
                .get(&name)
                .map(|(_, deps)| deps.iter().map(|d| rename(d)).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            out.push_str(rename(path));
            out.push(':');
            if !deps.is_empty() {
                out.push(' ');
                out.push_str(&deps);
            }
            out.push('\n');
        }
        out
    }
}
