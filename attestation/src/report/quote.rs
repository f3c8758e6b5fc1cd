//! The quote verifier: a TPM2_Quote's AK, signature, signer, nonce and PCR selection checked in
//! pure Rust, shared by the boot report ([`super::BootReport::verify`]) and the aTLS evidence
//! (`crate::validator`).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use super::{QuoteEvidence, VerifyError, decode_hex};
use crate::tpm_types::{
    self, Attest, ClockInfo, EccPublic, EccSignature, TPM_ALG_ECDSA, TPM_ALG_SHA256,
    TPM_ECC_NIST_P256, TPM_RH_ENDORSEMENT, object_attributes,
};

/// What a valid quote proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedQuote {
    /// The AK's TPM name (`000b || SHA256(TPMT_PUBLIC)`), stable for a given TPM and template.
    pub ak_name: Vec<u8>,
    /// SHA-256 of the AK's public point in SEC1 uncompressed form (`04 || x || y`).
    pub ak_fingerprint: [u8; 32],
    /// The AK's public point, SEC1 uncompressed.
    pub ak_public_point: [u8; 65],
    /// The qualifying data the quote binds.
    pub nonce: Vec<u8>,
    /// The TPM's clock when it signed.
    pub clock_info: ClockInfo,
    /// The TPM's firmware version.
    pub firmware_version: u64,
    /// The quoted sha256-bank PCRs, ascending.
    pub pcr_selection: Vec<u8>,
    /// SHA-256 over the quoted PCR values, as the TPM computed it.
    pub pcr_digest: [u8; 32],
}

fn describe_selections(selections: &[tpm_types::PcrSelection]) -> String {
    let banks: Vec<String> = selections
        .iter()
        .map(|s| format!("{:#06x}:{:?}", s.hash_alg, s.indices()))
        .collect();
    format!("[{}]", banks.join(", "))
}

impl QuoteEvidence {
    /// Checks that this quote is a TPM-generated quote signed by a restricted P-256 ECDSA
    /// signing key that is a primary of the endorsement hierarchy, over exactly the declared
    /// sha256 PCRs, with `qualifying_data` as its extraData (for a boot report, that is
    /// [`boot_report_qualifying_data`](super::boot_report_qualifying_data) of the nonce;
    /// [`BootReport::verify`](super::BootReport::verify) derives it).
    pub fn verify(&self, qualifying_data: &[u8]) -> Result<VerifiedQuote, VerifyError> {
        let ak_bytes = decode_hex("quote.ak_public", &self.ak_public)?;
        let attest_bytes = decode_hex("quote.attest", &self.attest)?;
        let signature_bytes = decode_hex("quote.signature", &self.signature)?;
        verify_quote(
            QuoteParts {
                ak_public: &ak_bytes,
                attest: &attest_bytes,
                signature: &signature_bytes,
            },
            &REPORT_FIELDS,
            &self.pcr_selection,
            qualifying_data,
        )
    }
}

/// The three marshalled TPM structures of a quote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuoteParts<'a> {
    pub ak_public: &'a [u8],
    pub attest: &'a [u8],
    pub signature: &'a [u8],
}

/// How the caller's format names the three structures, for error messages.
pub(crate) struct FieldNames {
    pub ak_public: &'static str,
    pub attest: &'static str,
    pub signature: &'static str,
}

const REPORT_FIELDS: FieldNames = FieldNames {
    ak_public: "quote.ak_public",
    attest: "quote.attest",
    signature: "quote.signature",
};

/// The quote checks of [`QuoteEvidence::verify`] on raw bytes (shared with the aTLS evidence).
pub(crate) fn verify_quote(
    parts: QuoteParts<'_>,
    fields: &FieldNames,
    pcr_selection: &[u8],
    nonce: &[u8],
) -> Result<VerifiedQuote, VerifyError> {
    let attest_bytes = parts.attest;
    let ak = EccPublic::parse(parts.ak_public).map_err(|source| VerifyError::Parse {
        field: fields.ak_public,
        source,
    })?;
    let attest = Attest::parse(attest_bytes).map_err(|source| VerifyError::Parse {
        field: fields.attest,
        source,
    })?;
    let signature = EccSignature::parse(parts.signature).map_err(|source| VerifyError::Parse {
        field: fields.signature,
        source,
    })?;

    // The AK: only a restricted signing key's signature over a TPM_GENERATED_VALUE structure
    // proves the TPM produced it; a non-restricted key could sign a forged TPMS_ATTEST.
    if ak.name_alg != TPM_ALG_SHA256 {
        return Err(VerifyError::AkNameAlg {
            actual: ak.name_alg,
        });
    }
    let attrs = ak.object_attributes;
    let problem = if attrs & object_attributes::RESTRICTED == 0 {
        Some("not restricted")
    } else if attrs & object_attributes::SIGN_ENCRYPT == 0 {
        Some("not a signing key")
    } else if attrs & object_attributes::FIXED_TPM == 0 {
        Some("not fixedTPM")
    } else if attrs & object_attributes::DECRYPT != 0 {
        Some("also a decryption key")
    } else {
        None
    };
    if let Some(problem) = problem {
        return Err(VerifyError::AkAttributes {
            actual: attrs,
            problem,
        });
    }
    if ak.scheme.scheme != TPM_ALG_ECDSA || ak.scheme.hash_alg != Some(TPM_ALG_SHA256) {
        return Err(VerifyError::AkScheme {
            scheme: ak.scheme.scheme,
            hash: ak.scheme.hash_alg,
        });
    }
    if ak.curve != TPM_ECC_NIST_P256 {
        return Err(VerifyError::AkKey {
            reason: format!("curve is {:#06x}, expected NIST P-256 (0x0003)", ak.curve),
        });
    }
    let (Some(point), Some(key)) = (ak.p256_sec1_point(), ak.p256_verifying_key()) else {
        return Err(VerifyError::AkKey {
            reason: format!(
                "the point (x {} bytes, y {} bytes) is not on the curve",
                ak.x.len(),
                ak.y.len()
            ),
        });
    };
    let ak_name = ak.name().ok_or(VerifyError::AkNameAlg {
        actual: ak.name_alg,
    })?;

    // The signature, before anything inside the attest is believed.
    if signature.sig_alg != TPM_ALG_ECDSA || signature.hash_alg != TPM_ALG_SHA256 {
        return Err(VerifyError::SignatureScheme {
            sig_alg: signature.sig_alg,
            hash_alg: signature.hash_alg,
        });
    }
    let p256_signature = signature.to_p256().ok_or(VerifyError::SignatureMalformed {
        r_len: signature.r.len(),
        s_len: signature.s.len(),
    })?;
    if !tpm_types::verify_p256_sha256(&key, attest_bytes, &p256_signature) {
        return Err(VerifyError::SignatureInvalid {
            ak_name: hex::encode(&ak_name),
        });
    }

    // The signer is this AK as an endorsement-hierarchy primary (not, say, a child key).
    let expected_signer =
        ak.primary_qualified_name(TPM_RH_ENDORSEMENT)
            .ok_or(VerifyError::AkNameAlg {
                actual: ak.name_alg,
            })?;
    if attest.qualified_signer != expected_signer {
        return Err(VerifyError::QualifiedSigner {
            expected: hex::encode(expected_signer),
            actual: hex::encode(&attest.qualified_signer),
        });
    }

    if attest.extra_data != nonce {
        return Err(VerifyError::UnexpectedNonce {
            expected: hex::encode(nonce),
            actual: hex::encode(&attest.extra_data),
        });
    }

    let mut declared = pcr_selection.to_vec();
    declared.sort_unstable();
    declared.dedup();
    let selection_matches = match attest.pcr_selections.as_slice() {
        [only] => only.hash_alg == TPM_ALG_SHA256 && only.indices() == declared,
        _ => false,
    };
    if !selection_matches || declared != pcr_selection {
        return Err(VerifyError::PcrSelection {
            declared: pcr_selection.to_vec(),
            attest: describe_selections(&attest.pcr_selections),
        });
    }
    let pcr_digest: [u8; 32] =
        attest
            .pcr_digest
            .clone()
            .try_into()
            .map_err(|d: Vec<u8>| VerifyError::Length {
                field: "quote.attest pcrDigest".into(),
                expected: 32,
                actual: d.len(),
            })?;

    Ok(VerifiedQuote {
        ak_fingerprint: Sha256::digest(point).into(),
        ak_public_point: point,
        ak_name,
        nonce: attest.extra_data,
        clock_info: attest.clock_info,
        firmware_version: attest.firmware_version,
        pcr_selection: declared,
        pcr_digest,
    })
}

impl VerifiedQuote {
    /// Checks that `pcrs` are exactly the quoted PCRs and hash to the quoted digest.
    pub fn check_pcrs(&self, pcrs: &BTreeMap<u8, [u8; 32]>) -> Result<(), VerifyError> {
        let quoted: BTreeSet<u8> = self.pcr_selection.iter().copied().collect();
        if let Some(&pcr) = pcrs.keys().find(|pcr| !quoted.contains(pcr)) {
            return Err(VerifyError::PcrNotQuoted { pcr });
        }
        let mut hasher = Sha256::new();
        for pcr in &self.pcr_selection {
            let value = pcrs.get(pcr).ok_or(VerifyError::PcrMissing { pcr: *pcr })?;
            hasher.update(value);
        }
        let computed: [u8; 32] = hasher.finalize().into();
        if computed != self.pcr_digest {
            return Err(VerifyError::PcrDigest {
                pcrs: self.pcr_selection.clone(),
                quoted: hex::encode(self.pcr_digest),
                computed: hex::encode(computed),
            });
        }
        Ok(())
    }

    /// Fails unless the quote was signed by the AK with TPM name `trusted_ak_name`.
    pub fn ensure_ak_name(&self, trusted_ak_name: &[u8]) -> Result<(), VerifyError> {
        if self.ak_name == trusted_ak_name {
            Ok(())
        } else {
            Err(VerifyError::UntrustedAk {
                expected: hex::encode(trusted_ak_name),
                actual: hex::encode(&self.ak_name),
            })
        }
    }
}
