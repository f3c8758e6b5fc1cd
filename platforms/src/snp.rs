//! AMD SEV-SNP attestation reports: parsed, verified to AMD's root, and judged against a policy.
//!
//! A report (`ATTESTATION_REPORT`, 1184 bytes, SEV-SNP firmware ABI §7.3) is signed by the
//! chip's VCEK (versioned chip endorsement key, derived from the chip's secrets and its TCB) or
//! by a cloud's VLEK (versioned loaded endorsement key). The verification, in order:
//!
//! 1. the chain: the ARK (AMD root key, pinned here by the SHA-256 of its certificate for each
//!    product) self-signed, the ASK (or the ASVK for a VLEK) signed by it, the VCEK/VLEK signed
//!    by that; RSA-PSS/SHA-384 throughout; every certificate valid at the verification time;
//! 2. the report's ECDSA P-384/SHA-384 signature over bytes `0x000..0x2A0` with the
//!    VCEK's/VLEK's key, and the report's `KEY_INFO` naming that kind of key;
//! 3. the endorsement's binding: a VCEK's `hwID` equals the report's `CHIP_ID`, its TCB
//!    components (bootloader, TEE, SNP, microcode SPLs) equal the report's `REPORTED_TCB`;
//! 4. the policy ([`SnpPolicy`]): debug off, no migration agent, the VMPL, a minimum TCB, and
//!    the launch measurement, `REPORT_DATA`, `HOST_DATA` and ID key digest where given.
//!
//! Signatures are checked with ring through x509-parser, already hawser's X.509 stack; the
//! `sev` crate's pure-Rust mode would add a second one (RustCrypto's rsa, p384, x509-cert) and
//! checks signatures only, so steps 1's dates, 3 and 4 would be written here anyway.
//!
//! Products: Milan and Genoa, whose TCB_VERSION layout (bootloader, TEE, 4 reserved, SNP,
//! microcode) is the one every vector here has. Turin's differs (an FMC SPL first) and no
//! genuine Turin report was at hand to prove a parser on, so Turin is refused by name.

use crate::chain::{Cert, ChainError, VerificationTime, verify_chain};

/// The size of an `ATTESTATION_REPORT`.
pub const REPORT_LEN: usize = 0x4A0;
/// The signed part of a report: everything before the signature.
const SIGNED_LEN: usize = 0x2A0;

/// SEV-SNP products hawser verifies, with their pinned AMD root keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    Milan,
    Genoa,
}

impl Product {
    /// The SHA-256 of AMD's ARK certificate for this product (as AMD's key distribution
    /// server, `kdsintf.amd.com/vcek/v1/<product>/cert_chain`, serves it).
    pub fn ark_fingerprint(self) -> &'static str {
        match self {
            Product::Milan => "69d063b45344d26a2e94e1f4210de49ef555308287d4c174445c95639a540bcd",
            Product::Genoa => "4c6598d19c18719c5dfd4a7d335f674e5bfe1d8f800cea2cf270c10d103db2f1",
        }
    }

    /// The product of a VCEK's/VLEK's `productName` extension ("Milan-B0", "Genoa").
    fn from_product_name(name: &str) -> Result<Self, SnpError> {
        match name.split('-').next().unwrap_or_default() {
            "Milan" => Ok(Product::Milan),
            "Genoa" => Ok(Product::Genoa),
            _ => Err(SnpError::Product(name.to_owned())),
        }
    }
}

/// A TCB version: the security patch levels of the firmware components (Milan and Genoa
/// layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcbVersion {
    pub bootloader: u8,
    pub tee: u8,
    pub snp: u8,
    pub microcode: u8,
}

impl TcbVersion {
    fn from_le(raw: u64) -> Self {
        let b = raw.to_le_bytes();
        Self {
            bootloader: b[0],
            tee: b[1],
            snp: b[6],
            microcode: b[7],
        }
    }

    fn components(self) -> [(&'static str, u8); 4] {
        [
            ("bootloader", self.bootloader),
            ("TEE", self.tee),
            ("SNP firmware", self.snp),
            ("microcode", self.microcode),
        ]
    }
}

/// Which key signed a report (`KEY_INFO.SIGNING_KEY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigningKey {
    Vcek,
    Vlek,
    /// The report is unsigned (7) or names a key this version of the ABI does not define.
    Other(u32),
}

/// A parsed `ATTESTATION_REPORT` (versions 2 and 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestationReport {
    pub version: u32,
    pub guest_svn: u32,
    pub policy: u64,
    pub family_id: [u8; 16],
    pub image_id: [u8; 16],
    pub vmpl: u32,
    pub signature_algorithm: u32,
    pub current_tcb: TcbVersion,
    pub platform_info: u64,
    pub signing_key: SigningKey,
    /// `KEY_INFO.MASK_CHIP_KEY`: the chip ID is zeroed and cannot be matched to a VCEK.
    pub mask_chip_key: bool,
    pub report_data: [u8; 64],
    pub measurement: [u8; 48],
    pub host_data: [u8; 32],
    pub id_key_digest: [u8; 48],
    pub author_key_digest: [u8; 48],
    pub report_id: [u8; 32],
    pub reported_tcb: TcbVersion,
    /// CPUID family, model, stepping (version 3 reports).
    pub cpuid: Option<(u8, u8, u8)>,
    pub chip_id: [u8; 64],
    pub committed_tcb: TcbVersion,
    pub launch_tcb: TcbVersion,
    /// The signature's R and S, big-endian, 48 bytes each.
    signature: [u8; 96],
    signed: Vec<u8>,
}

/// Guest policy bits (SEV-SNP ABI, `GUEST_POLICY`).
pub mod policy_bits {
    /// Simultaneous multithreading allowed.
    pub const SMT: u64 = 1 << 16;
    /// Reserved, must be one.
    pub const RESERVED_ONE: u64 = 1 << 17;
    /// A migration agent may be associated with the guest.
    pub const MIGRATE_MA: u64 = 1 << 18;
    /// The hypervisor may debug the guest (read and write its memory).
    pub const DEBUG: u64 = 1 << 19;
}

fn array<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(array(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(array(bytes, at))
}

/// ECDSA P-384 R or S as the report stores it (72 bytes little-endian, zero-padded) →
/// 48 bytes big-endian, or `None` if the padding is not zero.
fn scalar_be(le: &[u8]) -> Option<[u8; 48]> {
    if le[48..72].iter().any(|b| *b != 0) {
        return None;
    }
    let mut be = [0; 48];
    for (i, b) in le[..48].iter().enumerate() {
        be[47 - i] = *b;
    }
    Some(be)
}

impl AttestationReport {
    /// Parses a report; refuses any other length or version, and a signature with non-zero
    /// padding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SnpError> {
        if bytes.len() != REPORT_LEN {
            return Err(SnpError::Length(bytes.len()));
        }
        let version = u32_at(bytes, 0x00);
        if !(2..=3).contains(&version) {
            return Err(SnpError::Version(version));
        }
        let key_info = u32_at(bytes, 0x48);
        let signing_key = match (key_info >> 2) & 0b111 {
            0 => SigningKey::Vcek,
            1 => SigningKey::Vlek,
            other => SigningKey::Other(other),
        };
        let (Some(r), Some(s)) = (
            scalar_be(&bytes[0x2A0..0x2A0 + 72]),
            scalar_be(&bytes[0x2A0 + 72..0x2A0 + 144]),
        ) else {
            return Err(SnpError::SignatureEncoding);
        };
        let mut signature = [0; 96];
        signature[..48].copy_from_slice(&r);
        signature[48..].copy_from_slice(&s);
        Ok(Self {
            version,
            guest_svn: u32_at(bytes, 0x04),
            policy: u64_at(bytes, 0x08),
            family_id: array(bytes, 0x10),
            image_id: array(bytes, 0x20),
            vmpl: u32_at(bytes, 0x30),
            signature_algorithm: u32_at(bytes, 0x34),
            current_tcb: TcbVersion::from_le(u64_at(bytes, 0x38)),
            platform_info: u64_at(bytes, 0x40),
            signing_key,
            mask_chip_key: key_info & 0b10 != 0,
            report_data: array(bytes, 0x50),
            measurement: array(bytes, 0x90),
            host_data: array(bytes, 0xC0),
            id_key_digest: array(bytes, 0xE0),
            author_key_digest: array(bytes, 0x110),
            report_id: array(bytes, 0x140),
            reported_tcb: TcbVersion::from_le(u64_at(bytes, 0x180)),
            cpuid: (version >= 3).then(|| (bytes[0x188], bytes[0x189], bytes[0x18A])),
            chip_id: array(bytes, 0x1A0),
            committed_tcb: TcbVersion::from_le(u64_at(bytes, 0x1E0)),
            launch_tcb: TcbVersion::from_le(u64_at(bytes, 0x1F0)),
            signature,
            signed: bytes[..SIGNED_LEN].to_vec(),
        })
    }

    /// Whether the policy lets the hypervisor debug the guest.
    pub fn debug_allowed(&self) -> bool {
        self.policy & policy_bits::DEBUG != 0
    }

    /// The CPU the report names (version 3), if hawser models it: family 0x19, model 0x0X
    /// Milan, 0x1X Genoa.
    fn cpuid_product(&self) -> Option<Result<Product, String>> {
        let (family, model, stepping) = self.cpuid?;
        Some(match (family, model >> 4) {
            (0x19, 0x0) => Ok(Product::Milan),
            (0x19, 0x1) => Ok(Product::Genoa),
            _ => Err(format!(
                "CPUID family {family:#x} model {model:#x} stepping {stepping:#x}"
            )),
        })
    }
}

/// What a report must show, beyond a valid signature from a genuine AMD chip.
#[derive(Debug, Clone, Default)]
pub struct SnpPolicy {
    /// Accept a guest the hypervisor may debug (never for production).
    pub allow_debug: bool,
    /// Accept a guest with a migration agent.
    pub allow_migration_agent: bool,
    /// The VMPL the report must come from (0: the guest's most privileged level, where a
    /// bare guest kernel and Azure's HCL run).
    pub vmpl: Option<u32>,
    /// Every reported TCB component at least this.
    pub minimum_tcb: TcbVersion,
    /// The launch measurement.
    pub measurement: Option<[u8; 48]>,
    /// `REPORT_DATA`: the binding the verifier expects (a nonce, a key's hash).
    pub report_data: Option<[u8; 64]>,
    pub host_data: Option<[u8; 32]>,
    pub id_key_digest: Option<[u8; 48]>,
    /// The lowest guest SVN.
    pub minimum_guest_svn: u32,
}

/// The certificates that endorse a report: the VCEK (or VLEK) and the chain above it, DER.
#[derive(Debug, Clone)]
pub struct SnpEndorsement<'a> {
    /// The VCEK or VLEK.
    pub key: &'a [u8],
    /// The ASK (for a VCEK) or the ASVK (for a VLEK).
    pub intermediate: &'a [u8],
    /// The ARK; accepted only by its pinned fingerprint.
    pub root: &'a [u8],
}

/// A report that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedSnpReport {
    pub report: AttestationReport,
    pub product: Product,
    pub signing_key: SigningKey,
    /// A VLEK's `cspId`: the cloud the key was loaded for.
    pub csp_id: Option<String>,
}

/// Why a report is refused. Each names the check and the values that failed it.
#[derive(Debug, thiserror::Error)]
pub enum SnpError {
    #[error("an SEV-SNP attestation report is {REPORT_LEN} bytes, not {0}")]
    Length(usize),
    #[error("SEV-SNP report version {0} is not supported (2 and 3 are)")]
    Version(u32),
    #[error("the report's signature has non-zero padding")]
    SignatureEncoding,
    #[error("the report's signature algorithm is {0}, not 1 (ECDSA P-384 with SHA-384)")]
    SignatureAlgorithm(u32),
    #[error(
        "the endorsement's product \"{0}\" is not verified by hawser (Milan and Genoa are; \
         Turin's TCB layout is not modelled)"
    )]
    Product(String),
    #[error("the report's {0} does not match the endorsement's product {1:?}")]
    CpuMismatch(String, Product),
    #[error("{0} has no {1} extension")]
    MissingExtension(&'static str, &'static str),
    #[error("{0}'s {1} extension is malformed")]
    MalformedExtension(&'static str, &'static str),
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("the report is signed by a {report:?} key but endorsed by a {endorsement:?}")]
    SigningKeyKind {
        report: SigningKey,
        endorsement: SigningKey,
    },
    #[error("the report's signature does not verify with the {0:?}'s key")]
    Signature(SigningKey),
    #[error("the report masks its chip ID, so it cannot be tied to a VCEK")]
    MaskedChipId,
    #[error("the VCEK is for chip {certificate}, the report comes from chip {report}")]
    ChipId { certificate: String, report: String },
    #[error(
        "the endorsement is for {component} SPL {certificate}, the report's reported TCB has \
         {report}"
    )]
    TcbBinding {
        component: &'static str,
        certificate: u8,
        report: u8,
    },
    #[error(
        "the guest policy allows debugging (policy {0:#x}): the hypervisor can read its memory"
    )]
    Debug(u64),
    #[error("the guest policy allows a migration agent (policy {0:#x})")]
    MigrationAgent(u64),
    #[error("the report comes from VMPL {report}, the policy requires VMPL {expected}")]
    Vmpl { expected: u32, report: u32 },
    #[error("the reported {component} SPL is {report}, below the policy's minimum {minimum}")]
    TcbTooLow {
        component: &'static str,
        minimum: u8,
        report: u8,
    },
    #[error("guest SVN {report} is below the policy's minimum {minimum}")]
    GuestSvn { minimum: u32, report: u32 },
    #[error("the report's {field} is {report}, the policy expects {expected}")]
    Field {
        field: &'static str,
        expected: String,
        report: String,
    },
}

/// AMD's extensions of VCEK/VLEK certificates (OID arc 1.3.6.1.4.1.3704.1).
mod oids {
    pub const PRODUCT_NAME: &str = "1.3.6.1.4.1.3704.1.2";
    pub const BL_SPL: &str = "1.3.6.1.4.1.3704.1.3.1";
    pub const TEE_SPL: &str = "1.3.6.1.4.1.3704.1.3.2";
    pub const SNP_SPL: &str = "1.3.6.1.4.1.3704.1.3.3";
    pub const UCODE_SPL: &str = "1.3.6.1.4.1.3704.1.3.8";
    pub const HW_ID: &str = "1.3.6.1.4.1.3704.1.4";
    pub const CSP_ID: &str = "1.3.6.1.4.1.3704.1.5";
}

/// An extension's raw value (`extnValue`'s content), by dotted OID.
fn extension<'a>(cert: &'a Cert<'_>, oid: &str) -> Option<&'a [u8]> {
    cert.x509
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == oid)
        .map(|e| e.value)
}

/// A DER string (IA5String, UTF8String, PrintableString) or the raw bytes as text.
fn der_string(value: &[u8]) -> Option<String> {
    match value {
        [0x16 | 0x0C | 0x13, len, rest @ ..] if usize::from(*len) == rest.len() => {
            String::from_utf8(rest.to_vec()).ok()
        }
        _ => String::from_utf8(value.to_vec()).ok(),
    }
}

/// A small DER INTEGER (an SPL: 0..=255).
fn der_u8(value: &[u8]) -> Option<u8> {
    match value {
        [0x02, 1, v] => Some(*v),
        [0x02, 2, 0, v] if *v >= 0x80 => Some(*v),
        _ => None,
    }
}

fn spl(cert: &Cert<'_>, oid: &'static str, name: &'static str) -> Result<u8, SnpError> {
    let value = extension(cert, oid).ok_or(SnpError::MissingExtension(cert.which, name))?;
    der_u8(value).ok_or(SnpError::MalformedExtension(cert.which, name))
}

/// Verifies `report` (raw bytes) with its endorsement at `at`, then judges it by `policy`.
pub fn verify(
    report: &[u8],
    endorsement: &SnpEndorsement<'_>,
    policy: &SnpPolicy,
    at: VerificationTime,
) -> Result<VerifiedSnpReport, SnpError> {
    let report = AttestationReport::from_bytes(report)?;
    let key_which = match report.signing_key {
        SigningKey::Vlek => "the VLEK",
        _ => "the VCEK",
    };
    let key = Cert::parse(key_which, endorsement.key)?;
    let intermediate_which = match report.signing_key {
        SigningKey::Vlek => "the ASVK",
        _ => "the ASK",
    };
    let intermediate = Cert::parse(intermediate_which, endorsement.intermediate)?;
    let root = Cert::parse("the ARK", endorsement.root)?;

    // Which product, from the endorsement; the report's CPUID (version 3) must agree.
    let name = extension(&key, oids::PRODUCT_NAME)
        .ok_or(SnpError::MissingExtension(key.which, "productName"))?;
    let name = der_string(name).ok_or(SnpError::MalformedExtension(key.which, "productName"))?;
    let product = Product::from_product_name(&name)?;
    match report.cpuid_product() {
        Some(Ok(cpu)) if cpu != product => {
            return Err(SnpError::CpuMismatch(format!("{cpu:?} CPUID"), product));
        }
        Some(Err(cpuid)) => return Err(SnpError::CpuMismatch(cpuid, product)),
        _ => {}
    }

    // 1. The chain to the pinned ARK.
    verify_chain(
        &[&key, &intermediate, &root],
        &[product.ark_fingerprint()],
        at,
    )?;

    // 2. The report's signature, by the kind of key its KEY_INFO names.
    let endorsement_kind = if extension(&key, oids::CSP_ID).is_some() {
        SigningKey::Vlek
    } else {
        SigningKey::Vcek
    };
    if report.signing_key != endorsement_kind {
        return Err(SnpError::SigningKeyKind {
            report: report.signing_key,
            endorsement: endorsement_kind,
        });
    }
    if report.signature_algorithm != 1 {
        return Err(SnpError::SignatureAlgorithm(report.signature_algorithm));
    }
    let public_key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::ECDSA_P384_SHA384_FIXED,
        key.x509.public_key().subject_public_key.data.as_ref(),
    );
    public_key
        .verify(&report.signed, &report.signature)
        .map_err(|_| SnpError::Signature(endorsement_kind))?;

    // 3. The endorsement's binding to this chip and TCB.
    if endorsement_kind == SigningKey::Vcek {
        if report.mask_chip_key {
            return Err(SnpError::MaskedChipId);
        }
        let hw_id =
            extension(&key, oids::HW_ID).ok_or(SnpError::MissingExtension(key.which, "hwID"))?;
        if hw_id != report.chip_id {
            return Err(SnpError::ChipId {
                certificate: hex::encode(hw_id),
                report: hex::encode(report.chip_id),
            });
        }
    }
    let certified = TcbVersion {
        bootloader: spl(&key, oids::BL_SPL, "blSPL")?,
        tee: spl(&key, oids::TEE_SPL, "teeSPL")?,
        snp: spl(&key, oids::SNP_SPL, "snpSPL")?,
        microcode: spl(&key, oids::UCODE_SPL, "ucodeSPL")?,
    };
    for ((component, certificate), (_, reported)) in certified
        .components()
        .into_iter()
        .zip(report.reported_tcb.components())
    {
        if certificate != reported {
            return Err(SnpError::TcbBinding {
                component,
                certificate,
                report: reported,
            });
        }
    }
    let csp_id = extension(&key, oids::CSP_ID).and_then(der_string);

    // 4. The policy.
    judge(&report, policy)?;
    Ok(VerifiedSnpReport {
        report,
        product,
        signing_key: endorsement_kind,
        csp_id,
    })
}

/// The policy's checks of a report whose signature and endorsement are verified.
pub fn judge(report: &AttestationReport, policy: &SnpPolicy) -> Result<(), SnpError> {
    if report.debug_allowed() && !policy.allow_debug {
        return Err(SnpError::Debug(report.policy));
    }
    if report.policy & policy_bits::MIGRATE_MA != 0 && !policy.allow_migration_agent {
        return Err(SnpError::MigrationAgent(report.policy));
    }
    if let Some(expected) = policy.vmpl
        && report.vmpl != expected
    {
        return Err(SnpError::Vmpl {
            expected,
            report: report.vmpl,
        });
    }
    for ((component, minimum), (_, reported)) in policy
        .minimum_tcb
        .components()
        .into_iter()
        .zip(report.reported_tcb.components())
    {
        if reported < minimum {
            return Err(SnpError::TcbTooLow {
                component,
                minimum,
                report: reported,
            });
        }
    }
    if report.guest_svn < policy.minimum_guest_svn {
        return Err(SnpError::GuestSvn {
            minimum: policy.minimum_guest_svn,
            report: report.guest_svn,
        });
    }
    let field = |field: &'static str, expected: Option<&[u8]>, actual: &[u8]| match expected {
        Some(expected) if expected != actual => Err(SnpError::Field {
            field,
            expected: hex::encode(expected),
            report: hex::encode(actual),
        }),
        _ => Ok(()),
    };
    field(
        "launch measurement",
        policy.measurement.as_ref().map(|m| m.as_slice()),
        &report.measurement,
    )?;
    field(
        "REPORT_DATA",
        policy.report_data.as_ref().map(|m| m.as_slice()),
        &report.report_data,
    )?;
    field(
        "HOST_DATA",
        policy.host_data.as_ref().map(|m| m.as_slice()),
        &report.host_data,
    )?;
    field(
        "ID key digest",
        policy.id_key_digest.as_ref().map(|m| m.as_slice()),
        &report.id_key_digest,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank_report() -> Vec<u8> {
        let mut bytes = vec![0; REPORT_LEN];
        bytes[0] = 2;
        bytes[0x34] = 1;
        bytes
    }

    #[test]
    fn lengths_versions_and_signature_padding_are_refused_by_name() {
        assert!(matches!(
            AttestationReport::from_bytes(&[0; 1000]),
            Err(SnpError::Length(1000))
        ));
        let mut bytes = blank_report();
        bytes[0] = 1;
        assert!(matches!(
            AttestationReport::from_bytes(&bytes),
            Err(SnpError::Version(1))
        ));
        let mut bytes = blank_report();
        bytes[0x2A0 + 60] = 1;
        assert!(matches!(
            AttestationReport::from_bytes(&bytes),
            Err(SnpError::SignatureEncoding)
        ));
    }

    #[test]
    fn signature_scalars_are_reversed_to_big_endian() {
        let mut bytes = blank_report();
        bytes[0x2A0] = 0xAA; // R's least significant byte
        bytes[0x2A0 + 72 + 47] = 0xBB; // S's most significant byte
        let report = AttestationReport::from_bytes(&bytes).unwrap();
        assert_eq!(report.signature[47], 0xAA);
        assert_eq!(report.signature[48], 0xBB);
    }

    #[test]
    fn the_policy_names_each_violation() {
        let mut bytes = blank_report();
        bytes[0x08..0x10].copy_from_slice(&(policy_bits::RESERVED_ONE | 0x30000).to_le_bytes());
        // As the virtee vector's: bootloader 3, TEE 0, SNP 8, microcode 0x73.
        bytes[0x180..0x188].copy_from_slice(&[3, 0, 0, 0, 0, 0, 8, 0x73]);
        let report = AttestationReport::from_bytes(&bytes).unwrap();
        assert_eq!(
            report.reported_tcb,
            TcbVersion {
                bootloader: 3,
                tee: 0,
                snp: 8,
                microcode: 0x73
            }
        );
        judge(&report, &SnpPolicy::default()).unwrap();
        let low = SnpPolicy {
            minimum_tcb: TcbVersion {
                microcode: 0x74,
                ..TcbVersion::default()
            },
            ..SnpPolicy::default()
        };
        assert!(
            matches!(
                judge(&report, &low),
                Err(SnpError::TcbTooLow {
                    component: "microcode",
                    minimum: 0x74,
                    report: 0x73
                })
            ),
            "{:?}",
            judge(&report, &low)
        );
        let vmpl = SnpPolicy {
            vmpl: Some(1),
            ..SnpPolicy::default()
        };
        assert!(matches!(
            judge(&report, &vmpl),
            Err(SnpError::Vmpl {
                expected: 1,
                report: 0
            })
        ));
        let mut debug = bytes.clone();
        debug[0x08..0x10].copy_from_slice(&(policy_bits::DEBUG | 0x30000).to_le_bytes());
        let debug = AttestationReport::from_bytes(&debug).unwrap();
        assert!(matches!(
            judge(&debug, &SnpPolicy::default()),
            Err(SnpError::Debug(_))
        ));
        let measurement = SnpPolicy {
            measurement: Some([1; 48]),
            ..SnpPolicy::default()
        };
        let err = judge(&report, &measurement).unwrap_err().to_string();
        assert!(err.contains("launch measurement"), "{err}");
    }

    #[test]
    fn der_values_of_amd_extensions() {
        assert_eq!(der_u8(&[0x02, 0x01, 0x73]), Some(0x73));
        assert_eq!(der_u8(&[0x02, 0x02, 0x00, 0xd9]), Some(0xd9));
        assert_eq!(der_u8(&[0x02, 0x02, 0x01, 0x00]), None);
        assert_eq!(
            der_string(&[0x16, 3, b'a', b'b', b'c']).as_deref(),
            Some("abc")
        );
    }
}
