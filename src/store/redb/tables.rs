//! Table definitions and row encodings of the redb file.
//!
//! Schema version 14. Version 13 files store bulk jobs' records as they
//! are ([`INBOX_JOBS`]; from 14 each is a seal, see
//! `InboxRequest::PutJob`: a record stored before stays as it is until
//! its job's runner writes it again). Version 11 files store inbox bodies and headers as
//! they came, unsealed (opening one creates [`INBOX_SEALS`]; their rows
//! stay unsealed until reaped, see `seal`). Version 8 files have no replay marks or bulk jobs, and
//! no erased events (opening one creates their tables). Version 7 files
//! have no attempt timelines (opening one creates their table). Version 6 files have no dedupe records of reaped
//! inbox events (opening one creates their tables). Version 5 and 4 files key the Redis-protocol
//! keyspace by the key itself (opening one moves its rows to row ids).
//! Version 4 files keep each inbox event's body in its
//! row (opening one moves the bodies to their own table); version 3
//! files have no key-value tables (opening one creates them); version 2
//! files have no write-ahead log (opening one just records the new
//! version); version 1 keyed the runnable index by due time first, and its
//! earliest files had inbox rows without a lease generation (opening such a
//! file migrates it). Any change to a table's key or row format bumps the
//! version and adds a migration (or a refusal) to `migrate`. Every table
//! with expiring rows has an index table keyed
//! by `(expires_at_ms, key)`, so the reaper reads expired rows in expiry
//! order and its cost follows what expired, not what is stored. Invariant:
//! each row has exactly one index entry, at the row's current expiry;
//! overwriting a row removes its old index entry first.

use redb::TableDefinition;

use crate::clock::Millis;
use crate::domain::{ClaimResult, CreatedAt, Fingerprint, ScopedKey, Token};
use crate::store::ordering::{EventRecord, Recorded};
use crate::store::{ClaimRecord, ClaimState, Head};

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u64 = 14;

/// Metadata: `schema_version`, `fence` (last fence handed out).
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Key in [`META`] of the schema version.
pub const META_SCHEMA_VERSION: &str = "schema_version";
/// Key in [`META`] of the sequence number of the last write-ahead-log batch
/// the file holds durably (see `wal`).
pub const META_WAL_SEQ: &str = "wal_seq";
/// Key in [`META`] of the last fence handed out.
pub const META_FENCE: &str = "fence";
/// Key in [`META`]: 1 while a process has the file open and its
/// write-ahead log may hold batches the file does not; 0 (or absent) once
/// a clean shutdown checkpointed them all. Opening a file marked 1 without
/// its log is refused: the log holds acknowledged writes.
pub const META_LOG_OPEN: &str = "log_open";
/// Key in [`META`]: 2 once the file's write-ahead log is kept in two
/// segments (`.wal` and `.wal2`, see `wal_segments`), written by every
/// checkpoint; absent in files whose log was one file. Opening a file
/// marked 2 and left open without its second segment is refused, as
/// without the first.
pub const META_LOG_SEGMENTS: &str = "log_segments";
/// Keys in [`META`] of the file's id (a random u128 in two halves), written
/// when the file is created; its write-ahead log carries the same id.
pub const META_FILE_ID: [&str; 2] = ["file_id_hi", "file_id_lo"];

/// Claims by row id, as [`KV_ROWS`] holds the keyspace (and for the same
/// reason: a new claim is an append, not an insert at a random place in a
/// B-tree; the key to row id map is in memory, see `kv_index`): (scoped
/// key, [`claim_value`], `Some(expires_at_ms)`). Invariant: one row per
/// key; a rewrite keeps the key's row id. Row ids come from the keyspace's
/// counter ([`META_KV_NEXT_ID`]).
pub const CLAIM_ROWS: TableDefinition<u64, KvRow<'static>> = TableDefinition::new("claim_rows");
/// Expiry index of [`CLAIM_ROWS`], by (expires_at_ms, row id).
pub const CLAIM_ROW_EXPIRY: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("claim_row_expiry");

/// The state byte of a done record that keeps a result ([`claim_value`]):
/// such a value is never held in memory (`kv_index::Slot::in_space`).
pub const CLAIM_STATE_WITH_RESULT: u8 = 2;

/// A claim's value in [`CLAIM_ROWS`] (its expiry is the row's): state
/// (0 processing, 1 done), token (16 bytes), fence (8, little-endian),
/// then the fingerprint's bytes, if any (a fingerprint is never empty).
/// A done record that keeps a result has state 2, and after the fence the
/// fingerprint's length (2 bytes, little-endian), the fingerprint and the
/// result's JSON text. Builds before results read state 2 as done (every
/// state byte but 0 is), so a record never opens again as claimable.
pub fn claim_value(rec: &ClaimRecord) -> Vec<u8> {
    let fingerprint = rec.fingerprint.as_ref().map_or("", Fingerprint::as_str);
    let result = rec.result.as_ref().map_or("", ClaimResult::as_str);
    let mut v = Vec::with_capacity(27 + fingerprint.len() + result.len());
    v.push(match (rec.state, &rec.result) {
        (ClaimState::Processing, _) => 0,
        (ClaimState::Done, None) => 1,
        (ClaimState::Done, Some(_)) => CLAIM_STATE_WITH_RESULT,
    });
    v.extend_from_slice(rec.token.as_bytes());
    v.extend_from_slice(&rec.fence.to_le_bytes());
    if v[0] == CLAIM_STATE_WITH_RESULT {
        // A fingerprint is at most 256 bytes (`MAX_FINGERPRINT_BYTES`).
        let len = u16::try_from(fingerprint.len()).unwrap_or(u16::MAX);
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(fingerprint.as_bytes());
        v.extend_from_slice(result.as_bytes());
    } else {
        v.extend_from_slice(fingerprint.as_bytes());
    }
    v
}

/// Decodes a claim from its [`claim_value`] and expiry; `None` if the
/// value is too short to be one. Unknown state bytes read as done, the safe
/// side: a done record refuses new claims.
pub fn claim_from_value(value: &[u8], expires_at_ms: Millis) -> Option<ClaimRecord> {
    let (&state, rest) = value.split_first()?;
    let (token, rest) = rest.split_first_chunk::<16>()?;
    let (fence, rest) = rest.split_first_chunk::<8>()?;
    let (fingerprint, result) = if state == CLAIM_STATE_WITH_RESULT {
        let (len, rest) = rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_le_bytes(*len));
        if rest.len() < len {
            return None;
        }
        let (fingerprint, result) = rest.split_at(len);
        // Only parsed results were ever stored; a damaged one is dropped,
        // the record stays done.
        let result = std::str::from_utf8(result)
            .ok()
            .and_then(|r| ClaimResult::from_stored(r).ok());
        (fingerprint, result)
    } else {
        (rest, None)
    };
    Some(ClaimRecord {
        state: if state == 0 {
            ClaimState::Processing
        } else {
            ClaimState::Done
        },
        token: Token::from_bytes(*token),
        fence: u64::from_le_bytes(*fence),
        expires_at_ms,
        // Only parsed fingerprints were ever stored.
        fingerprint: std::str::from_utf8(fingerprint)
            .ok()
            .filter(|f| !f.is_empty())
            .and_then(|f| Fingerprint::parse(f).ok()),
        result,
    })
}

/// Row of [`CLAIMS_V9`]: (state, token, fence, expires_at_ms, fingerprint).
pub type ClaimRow<'a> = (u8, [u8; 16], u64, u64, Option<&'a str>);
/// Schema 1 to 9's claims, by scoped key; read only to migrate such a file.
pub const CLAIMS_V9: TableDefinition<&str, ClaimRow<'static>> = TableDefinition::new("claims");
/// Schema 1 to 9's expiry index of [`CLAIMS_V9`] (dropped by the
/// migration).
pub const CLAIM_EXPIRY_V9: TableDefinition<(u64, &str), ()> = TableDefinition::new("claim_expiry");

/// Row of [`EVENTS`]: (stream, created_at ns, applied_at_ms, expires_at_ms, outcome).
pub type EventRow<'a> = (&'a str, i128, u64, u64, u8);
/// Applied (and stale) events by scoped event id: unique.
pub const EVENTS: TableDefinition<&str, EventRow<'static>> = TableDefinition::new("applied_events");
/// Expiry index of [`EVENTS`].
pub const EVENT_EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("event_expiry");

/// Row of [`HEADS`]: (created_at ns, event id, expires_at_ms).
pub type HeadRow<'a> = (i128, &'a str, u64);
/// Stream heads by scoped stream name.
pub const HEADS: TableDefinition<&str, HeadRow<'static>> = TableDefinition::new("stream_heads");
/// Expiry index of [`HEADS`].
pub const HEAD_EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("head_expiry");

/// Decodes a claim row of [`CLAIMS_V9`] (to migrate it). Unknown state
/// bytes read as done, the safe side: a done record refuses new claims.
pub fn claim_from_row(row: ClaimRow<'_>) -> ClaimRecord {
    let (state, token, fence, expires_at_ms, fingerprint) = row;
    ClaimRecord {
        state: if state == 0 {
            ClaimState::Processing
        } else {
            ClaimState::Done
        },
        token: Token::from_bytes(token),
        fence,
        expires_at_ms,
        // Only parsed fingerprints were ever stored.
        fingerprint: fingerprint.and_then(|f| Fingerprint::parse(f).ok()),
        result: None,
    }
}

/// Decodes an event row.
pub fn event_from_row(row: EventRow<'_>) -> EventRecord {
    let (stream, created_at, applied_at_ms, expires_at_ms, outcome) = row;
    EventRecord {
        stream: ScopedKey::from_stored(stream.to_owned()),
        created_at: CreatedAt::from_unix_nanos(created_at),
        applied_at_ms,
        expires_at_ms,
        // Only 0 and 1 were ever written.
        outcome: if outcome == 0 {
            Recorded::Applied
        } else {
            Recorded::Stale
        },
    }
}

/// Encodes an event row.
pub fn event_to_row(rec: &EventRecord) -> EventRow<'_> {
    (
        rec.stream.as_str(),
        rec.created_at.unix_nanos(),
        rec.applied_at_ms,
        rec.expires_at_ms,
        match rec.outcome {
            Recorded::Applied => 0,
            Recorded::Stale => 1,
        },
    )
}

/// Decodes a head row into the head and its expiry.
pub fn head_from_row(row: HeadRow<'_>) -> (Head, Millis) {
    let (created_at, event_id, expires_at_ms) = row;
    (
        Head {
            created_at: CreatedAt::from_unix_nanos(created_at),
            event_id: ScopedKey::from_stored(event_id.to_owned()),
        },
        expires_at_ms,
    )
}

/// Row of [`INBOX`]: what a delivery attempt changes, and what a listing
/// shows; the body, written once, is in [`INBOX_BODIES`].
///
/// Stored as the tuple [`InboxTuple`] of its fields in this order, under
/// that tuple's redb type name (redb checks a table's value type by name):
/// files written while the row was that tuple open unchanged. A field
/// added, removed or moved is a new schema version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxRow<'a> {
    /// [`EventStatus::to_byte`](crate::store::inbox::EventStatus::to_byte).
    pub status: u8,
    /// When dedupd accepted the event, Unix ms.
    pub received_at_ms: u64,
    /// Its `created_at`, Unix ns.
    pub created_at_ns: i128,
    /// Its stream, if any.
    pub stream: Option<&'a str>,
    pub attempts: u32,
    /// Pending: when it may next be tried. Settled: when it settled.
    pub due_at_ms: u64,
    /// What went wrong last, if anything.
    pub last_error: Option<&'a str>,
    /// Redelivered by an operator: delivered even if older than the head.
    pub force: bool,
    /// The headers to forward, as a JSON array of pairs.
    pub headers: &'a str,
    /// Settled events: when the row is reaped (0 while pending).
    pub expires_at_ms: u64,
    pub lease: u64,
    /// Size of the body in [`INBOX_BODIES`].
    pub body_bytes: u64,
}

/// How an [`InboxRow`] is stored: its fields in order.
pub type InboxTuple<'a> = (
    u8,
    u64,
    i128,
    Option<&'a str>,
    u32,
    u64,
    Option<&'a str>,
    bool,
    &'a str,
    u64,
    u64,
    u64,
);

impl<'a> InboxRow<'a> {
    /// The row a stored tuple holds.
    pub fn from_tuple(t: InboxTuple<'a>) -> Self {
        let (
            status,
            received_at_ms,
            created_at_ns,
            stream,
            attempts,
            due_at_ms,
            last_error,
            force,
            headers,
            expires_at_ms,
            lease,
            body_bytes,
        ) = t;
        Self {
            status,
            received_at_ms,
            created_at_ns,
            stream,
            attempts,
            due_at_ms,
            last_error,
            force,
            headers,
            expires_at_ms,
            lease,
            body_bytes,
        }
    }

    /// The tuple it is stored as.
    pub fn to_tuple(self) -> InboxTuple<'a> {
        (
            self.status,
            self.received_at_ms,
            self.created_at_ns,
            self.stream,
            self.attempts,
            self.due_at_ms,
            self.last_error,
            self.force,
            self.headers,
            self.expires_at_ms,
            self.lease,
            self.body_bytes,
        )
    }
}

/// Stored exactly as [`InboxTuple`]: its bytes and its type name.
impl redb::Value for InboxRow<'_> {
    type SelfType<'a>
        = InboxRow<'a>
    where
        Self: 'a;
    type AsBytes<'a>
        = Vec<u8>
    where
        Self: 'a;

    const NICHE: Option<&'static [u8]> = <InboxTuple<'static> as redb::Value>::NICHE;

    fn fixed_width() -> Option<usize> {
        <InboxTuple<'static> as redb::Value>::fixed_width()
    }

    fn from_bytes<'a>(data: &'a [u8]) -> InboxRow<'a>
    where
        Self: 'a,
    {
        InboxRow::from_tuple(<InboxTuple<'static> as redb::Value>::from_bytes(data))
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a InboxRow<'b>) -> Vec<u8>
    where
        Self: 'b,
    {
        <InboxTuple<'static> as redb::Value>::as_bytes(&value.to_tuple())
    }

    fn type_name() -> redb::TypeName {
        <InboxTuple<'static> as redb::Value>::type_name()
    }
}
/// Gateway events by (source, event id).
pub const INBOX: TableDefinition<(&str, &str), InboxRow<'static>> =
    TableDefinition::new("inbox_events");
/// Each event's body by (source, event id): written at ingest, deleted with
/// the event, never rewritten (a delivery attempt changes only the
/// [`INBOX`] row).
pub const INBOX_BODIES: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("inbox_bodies");
/// The key slot of each sealed row's body and headers, by (source, event
/// id): written with the row, deleted with its body (an erasure, the
/// reaper), and the slot then shredded (see `seal`). A row with an entry
/// here has its headers and body sealed in [`INBOX_BODIES`] and stores
/// headers `[]`; a row without one (written before schema 12) stores them
/// as they came. Invariant: an entry only beside a body.
pub const INBOX_SEALS: TableDefinition<(&str, &str), u64> = TableDefinition::new("inbox_seals");
/// Schema 1 to 4 inbox rows: (status, received_at_ms, created_at ns,
/// stream, attempts, due_at_ms, last_error, force, headers as JSON, body,
/// expires_at_ms, lease generation). Read only to migrate such a file.
pub type InboxRowV4<'a> = (
    u8,
    u64,
    i128,
    Option<&'a str>,
    u32,
    u64,
    Option<&'a str>,
    bool,
    &'a str,
    &'a [u8],
    u64,
    u64,
);
/// Schema 1 to 4's inbox, headers and body in each row.
pub const INBOX_V4: TableDefinition<(&str, &str), InboxRowV4<'static>> =
    TableDefinition::new("inbox");
/// The earliest schema 1 inbox row: as [`InboxRowV4`] without the lease
/// generation. Read only to migrate such a file.
pub type InboxRowNoLease<'a> = (
    u8,
    u64,
    i128,
    Option<&'a str>,
    u32,
    u64,
    Option<&'a str>,
    bool,
    &'a str,
    &'a [u8],
    u64,
);
/// [`INBOX_V4`] as the earliest schema 1 files typed it.
pub const INBOX_NO_LEASE: TableDefinition<(&str, &str), InboxRowNoLease<'static>> =
    TableDefinition::new("inbox");
/// An attempt as [`INBOX_ATTEMPTS`] stores it: (attempt number, sent at
/// Unix ms, HTTP status or 0 when none came, latency µs, error).
pub type AttemptRow<'a> = (u32, u64, u16, u64, Option<&'a str>);
/// Each event's last attempts, oldest first, by (source, event id): written
/// when a turn that sent a request settles, deleted with the event (bounded
/// by `store::inbox::TIMELINE_ATTEMPTS`). An event never attempted has none.
pub const INBOX_ATTEMPTS: TableDefinition<(&str, &str), Vec<AttemptRow<'static>>> =
    TableDefinition::new("inbox_attempts");
/// Runnable pending events by (source, due_at_ms, event id): each source's
/// runnable events in due order, so the dispatcher reads every source on its
/// own (fairness, per-source limits) and never reads a source that left the
/// configuration. Invariant: holds every pending event without a stream, and
/// for each stream only its first pending event in queue order, at the row's
/// `due_at_ms`.
pub const INBOX_DUE: TableDefinition<(&str, u64, &str), ()> =
    TableDefinition::new("inbox_runnable");
/// Schema 1's runnable index, keyed (due_at_ms, source, event id); read
/// only to migrate a version 1 file.
pub const INBOX_DUE_V1: TableDefinition<(u64, &str, &str), ()> = TableDefinition::new("inbox_due");
/// Pending events of each stream in delivery order:
/// (source, stream, created_at ns, received_at_ms, event id).
pub const INBOX_QUEUE: TableDefinition<(&str, &str, i128, u64, &str), ()> =
    TableDefinition::new("inbox_queue");
/// Replay marks by (source, event id): the bulk job that last replayed the
/// event and the attempts it had then (see `Inbox::replay`). Deleted with
/// the row, and by an operator's redeliver; none without a row.
pub const INBOX_REPLAY: TableDefinition<(&str, &str), (&str, u32)> =
    TableDefinition::new("inbox_replay");
/// Bulk jobs by id: (the job's record, cancelled). The record's encoding is
/// the job runner's (`gateway::jobs`), opaque here.
pub const INBOX_JOBS: TableDefinition<&str, JobValue<'static>> = TableDefinition::new("inbox_jobs");
/// A row of [`INBOX_JOBS`]: the record (a seal from schema 14, see
/// `InboxRequest::PutJob`), and whether the job is cancelled.
pub type JobValue<'a> = (&'a [u8], bool);
/// Events by (source, status, received_at_ms, event id), for listing.
pub const INBOX_STATUS: TableDefinition<(&str, u8, u64, &str), ()> =
    TableDefinition::new("inbox_status");
/// Settled events by (expires_at_ms, source, event id), for the reaper.
pub const INBOX_EXPIRY: TableDefinition<(u64, &str, &str), ()> =
    TableDefinition::new("inbox_expiry");

/// Dedupe records of reaped inbox events: (source, event id) → until when
/// (Unix ms) a post of that id is still a duplicate. Written when the
/// reaper deletes a settled event less than `gateway.dedupe_window` after
/// it was received, so a late retry or a replay of a request whose
/// signature never expires (GitHub's has no timestamp) is not stored and
/// delivered again. No body, no headers: not an event (never listed or
/// counted). Invariant: an id has a row in [`INBOX`] or a record here,
/// never both (the record is written as the row is deleted; an insert
/// past the record's expiry takes the record out).
pub const INBOX_DEDUPE: TableDefinition<(&str, &str), u64> = TableDefinition::new("inbox_dedupe");
/// Expiry index of [`INBOX_DEDUPE`]: (until, source, event id).
pub const INBOX_DEDUPE_EXPIRY: TableDefinition<(u64, &str, &str), ()> =
    TableDefinition::new("inbox_dedupe_expiry");

/// Row of [`KV_ROWS`]: (key, value, expires_at_ms; `None` = no expiry).
pub type KvRow<'a> = (&'a [u8], &'a [u8], Option<u64>);
/// The Redis-protocol keyspace: rows by a row id the writer hands out in
/// increasing order, so a new key is an append at the end of the table
/// instead of an insert at a random place in it (see `kv_index`: the key
/// to row id map lives in memory, rebuilt from this table on open).
/// Invariant: one row per key; an overwrite keeps the key's row id.
pub const KV_ROWS: TableDefinition<u64, KvRow<'static>> = TableDefinition::new("kv_rows");
/// Expiry index of [`KV_ROWS`], by (expires_at_ms, row id): only rows that
/// have an expiry.
pub const KV_ROW_EXPIRY: TableDefinition<(u64, u64), ()> = TableDefinition::new("kv_row_expiry");
/// Key in [`META`] of the next keyspace row id (written when it moves).
pub const META_KV_NEXT_ID: &str = "kv_next_id";
/// Schema 4 and 5's keyspace, keyed by the key itself; read only to
/// migrate such a file.
pub const KV_V5: TableDefinition<&[u8], (&[u8], Option<u64>)> = TableDefinition::new("kv");
/// Schema 4 and 5's keyspace expiry index (dropped by the migration).
pub const KV_EXPIRY_V5: TableDefinition<(u64, &[u8]), ()> = TableDefinition::new("kv_expiry");

/// A table of a write transaction, opened on first use. Each batch runs in
/// its own transaction; opening a table and closing it again costs lookups
/// in redb's table tree (and, at commit, another), so a batch opens only
/// the tables its requests touch: a batch of claims opens three of sixteen.
pub struct Lazy<'txn, K: redb::Key + 'static, V: redb::Value + 'static> {
    tx: &'txn redb::WriteTransaction,
    def: TableDefinition<'static, K, V>,
    /// The table, once opened.
    table: Option<redb::Table<'txn, K, V>>,
}

impl<'txn, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'txn, K, V> {
    /// The table `def` of `tx`, not opened yet.
    pub fn new(tx: &'txn redb::WriteTransaction, def: TableDefinition<'static, K, V>) -> Self {
        Self {
            tx,
            def,
            table: None,
        }
    }

    /// The table, opened now if this is its first use.
    pub fn open(&mut self) -> Result<&mut redb::Table<'txn, K, V>, redb::Error> {
        let table = match self.table.take() {
            Some(t) => t,
            None => self.tx.open_table(self.def)?,
        };
        Ok(self.table.insert(table))
    }
}

#[cfg(test)]
mod tests {
    use redb::Value;

    use super::*;

    /// A file written while the inbox row was a tuple holds these bytes
    /// under this type name: the struct must read and write both as they
    /// are, field for field.
    #[test]
    fn an_inbox_row_is_stored_as_the_tuple_it_was() {
        let tuple: InboxTuple<'_> = (
            2,
            1_800_000_000_123,
            -1_700_000_000_000_000_007,
            Some("orders"),
            3,
            1_800_000_060_000,
            Some("HTTP 503"),
            true,
            r#"[["content-type","application/json"]]"#,
            1_800_604_800_000,
            5,
            4096,
        );
        let row = InboxRow::from_tuple(tuple);
        assert_eq!(row.status, 2);
        assert_eq!(row.due_at_ms, 1_800_000_060_000);
        assert_eq!(row.last_error, Some("HTTP 503"));
        assert_eq!(row.body_bytes, 4096);
        assert_eq!(InboxRow::type_name(), InboxTuple::type_name());
        assert_eq!(InboxRow::fixed_width(), InboxTuple::fixed_width());
        let bytes = InboxTuple::as_bytes(&tuple);
        assert_eq!(InboxRow::as_bytes(&row), bytes);
        assert_eq!(InboxRow::from_bytes(&bytes), row);
    }

    fn record(state: ClaimState, fingerprint: Option<&str>, result: Option<&str>) -> ClaimRecord {
        ClaimRecord {
            state,
            token: Token::from_bytes([7; 16]),
            fence: 0x0102,
            expires_at_ms: 1_800_000_000_000,
            fingerprint: fingerprint.map(|f| Fingerprint::parse(f).unwrap()),
            result: result.map(|r| ClaimResult::from_stored(r).unwrap()),
        }
    }

    /// Every shape reads back as written, and the bytes are pinned: rows
    /// written by earlier builds (states 0 and 1) read as they did, and a
    /// row with a result is laid out as `claim_value` documents.
    #[test]
    fn a_claim_value_reads_back_and_its_bytes_are_pinned() {
        for rec in [
            record(ClaimState::Processing, None, None),
            record(ClaimState::Processing, Some("sha256:aa"), None),
            record(ClaimState::Done, None, None),
            record(ClaimState::Done, Some("sha256:aa"), None),
            record(ClaimState::Done, None, Some(r#"{"id":1}"#)),
            record(ClaimState::Done, Some("sha256:aa"), Some("[1, 2.50]")),
        ] {
            let value = claim_value(&rec);
            assert_eq!(claim_from_value(&value, rec.expires_at_ms), Some(rec));
        }
        let mut old = vec![1];
        old.extend_from_slice(&[7; 16]);
        old.extend_from_slice(&0x0102u64.to_le_bytes());
        old.extend_from_slice(b"sha256:aa");
        assert_eq!(
            claim_value(&record(ClaimState::Done, Some("sha256:aa"), None)),
            old
        );
        let mut with_result = vec![2];
        with_result.extend_from_slice(&[7; 16]);
        with_result.extend_from_slice(&0x0102u64.to_le_bytes());
        with_result.extend_from_slice(&[9, 0]);
        with_result.extend_from_slice(b"sha256:aa\"ok\"");
        assert_eq!(
            claim_value(&record(ClaimState::Done, Some("sha256:aa"), Some("\"ok\""))),
            with_result
        );
        // A fingerprint length past the value's end is no claim value.
        with_result[25] = 200;
        assert_eq!(claim_from_value(&with_result, 0), None);
    }
}
