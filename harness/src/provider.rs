//! The harness plays the cloud provider: it certifies the VM's attestation key before boot.
//!
//! GCP and Azure create their vTPM's attestation key (AK) themselves, certify it with a
//! provider CA and store the certificate in a TPM NV index, where the guest finds it; a verifier
//! then trusts an AK because that CA certified it, never because the evidence says so. The QEMU
//! platform does the same with a local CA:
//!
//! 1. [`ProviderCa::generate`] makes the CA (ECDSA P-256, rcgen); its certificate is what
//!    verifiers trust (`AkTrust` in hawser-attestation).
//! 2. [`ProviderCa::provision_state_dir`] starts swtpm over TCP on the VM's TPM state
//!    directory, derives the AK with TPM2_CreatePrimary in the endorsement hierarchy from the
//!    template the guest uses ([`AK_TEMPLATE`]), issues the AK certificate, and writes it to NV
//!    index [`AK_CERT_NV_INDEX`] with the platform hierarchy; the QEMU boot then reuses the
//!    state directory. The index is platform-created, written only with platform
//!    authorisation (PPWRITE) and write-locked until it is deleted (WRITEDEFINE): an OS can read
//!    it (AUTHREAD, OWNERREAD, PPREAD, empty auth) but neither rewrite nor delete it. Doing it
//!    again on the same TPM replaces the certificate (the platform may undefine its index
//!    before boot; OVMF does not keep the platform hierarchy away from us here).
//!
//! The TPM commands are marshalled here by hand and sent straight to swtpm's TCP port, so the
//! harness (and the CLI, which uses it for `hawser local up`) needs neither libtss2 nor
//! tpm2-tools. The AK certificate carries the extended key usage tcg-kp-AIKCertificate
//! (2.23.133.8.3), which the validator requires.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::time::Duration;

use hawser_attestation::tpm_types::{AK_CERT_NV_INDEX, AK_TEMPLATE, EccPublic};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SerialNumber, SignatureAlgorithm,
};
use thiserror::Error;

use crate::{QemuError, Swtpm, SwtpmOptions};

/// tcg-kp-AIKCertificate (TCG EK Credential Profile).
const TCG_KP_AIK_CERTIFICATE: [u64; 5] = [2, 23, 133, 8, 3];
/// How long a TPM command may take on swtpm.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes per TPM2_NV_Write (TPM2_MAX_NV_BUFFER_SIZE is at least 512 everywhere).
const NV_WRITE_CHUNK: usize = 512;

// TPM 2.0 Part 2 constants.
const TPM_ST_NO_SESSIONS: u16 = 0x8001;
const TPM_ST_SESSIONS: u16 = 0x8002;
const TPM_RS_PW: u32 = 0x4000_0009;
pub(crate) const TPM_RH_ENDORSEMENT: u32 = 0x4000_000b;
const TPM_RH_PLATFORM: u32 = 0x4000_000c;
const TPM_ALG_SHA256: u16 = 0x000b;
const TPM_CC_NV_UNDEFINE_SPACE: u32 = 0x0122;
const TPM_CC_NV_DEFINE_SPACE: u32 = 0x012a;
pub(crate) const TPM_CC_CREATE_PRIMARY: u32 = 0x0131;
const TPM_CC_NV_WRITE: u32 = 0x0137;
const TPM_CC_NV_WRITE_LOCK: u32 = 0x0138;
pub(crate) const TPM_CC_FLUSH_CONTEXT: u32 = 0x0165;
const TPM_CC_NV_READ_PUBLIC: u32 = 0x0169;
/// TPM_RC_HANDLE for the first handle: what TPM2_NV_ReadPublic answers for a missing index.
const TPM_RC_HANDLE_1: u32 = 0x018b;

/// `TPMA_NV` of the AK certificate index: PPWRITE | WRITEDEFINE | PPREAD | OWNERREAD |
/// AUTHREAD | NO_DA | PLATFORMCREATE.
pub const AK_CERT_NV_ATTRIBUTES: u32 =
    (1 << 0) | (1 << 13) | (1 << 16) | (1 << 17) | (1 << 18) | (1 << 25) | (1 << 30);

/// Provisioning failed.
#[derive(Debug, Error)]
pub enum ProviderError {
    /// Certificate generation failed.
    #[error("cannot {what}")]
    Certificate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// swtpm could not be started.
    #[error(transparent)]
    Swtpm(#[from] QemuError),
    /// The swtpm is not a TCP one.
    #[error("the provider needs a TCP swtpm (SwtpmOptions::tcp()) to talk to")]
    NotTcp,
    /// Talking to swtpm failed.
    #[error("TPM I/O with swtpm on port {port} failed during {command}")]
    Io {
        port: u16,
        command: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A TPM command failed.
    #[error("{command} failed on swtpm port {port} with TPM response code {rc:#06x}")]
    Tpm {
        port: u16,
        command: &'static str,
        rc: u32,
    },
    /// A response that does not fit its command.
    #[error("{command} on swtpm port {port} returned a malformed response: {detail}")]
    Response {
        port: u16,
        command: &'static str,
        detail: String,
    },
    /// The AK the TPM created is not the ECC P-256 key of the template.
    #[error("the TPM created an AK that is not a P-256 key: {0}")]
    AkKey(String),
    /// The AK public area the TPM returned does not parse.
    #[error("the TPM created an AK whose public area does not parse")]
    AkParse(#[source] hawser_attestation::tpm_types::ParseError),
    /// The certificate chain does not fit one NV index.
    #[error("the AK certificate chain is {len} bytes, more than an NV index holds here ({max})")]
    ChainTooLarge { len: usize, max: usize },
}

/// What [`ProviderCa::provision`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedAk {
    /// The AK's marshalled `TPM2B_PUBLIC`, as TPM2_CreatePrimary returned it.
    pub ak_public: Vec<u8>,
    /// The AK's TPM name.
    pub ak_name: Vec<u8>,
    /// The AK certificate (DER) written to NV.
    pub certificate: Vec<u8>,
    /// The NV index it was written to.
    pub nv_index: u32,
}

/// The local provider CA (see the module docs).
pub struct ProviderCa {
    certificate: rcgen::Certificate,
    issuer: Issuer<'static, KeyPair>,
    name: String,
}

impl std::fmt::Debug for ProviderCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderCa")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The AK's public key as rcgen needs it to certify a key it does not hold.
struct AkPublicKey([u8; 65]);

impl PublicKeyData for AkPublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl ProviderCa {
    /// A new CA named `common_name` with a fresh P-256 key (valid 2020 to 2100).
    pub fn generate(common_name: &str) -> Result<Self, ProviderError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|source| {
            ProviderError::Certificate {
                what: "generate the provider CA key",
                source,
            }
        })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "hawser QEMU provider");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        params.serial_number = Some(SerialNumber::from(random_serial()));
        let certificate =
            params
                .self_signed(&key)
                .map_err(|source| ProviderError::Certificate {
                    what: "self-sign the provider CA",
                    source,
                })?;
        Ok(Self {
            certificate,
            issuer: Issuer::new(params, key),
            name: common_name.to_string(),
        })
    }

    /// The CA certificate (DER): what verifiers trust.
    pub fn certificate_der(&self) -> &[u8] {
        self.certificate.der()
    }

    /// The CA certificate (PEM).
    pub fn certificate_pem(&self) -> String {
        self.certificate.pem()
    }

    /// Certifies the AK whose marshalled `TPM2B_PUBLIC` is `ak_public` (a P-256 key). The
    /// subject names the AK by its TPM name.
    pub fn issue_ak_certificate(&self, ak_public: &[u8]) -> Result<Vec<u8>, ProviderError> {
        let ak = EccPublic::parse(ak_public).map_err(ProviderError::AkParse)?;
        let point = ak
            .p256_sec1_point()
            .ok_or_else(|| ProviderError::AkKey(format!("curve {:#06x}", ak.curve)))?;
        let name = ak
            .name()
            .ok_or_else(|| ProviderError::AkKey(format!("nameAlg {:#06x}", ak.name_alg)))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "hawser QEMU provider");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("AK {}", hex_encode(&name)));
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::Other(
            TCG_KP_AIK_CERTIFICATE.to_vec(),
        )];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        params.serial_number = Some(SerialNumber::from(random_serial()));
        let certificate = params
            .signed_by(&AkPublicKey(point), &self.issuer)
            .map_err(|source| ProviderError::Certificate {
                what: "sign the AK certificate",
                source,
            })?;
        Ok(certificate.der().to_vec())
    }

    /// Provisions the TPM whose state lives in `state_dir` (created if missing): starts a TCP
    /// swtpm on it, [`ProviderCa::provision`]s, and stops it again, so a VM booted with the
    /// same state directory finds the AK certificate in NV.
    pub fn provision_state_dir(&self, state_dir: &Path) -> Result<ProvisionedAk, ProviderError> {
        let swtpm = Swtpm::start(&SwtpmOptions::tcp().with_state_dir(state_dir))?;
        let provisioned = self.provision(&swtpm)?;
        drop(swtpm); // swtpm writes its state on every change and exits on SIGTERM.
        Ok(provisioned)
    }

    /// Creates the AK in a running TCP swtpm, certifies it and stores the certificate in NV
    /// index [`AK_CERT_NV_INDEX`] (no other client may be connected to the swtpm meanwhile).
    pub fn provision(&self, swtpm: &Swtpm) -> Result<ProvisionedAk, ProviderError> {
        let port = swtpm.tcp_port().ok_or(ProviderError::NotTcp)?;
        let mut tpm = RawTpm::connect(port)?;
        let ak_public = tpm.create_ak_public()?;
        let certificate = self.issue_ak_certificate(&ak_public)?;
        tpm.store_nv(AK_CERT_NV_INDEX, &certificate)?;
        let ak_name = EccPublic::parse(&ak_public)
            .ok()
            .and_then(|ak| ak.name())
            .unwrap_or_default();
        tracing::info!(
            ca = %self.name,
            ak_name = %hex_encode(&ak_name),
            nv_index = format_args!("{AK_CERT_NV_INDEX:#010x}"),
            "provider certified the VM's attestation key"
        );
        Ok(ProvisionedAk {
            ak_public,
            ak_name,
            certificate,
            nv_index: AK_CERT_NV_INDEX,
        })
    }
}

/// Stores `data` (for instance a certificate chain, DER certificates concatenated) in NV index
/// `index` of a running TCP swtpm the way [`ProviderCa::provision`] does, replacing any previous
/// content. For tests that need a TPM provisioned with something else.
pub fn store_nv(swtpm: &Swtpm, index: u32, data: &[u8]) -> Result<(), ProviderError> {
    let port = swtpm.tcp_port().ok_or(ProviderError::NotTcp)?;
    RawTpm::connect(port)?.store_nv(index, data)
}

/// The AK's marshalled `TPM2B_PUBLIC` as a running TCP swtpm derives it.
pub fn ak_public(swtpm: &Swtpm) -> Result<Vec<u8>, ProviderError> {
    let port = swtpm.tcp_port().ok_or(ProviderError::NotTcp)?;
    RawTpm::connect(port)?.create_ak_public()
}

fn random_serial() -> Vec<u8> {
    // Serial numbers only need to be unique per CA; the time and a process counter make them so
    // without a random source of our own.
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    let mut serial = vec![0x01]; // positive and non-zero
    serial.extend_from_slice(&nanos.to_be_bytes());
    serial.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    serial.extend_from_slice(&std::process::id().to_be_bytes());
    serial
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A raw TPM 2.0 command channel to swtpm's TCP server port.
pub(crate) struct RawTpm {
    stream: TcpStream,
    pub(crate) port: u16,
}

/// A TPM command's response: its handles and its parameter area.
pub(crate) struct Response {
    pub(crate) handles: Vec<u32>,
    pub(crate) params: Vec<u8>,
}

impl RawTpm {
    pub(crate) fn connect(port: u16) -> Result<Self, ProviderError> {
        let io = |source| ProviderError::Io {
            port,
            command: "connect",
            source,
        };
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).map_err(io)?;
        stream.set_read_timeout(Some(COMMAND_TIMEOUT)).map_err(io)?;
        stream
            .set_write_timeout(Some(COMMAND_TIMEOUT))
            .map_err(io)?;
        Ok(Self { stream, port })
    }

    /// Sends one command. `auth_handles` of the `handles` are authorised with an empty password
    /// session each; the response has `response_handles` handles.
    pub(crate) fn command(
        &mut self,
        name: &'static str,
        code: u32,
        handles: &[u32],
        auth_handles: usize,
        params: &[u8],
        response_handles: usize,
    ) -> Result<Response, ProviderError> {
        let tag = if auth_handles > 0 {
            TPM_ST_SESSIONS
        } else {
            TPM_ST_NO_SESSIONS
        };
        let mut body = Vec::new();
        for handle in handles {
            body.extend_from_slice(&handle.to_be_bytes());
        }
        if auth_handles > 0 {
            // TPMS_AUTH_COMMAND: TPM_RS_PW, empty nonce, continueSession, empty password.
            let session = [TPM_RS_PW.to_be_bytes().as_slice(), &[0, 0, 1, 0, 0]].concat();
            let sessions = session.repeat(auth_handles);
            body.extend_from_slice(&(sessions.len() as u32).to_be_bytes());
            body.extend_from_slice(&sessions);
        }
        body.extend_from_slice(params);
        let mut command = Vec::with_capacity(10 + body.len());
        command.extend_from_slice(&tag.to_be_bytes());
        command.extend_from_slice(&(10 + body.len() as u32).to_be_bytes());
        command.extend_from_slice(&code.to_be_bytes());
        command.extend_from_slice(&body);

        let port = self.port;
        let io = |source| ProviderError::Io {
            port,
            command: name,
            source,
        };
        self.stream.write_all(&command).map_err(io)?;
        let mut header = [0u8; 10];
        self.stream.read_exact(&mut header).map_err(io)?;
        let response_tag = u16::from_be_bytes([header[0], header[1]]);
        let size = u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
        let rc = u32::from_be_bytes([header[6], header[7], header[8], header[9]]);
        let malformed = |detail: String| ProviderError::Response {
            port,
            command: name,
            detail,
        };
        if !(10..=64 * 1024).contains(&size) {
            return Err(malformed(format!("a response size of {size} bytes")));
        }
        let mut rest = vec![0u8; size - 10];
        self.stream.read_exact(&mut rest).map_err(io)?;
        if rc != 0 {
            return Err(ProviderError::Tpm {
                port,
                command: name,
                rc,
            });
        }
        let mut at = 0;
        let mut take = |n: usize| -> Result<&[u8], ProviderError> {
            let bytes = rest.get(at..at + n).ok_or_else(|| {
                malformed(format!(
                    "{} bytes where {n} more were expected",
                    rest.len() - at.min(rest.len())
                ))
            })?;
            at += n;
            Ok(bytes)
        };
        let mut response_handles_out = Vec::new();
        for _ in 0..response_handles {
            let bytes = take(4)?;
            response_handles_out.push(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
        }
        let params = if response_tag == TPM_ST_SESSIONS {
            let size = take(4)?;
            let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]) as usize;
            take(size)?.to_vec()
        } else {
            let start = at;
            rest[start..].to_vec()
        };
        Ok(Response {
            handles: response_handles_out,
            params,
        })
    }

    /// TPM2_CreatePrimary(endorsement, AK template), then TPM2_FlushContext of the key; returns
    /// the `TPM2B_PUBLIC`.
    fn create_ak_public(&mut self) -> Result<Vec<u8>, ProviderError> {
        self.create_primary("TPM2_CreatePrimary(endorsement, AK template)", &AK_TEMPLATE)
    }

    /// TPM2_CreatePrimary(endorsement, `template`) (a `TPMT_PUBLIC`), then TPM2_FlushContext of
    /// the key; returns the key's `TPM2B_PUBLIC`. `name` names the call in errors.
    pub(crate) fn create_primary(
        &mut self,
        name: &'static str,
        template: &[u8],
    ) -> Result<Vec<u8>, ProviderError> {
        let mut params = Vec::new();
        params.extend_from_slice(&[0x00, 0x04, 0x00, 0x00, 0x00, 0x00]); // inSensitive: empty
        params.extend_from_slice(&(template.len() as u16).to_be_bytes());
        params.extend_from_slice(template); // inPublic
        params.extend_from_slice(&[0x00, 0x00]); // outsideInfo: empty
        params.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]); // creationPCR: none
        let response = self.command(
            name,
            TPM_CC_CREATE_PRIMARY,
            &[TPM_RH_ENDORSEMENT],
            1,
            &params,
            1,
        )?;
        let handle = response.handles[0];
        let out = &response.params;
        let public = out
            .get(..2)
            .map(|s| usize::from(u16::from_be_bytes([s[0], s[1]])))
            .and_then(|size| out.get(..2 + size))
            .map(<[u8]>::to_vec);
        // Flush before judging the response: the transient slot must not leak.
        self.command(
            "TPM2_FlushContext",
            TPM_CC_FLUSH_CONTEXT,
            &[],
            0,
            &handle.to_be_bytes(),
            0,
        )?;
        public.ok_or_else(|| ProviderError::Response {
            port: self.port,
            command: name,
            detail: "outPublic is truncated".into(),
        })
    }

    /// Defines `index` with the platform hierarchy (replacing an existing definition), writes
    /// `data` and write-locks it.
    pub(crate) fn store_nv(&mut self, index: u32, data: &[u8]) -> Result<(), ProviderError> {
        const MAX: usize = 2048; // MAX_NV_INDEX_SIZE of libtpms
        if data.len() > MAX {
            return Err(ProviderError::ChainTooLarge {
                len: data.len(),
                max: MAX,
            });
        }
        match self.command(
            "TPM2_NV_ReadPublic",
            TPM_CC_NV_READ_PUBLIC,
            &[index],
            0,
            &[],
            0,
        ) {
            Ok(_) => {
                self.command(
                    "TPM2_NV_UndefineSpace",
                    TPM_CC_NV_UNDEFINE_SPACE,
                    &[TPM_RH_PLATFORM, index],
                    1,
                    &[],
                    0,
                )?;
            }
            Err(ProviderError::Tpm {
                rc: TPM_RC_HANDLE_1,
                ..
            }) => {}
            Err(err) => return Err(err),
        }

        let mut nv_public = Vec::new();
        nv_public.extend_from_slice(&index.to_be_bytes());
        nv_public.extend_from_slice(&TPM_ALG_SHA256.to_be_bytes());
        nv_public.extend_from_slice(&AK_CERT_NV_ATTRIBUTES.to_be_bytes());
        nv_public.extend_from_slice(&[0x00, 0x00]); // authPolicy: empty
        nv_public.extend_from_slice(&(data.len() as u16).to_be_bytes());
        let mut params = vec![0x00, 0x00]; // auth: empty
        params.extend_from_slice(&(nv_public.len() as u16).to_be_bytes());
        params.extend_from_slice(&nv_public);
        self.command(
            "TPM2_NV_DefineSpace",
            TPM_CC_NV_DEFINE_SPACE,
            &[TPM_RH_PLATFORM],
            1,
            &params,
            0,
        )?;

        for (i, chunk) in data.chunks(NV_WRITE_CHUNK).enumerate() {
            let mut params = Vec::with_capacity(chunk.len() + 4);
            params.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            params.extend_from_slice(chunk);
            params.extend_from_slice(&((i * NV_WRITE_CHUNK) as u16).to_be_bytes());
            self.command(
                "TPM2_NV_Write",
                TPM_CC_NV_WRITE,
                &[TPM_RH_PLATFORM, index],
                1,
                &params,
                0,
            )?;
        }
        self.command(
            "TPM2_NV_WriteLock",
            TPM_CC_NV_WRITE_LOCK,
            &[TPM_RH_PLATFORM, index],
            1,
            &[],
            0,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nv_attributes_are_the_documented_bits() {
        // tpm2_nvdefine -a "ppwrite|writedefine|ppread|ownerread|authread|no_da|platformcreate"
        assert_eq!(AK_CERT_NV_ATTRIBUTES, 0x4207_2001);
    }

    /// A `TPM2B_PUBLIC` of the AK template with `point` (uncompressed P-256) as unique.
    fn ak_public_with(point: &[u8]) -> Vec<u8> {
        let mut tpmt = AK_TEMPLATE[..AK_TEMPLATE.len() - 4].to_vec();
        tpmt.extend_from_slice(&[0x00, 0x20]);
        tpmt.extend_from_slice(&point[1..33]);
        tpmt.extend_from_slice(&[0x00, 0x20]);
        tpmt.extend_from_slice(&point[33..65]);
        let mut tpm2b = (tpmt.len() as u16).to_be_bytes().to_vec();
        tpm2b.extend_from_slice(&tpmt);
        tpm2b
    }

    #[test]
    fn ca_certifies_the_ak_point_with_the_aik_usage() {
        let ca = ProviderCa::generate("test provider").expect("CA");
        assert!(
            ca.certificate_pem()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        let some_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let point = some_key.public_key_raw().to_vec();
        assert_eq!(point.len(), 65);
        let cert = ca
            .issue_ak_certificate(&ak_public_with(&point))
            .expect("AK certificate");
        let contains = |needle: &[u8]| cert.windows(needle.len()).any(|w| w == needle);
        assert!(contains(&point), "the certificate certifies the AK's point");
        assert!(
            contains(&[0x06, 0x05, 0x67, 0x81, 0x05, 0x08, 0x03]),
            "tcg-kp-AIKCertificate OID"
        );
        let ak_name = EccPublic::parse(&ak_public_with(&point))
            .expect("parses")
            .name()
            .expect("name");
        assert!(contains(format!("AK {}", hex_encode(&ak_name)).as_bytes()));

        assert!(matches!(
            ca.issue_ak_certificate(&[0, 1, 2]),
            Err(ProviderError::AkParse(_))
        ));
    }
}
