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
//!
//! The PCR commands are in `pcrs`, the attestation key and its quotes in `ak`; this file holds
//! the connection, its errors, NV reads and the random number generator.

use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use thiserror::Error;
use tss_esapi::{
    Context, TctiNameConf,
    constants::CapabilityType,
    handles::{NvIndexHandle, NvIndexTpmHandle, TpmHandle},
    interface_types::{resource_handles::NvAuth, session_handles::AuthSession},
    structures::CapabilityData,
};

mod ak;
mod pcrs;

pub use ak::{AttestationKey, MarshalledQuote};

/// The TPM hash algorithms naming PCR banks (re-exported so callers need no tss-esapi dependency).
pub use tss_esapi::interface_types::algorithm::HashingAlgorithm;

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
