//! The mesh's members as the peer API sees them: each registry entry with its last poll, and
//! whether it still polls. `hawser-joind` logs it; `hawser peers` shows it.

use std::collections::BTreeMap;
use std::time::Duration;

use hawser_mesh::{Peer, Registry};

use crate::PollStatus;

/// Whether a member polls the peer API, as its last poll shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Polling {
    /// A join service: it answers polls, it does not make them.
    Coordinator,
    /// Its last poll is recent.
    Polling,
    /// Its last poll is older than the stale limit: it stopped polling.
    Stopped,
    /// It never polled since it joined.
    Never,
}

/// One member as the peer API sees it: its entry and its last poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// The member's ID (disk UUID, or `join-service/<name>`).
    pub id: String,
    /// Its entry in the registry.
    pub peer: Peer,
    /// Its last poll, if any.
    pub last_poll: Option<PollStatus>,
    /// Whether it polls.
    pub polling: Polling,
}

/// Every member of `registry` with its last poll from `polls`, judged at `now` (seconds since
/// the Unix epoch): a node whose last poll is older than `stale_after` stopped polling.
pub fn member_statuses(
    registry: &Registry,
    polls: &BTreeMap<String, PollStatus>,
    now: u64,
    stale_after: Duration,
) -> Vec<MemberStatus> {
    registry
        .members()
        .map(|(id, peer)| {
            let last_poll = polls.get(id).cloned();
            let polling = match &last_poll {
                _ if peer.coordinator => Polling::Coordinator,
                None => Polling::Never,
                Some(poll) if now.saturating_sub(poll.unix_time) > stale_after.as_secs() => {
                    Polling::Stopped
                }
                Some(_) => Polling::Polling,
            };
            MemberStatus {
                id: id.to_owned(),
                peer: peer.clone(),
                last_poll,
                polling,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_mesh::PublicKey;

    #[test]
    fn members_that_stopped_or_never_polled_are_told_apart() {
        let mut registry = Registry::new("10.99.0.0/24".parse().unwrap()).unwrap();
        let key = |n: u8| PublicKey::from_slice(&[n; 32]).unwrap();
        registry
            .admit("join-service/j", "j", key(1), None, true, None)
            .unwrap();
        for (id, n) in [("fresh", 2), ("stale", 3), ("new", 4)] {
            registry.admit(id, id, key(n), None, false, None).unwrap();
        }
        let poll = |unix_time| PollStatus {
            unix_time,
            known_version: Some(1),
            stats: vec![],
        };
        let polls = [
            ("fresh".to_owned(), poll(990)),
            ("stale".to_owned(), poll(969)),
        ]
        .into();
        let statuses = member_statuses(&registry, &polls, 1000, Duration::from_secs(30));
        let by_id: std::collections::BTreeMap<_, _> = statuses
            .iter()
            .map(|s| (s.id.as_str(), s.polling))
            .collect();
        assert_eq!(
            by_id,
            [
                ("fresh", Polling::Polling),
                ("join-service/j", Polling::Coordinator),
                ("new", Polling::Never),
                ("stale", Polling::Stopped),
            ]
            .into()
        );
    }
}
