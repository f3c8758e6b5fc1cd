//! An emulated GCE vTPM: the harness plays Google's provider on swtpm, with a test CA shaped
//! like Google's, so the `gce` profile's whole path (the node's NV reads, the AK re-derived from
//! the template, the quote, `hawser_platforms::gce::verify`) runs on this host.
//!
//! GCE keeps two things in every vTPM's NV: the RSA AK's template (a `TPMT_PUBLIC`, NV
//! [`GCE_AK_TEMPLATE_NV_INDEX_RSA`]) and the certificate Google's CA issued for the key that
//! template gives on that TPM (NV [`GCE_AK_CERT_NV_INDEX_RSA`]). A node re-derives the AK with
//! TPM2_CreatePrimary in the endorsement hierarchy from the template and quotes with it; a
//! verifier walks the certificate to Google's pinned root and checks that its key is the AK.
//! [`GceTestCa::provision`] lays out a swtpm the same way, with the same commands as
//! [`crate::provider`] (hand-marshalled over swtpm's TCP port, platform authorisation, the
//! same NV attributes, [`crate::provider::AK_CERT_NV_ATTRIBUTES`]).
//!
//! # What mirrors Google, what does not
//!
//! Mirrors Google (compared with the genuine chain in `platforms/tests/vectors/gce/`):
//! - the NV indices, and the AK template: the genuine AK's public area (go-tpm-tools'
//!   `gce-cos-85` capture) with its `unique` emptied ([`GCE_AK_TEMPLATE_RSA`]: RSA-2048,
//!   RSASSA-SHA256, restricted signing, fixedTPM, fixedParent, sensitiveDataOrigin,
//!   userWithAuth; go-tpm-tools' own GCE template emulation is the same);
//! - the chain's shape: a self-signed root, one intermediate, the AK certificate, named like
//!   Google's Certificate Authority Service chain ("EK/AK CA Root" → "EK/AK CA Intermediate"),
//!   the CA certificates with keyCertSign and cRLSign (critical), the EKU 2.23.133.8.1,
//!   basicConstraints CA (critical), subject and authority key identifiers;
//! - the AK certificate: an empty subject; a critical subjectAltName holding only a directory
//!   name (TPM manufacturer "id:474F4F47", model "vTPM", version "id:20160511", byte for byte
//!   the genuine one); the subjectDirectoryAttributes of the genuine one (TPM specification
//!   "2.0", level 0, revision 142); basicConstraints CA:FALSE (critical); keyUsage
//!   digitalSignature (critical); the EKU tcg-kp-EKCertificate (2.23.133.8.1, what Google's AK
//!   certificates carry, not the AIK purpose 2.23.133.8.3); an authority key identifier; no
//!   subject key identifier; a 19-byte serial; 30 years of validity; the instance-information
//!   extension (1.3.6.1.4.1.11129.2.1.21) in the genuine layout ([`GceTestInstance::to_der`]:
//!   for the genuine instance it encodes the genuine bytes).
//!
//! Differs from Google:
//! - the names say TEST: "hawser TEST EK/AK CA Root" and "… Intermediate", organisation
//!   "hawser test, mirrors Google", organisational unit "hawser TEST, not Google Cloud";
//! - the CA keys are ECDSA P-384 and sign with ecdsa-with-SHA384, where Google's are RSA-4096
//!   signing sha256WithRSAEncryption: rcgen (on ring, the workspace's backend) cannot generate
//!   RSA keys, and the crates that can (aws-lc-rs, which feature unification would push into
//!   every rcgen user; `rsa`, slow at -O0 and with an open timing advisory) are not worth it for
//!   a test chain. The AK itself is RSA-2048, as Google's is, made by the TPM;
//! - no authority information access or CRL distribution point: there is nothing to fetch;
//! - the root is trusted by nobody by default: `hawser_platforms::gce::verify` pins Google's
//!   roots only, and a verifier trusts this one only by its fingerprint, explicitly
//!   (`gce::verify_pinned`);
//! - the instance-information values are whatever the test gives ([`GceTestInstance`]); the
//!   security properties' tags [2] to [5] (undocumented, FALSE in the genuine certificate) are
//!   written FALSE likewise.

use std::path::Path;

use hawser_attestation::tpm_types::{Reader, TPM_ALG_NULL};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, CustomExtension, DistinguishedName,
    DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PublicKeyData,
    SerialNumber, SignatureAlgorithm,
};

use crate::provider::{ProviderError, RawTpm};
use crate::{Swtpm, SwtpmOptions};

/// GCE's NV index of the RSA AK's certificate (`hawser_platforms::gce::AK_CERT_NV_INDEX_RSA`).
pub const GCE_AK_CERT_NV_INDEX_RSA: u32 = 0x01c1_0000;
/// GCE's NV index of the RSA AK's template (`hawser_platforms::gce::AK_TEMPLATE_NV_INDEX_RSA`).
pub const GCE_AK_TEMPLATE_NV_INDEX_RSA: u32 = 0x01c1_0001;

/// Google's RSA AK template, a `TPMT_PUBLIC`: the genuine AK's public area (go-tpm-tools
/// `internal/test/attestations/gce-cos-85-nonce9009.pb`, `ak_pub`) with an empty `unique`.
/// type RSA, nameAlg SHA-256, objectAttributes 0x00050072 (fixedTPM, fixedParent,
/// sensitiveDataOrigin, userWithAuth, restricted, sign), no authPolicy, symmetric NULL, scheme
/// RSASSA with SHA-256, 2048 bits, the default exponent.
pub const GCE_AK_TEMPLATE_RSA: [u8; 24] = [
    0x00, 0x01, 0x00, 0x0b, 0x00, 0x05, 0x00, 0x72, 0x00, 0x00, 0x00, 0x10, 0x00, 0x14, 0x00, 0x0b,
    0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

/// The instance-information extension of GCE AK certificates.
const INSTANCE_INFO_OID: [u64; 10] = [1, 3, 6, 1, 4, 1, 11129, 2, 1, 21];
/// tcg-kp-EKCertificate: the EKU of Google's CA and AK certificates alike.
const TCG_KP_EK_CERTIFICATE: [u64; 5] = [2, 23, 133, 8, 1];
/// The genuine AK certificate's subjectAltName value: a directory name with the TPM's
/// manufacturer (2.23.133.2.1 "id:474F4F47", "GOOG"), model (2.23.133.2.2 "vTPM") and version
/// (2.23.133.2.3 "id:20160511").
const GOOGLE_VTPM_SAN: &[u8] = &[
    0x30, 0x45, 0xa4, 0x43, 0x30, 0x41, 0x31, 0x16, 0x30, 0x14, 0x06, 0x05, 0x67, 0x81, 0x05, 0x02,
    0x01, 0x0c, 0x0b, b'i', b'd', b':', b'4', b'7', b'4', b'F', b'4', b'F', b'4', b'7', 0x31, 0x0f,
    0x30, 0x0d, 0x06, 0x05, 0x67, 0x81, 0x05, 0x02, 0x02, 0x0c, 0x04, b'v', b'T', b'P', b'M', 0x31,
    0x16, 0x30, 0x14, 0x06, 0x05, 0x67, 0x81, 0x05, 0x02, 0x03, 0x0c, 0x0b, b'i', b'd', b':', b'2',
    b'0', b'1', b'6', b'0', b'5', b'1', b'1',
];
/// The genuine AK certificate's subjectDirectoryAttributes value: tpmSpecification
/// (2.23.133.2.16) { "2.0", level 0, revision 142 }.
const GOOGLE_VTPM_SPECIFICATION: &[u8] = &[
    0x30, 0x19, 0x30, 0x17, 0x06, 0x05, 0x67, 0x81, 0x05, 0x02, 0x10, 0x31, 0x0e, 0x30, 0x0c, 0x0c,
    0x03, b'2', b'.', b'0', 0x02, 0x01, 0x00, 0x02, 0x02, 0x00, 0x8e,
];
/// The CA keys (see the module docs: Google's are RSA-4096).
static CA_ALGORITHM: &SignatureAlgorithm = &rcgen::PKCS_ECDSA_P384_SHA384;
/// `TPM2B_PUBLIC_KEY_RSA`'s maximum (4096-bit keys).
const MAX_RSA_KEY_BYTES: usize = 512;

/// The instance an AK certificate names (the fields of `hawser_platforms::gce::GceInstance`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GceTestInstance {
    pub zone: String,
    pub project_number: u64,
    pub project_id: String,
    pub instance_id: u64,
    pub instance_name: String,
    /// `securityProperties.securityVersion`.
    pub security_version: Option<u64>,
    /// `securityProperties.isProduction`.
    pub is_production: Option<bool>,
}

impl GceTestInstance {
    /// A test instance: project "hawser-test", zone "us-central1-a", a production host
    /// (as Google's certificates of ordinary VMs say, so a default `GcePolicy` accepts it),
    /// security version 1.
    pub fn example() -> Self {
        Self {
            zone: "us-central1-a".into(),
            project_number: 123_456_789_012,
            project_id: "hawser-test".into(),
            instance_id: 4_242_424_242_424_242_424,
            instance_name: "hawser-test-node".into(),
            security_version: Some(1),
            is_production: Some(true),
        }
    }

    /// The instance-information extension's value, DER, in the layout of Google's
    /// certificates (go-tpm-tools `server/verify.go`): `SEQUENCE { zone UTF8String,
    /// projectNumber INTEGER, projectId UTF8String, instanceId INTEGER, instanceName
    /// UTF8String, securityProperties [0] EXPLICIT SEQUENCE { securityVersion [0] EXPLICIT
    /// INTEGER, isProduction [1] EXPLICIT BOOLEAN, [2]..[5] EXPLICIT BOOLEAN FALSE } }`, the
    /// security properties left out when neither is given.
    pub fn to_der(&self) -> Vec<u8> {
        let mut fields = der(0x0c, self.zone.as_bytes());
        fields.extend(der_unsigned(&self.project_number.to_be_bytes()));
        fields.extend(der(0x0c, self.project_id.as_bytes()));
        fields.extend(der_unsigned(&self.instance_id.to_be_bytes()));
        fields.extend(der(0x0c, self.instance_name.as_bytes()));
        if self.security_version.is_some() || self.is_production.is_some() {
            let mut properties = Vec::new();
            if let Some(version) = self.security_version {
                properties.extend(der(0xa0, &der_unsigned(&version.to_be_bytes())));
            }
            if let Some(production) = self.is_production {
                properties.extend(der(0xa1, &der_boolean(production)));
            }
            for tag in 0xa2..=0xa5 {
                properties.extend(der(tag, &der_boolean(false)));
            }
            fields.extend(der(0xa0, &der(0x30, &properties)));
        }
        der(0x30, &fields)
    }
}

/// What [`GceTestCa::provision`] wrote and made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedGceAk {
    /// The template written to NV [`GCE_AK_TEMPLATE_NV_INDEX_RSA`] ([`GCE_AK_TEMPLATE_RSA`]).
    pub ak_template: Vec<u8>,
    /// The AK's `TPMT_PUBLIC` (no size prefix) as TPM2_CreatePrimary returned it: what
    /// `gce::GceEvidence::ak_public` holds.
    pub ak_public: Vec<u8>,
    /// The AK certificate (DER) written to NV [`GCE_AK_CERT_NV_INDEX_RSA`].
    pub ak_certificate: Vec<u8>,
}

/// A test CA shaped like Google's vTPM CA: a root and an intermediate (see the module docs for
/// what mirrors Google and what does not). Nothing trusts it unless told to.
pub struct GceTestCa {
    root: rcgen::Certificate,
    intermediate: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for GceTestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceTestCa").finish_non_exhaustive()
    }
}

/// The AK's RSA public key as rcgen needs it to certify a key it does not hold: PKCS#1
/// `RSAPublicKey` DER.
struct RsaAkPublicKey(Vec<u8>);

impl PublicKeyData for RsaAkPublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &rcgen::PKCS_RSA_SHA256
    }
}

impl GceTestCa {
    /// A new root ("hawser TEST EK/AK CA Root", valid from a day ago for 100 years, as Google's
    /// root is) and intermediate ("hawser TEST EK/AK CA Intermediate", until the root's end),
    /// with fresh ECDSA P-384 keys.
    pub fn generate() -> Result<Self, ProviderError> {
        let certificate = |what| move |source| ProviderError::Certificate { what, source };
        let now = time::OffsetDateTime::now_utc();
        let not_before = now - time::Duration::days(1);
        let not_after = now + time::Duration::days(100 * 365);

        let root_key = KeyPair::generate_for(CA_ALGORITHM)
            .map_err(certificate("generate the GCE test root key"))?;
        let root = CertifiedIssuer::self_signed(
            ca_params("hawser TEST EK/AK CA Root", not_before, not_after)
                .map_err(certificate("name the GCE test root"))?,
            root_key,
        )
        .map_err(certificate("self-sign the GCE test root"))?;

        let intermediate_key = KeyPair::generate_for(CA_ALGORITHM)
            .map_err(certificate("generate the GCE test intermediate key"))?;
        let intermediate = CertifiedIssuer::signed_by(
            ca_params("hawser TEST EK/AK CA Intermediate", not_before, not_after)
                .map_err(certificate("name the GCE test intermediate"))?,
            intermediate_key,
            &*root,
        )
        .map_err(certificate("sign the GCE test intermediate"))?;
        Ok(Self {
            root: AsRef::<rcgen::Certificate>::as_ref(&root).clone(),
            intermediate,
        })
    }

    /// The root (DER): what a verifier trusts by its fingerprint, explicitly.
    pub fn root_der(&self) -> &[u8] {
        self.root.der()
    }

    /// The root (PEM).
    pub fn root_pem(&self) -> String {
        self.root.pem()
    }

    /// The intermediate (DER): Google serves its own at the AK certificate's AIA URL; here
    /// the evidence or the verifier's bundle carries it.
    pub fn intermediate_der(&self) -> &[u8] {
        self.intermediate.der()
    }

    /// The intermediate (PEM).
    pub fn intermediate_pem(&self) -> String {
        self.intermediate.pem()
    }

    /// The root then the intermediate, PEM: a verifier's trust bundle.
    pub fn bundle_pem(&self) -> String {
        self.root_pem() + &self.intermediate_pem()
    }

    /// Certifies the RSA AK whose `TPMT_PUBLIC` (no size prefix) is `ak_public` for
    /// `instance`, the way Google's AK certificates are made (module docs).
    pub fn issue_ak_certificate(
        &self,
        ak_public: &[u8],
        instance: &GceTestInstance,
    ) -> Result<Vec<u8>, ProviderError> {
        let key = rsa_public_key(ak_public).map_err(ProviderError::AkParse)?;
        let now = time::OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new(); // empty, as Google's
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(30 * 365);
        params.serial_number = Some(SerialNumber::from(serial()));
        // No SKI: IsCa::NoCa, and basicConstraints CA:FALSE (critical) as an extension.
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::Other(
            TCG_KP_EK_CERTIFICATE.to_vec(),
        )];
        params.use_authority_key_identifier_extension = true;
        let mut basic_constraints =
            CustomExtension::from_oid_content(&[2, 5, 29, 19], vec![0x30, 0]);
        basic_constraints.set_criticality(true);
        let mut san = CustomExtension::from_oid_content(&[2, 5, 29, 17], GOOGLE_VTPM_SAN.to_vec());
        san.set_criticality(true);
        params.custom_extensions = vec![
            basic_constraints,
            CustomExtension::from_oid_content(&[2, 5, 29, 9], GOOGLE_VTPM_SPECIFICATION.to_vec()),
            san,
            CustomExtension::from_oid_content(&INSTANCE_INFO_OID, instance.to_der()),
        ];
        let certificate = params
            .signed_by(&key, &*self.intermediate)
            .map_err(|source| ProviderError::Certificate {
                what: "sign the GCE test AK certificate",
                source,
            })?;
        Ok(certificate.der().to_vec())
    }

    /// Provisions the TPM whose state lives in `state_dir` (created if missing): starts a TCP
    /// swtpm on it, [`GceTestCa::provision`]s, and stops it again, so a later swtpm (or a VM)
    /// on the same state directory is a GCE vTPM.
    pub fn provision_state_dir(
        &self,
        state_dir: &Path,
        instance: &GceTestInstance,
    ) -> Result<ProvisionedGceAk, ProviderError> {
        let swtpm = Swtpm::start(&SwtpmOptions::tcp().with_state_dir(state_dir))?;
        let provisioned = self.provision(&swtpm, instance)?;
        drop(swtpm); // swtpm writes its state on every change and exits on SIGTERM.
        Ok(provisioned)
    }

    /// Lays out a running TCP swtpm as GCE does (no other client may be connected meanwhile):
    /// the template to NV [`GCE_AK_TEMPLATE_NV_INDEX_RSA`], TPM2_CreatePrimary(endorsement,
    /// template), the AK certificate for the resulting key to NV [`GCE_AK_CERT_NV_INDEX_RSA`].
    /// Both indices are platform-created and write-locked, like the provider's.
    pub fn provision(
        &self,
        swtpm: &Swtpm,
        instance: &GceTestInstance,
    ) -> Result<ProvisionedGceAk, ProviderError> {
        let port = swtpm.tcp_port().ok_or(ProviderError::NotTcp)?;
        let mut tpm = RawTpm::connect(port)?;
        tpm.store_nv(GCE_AK_TEMPLATE_NV_INDEX_RSA, &GCE_AK_TEMPLATE_RSA)?;
        let ak_public = create_primary(&mut tpm, &GCE_AK_TEMPLATE_RSA)?;
        let ak_certificate = self.issue_ak_certificate(&ak_public, instance)?;
        tpm.store_nv(GCE_AK_CERT_NV_INDEX_RSA, &ak_certificate)?;
        tracing::info!(
            project = %instance.project_id,
            instance = %instance.instance_name,
            "the GCE test CA certified the vTPM's RSA attestation key"
        );
        Ok(ProvisionedGceAk {
            ak_template: GCE_AK_TEMPLATE_RSA.to_vec(),
            ak_public,
            ak_certificate,
        })
    }
}

/// The parameters of a test CA certificate named `common_name`, shaped like Google's CAS CAs.
fn ca_params(
    common_name: &str,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> Result<CertificateParams, rcgen::Error> {
    let printable =
        |text: &str| rcgen::string::PrintableString::try_from(text).map(DnValue::PrintableString);
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let name = &mut params.distinguished_name;
    name.push(DnType::CountryName, printable("US")?);
    name.push(DnType::StateOrProvinceName, printable("California")?);
    name.push(DnType::LocalityName, printable("Mountain View")?);
    name.push(
        DnType::OrganizationName,
        printable("hawser test, mirrors Google")?,
    );
    name.push(
        DnType::OrganizationalUnitName,
        printable("hawser TEST, not Google Cloud")?,
    );
    name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::Other(
        TCG_KP_EK_CERTIFICATE.to_vec(),
    )];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    params.serial_number = Some(SerialNumber::from(serial()));
    Ok(params)
}

/// TPM2_CreatePrimary(endorsement, `template`), then TPM2_FlushContext of the key; returns the
/// key's `TPMT_PUBLIC`.
fn create_primary(tpm: &mut RawTpm, template: &[u8]) -> Result<Vec<u8>, ProviderError> {
    let public = tpm.create_primary(
        "TPM2_CreatePrimary(endorsement, GCE's AK template)",
        template,
    )?;
    Ok(public.get(2..).map(<[u8]>::to_vec).unwrap_or_default())
}

/// The PKCS#1 `RSAPublicKey` of an RSA signing key's `TPMT_PUBLIC`.
fn rsa_public_key(
    tpmt_public: &[u8],
) -> Result<RsaAkPublicKey, hawser_attestation::tpm_types::ParseError> {
    let mut r = Reader::new(tpmt_public, "TPMT_PUBLIC");
    r.expect_u16("type", 0x0001, "TPM_ALG_RSA (0x0001)")?;
    r.u16("nameAlg")?;
    r.u32("objectAttributes")?;
    r.tpm2b("authPolicy", 64)?;
    r.expect_u16(
        "parameters.symmetric.algorithm",
        TPM_ALG_NULL,
        "TPM_ALG_NULL (a signing key)",
    )?;
    if r.u16("parameters.scheme.scheme")? != TPM_ALG_NULL {
        r.u16("parameters.scheme.details.hashAlg")?;
    }
    r.u16("parameters.keyBits")?;
    let exponent = match r.u32("parameters.exponent")? {
        0 => 65_537,
        e => e,
    };
    let modulus = r.tpm2b("unique.rsa", MAX_RSA_KEY_BYTES)?;
    r.finish()?;
    let mut key = der_unsigned(modulus);
    key.extend(der_unsigned(&exponent.to_be_bytes()));
    Ok(RsaAkPublicKey(der(0x30, &key)))
}

/// A DER element: `tag`, the definite length of `content`, `content`.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let first = bytes
            .iter()
            .position(|b| *b != 0)
            .unwrap_or(bytes.len() - 1);
        out.push(0x80 | (bytes.len() - first) as u8);
        out.extend_from_slice(&bytes[first..]);
    }
    out.extend_from_slice(content);
    out
}

/// A DER INTEGER of the non-negative big-endian `magnitude`.
fn der_unsigned(magnitude: &[u8]) -> Vec<u8> {
    let first = magnitude.iter().position(|b| *b != 0);
    let mut digits = first.map_or_else(|| vec![0], |first| magnitude[first..].to_vec());
    if digits[0] & 0x80 != 0 {
        digits.insert(0, 0);
    }
    der(0x02, &digits)
}

fn der_boolean(value: bool) -> Vec<u8> {
    der(0x01, &[if value { 0xff } else { 0x00 }])
}

/// A 19-byte positive serial, as Google's AK certificates have: unique per process and call
/// (the time, a counter and the process ID), which is all a test CA needs.
fn serial() -> Vec<u8> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    let mut serial = vec![0x01]; // positive and non-zero
    serial.extend_from_slice(&nanos.to_be_bytes());
    serial.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    serial.extend_from_slice(&(std::process::id() as u16).to_be_bytes());
    serial
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn the_genuine_instance_encodes_to_the_genuine_extension() {
        // The instance-information extension of go-tpm-tools' gce-cos-85 AK certificate.
        let genuine = hex::decode(
            "306a0c0d75732d63656e7472616c312d6102051b5a475c690c1c676f6f676c652e636f6d3a7775616c\
             652d6763702d74657374696e6702085e53e3fbbf8306c50c08636f732d74657374a020301ea0030201\
             00a1030101ffa203010100a303010100a403010100a503010100",
        )
        .unwrap();
        let instance = GceTestInstance {
            zone: "us-central1-a".into(),
            project_number: 0x1b_5a47_5c69,
            project_id: "google.com:wuale-gcp-testing".into(),
            instance_id: 0x5e53_e3fb_bf83_06c5,
            instance_name: "cos-test".into(),
            security_version: Some(0),
            is_production: Some(true),
        };
        assert_eq!(hex::encode(instance.to_der()), hex::encode(genuine));
    }

    #[test]
    fn integers_and_lengths_are_minimal_der() {
        assert_eq!(der_unsigned(&[0, 0, 0]), [0x02, 0x01, 0x00]);
        assert_eq!(der_unsigned(&[0, 0x80]), [0x02, 0x02, 0x00, 0x80]);
        assert_eq!(der_unsigned(&u64::MAX.to_be_bytes()).len(), 2 + 9);
        assert_eq!(der(0x04, &[0; 0x80])[..3], [0x04, 0x81, 0x80]);
        assert_eq!(der(0x04, &[0; 0x123])[..4], [0x04, 0x82, 0x01, 0x23]);
        assert_eq!(serial().len(), 19);
    }

    #[test]
    fn the_ak_certificate_has_googles_shape() {
        let ca = GceTestCa::generate().unwrap();
        assert!(
            ca.bundle_pem()
                .matches("-----BEGIN CERTIFICATE-----")
                .count()
                == 2
        );
        assert!(contains(ca.root_der(), b"hawser TEST EK/AK CA Root"));
        assert!(contains(
            ca.intermediate_der(),
            b"hawser TEST EK/AK CA Intermediate"
        ));
        // An RSA-2048 TPMT_PUBLIC: the template with a modulus.
        let modulus: Vec<u8> = (0..=255u8).map(|i| i | 0x80).collect();
        let mut ak = GCE_AK_TEMPLATE_RSA[..22].to_vec();
        ak.extend_from_slice(&256u16.to_be_bytes());
        ak.extend_from_slice(&modulus);
        let cert = ca
            .issue_ak_certificate(&ak, &GceTestInstance::example())
            .unwrap();
        assert!(
            contains(&cert, &modulus),
            "the certificate certifies the AK"
        );
        assert!(
            contains(&cert, GOOGLE_VTPM_SAN),
            "Google's TPM directory name"
        );
        assert!(contains(&cert, &GceTestInstance::example().to_der()));
        assert!(
            contains(&cert, &[0x06, 0x05, 0x67, 0x81, 0x05, 0x08, 0x01]),
            "tcg-kp-EKCertificate"
        );
        assert!(
            contains(&cert, &[0x30, 0x00, 0x30]),
            "an empty subject followed by the key"
        );
        // Not an RSA key: refused before anything is signed.
        assert!(matches!(
            ca.issue_ak_certificate(&GCE_AK_TEMPLATE_RSA[..4], &GceTestInstance::example()),
            Err(ProviderError::AkParse(_))
        ));
    }
}
