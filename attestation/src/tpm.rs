//! The issuer: hawser's PID 1 talking to the node's TPM. It speaks the few TPM 2.0 commands it
//! needs itself (module `wire`: TPM2_GetCapability, TPM2_ReadPublic, TPM2_CreatePrimary,
//! TPM2_Quote, TPM2_PCR_Read, TPM2_PCR_Extend, TPM2_Hash, TPM2_NV_ReadPublic, TPM2_NV_Read,
//! TPM2_GetRandom, TPM2_FlushContext), in pure Rust: no libtss2, and so no libcrypto, in the
//! initramfs.
//!
//! A blocking API (the PID 1 runs it on `spawn_blocking`), one connection per [`Tpm`], opened
//! from a TCTI string: `device:/dev/tpmrm0` in the guest (the character device: write a
//! command, read its response), `swtpm:host=127.0.0.1,port=N` against a host swtpm (its TCP
//! server socket, raw command bytes as libtss2's `swtpm` TCTI sends them). Neither sends
//! TPM2_Startup: the firmware, or swtpm's `startup-clear` flag, did. A TPM that answers
//! TPM_RC_RETRY, TPM_RC_YIELDED or TPM_RC_TESTING gets the command again, after a pause.
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
//! checks both give the same key). The command sends [`crate::tpm_types::AK_TEMPLATE`] as is.
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
//! The PCR commands are in `pcrs`, the attestation key and its quotes in `ak`, the wire format
//! and the transports in `wire`; this file holds the connection, its errors, NV reads and the
//! random number generator.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use thiserror::Error;

use crate::tpm_types::{ParseError, Reader};

mod ak;
mod pcrs;
mod wire;

pub use ak::{AttestationKey, MarshalledQuote};
pub use wire::{CommandError, HashingAlgorithm, ResponseCode};

use wire::{Command, Reply, Transport, cc};

/// Bytes asked for per TPM2_GetRandom (a TPM returns at most its largest digest size).
const RANDOM_PER_CALL: usize = 32;
/// Bytes asked for per TPM2_NV_Read: every TPM supports at least this (TPM2_MAX_NV_BUFFER_SIZE
/// is 1024 on swtpm and most hardware, never below 512).
const NV_READ_CHUNK: u16 = 512;
/// The largest NV index this module reads (TPM NV indices are a few KiB at most).
const NV_MAX_READ: usize = 16 * 1024;
/// How often a command the TPM asks to retry (TPM_RC_RETRY, _YIELDED, _TESTING) is sent.
const RETRY_ATTEMPTS: u32 = 40;
/// The pause before each retry (40 × 50 ms: a TPM's self-test is over well within 2 s).
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// `TPM_CAP_HANDLES`.
const TPM_CAP_HANDLES: u32 = 0x0000_0001;
/// `TPM_CAP_PCRS`.
const TPM_CAP_PCRS: u32 = 0x0000_0005;

/// A TPM operation that failed. Each variant names the TPM command and the TCTI.
#[derive(Debug, Error)]
pub enum TpmError {
    /// The TCTI string does not parse (this issuer speaks `device:` and `swtpm:`).
    #[error("cannot open TPM through TCTI {tcti:?}: {detail}")]
    Tcti { tcti: String, detail: String },
    /// The device cannot be opened or the swtpm socket not connected.
    #[error("cannot open TPM through TCTI {tcti:?}")]
    Open {
        tcti: String,
        #[source]
        source: std::io::Error,
    },
    /// A TPM command failed: the TPM returned an error code, or the I/O failed.
    #[error("{call} failed on TPM {tcti}")]
    Call {
        call: &'static str,
        tcti: String,
        #[source]
        source: CommandError,
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

impl TpmError {
    /// The TPM's response code, when the TPM refused the command.
    pub fn response_code(&self) -> Option<ResponseCode> {
        match self {
            TpmError::Call {
                source: CommandError::Response(rc),
                ..
            } => Some(*rc),
            _ => None,
        }
    }
}

struct Inner {
    transport: Transport,
    tcti: String,
}

impl Inner {
    fn unexpected(&self, call: &'static str, detail: String) -> TpmError {
        TpmError::Unexpected {
            call,
            tcti: self.tcti.clone(),
            detail,
        }
    }

    fn parse_err(&self, call: &'static str) -> impl FnOnce(ParseError) -> TpmError + '_ {
        move |err| self.unexpected(call, err.to_string())
    }

    /// Sends `command` (again while the TPM asks for a retry) and returns the successful
    /// response, framing checked.
    fn execute(&mut self, call: &'static str, command: &Command) -> Result<Vec<u8>, TpmError> {
        let call_err = |tcti: &str, source| TpmError::Call {
            call,
            tcti: tcti.to_string(),
            source,
        };
        let bytes = command
            .marshal()
            .map_err(|err| call_err(&self.tcti, CommandError::Io(err)))?;
        let mut attempt = 1;
        loop {
            let response = self
                .transport
                .transact(&bytes)
                .map_err(|err| call_err(&self.tcti, CommandError::Io(err)))?;
            let rc = wire::response_code(&response);
            if rc == 0 {
                return Ok(response);
            }
            let rc = ResponseCode(rc);
            if rc.is_retry() && attempt < RETRY_ATTEMPTS {
                tracing::debug!(call, tcti = %self.tcti, %rc, attempt, "TPM asks to retry");
                attempt += 1;
                std::thread::sleep(RETRY_PAUSE);
                continue;
            }
            tracing::debug!(call, code = command.code(), %rc, "TPM command failed");
            return Err(call_err(&self.tcti, CommandError::Response(rc)));
        }
    }

    /// [`Inner::execute`], then splits the response: `handles` response handles, then the
    /// parameters, handed to `parse`.
    fn run<T>(
        &mut self,
        call: &'static str,
        command: Command,
        handles: usize,
        parse: impl FnOnce(Reply<'_>) -> Result<T, ParseError>,
    ) -> Result<T, TpmError> {
        let response = self.execute(call, &command)?;
        wire::split_reply(&response, handles, command.has_sessions())
            .and_then(parse)
            .map_err(self.parse_err(call))
    }

    /// TPM2_GetCapability(TPM_CAP_HANDLES) of one handle: whether it exists.
    fn handle_exists(&mut self, handle: u32) -> Result<bool, TpmError> {
        const CALL: &str = "TPM2_GetCapability(TPM_CAP_HANDLES)";
        let command = Command::new(cc::GET_CAPABILITY)
            .u32(TPM_CAP_HANDLES)
            .u32(handle)
            .u32(1);
        self.run(CALL, command, 0, |mut reply| {
            let r = &mut reply.params;
            r.u8("moreData")?;
            let capability_offset = r.offset();
            let capability = r.u32("capability")?;
            if capability != TPM_CAP_HANDLES {
                return Err(r.unexpected(
                    "capability",
                    capability_offset,
                    "TPM_CAP_HANDLES",
                    capability.into(),
                ));
            }
            let count = r.u32("count")?;
            let first = if count > 0 {
                Some(r.u32("handle")?)
            } else {
                None
            };
            Ok(first == Some(handle))
        })
    }

    /// TPM2_FlushContext of a transient object.
    fn flush(&mut self, handle: u32) -> Result<(), TpmError> {
        let command = Command::new(cc::FLUSH_CONTEXT).u32(handle);
        self.run("TPM2_FlushContext", command, 0, |_| Ok(()))
    }
}

/// Reads a `TPM2B_*` and returns it with its size prefix (as a `TPM2B_PUBLIC` is kept).
fn tpm2b_whole(r: &mut Reader<'_>, field: &'static str, max: usize) -> Result<Vec<u8>, ParseError> {
    let body = r.tpm2b(field, max)?;
    // The reader bounded it by `max` < 65536.
    let mut out = (body.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    Ok(out)
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
    // A panic while holding the lock leaves the connection usable (each call is one TPM
    // command and its whole response), so a poisoned lock is not a reason to give up on the TPM.
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Tpm {
    /// Opens a TPM through a TCTI configuration string (`device:/dev/tpmrm0`,
    /// `swtpm:host=127.0.0.1,port=2321`).
    pub fn open(tcti: &str) -> Result<Tpm, TpmError> {
        let target = wire::parse_tcti(tcti).map_err(|detail| TpmError::Tcti {
            tcti: tcti.to_string(),
            detail,
        })?;
        let transport = Transport::open(&target).map_err(|source| TpmError::Open {
            tcti: tcti.to_string(),
            source,
        })?;
        tracing::debug!(tcti, "opened TPM");
        Ok(Tpm {
            inner: Arc::new(Mutex::new(Inner {
                transport,
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
        if !inner.handle_exists(index)? {
            return Err(TpmError::NvIndexMissing {
                index,
                tcti: inner.tcti.clone(),
            });
        }
        let size = inner.run(
            "TPM2_NV_ReadPublic",
            Command::new(cc::NV_READ_PUBLIC).handle(index),
            0,
            |mut reply| {
                let r = &mut reply.params;
                let public = r.tpm2b("nvPublic", usize::from(u16::MAX))?;
                let mut p = Reader::new(public, "TPMS_NV_PUBLIC");
                p.u32("nvIndex")?;
                p.u16("nameAlg")?;
                p.u32("attributes")?;
                p.tpm2b("authPolicy", 64)?;
                Ok(usize::from(p.u16("dataSize")?))
            },
        )?;
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
            let command = Command::new(cc::NV_READ)
                .authorised_handle(index)
                .handle(index)
                .u16(want)
                .u16(offset);
            let chunk = inner.run(CALL, command, 0, |mut reply| {
                Ok(reply
                    .params
                    .tpm2b("data", usize::from(NV_READ_CHUNK))?
                    .to_vec())
            })?;
            if chunk.is_empty() {
                return Err(inner.unexpected(CALL, format!("0 bytes at offset {offset}")));
            }
            data.extend_from_slice(&chunk);
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
            // want <= 32.
            let command = Command::new(cc::GET_RANDOM).u16(want as u16);
            let bytes = inner.run(CALL, command, 0, |mut reply| {
                Ok(reply.params.tpm2b("randomBytes", 64)?.to_vec())
            })?;
            if bytes.is_empty() {
                return Err(inner.unexpected(CALL, format!("0 bytes for a request of {want}")));
            }
            let take = bytes.len().min(n - out.len());
            out.extend_from_slice(&bytes[..take]);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// A TPM on loopback that, like swtpm, serves one connection at a time, answers each
    /// command with the next of `responses` (hex), and returns the commands it got. The
    /// issuer's open connects once without a command (to fail early); every command connects.
    fn fake_tpm(
        responses: &'static [&'static str],
    ) -> (String, std::thread::JoinHandle<Vec<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            drop(listener.accept().expect("accept the open's probe"));
            let mut commands = Vec::new();
            for response in responses {
                let (mut stream, _) = listener.accept().expect("accept");
                let mut header = [0u8; 10];
                stream.read_exact(&mut header).expect("header");
                let size = u32::from_be_bytes([header[2], header[3], header[4], header[5]]);
                let mut rest = vec![0u8; size as usize - 10];
                stream.read_exact(&mut rest).expect("body");
                commands.push([header.as_slice(), &rest].concat());
                // Two writes: the client must put a response together from short reads.
                let bytes = hex::decode(response).expect("hex");
                stream.write_all(&bytes[..3]).expect("write");
                stream.flush().expect("flush");
                std::thread::sleep(Duration::from_millis(5));
                stream.write_all(&bytes[3..]).expect("write");
            }
            commands
        });
        (format!("swtpm:host=127.0.0.1,port={port}"), server)
    }

    #[test]
    fn a_command_the_tpm_asks_to_retry_is_sent_again() {
        let (tcti, server) = fake_tpm(&[
            "80010000000a00000922",             // TPM_RC_RETRY
            "80010000000a0000090a",             // TPM_RC_TESTING
            "80010000001000000000000401020304", // four random bytes
        ]);
        let tpm = Tpm::open(&tcti).expect("open");
        assert_eq!(tpm.get_random(4).expect("random"), [1, 2, 3, 4]);
        let commands = server.join().expect("server");
        assert_eq!(commands.len(), 3);
        assert!(
            commands
                .iter()
                .all(|c| hex::encode(c) == "80010000000c0000017b0004")
        );
    }

    #[test]
    fn a_tpm_error_names_the_command_the_tcti_and_the_code() {
        let (tcti, server) = fake_tpm(&["80010000000a0000018b"]);
        let tpm = Tpm::open(&tcti).expect("open");
        let err = tpm.read_nv(0x01c1_0002).expect_err("refused");
        assert_eq!(err.response_code(), Some(ResponseCode(0x18b)));
        let text = crate::error_chain(&err);
        assert!(
            text.contains("TPM2_GetCapability(TPM_CAP_HANDLES)"),
            "{text}"
        );
        assert!(text.contains(&tcti), "{text}");
        assert!(text.contains("TPM_RC_HANDLE of handle 1"), "{text}");
        server.join().expect("server");
    }

    #[test]
    fn an_unknown_tcti_is_refused_before_any_io() {
        assert!(matches!(
            Tpm::open("mssim:host=localhost"),
            Err(TpmError::Tcti { .. })
        ));
    }
}
