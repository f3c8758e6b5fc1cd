//! Pure-Rust parsing of the three TPM 2.0 structures a quote travels as, and the arithmetic
//! around them (names, qualified names, ECDSA P-256 verification).
//!
//! The verifier runs on hosts and in the join service, which must not need libtss2, and it reads
//! bytes an attacker chose: every read goes through a bounds-checked [`Reader`] that reports the
//! structure, the field and the absolute byte offset of whatever was wrong, and nothing here
//! panics on malformed input (tests feed every truncation and random corruptions of real TPM
//! output). Encodings follow TPM 2.0 Library Part 2 (big-endian integers, `TPM2B_*` = `u16` size
//! plus bytes, unions selected by a preceding algorithm or tag).
//!
//! Parsed here:
//! - `TPM2B_PUBLIC` of an ECC key ([`EccPublic`]): type, nameAlg, objectAttributes, authPolicy,
//!   symmetric, scheme, curve, kdf and the public point;
//! - `TPMS_ATTEST` of a quote ([`Attest`]): magic, type, qualifiedSigner, extraData, clockInfo,
//!   firmwareVersion and `TPMS_QUOTE_INFO` (`TPML_PCR_SELECTION`, pcrDigest);
//! - `TPMT_SIGNATURE` of the ECC family ([`EccSignature`]): sigAlg, hash, r, s.

use sha2::{Digest, Sha256, Sha384, Sha512};

mod reader;

pub use reader::{ParseError, Reader};

/// `TPM_GENERATED_VALUE`: the TPM only signs structures starting with this magic with a
/// restricted key, which is what makes a quote unforgeable by the key's user.
pub const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
/// `TPM_ST_ATTEST_QUOTE`: the attestation type of TPM2_Quote output.
pub const TPM_ST_ATTEST_QUOTE: u16 = 0x8018;
/// `TPM_ALG_ECC`: the public-key type.
pub const TPM_ALG_ECC: u16 = 0x0023;
/// `TPM_ALG_SHA1`.
pub const TPM_ALG_SHA1: u16 = 0x0004;
/// `TPM_ALG_SHA256`.
pub const TPM_ALG_SHA256: u16 = 0x000b;
/// `TPM_ALG_SHA384`.
pub const TPM_ALG_SHA384: u16 = 0x000c;
/// `TPM_ALG_SHA512`.
pub const TPM_ALG_SHA512: u16 = 0x000d;
/// `TPM_ALG_NULL`: "no algorithm", also the selector of empty unions.
pub const TPM_ALG_NULL: u16 = 0x0010;
/// `TPM_ALG_ECDSA`.
pub const TPM_ALG_ECDSA: u16 = 0x0018;
/// `TPM_ALG_ECDAA`.
pub const TPM_ALG_ECDAA: u16 = 0x001a;
/// `TPM_ALG_SM2`.
pub const TPM_ALG_SM2: u16 = 0x001b;
/// `TPM_ALG_ECSCHNORR`.
pub const TPM_ALG_ECSCHNORR: u16 = 0x001c;
/// `TPM_ALG_AES`, `TPM_ALG_SM4`, `TPM_ALG_CAMELLIA`: symmetric algorithms with keyBits + mode.
const SYMMETRIC_BLOCK_CIPHERS: [u16; 3] = [0x0006, 0x0013, 0x0026];
/// `TPM_ECC_NIST_P256`.
pub const TPM_ECC_NIST_P256: u16 = 0x0003;
/// `TPM_RH_ENDORSEMENT`: the endorsement hierarchy's handle, which is also its qualified name.
pub const TPM_RH_ENDORSEMENT: u32 = 0x4000_000b;

/// The attestation key's template, a marshalled `TPMT_PUBLIC`: ECC NIST P-256, nameAlg SHA-256,
/// objectAttributes fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | restricted |
/// sign (0x00050072), empty authPolicy, symmetric NULL, scheme ECDSA with SHA-256, kdf NULL,
/// empty unique. TPM2_CreatePrimary in the endorsement hierarchy with this template gives the
/// same key on the same TPM every time, so the issuer (module `tpm`) and a provider certifying
/// the key before boot (the QEMU harness) derive the same AK. The `tpm` module sends these
/// bytes as they are; its tests check the whole TPM2_CreatePrimary command.
pub const AK_TEMPLATE: [u8; 24] = [
    0x00, 0x23, // type: TPM_ALG_ECC
    0x00, 0x0b, // nameAlg: TPM_ALG_SHA256
    0x00, 0x05, 0x00, 0x72, // objectAttributes
    0x00, 0x00, // authPolicy: empty
    0x00, 0x10, // parameters.symmetric: TPM_ALG_NULL
    0x00, 0x18, 0x00, 0x0b, // parameters.scheme: TPM_ALG_ECDSA, hashAlg TPM_ALG_SHA256
    0x00, 0x03, // parameters.curveID: TPM_ECC_NIST_P256
    0x00, 0x10, // parameters.kdf: TPM_ALG_NULL
    0x00, 0x00, // unique.x: empty
    0x00, 0x00, // unique.y: empty
];

/// The NV index holding the AK certificate (DER, followed by any intermediate certificates
/// towards the provider CA, concatenated). It is the index Google Compute Engine's vTPM uses
/// for its ECC AK certificate (the platform range 0x01C1_xxxx of the TCG handle registry); the
/// QEMU harness, playing the provider, defines it with the platform hierarchy before boot, so
/// the guest can read but never rewrite or delete it.
pub const AK_CERT_NV_INDEX: u32 = 0x01c1_0002;

/// `TPMA_OBJECT` bits (TPM 2.0 Part 2, 8.3).
pub mod object_attributes {
    /// The key cannot be duplicated to another TPM.
    pub const FIXED_TPM: u32 = 1 << 1;
    /// The key's parent cannot change.
    pub const FIXED_PARENT: u32 = 1 << 4;
    /// The TPM generated the private part (nobody ever saw it).
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    /// User role authorised by the auth value (empty for the AK).
    pub const USER_WITH_AUTH: u32 = 1 << 6;
    /// The key signs only digests the TPM produced itself (quotes, certifications).
    pub const RESTRICTED: u32 = 1 << 16;
    /// The key decrypts.
    pub const DECRYPT: u32 = 1 << 17;
    /// The key signs.
    pub const SIGN_ENCRYPT: u32 = 1 << 18;
}

// Size limits of the TPM2B buffers as libtss2 defines them (tss2_tpm2_types.h): an attacker
// cannot make the parser accept more than a TPM could have produced.
const MAX_DIGEST: usize = 64; // TPM2B_DIGEST: sizeof(TPMU_HA)
const MAX_DATA: usize = 66; // TPM2B_DATA: sizeof(TPMT_HA)
const MAX_NAME: usize = 66; // TPM2B_NAME: sizeof(TPMU_NAME)
const MAX_ECC_PARAMETER: usize = 128; // TPM2B_ECC_PARAMETER: TPM2_MAX_ECC_KEY_BYTES
const MAX_PCR_SELECT: usize = 4; // TPM2_PCR_SELECT_MAX
const MAX_PCR_BANKS: u32 = 16; // TPM2_NUM_PCR_BANKS

/// Digest size of a TPM hash algorithm, for the algorithms this crate can compute.
pub fn digest_size(alg: u16) -> Option<usize> {
    match alg {
        TPM_ALG_SHA1 => Some(20),
        TPM_ALG_SHA256 => Some(32),
        TPM_ALG_SHA384 => Some(48),
        TPM_ALG_SHA512 => Some(64),
        _ => None,
    }
}

/// `H_alg(data)` for the SHA-2 algorithms; `None` for anything else.
pub fn hash(alg: u16, data: &[u8]) -> Option<Vec<u8>> {
    match alg {
        TPM_ALG_SHA256 => Some(Sha256::digest(data).to_vec()),
        TPM_ALG_SHA384 => Some(Sha384::digest(data).to_vec()),
        TPM_ALG_SHA512 => Some(Sha512::digest(data).to_vec()),
        _ => None,
    }
}

/// A scheme selector with its hash (`TPMT_ECC_SCHEME`, `TPMT_KDF_SCHEME`): `hash_alg` is `None`
/// for `TPM_ALG_NULL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    pub scheme: u16,
    pub hash_alg: Option<u16>,
}

/// The parsed `TPM2B_PUBLIC` of an ECC key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EccPublic {
    /// `nameAlg`: the hash of the key's name.
    pub name_alg: u16,
    /// `objectAttributes` (`TPMA_OBJECT`, see [`object_attributes`]).
    pub object_attributes: u32,
    /// `authPolicy` (empty when the key has no policy).
    pub auth_policy: Vec<u8>,
    /// `parameters.symmetric.algorithm` (`TPM_ALG_NULL` for signing keys).
    pub symmetric: u16,
    /// `parameters.scheme`.
    pub scheme: Scheme,
    /// `parameters.curveID`.
    pub curve: u16,
    /// `parameters.kdf`.
    pub kdf: Scheme,
    /// `unique.x`, as the TPM sent it.
    pub x: Vec<u8>,
    /// `unique.y`, as the TPM sent it.
    pub y: Vec<u8>,
    /// The marshalled `TPMT_PUBLIC` (the `TPM2B_PUBLIC` without its size), what the name hashes.
    tpmt_public: Vec<u8>,
}

impl EccPublic {
    const STRUCTURE: &'static str = "TPM2B_PUBLIC";

    /// Parses a marshalled `TPM2B_PUBLIC` holding an ECC key. Non-ECC keys and unknown union
    /// selectors are errors.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut outer = Reader::new(bytes, Self::STRUCTURE);
        let size_offset = outer.offset();
        let size = usize::from(outer.u16("size")?);
        if size > outer.remaining() {
            return Err(ParseError::Truncated {
                structure: Self::STRUCTURE,
                field: "publicArea",
                offset: size_offset + 2,
                needed: size,
                available: outer.remaining(),
            });
        }
        let mut r = outer.sub(size, "publicArea")?;
        outer.finish()?;
        let tpmt_public = r.buf.to_vec();

        r.expect_u16("type", TPM_ALG_ECC, "TPM_ALG_ECC (0x23)")?;
        let name_alg = r.u16("nameAlg")?;
        let object_attributes = r.u32("objectAttributes")?;
        let auth_policy = r.tpm2b("authPolicy", MAX_DIGEST)?.to_vec();

        // TPMT_SYM_DEF_OBJECT: algorithm, then keyBits and mode unless NULL.
        let sym_offset = r.offset();
        let symmetric = r.u16("parameters.symmetric.algorithm")?;
        if symmetric != TPM_ALG_NULL {
            if !SYMMETRIC_BLOCK_CIPHERS.contains(&symmetric) {
                return Err(r.unexpected(
                    "parameters.symmetric.algorithm",
                    sym_offset,
                    "TPM_ALG_NULL, AES, SM4 or CAMELLIA",
                    symmetric.into(),
                ));
            }
            r.u16("parameters.symmetric.keyBits")?;
            r.u16("parameters.symmetric.mode")?;
        }

        // TPMT_ECC_SCHEME: scheme, then hashAlg (and a count for ECDAA) unless NULL.
        let scheme_offset = r.offset();
        let scheme_alg = r.u16("parameters.scheme.scheme")?;
        let scheme = match scheme_alg {
            TPM_ALG_NULL => Scheme {
                scheme: scheme_alg,
                hash_alg: None,
            },
            TPM_ALG_ECDSA | TPM_ALG_SM2 | TPM_ALG_ECSCHNORR => Scheme {
                scheme: scheme_alg,
                hash_alg: Some(r.u16("parameters.scheme.details.hashAlg")?),
            },
            TPM_ALG_ECDAA => {
                let hash_alg = r.u16("parameters.scheme.details.hashAlg")?;
                r.u16("parameters.scheme.details.count")?;
                Scheme {
                    scheme: scheme_alg,
                    hash_alg: Some(hash_alg),
                }
            }
            other => {
                return Err(r.unexpected(
                    "parameters.scheme.scheme",
                    scheme_offset,
                    "TPM_ALG_NULL, ECDSA, ECDAA, SM2 or ECSCHNORR",
                    other.into(),
                ));
            }
        };
        let curve = r.u16("parameters.curveID")?;
        // TPMT_KDF_SCHEME: every non-NULL KDF scheme carries a TPMS_SCHEME_HASH.
        let kdf_alg = r.u16("parameters.kdf.scheme")?;
        let kdf = Scheme {
            scheme: kdf_alg,
            hash_alg: if kdf_alg == TPM_ALG_NULL {
                None
            } else {
                Some(r.u16("parameters.kdf.details.hashAlg")?)
            },
        };
        let x = r.tpm2b("unique.x", MAX_ECC_PARAMETER)?.to_vec();
        let y = r.tpm2b("unique.y", MAX_ECC_PARAMETER)?.to_vec();
        r.finish()?;

        Ok(Self {
            name_alg,
            object_attributes,
            auth_policy,
            symmetric,
            scheme,
            curve,
            kdf,
            x,
            y,
            tpmt_public,
        })
    }

    /// The key's TPM name: `nameAlg || H_nameAlg(TPMT_PUBLIC)`; `None` if nameAlg is not a SHA-2
    /// algorithm.
    pub fn name(&self) -> Option<Vec<u8>> {
        let digest = hash(self.name_alg, &self.tpmt_public)?;
        let mut name = self.name_alg.to_be_bytes().to_vec();
        name.extend_from_slice(&digest);
        Some(name)
    }

    /// The qualified name a TPM reports as `qualifiedSigner` when this key is a primary key of
    /// the hierarchy with handle `hierarchy`: `nameAlg || H_nameAlg(hierarchy || name)` (TPM 2.0
    /// Part 1, "Qualified Name": a hierarchy's qualified name is its handle).
    pub fn primary_qualified_name(&self, hierarchy: u32) -> Option<Vec<u8>> {
        let name = self.name()?;
        let mut input = hierarchy.to_be_bytes().to_vec();
        input.extend_from_slice(&name);
        let digest = hash(self.name_alg, &input)?;
        let mut qn = self.name_alg.to_be_bytes().to_vec();
        qn.extend_from_slice(&digest);
        Some(qn)
    }

    /// The public point in SEC1 uncompressed form (`04 || x || y`, coordinates left-padded to 32
    /// bytes); `None` if the key is not on P-256 or a coordinate is longer than 32 bytes.
    pub fn p256_sec1_point(&self) -> Option<[u8; 65]> {
        if self.curve != TPM_ECC_NIST_P256 {
            return None;
        }
        let mut point = [0u8; 65];
        point[0] = 0x04;
        point[1..33].copy_from_slice(&left_pad_32(&self.x)?);
        point[33..65].copy_from_slice(&left_pad_32(&self.y)?);
        Some(point)
    }

    /// The P-256 verifying key; `None` if the key is not a valid P-256 point.
    pub fn p256_verifying_key(&self) -> Option<p256::ecdsa::VerifyingKey> {
        let point = self.p256_sec1_point()?;
        p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).ok()
    }

    /// The marshalled `TPMT_PUBLIC` this key's name is computed over.
    pub fn tpmt_public(&self) -> &[u8] {
        &self.tpmt_public
    }
}

/// Left-pads a big-endian integer to 32 bytes (TPMs may strip leading zero bytes).
fn left_pad_32(v: &[u8]) -> Option<[u8; 32]> {
    if v.len() > 32 {
        return None;
    }
    let mut out = [0u8; 32];
    out[32 - v.len()..].copy_from_slice(v);
    Some(out)
}

/// `TPMS_CLOCK_INFO`: the TPM's clock when it signed, and how often it was reset and restarted
/// (a changed `reset_count` between two quotes means the machine rebooted in between).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockInfo {
    /// Milliseconds the TPM has been powered since its clock was last set.
    pub clock: u64,
    /// TPM resets (reboots) since the last TPM2_Clear.
    pub reset_count: u32,
    /// TPM restarts (resume from hibernation) since the last reset.
    pub restart_count: u32,
    /// Whether `clock` cannot have been rolled back since it was last reported.
    pub safe: bool,
}

/// One `TPMS_PCR_SELECTION`: a bank and the bitmap of PCRs selected in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrSelection {
    /// The bank's hash algorithm.
    pub hash_alg: u16,
    /// `pcrSelect`: bit `i % 8` of byte `i / 8` selects PCR `i`.
    pub select: Vec<u8>,
}

impl PcrSelection {
    /// The selected PCR indices, ascending (the order the TPM concatenates them in).
    pub fn indices(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (byte_index, byte) in self.select.iter().enumerate() {
            for bit in 0..8u8 {
                if byte & (1 << bit) != 0 {
                    // select has at most MAX_PCR_SELECT (4) bytes, so the index fits in a u8.
                    out.push(byte_index as u8 * 8 + bit);
                }
            }
        }
        out
    }
}

/// A parsed quote `TPMS_ATTEST` (magic and type already checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attest {
    /// `qualifiedSigner`: the qualified name of the key that signed.
    pub qualified_signer: Vec<u8>,
    /// `extraData`: the qualifying data (nonce) the caller passed to TPM2_Quote.
    pub extra_data: Vec<u8>,
    /// `clockInfo`.
    pub clock_info: ClockInfo,
    /// `firmwareVersion`: vendor-specific TPM firmware version.
    pub firmware_version: u64,
    /// `attested.quote.pcrSelect`.
    pub pcr_selections: Vec<PcrSelection>,
    /// `attested.quote.pcrDigest`: the hash (with the AK's scheme hash) of the selected PCR
    /// values concatenated in selection order.
    pub pcr_digest: Vec<u8>,
}

impl Attest {
    const STRUCTURE: &'static str = "TPMS_ATTEST";

    /// Parses a marshalled quote `TPMS_ATTEST`; anything but a TPM-generated quote is an error.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::STRUCTURE);
        let magic_offset = r.offset();
        let magic = r.u32("magic")?;
        if magic != TPM_GENERATED_VALUE {
            return Err(r.unexpected(
                "magic",
                magic_offset,
                "TPM_GENERATED_VALUE (0xff544347)",
                magic.into(),
            ));
        }
        r.expect_u16("type", TPM_ST_ATTEST_QUOTE, "TPM_ST_ATTEST_QUOTE (0x8018)")?;
        let qualified_signer = r.tpm2b("qualifiedSigner", MAX_NAME)?.to_vec();
        let extra_data = r.tpm2b("extraData", MAX_DATA)?.to_vec();
        let clock = r.u64("clockInfo.clock")?;
        let reset_count = r.u32("clockInfo.resetCount")?;
        let restart_count = r.u32("clockInfo.restartCount")?;
        let safe_offset = r.offset();
        let safe = match r.u8("clockInfo.safe")? {
            0 => false,
            1 => true,
            other => {
                return Err(r.unexpected(
                    "clockInfo.safe",
                    safe_offset,
                    "TPMI_YES_NO (0 or 1)",
                    other.into(),
                ));
            }
        };
        let firmware_version = r.u64("firmwareVersion")?;

        let count_offset = r.offset();
        let count = r.u32("attested.quote.pcrSelect.count")?;
        if count > MAX_PCR_BANKS {
            return Err(ParseError::TooLarge {
                structure: Self::STRUCTURE,
                field: "attested.quote.pcrSelect.count",
                offset: count_offset,
                size: count as usize,
                max: MAX_PCR_BANKS as usize,
            });
        }
        let mut pcr_selections = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let hash_alg = r.u16("attested.quote.pcrSelect.hash")?;
            let size_offset = r.offset();
            let size = usize::from(r.u8("attested.quote.pcrSelect.sizeofSelect")?);
            if size > MAX_PCR_SELECT {
                return Err(ParseError::TooLarge {
                    structure: Self::STRUCTURE,
                    field: "attested.quote.pcrSelect.sizeofSelect",
                    offset: size_offset,
                    size,
                    max: MAX_PCR_SELECT,
                });
            }
            let select = r
                .bytes(size, "attested.quote.pcrSelect.pcrSelect")?
                .to_vec();
            pcr_selections.push(PcrSelection { hash_alg, select });
        }
        let pcr_digest = r.tpm2b("attested.quote.pcrDigest", MAX_DIGEST)?.to_vec();
        r.finish()?;

        Ok(Self {
            qualified_signer,
            extra_data,
            clock_info: ClockInfo {
                clock,
                reset_count,
                restart_count,
                safe,
            },
            firmware_version,
            pcr_selections,
            pcr_digest,
        })
    }
}

/// A parsed `TPMT_SIGNATURE` of the ECC family (`TPMS_SIGNATURE_ECC`: ECDSA, ECDAA, SM2,
/// ECSCHNORR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EccSignature {
    /// `sigAlg`.
    pub sig_alg: u16,
    /// `signature.hash`.
    pub hash_alg: u16,
    /// `signatureR`, big-endian.
    pub r: Vec<u8>,
    /// `signatureS`, big-endian.
    pub s: Vec<u8>,
}

impl EccSignature {
    const STRUCTURE: &'static str = "TPMT_SIGNATURE";

    /// Parses a marshalled `TPMT_SIGNATURE`; RSA and HMAC signatures are errors.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::STRUCTURE);
        let alg_offset = r.offset();
        let sig_alg = r.u16("sigAlg")?;
        if !matches!(
            sig_alg,
            TPM_ALG_ECDSA | TPM_ALG_ECDAA | TPM_ALG_SM2 | TPM_ALG_ECSCHNORR
        ) {
            return Err(r.unexpected(
                "sigAlg",
                alg_offset,
                "an ECC signature algorithm (ECDSA 0x18, ECDAA, SM2, ECSCHNORR)",
                sig_alg.into(),
            ));
        }
        let hash_alg = r.u16("signature.hash")?;
        let sig_r = r.tpm2b("signature.signatureR", MAX_ECC_PARAMETER)?.to_vec();
        let sig_s = r.tpm2b("signature.signatureS", MAX_ECC_PARAMETER)?.to_vec();
        r.finish()?;
        Ok(Self {
            sig_alg,
            hash_alg,
            r: sig_r,
            s: sig_s,
        })
    }

    /// The signature as a P-256 ECDSA signature; `None` if r or s is longer than 32 bytes,
    /// zero, or not below the group order.
    pub fn to_p256(&self) -> Option<p256::ecdsa::Signature> {
        let r = left_pad_32(&self.r)?;
        let s = left_pad_32(&self.s)?;
        p256::ecdsa::Signature::from_scalars(r, s).ok()
    }
}

/// Verifies an ECDSA P-256 signature over `SHA256(message)`. High-S signatures are accepted:
/// TPMs do not normalise s. The arithmetic is ring's (several times faster than the pure-Rust
/// curve, which matters at handshake rates); p256 only carries the validated key.
pub fn verify_p256_sha256(
    key: &p256::ecdsa::VerifyingKey,
    message: &[u8],
    signature: &p256::ecdsa::Signature,
) -> bool {
    use p256::elliptic_curve::sec1::ToEncodedPoint as _;
    let point = key.as_affine().to_encoded_point(false);
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point)
        .verify(message, &signature.to_bytes())
        .is_ok()
}

#[cfg(test)]
mod tests;
