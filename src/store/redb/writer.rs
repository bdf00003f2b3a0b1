//! The single writer thread and its group commit.
//!
//! Every write goes through one bounded queue to one thread. The thread takes
//! the first waiting request, drains whatever else is already queued (up to
//! `max_batch`), runs them all in one write transaction in arrival order,
//! appends the batch to the write-ahead log, and hands the answers to the
//! syncer thread ([`super::syncer`]), which syncs the log and only then
//! answers each caller. While one batch's record is syncing, the writer
//! already runs the next, so throughput grows with concurrency instead of
//! being capped at one fsync per operation.
//!
//! The transaction stays open for the next batches until it is
//! `storage.commit_hold` old (20 ms by default), then it is committed to
//! redb without a sync: a commit's fixed cost (tables opened, roots and
//! checksums written) is paid once for all of them, which is most of the
//! writer's time when batches are small. It is committed at once when a
//! read needs what it holds (see [`super::watermark`]), before a
//! checkpoint, and before stopping. If a batch fails, the transaction is
//! dropped and the batches before it run again in a fresh one.
//!
//! Invariant: no caller is answered `Ok` before its write is durable (in the
//! synced log, or in a durable commit); if the batch fails, every caller in
//! it gets the error and nothing in it took effect (the transaction is
//! dropped, and a log record of a failed batch is cut off — or, after a
//! failed sync, left out of the replay when the file is reopened). A batch
//! answered `Ok` is never undone: if its transaction cannot be committed,
//! the file is reopened and the log replayed.
//!
//! Disk faults: after a commit fails with an I/O error (a full or failing
//! disk), redb refuses every later write until the file is reopened. The
//! writer then marks the store unhealthy (writes answer `Unavailable` at
//! once, `/readyz` fails), and reopens the file — waiting out readers,
//! closing it, opening it again and proving it with a durable probe
//! commit — every few seconds until that works. What was committed before
//! the fault is all there: only committed data is ever acknowledged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableDatabase, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::counts::StatusDeltas;
use super::error::{EngineError, is_disk_fault};
use super::faults::FaultPlan;
use super::kv_index::KvIndex;
use super::ops::{Response, Tables};
use super::record::{Batch, Request};
use super::syncer::{self, Job, Synced};
use super::tables::{META, META_WAL_SEQ};
use super::wal::{self, Wal};
use super::{RedbOptions, Shared, open_db};
use crate::clock::Millis;
use crate::store::WriteStats;

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
        reply: oneshot::Sender<Result<Response, EngineError>>,
    },
    /// Finish what is queued before this, then stop.
    Shutdown,
    /// Answered once the writer took it from the queue and the syncer has
    /// answered everything before it: proof that neither is stuck in a
    /// commit or a sync (the watchdog asks).
    Ping(oneshot::Sender<()>),
}

/// Counters shared between the writer and the store.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests that ran and were logged (answered once the log is synced).
    pub operations: AtomicU64,
    /// redb commits made for them (several batches may share one).
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
    shared: &Arc<Shared>,
    mut rx: mpsc::Receiver<Envelope>,
    opts: &RedbOptions,
    counters: &Counters,
    log: Logged,
) {
    let started = log
        .wal
        .syncer()
        .and_then(|sync| syncer::spawn(shared.clone(), sync, opts.commit_metrics.clone(), 64));
    let (jobs, syncer) = match started {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the log's syncer thread: writes answer 503");
            shared.set_unhealthy();
            while let Some(env) = rx.blocking_recv() {
                match env {
                    Envelope::Write { reply, .. } => {
                        let _ = reply.send(Err(EngineError::DiskRefused));
                    }
                    Envelope::Ping(_) => {}
                    Envelope::Shutdown => return,
                }
            }
            return;
        }
    };
    write_loop(shared, &mut rx, opts, counters, log, &jobs);
    // The syncer answers what it holds, then stops.
    drop(jobs);
    let _ = syncer.join();
    tracing::debug!("writer stopped");
}

fn write_loop(
    shared: &Shared,
    rx: &mut mpsc::Receiver<Envelope>,
    opts: &RedbOptions,
    counters: &Counters,
    log: Logged,
    jobs: &SyncSender<Job>,
) {
    let max_batch = opts.max_batch.max(1);
    let mut db = shared.db();
    let mut log = Some(log);
    let mut batch = Vec::with_capacity(max_batch);
    let mut stopping = false;
    // The transaction kept open over batches, and for how long at most.
    let mut open: Option<Open> = None;
    let mut reopen_wait = REOPEN_FIRST;
    // Waits for the next write with a timeout while something is logged,
    // so a quiet moment takes the checkpoint instead of the first writes
    // after it (the queue's blocking receive has no timeout).
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .inspect_err(
            |e| tracing::warn!(error = %e, "no checkpoints when idle, and a commit per batch: cannot start a timer"),
        )
        .ok();
    // Without the timer an open transaction could wait for the next write.
    let hold = if idle.is_some() {
        opts.commit_hold
    } else {
        Duration::ZERO
    };
    while !stopping {
        if !shared.is_healthy() {
            open = None;
            match recover(shared, &mut db, opts, &mut log, jobs) {
                Ok(()) => reopen_wait = REOPEN_FIRST,
                Err(()) => {
                    // Refuse what waits, then try again a little later.
                    let deadline = Instant::now() + reopen_wait;
                    reopen_wait = (reopen_wait * 2).min(REOPEN_MAX);
                    let tried = Instant::now();
                    while Instant::now() < deadline {
                        // A read waits for the file: try again soon.
                        if tried.elapsed() >= REOPEN_FIRST
                            && shared.reopen_wanted.swap(false, Ordering::SeqCst)
                        {
                            break;
                        }
                        loop {
                            match rx.try_recv() {
                                Ok(Envelope::Write { reply, .. }) => {
                                    let _ = reply.send(Err(EngineError::DiskRefused));
                                }
                                Ok(Envelope::Ping(reply)) => {
                                    let _ = jobs.send(Job::Ping(reply));
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
        if commit_due(&open, hold, shared) {
            commit_open(shared, counters, &mut open);
        }
        let logged = log.as_ref().is_some_and(|l| !l.wal.is_empty());
        let first = match (&idle, &open) {
            (Some(rt), Some(o)) => match rx.try_recv() {
                Ok(env) => Some(env),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Holding a transaction: the next write, a read that
                    // wants it committed, or the end of the hold.
                    let until = tokio::time::Instant::from_std(o.since + hold);
                    let wait = async {
                        tokio::select! {
                            env = rx.recv() => Some(env),
                            () = shared.watermark.commit_asked() => None,
                            () = tokio::time::sleep_until(until) => None,
                        }
                    };
                    match rt.block_on(wait) {
                        Some(env) => env,
                        None => {
                            commit_open(shared, counters, &mut open);
                            continue;
                        }
                    }
                }
            },
            (Some(rt), None) if logged => match rx.try_recv() {
                Ok(env) => Some(env),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // The timer is made inside: it needs the runtime.
                    let wait =
                        async { tokio::time::timeout(opts.checkpoint_idle, rx.recv()).await };
                    match rt.block_on(wait) {
                        Ok(env) => env,
                        Err(_) => {
                            if let (Some(db), Some(l)) = (&db, log.as_mut()) {
                                checkpoint_now(shared, db, l, opts, "idle");
                            }
                            continue;
                        }
                    }
                }
            },
            _ => rx.blocking_recv(),
        };
        let Some(first) = first else {
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
                    let _ = jobs.send(Job::Ping(reply));
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
        // The syncer may have found a failed sync while this batch was
        // collected: its batches (and what ran after them) must be gone
        // before this one runs, so the file is reopened first.
        if !batch.is_empty() && !shared.is_healthy() {
            open = None;
            if recover(shared, &mut db, opts, &mut log, jobs).is_err() {
                for (_, _, reply) in batch.drain(..) {
                    let _ = reply.send(Err(EngineError::DiskRefused));
                }
            }
        }
        if !batch.is_empty() {
            let started = Instant::now();
            let (ops, replies): (Vec<_>, Vec<_>) = batch
                .drain(..)
                .map(|(request, now, reply)| ((now, request), reply))
                .unzip();
            let result = match (&db, log.as_mut()) {
                (Some(db), Some(log)) => {
                    run_batch(db, log, ops, shared, &mut open, opts.faults.as_deref())
                }
                _ => Err(redb::Error::PreviousIo),
            };
            // Committed now when a checkpoint or the stop needs it, when a
            // read waits for it, or when the transaction is old enough;
            // otherwise it stays open for the next batch.
            let result = result.and_then(|ran| {
                let due = stopping
                    || log.as_ref().is_some_and(|l| l.checkpoint_due(opts))
                    || commit_due(&open, hold, shared);
                if due && let (Some(log), Some(o)) = (log.as_mut(), open.take()) {
                    commit(shared, counters, o).inspect_err(|_| {
                        // Logged but not applied: cut the record, or a
                        // replay would apply what was refused. The
                        // batches before it in the transaction were
                        // answered (or will be): the reopen replays them.
                        let _ = log.wal.cut_to(ran.logged_at);
                    })?;
                }
                Ok(ran)
            });
            match result {
                Ok(ran) => {
                    shared.counts.apply(ran.deltas);
                    counters
                        .operations
                        .fetch_add(replies.len() as u64, Ordering::Relaxed);
                    let job = Job::Batch(Synced {
                        seq: ran.seq,
                        started,
                        replies: replies.into_iter().zip(ran.responses).collect(),
                    });
                    if let Err(std::sync::mpsc::SendError(Job::Batch(lost))) = jobs.send(job) {
                        for (reply, _) in lost.replies {
                            let _ = reply.send(Err(EngineError::DiskRefused));
                        }
                    }
                }
                Err(e) if is_disk_fault(&e) => {
                    tracing::error!(error = %e, batch = replies.len(), "the data file cannot be written: writes answer 503 until it can again");
                    shared.healthy.store(false, Ordering::SeqCst);
                    open = None;
                    for reply in replies {
                        let _ = reply.send(Err(EngineError::DiskRefused));
                    }
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, batch = replies.len(), "write transaction failed");
                    let err = EngineError::from(e);
                    for reply in replies {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
        }
        // A checkpoint when due, and always before stopping, so a clean
        // shutdown leaves an empty log.
        if let (Some(db), Some(l)) = (&db, log.as_mut())
            && (stopping || l.checkpoint_due(opts))
        {
            commit_open(shared, counters, &mut open);
            if shared.is_healthy() {
                checkpoint_now(shared, db, l, opts, if stopping { "stop" } else { "due" });
            }
        }
    }
    commit_open(shared, counters, &mut open);
}

/// Makes everything committed durable in the file and empties the log; a
/// failure marks the store unhealthy (writes answer 503 until the file is
/// reopened). `why` is for the log line.
fn checkpoint_now(shared: &Shared, db: &Database, log: &mut Logged, opts: &RedbOptions, why: &str) {
    let started = Instant::now();
    match log.checkpoint(db) {
        // Everything committed is durable in the file now.
        Ok(()) => {
            shared.watermark.synced(log.seq);
            let took = started.elapsed();
            opts.commit_metrics
                .checkpoint_seconds
                .record(took.as_secs_f64());
            tracing::debug!(ms = took.as_millis() as u64, why, "checkpoint");
        }
        Err(e) => {
            tracing::error!(error = %e, "checkpoint failed: writes answer 503 until the data file can be written");
            shared.healthy.store(false, Ordering::SeqCst);
        }
    }
}

/// The writer's write transaction, kept open over several batches until it
/// is committed (see `storage.commit_hold`). Each batch in it is logged;
/// the syncer answers its callers once the log is synced, commit or not.
struct Open {
    /// The transaction.
    tx: WriteTransaction,
    /// When its first batch ran.
    since: Instant,
    /// The number of its first batch.
    first: u64,
    /// Its batches in order, as logged: run again in a fresh transaction
    /// when a later batch fails and the transaction has to be dropped.
    batches: Vec<Vec<(Millis, Request)>>,
}

impl Open {
    fn begin(db: &Database, first: u64) -> Result<Self, redb::Error> {
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::None)
            .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
        Ok(Self {
            tx,
            since: Instant::now(),
            first,
            batches: Vec::new(),
        })
    }

    /// The number of its last batch.
    fn last(&self) -> u64 {
        self.first + self.batches.len() as u64 - 1
    }
}

/// Whether the open transaction is due for its commit: it is `hold` old,
/// or a read waits for it (that request is taken either way).
fn commit_due(open: &Option<Open>, hold: Duration, shared: &Shared) -> bool {
    let wanted = shared.watermark.take_commit_wanted();
    open.as_ref()
        .is_some_and(|o| wanted || o.since.elapsed() >= hold)
}

/// A batch that ran and was logged.
struct Ran {
    /// Its number.
    seq: u64,
    /// Each request's answer.
    responses: Vec<Response>,
    /// Inbox counts it moved.
    deltas: StatusDeltas,
    /// Where its log record begins.
    logged_at: u64,
}

/// Commits the open transaction, if any. A failure marks the store
/// unhealthy: its batches are logged (and answered once synced), so the
/// reopen replays them.
fn commit_open(shared: &Shared, counters: &Counters, open: &mut Option<Open>) {
    if let Some(o) = open.take()
        && let Err(e) = commit(shared, counters, o)
    {
        tracing::error!(error = %e, "the data file cannot be written: writes answer 503 until it can again");
        shared.set_unhealthy();
    }
}

/// Commits `open` without a sync (its batches are in the log). If that
/// fails, the keyspace index keeps their changes: its batches before the
/// last are answered (or will be) and must stay visible; the caller marks
/// the store unhealthy, and the reopen rebuilds the index from the file and
/// the log (a read that saw the last batch waits for its sync, which comes
/// only if it is replayed).
fn commit(shared: &Shared, counters: &Counters, open: Open) -> Result<(), redb::Error> {
    let last = open.last();
    // Readers that see these batches wait for their sync (see `syncer`).
    shared.watermark.show(last);
    match open.tx.commit() {
        Ok(()) => {
            shared.kv.keep();
            shared.watermark.committed(last);
            counters.commits.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => {
            // A reader may have taken one of these batches' numbers as one
            // it has to wait for; the reopen that follows tells it to retry.
            Err(redb::Error::Io(std::io::Error::other(format!(
                "the commit failed: {e}"
            ))))
        }
    }
}

/// Runs a batch in the open transaction (begun if there is none) and logs
/// it; the syncer syncs the record. On an error nothing in the batch took
/// effect: the transaction is dropped, and the batches before it in the
/// transaction run again in a fresh one (if that fails too, the error is
/// a disk fault and the reopen replays them from the log).
fn run_batch(
    db: &Database,
    log: &mut Logged,
    ops: Vec<(Millis, Request)>,
    shared: &Shared,
    open: &mut Option<Open>,
    faults: Option<&FaultPlan>,
) -> Result<Ran, redb::Error> {
    let seq = log.seq + 1;
    let mut o = match open.take() {
        Some(o) => o,
        None => Open::begin(db, seq)?,
    };
    let logged_at = log.wal.len();
    match run_logged(&o.tx, log, seq, &ops, &shared.kv, faults) {
        Ok((responses, deltas)) => {
            log.seq = seq;
            o.batches.push(ops);
            *open = Some(o);
            Ok(Ran {
                seq,
                responses,
                deltas,
                logged_at,
            })
        }
        Err(e) => {
            let Open {
                tx,
                since,
                first,
                batches,
            } = o;
            drop(tx);
            if shared.kv.rollback(!batches.is_empty()) {
                shared.watermark.abandoned();
            }
            if !batches.is_empty() {
                // If this fails too, keyspace readers wait until the reopen
                // rebuilds the map.
                *open = Some(redo(db, &shared.kv, since, first, batches).map_err(|again| {
                    redb::Error::Io(std::io::Error::other(format!(
                        "a batch failed ({e}), and running the ones before it again failed too: {again}"
                    )))
                })?);
                shared.kv.redone();
            }
            Err(e)
        }
    }
}

/// Runs batch `seq` in `tx` and logs it.
fn run_logged(
    tx: &WriteTransaction,
    log: &mut Logged,
    seq: u64,
    ops: &[(Millis, Request)],
    kv: &KvIndex,
    faults: Option<&FaultPlan>,
) -> Result<(Vec<Response>, StatusDeltas), redb::Error> {
    let (responses, deltas) = apply(tx, kv, seq, ops)?;
    if faults.is_some_and(FaultPlan::trip_batch) {
        return Err(redb::Error::Corrupted(
            "injected fault: the batch failed".into(),
        ));
    }
    let refs: Vec<(Millis, &Request)> = ops.iter().map(|(now, r)| (*now, r)).collect();
    log.wal.append(seq, &refs)?;
    Ok((responses, deltas))
}

/// Runs batch `seq`'s requests in `tx` and records it as the last batch the
/// file holds.
fn apply(
    tx: &WriteTransaction,
    kv: &KvIndex,
    seq: u64,
    ops: &[(Millis, Request)],
) -> Result<(Vec<Response>, StatusDeltas), redb::Error> {
    let mut tables = Tables::open(tx, kv, seq)?;
    let mut responses = Vec::with_capacity(ops.len());
    for (now, request) in ops {
        responses.push(tables.execute(request, *now)?);
    }
    tables.set_wal_seq(seq)?;
    Ok((responses, tables.finish()?))
}

/// A fresh transaction holding `batches` (numbered from `first`) again,
/// after a later batch failed and the one that held them was dropped.
fn redo(
    db: &Database,
    kv: &KvIndex,
    since: Instant,
    first: u64,
    batches: Vec<Vec<(Millis, Request)>>,
) -> Result<Open, redb::Error> {
    let mut o = Open::begin(db, first)?;
    o.since = since;
    for (seq, ops) in (first..).zip(&batches) {
        // Their inbox counts were taken when they first ran.
        let _ = apply(&o.tx, kv, seq, ops)?;
    }
    o.batches = batches;
    Ok(o)
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

/// The last write-ahead-log batch the file holds.
pub fn stored_seq(db: &Database) -> Result<u64, redb::Error> {
    let tx = db.begin_read()?;
    let meta = tx.open_table(META)?;
    Ok(meta.get(META_WAL_SEQ)?.map_or(0, |g| g.value()))
}

/// Builds the keyspace index `kv` from the file, then applies the logged
/// batches the file does not hold yet (those after its `wal_seq`), in
/// order, each as it ran; then a checkpoint makes them durable. Returns
/// the sequence number of the last batch.
pub fn replay(db: &Database, kv: &KvIndex, batches: Vec<Batch>) -> Result<u64, redb::Error> {
    replay_up_to(db, kv, batches, u64::MAX)
}

/// [`replay`], leaving out batches after `last` (ones that were refused).
fn replay_up_to(
    db: &Database,
    kv: &KvIndex,
    batches: Vec<Batch>,
    last: u64,
) -> Result<u64, redb::Error> {
    let mut seq = stored_seq(db)?;
    kv.rebuild(db, seq)?;
    let mut replayed = 0usize;
    let durable = seq;
    for batch in batches
        .into_iter()
        .filter(|b| b.seq > durable && b.seq <= last)
    {
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::None)
            .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
        // The counts are taken once the file is ready.
        let _ = apply(&tx, kv, batch.seq, &batch.ops)?;
        tx.commit()?;
        kv.keep();
        seq = batch.seq;
        replayed += 1;
    }
    checkpoint(db, seq)?;
    if replayed > 0 {
        tracing::info!(batches = replayed, "replayed the write-ahead log");
    }
    Ok(seq)
}

/// Reopens the file after a fault ([`reopen`]) and marks it writable.
fn recover(
    shared: &Shared,
    db: &mut Option<Arc<Database>>,
    opts: &RedbOptions,
    log: &mut Option<Logged>,
    jobs: &SyncSender<Job>,
) -> Result<(), ()> {
    match reopen(shared, db, opts, log, jobs) {
        Ok(()) => {
            shared.healthy.store(true, Ordering::SeqCst);
            tracing::info!("data file writable again: writes resume");
            Ok(())
        }
        Err(e) => {
            tracing::debug!(error = %e, "data file still cannot be written");
            Err(())
        }
    }
}

/// Closes the faulty database (once readers let go of it), opens the file
/// again, replays the log onto it and proves it with a durable commit.
fn reopen(
    shared: &Shared,
    db: &mut Option<Arc<Database>>,
    opts: &RedbOptions,
    log: &mut Option<Logged>,
    jobs: &SyncSender<Job>,
) -> Result<(), redb::Error> {
    // Once the syncer has answered everything handed to it, the batches
    // answered `Ok` are exactly those up to the watermark's durable one.
    let (done, wait) = std::sync::mpsc::sync_channel(1);
    if jobs.send(Job::Barrier(done)).is_ok() {
        let _ = wait.recv();
    }
    let acknowledged = shared.watermark.durable();
    // Commits after the last answered batch must not survive the close.
    if let Ok(refuse) = shared.refuse.lock() {
        refuse.store(true, Ordering::SeqCst);
    }
    // Readers wait (up to their deadline) from here until the file is back.
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
    let refuse = Arc::new(AtomicBool::new(false));
    let fresh = open_db(opts, refuse.clone())?;
    if let Ok(mut current) = shared.refuse.lock() {
        *current = refuse;
    }
    // The same file, so the same id: a log refused now was replaced under
    // the running process, and the file stays closed until it is fixed.
    let (mut wal, batches) = Wal::open(
        wal::path_for(&opts.path),
        opts.faults.clone(),
        stored_seq(&fresh)?,
        super::migrate::stored_file_id(&fresh)?,
        true,
    )
    .map_err(|e| match e {
        wal::LogError::Io(e) => redb::Error::Io(e),
        other => redb::Error::Corrupted(format!("write-ahead log: {other}")),
    })?;
    let seq = replay_up_to(&fresh, &shared.kv, batches, acknowledged)?;
    wal.reset()?;
    shared.counts.recount(&fresh)?;
    let _ = jobs.send(Job::Resume(wal.syncer()?));
    // The file first, then the epoch: a read that sees the new epoch finds
    // the file open (one that took the file with the old epoch runs again).
    let fresh = Arc::new(fresh);
    shared.set_db(Some(fresh.clone()));
    shared.watermark.reopened(seq);
    *db = Some(fresh);
    *log = Some(Logged {
        wal,
        seq,
        checkpointed: Instant::now(),
    });
    Ok(())
}
