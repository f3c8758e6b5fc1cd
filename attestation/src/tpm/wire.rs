//! The TPM 2.0 wire format and the two transports (TCTIs) the issuer speaks it over.
//!
//! A command is `tag u16 || commandSize u32 || commandCode u32 || handles || [authorizationSize
//! u32 || sessions] || parameters`, big-endian; a response is `tag u16 || responseSize u32 ||
//! responseCode u32 || handles || [parameterSize u32] || parameters || [sessions]` (TPM 2.0
//! Part 1, section 18). The only session used is the empty password session (`TPM_RS_PW`).
//!
//! Transports:
//! - `device:PATH` (`/dev/tpmrm0`): one `write` of the command, then `read`s until the response
//!   is whole. The kernel's resource manager answers each command with one response.
//! - `swtpm:host=H,port=P`: swtpm's TCP server socket carries raw command and response bytes,
//!   as libtss2's `swtpm` TCTI sends them (no `mssim` framing). TPM2_Startup is not sent: the
//!   TPM's owner starts it up (QEMU's firmware in a guest, `--flags startup-clear` for the
//!   harness's TCP swtpm), as with libtss2.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;

use thiserror::Error;

use crate::tpm_types::{ParseError, Reader};

/// `TPM_ST_NO_SESSIONS`.
const TPM_ST_NO_SESSIONS: u16 = 0x8001;
/// `TPM_ST_SESSIONS`.
const TPM_ST_SESSIONS: u16 = 0x8002;
/// `TPM_RS_PW`: the password session.
const TPM_RS_PW: u32 = 0x4000_0009;
/// The response header: tag, size, response code.
const HEADER: usize = 10;
/// The largest response accepted (a TPM's buffers are 4 KiB; swtpm's and Linux's TPM_BUFSIZE).
const MAX_RESPONSE: usize = 64 * 1024;
/// The largest command sent.
const MAX_COMMAND: usize = 4096;
/// The default swtpm server port (libtss2's too).
const SWTPM_DEFAULT_PORT: u16 = 2321;

/// Command codes (`TPM_CC_*`).
pub(super) mod cc {
    pub const CREATE_PRIMARY: u32 = 0x0131;
    pub const NV_READ: u32 = 0x014e;
    pub const QUOTE: u32 = 0x0158;
    pub const FLUSH_CONTEXT: u32 = 0x0165;
    pub const NV_READ_PUBLIC: u32 = 0x0169;
    pub const READ_PUBLIC: u32 = 0x0173;
    pub const GET_CAPABILITY: u32 = 0x017a;
    pub const GET_RANDOM: u32 = 0x017b;
    pub const HASH: u32 = 0x017d;
    pub const PCR_READ: u32 = 0x017e;
    pub const PCR_EXTEND: u32 = 0x0182;
}

/// The TPM hash algorithms naming PCR banks (`TPMI_ALG_HASH`), with the variant names
/// tss-esapi's `HashingAlgorithm` had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashingAlgorithm {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
    Sm3_256,
    Sha3_256,
    Sha3_384,
    Sha3_512,
}

impl HashingAlgorithm {
    const ALL: [(HashingAlgorithm, u16, usize); 8] = [
        (HashingAlgorithm::Sha1, 0x0004, 20),
        (HashingAlgorithm::Sha256, 0x000b, 32),
        (HashingAlgorithm::Sha384, 0x000c, 48),
        (HashingAlgorithm::Sha512, 0x000d, 64),
        (HashingAlgorithm::Sm3_256, 0x0012, 32),
        (HashingAlgorithm::Sha3_256, 0x0027, 32),
        (HashingAlgorithm::Sha3_384, 0x0028, 48),
        (HashingAlgorithm::Sha3_512, 0x0029, 64),
    ];

    /// The `TPM_ALG_ID`.
    pub fn id(self) -> u16 {
        Self::ALL
            .iter()
            .find(|(alg, _, _)| *alg == self)
            .map_or(0x0010, |(_, id, _)| *id)
    }

    /// The algorithm of a `TPM_ALG_ID`, if it is a hash this module knows.
    pub fn from_id(id: u16) -> Option<HashingAlgorithm> {
        Self::ALL
            .iter()
            .find(|(_, known, _)| *known == id)
            .map(|(alg, _, _)| *alg)
    }

    /// The digest size in bytes.
    pub fn digest_size(self) -> usize {
        Self::ALL
            .iter()
            .find(|(alg, _, _)| *alg == self)
            .map_or(0, |(_, _, size)| *size)
    }
}

/// A TPM response code other than `TPM_RC_SUCCESS`, displayed decoded (format 0 or 1, the
/// code's name, and the handle, session or parameter it refers to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseCode(pub u32);

/// Format-1 errors (`TPM_RC_FMT1 + n`), by `n`.
const FMT1_NAMES: &[(u32, &str)] = &[
    (0x01, "TPM_RC_ASYMMETRIC"),
    (0x02, "TPM_RC_ATTRIBUTES"),
    (0x03, "TPM_RC_HASH"),
    (0x04, "TPM_RC_VALUE"),
    (0x05, "TPM_RC_HIERARCHY"),
    (0x07, "TPM_RC_KEY_SIZE"),
    (0x08, "TPM_RC_MGF"),
    (0x09, "TPM_RC_MODE"),
    (0x0a, "TPM_RC_TYPE"),
    (0x0b, "TPM_RC_HANDLE"),
    (0x0c, "TPM_RC_KDF"),
    (0x0d, "TPM_RC_RANGE"),
    (0x0e, "TPM_RC_AUTH_FAIL"),
    (0x0f, "TPM_RC_NONCE"),
    (0x10, "TPM_RC_PP"),
    (0x12, "TPM_RC_SCHEME"),
    (0x15, "TPM_RC_SIZE"),
    (0x16, "TPM_RC_SYMMETRIC"),
    (0x17, "TPM_RC_TAG"),
    (0x18, "TPM_RC_SELECTOR"),
    (0x1a, "TPM_RC_INSUFFICIENT"),
    (0x1b, "TPM_RC_SIGNATURE"),
    (0x1c, "TPM_RC_KEY"),
    (0x1d, "TPM_RC_POLICY_FAIL"),
    (0x1f, "TPM_RC_INTEGRITY"),
    (0x20, "TPM_RC_TICKET"),
    (0x21, "TPM_RC_RESERVED_BITS"),
    (0x22, "TPM_RC_BAD_AUTH"),
    (0x23, "TPM_RC_EXPIRED"),
    (0x24, "TPM_RC_POLICY_CC"),
    (0x25, "TPM_RC_BINDING"),
    (0x26, "TPM_RC_CURVE"),
    (0x27, "TPM_RC_ECC_POINT"),
];

/// Format-0 codes by their low 12 bits (`TPM_RC_VER1 + n` errors, `TPM_RC_WARN + n` warnings).
const FMT0_NAMES: &[(u32, &str)] = &[
    (0x100, "TPM_RC_INITIALIZE"),
    (0x101, "TPM_RC_FAILURE"),
    (0x103, "TPM_RC_SEQUENCE"),
    (0x10b, "TPM_RC_PRIVATE"),
    (0x119, "TPM_RC_HMAC"),
    (0x120, "TPM_RC_DISABLED"),
    (0x121, "TPM_RC_EXCLUSIVE"),
    (0x124, "TPM_RC_AUTH_TYPE"),
    (0x125, "TPM_RC_AUTH_MISSING"),
    (0x126, "TPM_RC_POLICY"),
    (0x127, "TPM_RC_PCR"),
    (0x128, "TPM_RC_PCR_CHANGED"),
    (0x12d, "TPM_RC_UPGRADE"),
    (0x12e, "TPM_RC_TOO_MANY_CONTEXTS"),
    (0x12f, "TPM_RC_AUTH_UNAVAILABLE"),
    (0x130, "TPM_RC_REBOOT"),
    (0x131, "TPM_RC_UNBALANCED"),
    (0x142, "TPM_RC_COMMAND_SIZE"),
    (0x143, "TPM_RC_COMMAND_CODE"),
    (0x144, "TPM_RC_AUTHSIZE"),
    (0x145, "TPM_RC_AUTH_CONTEXT"),
    (0x146, "TPM_RC_NV_RANGE"),
    (0x147, "TPM_RC_NV_SIZE"),
    (0x148, "TPM_RC_NV_LOCKED"),
    (0x149, "TPM_RC_NV_AUTHORIZATION"),
    (0x14a, "TPM_RC_NV_UNINITIALIZED"),
    (0x14b, "TPM_RC_NV_SPACE"),
    (0x14c, "TPM_RC_NV_DEFINED"),
    (0x150, "TPM_RC_BAD_CONTEXT"),
    (0x151, "TPM_RC_CPHASH"),
    (0x152, "TPM_RC_PARENT"),
    (0x153, "TPM_RC_NEEDS_TEST"),
    (0x154, "TPM_RC_NO_RESULT"),
    (0x155, "TPM_RC_SENSITIVE"),
    (0x901, "TPM_RC_CONTEXT_GAP"),
    (0x902, "TPM_RC_OBJECT_MEMORY"),
    (0x903, "TPM_RC_SESSION_MEMORY"),
    (0x904, "TPM_RC_MEMORY"),
    (0x905, "TPM_RC_SESSION_HANDLES"),
    (0x906, "TPM_RC_OBJECT_HANDLES"),
    (0x907, "TPM_RC_LOCALITY"),
    (0x908, "TPM_RC_YIELDED"),
    (0x909, "TPM_RC_CANCELED"),
    (0x90a, "TPM_RC_TESTING"),
    (0x920, "TPM_RC_NV_RATE"),
    (0x921, "TPM_RC_LOCKOUT"),
    (0x922, "TPM_RC_RETRY"),
    (0x923, "TPM_RC_NV_UNAVAILABLE"),
];

impl ResponseCode {
    /// The code's name (`TPM_RC_HANDLE` for any handle's `TPM_RC_HANDLE`), if it is a TPM
    /// code this module knows.
    pub fn name(self) -> Option<&'static str> {
        let rc = self.0;
        if rc >> 16 != 0 {
            return None;
        }
        if rc & 0x80 != 0 {
            let n = rc & 0x3f;
            return FMT1_NAMES.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        }
        if rc & 0x100 == 0 || rc & 0x400 != 0 {
            return None;
        }
        let key = rc & 0xfff;
        FMT0_NAMES.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// Whether the TPM asks for the command again as it was (Part 2, 6.6.3: TPM_RC_RETRY,
    /// TPM_RC_YIELDED, TPM_RC_TESTING).
    pub fn is_retry(self) -> bool {
        matches!(self.0, 0x922 | 0x908 | 0x90a)
    }
}

impl std::fmt::Display for ResponseCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rc = self.0;
        let layer = rc >> 16;
        if layer != 0 {
            return write!(
                f,
                "response code {rc:#010x} from TSS layer {layer} (not the TPM's)"
            );
        }
        let name = self.name();
        if rc & 0x80 != 0 {
            let n = (rc >> 8) & 0x7;
            let place = if rc & 0x40 != 0 {
                format!(" of parameter {}", (rc >> 8) & 0xf)
            } else if rc & 0x800 != 0 {
                format!(" of session {n}")
            } else if n != 0 {
                format!(" of handle {n}")
            } else {
                String::new()
            };
            let name = name.unwrap_or("format-1 error");
            return write!(f, "{name}{place} ({rc:#05x}, format 1)");
        }
        if rc & 0x100 == 0 {
            return write!(f, "TPM 1.2 response code {rc:#05x}");
        }
        if rc & 0x400 != 0 {
            return write!(f, "vendor-defined response code {rc:#05x}");
        }
        let kind = if rc & 0x800 != 0 { "warning" } else { "error" };
        match name {
            Some(name) => write!(f, "{name} ({rc:#05x}, format 0 {kind})"),
            None => write!(f, "format 0 {kind} {rc:#05x}"),
        }
    }
}

/// Why a command got no usable response.
#[derive(Debug, Error)]
pub enum CommandError {
    /// The TPM answered with an error or warning.
    #[error("the TPM returned {0}")]
    Response(ResponseCode),
    /// Writing the command or reading the response failed, or the response is not framed as
    /// a TPM response.
    #[error("TPM I/O failed")]
    Io(#[source] io::Error),
}

/// Where the TPM is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    Device(PathBuf),
    Swtpm { host: String, port: u16 },
}

/// Parses a TCTI configuration string: `device[:PATH]` or `swtpm[:host=H,port=P]`.
pub(super) fn parse_tcti(tcti: &str) -> Result<Target, String> {
    let (name, conf) = tcti.split_once(':').unwrap_or((tcti, ""));
    match name {
        "device" => Ok(Target::Device(PathBuf::from(if conf.is_empty() {
            "/dev/tpmrm0"
        } else {
            conf
        }))),
        "swtpm" => {
            let mut host = "localhost".to_string();
            let mut port = SWTPM_DEFAULT_PORT;
            for pair in conf.split(',').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("host", value)) if !value.is_empty() => host = value.to_string(),
                    Some(("port", value)) => {
                        port = value
                            .parse()
                            .map_err(|_| format!("port {value:?} is not a port number"))?;
                    }
                    _ => return Err(format!("unknown swtpm TCTI option {pair:?}")),
                }
            }
            Ok(Target::Swtpm { host, port })
        }
        _ => Err(format!(
            "unknown TCTI {name:?} (this issuer speaks `device:PATH` and `swtpm:host=H,port=P`)"
        )),
    }
}

/// An open transport. swtpm serves one TCP connection at a time, so (as libtss2's swtpm TCTI
/// does) each command connects, and the connection closes with its response: another client of
/// the same swtpm (a provider writing NV indices, a second issuer) gets its turn between two
/// commands.
#[derive(Debug)]
pub(super) enum Transport {
    Device(File),
    Swtpm { host: String, port: u16 },
}

impl Transport {
    pub(super) fn open(target: &Target) -> io::Result<Transport> {
        match target {
            Target::Device(path) => OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map(Transport::Device),
            Target::Swtpm { host, port } => {
                // Fails now, by name, if nothing listens; the commands connect again.
                drop(TcpStream::connect((host.as_str(), *port))?);
                Ok(Transport::Swtpm {
                    host: host.clone(),
                    port: *port,
                })
            }
        }
    }

    /// Sends one command and returns its whole response, framing checked (tag, size); the
    /// response code is left to the caller.
    pub(super) fn transact(&mut self, command: &[u8]) -> io::Result<Vec<u8>> {
        match self {
            Transport::Device(file) => {
                // A TPM character device takes a command in one write.
                let written = retry_interrupted(|| file.write(command))?;
                if written != command.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("wrote {written} of {} command bytes", command.len()),
                    ));
                }
                read_response(file)
            }
            Transport::Swtpm { host, port } => {
                let mut stream = TcpStream::connect((host.as_str(), *port))?;
                stream.set_nodelay(true)?;
                stream.write_all(command)?;
                stream.flush()?;
                read_response(&mut stream)
            }
        }
    }
}

fn retry_interrupted<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn malformed(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

/// Reads one response: until the header's size is there, however short each read is.
fn read_response(source: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    let mut expected: Option<usize> = None;
    loop {
        if let Some(size) = expected
            && len >= size
        {
            break;
        }
        if len == buf.len() {
            buf.resize((buf.len() * 2).min(MAX_RESPONSE), 0);
        }
        let n = retry_interrupted(|| source.read(&mut buf[len..]))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the TPM closed after {len} response bytes"),
            ));
        }
        len += n;
        if expected.is_none() && len >= HEADER {
            let tag = u16::from_be_bytes([buf[0], buf[1]]);
            if tag != TPM_ST_NO_SESSIONS && tag != TPM_ST_SESSIONS {
                return Err(malformed(format!("response tag {tag:#06x}")));
            }
            let size = u32::from_be_bytes([buf[2], buf[3], buf[4], buf[5]]) as usize;
            if !(HEADER..=MAX_RESPONSE).contains(&size) {
                return Err(malformed(format!("response size {size}")));
            }
            expected = Some(size);
        }
    }
    let size = expected.unwrap_or(len);
    if len != size {
        return Err(malformed(format!(
            "{len} response bytes for a declared size of {size}"
        )));
    }
    buf.truncate(size);
    Ok(buf)
}

/// A command being marshalled.
#[derive(Debug, Clone)]
pub(super) struct Command {
    code: u32,
    handles: Vec<u32>,
    /// How many password sessions authorise it (one per handle needing authorisation).
    sessions: usize,
    params: Vec<u8>,
    /// A TPM2B longer than 65535 bytes was given: the command cannot be marshalled.
    overflow: bool,
}

impl Command {
    pub(super) fn new(code: u32) -> Command {
        Command {
            code,
            handles: Vec::new(),
            sessions: 0,
            params: Vec::new(),
            overflow: false,
        }
    }

    /// A handle in the handle area.
    pub(super) fn handle(mut self, handle: u32) -> Self {
        self.handles.push(handle);
        self
    }

    /// A handle authorised with the empty password session.
    pub(super) fn authorised_handle(mut self, handle: u32) -> Self {
        self.handles.push(handle);
        self.sessions += 1;
        self
    }

    pub(super) fn u8(mut self, value: u8) -> Self {
        self.params.push(value);
        self
    }

    pub(super) fn u16(mut self, value: u16) -> Self {
        self.params.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub(super) fn u32(mut self, value: u32) -> Self {
        self.params.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub(super) fn bytes(mut self, value: &[u8]) -> Self {
        self.params.extend_from_slice(value);
        self
    }

    /// A `TPM2B_*`: u16 size, then the bytes.
    pub(super) fn tpm2b(mut self, value: &[u8]) -> Self {
        match u16::try_from(value.len()) {
            Ok(size) => {
                self.params.extend_from_slice(&size.to_be_bytes());
                self.params.extend_from_slice(value);
            }
            Err(_) => self.overflow = true,
        }
        self
    }

    /// A `TPML_PCR_SELECTION` of one bank with `pcrs` (0 to 23) selected.
    pub(super) fn pcr_selection(self, bank: HashingAlgorithm, pcrs: &[u8]) -> Self {
        let mut select = [0u8; 3];
        for &pcr in pcrs {
            if let Some(byte) = select.get_mut(usize::from(pcr / 8)) {
                *byte |= 1 << (pcr % 8);
            }
        }
        self.u32(1).u16(bank.id()).u8(3).bytes(&select)
    }

    /// The marshalled command.
    pub(super) fn marshal(&self) -> io::Result<Vec<u8>> {
        if self.overflow {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a sized buffer longer than 65535 bytes",
            ));
        }
        let mut out = Vec::with_capacity(HEADER + 4 * self.handles.len() + 13 + self.params.len());
        let tag = if self.sessions > 0 {
            TPM_ST_SESSIONS
        } else {
            TPM_ST_NO_SESSIONS
        };
        out.extend_from_slice(&tag.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.code.to_be_bytes());
        for handle in &self.handles {
            out.extend_from_slice(&handle.to_be_bytes());
        }
        if self.sessions > 0 {
            // TPMS_AUTH_COMMAND: TPM_RS_PW, empty nonce, no attributes, empty password.
            const PASSWORD_SESSION: [u8; 9] = {
                let h = TPM_RS_PW.to_be_bytes();
                [h[0], h[1], h[2], h[3], 0, 0, 0, 0, 0]
            };
            let size = (PASSWORD_SESSION.len() * self.sessions) as u32;
            out.extend_from_slice(&size.to_be_bytes());
            for _ in 0..self.sessions {
                out.extend_from_slice(&PASSWORD_SESSION);
            }
        }
        out.extend_from_slice(&self.params);
        if out.len() > MAX_COMMAND {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a command of {} bytes", out.len()),
            ));
        }
        let size = (out.len() as u32).to_be_bytes();
        out[2..6].copy_from_slice(&size);
        Ok(out)
    }

    pub(super) fn has_sessions(&self) -> bool {
        self.sessions > 0
    }

    pub(super) fn code(&self) -> u32 {
        self.code
    }
}

/// The response code of a framed response (checked by [`Transport::transact`]).
pub(super) fn response_code(response: &[u8]) -> u32 {
    response
        .get(6..HEADER)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(u32::MAX, u32::from_be_bytes)
}

/// A successful response split into its handles and its parameter area.
pub(super) struct Reply<'a> {
    pub handles: Vec<u32>,
    pub params: Reader<'a>,
}

/// Splits a successful response to a command with `handles` response handles, and
/// (`sessions`) an authorisation area after the parameters.
pub(super) fn split_reply(
    response: &[u8],
    handles: usize,
    sessions: bool,
) -> Result<Reply<'_>, ParseError> {
    let mut r = Reader::new(response, "response");
    let expected_tag = if sessions {
        TPM_ST_SESSIONS
    } else {
        TPM_ST_NO_SESSIONS
    };
    r.expect_u16(
        "tag",
        expected_tag,
        if sessions {
            "TPM_ST_SESSIONS"
        } else {
            "TPM_ST_NO_SESSIONS"
        },
    )?;
    r.u32("responseSize")?;
    r.u32("responseCode")?;
    let mut out = Vec::with_capacity(handles);
    for _ in 0..handles {
        out.push(r.u32("handle")?);
    }
    let params = if sessions {
        let size = r.u32("parameterSize")? as usize;
        // The password sessions' acknowledgements follow; nothing in them to check.
        Reader::new(r.bytes(size, "parameters")?, "response parameters")
    } else {
        Reader::new(r.bytes(r.remaining(), "parameters")?, "response parameters")
    };
    Ok(Reply {
        handles: out,
        params,
    })
}

#[cfg(test)]
mod tests;
