//! The single writer thread and its group commit.
//!
//! Every write goes through one bounded queue to one thread. The thread takes
//! the first waiting request, drains whatever else is already queued (up to
//! `max_batch`), runs them all in one write transaction in arrival order,
//! commits with `Durability::Immediate`, and only then answers each caller.
//! While one commit is syncing, new requests pile up and share the next
//! commit, so throughput grows with concurrency instead of being capped at one
//! fsync per operation.
//!
//! Invariant: no caller is answered `Ok` before the commit that holds its
//! write is durable; if the transaction fails, every caller in the batch gets
//! the error and nothing in the batch took effect.
//!
//! Disk faults: after a commit fails with an I/O error (a full or failing
//! disk), redb refuses every later write until the file is reopened. The
//! writer then marks the store unhealthy (writes answer `Unavailable` at
//! once, `/readyz` fails), and reopens the file — waiting out readers,
//! closing it, opening it again and proving it with a durable probe
//! commit — every few seconds until that works. What was committed before
//! the fault is all there: only committed data is ever acknowledged.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Database, Durability};
use tokio::sync::{mpsc, oneshot};

use super::ops::{Request, Response, Tables};
use super::tables::{META, META_SCHEMA_VERSION, SCHEMA_VERSION};
use super::{RedbOptions, Shared, disk_unavailable, is_disk_fault, open_db};
use crate::clock::Millis;
use crate::store::{StoreError, WriteStats};

/// A request on its way to the writer, with where to send the answer.
#[derive(Debug)]
pub enum Envelope {
    /// One write.
    Write {
        /// What to do.
        request: Request,
        /// The caller's clock reading.
        now: Millis,
        /// Where the answer goes, after the commit.
        reply: oneshot::Sender<Result<Response, StoreError>>,
    },
    /// Finish what is queued before this, then stop.
    Shutdown,
}

/// Counters shared between the writer and the store.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests answered after a successful commit.
    pub operations: AtomicU64,
    /// Commits made.
    pub commits: AtomicU64,
}

impl Counters {
    /// A snapshot.
    pub fn snapshot(&self) -> WriteStats {
        WriteStats {
            operations: self.operations.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
        }
    }
}

/// First wait between attempts to reopen a faulty data file.
const REOPEN_FIRST: Duration = Duration::from_millis(200);
/// Longest wait between those attempts.
const REOPEN_MAX: Duration = Duration::from_secs(5);

/// Starts the writer thread.
pub fn spawn(
    shared: Arc<Shared>,
    opts: RedbOptions,
    counters: Arc<Counters>,
) -> std::io::Result<(mpsc::Sender<Envelope>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(opts.queue_capacity.max(1));
    let handle = std::thread::Builder::new()
        .name("dedupd-writer".into())
        .spawn(move || run(&shared, rx, &opts, &counters))?;
    Ok((tx, handle))
}

fn run(shared: &Shared, mut rx: mpsc::Receiver<Envelope>, opts: &RedbOptions, counters: &Counters) {
    let max_batch = opts.max_batch.max(1);
    let mut db = shared.db();
    let mut batch = Vec::with_capacity(max_batch);
    let mut stopping = false;
    let mut reopen_wait = REOPEN_FIRST;
    while !stopping {
        if !shared.is_healthy() {
            match reopen(shared, &mut db, opts) {
                Ok(()) => {
                    shared.healthy.store(true, Ordering::SeqCst);
                    reopen_wait = REOPEN_FIRST;
                    tracing::info!("data file writable again: writes resume");
                }
                Err(e) => {
                    tracing::debug!(error = %e, "data file still cannot be written");
                    // Refuse what waits, then try again a little later.
                    let deadline = Instant::now() + reopen_wait;
                    reopen_wait = (reopen_wait * 2).min(REOPEN_MAX);
                    while Instant::now() < deadline {
                        loop {
                            match rx.try_recv() {
                                Ok(Envelope::Write { reply, .. }) => {
                                    let _ = reply.send(Err(disk_unavailable()));
                                }
                                Ok(Envelope::Shutdown)
                                | Err(mpsc::error::TryRecvError::Disconnected) => return,
                                Err(mpsc::error::TryRecvError::Empty) => break,
                            }
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    continue;
                }
            }
        }
        let Some(first) = rx.blocking_recv() else {
            break;
        };
        for env in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match env {
                Envelope::Write {
                    request,
                    now,
                    reply,
                } => batch.push((request, now, reply)),
                Envelope::Shutdown => {
                    stopping = true;
                    break;
                }
            }
            if batch.len() >= max_batch {
                break;
            }
        }
        if batch.is_empty() {
            continue;
        }
        let result = match &db {
            Some(db) => commit(db, &batch),
            None => Err(redb::Error::PreviousIo),
        };
        match result {
            Ok(responses) => {
                // Only committed batches count, so operations per commit
                // is what group commit achieved.
                counters
                    .operations
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                counters.commits.fetch_add(1, Ordering::Relaxed);
                for ((_, _, reply), response) in batch.drain(..).zip(responses) {
                    // A caller that went away no longer needs its answer;
                    // its write is committed all the same.
                    let _ = reply.send(Ok(response));
                }
            }
            Err(e) if is_disk_fault(&e) => {
                tracing::error!(error = %e, batch = batch.len(), "the data file cannot be written: writes answer 503 until it can again");
                shared.healthy.store(false, Ordering::SeqCst);
                for (_, _, reply) in batch.drain(..) {
                    let _ = reply.send(Err(disk_unavailable()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = batch.len(), "write transaction failed");
                let err = StoreError::Failed(e.to_string());
                for (_, _, reply) in batch.drain(..) {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
    tracing::debug!("writer stopped");
}

/// Closes the faulty database (once readers let go of it), opens the file
/// again and proves it with a durable commit.
fn reopen(
    shared: &Shared,
    db: &mut Option<Arc<Database>>,
    opts: &RedbOptions,
) -> Result<(), redb::Error> {
    // Readers get `Unavailable` from here until the file is back.
    let old = shared.set_db(None).or_else(|| db.take());
    *db = None;
    if let Some(mut old) = old {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Arc::try_unwrap(old) {
                Ok(d) => {
                    drop(d);
                    break;
                }
                Err(still) if Instant::now() < deadline => {
                    old = still;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(still) => {
                    // A reader holds on: try again on the next attempt.
                    shared.set_db(Some(still));
                    return Err(redb::Error::PreviousIo);
                }
            }
        }
    }
    let fresh = open_db(opts)?;
    probe(&fresh)?;
    let fresh = Arc::new(fresh);
    shared.set_db(Some(fresh.clone()));
    *db = Some(fresh);
    Ok(())
}

/// A durable commit that writes a page: the disk takes writes and syncs.
fn probe(db: &Database) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    {
        let mut meta = tx.open_table(META)?;
        meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(())
}

type Pending = (
    Request,
    Millis,
    oneshot::Sender<Result<Response, StoreError>>,
);

fn commit(db: &Database, batch: &[Pending]) -> Result<Vec<Response>, redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    let mut responses = Vec::with_capacity(batch.len());
    {
        let mut tables = Tables::open(&tx)?;
        for (request, now, _) in batch {
            responses.push(tables.execute(request, *now)?);
        }
        tables.finish()?;
    }
    tx.commit()?;
    Ok(responses)
}
