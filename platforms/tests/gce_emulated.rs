//! The `gce` profile end to end on an emulated GCE vTPM: swtpm laid out as GCE lays out its
//! vTPMs by the harness's [`GceTestCa`] (Google's AK template in NV 0x01C10001, the AK
//! certificate of a test chain shaped like Google's in NV 0x01C10000), then, as a node would:
//! both indices read through hawser's TPM reader ([`node::gather_nv`]), the AK re-derived from
//! the template, PCRs 0–23 quoted with the verifier's nonce; and [`gce::verify_pinned`], with
//! the test root trusted explicitly by its fingerprint, accepts it and surfaces the instance.
//! The same evidence under Google's pins ([`gce::verify`]) and with a tampered PCR value is
//! refused.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed assumption fails it

use std::collections::BTreeMap;
use std::sync::OnceLock;

use hawser_attestation::tpm::Tpm;
use hawser_harness::provider_gce::{
    GCE_AK_CERT_NV_INDEX_RSA, GCE_AK_TEMPLATE_NV_INDEX_RSA, GCE_AK_TEMPLATE_RSA, GceTestCa,
    GceTestInstance, ProvisionedGceAk,
};
use hawser_harness::{Swtpm, SwtpmOptions};
use hawser_platforms::VerificationTime;
use hawser_platforms::chain::{Cert, ChainError};
use hawser_platforms::gce::{self, GceError, GceEvidence, GceInstance, GcePolicy, VtpmQuote};
use hawser_platforms::node;
use hawser_platforms::profile::Platform;
use hawser_platforms::tpm_rsa::QuoteError;

mod common;
use common::*;

/// The verifier's nonce (at most 64 bytes: TPM2B_DATA).
const NONCE: &[u8] = b"hawser: the join service's nonce for an emulated GCE node";
/// The PCR a test measures something into, so the quote covers more than zeros.
const MEASURED_PCR: u8 = 15;

/// One emulated GCE node's evidence, made once for every test here (an RSA primary key costs
/// swtpm a moment).
struct Emulated {
    root: Vec<u8>,
    intermediate: Vec<u8>,
    provisioned: ProvisionedGceAk,
    /// What `node::gather_nv` read, by index.
    gathered: BTreeMap<u32, Vec<u8>>,
    /// The node's AK: the `TPMT_PUBLIC` the TPM derived from the template in NV.
    ak_public: Vec<u8>,
    attest: Vec<u8>,
    signature: Vec<u8>,
    pcrs: BTreeMap<u8, Vec<u8>>,
}

impl Emulated {
    fn get() -> &'static Emulated {
        static EMULATED: OnceLock<Emulated> = OnceLock::new();
        EMULATED.get_or_init(Emulated::make)
    }

    fn make() -> Emulated {
        let state = tempfile::tempdir().unwrap();
        let ca = GceTestCa::generate().unwrap();
        // The provider's side: a swtpm on the state directory, laid out as GCE's, stopped.
        let provisioned = ca
            .provision_state_dir(state.path(), &GceTestInstance::example())
            .unwrap_or_else(|e| panic!("provisioning swtpm as a GCE vTPM: {e}"));
        // The node's side: the same TPM, as a VM booted on that state would have it.
        let swtpm = Swtpm::start(&SwtpmOptions::tcp().with_state_dir(state.path()))
            .unwrap_or_else(|e| panic!("swtpm: {e}"));
        let tpm = Tpm::open(&swtpm.tcti().unwrap()).unwrap();
        let gathered = node::gather_nv(&tpm, Platform::Gce).unwrap();
        tpm.extend_sha256_digest(MEASURED_PCR, &[0x42; 32]).unwrap();
        let ak = tpm
            .create_attestation_key_from_template(&gathered[&gce::AK_TEMPLATE_NV_INDEX_RSA])
            .unwrap();
        let selection: Vec<u8> = (0..24).collect();
        let pcrs = tpm
            .read_pcrs_sha256(selection.iter().copied())
            .unwrap()
            .into_iter()
            .map(|(pcr, value)| (pcr, value.to_vec()))
            .collect();
        let quote = tpm.quote_marshalled(&ak, NONCE, &selection).unwrap();
        assert_eq!(quote.pcr_selection, selection);
        // TPM2B_PUBLIC → TPMT_PUBLIC.
        let ak_public = ak.public_tpm2b()[2..].to_vec();
        Emulated {
            root: ca.root_der().to_vec(),
            intermediate: ca.intermediate_der().to_vec(),
            provisioned,
            gathered,
            ak_public,
            attest: quote.attest,
            signature: quote.signature,
            pcrs,
        }
    }

    /// The node's evidence, with `pcrs` presented and `intermediates` sent along.
    fn evidence<'a>(
        &'a self,
        intermediates: &'a [&'a [u8]],
        pcrs: &'a BTreeMap<u8, Vec<u8>>,
    ) -> GceEvidence<'a> {
        GceEvidence {
            ak_public: &self.ak_public,
            ak_certificate: &self.gathered[&gce::AK_CERT_NV_INDEX_RSA],
            intermediates,
            quote: VtpmQuote {
                attest: &self.attest,
                signature: &self.signature,
                pcrs,
            },
        }
    }

    fn root_fingerprint(&self) -> String {
        Cert::parse("the test root", &self.root)
            .unwrap()
            .fingerprint()
    }

    /// `gce::verify_pinned` with the test root trusted by its fingerprint.
    fn verify_trusting_the_test_root(
        &self,
        pcrs: &BTreeMap<u8, Vec<u8>>,
        nonce: &[u8],
    ) -> Result<gce::VerifiedGce, GceError> {
        let intermediates = [self.intermediate.as_slice()];
        let fingerprint = self.root_fingerprint();
        gce::verify_pinned(
            &self.evidence(&intermediates, pcrs),
            &[&self.root],
            &[fingerprint.as_str()],
            nonce,
            VerificationTime::now(),
        )
    }
}

#[test]
fn an_emulated_gce_node_verifies_with_the_test_root_trusted_explicitly() {
    let e = Emulated::get();
    // The node read GCE's two indices, holding what the provider wrote.
    assert_eq!(
        e.gathered.keys().copied().collect::<Vec<_>>(),
        [gce::AK_CERT_NV_INDEX_RSA, gce::AK_TEMPLATE_NV_INDEX_RSA]
    );
    assert_eq!(
        e.gathered[&gce::AK_TEMPLATE_NV_INDEX_RSA],
        GCE_AK_TEMPLATE_RSA
    );
    assert_eq!(
        e.gathered[&gce::AK_CERT_NV_INDEX_RSA],
        e.provisioned.ak_certificate
    );
    // The node re-derived exactly the key the provider certified.
    assert_eq!(e.ak_public, e.provisioned.ak_public);
    assert_ne!(e.pcrs[&MEASURED_PCR], [0; 32]);

    let verified = e.verify_trusting_the_test_root(&e.pcrs, NONCE).unwrap();
    assert_eq!(verified.pcrs, e.pcrs);
    let example = GceTestInstance::example();
    assert_eq!(
        verified.instance,
        Some(GceInstance {
            zone: example.zone,
            project_number: example.project_number,
            project_id: example.project_id,
            instance_id: example.instance_id,
            instance_name: example.instance_name,
            security_version: example.security_version,
            is_production: example.is_production,
        })
    );
    // The policy judges the surfaced instance as it would Google's.
    let policy = |projects: &[&str]| GcePolicy {
        project_ids: projects.iter().map(|p| (*p).to_owned()).collect(),
        minimum_security_version: 1,
        ..GcePolicy::default()
    };
    gce::judge(&verified, &policy(&["hawser-test"])).unwrap();
    let err = gce::judge(&verified, &policy(&["someone-else"])).unwrap_err();
    assert!(matches!(err, GceError::Project { .. }), "{err}");

    // Trusting the test root alongside Google's: the same verdict.
    let fingerprint = e.root_fingerprint();
    let pins = [
        gce::GOOGLE_ROOTS[0],
        gce::GOOGLE_ROOTS[1],
        fingerprint.as_str(),
    ];
    let intermediates = [e.intermediate.as_slice()];
    gce::verify_pinned(
        &e.evidence(&intermediates, &e.pcrs),
        &[&e.root],
        &pins,
        NONCE,
        VerificationTime::now(),
    )
    .unwrap();
    // Without the intermediate (neither sent nor in the verifier's bundle): refused by name.
    let err = gce::verify_pinned(
        &e.evidence(&[], &e.pcrs),
        &[&e.root],
        &pins,
        NONCE,
        VerificationTime::now(),
    )
    .unwrap_err();
    assert!(matches!(err, GceError::NoIntermediate(0)), "{err}");
}

#[test]
fn the_emulated_evidence_is_refused_under_googles_pins() {
    let e = Emulated::get();
    let intermediates = [e.intermediate.as_slice()];
    let evidence = e.evidence(&intermediates, &e.pcrs);
    // The test root presented as a root: refused by the fingerprint rule, naming it.
    let err = gce::verify(&evidence, &[&e.root], NONCE, VerificationTime::now()).unwrap_err();
    let fingerprint = e.root_fingerprint();
    assert!(
        matches!(&err, GceError::Chain(ChainError::UnpinnedRoot { fingerprint: f, .. })
            if *f == fingerprint),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("is not a pinned root"), "{message}");
    assert!(message.contains(&fingerprint), "{message}");
    assert!(message.contains(gce::GOOGLE_ROOTS[0]), "{message}");
    // Google's genuine root given instead: it did not issue the test intermediate.
    let google = GceVector::load().root;
    let err = gce::verify(&evidence, &[&google], NONCE, VerificationTime::now()).unwrap_err();
    assert!(matches!(err, GceError::NoRoot(1)), "{err}");
    // The test chain is not trusted because of its names either: the test root's subject and
    // issuer say TEST.
    let root = Cert::parse("the test root", &e.root).unwrap();
    assert!(root.x509.subject().to_string().contains("TEST"));
}

#[test]
fn a_tampered_pcr_value_or_another_nonce_is_refused() {
    let e = Emulated::get();
    let mut tampered = e.pcrs.clone();
    tampered.insert(MEASURED_PCR, vec![0; 32]);
    let err = e
        .verify_trusting_the_test_root(&tampered, NONCE)
        .unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::PcrDigest { .. })),
        "{err}"
    );
    let mut fewer = e.pcrs.clone();
    fewer.remove(&23);
    let err = e.verify_trusting_the_test_root(&fewer, NONCE).unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::PcrSet { .. })),
        "{err}"
    );
    let err = e
        .verify_trusting_the_test_root(&e.pcrs, b"another nonce")
        .unwrap_err();
    assert!(
        matches!(err, GceError::Quote(QuoteError::Nonce { .. })),
        "{err}"
    );
}

#[test]
fn the_emulation_uses_googles_indices_template_and_certificate_shape() {
    assert_eq!(GCE_AK_CERT_NV_INDEX_RSA, gce::AK_CERT_NV_INDEX_RSA);
    assert_eq!(GCE_AK_TEMPLATE_NV_INDEX_RSA, gce::AK_TEMPLATE_NV_INDEX_RSA);
    // The template is the genuine AK's public area with an empty unique (the modulus is what
    // the TPM makes of it).
    let genuine = GceVector::load();
    let ak_pub = &genuine.attestation.ak_pub;
    assert_eq!(ak_pub.len(), 22 + 2 + 256);
    assert_eq!(GCE_AK_TEMPLATE_RSA[..22], ak_pub[..22]);
    assert_eq!(GCE_AK_TEMPLATE_RSA[22..], [0, 0]);

    // The AK certificate has the genuine one's shape (module docs of provider_gce).
    let e = Emulated::get();
    let google = Cert::parse("Google's AK certificate", &genuine.attestation.ak_cert).unwrap();
    let test = Cert::parse("the test AK certificate", &e.provisioned.ak_certificate).unwrap();
    for cert in [&google, &test] {
        let x509 = &cert.x509;
        assert_eq!(
            x509.subject().iter().count(),
            0,
            "{}: empty subject",
            cert.which
        );
        let san = x509.subject_alternative_name().unwrap().unwrap();
        assert!(san.critical, "{}: a critical subjectAltName", cert.which);
        assert_eq!(san.value.general_names.len(), 1);
        let key_usage = x509.key_usage().unwrap().unwrap();
        assert!(key_usage.critical && key_usage.value.digital_signature());
        assert_eq!(
            key_usage.value.flags, 1,
            "{}: digitalSignature only",
            cert.which
        );
        let eku = x509.extended_key_usage().unwrap().unwrap();
        assert_eq!(
            eku.value
                .other
                .iter()
                .map(|oid| oid.to_id_string())
                .collect::<Vec<_>>(),
            ["2.23.133.8.1"],
            "{}",
            cert.which
        );
        let constraints = x509.basic_constraints().unwrap().unwrap();
        assert!(constraints.critical && !constraints.value.ca);
        let info = x509
            .extensions()
            .iter()
            .find(|ext| ext.oid.to_id_string() == gce::INSTANCE_INFO_OID)
            .unwrap();
        gce::parse_instance_info(info.value).unwrap();
    }
    // The same TPM directory name, byte for byte.
    let san = |cert: &Cert<'_>| {
        cert.x509
            .extensions()
            .iter()
            .find(|ext| ext.oid.to_id_string() == "2.5.29.17")
            .unwrap()
            .value
            .to_vec()
    };
    assert_eq!(san(&test), san(&google));
}
