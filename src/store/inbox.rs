//! The gateway inbox: events accepted from providers, waiting for (or done
//! with) delivery to the application. It always lives in the local redb file,
//! whatever backend holds claims and streams.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::domain::CreatedAt;

/// Where an event is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Waiting for delivery (or between attempts).
    Pending,
    /// The application answered 2xx.
    Delivered,
    /// Older than its stream's head when its turn came: not delivered.
    Stale,
    /// Every attempt failed; waits for an operator's redeliver.
    Dead,
}

impl EventStatus {
    /// Stored byte.
    pub fn to_byte(self) -> u8 {
        match self {
            EventStatus::Pending => 0,
            EventStatus::Delivered => 1,
            EventStatus::Stale => 2,
            EventStatus::Dead => 3,
        }
    }

    /// From the stored byte; unknown bytes read as dead (kept, not retried).
    pub fn from_byte(b: u8) -> Self {
        match b {
            0 => EventStatus::Pending,
            1 => EventStatus::Delivered,
            2 => EventStatus::Stale,
            _ => EventStatus::Dead,
        }
    }

    /// Parses the `status` query parameter.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(EventStatus::Pending),
            "delivered" => Some(EventStatus::Delivered),
            "stale" => Some(EventStatus::Stale),
            "dead" => Some(EventStatus::Dead),
            _ => None,
        }
    }
}

/// An event as ingest stores it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewEvent {
    /// Configured source name.
    pub source: String,
    /// The provider's event id (already validated as a key).
    pub event_id: String,
    /// Ordering scope, if the source has one and the event carries it.
    pub stream: Option<String>,
    /// The event's `created_at`, or its receive time when it has none.
    pub created_at: CreatedAt,
    /// When dedupd accepted it.
    pub received_at_ms: Millis,
    /// Request headers the application needs, as received.
    pub headers: Vec<(String, String)>,
    /// The raw body, byte for byte.
    pub body: Vec<u8>,
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEvent {
    /// Configured source name.
    pub source: String,
    /// The provider's event id.
    pub event_id: String,
    /// Current status.
    pub status: EventStatus,
    /// Ordering scope.
    pub stream: Option<String>,
    /// Its `created_at` (or receive time).
    pub created_at: CreatedAt,
    /// When dedupd accepted it.
    pub received_at_ms: Millis,
    /// Delivery attempts made (HTTP requests sent).
    pub attempts: u32,
    /// Pending: when it may next be tried. Settled: when it settled.
    pub due_at_ms: Millis,
    /// What went wrong last, if anything.
    pub last_error: Option<String>,
    /// Redelivered by an operator: deliver even if older than the head.
    pub force: bool,
    /// Headers to forward.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Vec<u8>,
    /// Settled events: when the record is reaped (0 while pending).
    pub expires_at_ms: Millis,
    /// Lease generation: grows with every lease and redeliver, so the
    /// outcome of a delivery turn whose lease was superseded is ignored.
    pub lease: u64,
    /// Size of the body (listings leave `body` empty).
    pub body_bytes: usize,
}

/// A source's events at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceSummary {
    /// Source name (configured or not).
    pub source: String,
    /// Events waiting for delivery.
    pub pending: u64,
    /// Delivered events kept for their retention.
    pub delivered: u64,
    /// Stale events kept for their retention.
    pub stale: u64,
    /// Dead events kept for their retention.
    pub dead: u64,
    /// When the oldest pending event was received, Unix ms.
    pub oldest_pending_ms: Option<Millis>,
}

/// Answer to an insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestOutcome {
    /// Stored; it will be delivered.
    Accepted,
    /// The inbox already holds this event id for this source.
    Duplicate,
}

/// How one delivery turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Settle {
    /// 2xx from the application (or another instance delivered it).
    Delivered {
        /// Whether this turn sent an HTTP request.
        attempted: bool,
    },
    /// Older than the head: not delivered.
    Stale,
    /// The attempt failed; try again at `retry_at`.
    Retry {
        /// Next attempt, Unix ms.
        retry_at: Millis,
        /// What failed.
        error: String,
        /// Whether this turn sent an HTTP request (counts as an attempt).
        attempted: bool,
    },
    /// The last allowed attempt failed.
    Dead {
        /// What failed.
        error: String,
    },
}

/// What a lease did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leased {
    /// Leased for delivery: (source, event id, lease generation).
    pub leased: Vec<(String, String, u64)>,
    /// Found older than their stream's head and settled as stale instead:
    /// (source, event id).
    pub stale: Vec<(String, String)>,
}

/// Answer to an operator's redeliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedeliverOutcome {
    /// Back to pending.
    Requeued,
    /// No such event.
    NotFound,
    /// Only dead and stale events can be redelivered.
    NotRedeliverable(EventStatus),
}

/// Retentions of settled events.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Retention {
    /// Delivered and stale events, ms.
    pub delivered_ms: u64,
    /// Dead events, ms.
    pub dead_ms: u64,
}

/// Where a listing page ends: `(received_at_ms, event id)` of its last event.
pub type Cursor = (u64, String);

/// Which end of a listing comes first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// Oldest received first; the cursor pages towards newer events.
    #[default]
    OldestFirst,
    /// Newest received first; the cursor pages towards older events.
    NewestFirst,
}
