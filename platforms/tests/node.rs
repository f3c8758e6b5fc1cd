//! The node side against a real swtpm: each profile's NV layout written with genuine captured
//! bytes, read back through hawser's TPM reader, and verified; a missing index refused by name.
//! And configfs-tsm's absence named (no SEV-SNP or TDX guest runs here).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use hawser_attestation::tpm::Tpm;
use hawser_platforms::node::{self, NodeError};
use hawser_platforms::profile::Platform;
use hawser_platforms::{azure, gce};

mod common;
use common::*;

fn swtpm() -> hawser_harness::Swtpm {
    hawser_harness::Swtpm::start(&hawser_harness::SwtpmOptions::tcp())
        .unwrap_or_else(|e| panic!("swtpm: {e}"))
}

fn store(swtpm: &hawser_harness::Swtpm, index: u32, data: &[u8]) {
    hawser_harness::provider::store_nv(swtpm, index, data)
        .unwrap_or_else(|e| panic!("storing NV {index:#010x}: {e}"));
}

#[test]
fn a_gce_node_reads_googles_ak_certificate_and_template_which_verify() {
    let v = GceVector::load();
    let swtpm = swtpm();
    store(&swtpm, gce::AK_CERT_NV_INDEX_RSA, &v.attestation.ak_cert);
    store(&swtpm, gce::AK_TEMPLATE_NV_INDEX_RSA, &v.attestation.ak_pub);
    let tpm = Tpm::open(&swtpm.tcti().unwrap()).unwrap();
    let gathered = node::gather_nv(&tpm, Platform::Gce).unwrap();
    assert_eq!(
        gathered.keys().copied().collect::<Vec<_>>(),
        [gce::AK_CERT_NV_INDEX_RSA, gce::AK_TEMPLATE_NV_INDEX_RSA]
    );
    // What the node read is what the verifier accepts: Google's certificate, from the TPM.
    let intermediates = [v.intermediate.as_slice()];
    let verified = gce::verify(
        &gce::GceEvidence {
            ak_public: &gathered[&gce::AK_TEMPLATE_NV_INDEX_RSA],
            ak_certificate: &gathered[&gce::AK_CERT_NV_INDEX_RSA],
            intermediates: &intermediates,
            quote: gce::VtpmQuote {
                attest: &v.quote.quote,
                signature: &v.quote.raw_sig,
                pcrs: &v.pcrs,
            },
        },
        &[&v.root],
        &GCE_NONCE,
        GCE_AT,
    )
    .unwrap();
    assert!(verified.instance.is_some());
    // The same TPM under the Azure profile: no HCL report, named with its index.
    let err = node::gather_nv(&tpm, Platform::AzureSnp).unwrap_err();
    assert!(matches!(err, NodeError::Missing { index, .. } if index == azure::HCL_REPORT_NV_INDEX));
    assert_eq!(
        err.to_string(),
        "NV index 0x01400001 (the HCL report (the CPU's report binding HCLAkPub)) is not defined \
         on this TPM: is this a azure-snp VM? The cluster's measurements select azure-snp"
    );
}

#[test]
fn an_azure_node_reads_its_ak_certificate_and_needs_the_hcl_report() {
    let capture = yaml("azure/azure-tdx-with-ak-intermediates-1780922561.yaml");
    let ak_certificate = pem_ders(
        capture["tpm_attestation"]["ak_certificate_pem"]
            .as_str()
            .unwrap(),
    )
    .remove(0);
    let swtpm = swtpm();
    store(&swtpm, azure::AK_CERT_NV_INDEX, &ak_certificate);
    // The HCL report is 2600 bytes on Azure; libtpms (swtpm) holds at most 2048 in one NV index
    // (MAX_NV_INDEX_SIZE), so its fixed part and the runtime data cannot both be stored here:
    // the reader's chunked reads of a full 2048-byte index stand in for it.
    let filler: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
    store(&swtpm, azure::HCL_USER_DATA_NV_INDEX, &filler);
    let tpm = Tpm::open(&swtpm.tcti().unwrap()).unwrap();
    assert_eq!(tpm.read_nv(azure::HCL_USER_DATA_NV_INDEX).unwrap(), filler);
    let err = node::gather_nv(&tpm, Platform::AzureTdx).unwrap_err();
    assert!(
        matches!(err, NodeError::Missing { index, platform: Platform::AzureTdx, .. }
        if index == azure::HCL_REPORT_NV_INDEX)
    );
    // The AK certificate reads back byte for byte.
    let read = tpm.read_nv(azure::AK_CERT_NV_INDEX).unwrap();
    assert_eq!(read, ak_certificate);
    // A QEMU node's layout is not there: the provider CA's certificate index is missing.
    let err = node::gather_nv(&tpm, Platform::Qemu).unwrap_err();
    assert!(err.to_string().contains("0x01c10002"), "{err}");
}

#[test]
fn bare_snp_and_tdx_need_configfs_tsm_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    // No report directory: the kernel has no TSM provider (this host is no SNP or TDX guest).
    let err = node::tsm_report(dir.path(), Platform::SevSnp, "hawser", &[0; 64]).unwrap_err();
    assert!(matches!(err, NodeError::NoTsm { .. }), "{err}");
    assert!(err.to_string().contains("sev_guest driver"), "{err}");
    let err = node::tsm_report(dir.path(), Platform::Gce, "hawser", &[0; 64]).unwrap_err();
    assert!(matches!(err, NodeError::NotTsm { .. }), "{err}");
    let err = node::tsm_report(dir.path(), Platform::Tdx, "hawser", &[0; 64]).unwrap_err();
    assert!(err.to_string().contains("tdx_guest driver"), "{err}");
}
