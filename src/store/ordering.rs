//! The ordering rule as a pure decision, shared by backends that evaluate it
//! in Rust. See DESIGN.md, "Ordering".

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
    pub outcome: ApplyOutcome,
}

/// The decision for one apply, given live state only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The answer.
    pub outcome: ApplyOutcome,
    /// Record the event id (with this outcome) — false for duplicates.
    pub record: bool,
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
            record: false,
            move_head: false,
        };
    }
    match head {
        Some(h) if created_at < h.created_at => Decision {
            outcome: ApplyOutcome::Stale,
            record: true,
            move_head: false,
        },
        _ => Decision {
            outcome: ApplyOutcome::Applied,
            record: true,
            move_head: true,
        },
    }
}
