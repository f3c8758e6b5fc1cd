// One file on purpose: one type (`Tpm`, one ESAPI context) with one method per TPM command.
//! The issuer: hawser's PID 1 talking to the node's TPM through tss-esapi and libtss2.
//!
//! A blocking API (the PID 1 runs it on `spawn_blocking`), one connection per [`Tpm`], opened
//! from a TCTI string: `device:/dev/tpmrm0` in the guest, `swtpm:host=127.0.0.1,port=N` against
//! a host swtpm.
//!
//! # Transient handles
//!
//! swtpm, and `/dev/tpm0` without the kernel's resource manager, keep a transient object loaded
//! until someone flushes it, and have only three slots (TPM_RC_OBJECT_MEMORY, 0x902, once they
//! are full). Every transient object this module creates is owned by a guard that flushes it
//! when dropped: an [`AttestationKey`] flushes its key however the caller's code path ends.
//!
//! # The attestation key template
//!
//! The AK is a **primary** key of the endorsement hierarchy, so the TPM derives it from the
//! endorsement primary seed and the template alone: the same TPM always gives the same AK, and
//! nothing has to be stored. A provider (the QEMU harness, a cloud) can create the same key
//! before boot, certify it and publish the certificate. The template (`TPMT_PUBLIC`) is fixed:
//!
//! | field | value |
//! |---|---|
//! | type | `TPM_ALG_ECC` |
//! | nameAlg | `TPM_ALG_SHA256` |
//! | objectAttributes | fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, restricted, sign (0x00050072) |
//! | authPolicy | empty |
//! | symmetric | `TPM_ALG_NULL` |
//! | scheme | `TPM_ALG_ECDSA` with `TPM_ALG_SHA256` |
//! | curveID | `TPM_ECC_NIST_P256` |
//! | kdf | `TPM_ALG_NULL` |
//! | unique | empty x, empty y |
//!
//! with an empty auth value, no sensitive data, no outside info and no creation PCRs. It is the
//! template `tpm2_createprimary -C e -G ecc256:ecdsa-sha256:null -g sha256 -a
//! 'fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign'` produces (a test
//! checks both give the same key).
//!
//! # Sessions
//!
//! Every authorisation here is of an empty auth value (the PCRs, the endorsement hierarchy, the
//! AK), given with a password session (`TPM_RS_PW`) rather than an HMAC session: an HMAC session
//! costs a TPM2_StartAuthSession and a TPM2_FlushContext around each command, ten times the
//! command itself on swtpm (a quote: 4.2 ms with, 0.49 ms without). An HMAC session would add
//! nothing when the secret is empty.
//!
//! # Boot phases
//!
//! [`Tpm::extend_phase`] does what systemd 257's `systemd-pcrextend WORD` does (see
//! [`hawser_pcr`] for the source): one TPM2_PCR_Extend carrying `H_bank(word)`
//! for every bank with all 24 PCRs allocated in which the PCR is already initialised (or for
//! every such bank if none is). SHA-2 banks are hashed here; any other bank (SHA-1 on swtpm,
//! SM3) is hashed by the TPM itself with TPM2_Hash, so no extra hash implementation is needed.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sha2::{Digest as _, Sha256, Sha384, Sha512};
use thiserror::Error;
use tss_esapi::{
    Context, TctiNameConf,
    attributes::ObjectAttributesBuilder,
    constants::CapabilityType,
    handles::{KeyHandle, NvIndexHandle, NvIndexTpmHandle, ObjectHandle, PcrHandle, TpmHandle},
    interface_types::{
        algorithm::{EccSchemeAlgorithm, PublicAlgorithm},
        ecc::EccCurve,
        resource_handles::{Hierarchy, NvAuth},
        session_handles::AuthSession,
    },
    structures::{
        CapabilityData, Data, Digest, DigestValues, EccPoint, EccScheme, HashScheme,
        KeyDerivationFunctionScheme, MaxBuffer, PcrSelectionList, PcrSlot, Public, PublicBuffer,
        PublicBuilder, PublicEccParametersBuilder, SignatureScheme, SymmetricDefinitionObject,
    },
    traits::Marshall,
};

use crate::report::QuoteEvidence;
use crate::tpm_types::EccPublic;

/// The TPM hash algorithms naming PCR banks (re-exported so callers need no tss-esapi dependency).
pub use tss_esapi::interface_types::algorithm::HashingAlgorithm;

/// The PCRs of a PC-client TPM: 0 to 23.
const PCR_COUNT: u8 = 24;
/// TPM2_PCR_Read returns at most 8 PCRs per call (the TPM's PCR selection output is limited).
const PCRS_PER_READ: usize = 8;
/// Bytes asked for per TPM2_GetRandom (a TPM returns at most its largest digest size).
const RANDOM_PER_CALL: usize = 32;
/// Bytes asked for per TPM2_NV_Read: every TPM supports at least this (TPM2_MAX_NV_BUFFER_SIZE
/// is 1024 on swtpm and most hardware, never below 512).
const NV_READ_CHUNK: u16 = 512;
/// The largest NV index this module reads (TPM NV indices are a few KiB at most).
const NV_MAX_READ: usize = 16 * 1024;

/// A TPM operation that failed. Each variant names the TPM command and the TCTI.
#[derive(Debug, Error)]
pub enum TpmError {
    /// The TCTI string does not parse or the TCTI library cannot be loaded.
    #[error("cannot open TPM through TCTI {tcti:?}")]
    Open {
        tcti: String,
        #[source]
        source: tss_esapi::Error,
    },
    /// A TPM command failed.
    #[error("{call} failed on TPM {tcti}")]
    Call {
        call: &'static str,
        tcti: String,
        #[source]
        source: tss_esapi::Error,
    },
    /// A TPM command returned a TPMS_ATTEST that does not parse.
    #[error("{call} on TPM {tcti} returned a TPMS_ATTEST that does not parse")]
    Attest {
        call: &'static str,
        tcti: String,
        #[source]
        source: crate::tpm_types::ParseError,
    },
    /// A TPM command returned something that does not fit the request.
    #[error("{call} on TPM {tcti} returned an unexpected response: {detail}")]
    Unexpected {
        call: &'static str,
        tcti: String,
        detail: String,
    },
    /// The caller asked for a PCR a PC-client TPM does not have.
    #[error("PCR {pcr} does not exist: a PC-client TPM has PCRs 0 to 23")]
    PcrIndex { pcr: u8 },
    /// An empty phase word (systemd-pcrextend refuses it too: it would make the series ambiguous).
    #[error("refusing to measure an empty phase word")]
    EmptyPhase,
    /// The TPM has no bank with all 24 PCRs allocated.
    #[error("TPM {tcti} has no PCR bank with all 24 PCRs allocated")]
    NoPcrBanks { tcti: String },
    /// An [`AttestationKey`] was used with another [`Tpm`] connection than the one that made it.
    #[error("the attestation key was created through another TPM connection")]
    ForeignKey,
    /// The NV index is not defined.
    #[error("NV index {index:#010x} is not defined on TPM {tcti}")]
    NvIndexMissing { index: u32, tcti: String },
}

struct Inner {
    context: Context,
    tcti: String,
}

// SAFETY: `Inner` owns its ESAPI context (heap state reached only through `&mut Context`) and the
// TCTI context (which tss-esapi itself declares Send + Sync). libtss2 requires that one ESAPI
// context is not used by two threads at the same time, which `Mutex<Inner>` guarantees; it has no
// thread affinity, so moving the context to another thread is sound.
unsafe impl Send for Inner {}

impl Inner {
    fn call_err(&self, call: &'static str) -> impl FnOnce(tss_esapi::Error) -> TpmError + '_ {
        move |source| TpmError::Call {
            call,
            tcti: self.tcti.clone(),
            source,
        }
    }

    fn unexpected(&self, call: &'static str, detail: String) -> TpmError {
        TpmError::Unexpected {
            call,
            tcti: self.tcti.clone(),
            detail,
        }
    }
}

/// A connection to a TPM. It is `Send + Sync` and every method takes `&self`, serialising on an
/// internal lock, so one connection can be shared (in an `Arc`) by the PID 1's blocking tasks.
pub struct Tpm {
    inner: Arc<Mutex<Inner>>,
    tcti: String,
}

impl std::fmt::Debug for Tpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tpm").field("tcti", &self.tcti).finish()
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock leaves the ESAPI context usable (each call is one TPM
    // command), so a poisoned lock is not a reason to give up on the TPM.
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

fn pcr_slot(pcr: u8) -> Result<PcrSlot, TpmError> {
    if pcr >= PCR_COUNT {
        return Err(TpmError::PcrIndex { pcr });
    }
    PcrSlot::try_from(1u32 << pcr).map_err(|_| TpmError::PcrIndex { pcr })
}

fn pcr_handle(pcr: u8) -> Result<PcrHandle, TpmError> {
    use PcrHandle::*;
    const HANDLES: [PcrHandle; PCR_COUNT as usize] = [
        Pcr0, Pcr1, Pcr2, Pcr3, Pcr4, Pcr5, Pcr6, Pcr7, Pcr8, Pcr9, Pcr10, Pcr11, Pcr12, Pcr13,
        Pcr14, Pcr15, Pcr16, Pcr17, Pcr18, Pcr19, Pcr20, Pcr21, Pcr22, Pcr23,
    ];
    HANDLES
        .get(usize::from(pcr))
        .copied()
        .ok_or(TpmError::PcrIndex { pcr })
}

fn slot_index(slot: PcrSlot) -> u8 {
    // A PcrSlot is a single bit of a u32, so trailing_zeros is below 32.
    u32::from(slot).trailing_zeros() as u8
}

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
    /// Opens a TPM through a TCTI configuration string (`device:/dev/tpmrm0`,
    /// `swtpm:host=127.0.0.1,port=2321`, …).
    pub fn open(tcti: &str) -> Result<Tpm, TpmError> {
        let open_err = |source| TpmError::Open {
            tcti: tcti.to_string(),
            source,
        };
        let conf = TctiNameConf::from_str(tcti).map_err(open_err)?;
        let context = Context::new(conf).map_err(open_err)?;
        tracing::debug!(tcti, "opened TPM");
        Ok(Tpm {
            inner: Arc::new(Mutex::new(Inner {
                context,
                tcti: tcti.to_string(),
            })),
            tcti: tcti.to_string(),
        })
    }

    /// The TCTI this connection was opened with.
    pub fn tcti(&self) -> &str {
        &self.tcti
    }

    /// The PCR banks with all 24 PCRs allocated (TPM2_GetCapability(TPM_CAP_PCRS)).
    pub fn pcr_banks(&self) -> Result<Vec<HashingAlgorithm>, TpmError> {
        let mut inner = lock(&self.inner);
        Self::full_banks(&mut inner)
    }

    fn full_banks(inner: &mut Inner) -> Result<Vec<HashingAlgorithm>, TpmError> {
        const CALL: &str = "TPM2_GetCapability(TPM_CAP_PCRS)";
        let (data, _more) = inner
            .context
            .get_capability(CapabilityType::AssignedPcr, 0, 1)
            .map_err(inner.call_err(CALL))?;
        let CapabilityData::AssignedPcr(list) = data else {
            return Err(inner.unexpected(CALL, format!("{data:?} instead of assigned PCRs")));
        };
        let banks: Vec<HashingAlgorithm> = list
            .get_selections()
            .iter()
            .filter(|selection| {
                (0..PCR_COUNT)
                    .all(|pcr| pcr_slot(pcr).is_ok_and(|slot| selection.is_selected(slot)))
            })
            .map(|selection| selection.hashing_algorithm())
            .collect();
        if banks.is_empty() {
            return Err(TpmError::NoPcrBanks {
                tcti: inner.tcti.clone(),
            });
        }
        Ok(banks)
    }

    /// Reads `pcrs` of one bank, looping because TPM2_PCR_Read returns at most 8 PCRs a call.
    pub fn read_pcrs(
        &self,
        bank: HashingAlgorithm,
        pcrs: impl IntoIterator<Item = u8>,
    ) -> Result<BTreeMap<u8, Vec<u8>>, TpmError> {
        let mut inner = lock(&self.inner);
        Self::read_pcrs_locked(&mut inner, bank, pcrs)
    }

    fn read_pcrs_locked(
        inner: &mut Inner,
        bank: HashingAlgorithm,
        pcrs: impl IntoIterator<Item = u8>,
    ) -> Result<BTreeMap<u8, Vec<u8>>, TpmError> {
        const CALL: &str = "TPM2_PCR_Read";
        let mut pending = BTreeSet::new();
        for pcr in pcrs {
            pcr_slot(pcr)?;
            pending.insert(pcr);
        }
        let mut values = BTreeMap::new();
        while !pending.is_empty() {
            let batch = pending
                .iter()
                .take(PCRS_PER_READ)
                .map(|&pcr| pcr_slot(pcr))
                .collect::<Result<Vec<_>, _>>()?;
            let selection = PcrSelectionList::builder()
                .with_selection(bank, &batch)
                .build()
                .map_err(inner.call_err(CALL))?;
            let (_update_counter, read, digests) = inner
                .context
                .pcr_read(selection)
                .map_err(inner.call_err(CALL))?;
            // The digests follow the returned selection: banks in order, PCRs ascending.
            let mut digests = digests.value().iter();
            let mut progressed = false;
            for selection in read.get_selections() {
                for slot in selection.selected() {
                    let Some(digest) = digests.next() else {
                        return Err(
                            inner.unexpected(CALL, "fewer digests than selected PCRs".to_string())
                        );
                    };
                    let pcr = slot_index(slot);
                    if selection.hashing_algorithm() == bank && pending.remove(&pcr) {
                        values.insert(pcr, digest.value().to_vec());
                        progressed = true;
                    }
                }
            }
            if !progressed {
                return Err(inner.unexpected(
                    CALL,
                    format!("none of PCRs {pending:?} of bank {bank:?} (are they allocated?)"),
                ));
            }
        }
        Ok(values)
    }

    /// Reads `pcrs` of the sha256 bank.
    pub fn read_pcrs_sha256(
        &self,
        pcrs: impl IntoIterator<Item = u8>,
    ) -> Result<BTreeMap<u8, [u8; 32]>, TpmError> {
        let mut inner = lock(&self.inner);
        let values = Self::read_pcrs_locked(&mut inner, HashingAlgorithm::Sha256, pcrs)?;
        values
            .into_iter()
            .map(|(pcr, value)| {
                let len = value.len();
                <[u8; 32]>::try_from(value).map(|v| (pcr, v)).map_err(|_| {
                    inner.unexpected(
                        "TPM2_PCR_Read",
                        format!("sha256 PCR {pcr} has {len} bytes, expected 32"),
                    )
                })
            })
            .collect()
    }

    /// Extends PCR `pcr` with the boot-phase word `phase` in every bank systemd-pcrextend would
    /// use (see the module docs). Returns the banks extended.
    pub fn extend_phase(&self, pcr: u8, phase: &str) -> Result<Vec<HashingAlgorithm>, TpmError> {
        if phase.is_empty() {
            return Err(TpmError::EmptyPhase);
        }
        let handle = pcr_handle(pcr)?;
        let mut inner = lock(&self.inner);
        let full = Self::full_banks(&mut inner)?;

        // Prefer the banks where the PCR is initialised (not all-zero or all-one), as
        // systemd's tpm2_get_good_pcr_banks() does.
        let mut good = Vec::new();
        for &bank in &full {
            let values = Self::read_pcrs_locked(&mut inner, bank, [pcr])?;
            let initialised = values.get(&pcr).is_some_and(|value| {
                !value.iter().all(|&b| b == 0) && !value.iter().all(|&b| b == 0xff)
            });
            if initialised {
                good.push(bank);
            }
        }
        let banks = if good.is_empty() { full } else { good };

        let mut digests = DigestValues::new();
        for &bank in &banks {
            let digest = Self::hash_for_bank(&mut inner, bank, phase.as_bytes())?;
            digests.set(bank, digest);
        }
        inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.pcr_extend(handle, digests)
            })
            .map_err(inner.call_err("TPM2_PCR_Extend"))?;
        tracing::info!(pcr, phase, banks = ?banks, "extended PCR with boot phase");
        Ok(banks)
    }

    /// Extends the sha256 bank of `pcr` with `digest` itself (not a hash of it), as
    /// Constellation's node lock extends PCR 15 with the cluster ID.
    pub fn extend_sha256_digest(&self, pcr: u8, digest: &[u8; 32]) -> Result<(), TpmError> {
        let handle = pcr_handle(pcr)?;
        let mut inner = lock(&self.inner);
        let mut digests = DigestValues::new();
        let value = Digest::try_from(digest.to_vec()).map_err(inner.call_err("Digest"))?;
        digests.set(HashingAlgorithm::Sha256, value);
        inner
            .context
            .execute_with_session(Some(AuthSession::Password), |ctx| {
                ctx.pcr_extend(handle, digests)
            })
            .map_err(inner.call_err("TPM2_PCR_Extend"))?;
        tracing::info!(pcr, "extended the sha256 bank with a digest");
        Ok(())
    }

    fn hash_for_bank(
        inner: &mut Inner,
        bank: HashingAlgorithm,
        data: &[u8],
    ) -> Result<Digest, TpmError> {
        let local = match bank {
            HashingAlgorithm::Sha256 => Some(Sha256::digest(data).to_vec()),
            HashingAlgorithm::Sha384 => Some(Sha384::digest(data).to_vec()),
            HashingAlgorithm::Sha512 => Some(Sha512::digest(data).to_vec()),
            _ => None,
        };
        match local {
            Some(bytes) => Digest::try_from(bytes).map_err(inner.call_err("TPM2_PCR_Extend")),
            None => {
                let buffer =
                    MaxBuffer::try_from(data.to_vec()).map_err(inner.call_err("TPM2_Hash"))?;
                let (digest, _ticket) = inner
                    .context
                    .execute_without_session(|ctx| ctx.hash(buffer, bank, Hierarchy::Null))
                    .map_err(inner.call_err("TPM2_Hash"))?;
                Ok(digest)
            }
        }
    }

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

    /// Reads the whole content of NV index `index` (TPM2_NV_Read in chunks), authorising with
    /// the index's own empty auth value (TPMA_NV_AUTHREAD), as a provider-written certificate
    /// index allows.
    pub fn read_nv(&self, index: u32) -> Result<Vec<u8>, TpmError> {
        const CALL: &str = "TPM2_NV_Read";
        let mut inner = lock(&self.inner);
        let (data, _more) = inner
            .context
            .execute_without_session(|ctx| ctx.get_capability(CapabilityType::Handles, index, 1))
            .map_err(inner.call_err("TPM2_GetCapability(TPM_CAP_HANDLES)"))?;
        let defined = matches!(&data, CapabilityData::Handles(list)
            if list.iter().next().is_some_and(|h| u32::from(*h) == index));
        if !defined {
            return Err(TpmError::NvIndexMissing {
                index,
                tcti: inner.tcti.clone(),
            });
        }
        let tpm_handle = NvIndexTpmHandle::new(index).map_err(inner.call_err(CALL))?;
        let mut object = inner
            .context
            .execute_without_session(|ctx| ctx.tr_from_tpm_public(TpmHandle::NvIndex(tpm_handle)))
            .map_err(inner.call_err("Esys_TR_FromTPMPublic"))?;
        let result = Self::read_nv_locked(&mut inner, NvIndexHandle::from(object));
        // Releases only the ESYS bookkeeping for the index; the index itself stays.
        if let Err(err) = inner.context.tr_close(&mut object) {
            tracing::warn!(tcti = %inner.tcti, %err, "Esys_TR_Close of an NV index failed");
        }
        result
    }

    fn read_nv_locked(inner: &mut Inner, handle: NvIndexHandle) -> Result<Vec<u8>, TpmError> {
        const CALL: &str = "TPM2_NV_Read";
        let (public, _name) = inner
            .context
            .execute_without_session(|ctx| ctx.nv_read_public(handle))
            .map_err(inner.call_err("TPM2_NV_ReadPublic"))?;
        let size = public.data_size();
        if size > NV_MAX_READ {
            return Err(inner.unexpected(
                "TPM2_NV_ReadPublic",
                format!("an NV index of {size} bytes (more than {NV_MAX_READ})"),
            ));
        }
        let mut data = Vec::with_capacity(size);
        while data.len() < size {
            // Both fit in u16: size <= NV_MAX_READ < 65536.
            let offset = data.len() as u16;
            let want = (size - data.len()).min(usize::from(NV_READ_CHUNK)) as u16;
            let chunk = inner
                .context
                .execute_with_session(Some(AuthSession::Password), |ctx| {
                    ctx.nv_read(NvAuth::NvIndex(handle), handle, want, offset)
                })
                .map_err(inner.call_err(CALL))?;
            if chunk.value().is_empty() {
                return Err(inner.unexpected(CALL, format!("0 bytes at offset {offset}")));
            }
            data.extend_from_slice(chunk.value());
        }
        data.truncate(size);
        Ok(data)
    }

    /// `n` bytes from the TPM's random number generator (TPM2_GetRandom, repeated as needed).
    pub fn get_random(&self, n: usize) -> Result<Vec<u8>, TpmError> {
        const CALL: &str = "TPM2_GetRandom";
        let mut inner = lock(&self.inner);
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let want = (n - out.len()).min(RANDOM_PER_CALL);
            let bytes = inner
                .context
                .execute_without_session(|ctx| ctx.get_random(want))
                .map_err(inner.call_err(CALL))?;
            if bytes.value().is_empty() {
                return Err(inner.unexpected(CALL, format!("0 bytes for a request of {want}")));
            }
            let take = bytes.value().len().min(n - out.len());
            out.extend_from_slice(&bytes.value()[..take]);
        }
        Ok(out)
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
