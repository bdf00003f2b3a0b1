//! The gateway inbox in the data file: the [`Inbox`] handle over the
//! engine. Its writes go through the writer like every other write; its
//! counts by status are kept in memory (see `counts`), so a summary never
//! scans the inbox.
//!
//! - `write`: the inbox's writes in the writer's transaction, and the
//!   invariants every one of them keeps between the inbox's tables (its
//!   `purge`: the reaper's deletions);
//! - `read`: the reads (due events, listings, lookups, the dedupe check);
//! - `row`: an event to and from its row.

mod read;
mod row;
mod write;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redb::ReadableDatabase;

pub use self::read::{InboxIndexes, any_sealed_job, next_dedupe_expiry, sealed_slots, sources};
pub use self::write::{InboxResponse, InboxTables};
use super::engine::{Engine, Fresh};
use super::error::EngineError;
use super::ops::Response;
use super::record::{InboxRequest, Lent, Request, SealedRow};
use super::seal::Seals;
use crate::clock::Millis;
use crate::domain::{CreatedAt, ScopedKey};
use crate::store::StoreError;
use crate::store::inbox::{
    Attempt, Cursor, DiskSpace, EraseOutcome, EventKey, EventStatus, Inbox, InboxEvent,
    IngestOutcome, KeysInMemory, Leased, ListOrder, NewEvent, RedeliverOutcome, ReplayState,
    Retention, Settle, SourceDue, SourceSummary, StoredJob,
};

/// The inbox in the data file; a handle on its engine (cheap to clone).
#[derive(Debug, Clone)]
pub struct RedbInbox {
    engine: Arc<Engine>,
}

impl RedbInbox {
    /// The inbox of the file `engine` has open.
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    async fn write(&self, request: InboxRequest, now: Millis) -> Result<InboxResponse, StoreError> {
        match self.engine.write(Request::Inbox(request), now).await? {
            Response::Inbox(r) => Ok(r),
            _ => Err(EngineError::Unexpected("an inbox write").into()),
        }
    }

    /// Every inbox table as stored, for consistency checks in tests (it
    /// reads the whole inbox).
    #[doc(hidden)]
    pub async fn inbox_indexes(&self) -> Result<InboxIndexes, StoreError> {
        Ok(self.engine.read_sealed(read::indexes).await?)
    }

    /// Stores `event` in each of `lanes` (with `filtered_ms`, the one lane
    /// is its source's, as filtered), each row with its own seal, unless
    /// its id is known in any of `known_in` or the lanes.
    async fn insert(
        &self,
        mut event: NewEvent,
        lanes: Vec<String>,
        known_in: Vec<String>,
        filtered_ms: Option<u64>,
        now: Millis,
    ) -> Result<IngestOutcome, StoreError> {
        let headers = std::mem::take(&mut event.headers);
        let body = std::mem::take(&mut event.body);
        let body_bytes = body.len() as u64;
        let seals = self.engine.shared.seals.clone();
        // A seal is a lent slot and a few µs of AES; growing the key file
        // (once per thousand seals) syncs it: off the async threads.
        let sealed = match seal_each_now(&seals, &lanes, &headers, &body) {
            Some(sealed) => sealed,
            None => {
                let seals = seals.clone();
                tokio::task::spawn_blocking(move || seal_each(&seals, lanes, &headers, &body))
                    .await
                    .map_err(|e| EngineError::ReadTask(Arc::new(e)))?
            }
        }
        .map_err(|e| self.engine.key_fault(e))?;
        let lent = Lent::new(seals, sealed.iter().map(|r| r.slot).collect());
        let request = InboxRequest::InsertSealed {
            event: Box::new(event),
            body_bytes,
            rows: sealed,
            known_in,
            filtered_ms,
            lent,
        };
        match self.write(request, now).await? {
            InboxResponse::Inserted(o) => Ok(o),
            _ => Err(EngineError::Unexpected("insert").into()),
        }
    }
}

/// [`seal_each`] with clean slots there now; `None` (nothing lent) when
/// one is missing.
fn seal_each_now(
    seals: &Seals,
    lanes: &[String],
    headers: &[(String, String)],
    body: &[u8],
) -> Option<std::io::Result<Vec<SealedRow>>> {
    let mut rows: Vec<SealedRow> = Vec::with_capacity(lanes.len());
    for lane in lanes {
        match seals.seal_now(headers, body) {
            Some(Ok((slot, seal))) => rows.push(SealedRow {
                lane: lane.clone(),
                slot,
                seal,
            }),
            failed => {
                seals.retire(rows.iter().map(|r| r.slot));
                return failed.map(|r| r.map(|_| Vec::new()));
            }
        }
    }
    Some(Ok(rows))
}

/// A row per lane, each sealed under a slot of its own; on an error the
/// slots lent so far are retired.
fn seal_each(
    seals: &Seals,
    lanes: Vec<String>,
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<Vec<SealedRow>> {
    let mut rows = Vec::with_capacity(lanes.len());
    for lane in lanes {
        match seals.seal(headers, body) {
            Ok((slot, seal)) => rows.push(SealedRow { lane, slot, seal }),
            Err(e) => {
                seals.retire(rows.iter().map(|r| r.slot));
                return Err(e);
            }
        }
    }
    Ok(rows)
}

/// Reads of the jobs' records before one that does not open is taken for
/// one whose key is gone (see `Inbox::jobs`): each read again commits the
/// batches synced before it, so only a new version of the same record,
/// synced and shredded in the microseconds between, makes it miss again.
const JOB_READS: u32 = 16;

#[async_trait]
impl Inbox for RedbInbox {
    async fn ingest(&self, event: NewEvent, now: Millis) -> Result<IngestOutcome, StoreError> {
        let lanes = vec![event.source.clone()];
        self.insert(event, lanes, Vec::new(), None, now).await
    }

    async fn ingest_routed(
        &self,
        event: NewEvent,
        lanes: Vec<String>,
        known_in: Vec<String>,
        filtered_ms: u64,
        now: Millis,
    ) -> Result<IngestOutcome, StoreError> {
        if lanes.is_empty() {
            let own = vec![event.source.clone()];
            return self
                .insert(event, own, known_in, Some(filtered_ms), now)
                .await;
        }
        self.insert(event, lanes, known_in, None, now).await
    }

    async fn knows_event(&self, event: &EventKey, now: Millis) -> Result<bool, StoreError> {
        // What the file shows, not what was acknowledged: that would make
        // the writer commit its open transaction at once, and anyone who
        // captured one signed request could repeat it to take group commit
        // away from every write. An event this misses (its insert is in the
        // writer's open transaction) is found again by the insert itself,
        // which answers `duplicate` the same way.
        let (source, id) = (event.source.clone(), event.event_id.clone());
        Ok(self
            .engine
            .read_seen(Fresh::Shown, move |db, shared| {
                let tx = db.begin_read()?;
                let seen = shared.watermark.visible();
                read::known(&tx, &source, &id, now).map(|known| (known, seen))
            })
            .await?)
    }

    fn dedupe_window(&self) -> Duration {
        self.engine.dedupe_window()
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Ok(self.engine.ready().await?)
    }

    fn disk_space(&self) -> Option<DiskSpace> {
        let (free_bytes, min_free_bytes) = self.engine.space_now();
        Some(DiskSpace {
            free_bytes,
            min_free_bytes,
        })
    }

    fn keys_in_memory(&self) -> Option<KeysInMemory> {
        Some(self.engine.keys_in_memory())
    }

    async fn lease(
        &self,
        events: Vec<(EventKey, Millis)>,
        stale_check: Option<Retention>,
        now: Millis,
    ) -> Result<Leased, StoreError> {
        let request = InboxRequest::Lease {
            events: events
                .into_iter()
                .map(|(e, until)| (e.source, e.event_id, until))
                .collect(),
            stale_check,
        };
        match self.write(request, now).await? {
            InboxResponse::Leased(l) => Ok(l),
            _ => Err(EngineError::Unexpected("lease").into()),
        }
    }

    async fn settle(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let request = InboxRequest::Settle {
            source: event.source.clone(),
            event_id: event.event_id.clone(),
            lease,
            settle,
            retention,
        };
        self.write(request, now).await.map(|_| ())
    }

    async fn settle_attempt(
        &self,
        event: &EventKey,
        lease: u64,
        settle: Settle,
        attempt: Attempt,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let request = InboxRequest::SettleAttempt {
            source: event.source.clone(),
            event_id: event.event_id.clone(),
            lease,
            settle,
            attempt,
            retention,
        };
        self.write(request, now).await.map(|_| ())
    }

    async fn settle_delivered(
        &self,
        event: &EventKey,
        lease: u64,
        apply: Option<(ScopedKey, ScopedKey, CreatedAt, u64)>,
        attempt: Option<Attempt>,
        retention: Retention,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (source, event_id) = (event.source.clone(), event.event_id.clone());
        let settle = Settle::Delivered { attempted: true };
        let settle = match attempt {
            Some(attempt) => InboxRequest::SettleAttempt {
                source,
                event_id,
                lease,
                settle,
                attempt,
                retention,
            },
            None => InboxRequest::Settle {
                source,
                event_id,
                lease,
                settle,
                retention,
            },
        };
        let request = Request::Delivered {
            apply,
            settle: Box::new(settle),
        };
        match self.engine.write(request, now).await? {
            Response::Inbox(_) => Ok(()),
            _ => Err(EngineError::Unexpected("a delivered settle").into()),
        }
    }

    async fn redeliver(
        &self,
        source: &str,
        event_id: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        let request = InboxRequest::Redeliver {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
        };
        match self.write(request, now).await? {
            InboxResponse::Redelivered(o) => Ok(o),
            _ => Err(EngineError::Unexpected("redeliver").into()),
        }
    }

    async fn replay(
        &self,
        source: &str,
        event_id: &str,
        job: &str,
        now: Millis,
    ) -> Result<RedeliverOutcome, StoreError> {
        let request = InboxRequest::Replay {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
            job: job.to_owned(),
        };
        match self.write(request, now).await? {
            InboxResponse::Redelivered(o) => Ok(o),
            _ => Err(EngineError::Unexpected("replay").into()),
        }
    }

    async fn erase(
        &self,
        source: &str,
        event_id: &str,
        retention_ms: u64,
        now: Millis,
    ) -> Result<EraseOutcome, StoreError> {
        let request = InboxRequest::Erase {
            source: source.to_owned(),
            event_id: event_id.to_owned(),
            retention_ms,
        };
        let outcome = match self.write(request, now).await? {
            InboxResponse::Erased(o) => o,
            _ => return Err(EngineError::Unexpected("erase").into()),
        };
        // Answered once its key is shredded too; and an erasure answered
        // before (whose caller went away before the shred) is made good.
        if outcome != EraseOutcome::NotFound {
            self.engine.shred().await?;
        }
        Ok(outcome)
    }

    /// Sealed under a slot of its own (see `InboxRequest::PutJob`): the
    /// version it replaces no longer opens once its slot is shredded, at
    /// the store's next shred (an erasure's, a job's end or delete): not
    /// a key-file sync at each of a running job's writes.
    async fn put_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError> {
        let id = id.to_owned();
        let seals = self.engine.shared.seals.clone();
        let sealed = match seals.seal_now(&[], &record) {
            Some(sealed) => sealed,
            None => {
                let seals = seals.clone();
                tokio::task::spawn_blocking(move || seals.seal(&[], &record))
                    .await
                    .map_err(|e| EngineError::ReadTask(Arc::new(e)))?
            }
        }
        .map_err(|e| self.engine.key_fault(e))?;
        let (slot, record) = sealed;
        let lent = Lent::new(seals, vec![slot]);
        self.write(InboxRequest::PutJob { id, record, lent }, now)
            .await
            .map(drop)
    }

    /// Every version is sealed: every one before no longer opens once
    /// this answers (their slots shredded).
    async fn end_job(&self, id: &str, record: Vec<u8>, now: Millis) -> Result<(), StoreError> {
        self.put_job(id, record, now).await?;
        self.engine.shred().await?;
        Ok(())
    }

    async fn cancel_job(&self, id: &str, now: Millis) -> Result<bool, StoreError> {
        let id = id.to_owned();
        match self.write(InboxRequest::CancelJob { id }, now).await? {
            InboxResponse::Job(found) => Ok(found),
            _ => Err(EngineError::Unexpected("a job's cancel").into()),
        }
    }

    async fn delete_job(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.write(InboxRequest::DeleteJob { id }, now).await?;
        self.engine.shred().await?;
        Ok(())
    }

    async fn replay_states(
        &self,
        source: &str,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<ReplayState>>, StoreError> {
        let source = source.to_owned();
        Ok(self
            .engine
            .read(move |tx| read::replay_states(tx, &source, &event_ids))
            .await?)
    }

    async fn jobs(&self) -> Result<Vec<StoredJob>, StoreError> {
        // A version its runner replaces while the read opens it is
        // shredded only after (`unshredded`). One replaced by a batch
        // synced (its slot retired, maybe shredded) but not yet committed
        // does not open: read again, the batch is committed first (an
        // acknowledged read) and the new version seen.
        let mut tries = 0;
        loop {
            tries += 1;
            let (jobs, unopened) = self
                .engine
                .read_seen(Fresh::Acknowledged, |db, shared| {
                    shared.seals.unshredded(|| {
                        let tx = db.begin_read()?;
                        let seen = shared.watermark.visible();
                        read::jobs(&tx, &shared.seals).map(|read| (read, seen))
                    })
                })
                .await?;
            if unopened.is_empty() {
                return Ok(jobs);
            }
            if tries == JOB_READS {
                // Once per job and process: the list is read every second
                // by a console that shows it.
                static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
                let mut warned = WARNED
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for (job, error) in unopened {
                    if !warned.contains(&job) {
                        tracing::warn!(job = %job, error = %error, "a bulk job's record does not open (its key file is not the one it was sealed with): it is not listed");
                        warned.push(job);
                    }
                }
                return Ok(jobs);
            }
        }
    }

    async fn purge_pending(
        &self,
        sources: Vec<String>,
        before: Millis,
        limit: u64,
        now: Millis,
    ) -> Result<u64, StoreError> {
        let request = Request::PurgePending {
            sources,
            before,
            limit,
        };
        let purged = match self.engine.write(request, now).await? {
            Response::Purged(n) => n,
            _ => return Err(EngineError::Unexpected("purge of pending events").into()),
        };
        self.engine.shred().await?;
        Ok(purged)
    }

    async fn due_events(
        &self,
        now: Millis,
        wants: Vec<(String, usize)>,
        max_bytes: u64,
    ) -> Result<Vec<SourceDue>, StoreError> {
        Ok(self
            .engine
            .read_sealed(move |tx, seals| read::due(tx, seals, now, &wants, max_bytes))
            .await?)
    }

    async fn inbox_sources(&self) -> Result<Vec<(String, u64)>, StoreError> {
        Ok(self.engine.read(read::sources).await?)
    }

    /// Counts by status come from memory, and one index read per source
    /// finds its oldest pending event.
    async fn inbox_summary(&self) -> Result<Vec<SourceSummary>, StoreError> {
        let counts = self.engine.shared.counts.snapshot();
        let summary = self.engine.read(move |tx| {
            let mut out = Vec::with_capacity(counts.len());
            for (source, c) in &counts {
                let oldest_pending_ms = if c[0] > 0 {
                    read::oldest_pending(tx, source)?
                } else {
                    None
                };
                out.push(SourceSummary {
                    pending: c[0],
                    delivered: c[1],
                    stale: c[2],
                    dead: c[3],
                    erased: c[4],
                    filtered: c[5],
                    oldest_pending_ms,
                    source: source.clone(),
                });
            }
            Ok(out)
        });
        Ok(summary.await?)
    }

    async fn has_source(&self, source: &str) -> Result<bool, StoreError> {
        let source = source.to_owned();
        Ok(self
            .engine
            .read(move |tx| read::has_source(tx, &source))
            .await?)
    }

    async fn inbox_event(
        &self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<InboxEvent>, StoreError> {
        let (source, id) = (source.to_owned(), event_id.to_owned());
        let read = move || {
            let (source, id) = (source.clone(), id.clone());
            self.engine
                .read_sealed(move |tx, seals| read::get(tx, seals, &source, &id))
        };
        match read().await {
            // Its key was shredded after the read began (erased or reaped
            // meanwhile): a fresh read shows what it is now.
            Err(EngineError::Redb(e)) if matches!(&*e, redb::Error::Corrupted(m) if m.starts_with(row::SEAL_CLOSED)) => {
                Ok(read().await?)
            }
            other => Ok(other?),
        }
    }

    async fn inbox_bodies(
        &self,
        source: &str,
        event_ids: Vec<String>,
    ) -> Result<Vec<Option<InboxEvent>>, StoreError> {
        let source = source.to_owned();
        Ok(self
            .engine
            .read_sealed(move |tx, seals| read::bodies(tx, seals, &source, &event_ids))
            .await?)
    }

    async fn list_events(
        &self,
        source: &str,
        status: EventStatus,
        order: ListOrder,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<(Vec<InboxEvent>, Option<Cursor>), StoreError> {
        let source = source.to_owned();
        let list = move |tx: &redb::ReadTransaction| {
            read::list(tx, &source, status, order, after.clone(), limit)
        };
        Ok(self.engine.read(list).await?)
    }

    async fn writer_responds(&self, within: Duration) -> bool {
        self.engine.writer_responds(within).await
    }
}
