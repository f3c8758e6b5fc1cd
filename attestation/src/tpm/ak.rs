//! The attestation key and its quotes: [`Tpm::create_attestation_key`] re-derives the AK from
//! the fixed template (see the `tpm` module docs), [`AttestationKey`] flushes it when dropped;
//! [`Tpm::load_persistent_attestation_key`] uses a key a platform keeps persistent (Azure's),
//! which is never flushed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::pcrs::pcr_slot;
use super::wire::{Command, cc};
use super::{HashingAlgorithm, Inner, Tpm, TpmError, lock, tpm2b_whole};
use crate::report::QuoteEvidence;
use crate::tpm_types::{
    AK_TEMPLATE, TPM_ALG_ECC, TPM_ALG_ECDSA, TPM_RH_ENDORSEMENT, object_attributes,
};

/// `TPM_ALG_RSA`.
const TPM_ALG_RSA: u16 = 0x0001;
/// `TPM_ALG_RSASSA`.
const TPM_ALG_RSASSA: u16 = 0x0014;
/// The largest `TPMT_PUBLIC` (an RSA-4096 key's is under 600 bytes).
const MAX_PUBLIC: usize = 1024;
/// The largest `TPM2B_NAME` (a SHA-512 name and its algorithm).
const MAX_NAME: usize = 66;
/// The largest `TPM2B_DATA` qualifying data (`sizeof(TPMT_HA)`).
const MAX_QUALIFYING_DATA: usize = 66;
/// The largest `TPM2B_ATTEST`.
const MAX_ATTEST: usize = 1024;

/// The key type (`TPM_ALG_RSA` or `TPM_ALG_ECC`) and attributes of a marshalled `TPMT_PUBLIC`.
fn type_and_attributes(tpmt_public: &[u8]) -> Option<(u16, u32)> {
    let key_type = u16::from_be_bytes(tpmt_public.get(0..2)?.try_into().ok()?);
    let attributes = u32::from_be_bytes(tpmt_public.get(4..8)?.try_into().ok()?);
    Some((key_type, attributes))
}

/// Whether a key's attributes make it a restricted signing key.
fn is_restricted_signer(attributes: u32) -> bool {
    use object_attributes::{DECRYPT, RESTRICTED, SIGN_ENCRYPT};
    attributes & RESTRICTED != 0 && attributes & SIGN_ENCRYPT != 0 && attributes & DECRYPT == 0
}

/// The quote signature scheme (RSASSA or ECDSA, both SHA-256) for a key type.
fn scheme_for(key_type: u16) -> Option<u16> {
    match key_type {
        TPM_ALG_RSA => Some(TPM_ALG_RSASSA),
        TPM_ALG_ECC => Some(TPM_ALG_ECDSA),
        _ => None,
    }
}

/// The TPM2_CreatePrimary command for an endorsement-hierarchy primary from `tpmt_public`:
/// empty auth and sensitive data, no outside info, no creation PCRs.
fn create_primary_command(tpmt_public: &[u8]) -> Command {
    Command::new(cc::CREATE_PRIMARY)
        .authorised_handle(TPM_RH_ENDORSEMENT)
        // TPM2B_SENSITIVE_CREATE: size 4, empty userAuth, empty data.
        .tpm2b(&[0, 0, 0, 0])
        .tpm2b(tpmt_public)
        // outsideInfo: empty.
        .tpm2b(&[])
        // creationPCR: an empty TPML_PCR_SELECTION.
        .u32(0)
}

impl Tpm {
    /// Creates (re-derives) the attestation key: the ECC P-256 restricted signing primary of the
    /// endorsement hierarchy from the fixed template in the module docs. The returned guard
    /// flushes the key when dropped.
    pub fn create_attestation_key(&self) -> Result<AttestationKey, TpmError> {
        const CALL: &str = "TPM2_CreatePrimary(endorsement, AK template)";
        self.create_primary_ak(CALL, &AK_TEMPLATE, TPM_ALG_ECDSA)
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
        let Some((key_type, attributes)) = type_and_attributes(tpmt_public) else {
            return Err(unexpected(format!(
                "the platform's AK template of {} bytes is not a TPMT_PUBLIC",
                tpmt_public.len()
            )));
        };
        if tpmt_public.len() > MAX_PUBLIC {
            return Err(unexpected(format!(
                "the platform's AK template has {} bytes (more than {MAX_PUBLIC})",
                tpmt_public.len()
            )));
        }
        if !is_restricted_signer(attributes) {
            return Err(unexpected(
                "the platform's AK template is not a restricted signing key".to_owned(),
            ));
        }
        let Some(scheme) = scheme_for(key_type) else {
            return Err(unexpected(
                "the platform's AK template is neither RSA nor ECC".to_owned(),
            ));
        };
        self.create_primary_ak(CALL, tpmt_public, scheme)
    }

    /// Uses the attestation key a platform keeps persistent at `handle` (Azure's vTPM AK at
    /// 0x81000003, a restricted RSA signing primary of the endorsement hierarchy the paravisor
    /// makes at boot). Its public area is read with TPM2_ReadPublic and its name computed from
    /// it (and checked against the TPM's); an RSA key quotes with RSASSA-SHA256, an ECC key
    /// with ECDSA-SHA256. The key belongs to the platform: dropping the guard never sends
    /// TPM2_FlushContext or TPM2_EvictControl, so the key stays for the next boot stage and the
    /// next guard.
    pub fn load_persistent_attestation_key(&self, handle: u32) -> Result<AttestationKey, TpmError> {
        const CALL: &str = "TPM2_ReadPublic(the platform's persistent AK)";
        let unexpected = |detail: String| TpmError::Unexpected {
            call: CALL,
            tcti: self.tcti.clone(),
            detail,
        };
        if handle >> 24 != 0x81 {
            return Err(unexpected(format!(
                "{handle:#010x} is not a persistent handle"
            )));
        }
        let mut inner = lock(&self.inner);
        if !inner.handle_exists(handle)? {
            drop(inner);
            return Err(unexpected(format!(
                "no key is persistent at handle {handle:#010x}"
            )));
        }
        let (public_tpm2b, tpm_name) = inner.run(
            CALL,
            Command::new(cc::READ_PUBLIC).handle(handle),
            0,
            |mut reply| {
                let r = &mut reply.params;
                let public = tpm2b_whole(r, "outPublic", MAX_PUBLIC)?;
                let name = r.tpm2b("name", MAX_NAME)?.to_vec();
                Ok((public, name))
            },
        )?;
        drop(inner);
        let tpmt = public_tpm2b.get(2..).unwrap_or_default();
        let Some((key_type, attributes)) = type_and_attributes(tpmt) else {
            return Err(unexpected("a public area too short to be a key".to_owned()));
        };
        if !is_restricted_signer(attributes) {
            return Err(unexpected(format!(
                "the key at {handle:#010x} is not a restricted signing key"
            )));
        }
        let Some(scheme) = scheme_for(key_type) else {
            return Err(unexpected(format!(
                "the key at {handle:#010x} is neither RSA nor ECC"
            )));
        };
        let name = name_of_public(&public_tpm2b).ok_or_else(|| {
            unexpected(format!(
                "an AK public area without a SHA-256 name: {}",
                hex::encode(&public_tpm2b)
            ))
        })?;
        if name != tpm_name {
            return Err(unexpected(format!(
                "the TPM names the key {}, its public area hashes to {}",
                hex::encode(&tpm_name),
                hex::encode(&name)
            )));
        }
        let key = AttestationKey {
            tpm: Arc::clone(&self.inner),
            handle,
            scheme,
            public_tpm2b,
            name,
            persistent: true,
        };
        tracing::debug!(
            ak_name = %hex::encode(&key.name),
            handle = format_args!("{handle:#010x}"),
            "using the platform's persistent attestation key"
        );
        Ok(key)
    }

    /// TPM2_CreatePrimary of `tpmt_public` in the endorsement hierarchy, as an AK that quotes
    /// with `scheme` (and SHA-256).
    fn create_primary_ak(
        &self,
        call: &'static str,
        tpmt_public: &[u8],
        scheme: u16,
    ) -> Result<AttestationKey, TpmError> {
        let mut inner = lock(&self.inner);
        let (handles, public_tpm2b, tpm_name) =
            inner.run(call, create_primary_command(tpmt_public), 1, |mut reply| {
                let r = &mut reply.params;
                let public = tpm2b_whole(r, "outPublic", MAX_PUBLIC)?;
                r.tpm2b("creationData", usize::from(u16::MAX))?;
                r.tpm2b("creationHash", 64)?;
                // TPMT_TK_CREATION: tag, hierarchy, digest.
                r.u16("creationTicket.tag")?;
                r.u32("creationTicket.hierarchy")?;
                r.tpm2b("creationTicket.digest", 64)?;
                let name = r.tpm2b("name", MAX_NAME)?.to_vec();
                Ok((reply.handles, public, name))
            })?;
        let Some(&handle) = handles.first() else {
            return Err(inner.unexpected(call, "no object handle".to_owned()));
        };
        // Release the lock before the guard exists: its Drop takes the lock to flush.
        drop(inner);
        // From here on the guard owns the handle: any error below flushes it.
        let mut key = AttestationKey {
            tpm: Arc::clone(&self.inner),
            handle,
            scheme,
            public_tpm2b: Vec::new(),
            name: Vec::new(),
            persistent: false,
        };
        let name = name_of_public(&public_tpm2b).ok_or_else(|| TpmError::Unexpected {
            call,
            tcti: self.tcti.clone(),
            detail: format!(
                "an AK public area without a SHA-256 name: {}",
                hex::encode(&public_tpm2b)
            ),
        })?;
        if name != tpm_name {
            return Err(TpmError::Unexpected {
                call,
                tcti: self.tcti.clone(),
                detail: format!(
                    "the TPM names the key {}, its public area hashes to {}",
                    hex::encode(&tpm_name),
                    hex::encode(&name)
                ),
            });
        }
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
        let mut inner = lock(&self.inner);
        if nonce.len() > MAX_QUALIFYING_DATA {
            return Err(inner.unexpected(
                CALL,
                format!(
                    "qualifying data of {} bytes (at most {MAX_QUALIFYING_DATA})",
                    nonce.len()
                ),
            ));
        }
        let selection: Vec<u8> = selected.iter().copied().collect();
        let command = Command::new(cc::QUOTE)
            .authorised_handle(ak.handle)
            .tpm2b(nonce)
            // TPMT_SIG_SCHEME: the key's scheme with SHA-256.
            .u16(ak.scheme)
            .u16(HashingAlgorithm::Sha256.id())
            .pcr_selection(HashingAlgorithm::Sha256, &selection);
        let (attest, signature) = inner.run(CALL, command, 0, |mut reply| {
            let r = &mut reply.params;
            let attest = r.tpm2b("quoted", MAX_ATTEST)?.to_vec();
            // TPMT_SIGNATURE: the rest of the parameters.
            let signature = r.bytes(r.remaining(), "signature")?.to_vec();
            Ok((attest, signature))
        })?;
        if signature.len() < 4 {
            return Err(inner.unexpected(CALL, format!("a signature of {} bytes", signature.len())));
        }
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
    handle: u32,
    /// How it signs quotes (`TPM_ALG_ECDSA` or `TPM_ALG_RSASSA`, with SHA-256): ECDSA for
    /// hawser's own template, the platform's template's scheme otherwise.
    scheme: u16,
    public_tpm2b: Vec<u8>,
    name: Vec<u8>,
    /// A persistent handle the platform owns: never flushed (flushing a persistent handle is an error, evicting it would destroy the
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
        if self.persistent {
            return;
        }
        let mut inner = lock(&self.tpm);
        match inner.flush(self.handle) {
            Ok(()) => tracing::debug!("flushed attestation key"),
            Err(err) => {
                tracing::warn!(tcti = %inner.tcti, err = %crate::error_chain(&err), "TPM2_FlushContext of the attestation key failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ak_command_marshals_to_the_documented_bytes() {
        let command = create_primary_command(&AK_TEMPLATE)
            .marshal()
            .expect("marshals");
        let expected = concat!(
            "8002",     // TPM_ST_SESSIONS
            "00000041", // 65 bytes
            "00000131", // TPM_CC_CreatePrimary
            "4000000b", // TPM_RH_ENDORSEMENT
            "00000009", "40000009", "0000", "00", "0000", // TPM_RS_PW, empty password
            "0004", "0000", "0000", // inSensitive: empty userAuth, empty data
            "0018", // inPublic: 24 bytes of TPMT_PUBLIC
            "0023", "000b", "00050072", "0000", // ECC, SHA-256, attributes, no policy
            "0010", "0018", "000b", "0003",
            "0010", // symmetric NULL, ECDSA-SHA256, P-256, kdf NULL
            "0000", "0000",     // unique: empty x, empty y
            "0000",     // outsideInfo: empty
            "00000000", // creationPCR: none
        );
        assert_eq!(hex::encode(command), expected);
    }

    #[test]
    fn the_ak_template_is_a_restricted_ecc_signer() {
        let (key_type, attributes) = type_and_attributes(&AK_TEMPLATE).expect("long enough");
        assert_eq!(key_type, TPM_ALG_ECC);
        assert_eq!(attributes, 0x0005_0072);
        assert!(is_restricted_signer(attributes));
        assert!(!is_restricted_signer(
            attributes | object_attributes::DECRYPT
        ));
        assert_eq!(scheme_for(key_type), Some(TPM_ALG_ECDSA));
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
