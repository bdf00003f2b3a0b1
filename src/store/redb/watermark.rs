//! Which batches readers may see, which are committed, and which are on
//! disk.
//!
//! Each write batch has a sequence number. The writer runs batches in one
//! redb write transaction and logs each, then makes the log durable (see
//! `syncer`) and only then answers. Two rules follow for reads:
//!
//! - Nothing that is not on disk is shown (an ingest answered "duplicate"
//!   from a batch lost in a crash would lose the event): a read notes the
//!   last batch it may have seen ([`Watermark::visible`]) and waits until
//!   that batch is on disk ([`Watermark::wait`]).
//! - Everything acknowledged is shown. The writer may keep its transaction
//!   open over several batches (`storage.commit_hold`), so a batch can be
//!   on disk — in the synced log, its callers answered — before redb has
//!   committed it. A read first makes sure the batches on disk are
//!   committed ([`Watermark::committed_through`]): it asks the writer to
//!   commit now and waits for that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Notify, watch};

use super::error::EngineError;

/// Where the batches stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marks {
    /// Grows when the writer undoes a batch a read may have seen (see
    /// `kv_index`), and when it reopens the file: the batches not on disk
    /// are gone then.
    epoch: u64,
    /// The last batch on disk.
    durable: u64,
    /// The last batch redb committed (readers of a transaction begun now
    /// see it).
    committed: u64,
}

/// Batches readers may see, committed, and on disk.
#[derive(Debug)]
pub struct Watermark {
    /// The last batch readers may see: set just before its commit, so a read
    /// transaction that sees a batch finds it here when it looks afterwards.
    visible: AtomicU64,
    /// Epoch, durable and committed, for readers to wait on.
    marks: watch::Sender<Marks>,
    /// Set by a read that needs the open transaction committed.
    commit_wanted: AtomicBool,
    /// Wakes the writer when it sits idle with a transaction open.
    wake: Notify,
}

impl Watermark {
    /// A file whose batches up to `seq` are committed and on disk.
    pub fn new(seq: u64) -> Self {
        Self {
            visible: AtomicU64::new(seq),
            marks: watch::Sender::new(Marks {
                epoch: 0,
                durable: seq,
                committed: seq,
            }),
            commit_wanted: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// Batch `seq` is about to be committed: readers may see it from now.
    pub fn show(&self, seq: u64) {
        self.visible.store(seq, Ordering::SeqCst);
    }

    /// Batches up to `seq` are committed.
    pub fn committed(&self, seq: u64) {
        self.marks.send_if_modified(|m| {
            let moved = seq > m.committed;
            m.committed = m.committed.max(seq);
            moved
        });
    }

    /// Batches up to `seq` are on disk.
    pub fn synced(&self, seq: u64) {
        self.marks.send_if_modified(|m| {
            let moved = seq > m.durable;
            m.durable = m.durable.max(seq);
            moved
        });
    }

    /// The file was reopened holding batches up to `seq`, all committed and
    /// on disk.
    pub fn reopened(&self, seq: u64) {
        self.visible.store(seq, Ordering::SeqCst);
        self.marks.send_modify(|m| {
            m.epoch += 1;
            m.durable = seq;
            m.committed = seq;
        });
    }

    /// A batch a read may have seen was undone (it failed before its
    /// commit): reads waiting now run again.
    pub fn abandoned(&self) {
        self.marks.send_modify(|m| m.epoch += 1);
    }

    /// The last batch on disk.
    pub fn durable(&self) -> u64 {
        self.marks.borrow().durable
    }

    /// The last batch committed.
    pub fn last_committed(&self) -> u64 {
        self.marks.borrow().committed
    }

    /// The epoch: take it before a read transaction begins.
    pub fn epoch(&self) -> u64 {
        self.marks.borrow().epoch
    }

    /// The last batch a read transaction that has begun may see.
    pub fn visible(&self) -> u64 {
        self.visible.load(Ordering::SeqCst)
    }

    /// Whether a read asked for the open transaction to be committed; the
    /// writer takes the request.
    pub fn take_commit_wanted(&self) -> bool {
        self.commit_wanted.swap(false, Ordering::SeqCst)
    }

    /// Completes once a read asks for a commit (the writer waits on it while
    /// idle with a transaction open).
    pub async fn commit_asked(&self) {
        self.wake.notified().await;
    }

    /// Waits until the file is reopened after `epoch` (true), or until
    /// `deadline` (false).
    pub async fn reopened_since(&self, epoch: u64, deadline: tokio::time::Instant) -> bool {
        let mut rx = self.marks.subscribe();
        matches!(
            tokio::time::timeout_at(deadline, rx.wait_for(|m| m.epoch != epoch)).await,
            Ok(Ok(_))
        )
    }

    /// Waits until every batch on disk now is committed, so a read
    /// transaction begun afterwards sees everything acknowledged; asks the
    /// writer to commit at once if it holds such a batch. `Unavailable` at
    /// `deadline`; returns early if the file was reopened after `epoch`
    /// (the reopened file holds every batch on disk).
    pub async fn committed_through(
        &self,
        epoch: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), EngineError> {
        let need = {
            let m = self.marks.borrow();
            if m.committed >= m.durable {
                return Ok(());
            }
            m.durable
        };
        self.commit_wanted.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        let reached = |m: &Marks| m.epoch != epoch || m.committed >= need;
        let mut rx = self.marks.subscribe();
        match tokio::time::timeout_at(deadline, rx.wait_for(reached)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) | Err(_) => Err(EngineError::DiskRefused),
        }
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
    ) -> Result<(), EngineError> {
        let reached = |m: &Marks| m.epoch != epoch || m.durable >= seq;
        let mut rx = self.marks.subscribe();
        let now = match tokio::time::timeout_at(deadline, rx.wait_for(reached)).await {
            Ok(Ok(m)) => *m,
            Ok(Err(_)) | Err(_) => return Err(EngineError::DiskRefused),
        };
        if now.epoch == epoch {
            Ok(())
        } else {
            Err(EngineError::Reopened)
        }
    }
}
