//! The inbox's reads: what the dispatcher takes next, the operator API's
//! listings and lookups, the dedupe check of an ingest. Each reads only the
//! index ranges it needs (see each function).

use redb::{ReadTransaction, ReadableTable};

use std::collections::HashSet;

use super::row::{BodyTables, attempt_from_row, decode};
use super::write::job_slot;
use crate::clock::Millis;
use crate::store::inbox::{
    Cursor, EventStatus, InboxEvent, ListOrder, ReplayMark, ReplayState, SourceDue, StoredJob,
};
use crate::store::redb::seal::{OpenSealError, Seals};
use crate::store::redb::tables::{
    INBOX, INBOX_ATTEMPTS, INBOX_BODIES, INBOX_DEDUPE, INBOX_DEDUPE_EXPIRY, INBOX_DUE,
    INBOX_EXPIRY, INBOX_JOBS, INBOX_QUEUE, INBOX_REPLAY, INBOX_SEALS, INBOX_STATUS,
};

/// For each `(source, limit)`: its runnable events due at `now`, in due
/// order, at most `limit`, and none past the one that takes the bodies
/// read to `max_bytes` (each row knows its body's size, so a body over the
/// budget is never loaded, unless it is the source's first). Reads only the
/// asked sources' ranges of the runnable index, so a source left out costs
/// nothing however many events it holds.
pub fn due(
    tx: &ReadTransaction,
    seals: &Seals,
    now: Millis,
    wants: &[(String, usize)],
    max_bytes: u64,
) -> Result<Vec<SourceDue>, redb::Error> {
    let due = tx.open_table(INBOX_DUE)?;
    let rows = tx.open_table(INBOX)?;
    let bodies = BodyTables::open(tx, seals)?;
    let mut out = Vec::with_capacity(wants.len());
    for (source, limit) in wants {
        let mut found = SourceDue::default();
        let mut bytes = 0u64;
        let source = source.as_str();
        for entry in due.range((source, 0u64, "")..)? {
            let (k, _) = entry?;
            let (s, at, id) = k.value();
            if s != source {
                break;
            }
            if at > now || found.events.len() >= *limit {
                found.next = Some(at);
                break;
            }
            let Some(row) = rows.get((s, id))? else {
                continue;
            };
            let row = row.value();
            if !found.events.is_empty() && bytes.saturating_add(row.body_bytes) > max_bytes {
                found.next = Some(at);
                break;
            }
            bytes = bytes.saturating_add(row.body_bytes);
            // A seal whose key was shredded after this read began: the
            // event was erased or reaped meanwhile, and is not due.
            if let Some(e) = bodies.try_with_body(decode(s, id, row))? {
                found.events.push(e);
            }
        }
        out.push(found);
    }
    Ok(out)
}

/// Every source with events in the inbox, with its count of pending events,
/// in name order. Skips from source to source, so it reads one index entry
/// per source plus one per pending event.
pub fn sources(tx: &ReadTransaction) -> Result<Vec<(String, u64)>, redb::Error> {
    let index = tx.open_table(INBOX_STATUS)?;
    let pending = EventStatus::Pending.to_byte();
    let mut out = Vec::new();
    let mut first = index.first()?.map(|(k, _)| k.value().0.to_owned());
    while let Some(source) = first {
        let count = index
            .range((source.as_str(), pending, 0u64, "")..)?
            .map_while(|e| {
                let (k, _) = e.ok()?;
                let (s, st, _, _) = k.value();
                (s == source && st == pending).then_some(())
            })
            .count() as u64;
        // Status bytes stop at 4, so (source, 255, ..) is past all of its
        // entries.
        first = index
            .range((source.as_str(), u8::MAX, u64::MAX, "")..)?
            .map(|e| e.map(|(k, _)| k.value().0.to_owned()))
            .find(|s| s.as_ref().map_or(true, |s| *s != source))
            .transpose()?;
        out.push((source, count));
    }
    Ok(out)
}

/// When the oldest pending event of `source` was received.
pub fn oldest_pending(tx: &ReadTransaction, source: &str) -> Result<Option<Millis>, redb::Error> {
    let pending = EventStatus::Pending.to_byte();
    let index = tx.open_table(INBOX_STATUS)?;
    let first = index
        .range((source, pending, 0u64, "")..)?
        .next()
        .transpose()?;
    Ok(first.and_then(|(k, _)| {
        let (s, st, at, _) = k.value();
        (s == source && st == pending).then_some(at)
    }))
}

/// Whether the inbox holds any event of `source`.
pub fn has_source(tx: &ReadTransaction, source: &str) -> Result<bool, redb::Error> {
    let index = tx.open_table(INBOX_STATUS)?;
    Ok(index
        .range((source, 0u8, 0u64, "")..)?
        .next()
        .transpose()?
        .is_some_and(|(k, _)| k.value().0 == source))
}

/// Whether a post of this id is a duplicate at `now`: the inbox holds the
/// event (its row is not decoded), or it was reaped less than its dedupe
/// window ago. The second lookup is made only for an id without a row.
pub fn known(
    tx: &ReadTransaction,
    source: &str,
    id: &str,
    now: Millis,
) -> Result<bool, redb::Error> {
    Ok(tx.open_table(INBOX)?.get((source, id))?.is_some()
        || tx
            .open_table(INBOX_DEDUPE)?
            .get((source, id))?
            .is_some_and(|g| g.value() > now))
}

/// When the first dedupe record expires, if any.
pub fn next_dedupe_expiry(tx: &ReadTransaction) -> Result<Option<Millis>, redb::Error> {
    Ok(tx
        .open_table(INBOX_DEDUPE_EXPIRY)?
        .first()?
        .map(|(k, _)| k.value().0))
}

/// One event whole: its row, body and attempt timeline.
pub fn get(
    tx: &ReadTransaction,
    seals: &Seals,
    source: &str,
    id: &str,
) -> Result<Option<InboxEvent>, redb::Error> {
    let rows = tx.open_table(INBOX)?;
    let bodies = BodyTables::open(tx, seals)?;
    let Some(mut e) = bodies.read_whole(&rows, source, id)? else {
        return Ok(None);
    };
    if let Some(timeline) = tx.open_table(INBOX_ATTEMPTS)?.get((source, id))? {
        e.timeline = timeline.value().into_iter().map(attempt_from_row).collect();
    }
    e.replay = mark(&tx.open_table(INBOX_REPLAY)?, source, id)?;
    Ok(Some(e))
}

/// Several events of `source` with their bodies (no timelines), in the
/// order of `ids`; `None` for one not held, or whose seal no longer opens
/// (erased or reaped after this read began).
pub fn bodies(
    tx: &ReadTransaction,
    seals: &Seals,
    source: &str,
    ids: &[String],
) -> Result<Vec<Option<InboxEvent>>, redb::Error> {
    let rows = tx.open_table(INBOX)?;
    let bodies = BodyTables::open(tx, seals)?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(match rows.get((source, id.as_str()))? {
            Some(row) => bodies.try_with_body(decode(source, id, row.value()))?,
            None => None,
        });
    }
    Ok(out)
}

/// An event's replay mark, if it has one.
fn mark(
    marks: &impl ReadableTable<(&'static str, &'static str), (&'static str, u32)>,
    source: &str,
    id: &str,
) -> Result<Option<ReplayMark>, redb::Error> {
    Ok(marks.get((source, id))?.map(|g| {
        let (job, base_attempts) = g.value();
        ReplayMark {
            job: job.to_owned(),
            base_attempts,
        }
    }))
}

/// For each of `source`'s `ids`: its status and its replay mark's job.
pub fn replay_states(
    tx: &ReadTransaction,
    source: &str,
    ids: &[String],
) -> Result<Vec<Option<ReplayState>>, redb::Error> {
    let rows = tx.open_table(INBOX)?;
    let marks = tx.open_table(INBOX_REPLAY)?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let state = match rows.get((source, id.as_str()))? {
            None => None,
            Some(row) => {
                let row = row.value();
                Some(ReplayState {
                    status: EventStatus::from_byte(row.status),
                    job: mark(&marks, source, id)?.map(|m| m.job),
                    last_error: row.last_error.map(str::to_owned),
                })
            }
        };
        out.push(state);
    }
    Ok(out)
}

/// Jobs whose record did not open, and why.
pub type Unopened = Vec<(String, OpenSealError)>;

/// Every bulk job's record, in id order, its seal opened (see
/// `InboxRequest::PutJob`), and the ids of those whose seal did not open
/// (left out): a version replaced by a batch synced but not yet
/// committed (read again, the new one is seen), or one the key file
/// does not hold the key of.
pub fn jobs(
    tx: &ReadTransaction,
    seals: &Seals,
) -> Result<(Vec<StoredJob>, Unopened), redb::Error> {
    let mut out = Vec::new();
    let mut unopened = Vec::new();
    for entry in tx.open_table(INBOX_JOBS)?.iter()? {
        let (k, v) = entry?;
        let (stored, cancelled) = v.value();
        let record = match job_slot(stored) {
            None => stored.to_vec(),
            Some(_) => match seals.open_seal(stored) {
                Ok(opened) => opened.body,
                Err(OpenSealError::Io(e)) => return Err(redb::Error::Io(e)),
                Err(e) => {
                    unopened.push((k.value().to_owned(), e));
                    continue;
                }
            },
        };
        out.push(StoredJob {
            id: k.value().to_owned(),
            record,
            cancelled,
        });
    }
    Ok((out, unopened))
}

/// A page of a source's events with `status` in `order` (by received time,
/// then id), starting after the cursor `(received_at_ms, event id)` of the
/// previous page's last event.
pub fn list(
    tx: &ReadTransaction,
    source: &str,
    status: EventStatus,
    order: ListOrder,
    after: Option<Cursor>,
    limit: usize,
) -> Result<(Vec<InboxEvent>, Option<Cursor>), redb::Error> {
    use std::ops::Bound::{Excluded, Included};
    let index = tx.open_table(INBOX_STATUS)?;
    let rows = tx.open_table(INBOX)?;
    let marks = tx.open_table(INBOX_REPLAY)?;
    let s = status.to_byte();
    // Status bytes stop at 4, so (source, s + 1, 0, "") is past every entry
    // of this status.
    let first = (source, s, 0u64, "");
    let end = (source, s + 1, 0u64, "");
    let cursor = after.as_ref().map(|(at, id)| (source, s, *at, id.as_str()));
    let range = match (order, cursor) {
        (_, None) => index.range((Included(first), Excluded(end)))?,
        (ListOrder::OldestFirst, Some(c)) => index.range((Excluded(c), Excluded(end)))?,
        (ListOrder::NewestFirst, Some(c)) => index.range((Included(first), Excluded(c)))?,
    };
    let entries: Box<dyn Iterator<Item = _>> = match order {
        ListOrder::OldestFirst => Box::new(range),
        ListOrder::NewestFirst => Box::new(range.rev()),
    };
    let mut events = Vec::new();
    let mut more = false;
    for entry in entries {
        let (k, _) = entry?;
        let (src, _, _, id) = k.value();
        if events.len() == limit {
            more = true;
            break;
        }
        if let Some(row) = rows.get((src, id))? {
            let mut e = decode(src, id, row.value());
            e.replay = mark(&marks, src, id)?;
            events.push(e);
        }
    }
    let next = if more {
        events
            .last()
            .map(|e| (e.received_at_ms, e.event_id.clone()))
    } else {
        None
    };
    Ok((events, next))
}

/// Every inbox index as stored, for consistency checks in tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxIndexes {
    /// Rows: (source, event id) → the row, decoded, with its body, its
    /// timeline and its replay mark.
    pub rows: Vec<InboxEvent>,
    /// Runnable index: (source, due_at_ms, event id).
    pub runnable: Vec<(String, u64, String)>,
    /// Stream queues: (source, stream, created_at ns, received_at_ms, event id).
    pub queue: Vec<(String, String, i128, u64, String)>,
    /// Status index: (source, status byte, received_at_ms, event id).
    pub status: Vec<(String, u8, u64, String)>,
    /// Expiry index: (expires_at_ms, source, event id).
    pub expiry: Vec<(u64, String, String)>,
    /// Bodies without a row: (source, event id). Always empty.
    pub orphan_bodies: Vec<(String, String)>,
    /// Timelines without a row: (source, event id). Always empty.
    pub orphan_timelines: Vec<(String, String)>,
    /// Replay marks without a row: (source, event id). Always empty.
    pub orphan_marks: Vec<(String, String)>,
    /// Erased rows that still have a body: (source, event id). Always
    /// empty.
    pub erased_bodies: Vec<(String, String)>,
    /// Seal entries without a body: (source, event id). Always empty.
    pub orphan_seals: Vec<(String, String)>,
    /// Key slots used by more than one row. Always empty.
    pub shared_slots: Vec<u64>,
    /// Dedupe records of reaped events: (source, event id, until).
    pub dedupe: Vec<(String, String, u64)>,
    /// Their expiry index: (until, source, event id).
    pub dedupe_expiry: Vec<(u64, String, String)>,
}

/// Whether any bulk job's record is sealed (a file of an older schema has
/// no jobs' table, or none).
pub fn any_sealed_job(tx: &ReadTransaction) -> Result<bool, redb::Error> {
    let table = match tx.open_table(INBOX_JOBS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    for entry in table.iter()? {
        if job_slot(entry?.1.value().0).is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The key slots the inbox's sealed rows and bulk jobs' records use.
pub fn sealed_slots(tx: &ReadTransaction) -> Result<HashSet<u64>, redb::Error> {
    let mut used = HashSet::new();
    for entry in tx.open_table(INBOX_SEALS)?.iter()? {
        let (_, slot) = entry?;
        used.insert(slot.value());
    }
    for entry in tx.open_table(INBOX_JOBS)?.iter()? {
        let (_, v) = entry?;
        used.extend(job_slot(v.value().0));
    }
    Ok(used)
}

/// Reads every inbox table whole (tests only: it reads everything).
pub fn indexes(tx: &ReadTransaction, seals: &Seals) -> Result<InboxIndexes, redb::Error> {
    let mut out = InboxIndexes::default();
    let rows = tx.open_table(INBOX)?;
    let opened = BodyTables::open(tx, seals)?;
    let bodies = tx.open_table(INBOX_BODIES)?;
    let sealed = tx.open_table(INBOX_SEALS)?;
    let timelines = tx.open_table(INBOX_ATTEMPTS)?;
    let marks = tx.open_table(INBOX_REPLAY)?;
    for entry in rows.iter()? {
        let (k, v) = entry?;
        let (s, id) = k.value();
        let mut e = opened.with_body(decode(s, id, v.value()))?;
        if let Some(t) = timelines.get((s, id))? {
            e.timeline = t.value().into_iter().map(attempt_from_row).collect();
        }
        e.replay = mark(&marks, s, id)?;
        if e.status == EventStatus::Erased && bodies.get((s, id))?.is_some() {
            out.erased_bodies.push((s.to_owned(), id.to_owned()));
        }
        out.rows.push(e);
    }
    for entry in marks.iter()? {
        let (k, _) = entry?;
        let (s, id) = k.value();
        if rows.get((s, id))?.is_none() {
            out.orphan_marks.push((s.to_owned(), id.to_owned()));
        }
    }
    for entry in timelines.iter()? {
        let (k, _) = entry?;
        let (s, id) = k.value();
        if rows.get((s, id))?.is_none() {
            out.orphan_timelines.push((s.to_owned(), id.to_owned()));
        }
    }
    for entry in bodies.iter()? {
        let (k, _) = entry?;
        let (s, id) = k.value();
        if rows.get((s, id))?.is_none() {
            out.orphan_bodies.push((s.to_owned(), id.to_owned()));
        }
    }
    let mut slots = HashSet::new();
    for entry in sealed.iter()? {
        let (k, slot) = entry?;
        let (s, id) = k.value();
        if bodies.get((s, id))?.is_none() {
            out.orphan_seals.push((s.to_owned(), id.to_owned()));
        }
        if !slots.insert(slot.value()) {
            out.shared_slots.push(slot.value());
        }
    }
    for entry in tx.open_table(INBOX_DUE)?.iter()? {
        let (k, _) = entry?;
        let (s, at, id) = k.value();
        out.runnable.push((s.to_owned(), at, id.to_owned()));
    }
    for entry in tx.open_table(INBOX_QUEUE)?.iter()? {
        let (k, _) = entry?;
        let (s, st, c, r, id) = k.value();
        out.queue
            .push((s.to_owned(), st.to_owned(), c, r, id.to_owned()));
    }
    for entry in tx.open_table(INBOX_STATUS)?.iter()? {
        let (k, _) = entry?;
        let (s, st, at, id) = k.value();
        out.status.push((s.to_owned(), st, at, id.to_owned()));
    }
    for entry in tx.open_table(INBOX_EXPIRY)?.iter()? {
        let (k, _) = entry?;
        let (at, s, id) = k.value();
        out.expiry.push((at, s.to_owned(), id.to_owned()));
    }
    for entry in tx.open_table(INBOX_DEDUPE)?.iter()? {
        let (k, v) = entry?;
        let (s, id) = k.value();
        out.dedupe.push((s.to_owned(), id.to_owned(), v.value()));
    }
    for entry in tx.open_table(INBOX_DEDUPE_EXPIRY)?.iter()? {
        let (k, _) = entry?;
        let (at, s, id) = k.value();
        out.dedupe_expiry.push((at, s.to_owned(), id.to_owned()));
    }
    Ok(out)
}
