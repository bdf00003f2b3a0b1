//! Storage faults on demand, for tests: a redb storage backend over the
//! data file that fails the next writes or syncs when told to, the way a
//! full or failing disk does (as redb's own crash tests do).

use std::fs::File;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// What to fail, shared by a test and the backend. All counts start at 0.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// Writes still to fail.
    writes: AtomicU64,
    /// Syncs still to fail.
    syncs: AtomicU64,
    /// While set, every write and sync fails (a full disk).
    full: AtomicBool,
    /// Faults injected so far.
    injected: AtomicU64,
    /// While true, every sync blocks (a disk that stopped answering).
    hung: Mutex<bool>,
    /// Wakes the syncs blocked by `hung`.
    unhang: Condvar,
}

impl FaultPlan {
    /// A plan that fails nothing yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Fails the next `n` writes.
    pub fn fail_next_writes(&self, n: u64) {
        self.writes.store(n, Ordering::SeqCst);
    }

    /// Fails the next `n` syncs.
    pub fn fail_next_syncs(&self, n: u64) {
        self.syncs.store(n, Ordering::SeqCst);
    }

    /// Fails every write and sync until called with `false`.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Makes every sync block until called with `false`: the writer hangs
    /// the way it does on a disk that stopped answering.
    pub fn set_hung(&self, hung: bool) {
        *self.hung.lock().unwrap_or_else(PoisonError::into_inner) = hung;
        self.unhang.notify_all();
    }

    fn wait_while_hung(&self) {
        let mut hung = self.hung.lock().unwrap_or_else(PoisonError::into_inner);
        while *hung {
            hung = self
                .unhang
                .wait(hung)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Whether the next write (or sync, with `sync`) of another file on the
    /// same disk — the write-ahead log — fails.
    pub fn trip(&self, sync: bool) -> bool {
        if sync {
            self.wait_while_hung();
        }
        self.take(if sync { &self.syncs } else { &self.writes })
    }

    fn take(&self, counter: &AtomicU64) -> bool {
        let hit = self.full.load(Ordering::SeqCst)
            || counter
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if hit {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }
}

fn no_space() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        "injected fault: no space left on device",
    )
}

/// The file backend, failing as its [`FaultPlan`] says.
#[derive(Debug)]
pub struct FaultyBackend {
    /// The real file.
    inner: FileBackend,
    /// What to fail.
    plan: Arc<FaultPlan>,
}

impl FaultyBackend {
    /// Wraps the open data file.
    pub fn new(file: File, plan: Arc<FaultPlan>) -> Result<Self, redb::DatabaseError> {
        Ok(Self {
            inner: FileBackend::new(file)?,
            plan,
        })
    }
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        if self.plan.take(&self.plan.writes) {
            return Err(no_space());
        }
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.plan.wait_while_hung();
        if self.plan.take(&self.plan.syncs) {
            return Err(no_space());
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        if self.plan.take(&self.plan.writes) {
            return Err(no_space());
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
