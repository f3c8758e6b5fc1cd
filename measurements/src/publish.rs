//! The measurements of a released image, for people who verify it without hawser's source.
//!
//! [`publish`] turns a reference file (`measurements/qemu-node.json`, kept equal to a rebuild by
//! `hawser measurements check`) into one JSON document in Constellation's published-measurements
//! shape (`version`, `ref`, `stream`, `list` of `{csp, attestationVariant, measurements}`), so
//! tools that read Constellation's `measurements.json` read this one, plus a `hawser` object
//! with what a verifier or a rebuild needs: every phase's values (a control plane's PCR 11
//! after its pivot among them, computed from the `enter-initrd` value), PCR 15's rule, the UKI's and
//! the root hash, the stub and kernel, and every pinned input with its sha256. The output is
//! deterministic (keys sorted, no timestamps), so a detached signature of its bytes
//! (`cosign sign-blob`, `gpg --detach-sign`) stays valid for anyone who re-publishes it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::reference::{Measurements, ReferenceMeasurements};
use hawser_pcr::{PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, pcr11_after_pivot};

/// The release a document describes, as Constellation's `version`, `ref` and `stream`.
#[derive(Debug, Clone)]
pub struct Release {
    /// e.g. `v0.1.0`.
    pub version: String,
    /// The branch or `-` for a release.
    pub git_ref: String,
    /// e.g. `stable`, `nightly`, `debug`.
    pub stream: String,
}

/// The attestation variant hawser's QEMU platform reports (a vTPM quoted by swtpm).
pub const QEMU_VARIANT: &str = "qemu-vtpm";

fn map(measurements: &Measurements) -> Value {
    measurements
        .iter()
        .map(|(pcr, m)| {
            let mut entry = json!({"expected": m.expected, "warnOnly": m.warn_only});
            if !m.also_expected.is_empty() {
                entry["alsoExpected"] = json!(m.also_expected);
            }
            (pcr.to_string(), entry)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The document for `reference`; `root_hash` comes from its command line when it is a node
/// image's (`hawser.root_hash=`).
pub fn publish(reference: &ReferenceMeasurements, release: &Release) -> Value {
    let md = &reference.metadata;
    let enter = &reference.measurements;
    let mut leave = enter.clone();
    leave.extend(reference.measurements_after_leave_initrd.clone());
    // A control plane's PID 1 extends `control-plane` before `leave-initrd`: its PCR 11 after
    // the pivot follows from the `enter-initrd` value alone (no field of the reference).
    let mut control_plane = leave.clone();
    if let Some(after_enter) = enter
        .get(&hawser_pcr::PCR_KERNEL_BOOT)
        .and_then(|m| <[u8; 32]>::try_from(hex::decode(&m.expected).ok()?).ok())
    {
        control_plane.insert(
            hawser_pcr::PCR_KERNEL_BOOT,
            crate::reference::Measurement {
                expected: hex::encode(pcr11_after_pivot(&after_enter, true)),
                warn_only: false,
                also_expected: Vec::new(),
            },
        );
    }
    let stub_only: Measurements = BTreeMap::from([(
        hawser_pcr::PCR_KERNEL_BOOT,
        crate::reference::Measurement {
            expected: md.pcr11_after_stub.clone(),
            warn_only: false,
            also_expected: Vec::new(),
        },
    )]);
    let root_hash = md
        .cmdline
        .split_whitespace()
        .find_map(|a| a.strip_prefix("hawser.root_hash="));
    let role = |r: &str| {
        md.inputs
            .iter()
            .find(|p| p.role.eq_ignore_ascii_case(r))
            .map(|p| format!("{} {}", p.name, p.version))
    };
    let enforced: Vec<String> = enter
        .iter()
        .filter(|(_, m)| !m.warn_only)
        .map(|(pcr, _)| pcr.to_string())
        .collect();
    json!({
        "version": release.version,
        "ref": release.git_ref,
        "stream": release.stream,
        "list": [{
            "csp": "QEMU",
            "attestationVariant": QEMU_VARIANT,
            "measurements": map(enter),
        }],
        "hawser": {
            "formatVersion": 1,
            "image": md.image,
            "imageVersion": md.image_version,
            "platform": md.platform,
            "enforced": enforced,
            "firmwareValuesFrom": md.firmware_values_from,
            "phases": {
                "stub": map(&stub_only),
                PHASE_ENTER_INITRD: map(enter),
                PHASE_LEAVE_INITRD: map(&leave),
                "leave-initrd-control-plane": map(&control_plane),
            },
            "pcr15": {
                "fresh": "0000000000000000000000000000000000000000000000000000000000000000",
                "lockedToCluster": "SHA256(0^32 || SHA256(\"hawser-cluster-id:\" || cluster ID)); `hawser measurements predict --cluster-id ID` prints it",
            },
            "bootPaths": md.boot_paths,
            "uki": md.uki,
            "ukiAuthenticode": md.uki_authenticode,
            "kernelAuthenticode": md.kernel_authenticode,
            "stub": role("stub"),
            "kernel": role("kernel"),
            "cmdline": md.cmdline,
            "rootHash": root_hash,
            "sections": md.sections,
            "inputLockDigest": md.input_lock_digest,
            "inputs": md.inputs,
            "rootfsLockDigest": md.rootfs_lock_digest,
            "rootfsPackages": md.rootfs_packages,
            "kubernetesLockDigest": md.kubernetes_lock_digest,
            "generatedBy": md.generated_by,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reference_publishes_in_constellations_shape_with_every_phase() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/qemu-node.json"))
            .expect("the committed node reference");
        let reference = ReferenceMeasurements::parse(&text).expect("parses");
        let release = Release {
            version: "v0.1.0".into(),
            git_ref: "-".into(),
            stream: "stable".into(),
        };
        let doc = publish(&reference, &release);
        // Constellation's reader: version, ref, stream, list[].measurements.
        assert_eq!(doc["version"], "v0.1.0");
        let entry = &doc["list"][0];
        assert_eq!(entry["attestationVariant"], QEMU_VARIANT);
        assert_eq!(
            entry["measurements"]["11"]["expected"],
            reference.measurements[&11].expected
        );
        assert_eq!(entry["measurements"]["0"]["warnOnly"], true);
        let h = &doc["hawser"];
        assert_eq!(
            h["phases"]["leave-initrd"]["11"]["expected"],
            reference.measurements_after_leave_initrd[&11].expected
        );
        assert_eq!(
            h["phases"]["stub"]["11"]["expected"],
            reference.metadata.pcr11_after_stub
        );
        // A control plane after its pivot: `control-plane`, then `leave-initrd`.
        let enter: [u8; 32] = hex::decode(&reference.measurements[&11].expected)
            .expect("hex")
            .try_into()
            .expect("32 bytes");
        assert_eq!(
            h["phases"]["leave-initrd-control-plane"]["11"]["expected"],
            hex::encode(pcr11_after_pivot(&enter, true))
        );
        assert_ne!(
            h["phases"]["leave-initrd-control-plane"]["11"],
            h["phases"]["leave-initrd"]["11"]
        );
        assert_eq!(
            h["phases"]["leave-initrd-control-plane"]["4"],
            h["phases"]["enter-initrd"]["4"]
        );
        assert_eq!(
            h["phases"]["leave-initrd"]["4"],
            h["phases"]["enter-initrd"]["4"]
        );
        assert_eq!(h["rootHash"].as_str().map(str::len), Some(64), "{h:#}");
        assert!(
            h["stub"]
                .as_str()
                .unwrap()
                .starts_with("systemd-boot-efi 257.")
        );
        assert_eq!(h["enforced"], json!(["4", "9", "11", "12", "13", "15"]));
        // Deterministic: the same reference gives the same bytes (a signature stays valid).
        assert_eq!(
            serde_json::to_string(&doc).unwrap(),
            serde_json::to_string(&publish(&reference, &release)).unwrap()
        );
    }
}
