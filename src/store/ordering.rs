//! The ordering rule as a pure decision, shared by backends that evaluate it
//! in Rust. See docs/claims.md, "Ordering: applied events and stream heads".

use serde::Serialize;

use crate::clock::Millis;
use crate::domain::{CreatedAt, ScopedKey};

/// Result of applying an event to its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApplyOutcome {
    /// The event is the newest seen: the head moved to it.
    Applied,
    /// The event is older than the head: recorded, head unchanged.
    Stale,
    /// The event id was applied (or found stale) before.
    Duplicate,
}

/// What an event record says the event was. A duplicate is never recorded
/// (the record of its first apply stays as it is), so it has no stored
/// form: a store cannot write one by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// It moved its stream's head.
    Applied,
    /// It was older than its stream's head.
    Stale,
}

impl From<Recorded> for ApplyOutcome {
    fn from(r: Recorded) -> Self {
        match r {
            Recorded::Applied => ApplyOutcome::Applied,
            Recorded::Stale => ApplyOutcome::Stale,
        }
    }
}

/// The newest applied event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Its `created_at`.
    pub created_at: CreatedAt,
    /// Its id (scoped as stored).
    pub event_id: ScopedKey,
}

/// What `apply` answers: the outcome and the stream's head afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyResult {
    /// Applied, stale or duplicate.
    pub outcome: ApplyOutcome,
    /// The head after the operation; `None` only when a duplicate's stream
    /// head has already expired.
    pub head: Option<Head>,
}

/// A recorded event (applied or stale).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// The stream it was applied to.
    pub stream: ScopedKey,
    /// Its `created_at`.
    pub created_at: CreatedAt,
    /// When dedupd recorded it, Unix milliseconds.
    pub applied_at_ms: Millis,
    /// When the record expires (applied_at + retention).
    pub expires_at_ms: Millis,
    /// Applied or stale.
    pub outcome: Recorded,
}

/// The decision for one apply, given live state only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: ApplyOutcome,
    /// Record the event id as this; `None` for a duplicate.
    pub record: Option<Recorded>,
    /// Move the head to the event.
    pub move_head: bool,
}

/// Decides one apply. `seen` is whether a live record of `event_id` exists;
/// `head` is the stream's live head. An event whose `created_at` equals the
/// head's is applied: equal timestamps are not "older".
pub fn decide(seen: bool, head: Option<&Head>, created_at: CreatedAt) -> Decision {
    if seen {
        return Decision {
            outcome: ApplyOutcome::Duplicate,
            record: None,
            move_head: false,
        };
    }
    match head {
        Some(h) if created_at < h.created_at => Decision {
            outcome: ApplyOutcome::Stale,
            record: Some(Recorded::Stale),
            move_head: false,
        },
        _ => Decision {
            outcome: ApplyOutcome::Applied,
            record: Some(Recorded::Applied),
            move_head: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Key, Namespace};

    fn head(nanos: i128) -> Head {
        Head {
            created_at: CreatedAt::from_unix_nanos(nanos),
            event_id: ScopedKey::new(
                &Namespace::Api,
                &Key::parse("evt_0", "event_id").expect("a key"),
            ),
        }
    }

    /// What a store writes is what it answered: applied as applied, stale
    /// as stale, and a duplicate leaves the first record alone.
    #[test]
    fn an_event_is_recorded_as_what_it_was_answered_and_a_duplicate_not_at_all() {
        let older = CreatedAt::from_unix_nanos(1);
        let newer = CreatedAt::from_unix_nanos(3);
        let cases = [
            (false, None, newer, Some(Recorded::Applied)),
            (false, Some(head(2)), newer, Some(Recorded::Applied)),
            (false, Some(head(2)), older, Some(Recorded::Stale)),
            (true, Some(head(2)), newer, None),
            (true, None, older, None),
        ];
        for (seen, head, created_at, recorded) in cases {
            let d = decide(seen, head.as_ref(), created_at);
            assert_eq!(d.record, recorded, "{d:?}");
            match d.record {
                Some(r) => assert_eq!(ApplyOutcome::from(r), d.outcome),
                None => assert_eq!(d.outcome, ApplyOutcome::Duplicate),
            }
            assert_eq!(d.move_head, d.outcome == ApplyOutcome::Applied);
        }
    }
}
