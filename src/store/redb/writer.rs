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
//! Invariant: no caller is answered `Ok` before its write is durable (in the
//! synced log, or in a durable commit); if the batch fails, every caller in
//! it gets the error and nothing in it took effect (the transaction is
//! dropped, and a log record of a failed batch is cut off).
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

use redb::{Database, Durability, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use super::counts::StatusDeltas;
use super::ops::{Request, Response, Tables};
use super::tables::{META, META_WAL_SEQ};
use super::wal::{self, Batch, Wal};
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
    /// Answered as soon as the writer takes it from the queue: proof that
    /// it is not stuck in a commit (the watchdog asks).
    Ping(oneshot::Sender<()>),
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
    log: Logged,
) -> std::io::Result<(mpsc::Sender<Envelope>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(opts.queue_capacity.max(1));
    let handle = std::thread::Builder::new()
        .name("dedupd-writer".into())
        .spawn(move || run(&shared, rx, &opts, &counters, log))?;
    Ok((tx, handle))
}

/// The write-ahead log and where it stands.
#[derive(Debug)]
pub struct Logged {
    /// The log file.
    pub wal: Wal,
    /// Sequence number of the last batch logged (or checkpointed).
    pub seq: u64,
    /// When the last checkpoint was made.
    pub checkpointed: Instant,
}

impl Logged {
    /// Whether a checkpoint is due.
    fn checkpoint_due(&self, opts: &RedbOptions) -> bool {
        !self.wal.is_empty()
            && (self.wal.len() >= opts.checkpoint_bytes
                || self.checkpointed.elapsed() >= opts.checkpoint_interval)
    }

    /// Makes everything committed durable in the file, then empties the log.
    fn checkpoint(&mut self, db: &Database) -> Result<(), redb::Error> {
        checkpoint(db, self.seq)?;
        self.wal.reset()?;
        self.checkpointed = Instant::now();
        Ok(())
    }
}

fn run(
    shared: &Shared,
    mut rx: mpsc::Receiver<Envelope>,
    opts: &RedbOptions,
    counters: &Counters,
    log: Logged,
) {
    let max_batch = opts.max_batch.max(1);
    let mut db = shared.db();
    let mut log = Some(log);
    let mut batch = Vec::with_capacity(max_batch);
    let mut stopping = false;
    let mut reopen_wait = REOPEN_FIRST;
    while !stopping {
        if !shared.is_healthy() {
            match reopen(shared, &mut db, opts, &mut log) {
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
                                Ok(Envelope::Ping(reply)) => {
                                    let _ = reply.send(());
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
                Envelope::Ping(reply) => {
                    let _ = reply.send(());
                }
                Envelope::Shutdown => {
                    stopping = true;
                    break;
                }
            }
            if batch.len() >= max_batch {
                break;
            }
        }
        if !batch.is_empty() {
            let started = Instant::now();
            let result = match (&db, log.as_mut()) {
                (Some(db), Some(log)) => commit(db, log, &batch),
                _ => Err(redb::Error::PreviousIo),
            };
            match result {
                Ok((responses, deltas)) => {
                    shared.counts.apply(deltas);
                    opts.commit_metrics
                        .seconds
                        .record(started.elapsed().as_secs_f64());
                    opts.commit_metrics.batch_size.record(batch.len() as f64);
                    // Only committed batches count, so operations per
                    // commit is what group commit achieved.
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
                    continue;
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
        // A checkpoint when due, and always before stopping, so a clean
        // shutdown leaves an empty log.
        if let (Some(db), Some(l)) = (&db, log.as_mut())
            && (stopping || l.checkpoint_due(opts))
            && let Err(e) = l.checkpoint(db)
        {
            tracing::error!(error = %e, "checkpoint failed: writes answer 503 until the data file can be written");
            shared.healthy.store(false, Ordering::SeqCst);
        }
    }
    tracing::debug!("writer stopped");
}

/// Runs a batch in one transaction, logs it, then commits without a sync.
fn commit(
    db: &Database,
    log: &mut Logged,
    batch: &[Pending],
) -> Result<(Vec<Response>, StatusDeltas), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::None)
        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    let mut responses = Vec::with_capacity(batch.len());
    let deltas;
    {
        let mut tables = Tables::open(&tx)?;
        for (request, now, _) in batch {
            responses.push(tables.execute(request, *now)?);
        }
        tables.set_wal_seq(log.seq + 1)?;
        deltas = tables.finish()?;
    }
    let ops: Vec<(Millis, &Request)> = batch.iter().map(|(r, now, _)| (*now, r)).collect();
    let before = log.wal.len();
    // Dropping `tx` on an error aborts it: nothing took effect.
    log.wal.append(log.seq + 1, &ops)?;
    if let Err(e) = tx.commit() {
        // Logged but not applied: cut the record, or a replay would apply
        // what was refused.
        let _ = log.wal.cut_to(before);
        return Err(e.into());
    }
    log.seq += 1;
    Ok((responses, deltas))
}

/// A durable commit recording that the file holds every batch up to `seq`.
pub fn checkpoint(db: &Database, seq: u64) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    {
        let mut meta = tx.open_table(META)?;
        meta.insert(META_WAL_SEQ, seq)?;
    }
    tx.commit()?;
    Ok(())
}

/// Applies the logged batches the file does not hold yet (those after its
/// `wal_seq`), in order, each as it ran; then a checkpoint makes them
/// durable. Returns the sequence number of the last batch.
pub fn replay(db: &Database, batches: Vec<Batch>) -> Result<u64, redb::Error> {
    let mut seq = {
        let tx = db.begin_read()?;
        let meta = tx.open_table(META)?;
        meta.get(META_WAL_SEQ)?.map_or(0, |g| g.value())
    };
    let mut replayed = 0usize;
    let durable = seq;
    for batch in batches.into_iter().filter(|b| b.seq > durable) {
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::None)
            .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
        {
            let mut tables = Tables::open(&tx)?;
            for (now, request) in &batch.ops {
                tables.execute(request, *now)?;
            }
            tables.set_wal_seq(batch.seq)?;
            // The counts are taken once the file is ready.
            let _ = tables.finish()?;
        }
        tx.commit()?;
        seq = batch.seq;
        replayed += 1;
    }
    checkpoint(db, seq)?;
    if replayed > 0 {
        tracing::info!(batches = replayed, "replayed the write-ahead log");
    }
    Ok(seq)
}

/// Closes the faulty database (once readers let go of it), opens the file
/// again, replays the log onto it and proves it with a durable commit.
fn reopen(
    shared: &Shared,
    db: &mut Option<Arc<Database>>,
    opts: &RedbOptions,
    log: &mut Option<Logged>,
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
    // Non-durable commits went with the old handle; the log has them all.
    *log = None;
    let fresh = open_db(opts)?;
    let (mut wal, batches) = Wal::open(wal::path_for(&opts.path), opts.faults.clone())?;
    let seq = replay(&fresh, batches)?;
    wal.reset()?;
    shared.counts.recount(&fresh)?;
    let fresh = Arc::new(fresh);
    shared.set_db(Some(fresh.clone()));
    *db = Some(fresh);
    *log = Some(Logged {
        wal,
        seq,
        checkpointed: Instant::now(),
    });
    Ok(())
}

type Pending = (
    Request,
    Millis,
    oneshot::Sender<Result<Response, StoreError>>,
);
