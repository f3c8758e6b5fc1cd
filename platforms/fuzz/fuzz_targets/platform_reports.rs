//! The platforms' parsers of untrusted bytes, and the verifiers behind them with a genuine
//! endorsement: an HCL report (its binding and HCLAkPub), an SEV-SNP report (verified against
//! virtee's genuine Milan VCEK chain, judged by a policy), RSA AK public areas and quote
//! signatures, GCE's instance-information extension, a measurements file's profile.
// cargo-fuzz builds this file as a libFuzzer binary (`--cfg fuzzing`); `tests/fuzz_seeds.rs`
// of the crate compiles it as a module and replays the seeds through `run`.
#![cfg_attr(fuzzing, no_main)]

use std::sync::OnceLock;

use hawser_platforms::VerificationTime;
use hawser_platforms::azure::HclReport;
use hawser_platforms::profile::Platform;
use hawser_platforms::snp::{self, AttestationReport, SnpEndorsement, SnpPolicy};
use hawser_platforms::tpm_rsa::{RsaPublic, RsaSignature};

/// virtee's Milan VCEK and AMD's Milan ASK and ARK (tests/vectors/, Apache-2.0).
fn milan() -> &'static (Vec<u8>, Vec<u8>, Vec<u8>) {
    static CHAIN: OnceLock<(Vec<u8>, Vec<u8>, Vec<u8>)> = OnceLock::new();
    CHAIN.get_or_init(|| {
        // platforms/tests/vectors, from the fuzz crate (platforms/fuzz) or from platforms'
        // own seed replay (tests/fuzz_seeds.rs).
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let platforms = if manifest.ends_with("fuzz") {
            manifest.join("..")
        } else {
            manifest.to_path_buf()
        };
        let vectors = platforms.join("tests/vectors");
        let read = |path: &str| {
            std::fs::read(vectors.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let pem = String::from_utf8(read("sev-snp/go-sev-guest/ask_ark_milan.pem"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ders = pem_ders(&pem);
        let ark = ders.pop().unwrap_or_default();
        let ask = ders.pop().unwrap_or_default();
        (read("sev-snp/virtee-sev/vcek_milan.der"), ask, ark)
    })
}

/// The base64 bodies of a PEM file's certificates, decoded.
fn pem_ders(pem: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .filter_map(|block| block.split("-----END CERTIFICATE-----").next())
        .map(|body| {
            let body: String = body.split_whitespace().collect();
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .unwrap_or_default()
        })
        .collect()
}

/// One input, as the fuzzer gives it.
pub fn run(data: &[u8]) {
    if let Ok(hcl) = HclReport::parse(data) {
        let _ = hcl.check_binding();
        let _ = hcl.ak_public();
    }
    if let Ok(report) = AttestationReport::from_bytes(data) {
        let _ = report.debug_allowed();
        let _ = snp::judge(&report, &SnpPolicy::default());
        let (vcek, ask, ark) = milan();
        let endorsement = SnpEndorsement {
            key: vcek,
            intermediate: ask,
            root: ark,
        };
        let _ = snp::verify(
            data,
            &endorsement,
            &SnpPolicy::default(),
            VerificationTime(1_704_067_200),
        );
    }
    if let Ok(key) = RsaPublic::parse_tpmt(data)
        && let Ok(signature) = RsaSignature::parse(data)
    {
        let _ = key.verify(data, &signature);
    }
    let _ = hawser_platforms::gce::parse_instance_info(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Platform::from_measurements(text);
    }
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));
