//! The attestation key and its quotes: [`Tpm::create_attestation_key`] re-derives the AK from
//! the fixed template (see the `tpm` module docs), [`AttestationKey`] flushes it when dropped.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tss_esapi::{
    attributes::ObjectAttributesBuilder,
    handles::{KeyHandle, ObjectHandle},
    interface_types::{
        algorithm::{EccSchemeAlgorithm, PublicAlgorithm},
        ecc::EccCurve,
        resource_handles::Hierarchy,
        session_handles::AuthSession,
    },
    structures::{
        Data, EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme, PcrSelectionList,
        Public, PublicBuffer, PublicBuilder, PublicEccParametersBuilder, SignatureScheme,
        SymmetricDefinitionObject,
    },
    traits::Marshall,
};

use super::pcrs::pcr_slot;
use super::{HashingAlgorithm, Inner, Tpm, TpmError, lock};
use crate::report::QuoteEvidence;
use crate::tpm_types::EccPublic;

/// The AK template described in the module docs.
fn attestation_key_template() -> Result<Public, tss_esapi::Error> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .with_decrypt(false)
        .build()?;
    PublicBuilder::new()
        .with_public_algorithm(PublicAlgorithm::Ecc)
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes)
        .with_ecc_parameters(
            PublicEccParametersBuilder::new()
                .with_symmetric(SymmetricDefinitionObject::Null)
                .with_ecc_scheme(EccScheme::create(
                    EccSchemeAlgorithm::EcDsa,
                    Some(HashingAlgorithm::Sha256),
                    None,
                )?)
                .with_curve(EccCurve::NistP256)
                .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                .with_is_signing_key(true)
                .with_is_decryption_key(false)
                .with_restricted(true)
                .build()?,
        )
        .with_ecc_unique_identifier(EccPoint::default())
        .build()
}

impl Tpm {
    /// Creates (re-derives) the attestation key: the ECC P-256 restricted signing primary of the
    /// endorsement hierarchy from the fixed template in the module docs. The returned guard
    /// flushes the key when dropped.
    pub fn create_attestation_key(&self) -> Result<AttestationKey, TpmError> {
        const CALL: &str = "TPM2_CreatePrimary(endorsement, AK template)";
        let mut inner = lock(&self.inner);
        let template = attestation_key_template().map_err(inner.call_err(CALL))?;
        let created = inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.create_primary(Hierarchy::Endorsement, template, None, None, None, None)
            })
            .map_err(inner.call_err(CALL))?;
        // Release the lock before the guard exists: its Drop takes the lock to flush.
        drop(inner);
        // From here on the guard owns the handle: any error below flushes it.
        let mut key = AttestationKey {
            tpm: Arc::clone(&self.inner),
            handle: created.key_handle,
            public_tpm2b: Vec::new(),
            name: Vec::new(),
        };
        let public_tpm2b = PublicBuffer::try_from(created.out_public)
            .and_then(|buffer| buffer.marshall())
            .map_err(|source| TpmError::Call {
                call: "Tss2_MU_TPM2B_PUBLIC_Marshal",
                tcti: self.tcti.clone(),
                source,
            })?;
        let name = EccPublic::parse(&public_tpm2b)
            .ok()
            .and_then(|public| public.name())
            .ok_or_else(|| TpmError::Unexpected {
                call: CALL,
                tcti: self.tcti.clone(),
                detail: format!(
                    "an AK public area that does not parse: {}",
                    hex::encode(&public_tpm2b)
                ),
            })?;
        key.public_tpm2b = public_tpm2b;
        key.name = name;
        tracing::debug!(ak_name = %hex::encode(&key.name), "created attestation key");
        Ok(key)
    }

    /// Quotes the sha256-bank `pcrs` with the AK, binding `nonce` (at most 64 bytes) as
    /// qualifying data. The evidence carries the TPM's structures marshalled as the TPM defines
    /// them, so `tpm2_checkquote` and [`QuoteEvidence::verify`] both read it.
    pub fn quote(
        &self,
        ak: &AttestationKey,
        nonce: &[u8],
        pcrs: &[u8],
    ) -> Result<QuoteEvidence, TpmError> {
        let quote = self.quote_marshalled(ak, nonce, pcrs)?;
        Ok(QuoteEvidence {
            ak_public: hex::encode(&ak.public_tpm2b),
            attest: hex::encode(quote.attest),
            signature: hex::encode(quote.signature),
            pcr_selection: quote.pcr_selection,
        })
    }

    /// The quote of a boot report: the sha256-bank `pcrs` with the AK, binding
    /// [`boot_report_qualifying_data`](crate::report::boot_report_qualifying_data) of `nonce` —
    /// never the nonce itself, which the host may have chosen (see [`crate::report`]).
    pub fn quote_boot_report(
        &self,
        ak: &AttestationKey,
        nonce: &[u8],
        pcrs: &[u8],
    ) -> Result<QuoteEvidence, TpmError> {
        self.quote(ak, &crate::report::boot_report_qualifying_data(nonce), pcrs)
    }

    /// [`Tpm::quote`] returning the marshalled `TPMS_ATTEST` and `TPMT_SIGNATURE` as bytes.
    ///
    /// The AK is authorised with a password session (its auth value is empty), not an HMAC
    /// session: that saves the TPM2_StartAuthSession and TPM2_FlushContext round trips of a
    /// session per quote, which are most of a quote's latency on swtpm.
    pub fn quote_marshalled(
        &self,
        ak: &AttestationKey,
        nonce: &[u8],
        pcrs: &[u8],
    ) -> Result<MarshalledQuote, TpmError> {
        const CALL: &str = "TPM2_Quote";
        if !Arc::ptr_eq(&self.inner, &ak.tpm) {
            return Err(TpmError::ForeignKey);
        }
        let mut selected = BTreeSet::new();
        for &pcr in pcrs {
            pcr_slot(pcr)?;
            selected.insert(pcr);
        }
        let slots = selected
            .iter()
            .map(|&pcr| pcr_slot(pcr))
            .collect::<Result<Vec<_>, _>>()?;
        let mut inner = lock(&self.inner);
        let selection = PcrSelectionList::builder()
            .with_selection(HashingAlgorithm::Sha256, &slots)
            .build()
            .map_err(inner.call_err(CALL))?;
        let qualifying_data = Data::try_from(nonce.to_vec()).map_err(inner.call_err(CALL))?;
        let scheme = SignatureScheme::EcDsa {
            hash_scheme: HashScheme::new(HashingAlgorithm::Sha256),
        };
        let handle = ak.handle;
        let (attest, signature) = inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.quote(handle, qualifying_data, scheme, selection)
            })
            .map_err(inner.call_err(CALL))?;
        let attest = attest
            .marshall()
            .map_err(inner.call_err("Tss2_MU_TPMS_ATTEST_Marshal"))?;
        let signature = signature
            .marshall()
            .map_err(inner.call_err("Tss2_MU_TPMT_SIGNATURE_Marshal"))?;
        Ok(MarshalledQuote {
            attest,
            signature,
            pcr_selection: selected.into_iter().collect(),
        })
    }
}

/// A quote as the TPM marshalled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarshalledQuote {
    /// The signed `TPMS_ATTEST`.
    pub attest: Vec<u8>,
    /// The `TPMT_SIGNATURE` over `attest`.
    pub signature: Vec<u8>,
    /// The quoted sha256-bank PCRs, ascending.
    pub pcr_selection: Vec<u8>,
}

/// The loaded attestation key. Dropping it flushes the transient object from the TPM.
pub struct AttestationKey {
    tpm: Arc<Mutex<Inner>>,
    handle: KeyHandle,
    public_tpm2b: Vec<u8>,
    name: Vec<u8>,
}

impl AttestationKey {
    /// The AK's marshalled `TPM2B_PUBLIC`.
    pub fn public_tpm2b(&self) -> &[u8] {
        &self.public_tpm2b
    }

    /// The AK's TPM name (`000b || SHA256(TPMT_PUBLIC)`): what a verifier pins or certifies.
    pub fn name(&self) -> &[u8] {
        &self.name
    }
}

impl std::fmt::Debug for AttestationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttestationKey")
            .field("name", &hex::encode(&self.name))
            .finish()
    }
}

impl Drop for AttestationKey {
    fn drop(&mut self) {
        let mut inner = lock(&self.tpm);
        match inner.context.flush_context(ObjectHandle::from(self.handle)) {
            Ok(()) => tracing::debug!("flushed attestation key"),
            Err(err) => {
                tracing::warn!(tcti = %inner.tcti, %err, "TPM2_FlushContext of the attestation key failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_marshals_to_the_documented_bytes() {
        let template = attestation_key_template().expect("template builds");
        let marshalled = template.marshall().expect("marshals");
        assert_eq!(
            hex::encode(marshalled),
            hex::encode(crate::tpm_types::AK_TEMPLATE)
        );
    }
}
