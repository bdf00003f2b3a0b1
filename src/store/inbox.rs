//! The gateway inbox: events accepted from providers, waiting for (or done
//! with) delivery to the application: the [`Inbox`] trait and its
//! vocabulary. It lives in the data file (`store::redb`), whatever backend
//! holds claims and streams.
//!
//! [`NewEvent`], [`Settle`] and [`Retention`] are logged in the data file's
//! write-ahead log: their encoding is pinned (see `store::redb::record`).
//! Add variants last, never reorder fields or variants.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::clock::Millis;
use crate::domain::{CreatedAt, ScopedKey};

/// The inbox's operations: what ingest, the dispatcher, the reaper and the
/// operator API do with events. Writes are durable before they answer;
/// reads show nothing that is not.
#[async_trait]
pub trait Inbox: Send + Sync + std::fmt::Debug + 'static {
    /// Stores a new event durably, unless the source already has its id
    /// (or had it less than [`Inbox::dedupe_window`] ago).
    async fn ingest(&self, event: NewEvent, now: Millis) -> Result<IngestOutcome, StoreError>;

    /// Whether a post of this event id is a duplicate at `now`: the inbox
    /// holds the event, or reaped it less than the dedupe window after it
    /// was received. Reads only; [`Inbox::ingest`] checks again.
    async fn knows_event(&self, event: &EventKey, now: Millis) -> Result<bool, StoreError>;

    /// Whether ingest should ask [`Inbox::knows_event`] before
    /// [`Inbox::ingest`]: worth it where a read spares the writer (the
    /// data file's group commit), not where the insert itself is one
    /// round trip that checks (the shared inbox).
    fn precheck_duplicates(&self) -> bool {
        true
    }

    /// Whether other processes write this inbox too (the shared inbox): a
    /// bulk job may start or be cancelled there, so a job runner looks
    /// again now and then. Where it is this process's own, the runner reads
    /// the jobs only when told (a read of what was acknowledged makes the
    /// data file's writer commit, taking group commit away).
    fn written_elsewhere(&self) -> bool {
        false
    }

    /// Stores a new event of a source with several destinations: a row in
    /// each lane of `lanes` (the destinations it matched); with none, one
    /// row in the event's source with status [`EventStatus::Filtered`],
    /// kept `filtered_ms`. A duplicate when its id is known in any of
    /// `known_in` (every lane of the source), as [`Inbox::ingest`] is.
    /// An inbox without destinations refuses anything but a lone lane,
    /// the source's own (`check-config` keeps such a configuration off it).
    async fn ingest_routed(
        &self,
        event: NewEvent,
        lanes: Vec<String>,
        known_in: Vec<String>,
        filtered_ms: u64,
        now: Millis,
    ) -> Result<IngestOutcome, StoreError> {
        let _ = (known_in, filtered_ms);
        if lanes.len() == 1 && lanes[0] == event.source {
            return self.ingest(event, now).await;
        }
        Err(StoreError::Failed(std::sync::Arc::new(
            std::io::Error::other("this inbox holds one destination per source"),
        )))
    }

    /// Whether `event` is still pending under lease generation `lease`:
    /// asked before sending an event held leased ahead where others write
    /// the inbox too (an operator on another instance may have erased or
    /// redelivered it meanwhile). Where the inbox is this process's own,
    /// every such change reaches the dispatcher directly: true.
    async fn lease_holds(&self, event: &EventKey, lease: u64) -> Result<bool, StoreError> {
        let _ = (event, lease);
        Ok(true)
    }

    /// The delivery lanes' state the processes sharing this inbox share
    /// (holds, rate limits, breakers: see [`super::lanes`]); `None` where
    /// the inbox is this process's own and its scheduler keeps them.
    fn lanes(&self) -> Option<&dyn super::lanes::Lanes> {
        None
    }

    /// How long a lease lasts when its holder renews it
    /// ([`Inbox::renew_leases`]), where several processes lease from this
    /// inbox (`gateway.lease_grace`): a process that dies loses its events
    /// to the others that long after its last renewal, whatever the
    /// attempt's timeout. `None` where the inbox is this process's own: a
    /// lease then only outlives a crash, and lasts the attempt's timeout
    /// plus a margin.
    fn lease_grace(&self) -> Option<Duration> {
        None
    }

    /// Extends to `until` each lease of `leases` (event, generation) that
    /// is still live at `now` under that generation: the event pending,
    /// not leased again since, its lease not yet over, its stream's turn
    /// still its own. A lease that ran out is never renewed, even if
    /// nobody took the event (its stream's turn may have passed to another
    /// event meanwhile). Answers, in order, each one's [`Renewal`], or
    /// `None` where that part of the store could not be reached (a
    /// cluster's master down): it may still be live. Fails only when no
    /// part answered. An inbox without a [`Inbox::lease_grace`] has
    /// nothing to renew: all renewed.
    async fn renew_leases(
        &self,
        leases: Vec<(EventKey, u64)>,
        until: Millis,
        now: Millis,
    ) -> Result<Vec<Option<Renewal>>, StoreError> {
        let _ = (until, now);
        Ok(vec![Some(Renewal::Renewed); leases.len()])
    }

    /// How long after its receipt a reaped event's id stays a duplicate
    /// (`gateway.dedupe_window`, as the inbox was opened with).
    fn dedupe_window(&self) -> Duration;

    /// What the instances sharing this inbox agree on besides its events
    /// (see [`Fleet`](super::fleet::Fleet)); `None` where the inbox is
    /// this process's own, and each process keeps that state itself.
    fn fleet(&self) -> Option<&dyn super::fleet::Fleet> {
        None
    }

    /// Ok when the inbox can take writes now (as `Store::ready`).
    async fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Free space on the disk that holds the inbox, read now, and the
    /// watermark below which writes are refused; `None` where the store
    /// does not watch a disk of its own.
    fn disk_space(&self) -> Option<DiskSpace> {
        None
    }

    /// The keys the store behind the inbox keeps in memory, counted now;
    /// `None` where it keeps none there.
    fn keys_in_memory(&self) -> Option<KeysInMemory> {
        None
    }

    /// Leases runnable events that are due at `now`, each until its own
    /// time, while they are being delivered: `(event, until)`;
    /// answers each one's current attempts (the read that found it may be
    /// older than its last settle). With `stale_check`, an
    /// event older than its stream's head (in the inbox's own store) is
    /// settled as stale instead, in the same write.
    async fn lease(
        &self,
        events: Vec<(EventKey, Millis)>,
        stale_check: Option<Retention>,
        now: Millis,
    ) -> Result<Leased, StoreError>;

    /// Records how a delivery turn under lease generation `lease` ended;
    /// ignored when another turn or a redeliver has taken the event since.
    async fn settle(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// [`Inbox::settle`] of a turn that sent a request: `attempt` joins
    /// the event's timeline (its last [`TIMELINE_ATTEMPTS`] attempts) in
    /// the same write, even when the settle itself is ignored (the request
    /// was sent all the same).
    #[allow(clippy::too_many_arguments)]
    async fn settle_attempt(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        attempt: Attempt,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Settles a delivered event and moves its stream head in the inbox's
    /// own store in one write: `apply` is (stream, event id, created_at,
    /// retention ms) when the event has a stream; `attempt`, the request
    /// that delivered it, joins the event's timeline.
    #[allow(clippy::too_many_arguments)]
    async fn settle_delivered(
        &self,
        event: &EventKey,
        lease: u64,
        apply: Option<(ScopedKey, ScopedKey, CreatedAt, u64)>,
        attempt: Option<Attempt>,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Puts a dead or stale event back to pending.
    async fn redeliver(
        &self,
        source: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError>;

    /// Puts a delivered, dead or stale event back to pending for the bulk
    /// job `job` (a replay): its attempts continue (the `dedupd-attempt`
    /// header counts on, the retry budget starts afresh from them), and a
    /// delivered or stale one is delivered even if older than its stream's
    /// head. Refused for an event the job already replayed, so a job that
    /// asks twice sends once.
    async fn replay(
        &self,
        source: &str,
        event_id: &str,
        job: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError>;

    /// Erases an event: its body and stored headers are deleted, its row
    /// stays with status [`EventStatus::Erased`] for `retention_ms` (and
    /// its id a duplicate for the dedupe window after its receipt). A
    /// pending event leaves its stream's queue: it is never delivered.
    async fn erase(
        &self,
        source: &str,
        event_id: &str,
        retention_ms: u64,
        now: Millis,
    ) -> Result<EraseOutcome, StoreError>;

    /// Writes a bulk job's record (created or updated): `record` is the
    /// job's own encoding, opaque to the inbox. Keeps the job's cancel mark.
    async fn put_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError>;

    /// Writes a bulk job's last record, once it ended: its filter keeps
    /// its shape, not its values (an erasure's names the person erased).
    /// The versions before it, which held them, are taken out of the
    /// store's files as an erased event's body is: shredded in the data
    /// file, rewritten out of Redis's.
    async fn end_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError>;

    /// Marks a job cancelled; false when there is no such job.
    async fn cancel_job(&self, id: &str, now: Millis) -> Result<bool, StoreError>;

    /// Deletes a job's record.
    async fn delete_job(&self, id: &str, now: Millis) -> Result<(), StoreError>;

    /// Every job's record, in id order.
    async fn jobs(&self) -> Result<Vec<StoredJob>, StoreError>;

    /// For each of `source`'s events `event_ids`: its status, the job of
    /// its replay mark and its last error, `None` when the inbox does not
    /// hold it. What a
    /// bulk job looks up of its window each pass: one read where the store
    /// can.
    async fn replay_states(
        &self,
        source: &str,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<ReplayState>>, StoreError> {
        let mut out = Vec::with_capacity(event_ids.len());
        for id in &event_ids {
            out.push(self.inbox_event(source, id).await?.map(|e| ReplayState {
                status: e.status,
                job: e.replay.map(|m| m.job),
                last_error: e.last_error,
            }));
        }
        Ok(out)
    }

    /// Deletes at most `limit` pending events of `sources` (removed from
    /// the configuration) received before `before`; how many went.
    async fn purge_pending(
        &self,
        sources: Vec<String>,
        before: Millis,
        limit: u64,
        now: Millis,
    ) -> Result<u64, StoreError>;

    /// For each `(source, limit)`: its runnable events due at `now` (at
    /// most `limit`, and no more once their bodies reach `max_bytes`; the
    /// first is always returned) and its next due time after them.
    async fn due_events(
        &self,
        now: Millis,
        wants: Vec<(String, usize)>,
        max_bytes: u64,
    ) -> Result<Vec<SourceDue>, StoreError>;

    /// Deletes at most `limit` settled events whose retention ended at
    /// `now` (their dedupe records stay for the rest of the window): how
    /// many went, and whether more are left. The data file's inbox is
    /// reaped with the file instead (`Store::purge_expired`): this answers
    /// nothing there.
    async fn purge_settled(&self, now: Millis, limit: u64) -> Result<(u64, bool), StoreError> {
        let _ = (now, limit);
        Ok((0, false))
    }

    /// Every source with events in the inbox, with its pending count.
    async fn inbox_sources(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// Each source with events in the inbox: its counts by status and when
    /// its oldest pending event was received, without scanning the inbox.
    async fn inbox_summary(&self) -> Result<Vec<SourceSummary>, StoreError>;

    /// Whether the inbox holds any event of `source`.
    async fn has_source(&self, source: &str) -> Result<bool, StoreError>;

    /// One event, with its body and its attempt timeline.
    async fn inbox_event(
        &self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<InboxEvent>, StoreError>;

    /// Several events of `source` with their bodies (no timelines), in the
    /// order of `event_ids`, `None` for one it does not hold (or whose key
    /// was shredded meanwhile): what a scan reads of a page, one read where
    /// the store can.
    async fn inbox_bodies(
        &self,
        source: &str,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<InboxEvent>>, StoreError> {
        let mut out = Vec::with_capacity(event_ids.len());
        for id in &event_ids {
            out.push(self.inbox_event(source, id).await?);
        }
        Ok(out)
    }

    /// A page of a source's events with `status`, in `order`, after the
    /// cursor of the previous page (bodies and headers left out: see
    /// [`InboxEvent::body_bytes`]; the data file keeps both sealed).
    async fn list_events(
        &self,
        source: &str,
        status: EventStatus,
        order: ListOrder,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<InboxEvent>, Option<Cursor>), StoreError>;

    /// Whether the inbox's writer takes a request within `within`: false
    /// while it is stuck (in a commit or a sync) or has stopped. The
    /// systemd watchdog asks.
    async fn writer_responds(&self, within: Duration) -> bool;
}

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
    /// Erased by an operator: body and headers deleted, the record kept.
    Erased,
    /// Matched by none of its source's destinations: kept, never sent.
    Filtered,
}

impl EventStatus {
    /// Stored byte.
    pub fn to_byte(self) -> u8 {
        match self {
            EventStatus::Pending => 0,
            EventStatus::Delivered => 1,
            EventStatus::Stale => 2,
            EventStatus::Dead => 3,
            EventStatus::Erased => 4,
            EventStatus::Filtered => 5,
        }
    }

    /// From the stored byte; unknown bytes read as dead (kept, not retried).
    pub fn from_byte(b: u8) -> Self {
        match b {
            0 => EventStatus::Pending,
            1 => EventStatus::Delivered,
            2 => EventStatus::Stale,
            4 => EventStatus::Erased,
            5 => EventStatus::Filtered,
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
            "erased" => Some(EventStatus::Erased),
            "filtered" => Some(EventStatus::Filtered),
            _ => None,
        }
    }
}

/// What became of a lease asked to be renewed ([`Inbox::renew_leases`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Live, and extended.
    Renewed,
    /// Its holder settled the event under it (its turn ended): nothing to
    /// renew, nothing lost.
    Ended,
    /// Taken by another instance, erased or redelivered, or run out.
    Lost,
}

/// Which event a write is about: its source and id, and its stream (the
/// shared inbox places an event by its stream).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    /// Configured source name.
    pub source: String,
    /// The provider's event id.
    pub event_id: String,
    /// Its ordering scope, if any.
    pub stream: Option<String>,
}

impl EventKey {
    /// The key of event `event_id` of `source` in `stream`.
    pub fn new(source: &str, event_id: &str, stream: Option<&str>) -> Self {
        Self {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
            stream: stream.map(str::to_owned),
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

impl NewEvent {
    /// Which event this is.
    pub fn key(&self) -> EventKey {
        EventKey::new(&self.source, &self.event_id, self.stream.as_deref())
    }
}

/// Free space on a store's disk (`dedupd_store_free_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    /// Bytes free for dedupd.
    pub free_bytes: u64,
    /// `storage.min_free_bytes`: writes are refused below it.
    pub min_free_bytes: u64,
}

/// Keys a store keeps in memory (`dedupd_store_keys_in_memory`): expired
/// ones count until the reaper deletes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeysInMemory {
    /// Claims.
    pub claims: u64,
    /// Keys of the Redis-protocol keyspace.
    pub keyspace: u64,
    /// The memory they take, estimated (`dedupd_store_key_memory_bytes`).
    pub bytes: u64,
    /// `storage.max_key_memory_bytes`, resolved
    /// (`dedupd_store_max_key_memory_bytes`).
    pub cap_bytes: u64,
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
    /// Its last attempts, oldest first (at most [`TIMELINE_ATTEMPTS`]);
    /// filled in by [`Inbox::inbox_event`] only, empty elsewhere.
    pub timeline: Vec<Attempt>,
    /// The bulk job that last replayed it, if any (see [`Inbox::replay`]).
    pub replay: Option<ReplayMark>,
}

impl InboxEvent {
    /// The event without its body and headers (`body_bytes` still gives
    /// its size): what a schedule looks at, cloned without the payload.
    pub fn without_payload(&self) -> Self {
        Self {
            source: self.source.clone(),
            event_id: self.event_id.clone(),
            status: self.status,
            stream: self.stream.clone(),
            created_at: self.created_at,
            received_at_ms: self.received_at_ms,
            attempts: self.attempts,
            due_at_ms: self.due_at_ms,
            last_error: self.last_error.clone(),
            force: self.force,
            headers: Vec::new(),
            body: Vec::new(),
            expires_at_ms: self.expires_at_ms,
            lease: self.lease,
            body_bytes: self.body_bytes,
            timeline: self.timeline.clone(),
            replay: self.replay.clone(),
        }
    }
}

/// An event's replay by a bulk job: the job, and the attempts the event
/// had when the job queued it (its retry budget counts from there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayMark {
    /// The job's id (the `dedupd-replay` header).
    pub job: String,
    /// Attempts made before the replay.
    pub base_attempts: u32,
}

/// An event as a bulk job looks it up: its status, and the job of its
/// replay mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayState {
    pub status: EventStatus,
    /// The job that last replayed it, if any.
    pub job: Option<String>,
    /// What went wrong last, if anything.
    pub last_error: Option<String>,
}

/// A bulk job's record as the inbox keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredJob {
    /// The job's id.
    pub id: String,
    /// Its record, as [`Inbox::put_job`] last wrote it.
    pub record: Vec<u8>,
    /// An operator cancelled it.
    pub cancelled: bool,
}

/// Answer to an erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EraseOutcome {
    /// Erased now.
    Erased,
    /// Erased before.
    AlreadyErased,
    /// No such event.
    NotFound,
}

impl InboxEvent {
    /// Which event this is.
    pub fn key(&self) -> EventKey {
        EventKey::new(&self.source, &self.event_id, self.stream.as_deref())
    }
}

/// Attempts an event's timeline keeps: the last ones, older ones drop off.
pub const TIMELINE_ATTEMPTS: usize = 10;
/// Longest error text an [`Attempt`] keeps, bytes (cut at a character
/// boundary, with an ellipsis).
pub const ATTEMPT_ERROR_BYTES: usize = 300;

/// One delivery attempt, as the event's timeline keeps it: an HTTP request
/// sent to the destination, and how it ended. Logged in the write-ahead log
/// (from log format 3): add fields never; a new field is a new type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attempt {
    /// Its number, as the `dedupd-attempt` header said (restarts at 1
    /// after a redeliver).
    pub attempt: u32,
    /// When it was sent, Unix ms.
    pub at_ms: Millis,
    /// The HTTP status the destination answered; none when it did not
    /// answer (refused, reset, timed out).
    pub status: Option<u16>,
    /// From sending the request to its answer (or failure), µs.
    pub latency_us: u64,
    /// What failed; none for a 2xx.
    pub error: Option<String>,
}

impl Attempt {
    /// An attempt, its error cut to [`ATTEMPT_ERROR_BYTES`].
    pub fn new(
        attempt: u32,
        at_ms: Millis,
        status: Option<u16>,
        latency: Duration,
        error: Option<&str>,
    ) -> Self {
        Self {
            attempt,
            at_ms,
            status,
            latency_us: u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            error: error.map(|e| cut(e, ATTEMPT_ERROR_BYTES)),
        }
    }
}

/// `text` cut to at most `max` bytes at a character boundary, with an
/// ellipsis when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    /// Erased events kept for their retention.
    pub erased: u64,
    /// Events no destination took, kept for the delivered retention.
    pub filtered: u64,
    /// When the oldest pending event was received, Unix ms.
    pub oldest_pending_ms: Option<Millis>,
}

/// Runnable events of one source: those due, and when the next one is.
#[derive(Debug, Clone, Default)]
pub struct SourceDue {
    /// Due at `now`, in due order, within the limits asked for.
    pub events: Vec<InboxEvent>,
    /// The earliest due time among the events not returned, if any (at or
    /// before `now` when a limit stopped the read).
    pub next: Option<Millis>,
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
        /// What failed; empty when nothing did (an unattempted turn given
        /// back): the last error then stays as it was.
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
    /// Leased for delivery, as the lease found them.
    pub leased: Vec<LeasedEvent>,
    /// Found older than their stream's head and settled as stale instead:
    /// (source, event id).
    pub stale: Vec<(String, String)>,
}

/// An event leased for delivery: its lease generation, and the fields a
/// turn needs as they stand now (a dispatcher's read may predate the last
/// settle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedEvent {
    pub source: String,
    pub event_id: String,
    pub lease: u64,
    /// Attempts made before this one.
    pub attempts: u32,
    /// Redelivered by an operator: delivered even if older than the head.
    pub force: bool,
    /// Queued by a bulk job's replay.
    pub replay: Option<ReplayMark>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_without_its_payload_keeps_everything_else() {
        let ev = InboxEvent {
            source: "sume".into(),
            event_id: "evt_1".into(),
            status: EventStatus::Dead,
            stream: Some("run_7".into()),
            created_at: CreatedAt::from_unix_nanos(1_700_000_000_000_000_000),
            received_at_ms: 11,
            attempts: 3,
            due_at_ms: 12,
            last_error: Some("503".into()),
            force: true,
            headers: vec![("x-sume-trace".into(), "t".into())],
            body: b"{\"id\":1}".to_vec(),
            expires_at_ms: 13,
            lease: 4,
            body_bytes: 8,
            timeline: vec![Attempt {
                attempt: 3,
                at_ms: 10,
                status: Some(503),
                latency_us: 900,
                error: Some("503".into()),
            }],
            replay: Some(ReplayMark {
                job: "job_1".into(),
                base_attempts: 1,
            }),
        };
        let head = ev.without_payload();
        assert!(head.body.is_empty() && head.headers.is_empty());
        assert_eq!(head.body_bytes, 8, "its size is still known");
        assert_eq!(
            head,
            InboxEvent {
                headers: Vec::new(),
                body: Vec::new(),
                ..ev
            }
        );
    }
}
