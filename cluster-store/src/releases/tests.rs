use super::*;
use crate::FileStore;

fn store() -> (tempfile::TempDir, FileStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(&dir.path().join("joined-disks")).unwrap();
    (dir, store)
}

fn measurements(byte: u8) -> ExpectedMeasurements {
    let mut m = ExpectedMeasurements::new();
    for pcr in [4u8, 9, 11] {
        m.insert(
            pcr,
            ExpectedPcr {
                expected: [byte; 32],
                warn_only: false,
            },
        );
    }
    m.insert(
        0,
        ExpectedPcr {
            expected: [0xee; 32],
            warn_only: true,
        },
    );
    m
}

fn release(name: &str, byte: u8, at: u64) -> Release {
    Release::new(name, &measurements(byte), None, "admin", at).unwrap()
}

#[test]
fn a_release_keeps_the_enforced_pcrs_and_reads_a_published_document() {
    let r = release("v1", 1, 10);
    assert_eq!(
        r.measurements.keys().copied().collect::<Vec<_>>(),
        vec![4, 9, 11]
    );
    let published = serde_json::json!({
        "version": "v0.2.0",
        "list": [{"csp": "QEMU", "measurements": {
            "4": {"expected": hex::encode([1u8; 32]), "warnOnly": false},
            "9": {"expected": hex::encode([1u8; 32]), "warnOnly": false},
            "11": {"expected": hex::encode([1u8; 32]), "warnOnly": false},
            "1": {"expected": hex::encode([7u8; 32]), "warnOnly": true}
        }}]
    });
    let from_doc =
        Release::from_measurements_text("v1", &published.to_string(), "admin", 10).unwrap();
    assert_eq!(from_doc.digest, r.digest, "the same image, the same digest");
    assert_eq!(from_doc.version.as_deref(), Some("v0.2.0"));
    assert_eq!(
        from_doc.attestation_variant, None,
        "a QEMU release names no platform"
    );
    // A cloud's release keeps its platform profile, in a verifier map or a published list.
    let mut gce = published.clone();
    gce["list"][0]["attestationVariant"] = "gcp-sev-es".into();
    let from_doc = Release::from_measurements_text("v1", &gce.to_string(), "admin", 10).unwrap();
    assert_eq!(from_doc.attestation_variant.as_deref(), Some("gcp-sev-es"));
    let mut map = published["list"][0]["measurements"].clone();
    map["attestationVariant"] = "azure-sev-snp".into();
    let from_map = Release::from_measurements_text("v1", &map.to_string(), "admin", 10).unwrap();
    assert_eq!(
        from_map.attestation_variant.as_deref(),
        Some("azure-sev-snp")
    );
    assert_eq!(
        from_map.digest, r.digest,
        "the platform is not part of the digest"
    );
    let err = Release::from_measurements_text("bad name", "{}", "admin", 0).unwrap_err();
    assert!(err.to_string().contains("\"bad name\""), "{err}");
    let err = Release::from_measurements_text("v", "{}", "admin", 0).unwrap_err();
    assert!(matches!(err, ReleaseError::NothingEnforced), "{err}");
}

#[test]
fn add_list_retire_and_what_a_join_service_accepts() {
    let (_dir, store) = store();
    assert!(seed(&store, &release("first", 1, 1)).unwrap());
    assert!(
        !seed(&store, &release("again", 2, 2)).unwrap(),
        "seeds only an empty store"
    );
    assert_eq!(add(&store, &release("v2", 2, 3)).unwrap(), Added::New);
    assert_eq!(add(&store, &release("v2", 2, 3)).unwrap(), Added::Present);
    let taken = add(&store, &release("v2", 3, 4)).unwrap_err();
    assert!(
        taken
            .to_string()
            .starts_with("release v2 exists with other measurements"),
        "{taken}"
    );
    let same = add(&store, &release("v2-again", 2, 4)).unwrap_err();
    assert_eq!(
        same.to_string(),
        "these measurements are release v2 already"
    );

    let names: Vec<String> = list(&store, ReadConsistency::Latest)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["first", "v2"]);

    // The old image's join service, before retirement: both accepted, its own by name.
    let stored = list(&store, ReadConsistency::Latest).unwrap();
    let set = release_set(&stored, &measurements(1));
    let accepted: Vec<&str> = set.accepted().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(accepted, ["first", "v2"]);

    retire(&store, "first", 5).unwrap();
    let unknown = retire(&store, "v9", 5).unwrap_err();
    assert_eq!(
        unknown.to_string(),
        "no release is named v9 (the cluster has: first, v2)"
    );
    let last = retire(&store, "v2", 6).unwrap_err();
    assert!(matches!(last, ReleaseError::LastAccepted(_)), "{last}");
    let back = add(&store, &release("first-again", 1, 7)).unwrap_err();
    assert!(back.to_string().contains("retired"), "{back}");

    // Even the old image's own join service refuses its own image once it is retired.
    let stored = list(&store, ReadConsistency::Latest).unwrap();
    let set = release_set(&stored, &measurements(1));
    let accepted: Vec<&str> = set.accepted().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(accepted, ["v2"]);
    let quote: BTreeMap<u8, [u8; 32]> = [4u8, 9, 11].into_iter().map(|p| (p, [1; 32])).collect();
    let refused = set.check(&quote).unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with("the node runs release first, which the cluster's admin retired"),
        "{refused}"
    );

    // An image the store does not know goes by its digest.
    let set = release_set(&stored, &measurements(9));
    assert!(
        set.accepted()[0].name.starts_with("image-"),
        "{:?}",
        set.accepted()[0].name
    );
}
