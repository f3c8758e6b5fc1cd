//! What `hawser-joind` reads and writes in the cluster store and its state directory as it
//! starts: the cluster's first release, the control-plane approvals imported into etcd, the
//! measurement salt.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::store::{ClusterStore, EtcdStore};

/// Makes this join service's own image the cluster's first release when the cluster store
/// holds none (the first control plane, or a cluster formed before releases), retrying while
/// etcd cannot be written. Otherwise only the admin adds releases.
pub async fn seed_release(
    store: Arc<dyn ClusterStore>,
    own: Arc<hawser_attestation::measurements::ExpectedMeasurements>,
) {
    use crate::store::releases;
    let digest = releases::measurements_digest(&releases::enforced_map(&own));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let release = match releases::Release::new(
        &releases::own_release_name(&digest),
        &own,
        None,
        "the first control plane's join service",
        now,
    ) {
        Ok(release) => release,
        Err(e) => {
            tracing::error!(
                "cannot make this image's release: {}",
                hawser_attestation::error_chain(&e)
            );
            return;
        }
    };
    let name = release.name.clone();
    let seeded = crate::store::write_until_done(
        "record this image as the cluster's first release",
        Duration::from_secs(5),
        move || match releases::seed(store.as_ref(), &release) {
            Ok(seeded) => Ok(seeded),
            Err(releases::ReleaseError::Store(e)) => Err(e),
            Err(e) => {
                tracing::error!(
                    "cannot record the first release: {}",
                    hawser_attestation::error_chain(&e)
                );
                Ok(false)
            }
        },
    )
    .await;
    if seeded {
        tracing::info!(release = %name, "this image is the cluster's first release");
    }
}

/// Imports the approvals file's names into etcd (put-if-absent), retried until etcd takes it.
pub async fn import_approvals(store: Arc<EtcdStore>, names: Vec<String>, file: PathBuf) {
    let note = format!("imported from {} at hawser-joind start", file.display());
    let imported = crate::store::write_until_done(
        &format!(
            "import the control-plane approvals {} into etcd",
            file.display()
        ),
        Duration::from_secs(5),
        move || store.import_control_plane_approvals(names.iter().map(String::as_str), &note),
    )
    .await;
    tracing::info!(
        file = %file.display(),
        imported = imported.len(),
        "control-plane approvals imported into etcd where absent"
    );
}

/// Why the measurement salt cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SaltError {
    /// The file exists and cannot be read, or cannot be created or written.
    #[error("cannot {action} {path}")]
    File {
        /// `read`, `create` or `write`.
        action: &'static str,
        /// The salt file.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// No random bytes for a new salt.
    #[error("cannot make a new measurement salt")]
    Random(#[from] hawser_keys::KeyError),
}

/// Reads the measurement salt, or creates it (32 random bytes, mode 0600) if missing.
pub fn salt_in_state_dir(path: &Path) -> Result<Vec<u8>, SaltError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let failed = |action| {
        move |source| SaltError::File {
            action,
            path: path.display().to_string(),
            source,
        }
    };
    match std::fs::read(path) {
        Ok(salt) => return Ok(salt),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed("read")(e)),
    }
    let salt = hawser_keys::random_bytes(hawser_keys::MEASUREMENT_SALT_LEN)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(failed("create"))?;
    file.write_all(&salt)
        .and_then(|()| file.sync_all())
        .map_err(failed("write"))?;
    tracing::info!(file = %path.display(), "created a new measurement salt");
    Ok(salt)
}
