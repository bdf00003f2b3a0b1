//! The inbox's writes, run in the writer's transaction: inserts, leases,
//! settling, redeliver; the reaper's deletions are in `purge`.
//!
//! Invariants (kept by every write here):
//! - each row has one [`INBOX_STATUS`] entry, at its status;
//! - a settled row has one [`INBOX_EXPIRY`] entry, a pending row none;
//! - a pending row with a stream has one [`INBOX_QUEUE`] entry;
//! - [`INBOX_DUE`] holds exactly the runnable pending rows (see its doc):
//!   per stream one event at a time, oldest `created_at` first;
//! - each row has one [`INBOX_BODIES`] entry, written with the row and
//!   deleted with it, and no body is without a row. Writes after the
//!   insert touch the row only (and the timeline);
//! - a row has at most one [`INBOX_ATTEMPTS`] entry (its timeline, at most
//!   [`TIMELINE_ATTEMPTS`] long), deleted with it; none without a row.
//! - an id has a row or an [`INBOX_DEDUPE`] record, never both; each record
//!   has one [`INBOX_DEDUPE_EXPIRY`] entry, at its expiry;
//! - a row has at most one [`INBOX_REPLAY`] mark, deleted with it; none
//!   without a row;
//! - an erased row has no body, no stream queue or runnable entry, and
//!   stored headers `[]`;
//! - a row has at most one [`INBOX_SEALS`] entry (the key slot of its
//!   sealed headers and body), written with its body and deleted with it;
//!   a sealed row stores headers `[]`. Each slot a write takes out of the
//!   table, or finds unused (a duplicate's), joins [`InboxTables::freed`]:
//!   once the batch is durable, its key is shredded (see `seal`).

mod purge;

use redb::{ReadableTable, WriteTransaction};

use super::row::{decode, to_row};
use crate::clock::Millis;
use crate::domain::CreatedAt;
use crate::store::inbox::{
    Attempt, EraseOutcome, EventStatus, InboxEvent, IngestOutcome, Leased, LeasedEvent, NewEvent,
    RedeliverOutcome, ReplayMark, Retention, Settle, TIMELINE_ATTEMPTS,
};
use crate::store::redb::counts::StatusDeltas;
use crate::store::redb::record::{InboxRequest, SealedRow};
use crate::store::redb::tables::{
    AttemptRow, INBOX, INBOX_ATTEMPTS, INBOX_BODIES, INBOX_DEDUPE, INBOX_DEDUPE_EXPIRY, INBOX_DUE,
    INBOX_EXPIRY, INBOX_JOBS, INBOX_QUEUE, INBOX_REPLAY, INBOX_SEALS, INBOX_STATUS, InboxRow, Lazy,
};

/// Answer to an [`InboxRequest`].
#[derive(Debug)]
pub enum InboxResponse {
    /// Answer to an insert.
    Inserted(IngestOutcome),
    /// What the lease did.
    Leased(Leased),
    /// Settle done.
    Done,
    /// Answer to a redeliver or a replay.
    Redelivered(RedeliverOutcome),
    /// Answer to an erase.
    Erased(EraseOutcome),
    /// Whether the job a write named exists.
    Job(bool),
}

/// A new row's body: as received (a request logged before seals), or
/// sealed with its headers.
#[derive(Clone, Copy)]
enum Body<'a> {
    Plain(&'a [u8]),
    Sealed {
        slot: u64,
        seal: &'a [u8],
        /// Bytes of the body inside.
        bytes: usize,
    },
}

/// The key slot of a job's stored record, when it is a seal (see
/// `InboxRequest::PutJob`); none for a record stored as it is.
pub fn job_slot(record: &[u8]) -> Option<u64> {
    crate::store::redb::seal::seal_header(record).map(|(slot, _)| slot)
}

/// Reads the `created_at` of a stream's live head: (source, stream).
pub type HeadLookup<'a> = dyn Fn(&str, &str) -> Result<Option<CreatedAt>, redb::Error> + 'a;

/// The inbox tables of one write transaction.
pub struct InboxTables<'txn> {
    rows: Lazy<'txn, (&'static str, &'static str), InboxRow<'static>>,
    bodies: Lazy<'txn, (&'static str, &'static str), &'static [u8]>,
    attempts: Lazy<'txn, (&'static str, &'static str), Vec<AttemptRow<'static>>>,
    due: Lazy<'txn, (&'static str, u64, &'static str), ()>,
    queue: Lazy<'txn, (&'static str, &'static str, i128, u64, &'static str), ()>,
    status: Lazy<'txn, (&'static str, u8, u64, &'static str), ()>,
    /// How this transaction changed each (source, status) count, for the
    /// in-memory counts once it commits.
    deltas: StatusDeltas,
    expiry: Lazy<'txn, (u64, &'static str, &'static str), ()>,
    dedupe: Lazy<'txn, (&'static str, &'static str), u64>,
    dedupe_expiry: Lazy<'txn, (u64, &'static str, &'static str), ()>,
    replay: Lazy<'txn, (&'static str, &'static str), (&'static str, u32)>,
    jobs: Lazy<'txn, &'static str, (&'static [u8], bool)>,
    seals: Lazy<'txn, (&'static str, &'static str), u64>,
    /// Key slots this transaction freed (their rows' bodies deleted) or
    /// found unused (a duplicate's seals), to shred once it is durable.
    freed: Vec<u64>,
}

impl<'txn> InboxTables<'txn> {
    /// The inbox tables of `tx` (each opened on first use).
    pub fn open(tx: &'txn WriteTransaction) -> Self {
        Self {
            rows: Lazy::new(tx, INBOX),
            bodies: Lazy::new(tx, INBOX_BODIES),
            attempts: Lazy::new(tx, INBOX_ATTEMPTS),
            due: Lazy::new(tx, INBOX_DUE),
            queue: Lazy::new(tx, INBOX_QUEUE),
            status: Lazy::new(tx, INBOX_STATUS),
            deltas: StatusDeltas::default(),
            expiry: Lazy::new(tx, INBOX_EXPIRY),
            dedupe: Lazy::new(tx, INBOX_DEDUPE),
            dedupe_expiry: Lazy::new(tx, INBOX_DEDUPE_EXPIRY),
            replay: Lazy::new(tx, INBOX_REPLAY),
            jobs: Lazy::new(tx, INBOX_JOBS),
            seals: Lazy::new(tx, INBOX_SEALS),
            freed: Vec::new(),
        }
    }

    /// The key slots the transaction freed so far (see [`InboxTables::freed`]).
    pub fn take_freed(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.freed)
    }

    /// Deletes a row's body and its seal's entry, freeing the slot.
    fn drop_body(&mut self, source: &str, id: &str) -> Result<(), redb::Error> {
        self.bodies.open()?.remove((source, id))?;
        if let Some(slot) = self.seals.open()?.remove((source, id))? {
            self.freed.push(slot.value());
        }
        Ok(())
    }

    /// How the transaction changed the counts so far.
    pub fn take_deltas(&mut self) -> StatusDeltas {
        std::mem::take(&mut self.deltas)
    }

    /// Adds a row's [`INBOX_STATUS`] entry, counting it.
    fn index_status(&mut self, key: (&str, u8, u64, &str), v: ()) -> Result<(), redb::Error> {
        if self.status.open()?.insert(key, v)?.is_none() {
            self.deltas.add(key.0, key.1, 1);
        }
        Ok(())
    }

    /// Removes a row's [`INBOX_STATUS`] entry, uncounting it.
    fn unindex_status(&mut self, key: (&str, u8, u64, &str)) -> Result<(), redb::Error> {
        if self.status.open()?.remove(key)?.is_some() {
            self.deltas.add(key.0, key.1, -1);
        }
        Ok(())
    }

    /// Performs one request. `head` reads the `created_at` of a stream's
    /// live head (source, stream) for the stale check of a lease.
    pub fn execute(
        &mut self,
        req: &InboxRequest,
        now: Millis,
        head: &HeadLookup<'_>,
    ) -> Result<InboxResponse, redb::Error> {
        Ok(match req {
            InboxRequest::Insert(new) => InboxResponse::Inserted(self.insert(new, now)?),
            InboxRequest::InsertRouted {
                event,
                lanes,
                known_in,
                filtered_ms,
            } => InboxResponse::Inserted(self.insert_routed(
                event,
                lanes,
                known_in,
                *filtered_ms,
                now,
            )?),
            InboxRequest::InsertSealed {
                event,
                body_bytes,
                rows,
                known_in,
                filtered_ms,
                lent: _,
            } => InboxResponse::Inserted(self.insert_sealed(
                event,
                *body_bytes,
                rows,
                known_in,
                *filtered_ms,
                now,
            )?),
            InboxRequest::Lease {
                events,
                stale_check,
            } => {
                let mut out = Leased::default();
                for (source, id, until) in events {
                    let Some(e) = self.lease(source, id, *until, now)? else {
                        continue;
                    };
                    let behind = match (stale_check, &e.stream) {
                        (Some(_), Some(stream)) if !e.force => {
                            head(source, stream)?.is_some_and(|h| e.created_at < h)
                        }
                        _ => false,
                    };
                    match stale_check {
                        Some(retention) if behind => {
                            self.settle(source, id, e.lease, &Settle::Stale, *retention, now)?;
                            out.stale.push((source.clone(), id.clone()));
                        }
                        _ => out.leased.push(LeasedEvent {
                            source: source.clone(),
                            event_id: id.clone(),
                            lease: e.lease,
                            attempts: e.attempts,
                            force: e.force,
                            replay: self.mark(source, id)?,
                        }),
                    }
                }
                InboxResponse::Leased(out)
            }
            InboxRequest::Settle {
                source,
                event_id,
                lease,
                settle,
                retention,
            } => {
                self.settle(source, event_id, *lease, settle, *retention, now)?;
                InboxResponse::Done
            }
            InboxRequest::SettleAttempt {
                source,
                event_id,
                lease,
                settle,
                attempt,
                retention,
            } => {
                self.record_attempt(source, event_id, attempt)?;
                self.settle(source, event_id, *lease, settle, *retention, now)?;
                InboxResponse::Done
            }
            InboxRequest::Redeliver { source, event_id } => {
                InboxResponse::Redelivered(self.redeliver(source, event_id, now)?)
            }
            InboxRequest::Replay {
                source,
                event_id,
                job,
            } => InboxResponse::Redelivered(self.replay(source, event_id, job, now)?),
            InboxRequest::Erase {
                source,
                event_id,
                retention_ms,
            } => InboxResponse::Erased(self.erase(source, event_id, *retention_ms, now)?),
            InboxRequest::PutJob { id, record, .. } => {
                let jobs = self.jobs.open()?;
                let before = jobs
                    .get(id.as_str())?
                    .map(|g| (job_slot(g.value().0), g.value().1));
                let cancelled = before.is_some_and(|(_, cancelled)| cancelled);
                jobs.insert(id.as_str(), (record.as_slice(), cancelled))?;
                // The version replaced, if sealed, no longer opens once
                // this batch is durable (a log replayed puts the same seal
                // again: its slot is not the one freed).
                let replaced = before.and_then(|(slot, _)| slot);
                if let Some(slot) = replaced.filter(|s| Some(*s) != job_slot(record)) {
                    self.freed.push(slot);
                }
                InboxResponse::Job(true)
            }
            InboxRequest::CancelJob { id } => {
                let jobs = self.jobs.open()?;
                let record = jobs.get(id.as_str())?.map(|g| g.value().0.to_vec());
                if let Some(record) = &record {
                    jobs.insert(id.as_str(), (record.as_slice(), true))?;
                }
                InboxResponse::Job(record.is_some())
            }
            InboxRequest::DeleteJob { id } => {
                let removed = self.jobs.open()?.remove(id.as_str())?;
                let slot = removed.as_ref().and_then(|g| job_slot(g.value().0));
                let found = removed.is_some();
                drop(removed);
                self.freed.extend(slot);
                InboxResponse::Job(found)
            }
        })
    }

    /// An event's replay mark, if it has one.
    fn mark(&mut self, source: &str, id: &str) -> Result<Option<ReplayMark>, redb::Error> {
        Ok(self.replay.open()?.get((source, id))?.map(|g| {
            let (job, base_attempts) = g.value();
            ReplayMark {
                job: job.to_owned(),
                base_attempts,
            }
        }))
    }

    /// An event's row, without its body: no write after the insert needs
    /// it.
    fn load(&mut self, source: &str, id: &str) -> Result<Option<InboxEvent>, redb::Error> {
        Ok(self
            .rows
            .open()?
            .get((source, id))?
            .map(|g| decode(source, id, g.value())))
    }

    /// Writes an event's row (not its body).
    fn save(&mut self, e: &InboxEvent) -> Result<(), redb::Error> {
        let headers = serde_json::to_string(&e.headers).unwrap_or_else(|_| "[]".into());
        self.rows.open()?.insert(
            (e.source.as_str(), e.event_id.as_str()),
            to_row(e, &headers),
        )?;
        Ok(())
    }

    /// Deletes an event's row, body (and seal) and timeline.
    fn delete(&mut self, source: &str, id: &str) -> Result<(), redb::Error> {
        self.rows.open()?.remove((source, id))?;
        self.drop_body(source, id)?;
        self.attempts.open()?.remove((source, id))?;
        self.replay.open()?.remove((source, id))?;
        Ok(())
    }

    /// Adds an attempt to the end of an event's timeline, dropping the
    /// oldest beyond [`TIMELINE_ATTEMPTS`]; nothing when the event is gone.
    fn record_attempt(
        &mut self,
        source: &str,
        id: &str,
        attempt: &Attempt,
    ) -> Result<(), redb::Error> {
        if self.rows.open()?.get((source, id))?.is_none() {
            return Ok(());
        }
        let mut timeline: Vec<(u32, u64, u16, u64, Option<String>)> = self
            .attempts
            .open()?
            .get((source, id))?
            .map(|g| {
                g.value()
                    .into_iter()
                    .map(|(n, at, status, us, error)| (n, at, status, us, error.map(str::to_owned)))
                    .collect()
            })
            .unwrap_or_default();
        timeline.push((
            attempt.attempt,
            attempt.at_ms,
            attempt.status.unwrap_or(0),
            attempt.latency_us,
            attempt.error.clone(),
        ));
        let drop = timeline.len().saturating_sub(TIMELINE_ATTEMPTS);
        let rows: Vec<AttemptRow<'_>> = timeline[drop..]
            .iter()
            .map(|(n, at, status, us, error)| (*n, *at, *status, *us, error.as_deref()))
            .collect();
        self.attempts.open()?.insert((source, id), rows)?;
        Ok(())
    }

    fn insert(&mut self, new: &NewEvent, now: Millis) -> Result<IngestOutcome, redb::Error> {
        if self.known(&new.source, &new.event_id, now)? {
            return Ok(IngestOutcome::Duplicate);
        }
        self.store_new(new, &new.source, EventStatus::Pending, 0, now)?;
        Ok(IngestOutcome::Accepted)
    }

    /// Whether event `id` is known in lane `source`: a row, or a live
    /// dedupe record. A record past its window is removed (the id is new
    /// again, and a row takes its place).
    fn known(&mut self, source: &str, id: &str, now: Millis) -> Result<bool, redb::Error> {
        let key = (source, id);
        if self.rows.open()?.get(key)?.is_some() {
            return Ok(true);
        }
        // The one lookup a new event pays for replay protection past its
        // row's reaping.
        let record = self.dedupe.open()?.get(key)?.map(|g| g.value());
        if let Some(until) = record {
            if until > now {
                return Ok(true);
            }
            self.dedupe.open()?.remove(key)?;
            self.dedupe_expiry.open()?.remove((until, key.0, key.1))?;
        }
        Ok(false)
    }

    /// Whether `new`'s id is known in any of `lanes` or in its source.
    fn known_in_any<'l>(
        &mut self,
        lanes: impl Iterator<Item = &'l String>,
        new: &'l NewEvent,
        now: Millis,
    ) -> Result<bool, redb::Error> {
        for lane in lanes.chain([&new.source]) {
            if self.known(lane, &new.event_id, now)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// See [`InboxRequest::InsertRouted`].
    fn insert_routed(
        &mut self,
        new: &NewEvent,
        lanes: &[String],
        known_in: &[String],
        filtered_ms: u64,
        now: Millis,
    ) -> Result<IngestOutcome, redb::Error> {
        if self.known_in_any(known_in.iter().chain(lanes), new, now)? {
            return Ok(IngestOutcome::Duplicate);
        }
        if lanes.is_empty() {
            let expires = now.saturating_add(filtered_ms);
            self.store_new(new, &new.source, EventStatus::Filtered, expires, now)?;
        }
        for lane in lanes {
            self.store_new(new, lane, EventStatus::Pending, 0, now)?;
        }
        Ok(IngestOutcome::Accepted)
    }

    /// See [`InboxRequest::InsertSealed`].
    fn insert_sealed(
        &mut self,
        new: &NewEvent,
        body_bytes: u64,
        rows: &[SealedRow],
        known_in: &[String],
        filtered_ms: Option<u64>,
        now: Millis,
    ) -> Result<IngestOutcome, redb::Error> {
        let lanes = rows.iter().map(|r| &r.lane);
        if self.known_in_any(known_in.iter().chain(lanes), new, now)? {
            self.freed.extend(rows.iter().map(|r| r.slot));
            return Ok(IngestOutcome::Duplicate);
        }
        let (status, expires) = match filtered_ms {
            Some(ms) => (EventStatus::Filtered, now.saturating_add(ms)),
            None => (EventStatus::Pending, 0),
        };
        let body_bytes = usize::try_from(body_bytes).unwrap_or(usize::MAX);
        for row in rows {
            let body = Body::Sealed {
                slot: row.slot,
                seal: &row.seal,
                bytes: body_bytes,
            };
            self.store(new, &row.lane, status, expires, now, body)?;
        }
        Ok(IngestOutcome::Accepted)
    }

    /// Stores `new` as a row of lane `source` with `status`: pending
    /// (queued by its stream), or settled until `expires_at_ms`.
    fn store_new(
        &mut self,
        new: &NewEvent,
        source: &str,
        status: EventStatus,
        expires_at_ms: Millis,
        now: Millis,
    ) -> Result<(), redb::Error> {
        self.store(
            new,
            source,
            status,
            expires_at_ms,
            now,
            Body::Plain(&new.body),
        )
    }

    /// [`InboxTables::store_new`] with `body`, as received or sealed.
    fn store(
        &mut self,
        new: &NewEvent,
        source: &str,
        status: EventStatus,
        expires_at_ms: Millis,
        now: Millis,
        body: Body<'_>,
    ) -> Result<(), redb::Error> {
        let e = InboxEvent {
            source: source.to_owned(),
            event_id: new.event_id.clone(),
            status,
            stream: new.stream.clone(),
            created_at: new.created_at,
            received_at_ms: new.received_at_ms,
            attempts: 0,
            due_at_ms: now,
            last_error: None,
            force: false,
            // A sealed row's are in its seal.
            headers: match body {
                Body::Plain(_) => new.headers.clone(),
                Body::Sealed { .. } => Vec::new(),
            },
            body: Vec::new(),
            expires_at_ms,
            lease: 0,
            body_bytes: match body {
                Body::Plain(b) => b.len(),
                Body::Sealed { bytes, .. } => bytes,
            },
            timeline: Vec::new(),
            replay: None,
        };
        self.save(&e)?;
        let key = (e.source.as_str(), e.event_id.as_str());
        match body {
            Body::Plain(b) => {
                self.bodies.open()?.insert(key, b)?;
            }
            Body::Sealed { slot, seal, .. } => {
                self.bodies.open()?.insert(key, seal)?;
                self.seals.open()?.insert(key, slot)?;
            }
        }
        self.index_status(
            (
                e.source.as_str(),
                e.status.to_byte(),
                e.received_at_ms,
                e.event_id.as_str(),
            ),
            (),
        )?;
        if status == EventStatus::Pending {
            self.enqueue(&e)?;
        } else {
            self.expiry.open()?.insert(
                (e.expires_at_ms, e.source.as_str(), e.event_id.as_str()),
                (),
            )?;
        }
        Ok(())
    }

    /// Makes a pending row runnable (or queued behind its stream).
    fn enqueue(&mut self, e: &InboxEvent) -> Result<(), redb::Error> {
        match &e.stream {
            None => {
                self.due
                    .open()?
                    .insert((e.source.as_str(), e.due_at_ms, e.event_id.as_str()), ())?;
            }
            Some(stream) => {
                self.queue.open()?.insert(
                    (
                        e.source.as_str(),
                        stream.as_str(),
                        e.created_at.unix_nanos(),
                        e.received_at_ms,
                        e.event_id.as_str(),
                    ),
                    (),
                )?;
                self.fix_stream(&e.source, stream)?;
            }
        }
        Ok(())
    }

    /// Takes a pending row out of the queue and due index.
    fn dequeue(&mut self, e: &InboxEvent) -> Result<(), redb::Error> {
        self.due
            .open()?
            .remove((e.source.as_str(), e.due_at_ms, e.event_id.as_str()))?;
        if let Some(stream) = &e.stream {
            self.queue.open()?.remove((
                e.source.as_str(),
                stream.as_str(),
                e.created_at.unix_nanos(),
                e.received_at_ms,
                e.event_id.as_str(),
            ))?;
            self.fix_stream(&e.source, stream)?;
        }
        Ok(())
    }

    /// Restores the due-index invariant for one stream: its first queued
    /// event is runnable, the second is not. Any write changes one queue
    /// position at most, so looking at the first two is enough.
    fn fix_stream(&mut self, source: &str, stream: &str) -> Result<(), redb::Error> {
        let firsts: Vec<String> = self
            .queue
            .open()?
            .range((source, stream, i128::MIN, 0u64, "")..)?
            .map_while(|entry| {
                let (k, _) = entry.ok()?;
                let (s, st, _, _, id) = k.value();
                (s == source && st == stream).then(|| id.to_owned())
            })
            .take(2)
            .collect();
        for (i, id) in firsts.iter().enumerate() {
            let due_at = self
                .rows
                .open()?
                .get((source, id.as_str()))?
                .map(|g| g.value().due_at_ms);
            if let Some(due_at) = due_at {
                if i == 0 {
                    self.due.open()?.insert((source, due_at, id.as_str()), ())?;
                } else {
                    self.due.open()?.remove((source, due_at, id.as_str()))?;
                }
            }
        }
        Ok(())
    }

    /// Leases a pending, runnable event until `until`; the leased row (with
    /// its new generation), or `None` when it is not runnable (settled, or
    /// queued behind an older event of its stream since the dispatcher read
    /// it).
    /// Leases a pending, runnable event that is due at `now` (a
    /// dispatcher's read may predate the settle that set a retry later).
    fn lease(
        &mut self,
        source: &str,
        id: &str,
        until: Millis,
        now: Millis,
    ) -> Result<Option<InboxEvent>, redb::Error> {
        let Some(mut e) = self.load(source, id)? else {
            return Ok(None);
        };
        if e.status != EventStatus::Pending
            || e.due_at_ms > now
            || self
                .due
                .open()?
                .remove((source, e.due_at_ms, id))?
                .is_none()
        {
            return Ok(None);
        }
        e.due_at_ms = until;
        e.lease += 1;
        self.save(&e)?;
        self.due.open()?.insert((source, until, id), ())?;
        Ok(Some(e))
    }

    fn settle(
        &mut self,
        source: &str,
        id: &str,
        lease: u64,
        settle: &Settle,
        retention: Retention,
        now: Millis,
    ) -> Result<(), redb::Error> {
        let Some(mut e) = self.load(source, id)? else {
            return Ok(());
        };
        if e.status != EventStatus::Pending || e.lease != lease {
            // A later turn (after this one's lease ran out) or a redeliver
            // owns the event now: this turn's late outcome is ignored.
            return Ok(());
        }
        let (status, attempted, error, retry_at) = match settle {
            Settle::Delivered { attempted } => (EventStatus::Delivered, *attempted, None, None),
            Settle::Stale => (EventStatus::Stale, false, None, None),
            Settle::Retry {
                retry_at,
                error,
                attempted,
            } => (
                EventStatus::Pending,
                *attempted,
                Some(error.clone()),
                Some(*retry_at),
            ),
            Settle::Dead { error } => (EventStatus::Dead, true, Some(error.clone()), None),
        };
        if attempted {
            e.attempts = e.attempts.saturating_add(1);
        }
        // An unattempted retry with no error (an event leased ahead and
        // given back) leaves the last error as it was.
        if error.as_deref().is_some_and(|e| !e.is_empty()) {
            e.last_error = error;
        } else if status == EventStatus::Delivered {
            e.last_error = None;
        }
        if let Some(retry_at) = retry_at {
            let was_runnable = self
                .due
                .open()?
                .remove((source, e.due_at_ms, id))?
                .is_some();
            e.due_at_ms = retry_at;
            self.save(&e)?;
            if was_runnable {
                self.due.open()?.insert((source, retry_at, id), ())?;
            }
            return Ok(());
        }
        self.dequeue(&e)?;
        self.unindex_status((source, e.status.to_byte(), e.received_at_ms, id))?;
        e.status = status;
        e.due_at_ms = now;
        e.expires_at_ms = now.saturating_add(match status {
            EventStatus::Dead => retention.dead_ms,
            _ => retention.delivered_ms,
        });
        self.save(&e)?;
        self.index_status((source, e.status.to_byte(), e.received_at_ms, id), ())?;
        self.expiry
            .open()?
            .insert((e.expires_at_ms, source, id), ())?;
        Ok(())
    }

    fn redeliver(
        &mut self,
        source: &str,
        id: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, redb::Error> {
        let Some(mut e) = self.load(source, id)? else {
            return Ok(RedeliverOutcome::NotFound);
        };
        if !matches!(e.status, EventStatus::Dead | EventStatus::Stale) {
            return Ok(RedeliverOutcome::NotRedeliverable(e.status));
        }
        self.unindex_status((source, e.status.to_byte(), e.received_at_ms, id))?;
        self.expiry.open()?.remove((e.expires_at_ms, source, id))?;
        // Only a stale event is delivered despite the head: the operator
        // asked for it. A dead one still yields to newer events.
        e.force = e.status == EventStatus::Stale;
        e.status = EventStatus::Pending;
        e.attempts = 0;
        self.replay.open()?.remove((source, id))?;
        e.due_at_ms = now;
        e.lease += 1;
        e.expires_at_ms = 0;
        self.save(&e)?;
        self.index_status((source, e.status.to_byte(), e.received_at_ms, id), ())?;
        self.enqueue(&e)?;
        Ok(RedeliverOutcome::Requeued)
    }

    fn replay(
        &mut self,
        source: &str,
        id: &str,
        job: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, redb::Error> {
        let Some(mut e) = self.load(source, id)? else {
            return Ok(RedeliverOutcome::NotFound);
        };
        let replayed = self.mark(source, id)?.is_some_and(|m| m.job == job);
        if replayed
            || !matches!(
                e.status,
                EventStatus::Delivered | EventStatus::Dead | EventStatus::Stale
            )
        {
            return Ok(RedeliverOutcome::NotRedeliverable(e.status));
        }
        self.unindex_status((source, e.status.to_byte(), e.received_at_ms, id))?;
        self.expiry.open()?.remove((e.expires_at_ms, source, id))?;
        // A delivered or stale event is sent again whatever the head says
        // (the operator asked for it; the head never moves back). A dead
        // one still yields to newer events, as its redeliver does.
        e.force = e.status != EventStatus::Dead;
        e.status = EventStatus::Pending;
        e.due_at_ms = now;
        e.lease += 1;
        e.expires_at_ms = 0;
        self.save(&e)?;
        self.replay
            .open()?
            .insert((source, id), (job, e.attempts))?;
        self.index_status((source, e.status.to_byte(), e.received_at_ms, id), ())?;
        self.enqueue(&e)?;
        Ok(RedeliverOutcome::Requeued)
    }

    fn erase(
        &mut self,
        source: &str,
        id: &str,
        retention_ms: u64,
        now: Millis,
    ) -> Result<EraseOutcome, redb::Error> {
        let Some(mut e) = self.load(source, id)? else {
            return Ok(EraseOutcome::NotFound);
        };
        if e.status == EventStatus::Erased {
            return Ok(EraseOutcome::AlreadyErased);
        }
        if e.status == EventStatus::Pending {
            // Out of its stream's queue: the next event of the stream is
            // runnable now; a turn in flight finds the lease moved on.
            self.dequeue(&e)?;
        } else {
            self.expiry.open()?.remove((e.expires_at_ms, source, id))?;
        }
        self.unindex_status((source, e.status.to_byte(), e.received_at_ms, id))?;
        self.drop_body(source, id)?;
        self.replay.open()?.remove((source, id))?;
        e.status = EventStatus::Erased;
        e.headers = Vec::new();
        e.body_bytes = 0;
        e.force = false;
        e.lease += 1;
        e.due_at_ms = now;
        e.expires_at_ms = now.saturating_add(retention_ms);
        self.save(&e)?;
        self.index_status((source, e.status.to_byte(), e.received_at_ms, id), ())?;
        self.expiry
            .open()?
            .insert((e.expires_at_ms, source, id), ())?;
        Ok(EraseOutcome::Erased)
    }
}
