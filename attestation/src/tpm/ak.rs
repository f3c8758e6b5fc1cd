//! The attestation key and its quotes: [`Tpm::create_attestation_key`] re-derives the AK from
//! the fixed template (see the `tpm` module docs), [`AttestationKey`] flushes it when dropped;
//! [`Tpm::load_persistent_attestation_key`] uses a key a platform keeps persistent (Azure's),
//! which is never flushed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tss_esapi::{
    attributes::ObjectAttributesBuilder,
    constants::CapabilityType,
    handles::{KeyHandle, ObjectHandle, PersistentTpmHandle, TpmHandle},
    interface_types::{
        algorithm::{EccSchemeAlgorithm, PublicAlgorithm},
        ecc::EccCurve,
        resource_handles::Hierarchy,
        session_handles::AuthSession,
    },
    structures::{
        CapabilityData, Data, EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme,
        PcrSelectionList, Public, PublicBuffer, PublicBuilder, PublicEccParametersBuilder,
        SignatureScheme, SymmetricDefinitionObject,
    },
    traits::{Marshall, UnMarshall},
};

use super::pcrs::pcr_slot;
use super::{HashingAlgorithm, Inner, Tpm, TpmError, lock};
use crate::report::QuoteEvidence;

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
        let template = attestation_key_template().map_err(|source| TpmError::Call {
            call: CALL,
            tcti: self.tcti.clone(),
            source,
        })?;
        let scheme = SignatureScheme::EcDsa {
            hash_scheme: HashScheme::new(HashingAlgorithm::Sha256),
        };
        self.create_primary_ak(CALL, template, scheme)
    }

    /// Creates the attestation key a platform describes by its own template (a marshalled
    /// `TPMT_PUBLIC`, as GCE keeps in NV 0x01C10001): a restricted signing primary of the
    /// endorsement hierarchy, RSA (RSASSA-SHA256) or ECC (ECDSA-SHA256). The platform certified
    /// the key this template gives on this TPM, so the node re-derives exactly it.
    pub fn create_attestation_key_from_template(
        &self,
        tpmt_public: &[u8],
    ) -> Result<AttestationKey, TpmError> {
        const CALL: &str = "TPM2_CreatePrimary(endorsement, the platform's AK template)";
        let unexpected = |detail: String| TpmError::Unexpected {
            call: CALL,
            tcti: self.tcti.clone(),
            detail,
        };
        let template = Public::unmarshall(tpmt_public).map_err(|source| TpmError::Call {
            call: "Tss2_MU_TPMT_PUBLIC_Unmarshal",
            tcti: self.tcti.clone(),
            source,
        })?;
        let attributes = template.object_attributes();
        if !(attributes.restricted() && attributes.sign_encrypt() && !attributes.decrypt()) {
            return Err(unexpected(
                "the platform's AK template is not a restricted signing key".to_owned(),
            ));
        }
        let hash_scheme = HashScheme::new(HashingAlgorithm::Sha256);
        let scheme = match &template {
            Public::Rsa { .. } => SignatureScheme::RsaSsa { hash_scheme },
            Public::Ecc { .. } => SignatureScheme::EcDsa { hash_scheme },
            _ => {
                return Err(unexpected(
                    "the platform's AK template is neither RSA nor ECC".to_owned(),
                ));
            }
        };
        self.create_primary_ak(CALL, template, scheme)
    }

    /// Uses the attestation key a platform keeps persistent at `handle` (Azure's vTPM AK at
    /// 0x81000003, a restricted RSA signing primary of the endorsement hierarchy the paravisor
    /// makes at boot). Its public area is read with TPM2_ReadPublic and its name computed from
    /// it (and checked against the TPM's); an RSA key quotes with RSASSA-SHA256, an ECC key
    /// with ECDSA-SHA256. The key belongs to the platform: dropping the guard releases only
    /// ESYS's bookkeeping for the handle (Esys_TR_Close), never TPM2_FlushContext or
    /// TPM2_EvictControl, so the key stays for the next boot stage and the next guard.
    pub fn load_persistent_attestation_key(&self, handle: u32) -> Result<AttestationKey, TpmError> {
        const CALL: &str = "TPM2_ReadPublic(the platform's persistent AK)";
        let unexpected = |detail: String| TpmError::Unexpected {
            call: CALL,
            tcti: self.tcti.clone(),
            detail,
        };
        let mut inner = lock(&self.inner);
        let tpm_handle = PersistentTpmHandle::new(handle).map_err(inner.call_err(CALL))?;
        let (data, _more) = inner
            .context
            .execute_without_session(|ctx| ctx.get_capability(CapabilityType::Handles, handle, 1))
            .map_err(inner.call_err("TPM2_GetCapability(TPM_CAP_HANDLES)"))?;
        let present = matches!(&data, CapabilityData::Handles(list)
            if list.iter().next().is_some_and(|h| u32::from(*h) == handle));
        if !present {
            drop(inner);
            return Err(unexpected(format!(
                "no key is persistent at handle {handle:#010x}"
            )));
        }
        let object = inner
            .context
            .execute_without_session(|ctx| {
                ctx.tr_from_tpm_public(TpmHandle::Persistent(tpm_handle))
            })
            .map_err(inner.call_err("Esys_TR_FromTPMPublic"))?;
        // From here on the guard owns the ESYS handle: any error below closes it (and only that).
        let mut key = AttestationKey {
            tpm: Arc::clone(&self.inner),
            handle: KeyHandle::from(object),
            scheme: SignatureScheme::Null,
            public_tpm2b: Vec::new(),
            name: Vec::new(),
            persistent: true,
        };
        let read = inner
            .context
            .execute_without_session(|ctx| ctx.read_public(key.handle))
            .map_err(inner.call_err(CALL));
        // Release the lock before any return: the guard's Drop takes it.
        drop(inner);
        let (public, tpm_name, _qualified_name) = read?;
        let attributes = public.object_attributes();
        if !(attributes.restricted() && attributes.sign_encrypt() && !attributes.decrypt()) {
            return Err(unexpected(format!(
                "the key at {handle:#010x} is not a restricted signing key"
            )));
        }
        let hash_scheme = HashScheme::new(HashingAlgorithm::Sha256);
        key.scheme = match &public {
            Public::Rsa { .. } => SignatureScheme::RsaSsa { hash_scheme },
            Public::Ecc { .. } => SignatureScheme::EcDsa { hash_scheme },
            _ => {
                return Err(unexpected(format!(
                    "the key at {handle:#010x} is neither RSA nor ECC"
                )));
            }
        };
        let public_tpm2b = PublicBuffer::try_from(public)
            .and_then(|buffer| buffer.marshall())
            .map_err(|source| TpmError::Call {
                call: "Tss2_MU_TPM2B_PUBLIC_Marshal",
                tcti: self.tcti.clone(),
                source,
            })?;
        let name = name_of_public(&public_tpm2b).ok_or_else(|| {
            unexpected(format!(
                "an AK public area without a SHA-256 name: {}",
                hex::encode(&public_tpm2b)
            ))
        })?;
        if name != tpm_name.value() {
            return Err(unexpected(format!(
                "the TPM names the key {}, its public area hashes to {}",
                hex::encode(tpm_name.value()),
                hex::encode(&name)
            )));
        }
        key.public_tpm2b = public_tpm2b;
        key.name = name;
        tracing::debug!(
            ak_name = %hex::encode(&key.name),
            handle = format_args!("{handle:#010x}"),
            "using the platform's persistent attestation key"
        );
        Ok(key)
    }

    /// TPM2_CreatePrimary of `template` in the endorsement hierarchy, as an AK that quotes with
    /// `scheme`.
    fn create_primary_ak(
        &self,
        call: &'static str,
        template: Public,
        scheme: SignatureScheme,
    ) -> Result<AttestationKey, TpmError> {
        let mut inner = lock(&self.inner);
        let created = inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.create_primary(Hierarchy::Endorsement, template, None, None, None, None)
            })
            .map_err(inner.call_err(call))?;
        // Release the lock before the guard exists: its Drop takes the lock to flush.
        drop(inner);
        // From here on the guard owns the handle: any error below flushes it.
        let mut key = AttestationKey {
            tpm: Arc::clone(&self.inner),
            handle: created.key_handle,
            scheme,
            public_tpm2b: Vec::new(),
            name: Vec::new(),
            persistent: false,
        };
        let public_tpm2b = PublicBuffer::try_from(created.out_public)
            .and_then(|buffer| buffer.marshall())
            .map_err(|source| TpmError::Call {
                call: "Tss2_MU_TPM2B_PUBLIC_Marshal",
                tcti: self.tcti.clone(),
                source,
            })?;
        let name = name_of_public(&public_tpm2b).ok_or_else(|| TpmError::Unexpected {
            call,
            tcti: self.tcti.clone(),
            detail: format!(
                "an AK public area without a SHA-256 name: {}",
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
        let scheme = ak.scheme;
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

/// The loaded attestation key. Dropping it flushes the transient object from the TPM; a
/// platform's persistent key ([`Tpm::load_persistent_attestation_key`]) stays.
pub struct AttestationKey {
    tpm: Arc<Mutex<Inner>>,
    handle: KeyHandle,
    /// How it signs quotes: ECDSA for hawser's own template, the platform's template's scheme
    /// otherwise.
    scheme: SignatureScheme,
    public_tpm2b: Vec<u8>,
    name: Vec<u8>,
    /// A persistent handle the platform owns: dropped by closing the ESYS handle only, never
    /// flushed (flushing a persistent handle is an error, evicting it would destroy the
    /// platform's key).
    persistent: bool,
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

    /// Whether the key is a platform's persistent key (kept in the TPM when dropped).
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }
}

/// The TPM name of a marshalled `TPM2B_PUBLIC` whose name algorithm is SHA-256:
/// `000b || SHA-256(TPMT_PUBLIC)`.
fn name_of_public(public_tpm2b: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest as _;
    let tpmt = public_tpm2b.get(2..)?;
    let declared = usize::from(u16::from_be_bytes([public_tpm2b[0], public_tpm2b[1]]));
    if declared != tpmt.len() || tpmt.get(2..4)? != [0x00, 0x0b] {
        return None;
    }
    let mut name = vec![0x00, 0x0b];
    name.extend_from_slice(&sha2::Sha256::digest(tpmt));
    Some(name)
}

impl std::fmt::Debug for AttestationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttestationKey")
            .field("name", &hex::encode(&self.name))
            .field("persistent", &self.persistent)
            .finish()
    }
}

impl Drop for AttestationKey {
    fn drop(&mut self) {
        let mut inner = lock(&self.tpm);
        if self.persistent {
            let mut object = ObjectHandle::from(self.handle);
            if let Err(err) = inner.context.tr_close(&mut object) {
                tracing::warn!(tcti = %inner.tcti, %err, "Esys_TR_Close of the persistent attestation key failed");
            }
            return;
        }
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

    #[test]
    fn the_name_of_a_public_area_is_its_sha256_with_the_algorithm_in_front() {
        let tpmt = crate::tpm_types::AK_TEMPLATE;
        let mut tpm2b = u16::try_from(tpmt.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        tpm2b.extend_from_slice(&tpmt);
        let expected = crate::tpm_types::EccPublic::parse(&tpm2b)
            .expect("parses")
            .name()
            .expect("named");
        assert_eq!(name_of_public(&tpm2b), Some(expected));
        // A length that disagrees, or another name algorithm, has no name here.
        assert_eq!(name_of_public(&tpm2b[..tpm2b.len() - 1]), None);
        let mut sha1 = tpm2b.clone();
        sha1[5] = 0x04;
        assert_eq!(name_of_public(&sha1), None);
    }
}
