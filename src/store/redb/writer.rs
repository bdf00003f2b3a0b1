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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use redb::{Database, Durability};
use tokio::sync::{mpsc, oneshot};

use super::ops::{Request, Response, Tables};
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

/// Starts the writer thread.
pub fn spawn(
    db: Arc<Database>,
    queue_capacity: usize,
    max_batch: usize,
    counters: Arc<Counters>,
) -> std::io::Result<(mpsc::Sender<Envelope>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(queue_capacity.max(1));
    let handle = std::thread::Builder::new()
        .name("dedupd-writer".into())
        .spawn(move || run(&db, rx, max_batch.max(1), &counters))?;
    Ok((tx, handle))
}

fn run(db: &Database, mut rx: mpsc::Receiver<Envelope>, max_batch: usize, counters: &Counters) {
    let mut batch = Vec::with_capacity(max_batch);
    let mut stopping = false;
    while !stopping {
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
        let result = commit(db, &batch);
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
