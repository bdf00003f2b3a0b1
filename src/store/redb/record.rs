//! The write-ahead log's records: the write requests the writer runs,
//! logged batch by batch and replayed after a crash. Their execution is in
//! `ops` (and the tables' modules), the log file's I/O in `wal`.
//!
//! A record is the postcard encoding of a [`Batch`], and postcard writes no
//! field names and no type tags: a reordered field, a changed type, or a
//! variant moved or inserted changes what logged bytes mean without
//! changing the log's header. So the encoding of every request is pinned by
//! a golden test (`wal_golden`, against `tests/golden/requests-format-N.hex`):
//! a change to it must bump `wal::FORMAT`. That covers the types nested in
//! the requests as well, wherever they are defined: the inbox's
//! ([`NewEvent`], [`Settle`], [`Retention`], [`Attempt`]), the keyspace's
//! ([`KvRequest`] and its conditions), and the domain's keys, TTLs, tokens,
//! fingerprints and timestamps. New variants go last; fields are renamed
//! freely (names are not encoded) but never reordered.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::domain::{ClaimResult, CreatedAt, Fingerprint, ScopedKey, Token, Ttl};
use crate::store::inbox::{Attempt, NewEvent, Retention, Settle};
use crate::store::keyspace::KvRequest;
use crate::store::redb::kv_index::{INLINE_MAX, KEY_OVERHEAD, Slot, Space};
use crate::store::redb::seal::Seals;

/// A write the writer thread performs. Serializable for the write-ahead
/// log: replaying the same requests with the same clock readings on the
/// same state gives the same result (nothing here draws randomness; a
/// claim's token comes with its request).
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// See [`crate::store::Store::claim`].
    Claim {
        key: ScopedKey,
        ttl: Ttl,
        fingerprint: Option<Fingerprint>,
        /// The token a new claim gets (drawn by the caller).
        token: Token,
    },
    /// See [`crate::store::Store::done`].
    Done {
        key: ScopedKey,
        token: Token,
        ttl: Ttl,
    },
    /// See [`crate::store::Store::release`].
    Release { key: ScopedKey, token: Token },
    /// See [`crate::store::Store::extend`].
    Extend {
        key: ScopedKey,
        token: Token,
        /// New TTL from now.
        ttl: Ttl,
    },
    /// See [`crate::store::Store::apply`].
    Apply {
        stream: ScopedKey,
        event_id: ScopedKey,
        /// The event's timestamp.
        created_at: CreatedAt,
        /// How long the records live.
        retention_ms: u64,
    },
    /// [`Request::PurgeExpired`] without dedupe records, as builds before
    /// them logged it: replayed from such a log, it leaves none, as it did.
    Purge {
        /// Most records to delete.
        limit: u64,
    },
    /// A gateway inbox write.
    Inbox(InboxRequest),
    /// A delivered gateway event: its stream head moves and it settles as
    /// delivered in one transaction, so it is never delivered with its head
    /// behind.
    Delivered {
        /// The head move, when the event has a stream: (stream, event id,
        /// created_at, retention ms), as for [`Request::Apply`].
        apply: Option<(ScopedKey, ScopedKey, CreatedAt, u64)>,
        /// The settle (an [`InboxRequest::Settle`]).
        settle: Box<InboxRequest>,
    },
    /// Deletes pending events of sources that left the configuration once
    /// they were received before `before`.
    PurgePending {
        sources: Vec<String>,
        /// Received before this (Unix ms): old enough to go.
        before: Millis,
        /// Most events to delete.
        limit: u64,
    },
    /// A write to the Redis-protocol keyspace. (Variants are logged by
    /// index: new ones go last, so a log written before them still reads.)
    Kv(KvRequest),
    /// See [`crate::store::Store::purge_expired`]. The window is logged
    /// with the request, so a replay writes the same dedupe records
    /// whatever the setting is when it runs.
    PurgeExpired {
        /// Most records to delete.
        limit: u64,
        /// How long after its receipt a reaped inbox event's id stays a
        /// duplicate (`gateway.dedupe_window`), ms.
        dedupe_window_ms: u64,
    },
    /// [`Request::Done`] that keeps the work's result (log format 7).
    DoneResult {
        key: ScopedKey,
        token: Token,
        ttl: Ttl,
        result: ClaimResult,
    },
}

impl Request {
    /// How a client's write may grow the in-memory index: an API claim, a
    /// `done` (of a key not claimed it stores one), a Redis-protocol `SET`.
    /// Refused at `storage.max_key_memory_bytes` when it would (see
    /// `key_memory`). The gateway's own claims (its bulk jobs' holds,
    /// bounded by its configuration) are never refused.
    pub fn key_growth(&self) -> Option<KeyGrowth<'_>> {
        match self {
            Request::Claim {
                key, fingerprint, ..
            } if key.is_api() => Some(KeyGrowth {
                space: Space::Claims,
                key: key.as_str().as_bytes(),
                when: GrowsWhen::AbsentOrExpired,
                inline: CLAIM_VALUE_LEN + fingerprint.as_ref().map_or(0, |f| f.as_str().len()),
            }),
            Request::Done { key, .. } if key.is_api() => Some(KeyGrowth {
                space: Space::Claims,
                key: key.as_str().as_bytes(),
                when: GrowsWhen::Absent,
                inline: CLAIM_VALUE_LEN,
            }),
            // A done of a held claim is never refused (the work is finished:
            // refusing its done would have it done again); a result is kept
            // in its row only, never in memory (`kv_index::Slot::in_space`),
            // so it grows no key.
            Request::DoneResult { key, .. } if key.is_api() => Some(KeyGrowth {
                space: Space::Claims,
                key: key.as_str().as_bytes(),
                when: GrowsWhen::Absent,
                inline: 0,
            }),
            Request::Kv(KvRequest::Set { key, value, .. }) => Some(KeyGrowth {
                space: Space::Kv,
                key,
                when: GrowsWhen::Longer,
                inline: if value.len() <= INLINE_MAX {
                    value.len()
                } else {
                    0
                },
            }),
            _ => None,
        }
    }

    /// Whether the engine itself makes this write, to keep what it holds
    /// moving (a delivery's lease and outcome, the reaper's deletions),
    /// rather than a client asking for a new record. Below the free-space
    /// watermark only these go on (see `space`).
    pub fn is_upkeep(&self) -> bool {
        match self {
            Request::Purge { .. }
            | Request::PurgeExpired { .. }
            | Request::PurgePending { .. }
            | Request::Delivered { .. } => true,
            Request::Inbox(i) => {
                matches!(
                    i,
                    InboxRequest::Lease { .. }
                        | InboxRequest::Settle { .. }
                        | InboxRequest::SettleAttempt { .. }
                        | InboxRequest::Erase { .. }
                        | InboxRequest::PutJob { .. }
                        | InboxRequest::CancelJob { .. }
                        | InboxRequest::DeleteJob { .. }
                )
            }
            Request::Claim { .. }
            | Request::Done { .. }
            | Request::DoneResult { .. }
            | Request::Release { .. }
            | Request::Extend { .. }
            | Request::Apply { .. }
            | Request::Kv(_) => false,
        }
    }

    /// About how many bytes this write adds to the log (and, at the next
    /// checkpoint, to the data file): its bodies and values counted
    /// exactly, everything else as a small fixed amount.
    pub fn estimated_bytes(&self) -> u64 {
        const SMALL: u64 = 256;
        let n = |len: usize| len as u64;
        SMALL
            + match self {
                Request::Inbox(InboxRequest::Insert(e)) => event_bytes(e),
                // A row (and a body) per destination it went to.
                Request::Inbox(InboxRequest::InsertRouted { event, lanes, .. }) => {
                    event_bytes(event) * n(lanes.len().max(1))
                }
                Request::Inbox(InboxRequest::InsertSealed { rows, .. }) => {
                    rows.iter().map(|r| n(r.seal.len())).sum::<u64>()
                }
                Request::Inbox(InboxRequest::Lease { events, .. }) => n(events.len()) * 64,
                Request::Inbox(InboxRequest::SettleAttempt {
                    settle, attempt, ..
                }) => {
                    let settled = match settle {
                        Settle::Retry { error, .. } | Settle::Dead { error } => n(error.len()),
                        Settle::Delivered { .. } | Settle::Stale => 0,
                    };
                    settled + n(attempt.error.as_ref().map_or(0, String::len))
                }
                Request::Inbox(InboxRequest::PutJob { record, .. }) => n(record.len()),
                Request::DoneResult { result, .. } => n(result.len()),
                Request::Kv(KvRequest::Set { key, value, .. }) => n(key.len() + value.len()),
                Request::Kv(KvRequest::Delete { keys }) => {
                    keys.iter().map(|k| n(k.len())).sum::<u64>()
                }
                _ => 0,
            }
    }
}

/// The bytes of an event's body and headers.
fn event_bytes(e: &NewEvent) -> u64 {
    e.body.len() as u64
        + e.headers
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum::<u64>()
}

/// An inbox write.
#[derive(Debug, Serialize, Deserialize)]
pub enum InboxRequest {
    /// Store a new event unless its id is known: held in the inbox, or
    /// reaped less than its dedupe window ago (see `tables::INBOX_DEDUPE`).
    Insert(NewEvent),
    /// Take runnable events out of the due index until `until` while they
    /// are delivered; after a crash they come due again by themselves.
    Lease {
        /// (source, event id, lease expiry in Unix ms).
        events: Vec<(String, String, Millis)>,
        /// `Some`: an event older than its stream's head is settled as
        /// stale in the same transaction instead of leased, with these
        /// retentions. Only where this file holds the heads and one
        /// process delivers, so no other turn can move a head in between.
        stale_check: Option<Retention>,
    },
    /// Record how a delivery turn ended.
    Settle {
        source: String,
        event_id: String,
        /// The lease generation the turn ran under.
        lease: u64,
        /// The ending.
        settle: Settle,
        /// Retentions for settled events.
        retention: Retention,
    },
    /// Put a dead or stale event back to pending.
    Redeliver { source: String, event_id: String },
    /// [`InboxRequest::Settle`] of a turn that sent a request, with that
    /// attempt for the event's timeline (log format 3 on).
    SettleAttempt {
        source: String,
        event_id: String,
        /// The lease generation the turn ran under.
        lease: u64,
        /// The ending.
        settle: Settle,
        /// The request sent.
        attempt: Attempt,
        /// Retentions for settled events.
        retention: Retention,
    },
    /// Put a settled event back to pending for a bulk job (log format 4
    /// on): see `Inbox::replay`.
    Replay {
        source: String,
        event_id: String,
        /// The job's id.
        job: String,
    },
    /// Erase an event: see `Inbox::erase`.
    Erase {
        source: String,
        event_id: String,
        /// How long the erased row stays, ms.
        retention_ms: u64,
    },
    /// Write a bulk job's record, keeping its cancel mark. Since this
    /// release `record` is a seal (see `seal`) under a slot of its own, a
    /// new one for each version: the record of a running erase job names
    /// the person it erases, and each version the write replaces (or a
    /// delete removes) has its slot shredded once the batch is synced, so
    /// no copy of it left in the files opens. One logged before is the
    /// record as it is (and still read so).
    PutJob {
        id: String,
        record: Vec<u8>,
        /// The slot of `record`'s seal, lent by the caller (see
        /// [`InboxRequest::InsertSealed`]'s `lent`; not logged).
        #[serde(skip)]
        lent: Lent,
    },
    /// Mark a bulk job cancelled.
    CancelJob { id: String },
    /// Delete a bulk job's record.
    DeleteJob { id: String },
    /// Store a new event for the destinations it matched (log format 5
    /// on): a row in each of `lanes`; with none, one row in the event's
    /// source with status filtered, kept `filtered_ms`. Unless its id is
    /// known in any of `known_in` (every lane of the source).
    InsertRouted {
        event: Box<NewEvent>,
        lanes: Vec<String>,
        known_in: Vec<String>,
        filtered_ms: u64,
    },
    /// Store a new event with its headers and body sealed (log format 6
    /// on; see `seal`): a row in each lane of `rows`, each with its own
    /// seal, unless its id is known in any of `known_in` or of the rows'
    /// lanes (a duplicate stores nothing, and its seals' slots are
    /// retired). With `filtered_ms`, the one row is its source's, with
    /// status filtered, kept that long. `event` carries no headers and no
    /// body: they are in the seals.
    InsertSealed {
        event: Box<NewEvent>,
        /// Bytes of the body, as received.
        body_bytes: u64,
        rows: Vec<SealedRow>,
        known_in: Vec<String>,
        filtered_ms: Option<u64>,
        /// The slots of `rows`, lent by the caller: retired if the request
        /// is dropped before it is logged (not logged itself).
        #[serde(skip)]
        lent: Lent,
    },
}

/// The key slots lent for a request's seals, until the request is stored
/// or refused. Dropped, it retires them: a request refused before it was
/// logged stored none of its seals. Once its batch is logged, the writer
/// takes it out of the request ([`Request::take_lent`], [`Lent::logged`]):
/// kept when the batch is synced ([`LoggedLent::keep`]), held otherwise
/// (dropped), since a crash before the log is started over could still
/// replay its record (see `Seals::hold`).
#[derive(Debug, Default)]
pub struct Lent(Option<(Arc<Seals>, Vec<u64>)>);

impl Lent {
    /// `slots`, lent by `seals`.
    pub fn new(seals: Arc<Seals>, slots: Vec<u64>) -> Self {
        Self(Some((seals, slots)))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some((seals, slots)) = self.0.take() {
            seals.retire(slots);
        }
    }
}

impl Lent {
    /// Its request was logged: from here on, dropped without a word (its
    /// batch not answered, say), its slots are held, not retired.
    pub fn logged(mut self) -> LoggedLent {
        LoggedLent(self.0.take())
    }
}

/// The key slots of a logged request's seals (see [`Lent`]): kept once
/// its batch is synced; held otherwise, however it is dropped.
#[derive(Debug)]
pub struct LoggedLent(Option<(Arc<Seals>, Vec<u64>)>);

impl LoggedLent {
    /// Its batch is synced: its seals are stored.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for LoggedLent {
    fn drop(&mut self) {
        if let Some((seals, slots)) = self.0.take() {
            seals.hold(slots);
        }
    }
}

/// One row of an [`InboxRequest::InsertSealed`].
#[derive(Debug, Serialize, Deserialize)]
pub struct SealedRow {
    /// Its lane (a source, or `SOURCE.DESTINATION`).
    pub lane: String,
    /// The key slot it is sealed under.
    pub slot: u64,
    /// The sealed headers and body.
    pub seal: Vec<u8>,
}

impl Request {
    /// The key slots lent for its seals, taken out of it (see [`Lent`]).
    pub fn take_lent(&mut self) -> Option<Lent> {
        match self {
            Request::Inbox(
                InboxRequest::InsertSealed { lent, .. } | InboxRequest::PutJob { lent, .. },
            ) => Some(std::mem::take(lent)),
            _ => None,
        }
    }
}

/// One batch as logged.
#[derive(Debug, Serialize, Deserialize)]
pub struct Batch {
    /// Sequence number: one more than the batch before.
    pub seq: u64,
    /// The requests, in execution order, each with its clock reading.
    pub ops: Vec<(Millis, Request)>,
}

/// A [`Batch`] as borrowed for encoding: the writer logs its requests
/// without moving them. Encodes exactly as a [`Batch`] does (same fields,
/// same order).
#[derive(Debug, Serialize)]
pub(super) struct BatchRef<'a> {
    /// See [`Batch::seq`].
    pub seq: u64,
    /// See [`Batch::ops`].
    pub ops: &'a [(Millis, &'a Request)],
}

/// A claim's stored value without a fingerprint: state, token, fence
/// (`super::tables::claim_value`).
const CLAIM_VALUE_LEN: usize = 25;

/// How a client's write may grow the in-memory index
/// ([`Request::key_growth`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyGrowth<'a> {
    pub space: Space,
    pub key: &'a [u8],
    /// When it grows the index if the key is there.
    pub when: GrowsWhen,
    /// The value it keeps inline (0: read from its row).
    pub inline: usize,
}

/// When a write grows the index for a key that is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrowsWhen {
    /// Only when absent (a `done` rewrites a claim no larger).
    Absent,
    /// When absent or expired (a live claim refuses a new one).
    AbsentOrExpired,
    /// When absent, or its value grows (a `SET`).
    Longer,
}

impl KeyGrowth<'_> {
    /// What it adds to the index's memory (estimated, as
    /// [`Slot::cost`]) given the key's slot `stored` at `now`: nothing
    /// when it grows nothing.
    pub fn added(&self, stored: Option<&Slot>, now: Millis) -> usize {
        let Some(slot) = stored else {
            return self.most();
        };
        let kept = slot.inline.as_ref().map_or(0, |v| v.len());
        match self.when {
            GrowsWhen::Absent => 0,
            GrowsWhen::AbsentOrExpired if slot.is_live(now) => 0,
            GrowsWhen::AbsentOrExpired | GrowsWhen::Longer => self.inline.saturating_sub(kept),
        }
    }

    /// [`KeyGrowth::added`] at most: for a key not there.
    pub fn most(&self) -> usize {
        KEY_OVERHEAD + self.key.len() + self.inline
    }
}
