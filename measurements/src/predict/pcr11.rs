//! PCR 11: the sections systemd-stub measures (name, then contents, in the stub version's order)
//! and the boot-phase words hawser's PID 1 extends on top.

use sha2::{Digest, Sha256};

use super::sections::Chosen;
use super::{
    PHASE_CONTROL_PLANE, PHASE_ENTER_INITRD, PHASE_LEAVE_INITRD, PredictedEvent, SectionDigest,
    event_type, phase_digest, size,
};
use crate::models::StubModel;

/// PCR 11's events: for each section of `model.pcr11_sections` the stub uses ([`Chosen`]: the
/// first of its name, or the chosen profile's), its name with NUL and then its contents (its
/// digest among `sections`, every section of the UKI in table order); then every phase word
/// PID 1 may extend (which of them a value includes is [`super::Phase`]'s choice).
pub(super) fn events(
    model: &StubModel,
    chosen: &Chosen<'_>,
    sections: &[SectionDigest],
) -> Vec<PredictedEvent> {
    let mut events = Vec::new();
    for &name in model.pcr11_sections {
        let Some(section) = chosen.index(name).and_then(|i| sections.get(i)) else {
            continue;
        };
        let (content, len) = (section.sha256, section.size);
        let mut with_nul = name.as_bytes().to_vec();
        with_nul.push(0);
        events.push(PredictedEvent {
            pcr: 11,
            event_type: event_type::EV_IPL,
            key: format!("ipl:{name}#1"),
            description: format!("systemd-stub: section name \"{name}\\0\""),
            covers: format!("the presence of a {name} section"),
            digest: Sha256::digest(&with_nul).into(),
            phase: None,
        });
        events.push(PredictedEvent {
            pcr: 11,
            event_type: event_type::EV_IPL,
            key: format!("ipl:{name}#2"),
            description: format!("systemd-stub: contents of {name}"),
            covers: format!("{} ({})", chosen.describe(name), size(len)),
            digest: content,
            phase: None,
        });
    }
    // In the order PID 1 extends them; `control-plane` only on a control plane (see
    // `Phase::includes`).
    for word in [PHASE_ENTER_INITRD, PHASE_CONTROL_PLANE, PHASE_LEAVE_INITRD] {
        events.push(PredictedEvent {
            pcr: 11,
            event_type: event_type::HAWSER_PHASE,
            key: format!("phase:{word}"),
            description: format!("hawser PID 1: boot phase \"{word}\""),
            covers: "hawser's boot phase (constant)".into(),
            digest: phase_digest(word),
            phase: Some(word),
        });
    }
    events
}
