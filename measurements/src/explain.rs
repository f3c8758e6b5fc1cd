//! Event-log diagnosis: lines up a real boot's TCG event log with the prediction for a UKI and
//! says which event differs and which input it covers.
//!
//! A PCR mismatch alone says nothing about its cause; the event log does. For each predicted
//! PCR (4, 9, 11, 12, 13) every predicted event is looked up in the log by what it is (the
//! OVMF action string, the n-th boot application, the Linux stub's event tag, the n-th
//! systemd-stub event with a section's name) and its digest compared; log events nothing
//! predicts are reported too (an extra boot application, a command-line override in PCR 12).
//! If the boot's quoted PCR values are given, the log's replay is checked against them first:
//! a log that does not replay to the quote explains nothing.

use std::collections::BTreeMap;
use std::fmt;

use crate::eventlog::{Event, EventLog, EventLogError};
use crate::predict::{Phase, PredictedEvent, Prediction};
use hawser_pcr::{extend_sha256, phase_digest};

/// The PCRs whose events are in the firmware's log and predicted.
pub const EXPLAINED_PCRS: [u8; 5] = [4, 9, 11, 12, 13];

/// How one predicted or logged event compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventMatch {
    /// The log has the predicted event with the predicted digest.
    Same {
        predicted: PredictedEvent,
        logged: Event,
    },
    /// The log has the event, with another digest.
    Differs {
        predicted: PredictedEvent,
        logged: Event,
    },
    /// The log lacks a predicted event.
    Missing { predicted: PredictedEvent },
    /// The log has an event nothing predicts.
    Unexpected { logged: Event },
}

impl EventMatch {
    /// Whether this entry is a discrepancy.
    pub fn is_problem(&self) -> bool {
        !matches!(self, EventMatch::Same { .. })
    }
}

/// The comparison for one PCR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrDiagnosis {
    pub pcr: u8,
    /// Predicted value after the firmware-logged events (PCR 11: after systemd-stub).
    pub predicted: [u8; 32],
    /// The log's replay.
    pub replayed: [u8; 32],
    /// The quoted value, if given (PCR 11: after hawser's phase extensions).
    pub quoted: Option<[u8; 32]>,
    /// What the quote should be given the replay (PCR 11: replay + the phases extended).
    pub quote_expected_from_log: [u8; 32],
    /// Events in log order; missing predicted events where they would have been.
    pub events: Vec<EventMatch>,
    /// Whether the matched events are in the predicted order.
    pub in_order: bool,
}

impl PcrDiagnosis {
    /// Prediction, log and (if given) quote agree.
    pub fn ok(&self) -> bool {
        self.predicted == self.replayed
            && self
                .quoted
                .is_none_or(|q| q == self.quote_expected_from_log)
    }

    /// The log does not replay to the quoted value.
    pub fn log_inconsistent_with_quote(&self) -> bool {
        self.quoted
            .is_some_and(|q| q != self.quote_expected_from_log)
    }
}

/// The firmware PCRs (0–3, 5–7): not predicted, but the log is checked against the quote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirmwarePcr {
    pub pcr: u8,
    pub replayed: [u8; 32],
    pub quoted: Option<[u8; 32]>,
}

/// The whole diagnosis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub pcrs: Vec<PcrDiagnosis>,
    pub firmware: Vec<FirmwarePcr>,
    /// hawser's phase words assumed extended into PCR 11 after the log (from the boot report).
    pub phases: Vec<String>,
}

impl Diagnosis {
    /// Every predicted PCR agrees with the log (and the quote, if given), and the firmware
    /// PCRs' logs replay to their quoted values.
    pub fn ok(&self) -> bool {
        self.pcrs.iter().all(PcrDiagnosis::ok)
            && self
                .firmware
                .iter()
                .all(|f| f.quoted.is_none_or(|q| q == f.replayed))
    }

    /// The diagnosis of one PCR.
    pub fn pcr(&self, pcr: u8) -> Option<&PcrDiagnosis> {
        self.pcrs.iter().find(|p| p.pcr == pcr)
    }
}

/// Compares `log` (and optionally the quoted PCR values of the same boot, with the phase
/// words hawser extended into PCR 11 after the firmware log ended) with `prediction`.
pub fn explain(
    prediction: &Prediction,
    log: &EventLog,
    quoted: Option<&BTreeMap<u8, [u8; 32]>>,
    phases: &[String],
) -> Result<Diagnosis, EventLogError> {
    let replay = log.replay_sha256()?;
    let mut pcrs = Vec::new();
    for pcr in EXPLAINED_PCRS {
        let predicted_events: Vec<&PredictedEvent> = prediction
            .events
            .iter()
            .filter(|e| e.pcr == pcr && e.phase.is_none())
            .collect();
        let logged: Vec<&Event> = log.events_for(u32::from(pcr)).collect();
        let (events, in_order) = line_up(&predicted_events, &logged);
        let replayed = replay.get(&u32::from(pcr)).copied().unwrap_or([0; 32]);
        let quote_expected_from_log = if pcr == 11 {
            phases
                .iter()
                .fold(replayed, |v, w| extend_sha256(&v, &phase_digest(w)))
        } else {
            replayed
        };
        pcrs.push(PcrDiagnosis {
            pcr,
            predicted: prediction.pcr(pcr, Phase::Stub),
            replayed,
            quoted: quoted.and_then(|q| q.get(&pcr).copied()),
            quote_expected_from_log,
            events,
            in_order,
        });
    }
    let firmware = [0u8, 1, 2, 3, 5, 6, 7]
        .into_iter()
        .map(|pcr| FirmwarePcr {
            pcr,
            replayed: replay.get(&u32::from(pcr)).copied().unwrap_or([0; 32]),
            quoted: quoted.and_then(|q| q.get(&pcr).copied()),
        })
        .collect();
    Ok(Diagnosis {
        pcrs,
        firmware,
        phases: phases.to_vec(),
    })
}

/// Pairs predicted and logged events by key; returns them in log order (missing ones at the
/// position of the predicted order) and whether the matched ones are in predicted order.
fn line_up(predicted: &[&PredictedEvent], logged: &[&Event]) -> (Vec<EventMatch>, bool) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let keys: Vec<String> = logged
        .iter()
        .map(|e| {
            let n = counts.entry(e.key_class()).or_insert(0);
            *n += 1;
            e.key(*n)
        })
        .collect();
    let mut used = vec![false; logged.len()];
    // For each predicted event, the index of its logged event.
    let mut pairs: Vec<Option<usize>> = Vec::new();
    for p in predicted {
        let found = keys
            .iter()
            .enumerate()
            .position(|(i, k)| !used[i] && *k == p.key);
        if let Some(i) = found {
            used[i] = true;
        }
        pairs.push(found);
    }
    let matched: Vec<usize> = pairs.iter().flatten().copied().collect();
    let in_order = matched.windows(2).all(|w| w[0] < w[1]);

    let mut out = Vec::new();
    let mut next_predicted = 0;
    for (i, e) in logged.iter().enumerate() {
        // Emit predicted events that are missing and come before this log event's partner.
        if let Some(p) = pairs.iter().position(|&x| x == Some(i)) {
            while next_predicted < p {
                if pairs[next_predicted].is_none() {
                    out.push(EventMatch::Missing {
                        predicted: predicted[next_predicted].clone(),
                    });
                }
                next_predicted += 1;
            }
            next_predicted = next_predicted.max(p + 1);
            let (predicted, logged) = (predicted[p].clone(), (*e).clone());
            out.push(if Some(predicted.digest) == logged.sha256() {
                EventMatch::Same { predicted, logged }
            } else {
                EventMatch::Differs { predicted, logged }
            });
        } else {
            out.push(EventMatch::Unexpected {
                logged: (*e).clone(),
            });
        }
    }
    for (p, pair) in pairs.iter().enumerate().skip(next_predicted) {
        if pair.is_none() {
            out.push(EventMatch::Missing {
                predicted: predicted[p].clone(),
            });
        }
    }
    (out, in_order)
}

/// Why an event might differ or be missing or extra, by what it is (its key, see
/// [`crate::eventlog::Event::key`]).
fn hint(pcr: u8, key: &str) -> String {
    let section = key.strip_prefix("ipl:").and_then(|k| k.rsplit_once('#'));
    match (pcr, key) {
        (4, "app#1") => "the firmware loaded a different UKI file than this one (compare the image length above with this UKI's size, and the sha256 of the file on the ESP)".into(),
        (4, "app#2") => "the kernel systemd-stub loaded is not this UKI's .linux".into(),
        (4, k) if k.starts_with("app#") => "the firmware ran another EFI application on this boot path (a boot manager, a shell, a failed boot option): PCR 4 covers every image started".into(),
        (4, _) => "the firmware's boot path differs from OVMF's removable-media boot".into(),
        (9, k) if k.ends_with("22ed") => "the kernel received another command line: this UKI's .cmdline differs, or a boot manager passed LoadOptions that replaced it (then PCR 12 is non-zero too)".into(),
        (9, k) if k.ends_with("22ec") => "the kernel loaded another initrd: .initrd or .osrel differ, or systemd-stub appended credentials, sysexts or addons found on the ESP (then PCR 12 or 13 is non-zero too)".into(),
        (11, _) => match section {
            Some((name, "1")) => format!("the booted UKI and this one differ in whether they have a {name} section"),
            Some((name, _)) => format!("the booted UKI's {name} section differs from this one's"),
            None => "systemd-stub measured something unexpected: the UKI booted is not this one".into(),
        },
        (12, _) => "systemd-stub measured a command-line override, credentials, a confext or an addon: something outside the UKI changed the boot".into(),
        (13, _) => "systemd-stub measured a system extension (<UKI>.extra.d/*.raw on the ESP)".into(),
        _ => String::new(),
    }
}

fn short(d: &[u8; 32]) -> String {
    hex::encode(&d[..8])
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.pcrs {
            let verdict = if p.log_inconsistent_with_quote() {
                "LOG DOES NOT MATCH QUOTE"
            } else if p.ok() {
                "ok"
            } else {
                "MISMATCH"
            };
            writeln!(f, "PCR {:>2}  {verdict}", p.pcr)?;
            writeln!(f, "        predicted        {}", hex::encode(p.predicted))?;
            writeln!(f, "        event log replay {}", hex::encode(p.replayed))?;
            if let Some(q) = p.quoted {
                if p.pcr == 11 && !self.phases.is_empty() {
                    writeln!(
                        f,
                        "        quoted           {} (after {})",
                        hex::encode(q),
                        self.phases.join(", ")
                    )?;
                } else {
                    writeln!(f, "        quoted           {}", hex::encode(q))?;
                }
                if p.log_inconsistent_with_quote() {
                    writeln!(
                        f,
                        "        the log replays to {} but the TPM quoted {}: the log is incomplete or from another boot; its events below prove nothing",
                        short(&p.quote_expected_from_log),
                        short(&q)
                    )?;
                }
            }
            if p.events.is_empty() {
                writeln!(f, "        (no events; none predicted)")?;
            }
            for e in &p.events {
                match e {
                    EventMatch::Same { predicted, logged } => writeln!(
                        f,
                        "   ok   #{:<3} {} {}",
                        logged.index,
                        short(&predicted.digest),
                        predicted.description
                    )?,
                    EventMatch::Differs { predicted, logged } => {
                        writeln!(
                            f,
                            "   DIFF #{:<3} {}: {}",
                            logged.index,
                            predicted.description,
                            logged.describe()
                        )?;
                        writeln!(
                            f,
                            "             predicted {} = {}",
                            hex::encode(predicted.digest),
                            predicted.covers
                        )?;
                        writeln!(
                            f,
                            "             logged    {}",
                            logged
                                .sha256()
                                .map_or("(no sha256)".to_owned(), hex::encode)
                        )?;
                        let h = hint(p.pcr, &predicted.key);
                        if !h.is_empty() {
                            writeln!(f, "             → {h}")?;
                        }
                    }
                    EventMatch::Missing { predicted } => {
                        writeln!(
                            f,
                            "   MISSING    {} ({}), predicted {}",
                            predicted.description,
                            predicted.covers,
                            short(&predicted.digest)
                        )?;
                        let h = hint(p.pcr, &predicted.key);
                        if !h.is_empty() {
                            writeln!(f, "             → {h}")?;
                        }
                    }
                    EventMatch::Unexpected { logged } => {
                        writeln!(
                            f,
                            "   EXTRA #{:<3} {} {}: {} (not predicted)",
                            logged.index,
                            logged
                                .sha256()
                                .map_or("(no sha256)".to_owned(), |d| short(&d)),
                            logged.type_name(),
                            logged.describe()
                        )?;
                        let h = hint(p.pcr, &logged.key(0));
                        if !h.is_empty() {
                            writeln!(f, "             → {h}")?;
                        }
                    }
                }
            }
            if !p.in_order {
                writeln!(
                    f,
                    "        the events are in another order than predicted (the order is part of the PCR value)"
                )?;
            }
        }
        for fw in &self.firmware {
            match fw.quoted {
                Some(q) if q != fw.replayed => writeln!(
                    f,
                    "PCR {:>2}  firmware, not predicted: LOG DOES NOT MATCH QUOTE (log {}, quoted {})",
                    fw.pcr,
                    short(&fw.replayed),
                    short(&q)
                )?,
                Some(_) => writeln!(
                    f,
                    "PCR {:>2}  firmware, not predicted: log replays to the quoted {}",
                    fw.pcr,
                    short(&fw.replayed)
                )?,
                None => writeln!(
                    f,
                    "PCR {:>2}  firmware, not predicted: log replays to {}",
                    fw.pcr,
                    short(&fw.replayed)
                )?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eventlog::tests::synthetic_log;
    use crate::predict::event_type::*;

    fn event(pcr: u8, key: &str, digest: u8) -> PredictedEvent {
        PredictedEvent {
            pcr,
            event_type: EV_IPL,
            key: key.into(),
            description: key.into(),
            covers: format!("input of {key}"),
            digest: [digest; 32],
            phase: None,
        }
    }

    fn ipl(name: &str) -> Vec<u8> {
        format!("{name}\0")
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect()
    }

    #[test]
    fn lines_up_same_differing_missing_and_extra_events() {
        let predicted = [
            event(11, "ipl:.linux#1", 1),
            event(11, "ipl:.linux#2", 2),
            event(11, "ipl:.osrel#1", 3),
            event(11, "ipl:.osrel#2", 4),
        ];
        let refs: Vec<&PredictedEvent> = predicted.iter().collect();
        let (l, o) = (ipl(".linux"), ipl(".osrel"));
        let x = ipl(".splash");
        let log = synthetic_log(&[
            (11, EV_IPL, [1; 32], &l),
            (11, EV_IPL, [9; 32], &l), // .linux contents differ
            (11, EV_IPL, [5; 32], &x), // unexpected section
            (11, EV_IPL, [3; 32], &o), // .osrel contents missing
        ]);
        let parsed = EventLog::parse(&log).expect("parse");
        let logged: Vec<&Event> = parsed.events_for(11).collect();
        let (events, in_order) = line_up(&refs, &logged);
        assert!(in_order);
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| match e {
                EventMatch::Same { .. } => "same",
                EventMatch::Differs { .. } => "differs",
                EventMatch::Missing { .. } => "missing",
                EventMatch::Unexpected { .. } => "extra",
            })
            .collect();
        assert_eq!(kinds, ["same", "differs", "extra", "same", "missing"]);
        match &events[1] {
            EventMatch::Differs { predicted, .. } => assert_eq!(predicted.key, "ipl:.linux#2"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reordered_events_are_flagged() {
        let predicted = [event(11, "ipl:.a#1", 1), event(11, "ipl:.b#1", 2)];
        let refs: Vec<&PredictedEvent> = predicted.iter().collect();
        let log = synthetic_log(&[
            (11, EV_IPL, [2; 32], &ipl(".b")),
            (11, EV_IPL, [1; 32], &ipl(".a")),
        ]);
        let parsed = EventLog::parse(&log).expect("parse");
        let logged: Vec<&Event> = parsed.events_for(11).collect();
        let (events, in_order) = line_up(&refs, &logged);
        assert!(!in_order);
        assert!(events.iter().all(|e| !e.is_problem()));
    }
}
