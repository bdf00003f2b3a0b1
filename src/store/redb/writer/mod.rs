//! The single writer thread and its group commit.
//!
//! Every write goes through one bounded queue to one thread. The thread takes
//! the first waiting request, drains whatever else is already queued (up to
//! `max_batch`), runs them all in one write transaction in arrival order,
//! appends the batch to the write-ahead log, syncs the log once for the
//! whole batch ([`super::syncer`]; with one CPU on the syncer's own
//! thread, while the writer runs the next) and only then answers each
//! caller. Writes that come in while it syncs wait in the queue and make
//! the next batch, so throughput grows with concurrency instead of being
//! capped at one fsync per operation.
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
//!
//! The pieces: [`spawn`] starts the thread, whose state is a [`Writer`];
//! `run` is its loop (take writes from the queue, run them as a batch,
//! commit and checkpoint when due), `batch` the transaction it holds over
//! batches, `room` the free-space watermark and the cap on keys in memory
//! before each batch (see [`super::space`]), `reopen` the recovery after a disk fault, and `replay` the
//! checkpoints and the replay of the log (also used when the file opens).

mod batch;
mod reopen;
mod replay;
mod room;
mod run;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::Database;
use tokio::sync::{mpsc, oneshot};

use self::batch::Open;
use super::RedbOptions;
use super::engine::Shared;
use super::error::EngineError;
use super::record::Request;
use super::sync_gate::SyncGate;
use super::syncer::{self, Job, Synced, Syncer};
use super::wal::WalSync;
use super::wal_segments::Segments;
use crate::clock::Millis;
use crate::store::WriteStats;

pub use self::replay::{log_open, log_segments, replay, stored_seq};

/// A request on its way to the writer, with where to send the answer.
#[derive(Debug)]
pub enum Envelope {
    Write {
        /// What to do.
        request: Request,
        /// The caller's clock reading.
        now: Millis,
        /// Where the answer goes, after the commit.
        reply: Reply,
    },
    /// Finish what is queued before this, then stop.
    Shutdown,
    /// Answered once the writer took it from the queue, having
    /// answered everything before it: proof that it is not stuck in a
    /// commit or a sync (the watchdog asks).
    Ping(oneshot::Sender<()>),
}

pub use super::answers::Reply;

/// Counters shared between the writer and the store.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests that ran and were logged (answered once the log is synced).
    pub operations: AtomicU64,
    /// redb commits made for them (several batches may share one).
    pub commits: AtomicU64,
}

impl Counters {
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
    /// Its two segments (see [`super::wal_segments`]).
    pub segments: Segments,
    /// Sequence number of the last batch logged (or checkpointed).
    pub seq: u64,
    /// When the last checkpoint was made.
    pub checkpointed: Instant,
}

impl Logged {
    /// Whether a checkpoint is due.
    fn checkpoint_due(&self, opts: &RedbOptions) -> bool {
        let active = &self.segments.active;
        !active.is_empty()
            && (active.len() >= opts.checkpoint_bytes
                || self.checkpointed.elapsed() >= opts.checkpoint_interval)
    }

    /// Makes everything committed durable in the file, then empties the log
    /// (`closing`: for good, at a clean shutdown).
    fn checkpoint(&mut self, db: &Database, closing: bool) -> Result<(), redb::Error> {
        replay::checkpoint(db, self.seq, !closing)?;
        self.segments.reset()?;
        self.checkpointed = Instant::now();
        Ok(())
    }

    /// A checkpoint whose sync is handed to the flusher thread (`gate`):
    /// the commit returns once its pages are written, and the file's next
    /// write waits for the sync. The log goes on in its other segment,
    /// emptied first: the checkpoint before this one, which covers it, was
    /// synced (waited for here). Returns a handle that syncs the segment
    /// now appended to, and how long that wait took.
    fn checkpoint_handed_over(
        &mut self,
        db: &Database,
        gate: &SyncGate,
    ) -> Result<(WalSync, Duration), redb::Error> {
        let started = Instant::now();
        gate.wait()?;
        let waited = started.elapsed();
        gate.arm();
        let made = replay::checkpoint(db, self.seq, true);
        gate.disarm();
        made?;
        let sync = self.segments.swap()?;
        self.checkpointed = Instant::now();
        Ok((sync, waited))
    }
}

/// The writer thread: runs the loop until the queue closes or a shutdown
/// comes.
fn run(
    shared: &Arc<Shared>,
    rx: mpsc::Receiver<Envelope>,
    opts: &RedbOptions,
    counters: &Counters,
    log: Logged,
) {
    let wal = match log.segments.active.syncer() {
        Ok(wal) => wal,
        Err(e) => return refuse_all(shared, rx, &e),
    };
    let syncer = Syncer::new(wal, opts.commit_metrics.clone());
    if opts.sync_thread {
        let (jobs, thread) = match syncer::spawn(shared.clone(), syncer) {
            Ok(s) => s,
            Err(e) => return refuse_all(shared, rx, &e),
        };
        // The syncer answers what it holds once the writer (and with it
        // the queue's sender) is gone, then stops.
        Writer::new(shared, rx, opts, counters, log, Syncing::Thread(jobs)).run();
        let _ = thread.join();
    } else {
        Writer::new(shared, rx, opts, counters, log, Syncing::Inline(syncer)).run();
    }
    tracing::debug!("writer stopped");
}

/// Without a handle to sync the log, every write is refused.
fn refuse_all(shared: &Shared, mut rx: mpsc::Receiver<Envelope>, e: &std::io::Error) {
    tracing::error!(error = %e, "cannot open the log for its syncs: writes answer 503");
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
}

/// Where the writer's logged batches are synced and answered: on the
/// writer itself (measured best with two CPUs or more: the hand-off to a
/// second thread cost more than the overlap gave), or on the syncer's own
/// thread (one CPU: there the writer then runs the next batch while the
/// disk syncs, and the hand-off crosses no core). Either way a batch is
/// answered only once its log record is synced, and in order.
enum Syncing {
    Inline(Syncer),
    Thread(std::sync::mpsc::SyncSender<Job>),
}

impl Syncing {
    /// Syncs and answers `batch` (on the syncer's thread: once it is
    /// synced there).
    fn answer(&mut self, shared: &Shared, batch: Synced) {
        match self {
            Syncing::Inline(s) => s.answer(shared, batch),
            Syncing::Thread(jobs) => {
                if let Err(std::sync::mpsc::SendError(Job::Batch(lost))) =
                    jobs.send(Job::Batch(batch))
                {
                    drop(lost.lent);
                    for (reply, _) in lost.replies {
                        let _ = reply.send(Err(EngineError::DiskRefused));
                    }
                }
            }
        }
    }

    /// The log goes on in its other segment (see `Syncer::swap`).
    fn swap(&mut self, next: WalSync) -> Result<(), redb::Error> {
        match self {
            Syncing::Inline(s) => {
                s.swap(next);
                Ok(())
            }
            Syncing::Thread(jobs) => jobs
                .send(Job::Swap(next))
                .map_err(|_| redb::Error::Io(std::io::Error::other("the log's syncer stopped"))),
        }
    }

    /// The file was reopened (see `Syncer::resume`).
    fn resume(&mut self, fresh: WalSync) {
        match self {
            Syncing::Inline(s) => s.resume(fresh),
            Syncing::Thread(jobs) => {
                let _ = jobs.send(Job::Resume(fresh));
            }
        }
    }

    /// Returns once every batch handed over is answered.
    fn barrier(&mut self) {
        if let Syncing::Thread(jobs) = self {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if jobs.send(Job::Barrier(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    /// Answers the watchdog's ping once every batch handed over is.
    fn ping(&mut self, reply: oneshot::Sender<()>) {
        match self {
            Syncing::Inline(_) => {
                let _ = reply.send(());
            }
            Syncing::Thread(jobs) => {
                let _ = jobs.send(Job::Ping(reply));
            }
        }
    }
}

/// The writer thread's state from one message to the next.
struct Writer<'a> {
    /// What the store and its readers share.
    shared: &'a Shared,
    /// The queue of writes.
    rx: mpsc::Receiver<Envelope>,
    /// How the store was opened.
    opts: &'a RedbOptions,
    /// Where operations and commits are counted.
    counters: &'a Counters,
    /// Syncs the log for each logged batch and answers its callers.
    syncer: Syncing,
    /// The database; `None` while a reopen after a disk fault has not
    /// succeeded yet.
    db: Option<Arc<Database>>,
    /// The write-ahead log; `None` as `db` is.
    log: Option<Logged>,
    /// The transaction kept open over batches, if any.
    open: Option<Open>,
    /// The wait before the next reopen attempt: doubles with each failed
    /// one, up to [`REOPEN_MAX`].
    reopen_wait: Duration,
    /// Waits for the next write with a timeout while something is logged,
    /// so a quiet moment takes the checkpoint instead of the first writes
    /// after it (the queue's blocking receive has no timeout); and while a
    /// transaction is held, for the end of the hold. `None` if no timer
    /// could be started.
    timer: Option<tokio::runtime::Runtime>,
    /// How long a transaction may stay open (`storage.commit_hold`); zero
    /// without the timer, or an open transaction could wait for the next
    /// write.
    hold: Duration,
    /// Most writes in one batch (at least one).
    max_batch: usize,
    /// The writes of the batch being collected (its allocation is reused).
    batch: Vec<(Request, Millis, Reply)>,
    /// A shutdown was taken from the queue: finish the batch, checkpoint
    /// and stop.
    stopping: bool,
    /// A batch found the index at `storage.max_key_memory_bytes`, and none
    /// since below 90 % of it (logged when that turns, not per refused
    /// write nor each time the reaper makes a little room).
    keys_full: bool,
    /// No expired keys are reclaimed at the cap before this (after a
    /// reclaim that freed nothing: see `room`).
    reclaim_after: Option<Millis>,
}

impl<'a> Writer<'a> {
    fn new(
        shared: &'a Shared,
        rx: mpsc::Receiver<Envelope>,
        opts: &'a RedbOptions,
        counters: &'a Counters,
        log: Logged,
        syncer: Syncing,
    ) -> Self {
        let max_batch = opts.max_batch.max(1);
        let timer = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .inspect_err(
                |e| tracing::warn!(error = %e, "no checkpoints when idle, and a commit per batch: cannot start a timer"),
            )
            .ok();
        let hold = if timer.is_some() {
            opts.commit_hold
        } else {
            Duration::ZERO
        };
        Self {
            shared,
            rx,
            opts,
            counters,
            syncer,
            db: shared.db(),
            log: Some(log),
            open: None,
            reopen_wait: REOPEN_FIRST,
            timer,
            hold,
            max_batch,
            batch: Vec::with_capacity(max_batch),
            stopping: false,
            keys_full: false,
            reclaim_after: None,
        }
    }
}
