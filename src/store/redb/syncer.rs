//! The log's sync: by the writer itself for each batch, as Redis's
//! `appendfsync always` is made by its one thread, or, with one CPU, on a
//! thread of its own.
//!
//! The writer logs a batch (written, not synced), runs it in its redb
//! transaction (committed without a sync, now or a little later), then
//! syncs the log once for it and answers its callers: no caller hears
//! `Ok` before its batch's record is on disk. Writes that come in while
//! the sync runs wait in the writer's queue and make the next batch: the
//! group commit. With two CPUs or more this is measured best: the
//! hand-off to a second thread, which let the writer run the next batch
//! meanwhile, cost 11 to 20 % more CPU per claim and a third more context
//! switches, at a lower rate. With one CPU ([`spawn`], the default when
//! the process may use only one) the overlap of the disk's sync with the
//! next batch is all the parallelism there is and the hand-off crosses no
//! core; there the writer syncing itself let each pipelined Redis-protocol
//! write wake it and preempt its sender, one context switch a write
//! (docs/performance.md).
//!
//! Readers must not see what is not durable either (an ingest answered
//! "duplicate" from a batch lost in a crash would lose the event): the
//! [`super::watermark::Watermark`] says which batch readers may see and
//! which is on disk, and every read waits until what it saw is on disk.
//!
//! After a failed sync, every later batch is refused until the writer has
//! reopened the file; the reopened file holds exactly the batches that were
//! answered `Ok` (the log is replayed up to the last one synced).

use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use super::CommitMetrics;
use super::answers::{self, Mailbox, Reply};
use super::engine::Shared;
use super::error::EngineError;
use super::ops::Response;
use super::record::LoggedLent;
use super::wal::WalSync;

/// A batch that ran and was logged, waiting for its log record's sync.
#[derive(Debug)]
pub struct Synced {
    /// Its sequence number.
    pub seq: u64,
    /// When the writer took it from the queue.
    pub started: Instant,
    /// Each caller and its answer.
    pub replies: Vec<(Reply, Response)>,
    /// Key slots it freed: retired once it is synced, before anyone is
    /// answered (an erasure then shreds them, see `seal`).
    pub freed: Vec<u64>,
    /// The key slots its inserts' seals were lent: kept once it is
    /// synced, retired if it is refused (their rows are then never stored).
    pub lent: Vec<LoggedLent>,
}

/// The writer's handle on the log's sync.
#[derive(Debug)]
pub struct Syncer {
    /// The segment appended to.
    wal: WalSync,
    metrics: CommitMetrics,
    /// A sync failed: every batch is refused until [`Syncer::resume`].
    failed: bool,
    /// The mailboxes a batch's answers were posted to (kept for its
    /// allocation).
    posted: Vec<Arc<Mailbox>>,
    /// The batch being answered (kept for its allocation: one a batch on
    /// the writer).
    one: Vec<Synced>,
}

impl Syncer {
    pub fn new(wal: WalSync, metrics: CommitMetrics) -> Self {
        Self {
            wal,
            metrics,
            failed: false,
            posted: Vec::new(),
            one: Vec::with_capacity(1),
        }
    }

    /// The file was reopened: sync this log from now on and accept
    /// batches again.
    pub fn resume(&mut self, fresh: WalSync) {
        self.wal = fresh;
        self.failed = false;
    }

    /// The writer went on in the log's other segment (see
    /// [`super::wal_segments`]): every batch before is synced in the old
    /// one already.
    pub fn swap(&mut self, next: WalSync) {
        self.wal = next;
    }

    /// Syncs the log for `batch`, then answers its callers; after a
    /// failed sync (this one or one before the file was reopened), with
    /// [`EngineError::DiskRefused`].
    pub fn answer(&mut self, shared: &Shared, batch: Synced) {
        let mut one = std::mem::take(&mut self.one);
        one.push(batch);
        self.answer_all(shared, &mut one);
        self.one = one;
    }

    /// Syncs the log once for every batch in `waiting`, then answers them
    /// all, in order.
    fn answer_all(&mut self, shared: &Shared, waiting: &mut Vec<Synced>) {
        let Some(last) = waiting.last().map(|b| b.seq) else {
            return;
        };
        if !self.failed {
            match self.wal.sync() {
                Ok(()) => {
                    shared.watermark.synced(last);
                    shared.seals.retire(
                        waiting
                            .iter_mut()
                            .flat_map(|b| std::mem::take(&mut b.freed)),
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "the write-ahead log cannot be synced: writes answer 503 until the data file can be written");
                    self.failed = true;
                    shared.set_unhealthy();
                }
            }
        }
        for batch in waiting.drain(..) {
            if self.failed {
                // Dropped: held.
                drop(batch.lent);
                for (reply, _) in batch.replies {
                    let _ = reply.send(Err(EngineError::DiskRefused));
                }
                continue;
            }
            batch.lent.into_iter().for_each(LoggedLent::keep);
            self.metrics
                .seconds
                .record(batch.started.elapsed().as_secs_f64());
            self.metrics.batch_size.record(batch.replies.len() as f64);
            // A caller that went away no longer needs its answer; its
            // write is durable all the same. Callers on a worker thread
            // with a mailbox are woken once a thread (see `answers`).
            for (reply, response) in batch.replies {
                reply.post(Ok(response), &mut self.posted);
            }
        }
        answers::wake(&mut self.posted);
    }
}

/// What the writer hands to the syncer's own thread, done in order.
#[derive(Debug)]
pub enum Job {
    /// Answer these callers once the log is synced.
    Batch(Synced),
    /// Answered once everything handed over before is answered: the
    /// watchdog's proof that syncs return.
    Ping(oneshot::Sender<()>),
    /// Like `Ping`, for the writer, which waits for it before reopening
    /// the file (so it knows which batches were answered `Ok`).
    Barrier(SyncSender<()>),
    /// See [`Syncer::resume`].
    Resume(WalSync),
    /// See [`Syncer::swap`].
    Swap(WalSync),
}

/// Runs `syncer` on a thread of its own, for a machine with one CPU: the
/// writer runs the next batch while the last one's sync waits for the
/// disk, the only overlap one CPU has, and the hand-off between the two
/// threads crosses no core. Each sync covers every batch handed over
/// since the last.
pub fn spawn(
    shared: Arc<Shared>,
    mut syncer: Syncer,
) -> std::io::Result<(SyncSender<Job>, JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(64);
    let handle = std::thread::Builder::new()
        .name("dedupd-syncer".into())
        .spawn(move || {
            let mut waiting = Vec::new();
            while let Ok(first) = rx.recv() {
                for job in std::iter::once(first).chain(rx.try_iter()) {
                    if let Job::Batch(b) = job {
                        waiting.push(b);
                        continue;
                    }
                    syncer.answer_all(&shared, &mut waiting);
                    match job {
                        Job::Ping(reply) => {
                            let _ = reply.send(());
                        }
                        Job::Barrier(reply) => {
                            let _ = reply.send(());
                        }
                        Job::Resume(fresh) => syncer.resume(fresh),
                        Job::Swap(next) => syncer.swap(next),
                        Job::Batch(_) => unreachable!("collected above"),
                    }
                }
                syncer.answer_all(&shared, &mut waiting);
            }
            tracing::debug!("syncer stopped");
        })?;
    Ok((tx, handle))
}
