//! The file backend: one join service's own files.
//!
//! The registry of joined disks is a text file, one disk a line: `<disk uuid> <AK name, hex>`,
//! appended when a disk first joins. A line with a UUID alone (written before disks were bound
//! to AKs) is bound to the AK of the disk's next join or rejoin, with a warning, and the file is
//! rewritten. The control-plane approvals are the [`ApprovalStore`] file, reloaded when it
//! changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::{BindOutcome, ClusterStore, DiskBinding, ReadConsistency, StoreError};
use crate::approvals::ApprovalStore;

/// The AK a joined disk is bound to (hex), `None` for a line written before disks were bound.
type Registry = BTreeMap<String, Option<String>>;

/// The cluster state in local files (see the module docs).
#[derive(Debug)]
pub struct FileStore {
    registry_file: PathBuf,
    joined: Mutex<Registry>,
    approvals: RwLock<Arc<ApprovalStore>>,
}

impl FileStore {
    /// Reads the registry of joined disks (a missing file is an empty registry); approves no
    /// control plane until given a list ([`FileStore::set_approvals`]).
    pub fn open(registry_file: &Path) -> Result<Self, StoreError> {
        let joined = match std::fs::read_to_string(registry_file) {
            Ok(text) => parse_registry(registry_file, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Registry::new(),
            Err(source) => {
                return Err(StoreError::Registry {
                    path: registry_file.display().to_string(),
                    source,
                });
            }
        };
        Ok(Self {
            registry_file: registry_file.to_owned(),
            joined: Mutex::new(joined),
            approvals: RwLock::new(Arc::new(ApprovalStore::none())),
        })
    }

    /// Control-plane joins are granted to the AKs on `approvals` only.
    pub fn set_approvals(&self, approvals: Arc<ApprovalStore>) {
        match self.approvals.write() {
            Ok(mut guard) => *guard = approvals,
            Err(poisoned) => *poisoned.into_inner() = approvals,
        }
    }

    /// The registry file.
    pub fn registry_file(&self) -> &Path {
        &self.registry_file
    }

    fn approvals(&self) -> Arc<ApprovalStore> {
        match self.approvals.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn lock_joined(&self) -> MutexGuard<'_, Registry> {
        match self.joined.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn io(&self, source: std::io::Error) -> StoreError {
        StoreError::Registry {
            path: self.registry_file.display().to_string(),
            source,
        }
    }
}

impl ClusterStore for FileStore {
    fn disk_binding(
        &self,
        uuid: &str,
        _consistency: ReadConsistency,
    ) -> Result<Option<DiskBinding>, StoreError> {
        Ok(self.lock_joined().get(uuid).map(|ak| match ak {
            Some(ak) => DiskBinding::Bound(ak.clone()),
            None => DiskBinding::Unbound,
        }))
    }

    fn bind_disk(&self, uuid: &str, ak_name: &str) -> Result<BindOutcome, StoreError> {
        use std::io::Write as _;
        let mut joined = self.lock_joined();
        match joined.get(uuid) {
            Some(Some(registered)) if registered == ak_name => Ok(BindOutcome::Same),
            Some(Some(registered)) => Ok(BindOutcome::Another(registered.clone())),
            Some(None) => {
                let mut bound = joined.clone();
                bound.insert(uuid.to_owned(), Some(ak_name.to_owned()));
                write_registry(&self.registry_file, &bound).map_err(|e| self.io(e))?;
                *joined = bound;
                Ok(BindOutcome::BoundLegacy)
            }
            None => {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.registry_file)
                    .map_err(|e| self.io(e))?;
                writeln!(file, "{uuid} {ak_name}")
                    .and_then(|()| file.sync_data())
                    .map_err(|e| self.io(e))?;
                joined.insert(uuid.to_owned(), Some(ak_name.to_owned()));
                Ok(BindOutcome::New)
            }
        }
    }

    fn approves_control_plane(&self, ak_name: &str) -> Result<bool, StoreError> {
        Ok(match hex::decode(ak_name) {
            Ok(name) => self.approvals().current().approves(&name),
            Err(_) => false,
        })
    }

    fn approvals_location(&self, _ak_name: &str) -> String {
        match self.approvals().path() {
            Some(path) => path.display().to_string(),
            None => {
                "a control-plane approvals file (this join service has none configured)".to_owned()
            }
        }
    }
}

/// Parses the registry of joined disks (format in the module docs).
fn parse_registry(path: &Path, text: &str) -> Result<Registry, StoreError> {
    let mut registry = Registry::new();
    for (index, line) in text.lines().enumerate() {
        let mut fields = line.split_whitespace();
        let Some(uuid) = fields.next() else {
            continue;
        };
        let ak_name = fields.next();
        let well_formed = fields.next().is_none()
            && ak_name.is_none_or(|ak| ak.bytes().all(|b| b.is_ascii_hexdigit()));
        if !well_formed {
            return Err(StoreError::RegistryLine {
                path: path.display().to_string(),
                line: index + 1,
            });
        }
        registry.insert(uuid.to_owned(), ak_name.map(str::to_ascii_lowercase));
    }
    Ok(registry)
}

/// Replaces the registry file with `registry` (write a temporary file, sync, rename).
fn write_registry(path: &Path, registry: &Registry) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut text = String::new();
    for (uuid, ak_name) in registry {
        text.push_str(uuid);
        if let Some(ak_name) = ak_name {
            text.push(' ');
            text.push_str(ak_name);
        }
        text.push('\n');
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
