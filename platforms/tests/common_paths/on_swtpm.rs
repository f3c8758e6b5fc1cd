//! The Azure node side on a real TPM (swtpm): the AK made persistent at 0x81000003 with Azure's
//! template by tpm2-tools, an HCL report in NV 0x01400001 whose runtime data names that key
//! (arranged: the genuine TDX capture's header and TDREPORT slot, this TPM's key as HCLAkPub;
//! libtpms holds at most 2048 bytes per index, the capture's report is 2600), and the genuine
//! AK certificate in 0x01C101D0 (of Azure's key: the node does not check it, the verifier does).
use super::*;
use hawser_attestation::tpm::Tpm;
use hawser_platforms::node::{AZURE_AK_HANDLE, AzureAuxRequest};
use hawser_platforms::tpm_rsa::{RsaPublic, VtpmQuote, verify_quote};

fn tpm2_tool(swtpm: &hawser_harness::Swtpm, tool: &str, args: &[&str], dir: &std::path::Path) {
    // A missing tool fails naming its package (tpm2-tools).
    let binary =
        hawser_harness::find_binary(std::path::Path::new(tool)).unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(binary)
        .args(args)
        .env("TPM2TOOLS_TCTI", swtpm.tcti().unwrap())
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The TDX capture's HCL report with `runtime_data` in place of its own.
fn hcl_report_naming(runtime_data: &[u8]) -> Vec<u8> {
    let mut report = AzureTdxVector::load().hcl_report[..1236].to_vec();
    report[1216 + 16..1216 + 20]
        .copy_from_slice(&u32::try_from(runtime_data.len()).unwrap().to_le_bytes());
    report.extend_from_slice(runtime_data);
    report
}

#[test]
fn an_azure_node_quotes_with_the_persistent_ak_and_sends_its_hcl_report() {
    let swtpm = hawser_harness::Swtpm::start(&hawser_harness::SwtpmOptions::tcp())
        .unwrap_or_else(|e| panic!("swtpm: {e}"));
    let dir = tempfile::tempdir().unwrap();
    tpm2_tool(
        &swtpm,
        "tpm2_createprimary",
        &[
            "-C",
            "e",
            "-G",
            "rsa2048:rsassa-sha256:null",
            "-g",
            "sha256",
            "-a",
            "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|restricted|sign",
            "-c",
            "ak.ctx",
        ],
        dir.path(),
    );
    tpm2_tool(
        &swtpm,
        "tpm2_evictcontrol",
        &["-C", "o", "-c", "ak.ctx", "0x81000003"],
        dir.path(),
    );
    tpm2_tool(&swtpm, "tpm2_flushcontext", &["-t"], dir.path());
    let tpm = Arc::new(Tpm::open(&swtpm.tcti().unwrap()).unwrap());
    let key = tpm
        .load_persistent_attestation_key(AZURE_AK_HANDLE)
        .unwrap();
    assert!(key.is_persistent());
    let public = RsaPublic::parse_tpmt(&key.public_tpm2b()[2..]).unwrap();
    assert_eq!(
        public.object_attributes, 0x0005_0472,
        "Azure's AK attributes"
    );
    let name = key.name().to_vec();
    drop(key);
    // Dropping the guard left the key: it loads again, the same.
    let again = tpm
        .load_persistent_attestation_key(AZURE_AK_HANDLE)
        .unwrap();
    assert_eq!(again.name(), name);
    drop(again);
    let err = tpm
        .load_persistent_attestation_key(0x8100_0004)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no key is persistent at handle 0x81000004"),
        "{err}"
    );

    // An HCL report naming another key (the capture's own HCLAkPub): the node refuses.
    let tdx = AzureTdxVector::load();
    let (capture_modulus, _) = azure::HclReport::parse(&tdx.hcl_report)
        .unwrap()
        .ak_public()
        .unwrap();
    let store = |index: u32, data: &[u8]| {
        hawser_harness::provider::store_nv(&swtpm, index, data)
            .unwrap_or_else(|e| panic!("NV {index:#010x}: {e}"))
    };
    store(
        azure::HCL_REPORT_NV_INDEX,
        &hcl_report_naming(&runtime_naming(&capture_modulus)),
    );
    store(azure::AK_CERT_NV_INDEX, &tdx.ak_certificate);
    let err = node::issuer_for_azure(Platform::AzureTdx, tpm.clone(), |_| {
        Ok(tdx.td_quote.clone())
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            NodeError::AkNotHcl {
                handle: AZURE_AK_HANDLE,
                ..
            }
        ),
        "{err}"
    );

    // Naming this TPM's key: the issuer asks for the TD quote of the report's TDREPORT and
    // sends the report, the answer and the AK certificate with every quote.
    let report = hcl_report_naming(&runtime_naming(&public.modulus));
    store(azure::HCL_REPORT_NV_INDEX, &report);
    let mut asked = None;
    let issuer = node::issuer_for_azure(Platform::AzureTdx, tpm.clone(), |request| {
        asked = Some(request.clone());
        Ok(tdx.td_quote.clone())
    })
    .unwrap();
    assert_eq!(
        asked,
        Some(AzureAuxRequest::TdQuote {
            td_report: tdx.hcl_report[32..32 + 1024].to_vec()
        })
    );
    let evidence = issuer.issue_evidence(&binding(), b"user").unwrap();
    assert_eq!(evidence.variant, Variant::AzureTdx as i32);
    assert_eq!(evidence.platform_report, report);
    assert_eq!(evidence.platform_aux, tdx.td_quote);
    assert_eq!(evidence.ak_cert_chain, vec![tdx.ak_certificate.clone()]);
    assert_eq!(tpm_name(&evidence.ak_public), name);
    // The quote is RSASSA by the persistent key over the binding, and its qualifiedSigner
    // names the key as a primary of the endorsement hierarchy: what AzureVerifier checks.
    let pcrs = evidence
        .pcrs_sha256
        .iter()
        .map(|(k, v)| (u8::try_from(*k).unwrap(), v.clone()))
        .collect();
    let attest = verify_quote(
        &public.modulus,
        public.exponent,
        &VtpmQuote {
            attest: &evidence.quote,
            signature: &evidence.signature,
            pcrs: &pcrs,
        },
        &binding().qualifying_data(b"user"),
    )
    .unwrap();
    let mut qualified = vec![0x00, 0x0b];
    use sha2::Digest as _;
    qualified.extend_from_slice(&sha2::Sha256::digest(
        [0x4000_000bu32.to_be_bytes().as_slice(), &name].concat(),
    ));
    assert_eq!(attest.qualified_signer, qualified);
    drop(issuer);
    tpm.load_persistent_attestation_key(AZURE_AK_HANDLE)
        .unwrap();
    // issuer_for names the Azure issuer.
    let err = node::issuer_for(Platform::AzureTdx, tpm).unwrap_err();
    assert!(
        matches!(err, NodeError::NeedsMetadata(Platform::AzureTdx)),
        "{err}"
    );
}

/// Runtime data as the HCL writes it, naming the RSA key of `modulus` as HCLAkPub.
fn runtime_naming(modulus: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(modulus);
    serde_json::json!({
        "keys": [{"kid": "HCLAkPub", "key_ops": ["sign"], "kty": "RSA", "e": "AQAB", "n": n}],
        "vm-configuration": {"secure-boot": true, "tpm-enabled": true},
    })
    .to_string()
    .into_bytes()
}
