//! RSA attestation keys and their signatures, as cloud vTPMs make them (GCE's and Azure's AKs
//! are RSA-2048 restricted signing keys; hawser's own AK is ECC, see
//! [`hawser_attestation::tpm_types::EccPublic`]), read with the attestation crate's
//! bounds-checked [`Reader`].

use std::collections::BTreeMap;

use hawser_attestation::tpm_types::{
    Attest, ParseError, Reader, TPM_ALG_NULL, TPM_ALG_SHA256, hash,
};
use sha2::{Digest as _, Sha256};

/// `TPM_ALG_RSA`.
pub const TPM_ALG_RSA: u16 = 0x0001;
/// `TPM_ALG_RSASSA`: PKCS#1 v1.5 signatures.
pub const TPM_ALG_RSASSA: u16 = 0x0014;
/// `TPM_ALG_RSAPSS`.
pub const TPM_ALG_RSAPSS: u16 = 0x0016;
/// `TPM2B_PUBLIC_KEY_RSA`: TPM2_MAX_RSA_KEY_BYTES (4096-bit keys).
const MAX_RSA_KEY_BYTES: usize = 512;

/// A parsed `TPMT_PUBLIC` of an RSA key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaPublic {
    pub name_alg: u16,
    pub object_attributes: u32,
    pub auth_policy: Vec<u8>,
    /// `parameters.scheme`: RSASSA or RSAPSS and its hash, or NULL (any).
    pub scheme: u16,
    pub scheme_hash: Option<u16>,
    pub key_bits: u16,
    /// `parameters.exponent`, 65537 where the TPM marshals 0.
    pub exponent: u32,
    /// `unique.rsa`: the modulus, big-endian.
    pub modulus: Vec<u8>,
    tpmt_public: Vec<u8>,
}

impl RsaPublic {
    const STRUCTURE: &'static str = "TPMT_PUBLIC";

    /// Parses a marshalled `TPMT_PUBLIC` (no size prefix) holding an RSA signing key.
    pub fn parse_tpmt(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::STRUCTURE);
        r.expect_u16("type", TPM_ALG_RSA, "TPM_ALG_RSA (0x0001)")?;
        let name_alg = r.u16("nameAlg")?;
        let object_attributes = r.u32("objectAttributes")?;
        let auth_policy = r.tpm2b("authPolicy", 64)?.to_vec();
        let sym_offset = r.offset();
        let symmetric = r.u16("parameters.symmetric.algorithm")?;
        if symmetric != TPM_ALG_NULL {
            return Err(r.unexpected(
                "parameters.symmetric.algorithm",
                sym_offset,
                "TPM_ALG_NULL (a signing key)",
                symmetric.into(),
            ));
        }
        let scheme_offset = r.offset();
        let scheme = r.u16("parameters.scheme.scheme")?;
        let scheme_hash = match scheme {
            TPM_ALG_NULL => None,
            TPM_ALG_RSASSA | TPM_ALG_RSAPSS => Some(r.u16("parameters.scheme.details.hashAlg")?),
            other => {
                return Err(r.unexpected(
                    "parameters.scheme.scheme",
                    scheme_offset,
                    "TPM_ALG_NULL, RSASSA or RSAPSS",
                    other.into(),
                ));
            }
        };
        let key_bits = r.u16("parameters.keyBits")?;
        let exponent = match r.u32("parameters.exponent")? {
            0 => 65_537,
            e => e,
        };
        let modulus = r.tpm2b("unique.rsa", MAX_RSA_KEY_BYTES)?.to_vec();
        r.finish()?;
        Ok(Self {
            name_alg,
            object_attributes,
            auth_policy,
            scheme,
            scheme_hash,
            key_bits,
            exponent,
            modulus,
            tpmt_public: bytes.to_vec(),
        })
    }

    /// The key's TPM name: `nameAlg || H_nameAlg(TPMT_PUBLIC)`.
    pub fn name(&self) -> Option<Vec<u8>> {
        let digest = hash(self.name_alg, &self.tpmt_public)?;
        let mut name = self.name_alg.to_be_bytes().to_vec();
        name.extend_from_slice(&digest);
        Some(name)
    }

    /// The qualified name a TPM reports as `qualifiedSigner` when this key is a primary of the
    /// hierarchy with handle `hierarchy` (as `EccPublic::primary_qualified_name`).
    pub fn primary_qualified_name(&self, hierarchy: u32) -> Option<Vec<u8>> {
        let mut input = hierarchy.to_be_bytes().to_vec();
        input.extend_from_slice(&self.name()?);
        let mut qualified = self.name_alg.to_be_bytes().to_vec();
        qualified.extend_from_slice(&hash(self.name_alg, &input)?);
        Some(qualified)
    }

    /// Whether `signature` is this key's RSASSA-PKCS1-v1_5 or RSA-PSS signature (SHA-256) over
    /// `message`.
    pub fn verify(&self, message: &[u8], signature: &RsaSignature) -> bool {
        verify_rsa(&self.modulus, self.exponent, message, signature)
    }
}

/// Whether `signature` (RSASSA-PKCS1-v1_5 or RSA-PSS, SHA-256) over `message` verifies with the
/// RSA key (`modulus`, `exponent`).
pub fn verify_rsa(modulus: &[u8], exponent: u32, message: &[u8], signature: &RsaSignature) -> bool {
    let parameters: &'static ring::signature::RsaParameters =
        match (signature.sig_alg, signature.hash_alg) {
            (TPM_ALG_RSASSA, TPM_ALG_SHA256) => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            (TPM_ALG_RSAPSS, TPM_ALG_SHA256) => &ring::signature::RSA_PSS_2048_8192_SHA256,
            _ => return false,
        };
    let exponent = exponent.to_be_bytes();
    let first = exponent.iter().position(|b| *b != 0).unwrap_or(3);
    ring::signature::RsaPublicKeyComponents {
        n: modulus,
        e: &exponent[first..],
    }
    .verify(parameters, message, &signature.signature)
    .is_ok()
}

/// A parsed `TPMT_SIGNATURE` of the RSA family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RsaSignature {
    pub sig_alg: u16,
    pub hash_alg: u16,
    pub signature: Vec<u8>,
}

impl RsaSignature {
    const STRUCTURE: &'static str = "TPMT_SIGNATURE";

    /// Parses a marshalled `TPMT_SIGNATURE`; anything but RSASSA and RSAPSS is an error.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::STRUCTURE);
        let alg_offset = r.offset();
        let sig_alg = r.u16("sigAlg")?;
        if !matches!(sig_alg, TPM_ALG_RSASSA | TPM_ALG_RSAPSS) {
            return Err(r.unexpected(
                "sigAlg",
                alg_offset,
                "an RSA signature algorithm (RSASSA 0x14, RSAPSS 0x16)",
                sig_alg.into(),
            ));
        }
        let hash_alg = r.u16("signature.hash")?;
        let signature = r.tpm2b("signature.sig", MAX_RSA_KEY_BYTES)?.to_vec();
        r.finish()?;
        Ok(Self {
            sig_alg,
            hash_alg,
            signature,
        })
    }
}

/// A TPM quote as the vTPM returned it, with the values of the PCRs it covers.
#[derive(Debug, Clone)]
pub struct VtpmQuote<'a> {
    /// The marshalled `TPMS_ATTEST`.
    pub attest: &'a [u8],
    /// The marshalled `TPMT_SIGNATURE`.
    pub signature: &'a [u8],
    /// The quoted bank's PCR values, by index.
    pub pcrs: &'a BTreeMap<u8, Vec<u8>>,
}

/// Why a vTPM quote is refused.
#[derive(Debug, thiserror::Error)]
pub enum QuoteError {
    #[error("the quote is malformed")]
    Attest(#[source] ParseError),
    #[error("the quote's signature is malformed")]
    SignatureFormat(#[source] ParseError),
    #[error("the quote's signature does not verify with the AK")]
    Signature,
    #[error("the quote's extraData is {quoted}, not the verifier's nonce {expected}")]
    Nonce { expected: String, quoted: String },
    #[error("the quote covers the {0:#06x} bank, not SHA-256")]
    Bank(u16),
    #[error("the quote selects PCRs {selected:?}; values were presented for {presented:?}")]
    PcrSet {
        selected: Vec<u8>,
        presented: Vec<u8>,
    },
    #[error("the presented PCR values do not hash to the quoted digest {quoted}")]
    PcrDigest { quoted: String },
}

/// Verifies a quote by the RSA AK (`modulus`, `exponent`): its signature, its `extraData`
/// equal to `nonce`, one SHA-256 selection whose digest covers exactly the PCR values
/// presented. Returns the parsed quote.
pub fn verify_quote(
    modulus: &[u8],
    exponent: u32,
    quote: &VtpmQuote<'_>,
    nonce: &[u8],
) -> Result<Attest, QuoteError> {
    let signature = RsaSignature::parse(quote.signature).map_err(QuoteError::SignatureFormat)?;
    if !verify_rsa(modulus, exponent, quote.attest, &signature) {
        return Err(QuoteError::Signature);
    }
    let attest = Attest::parse(quote.attest).map_err(QuoteError::Attest)?;
    if attest.extra_data != nonce {
        return Err(QuoteError::Nonce {
            expected: hex::encode(nonce),
            quoted: hex::encode(&attest.extra_data),
        });
    }
    let [selection] = attest.pcr_selections.as_slice() else {
        return Err(QuoteError::Bank(0));
    };
    if selection.hash_alg != TPM_ALG_SHA256 {
        return Err(QuoteError::Bank(selection.hash_alg));
    }
    let selected = selection.indices();
    let presented: Vec<u8> = quote.pcrs.keys().copied().collect();
    if selected != presented {
        return Err(QuoteError::PcrSet {
            selected,
            presented,
        });
    }
    // The digest is over the values in selection order, with the signing scheme's hash.
    let mut hasher = Sha256::new();
    for value in quote.pcrs.values() {
        hasher.update(value);
    }
    if hasher.finalize()[..] != attest.pcr_digest[..] {
        return Err(QuoteError::PcrDigest {
            quoted: hex::encode(&attest.pcr_digest),
        });
    }
    Ok(attest)
}

/// The name of `ak` as the TPM signed it: the quote's `qualifiedSigner` must be `ak` as a primary
/// of the endorsement hierarchy (the way a platform creates its AK), so the name comes from the
/// TPM's signature, not only from the presented public area (whose attribute bits change the
/// name without changing the key).
pub(crate) fn signed_primary_name(
    attest: &hawser_attestation::tpm_types::Attest,
    ak: &RsaPublic,
) -> Result<Vec<u8>, String> {
    use hawser_attestation::tpm_types::TPM_RH_ENDORSEMENT;
    let (Some(name), Some(qualified)) = (ak.name(), ak.primary_qualified_name(TPM_RH_ENDORSEMENT))
    else {
        return Err(format!(
            "the AK's name algorithm {:#06x} is not SHA-2",
            ak.name_alg
        ));
    };
    if attest.qualified_signer == qualified {
        return Ok(name);
    }
    Err(format!(
        "the quote's signer is {}, not the presented AK {} as a primary of the endorsement hierarchy",
        hex::encode(&attest.qualified_signer),
        hex::encode(&name)
    ))
}
