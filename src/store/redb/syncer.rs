//! The log's sync, on its own thread, so the writer runs the next batch
//! while the last one's log record goes to disk.
//!
//! The writer logs a batch (written, not synced), commits it to redb
//! without a sync, and hands its answers here. This thread syncs the log
//! once for everything handed over since its last sync, then answers: no
//! caller hears `Ok` before its batch's record is on disk.
//!
//! Readers must not see what is not durable either (an ingest answered
//! "duplicate" from a batch lost in a crash would lose the event): the
//! [`Watermark`] says which batch readers may see and which is on disk, and
//! every read waits until what it saw is on disk.
//!
//! After a failed sync, every later batch is refused until the writer has
//! reopened the file; the reopened file holds exactly the batches that were
//! answered `Ok` (the log is replayed up to the last one synced).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::{oneshot, watch};

use super::wal::WalSync;
use super::{CommitMetrics, Shared, disk_unavailable};
use crate::store::StoreError;
use crate::store::redb::ops::Response;

/// Batches readers may see, and batches on disk.
#[derive(Debug)]
pub struct Watermark {
    /// The last batch readers may see: set just before its commit, so a read
    /// transaction that sees a batch finds it here when it looks afterwards.
    visible: AtomicU64,
    /// (epoch, the last batch on disk). The epoch grows when the writer
    /// undoes a batch a read may have seen (see `kv_index`), and when it
    /// reopens the file: the batches not on disk are gone then.
    durable: watch::Sender<(u64, u64)>,
}

impl Watermark {
    /// A file whose batches up to `seq` are on disk.
    pub fn new(seq: u64) -> Self {
        Self {
            visible: AtomicU64::new(seq),
            durable: watch::Sender::new((0, seq)),
        }
    }

    /// Batch `seq` is about to be committed: readers may see it from now.
    pub fn show(&self, seq: u64) {
        self.visible.store(seq, Ordering::SeqCst);
    }

    /// Batches up to `seq` are on disk.
    pub fn synced(&self, seq: u64) {
        self.durable.send_if_modified(|(_, d)| {
            let moved = seq > *d;
            *d = (*d).max(seq);
            moved
        });
    }

    /// The file was reopened holding batches up to `seq`, all on disk.
    pub fn reopened(&self, seq: u64) {
        self.visible.store(seq, Ordering::SeqCst);
        self.durable.send_modify(|(e, d)| {
            *e += 1;
            *d = seq;
        });
    }

    /// A batch a read may have seen was undone (it failed before its
    /// commit): reads waiting now run again.
    pub fn abandoned(&self) {
        self.durable.send_modify(|(e, _)| *e += 1);
    }

    /// The last batch on disk.
    pub fn durable(&self) -> u64 {
        self.durable.borrow().1
    }

    /// The epoch: take it before a read transaction begins.
    pub fn epoch(&self) -> u64 {
        self.durable.borrow().0
    }

    /// The last batch a read transaction that has begun may see.
    pub fn visible(&self) -> u64 {
        self.visible.load(Ordering::SeqCst)
    }

    /// Waits until the file is reopened after `epoch` (true), or until
    /// `deadline` (false).
    pub async fn reopened_since(&self, epoch: u64, deadline: tokio::time::Instant) -> bool {
        let mut rx = self.durable.subscribe();
        matches!(
            tokio::time::timeout_at(deadline, rx.wait_for(|(e, _)| *e != epoch)).await,
            Ok(Ok(_))
        )
    }

    /// Waits until batch `seq` of `epoch` is on disk; `Unavailable` when
    /// the file was reopened meanwhile (what the read saw may be gone), or
    /// at `deadline` (a failed sync leaves the batch unsynced until the
    /// file is reopened).
    pub async fn wait(
        &self,
        epoch: u64,
        seq: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), StoreError> {
        let reached = |(e, d): &(u64, u64)| *e != epoch || *d >= seq;
        let mut rx = self.durable.subscribe();
        let now = match tokio::time::timeout_at(deadline, rx.wait_for(reached)).await {
            Ok(Ok(v)) => *v,
            Ok(Err(_)) | Err(_) => return Err(disk_unavailable()),
        };
        if now.0 == epoch {
            Ok(())
        } else {
            Err(StoreError::Unavailable(
                "the data file was reopened after a disk fault while this was read; retry".into(),
            ))
        }
    }
}

/// A batch committed to redb, waiting for its log record's sync.
#[derive(Debug)]
pub struct Synced {
    /// Its sequence number.
    pub seq: u64,
    /// When the writer took it from the queue.
    pub started: Instant,
    /// Each caller and its answer.
    pub replies: Vec<(oneshot::Sender<Result<Response, StoreError>>, Response)>,
}

/// What the writer hands over, answered in order.
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
    /// The file was reopened: sync this log from now on and accept batches
    /// again.
    Resume(WalSync),
}

/// Starts the thread.
pub fn spawn(
    shared: Arc<Shared>,
    wal: WalSync,
    metrics: CommitMetrics,
    capacity: usize,
) -> std::io::Result<(SyncSender<Job>, JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(capacity.max(1));
    let handle = std::thread::Builder::new()
        .name("dedupd-syncer".into())
        .spawn(move || run(&shared, &rx, wal, &metrics))?;
    Ok((tx, handle))
}

fn run(shared: &Shared, rx: &Receiver<Job>, mut wal: WalSync, metrics: &CommitMetrics) {
    let mut failed = false;
    let mut waiting: Vec<Synced> = Vec::new();
    while let Ok(first) = rx.recv() {
        for job in std::iter::once(first).chain(rx.try_iter()) {
            match job {
                Job::Batch(b) => waiting.push(b),
                other => {
                    answer(shared, &wal, metrics, &mut failed, &mut waiting);
                    match other {
                        Job::Ping(reply) => {
                            let _ = reply.send(());
                        }
                        Job::Barrier(reply) => {
                            let _ = reply.send(());
                        }
                        Job::Resume(fresh) => {
                            wal = fresh;
                            failed = false;
                        }
                        Job::Batch(_) => unreachable!("batches are collected above"),
                    }
                }
            }
        }
        answer(shared, &wal, metrics, &mut failed, &mut waiting);
    }
    tracing::debug!("syncer stopped");
}

/// Syncs the log once for every waiting batch, then answers them all.
fn answer(
    shared: &Shared,
    wal: &WalSync,
    metrics: &CommitMetrics,
    failed: &mut bool,
    waiting: &mut Vec<Synced>,
) {
    let Some(last) = waiting.last().map(|b| b.seq) else {
        return;
    };
    if !*failed {
        match wal.sync() {
            Ok(()) => shared.watermark.synced(last),
            Err(e) => {
                tracing::error!(error = %e, "the write-ahead log cannot be synced: writes answer 503 until the data file can be written");
                *failed = true;
                shared.set_unhealthy();
            }
        }
    }
    for batch in waiting.drain(..) {
        if *failed {
            for (reply, _) in batch.replies {
                let _ = reply.send(Err(disk_unavailable()));
            }
            continue;
        }
        metrics
            .seconds
            .record(batch.started.elapsed().as_secs_f64());
        metrics.batch_size.record(batch.replies.len() as f64);
        for (reply, response) in batch.replies {
            // A caller that went away no longer needs its answer; its write
            // is durable all the same.
            let _ = reply.send(Ok(response));
        }
    }
}
