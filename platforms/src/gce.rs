//! Google Compute Engine's vTPM (Shielded and Confidential VMs): a TPM quote by the AK whose
//! certificate Google's CA issued and stored in the vTPM's NV, verified offline.
//!
//! The evidence has the shape hawser's own has on QEMU, with Google in the provider's place:
//! the AK certificate (NV [`AK_CERT_NV_INDEX_RSA`] or [`AK_CERT_NV_INDEX_ECC`]) chains through
//! an intermediate to one of Google's two pinned roots ([`GOOGLE_ROOTS`]); its key must be the
//! quoting AK (a restricted signing key); the quote's `extraData` is the verifier's nonce; its
//! PCR digest covers the PCR values presented. The certificate also names the instance (the
//! instance-information extension, [`GceInstance`]), which the verified evidence carries.
//!
//! Google's AK certificates have an empty subject and a critical subjectAltName holding only a
//! directory name (the TPM's manufacturer "GOOG", model "vTPM"); path validators built for the
//! web refuse those, so the chain is walked by [`super::chain`].
//!
//! [`verify`] trusts Google's roots and no other. [`verify_pinned`] trusts the roots its caller
//! names by fingerprint instead: the way a test chain shaped like Google's (the harness's
//! emulated GCE vTPM, `hawser_harness::provider_gce`) is trusted, explicitly.

use std::collections::BTreeMap;

use x509_parser::der_parser::asn1_rs::{Any, Class, FromDer as _, Tag};
use x509_parser::public_key::PublicKey;

use crate::chain::{Cert, ChainError, VerificationTime, trim, verify_chain};
use crate::tpm_rsa::{QuoteError, RsaPublic, verify_quote};
use hawser_attestation::tpm_types::{ParseError, object_attributes};

/// GCE's NV index of the RSA AK's certificate.
pub const AK_CERT_NV_INDEX_RSA: u32 = 0x01c1_0000;
/// GCE's NV index of the ECC AK's certificate (the index hawser's QEMU provider uses too).
pub const AK_CERT_NV_INDEX_ECC: u32 = 0x01c1_0002;
/// GCE's NV index of the RSA AK's template (`TPMT_PUBLIC`): the node creates its AK from it
/// under the endorsement hierarchy, and Google certified the key that template gives.
pub const AK_TEMPLATE_NV_INDEX_RSA: u32 = 0x01c1_0001;
/// The instance-information extension of GCE AK certificates.
pub const INSTANCE_INFO_OID: &str = "1.3.6.1.4.1.11129.2.1.21";

/// Google's roots for vTPM certificates, by the SHA-256 of their DER (as published at
/// `pki.goog/cloud_integrity/` and in google/go-tpm-tools `server/ca-certs/`): the older
/// "tpm_ek_v1_cloud_host_root" hierarchy and the "EK/AK CA Root" of Certificate Authority
/// Service. Both sign AK certificates in use today.
pub const GOOGLE_ROOTS: [&str; 2] = [
    "9bd5285f8fb18502a7947e621ffd470266f49fcd3b73e19a190f690ad32a7caf",
    "594759594b9b61524f6c8ef668f7177f7b9066bc0674f2f49fe9e052be78beb2",
];

pub use crate::tpm_rsa::VtpmQuote;

/// What a GCE VM presents.
#[derive(Debug, Clone)]
pub struct GceEvidence<'a> {
    /// The AK's `TPMT_PUBLIC`.
    pub ak_public: &'a [u8],
    /// The AK certificate from the vTPM's NV, DER.
    pub ak_certificate: &'a [u8],
    /// Intermediates (untrusted: fetched from the certificate's AIA URL or sent along).
    pub intermediates: &'a [&'a [u8]],
    /// The quote of the SHA-256 bank.
    pub quote: VtpmQuote<'a>,
}

/// The instance the AK certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceInstance {
    pub zone: String,
    pub project_number: u64,
    pub project_id: String,
    pub instance_id: u64,
    pub instance_name: String,
    /// `securityProperties.securityVersion`.
    pub security_version: Option<u64>,
    /// `securityProperties.isProduction`: `false` for Google's test hosts.
    pub is_production: Option<bool>,
}

/// What a GCE VM's AK certificate must say about its instance, beyond Google's signature.
#[derive(Debug, Clone, Default)]
pub struct GcePolicy {
    /// The projects the cluster's VMs run in, by ID (empty: any project). Anyone can make a GCE
    /// VM, so a cluster names its projects: Google's root alone only says "some GCE VM".
    pub project_ids: Vec<String>,
    /// Accept a VM on a host Google marks as not production (`isProduction` false).
    pub allow_non_production: bool,
    /// The lowest `securityVersion` of the host's vTPM firmware.
    pub minimum_security_version: u64,
}

/// Evidence that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedGce {
    /// The SHA-256 bank's PCR values the quote covers.
    pub pcrs: BTreeMap<u8, Vec<u8>>,
    /// The instance the AK certificate names, if it has the extension.
    pub instance: Option<GceInstance>,
    /// The quote's clock info: `reset_count` changes on every reboot.
    pub reset_count: u32,
}

/// Why GCE evidence is refused.
#[derive(Debug, thiserror::Error)]
pub enum GceError {
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("no certificate among the {0} intermediates issued the AK certificate")]
    NoIntermediate(usize),
    #[error("no root among the {0} given issued the AK certificate's intermediate")]
    NoRoot(usize),
    #[error("the AK's public area is malformed")]
    AkPublic(#[source] ParseError),
    #[error("the AK certificate's key is not the quoting AK ({0})")]
    AkMismatch(&'static str),
    #[error(
        "the AK is not a restricted signing key bound to its TPM (object attributes {0:#010x})"
    )]
    AkAttributes(u32),
    #[error(transparent)]
    Quote(#[from] QuoteError),
    #[error("the AK certificate names no instance; the policy requires {0}")]
    NoInstance(&'static str),
    #[error("the VM runs in project {found}; the policy accepts {accepted:?}")]
    Project {
        found: String,
        accepted: Vec<String>,
    },
    #[error("the VM runs on a host Google marks as not production; the policy requires one")]
    NotProduction,
    #[error("the vTPM's security version is {found:?}, below the policy's minimum {minimum}")]
    SecurityVersion { found: Option<u64>, minimum: u64 },
    #[error("the AK certificate's instance-information extension is malformed: {0}")]
    InstanceInfo(String),
}

/// Verifies GCE evidence against `roots` (DER; each accepted only if its fingerprint is one of
/// [`GOOGLE_ROOTS`]), the verifier's `nonce`, at `at`.
///
/// The intermediates are the evidence's ([`GceEvidence::intermediates`]): a verifier that keeps
/// its own (a trust bundle) merges them into that list.
pub fn verify(
    evidence: &GceEvidence<'_>,
    roots: &[&[u8]],
    nonce: &[u8],
    at: VerificationTime,
) -> Result<VerifiedGce, GceError> {
    verify_pinned(evidence, roots, &GOOGLE_ROOTS, nonce, at)
}

/// [`verify`] with the roots accepted by `pinned_roots` (the SHA-256 of each root's DER, hex)
/// **instead of** [`GOOGLE_ROOTS`]: a verifier that trusts a root of its own (a test chain
/// such as `hawser_harness::provider_gce::GceTestCa`'s) names it here explicitly, and passes
/// [`GOOGLE_ROOTS`] along if Google's are to stay trusted. A root in `roots` that no pin names
/// is refused ([`ChainError::UnpinnedRoot`], naming its fingerprint), as by [`verify`].
pub fn verify_pinned(
    evidence: &GceEvidence<'_>,
    roots: &[&[u8]],
    pinned_roots: &[&str],
    nonce: &[u8],
    at: VerificationTime,
) -> Result<VerifiedGce, GceError> {
    let pinned: Vec<String> = pinned_roots
        .iter()
        .map(|p| p.to_ascii_lowercase())
        .collect();
    let pinned: Vec<&str> = pinned.iter().map(String::as_str).collect();
    // The AK certificate to a pinned root.
    let ak_cert = Cert::parse("the AK certificate", evidence.ak_certificate)?;
    let intermediates = evidence
        .intermediates
        .iter()
        .map(|der| Cert::parse("the AK certificate's intermediate", der))
        .collect::<Result<Vec<_>, _>>()?;
    let intermediate = intermediates
        .iter()
        .find(|c| c.x509.subject() == ak_cert.x509.issuer())
        .ok_or(GceError::NoIntermediate(intermediates.len()))?;
    let roots = roots
        .iter()
        .map(|der| Cert::parse("the AK certificate's root", der))
        .collect::<Result<Vec<_>, _>>()?;
    let root = roots
        .iter()
        .find(|c| c.x509.subject() == intermediate.x509.issuer())
        .ok_or(GceError::NoRoot(roots.len()))?;
    verify_chain(&[&ak_cert, intermediate, root], &pinned, at)?;

    // The certificate's key is the AK, and the AK only signs what the TPM made.
    let ak = RsaPublic::parse_tpmt(evidence.ak_public).map_err(GceError::AkPublic)?;
    match ak_cert.x509.public_key().parsed() {
        Ok(PublicKey::RSA(key)) => {
            if trim(key.modulus) != trim(&ak.modulus) {
                return Err(GceError::AkMismatch("the modulus differs"));
            }
            if trim(key.exponent) != trim(&ak.exponent.to_be_bytes()) {
                return Err(GceError::AkMismatch("the exponent differs"));
            }
        }
        _ => return Err(GceError::AkMismatch("the certificate's key is not RSA")),
    }
    let required = object_attributes::RESTRICTED
        | object_attributes::SIGN_ENCRYPT
        | object_attributes::FIXED_TPM
        | object_attributes::FIXED_PARENT
        | object_attributes::SENSITIVE_DATA_ORIGIN;
    if ak.object_attributes & required != required
        || ak.object_attributes & object_attributes::DECRYPT != 0
    {
        return Err(GceError::AkAttributes(ak.object_attributes));
    }

    // The quote: signed by the AK, over the nonce and the presented PCR values.
    let quote = &evidence.quote;
    let attest = verify_quote(&ak.modulus, ak.exponent, quote, nonce)?;

    let instance = ak_cert
        .x509
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == INSTANCE_INFO_OID)
        .map(|e| parse_instance_info(e.value))
        .transpose()?;
    Ok(VerifiedGce {
        pcrs: quote.pcrs.clone(),
        instance,
        reset_count: attest.clock_info.reset_count,
    })
}

/// Judges verified evidence's instance by `policy`.
pub fn judge(verified: &VerifiedGce, policy: &GcePolicy) -> Result<(), GceError> {
    let needs_instance = !policy.project_ids.is_empty()
        || !policy.allow_non_production
        || policy.minimum_security_version > 0;
    let Some(instance) = &verified.instance else {
        return if needs_instance {
            Err(GceError::NoInstance(
                "a project, a production host or a security version",
            ))
        } else {
            Ok(())
        };
    };
    if !policy.project_ids.is_empty() && !policy.project_ids.contains(&instance.project_id) {
        return Err(GceError::Project {
            found: instance.project_id.clone(),
            accepted: policy.project_ids.clone(),
        });
    }
    if !policy.allow_non_production && instance.is_production != Some(true) {
        return Err(GceError::NotProduction);
    }
    if policy.minimum_security_version > 0
        && instance
            .security_version
            .is_none_or(|v| v < policy.minimum_security_version)
    {
        return Err(GceError::SecurityVersion {
            found: instance.security_version,
            minimum: policy.minimum_security_version,
        });
    }
    Ok(())
}

/// The next DER element of `input`.
fn next<'a>(input: &mut &'a [u8], what: &str) -> Result<Any<'a>, GceError> {
    let (rest, any) =
        Any::from_der(input).map_err(|e| GceError::InstanceInfo(format!("{what}: {e}")))?;
    *input = rest;
    Ok(any)
}

fn utf8(any: &Any<'_>, what: &str) -> Result<String, GceError> {
    if any.tag() != Tag::Utf8String {
        return Err(GceError::InstanceInfo(format!(
            "{what} is not a UTF8String"
        )));
    }
    String::from_utf8(any.data.to_vec())
        .map_err(|_| GceError::InstanceInfo(format!("{what} is not UTF-8")))
}

fn unsigned(any: &Any<'_>, what: &str) -> Result<u64, GceError> {
    let digits = trim(any.data);
    if any.tag() != Tag::Integer || digits.len() > 8 || any.data.first().is_some_and(|b| *b >= 0x80)
    {
        return Err(GceError::InstanceInfo(format!(
            "{what} is not a non-negative 64-bit INTEGER"
        )));
    }
    Ok(digits.iter().fold(0, |n, b| n << 8 | u64::from(*b)))
}

/// The instance-information extension (go-tpm-tools `server/verify.go` names its layout):
/// `SEQUENCE { zone UTF8String, projectNumber INTEGER, projectId UTF8String, instanceId
/// INTEGER, instanceName UTF8String, securityProperties [0] EXPLICIT SEQUENCE {
/// securityVersion [0] EXPLICIT INTEGER OPTIONAL, isProduction [1] EXPLICIT BOOLEAN OPTIONAL,
/// … } OPTIONAL }`. Tags [2] to [5] of the security properties are in real certificates but not
/// documented; they are skipped.
pub fn parse_instance_info(value: &[u8]) -> Result<GceInstance, GceError> {
    let mut input = value;
    let sequence = next(&mut input, "the extension")?;
    if sequence.tag() != Tag::Sequence || !input.is_empty() {
        return Err(GceError::InstanceInfo("not one SEQUENCE".into()));
    }
    let mut fields = sequence.data;
    let zone = utf8(&next(&mut fields, "zone")?, "zone")?;
    let project_number = unsigned(&next(&mut fields, "projectNumber")?, "projectNumber")?;
    let project_id = utf8(&next(&mut fields, "projectId")?, "projectId")?;
    let instance_id = unsigned(&next(&mut fields, "instanceId")?, "instanceId")?;
    let instance_name = utf8(&next(&mut fields, "instanceName")?, "instanceName")?;
    let (mut security_version, mut is_production) = (None, None);
    if !fields.is_empty() {
        let tagged = next(&mut fields, "securityProperties")?;
        if tagged.class() != Class::ContextSpecific || tagged.tag() != Tag(0) {
            return Err(GceError::InstanceInfo(
                "securityProperties is not [0]".into(),
            ));
        }
        let mut inner = tagged.data;
        let properties = next(&mut inner, "securityProperties")?;
        let mut properties = properties.data;
        while !properties.is_empty() {
            let property = next(&mut properties, "a security property")?;
            let mut value = property.data;
            let value = next(&mut value, "a security property's value")?;
            match (property.class(), property.tag().0) {
                (Class::ContextSpecific, 0) => {
                    security_version = Some(unsigned(&value, "securityVersion")?);
                }
                (Class::ContextSpecific, 1) => {
                    if value.tag() != Tag::Boolean || value.data.len() != 1 {
                        return Err(GceError::InstanceInfo(
                            "isProduction is not a BOOLEAN".into(),
                        ));
                    }
                    is_production = Some(value.data[0] != 0);
                }
                _ => {}
            }
        }
    }
    Ok(GceInstance {
        zone,
        project_number,
        project_id,
        instance_id,
        instance_name,
        security_version,
        is_production,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_info_of_a_real_certificate() {
        // The extension of go-tpm-tools' gce-cos-85 AK certificate.
        let value = hex::decode(
            "306a0c0d75732d63656e7472616c312d6102051b5a475c690c1c676f6f676c652e636f6d3a7775616c\
             652d6763702d74657374696e6702085e53e3fbbf8306c50c08636f732d74657374a020301ea0030201\
             00a1030101ffa203010100a303010100a403010100a503010100",
        )
        .unwrap();
        let instance = parse_instance_info(&value).unwrap();
        assert_eq!(instance.zone, "us-central1-a");
        assert_eq!(instance.project_id, "google.com:wuale-gcp-testing");
        assert_eq!(instance.project_number, 0x1b_5a47_5c69);
        assert_eq!(instance.instance_id, 0x5e53_e3fb_bf83_06c5);
        assert_eq!(instance.instance_name, "cos-test");
        assert_eq!(instance.security_version, Some(0));
        assert_eq!(instance.is_production, Some(true));
        // Cut short: refused, naming what is missing.
        let err = parse_instance_info(&value[..40]).unwrap_err().to_string();
        assert!(err.contains("malformed"), "{err}");
    }

    #[test]
    fn a_test_root_is_refused_unless_its_fingerprint_is_pinned_explicitly() {
        use hawser_harness::provider_gce::{GCE_AK_TEMPLATE_RSA, GceTestCa, GceTestInstance};

        let ca = GceTestCa::generate().unwrap();
        // An RSA-2048 AK: Google's template with a modulus.
        let mut ak_public = GCE_AK_TEMPLATE_RSA[..22].to_vec();
        ak_public.extend_from_slice(&256u16.to_be_bytes());
        ak_public.extend((0..=255u8).map(|i| i | 0x81));
        let ak_certificate = ca
            .issue_ak_certificate(&ak_public, &GceTestInstance::example())
            .unwrap();
        let intermediates = [ca.intermediate_der()];
        let pcrs = BTreeMap::new();
        let evidence = GceEvidence {
            ak_public: &ak_public,
            ak_certificate: &ak_certificate,
            intermediates: &intermediates,
            quote: VtpmQuote {
                attest: &[],
                signature: &[],
                pcrs: &pcrs,
            },
        };
        let roots = [ca.root_der()];
        let fingerprint = Cert::parse("the test root", ca.root_der())
            .unwrap()
            .fingerprint();
        let now = VerificationTime::now();

        // Plain `verify`: Google's roots only. The test root is refused by its fingerprint.
        let err = verify(&evidence, &roots, b"nonce", now).unwrap_err();
        assert!(
            matches!(&err, GceError::Chain(ChainError::UnpinnedRoot { fingerprint: f, .. })
                if *f == fingerprint),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "the AK certificate's root is not a pinned root (its SHA-256 is {fingerprint}; \
                 pinned: {})",
                GOOGLE_ROOTS.join(", ")
            )
        );
        // Pinned explicitly (in any case of hex, alongside Google's), the chain is accepted and
        // the next check judges: here the quote, which this evidence does not have.
        let upper = fingerprint.to_uppercase();
        let pins = [GOOGLE_ROOTS[0], GOOGLE_ROOTS[1], upper.as_str()];
        let err = verify_pinned(&evidence, &roots, &pins, b"nonce", now).unwrap_err();
        assert!(
            matches!(err, GceError::Quote(QuoteError::SignatureFormat(_))),
            "{err}"
        );
        // No pins at all: nothing is trusted.
        let err = verify_pinned(&evidence, &roots, &[], b"nonce", now).unwrap_err();
        assert!(
            matches!(err, GceError::Chain(ChainError::UnpinnedRoot { .. })),
            "{err}"
        );
    }
}
