//! The engine: one redb file, one writer thread with group commit, reads
//! on read transactions that never wait for the writer. The handles
//! ([`super::RedbStore`], [`super::RedbInbox`], [`super::Keyspace`]) turn
//! their calls into its writes and reads.
//!
//! redb's API is blocking. Writes run on the writer thread
//! ([`super::writer`]); reads run on tokio's blocking pool, and no read
//! transaction is held across an `.await` (a read transaction pins pages
//! and would make the file grow). A read shows nothing that is not on disk,
//! and everything acknowledged ([`super::watermark`]); it waits out a
//! reopen of the file after a disk fault.
//!
//! Opening (and the open errors) is in [`super::open`].

use super::space::Space;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use redb::{Database, ReadTransaction, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use super::counts::StatusCounts;
use super::error::{EngineError, is_disk_fault};
use super::flusher::Flusher;
use super::kv_index::{KvIndex, Space as KeySpace};
use super::ops::Response;
use super::record::Request;
use super::seal::Seals;
use super::sync_gate::SyncGate;
use super::tables::META;
use super::watermark::Watermark;
use super::writer::{Counters, Envelope, Reply};
use crate::clock::Millis;
use crate::store::WriteStats;
use crate::store::inbox::KeysInMemory;

/// What the store, its readers and its writer share.
#[derive(Debug)]
pub struct Shared {
    /// The database. `None` once closed, and while the writer reopens it
    /// after a disk fault; readers clone the `Arc` for the length of one
    /// read.
    pub(super) db: Mutex<Option<Arc<Database>>>,
    /// False while the data file cannot commit (disk full or failing):
    /// writes answer `Unavailable`, `/readyz` fails, and the writer reopens
    /// the file until a commit succeeds again.
    pub(super) healthy: AtomicBool,
    /// Inbox events by source and status, as committed.
    pub(super) counts: StatusCounts,
    /// The keyspace's keys (the writer changes it with the rows).
    pub(super) kv: KvIndex,
    /// Which batches readers may see, and which are on disk.
    pub(super) watermark: Watermark,
    /// The open file's switch that refuses its writes (see [`super::guard`]).
    pub(super) refuse: Mutex<Arc<AtomicBool>>,
    /// Where the writer hands a checkpoint's sync to the flusher, and the
    /// file's writes wait for it (see [`super::sync_gate`]).
    pub(super) gate: Arc<SyncGate>,
    /// Set by a read waiting for the file to be reopened: the writer tries
    /// again soon instead of after its backoff.
    pub(super) reopen_wanted: AtomicBool,
    /// Set once `close` began: reads answer at once, nothing will reopen.
    pub(super) closing: AtomicBool,
    /// Free space on the file's disk, and whether writes are refused for
    /// want of it.
    pub(super) space: Space,
    /// The key file of the inbox's sealed events (see [`super::seal`]).
    pub(super) seals: Arc<Seals>,
}

impl Shared {
    /// Marks the file as not writable: writes answer `Unavailable` and the
    /// writer reopens it.
    pub(super) fn set_unhealthy(&self) {
        self.healthy.store(false, Ordering::SeqCst);
    }

    pub(super) fn db(&self) -> Option<Arc<Database>> {
        self.db.lock().ok().and_then(|d| d.clone())
    }

    pub(super) fn set_db(&self, db: Option<Arc<Database>>) -> Option<Arc<Database>> {
        match self.db.lock() {
            Ok(mut d) => std::mem::replace(&mut *d, db),
            Err(_) => None,
        }
    }

    pub(super) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }
}

/// The open data file and its writer: what every handle holds.
#[derive(Debug)]
pub struct Engine {
    /// The database and its health, shared with the writer.
    pub(super) shared: Arc<Shared>,
    pub(super) writes: mpsc::Sender<Envelope>,
    /// The writer thread, joined on close.
    pub(super) writer: Mutex<Option<JoinHandle<()>>>,
    /// Syncs the data file in the background between checkpoints.
    pub(super) flusher: Mutex<Option<Flusher>>,
    /// Group-commit counters.
    pub(super) counters: Arc<Counters>,
    /// How long a read waits out a reopen
    /// ([`RedbOptions::read_reopen_wait`](super::RedbOptions::read_reopen_wait)).
    pub(super) read_reopen_wait: Duration,
    /// [`RedbOptions::dedupe_window`](super::RedbOptions::dedupe_window), ms.
    pub(super) dedupe_window_ms: u64,
    /// [`RedbOptions::max_key_memory_bytes`](super::RedbOptions::max_key_memory_bytes).
    pub(super) max_key_memory_bytes: u64,
    /// The backups' turn (one at a time) and their word to stop (see
    /// [`super::backup`]).
    pub(super) backups: Arc<super::backup::Turns>,
}

impl Engine {
    /// Finishes queued writes, stops the writer and releases the file, so the
    /// same path can be opened again. Later calls answer `Unavailable`.
    pub(super) async fn close(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        // A backup waiting on its reader stops too (it holds the file).
        self.backups.stop();
        let flusher = self.flusher.lock().ok().and_then(|mut f| f.take());
        // Joining it waits out one sync: off the async threads.
        let _ = tokio::task::spawn_blocking(move || drop(flusher)).await;
        let _ = self.writes.send(Envelope::Shutdown).await;
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        let db = self.shared.set_db(None);
        if let Some(mut db) = db {
            // Wait out reads that still hold a clone; each is one short read.
            loop {
                match Arc::try_unwrap(db) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still_shared) => {
                        db = still_shared;
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                }
            }
        }
    }

    /// Queues `request` and waits for its answer: after its batch is on
    /// disk.
    pub(super) async fn write(
        &self,
        request: Request,
        now: Millis,
    ) -> Result<Response, EngineError> {
        let (reply, answer) = Reply::for_this_thread();
        self.writes
            .send(Envelope::Write {
                request,
                now,
                reply,
            })
            .await
            .map_err(|_| EngineError::Closed)?;
        answer.await.map_err(|_| EngineError::Closed)?
    }

    /// Queues `request` without waiting for its answer, so a caller can
    /// queue several writes into one batch; the returned future answers
    /// after the commit (in queue order).
    pub(super) async fn submit(
        &self,
        request: Request,
        now: Millis,
    ) -> Result<impl Future<Output = Result<Response, EngineError>> + Send + 'static, EngineError>
    {
        let (reply, answer) = Reply::for_this_thread();
        self.writes
            .send(Envelope::Write {
                request,
                now,
                reply,
            })
            .await
            .map_err(|_| EngineError::Closed)?;
        Ok(async move { answer.await.map_err(|_| EngineError::Closed)? })
    }

    /// Runs `f` on a read transaction on the blocking pool. A read that
    /// meets the file being reopened after a disk fault (the writer drops
    /// the handle redb poisoned and opens the file again, usually within
    /// milliseconds) asks the writer to try now, waits for the reopen, up
    /// to [`Engine::read_reopen_wait`], and runs again: reads keep answering while
    /// writes are refused, as long as the file can be opened. While it
    /// cannot (every write failing), they answer `Unavailable` after that
    /// wait.
    pub(super) async fn read<T, F>(&self, f: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: Fn(&ReadTransaction) -> Result<T, redb::Error> + Send + Sync + 'static,
    {
        self.read_seen(Fresh::Acknowledged, move |db, shared| {
            let tx = db.begin_read()?;
            // Any batch the transaction sees is at or below this.
            let seen = shared.watermark.visible();
            f(&tx).map(|v| (v, seen))
        })
        .await
    }

    /// Shreds the keys of every sealed row gone so far (erased, reaped)
    /// and of every seal never stored: they no longer open anywhere (see
    /// [`super::seal`]).
    pub(super) async fn shred(&self) -> Result<(), EngineError> {
        let seals = self.shared.seals.clone();
        if seals.shredded() {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || seals.shred())
            .await
            .map_err(|e| EngineError::ReadTask(Arc::new(e)))?
            .map_err(|e| self.key_fault(e))?;
        Ok(())
    }

    /// The key file could not be written (see [`super::seal`]): the disk
    /// is full or failing, as the data file's would be. The store is
    /// marked unhealthy (`/readyz` fails, writes answer 503) until the
    /// writer's reopen proves the disk writable again.
    pub(super) fn key_fault(&self, e: std::io::Error) -> EngineError {
        tracing::warn!(error = %e, "the key file cannot be written: writes answer 503 until the disk takes writes again");
        self.shared.set_unhealthy();
        self.want_reopen();
        EngineError::Keys(Arc::new(e))
    }

    /// [`Engine::read`] for a read that opens sealed events (see
    /// [`super::seal`]).
    pub(super) async fn read_sealed<T, F>(&self, f: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: Fn(&ReadTransaction, &Seals) -> Result<T, redb::Error> + Send + Sync + 'static,
    {
        self.read_seen(Fresh::Acknowledged, move |db, shared| {
            let tx = db.begin_read()?;
            let seen = shared.watermark.visible();
            f(&tx, &shared.seals).map(|v| (v, seen))
        })
        .await
    }

    /// [`Engine::read`] for a read that says itself which batch it may
    /// have seen (the keyspace's, which also reads the index in memory).
    pub(super) async fn read_seen<T, F>(&self, fresh: Fresh, f: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: Fn(&Database, &Shared) -> Result<(T, u64), redb::Error> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let deadline = tokio::time::Instant::now() + self.read_reopen_wait;
        loop {
            let epoch = self.shared.watermark.epoch();
            match self.read_once(epoch, fresh, f.clone(), deadline).await {
                Ok(value) => return Ok(value),
                Err(ReadFailure::Final(e)) => return Err(e),
                Err(ReadFailure::Reopening(e)) => {
                    self.want_reopen();
                    if !self.shared.watermark.reopened_since(epoch, deadline).await {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Asks the writer to reopen the file now: past its backoff, and
    /// woken if it sits idle since a failed sync (it starts a reopen on its
    /// next message).
    fn want_reopen(&self) {
        self.shared.reopen_wanted.store(true, Ordering::SeqCst);
        let (ping, _) = oneshot::channel();
        let _ = self.writes.try_send(Envelope::Ping(ping));
    }

    async fn read_once<T, F>(
        &self,
        epoch: u64,
        fresh: Fresh,
        f: Arc<F>,
        deadline: tokio::time::Instant,
    ) -> Result<T, ReadFailure>
    where
        T: Send + 'static,
        F: Fn(&Database, &Shared) -> Result<(T, u64), redb::Error> + Send + Sync + 'static,
    {
        // Before the file is taken: a reopen waits for every read holding it.
        if fresh == Fresh::Acknowledged {
            self.shared
                .watermark
                .committed_through(epoch, deadline)
                .await
                .map_err(ReadFailure::Reopening)?;
        }
        let Some(db) = self.shared.db() else {
            let closed_for_good =
                self.shared.closing.load(Ordering::SeqCst) || self.shared.is_healthy();
            return Err(if closed_for_good {
                ReadFailure::Final(EngineError::Closed)
            } else {
                ReadFailure::Reopening(EngineError::DiskRefused)
            });
        };
        let shared = self.shared.clone();
        let (value, seen) = tokio::task::spawn_blocking(move || {
            // Its reclaims of redb's buffer never wait for a checkpoint.
            let _reading = super::guard::reading();
            f(&db, &shared)
        })
        .await
        .map_err(|e| ReadFailure::Final(EngineError::ReadTask(Arc::new(e))))?
        .map_err(|e| {
            if is_disk_fault(&e) {
                ReadFailure::Reopening(EngineError::DiskRead(Arc::new(e)))
            } else {
                ReadFailure::Final(e.into())
            }
        })?;
        // Nothing that is not on disk is shown: a batch still syncing is
        // waited for (one sync at most); if the file was reopened meanwhile,
        // what was seen may be gone, so the read runs again. A sync that
        // failed leaves the batch unsynced until the reopen: waited for up
        // to the same deadline.
        if !self.shared.is_healthy() {
            self.want_reopen();
        }
        self.shared
            .watermark
            .wait(epoch, seen, deadline)
            .await
            .map_err(ReadFailure::Reopening)?;
        Ok(value)
    }

    /// Whether the writer takes a request from its queue within `within`:
    /// false while it is stuck in a commit or a sync (or has stopped).
    pub(super) async fn writer_responds(&self, within: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        let asked = async {
            self.writes.send(Envelope::Ping(tx)).await.ok()?;
            rx.await.ok()
        };
        matches!(tokio::time::timeout(within, asked).await, Ok(Some(())))
    }

    /// Ok when the file can serve requests: the writer runs, the file can
    /// commit, and a read answers.
    pub(super) async fn ready(&self) -> Result<(), EngineError> {
        if self.writes.is_closed() {
            return Err(EngineError::Closed);
        }
        if !self.shared.is_healthy() {
            return Err(EngineError::DiskRefused);
        }
        // Refusing writes for want of room: ready again as soon as there is
        // room (the writer's next batch decides exactly; a probe must not
        // wait for a write that the load balancer holds back meanwhile).
        let space = &self.shared.space;
        if space.is_low() {
            let free = space.read();
            if !space.takes_a_write(free) {
                return Err(EngineError::LowSpace {
                    free,
                    floor: space.floor(),
                });
            }
            space.set_low(false);
        }
        // The file answers a read. Not a read of what was acknowledged:
        // that would ask the writer to commit its open transaction at once,
        // and `/readyz` needs no token, so a flood of probes would take
        // group commit (`storage.commit_hold`) away from every write.
        self.read_seen(Fresh::Shown, |db, shared| {
            let tx = db.begin_read()?;
            let seen = shared.watermark.visible();
            tx.open_table(META)?;
            Ok(((), seen))
        })
        .await
    }

    /// Free bytes on the data file's disk, read now, and the watermark.
    pub(super) fn space_now(&self) -> (u64, u64) {
        let space = &self.shared.space;
        (space.read(), space.floor())
    }

    /// Keys held in memory: claims, Redis-protocol keys, the memory both
    /// take (estimated), and the cap on it.
    pub(super) fn keys_in_memory(&self) -> KeysInMemory {
        let ix = self.shared.kv.read();
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        KeysInMemory {
            claims: n(ix.len(KeySpace::Claims)),
            keyspace: n(ix.len(KeySpace::Kv)),
            bytes: n(ix.bytes(KeySpace::Claims) + ix.bytes(KeySpace::Kv)),
            cap_bytes: self.max_key_memory_bytes,
        }
    }

    /// Group-commit counters since the file was opened.
    pub(super) fn write_stats(&self) -> WriteStats {
        self.counters.snapshot()
    }

    /// How long after its receipt a reaped inbox event's id stays a
    /// duplicate.
    pub(super) fn dedupe_window(&self) -> Duration {
        Duration::from_millis(self.dedupe_window_ms)
    }
}

/// How long a read waits for the file to be reopened after a disk fault
/// before it answers `Unavailable`, by default.
pub const READ_REOPEN_WAIT: Duration = Duration::from_secs(2);

/// What a read must see from its first look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fresh {
    /// Every batch on disk when it begins (every write answered `Ok`): the
    /// writer's open transaction is committed first if it holds one.
    Acknowledged,
    /// What the file and the keyspace index show; the read itself finds out
    /// when it needs more (a keyspace row not yet committed).
    Shown,
}

/// Why one read attempt failed.
enum ReadFailure {
    /// The file is being reopened: worth running again once it is.
    Reopening(EngineError),
    /// Anything else: the answer.
    Final(EngineError),
}
