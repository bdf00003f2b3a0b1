//! The log's sync, on its own thread, so the writer runs the next batch
//! while the last one's log record goes to disk.
//!
//! The writer logs a batch (written, not synced), runs it in its redb
//! transaction (committed without a sync, now or a little later), and
//! hands its answers here. This thread syncs the log
//! once for everything handed over since its last sync, then answers: no
//! caller hears `Ok` before its batch's record is on disk.
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
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use super::CommitMetrics;
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
    pub replies: Vec<(oneshot::Sender<Result<Response, EngineError>>, Response)>,
    /// Key slots it freed: retired once it is synced, before anyone is
    /// answered (an erasure then shreds them, see `seal`).
    pub freed: Vec<u64>,
    /// The key slots its inserts' seals were lent: kept once it is
    /// synced, retired if it is refused (their rows are then never stored).
    pub lent: Vec<LoggedLent>,
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
    /// The writer went on in the log's other segment (see
    /// [`super::wal_segments`]): the batches before this are synced in the
    /// old one, those after in this one.
    Swap(WalSync),
}

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
                        Job::Swap(next) => wal = next,
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
                *failed = true;
                shared.set_unhealthy();
            }
        }
    }
    for batch in waiting.drain(..) {
        if *failed {
            // Dropped: held.
            drop(batch.lent);
            for (reply, _) in batch.replies {
                let _ = reply.send(Err(EngineError::DiskRefused));
            }
            continue;
        }
        batch.lent.into_iter().for_each(LoggedLent::keep);
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
