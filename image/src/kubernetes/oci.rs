//! An OCI image-layout archive, written deterministically: the one file (`images.tar`) that
//! `ctr -n k8s.io images import` reads on an offline node.
//!
//! ```text
//!   images.tar (ustar, sorted)        blobs are content-addressed: a layer two images
//!   ├── blobs/sha256/<config|layer|manifest>   share is stored once
//!   ├── index.json   one manifest per image, annotated with the tag
//!   │                (org.opencontainers.image.ref.name) and the full name containerd
//!   │                imports it by (io.containerd.image.name)
//!   └── oci-layout
//! ```
//!
//! Layers are uncompressed tars (`application/vnd.oci.image.layer.v1.tar`): the node's erofs
//! compresses the archive, and an uncompressed tar is deterministic without a compressor's
//! version in the picture. Every header (layer or archive) is ustar, written field by field:
//! path, mode (fixed by kind), uid/gid 0, no user or group names, mtime `SOURCE_DATE_EPOCH`,
//! no atime/ctime, no xattrs. The JSON is serde_json over structs (fixed field order) and
//! sorted maps, compact. Same inputs and epoch, same bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter, Read as _, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use crate::tool::{IoError, io_error};

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation containerd names an imported image by (`repository:tag`).
pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation of an index entry: the tag.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Why the archive could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// A layer entry's path is absolute, empty, or climbs with `..`.
    #[error("layer {layer:?}: {path:?} is not a relative path of plain names")]
    BadPath { layer: String, path: String },
    /// Two entries of one layer at the same path, or an entry under a file or symlink.
    #[error("layer {layer:?}: {path:?} is given twice, or under a file or symlink")]
    Conflict { layer: String, path: String },
    /// An image name containerd would refuse, or one given twice.
    #[error(
        "image {name:?}: not a unique `repository:tag` (lowercase repository, tag of \
         [A-Za-z0-9_.-], at most 128 characters)"
    )]
    BadReference { name: String },
    /// An image without layers.
    #[error("image {name:?} has no layers")]
    NoLayers { name: String },
    /// `SOURCE_DATE_EPOCH` cannot be written as the RFC 3339 `created` date.
    #[error("SOURCE_DATE_EPOCH {0} is past what an RFC 3339 date can say (the year 9999)")]
    Epoch(u64),
    /// A file's size changed while it was being archived.
    #[error(
        "{path} changed while it was archived (expected {expected} bytes): archive it again \
         once nothing writes to it"
    )]
    Changed { path: PathBuf, expected: u64 },
    /// A tar header field refused its value.
    #[error("cannot write the tar header of {path:?}")]
    Header {
        path: String,
        #[source]
        source: io::Error,
    },
    /// The JSON of a manifest, config or index could not be made.
    #[error("cannot serialise the {what} of the archive as JSON")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A file or directory could not be read or written.
    #[error(transparent)]
    Io(#[from] IoError),
}

/// The bytes of a regular file in a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Bytes(Vec<u8>),
    /// A file on the build host, read when the layer is written.
    Path(PathBuf),
}

/// One entry of a layer; `path` is relative (`usr/local/bin/kube-apiserver`). Missing parent
/// directories are added with mode 0755.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        content: Content,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Symlink { path, .. } => {
                path
            }
        }
    }
}

/// A layer: its entries (any order: they are sorted by path) and what it is, for the image
/// config's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub description: String,
    pub entries: Vec<Entry>,
}

/// One image of the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// `registry.hawser.invalid/kubernetes/kube-apiserver`
    pub repository: String,
    /// `v1.20.2`
    pub tag: String,
    /// The program and its first arguments (empty: none, `cmd` names the program).
    pub entrypoint: Vec<String>,
    /// The default arguments after the entrypoint (Docker's `CMD`, Kubernetes' `args`); left
    /// out of the config when empty.
    pub cmd: Vec<String>,
    /// `KEY=value`, in the order given.
    pub env: Vec<String>,
    /// Bottom first.
    pub layers: Vec<Layer>,
}

impl ImageSpec {
    /// `repository:tag`, the name containerd gives the imported image.
    pub fn name(&self) -> String {
        format!("{}:{}", self.repository, self.tag)
    }
}

/// What [`write_archive`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// By name, as in `index.json`.
    pub images: Vec<ImageSummary>,
    /// Distinct blobs (configs, manifests, layers).
    pub blobs: usize,
    /// Size of the archive file.
    pub bytes: u64,
}

/// One image of the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSummary {
    /// `repository:tag`
    pub name: String,
    /// `sha256:…` of the manifest.
    pub manifest_digest: String,
    /// Manifest, config and layers, in bytes (shared layers counted in each image).
    pub bytes: u64,
    /// `(sha256:…, bytes)` of each layer, bottom first.
    pub layers: Vec<(String, u64)>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: &'static str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<BTreeMap<&'static str, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    platform: Option<Platform>,
}

#[derive(Serialize)]
struct Platform {
    architecture: &'static str,
    os: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    media_type: &'static str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    schema_version: u32,
    media_type: &'static str,
    manifests: Vec<Descriptor>,
}

#[derive(Serialize)]
struct ImageConfig<'a> {
    created: &'a str,
    architecture: &'static str,
    os: &'static str,
    config: RunConfig<'a>,
    rootfs: RootFs,
    history: Vec<History<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfig<'a> {
    env: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    entrypoint: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cmd: &'a [String],
    working_dir: &'static str,
}

#[derive(Serialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: Vec<String>,
}

#[derive(Serialize)]
struct History<'a> {
    created: &'a str,
    created_by: &'a str,
}

/// Writes `images` as one OCI image-layout archive at `out` (via `<out>.partial` and a staging
/// directory `<out>.staging` beside it, both removed); every timestamp is `epoch`.
pub fn write_archive(
    images: &[ImageSpec],
    epoch: u64,
    out: &Path,
) -> Result<ArchiveSummary, OciError> {
    let created = super::build::build_date(epoch).map_err(|_| OciError::Epoch(epoch))?;
    check_names(images)?;
    let staging = sibling(out, ".staging");
    let partial = sibling(out, ".partial");
    let written = stage_and_write(images, &created, epoch, &staging, &partial, out);
    // Whatever happened, nothing but `out` stays.
    let cleaned = remove_dir_if_exists(&staging);
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    let summary = written?;
    cleaned?;
    Ok(summary)
}

fn stage_and_write(
    images: &[ImageSpec],
    created: &str,
    epoch: u64,
    staging: &Path,
    partial: &Path,
    out: &Path,
) -> Result<ArchiveSummary, OciError> {
    remove_dir_if_exists(staging)?;
    let blob_dir = staging.join("blobs/sha256");
    std::fs::create_dir_all(&blob_dir).map_err(io_error("create directory", &blob_dir))?;
    let mut blobs = Blobs {
        dir: blob_dir,
        sizes: BTreeMap::new(),
    };

    let mut by_name: BTreeMap<String, (Descriptor, ImageSummary)> = BTreeMap::new();
    for image in images {
        let (descriptor, summary) = write_image(image, created, epoch, &mut blobs)?;
        by_name.insert(summary.name.clone(), (descriptor, summary));
    }
    let mut manifests = Vec::new();
    let mut summaries = Vec::new();
    for (descriptor, summary) in by_name.into_values() {
        manifests.push(descriptor);
        summaries.push(summary);
    }
    let index = json(
        "index",
        &Index {
            schema_version: 2,
            media_type: MEDIA_TYPE_INDEX,
            manifests,
        },
    )?;

    write_outer_tar(partial, &blobs, &index, epoch)?;
    std::fs::rename(partial, out).map_err(io_error("rename the archive to", out))?;
    let bytes = std::fs::metadata(out).map_err(io_error("stat", out))?.len();
    Ok(ArchiveSummary {
        images: summaries,
        blobs: blobs.sizes.len(),
        bytes,
    })
}

/// Refuses names containerd would not take, and the same name twice.
fn check_names(images: &[ImageSpec]) -> Result<(), OciError> {
    let mut seen = BTreeSet::new();
    for image in images {
        let name = image.name();
        let repository_ok = !image.repository.is_empty()
            && image
                .repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b));
        let tag_ok = (1..=128).contains(&image.tag.len())
            && image
                .tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && !image.tag.starts_with(['.', '-']);
        if !repository_ok || !tag_ok || !seen.insert(name.clone()) {
            return Err(OciError::BadReference { name });
        }
        if image.layers.is_empty() {
            return Err(OciError::NoLayers { name });
        }
    }
    Ok(())
}

/// Writes the layers, config and manifest of one image; returns its index entry.
fn write_image(
    image: &ImageSpec,
    created: &str,
    epoch: u64,
    blobs: &mut Blobs,
) -> Result<(Descriptor, ImageSummary), OciError> {
    let mut layers = Vec::new();
    for layer in &image.layers {
        layers.push(blobs.put_layer(layer, epoch)?);
    }
    let diff_ids = layers.iter().map(|(digest, _)| digest.clone()).collect();
    let history = image
        .layers
        .iter()
        .map(|layer| History {
            created,
            created_by: &layer.description,
        })
        .collect();
    let config = json(
        "image config",
        &ImageConfig {
            created,
            architecture: "amd64",
            os: "linux",
            config: RunConfig {
                env: &image.env,
                entrypoint: &image.entrypoint,
                cmd: &image.cmd,
                working_dir: "/",
            },
            rootfs: RootFs {
                kind: "layers",
                diff_ids,
            },
            history,
        },
    )?;
    let config = blobs.put_bytes(&config)?;
    let manifest = json(
        "manifest",
        &Manifest {
            schema_version: 2,
            media_type: MEDIA_TYPE_MANIFEST,
            config: descriptor(MEDIA_TYPE_CONFIG, &config),
            layers: layers
                .iter()
                .map(|layer| descriptor(MEDIA_TYPE_LAYER, layer))
                .collect(),
        },
    )?;
    let manifest = blobs.put_bytes(&manifest)?;
    let name = image.name();
    let mut index_entry = descriptor(MEDIA_TYPE_MANIFEST, &manifest);
    index_entry.annotations = Some(BTreeMap::from([
        (ANNOTATION_IMAGE_NAME, name.clone()),
        (ANNOTATION_REF_NAME, image.tag.clone()),
    ]));
    index_entry.platform = Some(Platform {
        architecture: "amd64",
        os: "linux",
    });
    let bytes = manifest.1 + config.1 + layers.iter().map(|(_, size)| size).sum::<u64>();
    let summary = ImageSummary {
        name,
        manifest_digest: manifest.0,
        bytes,
        layers,
    };
    Ok((index_entry, summary))
}

fn descriptor(media_type: &'static str, (digest, size): &(String, u64)) -> Descriptor {
    Descriptor {
        media_type,
        digest: digest.clone(),
        size: *size,
        annotations: None,
        platform: None,
    }
}

fn json(what: &'static str, value: &impl Serialize) -> Result<Vec<u8>, OciError> {
    serde_json::to_vec(value).map_err(|source| OciError::Json { what, source })
}

/// The content-addressed blobs of the staging directory.
struct Blobs {
    dir: PathBuf,
    /// hex digest → size
    sizes: BTreeMap<String, u64>,
}

impl Blobs {
    fn put_bytes(&mut self, bytes: &[u8]) -> Result<(String, u64), OciError> {
        let hex = hex::encode(Sha256::digest(bytes));
        let size = bytes.len() as u64;
        if !self.sizes.contains_key(&hex) {
            let path = self.dir.join(&hex);
            std::fs::write(&path, bytes).map_err(io_error("write", &path))?;
            self.sizes.insert(hex.clone(), size);
        }
        Ok((format!("sha256:{hex}"), size))
    }

    /// Writes the layer's tar (uncompressed: its digest is also its diff ID); a layer already
    /// stored by another image is dropped.
    fn put_layer(&mut self, layer: &Layer, epoch: u64) -> Result<(String, u64), OciError> {
        let entries = normalise(layer)?;
        let staging = self.dir.join("layer.partial");
        let file = File::create(&staging).map_err(io_error("create", &staging))?;
        let mut tar = tar::Builder::new(Hashing::new(BufWriter::new(file)));
        for (path, entry) in &entries {
            append_entry(&mut tar, path, entry, epoch)?;
        }
        let hashing = tar.into_inner().map_err(io_error("write", &staging))?;
        let (hex, size) = hashing.finish(&staging)?;
        if self.sizes.contains_key(&hex) {
            std::fs::remove_file(&staging).map_err(io_error("remove", &staging))?;
        } else {
            let path = self.dir.join(&hex);
            std::fs::rename(&staging, &path).map_err(io_error("rename the layer to", &path))?;
            self.sizes.insert(hex.clone(), size);
        }
        Ok((format!("sha256:{hex}"), size))
    }
}

/// The layer's entries by path (sorted), each path checked, missing parents added as 0755
/// directories.
fn normalise(layer: &Layer) -> Result<BTreeMap<String, Entry>, OciError> {
    let bad = |path: &str| OciError::BadPath {
        layer: layer.description.clone(),
        path: path.to_owned(),
    };
    let conflict = |path: &str| OciError::Conflict {
        layer: layer.description.clone(),
        path: path.to_owned(),
    };
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    for entry in &layer.entries {
        let path = entry.path();
        if path.is_empty()
            || path
                .split('/')
                .any(|part| part.is_empty() || part == "." || part == "..")
        {
            return Err(bad(path));
        }
        if entries.insert(path.to_owned(), entry.clone()).is_some() {
            return Err(conflict(path));
        }
    }
    let paths: Vec<String> = entries.keys().cloned().collect();
    for path in paths {
        let mut parent = path.as_str();
        while let Some((up, _)) = parent.rsplit_once('/') {
            parent = up;
            match entries.get(parent) {
                Some(Entry::Dir { .. }) => {}
                Some(_) => return Err(conflict(&path)),
                None => {
                    let dir = Entry::Dir {
                        path: parent.to_owned(),
                        mode: 0o755,
                    };
                    entries.insert(parent.to_owned(), dir);
                }
            }
        }
    }
    Ok(entries)
}

/// A ustar header: the path, kind, mode and size given; uid/gid 0, no names, mtime `epoch`.
fn header(
    path: &str,
    kind: EntryType,
    mode: u32,
    size: u64,
    epoch: u64,
) -> Result<Header, OciError> {
    let failed = |source| OciError::Header {
        path: path.to_owned(),
        source,
    };
    let mut header = Header::new_ustar();
    header.set_path(path).map_err(failed)?;
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(epoch);
    header.set_size(size);
    header.set_device_major(0).map_err(failed)?;
    header.set_device_minor(0).map_err(failed)?;
    Ok(header)
}

fn append_entry<W: Write>(
    tar: &mut tar::Builder<Hashing<W>>,
    path: &str,
    entry: &Entry,
    epoch: u64,
) -> Result<(), OciError> {
    let tar_error = |source| OciError::Header {
        path: path.to_owned(),
        source,
    };
    match entry {
        Entry::Dir { mode, .. } => {
            let mut h = header(path, EntryType::Directory, *mode, 0, epoch)?;
            h.set_cksum();
            tar.append(&h, io::empty()).map_err(tar_error)
        }
        Entry::Symlink { target, .. } => {
            let mut h = header(path, EntryType::Symlink, 0o777, 0, epoch)?;
            h.set_link_name(target).map_err(tar_error)?;
            h.set_cksum();
            tar.append(&h, io::empty()).map_err(tar_error)
        }
        Entry::File {
            mode,
            content: Content::Bytes(bytes),
            ..
        } => {
            let mut h = header(path, EntryType::Regular, *mode, bytes.len() as u64, epoch)?;
            h.set_cksum();
            tar.append(&h, bytes.as_slice()).map_err(tar_error)
        }
        Entry::File {
            mode,
            content: Content::Path(source),
            ..
        } => {
            let file = File::open(source).map_err(io_error("open", source))?;
            let size = file.metadata().map_err(io_error("stat", source))?.len();
            let mut h = header(path, EntryType::Regular, *mode, size, epoch)?;
            h.set_cksum();
            let before = tar.get_ref().written;
            tar.append(&h, file.take(size))
                .map_err(io_error("archive", source))?;
            // Header, data, padding: a file that shrank would leave a short entry.
            if tar.get_ref().written != before + 512 + size.next_multiple_of(512) {
                return Err(OciError::Changed {
                    path: source.clone(),
                    expected: size,
                });
            }
            Ok(())
        }
    }
}

/// The archive itself: `blobs/`, `blobs/sha256/`, the blobs by digest, `index.json`,
/// `oci-layout`, in that (sorted) order.
fn write_outer_tar(out: &Path, blobs: &Blobs, index: &[u8], epoch: u64) -> Result<(), OciError> {
    let file = File::create(out).map_err(io_error("create", out))?;
    let mut tar = tar::Builder::new(Hashing::new(BufWriter::new(file)));
    let mut entries: Vec<(String, Entry)> = ["blobs", "blobs/sha256"]
        .into_iter()
        .map(|dir| {
            let entry = Entry::Dir {
                path: dir.to_owned(),
                mode: 0o755,
            };
            (dir.to_owned(), entry)
        })
        .collect();
    for hex in blobs.sizes.keys() {
        let path = format!("blobs/sha256/{hex}");
        let content = Content::Path(blobs.dir.join(hex));
        entries.push((path.clone(), regular(path, content)));
    }
    for (path, bytes) in [
        ("index.json", index.to_vec()),
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
    ] {
        entries.push((
            path.to_owned(),
            regular(path.to_owned(), Content::Bytes(bytes)),
        ));
    }
    for (path, entry) in &entries {
        append_entry(&mut tar, path, entry, epoch)?;
    }
    let hashing = tar.into_inner().map_err(io_error("write", out))?;
    hashing.finish(out)?;
    Ok(())
}

fn regular(path: String, content: Content) -> Entry {
    Entry::File {
        path,
        mode: 0o644,
        content,
    }
}

/// `<path><suffix>`, beside it.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

fn remove_dir_if_exists(dir: &Path) -> Result<(), IoError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("remove", dir)(e)),
        _ => Ok(()),
    }
}

/// A writer that hashes and counts what passes through.
struct Hashing<W: Write> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Flushes; the hex sha256 and the size of everything written.
    fn finish(mut self, path: &Path) -> Result<(String, u64), IoError> {
        self.inner.flush().map_err(io_error("write", path))?;
        Ok((hex::encode(self.hasher.finalize()), self.written))
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
