//! The file backend: one join service's own files.
//!
//! The registry of joined disks is a text file, one disk a line: `<disk uuid> <AK name, hex>`,
//! appended when a disk first joins. A line with a UUID alone (written before disks were bound
//! to AKs) is bound to the AK of the disk's next join or rejoin, with a warning, and the file is
//! rewritten. The control-plane approvals are the [`ApprovalStore`] file, reloaded when it
//! changes.
//!
//! The WireGuard mesh lives beside the registry file, in the same directory:
//! [`VPN_REGISTRY_FILE`] holds the versioned peer registry as JSON, replaced by an atomic rename
//! under a lock (an exclusive `flock` on [`VPN_LOCK_FILE`], so that `hawser peers` and a second
//! process never see half a file nor lose an update); [`VPN_POLLS_DIR`] holds one JSON file per
//! node with its last poll.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use hawser_mesh::{Ipv4Net, Registry};

use super::{
    BindOutcome, ClusterStore, DiskBinding, PollStatus, PutMode, ReadConsistency, RecordKind,
    RegistryChange, StoreError, apply_vpn_change,
};
use crate::approvals::ApprovalStore;

/// The VPN registry's file, in the directory of the registry of joined disks.
pub const VPN_REGISTRY_FILE: &str = "vpn-registry.json";
/// The lock taken around every read-modify-write of [`VPN_REGISTRY_FILE`].
const VPN_LOCK_FILE: &str = "vpn-registry.lock";
/// The directory of the nodes' last polls (one `<node id>.json` each).
pub const VPN_POLLS_DIR: &str = "vpn-polls";

/// The AK a joined disk is bound to (hex), `None` for a line written before disks were bound.
type Joined = BTreeMap<String, Option<String>>;

/// The cluster state in local files (see the module docs).
#[derive(Debug)]
pub struct FileStore {
    registry_file: PathBuf,
    /// The directory of the mesh's files (the registry file's).
    vpn_dir: PathBuf,
    /// Serializes this process's read-modify-writes of the VPN registry (the file lock does
    /// the same across processes).
    vpn_lock: Mutex<()>,
    joined: Mutex<Joined>,
    approvals: RwLock<Arc<ApprovalStore>>,
}

impl FileStore {
    /// Reads the registry of joined disks (a missing file is an empty registry); approves no
    /// control plane until given a list ([`FileStore::set_approvals`]).
    pub fn open(registry_file: &Path) -> Result<Self, StoreError> {
        let joined = match std::fs::read_to_string(registry_file) {
            Ok(text) => parse_registry(registry_file, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Joined::new(),
            Err(source) => {
                return Err(StoreError::Registry {
                    path: registry_file.display().to_string(),
                    source,
                });
            }
        };
        let vpn_dir = match registry_file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(Self {
            registry_file: registry_file.to_owned(),
            vpn_dir,
            vpn_lock: Mutex::new(()),
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

    fn lock_joined(&self) -> MutexGuard<'_, Joined> {
        match self.joined.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The VPN registry file.
    pub fn vpn_registry_file(&self) -> PathBuf {
        self.vpn_dir.join(VPN_REGISTRY_FILE)
    }

    /// The file of node `node_id`'s last poll.
    fn poll_file(&self, node_id: &str) -> PathBuf {
        self.vpn_dir
            .join(VPN_POLLS_DIR)
            .join(format!("{}.json", escape_id(node_id)))
    }

    fn read_vpn_registry(&self) -> Result<Option<Registry>, StoreError> {
        let path = self.vpn_registry_file();
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(vpn_io(&path, source)),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| StoreError::VpnJson {
                location: path.display().to_string(),
                what: "registry",
                source,
            })
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
                // One write call (`writeln!` on a File makes one per formatted piece): the line
                // goes to the file whole, never interleaved with another appender's.
                file.write_all(format!("{uuid} {ak_name}\n").as_bytes())
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

    fn update_vpn_registry(
        &self,
        prefix: Ipv4Net,
        change: RegistryChange<'_>,
    ) -> Result<Registry, StoreError> {
        let _in_process = match self.vpn_lock.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let lock_path = self.vpn_dir.join(VPN_LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| vpn_io(&lock_path, source))?;
        // Released when `lock` is closed, at the end of this function.
        lock.lock().map_err(|source| vpn_io(&lock_path, source))?;
        let (registry, changed) = apply_vpn_change(self.read_vpn_registry()?, prefix, change)?;
        if changed {
            let path = self.vpn_registry_file();
            let json =
                serde_json::to_vec_pretty(&registry).map_err(|source| StoreError::VpnJson {
                    location: path.display().to_string(),
                    what: "registry",
                    source,
                })?;
            replace_file(&path, &json).map_err(|source| vpn_io(&path, source))?;
        }
        Ok(registry)
    }

    fn vpn_registry(&self, _consistency: ReadConsistency) -> Result<Option<Registry>, StoreError> {
        self.read_vpn_registry()
    }

    fn record_vpn_poll(&self, node_id: &str, status: &PollStatus) -> Result<(), StoreError> {
        let dir = self.vpn_dir.join(VPN_POLLS_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| vpn_io(&dir, source))?;
        let path = self.poll_file(node_id);
        let json = serde_json::to_vec(status).map_err(|source| StoreError::VpnJson {
            location: path.display().to_string(),
            what: "poll",
            source,
        })?;
        replace_file(&path, &json).map_err(|source| vpn_io(&path, source))
    }

    fn put_record(
        &self,
        kind: RecordKind,
        name: &str,
        json: &[u8],
        mode: PutMode,
    ) -> Result<bool, StoreError> {
        let dir = self.vpn_dir.join(kind.dir_name());
        std::fs::create_dir_all(&dir).map_err(|source| vpn_io(&dir, source))?;
        let _guard = self.vpn_lock.lock().unwrap_or_else(|p| p.into_inner());
        let path = dir.join(format!("{}.json", escape_id(name)));
        if mode == PutMode::Create && path.exists() {
            return Ok(false);
        }
        replace_file(&path, json).map_err(|source| vpn_io(&path, source))?;
        Ok(true)
    }

    fn records(
        &self,
        kind: RecordKind,
        _consistency: ReadConsistency,
    ) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        read_json_dir(&self.vpn_dir.join(kind.dir_name()))
    }

    fn vpn_polls(&self) -> Result<BTreeMap<String, PollStatus>, StoreError> {
        let dir = self.vpn_dir.join(VPN_POLLS_DIR);
        read_json_dir(&dir)?
            .into_iter()
            .map(|(id, bytes)| {
                let status =
                    serde_json::from_slice(&bytes).map_err(|source| StoreError::VpnJson {
                        location: dir
                            .join(format!("{}.json", escape_id(&id)))
                            .display()
                            .to_string(),
                        what: "poll",
                        source,
                    })?;
                Ok((id, status))
            })
            .collect()
    }
}

/// Every `<id>.json` in `dir` (none if `dir` is absent), by unescaped ID.
fn read_json_dir(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => return Err(vpn_io(dir, source)),
    };
    let mut files = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| vpn_io(dir, source))?;
        let name = entry.file_name();
        // Temporary files of a write in progress end in `.new`.
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        let Some(id) = unescape_id(id) else {
            continue;
        };
        let path = entry.path();
        let bytes = std::fs::read(&path).map_err(|source| vpn_io(&path, source))?;
        files.insert(id, bytes);
    }
    Ok(files)
}

fn vpn_io(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::VpnFile {
        path: path.display().to_string(),
        source,
    }
}

/// A node ID as a file name: bytes other than ASCII letters, digits, `-`, `_` and `.` (a join
/// service's `join-service/<name>`) are written `%XX`.
fn escape_id(id: &str) -> String {
    let mut name = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'_')
            || (byte == b'.' && !name.is_empty())
        {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}

fn unescape_id(name: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = tail.get(..2)?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// Replaces `path` with `content`: a temporary file beside it, synced, renamed over it.
fn replace_file(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(content)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Parses the registry of joined disks (format in the module docs).
fn parse_registry(path: &Path, text: &str) -> Result<Joined, StoreError> {
    let mut registry = Joined::new();
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
fn write_registry(path: &Path, registry: &Joined) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_mesh::{PeerStats, PublicKey};

    fn key(n: u8) -> PublicKey {
        PublicKey::from_slice(&[n; 32]).unwrap()
    }

    fn prefix() -> Ipv4Net {
        "10.99.0.0/24".parse().unwrap()
    }

    fn admit(store: &FileStore, id: &str, n: u8) -> Result<Registry, StoreError> {
        store.update_vpn_registry(prefix(), &mut |registry| {
            registry.admit(id, id, key(n), None, false, None)?;
            Ok(())
        })
    }

    #[test]
    fn the_vpn_registry_survives_a_new_store_on_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(&dir.path().join("joined")).unwrap();
        assert_eq!(store.vpn_registry(ReadConsistency::Latest).unwrap(), None);
        admit(&store, "a", 1).unwrap();
        let written = admit(&store, "b", 2).unwrap();
        assert_eq!(written.version(), 2);
        let again = FileStore::open(&dir.path().join("joined")).unwrap();
        assert_eq!(
            again.vpn_registry(ReadConsistency::Latest).unwrap(),
            Some(written.clone())
        );
        // Confirming a member changes nothing and writes nothing new.
        assert_eq!(admit(&again, "a", 1).unwrap(), written);
        assert!(dir.path().join(VPN_REGISTRY_FILE).exists());
    }

    #[test]
    fn a_refused_change_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(&dir.path().join("joined")).unwrap();
        admit(&store, "a", 1).unwrap();
        let before = std::fs::read(store.vpn_registry_file()).unwrap();
        // The first admission succeeds inside the change, the second is refused: neither
        // is written.
        let error = store
            .update_vpn_registry(prefix(), &mut |registry| {
                registry.admit("b", "b", key(2), None, false, None)?;
                registry.admit("a", "a", key(9), None, false, None)?;
                Ok(())
            })
            .unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::Mesh(hawser_mesh::MeshError::KeyChanged { .. })
            ),
            "{error}"
        );
        assert_eq!(std::fs::read(store.vpn_registry_file()).unwrap(), before);
    }

    #[test]
    fn a_registry_for_another_prefix_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(&dir.path().join("joined")).unwrap();
        admit(&store, "a", 1).unwrap();
        let before = std::fs::read(store.vpn_registry_file()).unwrap();
        let error = store
            .update_vpn_registry("10.98.0.0/16".parse().unwrap(), &mut |_| Ok(()))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "the stored VPN registry is for prefix 10.99.0.0/24, but this join service is \
             configured with 10.98.0.0/16: the prefix of a mesh cannot change while it has members"
        );
        assert_eq!(std::fs::read(store.vpn_registry_file()).unwrap(), before);
        // A prefix written with host bits is the same prefix.
        admit(&store, "a", 1).unwrap();
        store
            .update_vpn_registry("10.99.0.7/24".parse().unwrap(), &mut |_| Ok(()))
            .unwrap();
    }

    #[test]
    fn a_corrupt_registry_file_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(&dir.path().join("joined")).unwrap();
        std::fs::write(store.vpn_registry_file(), "{ not json").unwrap();
        let error = store.vpn_registry(ReadConsistency::Latest).unwrap_err();
        assert!(
            error.to_string().contains(VPN_REGISTRY_FILE) && error.to_string().contains("JSON"),
            "{error}"
        );
        assert!(admit(&store, "a", 1).is_err());
    }

    #[test]
    fn polls_are_kept_per_node_and_the_last_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(&dir.path().join("joined")).unwrap();
        assert!(store.vpn_polls().unwrap().is_empty());
        let stats = PeerStats {
            public_key: key(1),
            endpoint: None,
            last_handshake_unix: None,
            rx_bytes: 1,
            tx_bytes: 2,
        };
        let node = "3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
        for unix_time in [10, 20] {
            store
                .record_vpn_poll(
                    node,
                    &PollStatus {
                        unix_time,
                        known_version: Some(3),
                        stats: vec![stats.clone()],
                    },
                )
                .unwrap();
        }
        let odd = "join-service/cp-1%..";
        store
            .record_vpn_poll(
                odd,
                &PollStatus {
                    unix_time: 5,
                    known_version: None,
                    stats: vec![],
                },
            )
            .unwrap();
        let polls = FileStore::open(&dir.path().join("joined"))
            .unwrap()
            .vpn_polls()
            .unwrap();
        assert_eq!(polls.len(), 2);
        assert_eq!(polls[node].unix_time, 20);
        assert_eq!(polls[node].stats, vec![stats]);
        assert_eq!(polls[odd].unix_time, 5);
        // No poll file escapes its directory.
        for entry in std::fs::read_dir(dir.path().join(VPN_POLLS_DIR)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
        }
    }
}
