//! The TCG event log that UEFI firmware keeps (crypto-agile format), as Linux exposes it in
//! securityfs (`/sys/kernel/security/tpm0/binary_bios_measurements`).
//!
//! A TPM only stores running PCR values; the event log says which digests went into them and
//! why. Replaying it (`PCR = H(PCR || digest)` per event) must give the quoted values, and its
//! individual events are what lets a mismatch be traced to one input: which section, which
//! command line, which image. Firmware writes the log, the kernel passes it on unchanged; it is
//! evidence, not trusted: only its replay against a quote makes it meaningful.
//!
//! Format: TCG PC Client Platform Firmware Profile Specification (rev. 1.05), section 10
//! ("Event Logging"): a first `TCG_PCR_EVENT` in SHA-1 format whose data is the
//! `TCG_EfiSpecIDEvent` ("Spec ID Event03") listing the digest algorithms and sizes, then
//! `TCG_PCR_EVENT2` records: `PCRIndex u32`, `EventType u32`, `TPML_DIGEST_VALUES` (count u32,
//! then per digest `AlgorithmId u16` and the digest), `EventSize u32`, event data. Integers are
//! little-endian.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::predict::event_type::*;
use hawser_pcr::{EVENT_LOG_MARKER, extend_sha256};

/// TPM_ALG_SHA256.
pub const TPM_ALG_SHA256: u16 = 0x000b;
/// TPM_ALG_SHA1.
pub const TPM_ALG_SHA1: u16 = 0x0004;

/// Why an event log cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventLogError {
    /// The log is empty.
    #[error("the event log is empty")]
    Empty,
    /// The log ends inside a record.
    #[error(
        "the event log is truncated: event {index} needs bytes {offset:#x}..{end:#x} ({what}) but the log has {len:#x} bytes"
    )]
    Truncated {
        index: usize,
        what: &'static str,
        offset: usize,
        end: usize,
        len: usize,
    },
    /// The first event is not a crypto-agile log header.
    #[error(
        "the event log is not in the crypto-agile (TPM 2.0) format: its first event is not a \"Spec ID Event03\" header ({reason})"
    )]
    NotCryptoAgile { reason: String },
    /// An event uses a digest algorithm the header did not declare.
    #[error(
        "event {index} at offset {offset:#x} has a digest of algorithm {algorithm:#06x}, which the log header does not declare"
    )]
    UnknownAlgorithm {
        index: usize,
        offset: usize,
        algorithm: u16,
    },
    /// The log has no sha256 bank.
    #[error("the event log has no sha256 digests (its algorithms: {algorithms})")]
    NoSha256 { algorithms: String },
    /// An event lacks its sha256 digest.
    #[error("event {index} (PCR {pcr}, {kind}) has no sha256 digest")]
    MissingSha256 {
        index: usize,
        pcr: u32,
        kind: String,
    },
}

/// The log header (`TCG_EfiSpecIDEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecId {
    pub platform_class: u32,
    pub spec_version: (u8, u8, u8),
    pub uintn_size: u8,
    /// (TPM algorithm ID, digest size), as declared.
    pub algorithms: Vec<(u16, u16)>,
}

/// One event record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Position in the log (0 = the header event).
    pub index: usize,
    /// Byte offset of the record in the log.
    pub offset: usize,
    pub pcr: u32,
    pub event_type: u32,
    /// (algorithm, digest) pairs.
    pub digests: Vec<(u16, Vec<u8>)>,
    pub data: Vec<u8>,
}

/// A parsed event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLog {
    pub spec: SpecId,
    /// Every event after the header, in log order.
    pub events: Vec<Event>,
}

struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
    index: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], EventLogError> {
        let end = self.at.checked_add(n);
        let slice =
            end.and_then(|end| self.data.get(self.at..end))
                .ok_or(EventLogError::Truncated {
                    index: self.index,
                    what,
                    offset: self.at,
                    end: end.unwrap_or(usize::MAX),
                    len: self.data.len(),
                })?;
        self.at += n;
        Ok(slice)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, EventLogError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, EventLogError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, EventLogError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl EventLog {
    /// Parses a crypto-agile event log. Trailing zero bytes (firmware logs are often padded to
    /// their allocated size) end the log.
    pub fn parse(bytes: &[u8]) -> Result<EventLog, EventLogError> {
        if bytes.is_empty() {
            return Err(EventLogError::Empty);
        }
        let mut c = Cursor {
            data: bytes,
            at: 0,
            index: 0,
        };
        // TCG_PCR_EVENT (SHA-1 format) carrying TCG_EfiSpecIDEvent.
        let _pcr = c.u32("header PCR index")?;
        let header_type = c.u32("header event type")?;
        c.take(20, "header SHA-1 digest")?;
        let size = c.u32("header event size")? as usize;
        let spec_data = c.take(size, "header event data")?;
        if header_type != EV_NO_ACTION || !spec_data.starts_with(b"Spec ID Event03\0") {
            return Err(EventLogError::NotCryptoAgile {
                reason: format!(
                    "type {header_type:#x}, data starting {:?}",
                    String::from_utf8_lossy(&spec_data[..spec_data.len().min(16)])
                ),
            });
        }
        let spec = parse_spec_id(spec_data)?;
        let sizes: BTreeMap<u16, usize> = spec
            .algorithms
            .iter()
            .map(|&(alg, size)| (alg, usize::from(size)))
            .collect();

        let mut events = Vec::new();
        loop {
            if bytes[c.at..].iter().all(|&b| b == 0) {
                break;
            }
            c.index += 1;
            let offset = c.at;
            let pcr = c.u32("PCR index")?;
            let event_type = c.u32("event type")?;
            let count = c.u32("digest count")?;
            let mut digests = Vec::new();
            for _ in 0..count {
                let algorithm = c.u16("digest algorithm")?;
                let size = *sizes
                    .get(&algorithm)
                    .ok_or(EventLogError::UnknownAlgorithm {
                        index: c.index,
                        offset,
                        algorithm,
                    })?;
                digests.push((algorithm, c.take(size, "digest")?.to_vec()));
            }
            let size = c.u32("event size")? as usize;
            let data = c.take(size, "event data")?.to_vec();
            events.push(Event {
                index: c.index,
                offset,
                pcr,
                event_type,
                digests,
                data,
            });
        }
        if !sizes.contains_key(&TPM_ALG_SHA256) {
            return Err(EventLogError::NoSha256 {
                algorithms: spec
                    .algorithms
                    .iter()
                    .map(|(a, _)| format!("{a:#06x}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(EventLog { spec, events })
    }

    /// Replays the sha256 bank: the value of every PCR the log touches (PCR 0 starts from the
    /// locality in a "StartupLocality" event, if there is one). EV_NO_ACTION events are not
    /// extended, as the specification says.
    pub fn replay_sha256(&self) -> Result<BTreeMap<u32, [u8; 32]>, EventLogError> {
        let mut pcrs: BTreeMap<u32, [u8; 32]> = BTreeMap::new();
        for e in &self.events {
            if e.event_type == EV_NO_ACTION {
                if let Some(rest) = e.data.strip_prefix(b"StartupLocality\0")
                    && let Some(&locality) = rest.first()
                {
                    let mut initial = [0u8; 32];
                    initial[31] = locality;
                    pcrs.insert(e.pcr, initial);
                }
                continue;
            }
            let digest = e.sha256().ok_or_else(|| EventLogError::MissingSha256 {
                index: e.index,
                pcr: e.pcr,
                kind: e.type_name().to_owned(),
            })?;
            let value = pcrs.entry(e.pcr).or_insert([0u8; 32]);
            *value = extend_sha256(value, &digest);
        }
        Ok(pcrs)
    }

    /// The events extended into `pcr` (EV_NO_ACTION excluded), in order.
    pub fn events_for(&self, pcr: u32) -> impl Iterator<Item = &Event> {
        self.events
            .iter()
            .filter(move |e| e.pcr == pcr && e.event_type != EV_NO_ACTION)
    }
}

fn parse_spec_id(data: &[u8]) -> Result<SpecId, EventLogError> {
    let mut c = Cursor {
        data,
        at: 16,
        index: 0,
    };
    let platform_class = c.u32("Spec ID platform class")?;
    let minor = c.u8("Spec ID version")?;
    let major = c.u8("Spec ID version")?;
    let errata = c.u8("Spec ID errata")?;
    let uintn_size = c.u8("Spec ID uintnSize")?;
    let count = c.u32("Spec ID algorithm count")?;
    if count == 0 || count > 16 {
        return Err(EventLogError::NotCryptoAgile {
            reason: format!("its header declares {count} digest algorithms"),
        });
    }
    let mut algorithms = Vec::new();
    for _ in 0..count {
        let alg = c.u16("Spec ID algorithm")?;
        let size = c.u16("Spec ID digest size")?;
        algorithms.push((alg, size));
    }
    Ok(SpecId {
        platform_class,
        spec_version: (major, minor, errata),
        uintn_size,
        algorithms,
    })
}

impl Event {
    /// The sha256 digest, if the event has one.
    pub fn sha256(&self) -> Option<[u8; 32]> {
        self.digests
            .iter()
            .find(|(alg, _)| *alg == TPM_ALG_SHA256)
            .and_then(|(_, d)| d.as_slice().try_into().ok())
    }

    /// The TCG name of the event type.
    pub fn type_name(&self) -> &'static str {
        match self.event_type {
            0x0 => "EV_PREBOOT_CERT",
            0x1 => "EV_POST_CODE",
            0x3 => "EV_NO_ACTION",
            0x4 => "EV_SEPARATOR",
            0x5 => "EV_ACTION",
            0x6 => "EV_EVENT_TAG",
            0x7 => "EV_S_CRTM_CONTENTS",
            0x8 => "EV_S_CRTM_VERSION",
            0x9 => "EV_CPU_MICROCODE",
            0xa => "EV_PLATFORM_CONFIG_FLAGS",
            0xb => "EV_TABLE_OF_DEVICES",
            0xc => "EV_COMPACT_HASH",
            0xd => "EV_IPL",
            0xe => "EV_IPL_PARTITION_DATA",
            0xf => "EV_NONHOST_CODE",
            0x10 => "EV_NONHOST_CONFIG",
            0x11 => "EV_NONHOST_INFO",
            0x12 => "EV_OMIT_BOOT_DEVICE_EVENTS",
            0x8000_0001 => "EV_EFI_VARIABLE_DRIVER_CONFIG",
            0x8000_0002 => "EV_EFI_VARIABLE_BOOT",
            0x8000_0003 => "EV_EFI_BOOT_SERVICES_APPLICATION",
            0x8000_0004 => "EV_EFI_BOOT_SERVICES_DRIVER",
            0x8000_0005 => "EV_EFI_RUNTIME_SERVICES_DRIVER",
            0x8000_0006 => "EV_EFI_GPT_EVENT",
            0x8000_0007 => "EV_EFI_ACTION",
            0x8000_0008 => "EV_EFI_PLATFORM_FIRMWARE_BLOB",
            0x8000_0009 => "EV_EFI_HANDOFF_TABLES",
            0x8000_000a => "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
            0x8000_000b => "EV_EFI_HANDOFF_TABLES2",
            0x8000_000c => "EV_EFI_VARIABLE_BOOT2",
            0x8000_0010 => "EV_EFI_HCRTM_EVENT",
            0x8000_00e0 => "EV_EFI_VARIABLE_AUTHORITY",
            0x8000_00e1 => "EV_EFI_SPDM_FIRMWARE_BLOB",
            0x8000_00e2 => "EV_EFI_SPDM_FIRMWARE_CONFIG",
            _ => "unknown event type",
        }
    }

    /// A short description of the event data, for people.
    pub fn describe(&self) -> String {
        let d = &self.data;
        match self.event_type {
            EV_SEPARATOR => {
                if d.as_slice() == [0, 0, 0, 0] {
                    "separator".to_owned()
                } else {
                    format!("separator {}", hex::encode(d))
                }
            }
            EV_EVENT_TAG => match tagged_event(d) {
                Some((id, text)) => format!("tag {id:#010x} {text:?}"),
                None => format!("{} bytes", d.len()),
            },
            EV_EFI_BOOT_SERVICES_APPLICATION | 0x8000_0004 | 0x8000_0005 => {
                match image_load_event(d) {
                    Some((length, path)) => format!("image of {length} bytes, {path}"),
                    None => format!("{} bytes", d.len()),
                }
            }
            0x8000_0001 | 0x8000_0002 | 0x8000_000c | 0x8000_00e0 => match variable_event(d) {
                Some((guid, name, len)) => format!("variable {name} ({guid}), {len} bytes"),
                None => format!("{} bytes", d.len()),
            },
            0x8000_0006 => "GPT partition table".to_owned(),
            _ => text(d).unwrap_or_else(|| format!("{} bytes", d.len())),
        }
    }

    /// Identifies the event for lining it up with a prediction (see
    /// [`crate::predict::PredictedEvent::key`]); `nth` counts earlier events of the same kind
    /// in the same PCR, from 1.
    pub fn key(&self, nth: usize) -> String {
        match self.event_type {
            EV_EFI_ACTION => format!("action:{}", text(&self.data).unwrap_or_default()),
            EV_SEPARATOR => "separator".to_owned(),
            EV_EFI_BOOT_SERVICES_APPLICATION => format!("app#{nth}"),
            EV_EVENT_TAG => match tagged_event(&self.data) {
                Some((id, _)) => format!("tag:{id:#010x}"),
                None => format!("tag:?#{nth}"),
            },
            EV_IPL => format!("ipl:{}#{nth}", text(&self.data).unwrap_or_default()),
            other => format!("{other:#x}#{nth}"),
        }
    }

    /// What [`Event::key`] counts occurrences of: the key without its `#n`.
    pub fn key_class(&self) -> String {
        let key = self.key(0);
        match key.rsplit_once('#') {
            Some((class, "0")) => class.to_owned(),
            _ => key,
        }
    }
}

/// Event data as text: UTF-16LE if it looks like it (systemd-stub's EV_IPL descriptions),
/// else ASCII; trailing NULs removed. `None` for binary data.
fn text(d: &[u8]) -> Option<String> {
    let looks_utf16 =
        d.len() >= 2 && d.len().is_multiple_of(2) && d.iter().skip(1).step_by(2).all(|&b| b == 0);
    let s = if looks_utf16 {
        let units: Vec<u16> = d
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        String::from_utf16(&units).ok()?
    } else {
        String::from_utf8(d.to_vec()).ok()?
    };
    let s = s.trim_end_matches('\0');
    (!s.is_empty() && s.chars().all(|c| !c.is_control() || c == '\n')).then(|| s.to_owned())
}

/// TCG_PCClientTaggedEvent: (id, data as text).
fn tagged_event(d: &[u8]) -> Option<(u32, String)> {
    let id = u32::from_le_bytes(d.get(0..4)?.try_into().ok()?);
    let len = u32::from_le_bytes(d.get(4..8)?.try_into().ok()?) as usize;
    let data = d.get(8..8usize.checked_add(len)?)?;
    Some((id, text(data).unwrap_or_else(|| format!("{len} bytes"))))
}

/// UEFI_IMAGE_LOAD_EVENT: (image length, device path).
fn image_load_event(d: &[u8]) -> Option<(u64, String)> {
    let length = u64::from_le_bytes(d.get(8..16)?.try_into().ok()?);
    let path_len = usize::try_from(u64::from_le_bytes(d.get(24..32)?.try_into().ok()?)).ok()?;
    let path = d.get(32..32usize.checked_add(path_len)?)?;
    Some((length, device_path(path)))
}

/// UEFI_VARIABLE_DATA: (GUID, name, data length).
fn variable_event(d: &[u8]) -> Option<(String, String, u64)> {
    let guid = guid(d.get(0..16)?)?;
    let name_len = usize::try_from(u64::from_le_bytes(d.get(16..24)?.try_into().ok()?)).ok()?;
    let data_len = u64::from_le_bytes(d.get(24..32)?.try_into().ok()?);
    let name = d.get(32..32usize.checked_add(name_len.checked_mul(2)?)?)?;
    let units: Vec<u16> = name
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Some((guid, String::from_utf16_lossy(&units), data_len))
}

fn guid(b: &[u8]) -> Option<String> {
    let b: &[u8; 16] = b.try_into().ok()?;
    Some(format!(
        "{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{}",
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        u16::from_le_bytes([b[4], b[5]]),
        u16::from_le_bytes([b[6], b[7]]),
        b[8],
        b[9],
        hex::encode(&b[10..16])
    ))
}

/// A UEFI device path, rendered briefly: file paths, vendor GUIDs, hard-drive partitions.
fn device_path(mut p: &[u8]) -> String {
    let mut out = String::new();
    while p.len() >= 4 {
        let (kind, sub) = (p[0], p[1]);
        let len = usize::from(u16::from_le_bytes([p[2], p[3]]));
        if kind == 0x7f || len < 4 || len > p.len() {
            break;
        }
        let body = &p[4..len];
        if !out.is_empty() {
            out.push('/');
        }
        match (kind, sub) {
            (4, 4) => {
                let units: Vec<u16> = body
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                out.push_str(String::from_utf16_lossy(&units).trim_end_matches('\0'));
            }
            (4, 3) | (1, 4) => {
                let _ = write!(
                    out,
                    "Vendor({})",
                    guid(body.get(..16).unwrap_or_default()).unwrap_or_default()
                );
            }
            (4, 1) => {
                let part = body
                    .get(..4)
                    .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                let _ = write!(out, "HD({part})");
            }
            (2, 1) => out.push_str("PciRoot"),
            (1, 1) => {
                let _ = write!(
                    out,
                    "Pci({:x},{:x})",
                    body.get(1).copied().unwrap_or(0),
                    body.first().copied().unwrap_or(0)
                );
            }
            _ => {
                let _ = write!(out, "({kind},{sub})");
            }
        }
        p = &p[len..];
    }
    if out.is_empty() {
        "(no device path)".to_owned()
    } else {
        out
    }
}

/// Why the event-log line found on a console cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {EVENT_LOG_MARKER}line is not valid base64")]
pub struct ConsoleLogError(#[source] pub base64::DecodeError);

/// Finds `HAWSER_EVENT_LOG <base64>` in console output and decodes it. `None` if there is no
/// such line; an error if the base64 is damaged.
pub fn find_in_console(console: &str) -> Option<Result<Vec<u8>, ConsoleLogError>> {
    use base64::Engine as _;
    let line = console
        .lines()
        .filter_map(|l| {
            l.find(EVENT_LOG_MARKER)
                .map(|at| &l[at + EVENT_LOG_MARKER.len()..])
        })
        .next_back()?;
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(line.trim())
            .map_err(ConsoleLogError),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a crypto-agile log with sha1 + sha256 banks from (pcr, type, sha256, data).
    pub(crate) fn synthetic_log(events: &[(u32, u32, [u8; 32], &[u8])]) -> Vec<u8> {
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&0u32.to_le_bytes());
        spec.extend_from_slice(&[0, 2, 0, 2]);
        spec.extend_from_slice(&2u32.to_le_bytes());
        spec.extend_from_slice(&TPM_ALG_SHA1.to_le_bytes());
        spec.extend_from_slice(&20u16.to_le_bytes());
        spec.extend_from_slice(&TPM_ALG_SHA256.to_le_bytes());
        spec.extend_from_slice(&32u16.to_le_bytes());
        spec.push(0);
        let mut log = Vec::new();
        log.extend_from_slice(&0u32.to_le_bytes());
        log.extend_from_slice(&EV_NO_ACTION.to_le_bytes());
        log.extend_from_slice(&[0; 20]);
        log.extend_from_slice(&(spec.len() as u32).to_le_bytes());
        log.extend_from_slice(&spec);
        for (pcr, kind, digest, data) in events {
            log.extend_from_slice(&pcr.to_le_bytes());
            log.extend_from_slice(&kind.to_le_bytes());
            log.extend_from_slice(&2u32.to_le_bytes());
            log.extend_from_slice(&TPM_ALG_SHA1.to_le_bytes());
            log.extend_from_slice(&[0xaa; 20]);
            log.extend_from_slice(&TPM_ALG_SHA256.to_le_bytes());
            log.extend_from_slice(digest);
            log.extend_from_slice(&(data.len() as u32).to_le_bytes());
            log.extend_from_slice(data);
        }
        log
    }

    #[test]
    fn parses_and_replays_a_synthetic_log() {
        let d1 = [1u8; 32];
        let d2 = [2u8; 32];
        let mut locality = b"StartupLocality\0".to_vec();
        locality.push(3);
        let log = synthetic_log(&[
            (0, EV_NO_ACTION, [0; 32], &locality),
            (0, 0x8, d1, b"version"),
            (4, EV_SEPARATOR, d2, &[0, 0, 0, 0]),
            (4, EV_NO_ACTION, [9; 32], b"ignored"),
        ]);
        let parsed = EventLog::parse(&log).expect("parse");
        assert_eq!(parsed.spec.algorithms, [(4, 20), (0xb, 32)]);
        assert_eq!(parsed.events.len(), 4);
        let pcrs = parsed.replay_sha256().expect("replay");
        let mut start = [0u8; 32];
        start[31] = 3;
        assert_eq!(pcrs[&0], extend_sha256(&start, &d1));
        assert_eq!(pcrs[&4], extend_sha256(&[0; 32], &d2));
        assert_eq!(parsed.events_for(4).count(), 1);
        assert_eq!(parsed.events[2].describe(), "separator");
        assert_eq!(parsed.events[1].describe(), "version");

        // Trailing zeros end the log.
        let mut padded = log.clone();
        padded.extend_from_slice(&[0; 64]);
        assert_eq!(EventLog::parse(&padded).expect("parse").events.len(), 4);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let log = synthetic_log(&[(4, EV_SEPARATOR, [2; 32], &[0, 0, 0, 1])]);
        for len in 0..log.len() {
            let result = EventLog::parse(&log[..len]);
            // Cutting exactly after the header leaves a valid, empty log.
            if len == log.len() - (4 + 4 + 4 + 22 + 34 + 4 + 4) {
                assert!(result.is_ok(), "header-only log at {len}");
            } else {
                assert!(result.is_err(), "a {len}-byte prefix parsed");
            }
        }
        let err = EventLog::parse(&log[..log.len() - 2]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the event log is truncated: event 1 needs bytes"),
            "{err}"
        );
    }

    #[test]
    fn refuses_sha1_only_logs_and_undeclared_algorithms() {
        let mut old = vec![0u8; 32];
        old[4] = 8; // EV_S_CRTM_VERSION, not a Spec ID header
        let err = EventLog::parse(&old).unwrap_err();
        assert!(err.to_string().contains("crypto-agile"), "{err}");
        let mut log = synthetic_log(&[(4, EV_SEPARATOR, [2; 32], &[0, 0, 0, 0])]);
        // Corrupt the second event's first algorithm ID (sha1 → 0x0099).
        let header_len = 32 + u32::from_le_bytes(log[28..32].try_into().expect("4")) as usize;
        log[header_len + 12] = 0x99;
        let err = EventLog::parse(&log).unwrap_err();
        assert!(err.to_string().contains("0x0099"), "{err}");
    }

    #[test]
    fn console_line_is_found_and_decoded() {
        let console = "noise\r\n[  1.0] hawser: HAWSER_EVENT_LOG AAECAw==\nmore\n";
        assert_eq!(
            find_in_console(console).expect("present").expect("valid"),
            [0, 1, 2, 3]
        );
        assert!(find_in_console("nothing here").is_none());
        assert!(
            find_in_console("HAWSER_EVENT_LOG !!!")
                .expect("present")
                .is_err()
        );
    }

    #[test]
    fn descriptions_of_stub_and_kernel_events() {
        let ipl: Vec<u8> = ".linux\0"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        let mut tag = LINUX_TAG.to_le_bytes().to_vec();
        tag.extend_from_slice(&13u32.to_le_bytes());
        tag.extend_from_slice(b"Linux initrd\0");
        let log = synthetic_log(&[
            (11, EV_IPL, [1; 32], &ipl),
            (9, EV_EVENT_TAG, [2; 32], &tag),
        ]);
        let parsed = EventLog::parse(&log).expect("parse");
        assert_eq!(parsed.events[0].describe(), ".linux");
        assert_eq!(parsed.events[0].key(1), "ipl:.linux#1");
        assert_eq!(parsed.events[0].key_class(), "ipl:.linux");
        assert_eq!(
            parsed.events[1].describe(),
            "tag 0x8f3b22ec \"Linux initrd\""
        );
        assert_eq!(parsed.events[1].key(1), "tag:0x8f3b22ec");
    }

    const LINUX_TAG: u32 = 0x8F3B_22EC;
}
