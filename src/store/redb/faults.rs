//! Storage faults on demand, for tests: a plan that fails the next writes
//! or syncs of the data file (through its backend, [`super::guard`]) and of
//! the write-ahead log when told to, the way a full or failing disk does
//! (as redb's own crash tests do).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// What blocks while the disk "hangs".
#[derive(Debug, Default, Clone, Copy)]
struct Hang {
    syncs: bool,
    appends: bool,
    /// Only the checkpoints' syncs handed to the flusher.
    handed_over: bool,
}

/// What to fail, shared by a test and the backend. All counts start at 0.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// Writes still to fail.
    writes: AtomicU64,
    /// Syncs still to fail.
    syncs: AtomicU64,
    /// Checkpoints' syncs handed to the flusher still to fail.
    handed_over: AtomicU64,
    /// Write batches still to fail once they ran, before they are logged,
    /// with an error that is not a disk fault.
    batches: AtomicU64,
    /// While set, every write and sync fails (a full disk).
    full: AtomicBool,
    /// Writes still to let through before the disk "fills" (sets `full`);
    /// `u64::MAX`: not counting.
    fill_in: AtomicU64,
    /// Faults injected so far.
    injected: AtomicU64,
    /// Checkpoint syncs the flusher took up so far.
    handed_over_taken: AtomicU64,
    /// While set, every sync (and, with `appends`, every append to the
    /// log) blocks: a disk that stopped answering.
    hung: Mutex<Hang>,
    /// Wakes what `hung` blocks.
    unhang: Condvar,
    /// While set (`u64::MAX`: not set), the free space the store reads on
    /// its disk, in bytes, instead of the filesystem's.
    free_bytes: AtomicU64,
}

impl FaultPlan {
    /// A plan that fails nothing yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            free_bytes: AtomicU64::new(u64::MAX),
            fill_in: AtomicU64::new(u64::MAX),
            ..Self::default()
        })
    }

    /// Makes the store read `bytes` as the free space on its disk (`None`:
    /// the filesystem's own figure again).
    pub fn set_free_bytes(&self, bytes: Option<u64>) {
        self.free_bytes
            .store(bytes.unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    /// The free space set by [`FaultPlan::set_free_bytes`], if any.
    pub fn free_bytes(&self) -> Option<u64> {
        Some(self.free_bytes.load(Ordering::SeqCst)).filter(|b| *b != u64::MAX)
    }

    /// Fails the next `n` writes.
    pub fn fail_next_writes(&self, n: u64) {
        self.writes.store(n, Ordering::SeqCst);
    }

    /// Fails the next `n` syncs.
    pub fn fail_next_syncs(&self, n: u64) {
        self.syncs.store(n, Ordering::SeqCst);
    }

    /// Fails the next `n` checkpoint syncs handed to the flusher thread
    /// (see [`super::sync_gate`]), and no other sync.
    pub fn fail_next_handed_over_syncs(&self, n: u64) {
        self.handed_over.store(n, Ordering::SeqCst);
    }

    /// Makes every checkpoint sync handed to the flusher block, before it
    /// writes the checkpoint's held pages, until called with `false` (other
    /// syncs go on): a checkpoint whose writes and sync are slow.
    pub fn set_handed_over_syncs_hung(&self, hung: bool) {
        self.hung
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .handed_over = hung;
        self.unhang.notify_all();
    }

    /// Waits while checkpoint syncs handed to the flusher hang
    /// ([`FaultPlan::set_handed_over_syncs_hung`]); the flusher calls it
    /// as it takes one up, so it counts them.
    pub fn wait_handed_over(&self) {
        self.handed_over_taken.fetch_add(1, Ordering::SeqCst);
        self.wait_while(|h| h.handed_over);
    }

    /// How many checkpoint syncs the flusher took up so far: once a
    /// checkpoint's commit handed its sync over, its pages are held in
    /// memory (until its sync is made).
    pub fn handed_over_taken(&self) -> u64 {
        self.handed_over_taken.load(Ordering::SeqCst)
    }

    /// Whether a checkpoint's sync handed to the flusher fails (asked once
    /// its held pages are written, as a failed `fdatasync` after them);
    /// it first waits while such syncs hang, then counts as any sync does
    /// ([`FaultPlan::trip`]).
    pub fn trip_handed_over(&self) -> bool {
        self.wait_while(|h| h.handed_over);
        if decrement(&self.handed_over) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        self.trip(true)
    }

    /// Fails the next `n` write batches after they ran, before they are
    /// logged, with an error that is not a disk fault (as a bug or a
    /// corrupt page would): the writer drops its transaction.
    pub fn fail_next_batches(&self, n: u64) {
        self.batches.store(n, Ordering::SeqCst);
    }

    /// Whether the batch that just ran fails.
    pub fn trip_batch(&self) -> bool {
        let hit = decrement(&self.batches);
        if hit {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }

    /// Lets the next `n` writes through, then fails every write and sync,
    /// as [`FaultPlan::set_full`] does: a disk that fills part way through
    /// whatever is writing.
    pub fn fill_after_writes(&self, n: u64) {
        self.fill_in.store(n, Ordering::SeqCst);
    }

    /// Fails every write and sync until called with `false`.
    pub fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// Makes every sync block until called with `false`: the writer hangs
    /// the way it does on a disk that stopped answering.
    pub fn set_hung(&self, hung: bool) {
        self.hung
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .syncs = hung;
        self.unhang.notify_all();
    }

    /// Makes every append to the write-ahead log block until called with
    /// `false`: the writer hangs after running a batch, before its commit.
    pub fn set_appends_hung(&self, hung: bool) {
        self.hung
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .appends = hung;
        self.unhang.notify_all();
    }

    fn wait_while(&self, blocked: impl Fn(Hang) -> bool) {
        let mut hung = self.hung.lock().unwrap_or_else(PoisonError::into_inner);
        while blocked(*hung) {
            hung = self
                .unhang
                .wait(hung)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Called before each append to the log: waits while appends hang.
    pub fn before_append(&self) {
        self.wait_while(|h| h.appends);
    }

    /// The error an injected fault returns: what a full disk answers.
    pub fn disk_full() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "injected fault: no space left on device",
        )
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Whether the next write (or sync, with `sync`) fails; a sync first
    /// waits while the plan hangs syncs.
    pub fn trip(&self, sync: bool) -> bool {
        if sync {
            self.wait_while(|h| h.syncs);
        }
        if !sync && self.fill_in.load(Ordering::SeqCst) != u64::MAX && !decrement(&self.fill_in) {
            self.fill_in.store(u64::MAX, Ordering::SeqCst);
            self.full.store(true, Ordering::SeqCst);
        }
        self.take(if sync { &self.syncs } else { &self.writes })
    }

    fn take(&self, counter: &AtomicU64) -> bool {
        let hit = self.full.load(Ordering::SeqCst) || decrement(counter);
        if hit {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }
}

/// Takes one from `counter` if it is above zero; whether it was.
fn decrement(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}
