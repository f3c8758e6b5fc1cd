//! The archive writer on small fake images: the same bytes twice, a different epoch different
//! bytes, one blob for a shared layer, the index naming each image, and every header fixed.

use std::collections::BTreeMap;
use std::io::Read as _;

use super::*;

const EPOCH: u64 = 1_700_000_000;

fn base() -> Layer {
    Layer {
        description: "base".into(),
        entries: vec![
            Entry::File {
                path: "etc/passwd".into(),
                mode: 0o644,
                content: Content::Bytes(b"root:x:0:0::/:/bin/false\n".to_vec()),
            },
            Entry::Dir {
                path: "tmp".into(),
                mode: 0o1777,
            },
            Entry::Symlink {
                path: "lib64".into(),
                target: "usr/lib64".into(),
            },
        ],
    }
}

fn images(dir: &Path) -> Vec<ImageSpec> {
    let tool = dir.join("tool");
    std::fs::write(&tool, b"#!/bin/sh\necho tool\n").unwrap();
    let image = |name: &str, binary: Content| ImageSpec {
        repository: format!("registry.hawser.invalid/test/{name}"),
        tag: "v1.2.3".into(),
        entrypoint: vec![format!("/usr/local/bin/{name}")],
        cmd: Vec::new(),
        env: vec!["PATH=/usr/local/bin:/usr/bin".into()],
        layers: vec![
            base(),
            Layer {
                description: format!("{name} binary"),
                entries: vec![Entry::File {
                    path: format!("usr/local/bin/{name}"),
                    mode: 0o755,
                    content: binary,
                }],
            },
        ],
    };
    // Listed out of name order: the index is sorted all the same.
    vec![
        image("zeta", Content::Bytes(b"zeta".to_vec())),
        image("alpha", Content::Path(tool)),
    ]
}

fn build(epoch: u64) -> (Vec<u8>, ArchiveSummary) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("images.tar");
    let summary = write_archive(&images(dir.path()), epoch, &out).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        {
            let mut n = names;
            n.sort();
            n
        },
        ["images.tar", "tool"],
        "staging files left behind"
    );
    (std::fs::read(&out).unwrap(), summary)
}

/// The entries of a tar: path → (header, data), in archive order.
fn entries(bytes: &[u8]) -> Vec<(String, tar::Header, Vec<u8>)> {
    let mut archive = tar::Archive::new(bytes);
    archive
        .entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            (path, entry.header().clone(), data)
        })
        .collect()
}

fn blob<'a>(files: &'a [(String, tar::Header, Vec<u8>)], digest: &str) -> &'a [u8] {
    let hex = digest.strip_prefix("sha256:").unwrap();
    let path = format!("blobs/sha256/{hex}");
    &files.iter().find(|(p, _, _)| *p == path).unwrap().2
}

fn assert_fixed_headers(files: &[(String, tar::Header, Vec<u8>)], epoch: u64) {
    let paths: Vec<&String> = files.iter().map(|(p, _, _)| p).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "entries are not sorted");
    for (path, header, _) in files {
        assert!(header.as_ustar().is_some(), "{path}: not ustar");
        assert_eq!(header.uid().unwrap(), 0, "{path}");
        assert_eq!(header.gid().unwrap(), 0, "{path}");
        assert_eq!(header.mtime().unwrap(), epoch, "{path}");
        assert_eq!(header.username_bytes(), Some(&b""[..]), "{path}");
        assert_eq!(header.groupname_bytes(), Some(&b""[..]), "{path}");
    }
}

#[test]
fn the_same_inputs_give_the_same_bytes_and_another_epoch_other_bytes() {
    let (first, _) = build(EPOCH);
    let (second, _) = build(EPOCH);
    assert!(first == second, "two builds of the same images differ");
    let (later, _) = build(EPOCH + 1);
    assert!(first != later, "the epoch does not reach the archive");
}

#[test]
fn the_index_names_each_image_and_a_shared_layer_is_stored_once() {
    let (bytes, summary) = build(EPOCH);
    let files = entries(&bytes);
    assert_fixed_headers(&files, EPOCH);
    let layout = &files.iter().find(|(p, _, _)| p == "oci-layout").unwrap().2;
    assert_eq!(layout, br#"{"imageLayoutVersion":"1.0.0"}"#);

    let index: serde_json::Value =
        serde_json::from_slice(&files.iter().find(|(p, _, _)| p == "index.json").unwrap().2)
            .unwrap();
    assert_eq!(index["mediaType"], MEDIA_TYPE_INDEX);
    let named: Vec<(String, String)> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let a = &m["annotations"];
            assert_eq!(m["platform"]["architecture"], "amd64");
            (
                a[ANNOTATION_IMAGE_NAME].as_str().unwrap().to_owned(),
                a[ANNOTATION_REF_NAME].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            (
                "registry.hawser.invalid/test/alpha:v1.2.3".to_owned(),
                "v1.2.3".to_owned()
            ),
            (
                "registry.hawser.invalid/test/zeta:v1.2.3".to_owned(),
                "v1.2.3".to_owned()
            ),
        ]
    );

    // base + two binary layers + two configs + two manifests: the base once.
    let blobs = files
        .iter()
        .filter(|(p, h, _)| p.starts_with("blobs/sha256/") && h.entry_type().is_file())
        .count();
    assert_eq!((blobs, summary.blobs), (7, 7));
    assert_eq!(summary.images[0].layers[0], summary.images[1].layers[0]);
    assert_eq!(summary.bytes, bytes.len() as u64);

    // Each blob's name is its sha256, and the manifest's sizes are the blobs' sizes.
    for (path, _, data) in &files {
        if let Some(hex) = path.strip_prefix("blobs/sha256/").filter(|h| !h.is_empty()) {
            assert_eq!(hex::encode(Sha256::digest(data)), hex, "{path}");
        }
    }
    for image in &summary.images {
        let manifest: serde_json::Value =
            serde_json::from_slice(blob(&files, &image.manifest_digest)).unwrap();
        assert_eq!(manifest["mediaType"], MEDIA_TYPE_MANIFEST);
        let config: serde_json::Value =
            serde_json::from_slice(blob(&files, manifest["config"]["digest"].as_str().unwrap()))
                .unwrap();
        assert_eq!(config["created"], "2023-11-14T22:13:20Z");
        assert_eq!(config["history"][1]["created"], "2023-11-14T22:13:20Z");
        assert_eq!(config["os"], "linux");
        let short = image
            .name
            .rsplit('/')
            .next()
            .unwrap()
            .replace(":v1.2.3", "");
        assert_eq!(
            config["config"]["Entrypoint"][0],
            format!("/usr/local/bin/{short}")
        );
        assert_eq!(config["config"]["Env"][0], "PATH=/usr/local/bin:/usr/bin");
        let diff_ids: Vec<String> = config["rootfs"]["diff_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_owned())
            .collect();
        let layer_digests: Vec<String> = image
            .layers
            .iter()
            .map(|(digest, _)| digest.clone())
            .collect();
        assert_eq!(diff_ids, layer_digests, "uncompressed: diff ID = digest");
        for layer in manifest["layers"].as_array().unwrap() {
            assert_eq!(layer["mediaType"], MEDIA_TYPE_LAYER);
            let data = blob(&files, layer["digest"].as_str().unwrap());
            assert_eq!(layer["size"], data.len() as u64);
            assert_fixed_headers(&entries(data), EPOCH);
        }
        // The binary layer: its parents first, as 0755 directories, then the file.
        let layer = entries(blob(&files, &image.layers[1].0));
        let listing: Vec<(String, u32)> = layer
            .iter()
            .map(|(p, h, _)| (p.clone(), h.mode().unwrap()))
            .collect();
        assert_eq!(
            listing,
            [
                ("usr".to_owned(), 0o755),
                ("usr/local".to_owned(), 0o755),
                ("usr/local/bin".to_owned(), 0o755),
                (format!("usr/local/bin/{short}"), 0o755),
            ]
        );
    }
    let base = entries(blob(&files, &summary.images[0].layers[0].0));
    let modes: BTreeMap<String, (u32, Option<String>)> = base
        .iter()
        .map(|(p, h, _)| {
            let link = h
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            (p.clone(), (h.mode().unwrap(), link))
        })
        .collect();
    assert_eq!(modes["tmp"], (0o1777, None));
    assert_eq!(modes["lib64"], (0o777, Some("usr/lib64".to_owned())));
    assert_eq!(modes["etc/passwd"], (0o644, None));
}

#[test]
fn refuses_bad_paths_conflicts_and_bad_names() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("images.tar");
    let with_entry = |entry: Entry| {
        let mut specs = images(dir.path());
        specs[0].layers[1].entries.push(entry);
        write_archive(&specs, EPOCH, &out).unwrap_err()
    };
    for path in ["/etc/x", "usr/../etc", "usr//x", ""] {
        let err = with_entry(Entry::Dir {
            path: path.into(),
            mode: 0o755,
        });
        assert!(matches!(err, OciError::BadPath { .. }), "{path}: {err}");
    }
    let err = with_entry(Entry::Dir {
        path: "usr/local/bin/zeta".into(),
        mode: 0o755,
    });
    assert!(err.to_string().contains("given twice"), "{err}");
    let err = with_entry(Entry::Dir {
        path: "usr/local/bin/zeta/under".into(),
        mode: 0o755,
    });
    assert!(matches!(err, OciError::Conflict { .. }), "{err}");

    let mut specs = images(dir.path());
    specs[1].repository = specs[0].repository.clone();
    let err = write_archive(&specs, EPOCH, &out).unwrap_err();
    assert!(matches!(err, OciError::BadReference { .. }), "{err}");
    let mut specs = images(dir.path());
    specs[0].repository = "Registry/Upper".into();
    assert!(write_archive(&specs, EPOCH, &out).is_err());
    let mut specs = images(dir.path());
    specs[0].tag = "v1+x".into();
    assert!(write_archive(&specs, EPOCH, &out).is_err());
    assert!(matches!(
        write_archive(&images(dir.path()), u64::MAX, &out).unwrap_err(),
        OciError::Epoch(_)
    ));
    assert!(!out.exists(), "a refused archive was written");
}
